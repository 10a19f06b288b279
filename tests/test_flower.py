"""Flower adapter: codec round trips, the ClientApp dispatcher and the full
training over Flower's in-process simulation against the estimator."""

import dataclasses

import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install \"skfedgp[flower]\" or \".[test]\")")

from skfedgp import federated as F  # noqa: E402
from skfedgp import flower as fl  # noqa: E402
from skfedgp._hierarchy import Packer  # noqa: E402


def _assert_same(a, b, path="v"):
    """Exact equality of decoded values: types, dtypes, shapes and bits."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, Packer):
        assert isinstance(b, Packer), path
        assert a.spec == b.spec and a.size == b.size and a.slices == b.slices, path
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}{{{k}}}")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert isinstance(b, float) and (a == b or (np.isnan(a) and np.isnan(b))), path
        assert np.float64(a).tobytes() == np.float64(b).tobytes(), path
    else:
        assert type(a) is type(b) and a == b, path


def _examples():
    rng = np.random.default_rng(0)
    d, M, P = 3, 4, 17
    lh = F.LocalHyperparameters(rng.random(d), 0.25, 1e-3 * np.pi, -0.7)
    Q = 2
    # multi-output (ILMM) messages: per-output arrays and a dict of loadings
    lh_mo = F.LocalHyperparameters(
        rng.random((2, d)), None, rng.random(Q), rng.standard_normal(Q),
        {"deviation": rng.standard_normal((1, Q, Q)), "local": rng.standard_normal((2, Q, Q))})
    return [
        F.ClientSummary(11, 3.5, 2.25, rng.random(d), rng.random(d) + 1.0),
        F.ClientSummary(11, rng.standard_normal(Q), rng.random(Q), rng.random(d),
                        rng.random(d) + 1.0, np.array([9, 11]), rng.standard_normal((Q, Q))),
        lh_mo,
        F.LocalHyperparameters(None, None, 0.5, rng.standard_normal(Q), {}),
        F.ClientUpdateValue(9, -2.0, lh_mo),
        F.InitBroadcast(0.1, 2.0, np.zeros(0), -rng.random(d), rng.random(d)),
        F.GlobalBroadcast(4, rng.standard_normal(P)),
        F.ClientUpdate(2, rng.standard_normal(P), -123.456789),
        F.ClientStatistics(1, rng.standard_normal((M, M)), rng.standard_normal(M)),
        F.ClientStatistics(1, None, rng.standard_normal(M)),
        F.PilotSummary(rng.random(d), 1.0 / 3.0, 0.01),
        F.StructuredStatistics(5, rng.standard_normal((M, M)), rng.standard_normal(M),
                               1e300, -2.5e-300),
        F.PosteriorBroadcast(6, rng.standard_normal(M), rng.standard_normal((M, M))),
        F.GlobalGradient(7, rng.standard_normal(P)),
        lh,
        F.LocalHyperparameters(None, None, 0.5),
        F.LocalHyperparameters(rng.random(d), 0.25, 1e-3, 0.1, trace_nats=12.5,
                               trace_nats_local=float("nan"), jitter_nats=1e-7,
                               n_observations=40),
        F.ClientUpdateValue(8, -1.0, lh),
        F._PopulationPilot(rng.random(d), 2.0, 0.1, np.ones(d)),
        F._PopulationPilot(rng.random(d), 2.0, 0.1, np.ones(d), noise_identified=False,
                           noise_spread=0.625, noise_pooled=0.03),
        F._PopulationPilot(rng.random(d), 2.0, 0.1, noise_spread=0.5),
        F.PoolEvidence(-3.25, rng.standard_normal(d + 2), 7.5),
        F.ClientState(rng.standard_normal(4), Packer([]), 1e-6, 0.01, noise_hyperprior=True,
                      noise_prior_sd=0.5),
        F.ModelConfig(components=("global", "deviation", "local"), n_inducing="auto",
                      n_inducing_local=7, lengthscale=[1.0, 2.0, 3.0],
                      local_lengthscale=np.array([0.5]), variance=None, local_variance=1.5,
                      noise_variance=None, phi=None, local_steps=20, learning_rate=0.1,
                      global_learning_rate=0.05, normalize_y=True, noise_prior_scale=None),
        F.structured_global_spec(("global", "deviation", "local"), M, d),
        F.structured_local_spec(("local",), 0, d),
        Packer([]),
        (np.arange(6, dtype=np.int64).reshape(2, 3), 3, None, "train", True, -0.0),
        None,
    ]


@pytest.mark.parametrize("value", _examples(), ids=lambda v: type(v).__name__)
def test_codec_round_trip_is_exact(value):
    rd = fl.encode(value, name="x")
    assert set(rd.keys()) == {"x.arrays", "x.config"}
    back = fl.decode(rd, name="x")
    _assert_same(value, back)


def test_codec_puts_arrays_in_array_record_and_scalars_in_config_record():
    msg = F.StructuredStatistics(3, np.eye(2), np.ones(2), 4.5, -1.0)
    rd = fl.encode(msg)
    arrays = rd["v.arrays"]
    config = dict(rd["v.config"])
    assert sorted(arrays.keys()) == ["v.precision", "v.shift"]
    assert config["v.round"] == 3 and config["v.constant"] == 4.5
    assert config["v#type"] == "StructuredStatistics"


def test_codec_payload_bytes_equal_message_nbytes():
    for value in _examples():
        if type(value).__name__ in dict.fromkeys(
                ("ClientSummary", "InitBroadcast", "GlobalBroadcast", "ClientUpdate",
                 "ClientStatistics", "PilotSummary", "StructuredStatistics",
                 "PosteriorBroadcast", "GlobalGradient", "LocalHyperparameters",
                 "ClientUpdateValue", "_PopulationPilot", "PoolEvidence",
                 "DesignResidual")):
            assert fl.payload_nbytes(value) == F.message_nbytes(value), type(value).__name__
    # a flag counts nothing on either side; numbers and arrays 8 bytes a number
    pop = F._PopulationPilot(np.ones(3), 2.0, 0.1, noise_identified=False, noise_spread=0.5)
    assert F.message_nbytes(pop) == fl.payload_nbytes(pop) == 8 * (3 + 3)


def test_codec_refuses_unknown_types():
    class Foo:
        pass

    with pytest.raises(TypeError, match="Foo"):
        fl.encode(Foo())

    @dataclasses.dataclass
    class Bar:
        x: int

    with pytest.raises(TypeError, match="Bar"):
        fl.encode(Bar(1))
    with pytest.raises(TypeError, match="dict keys must be str"):
        fl.encode({1: np.ones(2)})
    rd = fl.encode(F.GlobalGradient(1, np.ones(2)))
    cfg = dict(rd["v.config"])
    cfg["v#type"] = "os.system"
    from flwr.app import ConfigRecord
    rd["v.config"] = ConfigRecord(cfg)
    with pytest.raises(ValueError, match="unknown message type"):
        fl.decode(rd)


# --------------------------------------------------------------------------
# in-process simulation
# --------------------------------------------------------------------------

def _client_data(n_clients=3, n=40, seed=0, d=1):
    from skfedgp.datasets import make_hierarchical_regression

    X, y, groups = make_hierarchical_regression(n_clients=n_clients, n_samples=n,
                                                n_features=d, random_state=seed)
    return X, y, groups


def _loader(X, y, groups):
    labels = sorted(set(groups.tolist()))

    def load_data(context):
        # simulation: partition-id numbers the nodes 0..n-1
        lab = labels[int(context.node_config["partition-id"])]
        keep = groups == lab
        return f"site-{lab}", X[keep], y[keep]

    return load_data


def _simulate_app(app, client_app, n_nodes):
    from flwr.simulation import run_simulation

    run_simulation(app, client_app, num_supernodes=n_nodes,
                   backend_config={"init_args": {"num_cpus": 1},
                                   "client_resources": {"num_cpus": 1}})


def test_flower_training_matches_estimator_fit(tmp_path):
    import joblib

    from skfedgp import FederatedHierarchicalGPRegressor

    pytest.importorskip("ray", reason="Flower's simulation runtime needs Ray "
                        "(pip install \"flwr[simulation]\")")
    # 24 rows per client: the clients also fit the pooled pilot over Flower
    X, y, groups = _client_data(n_clients=3, n=24, seed=1, d=2)
    names = np.array([f"site-{g}" for g in groups], dtype=object)
    # one training run, as the Flower server runs (no restart_from_global)
    params = dict(random_state=0, n_rounds=2, restart_from_global=False)
    # the simulated clients run in Ray workers with one BLAS/OpenMP thread;
    # fit at one thread too (the set-up is not thread-count invariant to round-off)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)

    def on_finish(cid, client, context):
        joblib.dump({"theta": client.theta, "posterior": client.posterior},
                    tmp_path / f"{cid}.joblib")

    server_app = fl.make_server_app(min_nodes=3, timeout=300, **params)
    _simulate_app(server_app, fl.make_client_app(_loader(X, y, groups), on_finish=on_finish), 3)
    res = server_app.result_
    assert res is not None, "the ServerApp did not finish"
    assert res["client_ids"] == sorted(est.clients_)
    np.testing.assert_allclose(res["theta_global"], est.server_.theta_global,
                               rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(res["elbo_history"], est.elbo_history_, rtol=1e-8)
    np.testing.assert_allclose(res["objective_history"], est.objective_history_, rtol=1e-8)
    np.testing.assert_allclose(res["global_posterior"]["mean"],
                               est.global_posterior_["mean"], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(res["global_posterior"]["covariance"],
                               est.global_posterior_["covariance"], rtol=1e-8, atol=1e-12)
    assert res["y_offset"] == est.y_offset_ and res["y_scale"] == est.y_scale_
    assert res["n_iter"] == est.n_iter_
    for cid, client in est.clients_.items():
        local = joblib.load(tmp_path / f"{cid}.joblib")
        np.testing.assert_allclose(local["theta"], client.theta, rtol=1e-8, atol=1e-12)
        for k in ("mu_u", "Sigma_u"):
            np.testing.assert_allclose(local["posterior"][k], client.posterior[k],
                                       rtol=1e-7, atol=1e-10)
    for k, v in res["population"].items():
        np.testing.assert_allclose(v, est._population_local[k], rtol=1e-8)

    assert [c["round"] for c in res["communication"]] == [
        c["round"] for c in est.communication_]
    _assert_payload_matches_communication(res, est)
    # what went over the wire is the payload plus bounded overhead
    wire_up = sum(e["bytes_up"] for e in res["wire_log"])
    pay_up = sum(e["bytes_up"] for e in res["payload_log"])
    assert pay_up < wire_up < 3 * pay_up + 10_000 * len(res["wire_log"])


def _assert_payload_matches_communication(res, est):
    """The model payload per round of a Flower run equals ``communication_``
    in every round: the set-up (the initialisation message carries the
    global vector and the population pilot, every field of which is booked),
    every training round and the final exchange."""
    comm = est.communication_
    per = {e["round"]: (e["bytes_up"], e["bytes_down"])
           for e in fl.payload_per_round(res["payload_log"])}
    assert sorted(per) == [c["round"] for c in comm]
    for c in comm:
        assert per[c["round"]] == (c["bytes_up"], c["bytes_down"]), c["round"]


def _multioutput_data(n_clients=3, n=20, seed=0, n_missing=6):
    """Q=2 targets with ``n_missing`` NaN entries (never a whole row)."""
    from skfedgp.datasets import make_hierarchical_regression

    X, y, groups = make_hierarchical_regression(n_clients=n_clients, n_samples=n,
                                                n_outputs=2, random_state=seed)
    y = y.copy()
    rng = np.random.default_rng(seed)
    rows = rng.choice(y.shape[0], n_missing, replace=False)
    y[rows, rng.integers(0, 2, n_missing)] = np.nan
    assert y.shape == (n_clients * n, 2) and np.isnan(y).sum() == n_missing
    return X, y, groups


# --------------------------------------------------------------------------
# the transport and the ClientApp without a Flower runtime (fast)
# --------------------------------------------------------------------------

@pytest.fixture
def task_identity(monkeypatch):
    """Messages need a run/task identity, which Flower's runtime normally sets."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 5), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class _InProcessGrid:
    """A Grid stand-in: delivers each message to the ClientApp of its node in
    this process (one Context per node). ``fresh_process=True`` empties the
    per-process registry before every message, as a SuperNode in subprocess
    isolation does."""

    def __init__(self, client_app, n_nodes, fresh_process=False):
        from flwr.app import Context, RecordDict

        self.app = client_app
        self.fresh_process = fresh_process
        self.contexts = {
            101 + 7 * k: Context(run_id=5, node_id=101 + 7 * k,
                                 node_config={"partition-id": k}, state=RecordDict(),
                                 run_config={})
            for k in range(n_nodes)}
        self.delivered = 0

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            if self.fresh_process:
                fl._REGISTRY.clear()
            replies.append(self.app(msg, self.contexts[msg.metadata.dst_node_id]))
            self.delivered += 1
        return replies


