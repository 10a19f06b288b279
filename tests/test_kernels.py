"""Tests of skfedgp.kernels: the SE-ARD matrix and its gradient contractions.

Gradients are checked against central finite differences of
``F = sum(Kbar * K)`` for a fixed random ``Kbar`` (SPEC section 1,
"Gradients of one client term"); the two back ends are checked against each
other and the Numba contraction against a change of thread count.
"""

import numpy as np
import pytest

from skfedgp.kernels import se_ard, se_ard_diag, se_ard_grad, se_ard_grad_sym

BACKENDS = ("numba", "numpy")


def _problem(rng, n=9, m=5, d=3):
    X = rng.normal(size=(n, d))
    Z = rng.normal(size=(m, d))
    ell = rng.uniform(0.7, 1.6, size=d)
    var = 1.3
    Kbar = rng.normal(size=(n, m))
    return X, Z, ell, var, Kbar


@pytest.mark.parametrize("backend", BACKENDS)
def test_se_ard_matches_definition(rng, backend):
    X, Z, ell, var, _ = _problem(rng)
    K = se_ard(X, Z, ell, var, backend=backend)
    diff = (X[:, None, :] - Z[None, :, :]) / ell
    expected = var * np.exp(-0.5 * np.sum(diff**2, axis=-1))
    np.testing.assert_allclose(K, expected, rtol=1e-13, atol=0)
    # scalar lengthscale broadcasts to every dimension
    K_iso = se_ard(X, Z, 0.9, var, backend=backend)
    np.testing.assert_allclose(K_iso, se_ard(X, Z, np.full(3, 0.9), var, backend=backend))
    # the diagonal helper is the variance
    np.testing.assert_array_equal(se_ard_diag(X, var), np.full(X.shape[0], var))
    Kxx = se_ard(X, X, ell, var, backend=backend)
    np.testing.assert_allclose(np.diag(Kxx), se_ard_diag(X, var), rtol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_se_ard_grad_finite_differences(rng, backend, numgrad, assert_grad_close):
    X, Z, ell, var, Kbar = _problem(rng)
    K = se_ard(X, Z, ell, var, backend=backend)
    dZ, dell, dvar = se_ard_grad(X, Z, K, Kbar, ell, var, backend=backend)
    assert dZ.shape == Z.shape and dell.shape == ell.shape and np.ndim(dvar) == 0

    def F(Z_=Z, ell_=ell, var_=var):
        return float(np.sum(Kbar * se_ard(X, Z_, ell_, var_, backend=backend)))

    assert_grad_close(dZ, numgrad(lambda z: F(Z_=z), Z), f"{backend} dZ")
    assert_grad_close(dell, numgrad(lambda e: F(ell_=e), ell), f"{backend} dlengthscale")
    assert_grad_close(dvar, numgrad(lambda v: F(var_=float(v[0])), [var]), f"{backend} dvariance")


@pytest.mark.parametrize("backend", BACKENDS)
def test_se_ard_grad_sym_finite_differences(rng, backend, numgrad, assert_grad_close):
    m, d = 6, 2
    Z = rng.normal(size=(m, d))
    ell = np.array([0.8, 1.4])
    var = 0.7
    B = rng.normal(size=(m, m))
    Kbar = B + B.T  # symmetric, as produced by cholesky_backward
    K = se_ard(Z, Z, ell, var, backend=backend)
    dZ, dell, dvar = se_ard_grad_sym(Z, K, Kbar, ell, var, backend=backend)

    def F(Z_=Z, ell_=ell, var_=var):
        # both kernel arguments move with Z
        return float(np.sum(Kbar * se_ard(Z_, Z_, ell_, var_, backend=backend)))

    assert_grad_close(dZ, numgrad(lambda z: F(Z_=z), Z), f"{backend} sym dZ")
    assert_grad_close(dell, numgrad(lambda e: F(ell_=e), ell), f"{backend} sym dlengthscale")
    assert_grad_close(dvar, numgrad(lambda v: F(var_=float(v[0])), [var]), f"{backend} sym dvar")


def _rel(a, b):
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_backends_agree_on_larger_problem():
    rng = np.random.default_rng(42)
    n, m, d = 500, 40, 3
    X = rng.uniform(-2.0, 2.0, size=(n, d))
    Z = rng.uniform(-2.0, 2.0, size=(m, d))
    ell = np.array([0.6, 1.1, 2.0])
    var = 1.7
    K_nb = se_ard(X, Z, ell, var, backend="numba")
    K_np = se_ard(X, Z, ell, var, backend="numpy")
    # element-wise: the relative error of exp(-r2/2) is the absolute error of r2/2
    np.testing.assert_allclose(K_np, K_nb, rtol=1e-12, atol=0)
    Kbar = rng.normal(size=(n, m))
    g_nb = se_ard_grad(X, Z, K_nb, Kbar, ell, var, backend="numba")
    g_np = se_ard_grad(X, Z, K_nb, Kbar, ell, var, backend="numpy")
    for name, a, b in zip(("dZ", "dlengthscale", "dvariance"), g_np, g_nb):
        assert _rel(a, b) < 1e-12, f"{name}: numpy vs numba relative difference {_rel(a, b):.2e}"
    Kzz = se_ard(Z, Z, ell, var, backend="numba")
    B = rng.normal(size=(m, m))
    s_nb = se_ard_grad_sym(Z, Kzz, B + B.T, ell, var, backend="numba")
    s_np = se_ard_grad_sym(Z, Kzz, B + B.T, ell, var, backend="numpy")
    for name, a, b in zip(("dZ", "dlengthscale", "dvariance"), s_np, s_nb):
        assert _rel(a, b) < 1e-12, f"sym {name}: relative difference {_rel(a, b):.2e}"


def test_numba_results_independent_of_thread_count():
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba was started with fewer than 2 threads (NUMBA_NUM_THREADS)")
    rng = np.random.default_rng(7)
    n, m, d = 500, 40, 3
    X = rng.normal(size=(n, d))
    Z = rng.normal(size=(m, d))
    ell = np.array([0.9, 1.2, 0.5])
    var = 1.1
    Kbar = rng.normal(size=(n, m))
    before = numba.get_num_threads()
    out = {}
    try:
        for t in (1, 2):
            numba.set_num_threads(t)
            K = se_ard(X, Z, ell, var, backend="numba")
            out[t] = (K,) + tuple(
                np.atleast_1d(g) for g in se_ard_grad(X, Z, K, Kbar, ell, var, backend="numba")
            )
    finally:
        numba.set_num_threads(before)
    for a, b in zip(out[1], out[2]):
        assert np.array_equal(a, b), "numba result changes with the thread count"


def test_numpy_grad_builds_no_nmd_temporary(rng):
    # The NumPy back end must never build an n x M x d array (issue 2).
    # tracemalloc sees NumPy's allocations (not Numba's, whose allocator it
    # does not trace), so this check is only meaningful for "numpy".
    import tracemalloc

    backend = "numpy"
    n, m, d = 4000, 30, 8
    X = rng.normal(size=(n, d))
    Z = rng.normal(size=(m, d))
    ell = np.ones(d)
    K = se_ard(X, Z, ell, 1.0, backend=backend)
    Kbar = rng.normal(size=(n, m))
    se_ard_grad(X, Z, K, Kbar, ell, 1.0, backend=backend)  # warm up / compile
    tracemalloc.start()
    try:
        se_ard_grad(X, Z, K, Kbar, ell, 1.0, backend=backend)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    nmd_bytes = n * m * d * 8
    assert peak < nmd_bytes / 2, f"peak {peak} bytes suggests an n x M x d temporary"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lengthscale=-1.0, variance=1.0), "lengthscale"),
        (dict(lengthscale=np.ones(3), variance=1.0), "lengthscale"),
        (dict(lengthscale=1.0, variance=0.0), "variance"),
        (dict(lengthscale=np.nan, variance=1.0), "lengthscale"),
    ],
)
def test_bad_hyperparameters_raise(kwargs, match):
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match=match):
        se_ard(X, X, **kwargs)


