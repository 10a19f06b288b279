"""Speed of streaming into ``AsyncDGPRegressor`` and of the aggregation.

1. Streams ``--n`` points (default 10 000, 8 synthetic inputs) into 4 experts
   with a 1 000-point window by ``partial_fit`` (Numba rank-one append and
   delete-first-point update), in chunks of 100 points, and compares the
   time per point with refactorising the window from scratch per point
   (kernel matrix + ``scipy.linalg.cholesky`` of 1 000 x 1 000), measured on
   ``--n-refactor`` points (default 200) once the window is full and
   extrapolated to ``--n`` points.
2. Aggregation cost: time of one "async" information-set update + aggregation
   and of one rBCM aggregation, with experts holding 100 and 1 000 points —
   the aggregation only sees ``(x, mu, sigma)`` tuples, so its cost does not
   depend on the data size.

Writes ``docs/async_streaming.md``.

Run:  python benchmarks/bench_async_streaming.py [--n 10000]
"""

import argparse
import os
import time

import numpy as np
from scipy.linalg import cholesky

from skfedgp import AsyncDGPRegressor
from skfedgp.async_dgp import InformationSet, aggregate
from skfedgp.kernels import se_ard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--n-refactor", type=int, default=200)
    p.add_argument("--window", type=int, default=1000)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    d, W = 8, args.window
    X = rng.uniform(-1, 1, (args.n, d))
    y = np.sin(X @ rng.standard_normal(d)) + 0.1 * rng.standard_normal(args.n)
    ell = np.full(d, 0.8)
    est = AsyncDGPRegressor(n_experts=4, lengthscale=ell, variance=1.0, noise_variance=0.01,
                            optimize_hyperparameters=False, max_points_per_expert=W,
                            partition="sequential", random_state=0)
    est.partial_fit(X[:4], y[:4])  # compile the Numba kernels
    est = AsyncDGPRegressor(**est.get_params())
    t0 = time.perf_counter()
    for a in range(0, args.n, 100):
        est.partial_fit(X[a:a + 100], y[a:a + 100])
    t_inc = time.perf_counter() - t0

    # refactorising the window of one expert from scratch, per point
    t0 = time.perf_counter()
    for k in range(args.n_refactor):
        Xw = X[k:k + W]
        K = se_ard(Xw, Xw, ell, 1.0)
        K.flat[:: W + 1] += 0.01
        cholesky(K, lower=True, check_finite=False)
    t_ref = (time.perf_counter() - t0) / args.n_refactor * args.n

    # aggregation cost vs expert size
    agg = {}
    for n_e in (100, 1000):
        info = InformationSet(10, 30.0, 1.0, 1.0, ell)
        new = [(X[i], 0.1, 0.3) for i in range(4)]
        m = AsyncDGPRegressor(n_experts=4, lengthscale=ell, variance=1.0, noise_variance=0.01,
                              optimize_hyperparameters=False, random_state=0)
        m.fit(X[: 4 * n_e], y[: 4 * n_e])
        mu, var = m.predict_experts(X[:1])
        reps = 2000
        t0 = time.perf_counter()
        for r in range(reps):
            info.update(X[r % 50], new)
            info.aggregate(X[r % 50])
        t_async = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for r in range(reps):
            aggregate(mu, var, 1.0, "rbcm")
        t_rbcm = (time.perf_counter() - t0) / reps
        agg[n_e] = (t_async, t_rbcm)

    lines = [
        "# Streaming and aggregation speed of AsyncDGPRegressor", "",
        "Produced by `python benchmarks/bench_async_streaming.py` "
        f"(n = {args.n}, 4 experts, window {W}, 8 inputs).", "",
        "| quantity | value |", "|---|---|",
        f"| partial_fit, {args.n} points (incremental, Numba) | {t_inc:.2f} s "
        f"({t_inc / args.n * 1e3:.3f} ms/point) |",
        f"| refactorising the {W}-point window per point (extrapolated from "
        f"{args.n_refactor}) | {t_ref:.2f} s ({t_ref / args.n * 1e3:.3f} ms/point) |",
        f"| speed-up | {t_ref / t_inc:.1f}x |",
    ]
    for n_e, (ta, tr) in agg.items():
        lines.append(f"| aggregation with {n_e} points per expert: async update+aggregate / rBCM "
                     f"| {ta * 1e6:.1f} us / {tr * 1e6:.1f} us |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(ROOT, "docs", "async_streaming.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
