"""Fit time against the number of clients at a fixed total amount of data.

Prints, for 10 and 50 (with ``--large`` also 200) clients sharing about
1 500 observations of one
smooth 2-D function (plus noise and a small per-client offset), the wall
time of ``FederatedHierarchicalGPRegressor(random_state=0).fit`` at default
settings with ``n_jobs=1`` and ``n_jobs=2``, the rounds and ELBO
evaluations it took, and the ratio to an exact scikit-learn GP per client
(fixed kernel hyperparameters) fitted in the same process.

Also, as a reference for the targets: 50 clients x 30 points in under 10 s,
and ``n_jobs=2`` never slower than ``n_jobs=1`` beyond 10 clients of 2 000
points (``--large`` adds that case and the 200-client one; they take
long: about a millisecond of per-client work per ELBO evaluation, and
200 clients of 8 points need about 50 rounds, some 20 minutes for both
``n_jobs`` settings).

Usage::

    python benchmarks/bench_many_clients.py [--large]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor


def make(n_clients, n_per_client, seed=0, return_offset=False):
    """``X`` (n, 2), ``y`` and client labels ``g``; with ``return_offset``
    also each client's level (shape (n_clients,))."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n_clients * n_per_client, 2))
    g = np.repeat(np.arange(n_clients), n_per_client)
    offset = 0.3 * rng.normal(size=n_clients)
    y = np.sin(X[:, 0]) + 0.3 * np.cos(X[:, 1]) + offset[g] + 0.1 * rng.normal(size=X.shape[0])
    return (X, y, g, offset) if return_offset else (X, y, g)


def time_fit(X, y, g, n_jobs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t0 = time.perf_counter()
        est = FederatedHierarchicalGPRegressor(random_state=0, n_jobs=n_jobs).fit(X, y, g)
        return time.perf_counter() - t0, est


def time_gpr_per_client(X, y, g):
    t0 = time.perf_counter()
    for c in np.unique(g):
        k = ConstantKernel() * RBF(np.ones(2)) + WhiteKernel(0.1)
        GaussianProcessRegressor(k, normalize_y=True).fit(X[g == c], y[g == c])
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--large", action="store_true",
                   help="also 200 clients x 8 points and 10 clients x 2 000 points")
    args = p.parse_args(argv)
    cases = [(10, 150), (50, 30)]
    if args.large:
        cases += [(200, 8), (10, 2000)]
    print(f"{'clients':>8} {'n/client':>9} {'n_jobs=1 s':>11} {'n_jobs=2 s':>11} "
          f"{'2 vs 1':>7} {'rounds':>7} {'evals':>6} {'GPR/client s':>13}")
    for T, n in cases:
        X, y, g = make(T, n)
        t1, est = time_fit(X, y, g, 1)
        t2, _ = time_fit(X, y, g, 2)
        tg = time_gpr_per_client(X, y, g)
        print(f"{T:8d} {n:9d} {t1:11.1f} {t2:11.1f} {t2 / t1:7.2f} {est.n_iter_:7d} "
              f"{est.n_evaluations_:6d} {tg:13.1f}", flush=True)
    print("targets: 50 x 30 under 10 s; n_jobs=2 not slower than n_jobs=1 for 10 x 2000")


if __name__ == "__main__":
    main()
