"""Tests of :class:`skfedgp.OperatorClustering` and its operator maths."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score
from sklearn.utils.estimator_checks import parametrize_with_checks

from skfedgp import FederatedHierarchicalGPRegressor, OperatorClustering
from skfedgp.clustering import _client_hyperparameters, projection_operator

_SMALL = dict(n_inducing=6, n_inducing_local=4, n_rounds=2, local_steps=10)
BEIJING = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "beijing_air_quality"


def _direct_operator(X, Z, ell, var, s2):
    Kzx = var * np.exp(-0.5 * (((Z[:, None, :] - X[None, :, :]) / ell) ** 2).sum(-1))
    Kxx = var * np.exp(-0.5 * (((X[:, None, :] - X[None, :, :]) / ell) ** 2).sum(-1))
    return Kzx @ np.linalg.solve(Kxx + s2 * np.eye(len(X)), Kzx.T)


def test_projection_operator_exact(rng):
    X = rng.uniform(0, 3, (15, 2))
    Z = rng.uniform(0, 3, (6, 2))
    ell = np.array([0.7, 1.3])
    A = projection_operator(X, Z, ell, 2.0, 0.1, woodbury=False)
    np.testing.assert_allclose(A, _direct_operator(X, Z, ell, 2.0, 0.1), rtol=1e-10)
    np.testing.assert_allclose(A, A.T)
    assert np.all(np.linalg.eigvalsh(A) > -1e-10)


def test_projection_operator_woodbury_exact_when_nystrom_is(rng):
    # with X inside Z the Nystrom approximation of k(X, X) is exact (up to jitter)
    X = rng.uniform(0, 3, (8, 1))
    Z = np.vstack([X, rng.uniform(0, 3, (4, 1))])
    ell = np.array([0.8])
    A_ex = projection_operator(X, Z, ell, 1.5, 0.05, woodbury=False)
    A_wb = projection_operator(X, Z, ell, 1.5, 0.05, woodbury=True)
    np.testing.assert_allclose(A_wb, A_ex, rtol=1e-3, atol=1e-4 * np.abs(A_ex).max())
    # large n: Woodbury close to exact when Z covers the inputs densely
    X = np.linspace(0, 3, 300)[:, None]
    Z = np.linspace(0, 3, 40)[:, None]
    A_ex = projection_operator(X, Z, ell, 1.0, 0.1, woodbury=False)
    A_wb = projection_operator(X, Z, ell, 1.0, 0.1)  # n > m: Woodbury
    np.testing.assert_allclose(A_wb, A_ex, rtol=1e-3, atol=1e-3 * np.abs(A_ex).max())


def test_client_hyperparameters_in_original_units(rng):
    X = rng.uniform(0, 1, (40, 1))
    y = np.sin(6 * X[:, 0]) + 0.1 * rng.standard_normal(40)
    g = np.repeat([0, 1], 20)
    # no training rounds: the data-derived initial values and the final exchange
    # only (quasi-Newton iterations would amplify the round-off of the rescaled
    # inputs); the conversion to original units is what is tested
    params = dict(_SMALL, n_rounds=0)
    a = FederatedHierarchicalGPRegressor(random_state=0, **params).fit(X, y, groups=g)
    # inputs x10 + 5, targets x3 + 1: the standardised model is the same
    b = FederatedHierarchicalGPRegressor(random_state=0, **params).fit(
        10 * X + 5, 3 * y + 1, groups=g)
    for lab in (0, 1):
        ha, hb = _client_hyperparameters(a, lab), _client_hyperparameters(b, lab)
        np.testing.assert_allclose(hb["Z_g"], 10 * ha["Z_g"] + 5, rtol=1e-5)
        np.testing.assert_allclose(hb["Z_l"], 10 * ha["Z_l"] + 5, rtol=1e-5)
        np.testing.assert_allclose(hb["lengthscale_g"], 10 * ha["lengthscale_g"], rtol=1e-5)
        np.testing.assert_allclose(hb["lengthscale_l"], 10 * ha["lengthscale_l"], rtol=1e-5)
        for key in ("variance_g", "variance_l", "noise_variance"):
            np.testing.assert_allclose(hb[key], 9 * ha[key], rtol=1e-5)
    # the noise variance in target units matches the predictive std far from data
    h = _client_hyperparameters(a, 0)
    assert h["noise_variance"] > 0 and h["Z_g"].shape == (6, 1) and h["Z_l"].shape == (4, 1)


def _two_regime_clients(rng, n_clients=6, n=25):
    """Clients 0..2 observe [0, 4], clients 3..5 observe [6, 10]."""
    X, y, g = [], [], []
    for c in range(n_clients):
        lo = 0.0 if c < n_clients // 2 else 6.0
        x = np.sort(rng.uniform(lo, lo + 4, n))
        X.append(x[:, None])
        y.append(np.sin(x) + 0.1 * rng.standard_normal(n))
        g += [f"c{c}"] * n
    return np.vstack(X), np.concatenate(y), np.array(g)


@pytest.fixture(scope="module")
def two_regimes():
    rng = np.random.default_rng(0)
    X, y, g = _two_regime_clients(rng)
    reg = FederatedHierarchicalGPRegressor(random_state=0, **_SMALL).fit(X, y, groups=g)
    return X, y, g, reg


def test_default_operator_is_personal(two_regimes):
    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, random_state=0).fit(X, y, groups=g)
    ref = OperatorClustering(2, reg, operator="personal", random_state=0).fit(X, y, groups=g)
    np.testing.assert_array_equal(oc.dissimilarity_, ref.dissimilarity_)


def _personal_by_hand(reg, client, T):
    """Posterior mean and variance of client's c + f_delta + f_l at T (n, d)."""
    parts = reg.predict_components(T, [client] * len(T))
    mu = parts["offset"][0] + parts["deviation"][0] + parts["local"][0]
    return mu, parts["deviation"][1] ** 2 + parts["local"][1] ** 2


