"""Per-call time of the multi-output (ILMM) structured maths.

What is measured: one :func:`skfedgp._ilmm.forward` (a client's statistics)
and one :func:`skfedgp._ilmm.backward` (its full gradient, global and local)
for ``Q`` outputs, ``R`` latents per component (global, deviation, local),
``M`` global and ``M_l`` local inducing points per latent, ``n`` rows and
1-D inputs, with complete targets and with 20 % of the entries missing
(NaN).  As a yardstick, in the same process and interleaved with it (so that
a busy machine slows both alike), the scalar structured family
(:func:`skfedgp._structured.client_forward` /
:func:`skfedgp._structured.client_backward`) on a problem of the same total
sizes: ``R M`` global and ``R M_l`` local inducing points, hence the same
feature count ``M_F = R (M + M_l)``, the same number of inducing variables
``N_u = R (2 M + M_l)`` and the same ``n``.  The scalar family needs one
Gram matrix and one map ``E``; the ILMM needs ``Q`` channel maps, so the
ratio ILMM / scalar shows what the ``Q`` channels cost on top.

Times are the best of ``--repeats`` calls with one BLAS thread (as the
federated clients run).  Run ``python benchmarks/bench_ilmm.py`` (about
1 minute on 2 cores) or ``--quick`` (the two small sizes only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from skfedgp import _ilmm  # noqa: E402
from skfedgp._parallel import single_threaded_blas  # noqa: E402
from skfedgp._structured import client_backward, client_forward, feature_blocks  # noqa: E402

COMPONENTS = ("global", "deviation", "local")
GRID = [(4, 2, 25, 25, 50), (4, 2, 72, 50, 50), (4, 2, 64, 64, 5000)]


def make_problem(Q, R, M, M_l, n, missing, seed=0):
    """ILMM and scalar-family inputs of the same total sizes (1-D inputs on [0, 10])."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0.0, 10.0, size=(n, 1)), axis=0)
    Y = np.sin(X + np.arange(Q)) + 0.1 * rng.normal(size=(n, Q))
    if missing:
        Y[rng.uniform(size=Y.shape) < missing] = np.nan
        Y[np.all(np.isnan(Y), axis=1), 0] = 0.0
    G = dict(Z_g=np.linspace(0.0, 10.0, M)[:, None], lengthscale_g=np.full((R, 1), 1.5),
             B_g=rng.normal(size=(Q, R)), phi=0.3)
    L = dict(Z_l=np.linspace(0.1, 9.9, M_l)[:, None], lengthscale_l=np.full((R, 1), 1.0),
             B_l=rng.normal(size=(Q, R)), B_d=rng.normal(size=(Q, R)),
             noise_variance=np.full(Q, 0.05), offset=np.zeros(Q))
    Gs = dict(Z_g=np.linspace(0.0, 10.0, R * M)[:, None], lengthscale_g=np.array([1.5]),
              variance_g=1.0, phi=0.3)
    Bs = dict(Z_l=np.linspace(0.1, 9.9, R * M_l)[:, None], lengthscale_l=np.array([1.0]),
              variance_l=1.0)
    return X, Y, G, L, Gs, Bs


def _best(f, repeats):
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def bench(Q, R, M, M_l, n, missing, repeats):
    """Best-of-``repeats`` seconds: ILMM forward, backward; scalar forward, backward."""
    X, Y, G, L, Gs, Bs = make_problem(Q, R, M, M_l, n, missing)
    y = np.nan_to_num(Y[:, 0])
    blocks = feature_blocks(Gs, Bs, COMPONENTS)
    st = _ilmm.forward(X, Y, G, L, COMPONENTS)
    ss = client_forward(X, y, blocks, COMPONENTS, 0.05, 0.3)
    mu, A_inv = np.zeros(st.S.shape[0]), np.eye(st.S.shape[0])
    mus, A_invs = np.zeros(ss.S.shape[0]), np.eye(ss.S.shape[0])
    t = np.full(4, np.inf)
    for _ in range(repeats):  # interleaved
        t[0] = min(t[0], _best(lambda: _ilmm.forward(X, Y, G, L, COMPONENTS), 1))
        t[1] = min(t[1], _best(lambda: _ilmm.backward(st, X, Y, mu, A_inv), 1))
        t[2] = min(t[2], _best(lambda: client_forward(X, y, blocks, COMPONENTS, 0.05, 0.3), 1))
        t[3] = min(t[3], _best(lambda: client_backward(ss, X, y, mus, A_invs), 1))
    return t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="only the two small sizes")
    args = ap.parse_args(argv)
    grid = GRID[:2] if args.quick else GRID
    print(f"{'Q':>2} {'R':>2} {'M':>4} {'M_l':>4} {'n':>5} {'miss':>5} {'M_F':>5} {'N_u':>5} | "
          f"{'ILMM fwd':>9} {'bwd':>9} | {'scalar fwd':>10} {'bwd':>9} | ratio")
    with single_threaded_blas():
        for Q, R, M, M_l, n in grid:
            for missing in (0.0, 0.2):
                t = 1e3 * bench(Q, R, M, M_l, n, missing, args.repeats)
                print(f"{Q:>2} {R:>2} {M:>4} {M_l:>4} {n:>5} {missing:>5.0%} {R * (M + M_l):>5} "
                      f"{R * (2 * M + M_l):>5} | {t[0]:>6.2f} ms {t[1]:>6.2f} ms | "
                      f"{t[2]:>7.2f} ms {t[3]:>6.2f} ms | {(t[0] + t[1]) / (t[2] + t[3]):5.2f}",
                      flush=True)
    print("times: best of the repeats, one BLAS thread; ratio = ILMM (fwd + bwd) / scalar "
          "(fwd + bwd) on the same M_F, N_u and n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
