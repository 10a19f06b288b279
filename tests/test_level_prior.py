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
    value, grad = fed.level_log_prior(gpack, theta, cfg)
    tau2 = float(gpack.unpack(theta)["level_variance"])
    # (a - 1) log tau with a = 2
    assert value == pytest.approx((fed.LEVEL_PRIOR_SHAPE - 1.0) * np.log(np.sqrt(tau2)),
                                  rel=1e-12)
    eps = 1e-6
    for k in range(gpack.size):
        e = np.zeros(gpack.size)
        e[k] = eps
        fd = (fed.level_log_prior(gpack, theta + e, cfg)[0]
              - fed.level_log_prior(gpack, theta - e, cfg)[0]) / (2 * eps)
        assert grad[k] == pytest.approx(fd, abs=1e-8)
    assert np.count_nonzero(grad) == 1  # the level variance's entry only


def test_level_log_prior_off_without_priors_or_level():
    cfg = SimpleNamespace(noise_prior_scale=None)
    gpack = _spec()
    value, grad = fed.level_log_prior(gpack, np.zeros(gpack.size), cfg)
    assert value == 0.0 and not np.any(grad)
    from skfedgp._hierarchy import Packer
    no_level = Packer([("lengthscale_g", (1,), "log")])
    value, grad = fed.level_log_prior(no_level, np.zeros(1), SimpleNamespace(noise_prior_scale=1.0))
    assert value == 0.0 and grad.shape == (1,) and not np.any(grad)


@pytest.mark.parametrize("seed", [0, 2])
def test_levels_of_clients_on_disjoint_ranges_do_not_collapse(seed):
    # seed 2: the four levels fall with x, so the shared function can absorb
    # them as a trend; maximum likelihood then set tau^2 ~ 1e-7 and predicted
    # every client where it has no data as its neighbour, without its own level:
    # RMSE 0.50 and 35 % of the test points beyond 3 std (an exact GP with one-hot
    # client columns: 0.42 and 1.8 %). With the prior: 0.13 and 0 %.
    X, y, g, Xt, _, gt, ft = disjoint_case(seed)
    est = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, groups=g)
    m, s = est.predict(Xt, groups=gt, return_std=True)
    rmse = np.sqrt(np.mean((m - ft) ** 2))
    assert rmse < 0.2
    assert np.mean(np.abs(m - ft) > 3 * s) < 0.05
    assert est.level_variance_ > 0.01  # the levels' spread is (0.3)^2 in target units


def test_objective_history_holds_the_level_prior():
    X, y, g, *_ = disjoint_case(2)
    est = FederatedHierarchicalGPRegressor(random_state=2).fit(X, y, groups=g)
    off = FederatedHierarchicalGPRegressor(random_state=2, noise_prior_scale=None).fit(
        X, y, groups=g)
    # without any hyperprior the objective is the ELBO; the levels collapse
    assert off.objective_history_[-1] == pytest.approx(off.elbo_history_[-1], abs=1e-9)
    assert off.level_variance_ < est.level_variance_
