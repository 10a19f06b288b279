"""Behaviour of :class:`FederatedHierarchicalGPRegressor` as a scikit-learn
estimator: fit/predict contracts, the component decomposition, unseen
clients, ablations, progress output, and use inside clone / pickle /
Pipeline / GridSearchCV (issue 2, items 4 and "Done means")."""

import itertools
import pickle
import re
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.exceptions import DataConversionWarning
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression

FAST = dict(n_rounds=3, local_steps=5, n_inducing=6, n_inducing_local=5, random_state=0)


@pytest.fixture(scope="module")
def data():
    """Three clients of a learnable synthetic hierarchy (1 feature), string labels."""
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=30, random_state=0)
    labels = np.array(["north", "east", "south"])[g]
    return X, y, labels


@pytest.fixture(scope="module")
def fitted(data):
    X, y, g = data
    return FederatedHierarchicalGPRegressor(**FAST).fit(X, y, g)


# --------------------------------------------------------------------------
# fit / predict contracts
# --------------------------------------------------------------------------


def test_fit_returns_self_and_sets_attributes(data):
    X, y, g = data
    est = FederatedHierarchicalGPRegressor(**FAST)
    assert est.fit(X, y, g) is est
    assert sorted(est.clients_) == ["east", "north", "south"]
    assert est.n_features_in_ == X.shape[1]
    assert est.components_ == ("global", "deviation", "local")
    assert est.variational_family_ == "structured"
    assert 1 <= est.n_iter_ <= FAST["n_rounds"]
    assert len(est.elbo_history_) == est.n_iter_
    # set-up exchange, one record per round, the final posterior exchange
    assert [c["round"] for c in est.communication_] == list(range(est.n_iter_ + 2))
    mf = FederatedHierarchicalGPRegressor(**FAST, variational_family="mean_field",
                                          optimizer="adam").fit(X, y, g)
    assert len(mf.elbo_history_) == mf.n_iter_ == FAST["n_rounds"]
    assert len(mf.communication_) == FAST["n_rounds"] + 2  # set-up, rounds, final polish
    # the standardisation: pooled mean and the median of the clients' own
    # standard deviations (each client has its own learned constant mean),
    # from the clients' summaries
    assert_allclose(est.y_offset_, y.mean(), rtol=1e-12)
    assert_allclose(est.y_scale_, np.median([y[g == c].std() for c in set(g)]), rtol=1e-10)


def test_predict_shapes_std_and_cov(fitted, data):
    X, _, g = data
    idx = np.r_[0:4, 30:33, 60:62]  # rows of all three clients
    Xt, gt = X[idx], g[idx]
    mean = fitted.predict(Xt, gt)
    assert mean.shape == (idx.size,)
    m2, std = fitted.predict(Xt, gt, return_std=True)
    m3, cov = fitted.predict(Xt, gt, return_cov=True)
    assert std.shape == (idx.size,) and cov.shape == (idx.size, idx.size)
    assert_array_equal(m2, mean)
    assert_allclose(m3, mean, rtol=1e-12, atol=1e-12)
    assert np.all(std > 0)
    assert_allclose(np.diag(cov), std**2, rtol=1e-9)
    assert_allclose(cov, cov.T, atol=1e-12)
    assert np.linalg.eigvalsh(cov).min() > 0
    # rows of different clients are correlated through the shared global part
    assert abs(cov[0, 5]) > 1e-6
    with pytest.raises(ValueError, match="only one of return_std and return_cov"):
        fitted.predict(Xt, gt, return_std=True, return_cov=True)


def test_return_cov_diagonal_with_unseen_client(fitted, data):
    X, _, g = data
    Xt = X[:6]
    gt = np.array(["north", "north", "nobody", "nobody", "east", "nobody"])
    _, std = fitted.predict(Xt, gt, return_std=True)
    _, cov = fitted.predict(Xt, gt, return_cov=True)
    assert_allclose(np.diag(cov), std**2, rtol=1e-9)


