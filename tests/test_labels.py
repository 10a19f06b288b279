"""Client labels seen through :class:`FederatedHierarchicalGPRegressor`
(issue 6, item 4): ``client_column`` with string labels in a pandas
DataFrame, by position or by name; missing labels rejected by name; and no
silent population prediction when ``groups`` is left out or its labels have
another type than in ``fit``."""

import contextlib
import datetime
import warnings
from decimal import Decimal

import numpy as np
from sklearn.exceptions import ConvergenceWarning
import pandas as pd
import pytest
from numpy.testing import assert_array_equal

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.regressor import ClientLabelWarning

FAST = dict(n_rounds=2, local_steps=3, n_inducing=5, n_inducing_local=5, random_state=0)
STATIONS = ["Dongsi", "Shunyi", "Tiantan"]


@pytest.fixture(scope="module")
def frame():
    """Three stations of 20 rows: string labels, two numeric features."""
    rng = np.random.default_rng(0)
    n = 60
    df = pd.DataFrame({
        "station": np.repeat(STATIONS, 20),
        "temp": rng.normal(10.0, 5.0, n),
        "hum": rng.uniform(20.0, 90.0, n),
        "wind": rng.uniform(0.0, 5.0, n),
    })
    y = 0.3 * df["temp"].to_numpy() - 0.02 * df["hum"].to_numpy() + 0.1 * rng.normal(size=n)
    return df, y


@pytest.fixture(scope="module")
def reference(frame):
    """The same model fitted from the numeric features and groups=."""
    df, y = frame
    est = FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, df["station"])
    return est, est.predict(df[["temp", "hum"]], df["station"].to_numpy())


def _silent():
    """A context in which any warning is an error."""
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error")
    # a tiny training budget may end before convergence: that warning is expected here
    warnings.simplefilter("ignore", ConvergenceWarning)
    return ctx


# --------------------------------------------------------------------------
# client_column with string labels (the issue's input and its kind)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("column", [0, "station", -3])
def test_issue_input_dataframe_with_string_station(frame, reference, column):
    df, y = frame
    X = df[["station", "temp", "hum"]]
    est = FederatedHierarchicalGPRegressor(client_column=column, **FAST).fit(X, y)
    assert sorted(est.clients_) == STATIONS
    # n_features_in_ / feature_names_in_ describe X as passed, label column included
    assert est.n_features_in_ == 3
    assert_array_equal(est.feature_names_in_, ["station", "temp", "hum"])
    assert_array_equal(est.predict(X), reference[1])
    assert est.score(X, y) == pytest.approx(reference[0].score(df[["temp", "hum"]], y,
                                                               df["station"]), rel=1e-12)


@pytest.mark.parametrize(
    "make_X, column",
    [
        (lambda df: df[["temp", "station", "hum"]], 1),                  # label in the middle
        (lambda df: df[["temp", "hum", "station"]], -1),                 # last, negative index
        (lambda df: df[["temp", "hum", "station"]], "station"),
        (lambda df: df[["station", "temp", "hum"]].astype({"station": "category"}), "station"),
        (lambda df: df[["station", "temp", "hum"]].astype({"station": object}), 0),
        (lambda df: df[["station", "temp", "hum"]].to_numpy(dtype=object), 0),   # object array
        (lambda df: df[["station", "temp", "hum"]].values.tolist(), 0),          # list of rows
    ],
    ids=["middle", "last-negative", "last-by-name", "categorical", "object-dtype",
         "object-ndarray", "list-of-rows"],
)
def test_string_label_column_anywhere_any_container(frame, reference, make_X, column):
    df, y = frame
    X = make_X(df)
    est = FederatedHierarchicalGPRegressor(client_column=column, **FAST).fit(X, y)
    assert sorted(est.clients_) == STATIONS
    assert est.n_features_in_ == 3
    pred = est.predict(X)
    # column order of the features is the same as the reference's (temp, hum)
    assert_array_equal(pred, reference[1])


def test_integer_column_is_a_position_even_with_integer_column_names(frame, reference):
    """As in ColumnTransformer: an int is a position, a str a name."""
    df, y = frame
    X = df[["temp", "station", "hum"]].set_axis([0, 1, 2], axis=1)  # name 0 is at position 0
    est = FederatedHierarchicalGPRegressor(client_column=1, **FAST).fit(X, y)
    assert sorted(est.clients_) == STATIONS
    assert not hasattr(est, "feature_names_in_")  # integer names are not feature names
    assert_array_equal(est.predict(X), reference[1])


