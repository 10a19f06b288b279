"""Main job of skfedgp: ``python -m skfedgp``.

Fits pFedHGP (:class:`skfedgp.FederatedHierarchicalGPRegressor`) and two
ablations on an embedded default problem that the package generates itself,
then prints a metrics table and the communication totals and saves a figure.

The default problem (:func:`skfedgp.datasets.make_hierarchical_regression`)
is one where sharing matters: 8 data-poor clients with 12 training inputs
each, uniform on ``[0, 10]``, around a strong shared function, and a
100-point test grid over the whole interval per client. Every client's
function is a shared global GP draw (lengthscale 1.5, variance 1), plus a
small deviation of its own (same kernel, ``phi = 0.1``), plus a small
short-lengthscale local GP (lengthscale 0.6, variance 0.05), plus noise of
standard deviation 0.1. No client can learn the function from its own 12
points (Local-only extrapolates poorly between and beyond them), and no
single function fits every client (Global-only misses the deviations).

Models (paper section 4.4):

* **pFedHGP** -- ``components=("global", "deviation", "local")``;
* **Local-only** -- ``components=("local",)``: independent per-client sparse
  GPs, nothing shared;
* **Global-only** -- ``components=("global",)``: one shared sparse GP, with a
  noise variance per client.

Every other estimator parameter keeps its default (structured variational
family, L-BFGS, ``n_inducing="auto"``, data-derived initial values, ...);
``random_state`` and, if given, ``n_rounds`` (the maximum number of rounds)
come from the command line.

Metrics (pFedHGP section 4.5, eqs. 43--47): RMSE, negative log predictive
density (NLL, nats per test point), CRPS, empirical coverage and mean width of
the central 95 % predictive interval, each computed per client on its test
grid and then averaged over clients, as the paper does (eq. 43). The
predictive distribution is that of a new noisy observation
(``predict(..., return_std=True)``).

Communication: the sum over all rounds (including the set-up exchange,
round 0) of the bytes uploaded by the clients and downloaded from the server
(``communication_``), and the upload of one client in the last training round
(round 1's entry also counts the extra runs of ``restart_from_global``, so a
one-round run shows them too).

Run ``python -m skfedgp --help`` for the options.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from . import __version__
from .datasets import make_hierarchical_regression
from .metrics import coverage, crps_gaussian, gaussian_nll, interval_width, rmse
from .regressor import FederatedHierarchicalGPRegressor

__all__ = ["MODELS", "METRICS", "build_parser", "client_averaged_metrics", "main"]

#: (display name, ``components``) of the models fitted by the main job.
MODELS = (
    ("pFedHGP", ("global", "deviation", "local")),
    ("Local-only", ("local",)),
    ("Global-only", ("global",)),
)
#: Column names of the metrics table, in order.
METRICS = ("RMSE", "NLL", "CRPS", "coverage_95", "width_95")

#: Embedded default problem (see the module docstring).
N_CLIENTS = 8
N_SAMPLES = 12
N_TEST = 100
#: Generator settings of the embedded problem (see the module docstring).
PROBLEM = dict(phi=0.1, global_lengthscale=1.5, global_variance=1.0, local_lengthscale=0.6,
               local_variance=0.05, noise=0.1)
#: Number of clients drawn in the figure.
N_PLOTTED = 3


def _int_at_least(minimum, maximum=None):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return parse


def build_parser():
    """Command-line parser of ``python -m skfedgp``.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        prog="python -m skfedgp",
        description=(
            "Fit pFedHGP and its Local-only and Global-only ablations on synthetic "
            "hierarchical data (8 data-poor clients x 12 points around a shared function), "
            "print client-averaged test "
            "metrics and communication totals, and save a figure."
        ),
    )
    parser.add_argument(
        "--rounds", type=_int_at_least(1), default=None,
        help="maximum number of communication rounds (n_rounds; default: the "
             "estimator's, training stops earlier when the ELBO has converged)",
    )
    parser.add_argument(
        "--seed", type=_int_at_least(0, 2**32 - 1), default=0,
        help="seed of the synthetic data and of the estimators (default: %(default)s)",
    )
    parser.add_argument(
        "--output", default="skfedgp_demo.png",
        help="path of the PNG figure (default: %(default)s in the current directory)",
    )
    parser.add_argument(
        "--quiet", action="store_true",
        help="do not print per-round training progress",
    )
    return parser


