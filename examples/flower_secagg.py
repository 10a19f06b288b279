"""One ELBO evaluation's statistics summed by Flower's SecAgg+ (in simulation).

Each simulated client (a Flower SuperNode running
:func:`skfedgp.flower.make_client_app` with ``secure_aggregation=True``)
holds one client's data of :func:`skfedgp.datasets.make_hierarchical_regression`.
The ServerApp sets the clients up and trains one round over a
:class:`skfedgp.flower.FlowerTransport` (the plain protocol); after that
round, at the current global vector, it

1. runs :func:`skfedgp.flower.secure_statistics_sum`: Flower's
   ``SecAggPlusWorkflow`` (legacy strategy round) collects the clients'
   masked, quantised vectors ``[triu(S_i), b_i, e_i, log_prior_i]`` and
   unmasks only their sum;
2. asks the same clients for the same statistics in the clear
   (``transport.call("statistics", ...)``), for the comparison only;

and prints how far the secure sum, ``q(v_g)`` and the ELBO computed from it
(:func:`skfedgp._structured.combine`) are from the plain ones, next to the
bounds implied by the quantisation (:func:`skfedgp.flower.secagg_error_bound`,
:func:`skfedgp.flower.combine_error_bounds`).

The clipping range is a public parameter the clients must agree on
beforehand. Here it is the smallest power of two above twice the largest
entry of the previous (plain) evaluation's statistics, which this
demonstration's server holds anyway; a node whose statistics exceed it
refuses to send them.

Usage::

    python examples/flower_secagg.py [--clients 4] [--samples 30] [--features 1] [--seed 2]

Needs ``pip install "skfedgp[flower]"`` (Flower with its simulation runtime,
Ray, and the ``cryptography`` package SecAgg+ uses).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=30, help="points per client")
    parser.add_argument("--features", type=int, default=1)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args(argv)

    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from skfedgp import flower as fl
    from skfedgp._structured import combine
    from skfedgp.datasets import make_hierarchical_regression

    X, y, groups = make_hierarchical_regression(
        n_clients=args.clients, n_samples=args.samples, n_features=args.features,
        random_state=args.seed)
    labels = sorted(set(groups.tolist()))

    def load_data(context):
        lab = labels[int(context.node_config["partition-id"])]
        keep = groups == lab
        return f"site-{lab}", X[keep], y[keep]

    est, config, _ = fl._check_server_params(dict(random_state=0, n_rounds=1))
    app = ServerApp()
    out = {}

    @app.main()
    def server(grid, context):
        transport = fl.FlowerTransport(grid, min_nodes=args.clients, timeout=300).connect()

        def after_round(r, st):
            ids = list(transport.client_ids)
            largest = max(float(np.max(np.abs(fl.flatten_statistics(m))))
                          for m in st.messages.values())
            clip = float(2.0 ** np.ceil(np.log2(2.0 * largest)))
            t0 = time.perf_counter()
            out["secure"] = fl.secure_statistics_sum(
                grid, [transport.node_ids_[c] for c in ids], st.theta_global, r,
                clipping_range=clip, timeout=300)
            out["seconds"] = time.perf_counter() - t0
            out["plain"] = transport.call(
                "statistics", (st.theta_global, st.global_pack, config, r), ids, round_=r)

        est.checkpoint = after_round
        fl.fit_over_transport(transport, est, config, 1)

    run_simulation(app, fl.make_client_app(load_data, secure_aggregation=True),
                   num_supernodes=args.clients,
                   backend_config={"init_args": {"num_cpus": 1},
                                   "client_resources": {"num_cpus": 1}})
    if "secure" not in out:
        raise SystemExit("the ServerApp did not reach the secure sum")

    sec, msgs = out["secure"], list(out["plain"].values())
    n, eps = sec["n_clients"], sec["bound"]
    M = msgs[0].precision.shape[0]
    k = M * (M + 1) // 2
    plain_sum = np.sum([fl.flatten_statistics(m) for m in msgs], axis=0)
    err = np.abs(fl.flatten_statistics(sec["statistics"]) - plain_sum)
    plain = combine([m.precision for m in msgs], [m.shift for m in msgs],
                    [m.constant for m in msgs], M)
    s = sec["statistics"]
    secure = combine([s.precision], [s.shift], [s.constant], M)
    tol = fl.combine_error_bounds(plain.mu, plain.A_inv, eps)

    print(f"clients {n}, M = {M} global inducing points, vector of {plain_sum.size} entries")
    print(f"SecAgg+ (Flower): clipping_range c = {sec['clipping_range']:g}, "
          f"quantization_range T = 2**{int(np.log2(sec['quantization_range']))}, "
          f"modulus_range = 2**{int(np.log2(sec['modulus_range']))}; "
          f"{out['seconds']:.2f} s")
    print(f"bound per entry of the sum, n * 2c / T = {eps:.3e}")
    for name, sl in (("S (upper triangle)", slice(0, k)), ("b", slice(k, k + M)),
                     ("e", slice(k + M, k + M + 1)), ("log prior", slice(k + M + 1, None))):
        print(f"  max |secure - plain| {name:18s} {err[sl].max():.3e}")
    print(f"ELBO plain {plain.elbo:.10f}  secure {secure.elbo:.10f}  "
          f"|diff| {abs(secure.elbo - plain.elbo):.3e}  (bound {tol['elbo']:.3e})")
    dm, dc = np.abs(secure.mu - plain.mu), np.abs(secure.A_inv - plain.A_inv)
    print(f"q(v_g) mean       max |diff| {dm.max():.3e}  largest diff/bound "
          f"{np.max(dm / tol['mean']):.3f}")
    print(f"q(v_g) covariance max |diff| {dc.max():.3e}  largest diff/bound "
          f"{np.max(dc / tol['covariance']):.3f}")
    handed = sec["aggregate_fit_inputs"]
    same = all(np.array_equal(a[0], handed[0][2][0]) for _, _, a in handed)
    print(f"aggregate_fit was handed {len(handed)} results, all the same aggregate: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
