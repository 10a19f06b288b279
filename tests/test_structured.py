"""The structured (collapsed) variational family: exactness against a dense
hierarchical GP, analytic gradients against finite differences, the fitted
state's consistency, its messages and the default fit on the regressor
issue's inputs."""

import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp import federated as fed
from skfedgp._structured import (
    client_backward,
    client_forward,
    client_posterior,
    combine,
    feature_blocks,
    layout_map,
    predict_structured,
)
from skfedgp.federated import message_arrays, message_nbytes
from skfedgp.kernels import se_ard

ALL = ("global", "deviation", "local")
SUBSETS = [ALL, ("global", "local"), ("deviation", "local"), ("global",), ("local",),
           ("global", "deviation")]


def se(A, B, ell, var):
    """Plain NumPy SE-ARD kernel (independent of skfedgp.kernels)."""
    D = (A[:, None, :] - B[None, :, :]) / np.asarray(ell)
    return var * np.exp(-0.5 * np.sum(D**2, axis=-1))


def _clients(sizes=(12, 9, 7), d=2, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.uniform(size=(n, d)) for n in sizes]
    ys = [np.sin(3 * X[:, 0]) + 0.5 * k * X[:, 1] + 0.1 * rng.normal(size=len(X))
          for k, X in enumerate(Xs)]
    return Xs, ys


def _params(Xs, Zg, Zls, seed=1):
    G = dict(Z_g=Zg, lengthscale_g=np.array([0.4, 0.7]), variance_g=1.3, phi=0.3,
             level_variance=0.7)
    Bs = [dict(Z_l=Zl, lengthscale_l=np.array([0.2, 0.3]) * (1 + 0.1 * k),
               variance_l=0.5 + 0.1 * k, noise_variance=0.05 + 0.01 * k)
          for k, Zl in enumerate(Zls)]
    return G, Bs


def _elbo(Xs, ys, G, Bs, comps=ALL, jitter=1e-6):
    sts = [client_forward(X, y, feature_blocks(G, B, comps, jitter=jitter), comps,
                          B["noise_variance"], G["phi"], scale=B.get("client_scale", 1.0))
           for X, y, B in zip(Xs, ys, Bs)]
    M = G["Z_g"].shape[0] if "global" in comps else 0
    return combine([s.S for s in sts], [s.b for s in sts], [s.e for s in sts], M), sts


def _dense_cov(Xs, G, Bs, comps=ALL):
    """Prior covariance of all clients' targets of the exact hierarchical GP."""
    Xall = np.vstack(Xs)
    N = Xall.shape[0]
    off = np.cumsum([0] + [len(X) for X in Xs])
    C = np.zeros((N, N))
    # client i's function is level_i + s_i (g + d_i) + l_i
    s = np.concatenate([np.full(len(X), B.get("client_scale", 1.0)) for X, B in zip(Xs, Bs)])
    if "global" in comps:
        C += np.outer(s, s) * se(Xall, Xall, G["lengthscale_g"], G["variance_g"])
    for k, (X, B) in enumerate(zip(Xs, Bs)):
        sl = slice(off[k], off[k + 1])
        if "deviation" in comps:
            C[sl, sl] += (B.get("client_scale", 1.0) ** 2 * G["phi"]
                          * se(X, X, G["lengthscale_g"], G["variance_g"]))
        if "local" in comps:
            C[sl, sl] += se(X, X, B["lengthscale_l"], B["variance_l"])
        C[sl, sl] += G.get("level_variance", 0.0)  # the client's random level
        C[sl, sl] += B["noise_variance"] * np.eye(len(X))
    return C


# --------------------------------------------------------------------------
# exactness: inducing inputs = training inputs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("level", [True, False])
@pytest.mark.parametrize("sizes", [(12, 9), (12, 9, 7)])
@pytest.mark.parametrize("comps", [ALL, ("global", "local"), ("global", "deviation"),
                                   ("deviation", "local")])
def test_elbo_equals_exact_log_marginal_likelihood(sizes, comps, level, scaled):
    """M = n, Z = X: the collapsed bound is the exact log marginal likelihood of
    the hierarchical GP (shared function, deviation, local part, the clients'
    random levels ``N(0, level_variance)`` and noise; ``scaled``: client
    scales ``s_i`` on the shared parts, cross-covariance ``s_i s_j k_g``)."""
    Xs, ys = _clients(sizes)
    G, Bs = _params(Xs, np.vstack(Xs), [X.copy() for X in Xs])
    if scaled:
        for k, B in enumerate(Bs):
            B["client_scale"] = (0.3, 1.7, 0.01)[k]
    if not level:
        del G["level_variance"]
    post, _ = _elbo(Xs, ys, G, Bs, comps, jitter=1e-10)
    C = _dense_cov(Xs, G, Bs, comps)
    y = np.concatenate(ys)
    L = np.linalg.cholesky(C)
    a = np.linalg.solve(L, y)
    lml = -0.5 * a @ a - np.sum(np.log(np.diag(L))) - 0.5 * len(y) * np.log(2 * np.pi)
    assert abs(post.elbo - lml) < 1e-6


@pytest.mark.parametrize("scaled", [False, True])
def test_predictive_mean_and_covariance_equal_exact_posterior(scaled):
    Xs, ys = _clients((12, 9, 7))
    G, Bs = _params(Xs, np.vstack(Xs), [X.copy() for X in Xs])
    sc = (0.3, 1.7, 0.01) if scaled else (1.0, 1.0, 1.0)
    for B, s_ in zip(Bs, sc):
        B["client_scale"] = s_
    post, sts = _elbo(Xs, ys, G, Bs, jitter=1e-10)
    rng = np.random.default_rng(5)
    Xt = rng.uniform(size=(6, 2))
    Xall, y = np.vstack(Xs), np.concatenate(ys)
    C = _dense_cov(Xs, G, Bs)
    off = np.cumsum([0] + [len(X) for X in Xs])
    for i, (X, B, st) in enumerate(zip(Xs, Bs, sts)):
        # exact: cross covariance of client i's latent f at Xt with all targets
        s_all = np.concatenate([np.full(len(X_), s_) for X_, s_ in zip(Xs, sc)])
        Kx = sc[i] * s_all * se(Xt, Xall, G["lengthscale_g"], G["variance_g"])
        sl = slice(off[i], off[i + 1])
        Kx[:, sl] += sc[i] ** 2 * G["phi"] * se(Xt, X, G["lengthscale_g"], G["variance_g"])
        Kx[:, sl] += se(Xt, X, B["lengthscale_l"], B["variance_l"]) + G["level_variance"]
        Kss = (sc[i] ** 2 * (1 + G["phi"]) * se(Xt, Xt, G["lengthscale_g"], G["variance_g"])
               + se(Xt, Xt, B["lengthscale_l"], B["variance_l"]) + G["level_variance"])
        m_exact = Kx @ np.linalg.solve(C, y)
        c_exact = Kss - Kx @ np.linalg.solve(C, Kx.T)
        mu_u, Sigma_u, _ = client_posterior(st, post.mu, post.A_inv)
        blocks = feature_blocks(G, B, ALL, jitter=1e-10)
        E, _ = layout_map(blocks, ALL, G["phi"], sc[i])
        m, c = predict_structured(Xt, blocks, ALL, G["phi"], mu_u, Sigma_u, E, full_cov=True,
                                  scale=sc[i])
        assert_allclose(m, m_exact, atol=1e-6)
        assert_allclose(c, c_exact, atol=1e-6)
        _, v = predict_structured(Xt, blocks, ALL, G["phi"], mu_u, Sigma_u, E, scale=sc[i])
        assert_allclose(v, np.diag(c), atol=1e-10)
        parts = predict_structured(Xt, blocks, ALL, G["phi"], mu_u, Sigma_u, E,
                                   full_cov=True, per_component=True, scale=sc[i])
        assert_allclose(sum(m_ for m_, _ in parts.values()), m_exact, atol=1e-6)


