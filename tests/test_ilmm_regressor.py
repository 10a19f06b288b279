"""Multi-output (ILMM) targets in FederatedHierarchicalGPRegressor (issue 7)."""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression
from skfedgp.federated import Client, ModelConfig, Server


@pytest.fixture(scope="module")
def data():
    X, Y, g, Xt, Yt, gt = make_hierarchical_regression(
        n_clients=3, n_samples=30, n_outputs=3, scenario="A", n_test=20, random_state=1)
    return X, Y, g, Xt, Yt, gt


@pytest.fixture(scope="module")
def fitted(data):
    X, Y, g = data[:3]
    return FederatedHierarchicalGPRegressor(n_rounds=8, random_state=0).fit(X, Y, g)


def test_shapes_and_consistency(data, fitted):
    Xt, Yt, gt = data[3:]
    est = fitted
    Q = Yt.shape[1]
    assert est.n_outputs_ == Q
    m = est.predict(Xt, gt)
    m2, s = est.predict(Xt, gt, return_std=True)
    m3, C = est.predict(Xt, gt, return_cov=True)
    assert m.shape == s.shape == (Xt.shape[0], Q) and C.shape == (Xt.shape[0], Q, Q)
    np.testing.assert_allclose(m, m2)
    np.testing.assert_allclose(m, m3)
    np.testing.assert_allclose(C, np.swapaxes(C, 1, 2), atol=1e-12)
    assert np.all(np.linalg.eigvalsh(C) > 0)
    np.testing.assert_allclose(s, np.sqrt(np.diagonal(C, axis1=1, axis2=2)), rtol=1e-12)
    # the components (and the clients' constant means) add up to the mean
    parts = est.predict_components(Xt, gt)
    assert set(parts) == {"global", "deviation", "local", "offset"}
    np.testing.assert_allclose(sum(p[0] for p in parts.values()), m, atol=1e-8)
    # loadings in target units
    R_g, R_d, R_l = 2, 2, 2
    assert est.loadings_["global"].shape == (Q, R_g)
    for lab in np.unique(data[2]):
        assert est.loadings_["deviation"][lab].shape == (Q, R_d)
        assert est.loadings_["local"][lab].shape == (Q, R_l)
    # the ELBO history is finite and the model beats a constant predictor
    assert np.all(np.isfinite(est.elbo_history_))
    assert est.score(Xt, Yt, gt) > 0.5


def test_unseen_client_includes_spread_of_levels(data, fitted):
    """A never-seen client's constant means are a new draw: its Q x Q blocks
    carry (1 + 1/T) times the sample covariance of the clients' offsets."""
    Xt = data[3][:4]
    est = fitted
    offsets = np.array([c.local_values()["offset"] for c in est.clients_.values()])
    T, Q = offsets.shape
    V = (1 + 1 / T) * np.cov(offsets, rowvar=False, ddof=1)
    scale = np.asarray(est.y_scale_)
    parts = est.predict_components(Xt, np.full(4, "new"))
    np.testing.assert_allclose(parts["offset"][1], np.tile(scale * np.sqrt(np.diag(V)), (4, 1)),
                               rtol=1e-10)
    # a fitted client's constants are estimates: their own posterior std
    seen = est.predict_components(Xt, np.full(4, data[2][0]))
    P = est.clients_[data[2][0]].posterior
    sd = np.zeros(Q)
    sd[P["offset_outputs"]] = np.sqrt(np.diag(P["offset_variance"]))
    np.testing.assert_allclose(seen["offset"][1], np.tile(scale * sd, (4, 1)), rtol=1e-10)
    # the rows of one new client share the draw: its per-row blocks match the
    # joint covariance's, and two rows far apart (no kernel coupling left) are
    # coupled by exactly that covariance
    _, J = est.predict_joint(Xt[:2], np.array(["new", "new"]))
    _, C = est.predict(Xt[:2], np.array(["new", "new"]), return_cov=True)
    np.testing.assert_allclose(J[:Q, :Q], C[0], atol=1e-10)
    _, J_far = est.predict_joint(np.r_[Xt[:1], Xt[:1] + 1e6], np.array(["new", "new"]))
    far = J_far[:Q, Q:] / np.outer(scale, scale)
    np.testing.assert_allclose(far, V, atol=1e-8)


def test_unseen_client_is_wider(data, fitted):
    Xt, gt = data[3], data[5]
    est = fitted
    rows = gt == gt[0]
    _, s_seen = est.predict(Xt[rows], gt[rows], return_std=True)
    _, s_new = est.predict(Xt[rows], np.full(rows.sum(), "new"), return_std=True)
    assert s_new.shape == s_seen.shape
    assert np.all(s_new >= s_seen - 1e-9)
    assert np.mean(s_new) > np.mean(s_seen)


