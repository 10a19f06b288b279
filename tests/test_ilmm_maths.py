"""The multi-output (ILMM) structured posterior (skfedgp._ilmm): reduction to
the scalar family, exactness against a dense joint multi-output GP, analytic
gradients against central finite differences, the local surrogate, missing
entries and the packers."""

import numpy as np
import pytest
from numpy.testing import assert_allclose

from skfedgp import _ilmm
from skfedgp._linalg import CholeskyError
from skfedgp._structured import client_forward, combine, feature_blocks

ALL = ("global", "deviation", "local")
SUBSETS = [ALL, ("global", "local"), ("deviation", "local"), ("global",), ("local",),
           ("global", "deviation"), ("deviation",)]
IDS = ["+".join(c) for c in SUBSETS]


def se(A, B, ell):
    """Plain NumPy unit-variance SE-ARD kernel (independent of skfedgp)."""
    D = (A[:, None, :] - B[None, :, :]) / np.asarray(ell)
    return np.exp(-0.5 * np.sum(D**2, axis=-1))


def _data(sizes=(10, 8), Q=3, d=2, seed=0, n_missing=5):
    """Clients' inputs and (n, Q) targets with some NaN entries (no all-NaN row)."""
    rng = np.random.default_rng(seed)
    Xs, Ys = [], []
    for k, n in enumerate(sizes):
        X = rng.uniform(size=(n, d))
        Y = np.column_stack([np.sin(3 * X[:, 0] + q) + 0.3 * k * X[:, 1] for q in range(Q)])
        Y += 0.1 * rng.normal(size=Y.shape)
        for _ in range(n_missing):
            Y[rng.integers(n), rng.integers(Q)] = np.nan
        Y[np.all(np.isnan(Y), axis=1), 0] = 0.3
        Xs.append(X)
        Ys.append(Y)
    return Xs, Ys


def _params(Xs, Zg, Zls, Q=3, R=(2, 2, 1), per_channel=True, seed=1):
    rng = np.random.default_rng(seed)
    Rg, Rd, Rl = R
    d = Zg.shape[1]
    G = dict(Z_g=Zg, lengthscale_g=0.3 + 0.5 * rng.uniform(size=(Rg, d)),
             B_g=rng.normal(size=(Q, Rg)), phi=0.4)
    Ls = []
    for k, Zl in enumerate(Zls):
        s2 = (0.03 + 0.02 * rng.uniform(size=Q)) if per_channel else 0.04 + 0.01 * k
        Ls.append(dict(Z_l=Zl, lengthscale_l=0.2 + 0.3 * rng.uniform(size=(Rl, d)),
                       B_l=0.7 * rng.normal(size=(Q, Rl)), B_d=0.5 * rng.normal(size=(Q, Rd)),
                       noise_variance=s2, offset=0.1 * rng.normal(size=Q)))
    return G, Ls


def _elbo(Xs, Ys, G, Ls, comps=ALL, jitter=1e-6):
    sts = [_ilmm.forward(X, Y, G, L, comps, jitter=jitter, client=k)
           for k, (X, Y, L) in enumerate(zip(Xs, Ys, Ls))]
    Ng = sts[0].S.shape[0]
    return combine([s.S for s in sts], [s.b for s in sts], [s.e for s in sts], Ng), sts


def _dense(Xs, G, Ls, comps=ALL):
    """Prior covariance (SPEC eq. 35) of every client's every (input, channel) pair.

    Returns the covariance of all entries, flattened client by client, row-major
    in (input, channel).
    """
    Q = Ls[0]["offset"].shape[0]
    Xall = np.vstack(Xs)
    NQ = Xall.shape[0] * Q
    C = np.zeros((NQ, NQ))
    if "global" in comps:
        for r in range(G["B_g"].shape[1]):
            b = G["B_g"][:, r]
            C += np.kron(se(Xall, Xall, G["lengthscale_g"][r]), np.outer(b, b))
    off = np.cumsum([0] + [len(X) * Q for X in Xs])
    for k, (X, L) in enumerate(zip(Xs, Ls)):
        sl = slice(off[k], off[k + 1])
        if "deviation" in comps:
            for r in range(L["B_d"].shape[1]):
                b = L["B_d"][:, r]
                C[sl, sl] += G["phi"] * np.kron(se(X, X, G["lengthscale_g"][r]), np.outer(b, b))
        if "local" in comps:
            for r in range(L["B_l"].shape[1]):
                b = L["B_l"][:, r]
                C[sl, sl] += np.kron(se(X, X, L["lengthscale_l"][r]), np.outer(b, b))
    return C


def _noise_diag(Xs, Ls):
    Q = Ls[0]["offset"].shape[0]
    return np.concatenate([np.tile(np.broadcast_to(L["noise_variance"], (Q,)), len(X))
                           for X, L in zip(Xs, Ls)])


# --------------------------------------------------------------------------
# Q = 1, R = 1: the scalar structured family
# --------------------------------------------------------------------------