def test_predict_components_sum_to_predict(fitted, data):
    X, _, g = data
    comps = fitted.predict_components(X, g)
    assert set(comps) == {"global", "deviation", "local", "offset"}
    offset = comps.pop("offset")
    for lab in ("north", "east", "south"):  # each client's own constant mean
        assert_allclose(offset[0][g == lab], fitted.client_offsets_[lab], rtol=1e-12)
    for lab in ("north", "east", "south"):  # the random level's posterior std per client
        Sigma_u = fitted.clients_[lab].posterior["Sigma_u"]  # the level is u's last coordinate
        sd = np.sqrt(fitted.level_variance_ * Sigma_u[-1, -1])
        assert_allclose(offset[1][g == lab], sd, rtol=1e-10)
        assert 0 < sd < np.sqrt(fitted.level_variance_)  # the data shrink the level's prior
    for name, (m, s) in comps.items():
        assert m.shape == (X.shape[0],) and s.shape == (X.shape[0],), name
        assert np.all(s >= 0) and np.any(s > 0), name
    total = offset[0] + sum(m for m, _ in comps.values())
    assert_allclose(total, fitted.predict(X, g), rtol=1e-10, atol=1e-10)
    # the client-specific parts differ between clients at the same input
    x0 = np.repeat(X[:1], 3, axis=0)
    dev = fitted.predict_components(x0, ["north", "east", "south"])["deviation"][0]
    glob = fitted.predict_components(x0, ["north", "east", "south"])["global"][0]
    assert np.ptp(dev) > 1e-6
    assert np.ptp(glob) < 1e-12  # the global part is shared


def test_unseen_client_gets_wider_prediction(fitted, data):
    X, _, g = data
    rows = g == "east"
    m_seen, s_seen = fitted.predict(X[rows], g[rows], return_std=True)
    m_new, s_new = fitted.predict(X[rows], np.full(rows.sum(), "west"), return_std=True)
    assert np.all(np.isfinite(m_new))
    assert np.all(s_new > s_seen)
    # an unseen client's deviation and local parts are their priors: zero mean
    comps = fitted.predict_components(X[rows], np.full(rows.sum(), "west"))
    assert_array_equal(comps["deviation"][0], 0.0)
    assert_array_equal(comps["local"][0], 0.0)


def test_groups_none_is_population_prediction(fitted, data):
    X, _, _ = data
    m_none, s_none = fitted.predict(X[:10], return_std=True)
    m_new, s_new = fitted.predict(X[:10], ["never-seen"] * 10, return_std=True)
    assert_array_equal(m_none, m_new)
    assert_array_equal(s_none, s_new)
    # ... and not any fitted client's prediction
    assert not np.allclose(m_none, fitted.predict(X[:10], ["north"] * 10))


def test_groups_none_with_one_client_is_that_client(data):
    X, y, _ = data
    est = FederatedHierarchicalGPRegressor(**FAST).fit(X[:30], y[:30])
    assert len(est.clients_) == 1
    (label,) = est.clients_
    assert_array_equal(est.predict(X[:30]), est.predict(X[:30], [label] * 30))


def test_y_column_vector_accepted_two_columns_multioutput(data):
    X, y, g = data
    ref = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, g).predict(X, g)
    with pytest.warns(DataConversionWarning):
        est = FederatedHierarchicalGPRegressor(**FAST).fit(X, y[:, None], g)
    assert_array_equal(est.predict(X, g), ref)
    # two columns: the multi-output (ILMM) model, (n, 2) predictions
    est2 = FederatedHierarchicalGPRegressor(**FAST).fit(X, np.c_[y, 2 * y], g)
    assert est2.n_outputs_ == 2 and est2.predict(X, g).shape == (X.shape[0], 2)


@pytest.mark.parametrize(
    "components",
    [c for r in (1, 2, 3) for c in itertools.combinations(("global", "deviation", "local"), r)],
)
def test_ablations_through_components(data, components):
    X, y, g = data
    # any order is accepted; components_ is canonical
    est = FederatedHierarchicalGPRegressor(components=components[::-1], **FAST).fit(X, y, g)
    assert est.components_ == components
    mean, std = est.predict(X, g, return_std=True)
    assert np.all(np.isfinite(mean)) and np.all(std > 0)
    parts = est.predict_components(X, g)
    assert tuple(parts) == components + ("offset",)
    assert_allclose(sum(m for m, _ in parts.values()), mean, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bad", [("global", "shared"), "locale", (), ("global", "global2"),
                                 None, 0, 1.5, True])  # not sequences: were bare TypeErrors
def test_invalid_component_name(data, bad):
    X, y, g = data
    with pytest.raises(ValueError, match="components must be a non-empty subset"):
        FederatedHierarchicalGPRegressor(components=bad, **FAST).fit(X, y, g)


