"""The noise hyperprior's scale from the pooled small clients, against a fixed one.

Five clients of 12 points each, ``y = f(x) + noise`` (the same ``f`` for
every client), held-out points drawn at random clients. Three cases:

* ``integer``: inputs the integers 0-9, ``f(x) = sin(2.5 x)``, noise sd 0.3;
* ``continuous``: inputs uniform on [0, 10], ``f(x) = sin(x)``, noise sd 0.3;
* ``mixed``: as ``continuous`` with noise sd 0.1, 0.2, 0.3, 0.6 and 1.0 on
  the five clients;
* ``beside-large``: as ``continuous`` (noise sd 0.3), beside three clients
  of 100 points with noise sd 0.05; held-out points at the five small
  clients only (100 each);
* ``beside-large-same``: the same with noise sd 0.05 everywhere;
* ``beside-large-mixed``: the ``mixed`` clients beside the three large ones
  (noise sd 0.05).

Each is fitted with ``FederatedHierarchicalGPRegressor(random_state=0)``
three times: at the defaults (``estimated``), where the pooled clients take
their measured spread (``skfedgp.federated.noise_spread``) as their noise
prior's scale and are centred on their pooled noise when it is clearly not
the population's (``NOISE_POOLED_OFFSET``); with the pooled clients always
centred on the population's noise (``population-centre``, the behaviour
before that rule); and with the spread estimate switched off (``fixed``:
``noise_prior_scale`` = 1 for every client). An exact GP (scikit-learn, 3
restarts) on the pooled rows is the reference: with one fitted noise
variance, or, in the ``beside-large`` cases, with each client's true noise
variance given. Printed per case and seed: the estimated spread, and the
held-out RMSE, mean Gaussian NLL and share beyond 3 predictive standard
deviations of the models; then the means. The tables of docs/maths.md,
section 10 ("The prior's scale from the pooled clients") were made with it.

Usage::

    python benchmarks/bench_noise_spread.py [--cases integer continuous mixed
        beside-large beside-large-same beside-large-mixed] [--seeds 0 1 2 3 4 5]
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

CASES = ("integer", "continuous", "mixed", "beside-large", "beside-large-same",
         "beside-large-mixed")


def noise_sds(case, n_clients=5):
    """Each client's noise sd (the ``beside-large`` cases: 5 small, then 3 large)."""
    if case == "mixed":
        return np.array([0.1, 0.2, 0.3, 0.6, 1.0])
    if case == "beside-large":
        return np.r_[np.full(n_clients, 0.3), np.full(3, 0.05)]
    if case == "beside-large-same":
        return np.full(n_clients + 3, 0.05)
    if case == "beside-large-mixed":
        return np.r_[[0.1, 0.2, 0.3, 0.6, 1.0], np.full(3, 0.05)]
    return np.full(n_clients, 0.3)


def make_case(case, seed, n=12, n_clients=5):
    rng = np.random.default_rng(seed)
    if case.startswith("beside-large"):
        sds = noise_sds(case, n_clients)
        X, y, g, Xt, yt, gt = [], [], [], [], [], []
        for c in range(n_clients + 3):
            m = n if c < n_clients else 100
            x = rng.uniform(0, 10, m)
            X.append(x), y.append(np.sin(x) + sds[c] * rng.normal(size=m))
            g.append(np.full(m, c))
            if c < n_clients:
                xt = rng.uniform(0, 10, 100)
                Xt.append(xt), yt.append(np.sin(xt) + sds[c] * rng.normal(size=100))
                gt.append(np.full(100, c))
        X, y, g, Xt, yt, gt = (np.concatenate(v) for v in (X, y, g, Xt, yt, gt))
        return X[:, None], y, g, Xt[:, None], yt, gt
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
    sds = noise_sds(case, n_clients)
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
        with mock.patch.object(fed, "NOISE_POOLED_OFFSET", np.inf):
            est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
        out["population-centre"] = scores(yt, *est.predict(Xt, groups=gt, return_std=True))
        with mock.patch.object(fed, "noise_spread", lambda *args: None):
            est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
        out["fixed"] = scores(yt, *est.predict(Xt, groups=gt, return_std=True))
        if case.startswith("beside-large"):
            # each client's true noise variance given (alpha, in the
            # normalised units scikit-learn fits in)
            sds = noise_sds(case)
            gp = GaussianProcessRegressor(ConstantKernel() * RBF(),
                                          alpha=sds[g] ** 2 / np.var(y), normalize_y=True,
                                          n_restarts_optimizer=3, random_state=0).fit(X, y)
            mean, std = gp.predict(Xt, return_std=True)
            out["exact"] = scores(yt, mean, np.sqrt(std**2 + sds[gt] ** 2))
        else:
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
    models = ("fixed", "population-centre", "estimated", "exact")
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
