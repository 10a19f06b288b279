"""Multi-output regressor on real covariates: full model against global-only and exact GPs.

Beijing air quality (the UCI station files in ``DATA_DIR``): stations
Aotizhongxin, Dingling, Dongsi, Huairou and Wanliu, 60 days from 2013-11-01
at 02:00 and 14:00; each station holds out 12 random days (seeded). Targets:
log PM2.5, PM10, NO2 and CO, missing values kept as NaN; inputs: temperature,
dew point, pressure and wind speed, standardised on the training rows.

Prints per output the held-out and training RMSE, the 95 % coverage and the
share beyond 3 predictive std of: the default
``FederatedHierarchicalGPRegressor`` (full model), the same with
``components=("global",)``, and scikit-learn's exact GP per output on the
pooled rows with one-hot station columns (ARD RBF + white noise), fitted in
the same process. See docs/multioutput_accuracy.md.

Usage::

    python benchmarks/bench_multioutput_covariates.py --data-dir DATA_DIR [--seed 0]
"""
import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.metrics import coverage, rmse

STATIONS = ("Aotizhongxin", "Dingling", "Dongsi", "Huairou", "Wanliu")
OUTPUTS = ("PM2.5", "PM10", "NO2", "CO")
INPUTS = ("TEMP", "DEWP", "PRES", "WSPM")


def load(data_dir, seed, start="2013-11-01", days=60, n_test_days=12):
    """Rows of the five stations; ``test`` marks the held-out days."""
    rng = np.random.default_rng(seed)
    frames = []
    for name in STATIONS:
        found = sorted(Path(data_dir).glob(f"PRSA_Data_{name}_*.csv*"))
        if not found:
            raise SystemExit(f"no PRSA_Data_{name}_*.csv file in {data_dir!r}: --data-dir must "
                             "be the folder of the Beijing station files")
        path = found[0]
        d = pd.read_csv(path)
        d["date"] = pd.to_datetime(d[["year", "month", "day"]])
        t0 = pd.Timestamp(start)
        d = d[(d.date >= t0) & (d.date < t0 + pd.Timedelta(days=days))
              & d.hour.isin((2, 14))].copy()
        d["test"] = (d.date - t0).dt.days.isin(rng.choice(days, n_test_days, replace=False))
        frames.append(d)
    df = pd.concat(frames, ignore_index=True).dropna(subset=list(INPUTS))
    return df[~df[list(OUTPUTS)].isna().all(axis=1)].reset_index(drop=True)


def scores(Y, M, S):
    """Per output: RMSE, 95 % coverage and share beyond 3 std on the observed entries."""
    out = []
    for q in range(Y.shape[1]):
        ok = np.isfinite(Y[:, q])
        y, m, s = Y[ok, q], M[ok, q], S[ok, q]
        out.append((rmse(y, m), coverage(y, m, s, 0.95), float(np.mean(np.abs(y - m) > 3 * s))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    df = load(a.data_dir, a.seed)
    tr = ~df["test"].to_numpy()
    W = df[list(INPUTS)].to_numpy(float)
    X = (W - W[tr].mean(0)) / W[tr].std(0)
    Y = np.log(df[list(OUTPUTS)].to_numpy(float))
    g = df["station"].to_numpy().astype(str)
    print(f"{tr.sum()} training rows, {(~tr).sum()} test rows, outputs {OUTPUTS}")
    warnings.simplefilter("ignore")
    rows = []
    for name, kw in (("defaults (full)", {}), ("global only", {"components": ("global",)})):
        t0 = time.perf_counter()
        est = FederatedHierarchicalGPRegressor(random_state=a.seed, **kw).fit(X[tr], Y[tr], groups=g[tr])
        sec = time.perf_counter() - t0
        m, s = est.predict(X[~tr], groups=g[~tr], return_std=True)
        mt, st = est.predict(X[tr], groups=g[tr], return_std=True)
        rows.append((name, scores(Y[~tr], m, s), scores(Y[tr], mt, st), sec,
                     est.elbo_history_[-1]))
    onehot = (g[:, None] == np.array(STATIONS)[None, :]).astype(float)
    Z = np.column_stack([X, onehot])
    t0 = time.perf_counter()
    m, s = np.empty_like(Y), np.empty_like(Y)
    for q in range(Y.shape[1]):
        ok = tr & np.isfinite(Y[:, q])
        k = (ConstantKernel(1.0, (1e-3, 1e3)) * RBF(np.ones(Z.shape[1]), (1e-2, 1e3))
             + WhiteKernel(0.1, (1e-6, 1e1)))
        gp = GaussianProcessRegressor(k, normalize_y=True, n_restarts_optimizer=2,
                                      random_state=a.seed).fit(Z[ok], Y[ok, q])
        m[:, q], s[:, q] = gp.predict(Z, return_std=True)
    rows.append(("exact GP, one-hot stations", scores(Y[~tr], m[~tr], s[~tr]),
                 scores(Y[tr], m[tr], s[tr]), time.perf_counter() - t0, np.nan))
    print(f"{'model':28s} {'output':6s} {'RMSE':>6s} {'train':>6s} {'cov95':>6s} {'>3sd':>6s}")
    for name, test, train, sec, elbo in rows:
        for q, out in enumerate(OUTPUTS):
            print(f"{name:28s} {out:6s} {test[q][0]:6.3f} {train[q][0]:6.3f} "
                  f"{test[q][1]:6.3f} {test[q][2]:6.3f}")
        print(f"{'':28s} fit {sec:.0f} s, ELBO {elbo:.1f}")


if __name__ == "__main__":
    main()
