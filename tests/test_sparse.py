"""Tests of skfedgp._sparse: the whitened sparse blocks, the client ELBO term
``E_i`` with its analytic gradients, the whitened KL and block predictions
(SPEC section 1, "Whitened variational posterior", "Client ELBO term",
"Gradients of one client term", "Prediction for client i")."""

import numpy as np
import pytest

from skfedgp._linalg import DEFAULT_JITTER, CholeskyError
from skfedgp._sparse import Block, Component, block_predict, client_term, kl_whitened
from skfedgp.kernels import se_ard

N, D, MG, ML = 25, 2, 5, 4
TRIL = {M: np.tril(np.ones((M, M), dtype=bool)) for M in (MG, ML)}


def _chol(rng, M, diag=(0.4, 1.0)):
    C = np.tril(rng.normal(scale=0.2, size=(M, M)), -1)
    C[np.diag_indices(M)] = rng.uniform(*diag, size=M)
    return C


def _params(rng):
    """Random two-block problem: global (2 components), local (1)."""
    X = rng.uniform(0.0, 3.0, size=(N, D))
    y = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=N)
    p = {
        "Z_g": rng.uniform(0.0, 3.0, size=(MG, D)),
        "ell_g": np.array([1.1, 0.8]),
        "var_g": 1.2,
        "m1": rng.normal(size=MG),
        "C1": _chol(rng, MG),
        "c1": 1.0,
        "m2": rng.normal(scale=0.5, size=MG),
        "C2": _chol(rng, MG),
        "c2": 0.7,  # sqrt(phi) of the deviation component
        "Z_l": rng.uniform(0.0, 3.0, size=(ML, D)),
        "ell_l": np.array([0.5, 0.6]),
        "var_l": 0.6,
        "m3": rng.normal(scale=0.5, size=ML),
        "C3": _chol(rng, ML),
        "s2": 0.3,
    }
    return X, y, p


def _blocks(p):
    g = Block(p["Z_g"], p["ell_g"], p["var_g"],
              [Component(p["m1"], p["C1"], p["c1"]), Component(p["m2"], p["C2"], p["c2"])],
              "global")
    loc = Block(p["Z_l"], p["ell_l"], p["var_l"], [Component(p["m3"], p["C3"], 1.0)], "local")
    return [g, loc]


def _value(X, y, p, **change):
    q = dict(p, **change)
    for k in ("var_g", "var_l", "c1", "c2", "s2"):
        q[k] = float(np.asarray(q[k]).reshape(-1)[0])
    return client_term(X, y, _blocks(q), q["s2"], need_grad=False)[0]


def test_client_term_value_matches_dense_formula(rng):
    """E_i against a direct transcription of SPEC section 1 with explicit W."""
    X, y, p = _params(rng)
    value, _, _, parts = client_term(X, y, _blocks(p), p["s2"], need_grad=False)

    def W_of(Z, ell, var):
        Kzz = se_ard(Z, Z, ell, var) + DEFAULT_JITTER * var * np.eye(len(Z))
        L = np.linalg.cholesky(Kzz)
        return np.linalg.solve(L, se_ard(X, Z, ell, var).T).T

    Wg = W_of(p["Z_g"], p["ell_g"], p["var_g"])
    Wl = W_of(p["Z_l"], p["ell_l"], p["var_l"])
    phi = p["c2"] ** 2
    mu = Wg @ p["m1"] + p["c2"] * Wg @ p["m2"] + Wl @ p["m3"]
    tr_S = (np.sum((Wg @ p["C1"]) ** 2) + phi * np.sum((Wg @ p["C2"]) ** 2)
            + np.sum((Wl @ p["C3"]) ** 2))
    tr_R = (1 + phi) * (N * p["var_g"] - np.sum(Wg**2)) + (N * p["var_l"] - np.sum(Wl**2))
    sq = np.sum((y - mu) ** 2)
    expected = -N / 2 * np.log(2 * np.pi * p["s2"]) - (sq + tr_S + tr_R) / (2 * p["s2"])
    assert value == pytest.approx(expected, rel=1e-11)
    assert parts["sq_resid"] == pytest.approx(sq, rel=1e-11)
    assert parts["tr_S"] == pytest.approx(tr_S, rel=1e-11)
    assert parts["tr_R"] == pytest.approx(tr_R, rel=1e-9)
    assert parts["tr_R"] > 0  # the VFE trace term is a sum of non-negative variances