def _assert_personal_dissimilarity(oc, means, variances):
    """rho between clients c1 and c4 from the hand-computed moments; symmetric, zero diagonal."""
    ref = np.mean((means["c1"] - means["c4"]) ** 2 + variances["c1"] + variances["c4"])
    np.testing.assert_allclose(oc.dissimilarity_[1, 4], ref, rtol=1e-10)
    np.testing.assert_allclose(oc.dissimilarity_, oc.dissimilarity_.T)
    np.testing.assert_array_equal(np.diag(oc.dissimilarity_), 0.0)


def test_personal_residual_operator_by_hand(two_regimes):
    """m_i = personal function at the cell centres + mean residual of the cells
    holding at least MIN_CELL_ROWS of the client's rows; rho as for 'personal'."""
    from skfedgp.clustering import MIN_CELL_ROWS, N_EVAL_POINTS

    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, operator="personal_residual",
                            random_state=0).fit(X, y, groups=g)
    lo, hi = X.min(), X.max()
    K = N_EVAL_POINTS  # 1-D: one row of cells
    T = lo + (np.arange(K) + 0.5) / K * (hi - lo)
    ms, vs = {}, {}
    for c in ("c1", "c4"):
        rows = g == c
        mu, vs[c] = _personal_by_hand(reg, c, T[:, None])
        res = y[rows] - reg.predict(X[rows], [c] * rows.sum())
        cell = np.minimum(np.floor((X[rows, 0] - lo) / (hi - lo) * K).astype(int), K - 1)
        corr = np.zeros(K)
        for k in np.unique(cell):
            if np.sum(cell == k) >= MIN_CELL_ROWS:
                corr[k] = res[cell == k].mean()
        assert np.any(corr != 0) and np.sum(corr != 0) < np.unique(cell).size
        ms[c] = mu + corr
        np.testing.assert_allclose(oc.operators_[c][0], ms[c], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(oc.operators_[c][1], vs[c], rtol=1e-10)
    _assert_personal_dissimilarity(oc, ms, vs)


def test_personal_residual_grid_in_two_dimensions():
    """16 x 16 cells in 2-D (256 ** (1/2)); a dimension of zero width has one cell
    and does not count (256 cells along the other)."""
    X = np.array([[0.0, 1.0], [4.0, 3.0], [2.0, 2.0]])
    lo, width, counts, centres = OperatorClustering._grid(X)
    assert list(counts) == [16, 16] and centres.shape == (256, 2)
    np.testing.assert_allclose(centres[0], [0.125, 1.0625])
    cell = OperatorClustering._cell_index(X, lo, width, counts)
    np.testing.assert_array_equal(cell, [0, 255, 8 * 16 + 8])
    np.testing.assert_allclose(centres[cell[2]], [2.125, 2.0625])
    lo, width, counts, centres = OperatorClustering._grid(np.c_[X[:, 0], np.ones(3)])
    assert list(counts) == [256, 1] and centres.shape == (256, 2)
    assert np.all(centres[:, 1] == 1.0)


def _rough_groups(seed, span=200):
    """4 clients on one grid (2 rows per unit interval): a common rough signal,
    plus a rough signal per group of 2 clients that sums to zero over every
    two adjacent unit intervals, so it has no content on the scale that 8
    global inducing points over the span resolve."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, span, 2 * span, endpoint=False) + 0.25
    cell = np.floor(x).astype(int)
    common = rng.standard_normal(span)
    signs = rng.choice([-1.0, 1.0], (2, span // 2))
    own = 0.5 * np.repeat(signs, 2, axis=1) * np.tile([1.0, -1.0], span // 2)
    truth = np.array([0, 0, 1, 1])
    X = np.tile(x, truth.size)[:, None]
    y = np.concatenate([common[cell] + own[t][cell] + 0.2 * rng.standard_normal(x.size)
                        for t in truth])
    return X, y, np.repeat(np.arange(truth.size), x.size), truth


@pytest.mark.parametrize("seed", [0, 1])
def test_personal_residual_recovers_groups_the_fit_cannot_resolve(seed):
    """Groups that differ only on a scale finer than the fitted model's inducing
    points: the personal functions carry nothing of it ('personal' gave ARI
    -0.5 and 0.0 on these two seeds, 0.0 on seeds 2 and 3); the residuals
    averaged per cell (cells 0.78 wide) carry it."""
    X, y, g, truth = _rough_groups(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of the short fit
        reg = FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=4, n_rounds=3,
                                               random_state=0).fit(X, y, groups=g)
    oc = OperatorClustering(2, reg, operator="personal_residual",
                            random_state=0).fit(X, y, groups=g)
    assert adjusted_rand_score(truth, oc.client_labels_) == 1.0
    personal = OperatorClustering(2, reg, operator="personal", random_state=0).fit(X, y, groups=g)
    assert adjusted_rand_score(truth, personal.client_labels_) < 1.0


def test_personal_residual_needs_finite_1d_y(two_regimes):
    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, operator="personal_residual")
    with pytest.raises(ValueError, match="operator='personal_residual' needs y"):
        oc.fit(X, groups=g)
    with pytest.raises(ValueError, match="needs 1-D y with one target per row"):
        oc.fit(X, np.c_[y, y], groups=g)
    yn = y.copy()
    yn[3] = np.nan
    with pytest.raises(ValueError, match="needs finite y"):
        oc.fit(X, yn, groups=g)
    assert not hasattr(oc, "labels_")
    # the other operators do not need y with a fitted regressor
    OperatorClustering(2, reg, operator="personal", random_state=0).fit(X, groups=g)



def test_personal_residual_refuses_multi_output_before_fitting():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (60, 1))
    g = np.repeat(np.arange(3), 20)
    Y = np.c_[np.sin(X[:, 0]), np.cos(X[:, 0])]
    unfitted = FederatedHierarchicalGPRegressor(n_rounds=1)
    oc = OperatorClustering(2, unfitted, operator="personal_residual")
    with pytest.raises(ValueError, match="multi-output regressors are not supported"):
        oc.fit(X, Y, groups=g)
    assert not hasattr(unfitted, "clients_")  # refused before any fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = FederatedHierarchicalGPRegressor(n_rounds=1, n_inducing=5,
                                                  n_inducing_local=3).fit(X, Y, g)
    with pytest.raises(ValueError, match="n_outputs_=2"):
        OperatorClustering(2, fitted, operator="personal_residual").fit(X, Y[:, 0], groups=g)


@pytest.mark.parametrize("operator", ["published", "posterior"])
def test_kernel_operators_refuse_multi_output_with_a_clear_error(operator):
    """They read one kernel variance per component: a multi-output regressor
    failed with a TypeError from float() after the whole fit."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (60, 1))
    g = np.repeat(np.arange(3), 20)
    Y = np.c_[np.sin(X[:, 0]), np.cos(X[:, 0])]
    unfitted = FederatedHierarchicalGPRegressor(n_rounds=1)
    with pytest.raises(ValueError, match=f"operator='{operator}' needs scalar targets"):
        OperatorClustering(2, unfitted, operator=operator).fit(X, Y, groups=g)
    assert not hasattr(unfitted, "clients_")  # refused before any fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = FederatedHierarchicalGPRegressor(n_rounds=1, n_inducing=5,
                                                  n_inducing_local=3).fit(X, Y, g)
    oc = OperatorClustering(2, fitted, operator=operator)
    with pytest.raises(ValueError, match="n_outputs_=2; use operator='personal'"):
        oc.fit(X, groups=g)
    assert not hasattr(oc, "labels_")


