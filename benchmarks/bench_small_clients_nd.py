"""Many small clients in several inputs: defaults against exact GPs.

Each case: ``n_clients`` clients of ``n`` training rows and 20 held-out rows
each, inputs uniform on ``[0, 1]^d``; targets a shared random-Fourier
function (20 features, frequencies ``N(0, 1.5^2)``) plus each client's level
(``N(0, 0.3^2)``) and, with ``--deviations`` (the default), each client's own
smooth random-Fourier deviation (10 features, amplitude about 0.3), noise sd
0.1. Printed per case: RMSE, mean Gaussian NLL and the share of held-out
points beyond 3 predictive std, with the fit time, for

* ``FederatedHierarchicalGPRegressor(random_state=0)`` (defaults);
* the exact GP with one-hot client columns (scikit-learn's
  ``GaussianProcessRegressor``, ARD RBF over inputs and client columns plus
  white noise, ``normalize_y=True``, one restart): the same shared-plus-
  client structure without sparsity or federation;
* the exact GP pooled over all clients, ignoring the client (ARD RBF plus
  white noise).

The cases of docs/maths.md, sections 10 and 13 (pooled lengthscales, the
small clients' local lengthscale prior) were run with it. Usage::

    python benchmarks/bench_small_clients_nd.py [--cases 6:30:10:5 10:40:8:4 ...]
        [--no-deviations] [--no-exact]

A case is ``seed:n_clients:n:d``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor

DEFAULT_CASES = ["3:40:8:5", "4:40:8:5", "6:30:10:5", "10:40:8:4", "7:60:5:3", "8:30:6:2"]


def make_case(seed, n_clients, n, d, deviations=True, n_test=20):
    """(X, y, g, Xt, yt, gt) of one case (see the module docstring)."""
    rng = np.random.default_rng(seed)
    W, b = 1.5 * rng.normal(size=(20, d)), rng.uniform(0, 2 * np.pi, 20)
    a = rng.normal(size=20) / np.sqrt(10)
    level = rng.normal(0, 0.3, n_clients)
    Wd = 1.5 * rng.normal(size=(n_clients, 10, d))
    bd = rng.uniform(0, 2 * np.pi, (n_clients, 10))
    ad = 0.3 * rng.normal(size=(n_clients, 10)) / np.sqrt(5)

    def draw(m):
        X = rng.uniform(0, 1, (m * n_clients, d))
        g = np.repeat(np.arange(n_clients), m)
        f = np.cos(X @ W.T + b) @ a + level[g]
        if deviations:
            f = f + np.einsum("nk,nk->n",
                              np.cos(np.einsum("nd,nkd->nk", X, Wd[g]) + bd[g]), ad[g])
        return X, f + 0.1 * rng.normal(size=len(g)), g

    return (*draw(n), *draw(n_test))


def scores(y, mean, std):
    z = np.abs(y - mean) / std
    return (float(np.sqrt(np.mean((y - mean) ** 2))),
            float(np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * z**2)),
            float(np.mean(z > 3)))


def exact(X, y, Xt):
    d = X.shape[1]
    kernel = (ConstantKernel(1.0) * RBF(np.ones(d), length_scale_bounds=(1e-2, 1e5))
              + WhiteKernel(0.01))
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=1,
                                  random_state=0).fit(X, y)
    return gp.predict(Xt, return_std=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    p.add_argument("--no-deviations", action="store_true")
    p.add_argument("--no-exact", action="store_true")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    print(f"{'case':>12s} {'model':18s} {'RMSE':>7s} {'NLL':>7s} {'>3 sd':>6s} {'fit s':>6s}")
    for case in args.cases:
        seed, T, n, d = (int(v) for v in case.split(":"))
        X, y, g, Xt, yt, gt = make_case(seed, T, n, d, not args.no_deviations)
        rows = []
        t0 = time.perf_counter()
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
        rows.append(("skfedgp defaults", est.predict(Xt, gt, return_std=True),
                     time.perf_counter() - t0))
        if not args.no_exact:
            onehot = np.eye(T)
            t0 = time.perf_counter()
            pred = exact(np.hstack([X, onehot[g]]), y, np.hstack([Xt, onehot[gt]]))
            rows.append(("exact, one-hot", pred, time.perf_counter() - t0))
            t0 = time.perf_counter()
            rows.append(("exact, pooled", exact(X, y, Xt), time.perf_counter() - t0))
        for name, (mean, std), sec in rows:
            r, nll, beyond = scores(yt, mean, std)
            print(f"{case:>12s} {name:18s} {r:7.3f} {nll:7.3f} {100 * beyond:5.1f}% {sec:6.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
