"""Method-equivalence tests of the sparse engine (SPEC section 1; issue 2,
"Done means").  The idea follows GPflow's method-equivalence tests: models that
must coincide mathematically are built independently and compared.

* Exact GP: one client, one global-only block, ``Z = X`` (``M = n``) and the
  optimal whitened ``q`` give the exact GP's log marginal likelihood and
  predictions (compared with scikit-learn's ``GaussianProcessRegressor``).
* Centralised sparse GP: for ``M < n`` the same construction equals the
  collapsed SGPR bound of Titsias (2009), computed here in closed form, and
  its hyperparameter gradients (envelope theorem).
* ``phi -> 0`` without a local part: the hierarchical block is one SGPR.
* Federated sum: splitting a client's data into two clients with the same
  noise and summing their terms is exact.

About the jitter.  The engine adds ``1e-6 * var`` to every ``K_zz``
(SPEC section 1).  With ``Z = X`` this perturbs the sparse model by
``Delta = K - Q`` with ``0 <= Delta <= eps I`` (``eps`` the absolute jitter), so
``0 <= log p(y) - ELBO <= tr(Delta) / (2 s2) + eps ||y||^2 / (2 s2^2)``: the gap is
of order ``n eps / s2``, about 5e-6 relative at ``s2 = 0.1, var = 1``.  The
exactness claims to 1e-6 are therefore tested with the engine's jitter
lowered to 1e-12 through ``Block.jitter`` (escalation still active; the
agreement is then ~1e-10), and the engine's default jitter is tested
separately against the bound above and, at ``s2 = 0.5``, against 1e-6
directly for the evidence (1e-5 for the predictions).
"""

import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, WhiteKernel
from sklearn.gaussian_process.kernels import ConstantKernel as Const

from skfedgp._hierarchy import client_objective, global_spec, local_spec
from skfedgp._linalg import DEFAULT_JITTER, jittered_cholesky, solve_lower
from skfedgp._sparse import Block, Component, block_predict, client_term, kl_whitened
from skfedgp.kernels import se_ard

SMALL_JITTER = 1e-12


@pytest.fixture
def small_jitter():
    """Relative jitter 1e-12 instead of the default 1e-6 (``Block.jitter``)."""
    return SMALL_JITTER


def _data(rng, n, d=2):
    X = rng.uniform(0.0, 3.0, size=(n, d))
    y = np.sin(2.0 * X[:, 0]) + 0.4 * X[:, 1] - 0.5 + 0.1 * rng.normal(size=n)
    return X, y


def _optimal_q(X, y, Z, ell, var, s2, jitter=DEFAULT_JITTER):
    """Optimal whitened q(v) = N(m, S) of a single SGPR block (closed form)."""
    Kzz = se_ard(Z, Z, ell, var)
    L, _ = jittered_cholesky(Kzz, scale=var, jitter=jitter)
    W = solve_lower(L, se_ard(X, Z, ell, var).T).T
    S = np.linalg.inv(np.eye(len(Z)) + W.T @ W / s2)
    S = 0.5 * (S + S.T)
    m = S @ W.T @ y / s2
    return m, np.linalg.cholesky(S)


def _elbo(X, y, block, s2):
    """client_term - KL for a single-component block (one client, one block)."""
    comp = block.components[0]
    return client_term(X, y, [block], s2, need_grad=False)[0] - kl_whitened(comp.mean, comp.chol)[0]


def _sklearn_gpr(X, y, ell, var, s2, *, white=False):
    kernel = Const(var, "fixed") * RBF(ell, "fixed")
    if white:
        # noise in the kernel: predict() then returns the std of noisy y
        kernel = kernel + WhiteKernel(s2, "fixed")
        alpha = 0.0
    else:
        alpha = s2
    return GaussianProcessRegressor(kernel, alpha=alpha, optimizer=None,
                                    normalize_y=False).fit(X, y)


# ------------------------------------------------------------- exact GP

@pytest.mark.parametrize("s2", [0.01, 0.1])
def test_exact_gp_log_marginal_likelihood(small_jitter, s2):
    rng = np.random.default_rng(20)
    n = 15
    X, y = _data(rng, n)
    ell, var = np.array([0.8, 1.3]), 1.5
    m, C = _optimal_q(X, y, X, ell, var, s2, jitter=small_jitter)
    elbo = _elbo(X, y, Block(X.copy(), ell, var, [Component(m, C, 1.0)], "global",
                             jitter=small_jitter), s2)
    lml = _sklearn_gpr(X, y, ell, var, s2).log_marginal_likelihood_value_
    assert abs(elbo - lml) <= 1e-6 * abs(lml), (elbo, lml)
    lml_white = _sklearn_gpr(X, y, ell, var, s2, white=True).log_marginal_likelihood_value_
    assert lml_white == pytest.approx(lml, rel=1e-10)  # same model, sanity of the reference