def test_default_separates_frequencies():
    """Two groups of clients, sin(x) and sin(3x) on the same input range, with
    the default regressor: the published operator (inputs and kernels only)
    gave ARI -0.22 and 0.0 on these two seeds (0.0 on seeds 2 and 3); the
    default recovers both groups (and 'personal' does)."""
    for seed in range(2):
        rng = np.random.default_rng(seed)
        X = rng.uniform(0, 10, (240, 1))
        g = np.repeat(np.arange(6), 40)
        y = np.where(g < 3, np.sin(X[:, 0]), np.sin(3 * X[:, 0])) + 0.1 * rng.standard_normal(240)
        oc = OperatorClustering(2, random_state=0).fit(X, y, groups=g)
        assert adjusted_rand_score([0, 0, 0, 1, 1, 1], oc.client_labels_) == 1.0


def test_clusters_recover_regimes(two_regimes):
    """Same function, two input ranges: the published operator (inputs and
    kernels) separates where the clients' inputs lie."""
    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, operator="published", random_state=0).fit(X, y, groups=g)
    assert oc.estimator_ is reg  # a fitted estimator is reused, not refitted
    truth = [0, 0, 0, 1, 1, 1]
    assert list(oc.clients_) == [f"c{c}" for c in range(6)]
    assert adjusted_rand_score(truth, oc.client_labels_) == 1.0
    # labels_: one per row, the row's client cluster
    idx = np.searchsorted(oc.clients_, g)
    np.testing.assert_array_equal(oc.labels_, oc.client_labels_[idx])


