"""The helpers of :mod:`skfedgp._validation` on their own, and the
prediction-side resource limits of :class:`FederatedHierarchicalGPRegressor`
(issue 6, items 4 and 5): the ``return_cov`` memory budget fails fast, and
row-chunked prediction equals unchunked prediction without memory growing
with the number of test rows."""

import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import BaseEstimator

import skfedgp.regressor as regressor
from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp._validation import (
    ClientLabelWarning,
    _loose_key,
    _missing_mask,
    check_groups,
    split_client_column,
    unique_labels,
    warn_unmatched_labels,
)
from skfedgp.datasets import make_hierarchical_regression

FAST = dict(n_rounds=2, local_steps=3, n_inducing=25, n_inducing_local=20, random_state=0)


# --------------------------------------------------------------------------
# label helpers
# --------------------------------------------------------------------------


def test_unique_labels_sorted_plain_python_and_inverse():
    labels = np.array([3, 1, 3, 2, 1], dtype=np.int64)
    uniq, inv = unique_labels(labels)
    assert uniq == [1, 2, 3] and all(type(u) is int for u in uniq)
    assert_array_equal(np.asarray(uniq)[inv], labels)
    uniq, inv = unique_labels(["b", "a", "b"])
    assert uniq == ["a", "b"] and type(uniq[0]) is str
    assert_array_equal(inv, [1, 0, 1])


def test_unique_labels_keeps_types_and_handles_unorderable():
    uniq, inv = unique_labels([0, 1, "new", 1])  # a list: ints stay ints
    assert uniq == [0, 1, "new"] and type(uniq[1]) is int
    assert_array_equal(inv, [0, 1, 2, 1])
    uniq, inv = unique_labels(np.array(["x", 5, "x", (1, 2)], dtype=object))  # first-seen order
    assert uniq == ["x", 5, (1, 2)]
    assert_array_equal(inv, [0, 1, 0, 2])


@pytest.mark.parametrize(
    "labels, expected",
    [
        (np.array([1.0, np.nan, 2.0]), [False, True, False]),
        (np.array(["a", None, np.nan, pd.NA, pd.NaT, "b"], dtype=object),
         [False, True, True, True, True, False]),
        (np.array(["a", "b"]), [False, False]),
        (np.array([1, 2]), [False, False]),
        (np.array(["2020-01-01", "NaT"], dtype="datetime64[D]"), [False, True]),
        (np.array([0, "", "nan", "None"], dtype=object), [False] * 4),  # text is a label
    ],
)
def test_missing_mask(labels, expected):
    assert_array_equal(_missing_mask(labels), expected)


def test_check_groups_shapes_and_messages():
    assert check_groups(None, 3, "fit") is None
    assert_array_equal(check_groups([["a"], ["b"], ["a"]], 3, "fit"), ["a", "b", "a"])
    with pytest.raises(ValueError, match=r"groups passed to predict must be 1-D with one label "
                                         r"per row of X \(4 rows\), got shape \(3,\)"):
        check_groups(["a", "b", "c"], 4, "predict")
    with pytest.raises(ValueError, match=r"got shape \(2, 2\)"):
        check_groups([["a", "b"], ["c", "d"]], 2, "fit")
    with pytest.raises(ValueError, match=r"groups passed to fit has 12 missing client label\(s\) "
                                         r"\(None or NaN\) of 20 rows, at row\(s\) 0, 1, 2, 3, 4, "
                                         r"5, 6, 7, 8, 9, \.\.\.; client labels must be non-missing"):
        check_groups([None] * 12 + ["a"] * 8, 20, "fit")


class _Stub(BaseEstimator):
    """An estimator with no parameters, to receive n_features_in_."""


def test_split_client_column_positions_names_and_features_state():
    df = pd.DataFrame({"t": [1.0, 2.0], "site": ["a", "b"], "h": [3.0, 4.0]})
    est = _Stub()
    feats, labels = split_client_column(est, df, "site", reset=True)
    assert list(feats.columns) == ["t", "h"] and list(labels) == ["a", "b"]
    assert est.n_features_in_ == 3 and list(est.feature_names_in_) == ["t", "site", "h"]
    for column in (1, -2):
        feats, labels = split_client_column(est, df, column, reset=False)
        assert list(labels) == ["a", "b"]
    arr = np.array([[1.0, 7.0, 3.0], [2.0, 8.0, 4.0]])
    est = _Stub()
    feats, labels = split_client_column(est, arr, -1, reset=True)
    assert_array_equal(feats, arr[:, :2]) and assert_array_equal(labels, [3.0, 4.0])
    assert est.n_features_in_ == 3 and not hasattr(est, "feature_names_in_")
    with pytest.raises(ValueError, match="X has 2 features, but _Stub is expecting 3"):
        split_client_column(est, arr[:, :2], 0, reset=False)


