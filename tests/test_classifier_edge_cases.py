"""Edge cases of :class:`skfedgp.MaxEvidenceClassifier` and the small helpers it sits with."""

import warnings

import numpy as np
import pytest

from skfedgp import FederatedHierarchicalGPRegressor, MaxEvidenceClassifier
from skfedgp.__main__ import client_averaged_metrics
from skfedgp.datasets import load_beijing_air_quality


def _reg(**kw):
    return FederatedHierarchicalGPRegressor(
        **{**dict(n_inducing=8, n_inducing_local=4, n_rounds=2, local_steps=10), **kw})


def _curves(n_per_class=8, n_points=20, seed=0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, n_points)
    X = np.vstack([np.sin(6 * t) + 0.1 * rng.standard_normal((n_per_class, n_points)),
                   np.cos(6 * t) + 0.1 * rng.standard_normal((n_per_class, n_points))])
    return X, np.repeat([0, 1], n_per_class)


# --------------------------------------------------------------------------
# grid units and degenerate grids
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def index_and_seconds():
    X, y = _curves(n_points=24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = MaxEvidenceClassifier(random_state=0).fit(X, y)
        b = MaxEvidenceClassifier(grid=np.arange(24) * 3600.0, random_state=0).fit(X, y)
    return a, b, X


def test_default_lengthscales_follow_the_grid_spacing(index_and_seconds):
    a, b, _ = index_and_seconds
    # unit spacing keeps the paper's values exactly; seconds scale them by 3600
    assert a.estimator_.lengthscale == 50.0 and a.estimator_.local_lengthscale == 10.0
    assert b.estimator_.lengthscale == pytest.approx(50.0 * 3600)
    assert b.estimator_.local_lengthscale == pytest.approx(10.0 * 3600)


def test_grid_in_seconds_gives_the_index_grid_model(index_and_seconds):
    # before: "initial lengthscale_g ... outside the optimiser's range"
    a, b, X = index_and_seconds
    np.testing.assert_allclose(b.predict_proba(X), a.predict_proba(X), atol=1e-5)
    assert b.score(X, np.repeat([0, 1], 8)) == a.score(X, np.repeat([0, 1], 8))


def test_user_estimator_with_lengthscale_in_other_units_names_grid():
    X, y = _curves(n_points=24)
    clf = MaxEvidenceClassifier(_reg(lengthscale=1.0), grid=np.arange(24) * 3600.0)
    with pytest.raises(ValueError, match=r"units of grid \(median spacing 3600"):
        clf.fit(X, y)


@pytest.mark.parametrize("grid", [np.zeros(20), np.full(20, 7.5)])
def test_constant_grid_is_rejected(grid):
    X, y = _curves()
    with pytest.raises(ValueError, match="grid must hold at least 2 distinct values"):
        MaxEvidenceClassifier(_reg(), grid=grid).fit(X, y)


@pytest.mark.parametrize("labels, match", [
    (["1"] * 8 + [1] * 8, r"y mixes text and numeric class labels \(int, str;"),
    ([1] * 8 + ["1"] * 8, r"y mixes text and numeric class labels \(int, str;"),
    ([None] + ["a"] * 7 + ["b"] * 8, r"y holds missing class labels \(None\)"),
    ([1] * 8 + [None] * 8, r"y holds missing class labels \(None\)"),
])
@pytest.mark.parametrize("container", ["object array", "list"])
def test_class_labels_mixing_text_and_numbers_or_missing_are_named(labels, match, container):
    # before: NumPy's TypeError "'<' not supported between instances of 'int' and 'str'",
    # scikit-learn's "Unknown label type", or (a list) 1 and '1' merged into one class
    X, _ = _curves()
    y = np.array(labels, dtype=object) if container == "object array" else list(labels)
    clf = MaxEvidenceClassifier(_reg())
    with pytest.raises(ValueError, match=match):
        clf.fit(X, y)
    assert not hasattr(clf, "classes_")


def test_curves_of_unequal_length_in_a_list_are_named():
    # before: NumPy's "setting an array element with a sequence ... inhomogeneous shape"
    X, y = _curves()
    ragged = [list(row) for row in X]
    ragged[3] = ragged[3][:15]
    with pytest.raises(ValueError, match=r"different lengths: 15 of 20 values, and "
                       r"curve\(s\) \[3\] of \[15\]"):
        MaxEvidenceClassifier(_reg()).fit(ragged, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MaxEvidenceClassifier(_reg(), random_state=0).fit(X, y)
    with pytest.raises(ValueError, match=r"curve\(s\) \[3\] of \[15\]"):
        clf.predict(ragged)


@pytest.mark.parametrize("factor, size, detail", [
    (1e-160, "small", "the squares of the curves' values underflow float64"),
    (1e200, "large", "the variance of the curves' values overflows float64"),
])
def test_curves_too_small_or_large_to_standardise_are_named_as_the_curves(factor, size,
                                                                           detail):
    """The regressor's targets are the curves' values: its "y is too small to
    standardise ... rescale the targets" told a classifier user, whose y holds
    class labels, to rescale them. The message names the curves X (the
    regressor's own error is kept as the cause)."""
    X, y = _curves()
    clf = MaxEvidenceClassifier(_reg())
    with pytest.raises(ValueError, match=rf"^the curves X are too {size} to standardise: "
                                         rf"{detail} \(largest \|X\| = [0-9.e+-]+\); "
                                         r"rescale the curves X \(e\.g\. by a power of ten\), "
                                         r"not the class labels y$") as info:
        clf.fit(X * factor, y)
    assert str(info.value.__cause__).startswith(f"y is too {size} to standardise")
    assert not hasattr(clf, "estimator_")


# --------------------------------------------------------------------------
# class_prior as a dict
# --------------------------------------------------------------------------
def test_class_prior_dict_keyed_by_class_equals_the_array():
    X, y = _curves()
    t = np.linspace(0, 1, 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = MaxEvidenceClassifier(_reg(), grid=t, class_prior={1: 3.0, 0: 1.0},
                                  random_state=0).fit(X, y)
    np.testing.assert_allclose(np.exp(d.class_log_prior_), [0.25, 0.75])


def test_class_prior_dict_with_string_labels():
    X, y = _curves()
    y = np.where(y == 0, "a", "b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = MaxEvidenceClassifier(_reg(), grid=np.linspace(0, 1, 20),
                                  class_prior={"b": 1.0, "a": 4.0}).fit(X, y)
    np.testing.assert_allclose(np.exp(d.class_log_prior_), [0.8, 0.2])


@pytest.mark.parametrize("prior, match", [
    ({0: 0.5}, r"missing class\(es\) \[1\]"),
    ({0: 0.5, 1: 0.3, 2: 0.2}, r"unknown class\(es\) \[2\]"),
    ({0: 0.5, 1: "x"}, "class_prior must be"),
    ({0: 0.5, 1: -1.0}, "positive finite"),
    (object(), "class_prior must be 'uniform', 'empirical', an array .* or a dict"),
])
def test_bad_class_prior_is_a_value_error_naming_it(prior, match):
    X, y = _curves()
    with pytest.raises(ValueError, match=match):
        MaxEvidenceClassifier(_reg(), grid=np.linspace(0, 1, 20), class_prior=prior).fit(X, y)


# --------------------------------------------------------------------------
# load_beijing_air_quality dates, client_averaged_metrics lengths
# --------------------------------------------------------------------------
@pytest.mark.parametrize("kw, name", [({"start": "yesterday"}, "start"),
                                      ({"end": "not a date"}, "end")])
def test_unparseable_date_names_the_argument(kw, name, tmp_path):
    # the dates are checked before any file is read: an empty folder would
    # otherwise be reported first (no station files)
    with pytest.raises(ValueError, match=f"{name} must be a date .* got '{list(kw.values())[0]}'"):
        load_beijing_air_quality(tmp_path, **kw)


def test_client_averaged_metrics_groups_one_short():
    rng = np.random.default_rng(0)
    yy = rng.standard_normal(20)
    with pytest.raises(ValueError, match=r"same length.*groups \(19,\)"):
        client_averaged_metrics(yy, yy + 0.1, np.full(20, 0.5), np.repeat([0, 1], 10)[:-1])


def test_client_averaged_metrics_std_one_short():
    yy = np.zeros(20)
    with pytest.raises(ValueError, match=r"y_std \(19,\)"):
        client_averaged_metrics(yy, yy, np.full(19, 0.5), np.repeat([0, 1], 10))
