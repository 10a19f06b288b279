"""Tests of :mod:`skfedgp.async_dgp`: aggregation rules against hand
computations, one expert against scikit-learn's exact GP, the Numba
incremental Cholesky against ``numpy.linalg.cholesky``, ``partial_fit``
against ``fit``, analytic against finite-difference gradients, scikit-learn's
estimator checks and bad input."""

import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

from skfedgp import AsyncDGPRegressor
from skfedgp.async_dgp import (
    AGGREGATIONS,
    InformationSet,
    _Expert,
    _expert_nlml,
    aggregate,
    chol_append,
    chol_delete_first,
)


def _data(rng, n=60, d=2):
    X = rng.uniform(-2, 2, (n, d))
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.standard_normal(n)
    return X, y


def _fixed(**kw):
    base = dict(lengthscale=[0.8, 1.3], variance=1.5, noise_variance=0.02,
                optimize_hyperparameters=False, random_state=0)
    base.update(kw)
    return AsyncDGPRegressor(**base)


# --------------------------------------------------------------------------
# aggregation rules: hand computations on 2-3 experts
# --------------------------------------------------------------------------

MU = np.array([[1.0, 2.0, -0.5]])
VAR = np.array([[0.5, 0.25, 1.0]])
SF2 = 2.0


def test_moe_by_hand():
    m, v = aggregate(MU, VAR, SF2, "moe")
    assert m[0] == pytest.approx((1 + 2 - 0.5) / 3)
    second = (0.5 + 1 + 0.25 + 4 + 1 + 0.25) / 3
    assert v[0] == pytest.approx(second - m[0] ** 2)


def test_poe_and_gpoe_by_hand():
    m, v = aggregate(MU, VAR, SF2, "poe")
    prec = 2 + 4 + 1
    assert v[0] == pytest.approx(1 / prec)
    assert m[0] == pytest.approx((2 * 1 + 4 * 2 + 1 * -0.5) / prec)
    mg, vg = aggregate(MU, VAR, SF2, "gpoe")
    assert vg[0] == pytest.approx(3 / prec)  # weights 1/3
    assert mg[0] == pytest.approx(m[0])


def test_bcm_by_hand():
    m, v = aggregate(MU, VAR, SF2, "bcm")
    prec = 2 + 4 + 1 + (1 - 3) / 2.0
    assert v[0] == pytest.approx(1 / prec)
    assert m[0] == pytest.approx((2 * 1 + 4 * 2 - 0.5) / prec)


def test_rbcm_by_hand():
    mu, var = MU[:, :2], VAR[:, :2]
    m, v = aggregate(mu, var, SF2, "rbcm")
    b1, b2 = 0.5 * np.log(2 / 0.5), 0.5 * np.log(2 / 0.25)
    prec = b1 / 0.5 + b2 / 0.25 + (1 - b1 - b2) / 2
    assert v[0] == pytest.approx(1 / prec)
    assert m[0] == pytest.approx((b1 * 1 / 0.5 + b2 * 2 / 0.25) / prec)


def test_prior_mean_shifts_bcm_family():
    for rule in ("poe", "gpoe", "bcm", "rbcm"):
        m0, v0 = aggregate(MU, VAR, SF2, rule)
        m1, v1 = aggregate(MU + 3.0, VAR, SF2, rule, prior_mean=3.0)
        np.testing.assert_allclose(m1, m0 + 3.0)
        np.testing.assert_allclose(v1, v0)


