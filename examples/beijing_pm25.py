"""pFedHGP on the Beijing Multi-Site Air-Quality data: 12 stations, one year.

Each of the 12 monitoring stations is a federated client. The target is
``log(PM2.5)`` (PM2.5 in ug/m^3, natural logarithm) at 02:00 and 14:00 of every
day in the station files (2013-03-01 to 2014-02-28 with the one-year files;
the loader keeps every date it finds); the single input is the time in days. From
every station, 20 % of its *days* are held out (both readings of a held-out
day go to the test set; seeded with ``--seed``, each station draws its own
days), the rest is training data.

Four methods are compared on the held-out readings (metrics on the log scale,
computed per station and then averaged over the stations):

* **pFedHGP** -- :class:`skfedgp.FederatedHierarchicalGPRegressor` with the
  global, deviation and local components;
* **Local-only** -- the same estimator with ``components=("local",)``:
  independent sparse GPs, one per station, nothing shared;
* **Global-only** -- ``components=("global",)``: one function shared by all
  stations (with a noise variance per station);
* **Exact GP per station** -- :class:`sklearn.gaussian_process.GaussianProcessRegressor`
  with ``ConstantKernel * RBF + WhiteKernel``, ``normalize_y=True``, fitted on
  each station's own training data only.

The metrics are RMSE, the mean negative log predictive density (NLL, nats per
reading, of a new noisy reading: latent variance plus noise), CRPS, and the
empirical coverage and mean width of the central 95 % predictive interval
(:mod:`skfedgp.metrics`).

The figure shows one station (``--station``): its training and held-out
readings with the pFedHGP predictive mean and 95 % band, and the three
components of :meth:`~skfedgp.FederatedHierarchicalGPRegressor.predict_components`
(global, deviation, local; mean and +-2 std) in separate panels.

What the data need, and what the estimator's defaults (used for every setting
not given on the command line) make of it (details in
``docs/beijing_pm25.md`` and ``docs/convergence.md``, check (d)): PM2.5 is a
regional pollutant. About 86 % of the variance of log(PM2.5) is shared by the
12 stations, so a held-out day at one station is best predicted from the
other stations' readings of that day, through the shared global part. The
shared signal decorrelates within about a day (autocorrelation 0.54 at 12 h,
0.26 at 1 day), so the global part needs a short lengthscale (0.6 days after one
round, 0.45 after 14) and many inducing points: ``n_inducing="auto"`` gives 634 on
the 730 reading times of seed 0's split. ``learn_inducing_locations="auto"``
holds them at set-up and learns them from round 2, when the shortened
lengthscale leaves more than 1 % of the prior variance unexplained. What is
left at a station is an offset plus slow drift (the local part) and nearly
white noise. At these sizes a round of the full model takes 5 to 10 minutes
on one core, and training runs for tens of rounds: pass ``--rounds`` (and,
for a quicker look, ``--n-inducing``) to bound it. The script limits BLAS to
one thread (``--blas-threads``): the matrices are small, and two OpenBLAS
threads on a busy 2-core machine made a 256 x 256 Cholesky about 100 times
slower.

Usage::

    python examples/beijing_pm25.py --data-dir DATA_DIR

where ``DATA_DIR`` holds the UCI station files ``PRSA_Data_<Station>_*.csv[.gz]``
(:func:`skfedgp.datasets.fetch_beijing_air_quality` downloads them), with
``skfedgp`` installed, or ``PYTHONPATH=.`` from the repository root.

Run with ``--help`` for all options.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from skfedgp.__main__ import _int_at_least  # argparse helper shared with the main job

#: Display names and ``components`` of the federated models.
FEDERATED_MODELS = (
    ("pFedHGP", ("global", "deviation", "local")),
    ("Local-only", ("local",)),
    ("Global-only", ("global",)),
)
#: Display name of the per-station exact GP baseline.
EXACT_GP = "Exact GP per station"
#: All methods, in table order.
METHODS = tuple(name for name, _ in FEDERATED_MODELS) + (EXACT_GP,)
#: Station drawn in the figure unless ``--station`` says otherwise.
DEFAULT_STATION = "Dongsi"
#: Window (days since 2013-03-01) of the zoomed panel: December 2013 to
#: mid-January 2014, the heating season with the largest pollution episodes.
ZOOM_DAYS = (275.0, 320.0)
#: Metric columns of the table, in order.
METRICS = ("RMSE", "NLL", "CRPS", "coverage_95", "width_95")


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------
_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _fraction(text):
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), got {text!r}")
    return value


def build_parser():
    """The command-line parser of the example."""
    p = argparse.ArgumentParser(
        prog="beijing_pm25.py",
        description="pFedHGP vs Local-only, Global-only and exact per-station GPs on "
        "log(PM2.5) of the 12 Beijing stations (by default 20 % of each station's days are "
        "held out; see --test-fraction).",
    )
    p.add_argument("--data-dir", required=True, type=Path,
                   help="folder with the PRSA_Data_<Station>_*.csv[.gz] files")
    p.add_argument("--stations", nargs="+", default=None, metavar="NAME",
                   help="stations to use (default: all found)")
    p.add_argument("--station", default=None,
                   help="station drawn in the figure (default: Dongsi if loaded, else the "
                   "first station)")
    p.add_argument("--output", type=Path, default=Path("beijing_pm25.png"),
                   help="PNG file of the figure (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the held-out-day draw and of the models (default: %(default)s)")
    p.add_argument("--test-fraction", type=_fraction, default=0.2,
                   help="fraction of each station's days held out (default: %(default)s)")
    p.add_argument("--n-inducing", type=_positive_int, default=None,
                   help="global inducing points M (default: the estimator's, data-derived)")
    p.add_argument("--n-inducing-local", type=_positive_int, default=None,
                   help="local inducing points per station M_i (default: the estimator's, data-derived)")
    p.add_argument("--lengthscale", type=_positive_float, default=None,
                   help="initial global lengthscale, days (default: the estimator's, data-derived)")
    p.add_argument("--local-lengthscale", type=_positive_float, default=None,
                   help="initial local lengthscale, days (default: the estimator's, data-derived)")
    p.add_argument("--phi", type=_positive_float, default=None,
                   help="initial deviation scale phi (default: the estimator's, data-derived)")
    p.add_argument("--local-variance", type=_positive_float, default=None,
                   help="initial local kernel variance, standardised units "
                   "(default: the estimator's, data-derived)")
    p.add_argument("--rounds", type=_positive_int, default=None,
                   help="maximum communication rounds (default: the estimator's)")
    p.add_argument("--local-steps", type=_nonnegative_int, default=None,
                   help="local optimiser iterations per round (default: the estimator's)")
    p.add_argument("--gpr-restarts", type=_nonnegative_int, default=3,
                   help="optimizer restarts of each exact GP (default: %(default)s)")
    p.add_argument("--n-jobs", type=int, default=None,
                   help="parallel jobs (clients' local steps, exact GPs; default: 1)")
    p.add_argument("--blas-threads", type=_positive_int, default=1,
                   help="BLAS threads in this process (default: %(default)s; the "
                   "model's matrices are small, see docs/beijing_pm25.md)")
    p.add_argument("--per-station", action="store_true",
                   help="also print the held-out NLL of every method at every station")
    p.add_argument("--verbose", action="store_true",
                   help="print the per-round progress of the federated models")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="folder for resumable runs: each federated model's training "
                   "state is saved there after every round, and a run started again "
                   "with the same folder and options resumes it (the result is the same "
                   "as an uninterrupted run) or reuses a finished fit")
    return p


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------
def split_days(frame, test_fraction, seed):
    """Hold out a random fraction of each station's days.

    Parameters
    ----------
    frame : pandas.DataFrame
        With columns ``time_days`` and ``station`` (the loader's ``frame``).
    test_fraction : float
        Fraction in (0, 1) of each station's distinct days held out (rounded
        to the nearest integer, at least one day and at least one day kept).
    seed : int
        Seed of :func:`numpy.random.default_rng`; stations draw in sorted
        order from the same generator.

    Returns
    -------
    test : ndarray of bool, shape (n,)
        True for the readings of held-out days (both readings of a day).
    """
    day = np.floor(frame["time_days"].to_numpy()).astype(int)
    station = frame["station"].to_numpy()
    rng = np.random.default_rng(seed)
    test = np.zeros(len(frame), dtype=bool)
    for s in sorted(set(station)):
        rows = station == s
        days = np.unique(day[rows])
        if days.size < 2:
            raise ValueError(f"station {s!r} has data on {days.size} day(s); need at least 2")
        k = int(np.clip(round(test_fraction * days.size), 1, days.size - 1))
        held = rng.choice(days, size=k, replace=False)
        test[rows] = np.isin(day[rows], held)
    return test


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------
def fit_exact_gp(X, y, restarts, seed):
    """Exact GP of one station: ``C * RBF + White``, ``normalize_y=True``.

    The RBF lengthscale starts at 5 days (bounds 0.05 to 1000 days), the white
    noise at 0.1 (standardised units); ``restarts`` extra L-BFGS-B starts are
    drawn log-uniformly within the bounds.
    """
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    kernel = ConstantKernel(1.0, (1e-3, 1e2)) * RBF(5.0, (0.05, 1e3)) + WhiteKernel(
        0.1, (1e-4, 1e1)
    )
    gpr = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=restarts,
                                   random_state=seed)
    return gpr.fit(X, y)


def _exact_gp_job(X, y, Xt, restarts, seed):
    gpr = fit_exact_gp(X, y, restarts, seed)
    mean, std = gpr.predict(Xt, return_std=True)
    return gpr, mean, std


def station_metrics(y, mean, std):
    """RMSE, NLL, CRPS, 95 % coverage and width of one station's test readings."""
    from skfedgp.metrics import coverage, crps_gaussian, gaussian_nll, interval_width, rmse

    return {
        "RMSE": rmse(y, mean),
        "NLL": gaussian_nll(y, mean, std),
        "CRPS": crps_gaussian(y, mean, std),
        "coverage_95": coverage(y, mean, std, level=0.95),
        "width_95": interval_width(std, level=0.95),
    }