@pytest.mark.parametrize("fresh_process", [False, True])
def test_transport_in_process_gives_the_estimator_fit(fresh_process, task_identity):
    from skfedgp import FederatedHierarchicalGPRegressor

    X, y, groups = _client_data(n_clients=3, n=30, seed=2, d=1)
    names = np.array([f"site-{g}" for g in groups], dtype=object)
    params = dict(random_state=3, n_rounds=1)
    est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 3, fresh_process)
    transport = fl.FlowerTransport(grid, min_nodes=3).connect()
    assert transport.client_ids == sorted(est.clients_)
    assert transport.n_features_ == 1
    e, config, n_rounds = fl._check_server_params(params)
    res = fl.fit_over_transport(transport, e, config, n_rounds)
    np.testing.assert_allclose(res["theta_global"], est.server_.theta_global, rtol=1e-10)
    np.testing.assert_allclose(res["elbo_history"], est.elbo_history_, rtol=1e-10)
    assert res["failed_clients"] == [] and res["excluded_clients"] == []
    # the configuration went once to each client, then only references
    sent = [e for e in transport.payload_log_ if e["method"] == "local_phase"]
    assert sent and all(e["bytes_down"] == 0 and e["bytes_up"] == 0 for e in sent)


def test_transport_in_process_reports_the_trace_term(task_identity):
    """The Flower server sums the clients' trace terms as fit does and warns
    the same way (noise-free targets: a loose bound)."""
    from skfedgp import FederatedHierarchicalGPRegressor, SparseApproximationWarning

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (150, 1))
    groups = np.repeat([0, 1, 2], 50)
    y = np.sin(2 * X[:, 0]) * np.exp(-0.2 * X[:, 0]) + 0.1 * X[:, 0] ** 2
    names = np.array([f"site-{g}" for g in groups], dtype=object)
    params = dict(random_state=0, restart_from_global=False)  # one run each
    with pytest.warns(SparseApproximationWarning):
        est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 3)
    transport = fl.FlowerTransport(grid, min_nodes=3).connect()
    e, config, n_rounds = fl._check_server_params(params)
    with pytest.warns(SparseApproximationWarning):
        res = fl.fit_over_transport(transport, e, config, n_rounds)
    np.testing.assert_allclose(res["trace_term"], est.trace_term_, rtol=1e-10)


