"""Oracle scores on the pFedHGP multi-output benchmark (paper section 4).

The Oracle is :func:`skfedgp.datasets.hierarchical_oracle_predict`: the exact
joint GP posterior under the simulator's true covariance (true kernels and
loadings) over all clients' training data. Its scores are the accuracy limit
for scenarios A, B and D (Gaussian data given the loadings); in scenario C it
is the best linear predictor.

Usage (from the repository root)::

    python benchmarks/_oracle.py --seeds 5 --scenarios A B C D

Prints, per scenario, the run-level mean and 95 % t confidence interval of the
client-averaged metrics of paper eqs. 43--50 plus the ECE. The helper
:func:`oracle_scores` is meant to be imported by the Table-2 benchmark.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from skfedgp.datasets import hierarchical_oracle_predict, make_hierarchical_regression
from skfedgp.metrics import (
    coverage,
    covariance_error,
    crps_gaussian,
    expected_calibration_error,
    gaussian_nll,
    interval_width,
    output_covariance,
    rmse,
)

METRICS = ("RMSE", "NLL", "CRPS", "Cov95", "Width95", "CovErr", "ECE")


def client_scores(y_test, mean, cov, groups_test, y_test_clean, noise):
    """Client-averaged metrics (paper eqs. 43--50) of one run.

    Parameters
    ----------
    y_test : ndarray of shape (m, Q)
        Noisy test targets.
    mean : ndarray of shape (m, Q)
        Predictive means.
    cov : ndarray of shape (m, Q, Q)
        Predictive covariance blocks (with noise).
    groups_test : ndarray of shape (m,)
        Client id of every test row.
    y_test_clean : ndarray of shape (m, Q)
        Noise-free test signal (for the true output covariance, eq. 48).
    noise : float
        Simulation noise standard deviation.

    Returns
    -------
    dict
        ``METRICS`` -> float, each averaged over clients.
    """
    rows = []
    for i in np.unique(groups_test):
        k = groups_test == i
        sd = np.sqrt(np.diagonal(cov[k], axis1=1, axis2=2))
        true_cov = output_covariance(y_test_clean[k], noise_var=noise**2)  # eq. 48
        pred_cov = output_covariance(mean[k], cov[k])  # eq. 49
        rows.append([
            rmse(y_test[k], mean[k]),
            gaussian_nll(y_test[k], mean[k], y_cov=cov[k]),
            crps_gaussian(y_test[k], mean[k], sd),
            coverage(y_test[k], mean[k], sd),
            interval_width(sd),
            covariance_error(pred_cov, true_cov),
            expected_calibration_error(y_test[k], mean[k], sd),
        ])
    return dict(zip(METRICS, np.mean(rows, axis=0).tolist()))


def oracle_scores(scenario, seed, *, n_clients=6, n_samples=50, n_outputs=4, n_test=150):
    """Generate one run of the paper's benchmark and score the Oracle on it."""
    X, y, g, Xt, yt, gt, truth = make_hierarchical_regression(
        n_clients=n_clients, n_samples=n_samples, n_outputs=n_outputs,
        n_test=n_test, scenario=scenario, random_state=seed, return_truth=True,
    )
    mean, cov = hierarchical_oracle_predict(truth, X, y, g, Xt, gt)
    return client_scores(yt, mean, cov, gt, truth.y_test_clean, truth.noise)


def mean_ci(values, level=0.95):
    """Mean and half-width of the Student-t confidence interval over runs."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return float(v.mean()), float(half)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="number of runs (seeds 0..n-1)")
    parser.add_argument("--scenarios", nargs="+", default=list("ABCD"), choices=list("ABCD"))
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    print("Oracle (exact GP, true covariance), mean [95% CI] over", args.seeds, "seeds")
    print("scenario " + " ".join(f"{m:>18s}" for m in METRICS))
    for sc in args.scenarios:
        t0 = time.perf_counter()
        runs = [oracle_scores(sc, seed) for seed in range(args.seeds)]
        cells = []
        for m in METRICS:
            mu, half = mean_ci([r[m] for r in runs])
            cells.append(f"{mu:8.3f} [±{half:6.3f}]")
        print(f"{sc:>8s} " + " ".join(f"{c:>18s}" for c in cells),
              f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
