"""Compare the two ways of updating the variational factors of pFedHGP.

``variational_update="adam"`` is the paper's Algorithm 1 (every parameter,
variational factors included, moves by Adam steps); ``"closed_form"`` sets the
Gaussian factors to their exact optima (docs/maths.md, "Beyond the paper").
For several seeds of the synthetic hierarchical benchmark (6 clients x 50
points, 150-point test grid per client; `skfedgp.datasets`), the script fits
the full model with the estimator's defaults under each option and prints
the final training ELBO, the held-out NLL and RMSE averaged over clients,
and the fit time; then the mean over seeds and the number of seeds on which
"closed_form" is better.

Run:  python benchmarks/bench_variational_update.py [--seeds 5]
"""

import argparse
import time
import warnings

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression
from skfedgp.metrics import gaussian_nll, rmse


def per_client(metric, y, m, s, groups):
    return float(np.mean([metric(y[groups == g], m[groups == g], s[groups == g])
                          for g in np.unique(groups)]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--local-steps", type=int, default=80)
    args = p.parse_args(argv)
    rows = []
    for seed in range(args.seeds):
        X, y, g, Xt, yt, gt = make_hierarchical_regression(
            n_clients=6, n_samples=50, n_test=150, random_state=seed)
        for mode in ("adam", "closed_form"):
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = FederatedHierarchicalGPRegressor(
                    variational_update=mode, n_rounds=args.rounds,
                    local_steps=args.local_steps, random_state=seed).fit(X, y, g)
            dt = time.perf_counter() - t0
            m, s = est.predict(Xt, gt, return_std=True)
            rows.append((seed, mode, est.elbo_history_[-1],
                         per_client(lambda a, b, c: gaussian_nll(a, b, c), yt, m, s, gt),
                         per_client(lambda a, b, c: rmse(a, b), yt, m, s, gt), dt))
            print(f"seed {seed}  {mode:12s} ELBO {rows[-1][2]:9.2f}  NLL {rows[-1][3]:7.3f}  "
                  f"RMSE {rows[-1][4]:6.3f}  time {dt:6.1f}s", flush=True)
    print("\nmean over seeds")
    for mode in ("adam", "closed_form"):
        r = np.array([row[2:] for row in rows if row[1] == mode])
        print(f"  {mode:12s} ELBO {r[:, 0].mean():9.2f}  NLL {r[:, 1].mean():7.3f}  "
              f"RMSE {r[:, 2].mean():6.3f}  time {r[:, 3].mean():6.1f}s")
    a = np.array([row[2:4] for row in rows if row[1] == "adam"])
    c = np.array([row[2:4] for row in rows if row[1] == "closed_form"])
    print(f"closed_form better on ELBO in {(c[:, 0] > a[:, 0]).sum()}/{len(a)} seeds, "
          f"on held-out NLL in {(c[:, 1] < a[:, 1]).sum()}/{len(a)} seeds")


if __name__ == "__main__":
    main()