def test_information_set_by_hand_paper():
    # two entries, one at distance 0.5, one at distance 0; L_f = 1, beta = 2, sigma_f = 1
    s = InformationSet(3, beta=2.0, sigma_f=1.0, lipschitz=1.0, lengthscale=[1.0])
    x = np.array([0.0])
    s.update(x, [(np.array([0.5]), 1.0, 0.1), (np.array([0.0]), 3.0, 0.3)])
    eta = np.array([0.5 + 0.2, 0.6])
    rho = np.log(2.0 / eta)
    w = rho / eta**2
    w0 = (1 - rho.sum()) / 4.0
    mean, std = s.aggregate(x, prior_mean=0.5)
    assert mean == pytest.approx((w @ [1.0, 3.0] + w0 * 0.5) / (w.sum() + w0))
    assert std == pytest.approx(1 / np.sqrt(w.sum() + w0) / 2.0)
    # a far entry (eta > beta sigma_f) is not admitted; the cap keeps the lowest eta
    s2 = InformationSet(1, beta=2.0, sigma_f=1.0, lipschitz=1.0, lengthscale=[1.0])
    s2.update(x, [(np.array([5.0]), 9.0, 0.1), (np.array([0.5]), 1.0, 0.1),
                  (np.array([0.0]), 3.0, 0.3)])
    assert s2.mu == [3.0]
    # moving away prunes it: at x = 1.5, eta = 1.5 + 0.6 > 2
    s2.update(np.array([1.5]), [])
    assert len(s2) == 0
    assert s2.aggregate(np.array([1.5]), prior_mean=0.7) == (0.7, 1.0)


def test_information_set_gpgym_replacement():
    s = InformationSet(1, beta=2.0, sigma_f=1.0, lipschitz=1.0, lengthscale=[0.5],
                       convention="gpgym")
    x = np.array([0.0])
    # distance in lengthscale units: 0.5 / 0.5 = 1; admitted iff 1 < 2 (1 - 0.4) = 1.2
    s.update(x, [(np.array([0.5]), 1.0, 0.4)])
    assert s.mu == [1.0]
    s.update(x, [(np.array([0.5]), 2.0, 0.45)])  # 1 < 1.1 admitted but worse: no swap
    assert s.mu == [1.0]
    s.update(x, [(np.array([0.0]), 5.0, 0.5)])  # eta 1.0 < 1.8: replaces
    assert s.mu == [5.0]
    s.update(x, [(np.array([1.0]), 7.0, 0.0)])  # 2 < 2 is false: not admitted
    assert s.mu == [5.0]


def test_async_predict_is_rbcm_without_delay(rng):
    X, y = _data(rng)
    a = _fixed(n_experts=3, aggregation="async").fit(X, y)
    r = _fixed(n_experts=3, aggregation="rbcm").fit(X, y)
    ma, sa = a.predict(X[:7], return_std=True)
    mr, sr = r.predict(X[:7], return_std=True)
    # rho = log(sf / s) = rBCM's 0.5 log(sf^2 / s^2) (all positive for exact GPs)
    np.testing.assert_allclose(ma, mr, rtol=1e-10)
    np.testing.assert_allclose(sa, sr, rtol=1e-10)


# --------------------------------------------------------------------------
# one expert, no delay: the exact GP
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rule", AGGREGATIONS)
def test_one_expert_equals_exact_gp(rng, rule):
    X, y = _data(rng, n=40)
    Xs = rng.uniform(-2, 2, (15, 2))
    est = _fixed(n_experts=1, aggregation=rule).fit(X, y)
    k = ConstantKernel(1.5, "fixed") * RBF([0.8, 1.3], "fixed")
    ref = GaussianProcessRegressor(k, alpha=0.02, optimizer=None).fit(X, y - y.mean())
    mr, sr = ref.predict(Xs, return_std=True)
    mr = mr + y.mean()
    # the expert itself (what every rule combines)
    mu, var = est.predict_experts(Xs)
    np.testing.assert_allclose(mu[:, 0], mr, atol=1e-8)
    np.testing.assert_allclose(np.sqrt(var[:, 0]), sr, atol=1e-8)
    m, s = est.predict(Xs, return_std=True)
    if rule in ("moe", "poe", "gpoe", "bcm"):
        np.testing.assert_allclose(m, mr, atol=1e-8)
        np.testing.assert_allclose(s, sr, atol=1e-8)
    else:
        # rBCM and async weight the expert by beta = log(sf / s) and the prior by
        # 1 - beta (Deisenroth & Ng 2015, eq. 20): exact only where beta = 1
        b = np.log(np.sqrt(1.5) / sr)
        prec = b / sr**2 + (1 - b) / 1.5
        np.testing.assert_allclose(s, 1 / np.sqrt(prec), rtol=1e-8)
        np.testing.assert_allclose(m, y.mean() + (b * (mr - y.mean()) / sr**2) / prec, atol=1e-8)