def client_averaged_metrics(y_true, y_mean, y_std, groups):
    """Test metrics computed per client, then averaged over clients.

    Parameters
    ----------
    y_true, y_mean, y_std : ndarray of shape (n,)
        Test targets, predictive means and predictive standard deviations
        (target units; ``y_std`` strictly positive).
    groups : ndarray of shape (n,)
        Client label of every test point.

    Returns
    -------
    dict
        ``{name: value}`` for every name in :data:`METRICS`: RMSE (eq. 43),
        Gaussian NLL in nats per test point (eq. 44, marginal form), CRPS
        (eq. 45), coverage (eq. 46) and mean width (eq. 47) of the central
        95 % interval, each the unweighted mean over clients of the
        per-client value (pFedHGP section 4.5).

    Raises
    ------
    ValueError
        As the functions of :mod:`skfedgp.metrics` (shape mismatch,
        non-finite values, non-positive ``y_std``), or if the four arrays
        are not 1-D of one length.
    """
    y_true, y_mean, y_std, groups = (np.asarray(a) for a in (y_true, y_mean, y_std, groups))
    lengths = {"y_true": y_true.shape, "y_mean": y_mean.shape, "y_std": y_std.shape,
               "groups": groups.shape}
    if groups.ndim != 1 or len({s for s in lengths.values()}) != 1:
        raise ValueError(
            "y_true, y_mean, y_std and groups must be 1-D of the same length (one client "
            "label per test point); got shapes "
            + ", ".join(f"{k} {v}" for k, v in lengths.items()))
    per_client = []
    for label in np.unique(groups):
        k = groups == label
        per_client.append({
            "RMSE": rmse(y_true[k], y_mean[k]),
            "NLL": gaussian_nll(y_true[k], y_mean[k], y_std[k]),
            "CRPS": crps_gaussian(y_true[k], y_mean[k], y_std[k]),
            "coverage_95": coverage(y_true[k], y_mean[k], y_std[k], level=0.95),
            "width_95": interval_width(y_std[k], level=0.95),
        })
    return {name: float(np.mean([m[name] for m in per_client])) for name in METRICS}


def _format_bytes(n):
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n} B"  # pragma: no cover - unreachable


def _metrics_table(results):
    head = f"{'model':<12}" + "".join(f"{m:>13}" for m in METRICS) + f"{'fit time':>11}"
    lines = [head, "-" * len(head)]
    for name, res in results.items():
        row = f"{name:<12}" + "".join(f"{res['metrics'][m]:>13.4f}" for m in METRICS)
        lines.append(row + f"{res['fit_time']:>10.1f}s")
    return "\n".join(lines)


def _communication_table(results, n_clients):
    head = (f"{'model':<12}{'rounds':>7}{'up/client/round':>17}"
            f"{'total up':>12}{'total down':>12}")
    lines = [head, "-" * len(head)]
    for name, res in results.items():
        comm = res["estimator"].communication_
        n_rounds = res["estimator"].n_iter_
        # the last training round (not the final exchange): round 1's entry
        # also counts any extra runs (restart_from_global)
        rounds = [c["bytes_up"] for c in comm if 0 < c["round"] <= n_rounds]
        per_client = rounds[-1] / n_clients if rounds else 0.0
        up = sum(c["bytes_up"] for c in comm)
        down = sum(c["bytes_down"] for c in comm)
        lines.append(
            f"{name:<12}{n_rounds:>7}{_format_bytes(per_client):>17}"
            f"{_format_bytes(up):>12}{_format_bytes(down):>12}"
        )
    return "\n".join(lines)


