"""No client's training data in a fitted model (issue 6, item 7).

A pickled estimator must not contain any training input or target, neither
as raw values nor in the scaled coordinates the model works in (the scaling
is kept in the model, so scaled inputs would give the raw rows back), and no
local inducing input may sit on a training row. That includes the extremes
of the inputs: the joint bounding box the set-up keeps and sends back to
every client (``InitBroadcast``) is rounded outward (``outer_box``), since
in 1-D its exact corners were two of the training rows.
"""

import pickle
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor

CASES = {
    "structured": dict(n_rounds=2),
    "structured-partial-warm": dict(n_rounds=2, client_fraction=0.5, warm_start=True),
    "structured-learned-Z": dict(n_rounds=2, learn_inducing_locations=True),
    "mean-field": dict(variational_family="mean_field", optimizer="adam", n_rounds=2,
                       n_inducing=8, n_inducing_local=6),
    "multi-output": dict(n_rounds=2),
    "1-D": dict(n_rounds=2),
}


def _data(case, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(60, 2))
    if case == "1-D":
        X = X[:, :1]
        return X, np.sin(6 * X[:, 0]) + 0.1 * rng.normal(size=60), np.repeat([0, 1, 2], 20)
    g = np.repeat([0, 1, 2], 20)
    f = np.sin(3 * X[:, 0]) + 0.3 * X[:, 1]
    if case == "multi-output":
        y = np.c_[f, np.cos(2 * X[:, 1]) + 0.5 * f] + 0.1 * rng.normal(size=(60, 2))
    else:
        y = f + 0.1 * rng.normal(size=60)
    return X, y, g


def _fit(case):
    X, y, g = _data(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=0, **CASES[case]).fit(X, y, g)
        if CASES[case].get("warm_start"):
            est.fit(X, y, g)
    return X, y, g, est


def _float_bytes(values):
    return {np.float64(v).tobytes() for v in np.ravel(values)}


@pytest.mark.parametrize("case", list(CASES))
def test_pickle_holds_no_training_value_raw_or_scaled(case):
    X, y, g, est = _fit(case)
    blob = pickle.dumps(est)
    srv = est.server_
    Xs = (X - srv.x_offset) / srv.x_scale
    found = [v for v in _float_bytes(X) | _float_bytes(Xs) | _float_bytes(y) if v in blob]
    assert not found, f"{len(found)} training values found in the pickled model"
    for c in est.clients_.values():
        for name in ("_X", "_Xs", "_y", "_Y"):
            assert getattr(c, name, None) is None, name
    assert getattr(srv, "client_boxes", None) is None


@pytest.mark.parametrize("case", list(CASES))
def test_no_local_inducing_input_on_a_training_row(case):
    X, y, g, est = _fit(case)
    srv = est.server_
    Xs = (X - srv.x_offset) / srv.x_scale
    for lab, c in est.clients_.items():
        Zl = c.local_values()["Z_l"]
        dist = np.abs(Zl[:, None, :] - Xs[None, g == lab, :]).max(axis=-1)
        assert dist.min() > 1e-6, f"client {lab}: a local inducing input is a training row"


def test_local_design_covers_the_client_box():
    """The local design lies in the client's own box, spread over it; ``pad``
    applies only to a dimension without spread."""
    from skfedgp.federated import _local_inducing

    rng = np.random.default_rng(1)
    Xs = rng.uniform([0.2, -1.0], [0.5, 3.0], size=(40, 2))
    pad = np.array([0.01, 0.1])
    Z = _local_inducing(Xs, 16, 0, pad=pad)
    assert Z.shape == (16, 2)
    np.testing.assert_array_equal(Z, _local_inducing(Xs, 16, 0))
    lo, hi = Xs.min(axis=0), Xs.max(axis=0)
    assert np.all(Z >= lo) and np.all(Z <= hi)
    # spread: every quarter of each side's range holds a point
    for j in range(2):
        q = np.floor(4 * (Z[:, j] - lo[j]) / (hi[j] - lo[j])).clip(0, 3)
        assert set(q.astype(int)) == {0, 1, 2, 3}
    # a dimension without spread does not copy its one value into the design
    Xc = np.c_[Xs[:, 0], np.full(40, 0.7)]
    Zc = _local_inducing(Xc, 8, 0, pad=pad)
    assert not np.any(Zc[:, 1] == 0.7) and np.ptp(Zc[:, 1]) > 0.1
    assert np.all(np.abs(Zc[:, 1] - 0.7) <= 0.1)
    # reproducible
    np.testing.assert_array_equal(_local_inducing(Xs, 16, 3), _local_inducing(Xs, 16, 3))


