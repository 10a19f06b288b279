"""Running SMSE of the six aggregation rules on a simulated asynchronous network
(Yang, Dai & Hirche, AAAI 2025, Fig. 3) for KIN40K and PUMADYN32NM.

Protocol (fixed before looking at any result):

* Hyperparameters: ``AsyncDGPRegressor(n_experts=4)`` (sum of the experts'
  log marginal likelihoods, L-BFGS-B) fitted on 1 000 points drawn (seed 0)
  from the *test* split; targets standardised with that subset's mean and
  standard deviation.  The streamed data never enter this step.
* Stream: the training split in its stored order, as in the paper ("the
  real-time streaming data comes from the same dataset"; GPgym streams
  ``TrainDataSet`` column by column), ``--n-stream`` points (default: all,
  10 000 for KIN40K, 7 168 for PUMADYN32NM), 4 experts with a 1 000-point
  window, each taking one streamed point per job, the default protocol and
  delay model of :func:`skfedgp.simulation.simulate_stream` (seed 0; GPgym's
  ``decision_time = 0``), ``max_info`` 4 and 10.
* Variant "on time" (a sensitivity check of the protocol, not a tuning):
  the centre aggregates half an iteration after ``x_t`` arrives
  (``decision_time = 0.5``) and jobs start at 0.1 instead of 1 iteration
  (``base_delay = 0.1``, everything else equal), so early jobs of the fast
  experts are used at their own input, as the paper describes ("computation
  time grows with data size").
* Rules: the five baselines and "async" with the "paper" convention (the
  estimator's default) and, as an extra row, with the "gpgym" constants,
  on the same deliveries.  "prior" (always predict the prior mean 0) is
  shown as the reference an SMSE of 1 corresponds to.

Writes ``docs/async_regression.md`` (table) and ``docs/async_regression.png``.

Run:  python benchmarks/async_regression.py [--data-dir DATA_DIR] [--n-stream N]
"""

import argparse
import os
import time

import numpy as np
import pandas as pd

from skfedgp import AsyncDGPRegressor
from skfedgp.simulation import simulate_stream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = {"KIN40K": "kin40k/kin40k.npz", "PUMADYN32NM": "pumadyn32nm/pumadyn32nm.npz"}


def markdown(df):
    """A DataFrame as a GitHub markdown table (index first)."""
    cols = [df.index.name or ""] + [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in df.iterrows():
        out.append("| " + " | ".join([str(idx)] + [f"{v:.4f}" for v in row]) + " |")
    return "\n".join(out)


def run_dataset(path, n_stream, max_infos):
    d = np.load(path)
    rng = np.random.default_rng(0)
    sub = rng.choice(d["X_test"].shape[0], 1000, replace=False)
    Xh, yh = d["X_test"][sub], d["y_test"][sub]
    mu, sd = yh.mean(), yh.std()
    t0 = time.perf_counter()
    hyp = AsyncDGPRegressor(n_experts=4, random_state=0).fit(Xh, (yh - mu) / sd)
    t_hyp = time.perf_counter() - t0
    X = d["X_train"][:n_stream]
    y = (d["y_train"][:n_stream] - mu) / sd
    kw = dict(lengthscale=hyp.lengthscale_, variance=hyp.variance_,
              noise_variance=hyp.noise_variance_, max_points_per_expert=1000, random_state=0)
    frames, delays = [], {}
    for variant, extra in (("", {}), (" [on time]", dict(decision_time=0.5, base_delay=0.1))):
        for I in max_infos:
            t0 = time.perf_counter()
            df, jobs = simulate_stream(X, y, max_info=I, return_jobs=True, **kw, **extra)
            done = jobs[jobs.delivered >= 0]
            delays[variant or " [default]"] = (
                f"{len(jobs)} jobs, {(done.delivered == done.input).mean():.1%} used at their "
                f"own input, mean age when used {(done.delivered - done.input).mean():.2f} "
                f"iterations, mean job {(jobs.end - jobs.start).mean():.2f} iterations")
            g = simulate_stream(X, y, max_info=I, aggregations=("async",), convention="gpgym",
                                **kw, **extra)
            g["aggregation"] = "async (gpgym)"
            df = pd.concat([df, g], ignore_index=True)
            df["aggregation"] = df["aggregation"] + variant
            if not variant:
                prior = pd.DataFrame({"iteration": np.arange(len(y)), "aggregation": "prior",
                                      "prediction": 0.0, "target": y,
                                      "smse": np.cumsum(y**2) / np.arange(1, len(y) + 1)
                                      / y.var()})
                df = pd.concat([df, prior], ignore_index=True)
            df["max_info"] = I
            frames.append(df)
            print(f"  max_info={I}{variant}: {time.perf_counter() - t0:.1f} s", flush=True)
    return pd.concat(frames, ignore_index=True), hyp, t_hyp, delays


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--data-dir", default=os.path.join(ROOT, "..", "shared", "data"))
    p.add_argument("--n-stream", type=int, default=None)
    p.add_argument("--out", default=os.path.join(ROOT, "docs"))
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    max_infos = (4, 10)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex="col")
    lines = ["# Async DGP regression benchmark (simulated network)", "",
             "Produced by `python benchmarks/async_regression.py --data-dir DATA_DIR` (`DATA_DIR/kin40k/kin40k.npz`, `DATA_DIR/pumadyn32nm/pumadyn32nm.npz`); protocol in its docstring.",
             "Final running SMSE (lower is better; predicting the prior mean gives ~1).", ""]
    for c, (name, rel) in enumerate(DATASETS.items()):
        path = os.path.join(args.data_dir, rel)
        if not os.path.exists(path):
            print(f"skipping {name}: {path} not found")
            continue
        n = args.n_stream or np.load(path)["X_train"].shape[0]
        print(f"{name}: streaming {n} points", flush=True)
        df, hyp, t_hyp, delays = run_dataset(path, n, max_infos)
        final = df[df.iteration == df.iteration.max()].pivot(
            index="aggregation", columns="max_info", values="smse")
        final.columns = [f"max_info={c}" for c in final.columns]
        print(final.round(4).to_string())
        lines += [f"## {name} ({n} streamed points, hyperparameters in {t_hyp:.1f} s: "
                  f"variance {hyp.variance_:.3g}, noise {hyp.noise_variance_:.3g}, "
                  f"min lengthscale {hyp.lengthscale_.min():.3g})", "",
                  markdown(final), ""]
        lines += [f"* {k.strip()}: {v}" for k, v in delays.items()] + [""]
        for r, I in enumerate(max_infos):
            ax = axes[r, c]
            for rule, g in df[df.max_info == I].groupby("aggregation"):
                if rule.endswith("[on time]") and not rule.startswith("async"):
                    continue  # keep the figure readable: on-time baselines in the table only
                ax.plot(g.iteration, g.smse, label=rule, lw=2.0 if rule.startswith("async") else 1.0,
                        ls="--" if rule == "prior" or rule.endswith("[on time]") else "-")
            ax.set_title(f"{name}, max_info = {I}")
            ax.set_ylabel("running SMSE")
            ax.set_ylim(0, 2.5)
        axes[1, c].set_xlabel("iteration")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    fig.savefig(os.path.join(args.out, "async_regression.png"), dpi=110)
    with open(os.path.join(args.out, "async_regression.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote docs/async_regression.md and docs/async_regression.png")


if __name__ == "__main__":
    main()
