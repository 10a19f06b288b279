"""The pilots' start from a grid of the profile likelihood.

:func:`skfedgp.federated.profile_log_marginal_likelihood` and
:func:`skfedgp.federated.profile_grid_start`: a pilot whose starts all
end in the smooth optimum of its marginal likelihood (a steep trend that
calls a small fast wiggle noise) also starts from the best grid point.
"""

import warnings

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp import federated as fed
from skfedgp.kernels import se_ard


def _trend_clients(seed, n_clients=5, n=50, n_test=100):
    """A steep linear trend plus a small fast wiggle, and a small smooth
    departure per client (noise sd 0.1): most clients' own pilots call the
    wiggle noise."""
    rng = np.random.default_rng(seed)
    X, y, g, Xt, ft, gt = [], [], [], [], [], []
    for i in range(n_clients):
        W = rng.normal(size=(200, 1))
        b = rng.uniform(0, 2 * np.pi, 200)
        a = 0.2 * rng.normal(size=200) * np.sqrt(2 / 200)

        def f(x, W=W, b=b, a=a):
            return 3 * x[:, 0] + 0.5 * np.sin(3 * x[:, 0]) + np.cos(x @ W.T + b) @ a

        xtr = rng.uniform(0, 10, (n, 1))
        xte = rng.uniform(0, 10, (n_test, 1))
        X.append(xtr)
        y.append(f(xtr) + 0.1 * rng.normal(size=n))
        g += [i] * n
        Xt.append(xte)
        ft.append(f(xte))
        rng.normal(size=n_test)  # (noisy test targets, not used)
        gt += [i] * n_test
    return (np.vstack(X), np.concatenate(y), np.array(g), np.vstack(Xt), np.concatenate(ft),
            np.array(gt))


def _lml(X, y, ell, variance, noise):
    K = se_ard(X, X, np.atleast_1d(ell), variance) + (noise + fed.PILOT_JITTER) * np.eye(len(y))
    sign, logdet = np.linalg.slogdet(K)
    assert sign > 0
    return float(-0.5 * y @ np.linalg.solve(K, y) - 0.5 * logdet
                 - 0.5 * len(y) * np.log(2 * np.pi))


@pytest.mark.parametrize("d, ratio", [(1, 0.05), (3, 1.0), (2, 1e-3)])
def test_profile_log_marginal_likelihood_is_the_maximum_over_the_scale(d, ratio):
    """Against the direct log density maximised over the scale numerically."""
    rng = np.random.default_rng(d)
    X = rng.normal(size=(40, d))
    y = np.sin(X.sum(1)) + 0.1 * rng.normal(size=40)
    y -= y.mean()
    ell = np.linspace(0.5, 2.0, d)
    got = fed.profile_log_marginal_likelihood(X, y, ell, ratio)
    res = minimize_scalar(lambda t: -_lml(X, y, ell, np.exp(t), ratio * np.exp(t)),
                          bounds=(-12, 8), method="bounded", options={"xatol": 1e-10})
    assert got == pytest.approx(-res.fun, abs=1e-6)
    # invariant to the units of y
    assert fed.profile_log_marginal_likelihood(X, 1e3 * y, ell, ratio) == pytest.approx(
        got - len(y) * np.log(1e3), abs=1e-6)


@pytest.mark.parametrize("seed", [0, 2])
def test_a_small_fast_wiggle_on_a_steep_trend_is_found(seed, monkeypatch):
    """Five clients of a steep trend plus a small fast wiggle: without the
    grid start every client's pilot called the wiggle noise (noise sd 0.33
    instead of 0.1), and the fit started from them could not leave that
    optimum (RMSE 3-7 times the pooled exact GP's). With it the default fit
    is as accurate as an exact GP on all the rows."""
    X, y, g, Xt, ft, gt = _trend_clients(seed)
    oh = (g[:, None] == np.arange(5)).astype(float)
    oht = (gt[:, None] == np.arange(5)).astype(float)
    k = ConstantKernel() * RBF(np.ones(6), (1e-2, 1e5)) + WhiteKernel(1e-2, (1e-9, 1e1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exact = GaussianProcessRegressor(k, normalize_y=True, n_restarts_optimizer=2,
                                         random_state=0).fit(np.hstack([X, oh]), y)
        rmse_exact = np.sqrt(np.mean((exact.predict(np.hstack([Xt, oht])) - ft) ** 2))
        est = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, groups=g)
        mu, sd = est.predict(Xt, groups=gt, return_std=True)
        rmse = np.sqrt(np.mean((mu - ft) ** 2))
        assert rmse < 1.2 * rmse_exact
        assert np.mean(np.abs(mu - ft) > 3 * sd) < 0.01
        # without the grid start the same fit stays in the smooth optimum
        monkeypatch.setattr(fed, "PILOT_GRID_START", False)
        alone = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, groups=g)
    rmse_alone = np.sqrt(np.mean((alone.predict(Xt, groups=gt) - ft) ** 2))
    assert rmse_alone > 2 * rmse