def test_integer_column_that_also_names_another_column_warns(frame, reference):
    """The position is used, and the user is told of the column of that name."""
    df, y = frame
    X = df[["temp", "station", "hum"]].set_axis([1, 0, 2], axis=1)  # name 1 at position 0
    with pytest.warns(ClientLabelWarning, match=r"client_column=1 is read as a position "
                      r"\(column 1, named 0\).*a column named 1 \(position 0\)") as rec:
        est = FederatedHierarchicalGPRegressor(client_column=1, **FAST).fit(X, y)
    assert sorted(est.clients_) == STATIONS
    with pytest.warns(ClientLabelWarning, match="read as a position") as rec_p:
        assert_array_equal(est.predict(X), reference[1])
    # at the caller's line, in fit as in predict
    for r in (rec, rec_p):
        assert [w.filename for w in r if issubclass(w.category, ClientLabelWarning)] == [__file__]
    # text column names: no ambiguity, no warning
    ctx = _silent()
    try:
        est = FederatedHierarchicalGPRegressor(client_column="0", **FAST).fit(
            X.set_axis(["1", "0", "2"], axis=1), y)
    finally:
        ctx.__exit__(None, None, None)
    assert sorted(est.clients_) == STATIONS


@pytest.mark.filterwarnings("ignore:X does not have valid feature names")
def test_predict_checks_columns_against_fit(frame):
    df, y = frame
    X = df[["station", "temp", "hum"]]
    est = FederatedHierarchicalGPRegressor(client_column="station", **FAST).fit(X, y)
    with pytest.raises(ValueError, match="feature names should match"):
        est.predict(df[["station", "hum", "temp"]])
    with pytest.raises(ValueError, match="Feature names unseen at fit time:\n- wind"):
        est.predict(df[["station", "temp", "hum", "wind"]])
    pos = FederatedHierarchicalGPRegressor(client_column=0, **FAST).fit(X.to_numpy(), y)
    with pytest.raises(ValueError, match="X has 4 features, but FederatedHierarchicalGPRegressor "
                                         "is expecting 3 features"):
        pos.predict(df[["station", "temp", "hum", "wind"]].to_numpy())
    # the advice names what a fitted model can use: a DataFrame with the column
    with pytest.raises(ValueError, match="'station' is a column name, but X has no column "
                                         "names.*pass X as a DataFrame holding that column"):
        est.predict(X.to_numpy())
    with pytest.raises(ValueError, match="could not convert string to float"):
        est.predict(df[["temp", "station", "hum"]].set_axis(["station", "temp", "hum"], axis=1))


@pytest.mark.parametrize(
    "column, match",
    [
        ("city", r"client_column='city' is not a column of X; X has columns 'station', 'temp'"),
        (3, r"client_column=3 is not a column index of X with 3 columns"),
        (-4, r"client_column=-4 is not a column index of X with 3 columns"),
        (True, r"client_column=True is not a column index"),
        (0.0, r"client_column=0.0 is not a column index"),
    ],
)
def test_bad_client_column_for_dataframe(frame, column, match):
    df, y = frame
    with pytest.raises(ValueError, match=match):
        FederatedHierarchicalGPRegressor(client_column=column, **FAST).fit(
            df[["station", "temp", "hum"]], y)


def test_features_still_must_be_numeric_and_finite(frame):
    df, y = frame
    X = df[["station", "temp", "hum"]].copy()
    X["temp"] = X["temp"].astype(object)
    X.loc[4, "temp"] = "warm"
    with pytest.raises(ValueError, match="could not convert string to float"):
        FederatedHierarchicalGPRegressor(client_column=0, **FAST).fit(X, y)
    X = df[["station", "temp", "hum"]].copy()
    X.loc[4, "hum"] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        FederatedHierarchicalGPRegressor(client_column=0, **FAST).fit(X, y)


# --------------------------------------------------------------------------
# missing labels
# --------------------------------------------------------------------------


@pytest.mark.parametrize("missing", [None, np.nan, pd.NA, float("nan")])
def test_missing_label_in_groups_rejected(frame, missing):
    df, y = frame
    g = df["station"].to_numpy(dtype=object).copy()
    g[[3, 41]] = missing
    with pytest.raises(ValueError, match=r"groups passed to fit has 2 missing client label\(s\) "
                                         r"\(None or NaN\) of 60 rows, at row\(s\) 3, 41; client "
                                         r"labels must be non-missing"):
        FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, g)


def test_missing_label_in_groups_as_list_and_series(frame):
    df, y = frame
    g = list(df["station"])
    g[7] = None
    with pytest.raises(ValueError, match=r"has 1 missing client label.* at row\(s\) 7;"):
        FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, g)
    s = df["station"].copy()
    s[[0, 1, 2]] = None
    with pytest.raises(ValueError, match=r"has 3 missing client label.* at row\(s\) 0, 1, 2;"):
        FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, s)
    num = np.repeat([1.0, 2.0, 3.0], 20)
    num[59] = np.nan
    with pytest.raises(ValueError, match=r"has 1 missing client label.* at row\(s\) 59;"):
        FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, num)


