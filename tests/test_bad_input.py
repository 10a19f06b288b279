"""Bad input to :class:`FederatedHierarchicalGPRegressor`: every problem is a
clear error naming it, and a failed ``fit`` leaves nothing half-fitted
behind (issue 2, "Done means", bad input)."""

import dataclasses
import warnings

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

import skfedgp._hierarchy as hierarchy
import skfedgp._structured as structured
from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp._linalg import CholeskyError

FAST = dict(n_rounds=2, local_steps=3, n_inducing=5, n_inducing_local=5, random_state=0)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(0.0, 5.0, size=(40, 2))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=40)
    g = np.repeat(["a", "b"], 20)
    return X, y, g


def _est(**params):
    return FederatedHierarchicalGPRegressor(**{**FAST, **params})


# --------------------------------------------------------------------------
# data errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("bad, match", [(np.nan, "X contains NaN"), (np.inf, "X contains infinity"),
                                        (-np.inf, "X contains infinity")])
def test_non_finite_X(data, bad, match):
    X, y, g = data
    X = X.copy()
    X[7, 1] = bad
    with pytest.raises(ValueError, match=match):
        _est().fit(X, y, g)


@pytest.mark.parametrize("bad, match", [(np.nan, "y contains NaN"), (np.inf, "y contains infinity")])
def test_non_finite_y(data, bad, match):
    X, y, g = data
    y = y.copy()
    y[3] = bad
    with pytest.raises(ValueError, match=match):
        _est().fit(X, y, g)


@pytest.mark.parametrize("kind", ["labels", "numeric strings", "two columns of labels",
                                  "object array", "pandas Series", "pandas string Series",
                                  "pandas DataFrame"])
def test_string_targets_are_named(data, kind):
    import pandas as pd

    X, y, g = data
    lab = np.where(y > 0, "up", "down")
    ys = {"labels": lab, "numeric strings": y.astype(str),
          "two columns of labels": np.c_[lab, lab], "object array": lab.astype(object),
          "pandas Series": pd.Series(lab), "pandas string Series": pd.Series(lab, dtype="string"),
          "pandas DataFrame": pd.DataFrame({"a": lab, "b": lab})}[kind]
    with pytest.raises(ValueError, match=r"y must hold numbers \(a regression target\), got an "
                                         r"array of dtype .* with strings"):
        _est().fit(X, ys, g)


def test_output_never_observed_is_named(data):
    """An all-NaN target column keeps its own message (not the overflow one)."""
    X, y, g = data
    Y = np.c_[y, -y]
    Y[:, 1] = np.nan
    with pytest.raises(ValueError, match="output 1 has no observed"):
        _est().fit(X, Y, g)


@pytest.mark.parametrize("columns", [1, 2])
def test_targets_too_large_to_standardise(data, columns):
    """y * 1e200 used to end in 'no client is left ... non-finite values in the message'."""
    X, y, g = data
    yy = (y * 1e200) if columns == 1 else np.c_[y, -y] * 1e200
    est = _est()
    with pytest.raises(ValueError, match=r"y is too large to standardise: the variance of its "
                                         r"values overflows float64 \(largest \|y\| = "):
        est.fit(X, yy, g)
    assert not hasattr(est, "clients_")
    _est().fit(X, y * 1e100, g)  # large but representable: fits


@pytest.mark.parametrize("columns", [1, 2])
def test_targets_too_small_to_standardise(data, columns):
    """y * 1e-200: the squares underflow, the spread read as 0 and the model ran in
    wrong units (predictive std 1e197 times too large) without a word."""
    X, y, g = data
    yy = (y * 1e-200) if columns == 1 else np.c_[y, -y] * 1e-200
    est = _est()
    with pytest.raises(ValueError, match=r"y is too small to standardise: the squares of its "
                                         r"values underflow float64 \(largest \|y\| = "):
        est.fit(X, yy, g)
    assert not hasattr(est, "clients_")
    est = _est().fit(X, y * 1e-100, g)  # small but representable: fits, in its own units
    assert 1e-102 < float(np.ravel(est.y_scale_)[0]) < 1e-98
    _est().fit(X, np.zeros_like(y), g)  # constant zero targets are not "too small"


def test_non_finite_X_at_predict(data):
    X, y, g = data
    est = _est().fit(X, y, g)
    Xt = X[:3].copy()
    Xt[1, 0] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        est.predict(Xt, g[:3])