@pytest.mark.parametrize("n_clusters", [2, 6])
def test_client_labels_have_one_dtype(two_regimes, n_clusters):
    # six clients in six clusters skip the spectral step (np.arange: int64
    # here) where SpectralClustering gives int32: one dtype either way
    X, y, g, reg = two_regimes
    oc = OperatorClustering(n_clusters, reg, random_state=0).fit(X, y, groups=g)
    assert oc.client_labels_.dtype == np.int64 and oc.labels_.dtype == np.int64


def test_operators_and_dissimilarity(two_regimes):
    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, operator="published", random_state=0).fit(X, y, groups=g)
    for lab in oc.clients_:
        Ad, Al = oc.operators_[lab]
        assert Ad.shape == (6, 6) and Al.shape == (4, 4)
        np.testing.assert_allclose(np.trace(Ad) + np.trace(Al), 1.0)
    # operator of client c0 from its own rows, by the direct formula
    h = _client_hyperparameters(reg, "c0")
    Xi = X[g == "c0"]
    Ad = _direct_operator(Xi, h["Z_g"], h["lengthscale_g"], h["variance_g"], h["noise_variance"])
    Zl = h["Z_l"][np.argsort(h["Z_l"][:, 0])]
    Al = _direct_operator(Xi, Zl, h["lengthscale_l"], h["variance_l"], h["noise_variance"])
    tr = np.trace(Ad) + np.trace(Al)
    oc_exact = OperatorClustering(2, reg, woodbury=False, operator="published", random_state=0).fit(X, y, groups=g)
    np.testing.assert_allclose(oc_exact.operators_["c0"][0], Ad / tr, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(oc_exact.operators_["c0"][1], Al / tr, rtol=1e-7, atol=1e-12)
    # rho(i, j) = ||Ahat_i - Ahat_j||_F^2, symmetric with zero diagonal
    rho = oc.dissimilarity_
    np.testing.assert_allclose(rho, rho.T)
    np.testing.assert_array_equal(np.diag(rho), 0.0)
    a, b = oc.operators_["c0"], oc.operators_["c4"]
    np.testing.assert_allclose(rho[0, 4], np.sum((a[0] - b[0]) ** 2) + np.sum((a[1] - b[1]) ** 2))
    med = np.median(rho[np.triu_indices(6, 1)])
    np.testing.assert_allclose(oc.affinity_matrix_, np.exp(-rho / med))
    oc_inv = OperatorClustering(2, reg, affinity="inverse", operator="published", random_state=0).fit(X, y, groups=g)
    np.testing.assert_allclose(oc_inv.affinity_matrix_, 1 / (1 + rho / med))


def test_posterior_operator(two_regimes):
    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, operator="posterior", random_state=0).fit(X, y, groups=g)
    (A,) = oc.operators_["c1"]
    h = _client_hyperparameters(reg, "c1")
    parts = reg.predict_components(h["Z_g"], ["c1"] * 6)
    mu = parts["deviation"][0] + parts["local"][0]
    var = parts["deviation"][1] ** 2 + parts["local"][1] ** 2
    B = np.outer(mu, mu) + np.diag(var)
    np.testing.assert_allclose(A, B / np.trace(B), rtol=1e-10)


