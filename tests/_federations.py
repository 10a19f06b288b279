"""Synthetic federations shared by several test modules (not a test module)."""

import numpy as np


def five_point_federation(seed=7, n_test=150):
    """Three 2-D clients of 80 points and one of 5 that departs most.

    Client ``k`` departs from the shared function by ``0.3 k sin(2 x2)``;
    noise sd 0.1. The same generator as ``five_point_2d`` in
    ``benchmarks/bench_new_user_cases.py`` (which cannot import tests).

    Returns
    -------
    X, y, g, X_test, y_test, g_test : ndarray
        Training rows (260, 2), (260,), (260,) and ``n_test`` test rows per client.
    """
    rng = np.random.default_rng(seed)
    sizes = [80, 80, 80, 5]

    def make(ns):
        X = rng.uniform(-1.5, 1.5, (sum(ns), 2))
        g = np.repeat(np.arange(len(ns)), ns)
        f = (np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.5 * X[:, 0]
             + 0.3 * g * np.sin(2 * X[:, 1]))
        return X, f + 0.1 * rng.standard_normal(len(g)), g

    X, y, g = make(sizes)
    Xt, yt, gt = make([n_test] * len(sizes))
    return X, y, g, Xt, yt, gt