@pytest.mark.parametrize("comps", SUBSETS, ids=IDS)
def test_single_output_reduces_to_scalar_family(comps):
    Xs, Ys = _data((11,), Q=1, n_missing=0)
    X, y = Xs[0], Ys[0][:, 0]
    rng = np.random.default_rng(2)
    Zg, Zl = rng.uniform(size=(6, 2)), rng.uniform(size=(4, 2))
    var_g, var_l, phi, s2, c = 1.7, 0.6, 0.35, 0.05, 0.2
    ell_g, ell_l = np.array([0.4, 0.7]), np.array([0.25, 0.3])
    Gs = dict(Z_g=Zg, lengthscale_g=ell_g, variance_g=var_g, phi=phi)
    Bs = dict(Z_l=Zl, lengthscale_l=ell_l, variance_l=var_l)
    # the scalar family without a client level, on targets less the ILMM's fixed offset
    ref = client_forward(X, y - c, feature_blocks(Gs, Bs, comps), comps, s2, phi)
    G = dict(Z_g=Zg, lengthscale_g=ell_g[None], B_g=[[np.sqrt(var_g)]], phi=phi)
    L = dict(Z_l=Zl, lengthscale_l=ell_l[None], B_l=[[np.sqrt(var_l)]],
             B_d=[[np.sqrt(var_g)]], noise_variance=s2, offset=np.array([c]))
    st = _ilmm.forward(X, y[:, None], G, L, comps)
    assert st.S.shape == ref.S.shape
    assert_allclose(st.S, ref.S, rtol=1e-9, atol=1e-11)
    assert_allclose(st.b, ref.b, rtol=1e-9, atol=1e-11)
    assert_allclose(st.e, ref.e, rtol=1e-10)


# --------------------------------------------------------------------------
# exactness: inducing inputs = training inputs
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exact_setup():
    Xs, Ys = _data((10, 8), Q=3)
    G, Ls = _params(Xs, np.vstack(Xs), [X.copy() for X in Xs])
    return Xs, Ys, G, Ls


@pytest.mark.parametrize("comps", [ALL, ("global", "local"), ("deviation", "local"),
                                   ("global", "deviation")], ids=lambda c: "+".join(c))
def test_elbo_equals_dense_log_marginal_likelihood(exact_setup, comps):
    Xs, Ys, G, Ls = exact_setup
    post, _ = _elbo(Xs, Ys, G, Ls, comps, jitter=1e-10)
    C = _dense(Xs, G, Ls, comps) + np.diag(_noise_diag(Xs, Ls))
    y = np.concatenate([(Y - L["offset"]).ravel() for Y, L in zip(Ys, Ls)])
    obs = np.isfinite(y)
    assert (~obs).sum() >= 5  # the missing entries are really out of the likelihood
    Lc = np.linalg.cholesky(C[np.ix_(obs, obs)])
    a = np.linalg.solve(Lc, y[obs])
    lml = -0.5 * a @ a - np.sum(np.log(np.diag(Lc))) - 0.5 * obs.sum() * np.log(2 * np.pi)
    assert abs(post.elbo - lml) < 1e-6


def _dense_cross(Xt, Xall, X, G, L, rows, Q):
    """Client ``i``'s latent channels at ``Xt`` (R = (2, 2, 1)): their covariance
    ``Kx`` with every entry of all clients (``rows``: client i's columns) and
    their own prior covariance ``Kss``, both row-major in (input, channel)."""
    Kx = np.zeros((len(Xt) * Q, len(Xall) * Q))
    Kss = np.zeros((len(Xt) * Q, len(Xt) * Q))
    for r in range(2):
        b = G["B_g"][:, r]
        Kx += np.kron(se(Xt, Xall, G["lengthscale_g"][r]), np.outer(b, b))
        bd = L["B_d"][:, r]
        Kx[:, rows] += G["phi"] * np.kron(se(Xt, X, G["lengthscale_g"][r]), np.outer(bd, bd))
        Kss += np.kron(se(Xt, Xt, G["lengthscale_g"][r]),
                       np.outer(b, b) + G["phi"] * np.outer(bd, bd))
    bl = L["B_l"][:, 0]
    Kx[:, rows] += np.kron(se(Xt, X, L["lengthscale_l"][0]), np.outer(bl, bl))
    Kss += np.kron(se(Xt, Xt, L["lengthscale_l"][0]), np.outer(bl, bl))
    return Kx, Kss


def test_prediction_equals_dense_exact_posterior(exact_setup):
    Xs, Ys, G, Ls = exact_setup
    Q = 3
    post, sts = _elbo(Xs, Ys, G, Ls, jitter=1e-10)
    C = _dense(Xs, G, Ls) + np.diag(_noise_diag(Xs, Ls))
    y = np.concatenate([(Y - L["offset"]).ravel() for Y, L in zip(Ys, Ls)])
    obs = np.isfinite(y)
    Xall = np.vstack(Xs)
    Xt = np.random.default_rng(5).uniform(size=(4, 2))
    off = np.cumsum([0] + [len(X) * Q for X in Xs])
    for i, (X, L, st) in enumerate(zip(Xs, Ls, sts)):
        Kx, Kss = _dense_cross(Xt, Xall, X, G, L, slice(off[i], off[i + 1]), Q)
        Kx = Kx[:, obs]
        Co = C[np.ix_(obs, obs)]
        m_exact = (Kx @ np.linalg.solve(Co, y[obs])).reshape(len(Xt), Q)
        c_exact = (Kss - Kx @ np.linalg.solve(Co, Kx.T)).reshape(len(Xt), Q, len(Xt), Q)
        mu_u, Sigma_u, _ = _ilmm.posterior(st, post.mu, post.A_inv)
        m, c = _ilmm.predict(Xt, G, L, ALL, mu_u, Sigma_u, jitter=1e-10)
        assert m.shape == (4, Q) and c.shape == (4, Q, Q)
        assert_allclose(m, m_exact, atol=1e-6)
        blocks = np.stack([c_exact[n, :, n, :] for n in range(len(Xt))])
        assert_allclose(c, blocks, atol=1e-6)
        mf, cf = _ilmm.predict(Xt, G, L, ALL, mu_u, Sigma_u, full_cov=True, jitter=1e-10)
        assert_allclose(mf, m_exact, atol=1e-6)
        assert_allclose(cf, c_exact, atol=1e-6)


