"""Learned against held inducing inputs (``learn_inducing_locations``).

For each case and seed, fits ``FederatedHierarchicalGPRegressor(random_state=
seed)`` at its defaults three times -- ``learn_inducing_locations`` True,
False and "auto" (the default) -- and prints held-out RMSE, mean Gaussian
NLL, the share of test points beyond 3 predictive std, the fit time, the
rounds, the final objective and the design residual ``rho`` that "auto"
decides on (docs/maths.md section 11).

Cases:

* ``1d-small``: ``make_hierarchical_regression(n_clients=8, n_samples=12)``,
  100 test points per client;
* ``1d``: ``make_hierarchical_regression(n_clients=6, n_samples=50)``;
* ``2d``: ``make_hierarchical_regression(n_clients=6, n_samples=30,
  n_features=2)``;
* ``rff4d`` and ``rff6d``: 4 clients x 150 points of one random-feature
  function (30 cosines) of 4 inputs with lengthscale 0.3, or 6 inputs with
  lengthscale 0.5, on the unit cube, noise sd 0.05, 100 test points per
  client (a design of ``M = N / 4`` points cannot cover such inputs);
* ``kin40k`` and ``pumadyn32nm`` (with ``--data-dir``, the folder holding
  ``kin40k/kin40k.npz`` and ``pumadyn32nm/pumadyn32nm.npz``): 5 clients x 300
  and 4 clients x 250 random training points, up to 2000 test points with
  random client labels (an iid split: the clients share one function).

Usage::

    python benchmarks/bench_inducing.py [--case 1d-small 1d 2d rff4d rff6d kin40k
        pumadyn32nm] [--seeds 0 1 2] [--modes True False auto] [--data-dir DATA_DIR]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression


def case(name, seed, data_dir):
    rng = np.random.default_rng(seed)
    if name == "1d-small":
        return make_hierarchical_regression(n_clients=8, n_samples=12, n_test=100,
                                            random_state=seed)
    if name == "1d":
        return make_hierarchical_regression(n_clients=6, n_samples=50, n_test=150,
                                            random_state=seed)
    if name == "2d":
        return make_hierarchical_regression(n_clients=6, n_samples=30, n_features=2,
                                            n_test=100, random_state=seed)
    if name in ("rff4d", "rff6d"):
        d, ell = (4, 0.3) if name == "rff4d" else (6, 0.5)
        W = rng.normal(size=(d, 30)) / ell
        b = rng.uniform(0, 2 * np.pi, 30)
        a = rng.normal(size=30) * np.sqrt(2 / 30)

        def f(X):
            return np.cos(X @ W + b) @ a

        X, Xt = rng.uniform(size=(600, d)), rng.uniform(size=(400, d))
        g, gt = np.repeat(np.arange(4), 150), np.repeat(np.arange(4), 100)
        return (X, f(X) + 0.05 * rng.normal(size=600), g,
                Xt, f(Xt) + 0.05 * rng.normal(size=400), gt)
    if name in ("kin40k", "pumadyn32nm"):
        if data_dir is None:
            return None
        d = np.load(Path(data_dir) / name / f"{name}.npz")
        T, n = (5, 300) if name == "kin40k" else (4, 250)
        idx = rng.permutation(len(d["X_train"]))[: T * n]
        te = rng.permutation(len(d["X_test"]))[:2000]
        return (d["X_train"][idx], d["y_train"].ravel()[idx], np.repeat(np.arange(T), n),
                d["X_test"][te], d["y_test"].ravel()[te], rng.integers(0, T, te.size))
    raise ValueError(f"unknown case {name!r}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", nargs="+", default=["1d-small", "1d", "2d"],
                        choices=["1d-small", "1d", "2d", "rff4d", "rff6d", "kin40k",
                                 "pumadyn32nm"])
    parser.add_argument("--modes", nargs="+", default=["True", "False", "auto"],
                        choices=["True", "False", "auto"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    print(f"{'case':12s} {'seed':>4s} {'learn':>6s} {'RMSE':>8s} {'NLL':>8s} {'>3sd':>6s} "
          f"{'fit s':>7s} {'rounds':>6s} {'objective':>10s} {'rho':>9s} {'learned':>7s}")
    for name in args.case:
        for seed in args.seeds:
            data = case(name, seed, args.data_dir)
            if data is None:
                print(f"{name}: skipped (needs --data-dir)")
                break
            X, y, g, Xt, yt, gt = data
            for learn in [{"True": True, "False": False}.get(m, m) for m in args.modes]:
                est = FederatedHierarchicalGPRegressor(random_state=seed,
                                                       learn_inducing_locations=learn)
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est.fit(X, y, g)
                fit = time.perf_counter() - t0
                m, s = est.predict(Xt, gt, return_std=True)
                z = (yt - m) / s
                rmse = float(np.sqrt(np.mean((yt - m) ** 2)))
                nll = float(np.mean(0.5 * np.log(2 * np.pi * s**2) + 0.5 * z**2))
                rho = est.server_.design_residual_
                print(f"{name:12s} {seed:4d} {str(learn):>6s} {rmse:8.4f} {nll:8.3f} "
                      f"{100 * np.mean(np.abs(z) > 3):5.2f}% {fit:7.1f} {est.n_iter_:6d} "
                      f"{est.objective_history_[-1]:10.2f} "
                      f"{'' if rho is None else f'{rho:9.2e}':>9s} "
                      f"{str(est.learn_inducing_locations_):>7s}", flush=True)


if __name__ == "__main__":
    main()