def test_split_client_column_errors():
    df = pd.DataFrame([[1.0, "a", 2.0]], columns=["x", "site", "x"])
    with pytest.raises(ValueError, match=r"unique column names"):  # scikit-learn's check
        split_client_column(_Stub(), df, "site", reset=True)
    df = pd.DataFrame([[1.0, "a", 2.0]], columns=[0, 1, 2])  # integer names: no names
    with pytest.raises(ValueError, match=r"client_column='site' is not a column of X; X has "
                                         r"columns 0, 1, 2"):
        split_client_column(_Stub(), df, "site", reset=True)
    with pytest.raises(ValueError, match=r"Expected a 2D array X with the client labels in "
                                         r"column 0, got an array of shape \(3,\)"):
        split_client_column(_Stub(), [1.0, 2.0, 3.0], 0, reset=True)
    with pytest.raises(ValueError, match="at least one feature besides the labels"):
        split_client_column(_Stub(), np.zeros((4, 1)), 0, reset=True)
    import scipy.sparse as sp

    with pytest.raises(TypeError, match="Sparse data"):
        split_client_column(_Stub(), sp.csr_matrix(np.eye(3)), 0, reset=True)


@pytest.mark.parametrize(
    "a, b, same",
    [
        (1, "1", True), (1, "1.0", True), (2.0, "2", True), (1, " 1 ", True), (1, "01", True),
        ("A", "a", True), ("Dongsi", " dongsi", True), (b"x", "x", True),
        (1, 2, False), ("A", "B", False), (1, "one", False), ("1a", 1, False),
    ],
)
def test_loose_key(a, b, same):
    assert (_loose_key(a) == _loose_key(b)) is same


def test_warn_unmatched_labels_only_for_look_alikes():
    fitted = {1: None, 2: None, "north": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unmatched_labels([1, 2, "north"], fitted, "predict")  # all fitted
        warn_unmatched_labels(["south", 7], fitted, "predict")     # unseen, no look-alike
        warn_unmatched_labels([1.0, np.int64(2)], fitted, "predict")  # the same dict keys
    with pytest.warns(ClientLabelWarning, match=r"predict: '2' \(str\) is not a fitted client, "
                                                r"but 2 \(int\) is; 'NORTH' \(str\) is not a "
                                                r"fitted client, but 'north' \(str\) is\."):
        warn_unmatched_labels(["2", "NORTH", "south"], fitted, "predict")
    many = [str(k) for k in range(30)]
    with pytest.warns(ClientLabelWarning, match=r"\.\.\. \(30 such labels\)"):
        warn_unmatched_labels(many, {k: None for k in range(30)}, "score")


# --------------------------------------------------------------------------
# prediction resources
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=30, n_features=2,
                                           random_state=0)
    return FederatedHierarchicalGPRegressor(**FAST).fit(X, y, g), X, g