def test_offset_uncertainty_equals_dense_universal_kriging(exact_setup):
    """The client's estimated constants integrated under a flat prior (the other
    client's held at theirs): dense universal kriging with one trend column per
    observed channel of client i. Client 0 never observes channel 2, so its
    constants cover channels 0 and 1 only."""
    Xs, Ys, G, Ls = exact_setup
    Q = 3
    Ys = [Ys[0].copy(), Ys[1]]
    Ys[0][:, 2] = np.nan
    Ys[0][np.all(np.isnan(Ys[0]), axis=1), 0] = 0.1
    post, sts = _elbo(Xs, Ys, G, Ls, jitter=1e-10)
    C = _dense(Xs, G, Ls) + np.diag(_noise_diag(Xs, Ls))
    y = np.concatenate([(Y - L["offset"]).ravel() for Y, L in zip(Ys, Ls)])
    obs = np.isfinite(y)
    Xall = np.vstack(Xs)
    Xt = np.random.default_rng(7).uniform(size=(3, 2))
    off = np.cumsum([0] + [len(X) * Q for X in Xs])
    for i, (X, L, st) in enumerate(zip(Xs, Ls, sts)):
        Kx, Kss = _dense_cross(Xt, Xall, X, G, L, slice(off[i], off[i + 1]), Q)
        seen = [q for q in range(Q) if np.any(np.isfinite(Ys[i][:, q]))]
        T = np.zeros((len(y), len(seen)))  # trend: client i's constant per seen channel
        for j, q in enumerate(seen):
            T[off[i] + q:off[i + 1]:Q, j] = 1.0
        T = T[obs]
        Kx = Kx[:, obs]
        Co = C[np.ix_(obs, obs)]
        V = np.linalg.inv(T.T @ np.linalg.solve(Co, T))
        Sel = np.zeros((len(Xt) * Q, len(seen)))
        for j, q in enumerate(seen):
            Sel[q::Q, j] = 1.0
        R = Sel - Kx @ np.linalg.solve(Co, T)
        c_exact = (Kss - Kx @ np.linalg.solve(Co, Kx.T) + R @ V @ R.T).reshape(
            len(Xt), Q, len(Xt), Q)
        mu_u, Sigma_u, _ = _ilmm.posterior(st, post.mu, post.A_inv)
        est = _ilmm.offset_uncertainty(st, Sigma_u)
        assert list(est[2]) == seen
        assert_allclose(est[0], V, rtol=1e-6, atol=1e-9)
        _, cf = _ilmm.predict(Xt, G, L, ALL, mu_u, Sigma_u, full_cov=True, jitter=1e-10,
                              offset=est)
        assert_allclose(cf, c_exact, atol=1e-6)
        _, c = _ilmm.predict(Xt, G, L, ALL, mu_u, Sigma_u, jitter=1e-10, offset=est)
        assert_allclose(c, np.stack([c_exact[n, :, n, :] for n in range(len(Xt))]), atol=1e-6)


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


def _random_setup(per_channel, R=(2, 2, 1), sizes=(9, 7, 6), seed=3):
    Xs, Ys = _data(sizes, Q=3, seed=seed)
    rng = np.random.default_rng(seed + 10)
    G, Ls = _params(Xs, rng.uniform(size=(5, 2)), [rng.uniform(size=(4, 2)) for _ in Xs],
                    R=R, per_channel=per_channel, seed=seed)
    return Xs, Ys, G, Ls


def _keys(comps):
    shared = "global" in comps or "deviation" in comps
    kg = (["Z_g", "lengthscale_g"] if shared else []) + (["B_g"] if "global" in comps else [])
    kg += ["phi"] if "deviation" in comps else []
    kl = (["Z_l", "lengthscale_l", "B_l"] if "local" in comps else [])
    kl += (["B_d"] if "deviation" in comps else []) + ["noise_variance", "offset"]
    return kg, kl


def _close(analytic, numeric):
    analytic = np.asarray(analytic, float)
    assert analytic.shape == np.shape(numeric)
    assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-5 * np.abs(numeric).max() + 1e-9)


@pytest.mark.parametrize("per_channel", [True, False], ids=["diag-noise", "iso-noise"])
@pytest.mark.parametrize("comps", SUBSETS, ids=IDS)
def test_gradients_match_finite_differences(comps, per_channel):
    Xs, Ys, G, Ls = _random_setup(per_channel)
    post, sts = _elbo(Xs, Ys, G, Ls, comps)
    grads = [_ilmm.backward(s, X, Y, post.mu, post.A_inv) for s, X, Y in zip(sts, Xs, Ys)]

    def F(G_, Ls_):
        return _elbo(Xs, Ys, G_, Ls_, comps)[0].elbo

    kg, kl = _keys(comps)
    assert set(grads[0]) == set(kg) | set(kl)
    for key in kg:
        analytic = sum(np.asarray(g[key]) for g in grads)
        _close(analytic, _fd(lambda v: F({**G, key: v}, Ls), G[key]))
    k = 1
    for key in kl:
        def f(v, key=key):
            Ls_ = list(Ls)
            Ls_[k] = {**Ls[k], key: v}
            return F(G, Ls_)

        _close(grads[k][key], _fd(f, Ls[k][key]))
    # a partial request returns just that group
    only = _ilmm.backward(sts[0], Xs[0], Ys[0], post.mu, post.A_inv, want_local=False)
    assert set(only) == set(kg)
    for key in kg:
        assert_allclose(only[key], grads[0][key], rtol=1e-12, atol=1e-14)