@pytest.mark.parametrize("family", ["structured", "mean_field"])
def test_constant_inputs_are_not_copied_into_the_model(family):
    """A client whose inputs do not vary in one dimension (a per-site
    covariate), and one whose rows are all the same input: their values must
    not reach the pickled model through the local design (they did, as
    every point's coordinate in that dimension)."""
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(60, 2))
    X[20:40, 1] = 0.4372458913  # client 1: constant second input
    X[40:60] = [0.2718281828, 0.5772156649]  # client 2: one input, repeated
    y = np.sin(3 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=60)
    g = np.repeat([0, 1, 2], 20)
    kw = (dict(variational_family="mean_field", optimizer="adam", n_inducing=8,
               n_inducing_local=6) if family == "mean_field" else {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=2, **kw).fit(X, y, g)
    blob = pickle.dumps(est)
    srv = est.server_
    Xs = (X - srv.x_offset) / srv.x_scale
    for v in (0.4372458913, 0.2718281828, 0.5772156649, *Xs[20, 1:], *Xs[40]):
        assert np.float64(v).tobytes() not in blob, v


def test_outer_box_lies_strictly_outside_the_inputs():
    from skfedgp.federated import input_scaling, outer_box

    lo = np.array([0.0065, 0.0, 3.0, 1e15, 1e6, -1e-9, -7.25])
    hi = np.array([4.9656, 10.0, 3.0, 1e15 + 1, 1e6 + 1, 1e-9, -7.25])
    a, b = outer_box(lo, hi)
    spread = hi > lo
    assert np.all(a < lo) and np.all(b[spread] > hi[spread])
    # a feature without spread keeps width 0 (scale 1) at a corner below its value
    np.testing.assert_array_equal(a[~spread], b[~spread])
    np.testing.assert_array_equal(input_scaling(a, b)[1][~spread], 1.0)
    # widened by at most 4 grid steps, 0.4 % of the width, where the grid fits in a float
    ok = spread & (np.abs(lo) < 1e12)
    assert np.all((b - a)[ok] <= (hi - lo)[ok] * 1.004)
    np.testing.assert_allclose(outer_box(np.array([0.0065]), np.array([4.9656])),
                               [[0.005], [4.967]], rtol=0, atol=1e-12)


def test_a_constant_feature_is_scaled_to_the_same_small_value_whatever_its_size():
    """With the joint box rounded outward a constant feature's corner sits
    below its value; taken from the value's magnitude, that gap made the
    scaled value about 1e-3 |v| (156 for v = 123456), outside the unit cube
    where the mean-field family places Z_g: the global part was switched off.
    The gap is now 1e-3 to 2e-3 in the feature's units whatever its size."""
    from skfedgp.federated import outer_box

    for v in (0.0, 3.0, -7.25, 123456.0, 1.23e8, 1e15):
        lo, hi = outer_box(np.array([v]), np.array([v]))
        assert lo[0] == hi[0] and lo[0] < v and v - lo[0] <= 1.0
        if abs(v) < 1e12:
            assert 0.999e-3 <= v - lo[0] <= 2.001e-3
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 60)
    g = np.repeat([0, 1, 2], 20)
    y = np.sin(6 * x) + 0.05 * rng.normal(size=60)
    xt = np.linspace(0, 1, 30)
    preds = []
    for v in (0.0, 123456.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = FederatedHierarchicalGPRegressor(
                random_state=0, variational_family="mean_field", optimizer="adam",
                n_rounds=20, n_inducing=8, n_inducing_local=6).fit(np.c_[x, np.full(60, v)], y, g)
        Xt = np.c_[xt, np.full(30, v)]
        preds.append(est.predict(Xt, np.zeros(30, int)))
        assert np.mean(est.predict_components(Xt, np.zeros(30, int))["global"][1]) > 0.01
    np.testing.assert_allclose(preds[1], preds[0], atol=1e-6)