# --------------------------------------------------------------------------
# analytic gradients against central finite differences
# --------------------------------------------------------------------------


def _fd(f, v, h=1e-6):
    v = np.array(v, dtype=float)
    out = np.zeros_like(v)
    for k in range(v.size):
        vp, vm = v.copy(), v.copy()
        vp.flat[k] += h
        vm.flat[k] -= h
        out.flat[k] = (f(vp if v.ndim else float(vp)) - f(vm if v.ndim else float(vm))) / (2 * h)
    return out


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("comps", SUBSETS, ids=["+".join(c) for c in SUBSETS])
def test_gradients_match_finite_differences(comps, scaled):
    Xs, ys = _clients((12, 9, 7))
    rng = np.random.default_rng(3)
    G, Bs = _params(Xs, rng.uniform(size=(6, 2)), [rng.uniform(size=(4, 2)) for _ in Xs])
    if scaled:
        for k, B in enumerate(Bs):
            B["client_scale"] = (0.6, 1.4, 0.2)[k]
    post, sts = _elbo(Xs, ys, G, Bs, comps)
    grads = [client_backward(s, X, y, post.mu, post.A_inv) for s, X, y in zip(sts, Xs, ys)]

    def F(G_, Bs_):
        return _elbo(Xs, ys, G_, Bs_, comps)[0].elbo

    shared = "global" in comps or "deviation" in comps
    keys_g = [k for k in ("Z_g", "lengthscale_g", "variance_g") if shared]
    keys_g += ["phi"] if "deviation" in comps else []
    keys_g += ["level_variance"]
    for key in keys_g:
        analytic = sum(np.asarray(g[key]) for g in grads)
        numeric = _fd(lambda v: F({**G, key: v}, Bs), G[key])
        assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6 * np.abs(numeric).max())
    keys_l = (["Z_l", "lengthscale_l", "variance_l"] if "local" in comps else [])
    keys_l += ["client_scale"] if scaled and shared else []
    for key in keys_l + ["noise_variance"]:
        k = 1

        def f(v, key=key):
            Bs_ = list(Bs)
            Bs_[k] = {**Bs[k], key: v}
            return F(G, Bs_)

        numeric = _fd(f, Bs[k][key])
        assert_allclose(grads[k][key], numeric, rtol=1e-5, atol=1e-6 * np.abs(numeric).max())


def test_local_surrogate_touches_the_bound_and_its_gradient_matches():
    """The local phase's objective (q(v_g) fixed) is a lower bound that touches the ELBO."""
    Xs, ys = _clients((12, 9, 7))
    rng = np.random.default_rng(4)
    G, Bs = _params(Xs, rng.uniform(size=(6, 2)), [rng.uniform(size=(4, 2)) for _ in Xs])
    post, sts = _elbo(Xs, ys, G, Bs)
    k = 2
    mu, Ainv = post.mu, post.A_inv

    def part(st):
        return -0.5 * st.e + st.b @ mu - 0.5 * (np.sum(st.S * Ainv) + mu @ st.S @ mu)

    others = sum(part(s) for j, s in enumerate(sts) if j != k)

    def surrogate(B):
        st = client_forward(Xs[k], ys[k], feature_blocks(G, B, ALL), ALL, B["noise_variance"],
                            G["phi"])
        # the uncollapsed bound with q(v_g) = N(mu, A^{-1}) fixed: clients' parts - KL
        kl = 0.5 * (np.trace(Ainv) + mu @ mu - len(mu) - np.linalg.slogdet(Ainv)[1])
        return part(st) + others - kl, st

    val, st = surrogate(Bs[k])
    assert_allclose(val, post.elbo, rtol=1e-10)  # touches at the current point
    B2 = {**Bs[k], "variance_l": 0.9, "noise_variance": 0.02}
    Bs2 = list(Bs)
    Bs2[k] = B2
    assert surrogate(B2)[0] <= _elbo(Xs, ys, G, Bs2)[0].elbo + 1e-10  # below elsewhere
    st2 = surrogate(B2)[1]
    g = client_backward(st2, Xs[k], ys[k], post.mu, post.A_inv, want_global=False)
    for key in ("lengthscale_l", "variance_l", "noise_variance", "Z_l"):
        numeric = _fd(lambda v: surrogate({**B2, key: v})[0], B2[key])
        assert_allclose(g[key], numeric, rtol=1e-5, atol=1e-6 * np.abs(numeric).max())


# --------------------------------------------------------------------------
# the fitted estimator
# --------------------------------------------------------------------------

SMALL = dict(random_state=0, n_rounds=6)