@pytest.fixture
def two_block_problem():
    rng = np.random.default_rng(11)
    X, y, p = _params(rng)
    value, grads, dnoise, _ = client_term(X, y, _blocks(p), p["s2"])
    assert value == pytest.approx(_value(X, y, p), rel=1e-14)
    return X, y, p, grads, dnoise


@pytest.mark.parametrize("block, keys", [
    (0, {"Z": "Z_g", "lengthscale": "ell_g", "variance": "var_g"}),
    (1, {"Z": "Z_l", "lengthscale": "ell_l", "variance": "var_l"}),
])
def test_client_term_kernel_gradients(two_block_problem, block, keys, numgrad, assert_grad_close):
    X, y, p, grads, _ = two_block_problem
    for attr, key in keys.items():
        analytic = getattr(grads[block], attr)
        numeric = numgrad(lambda v, key=key: _value(X, y, p, **{key: v}), np.atleast_1d(p[key]))
        assert_grad_close(analytic, numeric.reshape(np.shape(analytic)), f"block {block} {attr}")


@pytest.mark.parametrize("block, k, mkey, ckey, coefkey", [
    (0, 0, "m1", "C1", "c1"),
    (0, 1, "m2", "C2", "c2"),
    (1, 0, "m3", "C3", None),
])
def test_client_term_variational_gradients(two_block_problem, block, k, mkey, ckey, coefkey,
                                           numgrad, assert_grad_close):
    X, y, p, grads, _ = two_block_problem
    g = grads[block]
    assert_grad_close(g.means[k], numgrad(lambda v: _value(X, y, p, **{mkey: v}), p[mkey]),
                      f"block {block} mean {k}")
    M = p[mkey].shape[0]
    numeric = numgrad(lambda v: _value(X, y, p, **{ckey: v}), p[ckey], mask=TRIL[M])
    assert np.array_equal(g.chols[k], np.tril(g.chols[k])), "Cholesky gradient must be lower"
    assert_grad_close(g.chols[k], numeric, f"block {block} chol {k}")
    if coefkey is not None:
        numeric = numgrad(lambda v: _value(X, y, p, **{coefkey: v}), [p[coefkey]])
        assert_grad_close(g.coefs[k], numeric, f"block {block} coef {k}")


def test_client_term_noise_gradient(two_block_problem, numgrad, assert_grad_close):
    X, y, p, _, dnoise = two_block_problem
    assert_grad_close(dnoise, numgrad(lambda v: _value(X, y, p, s2=v), [p["s2"]]), "noise")


def test_kl_whitened_value_and_gradients(rng, numgrad, assert_grad_close):
    M = 5
    m = rng.normal(size=M)
    C = _chol(rng, M)
    kl, dm, dC = kl_whitened(m, C)
    S = C @ C.T
    expected = 0.5 * (np.trace(S) + m @ m - M - np.linalg.slogdet(S)[1])
    assert kl == pytest.approx(expected, rel=1e-12)
    assert kl_whitened(np.zeros(M), np.eye(M))[0] == pytest.approx(0.0, abs=1e-15)
    assert kl > 0
    assert_grad_close(dm, numgrad(lambda v: kl_whitened(v, C)[0], m), "KL mean")
    numeric = numgrad(lambda v: kl_whitened(m, v)[0], C, mask=TRIL[M])
    assert_grad_close(dC, numeric, "KL chol")