def _federated(components, args):
    from skfedgp import FederatedHierarchicalGPRegressor

    # every setting not given on the command line keeps the estimator's default
    given = {
        "n_inducing": args.n_inducing, "n_inducing_local": args.n_inducing_local,
        "lengthscale": args.lengthscale, "local_lengthscale": args.local_lengthscale,
        "phi": args.phi, "local_variance": args.local_variance, "n_rounds": args.rounds,
        "local_steps": args.local_steps,
    }
    return FederatedHierarchicalGPRegressor(
        components=components,
        n_jobs=args.n_jobs,
        random_state=args.seed,
        verbose=int(args.verbose),
        **{k: v for k, v in given.items() if v is not None},
    )


#: Options that must be the same for a run to resume another one's checkpoints.
_RESUME_KEYS = ("data_dir", "stations", "seed", "test_fraction", "n_inducing",
                "n_inducing_local", "lengthscale", "local_lengthscale", "phi",
                "local_variance", "rounds", "local_steps", "n_jobs", "blas_threads")


def _rounds_left(est, state):
    """Rounds still to run after ``state``: the budget ``n_rounds`` (None: the
    estimator's default, 100 with L-BFGS and 20 with Adam) less the rounds done."""
    total = est.n_rounds
    if total is None:
        total = 100 if est.optimizer == "lbfgs" else 20
    return total - state.round