@pytest.fixture(scope="module")
def two_clients():
    rng = np.random.default_rng(12)
    XA, XB = rng.uniform(size=40), rng.uniform(size=40)
    yA = np.sin(6 * XA) + 0.05 * rng.normal(size=40)
    yB = np.sin(6 * XB) + 0.05 * rng.normal(size=40)
    X = np.r_[XA, XB][:, None]
    y = np.r_[yA, yB]
    g = np.array(["A"] * 40 + ["B"] * 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(**SMALL).fit(X, y, g)
    return X, y, g, est


@pytest.fixture(scope="module", params=["two clients", "with a client in other units"])
def fitted(request, two_clients):
    """``two_clients``, or the same plus a client "C" of 20 rows of ``1e-3 sin 6x``
    (another unit), every client learning its scale on the shared parts
    (``client_scale=True``)."""
    if request.param == "two clients":
        return two_clients
    X, y, g, _ = two_clients
    rng = np.random.default_rng(4)
    xc = rng.uniform(size=20)
    X = np.r_[X, xc[:, None]]
    y = np.r_[y, 1e-3 * (np.sin(6 * xc) + 0.05 * rng.normal(size=20))]
    g = np.r_[g, ["C"] * 20]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(client_scale=True, **SMALL).fit(X, y, g)
    assert all("shared_amplitude" in c.local_values() for c in est.clients_.values())
    assert est.client_scales_["C"] < 0.01
    return X, y, g, est


def _recompute(est, X, y, g):
    """Fresh statistics at the fitted hyperparameters, from the data (held by the test)."""
    srv = est.server_
    G = srv.global_pack.unpack(srv.theta_global)
    sts = {}
    for lab, c in est.clients_.items():
        rows = g == lab
        Xs = (X[rows] - srv.x_offset) / srv.x_scale
        ys = (y[rows] - est.y_offset_) / est.y_scale_
        B = c.local_values()
        sts[lab] = (client_forward(Xs, ys, feature_blocks(G, B, est.components_),
                                   est.components_, B["noise_variance"], G.get("phi", 1.0),
                                   scale=est.client_scales_[lab]),
                    Xs, ys)
    Mg = est.global_posterior_["mean"].shape[0]
    post = combine([s.S for s, _, _ in sts.values()], [s.b for s, _, _ in sts.values()],
                   [s.e for s, _, _ in sts.values()], Mg)
    return G, sts, post


def test_fitted_state_is_consistent(fitted):
    X, y, g, est = fitted
    G, sts, post = _recompute(est, X, y, g)
    # the last ELBO reported is that of the returned model
    # rtol 3e-8 (1e-6 nats here): the held 1-D design has cond(K_zz) ~ 1e11, and
    # the recomputation works with uncentred targets, the fit with centred ones
    # (round-off 7e-9 with the whitened Gram, 1.1e-8 with whitened rows)
    assert_allclose(est.elbo_history_[-1], post.elbo, rtol=3e-8)
    # every Gaussian factor is the exact optimum for the final hyperparameters
    assert_allclose(est.global_posterior_["mean"], post.mu, atol=1e-9)
    assert_allclose(est.global_posterior_["covariance"], post.A_inv, atol=1e-9)
    for lab, (st, _, _) in sts.items():
        mu_u, Sigma_u, H = client_posterior(st, post.mu, post.A_inv)
        assert_allclose(est.clients_[lab].posterior["mu_u"], mu_u, atol=1e-9)
        assert_allclose(est.clients_[lab].posterior["Sigma_u"], Sigma_u, atol=1e-9)
    # the objective (ELBO + the hyperpriors) never decreases (block
    # coordinate ascent), and is the ELBO plus the recomputed log priors: the
    # log-normal one of the noise variance (clients whose own pilot is not
    # reliable), the exponential one of the local standard deviation and the
    # server's gamma(2, 0) one of the levels' standard deviation, log tau
    obj = np.asarray(est.objective_history_)
    assert np.all(np.diff(obj) >= -1e-9 * np.abs(obj[1:]))
    lp = np.log(np.sqrt(G["level_variance"]))
    for c in est.clients_.values():
        B = c.local_values()
        if c.noise_hyperprior:
            delta = np.log(B["noise_variance"]) - np.log(c.prior_noise)
            lp += -0.5 * (delta / est.noise_prior_scale) ** 2
        lp += -c.prior_local["sd_rate"] * np.sqrt(B["variance_l"])
        if c.n_samples < fed.LOCAL_LENGTHSCALE_PRIOR_POINTS:  # log ell_l ~ N(log ell_pop, sd^2)
            lp += -0.5 * np.sum(((np.log(B["lengthscale_l"])
                                  - c.prior_local["lengthscale_centre"]) / fed.LOCAL_PRIOR_SD) ** 2)
        if "shared_amplitude" in B:  # log a_i ~ N(log a_c, sd^2), s_i = a_i / sqrt(variance_g)
            a = B["shared_amplitude"]
            lp += -0.5 * ((np.log(a) - c.prior_local["log_amplitude_centre"])
                          / fed.CLIENT_SCALE_PRIOR_SD) ** 2
            assert_allclose(est.client_scales_[c.client_id], a / np.sqrt(G["variance_g"]),
                            rtol=1e-14)
        else:
            assert est.client_scales_[c.client_id] == 1.0
    assert_allclose(obj[-1], est.elbo_history_[-1] + lp, rtol=1e-10)


def test_joint_covariance_across_clients_matches_dense_joint_posterior(fitted):
    """Cross-client covariance through v_g, against the dense arrow-shaped joint precision
    (with a client scale: ``s_A s_C`` times the shared parts' covariance)."""
    X, y, g, est = fitted
    G, sts, post = _recompute(est, X, y, g)
    Xt = np.array([[0.1], [0.5], [0.9]])
    labs = ["A", "B" if "C" not in est.clients_ else "C"]
    _, cov = est.predict(np.vstack([Xt, Xt]), [labs[0]] * 3 + [labs[1]] * 3, return_cov=True)
    # dense joint posterior of (v_g, c_1, ..., c_T) over every client: precision
    # built from P_i, G_i and S_i
    everyone = list(est.clients_)
    st = {lab: sts[lab][0] for lab in everyone}
    Mg = post.mu.shape[0]
    sizes = [Mg] + [st[lab].PiGt.shape[0] for lab in everyone]
    off = np.cumsum([0] + sizes)
    Lam = np.zeros((off[-1], off[-1]))
    Lam[:Mg, :Mg] = np.eye(Mg)
    for j, lab in enumerate(everyone, start=1):
        s = st[lab]
        # P from its factor, or (data-space elimination, n_i < N_c) from P^{-1}
        P = s.Lp @ s.Lp.T if s.Lp is not None else np.linalg.inv(s.Pinv)
        GT = P @ s.PiGt  # G^T = P (P^{-1} G^T), shape (M_c, M)
        sl = slice(off[j], off[j + 1])
        Lam[sl, sl] = P
        Lam[:Mg, sl] = GT.T
        Lam[sl, :Mg] = GT
        Lam[:Mg, :Mg] += s.S + GT.T @ s.PiGt  # = W_g^T W_g / s2_i
    Sigma = np.linalg.inv(Lam)
    srv = est.server_
    Xts = (Xt - srv.x_offset) / srv.x_scale
    feats = {}
    for j, lab in enumerate(everyone, start=1):
        if lab not in labs:
            continue
        B = est.clients_[lab].local_values()
        blocks = feature_blocks(G, B, est.components_)
        E, n_vg = layout_map(blocks, est.components_, G["phi"], est.client_scales_[lab])
        Ws = []
        for name, Z, ell, var, jit in blocks:
            if name == "c":  # the client's random level: one feature sqrt(level_variance)
                Ws.append(np.full((len(Xts), 1), np.sqrt(var)))
                continue
            K = se(Z, Z, ell, var) + jit * var * np.eye(len(Z))
            Ws.append(np.linalg.solve(np.linalg.cholesky(K), se(Xts, Z, ell, var).T).T)
        Fs = np.hstack(Ws)
        idx = np.r_[np.arange(Mg), off[j] + np.arange(sizes[j])]
        feats[lab] = (Fs @ E, idx)
    FA, iA = feats[labs[0]]
    FB, iB = feats[labs[1]]
    sA, sB = (est.client_scales_[lab] for lab in labs)
    Wg = FA[:, :Mg] / sA  # the global features (E's v_g columns are s_A times the identity)
    resid_g = sA * sB * (se(Xts, Xts, G["lengthscale_g"], G["variance_g"]) - Wg @ Wg.T)
    cross = FA @ Sigma[np.ix_(iA, iB)] @ FB.T + resid_g
    assert_allclose(cov[:3, 3:] / est.y_scale_**2, cross, atol=1e-8)


def test_unseen_client_variance_pinned(fitted):
    """Global posterior + deviation prior phi*k_g + population local prior + noise
    + a new draw of the client level, ``level_variance (T + 1) / (T - 1)`` (the
    level variance and the pooled mean being estimates from T clients); the
    shared parts at the clients' median scale ``s``."""
    X, y, g, est = fitted
    srv = est.server_
    G = srv.global_pack.unpack(srv.theta_global)
    pop = est._population_local
    Xt = np.array([[0.05], [0.37], [0.81]])
    Xts = (Xt - srv.x_offset) / srv.x_scale
    Z, ell, var = G["Z_g"], G["lengthscale_g"], G["variance_g"]
    L = np.linalg.cholesky(se(Z, Z, ell, var) + 1e-6 * var * np.eye(len(Z)))
    W = np.linalg.solve(L, se(Xts, Z, ell, var).T).T
    Ainv = est.global_posterior_["covariance"]
    T = len(est.clients_)
    assert T in (2, 3)
    s_new = float(np.median(list(est.client_scales_.values())))
    assert (s_new != 1.0) == (T == 3)  # learned scales: the median is one of them
    spread = G["level_variance"] * (T + 1) / (T - 1)
    expected = (s_new**2 * (np.einsum("ij,jk,ik->i", W, Ainv, W) + var - np.sum(W**2, axis=1)
                            + G["phi"] * var)
                + pop["variance_l"] + pop["noise_variance"] + spread)
    mean, std = est.predict(Xt, ["never-seen"] * 3, return_std=True)
    assert_allclose(std**2, est.y_scale_**2 * expected, rtol=1e-8)
    # a new client's level is centred at the pooled mean
    assert_allclose(mean, est.y_offset_ + est.y_scale_ * s_new * (W @ est.global_posterior_["mean"]),
                    rtol=1e-10)


def test_unseen_client_band_covers_another_level():
    """Clients on different levels: a held-out client's readings lie within
    the never-seen prediction's band (before, the band left out the spread of
    the clients' levels: std about 0.3 against an error of about 1.2)."""
    rng = np.random.default_rng(5)
    levels = np.linspace(-1.5, 1.5, 8)
    X = rng.uniform(0, 10, (8 * 25, 1))
    g = np.repeat(np.arange(8), 25)
    y = np.sin(X[:, 0]) + levels[g] + 0.1 * rng.standard_normal(g.size)
    keep = g != 6
    est = FederatedHierarchicalGPRegressor(random_state=0).fit(X[keep], y[keep], g[keep])
    Xt = np.linspace(0.5, 9.5, 40)[:, None]
    m, s = est.predict(Xt, ["new"] * 40, return_std=True)
    z = np.abs(np.sin(Xt[:, 0]) + levels[6] - m) / s
    assert np.max(z) < 3.0
    tau2 = est.level_variance_
    spread = tau2 * (7 + 1) / (7 - 1)
    parts = est.predict_components(Xt, ["new"] * 40)
    assert_allclose(parts["offset"][1] ** 2, spread, rtol=1e-10)
    assert np.all(s**2 > spread)
    # joint covariance: far apart (no kernel coupling left), two rows of one
    # new client share the whole level variance, two different new clients
    # the estimated centre's share tau^2/(T - 1), a fitted and a new client nothing
    # beyond the global posterior
    far = np.array([[-1e4], [1e4], [-2e4], [2e4], [3e4]])
    labs = ["new", "new", "other", "other", 0]
    _, C = est.predict(far, labs, return_cov=True)
    _, sd = est.predict(far, labs, return_std=True)
    assert_allclose(np.sqrt(np.diag(C)), sd, rtol=1e-10)
    share = tau2 / (7 - 1)
    assert_allclose(C[0, 1], spread, rtol=1e-6)
    assert_allclose(C[2, 3], spread, rtol=1e-6)
    assert_allclose([C[0, 2], C[1, 3], C[0, 3]], share, rtol=1e-6)
    assert abs(C[0, 4]) < 1e-6 * spread


def test_start_lengthscale_caps_at_five_spans():
    """Pilot lengthscales far beyond the data start at 5 spans; shorter ones,
    and dimensions without spread, are kept."""
    out = fed.start_lengthscale(np.array([274.0, 0.3, 50.0, 7.0]),
                                np.array([1.0, 1.0, 0.0, 2.0]))
    assert_allclose(out, [5.0, 0.3, 50.0, 7.0])
    assert fed.START_MAX_SPANS == 5.0
    # in a fit: a pilot that calls an input irrelevant does not start there
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (200, 3))
    y = np.sin(3 * X[:, 0]) + 0.02 * X[:, 1] + 0.05 * rng.standard_normal(200)
    est = FederatedHierarchicalGPRegressor(n_rounds=0, random_state=0).fit(
        X, y, np.repeat([0, 1], 100))
    G = est.server_.global_pack.unpack(est.server_.theta_global)
    assert np.all(G["lengthscale_g"] <= 5.0 * (1 + 1e-12))
    for c in est.clients_.values():
        assert np.all(c.local_values()["lengthscale_l"] <= 5.0 * 1.0 + 1e-9)


