"""Edge cases of :mod:`skfedgp.async_dgp`: experts without data, parameters
changed with ``set_params`` between ``partial_fit`` calls, and input checks
of the public ``aggregate`` and ``InformationSet``."""

import re
import warnings

import numpy as np
import pytest

from skfedgp import AsyncDGPRegressor
from skfedgp.async_dgp import AGGREGATIONS, InformationSet, _Expert, aggregate
from skfedgp.kernels import se_ard


def _data(rng, n=40):
    X = rng.uniform(0, 10, (n, 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return X, y


def _fixed(**kw):
    base = dict(lengthscale=[1.5, 4.0], variance=1.5, noise_variance=0.01,
                optimize_hyperparameters=False, random_state=0)
    base.update(kw)
    return AsyncDGPRegressor(**base)


# --------------------------------------------------------------------------
# experts holding no data
# --------------------------------------------------------------------------


def test_empty_experts_are_left_out_of_every_rule(rng):
    """40 points all in expert 0 of 4: the three empty experts only predict
    the prior, so every rule must give the one-expert prediction (MoE used to
    average the prior in: R^2 0.44 instead of 0.995, std 77x too large)."""
    X, y = _data(rng)
    Xt = rng.uniform(0, 10, (50, 2))
    for rule in AGGREGATIONS:
        one = _fixed(n_experts=1, aggregation=rule).fit(X, y)
        with pytest.warns(UserWarning, match=r"3 of 4 experts received no data \(groups"):
            four = _fixed(n_experts=4, aggregation=rule).fit(X, y, groups=np.zeros(40, int))
        m1, s1 = one.predict(Xt, return_std=True)
        m4, s4 = four.predict(Xt, return_std=True)
        np.testing.assert_allclose(m4, m1, rtol=1e-10, atol=1e-12, err_msg=rule)
        np.testing.assert_allclose(s4, s1, rtol=1e-10, atol=1e-12, err_msg=rule)
        assert four.beta_ == pytest.approx(one.beta_)
    # the experts' own predictions are still all there (the empty ones: the prior)
    mu, var = four.predict_experts(Xt)
    assert mu.shape == (50, 4)
    np.testing.assert_allclose(mu[:, 1:], four.prior_mean_)
    np.testing.assert_allclose(var[:, 1:], four.variance_)


def test_more_experts_than_samples_warns_and_aggregates_experts_with_data(rng):
    X, y = _data(rng, n=5)
    for rule in ("moe", "gpoe", "bcm"):
        with pytest.warns(UserWarning, match=r"of 50 experts received no data "
                                             r"\(n_experts=50 > n_samples=5\)"):
            est = _fixed(n_experts=50, aggregation=rule).fit(X, y)
        full = est.n_points_per_expert_ > 0
        assert 1 <= full.sum() <= 5
        mu, var = est.predict_experts(X)
        m, v = aggregate(mu[:, full], var[:, full], est.variance_, rule, est.prior_mean_)
        mean, std = est.predict(X, return_std=True)
        np.testing.assert_allclose(mean, m)
        np.testing.assert_allclose(std, np.sqrt(v))
    # no warning when every expert holds data
    X, y = _data(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fixed(n_experts=4, partition="sequential").fit(X, y)


def test_partial_fit_stream_with_an_empty_expert_ignores_it(rng):
    """A stream that has not reached expert 1 and 2 yet predicts as expert 0 alone."""
    X, y = _data(rng)
    Xt = rng.uniform(0, 10, (30, 2))
    for rule in ("moe", "gpoe"):
        one = _fixed(n_experts=1, aggregation=rule)
        three = _fixed(n_experts=3, aggregation=rule)
        for a, b in ((0, 20), (20, 40)):
            one.partial_fit(X[a:b], y[a:b])
            three.partial_fit(X[a:b], y[a:b], groups=np.zeros(b - a, int))
        assert three.n_points_per_expert_.tolist() == [40, 0, 0]
        m1, s1 = one.predict(Xt, return_std=True)
        m3, s3 = three.predict(Xt, return_std=True)
        np.testing.assert_allclose(m3, m1, rtol=1e-10)
        np.testing.assert_allclose(s3, s1, rtol=1e-10)


# --------------------------------------------------------------------------
# set_params between partial_fit calls
# --------------------------------------------------------------------------


def test_partial_fit_after_n_experts_changed_raises(rng):
    X, y = _data(rng)
    est = _fixed(n_experts=4).fit(X, y)
    before = est.n_points_per_expert_.copy()
    est.set_params(n_experts=8)
    msg = re.escape("n_experts=8 changed since the model was fitted with 4 experts")
    for kw in ({}, {"groups": np.arange(40) % 8}):
        with pytest.raises(ValueError, match=msg):
            est.partial_fit(X, y, **kw)
    np.testing.assert_array_equal(est.n_points_per_expert_, before)
    est.set_params(n_experts=4)  # set back: streaming goes on
    est.partial_fit(X[:4], y[:4])
    assert est.n_points_per_expert_.sum() == before.sum() + 4


def test_window_changed_with_set_params_applies_at_next_partial_fit(rng, monkeypatch):
    X, y = _data(rng)
    g = np.arange(40) % 2
    est = _fixed(n_experts=2).partial_fit(X[:20], y[:20], groups=g[:20])
    assert est.n_points_per_expert_.tolist() == [10, 10]
    est.set_params(max_points_per_expert=3)

    # a chunk that fails is undone, window shrink included
    calls = []

    def failing_add(self, x, yy):
        calls.append(1)
        raise np.linalg.LinAlgError("boom")

    with monkeypatch.context() as mp:
        mp.setattr(_Expert, "add", failing_add)
        with pytest.raises(np.linalg.LinAlgError):
            est.partial_fit(X[20:22], y[20:22], groups=g[20:22])
    assert calls
    assert [e.n for e in est.experts_] == [10, 10]
    for i, e in enumerate(est.experts_):
        np.testing.assert_array_equal(e.X[:10], X[:20][g[:20] == i])

    est.partial_fit(X[20:], y[20:], groups=g[20:])
    assert est.n_points_per_expert_.tolist() == [3, 3]
    ref = _fixed(n_experts=2, max_points_per_expert=3).fit(X, y, groups=g)
    for i, e in enumerate(est.experts_):
        Xi = X[g == i][-3:]
        np.testing.assert_array_equal(e.X[:3], Xi)
        np.testing.assert_array_equal(e.y[:3], y[g == i][-3:])
        K = se_ard(Xi, Xi, e.ell, e.sf2) + e.sn2 * np.eye(3)
        np.testing.assert_allclose(e.L[:3, :3], np.linalg.cholesky(K), atol=1e-10)
    Xt = rng.uniform(0, 10, (20, 2))
    # same experts; only the running prior mean (all 40 targets) is shared by both
    np.testing.assert_allclose(est.predict(Xt), ref.predict(Xt), rtol=1e-8, atol=1e-10)

    # the window shrinks also when the chunk does not touch the expert
    est.set_params(max_points_per_expert=1)
    est.partial_fit(X[:1], y[:1], groups=[0])
    assert est.n_points_per_expert_.tolist() == [1, 1]
    np.testing.assert_array_equal(est.experts_[1].X[:1], X[g == 1][-1:])


# --------------------------------------------------------------------------
# aggregate and InformationSet input checks
# --------------------------------------------------------------------------

MU = np.array([[1.0, 2.0]])
VAR = np.array([[0.5, 0.25]])


@pytest.mark.parametrize(
    "args, match",
    [
        ((MU, VAR, 1.0, "async"), r"aggregate\(\); it takes one of \('moe', 'poe', 'gpoe', "
                                  r"'bcm', 'rbcm'\).*InformationSet"),
        ((MU, VAR, 0.0, "rbcm"), "prior_var must be a finite positive number"),
        ((MU, VAR, -1.0, "poe"), "prior_var must be a finite positive number"),
        ((MU, VAR, np.nan, "poe"), "prior_var must be a finite positive number"),
        ((MU, -VAR, 1.0, "poe"), "var must be finite and positive"),
        ((MU, 0 * VAR, 1.0, "poe"), "var must be finite and positive"),
        ((MU, 4 * VAR, 1.0, "poe"), "var exceeds prior_var"),
        ((np.array([[np.nan, 1.0]]), VAR, 1.0, "poe"), "mu contains NaN"),
        ((np.zeros((1, 0)), np.zeros((1, 0)), 1.0, "poe"), "at least one expert"),
        ((np.array([1.0, 2.0]), np.array([0.5, 0.2]), 1.0, "poe"),
         r"mu must be 2-D of shape \(n_queries, n_experts\), got shape \(2,\)"),
        ((MU, np.array([[0.5, 0.2, 0.1]]), 1.0, "poe"), "mu and var must have the same shape"),
        ((MU, VAR, 1.0, "poe", np.nan), "prior_mean must be a finite number"),
    ],
)
def test_aggregate_rejects_bad_input_by_name(args, match):
    with pytest.raises(ValueError, match=match):
        aggregate(*args)
    # round-off above the prior variance (sigma**2 of sigma = sqrt(var)) is accepted
    m, v = aggregate(MU, np.array([[1.0 + 1e-12, 1.0]]), 1.0, "bcm")
    assert np.all(np.isfinite(m)) and v[0] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(max_info=0), "max_info must be an integer >= 1"),
        (dict(max_info=2.5), "max_info must be an integer >= 1"),
        (dict(beta=np.nan), "beta must be a finite positive number"),
        (dict(beta=0.0), "beta must be a finite positive number"),
        (dict(sigma_f=-1.0), "sigma_f must be a finite positive number"),
        (dict(lipschitz=-1.0), "lipschitz must be a finite number >= 0"),
        (dict(lengthscale=[1.0, 0.0]), "lengthscale must be positive"),
        (dict(convention="matlab"), "unknown convention"),
    ],
)
def test_information_set_rejects_bad_parameters_by_name(kw, match):
    args = dict(max_info=3, beta=1.0, sigma_f=1.0, lipschitz=1.0, lengthscale=1.0)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        InformationSet(**args)