def test_personal_operator(two_regimes):
    from skfedgp.clustering import N_EVAL_POINTS

    X, y, g, reg = two_regimes
    oc = OperatorClustering(2, reg, operator="personal", random_state=0).fit(X, y, groups=g)
    pts = oc._eval_points(X)
    assert pts.shape == (N_EVAL_POINTS, 1)
    assert pts.min() >= X.min() and pts.max() <= X.max()
    mus, vs = {}, {}
    for c in ("c1", "c4"):
        mus[c], vs[c] = _personal_by_hand(reg, c, pts)
        np.testing.assert_allclose(oc.operators_[c][0], mus[c], rtol=1e-10)
        np.testing.assert_allclose(oc.operators_[c][1], vs[c], rtol=1e-10)
    _assert_personal_dissimilarity(oc, mus, vs)


def test_personal_operator_separates_levels():
    # same inputs for every client (the published operator cannot tell them
    # apart), two groups of clients at different levels around one function
    rng = np.random.default_rng(5)
    X, y, g = [], [], []
    x = np.linspace(0, 10, 40)
    for c in range(6):
        X.append(x[:, None])
        y.append(np.sin(x) + (1.5 if c >= 3 else -1.5) + 0.1 * rng.standard_normal(40))
        g += [f"c{c}"] * 40
    X, y, g = np.vstack(X), np.concatenate(y), np.array(g)
    reg = FederatedHierarchicalGPRegressor(random_state=0, **_SMALL).fit(X, y, groups=g)
    oc = OperatorClustering(2, reg, operator="personal", random_state=0).fit(X, y, groups=g)
    assert adjusted_rand_score([0, 0, 0, 1, 1, 1], oc.client_labels_) == 1.0


def test_fits_unfitted_estimator(two_regimes):
    X, y, g, _ = two_regimes
    proto = FederatedHierarchicalGPRegressor(**_SMALL)
    oc = OperatorClustering(2, proto, random_state=0).fit(X, y, groups=g)
    assert oc.estimator_ is not proto and not hasattr(proto, "clients_")
    assert oc.labels_.shape == (X.shape[0],)