def test_issue_input_return_cov_on_40000_rows_fails_fast(fitted):
    est, X, _ = fitted
    rng = np.random.default_rng(1)
    Xt = rng.uniform(X.min(), X.max(), size=(40_000, X.shape[1]))
    gt = rng.integers(0, 3, size=40_000)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError, match=r"predict\(return_cov=True\) on 40000 rows needs a "
                                              r"40000 x 40000 float64 covariance of 11\.9 GiB "
                                              r"\(12800000000 bytes.*MAX_COV_BYTES = 2\.0 GiB "
                                              r"\(at most 16384 rows\)"):
            est.predict(Xt, gt, return_cov=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # validation copies only (~2 MB), no n x n array
    # the same rows without the joint covariance are fine (chunked)
    mean, std = est.predict(Xt, gt, return_std=True)
    assert mean.shape == std.shape == (40_000,) and np.all(std > 0)


def test_cov_budget_boundary(fitted, monkeypatch):
    est, X, g = fitted
    monkeypatch.setattr(regressor, "MAX_COV_BYTES", 8 * 50 * 50)
    mean, cov = est.predict(X[:50], g[:50], return_cov=True)  # exactly at the budget
    assert cov.shape == (50, 50)
    _, std = est.predict(X[:50], g[:50], return_std=True)
    assert_allclose(np.sqrt(np.diag(cov)), std, rtol=1e-9)
    with pytest.raises(MemoryError, match=r"on 51 rows .* \(at most 50 rows\)"):
        est.predict(X[:51], g[:51], return_cov=True)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prediction_equals_unchunked(fitted, monkeypatch, chunk):
    est, X, g = fitted
    rng = np.random.default_rng(2)
    Xt = np.vstack([X, rng.uniform(X.min(), X.max(), size=(150, X.shape[1]))])
    gt = np.concatenate([g, rng.choice([0, 1, 2, "unseen"], size=150)]).astype(object)
    gt = np.array([int(v) if v != "unseen" else v for v in gt], dtype=object)
    rng.shuffle(ix := np.arange(len(gt)))  # interleave clients
    Xt, gt = Xt[ix], gt[ix]
    monkeypatch.setattr(regressor, "PREDICT_CHUNK_ROWS", 10**9)
    ref_mean, ref_std = est.predict(Xt, gt, return_std=True)
    ref_parts = est.predict_components(Xt, gt)
    monkeypatch.setattr(regressor, "PREDICT_CHUNK_ROWS", chunk)
    mean, std = est.predict(Xt, gt, return_std=True)
    assert_allclose(mean, ref_mean, rtol=1e-12, atol=1e-12)
    assert_allclose(std, ref_std, rtol=1e-12, atol=1e-12)
    assert_allclose(est.predict(Xt, gt), ref_mean, rtol=1e-12, atol=1e-12)
    parts = est.predict_components(Xt, gt)
    for name in ref_parts:
        assert_allclose(parts[name][0], ref_parts[name][0], rtol=1e-12, atol=1e-12)
        assert_allclose(parts[name][1], ref_parts[name][1], rtol=1e-12, atol=1e-12)
    # and each row equals that row predicted alone
    for r in (0, 57, len(gt) - 1):
        assert_allclose(est.predict(Xt[r:r + 1], gt[r:r + 1]), mean[r:r + 1], rtol=1e-12)


def _peak_bytes(est, Xt, gt):
    est.predict(Xt[:5], gt[:5], return_std=True)  # warm caches outside the measurement
    tracemalloc.start()
    try:
        out = est.predict(Xt, gt, return_std=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del out
    return peak


def test_prediction_memory_does_not_grow_beyond_outputs(fitted, monkeypatch):
    """Marginal peak memory per test row is a few floats, not n x M kernel rows."""
    est, X, _ = fitted
    rng = np.random.default_rng(3)
    n1, n2 = 10_000, 30_000
    Xt = rng.uniform(X.min(), X.max(), size=(n2, X.shape[1]))
    gt = rng.integers(0, 3, size=n2)
    monkeypatch.setattr(regressor, "PREDICT_CHUNK_ROWS", 1000)
    per_row = (_peak_bytes(est, Xt, gt) - _peak_bytes(est, Xt[:n1], gt[:n1])) / (n2 - n1)
    # per row: two validated/standardised copies of X (2 x 2 floats), labels and
    # index (3 words), mean/var/outputs (4 floats): 13 words = 104 bytes; the
    # kernel matrices of one row against the 25 + 20 inducing points are not kept
    assert per_row < 120, per_row
    # the same measurement without chunking sees the n x M matrices
    monkeypatch.setattr(regressor, "PREDICT_CHUNK_ROWS", 10**9)
    unchunked = (_peak_bytes(est, Xt, gt) - _peak_bytes(est, Xt[:n1], gt[:n1])) / (n2 - n1)
    assert unchunked > 2.5 * per_row, (unchunked, per_row)


def test_more_inducing_points_than_observations_are_capped():
    """n_inducing=10000 on 60 observations used to allocate tens of GiB: it is
    reduced to the number of observations, with a warning naming both."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    y = np.sin(3 * X[:, 0]) + 0.05 * rng.standard_normal(60)
    g = np.repeat([0, 1, 2], 20)
    with pytest.warns(UserWarning, match=r"n_inducing=10000 exceeds the number of training "
                                         r"observations \(60\); 60 inducing points"):
        est = FederatedHierarchicalGPRegressor(n_inducing=10000, n_rounds=2,
                                               random_state=0).fit(X, y, g)
    assert est.n_inducing_ == 60
    # the mean-field family: the global and the local sets
    with pytest.warns(UserWarning) as rec:
        est = FederatedHierarchicalGPRegressor(
            n_inducing=500, n_inducing_local=45, variational_family="mean_field",
            optimizer="adam", n_rounds=1, local_steps=1, random_state=0).fit(X, y, g)
    msgs = " ".join(str(w.message) for w in rec)
    assert "n_inducing=500 exceeds" in msgs and "n_inducing_local=45 exceeds" in msgs
    assert est.n_inducing_ == 60
    # sizes within the data: no warning
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*exceeds the number of training")
        FederatedHierarchicalGPRegressor(n_inducing=20, n_rounds=1,
                                         random_state=0).fit(X, y, g)


def test_indefinite_global_precision_is_a_clear_error(monkeypatch):
    """Statistics that lost positive definiteness to rounding (nearly
    noise-free targets with as many inducing points as observations, on some
    BLAS builds): the error says so (not a bare LinAlgError from SciPy), and
    the estimator stays unfitted. Whether rounding breaks them depends on the
    platform, so the server's sum is made indefinite here by subtracting
    ``2 I`` from one client's upload."""
    from skfedgp import _structured

    M = 4
    with pytest.raises(FloatingPointError, match="not positive definite in floating point"):
        _structured.combine([-2.0 * np.eye(M)], [np.zeros(M)], [0.0], M)
    combine = _structured.combine

    def broken(S_list, b_list, e_list, M):
        return combine([S_list[0] - 2.0 * np.eye(M)] + list(S_list[1:]), b_list, e_list, M)

    monkeypatch.setattr(_structured, "combine", broken)
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    y = np.sin(3 * X[:, 0])
    g = np.repeat([0, 1, 2], 20)
    est = FederatedHierarchicalGPRegressor(n_inducing=10, random_state=0)
    with pytest.raises(FloatingPointError, match="not positive definite in floating point"):
        est.fit(X, y, g)
    assert not hasattr(est, "clients_")


def test_bound_diagnostics_name_the_value_and_the_reason():
    """A ConvergenceWarning names each hyperparameter at a bound with its
    likely reason; an input switched off (lengthscale at its upper bound) and
    a component switched off (variance at its lower bound) are not warned
    about."""
    from sklearn.exceptions import ConvergenceWarning

    from skfedgp.federated import LOG_BOUNDS
    from skfedgp.regressor import _warn_diagnostics

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.standard_normal(40)
    g = np.repeat([0, 1], 20)
    est = FederatedHierarchicalGPRegressor(n_rounds=3, random_state=0).fit(X, y, g)
    srv = est.server_
    theta0 = srv.theta_global.copy()

    def warned(**global_values):
        G = srv.global_pack.unpack(theta0)
        G.update(global_values)
        srv.theta_global = srv.global_pack.pack(G)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            _warn_diagnostics(est, True, 3)
        srv.theta_global = theta0
        return [str(w.message) for w in rec if issubclass(w.category, ConvergenceWarning)]

    lo, hi = srv.lengthscale_range()  # LOG_BOUNDS, the floor per dimension
    assert np.all(lo <= LOG_BOUNDS["lengthscale_g"][0]) and hi == LOG_BOUNDS["lengthscale_g"][1]
    G = srv.global_pack.unpack(theta0)
    assert warned() == []
    assert warned(lengthscale_g=np.r_[G["lengthscale_g"][0], hi]) == []   # x1 switched off
    assert warned(variance_g=LOG_BOUNDS["variance_g"][0]) == []           # global part off
    # phi at its upper bound: the shared part switched off relative to the
    # deviations (only phi var_g identified), a documented outcome too
    assert warned(phi=LOG_BOUNDS["phi"][1]) == []
    msg = warned(lengthscale_g=np.r_[lo[0], G["lengthscale_g"][1]])
    assert len(msg) == 1 and "lengthscale_g (lower bound)" in msg[0]
    assert "faster than the inputs resolve" in msg[0] and "noise-free" not in msg[0]
    # noise-free data: the noise variances end at their floors, named per client
    # (with learned inducing inputs; with the design held they end just above)
    y0 = np.sin(4 * X[:, 0])
    with pytest.warns(ConvergenceWarning, match=r"noise_variance of client 0 \(lower bound\).*"
                                                r"nearly noise-free data"):
        FederatedHierarchicalGPRegressor(random_state=0, learn_inducing_locations=True).fit(
            X, y0, g)