def test_gradients_with_more_local_latents_and_fewer_deviation_latents():
    """(R_g, R_d, R_l) = (3, 1, 2): deviation uses the first global kernel only."""
    Xs, Ys, G, Ls = _random_setup(True, R=(3, 1, 2), sizes=(8, 6), seed=7)
    post, sts = _elbo(Xs, Ys, G, Ls)
    grads = [_ilmm.backward(s, X, Y, post.mu, post.A_inv) for s, X, Y in zip(sts, Xs, Ys)]
    for key in ("lengthscale_g", "B_g", "phi", "Z_g"):
        analytic = sum(np.asarray(g[key]) for g in grads)
        _close(analytic, _fd(lambda v: _elbo(Xs, Ys, {**G, key: v}, Ls)[0].elbo, G[key]))
    for key in ("lengthscale_l", "B_l", "B_d"):
        def f(v, key=key):
            return _elbo(Xs, Ys, G, [{**Ls[0], key: v}, Ls[1]])[0].elbo

        _close(grads[0][key], _fd(f, Ls[0][key]))
    # deviation-only with R_g = 3 kernels but R_d = 1: only the first lengthscale row moves
    comps = ("deviation", "local")
    post, sts = _elbo(Xs, Ys, G, Ls, comps)
    g = sum(_ilmm.backward(s, X, Y, post.mu, post.A_inv)["lengthscale_g"]
            for s, X, Y in zip(sts, Xs, Ys))
    assert g.shape == (3, 2) and np.all(g[1:] == 0) and np.any(g[0] != 0)
    _close(g, _fd(lambda v: _elbo(Xs, Ys, {**G, "lengthscale_g": v}, Ls, comps)[0].elbo,
                  G["lengthscale_g"]))


def test_packer_flat_gradient_chains_the_log_transform():
    Xs, Ys, G, Ls = _random_setup(True, sizes=(7, 6))
    gp = _ilmm.global_spec(ALL, 5, 2, 3, 2)
    lp = _ilmm.local_spec(ALL, 4, 2, 3, 2, 1, noise="diagonal")
    assert gp.names() == ["Z_g", "lengthscale_g", "B_g", "phi"]
    assert lp.names() == ["Z_l", "lengthscale_l", "B_l", "B_d", "noise_variance", "offset"]
    tg, tl = gp.pack(G), lp.pack(Ls[0])
    post, sts = _elbo(Xs, Ys, G, Ls)
    grads = [_ilmm.backward(s, X, Y, post.mu, post.A_inv) for s, X, Y in zip(sts, Xs, Ys)]
    flat_g = sum(gp.flat_grad(tg, g) for g in grads)
    flat_l = lp.flat_grad(tl, grads[0])
    num_g = _fd(lambda t: _elbo(Xs, Ys, gp.unpack(t), Ls)[0].elbo, tg)
    num_l = _fd(lambda t: _elbo(Xs, Ys, G, [lp.unpack(t), Ls[1]])[0].elbo, tl)
    _close(flat_g, num_g)
    _close(flat_l, num_l)
    # isotropic noise is a scalar entry; ablated components drop their keys
    lp1 = _ilmm.local_spec(("global",), 4, 2, 3, 2, 1)
    assert lp1.names() == ["noise_variance", "offset"]
    assert lp1.unpack(lp1.pack({"noise_variance": 0.1, "offset": np.zeros(3)}))[
        "noise_variance"] == pytest.approx(0.1)
    assert _ilmm.global_spec(("local",), 5, 2, 3, 2).names() == []
    assert _ilmm.global_spec(("deviation",), 5, 2, 3, 2).names() == ["Z_g", "lengthscale_g",
                                                                     "phi"]


# --------------------------------------------------------------------------
# the local surrogate (q(v_g) fixed)
# --------------------------------------------------------------------------


def test_local_surrogate_touches_the_bound_and_lies_below_it():
    Xs, Ys, G, Ls = _random_setup(True)
    post, sts = _elbo(Xs, Ys, G, Ls)
    k = 2
    mu, Ainv = post.mu, post.A_inv

    def part(st):
        return -0.5 * st.e + st.b @ mu - 0.5 * (np.sum(st.S * Ainv) + mu @ st.S @ mu)

    others = sum(part(s) for j, s in enumerate(sts) if j != k)
    kl = 0.5 * (np.trace(Ainv) + mu @ mu - len(mu) - np.linalg.slogdet(Ainv)[1])

    def surrogate(L):
        st = _ilmm.forward(Xs[k], Ys[k], G, L, ALL)
        return part(st) + others - kl, st

    val, _ = surrogate(Ls[k])
    assert_allclose(val, post.elbo, rtol=1e-10)  # touches at the current point
    rng = np.random.default_rng(0)
    for _ in range(3):  # below it wherever only the client's own parameters move
        L2 = {**Ls[k], "B_l": Ls[k]["B_l"] + 0.3 * rng.normal(size=(3, 1)),
              "B_d": Ls[k]["B_d"] * rng.uniform(0.5, 1.5),
              "noise_variance": Ls[k]["noise_variance"] * rng.uniform(0.3, 3.0, size=3),
              "lengthscale_l": Ls[k]["lengthscale_l"] * rng.uniform(0.7, 1.4)}
        true = _elbo(Xs, Ys, G, [Ls[0], Ls[1], L2])[0].elbo
        s2, st2 = surrogate(L2)
        assert s2 < true - 1e-8
    # its gradient away from the touching point is backward with the fixed mu, A^{-1}
    g = _ilmm.backward(st2, Xs[k], Ys[k], mu, Ainv, want_global=False)
    for key in ("Z_l", "lengthscale_l", "B_l", "B_d", "noise_variance", "offset"):
        _close(g[key], _fd(lambda v: surrogate({**L2, key: v})[0], L2[key]))