def test_mismatched_lengths(data):
    X, y, g = data
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        _est().fit(X, y[:-1], g)


@pytest.mark.parametrize("where", ["fit", "predict"])
def test_groups_of_wrong_length(data, where):
    X, y, g = data
    est = _est().fit(X, y, g) if where == "predict" else _est()
    with pytest.raises(ValueError, match=rf"groups passed to {where} must be 1-D with one label "
                                         r"per row of X \(40 rows\)"):
        if where == "fit":
            est.fit(X, y, g[:-1])
        else:
            est.predict(X, g[:-1])


def test_one_dimensional_X(data):
    X, y, g = data
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array"):
        _est().fit(X[:, 0], y, g)


def test_client_with_one_sample_is_named(data):
    X, y, g = data
    g = g.astype(object)
    g[5] = "lonely"
    with pytest.raises(ValueError, match="client 'lonely' has 1 sample"):
        _est().fit(X, y, g)


def test_single_sample_without_groups(data):
    X, y, _ = data
    with pytest.raises(ValueError, match="1 sample"):
        _est().fit(X[:1], y[:1])


def test_predict_before_fit(data):
    X, _, g = data
    for method in ("predict", "predict_components"):
        with pytest.raises(NotFittedError):
            getattr(_est(), method)(X, g)


def test_wrong_number_of_features_at_predict(data):
    X, y, g = data
    est = _est().fit(X, y, g)
    with pytest.raises(ValueError, match="X has 3 features, but FederatedHierarchicalGPRegressor "
                                         "is expecting 2 features"):
        est.predict(np.c_[X, X[:, 0]], g)


@pytest.mark.parametrize("column, match", [(2, "client_column=2 is not a column index of X"),
                                           (1.5, "client_column=1.5 is not a column index")])
def test_bad_client_column(data, column, match):
    X, y, _ = data
    with pytest.raises(ValueError, match=match):
        _est(client_column=column).fit(X, y)


def test_client_column_needs_a_feature(data):
    X, y, g = data
    with pytest.raises(ValueError, match="at least one feature besides the labels"):
        _est(client_column=0).fit(np.zeros((40, 1)), y)


# --------------------------------------------------------------------------
# hyperparameter errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_inducing": 0}, r"n_inducing must be an integer >= 1 or 'auto', got 0"),
        ({"n_inducing": 2.5}, r"n_inducing must be an integer >= 1 or 'auto', got 2.5"),
        ({"n_inducing": "many"}, r"n_inducing must be an integer >= 1 or 'auto', got 'many'"),
        ({"variational_family": "full"}, r"variational_family must be 'structured' or "
                                         r"'mean_field', got 'full'"),
        ({"optimizer": "sgd"}, r"optimizer must be 'lbfgs' or 'adam', got 'sgd'"),
        ({"variational_family": "mean_field"}, r"optimizer='lbfgs' needs "
                                               r"variational_family='structured'"),
        ({"tol": -1.0}, r"tol must be a finite number >= 0, got -1.0"),
        ({"global_steps": -2}, r"global_steps must be an integer >= 0"),
        ({"n_inducing_local": -3}, r"n_inducing_local must be an integer >= 1"),
        ({"n_rounds": -1}, r"n_rounds must be an integer >= 0"),
        ({"local_steps": True}, r"local_steps must be an integer"),
        ({"variance": -1.0}, r"variance must be a finite positive number, got -1.0"),
        ({"local_variance": 0.0}, r"local_variance must be a finite positive number"),
        ({"noise_variance": -0.1}, r"noise_variance must be a finite positive number"),
        ({"phi": np.inf}, r"phi must be a finite positive number"),
        ({"learning_rate": 0}, r"learning_rate must be a finite positive number"),
        ({"global_learning_rate": np.nan}, r"global_learning_rate must be a finite positive"),
        ({"variational_update": "newton"}, r"variational_update must be 'adam' or 'closed_form', "
                                           r"got 'newton'"),
        ({"lengthscale": -1.0}, r"lengthscales must be finite and positive"),
        ({"local_lengthscale": [1.0, 2.0, 3.0]}, r"lengthscale must be a scalar or have 2 entries"),
        # joblib's own errors (OverflowError for inf) or silent acceptance before
        ({"n_jobs": np.inf}, r"n_jobs must be None or a non-zero integer .*got inf"),
        ({"n_jobs": 1.5}, r"n_jobs must be None or a non-zero integer .*got 1.5"),
        ({"n_jobs": True}, r"n_jobs must be None or a non-zero integer .*got True"),
        ({"n_jobs": 0}, r"n_jobs must be None or a non-zero integer .*got 0"),
    ],
)
def test_bad_hyperparameters(data, params, match):
    X, y, g = data
    with pytest.raises(ValueError, match=match):
        _est(**params).fit(X, y, g)