def _fit_resumable(name, est, X, y, groups, directory):
    """Fit ``est``, resuming or reusing what an earlier run left in ``directory``.

    Files (``<name>`` made file-safe): ``<name>.fitted.joblib``, the fitted
    estimator of a finished run (reused as it is); ``<name>.state.joblib``,
    the :class:`~skfedgp.federated.TrainingState` after the last finished
    round (``checkpoint``), from which training resumes with the remaining
    rounds (``resume_from``); ``<name>.seconds``, the fit time spent so far.

    Returns
    -------
    est : FederatedHierarchicalGPRegressor
        Fitted.
    seconds : float
        Fit time, summed over the runs that trained it.
    """
    import joblib

    from skfedgp.federated import TrainingState

    slug = "".join(ch if ch.isalnum() else "_" for ch in name.lower())
    fitted, state_path = directory / f"{slug}.fitted.joblib", directory / f"{slug}.state.joblib"
    clock = directory / f"{slug}.seconds"
    spent = float(clock.read_text()) if clock.exists() else 0.0
    if fitted.exists():
        return joblib.load(fitted), spent
    if state_path.exists():
        state = TrainingState.load(state_path)
        left = _rounds_left(est, state)
        if left < 1:
            raise SystemExit(f"{state_path} is at round {state.round}, the last one; "
                             "remove it to train again")
        est.set_params(resume_from=state, n_rounds=left)
    t0 = time.perf_counter()

    def checkpoint(r, st):
        st.save(state_path)
        clock.write_text(repr(spent + time.perf_counter() - t0))

    est.set_params(checkpoint=checkpoint)
    est.fit(X, y, groups)
    spent += time.perf_counter() - t0
    est.set_params(checkpoint=None, resume_from=None)
    joblib.dump(est, fitted)
    clock.write_text(repr(spent))
    return est, spent