# --------------------------------------------------------------------------
# missing entries, unseen clients, errors
# --------------------------------------------------------------------------


def test_all_missing_row_contributes_nothing():
    Xs, Ys, G, Ls = _random_setup(True, sizes=(7, 6))
    post, sts = _elbo(Xs, Ys, G, Ls)
    X2 = np.vstack([Xs[0][:3], [[0.5, 0.5]], Xs[0][3:], [[0.1, 0.9]]])
    Y2 = np.vstack([Ys[0][:3], np.full((1, 3), np.nan), Ys[0][3:], np.full((1, 3), np.nan)])
    post2, sts2 = _elbo([X2, Xs[1]], [Y2, Ys[1]], G, Ls)
    assert np.isfinite(post2.elbo)
    assert_allclose(post2.elbo, post.elbo, rtol=1e-12)
    assert_allclose(sts2[0].S, sts[0].S, atol=1e-12)
    assert_allclose(sts2[0].b, sts[0].b, atol=1e-12)
    g = _ilmm.backward(sts[0], Xs[0], Ys[0], post.mu, post.A_inv)
    g2 = _ilmm.backward(sts2[0], X2, Y2, post2.mu, post2.A_inv)
    for key in g:
        assert np.all(np.isfinite(g2[key]))
        assert_allclose(g2[key], g[key], rtol=1e-9, atol=1e-12)


def test_a_channel_missing_on_a_client_is_exact(exact_setup):
    """One client never observes channel 2: the ELBO is the dense LML of what is observed."""
    Xs, Ys, G, Ls = exact_setup
    Ys = [Ys[0].copy(), Ys[1]]
    Ys[0][:, 2] = np.nan
    Ys[0][np.all(np.isnan(Ys[0]), axis=1), 0] = 0.1
    post, sts = _elbo(Xs, Ys, G, Ls, jitter=1e-10)
    g = _ilmm.backward(sts[0], Xs[0], Ys[0], post.mu, post.A_inv)
    assert g["noise_variance"][2] == 0.0 and g["offset"][2] == 0.0
    C = _dense(Xs, G, Ls) + np.diag(_noise_diag(Xs, Ls))
    y = np.concatenate([(Y - L["offset"]).ravel() for Y, L in zip(Ys, Ls)])
    obs = np.isfinite(y)
    Lc = np.linalg.cholesky(C[np.ix_(obs, obs)])
    a = np.linalg.solve(Lc, y[obs])
    lml = -0.5 * a @ a - np.sum(np.log(np.diag(Lc))) - 0.5 * obs.sum() * np.log(2 * np.pi)
    assert abs(post.elbo - lml) < 1e-6


def test_unseen_client_prediction_is_global_posterior_plus_priors(exact_setup):
    """Prior moments for c: global posterior (exact) + deviation and local priors."""
    Xs, Ys, G, Ls = exact_setup
    Q = 3
    post, _ = _elbo(Xs, Ys, G, Ls, jitter=1e-10)
    Lnew = {**Ls[0], "Z_l": np.random.default_rng(8).uniform(size=(5, 2))}
    Ng = post.mu.shape[0]
    n_c = Ng + 5  # R_d = R_g: w has N_g entries; one local latent with 5 inducing points
    mu_u = np.r_[post.mu, np.zeros(n_c)]
    Sigma_u = np.zeros((Ng + n_c, Ng + n_c))
    Sigma_u[:Ng, :Ng] = post.A_inv
    Sigma_u[Ng:, Ng:] = np.eye(n_c)
    Xt = np.random.default_rng(9).uniform(size=(3, 2))
    m, c = _ilmm.predict(Xt, G, Lnew, ALL, mu_u, Sigma_u, full_cov=True, jitter=1e-10)
    Cd = _dense(Xs, G, Ls) + np.diag(_noise_diag(Xs, Ls))
    y = np.concatenate([(Y - L["offset"]).ravel() for Y, L in zip(Ys, Ls)])
    obs = np.isfinite(y)
    Xall = np.vstack(Xs)
    Kx = sum(np.kron(se(Xt, Xall, G["lengthscale_g"][r]),
                     np.outer(G["B_g"][:, r], G["B_g"][:, r])) for r in range(2))[:, obs]
    Kss = np.zeros((3 * Q, 3 * Q))
    for r in range(2):
        b, bd = G["B_g"][:, r], Lnew["B_d"][:, r]
        Kss += np.kron(se(Xt, Xt, G["lengthscale_g"][r]),
                       np.outer(b, b) + G["phi"] * np.outer(bd, bd))
    bl = Lnew["B_l"][:, 0]
    Kss += np.kron(se(Xt, Xt, Lnew["lengthscale_l"][0]), np.outer(bl, bl))
    Co = Cd[np.ix_(obs, obs)]
    assert_allclose(m, (Kx @ np.linalg.solve(Co, y[obs])).reshape(3, Q), atol=1e-6)
    assert_allclose(c, (Kss - Kx @ np.linalg.solve(Co, Kx.T)).reshape(3, Q, 3, Q), atol=1e-6)