# --------------------------------------------------------------------------
# numerical failure: Cholesky after jitter escalation
# --------------------------------------------------------------------------


def _coincident_client_data():
    """Client "a" spread over [0, 10]; client "b" squeezed into a 1e-12 interval.

    Client b's local inducing points (a design over its own box) are then
    numerically identical for any sensible lengthscale, so its local ``K_zz`` is
    numerically the rank-one matrix ``var * 11^T``. (With a 1e-10 interval
    the pilot found a lengthscale of 1.5e-13, below the spread, and whether
    the factorisation failed turned on round-off.)
    """
    rng = np.random.default_rng(1)
    X = np.vstack([rng.uniform(0.0, 10.0, (30, 1)), 5.0 + 1e-12 * rng.uniform(size=(30, 1))])
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    return X, y, np.repeat(["a", "b"], 30)


def _tiny_jitter(monkeypatch, family):
    """Shrink the starting jitter below machine precision in the training path.

    The escalation then tries 1e-22 ... 1e-17, all lost in rounding against
    the variance: the real factorisation runs on the real, numerically
    singular matrix and must fail after escalation; the Cholesky routine
    itself is not replaced.
    """
    if family == "mean_field":
        build_blocks = hierarchy.build_blocks

        def tiny(G, B, components):
            return [dataclasses.replace(b, jitter=1e-22) for b in build_blocks(G, B, components)]

        monkeypatch.setattr(hierarchy, "build_blocks", tiny)
    else:
        feature_blocks = structured.feature_blocks
        monkeypatch.setattr(structured, "feature_blocks",
                            lambda G, B, c, jitter=None: feature_blocks(G, B, c, jitter=1e-22))


FAMILIES = [dict(variational_family="structured"),
            dict(variational_family="mean_field", optimizer="adam")]


@pytest.mark.parametrize("family", FAMILIES, ids=["structured", "mean_field"])
def test_cholesky_failure_names_matrix_and_client(monkeypatch, family):
    X, y, g = _coincident_client_data()
    # with the default relative jitter (1e-6 * variance, escalated up to 1e-1)
    # the singular K_zz of client b is rescued and the fit succeeds
    ok = _est(n_jobs=1, **family).fit(X, y, g)
    assert np.all(np.isfinite(ok.predict(X, g)))

    _tiny_jitter(monkeypatch, family["variational_family"])
    est = _est(n_jobs=1, **family)
    with pytest.raises(CholeskyError, match=r"K_zz \(local\) of client 'b' failed after \d+ tries") as info:
        est.fit(X, y, g)
    assert info.value.matrix == "K_zz (local)"
    assert info.value.client == "b"
    with pytest.raises(NotFittedError):
        check_is_fitted(est)


def test_non_finite_training_names_client(data):
    X, y, g = data
    with pytest.raises(FloatingPointError, match="client '(a|b)'"):
        _est(local_lengthscale=1e-300, variational_family="mean_field",
             optimizer="adam").fit(X, y, g)


@pytest.mark.parametrize("param, value", [("local_lengthscale", 1e-300), ("lengthscale", 1e9),
                                          ("variance", 1e12), ("phi", 1e-12)])
def test_initial_value_outside_optimiser_range_is_an_error(data, param, value):
    X, y, g = data
    with pytest.raises(ValueError, match=r"lies outside the optimiser's range"):
        _est(**{param: value}).fit(X, y, g)


# --------------------------------------------------------------------------
# nothing half-fitted
# --------------------------------------------------------------------------


def test_failed_first_fit_leaves_estimator_unfitted(data):
    X, y, g = data
    g = g.astype(object)
    g[0] = "lonely"  # fails after validate_data has seen X
    est = _est()
    with pytest.raises(ValueError, match="client 'lonely'"):
        est.fit(X, y, g)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    assert not hasattr(est, "n_features_in_")
    with pytest.raises(NotFittedError):
        est.predict(X, g)


