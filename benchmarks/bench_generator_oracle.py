"""Defaults against the Oracle on the package's own generator.

``make_hierarchical_regression(n_clients=6, n_samples=40, n_features=d,
n_test=100, random_state=seed)`` (each client's function is a shared part, a
deviation and a local part on a short lengthscale, noise sd 0.05), fitted
with ``FederatedHierarchicalGPRegressor(random_state=0)`` and predicted with
each test point's client. The Oracle is
:func:`skfedgp.datasets.hierarchical_oracle_predict`, the exact GP with the
simulator's true covariance: the accuracy limit. Printed per ``(d, seed)``:
RMSE, mean Gaussian NLL, the share of test points beyond 3 predictive
standard deviations and the 95 % coverage of both, the fit time, and the
number of clients whose noise variance has a hyperprior
(``clients_[label].noise_hyperprior``). The tables of docs/maths.md,
section 10 ("Noise hyperprior", "Pilots that interpolated") were made with
it.

Usage::

    python benchmarks/bench_generator_oracle.py [--dims 1 2 3] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import hierarchical_oracle_predict, make_hierarchical_regression
from skfedgp.metrics import coverage, gaussian_nll, rmse


def scores(y, mean, std):
    return (rmse(y, mean), gaussian_nll(y, mean, std),
            float(np.mean(np.abs(y - mean) > 3 * std)), coverage(y, mean, std))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)
    print(f"{'d':>2} {'seed':>4} {'model':<8} {'RMSE':>7} {'NLL':>7} {'>3 sd':>6} "
          f"{'cov95':>6} {'fit s':>6} {'priors':>6}")
    for d in args.dims:
        for seed in args.seeds:
            X, y, g, Xt, yt, gt, truth = make_hierarchical_regression(
                n_clients=6, n_samples=40, n_features=d, n_test=100, random_state=seed,
                return_truth=True)
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
            mean, std = est.predict(Xt, groups=gt, return_std=True)
            fit_s = time.perf_counter() - t
            n_prior = sum(bool(getattr(c, "noise_hyperprior", True))
                          for c in est.clients_.values())
            mo, co = hierarchical_oracle_predict(truth, X, y, g, Xt, gt)
            rows = (("skfedgp", scores(yt, mean, std), f"{fit_s:6.1f}", f"{n_prior:6d}"),
                    ("Oracle", scores(yt, np.ravel(mo), np.sqrt(np.ravel(co))), "", ""))
            for name, (r, nll, b3, cov), fs, npri in rows:
                print(f"{d:>2} {seed:>4} {name:<8} {r:7.3f} {nll:7.3f} {100 * b3:5.1f}% "
                      f"{cov:6.3f} {fs:>6} {npri:>6}", flush=True)


if __name__ == "__main__":
    main()