# --------------------------------------------------------------------------
# incremental Cholesky
# --------------------------------------------------------------------------


def test_incremental_cholesky_matches_numpy_after_1000_appends_and_window(rng):
    d, cap = 3, 300
    ell, sf2, sn2 = np.array([0.7, 1.0, 1.4]), 1.3, 0.05
    X = rng.standard_normal((1000, d))
    L = np.zeros((cap, cap))
    Xb = np.zeros((cap, d))
    yb = np.zeros(cap)
    work = np.zeros(cap)
    n = 0
    for k in range(1000):
        if n == cap:
            chol_delete_first(L, Xb, yb, n, work)
            n -= 1
        assert chol_append(L, Xb, n, X[k], 1 / ell, sf2, sn2, work)
        yb[n] = k
        n += 1
    Xw = X[-cap:]
    diff = (Xw[:, None, :] - Xw[None, :, :]) / ell
    K = sf2 * np.exp(-0.5 * (diff**2).sum(-1)) + sn2 * np.eye(cap)
    np.testing.assert_allclose(L, np.linalg.cholesky(K), atol=1e-8)
    np.testing.assert_array_equal(Xb, Xw)
    np.testing.assert_array_equal(yb, np.arange(700, 1000))


def test_incremental_cholesky_refuses_n_outside_the_buffers(rng):
    """chol_append with n = cap wrote a row past the buffer and returned True;
    chol_delete_first with n = 0 zeroed the buffer's last row. Both now raise
    before the compiled kernel runs. The buffers are views of larger arrays, so
    a write past their end lands in a guard row that must stay zero."""
    d, cap = 2, 4
    ell = np.array([0.7, 1.3])
    Lg, Xg, ig = np.zeros((cap + 1, cap)), np.zeros((cap + 1, d)), np.ones(d + 1)
    L, Xb, inv_ell = Lg[:cap], Xg[:cap], ig[:d] / ell
    yb, work = np.arange(cap, dtype=float), np.zeros(cap)
    for n in range(cap):
        assert chol_append(L, Xb, n, rng.standard_normal(d), inv_ell, 1.3, 0.05, work)
    saved = Lg.copy(), Xg.copy(), yb.copy()
    with pytest.raises(ValueError, match=r"n \(the number of stored points\) must be an integer "
                                         r"in \[0, 3\].*got 4 \(at n = cap the buffers are full"):
        chol_append(L, Xb, cap, np.ones(d), inv_ell, 1.3, 0.05, work)
    with pytest.raises(ValueError, match=r"must be an integer in \[0, 3\].*got -1"):
        chol_append(L, Xb, -1, np.ones(d), inv_ell, 1.3, 0.05, work)
    with pytest.raises(ValueError, match=r"x and inv_ell must be of shape \(d,\) = \(2,\)"):
        chol_append(L, Xb, 1, np.ones(d + 1), ig / 1.0, 1.3, 0.05, work)
    with pytest.raises(ValueError, match=r"must be an integer in \[1, 4\].*got 0"):
        chol_delete_first(L, Xb, yb, 0, work)
    with pytest.raises(ValueError, match=r"yb must be of shape \(cap,\) = \(4,\)"):
        chol_delete_first(L, Xb, yb[:2], 2, work)
    for got, want in zip((Lg, Xg, yb), saved):
        np.testing.assert_array_equal(got, want)  # nothing written, guard rows still zero
    chol_delete_first(L, Xb, yb, cap, work)  # the full range still works
    np.testing.assert_array_equal(yb[: cap - 1], [1.0, 2.0, 3.0])


def test_partial_fit_in_chunks_equals_fit(rng):
    X, y = _data(rng, n=90)
    a = _fixed(n_experts=3).fit(X, y)
    b = _fixed(n_experts=3)
    for chunk in np.array_split(np.arange(90), 4):
        b.partial_fit(X[chunk], y[chunk])
    np.testing.assert_array_equal(a.n_points_per_expert_, b.n_points_per_expert_)
    Xs = rng.uniform(-2, 2, (10, 2))
    for ea, eb in zip(a.experts_, b.experts_):
        np.testing.assert_allclose(eb.L[: eb.n, : eb.n], ea.L[: ea.n, : ea.n], atol=1e-10)
    for rule in AGGREGATIONS:
        a.set_params(aggregation=rule), b.set_params(aggregation=rule)
        np.testing.assert_allclose(b.predict(Xs), a.predict(Xs), atol=1e-8)


