"""The population block used to predict for clients never seen in fit.

A never-seen client's local part is a draw from a randomly chosen client's
prior: its prior variance at a point is the mean of the fitted clients' local
variances. A geometric mean (the earlier rule) was pulled to about 0 by the
clients whose fitted local part is switched off, and a never-seen client's
band was far too narrow.
"""

import warnings

import numpy as np
import pytest

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.federated import LocalHyperparameters, _population_from

COMPONENTS = ("global", "deviation", "local")


def _hypers(variances, lengthscales):
    return [LocalHyperparameters(np.array([ell]), v, 0.01 * (k + 1))
            for k, (v, ell) in enumerate(zip(variances, lengthscales))]


def test_population_variance_is_the_mean_of_the_clients():
    pop = _population_from(_hypers([1e-9, 1e-9, 2.0], [50.0, 0.1, 0.3]), COMPONENTS)
    assert pop["variance_l"] == pytest.approx((2.0 + 2e-9) / 3)
    # the lengthscale follows the clients that use their local part
    assert pop["lengthscale_l"][0] == pytest.approx(0.3, rel=1e-6)
    # the noise variance stays a geometric mean
    assert pop["noise_variance"] == pytest.approx((0.01 * 0.02 * 0.03) ** (1 / 3))


def test_population_lengthscale_without_any_local_variance():
    pop = _population_from(_hypers([0.0, 0.0], [4.0, 1.0]), COMPONENTS)
    assert pop["variance_l"] == 0.0
    assert pop["lengthscale_l"][0] == pytest.approx(2.0)


def test_never_seen_client_band_covers_it():
    """Seven clients on levels and shapes of their own; the eighth is held out.

    Three of the seven fits explain their level with the local part
    (variance 1.4-2), the other four switch it off: with the geometric
    mean, the held-out client's band had sd 0.33 and 23 % of its points
    beyond 3 sd (its level is 1.6 sd of the others' from their mean)."""
    rng = np.random.default_rng(0)
    K, n = 8, 30
    levels = rng.normal(0, 1.0, K)
    amp = rng.normal(0, 0.5, K)
    phase = rng.uniform(0, 6, K)
    X = rng.uniform(0, 10, (K * n, 1))
    g = np.repeat(np.arange(K), n)

    def f(x, c):
        return np.sin(x) + levels[c] + amp[c] * np.sin(0.7 * x + phase[c])

    y = f(X[:, 0], g) + 0.1 * rng.standard_normal(K * n)
    keep = g != 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X[keep], y[keep], g[keep])
    Xt = np.linspace(0, 10, 200)[:, None]
    m, s = est.predict(Xt, ["new"] * 200, return_std=True)
    z = np.abs(m - f(Xt[:, 0], np.full(200, 7))) / s
    assert np.mean(z > 3) < 0.01


def test_weighted_median_reduces_to_the_median():
    from skfedgp.federated import _weighted_median

    for v in ([3.0, 1.0, 2.0, 4.0], [5.0, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]):
        assert _weighted_median(v, [1] * len(v), interpolate=True) == np.median(v)
    assert _weighted_median([1.0, 2.0, 3.0, 4.0, 5.0], [400, 100, 30, 10, 5],
                            interpolate=True) == 1.0
    rng = np.random.default_rng(0)
    for _ in range(2000):
        v = rng.normal(size=rng.integers(1, 8))
        # equal float weights whose cumulative sums are not exact
        for w0 in (0.7, 0.1, 1e-3):
            assert _weighted_median(v, [w0] * len(v), interpolate=True) == np.median(v)
        # integer weights (zeros included): the median of the repeated values
        iw = rng.integers(0, 4, size=len(v))
        if iw.sum():
            assert _weighted_median(v, iw, interpolate=True) == pytest.approx(
                np.median(np.repeat(v, iw)), rel=1e-15, abs=1e-15)


def test_population_variance_in_common_units_with_client_scales():
    """A client that learned its own scale s_i has its local variance in its
    own units: the mean is taken of v_i / s_i^2 and put back at the
    never-seen client's (median) scale."""
    hypers = [LocalHyperparameters(np.array([0.3]), v, 0.01, scale=s)
              for v, s in ((1.0, 1.0), (2.0, 1.0), (4e6, 1e3))]
    pop = _population_from(hypers, COMPONENTS)
    assert pop["client_scale"] == 1.0  # the median scale
    assert pop["variance_l"] == pytest.approx((1.0 + 2.0 + 4.0) / 3)


@pytest.mark.slow
def test_small_clients_do_not_set_the_starting_lengthscales():
    """Clients of 300, 60, 20, 20 and 8 points of one function of 3 of 24
    inputs. The starting global lengthscales are the pilots' median, now
    weighted by the clients' sizes: the plain median was a 20-point client's
    pilot (nearly flat in 24 inputs), the shared part learned little, and the
    four small clients' RMSE was 0.19-0.24 (0.04-0.07 now; 0.04 for the big
    client either way)."""
    rng = np.random.default_rng(0)
    d, sizes = 24, [300, 60, 20, 20, 8]

    def f(X):
        return np.sin(3 * X[:, 0]) + 0.8 * np.cos(2 * X[:, 1]) * X[:, 2]

    X = rng.uniform(-1, 1, (sum(sizes), d))
    g = np.repeat(np.arange(5), sizes)
    y = f(X) + 0.1 * rng.normal(size=len(X))
    Xt = rng.uniform(-1, 1, (500, d))
    gt = np.arange(500) % 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    m, s = est.predict(Xt, gt, return_std=True)
    for c in range(5):
        k = gt == c
        assert np.sqrt(np.mean((m[k] - f(Xt[k])) ** 2)) < 0.12, c
    assert np.mean(np.abs(m - f(Xt)) > 3 * s) < 0.01
