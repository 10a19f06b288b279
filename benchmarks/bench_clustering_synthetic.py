"""OperatorClustering on synthetic groups of clients: ARI per seed and operator.

Each case draws clients in known groups, fits one regressor per seed and
clusters its clients with every operator compared (all on that one fit).
Printed: the adjusted Rand index against the true groups, per seed.

Cases (3 clients per group, inputs drawn per client, Gaussian noise):

* ``freq``: ``sin x`` against ``sin 3x`` on [0, 10], 40 points, noise 0.1,
  the default regressor of :class:`~skfedgp.OperatorClustering`.
* ``freq_default``: the same with a default
  :class:`~skfedgp.FederatedHierarchicalGPRegressor`.
* ``bump``: ``sin x`` against ``sin x`` plus a bump ``exp(-(x - 5)^2 / 0.5)``.
* ``bump_cos``: three groups, ``sin x``, plus the bump, plus ``0.5 cos 2x``.
* ``levels``: ``sin x`` shifted by -1.5 and +1.5 (all clients on one grid).
* ``noisy_bump``: ``bump`` with noise 0.5 instead of 0.1.
* ``dense_noisy_bump``: ``noisy_bump`` with 600 points per client (about
  2.3 rows per cell of ``"personal_residual"``, so most cells report a
  residual mean: the case where its correction adds the most noise).
* ``dense_freq``: ``freq`` with 600 points per client and noise 0.5.
* ``faint_bump``: ``sin x`` against ``sin x`` plus ``0.5 exp(-(x - 5)^2 /
  0.5)``, noise 1.0, 600 points per client (a faint smooth difference
  under much noise).
* ``faint_bump_2000``: the same with 2000 points per client.
* ``rough``: 6 clients on one grid of 600 points over [0, 300]; every client
  sees a common rough signal plus its group's rough signal (both random
  values per unit interval, sd 1 and 0.5) and noise 0.3; fitted with
  ``M = 10``, ``M_i = 4``, which cannot resolve unit-scale structure (the
  situation of the Beijing zones at ``M = 30``).

Usage::

    python benchmarks/bench_clustering_synthetic.py [--cases ...] [--seeds 4]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.metrics import adjusted_rand_score

from skfedgp import FederatedHierarchicalGPRegressor, OperatorClustering
from skfedgp.clustering import default_clustering_regressor


def _groups_of(n_groups, per=3):
    return np.repeat(np.arange(n_groups), per)


def make_case(name, seed):
    """``(X, y, groups, truth, regressor)`` of one case and seed."""
    rng = np.random.default_rng(seed)
    n, noise = 40, 0.1
    reg = default_clustering_regressor()
    if name == "rough":
        n_pts, span = 600, 300
        x = np.linspace(0, span, n_pts)
        common = rng.standard_normal(span + 1)
        own = 0.5 * rng.standard_normal((2, span + 1))
        truth = _groups_of(2)
        X = np.tile(x, truth.size)[:, None]
        cell = np.floor(x).astype(int)
        y = np.concatenate([common[cell] + own[t][cell] + 0.3 * rng.standard_normal(n_pts)
                            for t in truth])
        g = np.repeat(np.arange(truth.size), n_pts)
        reg = FederatedHierarchicalGPRegressor(n_inducing=10, n_inducing_local=4)
        return X, y, g, truth, reg
    if name == "levels":
        truth = _groups_of(2)
        x = np.linspace(0, 10, n)
        X = np.tile(x, truth.size)[:, None]
        y = np.concatenate([np.sin(x) + (1.5 if t else -1.5) + noise * rng.standard_normal(n)
                            for t in truth])
        return X, y, np.repeat(np.arange(truth.size), n), truth, reg
    funcs = {
        "freq": (np.sin, lambda x: np.sin(3 * x)),
        "bump": (np.sin, lambda x: np.sin(x) + np.exp(-(x - 5) ** 2 / 0.5)),
        "faint_bump": (np.sin, lambda x: np.sin(x) + 0.5 * np.exp(-(x - 5) ** 2 / 0.5)),
        "bump_cos": (np.sin, lambda x: np.sin(x) + np.exp(-(x - 5) ** 2 / 0.5),
                     lambda x: np.sin(x) + 0.5 * np.cos(2 * x)),
    }
    base = {"freq_default": "freq", "noisy_bump": "bump", "dense_noisy_bump": "bump",
            "dense_freq": "freq", "faint_bump_2000": "faint_bump"}.get(name, name)
    if name in ("noisy_bump", "dense_noisy_bump", "dense_freq"):
        noise = 0.5
    if name.startswith(("dense", "faint")):
        n = 600
    if base == "faint_bump":
        noise = 1.0
        n = 2000 if name.endswith("2000") else 600
    if name == "freq_default":
        reg = FederatedHierarchicalGPRegressor()
    fs = funcs[base]
    truth = _groups_of(len(fs))
    X = rng.uniform(0, 10, (truth.size * n, 1))
    g = np.repeat(np.arange(truth.size), n)
    y = np.array([fs[truth[c]](x) for c, x in zip(g, X[:, 0])])
    y = y + noise * rng.standard_normal(g.size)
    return X, y, g, truth, reg


CASES = ("freq", "freq_default", "bump", "bump_cos", "levels", "noisy_bump",
         "dense_noisy_bump", "dense_freq", "faint_bump", "faint_bump_2000", "rough")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--operator", nargs="+",
                   default=["personal", "personal_residual", "published"])
    args = p.parse_args(argv)
    print("nan: the operator raised FloatingPointError (kernel underflow)")
    for case in args.cases:
        aris = {op: [] for op in args.operator}
        t0 = time.perf_counter()
        for seed in range(args.seeds):
            X, y, g, truth, reg = make_case(case, seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                reg.set_params(random_state=seed).fit(X, y, groups=g)
                for op in args.operator:
                    try:
                        oc = OperatorClustering(len(set(truth)), reg, operator=op,
                                                random_state=seed).fit(X, y, groups=g)
                    except FloatingPointError:  # the published operator's kernel underflows
                        aris[op].append(np.nan)
                        continue
                    aris[op].append(adjusted_rand_score(truth, oc.client_labels_))
        for op, a in aris.items():
            print(f"{case:13s} {op:18s} ARI per seed {', '.join(f'{v:.3f}' for v in a)} "
                  f"(mean {np.mean(a):.3f})", flush=True)
        print(f"{case:13s} {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