_GOOD_ITEM = (np.array([0.0, 0.05]), 2.0, 0.1)


@pytest.mark.parametrize("convention", ["paper", "gpgym"])
@pytest.mark.parametrize(
    "bad, match",
    [
        ((np.array([0.0, 0.0]), "abc", 0.1), r"mu_k of item 1 must be a finite real number"),
        ((np.array([0.0, 0.0]), np.nan, 0.1), r"mu_k of item 1 must be a finite real number"),
        ((np.array([0.0, 0.0]), True, 0.1), r"mu_k of item 1 must be a finite real number"),
        ((np.array([0.0, 0.0]), 2.0, None), r"sigma_k of item 1 must be a finite real number"),
        ((np.array([0.0, 0.0]), 2.0, -0.1), r"sigma_k of item 1 must be >= 0"),
        ((np.array([0.0]), 2.0, 0.1), r"x_k of item 1 must be a finite array of shape \(2,\)"),
        ((np.array([0.0, np.inf]), 2.0, 0.1), r"x_k of item 1 must be a finite array"),
        ((np.array([0.0, 0.0]), 2.0), r"item 1 of new must be a triple"),
    ],
)
def test_information_set_rejected_update_leaves_the_set_unchanged(convention, bad, match):
    """A bad item (a string mu_k, an input of the wrong length for d = 2, NaN)
    used to be stored in part before the error, or silently: lists of different
    lengths, after which every aggregate raised (or NaN means). Every item is
    now checked first, and a rejected update changes nothing."""
    s = InformationSet(3, beta=2.0, sigma_f=1.0, lipschitz=1.0, lengthscale=[1.0, 1.0],
                       convention=convention)
    x = np.zeros(2)
    s.update(x, [(np.array([0.1, 0.0]), 1.0, 0.1)])
    before = (s.aggregate(x), [a.tolist() for a in s.x], list(s.mu), list(s.sigma))
    with pytest.raises(ValueError, match=match):
        s.update(x, iter([_GOOD_ITEM, bad]))  # the good item first: not stored either
    assert (s.aggregate(x), [a.tolist() for a in s.x], list(s.mu), list(s.sigma)) == before
    assert len(s.x) == len(s.mu) == len(s.sigma) == 1
    # a current input of another length than the stored ones is named too
    with pytest.raises(ValueError, match="x has 3 entries but the stored inputs have 2"):
        s.update(np.zeros(3), [])
    assert len(s) == 1
    s.update(x, [_GOOD_ITEM])  # the set still works
    assert s.mu == [1.0, 2.0]


