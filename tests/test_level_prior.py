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


def _disjoint(seed):
    """Four clients on the four quarters of [0, 10], each tested over all of it.

    Each client is ``sin x + 0.2 x`` plus its own smooth departure (sd 0.1)
    and its own level (sd 0.3); noise sd 0.1, 40 training points each.
    """
    rng = np.random.default_rng(seed)

    def draw():
        W = rng.normal(size=(200, 1)) / 3.0
        b = rng.uniform(0, 2 * np.pi, 200)
        a = rng.normal(size=200) * 0.1 * np.sqrt(2.0 / 200)
        return lambda x: np.cos(x[:, None] @ W.T + b) @ a

    funcs = []
    for _ in range(4):
        dev, off = draw(), 0.3 * rng.normal()
        funcs.append(lambda x, d=dev, o=off: np.sin(x) + 0.2 * x + d(x) + o)
    X, y, g, Xt, ft, gt = [], [], [], [], [], []
    for i, f in enumerate(funcs):
        x = rng.uniform(2.5 * i, 2.5 * (i + 1), 40)
        xt = rng.uniform(0, 10, 100)
        X.append(x)
        y.append(f(x) + 0.1 * rng.normal(size=40))
        g += [i] * 40
        fte = f(xt)
        rng.normal(size=100)  # (the generator's noisy test targets, unused here)
        Xt.append(xt)
        ft.append(fte)
        gt += [i] * 100
    return (np.concatenate(X)[:, None], np.concatenate(y), np.array(g),
            np.concatenate(Xt)[:, None], np.concatenate(ft), np.array(gt))


@pytest.mark.parametrize("seed", [0, 2])
def test_levels_of_clients_on_disjoint_ranges_do_not_collapse(seed):
    # seed 2: the four levels fall with x, so the shared function can absorb
    # them as a trend; maximum likelihood then set tau^2 ~ 1e-7 and predicted
    # every client where it has no data as its neighbour, without its own level:
    # RMSE 0.50 and 35 % of the test points beyond 3 std (an exact GP with one-hot
    # client columns: 0.42 and 1.8 %). With the prior: 0.13 and 0 %.
    X, y, g, Xt, ft, gt = _disjoint(seed)
    est = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, groups=g)
    m, s = est.predict(Xt, groups=gt, return_std=True)
    rmse = np.sqrt(np.mean((m - ft) ** 2))
    assert rmse < 0.2
    assert np.mean(np.abs(m - ft) > 3 * s) < 0.05
    assert est.level_variance_ > 0.01  # the levels' spread is (0.3)^2 in target units


def test_objective_history_holds_the_level_prior():
    X, y, g, *_ = _disjoint(2)
    est = FederatedHierarchicalGPRegressor(random_state=2).fit(X, y, groups=g)
    off = FederatedHierarchicalGPRegressor(random_state=2, noise_prior_scale=None).fit(
        X, y, groups=g)
    # without any hyperprior the objective is the ELBO; the levels collapse
    assert off.objective_history_[-1] == pytest.approx(off.elbo_history_[-1], abs=1e-9)
    assert off.level_variance_ < est.level_variance_
