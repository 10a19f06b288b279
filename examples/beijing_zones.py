"""Discover zones of Beijing monitoring stations with OperatorClustering.

Each of the 12 stations is a federated client; the target is ``log(PM2.5)``
(ug/m^3) at 02:00 and 14:00 of every day of the shared year
(2013-03-01 .. 2014-02-28); the input is the time in days. A
:class:`~skfedgp.FederatedHierarchicalGPRegressor` (``M = 30``,
``M_i = 12``, the paper's air-quality setting) is fitted federatedly, then
:class:`~skfedgp.OperatorClustering` groups the stations into 3 clusters
from per-station summaries (``--operator``: any of ``personal_residual``
(the only one that recovers the zones), ``personal`` (the default of
:class:`~skfedgp.OperatorClustering`), ``published`` (the paper's),
``posterior``; all four by default, on one fitted regressor per seed;
``--n-inducing`` and ``--n-inducing-local`` change ``M`` and ``M_i``).
The adjusted Rand index is computed against the paper's zones: west suburb
{Changping, Dingling}, east suburb {Huairou, Shunyi}, urban core = the other
eight. Repeated over ``--seeds`` (the regressor's and the clustering's seed).

Saves ``zones_dissimilarity.png`` (the dissimilarity heat map of the last
seed, first operator listed) and ``zones_stations.png`` (stations at their
approximate map positions, coloured by cluster) in ``--out-dir``.

Usage::

    python examples/beijing_zones.py --data-dir DATA_DIR

Run with ``--help`` for all options.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

from skfedgp import FederatedHierarchicalGPRegressor, OperatorClustering
from skfedgp.clustering import _OPERATORS
from skfedgp.datasets import load_beijing_air_quality

REPO = Path(__file__).resolve().parents[1]
ZONES = {"Changping": "west suburb", "Dingling": "west suburb",
         "Huairou": "east suburb", "Shunyi": "east suburb"}
#: Approximate station positions (longitude E, latitude N), for the figure only.
POSITIONS = {
    "Aotizhongxin": (116.40, 39.98), "Changping": (116.23, 40.22),
    "Dingling": (116.22, 40.29), "Dongsi": (116.42, 39.93),
    "Guanyuan": (116.34, 39.93), "Gucheng": (116.18, 39.91),
    "Huairou": (116.63, 40.33), "Nongzhanguan": (116.46, 39.94),
    "Shunyi": (116.66, 40.13), "Tiantan": (116.41, 39.88),
    "Wanliu": (116.29, 39.99), "Wanshouxigong": (116.35, 39.88),
}


def figures(oc, out_dir, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(oc.clients_)
    fig, ax = plt.subplots(figsize=(6, 5))
    im = ax.imshow(oc.dissimilarity_, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    fig.colorbar(im, ax=ax, label="rho (dissimilarity)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "zones_dissimilarity.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for name, lab in zip(names, oc.client_labels_):
        lon, lat = POSITIONS.get(name, (np.nan, np.nan))
        ax.scatter(lon, lat, color=f"C{lab}", s=60,
                   marker="s" if name in ZONES else "o")
        ax.annotate(name, (lon, lat), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("longitude (deg E)")
    ax.set_ylabel("latitude (deg N)")
    ax.set_title(title + "\ncolour = cluster, square = suburb station (paper)", fontsize=9)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "zones_stations.png", dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True,
                   help="folder holding beijing_air_quality/ with the station files")
    p.add_argument("--out-dir", default=str(REPO / "docs"))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--operator", nargs="+", choices=_OPERATORS,
                   default=["personal_residual", "personal", "published", "posterior"],
                   help="operators to compare (all on the same fitted regressor per seed; "
                        "the figures show the first)")
    p.add_argument("--n-inducing", type=int, default=30, help="M (default 30, the paper's)")
    p.add_argument("--n-inducing-local", type=int, default=12,
                   help="M_i (default 12, the paper's)")
    p.add_argument("--n-rounds", type=int, default=None,
                   help="maximum rounds (default: the regressor's own stopping rule)")
    p.add_argument("--local-steps", type=int, default=None)
    args = p.parse_args(argv)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)  # before the long fits

    folder = Path(args.data_dir) / "beijing_air_quality"
    if not folder.is_dir():
        raise SystemExit(f"Beijing data folder {folder} not found; pass --data-dir")
    d = load_beijing_air_quality(folder, start="2013-03-01", end="2014-03-01")
    X, y, g = d.data, np.log(d.target), d.groups
    # reference (not federated: pools the raw series): departures of each
    # station from the 12-station mean, same affinity and spectral clustering
    from sklearn.cluster import SpectralClustering

    wide = d.frame.pivot(index="time_days", columns="station", values="PM2.5")
    dep = np.log(wide).sub(np.log(wide).mean(axis=1), axis=0).fillna(0.0).to_numpy()
    D = ((dep[:, :, None] - dep[:, None, :]) ** 2).mean(axis=0)
    W = np.exp(-D / np.median(D[np.triu_indices(D.shape[0], 1)]))
    ref = SpectralClustering(3, affinity="precomputed", random_state=0).fit_predict(W)
    truth = [ZONES.get(c, "urban core") for c in wide.columns]
    print(f"reference (pooled raw departures): ARI {adjusted_rand_score(truth, ref):.3f}")
    aris = {op: [] for op in args.operator}
    budget = {k: v for k, v in (("n_rounds", args.n_rounds), ("local_steps", args.local_steps))
              if v is not None}
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        reg = FederatedHierarchicalGPRegressor(
            n_inducing=args.n_inducing, n_inducing_local=args.n_inducing_local,
            random_state=seed, **budget).fit(X, y, groups=g)
        t1 = time.perf_counter()
        for op in args.operator:
            oc = OperatorClustering(3, reg, operator=op, random_state=seed)
            oc.fit(X, y, groups=g)
            truth = [ZONES.get(c, "urban core") for c in oc.clients_]
            ari = adjusted_rand_score(truth, oc.client_labels_)
            aris[op].append(ari)
            groups = {}
            for c, lab in zip(oc.clients_, oc.client_labels_):
                groups.setdefault(int(lab), []).append(str(c))
            print(f"seed {seed} ({reg.n_iter_} rounds, fit {t1 - t0:.0f} s) operator={op}: "
                  f"ARI {ari:.3f} clusters {list(groups.values())}", flush=True)
            if seed == args.seeds - 1 and op == args.operator[0]:
                figures(oc, args.out_dir, f"operator={op}, seed {seed}: ARI {ari:.2f}")
    for op, a in aris.items():
        print(f"operator={op}: ARI mean {np.mean(a):.3f}, min {np.min(a):.3f}, "
              f"max {np.max(a):.3f} over {args.seeds} seed(s)")


if __name__ == "__main__":
    main()