def test_bad_input(two_regimes):
    X, y, g, reg = two_regimes
    with pytest.raises(ValueError, match="pass groups"):
        OperatorClustering(2, reg).fit(X, y)
    with pytest.raises(ValueError, match="n_clusters=7"):
        OperatorClustering(7, reg).fit(X, y, groups=g)
    g2 = g.copy()
    g2[:3] = "new"
    with pytest.raises(ValueError, match="not clients"):
        OperatorClustering(2, reg).fit(X, y, groups=g2)
    with pytest.raises(ValueError, match="affinity"):
        OperatorClustering(2, reg, affinity="cosine").fit(X, y, groups=g)
    with pytest.raises(ValueError, match="operator"):
        OperatorClustering(2, reg, operator="x").fit(X, y, groups=g)
    with pytest.raises(ValueError, match="groups must be 1-D"):
        OperatorClustering(2, reg).fit(X, y, groups=g[:-1])
    with pytest.raises(ValueError, match="y is required"):
        OperatorClustering(2, FederatedHierarchicalGPRegressor(**_SMALL)).fit(X, groups=g)
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        OperatorClustering(2, reg).fit(Xn, y, groups=g)


def test_beijing_operators_run():
    if not BEIJING.is_dir():
        pytest.skip(f"Beijing data folder {BEIJING} is absent (shared developer data)")
    from skfedgp.datasets import load_beijing_air_quality

    d = load_beijing_air_quality(BEIJING)
    reg = FederatedHierarchicalGPRegressor(n_inducing=10, n_inducing_local=4, n_rounds=1,
                                           local_steps=5, random_state=0)
    oc = OperatorClustering(3, reg, random_state=0).fit(d.data, np.log(d.target), d.groups)
    assert len(oc.clients_) == 12 and set(oc.client_labels_) == {0, 1, 2}
    assert np.all(np.isfinite(oc.dissimilarity_))


# ---------------------------------------------------------------------------
# scikit-learn's estimator checks
# ---------------------------------------------------------------------------
_NEEDS_GROUPS = (
    "OperatorClustering clusters clients: fit needs groups (the client label of "
    "every row) and y (the targets of the regressor); the generic check calls "
    "fit(X) or fit(X, y) without groups, which raises a ValueError by design"
)
_EXPECTED_FAILED = {
    name: _NEEDS_GROUPS
    for name in (
        "check_fit_score_takes_y", "check_estimators_overwrite_params",
        "check_dont_overwrite_parameters", "check_estimators_fit_returns_self",
        "check_readonly_memmap_input", "check_n_features_in_after_fitting",
        "check_positive_only_tag_during_fit", "check_estimators_dtypes",
        "check_dtype_object", "check_pipeline_consistency", "check_estimators_nan_inf",
        "check_estimators_pickle", "check_f_contiguous_array_estimator",
        "check_clustering", "check_methods_sample_order_invariance",
        "check_methods_subset_invariance", "check_fit2d_1sample", "check_fit2d_1feature",
        "check_dict_unchanged", "check_fit_idempotent", "check_fit_check_is_fitted",
        "check_n_features_in", "check_fit2d_predict1d",
    )
}


@parametrize_with_checks(
    [OperatorClustering(2, FederatedHierarchicalGPRegressor(n_inducing=4, n_inducing_local=3,
                                                            n_rounds=2, local_steps=5),
                        random_state=0)],
    expected_failed_checks=lambda est: _EXPECTED_FAILED,
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_local_blocks_of_different_sizes_are_padded(rng):
    """With n_inducing_local="auto" clients get local sets of different sizes."""
    X = rng.uniform(0, 10, size=(90, 1))
    g = np.repeat(np.arange(3), [20, 30, 40])
    y = np.sin(X[:, 0]) + 0.3 * (g == 2) + 0.1 * rng.standard_normal(90)
    est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=2).fit(X, y, groups=g)
    sizes = {c.local_values()["Z_l"].shape[0] for c in est.clients_.values()}
    assert len(sizes) > 1
    oc = OperatorClustering(n_clusters=2, estimator=est, operator="published", random_state=0).fit(X, y, groups=g)
    rho = oc.dissimilarity_
    assert rho.shape == (3, 3) and np.all(np.isfinite(rho)) and np.allclose(rho, rho.T)
    # the zero padding: rho equals the difference with the smaller block embedded
    a, b = oc.operators_[0], oc.operators_[2]
    m = max(a[1].shape[0], b[1].shape[0])
    pa, pb = np.zeros((m, m)), np.zeros((m, m))
    pa[: a[1].shape[0], : a[1].shape[0]] = a[1]
    pb[: b[1].shape[0], : b[1].shape[0]] = b[1]
    expected = np.sum((a[0] - b[0]) ** 2) + np.sum((pa - pb) ** 2)
    assert rho[0, 2] == pytest.approx(expected, rel=1e-12)