@pytest.mark.parametrize("missing", [None, np.nan])
def test_missing_label_in_client_column_rejected(frame, missing):
    df, y = frame
    X = df[["station", "temp", "hum"]].copy()
    X.loc[[5, 6], "station"] = missing
    with pytest.raises(ValueError, match=r"client_column='station' has 2 missing client "
                                         r"label\(s\) \(None or NaN\) of 60 rows, at row\(s\) 5, 6"):
        FederatedHierarchicalGPRegressor(client_column="station", **FAST).fit(X, y)


def test_missing_label_in_numeric_label_column_rejected(frame):
    """A NaN in a float label column is named as a missing label, not 'X contains NaN'."""
    df, y = frame
    X = np.column_stack([np.repeat([0.0, 1.0, 2.0], 20), df[["temp", "hum"]].to_numpy()])
    X[10, 0] = np.nan
    with pytest.raises(ValueError, match=r"client_column=0 has 1 missing client label"):
        FederatedHierarchicalGPRegressor(client_column=0, **FAST).fit(X, y)


def test_missing_label_rejected_at_predict(frame, reference):
    df, _ = frame
    est = reference[0]
    g = df["station"].to_numpy(dtype=object)[:4].copy()
    g[2] = None
    with pytest.raises(ValueError, match=r"groups passed to predict has 1 missing client label"):
        est.predict(df[["temp", "hum"]][:4], g)
    with pytest.raises(ValueError, match=r"groups passed to predict_components has 1 missing"):
        est.predict_components(df[["temp", "hum"]][:4], g)


# --------------------------------------------------------------------------
# no silent population prediction
# --------------------------------------------------------------------------


def test_groups_none_with_several_clients_warns(frame, reference):
    df, y = frame
    est = reference[0]
    X = df[["temp", "hum"]]
    with pytest.warns(ClientLabelWarning, match=r"predict was called with groups=None on a model "
                                                r"fitted with 3 clients \('Dongsi', 'Shunyi', "
                                                r"'Tiantan'\): every row gets the population"):
        pred = est.predict(X)
    # the fallback itself is unchanged: the same as an explicit unseen label
    ctx = _silent()
    try:
        assert_array_equal(pred, est.predict(X, ["new-site"] * len(X)))
    finally:
        ctx.__exit__(None, None, None)
    with pytest.warns(ClientLabelWarning, match="score was called with groups=None"):
        est.score(X, y)
    with pytest.warns(ClientLabelWarning, match="predict_components was called with groups=None"):
        est.predict_components(X)
    with pytest.warns(ClientLabelWarning, match="groups=None"):
        est.predict(X, return_std=True)


def test_no_warning_when_labels_are_right(frame, reference):
    df, y = frame
    est, _ = reference
    X = df[["temp", "hum"]]
    ctx = _silent()
    try:
        est.predict(X, df["station"])
        est.score(X, y, df["station"].to_numpy())
        est.predict(X, ["new-site"] * len(X))          # explicit population request
        est.predict(X[:2], ["Dongsi", "elsewhere"])     # seen and unseen, no look-alike
        one = FederatedHierarchicalGPRegressor(**FAST).fit(X, y)  # a single client
        one.predict(X)
        one.score(X, y)
    finally:
        ctx.__exit__(None, None, None)


def _int_fitted(frame):
    df, y = frame
    g = np.repeat([1, 2, 3], 20)
    return FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, g), g


def test_issue_input_int_labels_in_fit_str_in_predict_warns(frame):
    df, y = frame
    est, g = _int_fitted(frame)
    X = df[["temp", "hum"]]
    with pytest.warns(ClientLabelWarning,
                      match=r"predict: '1' \(str\) is not a fitted client, but 1 \(int\) is; "
                            r"'2' \(str\) is not a fitted client, but 2 \(int\) is; '3' \(str\) "
                            r"is not a fitted client, but 3 \(int\) is\. Client labels must match"):
        pred = est.predict(X, g.astype(str))
    assert_array_equal(pred, est.predict(X, ["unseen"] * len(X)))  # what the rows got
    assert not np.allclose(pred, est.predict(X, g))
    with pytest.warns(ClientLabelWarning, match=r"score: '1' \(str\) is not a fitted client"):
        est.score(X, y, g.astype(str))


@pytest.mark.parametrize(
    "fit_labels, predict_labels, named",
    [
        (["1", "2", "3"], [1, 2, 3], r"1 \(int\) is not a fitted client, but '1' \(str\) is"),
        ([1, 2, 3], [1.5, "2.0", 3], r"'2.0' \(str\) is not a fitted client, but 2 \(int\) is"),
        ([1, 2, 3], ["01", 2, 3], r"'01' \(str\) is not a fitted client, but 1 \(int\) is"),
        (["A", "B", "C"], [" A", "B", "C"], r"' A' \(str\) is not a fitted client, but 'A'"),
        (["Dongsi", "Shunyi", "Tiantan"], ["dongsi", "Shunyi", "x"],
         r"'dongsi' \(str\) is not a fitted client, but 'Dongsi' \(str\) is"),
        ([b"a", b"b", b"c"], ["a", "b", "c"], r"'a' \(str\) is not a fitted client, but b'a'"),
    ],
)
def test_look_alike_labels_warn(frame, fit_labels, predict_labels, named):
    df, y = frame
    g = np.repeat(np.asarray(fit_labels, dtype=object), 20)
    est = FederatedHierarchicalGPRegressor(**FAST).fit(df[["temp", "hum"]], y, g)
    with pytest.warns(ClientLabelWarning, match=named):
        est.predict(df[["temp", "hum"]][:3], predict_labels)