def test_the_grid_start_finds_the_wiggle_optimum_of_one_client(monkeypatch):
    """One client of the trend: the pilot from the grid's start has a larger
    log marginal likelihood than from the other starts, and the grid's best
    point is near the lengthscale it ends at."""
    X, y, g, *_ = _trend_clients(2)
    Xc, yc = X[g == 0] / 10.0, (y[g == 0] - y.mean()) / y.std()
    with_grid = fed.pilot_fit(Xc, yc, 0)
    monkeypatch.setattr(fed, "PILOT_GRID_START", False)
    without = fed.pilot_fit(Xc, yc, 0)
    assert np.sqrt(with_grid.noise_variance) * y.std() == pytest.approx(0.1, rel=0.3)
    assert np.sqrt(without.noise_variance) * y.std() > 0.25
    Xs = (Xc - Xc.mean()) / Xc.std()
    ell, ratio, value, scale = fed.profile_grid_start(Xs, yc - yc.mean())
    # the grid point is within a grid step (a factor of about 1.6) of the optimum
    assert 1 / 1.7 < with_grid.lengthscale[0] / Xc.std() / ell < 1.7
    assert ratio < 1e-2
    # the value and scale are the profile likelihood's at that point
    v, s = fed.profile_log_marginal_likelihood(Xs, yc - yc.mean(), np.array([ell]), ratio,
                                               return_scale=True)
    assert (value, scale) == (v, s)
    # and the grid's start is fitted only because it is above the other starts' fits
    assert value > fed.profile_log_marginal_likelihood(
        Xs, yc - yc.mean(), without.lengthscale / Xc.std(),
        without.noise_variance / without.variance)


def test_the_grid_start_is_not_fitted_where_the_other_starts_are_better(monkeypatch):
    """A smooth function with moderate noise: the other starts find the
    optimum, the grid's best point is below their fit, and no extra fit is
    made (the grid costs only its Cholesky factorisations)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (200, 2))
    y = np.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=200)
    y = (y - y.mean()) / y.std()
    calls = []
    real = fed._pilot_gp
    monkeypatch.setattr(fed, "_pilot_gp", lambda *a, **k: calls.append(1) or real(*a, **k))
    with_grid = fed.pilot_fit(X, y, 0)
    n_with = len(calls)
    monkeypatch.setattr(fed, "PILOT_GRID_START", False)
    del calls[:]
    without = fed.pilot_fit(X, y, 0)
    assert n_with == len(calls)
    np.testing.assert_array_equal(with_grid.lengthscale, without.lengthscale)


def test_a_winning_grid_start_in_two_inputs_ends_in_an_ard_fit(monkeypatch):
    """Two inputs, each a steep trend plus a fast wiggle of its own period
    (3 and 2 per unit: lengthscales in the ratio 1.5), 250 points, noise sd
    0.1. The pilot's own starts end in the smooth optimum that calls both
    wiggles noise (noise sd 0.51); the grid's best isotropic point starts a
    fit that finds them: noise sd about 0.1, a higher log marginal
    likelihood, and lengthscales of their own per input (the grid point is
    isotropic, the fit from it ARD), in about the truth's ratio."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (250, 2))
    y = (3 * X[:, 0] + 0.5 * np.sin(3 * X[:, 0]) + 2 * X[:, 1] + 0.5 * np.sin(2 * X[:, 1])
         + 0.1 * rng.normal(size=250))
    Xc, yc = X / 10.0, (y - y.mean()) / y.std()
    with_grid = fed.pilot_fit(Xc, yc, 0)
    monkeypatch.setattr(fed, "PILOT_GRID_START", False)
    without = fed.pilot_fit(Xc, yc, 0)
    assert np.sqrt(with_grid.noise_variance) * y.std() == pytest.approx(0.1, rel=0.3)
    assert np.sqrt(without.noise_variance) * y.std() > 0.3
    ratio = with_grid.lengthscale[1] / with_grid.lengthscale[0]
    assert 1.2 < ratio < 2.0

    def lml(p):
        return _lml(Xc, yc, p.lengthscale, p.variance, p.noise_variance)

    assert lml(with_grid) > lml(without) + 10.0