def test_reproducible(data):
    X, Y, g, Xt, _, gt = data
    kw = dict(n_rounds=2, random_state=3)
    a = FederatedHierarchicalGPRegressor(**kw).fit(X, Y, g).predict(Xt, gt, return_cov=True)
    b = FederatedHierarchicalGPRegressor(**kw).fit(X, Y, g).predict(Xt, gt, return_cov=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_missing_outputs_are_masked(data):
    """NaN entries are missing outputs: the fit uses the others, and the hidden
    values are recovered through the other outputs and the loadings."""
    X, Y, g, Xt, _, gt = data
    Ym = Y.copy()
    rng = np.random.default_rng(0)
    holes = rng.random(Y.shape) < 0.2
    holes[np.all(holes, axis=1), 0] = False  # keep one output per row
    Ym[holes] = np.nan
    est = FederatedHierarchicalGPRegressor(n_rounds=5, random_state=0).fit(X, Ym, g)
    m, s = est.predict(X, g, return_std=True)
    assert np.all(np.isfinite(m)) and np.all(np.isfinite(s))
    err = (m - Y)[holes]
    assert np.sqrt(np.mean(err**2)) < 0.5 * np.std(Y)
    # calibrated at the hidden entries (a loose check: few points)
    assert np.mean(np.abs(err) > 3 * s[holes]) < 0.1


def test_diagonal_noise_and_ranks(data):
    X, Y, g, Xt, _, gt = data
    est = FederatedHierarchicalGPRegressor(n_rounds=2, n_latent=(2, 1, 1), noise="diagonal",
                                           random_state=0).fit(X, Y, g)
    Q = Y.shape[1]
    lab = g[0]
    assert np.shape(est.clients_[lab].local_values()["noise_variance"]) == (Q,)
    assert est.loadings_["deviation"][lab].shape == (Q, 1)
    m, C = est.predict(Xt, gt, return_cov=True)
    assert C.shape == (Xt.shape[0], Q, Q)


@pytest.mark.parametrize("components", [("global", "local"), ("global", "deviation"),
                                        ("global",), ("local",)])
def test_ablations(data, components):
    X, Y, g, Xt, Yt, gt = data
    est = FederatedHierarchicalGPRegressor(components=components, n_rounds=2,
                                           random_state=0).fit(X, Y, g)
    m, s = est.predict(Xt, gt, return_std=True)
    assert m.shape == Yt.shape and np.all(np.isfinite(s)) and np.all(s > 0)
    assert set(est.predict_components(Xt, gt)) == set(components) | {"offset"}
    # unseen clients too
    m, s = est.predict(Xt[:3], np.array(["new"] * 3), return_std=True)
    assert np.all(np.isfinite(m)) and np.all(s > 0)


def test_close_to_exact_gp_with_many_inducing_points():
    """One client, 1-D inputs, far more inducing points than the function's
    detail needs: the sparse posterior equals the exact ILMM GP posterior at the
    fitted hyperparameters (Titsias' bound is tight when the inducing points
    resolve the kernel), with the client's estimated constants integrated under
    a flat prior (universal kriging, one trend column per output)."""
    from skfedgp.kernels import se_ard

    rng = np.random.default_rng(0)
    n, Q = 25, 2
    X = np.sort(rng.uniform(0, 5, (n, 1)), axis=0)
    f = np.c_[np.sin(X[:, 0]), np.sin(X[:, 0]) + 0.5 * np.cos(2 * X[:, 0])]
    Y = f + 0.05 * rng.standard_normal((n, Q))
    est = FederatedHierarchicalGPRegressor(components=("global",), n_latent=1,
                                           n_inducing=60, n_rounds=5, random_state=0)
    est.fit(X, Y)
    Xt = np.linspace(0, 5, 7)[:, None]
    m, C = est.predict(Xt, return_cov=True)
    # exact GP with the fitted hyperparameters (scaled units inside the model)
    srv = est.server_
    G = srv.global_pack.unpack(srv.theta_global)
    lab = next(iter(est.clients_))
    L = est.clients_[lab].local_values()
    xs = (X - srv.x_offset) / srv.x_scale
    xt = (Xt - srv.x_offset) / srv.x_scale
    B = G["B_g"]
    ell = G["lengthscale_g"][0]
    noise = np.diag(np.broadcast_to(L["noise_variance"], (Q,)))  # per output
    K = np.kron(se_ard(xs, xs, ell, 1.0), B @ B.T) + np.kron(np.eye(n), noise)
    Ks = np.kron(se_ard(xt, xs, ell, 1.0), B @ B.T)
    Kss = np.kron(se_ard(xt, xt, ell, 1.0), B @ B.T)
    ys = ((Y - est.y_offset_) / est.y_scale_ - L["offset"]).ravel()
    mu = L["offset"] + (Ks @ np.linalg.solve(K, ys)).reshape(-1, Q)
    S = Kss - Ks @ np.linalg.solve(K, Ks.T)
    T = np.kron(np.ones((n, 1)), np.eye(Q))  # trend: the constant of each output
    V = np.linalg.inv(T.T @ np.linalg.solve(K, T))
    R = np.kron(np.ones((len(Xt), 1)), np.eye(Q)) - Ks @ np.linalg.solve(K, T)
    S = S + R @ V @ R.T
    scale = np.asarray(est.y_scale_)
    np.testing.assert_allclose(m, est.y_offset_ + scale * mu, atol=2e-3 * scale.max())
    for k in range(Xt.shape[0]):
        blk = S[k * Q:(k + 1) * Q, k * Q:(k + 1) * Q] + noise
        np.testing.assert_allclose(C[k], np.outer(scale, scale) * blk,
                                   atol=2e-3 * scale.max() ** 2)


def test_bad_input(data):
    X, Y, g = data[:3]
    est = FederatedHierarchicalGPRegressor(n_rounds=1)
    Yb = Y.copy()
    Yb[4] = np.nan
    with pytest.raises(ValueError, match="every output missing"):
        est.fit(X, Yb, g)
    Yb = Y.copy()
    Yb[2, 1] = np.inf
    with pytest.raises(ValueError, match="infinit"):
        est.fit(X, Yb, g)
    Xb = X.copy()
    Xb[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(Xb, Y, g)
    with pytest.raises(ValueError, match="rows"):
        est.fit(X, Y[:-1], g)
    with pytest.raises(ValueError, match="mean-field|structured"):
        FederatedHierarchicalGPRegressor(variational_family="mean_field",
                                         optimizer="adam").fit(X, Y, g)
    with pytest.raises(ValueError, match="variance"):
        FederatedHierarchicalGPRegressor(variance=1.0).fit(X, Y, g)
    with pytest.raises(ValueError, match="n_latent"):
        FederatedHierarchicalGPRegressor(n_latent=(1, 2, 1)).fit(X, Y, g)
    with pytest.raises(ValueError, match="n_latent"):
        FederatedHierarchicalGPRegressor(n_latent=0).fit(X, Y, g)
    with pytest.raises(ValueError, match="noise"):
        FederatedHierarchicalGPRegressor(noise="full").fit(X, Y, g)


def test_wrong_number_of_outputs(data, fitted):
    X, Y, g, Xt, Yt, gt = data
    with pytest.raises(ValueError, match="outputs"):
        fitted.score(Xt, Yt[:, :2], gt)
    # clients that disagree on the number of outputs (each holds its own data)
    cfg = ModelConfig(components=("global",), n_inducing=5, n_inducing_local=5,
                      lengthscale=None, local_lengthscale=None, variance=None,
                      local_variance=None, noise_variance=None, phi=None, local_steps=1,
                      learning_rate=0.1, global_learning_rate=0.1, normalize_y=True,
                      variational_family="structured", n_outputs=3)
    a = Client("a", X[:10], Y[:10])
    b = Client("b", X[10:20], Y[10:20, :2])
    with pytest.raises(ValueError, match="number of outputs"):
        Server(cfg, 1, 0).standardise([a.summary(), b.summary()])


def test_predict_joint_matches_blocks(data, fitted):
    Xt, gt = data[3], data[5]
    rows = gt == gt[0]
    m, C = fitted.predict(Xt[rows], gt[rows], return_cov=True)
    mj, J = fitted.predict_joint(Xt[rows], gt[rows])
    n, Q = m.shape
    np.testing.assert_allclose(mj, m, atol=1e-10)
    assert J.shape == (n * Q, n * Q)
    for i in range(n):  # the per-row blocks of the joint covariance
        np.testing.assert_allclose(J[i * Q:(i + 1) * Q, i * Q:(i + 1) * Q], C[i], atol=1e-8)
    assert np.all(np.linalg.eigvalsh(J) > 0)
    # a never-seen client: its per-row blocks match too
    new = np.array(["new"] * 4)
    m, C = fitted.predict(Xt[:4], new, return_cov=True)
    mj, J = fitted.predict_joint(Xt[:4], new)
    np.testing.assert_allclose(mj, m, atol=1e-10)
    for i in range(4):
        np.testing.assert_allclose(J[i * Q:(i + 1) * Q, i * Q:(i + 1) * Q], C[i], atol=1e-8)
    with pytest.raises(ValueError, match="one client"):
        fitted.predict_joint(Xt, gt)


def test_predict_joint_over_the_memory_budget_says_rows_and_outputs(data, fitted, monkeypatch):
    from skfedgp import regressor

    Xt, gt = data[3], data[5]
    Q = fitted.n_outputs_
    monkeypatch.setattr(regressor, "MAX_COV_BYTES", 8 * (4 * Q) ** 2)
    _, J = fitted.predict_joint(Xt[:4], gt[:4])  # exactly at the budget
    assert J.shape == (4 * Q, 4 * Q)
    with pytest.raises(MemoryError, match=rf"predict_joint on 5 rows x {Q} outputs needs a "
                       rf"{5 * Q} x {5 * Q} .*\(at most 4 rows with {Q} outputs\)\. "
                       r"Use predict\(return_cov=True\) for the per-row Q x Q blocks"):
        fitted.predict_joint(Xt[:5], gt[:5])


@pytest.mark.parametrize("noise", ["diagonal", "isotropic"])
def test_noise_does_not_depend_on_column_units(noise):
    """The default noise="diagonal" and noise="isotropic" are in standardised
    units: multiplying one target column by 1000 rescales that column's
    predictions and leaves the other column's unchanged."""
    rng = np.random.default_rng(3)
    n = 30
    X = rng.uniform(0, 6, (2 * n, 1))
    g = np.repeat(["a", "b"], n)
    Y = np.c_[np.sin(X[:, 0]), np.cos(X[:, 0])] + 0.1 * rng.standard_normal((2 * n, 2))
    Xt = np.linspace(0, 6, 9)[:, None]
    gt = np.repeat("a", 9)
    kw = dict(n_latent=1, n_rounds=2, random_state=0, noise=noise)
    m1, s1 = FederatedHierarchicalGPRegressor(**kw).fit(X, Y, groups=g).predict(
        Xt, groups=gt, return_std=True)
    k = np.array([1.0, 1000.0])
    m2, s2 = FederatedHierarchicalGPRegressor(**kw).fit(X, Y * k, groups=g).predict(
        Xt, groups=gt, return_std=True)
    # rtol 1e-5: the per-output noise centres agree to 1e-12, but two rounds
    # of L-BFGS amplify the columns' round-off to 2e-6 relative in the
    # diagonal noise's predictions (they passed at 1e-6 with one centre)
    np.testing.assert_allclose(m2 / k, m1, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(s2 / k, s1, rtol=1e-5)


def test_isotropic_target_noise_is_one_variance_in_target_units():
    """Outputs on scales 1 and 50 with the same noise (sd 0.05):
    noise="isotropic_target" gives every output the same noise variance in
    target units, its hyperprior centre is in those units (close to the
    true 0.0025, not off by the ratio of the scales) also for a client whose
    pilot could run on one output only, and the
    client's gradient in the one packed noise parameter (chain rule through
    the per-output weights) matches central finite differences."""
    from skfedgp.federated import ILMMStructuredClient

    rng = np.random.default_rng(3)
    n = 30
    X = rng.uniform(0, 6, (3 * n, 1))
    g = np.repeat(["a", "b", "c"], n)
    Y = np.c_[np.sin(X[:, 0]), 50.0 * np.cos(X[:, 0])] + 0.05 * rng.standard_normal((3 * n, 2))
    Y[np.flatnonzero(g == "c")[3:], 0] = np.nan  # client c: too few rows for a pilot of output 0
    states = {}
    est = FederatedHierarchicalGPRegressor(
        n_latent=1, n_rounds=2, random_state=0, noise="isotropic_target",
        checkpoint=lambda r, s: states.__setitem__(r, s)).fit(X, Y, groups=g)
    scale = np.asarray(est.y_scale_)
    assert scale.shape == (2,) and scale[1] > 10 * scale[0]
    unit = float(np.mean(scale**2))  # the packed value's unit, target variance
    assert np.isnan(est.clients_["c"]._pilot_noise[0])  # its output-0 pilot did not run
    for c in est.clients_.values():
        s2 = np.asarray(c.local_values()["noise_variance"])
        assert s2.shape == (2,)
        raw = s2 * scale**2
        np.testing.assert_allclose(raw, raw[0], rtol=1e-12)
        assert 0.0025 / 3 < raw[0] < 0.0025 * 3
        assert 0.0025 / 4 < c.prior_noise * unit < 0.0025 * 4
    # chain rule: the surrogate's gradient in the packed (log) noise parameter
    st = states[2]
    client = ILMMStructuredClient(Client("a", X[g == "a"], Y[g == "a"]))
    client.prepare(st.init)
    client.set_state(st.client_states["a"])
    cfg = est.server_.config
    args = (st.theta_global, st.global_pack, cfg, st.post.mean, st.post.covariance)
    theta = client.theta.copy()
    sl = client.pack.slices["noise_variance"]
    _, grad = client._surrogate(theta, *args)
    assert client.noise_weights() is not None
    h = 1e-4  # the surrogate is a sum of large terms: smaller steps cancel digits
    tp, tm = theta.copy(), theta.copy()
    tp[sl] += h
    tm[sl] -= h
    fd = (client._surrogate(tp, *args)[0] - client._surrogate(tm, *args)[0]) / (2 * h)
    np.testing.assert_allclose(grad[sl], fd, rtol=1e-4)


def test_given_noise_variance_is_in_target_units():
    """A given noise_variance (target units) starts every output at that
    variance with noise="diagonal", and one above the range for some output
    is refused."""
    rng = np.random.default_rng(4)
    X = rng.uniform(0, 6, (40, 1))
    Y = np.c_[np.sin(X[:, 0]), 50.0 * np.cos(X[:, 0])] + 0.05 * rng.standard_normal((40, 2))
    states = {}
    est = FederatedHierarchicalGPRegressor(
        n_latent=1, n_rounds=1, random_state=0, noise="diagonal", noise_variance=0.01,
        local_steps=1, global_steps=1, checkpoint=lambda r, s: states.__setitem__(r, s))
    est.fit(X, Y)
    st = states[1]
    (cs,) = st.client_states.values()
    scale = np.asarray(est.y_scale_)
    start = cs.pack.unpack(cs.theta)["noise_variance"] * scale**2
    assert np.all(start < 0.05) and np.all(start > 0.002)  # near 0.01 after one short round
    with pytest.raises(ValueError, match="noise_variance"):
        FederatedHierarchicalGPRegressor(n_latent=1, n_rounds=1, noise="diagonal",
                                         noise_variance=1e4 * scale[0] ** 2 * 2).fit(X, Y)


def test_resumed_or_warm_started_fit_keeps_the_noise_model():
    """A warm start (or resume) with another noise option is refused by name
    instead of reading the saved noise values in other units."""
    X, Y, g = _small_multioutput()
    est = FederatedHierarchicalGPRegressor(n_latent=1, n_rounds=1, random_state=0).fit(X, Y, g)
    est.set_params(noise="isotropic_target", warm_start=True)
    with pytest.raises(ValueError, match="was trained with noise='diagonal'"):
        est.fit(X, Y, g)


def test_warm_start_refuses_an_output_observed_nowhere_and_keeps_the_model():
    """A warm-start refit skips the server's set-up, which refuses an output
    that is NaN in every row; it accepted it and degraded that output. It is
    refused as a fresh fit refuses it, and the fitted model stays as it was."""
    X, Y, g = _small_multioutput()
    Yn = Y.copy()
    Yn[:, 1] = np.nan
    message = r"^output 1 has no observed \(non-NaN\) value in any client$"
    with pytest.raises(ValueError, match=message):
        FederatedHierarchicalGPRegressor(n_latent=1, n_rounds=1, random_state=0).fit(X, Yn, g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_latent=1, n_rounds=1, random_state=0,
                                               warm_start=True).fit(X, Y, g)
    before = est.predict(X, g, return_std=True)
    history = list(est.elbo_history_)
    with pytest.raises(ValueError, match=message):
        est.fit(X, Yn, g)
    after = est.predict(X, g, return_std=True)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert est.elbo_history_ == history


def _small_multioutput():
    rng = np.random.default_rng(5)
    X = rng.uniform(0, 6, (40, 1))
    g = np.repeat(["a", "b"], 20)
    Y = np.c_[np.sin(X[:, 0]), 3.0 * np.cos(X[:, 0])] + 0.05 * rng.standard_normal((40, 2))
    return X, Y, g


def test_unobserved_output_is_left_out_of_the_population_level():
    """A client that never observed an output never learned that output's
    constant mean: the population's mean and spread of that output come from
    the clients that did (and every client says which, in its final message)."""
    X, Y, g, *_ = make_hierarchical_regression(
        n_clients=4, n_samples=20, n_outputs=2, scenario="A", n_test=5, random_state=2)
    Y = Y.copy()
    last = np.unique(g)[-1]
    Y[g == last, 1] = np.nan
    est = FederatedHierarchicalGPRegressor(n_rounds=2, random_state=0).fit(X, Y, g)
    offs = {lab: c.local_values()["offset"] for lab, c in est.clients_.items()}
    kept = np.array([offs[lab][1] for lab in offs if lab != last])
    pop = est._population_local
    np.testing.assert_allclose(pop["offset"][1], kept.mean(), rtol=1e-12)
    np.testing.assert_allclose(pop["offset_variance"][1, 1], (1 + 1 / 3) * np.var(kept, ddof=1),
                               rtol=1e-10)
    allc = np.array([offs[lab][0] for lab in offs])
    np.testing.assert_allclose(pop["offset"][0], allc.mean(), rtol=1e-12)
    np.testing.assert_allclose(pop["offset_variance"][0, 0], (1 + 1 / 4) * np.var(allc, ddof=1),
                               rtol=1e-10)
    assert np.all(np.linalg.eigvalsh(pop["offset_variance"]) >= -1e-12)
    assert not np.allclose(np.mean([offs[lab][1] for lab in offs]), kept.mean())
    # the client that never observed output 1 never learned its level there:
    # it gets the population's level and spread for that output only
    Xt = X[:3]
    parts = est.predict_components(Xt, np.full(3, last))
    scale = np.asarray(est.y_scale_)
    P = est.clients_[last].posterior  # output 0: its own estimate's std
    assert list(P["offset_outputs"]) == [0]
    np.testing.assert_allclose(parts["offset"][1][:, 0],
                               scale[0] * np.sqrt(P["offset_variance"][0, 0]), rtol=1e-10)
    np.testing.assert_allclose(parts["offset"][1][:, 1],
                               scale[1] * np.sqrt(pop["offset_variance"][1, 1]), rtol=1e-10)
    np.testing.assert_allclose(parts["offset"][0][:, 1],
                               est.y_offset_[1] + scale[1] * pop["offset"][1], rtol=1e-10)


def test_unobserved_output_is_left_out_of_population_noise_and_loadings():
    """noise="diagonal": an output a client never observed never trained its
    noise variance or its loadings' rows there; the never-seen client's
    population values for that output average over the clients that observed it."""
    X, Y, g, *_ = make_hierarchical_regression(
        n_clients=4, n_samples=20, n_outputs=2, scenario="A", n_test=5, random_state=2)
    Y = Y.copy()
    last = np.unique(g)[-1]
    Y[g == last, 1] = np.nan
    est = FederatedHierarchicalGPRegressor(n_rounds=2, noise="diagonal",
                                           random_state=0).fit(X, Y, g)
    pop = est._population_local
    vals = {lab: c.local_values() for lab, c in est.clients_.items()}
    others = [lab for lab in vals if lab != last]
    s2 = np.array([vals[lab]["noise_variance"] for lab in vals])
    s2_kept = np.array([vals[lab]["noise_variance"] for lab in others])
    np.testing.assert_allclose(pop["noise_variance"][1], np.exp(np.mean(np.log(s2_kept[:, 1]))),
                               rtol=1e-10)
    np.testing.assert_allclose(pop["noise_variance"][0], np.exp(np.mean(np.log(s2[:, 0]))),
                               rtol=1e-10)
    assert not np.isclose(np.exp(np.mean(np.log(s2[:, 1]))), pop["noise_variance"][1])
    for key, name in (("B_d", "deviation"), ("B_l", "local")):
        B = {lab: vals[lab][key] for lab in vals}
        want_11 = np.mean([B[lab][1, 0] ** 2 for lab in others])
        np.testing.assert_allclose(pop["coregionalisation"][name][0, 1, 1], want_11, rtol=1e-10)
        want_00 = np.mean([B[lab][0, 0] ** 2 for lab in vals])
        np.testing.assert_allclose(pop["coregionalisation"][name][0, 0, 0], want_00, rtol=1e-10)
        want_01 = np.mean([B[lab][0, 0] * B[lab][1, 0] for lab in others])
        np.testing.assert_allclose(pop["coregionalisation"][name][0, 0, 1], want_01, rtol=1e-10)


def test_population_coregionalisation_stays_psd_when_clients_miss_different_outputs():
    """Each client observed two of three outputs: the pairwise averages of the
    loadings' outer products are projected back onto the PSD cone, so a
    never-seen client's predictive Q x Q block is a covariance."""
    from skfedgp.federated import LocalHyperparameters, _population_from

    b = [np.array([1.0, 1.0, 0.3]), np.array([0.3, 1.0, 1.0]), np.array([1.0, 0.3, -1.0])]
    obs = [[1, 1, 0], [0, 1, 1], [1, 0, 1]]
    hyp = [LocalHyperparameters(np.ones((1, 1)), None, np.full(3, 0.01), np.zeros(3),
                                {"local": np.outer(b[k], b[k])[None]}, np.array(obs[k], float))
           for k in range(3)]
    C = _population_from(hyp, ("local",))["coregionalisation"]["local"][0]
    assert np.linalg.eigvalsh(C).min() >= -1e-12
    # without the projection the pairwise average has a negative eigenvalue
    raw = np.zeros((3, 3))
    for q in range(3):
        for p in range(3):
            raw[q, p] = np.mean([b[k][q] * b[k][p] for k in range(3) if obs[k][q] and obs[k][p]])
    assert np.linalg.eigvalsh(raw).min() < -0.1
    rng = np.random.default_rng(0)
    X, Y, g = [], [], []
    for k in range(3):
        x = rng.uniform(0, 10, 30)
        Yk = np.outer(np.sin(x + k), b[k]) + 0.05 * rng.standard_normal((30, 3))
        Yk[:, [q for q in range(3) if not obs[k][q]]] = np.nan
        X.append(x)
        Y.append(Yk)
        g += [k] * 30
    est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=3, components=("local",),
                                           n_latent=1).fit(np.concatenate(X)[:, None],
                                                           np.vstack(Y), np.array(g))
    _, C_new = est.predict(np.array([[5.0]]), ["new"], return_cov=True)
    assert np.linalg.eigvalsh(C_new[0]).min() > 0


def test_isotropic_target_population_noise_keeps_the_output_ratio():
    """noise="isotropic_target": one trained value mapped to the outputs by a
    fixed ratio; the population keeps that ratio even when a client missed an
    output (only noise="diagonal" averages per output over observers)."""
    X, Y, g, *_ = make_hierarchical_regression(
        n_clients=4, n_samples=20, n_outputs=2, scenario="A", n_test=5, random_state=2)
    Y = Y.copy()
    Y[g == np.unique(g)[-1], 1] = np.nan
    est = FederatedHierarchicalGPRegressor(n_rounds=2, noise="isotropic_target",
                                           random_state=0).fit(X, Y, g)
    s2 = np.array([c.local_values()["noise_variance"] for c in est.clients_.values()])
    pop = est._population_local["noise_variance"]
    np.testing.assert_allclose(pop, np.exp(np.mean(np.log(s2), axis=0)), rtol=1e-12)
    np.testing.assert_allclose(pop[1] / pop[0], s2[0, 1] / s2[0, 0], rtol=1e-10)


def test_offset_moments_overlapping_outputs():
    """Pairwise-complete moments: exact diagonal, the covariance of the
    output means sigma_qp T_qp / (T_q T_p), and PSD results where the plain
    pairwise estimate scaled entrywise was not (review example)."""
    from skfedgp.federated import _offset_moments

    off = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [1.0, 0.0]])
    seen = np.array([[1, 1], [1, 1], [1, 1], [1, 0]], dtype=bool)
    mean, new, shared = _offset_moments(off, seen)
    np.testing.assert_allclose(mean, [1.0, 1.0])
    for M in (new, shared):
        np.testing.assert_allclose(M, M.T)
        assert np.all(np.linalg.eigvalsh(M) >= -1e-12)
    # new = S + G o S with S the (projected) pairwise covariance and
    # G_qp = T_qp / (T_q T_p): here T = (4, 3), T_01 = 3
    S = new - shared
    G = np.array([[1 / 4, 3 / (4 * 3)], [3 / (4 * 3), 1 / 3]])
    np.testing.assert_allclose(shared, G * S, rtol=1e-12)
    # G is the covariance factor of the two output means (Monte Carlo, unit
    # variances, correlation 0.9, output 1 seen by the first three clients)
    rng = np.random.default_rng(0)
    Sig = np.array([[1.0, 0.9], [0.9, 1.0]])
    draws = rng.multivariate_normal([0, 0], Sig, size=(200_000, 4))
    mc = np.cov(draws[:, :, 0].mean(axis=1), draws[:, :3, 1].mean(axis=1))
    np.testing.assert_allclose(mc, G * Sig, rtol=0.03)


