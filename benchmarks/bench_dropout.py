"""Client dropout benchmark of the structured family.

For several data sets and seeds, three fits of
:class:`skfedgp.FederatedHierarchicalGPRegressor` at its defaults:

* ``reference``: every client answers every call;
* ``dropout``: in every round each client drops out with probability 0.2
  (:class:`RoundDropout`, injected through the documented ``fault_hook``):
  it goes offline at a random step of the round (its local phase, a
  statistics upload or a gradient upload of the server's global phase) and
  stays offline for the rest of that round; the policy retries once, then
  the server holds its last message fixed (``docs/deployment.md``). The
  set-up and the final exchange are left alone (a client failing there is
  excluded from the model, which would change the data the ELBO is about);
* ``fraction 0.8``: ``client_fraction=0.8``, no failure.

Printed per fit: the final ELBO (the exact ELBO of the returned model,
standardised units), its ratio to the reference's and the relative gap
``(ELBO_ref - ELBO) / |ELBO_ref|`` (target for dropout: at most 2 %),
rounds, failed calls, and whether any non-finite value reached the server.

Data sets: ``synthetic`` (``make_hierarchical_regression``, 8 clients of
40 points), ``beijing`` (12 stations, log PM2.5 at 14:00 against the day,
March to June 2013) and ``kin40k`` (6 clients of 150 random training
points, 8 inputs). Every fit uses the same ``--n-rounds`` and ``--tol``
(default: the estimator's, 100 and 1e-4). The real data sets are read from ``--data-dir`` (default
``../shared/data`` from the repository root) and skipped, with the reason,
when absent.

Usage (from the repository root)::

    python benchmarks/bench_dropout.py [--data-dir DIR] [--seeds K] [--first-seed S]
        [--only synthetic,kin40k]
        [--n-rounds R] [--tol TOL]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import skfedgp._structured as structured  # noqa: E402
from skfedgp import FederatedHierarchicalGPRegressor  # noqa: E402
from skfedgp.datasets import load_beijing_air_quality, make_hierarchical_regression  # noqa: E402

#: Probability that a client drops out in a round.
DROP = 0.2
#: Target: the dropout run's final ELBO within this relative gap of the reference's.
TARGET_GAP = 0.02
#: Protocol steps of a round at which a client may go offline, in their order.
STAGES = ("local_phase", "statistics", "global_gradient")


class RoundDropout:
    """Fault hook: each round, each client goes offline with probability ``p``.

    The offline clients and the step at which each goes offline are drawn
    from ``numpy.random.default_rng([seed, round])`` (reproducible). A
    client offline from a step fails that call and every later one of the
    round. Only the rounds' own steps are affected: a statistics or gradient
    call counts only after the round's local phase has started, so the
    set-up, a round-start evaluation and the final exchange are left alone.
    """

    def __init__(self, p, seed):
        self.p = p
        self.seed = seed
        self.plan = {}
        self.local_started = set()
        self.n_dropped = 0

    def _round_plan(self, r, cid):
        if r not in self.plan:
            self.plan[r] = (np.random.default_rng([self.seed, r]), {})
        rng, plan = self.plan[r]
        if cid not in plan:
            plan[cid] = (int(rng.integers(len(STAGES))) if rng.random() < self.p else None)
            self.n_dropped += plan[cid] is not None
        return plan[cid]

    def __call__(self, cid, method, r):
        if method not in STAGES or r < 1:
            return
        if method == "local_phase":
            self.local_started.add(r)
        elif r not in self.local_started:
            return  # a round-start evaluation or the final exchange
        stage = self._round_plan(r, cid)
        if stage is not None and STAGES.index(method) >= stage:
            raise ConnectionError(f"client {cid!r} offline in round {r}")


def _synthetic(seed, data_dir):
    X, y, g = make_hierarchical_regression(n_clients=8, n_samples=40, random_state=seed)
    return X, y, g


def _beijing(seed, data_dir):
    path = Path(data_dir) / "beijing_air_quality"
    if not path.is_dir():
        return f"{path} not found"
    data = load_beijing_air_quality(path, hours=(14,), start="2013-03-01", end="2013-07-01")
    keep = data.target > 0
    return data.data[keep], np.log(data.target[keep]), data.groups[keep]


def _kin40k(seed, data_dir):
    path = Path(data_dir) / "kin40k" / "kin40k.npz"
    if not path.is_file():
        return f"{path} not found"
    d = np.load(path)
    rng = np.random.default_rng(seed)
    idx = rng.choice(d["X_train"].shape[0], 6 * 150, replace=False)
    return d["X_train"][idx], d["y_train"][idx], np.repeat(np.arange(6), 150)


DATASETS = {"synthetic": _synthetic, "beijing": _beijing, "kin40k": _kin40k}


def _fit(X, y, g, seed, n_rounds, tol, **kw):
    nonfinite = []
    orig = structured.combine

    def spy(S, b, e, M):
        if not all(np.all(np.isfinite(a)) for a in list(S) + list(b) + [np.asarray(e)]):
            nonfinite.append(True)
        return orig(S, b, e, M)

    structured.combine = spy
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            est = FederatedHierarchicalGPRegressor(random_state=seed, n_rounds=n_rounds, tol=tol,
                                                   **kw).fit(X, y, g)
            seconds = time.perf_counter() - t0
    finally:
        structured.combine = orig
    return est, seconds, bool(nonfinite)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--only", default=",".join(DATASETS))
    p.add_argument("--n-rounds", type=int, default=100)
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args(argv)
    common = dict(n_rounds=args.n_rounds, tol=args.tol)
    print(f"n_rounds={args.n_rounds}, tol={args.tol:g}, dropout probability {DROP}")
    print(f"{'data':10s} {'seed':>4s} {'run':13s} {'ELBO':>12s} {'ratio':>8s} {'gap':>8s} "
          f"{'rounds':>6s} {'failed':>6s} {'NaN':>4s} {'time s':>7s}")
    worst = -np.inf
    for name in args.only.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            data = DATASETS[name](seed, args.data_dir)
            if isinstance(data, str):
                print(f"{name:10s} skipped: {data}")
                break
            X, y, g = data
            ref, t_ref, nan_ref = _fit(X, y, g, seed, **common)
            hook = RoundDropout(DROP, seed)
            runs = [("reference", ref, t_ref, nan_ref),
                    ("dropout 0.2", *_fit(X, y, g, seed, fault_hook=hook, **common)),
                    ("fraction 0.8", *_fit(X, y, g, seed, client_fraction=0.8, **common))]
            e_ref = ref.elbo_history_[-1]
            for label, est, secs, nan in runs:
                e = est.elbo_history_[-1]
                gap = (e_ref - e) / abs(e_ref)
                if label == "dropout 0.2":
                    worst = max(worst, gap)
                    assert len(est.clients_) == len(ref.clients_)  # nobody excluded
                print(f"{name:10s} {seed:4d} {label:13s} {e:12.4f} {e / e_ref:8.4f} "
                      f"{gap:8.2%} {est.n_iter_:6d} {len(est.failed_clients_):6d} "
                      f"{'yes' if nan else 'no':>4s} {secs:7.1f}", flush=True)
    print(f"largest dropout gap {worst:.2%} (target <= {TARGET_GAP:.0%}): "
          f"{'PASS' if worst <= TARGET_GAP else 'FAIL'}")


if __name__ == "__main__":
    main()