def test_look_alike_labels_in_client_column_warn(frame):
    """Fitted with integer station codes in the frame, predicted with string codes."""
    df, y = frame
    X = df[["station", "temp", "hum"]].assign(station=np.repeat([10, 20, 30], 20))
    est = FederatedHierarchicalGPRegressor(client_column="station", **FAST).fit(X, y)
    assert sorted(est.clients_) == [10, 20, 30]
    with pytest.warns(ClientLabelWarning, match=r"'10' \(str\) is not a fitted client, but 10"):
        est.predict(X.astype({"station": str}))
    ctx = _silent()
    try:
        est.predict(X)  # the same labels as in fit: no warning
    finally:
        ctx.__exit__(None, None, None)


def test_pipeline_routes_groups_with_metadata_routing():
    """With scikit-learn's metadata routing, a Pipeline passes ``groups`` to
    fit, predict and score once the estimator requests it; the predictions are
    those of the estimator fitted on the transformed inputs."""
    import sklearn
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (45, 2))
    g = np.repeat(["a", "b", "c"], 15)
    y = np.sin(X[:, 0]) + (g == "b") + 0.05 * rng.standard_normal(45)
    kw = dict(n_rounds=2, random_state=0)
    with sklearn.config_context(enable_metadata_routing=True):
        gp = (FederatedHierarchicalGPRegressor(**kw).set_fit_request(groups=True)
              .set_predict_request(groups=True, return_std=True)
              .set_score_request(groups=True))
        pipe = make_pipeline(StandardScaler(), gp).fit(X, y, groups=g)
        m, sd = pipe.predict(X, groups=g, return_std=True)
        r2 = pipe.score(X, y, groups=g)
    Xs = StandardScaler().fit_transform(X)
    ref = FederatedHierarchicalGPRegressor(**kw).fit(Xs, y, g)
    m_ref, sd_ref = ref.predict(Xs, g, return_std=True)
    np.testing.assert_allclose(m, m_ref, rtol=1e-10)
    np.testing.assert_allclose(sd, sd_ref, rtol=1e-10)
    np.testing.assert_allclose(r2, ref.score(Xs, y, g), rtol=1e-10)
    # the client part is used: the population prediction differs
    with pytest.warns(UserWarning):
        pop = ref.predict(Xs)
    assert not np.allclose(m, pop)



# --------------------------------------------------------------------------
# label types: look-alikes of different types refused in fit, bools never
# numeric clients at predict
# --------------------------------------------------------------------------

FAST1 = dict(FAST, n_rounds=1)
_MIXED = r"mixes client labels of different types that look alike: "
_CAST = r"Cast the labels to one type before fit"


@pytest.fixture(scope="module")
def small():
    """30 rows, two features, a target that depends on the client (of 3)."""
    rng = np.random.default_rng(1)
    X = rng.uniform(0.0, 5.0, (30, 2))
    y = np.sin(X[:, 0]) + np.repeat([0.0, 1.0, -1.0], 10) + 0.05 * rng.standard_normal(30)
    return X, y