def test_an_output_a_client_never_observed_gets_the_never_seen_clients_law():
    """Nothing was learned about how a client's own parts load on an output it
    never recorded (its loadings' rows stay 0): on that output its prediction
    is a never-seen client's (mean and, up to its own noise, variance), not the zero-variance
    deviation and local parts of its own posterior."""
    X, Y, g, Xt, _, gt = make_hierarchical_regression(
        n_clients=3, n_samples=20, n_outputs=3, scenario="A", n_test=6, random_state=0)
    Y = Y.copy()
    Y[g == 1, 2] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=2, random_state=0).fit(X, Y, g)
        rows = Xt[gt == 1]
        m, s = est.predict(rows, np.full(len(rows), 1), return_std=True)
        m_new, s_new = est.predict(rows, np.full(len(rows), "never-seen"), return_std=True)
        mj, Cj = est.predict_joint(rows, np.full(len(rows), 1))
        parts = est.predict_components(rows, np.full(len(rows), 1))
    assert_allclose(est.loadings_["deviation"][1][2], 0.0)
    assert_allclose(est.loadings_["local"][1][2], 0.0)
    assert_allclose(m[:, 2], m_new[:, 2], rtol=1e-10, atol=1e-10)
    # the same up to its global posterior's coupling to the client's data
    # (the noise variance of the output it never observed is the population's)
    assert_allclose(s[:, 2], s_new[:, 2], rtol=1e-2)
    # an observed output keeps its own posterior
    assert not np.allclose(s[:, 0], s_new[:, 0], rtol=1e-2)
    # the joint covariance and the components agree with the marginal
    assert_allclose(np.sqrt(np.diag(Cj)).reshape(-1, 3), s, rtol=1e-10)
    for name in ("deviation", "local"):
        assert np.all(parts[name][1][:, 2] > 0)


