"""Tracking control with a learned, asynchronously aggregated compensation
(Yang, Dai & Hirche, AAAI 2025, Fig. 4): Monte-Carlo runs of
:func:`skfedgp.simulation.simulate_tracking` with every aggregation rule.

Protocol (docs/async_dgp.md and the authors' GPgym control test, Dai & Yang,
arXiv 2412.13276; fixed before looking at any result): plant
``x1' = x2, x2' = f(x) + u`` with :func:`skfedgp.simulation.reference_dynamics`,
reference ``0.5 sin(5 t)`` (GPgym's default), gains ``l1 = 2, l2 = 10``,
4 experts, ``max_info = 20``, at most 100 points per expert, one iteration
per control step of 0.02 s for 20 s, a noisy sample of ``f`` streamed at
every step, ``f_hat`` held over the step (RK4), ``x(0) ~ U(0, 1)^2``, the
default delay model of ``simulate_tracking`` (steps of compute grow with each
expert's data; GPgym's ``decision_time = 0``).  Kernel hyperparameters fixed
a priori from the form of ``f``: lengthscales (0.3, 1.0) (the ``sin(5 x1)``
term), signal variance 25 (amplitude 10 of that term), noise variance 0.01.
Errors per run: RMS over the run of ``||x - x_d||`` (tracking, GPgym's
``norm_e_set``) and of ``f_hat - f`` (prediction).

Writes ``docs/async_control.md`` and ``docs/async_control.png`` (violins).

Run:  python benchmarks/async_control.py [--runs 100] [--n-jobs 2]
"""

import argparse
import os
import time

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from skfedgp.simulation import simulate_tracking

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(seed):
    df = simulate_tracking(n_runs=1, random_state=int(seed))
    df["run"] = int(seed)
    return df


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--n-jobs", type=int, default=2)
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    df = pd.concat(Parallel(n_jobs=args.n_jobs)(delayed(one_run)(s) for s in range(args.runs)),
                   ignore_index=True)
    elapsed = time.perf_counter() - t0
    stats = df.groupby("aggregation", sort=False)[["tracking_error", "prediction_error"]].agg(
        ["mean", "median"])
    stats.columns = [f"{a} {b}" for a, b in stats.columns]
    wins = (df.loc[df.groupby("run")["tracking_error"].idxmin(), "aggregation"]
            .value_counts().reindex(stats.index, fill_value=0))
    stats["runs with lowest tracking error"] = wins
    print(stats.round(4).to_string())
    print(f"{args.runs} runs in {elapsed:.1f} s")
    cols = ["aggregation"] + list(stats.columns)
    lines = ["# Async DGP control benchmark", "",
             f"Produced by `python benchmarks/async_control.py --runs {args.runs}` "
             f"({elapsed:.0f} s); protocol in its docstring. Lower is better.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rule, row in stats.iterrows():
        vals = [f"{v:.4f}" for v in row.iloc[:-1]] + [str(int(row.iloc[-1]))]
        lines.append("| " + " | ".join([rule] + vals) + " |")
    with open(os.path.join(ROOT, "docs", "async_control.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    rules = list(stats.index)
    fig, axes = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for ax, col in zip(axes, ("tracking_error", "prediction_error")):
        data = [df.loc[df.aggregation == r, col].to_numpy() for r in rules]
        ax.violinplot(data, showmeans=True, showmedians=True)
        ax.set_ylabel(col.replace("_", " ") + " (RMS)")
    axes[1].set_xticks(range(1, len(rules) + 1), rules)
    axes[0].set_title(f"{args.runs} Monte-Carlo runs")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "async_control.png"), dpi=110)
    print("wrote docs/async_control.md and docs/async_control.png")


if __name__ == "__main__":
    main()