def _obj(*labels):
    """An object array of 30 labels: ``labels`` repeated in blocks of equal size."""
    return np.repeat(np.asarray(labels + (None,), dtype=object)[:-1], 30 // len(labels))


@pytest.mark.parametrize(
    "groups, named",
    [
        (lambda: [1] * 15 + ["1"] * 15, r"1 \(int\) vs '1' \(str\)"),               # list
        (lambda: _obj(1, "1", 2), r"1 \(int\) vs '1' \(str\)"),                     # object array
        (lambda: pd.Series(_obj(1, "1", 2)), r"1 \(int\) vs '1' \(str\)"),          # pandas object
        (lambda: pd.Series(_obj(1, "1", 2)).astype("category"),                    # categorical
         r"1 \(int\) vs '1' \(str\)"),
        (lambda: _obj(np.int64(7), "07", 8), r"7 \(int\) vs '07' \(str\)"),
        (lambda: _obj(1.5, "1.5", 2.0), r"1.5 \(float\) vs '1.5' \(str\)"),
        (lambda: _obj(True, 1, False), r"True \(bool\) vs 1 \(int\)"),             # True == 1
        (lambda: _obj(np.bool_(False), 0, 2), r"False \(bool\) vs 0 \(int\)"),
        (lambda: _obj(True, "true", False), r"True \(bool\) vs 'true' \(str\)"),
        (lambda: _obj(b"a", "a", "b"), r"b'a' \(bytes\) vs 'a' \(str\)"),
        (lambda: _obj(1, "1", 2, "2", 3), r"1 \(int\) vs '1' \(str\); 2 \(int\) vs '2' \(str\)"),
        (lambda: _obj(Decimal(1), "1", 2), r"Decimal\('1'\) \(Decimal\) vs '1' \(str\)"),
    ],
    ids=["list", "object-array", "series", "categorical", "np-int", "float", "bool-int",
         "np-bool-int", "bool-text", "bytes-str", "two-sets", "decimal-str"],
)
def test_fit_refuses_look_alike_labels_of_different_types(small, groups, named):
    X, y = small
    est = FederatedHierarchicalGPRegressor(**FAST1)
    with pytest.raises(ValueError, match=r"groups passed to fit " + _MIXED + named + r"\. "
                                         r"Labels are compared by value and type.*" + _CAST):
        est.fit(X, y, groups())
    assert not hasattr(est, "clients_")  # nothing half-fitted


def test_fit_refuses_look_alike_labels_in_client_column(small):
    """A station column read partly as text: 10 and '10' in one object column."""
    X, y = small
    df = pd.DataFrame({"station": _obj(10, "10", 20), "a": X[:, 0], "b": X[:, 1]})
    with pytest.raises(ValueError, match=r"client_column='station' " + _MIXED
                                         + r"10 \(int\) vs '10' \(str\)\..*" + _CAST):
        FederatedHierarchicalGPRegressor(client_column="station", **FAST1).fit(df, y)
    with pytest.raises(ValueError, match=r"client_column=0 " + _MIXED + r"10 \(int\) vs '10'"):
        FederatedHierarchicalGPRegressor(client_column=0, **FAST1).fit(df.to_numpy(object), y)
    # cast to one type, as the message says: 10 and '10' are one client
    est = FederatedHierarchicalGPRegressor(client_column="station", **FAST1).fit(
        df.astype({"station": str}), y)
    assert sorted(est.clients_) == ["10", "20"]


@pytest.mark.parametrize(
    "groups, clients",
    [
        (lambda: np.repeat([1, 2, 3], 10), [1, 2, 3]),
        (lambda: list(np.repeat([1, 2, 3], 10).tolist()), [1, 2, 3]),
        (lambda: np.repeat([1.0, 2.0, 3.5], 10), [1.0, 2.0, 3.5]),
        (lambda: _obj(1, 2.0, np.int64(3)), [1, 2.0, 3]),                # one family: numbers
        (lambda: np.repeat(["a", "b", "c"], 10), ["a", "b", "c"]),
        (lambda: pd.Series(np.repeat(["a", "b", "c"], 10), dtype="string"), ["a", "b", "c"]),
        (lambda: pd.Series(np.repeat(["a", "b", "c"], 10)).astype("category"), ["a", "b", "c"]),
        (lambda: pd.Series(np.repeat([3, 1, 2], 10)).astype("category"), [1, 2, 3]),
        (lambda: _obj("1", "01", " 1"), [" 1", "01", "1"]),              # all str: three names
        (lambda: np.repeat([True, False], 15), [False, True]),           # all bool: two clients
        (lambda: [True] * 15 + [False] * 15, [False, True]),
        (lambda: pd.Series(np.repeat([True, False], 15), dtype="boolean"), [False, True]),
        (lambda: _obj(0, 1, "new"), [0, 1, "new"]),                      # mixed, not alike
        (lambda: _obj(True, False, "yes"), [False, True, "yes"]),
    ],
    ids=["int", "int-list", "float", "numbers-object", "str", "string-dtype", "categorical",
         "int-categorical", "str-look-alikes", "bool", "bool-list", "boolean-dtype",
         "int-and-str", "bool-and-str"],
)
def test_ordinary_labels_still_fit(small, groups, clients):
    X, y = small
    ctx = _silent()
    try:
        est = FederatedHierarchicalGPRegressor(**FAST1).fit(X, y, groups())
    finally:
        ctx.__exit__(None, None, None)
    assert sorted(est.clients_, key=repr) == sorted(clients, key=repr)
    assert all(type(a) is type(b) for a, b in zip(sorted(est.clients_, key=repr),
                                                  sorted(clients, key=repr)))


@pytest.fixture(scope="module")
def int_model(small):
    X, y = small
    return FederatedHierarchicalGPRegressor(**FAST1).fit(X, y, np.repeat([0, 1, 2], 10))


@pytest.fixture(scope="module")
def bool_model(small):
    X, y = small
    return FederatedHierarchicalGPRegressor(**FAST1).fit(
        X, y, np.repeat([True, False, True], 10))


def _predict_silently(est, X, groups):
    """``est.predict`` with any warning an error, but that of a model of fewer than 3
    clients predicting for a new one (the bool model has two clients)."""
    ctx = _silent()
    warnings.filterwarnings("ignore", message=".*rows of a client never seen in fit")
    try:
        return est.predict(X, groups)
    finally:
        ctx.__exit__(None, None, None)


@pytest.mark.parametrize(
    "groups",
    [
        lambda: [True, 1, False, 0],
        lambda: np.array([True, 1, False, 0], dtype=object),
        lambda: pd.Series([True, 1, False, 0], dtype=object),
    ],
    ids=["list", "object-array", "series"],
)
def test_bool_label_is_not_an_int_client_at_predict(small, int_model, groups):
    """Fitted with 0, 1, 2: True and False get the population prediction, as '1' does."""
    X, _ = small
    est = int_model
    with pytest.warns(ClientLabelWarning,
                      match=r"predict: False \(bool\) is not a fitted client, but 0 \(int\) is; "
                            r"True \(bool\) is not a fitted client, but 1 \(int\) is\. Client "
                            r"labels must match the labels given to fit in value and type "
                            r"\(1, '1' and True are three different clients\)"):
        pred = est.predict(X[:4], groups())
    population = _predict_silently(est, X[:4], [99] * 4)  # a never-fitted int: no warning
    fitted = _predict_silently(est, X[:4], [1, 1, 0, 0])
    # (predicted in other row groups: equal up to round-off)
    np.testing.assert_allclose(pred[[0, 2]], population[[0, 2]], rtol=1e-12)  # the bool rows
    np.testing.assert_allclose(pred[[1, 3]], fitted[[1, 3]], rtol=1e-12)  # the int rows
    assert not np.allclose(fitted[[0, 2]], population[[0, 2]])


def test_bool_array_and_score_on_int_model(small, int_model):
    X, y = small
    est = int_model
    with pytest.warns(ClientLabelWarning, match=r"predict: True \(bool\) is not a fitted "
                                                r"client, but 1 \(int\) is\."):
        pred = est.predict(X[:3], np.array([True, True, True]))
    np.testing.assert_allclose(pred, _predict_silently(est, X[:3], [-1] * 3),
                               rtol=1e-12)
    with pytest.warns(ClientLabelWarning, match=r"score: False \(bool\) is not a fitted client"):
        est.score(X[:10], y[:10], np.zeros(10, dtype=bool))
    with pytest.warns(ClientLabelWarning, match=r"predict_components: True \(bool\) is not"):
        est.predict_components(X[:2], [True, True])
    ctx = _silent()
    try:  # the fitted labels themselves, and 1.0 / np.int64(1) (equal, same family): no warning
        est.predict(X[:3], np.array([0, 1, 2]))
        est.predict(X[:3], [0.0, np.int64(1), 2])
    finally:
        ctx.__exit__(None, None, None)


@pytest.mark.filterwarnings("ignore:predict. rows of a client never seen in fit")
def test_int_label_is_not_a_bool_client_at_predict(small, bool_model):
    X, _ = small
    est = bool_model
    assert sorted(est.clients_) == [False, True]
    fitted = _predict_silently(est, X[:4], [True, True, False, False])
    _predict_silently(est, X[:4], pd.Series([True, True, False, False], dtype="boolean"))
    # every bool is fitted: any other label is of a type no fitted client has
    with pytest.warns(ClientLabelWarning, match=r"'new-site' \(str\) is not a fitted client, "
                                                r"and no fitted client has a label of that type "
                                                r"\(the fitted labels are False, True, of type "
                                                r"bool\)"):
        population = est.predict(X[:4], ["new-site"] * 4)
    with pytest.warns(ClientLabelWarning,
                      match=r"predict: 0 \(int\) is not a fitted client, but False \(bool\) is; "
                            r"1 \(int\) is not a fitted client, but True \(bool\) is\."):
        pred = est.predict(X[:4], [1, True, 0, False])
    np.testing.assert_allclose(pred[[0, 2]], population[[0, 2]], rtol=1e-12)
    np.testing.assert_allclose(pred[[1, 3]], fitted[[1, 3]], rtol=1e-12)
    with pytest.warns(ClientLabelWarning, match=r"1.0 \(float\) is not a fitted client, but "
                                                r"True \(bool\) is"):
        est.predict(X[:2], np.array([1.0, 1.0]))
    with pytest.warns(ClientLabelWarning, match=r"'True' \(str\) is not a fitted client, but "
                                                r"True \(bool\) is"):
        est.predict(X[:2], ["True", "True"])


def test_bool_label_column_at_predict_on_int_column_model(small):
    X, y = small
    df = pd.DataFrame({"site": np.repeat([0, 1, 2], 10), "a": X[:, 0], "b": X[:, 1]})
    est = FederatedHierarchicalGPRegressor(client_column="site", **FAST1).fit(df, y)
    with pytest.warns(ClientLabelWarning, match=r"True \(bool\) is not a fitted client, but 1 "
                                                r"\(int\) is"):
        est.predict(df[:4].assign(site=True))


def test_groups_that_disagree_with_the_client_column_are_warned_about(frame):
    """The column overrides groups; a groups naming other clients is most likely a
    mistake, so it is not ignored silently (the same groups is accepted quietly)."""
    df, y = frame
    X = df[["station", "temp", "hum"]]
    est = FederatedHierarchicalGPRegressor(client_column="station", **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ClientLabelWarning)
        est.fit(X, y, groups=df["station"].to_numpy())  # the same labels: quiet
        est.predict(X, groups=df["station"].to_numpy())
    other = np.where(df["station"].to_numpy() == STATIONS[0], STATIONS[1], STATIONS[0])
    n_diff = int(np.sum(other != df["station"].to_numpy()))
    with pytest.warns(ClientLabelWarning, match=f"groups passed to fit differs from "
                                                f"client_column='station' in {n_diff} of"):
        est.fit(X, y, groups=other)
    assert sorted(est.clients_) == STATIONS  # the column was used
    with pytest.warns(ClientLabelWarning, match="groups passed to predict differs"):
        est.predict(X, groups=other)


# ---------------------------------------------------------------------------
# labels of other kinds: sets, dates, unhashable values; client_column after
# set_params; a missing target written as None
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """Any warning is an error, except the tiny training budget's ConvergenceWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def _small(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 5, (30, 1))
    g = np.repeat([0, 1, 2], 10)
    return X, np.sin(X[:, 0]) + 0.3 * g + 0.1 * rng.normal(size=30), g


def test_frozenset_labels_are_three_clients():
    """np.unique sorts sets by "subset of" and splits equal labels apart."""
    X, y, g = _small()
    labs = [frozenset({"a"}), frozenset({"b"}), frozenset({"c"})]
    groups = np.empty(30, dtype=object)
    groups[:] = [labs[k] for k in g]
    with _quiet():
        est = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, groups)
        ref = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, g)
    assert len(est.clients_) == 3
    assert set(est.clients_) == set(labs)
    with _quiet():
        np.testing.assert_allclose(est.predict(X, groups), ref.predict(X, g), rtol=1e-10)


def test_list_of_tuple_labels_is_one_tuple_label_a_row():
    """A list of tuples was read as a 2-D array ("must be 1-D ... got shape
    (30, 2)"); each tuple is one client label, in fit, predict and score."""
    X, y, g = _small()
    groups = [("site", int(k)) for k in g]
    with _quiet():
        est = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, groups)
        ref = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, g)
    assert list(est.clients_) == [("site", 0), ("site", 1), ("site", 2)]
    with _quiet():  # no ClientLabelWarning: the tuples are the fitted clients
        assert_array_equal(est.predict(X, groups), ref.predict(X, g))
        assert est.score(X, y, groups) == ref.score(X, y, g)
        # an unseen tuple gets the population prediction, as an unseen int does
        assert_array_equal(est.predict(X[:4], [("site", 9)] * 4), ref.predict(X[:4], [9] * 4))