def test_per_component_prediction(exact_setup):
    Xs, Ys, G, Ls = exact_setup
    post, sts = _elbo(Xs, Ys, G, Ls)
    mu_u, Sigma_u, H = _ilmm.posterior(sts[0], post.mu, post.A_inv)
    assert H.shape == (mu_u.shape[0], post.mu.shape[0])
    Xt = np.random.default_rng(4).uniform(size=(5, 2))
    m, c = _ilmm.predict(Xt, G, Ls[0], ALL, mu_u, Sigma_u)
    parts = _ilmm.predict(Xt, G, Ls[0], ALL, mu_u, Sigma_u, per_component=True)
    assert set(parts) == set(ALL)
    # the means add up; every covariance block is symmetric positive semi-definite
    assert_allclose(sum(p[0] for p in parts.values()), m, atol=1e-10)
    for _, cv in list(parts.values()) + [(m, c)]:
        assert cv.shape == (5, 3, 3)
        assert_allclose(cv, cv.transpose(0, 2, 1), atol=1e-12)
        assert np.all(np.linalg.eigvalsh(cv) > -1e-10)
    # the local part at an input far from the data is its prior B_l B_l^T
    far = _ilmm.predict(np.array([[30.0, 30.0]]), G, Ls[0], ALL, mu_u, Sigma_u,
                        per_component=True)
    bl = Ls[0]["B_l"][:, 0]
    assert_allclose(far["local"][1][0], np.outer(bl, bl), atol=1e-12)
    assert_allclose(far["local"][0], 0.0, atol=1e-12)
    # the diagonal-block prediction equals the blocks of the full covariance
    _, cf = _ilmm.predict(Xt, G, Ls[0], ALL, mu_u, Sigma_u, full_cov=True)
    assert_allclose(c, np.stack([cf[n, :, n, :] for n in range(5)]), atol=1e-12)


def test_errors_name_the_problem():
    Xs, Ys, G, Ls = _random_setup(True, sizes=(6,))
    with pytest.raises(CholeskyError, match="client 'A'"):
        _ilmm.forward(Xs[0], Ys[0], {**G, "lengthscale_g": np.full((2, 2), np.nan)}, Ls[0], ALL,
                      client="A")
    with pytest.raises(ValueError, match="Y"):
        _ilmm.forward(Xs[0], Ys[0][:, :2], G, Ls[0], ALL)
    Yinf = Ys[0].copy()
    Yinf[0, 0] = np.inf
    with pytest.raises(ValueError, match="inf"):
        _ilmm.forward(Xs[0], Yinf, G, Ls[0], ALL)
    with pytest.raises(ValueError, match="R_d"):
        _ilmm.forward(Xs[0], Ys[0], G, {**Ls[0], "B_d": np.ones((3, 3))}, ALL)
    with pytest.raises(ValueError, match="noise_variance"):
        _ilmm.forward(Xs[0], Ys[0], G, {**Ls[0], "noise_variance": np.ones(2)}, ALL)
    with pytest.raises(ValueError, match="components"):
        _ilmm.forward(Xs[0], Ys[0], G, Ls[0], ())


# --------------------------------------------------------------------------
# the fast (collapsed-channel) implementation against the per-channel one
# --------------------------------------------------------------------------


