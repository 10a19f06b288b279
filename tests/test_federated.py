"""Federation properties of the regressor (issue 2, item 3 and "Done means"):
what the server receives, the communication record, and bitwise
reproducibility across joblib back ends (n_jobs=1, loky n_jobs=2, dask)."""

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.federated import (
    ClientStatistics,
    ClientSummary,
    ClientUpdate,
    GlobalBroadcast,
    InitBroadcast,
    Server,
    message_arrays,
    message_nbytes,
)

FAST = dict(n_rounds=3, local_steps=4, n_inducing=6, n_inducing_local=5, random_state=0)
#: The mean-field family's protocol (the paper's Algorithm 1 and its closed-form variant);
#: the structured family's messages are tested in test_structured.py.
MF = dict(FAST, variational_family="mean_field", optimizer="adam")


def _clients_data(sizes, d=2, seed=0):
    """Clients ``"c0", "c1", ...`` with ``sizes[k]`` rows each, continuous random data."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, size=(sum(sizes), d))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=X.shape[0])
    g = np.repeat([f"c{k}" for k in range(len(sizes))], sizes)
    return X, y, g


@pytest.fixture
def spy(monkeypatch):
    """Record every message the server receives and sends (wraps Server methods)."""
    log = {"summaries": [], "init": [], "updates": [], "broadcasts": [], "statistics": []}
    initialise, apply, broadcast = Server.initialise, Server.apply, Server.broadcast
    set_global_factor = Server.set_global_factor

    def _set_global_factor(self, statistics, **kwargs):
        log["statistics"].append(list(statistics))
        return set_global_factor(self, statistics, **kwargs)

    def _initialise(self, summaries):
        log["summaries"].append(list(summaries))
        out = initialise(self, summaries)
        log["init"].append(out)
        return out

    def _apply(self, updates):
        log["updates"].append(list(updates))
        return apply(self, updates)

    def _broadcast(self, round_):
        out = broadcast(self, round_)
        log["broadcasts"].append(out)
        return out

    monkeypatch.setattr(Server, "initialise", _initialise)
    monkeypatch.setattr(Server, "apply", _apply)
    monkeypatch.setattr(Server, "broadcast", _broadcast)
    monkeypatch.setattr(Server, "set_global_factor", _set_global_factor)
    return log


def _fit_and_log(spy, sizes, **params):
    """Fit and return the messages of the training rounds and, apart, of the final polish."""
    for v in spy.values():
        v.clear()
    X, y, g = _clients_data(sizes)
    est = FederatedHierarchicalGPRegressor(**{**MF, **params}).fit(X, y, g)
    R = FAST["n_rounds"]
    log = {k: list(v) for k, v in spy.items()}
    log["polish_statistics"] = [r for r in log["statistics"] if r[0].round > R]
    log["statistics"] = [r for r in log["statistics"] if r[0].round <= R]
    log["polish_broadcasts"] = [b for b in log["broadcasts"] if b.round > R]
    log["broadcasts"] = [b for b in log["broadcasts"] if b.round <= R]
    return est, (X, y, g), log


def _shapes(msg):
    return {name: a.shape for name, a in message_arrays(msg).items()}


@pytest.mark.parametrize("variational_update", ["adam", "closed_form"])
def test_server_bound_messages_do_not_depend_on_n_i(spy, variational_update):
    sizes_a, sizes_b = (5, 200), (60, 9)
    est, (X, y, g), log = _fit_and_log(spy, sizes_a, variational_update=variational_update)
    _, _, log_b = _fit_and_log(spy, sizes_b, variational_update=variational_update)
    M, d = FAST["n_inducing"], X.shape[1]
    P = est.server_.global_pack.size

    (summaries,) = log["summaries"]
    assert len(summaries) == 2 and all(isinstance(s, ClientSummary) for s in summaries)
    assert [s.n_samples for s in summaries] == list(sizes_a)
    assert _shapes(summaries[0]) == _shapes(summaries[1]) == _shapes(log_b["summaries"][0][0])
    assert _shapes(summaries[0]) == {"n_samples": (), "y_sum": (), "y_centred_sumsq": (),
                                     "x_min": (d,), "x_max": (d,)}

    assert len(log["updates"]) == FAST["n_rounds"]
    expected = {"round": (), "grad_global": (P,), "objective": ()}
    for round_a, round_b in zip(log["updates"], log_b["updates"]):
        assert len(round_a) == 2
        for u in round_a + round_b:
            assert isinstance(u, ClientUpdate)
            assert _shapes(u) == expected
            assert all(np.all(np.isfinite(a)) for a in message_arrays(u).values())
    if variational_update == "closed_form":
        # the extra phase of each round: statistics for the exact q(v_g)
        assert len(log["statistics"]) == len(log_b["statistics"]) == FAST["n_rounds"]
        for round_a, round_b in zip(log["statistics"], log_b["statistics"]):
            assert len(round_a) == 2
            for m in round_a + round_b:
                assert isinstance(m, ClientStatistics)
                assert _shapes(m) == {"round": (), "precision": (M, M), "shift": (M,)}
                assert all(np.all(np.isfinite(a)) for a in message_arrays(m).values())
    else:
        assert log["statistics"] == []
    # a 200-row client uploads exactly as many bytes as a 5-row one
    assert message_nbytes(log["updates"][0][0]) == message_nbytes(log["updates"][0][1])

    # no raw observation travels to the server
    for k, label in enumerate(["c0", "c1"]):
        Xi, yi = X[g == label], y[g == label]
        s = summaries[k]
        # the only input values in the set-up message are the per-feature
        # extremes (the documented bounding box); no target value at all
        assert_array_equal(s.x_min, Xi.min(axis=0))
        assert_array_equal(s.x_max, Xi.max(axis=0))
        for name, a in message_arrays(s).items():
            assert not np.isin(a, yi).any(), name
        for u in [r[k] for r in log["updates"] + log["statistics"]]:
            for name, a in message_arrays(u).items():
                if name == "round":
                    continue
                assert a.size < Xi.size or Xi.shape[0] < 10, name  # big client: smaller than its data
                assert not np.isin(a, Xi).any(), name
                assert not np.isin(a, yi).any(), name


@pytest.mark.parametrize("variational_update", ["adam", "closed_form"])
def test_communication_record(spy, variational_update):
    est, _, log = _fit_and_log(spy, (5, 200, 30), variational_update=variational_update)
    comm = est.communication_
    phases = 2 if variational_update == "closed_form" else 1  # statistics + local round
    # set-up, the rounds, and the final polish of the factors (round n_rounds + 1)
    assert [c["round"] for c in comm] == list(range(FAST["n_rounds"] + 2))
    polish = comm[-1]
    assert polish["bytes_up"] >= sum(message_nbytes(m) for r in log["polish_statistics"]
                                     for m in r)
    comm = comm[:-1]
    assert comm[0]["bytes_up"] == sum(message_nbytes(s) for s in log["summaries"][0])
    assert comm[0]["bytes_down"] == 3 * message_nbytes(log["init"][0])
    assert isinstance(log["init"][0], InitBroadcast)
    assert len(log["broadcasts"]) == phases * FAST["n_rounds"]
    for r in range(1, FAST["n_rounds"] + 1):
        ups = log["updates"][r - 1] + (log["statistics"][r - 1] if phases == 2 else [])
        bcs = log["broadcasts"][phases * (r - 1): phases * r]
        assert all(isinstance(bc, GlobalBroadcast) and bc.round == r for bc in bcs)
        assert comm[r]["bytes_up"] == sum(message_nbytes(u) for u in ups) > 0
        assert comm[r]["bytes_down"] == 3 * sum(message_nbytes(bc) for bc in bcs) > 0
        assert comm[r]["n_messages"] == 3 * phases
    # fixed-size uploads: every round costs the same, whatever the n_i
    assert len({c["bytes_up"] for c in comm[1:]}) == 1
    est_b, _, _ = _fit_and_log(spy, (100, 7, 12), variational_update=variational_update)
    assert [c["bytes_up"] for c in est_b.communication_[:-1]] == [c["bytes_up"] for c in comm]
    assert [c["bytes_down"] for c in est_b.communication_[:-1]] == [c["bytes_down"]
                                                                   for c in comm]


# --------------------------------------------------------------------------
# reproducibility across back ends
# --------------------------------------------------------------------------

_SIZES = (12, 40, 25)


def _fit_predict(**params):
    X, y, g = _clients_data(_SIZES, seed=1)
    est = FederatedHierarchicalGPRegressor(**{**MF, **params}).fit(X, y, g)
    Xt = np.vstack([X[::5], [[0.1, -0.2]]])
    gt = np.append(g[::5], "unseen")
    mean, std = est.predict(Xt, gt, return_std=True)
    return mean, std, np.array(est.elbo_history_)


def _assert_identical(a, b):
    for x, y in zip(a, b):
        assert_array_equal(x, y)  # bitwise, not approximately


@pytest.fixture(scope="module")
def serial():
    return {v: _fit_predict(n_jobs=1, variational_update=v) for v in ("adam", "closed_form")}


@pytest.mark.parametrize("variational_update", ["adam", "closed_form"])
def test_loky_n_jobs_2_identical_to_serial(serial, variational_update):
    _assert_identical(serial[variational_update],
                      _fit_predict(n_jobs=2, variational_update=variational_update))


def test_dask_backend_identical_to_serial(serial):
    pytest.importorskip("dask", reason="dask is a test extra; not installed")
    distributed = pytest.importorskip("distributed", reason="distributed is a test extra; not installed")
    import joblib

    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        with distributed.Client(cluster) as client:
            with joblib.parallel_config(backend="dask"):
                results = {v: _fit_predict(n_jobs=2, variational_update=v)
                           for v in ("adam", "closed_form")}
            # the work really went to the cluster's worker processes
            assert len(client.scheduler_info()["workers"]) == 2
    finally:
        cluster.close()
    for v in results:
        _assert_identical(serial[v], results[v])


def test_same_seed_identical_different_seed_differs(spy):
    X, y, g = _clients_data(_SIZES, seed=2)
    runs = {}
    for seed in (0, 0, 1):
        spy["init"].clear()
        est = FederatedHierarchicalGPRegressor(**{**MF, "random_state": seed}).fit(X, y, g)
        runs.setdefault(seed, []).append(
            (spy["init"][0].theta_global, est.predict(X, g),
             {k: c.local_values()["Z_l"] for k, c in est.clients_.items()})
        )
    (a, b), (c,) = runs[0], runs[1]
    assert_array_equal(a[0], b[0])
    assert_array_equal(a[1], b[1])
    for k in a[2]:
        assert_array_equal(a[2][k], b[2][k])
    unpack = est.server_.global_pack.unpack
    assert not np.allclose(unpack(a[0])["Z_g"], unpack(c[0])["Z_g"])  # other Sobol scrambling
    assert not np.allclose(a[1], c[1])
    assert any(not np.allclose(a[2][k], c[2][k]) for k in a[2])  # different k-means init


def test_random_state_instance_is_not_reused_identically():
    X, y, g = _clients_data(_SIZES, seed=2)
    rs = np.random.RandomState(0)
    est = FederatedHierarchicalGPRegressor(**{**FAST, "random_state": rs})
    first = est.fit(X, y, g).predict(X, g)
    second = est.fit(X, y, g).predict(X, g)
    assert not np.allclose(first, second)  # a RandomState instance is consumed, as in sklearn