def test_exact_gp_predictions(small_jitter):
    rng = np.random.default_rng(21)
    n, s2 = 15, 0.1
    X, y = _data(rng, n)
    ell, var = np.array([0.7, 1.1]), 1.3
    m, C = _optimal_q(X, y, X, ell, var, s2, jitter=small_jitter)
    block = Block(X.copy(), ell, var, [Component(m, C, 1.0)], "global", jitter=small_jitter)
    Xs = np.vstack([rng.uniform(-0.5, 3.5, size=(12, 2)), X[:3]])  # incl. training inputs
    mean, var_f = block_predict(Xs, block)
    ref_mean, ref_std = _sklearn_gpr(X, y, ell, var, s2).predict(Xs, return_std=True)
    _, ref_std_y = _sklearn_gpr(X, y, ell, var, s2, white=True).predict(Xs, return_std=True)
    scale = np.max(np.abs(ref_mean))
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(np.sqrt(var_f), ref_std, rtol=1e-6)
    np.testing.assert_allclose(np.sqrt(var_f + s2), ref_std_y, rtol=1e-6)
    # full covariance agrees too
    _, cov = block_predict(Xs, block, full_cov=True)
    _, ref_cov = _sklearn_gpr(X, y, ell, var, s2).predict(Xs, return_cov=True)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-6, atol=1e-6 * var)


def test_exact_gp_at_default_jitter():
    """With the engine's own jitter: within the jitter bound, and 1e-6 at s2=0.5."""
    rng = np.random.default_rng(22)
    n = 15
    X, y = _data(rng, n)
    ell, var = np.array([0.8, 1.3]), 1.0
    eps = DEFAULT_JITTER * var
    for s2 in (0.01, 0.1, 0.5):
        m, C = _optimal_q(X, y, X, ell, var, s2)
        block = Block(X.copy(), ell, var, [Component(m, C, 1.0)], "global")
        elbo = _elbo(X, y, block, s2)
        lml = _sklearn_gpr(X, y, ell, var, s2).log_marginal_likelihood_value_
        gap = lml - elbo
        bound = n * eps / (2 * s2) + eps * (y @ y) / (2 * s2**2)
        assert -1e-10 * abs(lml) <= gap <= bound, (s2, gap, bound)
        if s2 == 0.5:
            assert abs(gap) <= 1e-6 * abs(lml), gap
            # The predictive mean is more sensitive: in directions where K has
            # small eigenvalues lambda the jitter enters as s2 eps / (lambda
            # (lambda + s2)), so only 1e-5 is guaranteed here (measured 3.5e-6);
            # see test_exact_gp_predictions for the 1e-6 check.
            Xs = rng.uniform(0.0, 3.0, size=(10, 2))
            mean, var_f = block_predict(Xs, block)
            ref_mean, ref_std_y = _sklearn_gpr(X, y, ell, var, s2, white=True).predict(
                Xs, return_std=True)
            np.testing.assert_allclose(mean, ref_mean, rtol=0, atol=1e-5 * np.max(np.abs(ref_mean)))
            np.testing.assert_allclose(np.sqrt(var_f + s2), ref_std_y, rtol=1e-5)


# ------------------------------------------------- centralised sparse GP

def _collapsed_bound(X, y, Z, ell, var, s2):
    """Titsias (2009) collapsed SGPR bound, K_zz with the engine's jitter."""
    n = len(y)
    Kzz = se_ard(Z, Z, ell, var) + DEFAULT_JITTER * var * np.eye(len(Z))
    Kxz = se_ard(X, Z, ell, var)
    Q = Kxz @ np.linalg.solve(Kzz, Kxz.T)
    A = Q + s2 * np.eye(n)
    logdet = np.linalg.slogdet(A)[1]
    quad = y @ np.linalg.solve(A, y)
    return -0.5 * (n * np.log(2 * np.pi) + logdet + quad) - (n * var - np.trace(Q)) / (2 * s2)


@pytest.fixture
def sgpr_problem():
    rng = np.random.default_rng(23)
    X, y = _data(rng, 40)
    Z = rng.uniform(0.0, 3.0, size=(7, 2))
    return X, y, Z, np.array([0.9, 1.4]), 1.2, 0.15


