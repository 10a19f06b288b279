"""Beijing stations with weather covariates: defaults against an exact GP.

Four stations of the Beijing Multi-Site Air-Quality data (UCI; Dongsi,
Huairou, Changping, Wanliu) are the clients. Each contributes 120 random
hourly rows of 1-21 April 2013 for training and 150 other rows of the same
weeks for testing; inputs are time (days), hour, temperature, dew point,
pressure and wind speed, the target is ``log(1 + PM2.5)``. ``--seeds``
draws the rows (seed ``s`` also seeds the regressor). Printed per seed:
held-out RMSE, mean Gaussian NLL and the share of test rows beyond 3
predictive std, with the fit time, for

* ``FederatedHierarchicalGPRegressor(random_state=seed)`` (defaults);
* scikit-learn's exact ``GaussianProcessRegressor`` on the inputs plus
  one-hot station columns (ARD RBF times a constant plus white noise,
  ``normalize_y=True``, 3 random restarts).

Time varies on a far shorter scale here (about 0.3 days) than the weather
inputs, the case of the pilots' per-input start (docs/maths.md, section
11). Usage::

    python benchmarks/bench_beijing_covariates.py [--data-dir DIR] [--seeds 0 1 2]
        [--no-exact]

``DIR`` holds the station files ``PRSA_Data_<Station>_...csv[.gz]``
(default: ``../shared/data/beijing_air_quality`` beside the repository).
"""

from __future__ import annotations

import argparse
import glob
import os
import time
import warnings

import numpy as np
import pandas as pd
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor

STATIONS = ("Dongsi", "Huairou", "Changping", "Wanliu")
FEATURES = ("t", "hour", "TEMP", "DEWP", "PRES", "WSPM")
DEFAULT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                           "beijing_air_quality")


def load(data_dir):
    """{station: DataFrame of 1-21 April 2013 with the inputs and PM2.5}."""
    frames = {}
    for s in STATIONS:
        files = sorted(glob.glob(os.path.join(data_dir, f"PRSA_Data_{s}_*.csv*")))
        if not files:
            raise FileNotFoundError(f"no PRSA_Data_{s}_*.csv[.gz] in {data_dir}")
        df = pd.read_csv(files[0])
        df = df[(df.year == 2013) & (df.month == 4) & (df.day <= 21)]
        df = df.dropna(subset=["PM2.5", "TEMP", "DEWP", "PRES", "WSPM"]).copy()
        df["t"] = (df.day - 1) + df.hour / 24.0
        frames[s] = df
    return frames


def make_case(frames, seed, n=120, n_test=150):
    """(X, y, g, X_test, y_test, g_test) of one draw of the rows."""
    rng = np.random.default_rng(seed)
    parts = [[], [], [], [], [], []]
    for c, s in enumerate(STATIONS):
        df = frames[s]
        idx = rng.permutation(len(df))
        a, b = idx[:n], idx[n:n + n_test]
        Z = df[list(FEATURES)].to_numpy(float)
        v = np.log1p(df["PM2.5"].to_numpy(float))
        for k, (rows, vals) in enumerate(((a, Z), (a, v), (a, None),
                                          (b, Z), (b, v), (b, None))):
            parts[k].append(np.full(len(rows), c) if vals is None else vals[rows])
    return tuple(np.concatenate(p) for p in parts)


def scores(y, mean, std):
    z = np.abs(y - mean) / std
    return (float(np.sqrt(np.mean((y - mean) ** 2))),
            float(np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * z**2)),
            float(np.mean(z > 3)))


def exact_one_hot(X, y, g, Xt, gt, seed):
    labels = np.unique(g)
    d = X.shape[1] + labels.size
    kernel = (ConstantKernel() * RBF(np.ones(d), length_scale_bounds=(1e-3, 1e5))
              + WhiteKernel())
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=3,
                                  random_state=seed)
    one_hot = (g[:, None] == labels[None, :]).astype(float)
    gp.fit(np.hstack([X, one_hot]), y)
    return gp.predict(np.hstack([Xt, (gt[:, None] == labels[None, :]).astype(float)]),
                      return_std=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=DEFAULT_DIR)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--no-exact", action="store_true")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    frames = load(args.data_dir)
    print(f"{'seed':>4s} {'model':18s} {'RMSE':>7s} {'NLL':>7s} {'>3 sd':>6s} {'fit s':>6s}")
    for seed in args.seeds:
        X, y, g, Xt, yt, gt = make_case(frames, seed)
        t0 = time.perf_counter()
        est = FederatedHierarchicalGPRegressor(random_state=seed).fit(X, y, groups=g)
        mean, std = est.predict(Xt, groups=gt, return_std=True)
        rows = [("skfedgp defaults", scores(yt, mean, std), time.perf_counter() - t0)]
        if not args.no_exact:
            t0 = time.perf_counter()
            mean, std = exact_one_hot(X, y, g, Xt, gt, seed)
            rows.append(("exact one-hot GP", scores(yt, mean, std), time.perf_counter() - t0))
        for name, (r, nll, out), sec in rows:
            print(f"{seed:4d} {name:18s} {r:7.3f} {nll:7.3f} {100 * out:5.1f}% {sec:6.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
