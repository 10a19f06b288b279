"""Rounds, time and accuracy of a default multi-output fit against the Oracle.

What is measured: ``FederatedHierarchicalGPRegressor(n_latent=2,
random_state=seed)`` (its defaults, or the estimator parameters given with
``--params``) on the paper's scenario A (6 clients x 50 points x 4 outputs,
150 test points per client; ``skfedgp.datasets.make_hierarchical_regression``),
one line per seed: rounds used, fit time, final ELBO, RMSE on the noisy test
targets, the same for the Oracle (the exact GP with the simulator's true
covariance, ``hierarchical_oracle_predict``) and their ratio, the Gaussian
NLL per test row with the full 4 x 4 blocks (``skfedgp.metrics.gaussian_nll``), 95 % coverage
and the share of test targets beyond 3 predictive std (per-output std of the
``(n, Q, Q)`` blocks). It is the measurement behind the training-speed
notes of docs/maths.md section 12: a fit that converges in fewer rounds
must not lose accuracy against the Oracle.

Usage::

    python benchmarks/bench_ilmm_training.py --seeds 0 1 2
    python benchmarks/bench_ilmm_training.py --seeds 0 --params "local_steps=50"

One default fit takes about 1-2 minutes on one core of a 2-core machine
running another job (1.5-5 minutes with ``learn_inducing_locations=True``).
"""

from __future__ import annotations

import argparse
import ast
import time
import warnings

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import hierarchical_oracle_predict, make_hierarchical_regression
from skfedgp.metrics import gaussian_nll


def parse_params(text):
    """``"a=1, b=2.5"`` -> ``{"a": 1, "b": 2.5}`` (literals only)."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, _, value = item.partition("=")
        out[key.strip()] = ast.literal_eval(value.strip())
    return out


def run(seed, params):
    X, Y, g, Xt, Yt, gt, truth = make_hierarchical_regression(
        n_clients=6, n_samples=50, n_outputs=4, n_test=150, scenario="A",
        random_state=seed, return_truth=True)
    est = FederatedHierarchicalGPRegressor(n_latent=2, random_state=seed, **params)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, Y, g)
    fit_s = time.perf_counter() - t0
    mean, cov = est.predict(Xt, gt, return_cov=True)
    mean_o, _ = hierarchical_oracle_predict(truth, X, Y, g, Xt, gt)
    rmse = float(np.sqrt(np.nanmean((mean - Yt) ** 2)))
    rmse_o = float(np.sqrt(np.nanmean((mean_o - Yt) ** 2)))
    sd = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    z = np.abs(mean - Yt) / sd
    nll = gaussian_nll(Yt, mean, y_cov=cov)
    return dict(seed=seed, rounds=est.n_iter_, fit_s=fit_s, elbo=est.elbo_history_[-1],
                rmse=rmse, rmse_oracle=rmse_o, ratio=rmse / rmse_o, nll=nll,
                cov95=float(np.mean(z < 1.959964)), beyond3=float(np.mean(z > 3.0)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--params", default="", help='estimator parameters, e.g. "local_steps=50"')
    args = ap.parse_args(argv)
    params = parse_params(args.params)
    print(f"scenario A, n_latent=2, params {params or 'defaults'}")
    rows = []
    for seed in args.seeds:
        r = run(seed, params)
        rows.append(r)
        print(f"seed {seed}: rounds {r['rounds']:3d}  fit {r['fit_s']:6.1f} s  ELBO {r['elbo']:8.1f}  "
              f"RMSE {r['rmse']:.4f} (Oracle {r['rmse_oracle']:.4f}, ratio {r['ratio']:.3f})  "
              f"NLL {r['nll']:.3f}  "
              f"cov95 {r['cov95']:.3f}  beyond 3 sd {100 * r['beyond3']:.2f} %", flush=True)
    if len(rows) > 1:
        mean = {k: np.mean([r[k] for r in rows]) for k in ("rounds", "fit_s", "ratio", "nll",
                                                           "cov95", "beyond3")}
        print(f"mean: rounds {mean['rounds']:.1f}  fit {mean['fit_s']:.1f} s  "
              f"ratio {mean['ratio']:.3f}  NLL {mean['nll']:.3f}  cov95 {mean['cov95']:.3f}  "
              f"beyond 3 sd {100 * mean['beyond3']:.2f} %")


if __name__ == "__main__":
    main()