def test_partial_fit_window_equals_fit_on_latest_points(rng):
    X, y = _data(rng, n=80)
    g = np.arange(80) % 2
    b = _fixed(n_experts=2, max_points_per_expert=15)
    b.partial_fit(X[:30], y[:30], groups=g[:30]).partial_fit(X[30:], y[30:], groups=g[30:])
    for i, e in enumerate(b.experts_):
        ref = _Expert(2, [0.8, 1.3], 1.5, 0.02)
        Xi, yi = X[g == i][-15:], y[g == i][-15:]
        ref.set_batch(Xi, yi)
        np.testing.assert_allclose(e.L[:15, :15], ref.L[:15, :15], atol=1e-10)
        np.testing.assert_array_equal(e.y[:15], yi)
    assert b.prior_mean_ == pytest.approx(y.mean())


# --------------------------------------------------------------------------
# hyperparameters
# --------------------------------------------------------------------------


def test_nlml_gradient_finite_differences(rng, numgrad):
    X, y = _data(rng, n=25, d=3)
    theta = np.log(np.array([0.9, 1.2, 2.0, 1.4, 0.05]))
    g = _expert_nlml(X, y, theta)[1]
    np.testing.assert_allclose(g, numgrad(lambda t: _expert_nlml(X, y, t)[0], theta),
                               rtol=1e-5, atol=1e-6)


def test_nlml_matches_sklearn(rng):
    X, y = _data(rng, n=30)
    theta = np.log(np.array([0.8, 1.3, 1.5, 0.02]))
    k = ConstantKernel(1.5) * RBF([0.8, 1.3])
    ref = GaussianProcessRegressor(k, alpha=0.02, optimizer=None).fit(X, y)
    assert _expert_nlml(X, y, theta)[0] == pytest.approx(-ref.log_marginal_likelihood_value_)


def test_optimisation_improves_summed_likelihood(rng):
    X, y = _data(rng, n=80)
    est = AsyncDGPRegressor(n_experts=2, random_state=0, n_jobs=2).fit(X, y)
    # objective at the initial and at the learned hyperparameters
    init = _fixed(n_experts=2, lengthscale=X.std(0), variance=1.0, noise_variance=0.1)
    init.fit(X, y)
    def total(m):
        th = np.log(np.concatenate([m.lengthscale_, [m.variance_, m.noise_variance_]]))
        return sum(_expert_nlml(e.X[: e.n], e.y[: e.n] - m.prior_mean_, th)[0] for e in m.experts_)
    assert total(est) < total(init) - 1.0


# --------------------------------------------------------------------------
# scikit-learn compatibility and bad input
# --------------------------------------------------------------------------


@parametrize_with_checks(
    [AsyncDGPRegressor(random_state=0), AsyncDGPRegressor(aggregation="bcm", random_state=0)]
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_bad_input(rng):
    X, y = _data(rng, n=30)
    est = _fixed().fit(X, y)
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(rng.standard_normal((5, 3)), np.zeros(5))
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _fixed().partial_fit(Xn, y)
    with pytest.raises(ValueError, match="NaN"):
        est.partial_fit(Xn, y)
    with pytest.raises(ValueError, match="max_info"):
        _fixed(max_info=0).fit(X, y)
    with pytest.raises(ValueError, match="unknown aggregation"):
        _fixed(aggregation="median").fit(X, y)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(MU, VAR, SF2, "median")
    with pytest.raises(ValueError, match="convention"):
        _fixed(convention="matlab").fit(X, y)
    with pytest.raises(ValueError, match="groups"):
        _fixed(n_experts=2).fit(X, y, groups=np.full(30, 5))
    with pytest.raises(ValueError, match="lengthscale"):
        _fixed(lengthscale=[1.0, -1.0]).fit(X, y)


def test_predict_before_fit_is_not_fitted_whatever_the_parameters():
    """An unfitted model with a bad parameter (set before fit) raised the
    parameter's ValueError from predict, not NotFittedError."""
    est = AsyncDGPRegressor(aggregation="median")
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((2, 2)))
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((2, 2)), return_std=True)