@pytest.mark.parametrize("failure", ["nan", "one_sample", "more_features", "cholesky"])
def test_failed_refit_keeps_previous_model(data, failure, monkeypatch):
    X, y, g = data
    est = _est().fit(X, y, g)
    before = est.predict(X, g, return_std=True)
    state = (est.n_features_in_, est.clients_, est.server_, est.elbo_history_, est.y_offset_)
    if failure == "nan":
        Xb = X.copy()
        Xb[0, 0] = np.nan
        args, err = (Xb, y, g), ValueError
    elif failure == "one_sample":
        gb = g.astype(object)
        gb[0] = "lonely"
        args, err = (X, y, gb), ValueError
    elif failure == "more_features":  # passes validation (resetting n_features_in_), fails later
        gb = g.astype(object)
        gb[0] = "lonely"
        args, err = (np.c_[X, X[:, :1]], y, gb), ValueError
    else:
        _tiny_jitter(monkeypatch, "structured")
        # one feature, where the factorisation fails on any platform (with two
        # identical columns the rounding of some BLAS builds rescues it)
        args, err = _coincident_client_data(), CholeskyError
    with pytest.raises(err):
        est.fit(*args)
    monkeypatch.undo()
    assert (est.n_features_in_, est.clients_, est.server_, est.elbo_history_, est.y_offset_) == state
    after = est.predict(X, g, return_std=True)
    assert_array_equal(before[0], after[0])
    assert_array_equal(before[1], after[1])


def test_tiny_initial_noise_variance_starts_at_the_floor():
    """noise_variance below the floor (noise-free data) is raised, not rejected."""
    X = np.linspace(0.0, 1.0, 20)[:, None]
    y = np.sin(6.0 * X[:, 0])
    est = FederatedHierarchicalGPRegressor(noise_variance=1e-12, n_rounds=1, local_steps=2,
                                           n_inducing=5, n_inducing_local=5, random_state=0)
    mean, std = est.fit(X, y).predict(X, return_std=True)
    assert np.all(np.isfinite(mean)) and np.all(std > 0)


@pytest.mark.parametrize("factor, match", [(1e-200, "too small"), (1e200, "too large")])
def test_other_estimators_refuse_targets_float64_cannot_standardise(data, factor, match):
    """The same target check in the baseline and the Async DGP regressor (they
    fitted y * 1e-200 with a predictive std 1e197 times too large)."""
    from skfedgp import AsyncDGPRegressor, PFedGPRegressor

    X, y, g = data
    with pytest.raises(ValueError, match=f"y is {match} to standardise"):
        PFedGPRegressor(n_rounds=1).fit(X, y * factor, g)
    with pytest.raises(ValueError, match=f"y is {match} to standardise"):
        AsyncDGPRegressor().fit(X, y * factor)
    with pytest.raises(ValueError, match=f"y is {match} to standardise"):
        AsyncDGPRegressor().partial_fit(X, y * factor)


def test_shared_parts_off_warning_names_the_outcome():
    """Clients with nothing in common (pure noise) switch the global part off: a
    SharedPartsOffWarning says so; clients sharing a function get none."""
    from skfedgp import SharedPartsOffWarning

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (90, 1))
    g = np.repeat(["a", "b", "c"], 30)
    with pytest.warns(SharedPartsOffWarning, match="global part was switched off"):
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, rng.normal(size=90), groups=g)
    G = est.server_.global_pack.unpack(est.server_.theta_global)
    assert G["variance_g"] <= 1e-5
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.normal(size=90)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedPartsOffWarning)
        FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)