def test_global_only_equals_collapsed_sgpr(sgpr_problem):
    X, y, Z, ell, var, s2 = sgpr_problem
    m, C = _optimal_q(X, y, Z, ell, var, s2)
    block = Block(Z, ell, var, [Component(m, C, 1.0)], "global")
    elbo = _elbo(X, y, block, s2)
    bound = _collapsed_bound(X, y, Z, ell, var, s2)
    assert elbo == pytest.approx(bound, rel=1e-10)
    # a lower bound of the exact GP evidence, strictly below it for M < n
    lml = _sklearn_gpr(X, y, ell, var, s2).log_marginal_likelihood_value_
    assert elbo < lml
    # any other q is worse
    rng = np.random.default_rng(0)
    other = Block(Z, ell, var, [Component(m + 0.05 * rng.normal(size=len(m)), 0.9 * C, 1.0)])
    assert _elbo(X, y, other, s2) < elbo


def test_sgpr_optimum_is_stationary(sgpr_problem):
    X, y, Z, ell, var, s2 = sgpr_problem
    m, C = _optimal_q(X, y, Z, ell, var, s2)
    _, grads, _, _ = client_term(X, y, [Block(Z, ell, var, [Component(m, C, 1.0)])], s2)
    _, dm_kl, dC_kl = kl_whitened(m, C)
    gm = grads[0].means[0] - dm_kl
    gC = grads[0].chols[0] - dC_kl
    assert np.max(np.abs(gm)) < 1e-9 * max(1.0, np.max(np.abs(dm_kl)))
    assert np.max(np.abs(gC)) < 1e-9 * max(1.0, np.max(np.abs(dC_kl)))


def test_sgpr_hyperparameter_gradients_equal_collapsed_bound_gradients(
        sgpr_problem, numgrad, assert_grad_close):
    """At the optimal q, d ELBO / d theta = d bound / d theta (envelope theorem)."""
    X, y, Z, ell, var, s2 = sgpr_problem
    m, C = _optimal_q(X, y, Z, ell, var, s2)
    _, grads, dnoise, _ = client_term(X, y, [Block(Z, ell, var, [Component(m, C, 1.0)])], s2)
    g = grads[0]
    assert_grad_close(g.Z, numgrad(lambda z: _collapsed_bound(X, y, z, ell, var, s2), Z), "Z")
    assert_grad_close(g.lengthscale,
                      numgrad(lambda e: _collapsed_bound(X, y, Z, e, var, s2), ell), "ell")
    assert_grad_close(g.variance,
                      numgrad(lambda v: _collapsed_bound(X, y, Z, ell, v[0], s2), [var]), "var")
    assert_grad_close(dnoise,
                      numgrad(lambda v: _collapsed_bound(X, y, Z, ell, var, v[0]), [s2]), "s2")


def test_sgpr_predictions_equal_closed_form(sgpr_problem):
    X, y, Z, ell, var, s2 = sgpr_problem
    m, C = _optimal_q(X, y, Z, ell, var, s2)
    block = Block(Z, ell, var, [Component(m, C, 1.0)], "global")
    Xs = np.random.default_rng(1).uniform(-0.5, 3.5, size=(9, 2))
    mean, cov = block_predict(Xs, block, full_cov=True)
    # Titsias (2009) predictive: Sigma = (Kzz + Kzx Kxz / s2)^{-1}
    Kzz = se_ard(Z, Z, ell, var) + DEFAULT_JITTER * var * np.eye(len(Z))
    Kxz, Ksz = se_ard(X, Z, ell, var), se_ard(Xs, Z, ell, var)
    Sigma = np.linalg.inv(Kzz + Kxz.T @ Kxz / s2)
    ref_mean = Ksz @ Sigma @ Kxz.T @ y / s2
    ref_cov = (se_ard(Xs, Xs, ell, var) - Ksz @ np.linalg.solve(Kzz, Ksz.T)
               + Ksz @ Sigma @ Ksz.T)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-7, atol=1e-10)


# ------------------------------------------------------- phi -> 0 is SGPR

def _chol(rng, M):
    C = np.tril(rng.normal(scale=0.2, size=(M, M)), -1)
    C[np.diag_indices(M)] = rng.uniform(0.4, 1.0, size=M)
    return C