def test_date_labels_match_whatever_their_unit():
    X, y, g = _small()
    days = np.array(["2020-01-01", "2020-01-02", "2020-01-03"], dtype="datetime64[D]")
    with _quiet():
        est = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, days[g])
        ns = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, days[g].astype("datetime64[ns]"))
    assert list(est.clients_) == list(pd.DatetimeIndex(days))
    assert list(ns.clients_) == list(est.clients_)
    with _quiet():
        own = est.predict(X[:12], days[g[:12]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ClientLabelWarning)  # no population fallback
        warnings.simplefilter("ignore", ConvergenceWarning)
        for other in (pd.Series(days[g[:12]]), days[g[:12]].astype("datetime64[ns]"),
                      [d.item() for d in days[g[:12]]]):
            assert_array_equal(est.predict(X[:12], other), own)


def test_unhashable_labels_named():
    X, y, g = _small()
    groups = np.empty(30, dtype=object)
    groups[:] = [[k] for k in g]
    with pytest.raises(ValueError, match="unhashable client label at row 0"):
        FederatedHierarchicalGPRegressor(**FAST).fit(X, y, groups)
    with _quiet():
        est = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, g)
    with pytest.raises(ValueError, match="groups passed to predict holds an unhashable"):
        est.predict(X[:2], groups[:2])


