"""Why the Beijing zones need short-scale information: the probes behind
docs/clustering.md ("What carries the zones").

On the shared year (log PM2.5 at 02:00 and 14:00, 12 stations, zones west
{Changping, Dingling}, east {Huairou, Shunyi}, urban core the other eight)
it prints adjusted Rand indices of three clusters against the zones, for:

1. pooled raw data (not federated, for reference): squared distances of the
   stations' log series after averaging over blocks of 1, 2, 7 and 30 days;
   and summaries without time alignment (each station's mean and standard
   deviation; its 19 quantiles);
2. ``operator="personal_residual"`` with other grid sizes ``K`` and other
   ``MIN_CELL_ROWS`` (module constants changed for the probe only), on one
   fitted regressor per seed (``M = 30``, ``M_i = 12``, as in
   examples/beijing_zones.py);
3. two ways of removing the noise from the cell means of the residuals,
   each a standard estimator under the assumption that the residual noise
   is independent across clients: (a) shrinking every cell mean by the
   best linear predictor of a cell effect, with the effect variance (by
   moments) and the within-cell variance pooled as medians over the
   clients; (b) subtracting the expected noise part ``s2w_i / n_ik`` of
   the squared differences (clipped at 0; a pair whose squared difference
   is below that noise part is clipped: its residuals move together).

Usage::

    python benchmarks/zones_probe.py --data-dir DATA_DIR [--seeds 5]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.cluster import SpectralClustering
from sklearn.metrics import adjusted_rand_score

import skfedgp.clustering as C
from skfedgp import FederatedHierarchicalGPRegressor, OperatorClustering
from skfedgp.datasets import load_beijing_air_quality

ZONES = {"Changping": "west", "Dingling": "west", "Huairou": "east", "Shunyi": "east"}


def spectral(D, seed=0, k=3):
    W = np.exp(-D / np.median(D[np.triu_indices(D.shape[0], 1)]))
    return SpectralClustering(k, affinity="precomputed", random_state=seed).fit_predict(W)


def sq_dist(V):
    """Mean squared difference of rows of V over the columns both observe."""
    n = V.shape[0]
    D = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            m = ~np.isnan(V[i]) & ~np.isnan(V[j])
            D[i, j] = D[j, i] = np.mean((V[i, m] - V[j, m]) ** 2)
    return D


def cell_summaries(reg, X, y, g, clients):
    """Per client: personal mean/variance at the cell centres, cell means of the
    residuals, counts, pooled within-cell variance and moment estimate of the
    cell-effect variance (cells with >= 2 rows)."""
    lo, width, counts, centres = OperatorClustering._grid(X)
    K = centres.shape[0]
    out = {}
    for c in clients:
        rows = g == c
        mu, var = OperatorClustering._personal(reg, c, centres)
        r = y[rows] - reg.predict(X[rows], [c] * int(rows.sum()))
        cell = OperatorClustering._cell_index(X[rows], lo, width, counts)
        n = np.bincount(cell, minlength=K)
        rbar = np.bincount(cell, r, K) / np.maximum(n, 1)
        keep = n >= 2
        rr = keep[cell]
        s2w = np.sum((r[rr] - rbar[cell[rr]]) ** 2) / np.sum(n[keep] - 1)
        tau2 = float(np.mean(rbar[keep] ** 2 - s2w / n[keep]))
        out[c] = dict(mu=mu, var=var, rbar=np.where(keep, rbar, 0.0), n=n, keep=keep,
                      s2w=s2w, tau2=tau2)
    return out


def denoised(S, clients, how):
    M = []
    tau2 = max(0.0, float(np.median([S[c]["tau2"] for c in clients])))
    s2 = float(np.median([S[c]["s2w"] for c in clients]))
    for c in clients:
        s = S[c]
        if how == "shrunk":
            w = np.where(s["keep"], tau2 / (tau2 + s2 / np.maximum(s["n"], 1)), 0.0)
            M.append(s["mu"] + w * s["rbar"])
        else:
            M.append(s["mu"] + s["rbar"])
    M = np.array(M)
    V = np.array([S[c]["var"].mean() for c in clients])
    D = ((M[:, None] - M[None]) ** 2).mean(-1) + V[:, None] + V[None]
    if how == "debiased":
        q = np.array([np.sum(S[c]["s2w"] / S[c]["n"][S[c]["keep"]]) / S[c]["n"].size
                      for c in clients])
        D = np.maximum(D - q[:, None] - q[None], 0.0)
    np.fill_diagonal(D, 0.0)
    return D, tau2, s2


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--data-dir", required=True,
                   help="folder holding beijing_air_quality/ with the station files")
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args(argv)
    d = load_beijing_air_quality(Path(args.data_dir) / "beijing_air_quality",
                                 start="2013-03-01", end="2014-03-01")
    X, y, g = d.data, np.log(d.target), np.asarray(d.groups)
    clients = np.unique(g)
    truth = [ZONES.get(c, "urban core") for c in clients]

    def ari(labels):
        return adjusted_rand_score(truth, labels)

    print("1. pooled raw data (not federated)")
    wide = np.log(d.frame.pivot(index="time_days", columns="station", values="PM2.5"))
    wide = wide[list(clients)]
    day = np.floor(wide.index.to_numpy()).astype(int)
    for block in (1, 2, 7, 30):
        B = wide.groupby(day // block).mean().to_numpy().T
        a = ari(spectral(sq_dist(B)))
        print(f"   log series averaged over {block:2d}-day blocks: ARI {a:.3f}")
    F = np.c_[[y[g == c].mean() for c in clients], [y[g == c].std() for c in clients]]
    print(f"   mean and sd of each station (no time alignment): "
          f"ARI {ari(spectral(((F[:, None] - F[None]) ** 2).sum(-1))):.3f}")
    Q = np.array([np.quantile(y[g == c], np.linspace(0.05, 0.95, 19)) for c in clients])
    a = ari(spectral(sq_dist(Q)))
    print(f"   19 quantiles of each station (no time alignment): ARI {a:.3f}")

    regs = []
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            regs.append(FederatedHierarchicalGPRegressor(
                n_inducing=30, n_inducing_local=12, random_state=seed).fit(X, y, groups=g))
        print(f"   fit seed {seed}: {regs[-1].n_iter_} rounds, {time.perf_counter() - t0:.0f} s",
              flush=True)

    print("2. operator='personal_residual' by grid size K and MIN_CELL_ROWS "
          f"(ARI, seeds 0..{args.seeds - 1})")
    saved = C.N_EVAL_POINTS, C.MIN_CELL_ROWS
    try:
        for mcr in (1, 2, 3):
            for K in (128, 182, 256, 365, 512):
                C.N_EVAL_POINTS, C.MIN_CELL_ROWS = K, mcr
                row = []
                for seed, reg in enumerate(regs):
                    oc = OperatorClustering(3, reg, operator="personal_residual",
                                            random_state=seed).fit(X, y, groups=g)
                    row.append(ari(oc.client_labels_))
                print(f"   MIN_CELL_ROWS {mcr}, K {K:3d} (cells {365 / K:.2f} days): "
                      + ", ".join(f"{a:.3f}" for a in row), flush=True)
    finally:
        C.N_EVAL_POINTS, C.MIN_CELL_ROWS = saved

    print("3. noise removed from the cell means (K = 256, cells with >= 2 rows)")
    summaries = [cell_summaries(reg, X, y, g, clients) for reg in regs]
    iu = np.triu_indices(len(clients), 1)
    for how in ("raw", "shrunk", "debiased"):
        row, info = [], []
        for seed, S in enumerate(summaries):
            D, tau2, s2 = denoised(S, clients, how)
            if how == "debiased":
                info.append(f"{np.mean(D[iu] == 0):.2f}")
            else:
                info.append(f"{tau2 / (tau2 + s2 / 2):.2f}")
            med = np.median(D[iu])
            row.append(f"{ari(spectral(D, seed)):.3f}" if med > 0 else "n/a (median 0)")
        extra = {"shrunk": f" (shrink factor at 2 rows per cell: {', '.join(info)})",
                 "debiased": f" (share of pairs clipped to 0: {', '.join(info)})"}.get(how, "")
        print(f"   {how:8s}: " + ", ".join(row) + extra, flush=True)


if __name__ == "__main__":
    main()
