"""Unequal client sizes on real data: skfedgp at defaults against an exact GP.

One function shared by every client (a random split of KIN40K or
PUMADYN-32nm into clients of 400, 100, 30, 10 and 5 training points; 1 000
test points spread evenly over the clients and predicted with their
client's label). The reference is scikit-learn's exact
``GaussianProcessRegressor`` (constant x ARD RBF + white noise,
``normalize_y=True``, 2 optimiser restarts) on the pooled training data,
which is the right model here. Printed per client and overall: RMSE,
mean Gaussian NLL, share of test points beyond 3 predictive std and 95 %
coverage.

This is the case behind the set-up's size-weighted pilot medians (the
starting global lengthscales): with the plain median a small client's
pilot set them, the shared part learned little and the small clients'
predictions were worse than the mean and over-confident (PUMADYN-32nm seed
0: 17 % of test points beyond 3 std).

Usage::

    python benchmarks/bench_unequal_clients.py --data-dir DATA_DIR [--data kin40k pumadyn32nm] [--seeds 0 1]

``DATA_DIR/kin40k/kin40k.npz`` and ``DATA_DIR/pumadyn32nm/pumadyn32nm.npz``
hold ``X_train``, ``y_train``, ``X_test``, ``y_test``. A fit takes 0.5-2
minutes on one core.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.metrics import coverage, gaussian_nll, rmse

SIZES = (400, 100, 30, 10, 5)


def scores(y, mean, std):
    return (rmse(y, mean), gaussian_nll(y, mean, std),
            float(np.mean(np.abs(y - mean) > 3 * std)), coverage(y, mean, std))


def run(path, seed, exact=True):
    data = np.load(path)
    rng = np.random.default_rng(seed)
    itr = rng.choice(len(data["y_train"]), sum(SIZES), replace=False)
    ite = rng.choice(len(data["y_test"]), 1000, replace=False)
    X, y = data["X_train"][itr], data["y_train"][itr]
    Xt, yt = data["X_test"][ite], data["y_test"][ite]
    g = np.repeat(np.arange(len(SIZES)), SIZES)
    gt = rng.permutation(np.arange(len(yt)) % len(SIZES))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, g)
    fit_s = time.perf_counter() - t0
    m, s = est.predict(Xt, gt, return_std=True)
    rows = {"skfedgp": (m, s)}
    info = f"skfedgp fit {fit_s:.0f} s, {est.n_iter_} rounds, M = {est.n_inducing_}"
    if exact:
        t0 = time.perf_counter()
        kernel = ConstantKernel() * RBF(np.ones(X.shape[1])) + WhiteKernel()
        gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=2,
                                      random_state=seed).fit(X, y)
        rows["exact GP (pooled)"] = gp.predict(Xt, return_std=True)
        info += f"; exact GP fit {time.perf_counter() - t0:.0f} s"
    return yt, gt, rows, info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--data", nargs="+", default=["kin40k", "pumadyn32nm"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--no-exact", action="store_true", help="skip the exact GP")
    args = ap.parse_args(argv)
    for name in args.data:
        path = os.path.join(args.data_dir, name, f"{name}.npz")
        if not os.path.exists(path):
            raise SystemExit(f"{path} not found")
        for seed in args.seeds:
            yt, gt, rows, info = run(path, seed, exact=not args.no_exact)
            print(f"\n== {name}, seed {seed} ({info})")
            print(f"{'client (n)':12s} {'model':18s} {'RMSE':>7s} {'NLL':>7s} {'>3 sd':>7s} {'cov95':>6s}")
            for c in list(range(len(SIZES))) + [None]:
                k = np.ones(len(yt), bool) if c is None else gt == c
                label = "all" if c is None else f"{c} ({SIZES[c]})"
                for model, (m, s) in rows.items():
                    r, nll, b3, cov = scores(yt[k], m[k], s[k])
                    print(f"{label:12s} {model:18s} {r:7.3f} {nll:7.2f} {100 * b3:6.1f}% {cov:6.3f}")
            print(flush=True)


if __name__ == "__main__":
    main()