def test_bad_shapes_and_backend_raise():
    with pytest.raises(ValueError, match="columns"):
        se_ard(np.zeros((3, 2)), np.zeros((3, 3)), 1.0, 1.0)
    with pytest.raises(ValueError, match="backend"):
        se_ard(np.zeros((3, 2)), np.zeros((3, 2)), 1.0, 1.0, backend="torch")


def test_small_kernel_path_keeps_precision_for_far_apart_inputs():
    """Inputs at both ends of a wide box and a short lengthscale: the
    clients' small-size NumPy path (``_structured._se``, ``_se_grad``) and
    both back ends of :mod:`skfedgp.kernels` must be exact. Expanding ``|x - z|^2`` lost seven
    digits here (inducing points at 0 and at 1, inputs of width 1e-4 near 0,
    lengthscale 4e-5): the bound was noisy in the lengthscales."""
    from skfedgp._structured import _se, _se_grad

    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1e-4, size=(30, 2))
    Z = np.r_[rng.uniform(0, 1e-4, size=(20, 2)), 1 - rng.uniform(0, 1e-4, size=(20, 2))]
    ell = np.array([3.6e-5, 5.8e-5])
    D = (X[:, None, :].astype(np.longdouble) - Z[None, :, :]) / ell
    want = np.asarray(1.7 * np.exp(-0.5 * np.sum(D * D, axis=-1)), dtype=float)
    np.testing.assert_allclose(_se(X, Z, ell, 1.7), want, rtol=1e-12, atol=1e-300)
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(se_ard(X, Z, ell, 1.7, backend=backend), want, rtol=1e-12,
                                   atol=1e-300)
    Kbar = rng.normal(size=want.shape)
    mine = _se_grad(X, Z, want, Kbar, ell, 1.7)
    for backend in ("numba", "numpy"):
        fused = se_ard_grad(X, Z, want, Kbar, ell, 1.7, backend=backend)
        for a, b in zip(mine, fused):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * np.max(np.abs(b)))