def test_no_client_data_in_fitted_model(two_clients):
    X, y, g, est = two_clients
    blob = pickle.dumps(est)
    # the per-feature extremes of the inputs are the documented bounding box of
    # the set-up message (ClientSummary); every other raw value must be absent
    box = {X.min(), X.max()}
    for v in np.concatenate([X.ravel(), y]):
        if v not in box:
            assert np.float64(v).tobytes() not in blob
    for c in est.clients_.values():
        assert getattr(c, "_Xs", None) is None and getattr(c, "_y", None) is None


# --------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------


@pytest.fixture
def structured_spy(monkeypatch):
    log = {"pilot": [], "statistics": [], "gradients": [], "final": [], "design": [],
           "pool": [], "input_scale": []}
    S = fed.StructuredClient
    orig = {name: getattr(S, name) for name in ("pilot", "statistics", "global_gradient",
                                                "finish", "design_residual", "pool_evidence",
                                                "input_scale_check")}

    def wrap(name, key):
        def f(self, *a, **k):
            out = orig[name](self, *a, **k)
            log[key].append((self.client_id, out))
            return out
        return f

    monkeypatch.setattr(S, "pilot", wrap("pilot", "pilot"))
    monkeypatch.setattr(S, "statistics", wrap("statistics", "statistics"))
    monkeypatch.setattr(S, "global_gradient", wrap("global_gradient", "gradients"))
    monkeypatch.setattr(S, "finish", wrap("finish", "final"))
    monkeypatch.setattr(S, "design_residual", wrap("design_residual", "design"))
    monkeypatch.setattr(S, "pool_evidence", wrap("pool_evidence", "pool"))
    monkeypatch.setattr(S, "input_scale_check", wrap("input_scale_check", "input_scale"))
    return log