def test_transport_in_process_multioutput_gives_the_estimator_fit(task_identity):
    """ILMM clients rebuilt from ``context.state`` in every message (subprocess
    isolation) give fit's model; the nodes report their Q at hello."""
    from skfedgp import FederatedHierarchicalGPRegressor

    X, y, groups = _multioutput_data(n_clients=3, n=20, seed=2)
    names = np.array([f"site-{g}" for g in groups], dtype=object)
    params = dict(random_state=3, n_rounds=1, n_inducing=5, n_latent=(2, 1, 1),
                  restart_from_global=False)  # one run, as the Flower server
    est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 3, fresh_process=True)
    transport = fl.FlowerTransport(grid, min_nodes=3).connect()
    assert transport.n_outputs_ == 2 and transport.n_features_ == 1
    e, config, n_rounds = fl._check_server_params(params)
    assert config.n_outputs == 0  # learned from the nodes, not from the parameters
    res = fl.fit_over_transport(transport, e, config, n_rounds)
    assert res["config"].n_outputs == 2 and res["config"].n_latent == (2, 1, 1)
    np.testing.assert_allclose(res["theta_global"], est.server_.theta_global, rtol=1e-10)
    np.testing.assert_allclose(res["elbo_history"], est.elbo_history_, rtol=1e-10)
    np.testing.assert_allclose(res["objective_history"], est.objective_history_, rtol=1e-10)
    assert res["config"] == est.server_.config
    assert res["global_pack"].spec == est.server_.global_pack.spec
    assert "B_g" in res["global_values"]
    np.testing.assert_allclose(res["y_offset"], est.y_offset_, rtol=1e-12)
    np.testing.assert_allclose(res["y_scale"], est.y_scale_, rtol=1e-12)
    assert np.shape(res["y_scale"]) == (2,)
    for k, v in res["population"].items():  # the coregionalisation dicts went over too
        if isinstance(v, dict):
            assert v.keys() == est._population_local[k].keys(), k
            for kk in v:
                np.testing.assert_allclose(v[kk], est._population_local[k][kk], rtol=1e-8)
        else:
            np.testing.assert_allclose(v, est._population_local[k], rtol=1e-8)
    _assert_payload_matches_communication(res, est)
    # parameters fit refuses with multi-output targets are refused here too
    e, config, n_rounds = fl._check_server_params(dict(params, variance=1.0))
    transport = fl.FlowerTransport(
        _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 3), min_nodes=3).connect()
    with pytest.raises(ValueError, match="variance must be None with multi-output"):
        fl.fit_over_transport(transport, e, config, n_rounds)