# --------------------------------------------------------------------------
# inputs whose squares overflow float64
# --------------------------------------------------------------------------


@pytest.mark.parametrize("unit", [1e160, 1e200])
def test_inputs_whose_squares_overflow_fit_as_in_ordinary_units(rng, unit):
    """Inputs of magnitude 1e160 or more are finite, but their squares are
    not: the default lengthscales (each input's spread) and the information
    set's distances overflowed, and fit failed with "lengthscale must be
    finite and positive". Fitted with learned hyperparameters, the same data
    in units 1 and ``unit`` must give the same predictions (the kernel
    depends on the inputs only through distances in lengthscale units)."""
    X, y = _data(rng)
    Xt = rng.uniform(0, 10, (30, 2))
    kw = dict(n_experts=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow on the way
        ref = AsyncDGPRegressor(**kw).fit(X, y)
        big = AsyncDGPRegressor(**kw).fit(X * unit, y)
        m0, s0 = ref.predict(Xt, return_std=True)
        m1, s1 = big.predict(Xt * unit, return_std=True)
    assert np.all(np.isfinite(m1)) and np.all(s1 > 0)
    np.testing.assert_allclose(m1, m0, atol=0.05 * np.std(y))
    np.testing.assert_allclose(s1, s0, rtol=0.1, atol=0.01 * np.std(y))
    # the information set's distance, in both conventions
    for conv in ("paper", "gpgym"):
        info = InformationSet(max_info=3, beta=2.0, sigma_f=1.0, lipschitz=1.0,
                              lengthscale=unit, convention=conv)
        d = info._dist(np.array([[0.0, 0.0], [3 * unit, 4 * unit]]), np.zeros(2))
        expect = 5.0 if conv == "gpgym" else 5.0 * unit
        np.testing.assert_allclose(d, [0.0, expect], rtol=1e-12)


@pytest.mark.parametrize("beta", [1e-300, 1e200, 1e300])
def test_extreme_beta_gives_the_same_prediction(rng, beta):
    """beta cancels from the no-delay async rule, but its squares overflowed
    (or underflowed) there and in the information set: predictions were NaN
    with no error. Both now work in units of the bound beta sigma_f."""
    X, y = _data(rng)
    kw = dict(n_experts=2, random_state=0)
    ref = AsyncDGPRegressor(beta=1.0, **kw).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        est = AsyncDGPRegressor(beta=beta, **kw).fit(X, y)
        m, s = est.predict(X[:5], return_std=True)
    m0, s0 = ref.predict(X[:5], return_std=True)
    np.testing.assert_allclose(m, m0, rtol=1e-10)
    np.testing.assert_allclose(s, s0, rtol=1e-10)
    info = InformationSet(max_info=3, beta=beta, sigma_f=1.0, lipschitz=0.0, lengthscale=1.0)
    info.update(np.zeros(1), [(np.zeros(1), 0.5, 0.1), (np.zeros(1), 0.7, 0.2)])
    mean, std = info.aggregate(np.zeros(1))
    assert np.isfinite(mean) and np.isfinite(std) and std > 0


@pytest.mark.parametrize("kw, match", [
    (dict(rkhs_bound=None), "rkhs_bound must be a finite positive number, got None"),
    (dict(rkhs_bound=1e308), r"constants overflow float64.*use a smaller rkhs_bound"),
    (dict(beta=1e308), r"constants overflow float64.*use a smaller beta"),
    # L_f overflows with beta given: rkhs_bound is named (it said "beta")
    (dict(rkhs_bound=1e308, beta=1.0), r"constants overflow float64.*use a smaller rkhs_bound"),
])
def test_bad_rkhs_bound_is_named_and_leaves_the_fit(rng, kw, match):
    """rkhs_bound=None raised a bare TypeError from the arithmetic, and a
    bound whose square overflows an OverflowError; a beta with beta sigma_f
    beyond float64 is named too. A failed refit keeps the previous fit."""
    X, y = _data(rng)
    est = AsyncDGPRegressor(n_experts=2, random_state=0).fit(X, y)
    before = est.predict(X[:5])
    est.set_params(**kw)
    with pytest.raises(ValueError, match=match):
        est.fit(X, y)
    with pytest.raises(ValueError, match=match):
        est.partial_fit(X, y)
    est.set_params(rkhs_bound=1.0, beta=None)
    np.testing.assert_array_equal(est.predict(X[:5]), before)


def test_given_lengthscale_outside_the_learned_range_is_refused(rng):
    """lengthscale=1e308 was clipped to the upper bound of the learned range,
    where the kernel is flat and the search cannot move: a fit that learned
    nothing, without a word. A given starting value outside the range is now
    refused by name (as the federated regressor does); with fixed
    hyperparameters it is used as given."""
    X, y = _data(rng)
    with pytest.raises(ValueError, match=r"lengthscale=1e\+308 lies outside the range"):
        AsyncDGPRegressor(n_experts=2, lengthscale=1e308, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match=r"lies outside the range"):
        AsyncDGPRegressor(n_experts=2, lengthscale=[1.0, 1e-9], random_state=0).fit(X, y)
    est = AsyncDGPRegressor(n_experts=2, lengthscale=1e308, optimize_hyperparameters=False,
                            variance=1.0, noise_variance=0.1, random_state=0).fit(X, y)
    np.testing.assert_array_equal(est.lengthscale_, [1e308, 1e308])
    AsyncDGPRegressor(n_experts=2, lengthscale=[1.5, 4.0], random_state=0).fit(X, y)


def test_beta_zero_warning_names_cause_and_remedy():
    # streaming in chunks of 10 rows: the first chunk's hyperparameters (noise
    # fitted tiny on 10 points) are kept, and Lemma 1 then gives beta = 0; the
    # warning said only "Lemma 1 gives beta = 0; using beta = 1"
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (40, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(40)
    est = AsyncDGPRegressor(n_experts=2, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(4):
            est.partial_fit(X[10 * k:10 * (k + 1)], y[10 * k:10 * (k + 1)])
    msgs = [str(w.message) for w in caught if "Lemma 1 gives beta = 0" in str(w.message)]
    assert msgs and est.beta_ == 1.0
    assert all("rkhs_bound" in m and "partial_fit" in m and "explicit beta" in m for m in msgs)