def _fit_sizes(sizes, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, size=(sum(sizes), 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=X.shape[0])
    g = np.repeat([f"c{k}" for k in range(len(sizes))], sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # one training run (restart_from_global has its own accounting test)
        est = FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=5, n_rounds=2,
                                               global_steps=3, local_steps=3, random_state=0,
                                               restart_from_global=False).fit(X, y, g)
    return est, X, y, g


def test_server_bound_messages_fixed_size_and_free_of_raw_data(structured_spy):
    # three small clients: they also fit the pooled pilot (PoolEvidence messages)
    est, X, y, g = _fit_sizes((8, 10, 14, 300))
    M, P = 8, est.server_.global_pack.size
    log = structured_spy
    for key in ("pilot", "statistics", "gradients", "final", "design", "pool", "input_scale"):
        assert log[key], key
        by_client = {}
        for cid, msg in log[key]:
            if msg is None:
                continue
            by_client.setdefault(cid, set()).add(
                tuple(sorted((n, a.shape) for n, a in message_arrays(msg).items())))
            Xi, yi = X[g == cid], y[g == cid]
            for name, a in message_arrays(msg).items():
                if name == "round":
                    continue
                assert not np.isin(a, Xi).any(), (key, name)
                assert not np.isin(a, yi).any(), (key, name)
        # a 300-row client sends arrays of the same shapes as a 6-row one
        shapes = list(by_client.values())
        assert key != "pool" or set(by_client) == {"c0", "c1", "c2"}  # the small ones
        assert all(s == shapes[0] for s in shapes), key
    st = log["statistics"][0][1]
    assert st.precision.shape == (M, M) and st.shift.shape == (M,)
    assert log["gradients"][0][1].grad_global.shape == (P,)


def test_communication_accounts_for_every_upload(structured_spy, monkeypatch):
    sizes = (20, 40, 9, 12)
    est, X, *_ = _fit_sizes(sizes)
    log = structured_spy
    up = sum(message_nbytes(m) for key in ("statistics", "gradients", "final", "design")
             for _, m in log[key])
    # learn_inducing_locations="auto": four numbers per client at set-up and
    # at every re-check while Z_g is held
    assert len(log["design"]) == len(sizes) * len(est.server_.design_residual_history_)
    up_setup = sum(message_nbytes(m) for key in ("pilot", "pool", "input_scale")
                   for _, m in log[key] if m is not None)
    # the input-scale check: d numbers per client (client scales on by default)
    assert [message_nbytes(m) for _, m in log["input_scale"]] == [2 * 8] * len(sizes)
    assert {c for c, _ in log["pool"]} == {"c0", "c2", "c3"}  # 20, 9 and 12 rows
    summaries = len(sizes) * (3 * 8 + 2 * 2 * 8)  # n, sum, centred sum of squares, box
    assert sum(c["bytes_up"] for c in est.communication_) == up + up_setup + summaries
    # downloads: each pool exchange sends the d + 2 log hyperparameters, and
    # the population's values sent to every client carry the pooled clients'
    # spread when it was measured and their pooled noise when they are
    # centred there (one more number each); the same fit without the pool
    # differs at set-up by exactly that
    n_pool = len(log["pool"])
    pop = est.server_.population_pilot
    spread = (pop.noise_spread is not None) + (pop.noise_pooled is not None)
    monkeypatch.setattr(fed, "PILOT_POOL_MIN_CLIENTS", 10**6)
    without = _fit_sizes(sizes)[0]
    assert without.server_.population_pilot.noise_spread is None
    assert (est.communication_[0]["bytes_down"] - without.communication_[0]["bytes_down"]
            == n_pool * 8 * (X.shape[1] + 2) + 8 * len(sizes) * spread)


def test_thread_parallel_and_serial_identical():
    a = _fit_sizes((20, 40, 9))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        rng = np.random.default_rng(0)
        X = rng.uniform(-3.0, 3.0, size=(69, 2))
        y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=69)
        g = np.repeat(["c0", "c1", "c2"], (20, 40, 9))
        b = FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=5, n_rounds=2,
                                             global_steps=3, local_steps=3, random_state=0,
                                             n_jobs=2, restart_from_global=False).fit(X, y, g)
    assert_array_equal(a.elbo_history_, b.elbo_history_)
    assert_array_equal(a.predict(X, g), b.predict(X, g))


# --------------------------------------------------------------------------
# defaults on the regressor issue's inputs
# --------------------------------------------------------------------------


def test_noise_free_sine_one_client_at_defaults():
    k = np.arange(40.0)
    X, y = k[:, None], np.sin(2 * np.pi * k / 20)
    est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y)
    m, s = est.predict(X, return_std=True)
    assert np.max(np.abs(m - y)) < 0.01
    assert np.mean(np.abs(m - y) > 3 * s) <= 0.01
    xt = np.linspace(0.5, 38.5, 39)[:, None]
    mt, st = est.predict(xt, return_std=True)
    ft = np.sin(2 * np.pi * xt[:, 0] / 20)
    assert np.mean(np.abs(mt - ft) > 3 * st) <= 0.01
    # the returned model is the best of the run: the objective (ELBO + the
    # clients' log hyperpriors) ends at its maximum, and the ELBO within a nat of its
    # own (the stale posterior ended 36 nats below its peak)
    assert est.objective_history_[-1] == max(est.objective_history_)
    assert est.elbo_history_[-1] >= max(est.elbo_history_) - 1.0


def test_two_clients_sine_at_defaults(two_clients):
    X, y, g, _ = two_clients
    est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    xg = np.linspace(0, 1, 19)[:, None]
    for lab in ("A", "B"):
        m, s = est.predict(xg, [lab] * 19, return_std=True)
        f = np.sin(6 * xg[:, 0])
        assert np.sqrt(np.mean((m - f) ** 2)) < 0.05
        assert np.mean(np.abs(m - f) > 3 * s) <= 0.01
        mt, st = est.predict(X[g == lab], g[g == lab], return_std=True)
        assert np.mean(np.abs(mt - y[g == lab]) > 3 * st) <= 0.01


# --------------------------------------------------------------------------
# the mean-field family also ends consistent
# --------------------------------------------------------------------------


@pytest.mark.parametrize("update", ["closed_form", "adam"])
def test_mean_field_fit_ends_at_the_factors_optimum(two_clients, update):
    from skfedgp._hierarchy import client_objective, server_objective

    X, y, g, _ = two_clients
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(
            variational_family="mean_field", optimizer="adam", variational_update=update,
            n_rounds=3, local_steps=10, n_inducing=8, n_inducing_local=6,
            random_state=0).fit(X, y, g)
    srv = est.server_
    gpack = srv.global_pack
    elbo, grad_g = server_objective(srv.theta_global, gpack)
    for lab, c in est.clients_.items():
        assert c._X is None and c._Xs is None  # no data kept
        rows = g == lab
        Xs = (X[rows] - srv.x_offset) / srv.x_scale
        ys = (y[rows] - est.y_offset_) / est.y_scale_
        v, gl, gg = client_objective(srv.theta_global, c.theta_local, Xs, ys, gpack,
                                     c.local_pack, est.components_)
        elbo += v
        grad_g = grad_g + gg
        assert np.max(np.abs(gl[c.local_pack.variational_mask()])) < 1e-5
    assert np.max(np.abs(grad_g[gpack.variational_mask()])) < 1e-5
    # the last ELBO reported is that of the returned model
    assert_allclose(est.elbo_history_[-1], elbo, rtol=1e-10)