def test_connect_accepts_a_node_of_an_earlier_version(task_identity, monkeypatch):
    """A node whose hello reply is the number of features only (skfedgp before
    multi-output over Flower) counts as one target column."""
    X, y, groups = _multioutput_data(n_clients=3, n=10, seed=0, n_missing=0)
    monkeypatch.setattr(fl, "_data_shape", lambda client: int(client._client._X.shape[1]))
    tr = fl.FlowerTransport(
        _InProcessGrid(fl.make_client_app(_loader(X, y[:, 0], groups)), 3), min_nodes=3)
    tr.connect()
    assert tr.n_features_ == 1 and tr.n_outputs_ == 1


def test_connect_refuses_nodes_with_different_numbers_of_outputs(task_identity):
    X, y, groups = _multioutput_data(n_clients=3, n=10, seed=0, n_missing=0)
    labels = sorted(set(groups.tolist()))

    def load_data(context):
        k = int(context.node_config["partition-id"])
        keep = groups == labels[k]
        # site-2 holds one target column, the others two
        return f"site-{labels[k]}", X[keep], (y[keep, 0] if k == 2 else y[keep])

    tr = fl.FlowerTransport(_InProcessGrid(fl.make_client_app(load_data), 3), min_nodes=3)
    with pytest.raises(ValueError, match="different numbers of outputs") as info:
        tr.connect()
    msg = str(info.value)
    assert "'site-2': 1" in msg and "'site-0': 2" in msg and "'site-1': 2" in msg


@pytest.mark.parametrize("spoil, match", [
    (lambda X, y: y.__setitem__((3, slice(None)), np.nan), "every output missing"),
    (lambda X, y: y.__setitem__((4, 1), np.inf), "infinit"),
    (lambda X, y: X.__setitem__((2, 0), np.nan), "NaN"),
    (lambda X, y: None, None),
])
def test_node_validates_multioutput_data_as_fit_does(spoil, match, task_identity):
    """A NaN entry is a missing output (accepted); a row with every output
    missing, inf in y or NaN in X is refused, naming the client, with fit's
    message."""
    from skfedgp import FederatedHierarchicalGPRegressor

    X, y, groups = _multioutput_data(n_clients=2, n=10, seed=0, n_missing=4)
    X, y = X.copy(), y.copy()
    spoil(X, y)
    tr = fl.FlowerTransport(_InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 2),
                            min_nodes=2)
    if match is None:
        assert tr.connect().n_outputs_ == 2
        return
    with pytest.raises(RuntimeError, match=match) as info:
        tr.connect()
    assert "client 'site-0'" in str(info.value)
    with pytest.raises(ValueError, match=match):
        FederatedHierarchicalGPRegressor().fit(X, y, groups)


def test_transport_reports_client_errors_as_failures(task_identity):
    X, y, groups = _client_data(n_clients=2, n=20, seed=0)
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 2)
    tr = fl.FlowerTransport(grid, min_nodes=2).connect()
    # statistics before the set-up: the client's own code raises
    out = tr.call("statistics", (np.zeros(3), None, None, 1), round_=4)
    assert set(out) == set(tr.client_ids)
    for cid, f in out.items():
        assert isinstance(f, F.ClientFailure)
        assert f.client_id == cid and f.method == "statistics" and f.round == 4
        assert not f.numerical and "Error" in f.error
    # a numerical error is flagged as such
    out = tr.call("global_gradient", (F.PosteriorBroadcast(1, np.zeros(2), np.eye(2)),
                                      np.zeros(3), None, None))
    assert all(isinstance(f, F.ClientFailure) for f in out.values())
    with pytest.raises(ValueError, match="unknown client method"):
        tr.call("__init__", ())
    with pytest.raises(ValueError, match="unknown client id"):
        tr.call("summary", (), ids=["nobody"])


def test_missing_reply_is_a_timeout_failure(task_identity):
    X, y, groups = _client_data(n_clients=2, n=20, seed=0)

    class Lossy(_InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages, timeout=timeout)
            return replies[1:]  # the first node's reply never arrives

    tr = fl.FlowerTransport(Lossy(fl.make_client_app(_loader(X, y, groups)), 2),
                            timeout=1.0)
    tr.node_ids_ = {"a": 101, "b": 108}
    tr.client_ids = ["a", "b"]
    tr._held = {"a": {}, "b": {}}
    out = tr.call("summary", ())
    assert isinstance(out["a"], F.ClientFailure) and "TimeoutError" in out["a"].error
    assert isinstance(out["b"], F.ClientSummary)


def test_connect_refuses_bad_node_data(task_identity):
    X, y, groups = _client_data(n_clients=2, n=20, seed=0)
    y = y.copy()
    y[3] = np.nan
    tr = fl.FlowerTransport(_InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 2),
                            min_nodes=2)
    with pytest.raises(RuntimeError, match="NaN"):
        tr.connect()

    def same_id(context):
        return "dup", X[:5], np.arange(5.0)

    tr = fl.FlowerTransport(_InProcessGrid(fl.make_client_app(same_id), 2), min_nodes=2)
    with pytest.raises(ValueError, match="both report client id 'dup'"):
        tr.connect()
    tr = fl.FlowerTransport(_InProcessGrid(fl.make_client_app(same_id), 1), min_nodes=2,
                            connect_timeout=0.2)
    with pytest.raises(TimeoutError, match="min_nodes=2"):
        tr.connect()


