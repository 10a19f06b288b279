"""Growing the global inducing set where ``N / 4`` points leave much of the prior unexplained.

``n_inducing="auto"`` caps ``M`` at a quarter of the observations (or 64);
where that cap binds, the server checks the share of the prior variance that the design
leaves unexplained over the region the clients cover and, if that is above
5 %, grows ``M`` while it is above 1 %, up to half the observations and at most 512 points
(``federated.AUTO_GROW_SHARE``; docs/maths.md section 11). For each case and
seed this script fits ``FederatedHierarchicalGPRegressor(random_state=seed)``
at its defaults ("grown") and with ``n_inducing`` fixed at the ungrown
``M = N / 4`` ("N/4"), and scikit-learn's exact ``GaussianProcessRegressor``
(SE-ARD times a constant plus white noise, ``normalize_y=True``, 2 restarts)
on the pooled data with one-hot client columns, the yardstick. It prints
held-out RMSE, the ratio to the exact GP's, mean Gaussian NLL, the share of
test points beyond 3 predictive std, ``M`` and the fit time; all fits of a
case run in this process one after the other.

Cases (from ``bench_inducing.py``): ``rff4d``, ``rff6d`` (4 clients x 150
points of one random-feature function of 4 or 6 inputs, noise sd 0.05), and,
with ``--data-dir`` (the folder holding ``kin40k/kin40k.npz``), ``kin40k``:
5 clients x 200 random training rows, 100 random test rows per client.

Usage::

    python benchmarks/bench_inducing_growth.py [--case rff4d rff6d kin40k]
        [--seeds 0 1 2] [--data-dir DATA_DIR]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from bench_inducing import case as inducing_case
from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.metrics import gaussian_nll, rmse


def case(name, seed, data_dir):
    if name != "kin40k":
        return inducing_case(name, seed, data_dir)
    if data_dir is None:
        return None
    rng = np.random.default_rng(seed)
    d = np.load(Path(data_dir) / "kin40k" / "kin40k.npz")
    i = rng.choice(len(d["y_train"]), 1000, replace=False)
    it = rng.choice(len(d["y_test"]), 500, replace=False)
    return (d["X_train"][i], d["y_train"].ravel()[i], np.repeat(np.arange(5), 200),
            d["X_test"][it], d["y_test"].ravel()[it], np.repeat(np.arange(5), 100))


def scores(yt, m, s):
    return rmse(yt, m), gaussian_nll(yt, m, s), float(np.mean(np.abs(yt - m) > 3 * s))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", nargs="+", default=["rff4d", "rff6d"],
                        choices=["rff4d", "rff6d", "kin40k"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    print(f"{'case':8s} {'seed':>4s} {'model':>6s} {'RMSE':>7s} {'/exact':>7s} {'NLL':>7s} "
          f"{'>3sd':>6s} {'M':>4s} {'fit s':>7s}")
    for name in args.case:
        for seed in args.seeds:
            data = case(name, seed, args.data_dir)
            if data is None:
                print(f"{name}: skipped (needs --data-dir)")
                break
            X, y, g, Xt, yt, gt = data
            T = int(g.max()) + 1
            onehot = np.eye(T)
            kern = (ConstantKernel() * RBF(np.ones(X.shape[1] + T))
                    + WhiteKernel(0.1))
            gp = GaussianProcessRegressor(kern, normalize_y=True, n_restarts_optimizer=2,
                                          random_state=seed)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gp.fit(np.hstack([X, onehot[g]]), y)
            t_exact = time.perf_counter() - t0
            m, s = gp.predict(np.hstack([Xt, onehot[gt]]), return_std=True)
            ref = scores(yt, m, s)
            print(f"{name:8s} {seed:4d} {'exact':>6s} {ref[0]:7.4f} {1.0:7.3f} {ref[1]:7.3f} "
                  f"{100 * ref[2]:5.2f}% {'':>4s} {t_exact:7.1f}", flush=True)
            quarter = max(64, int(np.ceil(0.25 * len(y))))
            for label, kw in (("grown", {}), ("N/4", {"n_inducing": quarter})):
                est = FederatedHierarchicalGPRegressor(random_state=seed, **kw)
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est.fit(X, y, g)
                fit = time.perf_counter() - t0
                r = scores(yt, *est.predict(Xt, gt, return_std=True))
                print(f"{name:8s} {seed:4d} {label:>6s} {r[0]:7.4f} {r[0] / ref[0]:7.3f} "
                      f"{r[1]:7.3f} {100 * r[2]:5.2f}% {est.n_inducing_:4d} {fit:7.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