def test_one_sample_cannot_learn_hyperparameters(rng):
    """One row used to give variance = noise = 1e-5 and a confident prediction
    five lengthscales away; learning needs two rows, fixed values do not."""
    X, y = _data(rng, n=30)
    with pytest.raises(ValueError, match="at least 2 samples, got n_samples = 1"):
        AsyncDGPRegressor(random_state=0).fit(X[:1], y[:1])
    with pytest.raises(ValueError, match="at least 2 samples, got n_samples = 1"):
        AsyncDGPRegressor(random_state=0).partial_fit(X[:1], y[:1])
    est = _fixed().partial_fit(X[:1], y[:1])  # given hyperparameters: streaming may start
    est.partial_fit(X[1:], y[1:])
    assert np.all(np.isfinite(est.predict(X)))


def test_string_targets_are_refused_by_name():
    X = np.arange(10.0)[:, None]
    with pytest.raises(ValueError, match="y must hold numbers"):
        AsyncDGPRegressor().fit(X, np.array(list("abcdefghij")))
    with pytest.raises(ValueError, match="y must hold numbers"):
        AsyncDGPRegressor().partial_fit(X, np.array(list("abcdefghij"), dtype=object))


@pytest.mark.parametrize("c", [1e-3, 1e3, 1e6])
def test_fit_does_not_depend_on_target_units(c):
    """Learned hyperparameters are optimised on standardised targets: scaling y
    by c scales the predictive mean and std by c (before, targets far from unit
    scale hit the fixed log-bounds: a constant prediction at c = 1e3)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (60, 1))
    y = np.sin(2 * X[:, 0]) + 0.05 * rng.standard_normal(60)
    Xt = np.linspace(0, 5, 7)[:, None]
    m1, s1 = AsyncDGPRegressor(n_experts=3, random_state=0).fit(X, y).predict(Xt, return_std=True)
    est = AsyncDGPRegressor(n_experts=3, random_state=0).fit(X, c * y)
    mc, sc = est.predict(Xt, return_std=True)
    np.testing.assert_allclose(mc / c, m1, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(sc / c, s1, rtol=1e-5)
    assert est.variance_ / c**2 > 0.05  # the signal is not lost


@pytest.mark.parametrize("sx", [1e-6, 1e6])
def test_fit_does_not_depend_on_the_inputs_units(sx):
    """The lengthscales' bounds follow the inputs' spread: inputs in units of
    1e-6 used to pin the lengthscale at its bound (the model predicted the
    mean, 97 % of points beyond 3 std), 1e6 likewise at the other bound."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (120, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(120)
    Xt = rng.uniform(0, 10, (50, 1))
    a = AsyncDGPRegressor(random_state=0).fit(X, y)
    b = AsyncDGPRegressor(random_state=0).fit(X * sx, y)
    np.testing.assert_allclose(b.lengthscale_ / sx, a.lengthscale_, rtol=1e-5)
    ma, sa = a.predict(Xt, return_std=True)
    mb, sb = b.predict(Xt * sx, return_std=True)
    np.testing.assert_allclose(mb, ma, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sb, sa, rtol=1e-5)


@pytest.mark.parametrize("offset", [1e5, 1e7])
def test_expert_gradient_does_not_depend_on_where_the_inputs_are(offset):
    # the lengthscale gradient used the expanded square |x|^2 + |x'|^2 - 2 x.x',
    # which cancels far from the origin (at 1e7: -344 instead of -15.3)
    from skfedgp.async_dgp import _expert_nlml

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (40, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(40)
    theta = np.log([0.8, 2.0, 1.0, 0.05])
    f0, g0 = _expert_nlml(X, y, theta)
    f1, g1 = _expert_nlml(X + offset, y, theta)
    assert f1 == pytest.approx(f0, rel=1e-6)
    np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)