def test_app_factories_validate_their_arguments():
    with pytest.raises(TypeError, match="load_data"):
        fl.make_client_app("data.csv")
    with pytest.raises(ValueError, match="structured"):
        fl.make_server_app(variational_family="mean_field", optimizer="adam")
    with pytest.raises(ValueError, match="n_rounds"):
        fl.make_server_app(n_rounds=-1)
    with pytest.raises(ValueError, match="resume_from"):
        fl.make_server_app(warm_start=True)
    with pytest.raises(ValueError, match="client_fraction"):
        fl.make_server_app(client_fraction=1.5)
    with pytest.raises(ValueError, match="min_nodes"):
        fl.FlowerTransport(object(), min_nodes=0)


def test_fault_hook_and_partial_participation_match_the_estimator(task_identity):
    """The same injected failure and the same participation sampling give the
    same model over Flower messages as in fit."""
    from skfedgp import FederatedHierarchicalGPRegressor

    X, y, groups = _client_data(n_clients=3, n=30, seed=4, d=1)
    names = np.array([f"site-{g}" for g in groups], dtype=object)

    def hook(cid, method, r):
        if cid == "site-1" and method == "local_phase" and r == 1:
            raise TimeoutError("injected")

    params = dict(random_state=5, n_rounds=2, fault_hook=hook, client_fraction=0.7,
                  max_retries=0)
    est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 3)
    e, config, n_rounds = fl._check_server_params(params)
    transport = fl.FlowerTransport(grid, min_nodes=3, fault_hook=hook).connect()
    res = fl.fit_over_transport(transport, e, config, n_rounds)
    assert res["failed_clients"] == est.failed_clients_
    assert any(f[1] == "site-1" and f[2] == "local_phase" for f in res["failed_clients"])
    np.testing.assert_allclose(res["theta_global"], est.server_.theta_global, rtol=1e-10)
    np.testing.assert_allclose(res["elbo_history"], est.elbo_history_, rtol=1e-10)