def _save_figure(path, results, data, clients):
    """Figure: per client, data + fits (top) and the pFedHGP components (bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    X, y, groups, X_test, y_test, groups_test = data
    full = results["pFedHGP"]["estimator"]
    z = 1.959963984540054  # norm.ppf(0.975)
    fig = Figure(figsize=(4.2 * len(clients), 6.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(clients), sharex=True, squeeze=False)
    colours = {"global": "tab:blue", "deviation": "tab:orange", "local": "tab:green"}
    for j, client in enumerate(clients):
        tr = groups == client
        te = groups_test == client
        order = np.argsort(X_test[te, 0])
        xs = X_test[te][order]
        x1 = xs[:, 0]
        g = groups_test[te][order]
        top, bottom = axes[0, j], axes[1, j]

        mean, std = full.predict(xs, g, return_std=True)
        top.fill_between(x1, mean - z * std, mean + z * std, color="tab:purple", alpha=0.2,
                         lw=0, label="pFedHGP 95 % band")
        top.plot(x1, y_test[te][order], color="0.55", lw=0.8, label="test targets")
        top.plot(x1, mean, color="tab:purple", lw=1.6, label="pFedHGP mean")
        for name, style in (("Local-only", ":"), ("Global-only", "--")):
            m = results[name]["estimator"].predict(xs, g)
            top.plot(x1, m, color="k", ls=style, lw=1.0, label=f"{name} mean")
        top.plot(X[tr, 0], y[tr], "o", ms=3.5, mfc="white", mec="k", mew=0.8,
                 label="training data")
        top.set_title(f"client {client}")

        parts = full.predict_components(xs, g)
        parts.pop("offset", None)
        for name, (m, s) in parts.items():
            c = colours.get(name, "k")
            bottom.fill_between(x1, m - z * s, m + z * s, color=c, alpha=0.18, lw=0)
            bottom.plot(x1, m, color=c, lw=1.4, label=name)
        bottom.axhline(0.0, color="0.7", lw=0.6)
        bottom.set_xlabel("x")
    axes[0, 0].set_ylabel("y")
    axes[1, 0].set_ylabel("component (offset removed)")
    axes[0, 0].legend(fontsize=7, loc="best")
    axes[1, 0].legend(fontsize=7, loc="best")
    fig.suptitle("skfedgp main job: pFedHGP on synthetic hierarchical data "
                 "(bands: mean +/- 1.96 sd)", fontsize=10)
    fig.savefig(path, dpi=110)


def main(argv=None):
    """Run the main job.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status, 0 on success.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    output = Path(args.output).expanduser()
    if output.suffix.lower() != ".png":
        parser.error(f"--output must name a .png file, got {str(output)!r}")
    if not output.parent.is_dir():
        parser.error(f"the folder of --output does not exist: {str(output.parent)!r}")
    if output.is_dir():
        parser.error(f"--output names a folder, not a file: {str(output)!r}")
    # before the fits, not after them: the file must be writable
    existed = output.exists()
    try:
        with open(output, "ab"):
            pass
    except OSError as exc:
        parser.error(f"--output cannot be written: {str(output)!r} ({exc.strerror})")
    if not existed:
        output.unlink()

    t_start = time.perf_counter()
    data = make_hierarchical_regression(
        n_clients=N_CLIENTS, n_samples=N_SAMPLES, n_test=N_TEST, random_state=args.seed,
        **PROBLEM,
    )
    X, y, groups, X_test, y_test, groups_test = data
    print(
        f"skfedgp {__version__} main job: synthetic hierarchical data, {N_CLIENTS} clients x "
        f"{N_SAMPLES} training points, {N_TEST}-point test grid per client (seed {args.seed}); "
        f"estimator defaults" + (f", at most {args.rounds} rounds" if args.rounds else ""),
        flush=True,
    )

    results = {}
    for name, components in MODELS:
        if not args.quiet:
            print(f"\n== fitting {name}: components={components}", flush=True)
        est = FederatedHierarchicalGPRegressor(
            components=components,
            n_rounds=args.rounds,
            random_state=args.seed,
            verbose=0 if args.quiet else 1,
        )
        t0 = time.perf_counter()
        est.fit(X, y, groups)
        fit_time = time.perf_counter() - t0
        mean, std = est.predict(X_test, groups_test, return_std=True)
        results[name] = {
            "estimator": est,
            "fit_time": fit_time,
            "metrics": client_averaged_metrics(y_test, mean, std, groups_test),
        }

    print("\nTest metrics, averaged over clients (NLL in nats per point; lower is better "
          "except coverage_95, ideally 0.95):")
    print(_metrics_table(results))
    print("\nCommunication (set-up exchange + all rounds; float64 payloads):")
    print(_communication_table(results, N_CLIENTS))

    clients = list(np.unique(groups_test))[:N_PLOTTED]
    _save_figure(output, results, data, clients)
    print(f"\nFigure saved to {output} (clients {', '.join(str(c) for c in clients)}); "
          f"total time {time.perf_counter() - t_start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through `python -m skfedgp`
    sys.exit(main())