def test_verbose_prints_round_lines(data, capsys):
    X, y, g = data
    FederatedHierarchicalGPRegressor(**{**FAST, "n_jobs": 1}, verbose=1,
                                     restart_from_global=False).fit(X, y, g)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("[skfedgp] round")]
    assert len(lines) == FAST["n_rounds"]
    for r, ln in enumerate(lines, start=1):
        match = re.search(r"round\s+(\d+)/(\d+)\s+ELBO\s+(\S+)\s+time\s+(\S+)s", ln)
        assert match is not None, ln
        assert int(match.group(1)) == r and int(match.group(2)) == FAST["n_rounds"]
        assert np.isfinite(float(match.group(3)))
    FederatedHierarchicalGPRegressor(**FAST, verbose=0).fit(X, y, g)
    assert capsys.readouterr().out == ""


def test_score_is_r2(fitted, data):
    X, y, g = data
    assert fitted.score(X, y, g) == pytest.approx(r2_score(y, fitted.predict(X, g)), rel=1e-12)
    w = np.linspace(0.5, 2.0, y.size)
    assert fitted.score(X, y, g, sample_weight=w) == pytest.approx(
        r2_score(y, fitted.predict(X, g), sample_weight=w), rel=1e-12
    )


def test_learns_synthetic_hierarchy():
    X, y, g, Xt, yt, gt = make_hierarchical_regression(
        n_clients=3, n_samples=40, n_test=20, random_state=1
    )
    est = FederatedHierarchicalGPRegressor(
        n_rounds=4, local_steps=10, n_inducing=8, n_inducing_local=8, random_state=0
    ).fit(X, y, g)
    assert len(est.elbo_history_) == 4
    assert np.all(np.isfinite(est.elbo_history_))
    assert est.elbo_history_[-1] > est.elbo_history_[0]
    assert est.score(Xt, yt, gt) > 0.5


# --------------------------------------------------------------------------
# clone, pickle, Pipeline, GridSearchCV
# --------------------------------------------------------------------------


def test_clone_gives_unfitted_copy(fitted):
    c = clone(fitted)
    assert c.get_params() == fitted.get_params()
    assert not hasattr(c, "clients_")
    with pytest.raises(Exception, match="not fitted"):
        check_is_fitted(c)


def test_pickle_round_trip(fitted, data):
    X, _, g = data
    gt = np.where(np.arange(g.size) % 7 == 0, "unseen", g)  # includes a population row
    before = fitted.predict(X, gt, return_std=True)
    restored = pickle.loads(pickle.dumps(fitted))
    after = restored.predict(X, gt, return_std=True)
    assert_array_equal(before[0], after[0])
    assert_array_equal(before[1], after[1])
    assert_array_equal(fitted.predict(X), restored.predict(X))  # population sentinel survives
    assert restored.elbo_history_ == fitted.elbo_history_


def _with_label_column(X, g):
    """Append the client label as the last column of X (as a float)."""
    return np.column_stack([X, g.astype(float)])


def test_client_column_equals_groups(data):
    X, y, _ = data
    _, _, gi = make_hierarchical_regression(n_clients=3, n_samples=30, random_state=0)
    a = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, gi)
    b = FederatedHierarchicalGPRegressor(client_column=1, **FAST).fit(_with_label_column(X, gi), y)
    assert b.n_features_in_ == 2 and len(b.clients_) == 3
    assert_array_equal(a.predict(X, gi), b.predict(_with_label_column(X, gi)))
    # the label column may be anywhere, negative indices included
    c = FederatedHierarchicalGPRegressor(client_column=0, **FAST).fit(
        np.column_stack([gi.astype(float), X]), y
    )
    assert_array_equal(a.predict(X, gi), c.predict(np.column_stack([gi.astype(float), X])))


def test_grid_search_with_group_kfold_and_client_column():
    X, y, g = make_hierarchical_regression(n_clients=6, n_samples=15, random_state=3)
    Xc = _with_label_column(X, g)
    est = FederatedHierarchicalGPRegressor(client_column=-1, **FAST)
    # groups= goes to the splitter only (no metadata routing); the estimator
    # reads each row's client from the label column, so held-out folds are
    # unseen clients and get the population prediction
    search = GridSearchCV(est, {"n_inducing": [5, 8]}, cv=GroupKFold(3), error_score="raise")
    search.fit(Xc, y, groups=g)
    assert search.best_params_["n_inducing"] in (5, 8)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    assert search.best_estimator_.n_inducing == search.best_params_["n_inducing"]
    assert len(search.best_estimator_.clients_) == 6
    assert search.predict(Xc).shape == y.shape