def _rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def test_vanishing_deviation_block_is_one_sgpr():
    rng = np.random.default_rng(24)
    X, y = _data(rng, 30)
    M = 6
    Z, ell, var, s2 = rng.uniform(0, 3, size=(M, 2)), np.array([1.0, 1.2]), 0.9, 0.2
    m_g, C_g = rng.normal(size=M), _chol(rng, M)
    m_d, C_d = rng.normal(size=M), _chol(rng, M)  # arbitrary deviation factor
    plain = Block(Z, ell, var, [Component(m_g, C_g, 1.0)], "global")
    out_plain = client_term(X, y, [plain], s2)
    diffs = []
    for phi in (1e-8, 1e-16):
        hier = Block(Z, ell, var,
                     [Component(m_g, C_g, 1.0), Component(m_d, C_d, np.sqrt(phi))], "global")
        out = client_term(X, y, [hier], s2)
        g_h, g_p = out[1][0], out_plain[1][0]
        d = max(
            _rel(out[0], out_plain[0]), _rel(out[2], out_plain[2]),
            _rel(g_h.Z, g_p.Z), _rel(g_h.lengthscale, g_p.lengthscale),
            _rel(g_h.variance, g_p.variance),
            _rel(g_h.means[0], g_p.means[0]), _rel(g_h.chols[0], g_p.chols[0]),
        )
        diffs.append(d)
    # the difference is O(sqrt(phi)): it vanishes as phi -> 0
    assert diffs[1] < 1e-6, diffs
    assert diffs[1] < 1e-3 * diffs[0], diffs


def test_vanishing_deviation_model_equals_global_only_model():
    """Through the Packer: ("global", "deviation") with phi -> 0 and the
    deviation at its prior equals ("global",) — value and shared gradients."""
    rng = np.random.default_rng(25)
    X, y = _data(rng, 30)
    M = 5
    shared = {
        "Z_g": rng.uniform(0, 3, size=(M, 2)), "lengthscale_g": np.array([0.9, 1.3]),
        "variance_g": 1.1, "m_g": rng.normal(size=M), "C_g": _chol(rng, M),
        "noise_variance": 0.25,
    }
    out = {}
    for comps in (("global",), ("global", "deviation")):
        gp, lp = global_spec(comps, M, 2), local_spec(comps, M, 3, 2)
        vals = dict(shared, phi=1e-16, m_d=np.zeros(M), C_d=np.eye(M))
        tg = gp.pack({k: vals[k] for k in gp.names()})
        tl = lp.pack({k: vals[k] for k in lp.names()})
        out[comps] = (gp, lp) + client_objective(tg, tl, X, y, gp, lp, comps)
    gp1, lp1, v1, gl1, gg1 = out[("global",)]
    gp2, lp2, v2, gl2, gg2 = out[("global", "deviation")]
    assert v2 == pytest.approx(v1, rel=1e-12)
    for name in gp1.names():
        assert _rel(gg2[gp2.slices[name]], gg1[gp1.slices[name]]) < 1e-10, name
    assert gl2[lp2.slices["noise_variance"]] == pytest.approx(
        gl1[lp1.slices["noise_variance"]][0], rel=1e-10)


# -------------------------------------------------------- federated sum

def test_split_clients_sum_to_one_client():
    rng = np.random.default_rng(26)
    X, y = _data(rng, 30)
    M = 6
    Z, ell, var, s2 = rng.uniform(0, 3, size=(M, 2)), np.array([1.0, 0.8]), 1.3, 0.3
    block = Block(Z, ell, var, [Component(rng.normal(size=M), _chol(rng, M), 1.0)], "global")
    whole = client_term(X, y, [block], s2)
    idx = rng.permutation(30)
    parts = [client_term(X[i], y[i], [block], s2) for i in (idx[:11], idx[11:])]
    assert parts[0][0] + parts[1][0] == pytest.approx(whole[0], rel=1e-12)
    assert parts[0][2] + parts[1][2] == pytest.approx(whole[2], rel=1e-10)
    gw, ga, gb = whole[1][0], parts[0][1][0], parts[1][1][0]
    for attr in ("Z", "lengthscale", "variance"):
        assert _rel(getattr(ga, attr) + getattr(gb, attr), getattr(gw, attr)) < 1e-10, attr
    assert _rel(ga.means[0] + gb.means[0], gw.means[0]) < 1e-10
    assert _rel(ga.chols[0] + gb.chols[0], gw.chols[0]) < 1e-10

    # and through the flat global vector that clients upload (Algorithm 1)
    comps = ("global",)
    gp, lp = global_spec(comps, M, 2), local_spec(comps, M, 3, 2)
    tg = gp.pack({"Z_g": Z, "lengthscale_g": ell, "variance_g": var,
                  "m_g": block.components[0].mean, "C_g": block.components[0].chol})
    tl = lp.pack({"noise_variance": s2})
    v_all, _, g_all = client_objective(tg, tl, X, y, gp, lp, comps)
    v_a, _, g_a = client_objective(tg, tl, X[idx[:11]], y[idx[:11]], gp, lp, comps)
    v_b, _, g_b = client_objective(tg, tl, X[idx[11:]], y[idx[11:]], gp, lp, comps)
    assert v_a + v_b == pytest.approx(v_all, rel=1e-12)
    assert _rel(g_a + g_b, g_all) < 1e-10