def test_server_names_a_client_whose_local_phase_always_fails(task_identity):
    """As fit does, the Flower server warns about a client whose local phase
    failed whenever it was asked (its own hyperparameters never moved), and
    stays quiet about one that failed in some rounds only."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    X, y, groups = _client_data(n_clients=3, n=30, seed=4, d=1)

    def run(hook):
        params = dict(random_state=5, n_rounds=2, tol=0.0, fault_hook=hook, max_retries=0)
        grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 3)
        e, config, n_rounds = fl._check_server_params(params)
        transport = fl.FlowerTransport(grid, min_nodes=3, fault_hook=hook).connect()
        return fl.fit_over_transport(transport, e, config, n_rounds)

    def always(cid, method, r):
        if cid == "site-1" and method == "local_phase":
            raise TimeoutError("late")

    with pytest.warns(ConvergenceWarning, match=r"client\(s\) \['site-1'\] failed their local "
                                                r"phase whenever asked in this fit"):
        res = run(always)
    assert "site-1" in res["client_ids"]

    def once(cid, method, r):
        if cid == "site-1" and method == "local_phase" and r == 1:
            raise TimeoutError("late")

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run(once)
    assert not any("failed their local phase" in str(w.message) for w in rec)


def test_partial_participation_communication_matches_flower_payload(task_identity,
                                                                    monkeypatch):
    """With partial participation (5 clients, client_fraction=0.6, 5 rounds)
    communication_ equals Flower's measured payload in every round, also in
    rounds where the global phase rejects trial points: a client failing
    numerically at a trial point (round 4), statistics that make q(v_g)
    fail in combine (round 2) and replies with non-finite values (round 3).
    Those exchanges went over the wire (the broadcast down, the replies up)
    and count in both."""
    from skfedgp import FederatedHierarchicalGPRegressor

    X, y, groups = _client_data(n_clients=5, n=30, seed=4, d=1)
    names = np.array([f"site-{g}" for g in groups], dtype=object)
    params = dict(random_state=5, n_rounds=5, client_fraction=0.6, n_inducing=6,
                  lengthscale=3.0, learn_inducing_locations=False)
    seen = {}
    statistics = F.StructuredClient.statistics

    def injected(self, theta_g, gpack, config, round_):
        # every participant's 4th evaluation of the round is a trial point of
        # the global phase (after at most a refresh and the phase's start)
        k = seen[self.client_id, round_] = seen.get((self.client_id, round_), 0) + 1
        msg = statistics(self, theta_g, gpack, config, round_)
        if round_ == 2 and k == 4:
            # finite, but I + sum S_i is not positive definite: combine fails
            return dataclasses.replace(msg, precision=-1e6 * np.eye(len(msg.shift)))
        if round_ == 4 and k == 4 and self.client_id == "site-2":
            raise np.linalg.LinAlgError("injected")
        if round_ == 3 and k == 4:
            # a reply with a NaN: received (and counted), then dropped as a
            # numerical failure, which rejects the trial point
            return dataclasses.replace(msg, shift=np.full_like(msg.shift, np.nan))
        return msg

    monkeypatch.setattr(F.StructuredClient, "statistics", injected)
    est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)
    seen.clear()
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 5)
    e, config, n_rounds = fl._check_server_params(params)
    transport = fl.FlowerTransport(grid, min_nodes=5).connect()
    res = fl.fit_over_transport(transport, e, config, n_rounds)
    np.testing.assert_allclose(res["elbo_history"], est.elbo_history_, rtol=1e-10)
    assert res["n_evaluations"] == est.n_evaluations_
    log = res["payload_log"]
    for r in (2, 3, 4):
        # the injected trial points were rejected: a statistics exchange
        # without its global_gradient exchange
        calls = [e["method"] for e in log if e["round"] == r]
        assert calls.count("statistics") > calls.count("global_gradient"), r
    _assert_payload_matches_communication(res, est)


def test_beijing_example_loader_reads_only_its_own_station():
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    data_dir = repo.parent / "shared" / "data" / "beijing_air_quality"
    if not (data_dir.is_dir() and any(data_dir.glob("PRSA_Data_*.csv*"))):
        pytest.skip(f"Beijing air-quality data not found in {data_dir} (the real data set "
                    "lives outside the repository, in <repo>/../shared/data)")
    spec = importlib.util.spec_from_file_location(
        "flower_beijing_example", repo / "examples" / "flower_beijing.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    names = ex.station_names(data_dir)
    assert len(names) == 12 and names == sorted(names) and "Dongsi" in names
    load = ex.station_loader(data_dir, names)

    class Ctx:
        def __init__(self, k):
            self.node_config = {"partition-id": k}

    k = names.index("Dongsi")
    cid, X, y = load(Ctx(k))
    assert cid == "Dongsi"
    assert X.ndim == 2 and X.shape[1] == 1 and X.shape[0] == y.shape[0] > 600
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(y))
    # days since 2013-03-01 00:00, readings at 02:00 and 14:00
    frac = np.round((X[:, 0] % 1.0) * 24).astype(int)
    assert set(frac.tolist()) <= {2, 14}
    assert X.min() >= 0 and X.max() < 366


def test_codec_reads_records_without_newer_optional_fields():
    """A node of an earlier version does not send fields added since
    (``LocalHyperparameters.offset_observed``, ``PilotSummary.noise_variance_target``):
    they take their defaults; a required field that is missing is still an error."""
    from flwr.common import ArrayRecord, ConfigRecord

    lh = F.LocalHyperparameters(np.ones(2), None, np.array([0.1, 0.2]), np.array([0.5, -0.5]),
                                None, np.array([1.0, 0.0]))
    for value, field in ((lh, "offset_observed"),
                         (F.PilotSummary(np.ones(2), 1.0, 0.1, 0.3), "noise_variance_target")):
        rd = fl.encode(value, name="x")
        drop = f"v.{field}"
        rd["x.arrays"] = ArrayRecord({k: v for k, v in rd["x.arrays"].items()
                                      if not k.startswith(drop)})
        rd["x.config"] = ConfigRecord({k: v for k, v in rd["x.config"].items()
                                       if not k.startswith(drop)})
        back = fl.decode(rd, name="x")
        assert getattr(back, field) is None
    rd = fl.encode(F.PilotSummary(np.ones(2), 1.0, 0.1), name="x")
    config = dict(rd["x.config"])
    del config["v.variance"]
    rd["x.config"] = ConfigRecord(config)
    with pytest.raises(ValueError, match="'v.variance' is missing"):
        fl.decode(rd, name="x")


# --------------------------------------------------------------------------
# secure aggregation (SecAgg+) of one evaluation's statistics
# --------------------------------------------------------------------------

def _require_secagg():
    """Skip unless the installed Flower has SecAgg+ and its crypto dependency."""
    pytest.importorskip("cryptography", reason="Flower's SecAgg+ needs the cryptography package")
    try:
        from flwr.client.mod import secaggplus_mod  # noqa: F401
        from flwr.server.workflow import SecAggPlusWorkflow  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the Flower version
        pytest.skip(f"this Flower has no SecAgg+ (secaggplus_mod / SecAggPlusWorkflow): {exc}")


class _WireGrid(_InProcessGrid):
    """:class:`_InProcessGrid` whose messages go through Flower's protobuf
    serialisation both ways, so that each node gets its own copy as over a
    network (the SecAgg+ workflow sends one content object to several nodes
    and ``secaggplus_mod`` edits what it receives); an exception of the
    ClientApp becomes an error reply, as Flower's runtime sends it. Keeps
    every reply the server received."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replies = []

    @staticmethod
    def _wire(msg):
        from flwr.common.serde import message_from_proto, message_to_proto
        from flwr.proto.message_pb2 import Message as ProtoMessage

        proto = ProtoMessage()
        proto.ParseFromString(message_to_proto(msg).SerializeToString())
        return message_from_proto(proto)

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode

        out = []
        for msg in messages:
            msg = self._wire(msg)
            try:
                rep = self.app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as exc:  # noqa: BLE001 -- as Flower's runtime replies
                rep = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                    reason=repr(exc)), reply_to=msg)
            out.append(self._wire(rep))
            self.delivered += 1
        self.replies.extend(out)
        return out


