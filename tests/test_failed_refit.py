"""A fit (or a streamed chunk) that fails leaves every estimator as it was.

Each case fits a model, makes a later fit or ``partial_fit`` fail, and checks
that the model predicts exactly as before and its fitted attributes still
describe it (``n_features_in_`` included, which ``validate_data`` sets
before the later checks run).
"""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from skfedgp import (AsyncDGPRegressor, FederatedHierarchicalGPRegressor,
                     MaxEvidenceClassifier, OperatorClustering)


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _async_data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, (n, 1))
    return X, np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)


FIXED = dict(optimize_hyperparameters=False, lengthscale=1.0, variance=1.0,
             noise_variance=1e-20)


def test_async_refit_with_bad_groups_keeps_model():
    X, y = _async_data()
    est = AsyncDGPRegressor(random_state=0).fit(X, y)
    before = est.predict(X[:5], return_std=True)
    with pytest.raises(ValueError, match="groups must be integers"):
        est.fit(np.c_[X, X], y, groups=np.arange(60) % 9)
    assert est.n_features_in_ == 1
    after = est.predict(X[:5], return_std=True)
    assert_array_equal(before[0], after[0])
    assert_array_equal(before[1], after[1])


def test_async_refit_whose_factorisation_fails_keeps_model_and_names_expert():
    X, y = _async_data()
    est = AsyncDGPRegressor(n_experts=2, random_state=0).fit(X, y)
    before = est.predict(X[:5])
    points, noise = est.n_points_per_expert_.copy(), est.noise_variance_
    est.set_params(**FIXED)
    with pytest.raises(np.linalg.LinAlgError, match="expert 0 .*noise variance is too small"):
        est.fit(np.r_[X, X], np.r_[y, y])  # every input twice, almost no noise
    assert_array_equal(est.predict(X[:5]), before)
    assert_array_equal(est.n_points_per_expert_, points)
    assert [e.n for e in est.experts_] == list(points)
    assert est.noise_variance_ == noise


def test_async_partial_fit_chunk_is_all_or_nothing():
    X = np.linspace(0, 10, 20)[:, None]
    y = np.sin(X[:, 0])
    kw = dict(FIXED, n_experts=1)
    a = AsyncDGPRegressor(**kw).partial_fit(X, y)
    b = AsyncDGPRegressor(**kw).partial_fit(X, y)
    # the second point duplicates x = 0: its rank-one update fails after the
    # first point of the chunk went in
    with pytest.raises(np.linalg.LinAlgError, match="nothing of the chunk was added"):
        a.partial_fit([[20.0], [0.0]], [1000.0, 1000.0])
    assert a.experts_[0].n == 20
    assert_array_equal(a.n_points_per_expert_, [20])
    a.partial_fit([[11.0]], [0.0])
    b.partial_fit([[11.0]], [0.0])
    assert a.prior_mean_ == b.prior_mean_
    Xq = np.array([[0.5], [20.0], [50.0]])
    assert_array_equal(a.predict(Xq), b.predict(Xq))


def test_async_random_partition_unchanged_by_failed_chunk():
    """The chunk fails after its points were assigned (a draw of the partition)."""
    X, y = _async_data(40)
    kw = dict(FIXED, partition="random", n_experts=2, random_state=1)
    a = AsyncDGPRegressor(**kw).partial_fit(X[:20], y[:20])
    b = AsyncDGPRegressor(**kw).partial_fit(X[:20], y[:20])
    # three copies of one input: two share an expert, whose update then fails
    with pytest.raises(np.linalg.LinAlgError, match="nothing of the chunk was added"):
        a.partial_fit([[20.0], [20.0], [20.0]], [1.0, 1.0, 1.0])
    a.partial_fit(X[20:], y[20:])
    b.partial_fit(X[20:], y[20:])
    assert_array_equal(a.n_points_per_expert_, b.n_points_per_expert_)
    assert_array_equal(a.predict(X[:7]), b.predict(X[:7]))


def test_async_windowed_expert_restored_after_failed_chunk():
    """A full window drops its oldest point in place before the failing append."""
    X = np.linspace(0, 10, 20)[:, None]
    y = np.sin(X[:, 0])
    kw = dict(FIXED, n_experts=1, max_points_per_expert=10)
    a = AsyncDGPRegressor(**kw).partial_fit(X, y)
    b = AsyncDGPRegressor(**kw).partial_fit(X, y)
    with pytest.raises(np.linalg.LinAlgError):
        a.partial_fit([[30.0], [31.0], [X[-1, 0]]], [0.0, 0.0, 0.0])  # the last: a duplicate
    Xq = np.array([[5.5], [7.2], [9.9]])
    assert_array_equal(a.predict(Xq), b.predict(Xq))
    a.partial_fit([[12.0]], [0.5])
    b.partial_fit([[12.0]], [0.5])
    assert_array_equal(a.predict(Xq), b.predict(Xq))


