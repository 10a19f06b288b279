"""The noise hyperprior's scale from the pooled small clients, against a fixed one.

Five clients of 12 points each, ``y = f(x) + noise`` (the same ``f`` for
every client), held-out points drawn at random clients. Three cases:

* ``integer``: inputs the integers 0-9, ``f(x) = sin(2.5 x)``, noise sd 0.3;
* ``continuous``: inputs uniform on [0, 10], ``f(x) = sin(x)``, noise sd 0.3;
* ``mixed``: as ``continuous`` with noise sd 0.1, 0.2, 0.3, 0.6 and 1.0 on
  the five clients.

Each is fitted with ``FederatedHierarchicalGPRegressor(random_state=0)``
twice: at the defaults, where the clients centred on the population's noise
take the pooled clients' spread as their prior's scale
(``skfedgp.federated.noise_spread``), and with that estimate switched off
(``noise_prior_scale`` = 1 for every client, the earlier behaviour). An
exact GP (scikit-learn, one noise variance, 3 restarts) on the pooled rows
is the reference. Printed per case and seed: the estimated spread, and the
held-out RMSE, mean Gaussian NLL and share beyond 3 predictive standard
deviations of the three models; then the means. The table of docs/maths.md,
section 10 ("The prior's scale from the pooled clients") was made with it.

Usage::

    python benchmarks/bench_noise_spread.py [--cases integer continuous mixed]
        [--seeds 0 1 2 3 4 5]
"""

from __future__ import annotations

import argparse
import warnings
from unittest import mock

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp import federated as fed
from skfedgp.metrics import gaussian_nll, rmse

CASES = ("integer", "continuous", "mixed")


def make_case(case, seed, n=12, n_clients=5):
    rng = np.random.default_rng(seed)
    if case == "integer":
        X = rng.integers(0, 10, size=(n_clients * n, 1)).astype(float)
        Xt = rng.integers(0, 10, size=(500, 1)).astype(float)

        def f(x):
            return np.sin(2.5 * x[:, 0])
    else:
        X = rng.uniform(0, 10, size=(n_clients * n, 1))
        Xt = rng.uniform(0, 10, size=(500, 1))

        def f(x):
            return np.sin(x[:, 0])
    sds = np.array([0.1, 0.2, 0.3, 0.6, 1.0]) if case == "mixed" else np.full(n_clients, 0.3)
    g = np.repeat(np.arange(n_clients), n)
    y = f(X) + sds[g] * rng.standard_normal(n_clients * n)
    gt = rng.integers(0, n_clients, 500)
    yt = f(Xt) + sds[gt] * rng.standard_normal(500)
    return X, y, g, Xt, yt, gt


def scores(y, mean, std):
    return rmse(y, mean), gaussian_nll(y, mean, std), float(np.mean(np.abs(y - mean) > 3 * std))


def run(case, seed):
    X, y, g, Xt, yt, gt = make_case(case, seed)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
        out["spread"] = est.server_.population_pilot.noise_spread
        out["estimated"] = scores(yt, *est.predict(Xt, groups=gt, return_std=True))
        with mock.patch.object(fed, "noise_spread", lambda *args: None):
            est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
        out["fixed"] = scores(yt, *est.predict(Xt, groups=gt, return_std=True))
        kernel = ConstantKernel() * RBF() + WhiteKernel()
        gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=3,
                                      random_state=0).fit(X, y)
        out["exact"] = scores(yt, *gp.predict(Xt, return_std=True))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    args = ap.parse_args(argv)
    models = ("fixed", "estimated", "exact")
    for case in args.cases:
        print(f"case {case}: RMSE / NLL / beyond 3 std for {', '.join(models)}")
        rows = []
        for seed in args.seeds:
            r = run(case, seed)
            rows.append(r)
            spread = "none" if r["spread"] is None else f"{r['spread']:.2f}"
            print(f"  seed {seed}: spread {spread:>4}  " + "  ".join(
                f"{m} {r[m][0]:.3f} / {r[m][1]:.3f} / {100 * r[m][2]:.1f} %" for m in models),
                flush=True)
        print("  mean:             " + "  ".join(
            f"{m} {np.mean([r[m][0] for r in rows]):.3f} / {np.mean([r[m][1] for r in rows]):.3f}"
            f" / {100 * np.mean([r[m][2] for r in rows]):.1f} %" for m in models))


if __name__ == "__main__":
    main()
