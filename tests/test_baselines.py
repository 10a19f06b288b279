"""Tests of the pFedGP baseline :class:`skfedgp.baselines.PFedGPRegressor`.

References: the exact LMC log marginal likelihood against SciPy's
multivariate normal, its gradient against central finite differences, the
posterior against a dense NumPy GP built with ``np.kron``, the FedAvg step
against the weighted geometric mean, and scikit-learn's estimator checks.
"""

import warnings

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.utils.estimator_checks import parametrize_with_checks

import skfedgp.baselines as bl
from skfedgp import PFedGPRegressor
from skfedgp._validation import ClientLabelWarning
from skfedgp.baselines import fedavg_log_mean, lmc_log_marginal_likelihood


def _se(X1, X2, ell):
    d2 = ((X1[:, None, :] - X2[None, :, :]) ** 2 / ell**2).sum(-1)
    return np.exp(-0.5 * d2)


def _dense_cov(X1, X2, B, ell):
    """Input-major LMC covariance of every (x, q) pair: sum_r kron(k_r, b_r b_r^T)."""
    return sum(np.kron(_se(X1, X2, ell[r]), np.outer(B[:, r], B[:, r]))
               for r in range(B.shape[1]))


def _problem(rng, n=12, d=2, Q=3, R=2, missing=0.25):
    X = rng.uniform(0, 1, (n, d))
    Y = rng.normal(size=(n, Q))
    mask = rng.uniform(size=(n, Q)) < missing
    mask[:, 0] = False  # every row keeps a channel
    Y[mask] = np.nan
    B = rng.normal(size=(Q, R))
    ell = rng.uniform(0.3, 1.0, (R, d))
    return X, Y, B, ell


def _entries(X, Y):
    rows, qs = np.nonzero(~np.isnan(Y))
    return X[rows], qs, Y[rows, qs]


def _multi_client_data(rng, T=3, n=25, Q=2):
    X = rng.uniform(0, 10, (T * n, 1))
    Y = np.hstack([np.sin(X) + 0.3 * q * np.cos(2 * X) for q in range(Q)])
    groups = np.repeat(np.arange(T), n)
    Y = Y + 0.2 * groups[:, None] * np.cos(X / 3) + 0.05 * rng.normal(size=Y.shape)
    return X, Y, groups


# ---------------------------------------------------------------------------
# likelihood and gradient
# ---------------------------------------------------------------------------
def test_lml_matches_scipy_on_observed_entries(rng):
    """Masking entries = deleting their rows/columns of the dense covariance."""
    X, Y, B, ell = _problem(rng)
    s2 = 0.07
    Xe, qe, v = _entries(X, Y)
    lml = lmc_log_marginal_likelihood(Xe, qe, v, B, ell, s2, gradient=False)
    K = _dense_cov(X, X, B, ell) + s2 * np.eye(Y.size)
    keep = ~np.isnan(Y.ravel())  # input-major, as np.kron orders it
    ref = multivariate_normal(np.zeros(keep.sum()), K[np.ix_(keep, keep)]).logpdf(
        Y.ravel()[keep])
    assert lml == pytest.approx(ref, rel=1e-10, abs=1e-10)
    assert keep.sum() < Y.size  # the case really has missing entries


