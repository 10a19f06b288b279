"""Speed of the clients' pilot exact GP against scikit-learn's, same process.

Each client's set-up fits a few exact GPs on at most 256 of its rows
(``skfedgp.federated.pilot_fit``). ``federated._pilot_gp`` maximises the
log marginal likelihood of scikit-learn's ``GaussianProcessRegressor(
ConstantKernel * RBF + WhiteKernel)`` with the same parameters, bounds and
L-BFGS-B optimizer, with the package's compiled SE-ARD kernel and gradient
contraction. This script fits both from the same starts and prints the
time of each, their ratio and the largest difference of the optima's log
marginal likelihood (nats).

Usage::

    python benchmarks/bench_pilot.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import federated as fed


def sklearn_fit(X, y, v, ell, noise_share):
    k = (ConstantKernel(v, (1e-6 * v, 1e3 * v)) * RBF(ell, (1e-3, 1e3))
         + WhiteKernel(noise_share * v, (1e-6 * v, 10.0 * v)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return GaussianProcessRegressor(k).fit(X, y).log_marginal_likelihood_value_


def case(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(2 * X[:, 0]) + (0.5 * X[:, 1] ** 2 if d > 1 else 0) + 0.1 * rng.normal(size=n)
    return X, y - y.mean()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    fed._pilot_gp(*case(20, 2, 0), 1.0, np.ones(2), 0.1)  # compile once, outside the timings
    print(f"{'n':>5s} {'d':>3s} {'start':>8s} {'scikit-learn s':>15s} {'skfedgp s':>10s} "
          f"{'ratio':>6s} {'max |dLML|':>11s}")
    for n, d in ((40, 1), (128, 1), (256, 2), (256, 6), (256, 10)):
        for start in ("sqrt(d)", "fine"):
            t_ref = t_own = 0.0
            diff = 0.0
            for r in range(args.repeats):
                X, y = case(n, d, r)
                v = float(np.var(y))
                ell = np.full(d, np.sqrt(d) if start == "sqrt(d)" else 0.3)
                t0 = time.perf_counter()
                ref = sklearn_fit(X, y, v, ell, 0.1)
                t1 = time.perf_counter()
                own = fed._pilot_gp(X, y, v, ell, 0.1).log_marginal_likelihood
                t2 = time.perf_counter()
                t_ref += t1 - t0
                t_own += t2 - t1
                diff = max(diff, abs(own - ref))
            print(f"{n:5d} {d:3d} {start:>8s} {t_ref / args.repeats:15.3f} "
                  f"{t_own / args.repeats:10.3f} {t_ref / t_own:6.1f} {diff:11.2e}")


if __name__ == "__main__":
    main()