@pytest.mark.parametrize("levels", [(3.0, 3.0, 3.0), (3.0, -1.0, 250.0)])
def test_constant_targets_are_reported_as_constant_not_as_unrelated_clients(levels):
    """Every client's targets constant: the warning says so (not "check units"),
    and each client is predicted at its own level."""
    from skfedgp import SharedPartsOffWarning

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (60, 1))
    g = np.repeat([0, 1, 2], 20)
    y = np.repeat(levels, 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
    texts = [str(w.message) for w in caught if issubclass(w.category, SharedPartsOffWarning)]
    assert len(texts) == 1 and "targets are constant" in texts[0]
    assert "units" not in texts[0]
    mean, std = est.predict(X, groups=g, return_std=True)
    assert np.all(np.isfinite(std))
    assert np.all(np.abs(mean - y) <= 1e-3 * (1 + np.abs(y)))
    # a warm start rebuilds the server from the fitted state: same message
    est.set_params(warm_start=True, n_rounds=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X, y, groups=g)
    texts = [str(w.message) for w in caught if issubclass(w.category, SharedPartsOffWarning)]
    assert len(texts) == 1 and "targets are constant" in texts[0]


def test_constant_multioutput_targets_are_reported_per_constant_output():
    """Multi-output targets constant in every client fitted silently (1-D ones
    give a SharedPartsOffWarning): the warning names each such output, also
    after a warm start, and only those outputs."""
    from skfedgp import SharedPartsOffWarning

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (30, 1))
    g = np.repeat([0, 1, 2], 10)

    def texts(est, Y):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est.fit(X, Y, groups=g)
        return [str(w.message) for w in caught if issubclass(w.category, SharedPartsOffWarning)]

    both = ("outputs 0, 1 of y are constant in every client (no spread within any of the 3 "
            "clients): there is no function to fit for them, so each client is predicted by "
            "its own constant level of those outputs")
    est = FederatedHierarchicalGPRegressor(random_state=0)
    assert texts(est, np.zeros((30, 2))) == [both]
    est.set_params(warm_start=True, n_rounds=2)  # the server is rebuilt from the fitted state
    assert texts(est, np.zeros((30, 2))) == [both]
    Y = np.c_[np.sin(X[:, 0]) + 0.05 * rng.normal(size=30), np.repeat([3.0, -1.0, 250.0], 10)]
    assert texts(FederatedHierarchicalGPRegressor(random_state=0), Y) == [
        "output 1 of y is constant in every client (no spread within any of the 3 clients): "
        "there is no function to fit for it, so each client is predicted by its own constant "
        "level of that output"]


def test_multioutput_global_part_switched_off_is_reported_also_beside_constant_outputs():
    """Multi-output targets that are pure noise at every client switch the
    global part off (every global loading 0) silently, where 1-D targets
    warn; and a constant output's message used to be the only one, hiding
    the other outputs' global part switched off. Both are reported now;
    outputs sharing a function get neither."""
    from skfedgp import SharedPartsOffWarning

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (90, 1))
    g = np.repeat(["a", "b", "c"], 30)

    def texts(Y):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            FederatedHierarchicalGPRegressor(random_state=0).fit(X, Y, groups=g)
        return [str(w.message) for w in caught if issubclass(w.category, SharedPartsOffWarning)]

    off = "the global part was switched off (largest global variance over the non-constant"
    t = texts(rng.normal(size=(90, 2)))
    assert len(t) == 1 and t[0].startswith(off)
    t = texts(np.c_[rng.normal(size=90), np.repeat([1.0, 2.0, 3.0], 30)])
    assert len(t) == 2 and t[0].startswith("output 1 of y is constant") and t[1].startswith(off)
    shared = np.c_[np.sin(6 * X[:, 0]), np.cos(6 * X[:, 0])] + 0.05 * rng.normal(size=(90, 2))
    assert texts(shared) == []


@pytest.mark.parametrize("value", ["False", "yes", 0, None])
def test_flags_must_be_booleans(value):
    """A string such as "False" must not count as True (it did, silently)."""
    from skfedgp import AsyncDGPRegressor

    rng = np.random.default_rng(0)
    X, y = rng.uniform(0, 5, (30, 1)), rng.normal(size=30)
    with pytest.raises(ValueError, match="normalize_y must be True or False"):
        FederatedHierarchicalGPRegressor(normalize_y=value, n_rounds=1).fit(X, y)
    with pytest.raises(ValueError, match="optimize_hyperparameters must be True or False"):
        AsyncDGPRegressor(n_experts=2, optimize_hyperparameters=value).fit(X, y)


