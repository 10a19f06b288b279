"""The server's hyperprior on the clients' level variance (docs/maths.md, section 13).

A gamma(2, 0) prior on the levels' standard deviation (Chung et al. 2013,
Psychometrika 78(4)): ``log p(tau) = log tau``, added by the server to its
global objective and to the objective the stopping rule reads.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp import federated as fed

from _federations import disjoint_case


def _spec():
    return fed.structured_global_spec(("global", "deviation", "local"), 3, 1)


def test_level_log_prior_value_and_gradient():
    gpack = _spec()
    cfg = SimpleNamespace(noise_prior_scale=1.0)  # the one setting it reads
    rng = np.random.default_rng(0)
    theta = rng.normal(size=gpack.size)
    value, grad = fed.level_log_prior(gpack, theta, cfg, 4)
    tau2 = float(gpack.unpack(theta)["level_variance"])
    # (a - 1) log tau with a = 2
    assert value == pytest.approx((fed.LEVEL_PRIOR_SHAPE - 1.0) * np.log(np.sqrt(tau2)),
                                  rel=1e-12)
    eps = 1e-6
    for k in range(gpack.size):
        e = np.zeros(gpack.size)
        e[k] = eps
        fd = (fed.level_log_prior(gpack, theta + e, cfg, 4)[0]
              - fed.level_log_prior(gpack, theta - e, cfg, 4)[0]) / (2 * eps)
        assert grad[k] == pytest.approx(fd, abs=1e-8)
    assert np.count_nonzero(grad) == 1  # the level variance's entry only


def test_level_log_prior_off_without_priors_level_or_second_client():
    gpack = _spec()
    theta = np.ones(gpack.size)
    value, grad = fed.level_log_prior(gpack, theta, SimpleNamespace(noise_prior_scale=None), 4)
    assert value == 0.0 and not np.any(grad)
    # one client: the bound falls like -log tau, the prior would make the
    # objective rise without end
    value, grad = fed.level_log_prior(gpack, theta, SimpleNamespace(noise_prior_scale=1.0), 1)
    assert value == 0.0 and not np.any(grad)
    from skfedgp._hierarchy import Packer
    no_level = Packer([("lengthscale_g", (1,), "log")])
    value, grad = fed.level_log_prior(no_level, np.zeros(1),
                                      SimpleNamespace(noise_prior_scale=1.0), 4)
    assert value == 0.0 and grad.shape == (1,) and not np.any(grad)


def test_one_client_fit_has_no_level_prior(monkeypatch):
    # with the prior, one client's level variance climbed towards its upper
    # bound (16 174 in target units on 40 points of sin x; 6.6e-7 without)
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (40, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(40)
    est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=10).fit(X, y)
    monkeypatch.setattr(fed, "LEVEL_PRIOR_SHAPE", 1.0)  # a = 1: no prior
    ref = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=10).fit(X, y)
    assert est.level_variance_ == ref.level_variance_
    assert est.objective_history_ == ref.objective_history_


@pytest.fixture(scope="module")
def disjoint_fits():
    """Default fits of the disjoint case, seeds 0 and 2 (with their data)."""
    out = {}
    for seed in (0, 2):
        X, y, g, Xt, yt, gt, ft = disjoint_case(seed)
        est = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, groups=g)
        out[seed] = (est, X, y, g, Xt, gt, ft)
    return out


@pytest.mark.parametrize("seed", [0, 2])
def test_levels_of_clients_on_disjoint_ranges_do_not_collapse(disjoint_fits, seed):
    # seed 2: the four levels fall with x, so the shared function can absorb
    # them as a trend; maximum likelihood then set tau^2 ~ 1e-7 and predicted
    # every client where it has no data as its neighbour, without its own level:
    # RMSE 0.50 against the noise-free values and 35 % of the noisy test points
    # beyond 3 std (the exact GP pooled with one-hot client columns of
    # benchmarks/bench_new_user_cases.py: 0.40 and 18 %). With the prior: 0.13
    # and 0 %.
    est, X, y, g, Xt, gt, ft = disjoint_fits[seed]
    m, s = est.predict(Xt, groups=gt, return_std=True)
    rmse = np.sqrt(np.mean((m - ft) ** 2))
    assert rmse < 0.2
    assert np.mean(np.abs(m - ft) > 3 * s) < 0.05
    assert est.level_variance_ > 0.01  # the levels' spread is (0.3)^2 in target units


def test_without_hyperpriors_the_levels_collapse(disjoint_fits):
    # noise_prior_scale=None: no hyperprior at all (the objective is the ELBO)
    # and, on seed 2, maximum likelihood's level variance at about 0 (the
    # objective's level prior itself is checked in test_structured's
    # test_fitted_state_is_consistent)
    est, X, y, g, *_ = disjoint_fits[2]
    off = FederatedHierarchicalGPRegressor(random_state=2, noise_prior_scale=None).fit(
        X, y, groups=g)
    assert off.objective_history_[-1] == pytest.approx(off.elbo_history_[-1], abs=1e-9)
    assert off.level_variance_ < 1e-3 < 0.1 < est.level_variance_
