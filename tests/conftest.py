"""Shared pytest fixtures of the skfedgp test suite.

Only fixtures live here.  The finite-difference helpers are exposed as
fixtures that return functions, so every test module can use them without a
helper module.
"""

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A freshly seeded NumPy generator (seed 0), identical in every test."""
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def numgrad():
    """Central finite differences of a scalar function of one array.

    Returns a function ``numgrad(f, x, h=1e-6, mask=None)``: ``f`` maps an
    array shaped like ``x`` (float64) to a float; the result has the shape of
    ``x`` and holds ``(f(x + h e_k) - f(x - h e_k)) / (2 h)`` for every entry
    ``k`` where ``mask`` is true (zero elsewhere).  ``x`` is never modified.
    """

    def _numgrad(f, x, h=1e-6, mask=None):
        x = np.array(x, dtype=float, copy=True)
        g = np.zeros_like(x)
        flat_mask = (
            np.ones(x.size, dtype=bool) if mask is None else np.asarray(mask, bool).ravel()
        )
        for k in np.flatnonzero(flat_mask):
            xp = x.copy()
            xp.flat[k] += h
            xm = x.copy()
            xm.flat[k] -= h
            g.flat[k] = (f(xp) - f(xm)) / (2.0 * h)
        return g

    return _numgrad


@pytest.fixture(scope="session")
def assert_grad_close():
    """Compare an analytic gradient group with its finite-difference estimate.

    Returns a function ``check(analytic, numeric, name, tol=1e-5)`` asserting

    ``max_k |analytic_k - numeric_k| / max(max_k |numeric_k|, max_k |analytic_k|) < tol``

    i.e. the largest absolute error over the whole parameter group relative
    to the group's largest entry.  It also asserts that the group is not
    (numerically) zero, so that the comparison cannot pass vacuously.
    """

    def _check(analytic, numeric, name, tol=1e-5):
        a = np.atleast_1d(np.asarray(analytic, dtype=float)).ravel()
        b = np.atleast_1d(np.asarray(numeric, dtype=float)).ravel()
        assert a.shape == b.shape, f"{name}: shape {a.shape} != {b.shape}"
        scale = max(np.max(np.abs(b)), np.max(np.abs(a)))
        assert scale > 1e-8, f"{name}: gradient group is ~0, the check would be vacuous"
        err = np.max(np.abs(a - b)) / scale
        assert err < tol, f"{name}: relative gradient error {err:.3e} >= {tol:g}"
        return err

    return _check