def test_async_accepts_generator_random_state(quiet):
    X, y = _async_data()
    kw = dict(partition="random", n_experts=3, optimize_hyperparameters=False)
    p1 = AsyncDGPRegressor(random_state=np.random.default_rng(5), **kw).fit(X, y).predict(X[:4])
    p2 = AsyncDGPRegressor(random_state=np.random.default_rng(5), **kw).fit(X, y).predict(X[:4])
    assert_array_equal(p1, p2)


def test_async_two_dimensional_groups_named():
    X, y = _async_data(30)
    with pytest.raises(ValueError, match="groups must be 1-D"):
        AsyncDGPRegressor(n_experts=2).fit(X, y, groups=np.zeros((30, 2), int))


def _curves(n_classes=3, per_class=6, n_points=40, seed=0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, n_points)
    X = np.vstack([np.sin((c + 1) * 3 * t) + 0.1 * rng.standard_normal((per_class, n_points))
                   for c in range(n_classes)])
    return X, np.repeat(np.arange(n_classes), per_class)


def _cheap_regressor():
    return FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=4, n_rounds=2)


def test_classifier_failed_refit_keeps_model(quiet):
    X, y = _curves()
    clf = MaxEvidenceClassifier(_cheap_regressor(), random_state=0).fit(X, y)
    before = clf.predict_proba(X)
    with pytest.raises(ValueError, match="at least 2 classes"):
        clf.fit(X[:6, :30], y[:6])  # one class, and curves of another length
    assert clf.n_features_in_ == 40
    assert_array_equal(clf.predict_proba(X), before)


def test_classifier_prior_weights_whose_sum_overflows(quiet):
    X, y = _curves(n_classes=2)
    big = MaxEvidenceClassifier(_cheap_regressor(), class_prior=[1e308, 1e308],
                                random_state=0).fit(X, y)
    assert_allclose(big.class_log_prior_, np.log([0.5, 0.5]), rtol=1e-12)
    proba = big.predict_proba(X[[0, 6]])
    assert np.all(np.isfinite(proba))
    assert_array_equal(big.predict(X[[0, 6]]), [0, 1])


def test_clustering_reused_regressor_of_other_width_named(quiet):
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (30, 1))
    g = np.repeat(np.arange(3), 10)
    y = np.sin(6 * X[:, 0]) + g
    reg = _cheap_regressor().fit(X, y, g)
    for operator in ("published", "posterior", "personal", "personal_residual"):
        oc = OperatorClustering(n_clusters=2, estimator=reg, operator=operator)
        with pytest.raises(ValueError, match="X has 2 features, but the fitted estimator"):
            oc.fit(np.c_[X, X], y, groups=g)
        assert not hasattr(oc, "n_features_in_")


def test_clustering_failed_refit_keeps_model(quiet):
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (40, 1))
    g = np.repeat(np.arange(4), 10)
    y = np.sin(6 * X[:, 0]) + (g >= 2)
    oc = OperatorClustering(n_clusters=2, estimator=_cheap_regressor(), random_state=0)
    oc.fit(X, y, groups=g)
    labels = oc.labels_.copy()
    with pytest.raises(ValueError, match="cannot be split"):
        oc.fit(np.c_[X, X][:10], y[:10], groups=g[:10])
    assert oc.n_features_in_ == 1
    assert_array_equal(oc.labels_, labels)


@pytest.mark.parametrize("bad", ["False", np.nan, [1, 2], 1])
def test_regressor_non_bool_warm_start_is_refused_and_keeps_model(quiet, bad):
    """warm_start was only read as a truth value: the string 'False'
    continued the fitted model (n_iter_ grew), nan and [1, 2] too."""
    X = np.linspace(0, 1, 20)[:, None]
    y, g = np.sin(6 * X[:, 0]), np.arange(20) % 2
    est = FederatedHierarchicalGPRegressor(n_rounds=2, random_state=0).fit(X, y, groups=g)
    before, n_iter = est.predict(X, groups=g), est.n_iter_
    est.set_params(warm_start=bad)
    with pytest.raises(ValueError, match="warm_start must be True or False"):
        est.fit(X, y, groups=g)
    assert est.n_iter_ == n_iter
    assert_array_equal(est.predict(X, groups=g), before)