def _unequal_noise_outputs(seed):
    """3 clients, 3 outputs mixing two latent functions; noise sd 0.05, 0.05, 0.8."""
    rng = np.random.default_rng(seed)
    W = np.array([[1.0, 0.5], [0.5, -1.0], [-0.7, 0.7]])
    sd = np.array([0.05, 0.05, 0.8])
    parts = []
    for c in range(3):
        x = rng.uniform(0, 5, 60)
        F = np.c_[np.sin(1.5 * x) + 0.3 * np.sin(0.5 * x + c), np.cos(0.7 * x)]
        parts.append((x[:, None], F @ W.T + sd * rng.standard_normal((60, 3)), np.full(60, c)))
    X, Y, g = (np.concatenate([p[k] for p in parts]) for k in range(3))
    train = np.tile(np.r_[np.ones(40, bool), np.zeros(20, bool)], 3)
    return X[train], Y[train], g[train], X[~train], Y[~train], g[~train]


@pytest.mark.parametrize("seed", [0, 1])
def test_default_noise_follows_each_outputs_own_noise(seed):
    """With one noise variance shared by the outputs (noise="isotropic", the
    default before) the noisy output had 10-13 % of held-out points beyond
    3 std and 95 % coverage 0.67, the clean ones intervals 5-10 times too
    wide; the default "diagonal" fits one per output."""
    X, Y, g, Xt, Yt, gt = _unequal_noise_outputs(seed)
    scores = {}
    for noise in ("diagonal", "isotropic"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = FederatedHierarchicalGPRegressor(noise=noise, random_state=0).fit(X, Y, g)
        m, s = est.predict(Xt, gt, return_std=True)
        z = np.abs(Yt - m) / s
        scores[noise] = (np.mean(z[:, 2] > 3), np.mean(z[:, 2] < 1.96), np.mean(s[:, 0]))
    assert FederatedHierarchicalGPRegressor().noise == "diagonal"
    assert scores["diagonal"][0] <= 0.05 and scores["diagonal"][1] >= 0.8
    assert scores["diagonal"][2] < 0.2  # the clean output's std near its noise sd 0.05
    assert scores["isotropic"][0] >= 0.08  # the case is one the old default got wrong


def test_unobserved_output_takes_the_population_noise():
    """With one noise variance per output, a client that never observed an
    output never trained its noise there: its prediction for that output uses
    the population's (as its level does). It used the untrained value, 0.32
    against the population's 0.71: predictive std 0.45 for a true noise sd of
    0.5, 95 % coverage 0.87."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (90, 1))
    g = np.repeat([0, 1, 2], 30)
    sd = np.array([0.05, 0.5])
    Y = np.c_[np.sin(X[:, 0]), 0.5 * np.cos(X[:, 0])] + sd * rng.normal(size=(90, 2))
    Y[g == 2, 1] = np.nan  # client 2 never observes the noisy output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_latent=1, n_rounds=5, random_state=0).fit(X, Y, g)
    Xt = rng.uniform(0, 5, (2000, 1))
    Yt = np.c_[np.sin(Xt[:, 0]), 0.5 * np.cos(Xt[:, 0])] + sd * rng.normal(size=(2000, 2))
    m, s = est.predict(Xt, np.full(2000, 2), return_std=True)
    _, s_new = est.predict(Xt, np.full(2000, 7), return_std=True)  # a never-seen client
    np.testing.assert_allclose(s[:, 1].mean(), s_new[:, 1].mean(), rtol=0.05)
    assert np.mean(np.abs(Yt[:, 1] - m[:, 1]) < 1.96 * s[:, 1]) >= 0.92
    # the observed output keeps the client's own noise
    m_obs, s_obs = est.predict(Xt, np.full(2000, 0), return_std=True)
    assert s_obs[:, 0].mean() < 0.2


def test_output_seen_once_per_client_warns_and_is_widened():
    """An output recorded once per client: each client's own constant mean
    fits that value exactly, so nothing about how the output varies within a
    client can be learned. The fit predicted it as a flat level with sd 0.11
    (max |z| 36 on the true values); now it warns and the variance is raised
    to that of a new draw from the output's pooled values (Student-t)."""
    from skfedgp import UnderObservedOutputWarning

    rng = np.random.RandomState(0)
    X = rng.uniform(0, 5, (30, 1))
    g = np.repeat([0, 1, 2], 10)
    f = np.sin(X[:, 0]) + 0.3 * g
    Y = np.c_[f, 2 * f] + 0.1 * rng.randn(30, 2)
    Yobs = Y.copy()
    Yobs[~np.isin(np.arange(30), [0, 10, 20]), 1] = np.nan
    with pytest.warns(UnderObservedOutputWarning, match=r"output 1: 3 values in 3 client"):
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, Yobs, groups=g)
    m, s = est.predict(X, groups=g, return_std=True)
    assert np.max(np.abs(Y[:, 1] - m[:, 1]) / s[:, 1]) < 5
    # the well-observed output is not widened
    assert np.mean(s[:, 0]) < 0.5
    # predict_joint gives the same marginal std
    _, C = est.predict_joint(X[:10], groups=g[:10])
    assert_allclose(np.sqrt(np.diag(C))[1::2], s[:10, 1], rtol=1e-6)
    # seen once per client with the same value everywhere: no spread to raise
    # the variance by, but the warning still says the output is under-observed
    # (it said nothing)
    Ysame = Yobs.copy()
    Ysame[[0, 10, 20], 1] = 1.5
    with pytest.warns(UnderObservedOutputWarning, match=r"output 1: 3 values in 3 client"
                      r"\(s\), all equal.*no spread to raise it by"):
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=2).fit(X, Ysame, groups=g)
    # a value seen once over all clients is refused
    Y1 = Yobs.copy()
    Y1[[10, 20], 1] = np.nan
    with pytest.raises(ValueError, match="output 1 has a single observed"):
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1).fit(X, Y1, groups=g)