@pytest.mark.parametrize("make_y", [
    lambda y: [None] + list(y[1:]),
    lambda y: np.array([None] + list(y[1:]), dtype=object),
    lambda y: pd.Series([None] + list(y[1:]), dtype=object),
])
def test_none_target_is_a_missing_value_error(make_y):
    """sklearn's finite check passes None in object arrays; it must not drop a client."""
    X, y, g = _small()
    with pytest.raises(ValueError, match=r"y contains 1 missing value\(s\) .* row\(s\) 0"):
        FederatedHierarchicalGPRegressor(**FAST).fit(X, make_y(y), g)


def test_prediction_uses_the_client_column_of_the_fit(frame):
    df, y = frame
    with _quiet():
        est = FederatedHierarchicalGPRegressor(client_column="station", **FAST).fit(df, y)
        before = est.predict(df)
    est.set_params(client_column=None)  # applies from the next fit on
    assert est.client_column_ == "station"
    with _quiet():
        assert_array_equal(est.predict(df), before)
    X = df[["temp", "hum", "wind"]].to_numpy()
    with _quiet():
        plain = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, df["station"])
        own = plain.predict(X, df["station"])
    plain.set_params(client_column=0)
    # fitted without a label column: column 0 of X stays a feature, so
    # without groups the rows get the population prediction (and the warning)
    with pytest.warns(ClientLabelWarning, match="groups=None"):
        pop = plain.predict(X)
    assert pop.shape == (X.shape[0],)
    with _quiet():
        assert_array_equal(plain.predict(X, df["station"]), own)