def test_block_predict_matches_dense_formula(rng):
    X, y, p = _params(rng)
    blk = _blocks(p)[0]
    Xs = rng.uniform(0.0, 3.0, size=(7, D))
    mean, var = block_predict(Xs, blk)
    mean_f, cov = block_predict(Xs, blk, full_cov=True)
    np.testing.assert_allclose(mean_f, mean, rtol=1e-14)
    np.testing.assert_allclose(np.diag(cov), var, rtol=1e-10)
    np.testing.assert_allclose(cov, cov.T, rtol=0, atol=1e-15)
    assert np.linalg.eigvalsh(cov).min() > -1e-10
    # eq. 30 (SPEC section 1) with explicit W*
    Z, ell, v = p["Z_g"], p["ell_g"], p["var_g"]
    L = np.linalg.cholesky(se_ard(Z, Z, ell, v) + DEFAULT_JITTER * v * np.eye(MG))
    Ws = np.linalg.solve(L, se_ard(Xs, Z, ell, v).T).T
    a = p["m1"] + p["c2"] * p["m2"]
    Sig = p["C1"] @ p["C1"].T + p["c2"] ** 2 * p["C2"] @ p["C2"].T
    gamma = 1 + p["c2"] ** 2
    expected = Ws @ Sig @ Ws.T + gamma * (se_ard(Xs, Xs, ell, v) - Ws @ Ws.T)
    np.testing.assert_allclose(mean, Ws @ a, rtol=1e-11)
    np.testing.assert_allclose(cov, expected, rtol=1e-9, atol=1e-12)


def test_duplicated_inducing_points_in_client_term(rng):
    X, y, p = _params(rng)
    Zg = p["Z_g"].copy()
    Zg[3] = Zg[1]  # duplicated inducing point: K_zz singular, jitter rescues it
    p["Z_g"] = Zg
    value, grads, dnoise, _ = client_term(X, y, _blocks(p), p["s2"], client="c0")
    assert np.isfinite(value) and np.isfinite(dnoise)
    assert all(np.all(np.isfinite(g.Z)) for g in grads)


def test_client_term_cholesky_error_names_block_and_client(rng):
    X, y, p = _params(rng)
    Zl = p["Z_l"].copy()
    Zl[0, 0] = np.nan
    p["Z_l"] = Zl
    with pytest.raises(CholeskyError) as info:
        client_term(X, y, _blocks(p), p["s2"], client="Dongsi")
    msg = str(info.value)
    assert "K_zz (local)" in msg and "Dongsi" in msg


def test_client_term_bitwise_independent_of_thread_count():
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba was started with fewer than 2 threads (NUMBA_NUM_THREADS)")
    rng = np.random.default_rng(12)
    _, _, p = _params(rng)
    n = 700  # several row groups of the engine's parallel passes
    X = rng.uniform(0.0, 3.0, size=(n, D))
    y = np.sin(2.0 * X[:, 0]) + 0.1 * rng.normal(size=n)
    before = numba.get_num_threads()
    out = {}
    try:
        for t in (1, 2):
            numba.set_num_threads(t)
            value, grads, dnoise, _ = client_term(X, y, _blocks(p), p["s2"])
            flat = [value, dnoise]
            for g in grads:
                flat += [g.Z, g.lengthscale, g.variance, *g.means, *g.chols, *g.coefs]
            out[t] = [np.atleast_1d(np.asarray(a, float)) for a in flat]
    finally:
        numba.set_num_threads(before)
    for a, b in zip(out[1], out[2]):
        assert np.array_equal(a, b), "client_term changes with the thread count"


def test_client_term_without_kernel_gradients_of_a_block(two_block_problem):
    """Skipping a block's kernel gradients changes nothing else, bit for bit."""
    X, y, p, _, _ = two_block_problem
    blocks = _blocks(p)
    full = client_term(X, y, blocks, p["s2"])
    part = client_term(X, y, blocks, p["s2"], kernel_grad=[False, True])
    assert part[0] == full[0] and part[2] == full[2]
    g_full, g_part = full[1], part[1]
    assert g_part[0].Z is None and g_part[0].lengthscale is None and g_part[0].variance is None
    for a, b in zip(g_full[0].means + g_full[0].chols, g_part[0].means + g_part[0].chols):
        np.testing.assert_array_equal(a, b)
    assert g_full[0].coefs == g_part[0].coefs
    np.testing.assert_array_equal(g_full[1].Z, g_part[1].Z)
    np.testing.assert_array_equal(g_full[1].lengthscale, g_part[1].lengthscale)
    assert g_full[1].variance == g_part[1].variance
    with pytest.raises(ValueError, match="one flag per block"):
        client_term(X, y, blocks, p["s2"], kernel_grad=[True])