def test_under_observed_floor_spares_clients_that_saw_the_output_and_follows_a_warm_start():
    """The floor of an under-observed output (fewer than two values per
    observing client on average) applies to the clients that saw it less
    than twice, not to one that saw it on several rows (its own values
    inform it); a warm start on data where the output is well observed
    drops the floor and the warning (they were kept from the first fit:
    sd 2.2 against 0.096 for a fresh fit)."""
    from skfedgp import UnderObservedOutputWarning

    rng = np.random.RandomState(1)
    X = rng.uniform(0, 5, (48, 1))
    g = np.repeat(np.arange(6), 8)
    f = np.sin(X[:, 0]) + 0.3 * g
    Y = np.c_[f, 2 * f] + 0.1 * rng.randn(48, 2)
    seen = (g == 0) & (np.arange(48) % 2 == 0) | np.isin(np.arange(48), [8, 16, 24, 32, 40])
    Yobs = Y.copy()
    Yobs[~seen, 1] = np.nan  # client 0: 4 values of output 1; the others: 1 each
    est = FederatedHierarchicalGPRegressor(random_state=0, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.warns(UnderObservedOutputWarning, match=r"output 1: 9 values in 6 client"):
            est.fit(X, Yobs, g)
    floor_sd = np.sqrt(est.server_.output_variance_floor[1]) * est.y_scale_[1]
    _, s = est.predict(X, g, return_std=True)
    assert np.all(s[g != 0, 1] >= floor_sd * (1 - 1e-9))
    assert np.median(s[g == 0, 1]) < 0.5 * floor_sd  # its own variance, not the floor
    assert np.max(np.abs(Y[g == 0, 1] - est.predict(X[g == 0], g[g == 0])[:, 1])
                  / s[g == 0, 1]) < 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("error", UnderObservedOutputWarning)
        est.fit(X, Y, g)  # the same clients, every value observed
    assert not np.any(est.server_.output_variance_floor > 0)
    _, s = est.predict(X, g, return_std=True)
    assert np.all(s[:, 1] < 0.5 * floor_sd)