def test_lml_gradient_matches_finite_differences(rng, numgrad):
    X, Y, B, ell = _problem(rng)
    s2 = 0.1
    Xe, qe, v = _entries(X, Y)
    _, g = lmc_log_marginal_likelihood(Xe, qe, v, B, ell, s2)
    f_ell = lambda le: lmc_log_marginal_likelihood(Xe, qe, v, B, np.exp(le), s2,
                                                   gradient=False)
    f_B = lambda b: lmc_log_marginal_likelihood(Xe, qe, v, b, ell, s2, gradient=False)
    f_s = lambda ls: lmc_log_marginal_likelihood(Xe, qe, v, B, ell, float(np.exp(ls[0])),
                                                 gradient=False)
    np.testing.assert_allclose(g["log_ell"], numgrad(f_ell, np.log(ell)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g["B"], numgrad(f_B, B), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g["log_noise"], numgrad(f_s, np.log([s2]))[0], rtol=1e-5,
                               atol=1e-7)


def test_client_objective_gradient_matches_finite_differences(rng, numgrad):
    """The packed (log ell, B, log s2) objective that L-BFGS-B minimises."""
    X, Y, B, ell = _problem(rng, d=1, R=2)
    c = bl._Client("a", X, Y, np.zeros(Y.shape[1]), 1.0, B, 0.2)
    f, _, _ = c._objective()
    theta = np.concatenate([np.log(ell).ravel(), B.ravel(), [np.log(0.2)]])
    _, grad = f(theta)
    np.testing.assert_allclose(grad, numgrad(lambda t: f(t)[0], theta), rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------
# posterior
# ---------------------------------------------------------------------------
def test_one_client_posterior_equals_dense_numpy_gp(rng):
    X, Y, _, _ = _problem(rng, n=15, d=1, Q=3)
    Y = Y * 2.0 + 5.0
    est = PFedGPRegressor(n_latent=2, n_rounds=1, local_steps=3, random_state=0).fit(X, Y)
    (lab, c), = est.clients_.items()
    B, s2 = est.loadings_[lab], est.noise_variance_[lab]
    ell = est.lengthscales_
    Xs = np.linspace(-0.2, 1.2, 7)[:, None]
    Q = Y.shape[1]
    keep = ~np.isnan(Y.ravel())
    y0 = (Y - c.y_offset).ravel()[keep]
    K = (_dense_cov(X, X, B, ell) + s2 * np.eye(Y.size))[np.ix_(keep, keep)]
    Ks = _dense_cov(Xs, X, B, ell)[:, keep]
    Kss = _dense_cov(Xs, Xs, B, ell) + s2 * np.eye(Xs.shape[0] * Q)
    mean_ref = (Ks @ np.linalg.solve(K, y0)).reshape(-1, Q) + c.y_offset
    cov_ref = Kss - Ks @ np.linalg.solve(K, Ks.T)
    blocks_ref = np.stack([cov_ref[j * Q:(j + 1) * Q, j * Q:(j + 1) * Q]
                           for j in range(Xs.shape[0])])
    mean, blocks = est.predict(Xs, return_cov=True)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(blocks, blocks_ref, rtol=1e-7, atol=1e-9)
    _, std = est.predict(Xs, return_std=True)
    np.testing.assert_allclose(std**2, np.diagonal(blocks_ref, axis1=1, axis2=2), rtol=1e-7)


def test_scalar_targets_joint_covariance(rng):
    X = rng.uniform(0, 1, (20, 1))
    y = np.sin(6 * X[:, 0]) + 0.1 * rng.normal(size=20)
    est = PFedGPRegressor(n_rounds=2, local_steps=5, random_state=0).fit(X, y)
    Xs = np.linspace(0, 1, 9)[:, None]
    m, cov = est.predict(Xs, return_cov=True)
    m2, std = est.predict(Xs, return_std=True)
    assert m.shape == (9,) and cov.shape == (9, 9) and std.shape == (9,)
    np.testing.assert_allclose(m, m2)
    np.testing.assert_allclose(np.diag(cov), std**2, rtol=1e-10)
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)
    assert np.linalg.eigvalsh(cov).min() > 0
    # a column vector y gives the same numbers, shaped (n, 1)
    m_col = PFedGPRegressor(n_rounds=2, local_steps=5, random_state=0).fit(
        X, y[:, None]).predict(Xs)
    np.testing.assert_allclose(m_col[:, 0], m, rtol=1e-12)


def test_joint_covariance_has_the_regressors_memory_budget(rng, monkeypatch):
    """predict(return_cov=True) had no budget (NumPy's own MemoryError, or
    swapping, at a huge n); it now refuses above skfedgp.regressor.MAX_COV_BYTES,
    as FederatedHierarchicalGPRegressor does, naming the memory needed."""
    import skfedgp.regressor as regressor

    X = rng.uniform(0, 1, (20, 1))
    y = np.sin(6 * X[:, 0]) + 0.1 * rng.normal(size=20)
    est = PFedGPRegressor(n_rounds=1, local_steps=3, random_state=0).fit(X, y)
    Xs = np.linspace(0, 1, 10)[:, None]
    monkeypatch.setattr(regressor, "MAX_COV_BYTES", 8 * 10 * 10 - 1)
    with pytest.raises(MemoryError,
                       match=r"10 x 10 float64 covariance .*800 bytes.*MAX_COV_BYTES"):
        est.predict(Xs, return_cov=True)
    assert est.predict(Xs[:9], return_cov=True)[1].shape == (9, 9)  # within the budget
    # the marginal variances and the Q x Q blocks of 2-D targets have no n x n matrix
    assert est.predict(Xs, return_std=True)[1].shape == (10,)
    multi = PFedGPRegressor(n_rounds=1, local_steps=3, random_state=0).fit(X, np.c_[y, -y])
    assert multi.predict(Xs, return_cov=True)[1].shape == (10, 2, 2)


def test_lml_refuses_nan_inputs_and_noise(rng):
    """NaN in the inputs, targets, loadings or noise (or a zero lengthscale)
    returned a NaN log marginal likelihood silently."""
    X = rng.uniform(0, 1, (6, 2))
    qe = np.array([0, 1, 0, 1, 0, 1])
    v = rng.normal(size=6)
    B = rng.normal(size=(2, 2))
    ell = rng.uniform(0.3, 1.0, (2, 2))
    assert np.isfinite(lmc_log_marginal_likelihood(X, qe, v, B, ell, 0.1, gradient=False))
    for name, args in [
        ("Xe", (np.where(np.arange(12).reshape(6, 2) == 3, np.nan, X), qe, v, B, ell, 0.1)),
        ("v", (X, qe, np.r_[v[:5], np.nan], B, ell, 0.1)),
        ("B", (X, qe, v, np.full((2, 2), np.inf), ell, 0.1)),
        ("ell", (X, qe, v, B, np.full((2, 2), np.nan), 0.1)),
    ]:
        with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
            lmc_log_marginal_likelihood(*args)
    with pytest.raises(ValueError, match="ell .* must be positive"):
        lmc_log_marginal_likelihood(X, qe, v, B, np.zeros((2, 2)), 0.1)
    for noise in (np.nan, np.inf):
        with pytest.raises(ValueError, match="noise_variance must be a finite number"):
            lmc_log_marginal_likelihood(X, qe, v, B, ell, noise, gradient=False)


# ---------------------------------------------------------------------------
# federated averaging
# ---------------------------------------------------------------------------
def test_fedavg_log_mean_refuses_zero_weights_and_non_positive_lengthscales():
    """Weights summing to zero (0 / 0) and lengthscales <= 0 (log) gave NaN
    or a zero lengthscale silently."""
    a, b = np.array([[1.0, 4.0]]), np.array([[9.0, 1.0]])
    with pytest.raises(ValueError, match="weights sum to zero"):
        fedavg_log_mean([a, b], [0, 0])
    with pytest.raises(ValueError, match="weights must be finite and non-negative"):
        fedavg_log_mean([a, b], [1, -1])
    with pytest.raises(ValueError, match="weights must be finite and non-negative"):
        fedavg_log_mean([a, b], [1, np.nan])
    for bad in (-a, 0 * a, np.array([[1.0, np.nan]])):
        with pytest.raises(ValueError, match="lengthscales must be finite and positive"):
            fedavg_log_mean([a, bad], [1, 1])
    np.testing.assert_allclose(fedavg_log_mean([a, b], [0, 2]), b, rtol=1e-12)


def test_fedavg_log_mean_by_hand():
    a = np.array([[1.0, 4.0]])
    b = np.array([[9.0, 1.0]])
    out = fedavg_log_mean([a, b], [1, 3])
    np.testing.assert_allclose(out, [[9.0 ** 0.75, 4.0 ** 0.25]], rtol=1e-12)


def test_server_step_is_weighted_log_mean_of_client_lengthscales(rng, monkeypatch):
    X, Y, groups = _multi_client_data(rng)
    Y[groups == 1, 1] = np.where(np.arange(25) % 2 == 0, np.nan, Y[groups == 1, 1])
    sent = []
    orig = bl._local_round

    def spy(client, ell, steps):
        client, ell_new = orig(client, ell, steps)
        sent.append((client.label, client.n_entries, ell_new.copy()))
        return client, ell_new

    monkeypatch.setattr(bl, "_local_round", spy)
    est = PFedGPRegressor(n_rounds=1, local_steps=4, random_state=0).fit(X, Y, groups)
    assert est.n_iter_ == 1
    w = np.array([n for _, n, _ in sent], dtype=float)
    assert sorted(w) == [37.0, 50.0, 50.0]  # weights are observed entries, not rows
    logs = np.stack([np.log(e) for _, _, e in sent])
    ref = np.exp(np.tensordot(w / w.sum(), logs, axes=1))
    np.testing.assert_allclose(est.lengthscale_history_[1], ref, rtol=1e-12)
    np.testing.assert_allclose(est.lengthscales_, ref * est.x_scale_, rtol=1e-12)
    # the upload per client is the (n_latent, d) lengthscale array only
    assert est.communication_[0]["upload_bytes"] == 3 * ref.size * 8


def test_reproducible_and_personalised(rng):
    X, Y, groups = _multi_client_data(rng)
    a = PFedGPRegressor(n_rounds=3, local_steps=5, random_state=1).fit(X, Y, groups)
    b = PFedGPRegressor(n_rounds=3, local_steps=5, random_state=1).fit(X, Y, groups)
    c = PFedGPRegressor(n_rounds=3, local_steps=5, random_state=2).fit(X, Y, groups)
    np.testing.assert_array_equal(a.predict(X, groups), b.predict(X, groups))
    assert not np.allclose(a.loadings_[0], c.loadings_[0])
    # the final refit is what the clients predict with: its LML is the last entry
    lml = sum(lmc_log_marginal_likelihood(c.X[c.entries[0]], c.entries[1], c.entries[2],
                                          c.B, a.lengthscale_unit_, c.noise_variance,
                                          gradient=False) for c in a.clients_.values())
    assert lml == pytest.approx(a.lml_history_[-1], rel=1e-10)
    a0 = PFedGPRegressor(n_rounds=0, random_state=1).fit(X, Y, groups)
    assert a0.n_iter_ == 0 and len(a0.lengthscale_history_) == 1
    # a personalised fit: training RMSE well below the targets' spread
    assert np.sqrt(np.mean((a.predict(X, groups) - Y) ** 2)) < 0.2 * Y.std()


def test_unseen_client_gets_population_prior(rng):
    X, Y, groups = _multi_client_data(rng)
    est = PFedGPRegressor(n_rounds=1, local_steps=3, random_state=0).fit(X, Y, groups)
    Xs = np.array([[1.0], [7.0]])
    m, cov = est.predict(Xs, [-1, -1], return_cov=True)
    offs = np.mean([c.y_offset for c in est.clients_.values()], axis=0)
    np.testing.assert_allclose(m, np.tile(offs, (2, 1)))
    prior = np.mean([est.loadings_[k] @ est.loadings_[k].T for k in est.clients_], axis=0)
    prior += np.mean(list(est.noise_variance_.values())) * np.eye(2)
    np.testing.assert_allclose(cov, np.stack([prior, prior]), rtol=1e-10)
    with pytest.warns(ClientLabelWarning, match="population prior"):
        m2 = est.predict(Xs)
    np.testing.assert_allclose(m2, m)
    with pytest.warns(ClientLabelWarning):
        est.predict(Xs, ["1", "1"])  # looks like the fitted client 1


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------
def test_bad_input_errors(rng, monkeypatch):
    X, Y, groups = _multi_client_data(rng)
    est = PFedGPRegressor(n_rounds=1, local_steps=2)
    Xn = X.copy()
    Xn[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(Xn, Y, groups)
    Yn = Y.copy()
    Yn[4] = np.nan
    with pytest.raises(ValueError, match="every channel missing"):
        est.fit(X, Yn, groups)
    Yi = Y.copy()
    Yi[0, 1] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        est.fit(X, Yi, groups)
    Yc = Y.copy()
    Yc[groups == 2, 1] = np.nan
    with pytest.raises(ValueError, match=r"client 2 has no observation of channel\(s\) \[1\]"):
        est.fit(X, Yc, groups)
    g1 = groups.copy()
    g1[0] = 9
    with pytest.raises(ValueError, match="client 9 has 1 sample"):
        est.fit(X, Y, g1)
    with pytest.raises(ValueError, match="missing client label"):
        est.fit(X, Y, np.where(groups == 0, None, groups).astype(object))
    monkeypatch.setattr(bl, "MAX_ENTRIES_PER_CLIENT", 40)
    with pytest.raises(ValueError, match="50 observed target entries.*MAX_ENTRIES_PER_CLIENT"):
        est.fit(X, Y, groups)
    monkeypatch.undo()
    for bad in (dict(n_latent=0), dict(n_rounds=-1), dict(local_steps=0),
                dict(noise_variance=-1.0), dict(lengthscale=[1.0, 2.0, 3.0]), dict(tol=-1.0)):
        with pytest.raises(ValueError):
            PFedGPRegressor(**bad).fit(X, Y, groups)
    est.fit(X, Y, groups)
    before = est.predict(X, groups)
    with pytest.raises(ValueError, match="every channel missing"):
        est.fit(X[:, :1], Yn, groups)  # a failed refit keeps the fitted state
    np.testing.assert_array_equal(est.predict(X, groups), before)
    with pytest.raises(ValueError, match="features"):
        est.predict(np.hstack([X, X]), groups)
    with pytest.raises(ValueError, match="only one of"):
        est.predict(X, groups, return_std=True, return_cov=True)


# ---------------------------------------------------------------------------
# scikit-learn conventions
# ---------------------------------------------------------------------------
@parametrize_with_checks([PFedGPRegressor(n_rounds=2, local_steps=10, random_state=0)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_tol_stops_when_lengthscales_settle(rng):
    X, Y, groups = _multi_client_data(rng)
    est = PFedGPRegressor(n_rounds=30, local_steps=10, tol=1e-2, random_state=0).fit(
        X, Y, groups)
    h = np.log(np.stack(est.lengthscale_history_))
    steps = np.abs(np.diff(h, axis=0)).max(axis=(1, 2))
    assert est.n_iter_ == len(steps) < 30
    assert steps[-1] <= 1e-2 and np.all(steps[:-1] > 1e-2)
    full = PFedGPRegressor(n_rounds=4, local_steps=10, tol=0.0, random_state=0).fit(
        X, Y, groups)
    assert full.n_iter_ == 4


def test_client_column_equals_groups(rng):
    X, Y, groups = _multi_client_data(rng)
    labels = np.array(["a", "b", "c"], dtype=object)[groups]
    Xc = np.column_stack([labels, X[:, 0]]).astype(object)
    by_col = PFedGPRegressor(n_rounds=2, local_steps=5, client_column=0, random_state=0)
    by_grp = PFedGPRegressor(n_rounds=2, local_steps=5, random_state=0)
    m1 = by_col.fit(Xc, Y).predict(Xc)
    m2 = by_grp.fit(X, Y, labels).predict(X, labels)
    np.testing.assert_allclose(m1, m2, rtol=1e-12)
    assert by_col.n_features_in_ == 2 and by_col.n_features_model_ == 1


def test_score_leaves_out_missing_outputs():
    """fit accepts NaN for an output a sensor did not record; score must too
    (each output's R^2 on its observed rows, averaged as r2_score does)."""
    from sklearn.metrics import r2_score

    from skfedgp import FederatedHierarchicalGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 6, (60, 1))
    g = np.repeat([0, 1, 2], 20)
    Y = np.c_[np.sin(X[:, 0]), np.cos(X[:, 0])] + 0.05 * rng.standard_normal((60, 2))
    Yn = Y.copy()
    Yn[::4, 1] = np.nan
    for est in (PFedGPRegressor(n_rounds=1, random_state=0),
                FederatedHierarchicalGPRegressor(n_rounds=1, n_latent=1, random_state=0)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, Yn, g)
        P = est.predict(X, g)
        seen = ~np.isnan(Yn[:, 1])
        want = np.mean([r2_score(Y[:, 0], P[:, 0]), r2_score(Y[seen, 1], P[seen, 1])])
        assert np.isclose(est.score(X, Yn, g), want)
        assert est.score(X, Y, g) == r2_score(Y, P)  # without NaN: r2_score exactly


def test_groups_that_disagree_with_the_client_column_are_warned_about():
    rng = np.random.default_rng(1)
    X = np.c_[np.repeat([0, 1], 15), rng.uniform(0, 5, 30)]
    y = np.sin(X[:, 1]) + 0.05 * rng.standard_normal(30)
    other = 1 - X[:, 0].astype(int)
    est = PFedGPRegressor(client_column=0, n_rounds=1, random_state=0)
    with pytest.warns(ClientLabelWarning, match="groups passed to fit differs from "
                                                "client_column=0 in 30 of 30 rows"):
        est.fit(X, y, other)
    with pytest.warns(ClientLabelWarning, match="groups passed to predict differs"):
        est.predict(X, other)


def test_prediction_uses_the_client_column_of_the_fit_and_names_its_prior():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (16, 1))
    y = np.sin(X[:, 0])
    g = np.repeat([0, 1], 8)
    Xg = np.c_[X, g]  # column 1: the client label
    est = PFedGPRegressor(client_column=1, n_rounds=2, local_steps=5, random_state=0).fit(Xg, y)
    before = est.predict(Xg[:3])
    est.set_params(client_column=None)  # applies from the next fit on
    assert est.client_column_ == 1
    np.testing.assert_array_equal(est.predict(Xg[:3]), before)
    # a look-alike label's warning describes this model's fallback, not the hierarchy's
    with pytest.warns(ClientLabelWarning, match="averaged means and loadings") as rec:
        est.predict(np.c_[X[:1], ["0"]].astype(object))
    assert "global part" not in str(rec[0].message)


@pytest.mark.parametrize("start", [1e308, 1e-300, [1e-9, 0.3]])
def test_given_lengthscale_outside_learned_range_is_refused(rng, start):
    """A start beyond the bounds (1e-3 to 1e3 times the inputs' range) was
    clipped to a bound, so 1e308 fitted a flat kernel without a word."""
    X = rng.uniform(0, 2, (40, 1))
    y = np.sin(3 * X[:, 0])
    g = np.repeat([0, 1], 20)
    with pytest.raises(ValueError, match=r"lies outside the range the lengthscales are "
                                         r"learned in, \[0\.00\d+\] to \[\d\.\d+e\+03\]"):
        PFedGPRegressor(n_latent=2, lengthscale=start).fit(X, y, groups=g)
    # inside the range (in input units) it is taken
    est = PFedGPRegressor(n_latent=1, lengthscale=0.5, n_rounds=0).fit(X, y, groups=g)
    np.testing.assert_allclose(est.lengthscales_, 0.5, rtol=1e-12)


def test_copied_rows_warn_as_in_the_regressor():
    # a table appended to itself: the noise variance collapsed (median
    # predictive sd 0.0009 at the training inputs, true noise sd 0.1) without
    # a word; the baseline now gives the regressor's warning
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (40, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(40)
    g = np.repeat([0, 1], 20)
    with pytest.warns(UserWarning, match="repeat an earlier row exactly"):
        PFedGPRegressor(n_rounds=1, random_state=0).fit(np.vstack([X, X]), np.r_[y, y],
                                                        np.r_[g, g])
    with warnings.catch_warnings(record=True) as caught:  # the same rows once: no such warning
        warnings.simplefilter("always")
        PFedGPRegressor(n_rounds=1, random_state=0).fit(X, y, g)
    assert not [w for w in caught if "repeat an earlier row" in str(w.message)]