def test_auto_inducing_budget_is_the_largest_affordable_size():
    """``budget_inducing`` returns the largest M whose estimated evaluation cost
    fits the budget; more or larger clients afford fewer points."""
    from skfedgp.federated import AUTO_MAX_LOCAL, budget_inducing

    comps = ("global", "deviation", "local")
    sizes = [584] * 12

    def cost(M):
        n = np.asarray(sizes, float)
        f = M + np.minimum(n, AUTO_MAX_LOCAL)
        return float(np.sum(n * f**2 + 4.0 * f**3) + M**3)

    M = budget_inducing(sizes, comps, budget=5e9)
    assert cost(M) <= 5e9 < cost(M + 1)
    assert budget_inducing(sizes * 2, comps, budget=5e9) < M
    assert budget_inducing([5000] * 12, comps, budget=5e9) < M
    assert budget_inducing(sizes, comps, budget=5e10) > M


def test_design_share_against_a_dense_nystrom():
    """``design_share`` is ``1 - sum q(x, x) / sum k(x, x)`` with the Nystrom
    ``q(x, x) = k(x, Z) K_zz^{-1} k(Z, x)``; 0 with ``Z = X``, near 1 with a
    single far point."""
    from skfedgp.federated import design_share

    rng = np.random.default_rng(0)
    X, Z = rng.uniform(size=(40, 3)), rng.uniform(size=(12, 3))
    ell = np.array([0.3, 0.5, 0.8])

    def k(A, B):
        return np.exp(-0.5 * np.sum(((A[:, None] - B[None]) / ell) ** 2, axis=-1))

    Kzz = k(Z, Z)
    q = np.einsum("ij,ji->i", k(X, Z), np.linalg.solve(Kzz, k(Z, X)))
    assert design_share(X, Z, ell, jitter=0.0) == pytest.approx(1.0 - q.mean(), abs=1e-8)
    assert design_share(X, X, ell) < 1e-4
    assert design_share(X, np.full((1, 3), 50.0), ell) == pytest.approx(1.0)


def _growth_case(d, ell, sizes, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(sum(sizes), d))
    W = rng.normal(size=(d, 20)) / ell
    y = np.cos(X @ W + rng.uniform(0, 6, 20)).sum(axis=1) + 0.05 * rng.normal(size=len(X))
    return X, y, np.repeat(np.arange(len(sizes)), sizes)


def test_auto_inducing_grows_where_a_quarter_of_n_leaves_the_prior_unexplained():
    """Six inputs of short lengthscale, 4 x 150 points: ``N / 4 = 150``
    points leave more than AUTO_GROW_SHARE of the prior unexplained, so the
    server grows ``M`` (by a quarter per check) up to ``N / 2``; every check
    is recorded, the last one is the ``M`` used, and every check but the
    last was above the threshold. Set-up only (``n_rounds=0``)."""
    from skfedgp.federated import AUTO_GROW_MAX, AUTO_GROW_SHARE

    X, y, g = _growth_case(6, 0.4, [150] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=0, random_state=0).fit(X, y, g)
    growth = est.server_.inducing_growth_
    assert growth[0][0] == 150 and len(growth) >= 2
    assert all(share > AUTO_GROW_SHARE for _, share in growth[:-1])
    assert est.n_inducing_ == growth[-1][0] > 150
    assert est.n_inducing_ <= min(300, AUTO_GROW_MAX)
    assert est.server_.global_pack.unpack(est.server_.theta_global)["Z_g"].shape[0] \
        == est.n_inducing_
    # the design's share decreases as it grows (nested Sobol designs)
    shares = [s for _, s in growth]
    assert all(a > b for a, b in zip(shares, shares[1:]))


@pytest.mark.parametrize("d, ell, sizes", [
    (1, 0.05, [100] * 5),   # 1-D: the lengthscale rule never reaches N / 4
    (2, 0.3, [30] * 6),     # 2-D: for this function 64 points cover the square
])
def test_auto_inducing_does_not_grow_where_the_design_covers_the_inputs(d, ell, sizes):
    """Where ``N / 4`` (or the lengthscale rule) already explains the prior,
    ``M`` is what it was before growth existed."""
    from skfedgp.federated import AUTO_GROW_SHARE

    X, y, g = _growth_case(d, ell, sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=0, random_state=0).fit(X, y, g)
    growth = est.server_.inducing_growth_
    assert len(growth) <= 1
    if growth:
        assert growth[0][1] <= AUTO_GROW_SHARE and est.n_inducing_ == growth[0][0]
    assert est.n_inducing_ <= max(64, int(np.ceil(0.25 * len(y))))


@pytest.mark.parametrize("shift", [0.0, 4.0])
def test_the_checked_design_is_the_one_used(monkeypatch, shift):
    """The last design whose share was checked is ``Z_g``, also when two
    clients sit far from the other two (``shift`` 4 in 4-D: the union is a
    small share of the box and its candidates come another way)."""
    import skfedgp.federated as fed

    checked = []
    real = fed.design_share

    def spy(X, Z, ell, jitter=fed.DEFAULT_JITTER):
        checked.append(np.array(Z))
        return real(X, Z, ell, jitter)

    monkeypatch.setattr(fed, "design_share", spy)
    X, y, g = _growth_case(4, 0.3, [150] * 4)
    X = X + shift * (g >= 2)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=0, random_state=0).fit(X, y, g)
    assert checked, "no growth check ran"
    Z_g = est.server_.global_pack.unpack(est.server_.theta_global)["Z_g"]
    assert_allclose(checked[-1], Z_g)