def _reference(X, Y, G, L, comps, mu, A_inv, jitter=1e-6):
    """The direct per-channel algorithm (one whitened Gram, one ``E_q`` per channel).

    The first implementation of ``_ilmm.forward`` / ``backward``, kept as an
    independent reference for the collapsed one: returns ``(S, b, e, Wf, trR,
    gam, mu_u, Sigma_u, grads)``.
    """
    from scipy import sparse

    from skfedgp._linalg import cholesky_backward, solve_lower
    from skfedgp._structured import (CHUNK_ROWS, _chol, _chol_solve, _se_grad,
                                     _se_grad_sym)

    lay = _ilmm._layout(G, L, comps)
    Q, Mf, idx, C = lay.Q, lay.Mf, lay.idx, lay.coef
    X, Y = _ilmm._check_data(X, Y, Q)
    s2, iso, s2shape = _ilmm._noise(L, Q)
    off = _ilmm._offset(L, Q)
    Kzz, Ls = _ilmm._factor_blocks(lay, jitter, None)
    Phi = np.zeros((Q, Mf, Mf))
    psi, kap = np.zeros((Mf, Q)), np.zeros((Mf, Q))
    yy, ysum, n_q = np.zeros(Q), np.zeros(Q), np.zeros(Q)
    for a in range(0, X.shape[0], CHUNK_ROWS):
        Xc, O, Yc = _ilmm._chunk(X, Y, off, a)
        Kc = _ilmm._kernel_rows(Xc, lay)
        for q in range(Q):
            Phi[q] += Kc[O[:, q]].T @ Kc[O[:, q]]
        psi += Kc.T @ Yc
        kap += Kc.T @ O
        yy += np.sum(Yc**2, axis=0)
        ysum += Yc.sum(axis=0)
        n_q += O.sum(axis=0)
    Wf = np.empty((Q, Mf, Mf))
    for q in range(Q):
        W = _ilmm._lsolve(lay, Ls, _ilmm._lsolve(lay, Ls, Phi[q]).T)
        Wf[q] = 0.5 * (W + W.T)
    wf, wk = _ilmm._lsolve(lay, Ls, psi), _ilmm._lsolve(lay, Ls, kap)
    Lam, h = np.zeros((lay.Nu, lay.Nu)), np.zeros(lay.Nu)
    gam, trR = np.zeros((Q, Mf)), np.zeros(Q)
    for q in range(Q):
        cq = C[q]
        Lam += cq[:, None] * Wf[q][np.ix_(idx, idx)] * cq[None, :] / s2[q]
        h += cq * wf[idx, q] / s2[q]
        gam[q] = np.bincount(idx, weights=cq**2, minlength=Mf)
        trR[q] = np.sum(gam[q] * (n_q[q] / lay.bsize - np.diag(Wf[q])))
    ng = lay.n_vg
    Lp = _chol(np.eye(lay.n_c) + Lam[ng:, ng:], "P", None)
    Gm, r = Lam[:ng, ng:], h[ng:]
    PiGt, Pir = _chol_solve(Lp, Gm.T), _chol_solve(Lp, r)
    S = Lam[:ng, :ng] - Gm @ PiGt
    S = 0.5 * (S + S.T)
    b = h[:ng] - Gm @ Pir
    logdetP = 2.0 * np.sum(np.log(np.diag(Lp))) if lay.n_c else 0.0
    e = np.sum(n_q * (np.log(2 * np.pi) + np.log(s2))) + logdetP + np.sum(yy / s2) - r @ Pir \
        + np.sum(trR / s2)
    # posterior moments of u
    Pinv = _chol_solve(Lp, np.eye(lay.n_c)) if lay.n_c else np.zeros((0, 0))
    Sgc = -A_inv @ PiGt.T
    mu_u = np.concatenate([mu, Pir - PiGt @ mu])
    Sigma_u = np.block([[A_inv, Sgc], [Sgc.T, Pinv + PiGt @ A_inv @ PiGt.T]])
    Sigma_u = 0.5 * (Sigma_u + Sigma_u.T)
    # backward, channel by channel
    Sel = sparse.csr_matrix((np.ones(lay.Nu), (idx, np.arange(lay.Nu))), shape=(Mf, lay.Nu))
    gcoef, g_s2, g_off = np.zeros((Q, lay.Nu)), np.zeros(Q), np.zeros(Q)
    Wbar, wbar = np.zeros((Q, Mf, Mf)), np.zeros((Mf, Q))
    for q in range(Q):
        cq = C[q]
        mu_z = Sel @ (cq * mu_u)
        ES = Sel @ (cq[:, None] * Sigma_u)
        Xi = np.asarray((Sel @ (ES * cq[None, :]).T).T) + np.outer(mu_z, mu_z)
        quad = yy[q] - 2.0 * mu_z @ wf[:, q] + np.sum(Xi * Wf[q]) + trR[q]
        g_s2[q] = -0.5 * n_q[q] / s2[q] + quad / (2.0 * s2[q] ** 2)
        g_off[q] = (ysum[q] - wk[:, q] @ mu_z) / s2[q]
        res = wf[:, q] - Wf[q] @ mu_z
        t = np.einsum("jk,kj->j", Wf[q][idx], ES)
        gcoef[q] = (mu_u * res[idx] - t - cq * (n_q[q] / lay.bsize[idx]
                                                - np.diag(Wf[q])[idx])) / s2[q]
        Wbar[q] = -(Xi - np.diag(gam[q])) / (2.0 * s2[q])
        wbar[:, q] = mu_z / s2[q]
    grads = {"offset": g_off, "noise_variance": g_s2.sum() if iso else g_s2.reshape(s2shape)}
    names = {"global": "B_g", "deviation": "B_d", "local": "B_l"}
    for name, rr, sl in lay.groups:
        tot = gcoef[:, sl].sum(axis=1)
        B = grads.setdefault(names[name], np.zeros((Q, len([g for g in lay.groups
                                                            if g[0] == name]))))
        B[:, rr] = np.sqrt(lay.phi) * tot if name == "deviation" else tot
        if name == "deviation":
            grads["phi"] = grads.get("phi", 0.0) + np.sum(tot * C[:, sl.start]) / (2 * lay.phi)
    Pb = np.empty((Q, Mf, Mf))
    Rsum = np.zeros((Mf, Mf))
    for q in range(Q):
        T = _ilmm._lsolve(lay, Ls, Wbar[q], trans=True)
        Pq = _ilmm._lsolve(lay, Ls, np.ascontiguousarray(T.T), trans=True).T
        Pb[q] = Pq + Pq.T
        Rsum += 2.0 * Wbar[q] @ Wf[q] + np.outer(wbar[:, q], wf[:, q])
    psibar = _ilmm._lsolve(lay, Ls, wbar, trans=True)
    acc = {}
    for k, (kind, rr, Z, ell, a, b_) in enumerate(lay.blocks):
        Lbar = -np.tril(solve_lower(Ls[k], Rsum[a:b_, a:b_], trans=True))
        dZ, dell, _ = _se_grad_sym(Z, Kzz[k], cholesky_backward(Ls[k], Lbar), ell, 1.0)
        acc[k] = [dZ, dell]
    for a0 in range(0, X.shape[0], CHUNK_ROWS):
        Xc, O, Yc = _ilmm._chunk(X, Y, off, a0)
        Kc = _ilmm._kernel_rows(Xc, lay)
        Kbar = Yc @ psibar.T
        for q in range(Q):
            Kbar[O[:, q]] += Kc[O[:, q]] @ Pb[q]
        for k, (kind, rr, Z, ell, a, b_) in enumerate(lay.blocks):
            dZ, dell, _ = _se_grad(Xc, Z, Kc[:, a:b_], Kbar[:, a:b_], ell, 1.0)
            acc[k][0] += dZ
            acc[k][1] += dell
    for kind in ("g", "l"):
        ks = [k for k, bl in enumerate(lay.blocks) if bl[0] == kind]
        if ks:
            Z = lay.blocks[ks[0]][2]
            grads[f"Z_{kind}"] = sum(acc[k][0] for k in ks)
            dell = np.zeros((lay.R_gl if kind == "g" else len(ks), Z.shape[1]))
            for k in ks:
                dell[lay.blocks[k][1]] = acc[k][1]
            grads[f"lengthscale_{kind}"] = dell
    return S, b, e, Wf, trR, gam, mu_u, Sigma_u, grads


