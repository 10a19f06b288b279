"""NumPy masked arrays: a masked entry is never read as a value.

``np.asarray`` (and so scikit-learn's ``check_array``) drops a mask and
reads the values under it. Every estimator and metric either treats a
masked entry as missing, where a missing entry has a meaning (an output of
a multi-output target, a point of a curve), or refuses it by name.
"""

import warnings

import numpy as np
import pytest

from skfedgp import (AsyncDGPRegressor, FederatedHierarchicalGPRegressor, MaxEvidenceClassifier,
                     OperatorClustering, PFedGPRegressor, metrics)
from skfedgp._validation import unmask

HIDDEN = 1e9  # the value under the mask: reading it would wreck any fit


def _data(seed=0, n=40):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, (n, 1))
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.standard_normal(n)
    return X, y, np.repeat([0, 1], n // 2)


def _masked(a, index):
    m = np.ma.masked_array(np.array(a, dtype=float), mask=np.zeros(np.shape(a), bool))
    m.data[index] = HIDDEN
    m.mask[index] = True
    return m


def _reg(**kw):
    return FederatedHierarchicalGPRegressor(**{**dict(n_rounds=1, random_state=0), **kw})


def test_unmask_contract():
    plain = np.arange(3.0)
    assert unmask(plain, "y") is plain
    assert unmask([1, 2], "y") == [1, 2]
    nothing_masked = np.ma.masked_array(plain, mask=False)
    out = unmask(nothing_masked, "y")
    assert type(out) is np.ndarray and np.array_equal(out, plain)
    filled = unmask(_masked([[1, 2], [3, 4]], (1, 0)), "Y", missing_ok=True)
    assert type(filled) is np.ndarray
    assert np.isnan(filled[1, 0]) and np.array_equal(filled[[0, 0, 1], [0, 1, 1]], [1, 2, 4])
    with pytest.raises(ValueError, match=r"Y is a masked array with 1 masked entry \(first at "
                                         r"index \(1, 0\)\)"):
        unmask(_masked([[1, 2], [3, 4]], (1, 0)), "Y")
    two = np.ma.masked_array(np.arange(4.0), mask=[False, False, True, True])
    with pytest.raises(ValueError, match="2 masked entries"):
        unmask(two, "y")


@pytest.mark.parametrize("make", [
    lambda: _reg(), lambda: PFedGPRegressor(), lambda: AsyncDGPRegressor(n_experts=2),
], ids=["pfedhgp", "pfedgp", "asyncdgp"])
@pytest.mark.parametrize("what", ["X", "y", "groups"])
def test_fit_refuses_masked_entries(make, what):
    X, y, g = _data()
    args = {"X": X, "y": y, "groups": g}
    args[what] = _masked(args[what], (3, 0) if what == "X" else 3)
    est = make()
    if isinstance(est, AsyncDGPRegressor) and what == "groups":
        args["groups"] = np.ma.masked_array(g % 2, mask=np.arange(40) == 3)
    with pytest.raises(ValueError, match=f"{what} is a masked array with 1 masked entry"):
        est.fit(args["X"], args["y"], groups=args["groups"])


def test_predict_and_score_refuse_masked_entries():
    X, y, g = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = [_reg().fit(X, y, groups=g), PFedGPRegressor().fit(X, y, groups=g)]
        a = AsyncDGPRegressor(n_experts=2).fit(X, y)
    for m in models:
        with pytest.raises(ValueError, match="X is a masked array"):
            m.predict(_masked(X, (0, 0)), groups=g)
        with pytest.raises(ValueError, match="groups is a masked array"):
            m.predict(X, groups=np.ma.masked_array(g, mask=np.arange(40) == 0))
        with pytest.raises(ValueError, match="y is a masked array"):
            m.score(X, _masked(y, 0), groups=g)
    for call in (a.predict, a.predict_experts):
        with pytest.raises(ValueError, match="X is a masked array"):
            call(_masked(X, (0, 0)))
    with pytest.raises(ValueError, match="X is a masked array"):
        AsyncDGPRegressor(n_experts=2).partial_fit(_masked(X, (1, 0)), y)


def test_masked_without_masked_entries_is_the_plain_fit():
    X, y, g = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = _reg().fit(np.ma.masked_array(X), np.ma.masked_array(y), groups=g)
        b = _reg().fit(X, y, groups=g)
    np.testing.assert_array_equal(a.predict(X, groups=g), b.predict(X, groups=g))


def test_multioutput_masked_output_is_missing():
    """A masked output of a row is the same as NaN there (an unrecorded output)."""
    X, y, g = _data()
    Y = np.c_[y, np.cos(4 * X[:, 0])]
    Y_nan = Y.copy()
    Y_nan[4, 1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for make in (lambda: _reg(n_latent=1), lambda: PFedGPRegressor(n_latent=1)):
            a = make().fit(X, _masked(Y, (4, 1)), groups=g)
            b = make().fit(X, Y_nan, groups=g)
            pa = a.predict(X, groups=g)
            # the same fit up to round-off, which L-BFGS amplifies (BLAS threads)
            np.testing.assert_allclose(pa, b.predict(X, groups=g), rtol=0, atol=1e-4)
            assert np.abs(pa).max() < 10  # the hidden 1e9 was not read
            assert a.score(X, _masked(Y, (4, 1)), groups=g) == pytest.approx(
                b.score(X, Y_nan, groups=g), abs=1e-4)


def _curves():
    """Two classes of 8 noisy curves of 20 points, and a small regressor for them."""
    rng = np.random.default_rng(0)
    t = np.linspace(0, 1, 20)
    X = np.vstack([np.sin(6 * t) + 0.1 * rng.standard_normal((8, 20)),
                   np.cos(6 * t) + 0.1 * rng.standard_normal((8, 20))])
    reg = FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=4, n_rounds=2,
                                           local_steps=10, random_state=0)
    return X, np.repeat([0, 1], 8), reg


def test_classifier_masked_point_is_missing():
    X, y, reg = _curves()
    X_nan = X.copy()
    X_nan[2, 5] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = MaxEvidenceClassifier(reg, random_state=0).fit(_masked(X, (2, 5)), y)
        b = MaxEvidenceClassifier(reg, random_state=0).fit(X_nan, y)
    np.testing.assert_allclose(a.decision_function(_masked(X, (2, 5))),
                               b.decision_function(X_nan), rtol=1e-4)
    with pytest.raises(ValueError, match="y is a masked array"):
        MaxEvidenceClassifier(reg).fit(X, np.ma.masked_array(y, mask=np.arange(16) == 0))


def test_clustering_and_metrics_refuse_masked_entries():
    X, y, g = _data()
    with pytest.raises(ValueError, match="X is a masked array"):
        OperatorClustering(n_clusters=2).fit(_masked(X, (0, 0)), y, groups=g)
    with pytest.raises(ValueError, match="groups is a masked array"):
        OperatorClustering(n_clusters=2).fit(X, y, groups=np.ma.masked_array(g, mask=g == 0))
    with pytest.raises(ValueError, match="y_true is a masked array"):
        metrics.rmse(_masked(y, 0), y)
    with pytest.raises(ValueError, match="y_std is a masked array"):
        metrics.gaussian_nll(y, y, _masked(np.ones(40), 1))


def test_scores_refuse_masked_targets_and_weights():
    """Every score reads neither a masked target nor a masked sample weight."""
    X, y, g = _data()
    w = np.ma.masked_array(np.ones(40), mask=np.arange(40) == 0)
    w.data[0] = HIDDEN
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = [(_reg().fit(X, y, groups=g), {"groups": g}),
                  (PFedGPRegressor().fit(X, y, groups=g), {"groups": g}),
                  (AsyncDGPRegressor(n_experts=2).fit(X, y), {})]
    for m, kw in models:
        with pytest.raises(ValueError, match="sample_weight is a masked array"):
            m.score(X, y, sample_weight=w, **kw)
    with pytest.raises(ValueError, match="y is a masked array"):
        models[2][0].score(X, _masked(y, 0))
    # a one-column 2-D y: a masked entry is refused by name, not read as a
    # missing channel
    with pytest.raises(ValueError, match="y is a masked array"):
        PFedGPRegressor().fit(X, _masked(y[:, None], (0, 0)), groups=g)
    with pytest.raises(ValueError, match="levels is a masked array"):
        metrics.expected_calibration_error(
            y, y, np.ones(40), levels=np.ma.masked_array([0.5, 0.99], mask=[False, True]))


def test_classifier_score_refuses_masked_labels_and_weights():
    X, y, reg = _curves()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MaxEvidenceClassifier(reg, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="y is a masked array"):
        clf.score(X, np.ma.masked_array(y, mask=np.arange(16) == 0))
    with pytest.raises(ValueError, match="sample_weight is a masked array"):
        clf.score(X, y, sample_weight=np.ma.masked_array(np.ones(16), mask=np.arange(16) == 0))
