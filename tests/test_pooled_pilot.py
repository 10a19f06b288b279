"""The pooled pilot of small clients: its objective, its gradient and what it fixes.

Clients with a handful of points cannot estimate their noise variance alone:
an exact GP fitted to 4-8 points interpolates them. The set-up exchange lets
the small clients fit one shared kernel together (each an independent GP
with its own constant mean, :func:`skfedgp.federated.pool_evidence`), and the
population's noise variance, the centre of every client's noise hyperprior,
takes the pooled value.
"""
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp import federated as fed


def _dense_reml(X, y, theta):
    d = X.shape[1]
    ell, var, s2 = np.exp(theta[:d]), np.exp(theta[d]), np.exp(theta[d + 1])
    diff = (X[:, None, :] - X[None, :, :]) / ell
    K = var * np.exp(-0.5 * np.sum(diff**2, axis=-1)) + s2 * np.eye(len(y))
    Ki = np.linalg.inv(K)
    one = np.ones(len(y))
    c = one @ Ki @ one
    P = Ki - np.outer(Ki @ one, Ki @ one) / c
    return -0.5 * (y @ P @ y + np.linalg.slogdet(K)[1] + np.log(c))


@pytest.mark.parametrize("n, d", [(2, 1), (7, 2), (12, 3)])
def test_pool_evidence_is_the_restricted_likelihood_with_its_gradient(n, d):
    rng = np.random.default_rng(n + d)
    X = rng.uniform(size=(n, d))
    y = rng.normal(size=n)
    theta = np.log(np.r_[rng.uniform(0.2, 1.0, d), 0.8, 0.05])
    out = fed.pool_evidence(X, y, theta)
    assert out.value == pytest.approx(_dense_reml(X, y, theta), rel=1e-10)
    h = 1e-6
    fd = [(fed.pool_evidence(X, y, theta + h * e).value
           - fed.pool_evidence(X, y, theta - h * e).value) / (2 * h)
          for e in np.eye(d + 2)]
    np.testing.assert_allclose(out.grad, fd, rtol=1e-6, atol=1e-7)
    # a constant added to a client's targets changes nothing (its mean is integrated out)
    assert fed.pool_evidence(X, y + 7.0, theta).value == pytest.approx(out.value, rel=1e-9)


def test_pool_evidence_of_one_point_is_zero():
    out = fed.pool_evidence(np.zeros((1, 2)), np.ones(1), np.zeros(4))
    assert out.value == 0.0 and out.grad.shape == (4,) and not out.grad.any()


def _tiny_clients(seed, n_clients=30, noise_sd=0.1, scale=None):
    rng = np.random.default_rng(seed)
    X, y, g, Xt, yt, gt = [], [], [], [], [], []
    for c in range(n_clients):
        n = int(rng.integers(4, 9))
        level, a = rng.normal(0, 0.5), rng.normal(0, 0.2)
        s = scale.get(c, 1.0) if scale else 1.0

        def f(x):
            return s * (np.sin(1.5 * x) + 0.4 * np.cos(4 * x) + level + a * np.sin(x))

        x, xt = rng.uniform(-3, 3, n), rng.uniform(-3, 3, 50)
        X.append(x), y.append(f(x) + s * noise_sd * rng.normal(size=n)), g.append(np.full(n, c))
        Xt.append(xt), yt.append(f(xt) + s * noise_sd * rng.normal(size=50))
        gt.append(np.full(50, c))
    return [np.concatenate(v) for v in (X, y, g, Xt, yt, gt)]


def _fit(X, y, g):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return FederatedHierarchicalGPRegressor(random_state=0).fit(X[:, None], y, g)


def test_many_tiny_clients_get_the_noise_right_and_are_calibrated():
    X, y, g, Xt, yt, gt = _tiny_clients(2026)
    # the data are such that the clients' own pilots interpolate: their
    # weighted median noise variance is far below the true 0.01
    est = _fit(X, y, g)
    ys2 = est.y_scale_**2
    own = []
    for c in np.unique(g):
        # a pilot standardises its own inputs and centres its targets, so
        # only the targets' scale matters
        p = fed.pilot_fit(X[g == c][:, None], y[g == c] / est.y_scale_, 0)
        if p is not None:
            own.append((p.noise_variance * ys2, np.sum(g == c)))
    own_median = fed._weighted_median([v for v, _ in own], [w for _, w in own])
    assert own_median < 0.005
    centre = est.server_.population_pilot.noise_variance * ys2
    assert 0.005 < centre < 0.02
    m, s = est.predict(Xt[:, None], gt, return_std=True)
    z = np.abs(yt - m) / s
    assert np.mean(z > 3) <= 0.015  # 3.4 % with the pilots' median as the centre
    assert np.sqrt(np.mean((yt - m) ** 2)) < 0.18


def test_a_small_client_on_another_scale_does_not_set_the_pooled_noise():
    X, y, g, *_ = _tiny_clients(7, n_clients=12)
    X2, y2, g2, *_ = _tiny_clients(7, n_clients=12, scale={3: 1000.0})
    a, b = _fit(X, y, g), _fit(X2, y2, g2)
    na = a.server_.population_pilot.noise_variance * a.y_scale_**2
    nb = b.server_.population_pilot.noise_variance * b.y_scale_**2
    assert nb == pytest.approx(na, rel=0.5)