def test_default_regressor_sizes_capped_quietly():
    """The default clustering regressor's M = 30 on 24 rows is capped without a
    warning the user could not act on; a size the user gives still warns."""
    import warnings

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (24, 1))
    g = np.repeat(np.arange(4), 6)
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(24)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*exceeds the number of training")
        oc = OperatorClustering(2, random_state=0).fit(X, y, groups=g)
    assert oc.estimator_.n_inducing_ == 24
    with pytest.warns(UserWarning, match="n_inducing=30 exceeds"):
        OperatorClustering(2, FederatedHierarchicalGPRegressor(n_inducing=30, n_rounds=1),
                           random_state=0).fit(X, y, groups=g)


def test_mixed_type_client_labels_and_wrong_estimator():
    """Labels of mixed types (accepted by the regressor) cluster too; an estimator
    of another kind is refused by name before any fit."""
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(48, 1))
    g = np.array([0, "b", 2, "d"] * 12, dtype=object)
    y = np.where(np.isin(g, [0, 2]), np.sin(6 * X[:, 0]), np.cos(6 * X[:, 0]))
    reg = FederatedHierarchicalGPRegressor(n_rounds=3, random_state=0)
    oc = OperatorClustering(2, reg, random_state=0).fit(X, y, groups=g)
    assert list(oc.clients_) == [0, "b", 2, "d"]
    assert oc.labels_.shape == (48,)
    for k, lab in enumerate(oc.clients_):
        assert np.all(oc.labels_[np.array([v == lab and type(v) is type(lab) for v in g])]
                      == oc.client_labels_[k])
    with pytest.raises(TypeError, match="FederatedHierarchicalGPRegressor"):
        OperatorClustering(2, StandardScaler()).fit(X, y, groups=g)


@pytest.mark.parametrize("shift", [1e4, 1e5, 1e7])
def test_reused_regressor_with_inputs_far_away_says_why(shift):
    """A fitted regressor reused with X shifted far from its data: the published
    operator's kernel underflows; the error names the likely cause (far from
    the origin too, where an expanded squared distance used to cancel and
    the client's Gram failed its Cholesky instead)."""
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(40, 1))
    g = np.repeat([0, 1, 2, 3], 10)
    y = np.sin(6 * X[:, 0]) + 0.1 * (g % 2)
    reg = FederatedHierarchicalGPRegressor(n_rounds=2, random_state=0).fit(X, y, g)
    with pytest.raises(FloatingPointError, match="inputs in other units or another range"):
        OperatorClustering(2, reg, operator="published").fit(X + shift, y, groups=g)


def test_an_excluded_client_is_named_as_excluded():
    from skfedgp import FederatedHierarchicalGPRegressor
    from skfedgp.datasets import make_hierarchical_regression

    X, y, g = make_hierarchical_regression(n_clients=4, n_samples=20, random_state=0)

    def hook(client, method, round_):
        if client == 1:
            raise RuntimeError("unreachable")

    reg = FederatedHierarchicalGPRegressor(n_inducing=8, n_rounds=1, fault_hook=hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"client\(s\) \[1\] were excluded from the "
                                             r"regressor's model after their calls failed"):
            OperatorClustering(2, reg, random_state=0).fit(X, y, g)


def test_an_estimator_with_a_client_column_is_refused_up_front():
    from skfedgp.datasets import make_hierarchical_regression

    X, y, g = make_hierarchical_regression(n_clients=4, n_samples=20, random_state=0)
    reg = FederatedHierarchicalGPRegressor(client_column=0, n_inducing=8, n_rounds=1)
    for operator in ("published", "personal", "personal_residual"):
        with pytest.raises(ValueError, match="estimator has client_column=0; OperatorClustering "
                                             "takes the client labels as groups"):
            OperatorClustering(2, reg, operator=operator, random_state=0).fit(np.c_[g, X], y, g)


