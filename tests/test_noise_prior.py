"""The noise hyperprior's centre: a client's own pilot when it has enough points.

A noisy client among nearly noise-free ones used to have its noise
variance pulled towards theirs (the population's centre); its local part
then took up its noise and its band was far too narrow (docs/maths.md,
section 10, "Noise hyperprior").
"""

import warnings

import numpy as np
import pytest

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.federated import PILOT_POOL_POINTS


def _clients(seed, sds=(0.01, 0.01, 0.5, 0.5), n=50, n_test=1000):
    rng = np.random.default_rng(seed)
    X, y, g, Xt, yt, gt = [], [], [], [], [], []
    for i, sd in enumerate(sds):
        a = rng.normal(0, 0.3)

        def f(x, a=a):
            return np.sin(2 * x[:, 0]) + a * np.cos(x[:, 0])

        x = rng.uniform(0, 5, (n, 1))
        xt = rng.uniform(0, 5, (n_test, 1))
        X.append(x)
        y.append(f(x) + sd * rng.standard_normal(n))
        g.append(np.full(n, i))
        Xt.append(xt)
        yt.append(f(xt) + sd * rng.standard_normal(n_test))
        gt.append(np.full(n_test, i))
    return tuple(map(np.concatenate, (X, y, g, Xt, yt, gt)))


@pytest.fixture(scope="module")
def fitted():
    X, y, g, Xt, yt, gt = _clients(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=1).fit(X, y, groups=g)
    return est, Xt, yt, gt


def test_each_large_client_centres_on_its_own_noise(fitted):
    """Clients of 50 points: each centre (target units) near the client's own
    noise variance, not the quiet clients' 1e-4 for the noisy ones."""
    est = fitted[0]
    scale2 = float(np.ravel(est.y_scale_)[0]) ** 2
    assert 50 >= PILOT_POOL_POINTS
    for c, sd in enumerate((0.01, 0.01, 0.5, 0.5)):
        centre = est.clients_[c].prior_noise * scale2
        # a pilot on 50 points: within a factor 4 of the true variance (the
        # population's centre would be 2500 times off for the noisy clients)
        assert sd**2 / 4 < centre < 4 * sd**2, (c, centre)


def test_noisy_client_among_quiet_ones_is_calibrated(fitted):
    """The given instance (seed 1): client 3 (noise sd 0.5) had 6.3 % of its
    test points beyond 3 std and 95 % coverage 0.80; an exact GP per client
    0.4 % and 0.94."""
    est, Xt, yt, gt = fitted
    mean, std = est.predict(Xt, gt, return_std=True)
    for c in (2, 3):
        k = gt == c
        z = np.abs(yt[k] - mean[k]) / std[k]
        assert np.mean(z > 3) < 0.03, (c, np.mean(z > 3))
        assert np.mean(z < 1.959964) > 0.86, (c, np.mean(z < 1.959964))
    for c in (0, 1):  # the quiet clients keep their narrow bands
        k = gt == c
        assert np.median(std[k]) < 0.02


def test_small_client_keeps_the_population_centre():
    """A client below PILOT_POOL_POINTS observations keeps the population's
    centre, even when its own few points look noisier: its own pilot is not
    reliable (an 8-point client, noise sd 0.5, among three of 40 points with
    noise sd 0.05)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (3 * 40 + 8, 1))
    g = np.r_[np.repeat([0, 1, 2], 40), np.full(8, 3)]
    sd = np.where(g == 3, 0.5, 0.05)
    y = np.sin(2 * X[:, 0]) + sd * rng.standard_normal(len(g))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1).fit(X, y, groups=g)
    scale2 = float(np.ravel(est.y_scale_)[0]) ** 2
    big = np.array([est.clients_[c].prior_noise for c in range(3)]) * scale2
    small = est.clients_[3].prior_noise * scale2
    assert np.all((0.05**2 / 4 < big) & (big < 4 * 0.05**2)), big
    assert big.min() / 2 <= small <= 2 * big.max(), (small, big)


@pytest.mark.parametrize("n, d, expected", [
    (31, 1, False), (32, 1, True),      # 1-D: PILOT_POOL_POINTS decides
    (49, 3, False), (50, 3, True),      # 10 per (d + 2) decides
    (100, 32, False), (340, 32, False),  # 32-D: the pilot uses at most 256 points
    (5000, 23, True), (5000, 24, False),
])
def test_own_noise_centre_boundaries(n, d, expected):
    from skfedgp.federated import own_noise_centre

    assert own_noise_centre(n, d) is expected