def test_growth_starts_only_above_its_start_share(monkeypatch):
    """A first share below AUTO_GROW_START leaves ``M`` alone even though it
    is above the stop share: with the start raised above the 6-D case's
    first share there is one check and no growth."""
    import skfedgp.federated as fed

    X, y, g = _growth_case(6, 0.4, [150] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grown = FederatedHierarchicalGPRegressor(n_rounds=0, random_state=0).fit(X, y, g)
        first = grown.server_.inducing_growth_[0][1]
        assert first > fed.AUTO_GROW_SHARE
        monkeypatch.setattr(fed, "AUTO_GROW_START", first * 1.01)
        held = FederatedHierarchicalGPRegressor(n_rounds=0, random_state=0).fit(X, y, g)
    assert held.n_inducing_ == 150 and len(held.server_.inducing_growth_) == 1
    assert grown.n_inducing_ > 150


def test_a_given_n_inducing_is_never_grown():
    """Growth is part of ``n_inducing="auto"`` only: a given number is used as given."""
    X, y, g = _growth_case(6, 0.4, [150] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=0, n_inducing=150,
                                               random_state=0).fit(X, y, g)
    assert est.n_inducing_ == 150 and est.server_.inducing_growth_ == []


def _data_poor(seed):
    """8 clients of 3-15 points of a shared function plus their own level and
    a smooth deviation; every other client sees only a window of width 4 of
    [0, 10]; each client tested on 60 points of [0, 10]."""
    rng = np.random.default_rng(seed)
    X, y, g, Xt, yt, gt = [], [], [], [], [], []
    for c in range(8):
        n = int(rng.integers(3, 16))
        level, amp = rng.normal(0, 1.0), rng.normal(0, 0.3)
        w, phase = rng.uniform(0.3, 1.0), rng.uniform(0, 6)
        lo = rng.uniform(0, 6) if c % 2 else 0.0
        hi = lo + 4.0 if c % 2 else 10.0
        for XX, yy, gg, x in ((X, y, g, rng.uniform(lo, hi, n)), (Xt, yt, gt, rng.uniform(0, 10, 60))):
            XX.append(x[:, None])
            yy.append(np.sin(1.3 * x) + 0.5 * np.cos(0.7 * x) + level
                      + amp * np.sin(w * x + phase) + 0.1 * rng.standard_normal(x.size))
            gg.append(np.full(x.size, c))
    return tuple(np.concatenate(a) for a in (X, y, g, Xt, yt, gt))


@pytest.mark.parametrize("seed", [1, 4])
def test_data_poor_clients_band_holds_their_levels(seed):
    """Random client levels: with 3-15 points per client the band stays near
    nominal (seeds where the free, profiled constant means put 19 % and 22 %
    of the test points beyond 3 predictive std; an exact GP with the
    hierarchical kernel puts 2.7 % and 6.0 %; now 6.5 % and 8.5 %)."""
    X, y, g, Xt, yt, gt = _data_poor(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    m, s = est.predict(Xt, gt, return_std=True)
    assert np.mean(np.abs(yt - m) > 3 * s) < 0.12
    assert est.level_variance_ > 0.1  # true levels N(0, 1): the spread is learned


def test_never_seen_client_with_too_few_fitted_clients_warns(two_clients):
    """Two fitted clients cannot tell the spread of the clients' levels: a
    never-seen label's band is flagged as unreliable (three clients: no warning)."""
    X, y, g, est = two_clients
    Xt = np.array([[0.3], [0.7]])
    with pytest.warns(UserWarning, match="estimated here from 2 client"):
        est.predict(Xt, ["new", "new"], return_std=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        est.predict(Xt, ["A", "B"])  # fitted clients: no warning
    X3 = np.r_[X, X[:20]]
    y3 = np.r_[y, y[:20] + 0.5]
    g3 = np.r_[g, ["C"] * 20]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est3 = FederatedHierarchicalGPRegressor(**SMALL).fit(X3, y3, g3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        est3.predict(Xt, ["new", "new"])


# --------------------------------------------------------------------------
# an exact local part: Z_l at the inputs maximises the bound
# --------------------------------------------------------------------------


def test_exact_local_inducing_inputs_maximise_the_bound():
    """Z_l = the client's inputs (exact local part) maximises the bound over Z_l
    whatever the other values (global part sparse): every perturbation of Z_l
    lowers it (the variational family then contains the exact conditional of the
    local function at the inputs; any other Z_l restricts it)."""
    Xs, ys = _clients((12, 9))
    rng = np.random.default_rng(5)
    Zg = rng.uniform(size=(6, 2))  # a sparse global part
    G, Bs = _params(Xs, Zg, [X.copy() for X in Xs])
    base = _elbo(Xs, ys, G, Bs, jitter=1e-10)[0].elbo
    for trial in range(5):
        moved = [dict(B) for B in Bs]
        moved[trial % 2]["Z_l"] = Bs[trial % 2]["Z_l"] + 0.05 * rng.normal(size=(
            Bs[trial % 2]["Z_l"].shape))
        assert _elbo(Xs, ys, G, moved, jitter=1e-10)[0].elbo < base


# --------------------------------------------------------------------------
# a client centred at its own mean: the level's prior mean
# --------------------------------------------------------------------------


def test_centred_targets_with_level_prior_mean_give_the_same_bound_and_gradients():
    """Passing y - m with the level's prior mean -m / tau (what every client
    does, federated.StructuredClient._centre) gives the same bound, the same
    gradients (level_variance included: its prior mean moves with tau, checked
    against finite differences) and the level's posterior shifted by m / tau."""
    Xs, ys = _clients((12, 9))
    rng = np.random.default_rng(1)
    G, Bs = _params(Xs, rng.uniform(size=(6, 2)), [X[:5].copy() for X in Xs])
    ys = [y + 7.0 * k - 3.0 for k, y in enumerate(ys)]  # clients on other levels

    def run(G, centre):
        out = []
        for X, y, B in zip(Xs, ys, Bs):
            m = float(np.mean(y)) if centre else 0.0
            st = client_forward(X, y - m, feature_blocks(G, B, ALL, jitter=1e-8), ALL,
                                B["noise_variance"], G["phi"],
                                level_mean=-m / np.sqrt(G["level_variance"]))
            out.append((st, X, y - m, m))
        post = combine([o[0].S for o in out], [o[0].b for o in out], [o[0].e for o in out],
                       G["Z_g"].shape[0])
        grads = [client_backward(st, X, yc, post.mu, post.A_inv) for st, X, yc, _ in out]
        return post, grads, out

    p0, g0, o0 = run(G, False)
    p1, g1, o1 = run(G, True)
    assert abs(p0.elbo - p1.elbo) < 1e-9 * abs(p0.elbo)
    assert_allclose(p1.mu, p0.mu, rtol=1e-8, atol=1e-10)
    for a, b in zip(g0, g1):
        assert set(a) == set(b)
        for k in a:
            assert_allclose(np.asarray(b[k]), np.asarray(a[k]), rtol=1e-7, atol=1e-9)
    tau = np.sqrt(G["level_variance"])
    for (s0, *_), (s1, _, _, m) in zip(o0, o1):
        mu0 = client_posterior(s0, p0.mu, p0.A_inv)[0]
        mu1 = client_posterior(s1, p1.mu, p1.A_inv)[0]
        a = s1.layout.level_row()
        assert abs(mu1[a] + m / tau - mu0[a]) < 1e-8
    h = 1e-6 * G["level_variance"]
    fd = (run(dict(G, level_variance=G["level_variance"] + h), True)[0].elbo
          - run(dict(G, level_variance=G["level_variance"] - h), True)[0].elbo) / (2 * h)
    an = sum(g["level_variance"] for g in g1)
    assert abs(an - fd) < 1e-5 * max(1.0, abs(fd))


def test_whitened_statistics_stay_definite_where_the_whitened_gram_does_not():
    """``W_f = F^T F`` from whitened rows equals the whitened raw Gram on a
    well-conditioned case, and stays positive semi-definite on an
    ill-conditioned ``K_zz`` (long lengthscale), where whitening the raw Gram
    ``K^T K`` by two triangular solves loses definiteness (what made ``P``
    indefinite for a nearly noise-free straight line)."""
    import scipy.linalg as sl

    from skfedgp import _structured as S
    from skfedgp._linalg import jittered_cholesky

    rng = np.random.default_rng(0)

    def parts(ell, n=300, M=12):
        X = rng.uniform(size=(n, 1))
        y = rng.normal(size=n)
        blocks = [("g", rng.uniform(size=(M, 1)), np.array([ell]), 1.0, 1e-6),
                  ("l", rng.uniform(size=(5, 1)), np.array([0.3]), 0.5, 1e-6)]
        Ls = [jittered_cholesky(S._block_kernel(b, Z, Z, e, v), scale=v, jitter=j)[0]
              for b, Z, e, v, j in blocks]
        Lam = sl.block_diag(*Ls)
        K = S._kernel_rows(X, blocks)
        gram = sl.solve_triangular(Lam, sl.solve_triangular(Lam, K.T @ K, lower=True).T,
                                   lower=True)
        return X, y, blocks, Lam, K, 0.5 * (gram + gram.T)

    X, y, blocks, Lam, K, gram = parts(0.3)
    W, w = S._whitened_statistics(X, y, blocks, Lam)
    np.testing.assert_allclose(W, gram, rtol=1e-7, atol=1e-7 * np.abs(W).max())
    np.testing.assert_allclose(w, sl.solve_triangular(Lam, K.T @ y, lower=True), rtol=1e-7,
                               atol=1e-7 * np.abs(w).max())

    X, y, blocks, Lam, K, gram = parts(50.0)  # K_zz of condition ~1e6 or worse
    W, _ = S._whitened_statistics(X, y, blocks, Lam)
    s2 = 1e-6
    assert np.linalg.eigvalsh(np.eye(len(W)) + W / s2).min() > 0.99
    assert np.linalg.eigvalsh(np.eye(len(gram)) + gram / s2).min() < 0.99


def test_broken_posterior_covariance_is_an_error_not_a_clipped_variance(two_clients):
    """A client posterior covariance that is not positive semi-definite gives a
    clear error in predict and predict_components (before: the latent variance
    was clipped to 0 silently, the noise std returned, and a component std NaN)."""
    import copy

    X, y, g, est = two_clients
    lab = next(iter(est.clients_))
    broken = copy.deepcopy(est)
    P = broken.clients_[lab].posterior
    P["Sigma_u"] = P["Sigma_u"] - 1e3 * np.eye(P["Sigma_u"].shape[0])
    x = X[:3]
    with pytest.raises(FloatingPointError, match="negative"):
        broken.predict(x, [lab] * 3, return_std=True)
    with pytest.raises(FloatingPointError, match="negative"):
        broken.predict_components(x, [lab] * 3)
    m, s = est.predict(x, [lab] * 3, return_std=True)  # the intact model is untouched
    assert np.all(np.isfinite(s)) and np.all(s > 0)


_WITH_CLIENT_VARIABLES = [c for c in SUBSETS if "deviation" in c or "local" in c]


@pytest.mark.parametrize("comps", _WITH_CLIENT_VARIABLES,
                         ids=["+".join(c) for c in _WITH_CLIENT_VARIABLES])
@pytest.mark.parametrize("level_mean", [0.0, -0.8])
def test_data_space_elimination_matches_the_client_space_one(comps, level_mean, monkeypatch):
    """A client with fewer observations than variables eliminates them through its
    n x n data covariance (Woodbury); statistics, posterior moments and gradients
    agree with the N_c-space elimination, which the same client uses when the
    data-space form is switched off."""
    import skfedgp._structured as st_mod

    rng = np.random.default_rng(7)
    X = rng.uniform(size=(3, 2))  # 3 < N_c = 9 (deviation) + 4 (local) + 1 (level)
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=3)
    G, (B,) = _params([X], rng.uniform(size=(9, 2)), [rng.uniform(size=(4, 2))])
    blocks = feature_blocks(G, B, comps)

    def run():
        st = client_forward(X, y, blocks, comps, 0.03, G["phi"], level_mean=level_mean,
                            scale=1.3)
        M = st.S.shape[0]
        post = combine([st.S], [st.b], [st.e], M)
        mu_u, Sigma_u, _ = client_posterior(st, post.mu, post.A_inv)
        grads = client_backward(st, X, y, post.mu, post.A_inv)
        return st, mu_u, Sigma_u, grads

    small, mu_s, Sig_s, g_s = run()
    assert small.Pinv is not None and small.Lp is None  # the data-space path ran
    monkeypatch.setattr(st_mod, "DATA_SPACE_MAX_RATIO", -1.0)
    big, mu_b, Sig_b, g_b = run()
    assert big.Pinv is None and big.Lp is not None
    for name in ("S", "b", "PiGt", "Pir"):
        assert_allclose(getattr(small, name), getattr(big, name), rtol=1e-9, atol=1e-10)
    assert_allclose(small.e, big.e, rtol=1e-11)
    assert_allclose(mu_s, mu_b, rtol=1e-9, atol=1e-10)
    assert_allclose(Sig_s, Sig_b, rtol=1e-9, atol=1e-10)
    assert g_s.keys() == g_b.keys()
    for k in g_b:
        assert_allclose(g_s[k], g_b[k], rtol=1e-8, atol=1e-9 * np.abs(g_b[k]).max())


def test_global_factor_cache_is_bitwise_transparent_and_read_only():
    """Simulated clients share the factor of the broadcast global K_zz: a cached
    factor gives the same bits as a fresh one, and callers cannot write into it."""
    import skfedgp._structured as st_mod

    Xs, ys = _clients((12, 4))
    rng = np.random.default_rng(4)
    G, Bs = _params(Xs, rng.uniform(size=(6, 2)), [rng.uniform(size=(4, 2)) for _ in Xs])
    st_mod._FACTOR_CACHE.clear()
    st_mod._FACTOR_CACHE_USED = 0
    fresh = _elbo(Xs, ys, G, Bs)  # the second client reuses the first one's factor
    assert len(st_mod._FACTOR_CACHE) == 1
    K, L, _ = next(iter(st_mod._FACTOR_CACHE.values()))[:3]
    assert not K.flags.writeable and not L.flags.writeable
    again = _elbo(Xs, ys, G, Bs)  # every client from the cache
    assert fresh[0].elbo == again[0].elbo
    assert_array_equal(fresh[0].mu, again[0].mu)
    for a, b in zip(fresh[1], again[1]):
        assert_array_equal(a.S, b.S)


def test_a_dominant_prior_variance_falls_back_to_client_space():
    """A prior variance 1e8 times the noise variance or more on a row: the data-space
    covariance would be nearly singular, so the client eliminates in N_c space."""
    rng = np.random.default_rng(8)
    X = rng.uniform(size=(3, 2))
    y = rng.normal(size=3)
    G, (B,) = _params([X], rng.uniform(size=(6, 2)), [rng.uniform(size=(4, 2))])
    small = client_forward(X, y, feature_blocks(G, B, ALL), ALL, 0.05, G["phi"])
    assert small.Pinv is not None
    G = dict(G, level_variance=1e7)
    big = client_forward(X, y, feature_blocks(G, B, ALL), ALL, 1e-2, G["phi"])
    assert big.Pinv is None and big.Lp is not None
    assert np.isfinite(big.e)