@pytest.mark.parametrize("missing", ["complete", "missing", "channel-absent"])
@pytest.mark.parametrize("comps", SUBSETS, ids=IDS)
def test_fast_path_equals_per_channel_reference(comps, missing):
    sizes = (12, 9) if missing != "complete" else (12, 0)
    Xs, Ys, G, Ls = _random_setup(missing == "missing", sizes=sizes[:1], seed=11)
    X, Y, L = Xs[0], Ys[0], Ls[0]
    if missing == "complete":
        Y = np.where(np.isnan(Y), 0.2, Y)
    elif missing == "channel-absent":  # channel 1 never seen, channel 0 partly
        Y = np.where(np.isnan(Y), 0.2, Y)
        Y[:, 1] = np.nan
        Y[::3, 0] = np.nan
    st = _ilmm.forward(X, Y, G, L, comps)
    rng = np.random.default_rng(0)
    Ng = st.S.shape[0]
    mu = rng.normal(size=Ng)
    A = rng.normal(size=(Ng, Ng))
    A_inv = A @ A.T / max(Ng, 1) + 0.5 * np.eye(Ng)
    S, b, e, Wf, trR, gam, mu_u, Sigma_u, g_ref = _reference(X, Y, G, L, comps, mu, A_inv)
    tight = dict(rtol=1e-10, atol=1e-12)
    assert_allclose(st.S, S, **tight)
    assert_allclose(st.b, b, **tight)
    assert_allclose(st.e, e, rtol=1e-11)
    assert_allclose(st.Wf, Wf, rtol=1e-10, atol=1e-11)
    assert_allclose(st.trR, trR, rtol=1e-10, atol=1e-11)
    assert_allclose(st.gam, gam, rtol=0, atol=0)
    m, Sg, H = _ilmm.posterior(st, mu, A_inv)
    assert_allclose(m, mu_u, **tight)
    assert_allclose(Sg, Sigma_u, **tight)
    assert_allclose(H, np.vstack([np.eye(Ng), -st.PiGt]), rtol=0, atol=0)
    g = _ilmm.backward(st, X, Y, mu, A_inv)
    assert set(g) == set(g_ref)
    for key in g_ref:
        ref = np.asarray(g_ref[key], float)
        assert np.shape(g[key]) == ref.shape, key
        assert_allclose(g[key], ref, rtol=1e-9, atol=1e-10 * (np.abs(ref).max() + 1e-300),
                        err_msg=key)
    # a state without forward's cache (every channel treated as corrected) agrees too
    st._cache.clear()
    g2 = _ilmm.backward(st, X, Y, mu, A_inv)
    for key in g_ref:
        assert_allclose(g2[key], g[key], rtol=1e-9, atol=1e-10 * (np.abs(g[key]).max() + 1e-300))


@pytest.mark.parametrize("missing", [False, True], ids=["complete", "missing"])
def test_fast_path_streams_over_chunks(missing):
    """More rows than one chunk (the backward pass's Gram path), partial rows in both chunks."""
    from skfedgp._structured import CHUNK_ROWS

    Xs, Ys, G, Ls = _random_setup(True, sizes=(CHUNK_ROWS + 40,), seed=12)
    G = {**G, "Z_g": G["Z_g"][:3]}
    L = {**Ls[0], "Z_l": Ls[0]["Z_l"][:2]}
    X, Y = Xs[0], np.where(np.isnan(Ys[0]), 0.3, Ys[0])
    assert not _ilmm._use_features(Y, 3 * 2 + 2)  # M_F = 8: the backward pass takes the Gram path
    if missing:
        Y[np.random.default_rng(3).uniform(size=Y.shape) < 0.2] = np.nan
        Y[np.all(np.isnan(Y), axis=1), 2] = 0.1
    st = _ilmm.forward(X, Y, G, L, ALL)
    Ng = st.S.shape[0]
    mu, A_inv = np.linspace(-1, 1, Ng), 0.3 * np.eye(Ng)
    S, b, e, Wf, *_, g_ref = _reference(X, Y, G, L, ALL, mu, A_inv)
    assert_allclose(st.S, S, rtol=1e-10, atol=1e-10)
    assert_allclose(st.e, e, rtol=1e-11)
    g = _ilmm.backward(st, X, Y, mu, A_inv)
    st._cache.clear()
    g2 = _ilmm.backward(st, X, Y, mu, A_inv)
    for key in g_ref:
        for gg in (g, g2):
            assert_allclose(gg[key], g_ref[key], rtol=1e-9,
                            atol=1e-10 * np.abs(g_ref[key]).max(), err_msg=key)
