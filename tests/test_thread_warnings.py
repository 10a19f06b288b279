"""Warnings and threads: a fit leaves the process's warning filters as it found them.

Clients set up in a thread pool (``n_jobs=2``) used to wrap their pilot fits
(then scikit-learn's ``GaussianProcessRegressor``) in
:class:`warnings.catch_warnings`, whose save-and-restore is not
thread-safe: overlapping blocks left an ``"ignore"`` filter for
scikit-learn's ``ConvergenceWarning`` installed for good, so the fit's own
convergence warning (and every later one in the process) was lost. The
pilots now raise no warning; scikit-learn's validation in the threads
still uses such blocks (``warning_filters_kept``).
"""

import warnings

import numpy as np
import pytest
from scipy.stats import qmc
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.federated import _sobol_next


def _data(n_clients=12, n_per=20, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n_clients * n_per, 2))
    g = np.repeat(np.arange(n_clients), n_per)
    y = np.sin(X[:, 0]) + 0.3 * np.cos(X[:, 1]) + 0.1 * rng.normal(size=X.shape[0])
    return X, y, g


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_fit_leaves_warning_filters_unchanged_and_warns(n_jobs):
    X, y, g = _data()
    for seed in range(3):  # overlapping pilot fits in threads are a matter of timing
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            before = list(warnings.filters)
            FederatedHierarchicalGPRegressor(n_rounds=1, n_jobs=n_jobs,
                                             random_state=seed).fit(X, y, g)
            # compared inside the block: its exit would restore the list anyway
            assert list(warnings.filters) == before
        # the training budget ran out: that ConvergenceWarning reaches the caller
        assert any(issubclass(w.category, ConvergenceWarning)
                   and "n_rounds=1" in str(w.message) for w in rec)
        # and no Sobol balance warning leaks from the inducing designs
        assert not any("balance properties of Sobol" in str(w.message) for w in rec)


def test_fit_without_an_outer_block_leaves_no_filter():
    X, y, g = _data()
    before = list(warnings.filters)
    FederatedHierarchicalGPRegressor(n_rounds=2, n_jobs=2, random_state=0).fit(X, y, g)
    assert list(warnings.filters) == before


@pytest.mark.parametrize("sizes", [(71,), (1, 2, 3), (256, 5), (0, 7)])
def test_sobol_next_continues_the_sequence(sizes):
    ref = qmc.Sobol(3, scramble=True, seed=4)
    eng = qmc.Sobol(3, scramble=True, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = [ref.random(n) for n in sizes]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = [_sobol_next(eng, n) for n in sizes]
    for e, r in zip(expected, got):
        assert r.shape == e.shape
        np.testing.assert_array_equal(r, e)
    assert eng.num_generated == ref.num_generated
    np.testing.assert_array_equal(_sobol_next(eng, 4), ref.random(4))


def test_sobol_next_refuses_bad_counts():
    eng = qmc.Sobol(2, scramble=True, seed=0)
    with pytest.raises(ValueError, match="cannot draw -1"):
        _sobol_next(eng, -1)
    with pytest.raises(TypeError):
        _sobol_next(eng, 2.5)
    with pytest.raises(ValueError, match="points left"):
        _sobol_next(eng, eng.maxn + 1)
    assert eng.num_generated == 0


def test_warning_filters_kept_restores_a_leftover():
    from skfedgp.federated import warning_filters_kept

    before = list(warnings.filters)
    with warning_filters_kept():
        warnings.simplefilter("error", RuntimeWarning)  # a leftover, as from check_array
    assert list(warnings.filters) == before