def test_pipeline_scaler_leaves_label_column_alone():
    X, y, g = make_hierarchical_regression(
        n_clients=4, n_samples=15, n_features=2, random_state=4
    )
    Xc = _with_label_column(X * 100.0, g)  # features on a large scale
    pre = ColumnTransformer(
        [("scale", StandardScaler(), [0, 1]), ("client", "passthrough", [2])]
    )  # output columns: 2 scaled features, then the untouched label column
    pipe = Pipeline([("pre", pre), ("gp", FederatedHierarchicalGPRegressor(client_column=-1, **FAST))])
    pipe.fit(Xc, y)
    gp = pipe.named_steps["gp"]
    assert sorted(gp.clients_) == [0.0, 1.0, 2.0, 3.0]  # the labels survived unscaled
    Xt = pipe.named_steps["pre"].transform(Xc)
    assert_array_equal(Xt[:, 2], g)
    assert_allclose(Xt[:, :2].mean(axis=0), 0.0, atol=1e-12)  # features were scaled
    # same model as fitting the scaled features with groups=
    direct = FederatedHierarchicalGPRegressor(**FAST).fit(Xt[:, :2], y, g)
    assert_array_equal(pipe.predict(Xc), direct.predict(Xt[:, :2], g))
    search = GridSearchCV(pipe, {"gp__n_inducing": [5, 8]}, cv=GroupKFold(2), error_score="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        search.fit(Xc, y, groups=g)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))


def test_predict_mixes_seen_and_unseen_labels():
    """A seen client's rows keep their own prediction next to an unseen label."""
    X, y, g = make_hierarchical_regression(n_clients=2, n_samples=20, random_state=3)
    est = FederatedHierarchicalGPRegressor(n_rounds=2, local_steps=3, n_inducing=5,
                                           n_inducing_local=5, random_state=0).fit(X, y, g)
    both = est.predict(X[:3], [0, 1, "new"])
    alone = est.predict(X[:2], [0, 1])
    np.testing.assert_allclose(both[:2], alone, rtol=1e-12)
    pop = est.predict(X[2:3], ["new"])
    np.testing.assert_allclose(both[2:], pop, rtol=1e-12)


def test_target_standardisation_keeps_precision_with_large_offset():
    """Client summaries give the pooled std exactly even for y offset by 1e9."""
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=30, random_state=4)
    est = FederatedHierarchicalGPRegressor(n_rounds=1, local_steps=1, n_inducing=5,
                                           n_inducing_local=5, random_state=0)
    est.fit(X, y + 1e9, g)
    assert est.y_scale_ == pytest.approx(np.median([y[g == c].std() for c in set(g)]), rel=1e-6)
    assert est.y_offset_ == pytest.approx(1e9 + np.mean(y), rel=1e-12)
    mf = FederatedHierarchicalGPRegressor(n_rounds=1, local_steps=1, n_inducing=5,
                                          n_inducing_local=5, random_state=0,
                                          variational_family="mean_field", optimizer="adam")
    mf.fit(X, y + 1e9, g)  # the mean-field family: pooled standardisation
    assert mf.y_scale_ == pytest.approx(np.std(y), rel=1e-6)
    assert mf.y_offset_ == pytest.approx(1e9 + np.mean(y), rel=1e-12)


def test_refit_with_other_settings_keeps_no_attribute_of_the_earlier_fit():
    """A refit describes only the new model: attributes of an earlier fit with
    other components, family or number of target columns do not survive."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (60, 1))
    g = np.repeat([0, 1, 2], 20)
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.normal(size=60)
    Y = np.c_[y, np.cos(6 * X[:, 0])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=1, random_state=0).fit(X, y, g)
        assert hasattr(est, "phi_") and hasattr(est, "client_offsets_")
        est.set_params(components=("local",)).fit(X, y, g)
        assert not hasattr(est, "phi_")
        est.set_params(components=("global", "deviation", "local"), n_latent=1).fit(X, Y, g)
        assert hasattr(est, "loadings_")
        est.fit(X, y, g)  # back to one column
        assert not hasattr(est, "loadings_")
        est.set_params(variational_family="mean_field", optimizer="adam").fit(X, y, g)
        for name in ("client_offsets_", "global_posterior_", "objective_history_",
                     "n_evaluations_", "failed_clients_", "excluded_clients_",
                     "level_variance_", "client_scales_"):
            assert not hasattr(est, name), name
        # the mean-field family reports phi too, as documented
        assert np.isfinite(est.phi_) and est.phi_ > 0
        assert est.n_features_in_ == 1
