"""pFedHGP over Flower: each Beijing air-quality station is a ClientApp.

Every one of the 12 monitoring stations is a Flower SuperNode (here simulated
by Flower's in-process simulation runtime, :func:`flwr.simulation.run_simulation`)
whose ClientApp reads *only its own station file* from ``--data-dir``; the
ServerApp (:func:`skfedgp.flower.make_server_app`) trains
:class:`skfedgp.FederatedHierarchicalGPRegressor`'s model (structured family,
the estimator's defaults) by Flower messages. The target is ``log(PM2.5)``
(PM2.5 in ug/m^3) at 02:00 and 14:00 of each day; the input is the time in
days since 2013-03-01 00:00 (a fixed origin, so the stations agree without
seeing each other's data).

The script prints the ELBO per round, the model payload per round (which
equals the estimator's ``communication_``) and the bytes actually serialised,
and saves the fitted global state with ``--output``. With ``--compare`` it
also fits the estimator in this process on the same data (one BLAS/OpenMP
thread, as the simulated clients run) and prints the largest difference of
the global vectors and ELBOs.

Usage::

    python examples/flower_beijing.py --data-dir DATA_DIR [--n-rounds 3] [--compare]

where ``DATA_DIR`` holds the UCI station files ``PRSA_Data_<Station>_*.csv[.gz]``
(:func:`skfedgp.datasets.fetch_beijing_air_quality` downloads them). Needs
``pip install "skfedgp[flower]"``. For a deployment on separate machines (one
SuperNode per station, each with its own ``data-path``), see
``docs/flower.md``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

#: Time origin of the input (days since this instant, Beijing local time).
ORIGIN = "2013-03-01 00:00"
_FILE_RE = re.compile(r"^PRSA_Data_(?P<station>.+?)_\d{8}-\d{8}\.csv(\.gz)?$")


def station_names(data_dir):
    """Station names from the file names in ``data_dir`` (no file is read)."""
    names = sorted({m.group("station") for p in Path(data_dir).iterdir()
                    if (m := _FILE_RE.match(p.name))})
    if not names:
        raise FileNotFoundError(
            f"no Beijing air-quality files PRSA_Data_<Station>_<YYYYMMDD>-<YYYYMMDD>.csv[.gz] "
            f"in {str(data_dir)!r}")
    return names


def station_loader(data_dir, stations):
    """``load_data(context)`` of the ClientApp: the node's own station only."""

    def load_data(context):
        import pandas as pd

        from skfedgp.datasets import load_beijing_air_quality

        station = stations[int(context.node_config["partition-id"])]
        data = load_beijing_air_quality(data_dir, stations=[station])
        t = (data.frame["timestamp"] - pd.Timestamp(ORIGIN)) / pd.Timedelta(days=1)
        return station, t.to_numpy(dtype=float)[:, None], np.log(data.target)

    return load_data


def _rounds_equal(payload, communication):
    """Whether the payload per round equals ``communication_`` (rounds >= 1)."""
    key = [(c["round"], c["bytes_up"], c["bytes_down"]) for c in communication[1:]]
    return key == [(p["round"], p["bytes_up"], p["bytes_down"]) for p in payload[1:]]


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, type=Path,
                        help="folder with the station files PRSA_Data_<Station>_*.csv[.gz]")
    parser.add_argument("--n-rounds", type=int, default=3,
                        help="maximum number of training rounds (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="random_state (default 0)")
    parser.add_argument("--stations", nargs="+", default=None,
                        help="station names (default: every station in --data-dir)")
    parser.add_argument("--output", type=Path, default=None,
                        help="save the fitted global state here (joblib)")
    parser.add_argument("--compare", action="store_true",
                        help="also fit the estimator in this process and compare")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.n_rounds < 1:
        raise SystemExit("--n-rounds must be >= 1")
    if not args.data_dir.is_dir():
        raise SystemExit(f"data directory {str(args.data_dir)!r} does not exist")
    try:
        from flwr.simulation import run_simulation
    except ImportError:
        raise SystemExit('this example needs Flower: pip install "skfedgp[flower]"') from None
    from skfedgp.flower import make_client_app, make_server_app, payload_per_round

    data_dir = args.data_dir.resolve()
    stations = args.stations or station_names(data_dir)
    params = dict(random_state=args.seed, n_rounds=args.n_rounds)
    server_app = make_server_app(min_nodes=len(stations), output_path=args.output, **params)
    client_app = make_client_app(station_loader(data_dir, stations))
    t0 = time.perf_counter()
    run_simulation(server_app, client_app, num_supernodes=len(stations),
                   backend_config={"init_args": {"num_cpus": 1},
                                   "client_resources": {"num_cpus": 1}})
    elapsed = time.perf_counter() - t0
    res = server_app.result_
    if res is None:
        raise SystemExit("the ServerApp did not finish (see Flower's log above)")
    print(f"\nFlower simulation: {len(res['client_ids'])} stations, {res['n_iter']} round(s), "
          f"{res['n_evaluations']} ELBO evaluations, {len(res['payload_log'])} exchanges, "
          f"{elapsed:.1f} s")
    print(f"global inducing points: {res['n_inducing']}; failed calls: "
          f"{len(res['failed_clients'])}")
    print("round  ELBO            payload up (B)  payload down (B)")
    for c, e in zip(payload_per_round(res["payload_log"])[1:], res["elbo_history"] + [None]):
        print(f"{c['round']:5d}  {'' if e is None else f'{e: .6e}':14s}  "
              f"{c['bytes_up']:14d}  {c['bytes_down']:16d}")
    pay = sum(e["bytes_up"] + e["bytes_down"] for e in res["payload_log"])
    wire = sum(e["bytes_up"] + e["bytes_down"] for e in res["wire_log"])
    print(f"model payload {pay} B in all; serialised records {wire} B ({wire / pay:.3f} x)")
    if args.output:
        print(f"fitted global state saved to {args.output}")
    if args.compare:
        from skfedgp import FederatedHierarchicalGPRegressor

        loader = station_loader(data_dir, stations)

        class _Ctx:  # the loader only reads node_config
            def __init__(self, k):
                self.node_config = {"partition-id": k}

        parts = [loader(_Ctx(k)) for k in range(len(stations))]
        X = np.vstack([p[1] for p in parts])
        y = np.concatenate([p[2] for p in parts])
        groups = np.concatenate([[p[0]] * len(p[2]) for p in parts]).astype(object)
        from threadpoolctl import threadpool_limits

        t0 = time.perf_counter()
        # the simulated clients run in Ray workers with one BLAS/OpenMP thread
        # (num_cpus=1); the estimator's set-up (pilot GPs, k-means) is not
        # thread-count invariant to round-off, so compare at one thread too
        with threadpool_limits(1):
            est = FederatedHierarchicalGPRegressor(**params).fit(X, y, groups)
        print(f"\nestimator fit in one process: {time.perf_counter() - t0:.1f} s")
        print(f"max |theta_global difference| "
              f"{np.max(np.abs(res['theta_global'] - est.server_.theta_global)):.3e}; "
              f"max |ELBO difference| "
              f"{np.max(np.abs(np.subtract(res['elbo_history'], est.elbo_history_))):.3e}; "
              f"Flower payload per round == communication_ for rounds >= 1: "
              f"{_rounds_equal(payload_per_round(res['payload_log']), est.communication_)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