def test_numpy_booleans_are_flags():
    """What a parameter grid built with NumPy passes."""
    from skfedgp import AsyncDGPRegressor

    rng = np.random.default_rng(0)
    X, y = rng.uniform(0, 5, (30, 1)), rng.normal(size=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(normalize_y=np.bool_(False), n_rounds=1).fit(X, y)
    assert est.get_params()["normalize_y"] is np.bool_(False)
    AsyncDGPRegressor(n_experts=2, optimize_hyperparameters=np.bool_(False)).fit(X, y)


def test_a_single_tuple_labelled_client_predicts_without_groups():
    """One client labelled by a tuple: predict without groups uses it (the
    label repeated per row had become a 2-D array: 'unhashable type')."""
    from skfedgp import PFedGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (40, 1))
    g = np.empty(40, dtype=object)
    g[:] = [("a", 1)] * 40
    y = np.sin(X[:, 0]) + 0.05 * rng.normal(size=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=2).fit(X, y, g)
        base = PFedGPRegressor(n_rounds=1).fit(X, np.c_[y, -y], g)
    assert_array_equal(est.predict(X[:3]), est.predict(X[:3], g[:3]))
    assert_array_equal(base.predict(X[:3]), base.predict(X[:3], g[:3]))


@pytest.mark.parametrize("n_jobs", [np.inf, 1e308, 1.5, True])
def test_bad_n_jobs_is_named_by_every_estimator(n_jobs):
    """n_jobs went to joblib unchecked: inf raised OverflowError, 1e308 a
    message about a long expression, and 1.5 or True ran as 1."""
    from skfedgp import AsyncDGPRegressor, MaxEvidenceClassifier, PFedGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (30, 1))
    y, g = np.sin(X[:, 0]), np.arange(30) % 3
    match = r"n_jobs must be None or a non-zero integer"
    with pytest.raises(ValueError, match=match):
        AsyncDGPRegressor(n_experts=2, n_jobs=n_jobs).fit(X, y)
    with pytest.raises(ValueError, match=match):
        PFedGPRegressor(n_rounds=1, local_steps=1, n_jobs=n_jobs).fit(X, y, groups=g)
    curves = np.sin(np.linspace(0, 3, 10)) + 0.1 * rng.standard_normal((6, 10))
    with pytest.raises(ValueError, match=match):
        MaxEvidenceClassifier(n_jobs=n_jobs).fit(curves, [0, 0, 0, 1, 1, 1])


def test_text_for_an_array_parameter_is_named():
    """A string lengthscale (AsyncDGP, PFedGP) or grid (classifier) gave
    NumPy's bare "could not convert string to float", naming no parameter."""
    from skfedgp import AsyncDGPRegressor, MaxEvidenceClassifier, PFedGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (30, 1))
    y, g = np.sin(X[:, 0]), np.arange(30) % 3
    match = r"must be a number or an array of numbers, got 'abc'"
    with pytest.raises(ValueError, match="lengthscale " + match):
        AsyncDGPRegressor(n_experts=2, lengthscale="abc").fit(X, y)
    with pytest.raises(ValueError, match="lengthscale " + match):
        PFedGPRegressor(n_rounds=1, local_steps=1, lengthscale="abc").fit(X, y, groups=g)
    curves = np.sin(np.linspace(0, 3, 10)) + 0.1 * rng.standard_normal((6, 10))
    with pytest.raises(ValueError, match="grid " + match):
        MaxEvidenceClassifier(grid="abc").fit(curves, [0, 0, 0, 1, 1, 1])
    # numeric strings, and None inside an array, converted silently (None to NaN)
    for bad in ("0.5", [1.0, "2"], [0.5, None]):
        with pytest.raises(ValueError, match="lengthscale must be a number"):
            AsyncDGPRegressor(n_experts=2, lengthscale=bad).fit(np.c_[X, X], y)
    with pytest.raises(ValueError, match="grid must be a number"):
        MaxEvidenceClassifier(grid=[str(v) for v in range(10)]).fit(curves, [0, 0, 0, 1, 1, 1])
    # a bool was read as 1.0 by all three regressors
    with pytest.raises(ValueError, match="lengthscale must be a number.*got True"):
        AsyncDGPRegressor(n_experts=2, lengthscale=True).fit(X, y)
    with pytest.raises(ValueError, match="lengthscale must be a number.*got True"):
        PFedGPRegressor(n_rounds=1, local_steps=1, lengthscale=True).fit(X, y, groups=g)
    with pytest.raises(ValueError, match="lengthscale must be a positive number.*got True"):
        FederatedHierarchicalGPRegressor(n_rounds=1, lengthscale=True).fit(X, y, groups=g)
