"""``restart_from_global`` against one training run: accuracy and fit time.

For each case, fits ``FederatedHierarchicalGPRegressor(random_state=0)`` with
``restart_from_global=False`` and with the default ``"auto"`` on the same
data, and prints the held-out RMSE and share of test points beyond 3
predictive standard deviations of each, whether the second run was kept
(``restarted_from_global_``: None no global-only fit, False the first run
kept or no second run, True the second run kept), and the ratio of the two
fit times (measured in this process, one after the other). The table in
docs/maths.md, section 11, was made with it.

Cases (``--cases``; each with ``--seeds``):

- ``dim20``: 20 inputs of which the first 5 matter, one function shared by
  3 clients, 300 rows, 75 held out.
- ``dim10`` and ``dim15``: 10 inputs of which 3 matter (4 clients × 60)
  and 15 of which 4 matter (4 × 50), one function plus a constant per
  client, noise sd 0.15, 400 test points (drawn from ``default_rng(100 +
  seed)``; not used to design the rule).
- ``hier1``, ``hier2``, ``hier3``: ``make_hierarchical_regression`` with 6
  clients of 40 points in 1, 2 or 3 dimensions, 100 test points each.
- ``departures``: 5 clients × 40 points in 2-D, each with its own departure
  ``0.5 a_i cos(9 x2)`` from a shared function.
- ``homoscedastic`` and ``heteroscedastic``: 5 clients × 12 points of
  ``sin(x)`` on [0, 10], noise sd 0.3 for all or 0.1-1.0 by client.
- ``integer``: inputs in {0, ..., 9}, ``sin(2.5 x)`` with noise sd 0.3, 5
  clients × 30 rows.
- ``branin`` and ``branin3``: the noise-free Branin function on the unit
  square, 1 client × 40 points or 3 clients × 20.

Usage::

    python benchmarks/bench_restart_from_global.py [--cases dim20 hier1 ...] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression

CASES = ("dim20", "dim10", "dim15", "hier1", "hier2", "hier3", "departures", "homoscedastic",
         "heteroscedastic", "integer", "branin", "branin3")


def _branin(X):
    x1, x2 = 15 * X[:, 0] - 5, 15 * X[:, 1]
    return ((x2 - 5.1 / (4 * np.pi**2) * x1**2 + 5 / np.pi * x1 - 6) ** 2
            + 10 * (1 - 1 / (8 * np.pi)) * np.cos(x1) + 10)


def make_case(case, seed):
    """Training and test data ``(X, y, g, X_test, y_test, g_test)`` of one case."""
    rng = np.random.default_rng(seed)
    if case == "dim20":
        C, n = 3, 100
        X = rng.uniform(-1, 1, (C * n, 20))
        g = np.repeat(np.arange(C), n)
        y = (np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.5 * X[:, 2] + 0.5 * np.sin(2 * X[:, 3])
             + np.cos(2 * X[:, 4]) + 0.1 * rng.normal(size=C * n))
        idx = rng.permutation(C * n)
        te, tr = idx[:75], idx[75:]
        return X[tr], y[tr], g[tr], X[te], y[te], g[te]
    if case in ("dim10", "dim15"):
        rng = np.random.default_rng(100 + seed)
        T, n, d = (4, 60, 10) if case == "dim10" else (4, 50, 15)
        X = rng.uniform(-1, 1, (T * n, d))
        g = np.repeat(np.arange(T), n)
        off = rng.normal(scale=0.5, size=T)

        def f(x, c):
            out = np.sin(3 * x[:, 0]) + 0.7 * x[:, 1] * x[:, 2] + off[c]
            return out + 0.5 * np.cos(2 * x[:, 3]) if case == "dim15" else out

        y = f(X, g) + 0.15 * rng.standard_normal(T * n)
        Xt = rng.uniform(-1, 1, (400, d))
        gt = rng.integers(0, T, 400)
        return X, y, g, Xt, f(Xt, gt) + 0.15 * rng.standard_normal(400), gt
    if case.startswith("hier"):
        return make_hierarchical_regression(n_clients=6, n_samples=40, n_features=int(case[4:]),
                                            n_test=100, random_state=seed)[:6]
    if case in ("homoscedastic", "heteroscedastic"):
        T, n = 5, 12
        sd = (np.array([0.1, 0.2, 0.3, 0.6, 1.0]) if case == "heteroscedastic"
              else np.full(T, 0.3))
        X = rng.uniform(0, 10, (T * n, 1))
        g = np.repeat(np.arange(T), n)
        y = np.sin(X[:, 0]) + sd[g] * rng.standard_normal(T * n)
        Xt = rng.uniform(0, 10, (1000, 1))
        gt = rng.integers(0, T, 1000)
        return X, y, g, Xt, np.sin(Xt[:, 0]) + sd[gt] * rng.standard_normal(1000), gt
    if case == "integer":
        T, n = 5, 30
        X = rng.integers(0, 10, (T * n, 1)).astype(float)
        g = np.repeat(np.arange(T), n)
        y = np.sin(2.5 * X[:, 0]) + 0.3 * rng.standard_normal(T * n)
        Xt = rng.integers(0, 10, (500, 1)).astype(float)
        gt = rng.integers(0, T, 500)
        return X, y, g, Xt, np.sin(2.5 * Xt[:, 0]) + 0.3 * rng.standard_normal(500), gt
    if case.startswith("branin"):
        T, n = (1, 40) if case == "branin" else (3, 20)
        X = rng.uniform(0, 1, (T * n, 2))
        Xt = rng.uniform(0, 1, (500, 2))
        return (X, _branin(X), np.repeat(np.arange(T), n), Xt, _branin(Xt),
                rng.integers(0, T, 500))
    if case == "departures":
        T, n = 5, 40
        X = rng.uniform(0, 1, (T * n, 2))
        g = np.repeat(np.arange(T), n)
        a = rng.normal(size=T)

        def f(x, c):
            return np.sin(6 * x[:, 0]) + x[:, 1] + 0.5 * a[c] * np.cos(9 * x[:, 1])

        Xt = rng.uniform(0, 1, (500, 2))
        gt = rng.integers(0, T, 500)
        return (X, f(X, g) + 0.1 * rng.standard_normal(T * n), g, Xt,
                f(Xt, gt) + 0.1 * rng.standard_normal(500), gt)
    raise ValueError(f"unknown case {case!r}; one of {CASES}")


def run(case, seed):
    X, y, g, Xt, yt, gt = make_case(case, seed)
    out = {}
    for mode in (False, "auto"):
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = FederatedHierarchicalGPRegressor(random_state=0,
                                                   restart_from_global=mode).fit(X, y, g)
        elapsed = time.perf_counter() - t
        mean, std = est.predict(Xt, groups=gt, return_std=True)
        out[mode] = (elapsed, float(np.sqrt(np.mean((yt - mean) ** 2))),
                     float(np.mean(np.abs(yt - mean) > 3 * std)), est.restarted_from_global_)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = p.parse_args(argv)
    print(f"{'case':<16}{'seed':>5}{'RMSE off':>10}{'b3 off':>8}{'RMSE auto':>11}"
          f"{'b3 auto':>9}{'restarted':>11}{'time ratio':>12}")
    for case in args.cases:
        for seed in args.seeds:
            res = run(case, seed)
            off, auto = res[False], res["auto"]
            print(f"{case:<16}{seed:>5}{off[1]:>10.3f}{off[2]:>8.3f}{auto[1]:>11.3f}"
                  f"{auto[2]:>9.3f}{str(auto[3]):>11}{auto[0] / off[0]:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