def _check_resume_settings(args):
    """Write the run's options to ``--checkpoint-dir``; refuse a folder of other options."""
    import json

    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    now = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
           if k in _RESUME_KEYS}
    path = args.checkpoint_dir / "settings.json"
    if path.exists():
        before = json.loads(path.read_text())
        if before != now:
            diff = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            raise SystemExit(f"--checkpoint-dir {str(args.checkpoint_dir)!r} holds a run with "
                             f"other options ({', '.join(diff)}); use another folder")
    else:
        path.write_text(json.dumps(now, indent=1, sort_keys=True))


# --------------------------------------------------------------------------
# figure
# --------------------------------------------------------------------------
def plot_station(path, station, est, X_tr, y_tr, X_te, y_te, zoom=ZOOM_DAYS):
    """Save the figure of one station (data, prediction, components).

    Panels: the whole year (training and held-out readings, predictive mean
    and 95 % band of a new reading), the same over the ``zoom`` window (days),
    then the global, deviation and local components (latent mean +- 2 std,
    log units, without the target offset).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo = np.floor(min(X_tr.min(), X_te.min()))
    hi = np.ceil(max(X_tr.max(), X_te.max()))
    grid = np.arange(lo, hi + 1e-9, 0.125)[:, None]
    groups = np.full(grid.shape[0], station, dtype=object)
    mean, std = est.predict(grid, groups, return_std=True)
    # the three latent components; the client's constant mean is a level,
    # not a panel (its own std is mostly cancelled by its covariance with them)
    comps = {k: v for k, v in est.predict_components(grid, groups).items() if k != "offset"}
    t = grid[:, 0]

    n_panels = 2 + len(comps)
    fig, axes = plt.subplots(n_panels, 1, figsize=(11, 2.2 * n_panels), layout="constrained")

    def data_panel(ax, window):
        sel = (t >= window[0]) & (t <= window[1])
        ax.fill_between(t[sel], (mean - 1.96 * std)[sel], (mean + 1.96 * std)[sel], color="C0",
                        alpha=0.25, lw=0, label="95 % predictive band")
        ax.plot(t[sel], mean[sel], color="C0", lw=0.8, label="predictive mean")
        for X_, y_, style, kw in ((X_tr, y_tr, ".", dict(color="k", ms=2.5)),
                                  (X_te, y_te, "x", dict(color="C3", ms=3.5, mew=0.8))):
            keep = (X_[:, 0] >= window[0]) & (X_[:, 0] <= window[1])
            label = "training readings" if style == "." else "held-out readings"
            ax.plot(X_[keep, 0], y_[keep], style, label=label, **kw)
        ax.set_xlim(*window)
        ax.set_ylabel("log PM2.5")

    data_panel(axes[0], (lo, hi))
    axes[0].set_title(f"pFedHGP, station {station}: log(PM2.5 in ug/m3) at 02:00 and 14:00; "
                      "x = held-out days")
    axes[0].legend(loc="upper left", ncol=4, fontsize=8, frameon=False)
    axes[0].axvspan(*zoom, color="0.85", zorder=0)
    data_panel(axes[1], zoom)
    axes[1].set_title(f"zoom: days {zoom[0]:g}-{zoom[1]:g}", fontsize=9)
    for ax, (name, (m, s)) in zip(axes[2:], comps.items()):
        ax.fill_between(t, m - 2 * s, m + 2 * s, color="C2", alpha=0.3, lw=0)
        ax.plot(t, m, color="C2", lw=0.8)
        ax.axhline(0.0, color="0.5", lw=0.5)
        ax.set_xlim(lo, hi)
        ax.set_ylabel(f"{name}\n(log units)")
        ax.set_title(f"{name} component: mean +- 2 std (latent)", fontsize=9)
    axes[-1].set_xlabel("days since 2013-03-01")
    fig.savefig(path, dpi=80, pil_kwargs={"optimize": True})
    plt.close(fig)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------
def run(args):
    """Run the comparison.

    Returns
    -------
    result : dict
        ``table`` (pandas.DataFrame, methods x METRICS, station averages),
        ``per_station`` (long DataFrame), ``timings`` (seconds per method:
        fit and predict), ``models`` (fitted federated estimators by name),
        ``exact_gps`` (fitted GaussianProcessRegressor by station),
        ``stations``, ``n_train``, ``n_test`` and ``figure`` (path of the PNG).
    """
    import pandas as pd
    from joblib import Parallel, delayed

    from skfedgp.datasets import load_beijing_air_quality

    data = load_beijing_air_quality(args.data_dir, stations=args.stations)
    frame = data.frame
    if args.station is None:
        loaded = sorted(set(data.groups))
        args.station = DEFAULT_STATION if DEFAULT_STATION in loaded else loaded[0]
    if args.station not in set(data.groups):
        raise ValueError(
            f"--station {args.station!r} is not among the loaded stations "
            f"{sorted(set(data.groups))}"
        )
    if np.any(data.target <= 0):
        raise ValueError("PM2.5 readings must be positive to take the logarithm")
    X = data.data
    y = np.log(data.target)
    groups = data.groups
    test = split_days(frame, args.test_fraction, args.seed)
    X_tr, y_tr, g_tr = X[~test], y[~test], groups[~test]
    X_te, y_te, g_te = X[test], y[test], groups[test]
    stations = sorted(set(groups))

    rows, timings, models = [], {}, {}
    if args.checkpoint_dir is not None:
        _check_resume_settings(args)
    for name, components in FEDERATED_MODELS:
        est = _federated(components, args)
        t0 = time.perf_counter()
        if args.checkpoint_dir is None:
            est.fit(X_tr, y_tr, g_tr)
            fit_s = time.perf_counter() - t0
        else:
            est, fit_s = _fit_resumable(name, est, X_tr, y_tr, g_tr, args.checkpoint_dir)
        t1 = time.perf_counter()
        mean, std = est.predict(X_te, g_te, return_std=True)
        t2 = time.perf_counter()
        timings[name] = (fit_s, t2 - t1)
        models[name] = est
        for s in stations:
            m = g_te == s
            rows.append({"method": name, "station": s,
                         **station_metrics(y_te[m], mean[m], std[m])})

    t0 = time.perf_counter()
    jobs = Parallel(n_jobs=args.n_jobs)(
        delayed(_exact_gp_job)(X_tr[g_tr == s], y_tr[g_tr == s], X_te[g_te == s],
                               args.gpr_restarts, args.seed)
        for s in stations
    )
    t1 = time.perf_counter()
    for s, (_, mean, std) in zip(stations, jobs):
        m = g_te == s
        rows.append({"method": EXACT_GP, "station": s,
                     **station_metrics(y_te[m], mean, std)})
    timings[EXACT_GP] = (t1 - t0, 0.0)  # fit and predict run together

    per_station = pd.DataFrame(rows)
    table = per_station.groupby("method", sort=False)[list(METRICS)].mean()
    table = table.loc[list(METHODS)]
    table["fit_s"] = [timings[n][0] for n in METHODS]

    k = args.station
    plot_station(args.output, k, models["pFedHGP"], X_tr[g_tr == k], y_tr[g_tr == k],
                 X_te[g_te == k], y_te[g_te == k])
    return {
        "table": table,
        "per_station": per_station,
        "timings": timings,
        "models": models,
        "exact_gps": dict(zip(stations, (j[0] for j in jobs))),
        "n_train": int((~test).sum()),
        "n_test": int(test.sum()),
        "stations": stations,
        "figure": args.output,
        "dates": (f"{frame['timestamp'].min():%Y-%m-%d}", f"{frame['timestamp'].max():%Y-%m-%d}"),
    }


def main(argv=None):
    """Command-line entry point; returns the result dictionary of :func:`run`."""
    args = build_parser().parse_args(argv)
    if args.output.suffix.lower() != ".png":
        raise SystemExit(f"--output must be a .png file, got {str(args.output)!r}")
    if not args.output.parent.exists():
        raise SystemExit(f"folder of --output {str(args.output.parent)!r} does not exist")
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    with threadpool_limits(limits=args.blas_threads):
        result = run(args)
    total = time.perf_counter() - t0

    import pandas as pd

    table = result["table"]
    print(f"Beijing air quality: {len(result['stations'])} stations, target log(PM2.5) "
          f"(natural log of ug/m3), readings at 02:00 and 14:00, "
          f"{result['dates'][0]}..{result['dates'][1]}")
    print(f"train {result['n_train']} readings, test {result['n_test']} readings "
          f"({args.test_fraction:.0%} of each station's days held out, seed {args.seed})")
    est = result["models"].get("pFedHGP")
    if est is not None:
        print(f"settings: estimator defaults except those given on the command line; "
              f"fitted M={est.n_inducing_} global inducing points, {est.n_iter_} rounds")
    print()
    print("Held-out metrics on the log scale, averaged over stations "
          "(NLL in nats per reading; fit_s = fit time in seconds):")
    with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 120):
        print(table.to_string())
    if args.per_station:
        nll = result["per_station"].pivot(index="station", columns="method", values="NLL")
        print()
        print("Held-out NLL per station (log scale, nats per reading):")
        with pd.option_context("display.float_format", "{:.3f}".format, "display.width", 120):
            print(nll[list(METHODS)].to_string())
    print()
    print("Timing per method (seconds):")
    for name in METHODS:
        fit_s, pred_s = result["timings"][name]
        extra = "  (fit + predict, all stations)" if name == EXACT_GP else f"  predict {pred_s:.2f}"
        print(f"  {name:<22s} fit {fit_s:7.2f}{extra}")
    print(f"  total {total:.1f} s")
    est = result["models"]["pFedHGP"]
    G = est.server_.global_values()
    lg = float(np.ravel(G["lengthscale_g"])[0] * est.server_.x_scale[0])
    print()
    print(f"pFedHGP learned: global lengthscale {lg:.2f} d, global variance "
          f"{float(G['variance_g']):.3f}, phi {float(G['phi']):.4f} (standardised units)")
    print(f"figure: {result['figure']} (station {args.station})")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