def test_statistics_flatten_round_trip_and_quantisation_range():
    rng = np.random.default_rng(3)
    for M in (0, 1, 5):
        R = rng.standard_normal((M, M))
        st = F.StructuredStatistics(2, R @ R.T, rng.standard_normal(M), 3.5, -0.25)
        v = fl.flatten_statistics(st)
        assert v.shape == (M * (M + 1) // 2 + M + 2,)
        back = fl.unflatten_statistics(v, 2)
        np.testing.assert_allclose(back.precision, st.precision, rtol=0, atol=1e-15)
        assert np.array_equal(back.precision, back.precision.T)
        assert np.array_equal(back.shift, st.shift) and back.round == 2
        assert (back.constant, back.log_prior) == (3.5, -0.25)
    with pytest.raises(ValueError, match="length"):
        fl.unflatten_statistics(np.zeros(5))
    # n T < 2**32, T a power of two at most 2**30 (Flower's int32 quantiser)
    assert [fl.secagg_quantization_range(n) for n in (2, 3, 4, 5, 8, 9)] == [
        2**30, 2**30, 2**29, 2**29, 2**28, 2**28]
    with pytest.raises(ValueError, match="at least 2"):
        fl.secagg_quantization_range(1)
    assert fl.secagg_error_bound(4, 128.0, 2**29) == pytest.approx(8 * 128.0 / 2**29, rel=1e-9)


def test_combine_error_bounds_hold_for_an_adversarial_perturbation():
    """The bounds are bounds, not first-order estimates: a rank-one
    perturbation ``dA = -eps s s^T`` (``s`` the signs of a row of
    ``A^{-1}``) moves that diagonal entry of ``A^{-1}`` by
    ``eps r_j^2 / (1 - eps s^T A^{-1} s)``, above the first-order
    ``eps r_j^2``; random sign perturbations stay inside too."""
    from skfedgp._structured import combine

    rng = np.random.default_rng(0)
    M, e = 12, 5.0
    R = rng.standard_normal((M, 3 * M))
    S, b = R @ R.T / 5.0, 3.0 * rng.standard_normal(M)
    base = combine([S], [b], [e], M)
    r = np.abs(base.A_inv).sum(axis=1)
    for eps in (1e-6, 1e-3, 1e-2):
        tol = fl.combine_error_bounds(base.mu, base.A_inv, eps)
        assert 0 < tol["rho"] < 1
        perturbations = []
        for j in range(M):
            s = np.sign(base.A_inv[j])
            perturbations.append((-np.outer(s, s), s, 1.0))
        for _ in range(30):
            D = rng.choice([-1.0, 1.0], size=(M, M))
            perturbations.append((np.triu(D) + np.triu(D, 1).T, rng.choice([-1.0, 1.0], M),
                                  float(rng.choice([-1.0, 1.0]))))
        exceeds_first_order = False
        for D, db, de in perturbations:
            for sign in (1.0, -1.0):
                q = combine([S + sign * eps * D], [b + sign * eps * db], [e + sign * eps * de], M)
                dcov = np.abs(q.A_inv - base.A_inv)
                assert np.all(dcov <= tol["covariance"] * (1 + 1e-9))
                assert np.all(np.abs(q.mu - base.mu) <= tol["mean"] * (1 + 1e-9))
                assert abs(q.elbo - base.elbo) <= tol["elbo"] * (1 + 1e-9)
                exceeds_first_order |= bool(np.any(np.diag(dcov) > eps * r * r * (1 + 1e-9)))
        assert exceeds_first_order
    with pytest.raises(ValueError, match="too large"):
        fl.combine_error_bounds(base.mu, base.A_inv, 1.0)


def test_secure_statistics_sum_gives_the_plain_posterior_and_elbo(task_identity, request):
    """One ELBO evaluation's statistics summed by Flower's SecAgg+ (4 nodes,
    masked vectors over serialised messages) give q(v_g), the ELBO and the
    summed log prior of the plain per-client exchange within the bounds the
    quantisation implies; the strategy's aggregate step and the server's
    replies see only the aggregate and masked integers."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    from skfedgp._structured import combine

    _require_secagg()
    # Flower's stochastic rounding draws from NumPy's global generator (here
    # every node runs in this process): seed it for a reproducible run
    saved = np.random.get_state()
    request.addfinalizer(lambda: np.random.set_state(saved))
    np.random.seed(20261202)
    n_nodes = 4
    X, y, groups = _client_data(n_clients=n_nodes, n=30, seed=2, d=1)
    grid = _WireGrid(fl.make_client_app(_loader(X, y, groups), secure_aggregation=True),
                     n_nodes)
    transport = fl.FlowerTransport(grid, min_nodes=n_nodes).connect()
    est, config, _ = fl._check_server_params(dict(random_state=0, n_rounds=1))
    seen = {}

    def after_round(r, st):
        ids = list(transport.client_ids)
        nodes = [transport.node_ids_[c] for c in ids]
        # the clipping range the clients agree on: a power of two above twice
        # the largest entry of the previous evaluation's statistics
        largest = max(float(np.max(np.abs(fl.flatten_statistics(m))))
                      for m in st.messages.values())
        clip = float(2.0 ** np.ceil(np.log2(2.0 * largest)))
        start = len(grid.replies)
        seen["secure"] = fl.secure_statistics_sum(grid, nodes, st.theta_global, r,
                                                  clipping_range=clip)
        seen["replies"] = grid.replies[start:]
        seen["plain"] = transport.call("statistics", (st.theta_global, st.global_pack,
                                                      config, r), ids, round_=r)
        seen["vectors"] = {transport.node_ids_[c]: fl.flatten_statistics(m)
                           for c, m in seen["plain"].items()}
        # a node whose statistics exceed the agreed range refuses to send them
        # (an error reply): SecAgg+ would sum the other three, the function refuses
        tops = sorted(float(np.max(np.abs(v))) for v in seen["vectors"].values())
        assert tops[-2] < tops[-1]
        start = len(grid.replies)
        with pytest.raises(RuntimeError, match="incomplete"):
            fl.secure_statistics_sum(grid, nodes, st.theta_global, r,
                                     clipping_range=0.5 * (tops[-2] + tops[-1]))
        errors = [rep.error.reason for rep in grid.replies[start:] if rep.has_error()]
        assert len(errors) == 1 and "outside the agreed clipping range" in errors[0]
        # the error reason reaches the server in the clear: no value of the statistics
        assert f"{tops[-1]:.6g}" not in errors[0] and f"{tops[-1]:.3g}" not in errors[0]
        # every node refusing: the protocol halts
        with pytest.raises(RuntimeError, match="halted"):
            fl.secure_statistics_sum(grid, nodes, st.theta_global, r, clipping_range=1e-3)

    est.checkpoint = after_round
    fl.fit_over_transport(transport, est, config, 1)

    sec = seen["secure"]
    msgs = list(seen["plain"].values())
    assert all(isinstance(m, F.StructuredStatistics) for m in msgs)
    assert sec["n_clients"] == n_nodes and sec["quantization_range"] == 2**29
    eps = sec["bound"]
    assert eps == fl.secagg_error_bound(n_nodes, sec["clipping_range"], 2**29)
    plain_sum = np.sum([fl.flatten_statistics(m) for m in msgs], axis=0)
    secure_sum = fl.flatten_statistics(sec["statistics"])
    err = np.abs(secure_sum - plain_sum)
    assert err.max() <= eps          # the SecAgg+ quantisation bound, every entry
    assert err.max() > 0             # it did go through the quantiser
    assert np.max(np.abs(plain_sum)) <= n_nodes * sec["clipping_range"]

    M = msgs[0].precision.shape[0]
    plain = combine([m.precision for m in msgs], [m.shift for m in msgs],
                    [m.constant for m in msgs], M)
    s = sec["statistics"]
    secure = combine([s.precision], [s.shift], [s.constant], M)
    # the bounds hold from either posterior (the server only has the secure
    # one); the small absolute terms are round-off of combine itself
    for post in (plain, secure):
        tol = fl.combine_error_bounds(post.mu, post.A_inv, eps)
        assert abs(secure.elbo - plain.elbo) <= tol["elbo"] + 1e-10 * abs(plain.elbo)
        assert np.all(np.abs(secure.mu - plain.mu) <= tol["mean"] + 1e-12)
        assert np.all(np.abs(secure.A_inv - plain.A_inv) <= tol["covariance"] + 1e-12)
    assert abs(s.log_prior - sum(m.log_prior for m in msgs)) <= eps

    # the strategy's aggregate step is handed the aggregate (the mean, weight 1
    # per client) in place of every client's parameters, never a client's own
    handed = sec["aggregate_fit_inputs"]
    assert sorted(nid for nid, _, _ in handed) == sorted(seen["vectors"])
    for nid, num_examples, arrays in handed:
        assert num_examples == fl.SECURE_WEIGHT and len(arrays) == 1
        np.testing.assert_array_equal(arrays[0], secure_sum / n_nodes)
        assert np.max(np.abs(arrays[0] - seen["vectors"][nid])) > 1e3 * eps
    # what the server received in the SecAgg+ exchange: no float array, and
    # per node a masked vector of integers modulo 2**32 that is not its
    # quantised statistics
    masked = {}
    for rep in seen["replies"]:
        assert rep.metadata.message_type == "train"
        assert all(len(rec) == 0 for rec in rep.content.array_records.values())
        cfg = rep.content.config_records[RECORD_KEY_CONFIGS]
        if Key.MASKED_PARAMETERS in cfg:
            from flwr.common import bytes_to_ndarray

            arrs = [bytes_to_ndarray(b) for b in cfg[Key.MASKED_PARAMETERS]]
            masked[rep.metadata.src_node_id] = arrs
    assert sorted(masked) == sorted(seen["vectors"])
    T, c = sec["quantization_range"], sec["clipping_range"]
    for nid, arrs in masked.items():
        assert [a.size for a in arrs] == [1, plain_sum.size]  # weight factor, vector
        assert all(a.dtype.kind in "iu" and a.min() >= 0 and a.max() < 2**32 for a in arrs)
        alone = arrs[1] * (2.0 * c / T) - c  # dequantised on its own
        assert np.max(np.abs(alone - seen["vectors"][nid])) > 1.0


def test_server_checks_the_run_set_up_as_fit_does(tmp_path):
    """Over Flower, as in fit and before any node is asked anything: a resumed
    state trained with other model settings, a checkpoint path in a missing
    folder or naming a folder, and min_clients above the nodes are refused."""
    import warnings

    from skfedgp import FederatedHierarchicalGPRegressor
    from skfedgp.federated import TrainingState

    X, y, g = _client_data()
    path = tmp_path / "state.joblib"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FederatedHierarchicalGPRegressor(n_rounds=1, n_inducing=6, random_state=0,
                                         checkpoint=str(path)).fit(X, y, g)
    state = TrainingState.load(path)

    class Untouchable:  # any call would mean the checks came too late
        client_ids = sorted(set(g))
        n_features_ = X.shape[1]
        n_outputs_ = 1

        def __getattr__(self, name):
            raise AssertionError(f"the transport was used ({name}) before the checks")

    cases = [
        (dict(n_inducing=9, resume_from=state), "resume_from: the saved model was trained "
                                                "with n_inducing=6"),
        (dict(checkpoint=str(tmp_path / "missing" / "s.joblib")), "does not exist"),
        (dict(checkpoint=str(tmp_path)), "is a folder"),
        (dict(min_clients=len(set(g)) + 1), "exceeds the number of clients"),
    ]
    for params, match in cases:
        est = FederatedHierarchicalGPRegressor(random_state=0, **params)
        config, n_rounds = est._check_params()
        with pytest.raises(ValueError, match=match):
            fl.fit_over_transport(Untouchable(), est, config, 1)


def test_transport_in_process_small_client_local_prior(task_identity):
    """The small client's local-kernel prior (round 2: LocalKernelSummary up from
    the large clients, the centre down to the small one) over the Flower
    transport gives fit's model, and its bytes are those of communication_."""
    from skfedgp import FederatedHierarchicalGPRegressor

    from _federations import five_point_federation

    # tests/test_local_prior.py's federation: the clients depart by 0.3 k sin(2 x2)
    X, y, groups, *_ = five_point_federation(7)
    names = np.array([f"site-{g}" for g in groups], dtype=object)
    params = dict(random_state=3, n_rounds=3, tol=0.0, restart_from_global=False)
    est = FederatedHierarchicalGPRegressor(**params).fit(X, y, names)
    assert est.server_.local_prior_centre_  # the prior was formed
    grid = _InProcessGrid(fl.make_client_app(_loader(X, y, groups)), 4)
    transport = fl.FlowerTransport(grid, min_nodes=4).connect()
    e, config, n_rounds = fl._check_server_params(params)
    res = fl.fit_over_transport(transport, e, config, n_rounds)
    np.testing.assert_allclose(res["theta_global"], est.server_.theta_global, rtol=1e-10)
    np.testing.assert_allclose(res["elbo_history"], est.elbo_history_, rtol=1e-10)
    methods = {entry["method"] for entry in transport.payload_log_}
    assert {"local_prior_summary", "set_local_prior"} <= methods
    res["payload_log"] = transport.payload_log_
    _assert_payload_matches_communication(res, est)