def test_negative_verbose_is_silent_and_none_rejected(capsys):
    X, y, g = _small()
    with _quiet():
        FederatedHierarchicalGPRegressor(**dict(FAST, verbose=-1)).fit(X, y, g)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="verbose must be an int"):
        FederatedHierarchicalGPRegressor(**dict(FAST, verbose=None)).fit(X, y, g)


def test_copied_rows_warn_and_repeated_measurements_do_not():
    X, y, g = _small()
    idx = np.r_[np.arange(30), np.arange(10)]  # client 0's rows twice
    with pytest.warns(UserWarning, match=r"client\(s\) 0 \(10 of 20 rows\) have rows that repeat"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            FederatedHierarchicalGPRegressor(**FAST).fit(X[idx], y[idx], g[idx])
    # real repeats: the same inputs measured again with another (noisy) target
    y2 = np.r_[y, y[:10] + 0.05]
    with _quiet():
        FederatedHierarchicalGPRegressor(**FAST).fit(X[idx], y2, g[idx])


def test_date_strings_look_like_date_labels():
    X, y, g = _small()
    days = np.array(["2020-01-01", "2020-01-02", "2020-01-03"], dtype="datetime64[D]")
    with _quiet():
        est = FederatedHierarchicalGPRegressor(**FAST).fit(X, y, days[g])
    with pytest.warns(ClientLabelWarning, match="2020-01-01"):
        est.predict(X[:3], days[g[:3]].astype(str))
    mixed = np.array([datetime.date(2020, 1, 1)] * 15 + ["2020-01-01"] * 15, dtype=object)
    with pytest.raises(ValueError, match="look alike"):
        FederatedHierarchicalGPRegressor(**FAST).fit(X, y, mixed)


def test_same_dates_as_groups_and_client_column_do_not_warn():
    X, y, g = _small()
    days = [datetime.date(2020, 1, 1 + k) for k in g]
    df = pd.DataFrame({"day": days, "x": X[:, 0]})
    with _quiet():
        est = FederatedHierarchicalGPRegressor(client_column="day", **FAST)
        est.fit(df, y, groups=np.array(days, dtype=object))
        est.predict(df, groups=np.array(days, dtype=object))
    assert len(est.clients_) == 3


def test_classifier_identical_curves_are_not_called_copies():
    from skfedgp import MaxEvidenceClassifier

    rng = np.random.default_rng(0)
    t = np.linspace(0, 1, 20)
    X = np.vstack([np.tile(np.sin(3 * t), (3, 1)),
                   np.cos(3 * t) + 0.1 * rng.standard_normal((3, 20))])
    reg = FederatedHierarchicalGPRegressor(n_rounds=2, n_inducing=6, n_inducing_local=4)
    with _quiet():
        MaxEvidenceClassifier(reg, verbose=None, random_state=0).fit(X, [0, 0, 0, 1, 1, 1])


def test_labels_of_a_type_no_fitted_client_has_warn(frame, reference):
    """Clients fitted as 'Dongsi', 'Shunyi', 'Tiantan' and predicted with the
    integer codes 0, 1, 2 (an encoded column) got the population prediction
    without a word (issue 6, item 4: int against str)."""
    df, y = frame
    est = reference[0]
    X = df[["temp", "hum"]]
    codes = pd.Categorical(df["station"]).codes.astype(int)
    with pytest.warns(ClientLabelWarning,
                      match=r"predict: 0 \(int\), 1 \(int\), 2 \(int\) are not fitted clients, "
                            r"and no fitted client has a label of that type \(the fitted labels "
                            r"are 'Dongsi', 'Shunyi', 'Tiantan', of type str\)"):
        pred = est.predict(X, codes)
    ctx = _silent()
    try:
        population = est.predict(X, ["new-site"] * len(X))  # a never-fitted text label
    finally:
        ctx.__exit__(None, None, None)
    np.testing.assert_allclose(pred, population, rtol=1e-12)
    with pytest.warns(ClientLabelWarning, match=r"score: 7 \(int\) is not a fitted client, and "
                                                r"no fitted client has a label of that type"):
        est.score(X, y, np.full(len(X), 7))