def test_a_list_of_mixed_type_labels_keeps_its_types():
    from skfedgp.datasets import make_hierarchical_regression

    X, y, g = make_hierarchical_regression(n_clients=4, n_samples=20, random_state=0)
    mixed = np.array([0, 1, "a", "b"], dtype=object)[g]
    reg = FederatedHierarchicalGPRegressor(n_inducing=8, n_rounds=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg.fit(X, y, mixed)
        a = OperatorClustering(2, reg, random_state=0).fit(X, y, groups=mixed)
        b = OperatorClustering(2, reg, random_state=0).fit(X, y, groups=list(mixed))
    assert list(b.clients_) == list(a.clients_)
    np.testing.assert_array_equal(b.client_labels_, a.client_labels_)


@pytest.mark.parametrize("woodbury", [True, False])
def test_projection_operator_refuses_non_finite_inputs(rng, woodbury):
    """NaN in Z (a generic SciPy message at best) or inf in X (in the Woodbury
    form its row silently dropped out: exp(-inf) = 0) are named up front, as
    is a non-finite noise variance."""
    X = rng.uniform(0, 3, (15, 2))
    Z = rng.uniform(0, 3, (6, 2))
    ell = np.array([0.7, 1.3])
    Zn = Z.copy()
    Zn[1, 0] = np.nan
    with pytest.raises(ValueError, match="Z contains NaN or inf"):
        projection_operator(X, Zn, ell, 2.0, 0.1, woodbury=woodbury)
    Xi = X.copy()
    Xi[0, 1] = np.inf
    with pytest.raises(ValueError, match="X contains NaN or inf"):
        projection_operator(Xi, Z, ell, 2.0, 0.1, woodbury=woodbury)
    with pytest.raises(ValueError, match="noise_variance must be a finite number"):
        projection_operator(X, Z, ell, 2.0, np.nan, woodbury=woodbury)
    assert np.all(np.isfinite(projection_operator(X, Z, ell, 2.0, 0.1, woodbury=woodbury)))


def test_indistinguishable_clients_are_reported():
    """Four clients with the same rows: the dissimilarities are equal (to
    round-off) and any split is arbitrary. Before, they were split into
    clusters [1 0 1 1] without a word; now a UserWarning says the labels are
    arbitrary. Distinct groups give no such warning."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, 30)
    y = np.sin(x) + 0.1 * rng.standard_normal(30)
    g = np.repeat(list("abcd"), 30)
    with pytest.warns(UserWarning, match="equally dissimilar"):
        oc = OperatorClustering(2, random_state=0).fit(np.tile(x, 4)[:, None], np.tile(y, 4),
                                                       groups=g)
    off = oc.dissimilarity_[np.triu_indices(4, 1)]
    assert np.ptp(off) <= 1e-6 * off.max()
    with warnings.catch_warnings():  # one cluster per client: not arbitrary
        warnings.filterwarnings("error", message=".*equally dissimilar")
        OperatorClustering(4, random_state=0).fit(np.tile(x, 4)[:, None], np.tile(y, 4), groups=g)
    y2 = np.concatenate([np.sin(x), np.sin(x), np.cos(x), np.cos(x)]) \
        + 0.1 * rng.standard_normal(120)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*equally dissimilar")
        oc = OperatorClustering(2, random_state=0).fit(np.tile(x, 4)[:, None], y2, groups=g)
    assert adjusted_rand_score([0, 0, 1, 1], oc.client_labels_) == 1.0


def test_tuple_client_labels_and_as_many_clusters_as_clients():
    """Labels the regressor accepts (tuples in a 1-D object array) work with
    every operator, and n_clusters equal to the number of clients needs no
    SciPy warning about its dense eigensolver."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (80, 1))
    g = np.repeat(np.arange(4), 20)
    y = np.sin(X[:, 0]) + 0.3 * (g % 2) + 0.05 * rng.normal(size=80)
    tl = np.empty(4, dtype=object)
    tl[:] = [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=4,
                                               n_rounds=3).fit(X, y, tl[g])
    for operator in ("published", "personal", "personal_residual", "posterior"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            oc = OperatorClustering(4, reg, operator=operator, random_state=0).fit(X, y, tl[g])
        assert list(oc.clients_) == list(tl)
        assert sorted(oc.client_labels_) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"got shape \(79,\)$"):
        OperatorClustering(2, reg, operator="personal_residual").fit(X, y[:-1], tl[g])