@pytest.mark.parametrize("form", ["scalar", "one", "full", "strided"])
def test_small_paths_take_any_lengthscale_form(form):
    """``se_small``/``se_grad_small`` (the many-small-clients paths) agree with
    the public functions for a scalar, a (1,), a (d,) and a strided lengthscale."""
    from skfedgp.kernels import se_grad_small, se_small

    rng = np.random.default_rng(5)
    X, Z = rng.normal(size=(9, 3)), rng.normal(size=(6, 3))
    full = np.array([0.6, 0.6, 0.6]) if form in ("scalar", "one") else np.array([0.5, 0.8, 1.3])
    ell = {"scalar": 0.6, "one": np.array([0.6]), "full": full,
           "strided": np.repeat(full, 2)[::2]}[form]
    K = se_ard(X, Z, full, 1.4)
    np.testing.assert_allclose(se_small(X, Z, ell, 1.4), K, rtol=1e-13)
    Kbar = rng.normal(size=K.shape)
    for a, b in zip(se_grad_small(X, Z, K, Kbar, ell, 1.4), se_ard_grad(X, Z, K, Kbar, full, 1.4)):
        np.testing.assert_allclose(np.broadcast_to(a, np.shape(b)), b, rtol=1e-11, atol=1e-13)


def test_small_paths_refuse_mismatched_shapes():
    """The compiled small-size loops do not check indices: the wrappers check shapes."""
    from skfedgp.kernels import se_grad_small, se_small

    X, Z = np.ones((4, 3)), np.zeros((2, 1))
    with pytest.raises(ValueError, match="same number of columns"):
        se_small(X, Z, 1.0, 1.0)
    Z = np.zeros((2, 3))
    K = se_small(X, Z, 1.0, 1.0)
    with pytest.raises(ValueError, match="same number of columns"):
        se_grad_small(X, Z[:, :1], K, K, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"shape \(4, 2\)"):
        se_grad_small(X, Z, K[:3], K, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"shape \(4, 2\)"):
        se_grad_small(X, Z, K, K.T, 1.0, 1.0)
