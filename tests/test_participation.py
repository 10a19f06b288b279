"""Client transport, partial participation, failures, warm start and checkpoints
of the structured family (issue 10, items 2-4)."""

import dataclasses
import warnings
import zlib

import numpy as np
import pytest
from joblib import parallel_config
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils.validation import check_is_fitted

import skfedgp._structured as structured
from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.federated import (
    OBJECTIVE_VERSION,
    ClientFailure,
    JoblibTransport,
    RoundSkippedWarning,
    StructuredClient,
    StructuredStatistics,
    TrainingFailedError,
    TrainingState,
)

# one training run per fit (these tests follow the protocol step by step)
FAST = dict(n_inducing=8, n_inducing_local=5, n_rounds=4, global_steps=5, local_steps=5,
            random_state=0, restart_from_global=False)
IDS = [f"c{k}" for k in range(5)]


def _data(sizes=(40, 40, 40, 40, 40), seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, size=(sum(sizes), 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=X.shape[0])
    g = np.repeat([f"c{k}" for k in range(len(sizes))], sizes)
    return X, y, g


def _fit(X, y, g, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return FederatedHierarchicalGPRegressor(**dict(FAST, **kw)).fit(X, y, g)


def _same_model(a, b, exact=True):
    check = assert_array_equal if exact else (lambda u, v: assert_allclose(u, v, rtol=1e-12,
                                                                          atol=1e-12))
    check(a.server_.theta_global, b.server_.theta_global)
    assert list(a.clients_) == list(b.clients_)
    for k in a.clients_:
        check(a.clients_[k].theta, b.clients_[k].theta)
    check(np.array(a.elbo_history_), np.array(b.elbo_history_))
    check(a.global_posterior_["mean"], b.global_posterior_["mean"])


@pytest.fixture(scope="module")
def data():
    return _data()


@pytest.fixture(scope="module")
def reference(data):
    return _fit(*data)


@pytest.fixture
def combine_spy(monkeypatch):
    """Every (S_i, b_i, e_i) that reaches the server's combine must be finite."""
    calls = []
    orig = structured.combine

    def spy(S, b, e, M):
        for arr in list(S) + list(b) + [np.asarray(e, dtype=float)]:
            assert np.all(np.isfinite(arr)), "a non-finite message reached combine"
        calls.append(len(e))
        return orig(S, b, e, M)

    monkeypatch.setattr(structured, "combine", spy)
    return calls


class _Recorder:
    """Fault hook: records every call, raises for the (client, method, round) it is told."""

    def __init__(self, fail=(), first_only=False, exc=TimeoutError):
        self.fail = set(fail)
        self.first_only = first_only
        self.exc = exc
        self.calls = []
        self.raised = set()

    def __call__(self, cid, method, round_):
        self.calls.append((cid, method, round_))
        key = (cid, method, round_)
        if key in self.fail and not (self.first_only and key in self.raised):
            self.raised.add(key)
            raise self.exc(f"injected: {key}")


# --------------------------------------------------------------------------
# the transport
# --------------------------------------------------------------------------


class _Counter:
    def __init__(self, cid):
        self.client_id = cid
        self.n = 0

    def bump(self, k):
        self.n += k
        return self.n

    def boom(self):
        raise ValueError(f"client {self.client_id} broke")

    def bad_cholesky(self):
        raise np.linalg.LinAlgError("not positive definite")


class _Timed:
    """A client whose ``statistics`` takes a given time and records its thread."""

    def __init__(self, cid, seconds):
        self.client_id = cid
        self.seconds = seconds
        self.threads = []

    def statistics(self, k):
        import threading
        import time

        self.threads.append(threading.get_ident())
        time.sleep(self.seconds)
        return k + 1

    global_gradient = statistics


def test_transport_times_both_dispatches_then_keeps_the_faster():
    """n_jobs > 1 with threads: the first calls of a protocol method are timed
    in a loop and in the pool; sleeping clients (GIL released) are faster in
    the pool, which is then kept; results do not depend on the way."""
    from skfedgp.federated import _TIMING_CALLS

    t = JoblibTransport([_Timed(c, 0.05) for c in "ab"], n_jobs=2)
    with t:
        for k in range(2 * _TIMING_CALLS + 2):
            assert t.call("statistics", (k,)) == {"a": k + 1, "b": k + 1}
    assert t.dispatch_ == {"statistics": "threads"}
    # an undecided method then follows the decided one, untimed
    with t:
        t.call("global_gradient", (0,))
    assert t.dispatch_["global_gradient"] == "threads" and "global_gradient" not in t._timings
    assert len(t._timings["statistics"]["loop"]) == _TIMING_CALLS
    assert len(t._timings["statistics"]["warm-up"]) == 1
    # a call to one client is neither timed nor pooled
    t2 = JoblibTransport([_Timed(c, 0.0) for c in "ab"], n_jobs=2)
    with t2:
        t2.call("statistics", (0,))  # warm-up
        t2.call("statistics", (0,), ids=["a"])
    assert t2._timings["statistics"]["threads"] == [] == t2._timings["statistics"]["loop"]
    # one job, or a method outside the timed protocol: no timing at all
    t1 = JoblibTransport([_Timed(c, 0.0) for c in "ab"], n_jobs=1)
    with t1:
        for k in range(2 * _TIMING_CALLS + 2):
            t1.call("statistics", (k,))
    assert t1.dispatch_ == {} and t1._timings == {}


@pytest.mark.parametrize("backend", ["threading", "loky"])
def test_transport_calls_per_client_args_ids_and_failures(backend):
    t = JoblibTransport([_Counter(c) for c in "abc"], n_jobs=2)
    with parallel_config(backend=backend, n_jobs=2):
        with t:
            out = t.call("bump", {"a": (1,), "b": (10,), "c": (100,)})
            assert out == {"a": 1, "b": 10, "c": 100}
            out = t.call("bump", (5,), ids=["c", "a"], round_=3)
            assert list(out) == ["c", "a"] and out == {"c": 105, "a": 6}
            # process backends: the updated client objects came back
            assert [t.clients[c].n for c in "abc"] == [6, 10, 105]
            out = t.call("boom", ids=["b"], round_=4)
    f = out["b"]
    assert isinstance(f, ClientFailure)
    assert (f.client_id, f.method, f.round, f.numerical) == ("b", "boom", 4, False)
    assert "client b broke" in f.error
    assert t.clients["b"].n == 10  # a failed call leaves the client object as it was
    assert t.call("bad_cholesky", ids=["a"])["a"].numerical


def test_fault_hook_is_called_before_each_call_and_blocks_it():
    hook = _Recorder(fail=[("b", "bump", 7)])
    t = JoblibTransport([_Counter(c) for c in "abc"], fault_hook=hook)
    out = t.call("bump", (1,), round_=7)
    assert hook.calls == [("a", "bump", 7), ("b", "bump", 7), ("c", "bump", 7)]
    assert isinstance(out["b"], ClientFailure) and "TimeoutError" in out["b"].error
    assert t.clients["b"].n == 0 and t.clients["a"].n == 1  # the call was not made


def test_harmless_hook_changes_nothing_and_sees_every_protocol_step(data, reference):
    hook = _Recorder()
    est = _fit(*data, fault_hook=hook)
    _same_model(est, reference)
    assert est.communication_ == reference.communication_
    assert est.failed_clients_ == [] and est.excluded_clients_ == []
    methods = {m for _, m, _ in hook.calls}
    assert methods == {"summary", "prepare", "pilot", "input_scale_check", "initialise",
                       "design_residual", "statistics", "global_gradient", "local_phase", "finish"}
    for c in est.clients_.values():  # "close" forgot every client's data
        assert getattr(c, "_Xs", None) is None and getattr(c, "_y", None) is None


def test_client_methods_return_messages_not_clients(data):
    X, y, g = data
    from skfedgp.federated import Client

    from skfedgp.federated import InitBroadcast, PilotSummary

    c = StructuredClient(Client("c0", X[g == "c0"], y[g == "c0"]))
    assert c.summary().n_samples == 40
    assert c.prepare(InitBroadcast(0.0, 1.0, np.zeros(0), X.min(axis=0), X.max(axis=0))) is None
    assert isinstance(c.pilot(0), PilotSummary)
    assert c.close() is None and c._Xs is None


# --------------------------------------------------------------------------
# failures
# --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["statistics", "global_gradient", "local_phase"])
def test_failure_mid_round_is_retried_then_skipped(data, reference, combine_spy, method):
    hook = _Recorder(fail=[("c1", method, 2)])
    est = _fit(*data, fault_hook=hook, max_retries=1)
    # retried once, then absent for the rest of round 2; back in round 3
    assert est.failed_clients_ == [(2, "c1", method, f"TimeoutError(\"injected: ('c1', "
                                    f"'{method}', 2)\")")] * 2
    assert est.excluded_clients_ == [] and set(est.clients_) == set(IDS)
    assert ("c1", "local_phase", 3) in hook.calls
    assert np.all(np.isfinite(est.elbo_history_)) and len(est.elbo_history_) == 4
    assert combine_spy  # the spy saw every combine
    assert np.all(np.isfinite(est.predict(*data[::2])))
    # the exchanges after the failure had everyone: the failed round costs at
    # most two rounds of progress (after 8 rounds the failed runs are 1.5
    # rounds behind the uninterrupted run: ELBO 96.1-97.4 against 95.3 after
    # its round 6 and 99.5 after its round 8)
    longer = _fit(*data, fault_hook=_Recorder(fail=[("c1", method, 2)]), max_retries=1,
                  n_rounds=8)
    full = _fit(*data, n_rounds=8)
    assert longer.elbo_history_[-1] > full.elbo_history_[5] - 0.01 * abs(full.elbo_history_[5])


def test_a_failure_that_succeeds_on_retry_changes_nothing(data, reference):
    hook = _Recorder(fail=[("c2", "statistics", 3), ("c0", "local_phase", 2)], first_only=True)
    est = _fit(*data, fault_hook=hook, max_retries=1)
    assert [f[:3] for f in est.failed_clients_] == [(2, "c0", "local_phase"),
                                                    (3, "c2", "statistics")]
    _same_model(est, reference)


def test_without_retries_a_failure_is_not_retried(data):
    hook = _Recorder(fail=[("c2", "statistics", 3)], first_only=True)
    est = _fit(*data, fault_hook=hook, max_retries=0)
    assert [f[:3] for f in est.failed_clients_] == [(3, "c2", "statistics")]


def test_non_finite_messages_are_failures_and_never_reach_combine(data, combine_spy,
                                                                  monkeypatch):
    orig = StructuredClient.statistics

    def poisoned(self, theta_g, gpack, config, round_):
        msg = orig(self, theta_g, gpack, config, round_)
        if self.client_id == "c3" and round_ == 2:
            S = msg.precision.copy()
            S[0, 0] = np.nan
            return StructuredStatistics(msg.round, S, msg.shift, msg.constant, msg.log_prior)
        return msg

    monkeypatch.setattr(StructuredClient, "statistics", poisoned)
    est = _fit(*data)
    assert est.failed_clients_ and all(f[1:3] == ("c3", "statistics") and f[0] == 2
                                       and "non-finite" in f[3] for f in est.failed_clients_)
    assert np.all(np.isfinite(est.elbo_history_))
    assert set(est.clients_) == set(IDS)


def test_failures_are_reproducible(data):
    def hook(cid, method, round_):
        # a deterministic 20 % "coin" per (client, method, round) during the rounds
        if 0 < round_ <= 4 and zlib.crc32(f"{cid}/{method}/{round_}".encode()) % 5 == 0:
            raise ConnectionError("dropped")

    a = _fit(*data, fault_hook=hook, client_fraction=0.8)
    b = _fit(*data, fault_hook=hook, client_fraction=0.8)
    _same_model(a, b)
    assert a.failed_clients_ == b.failed_clients_
    assert len(a.failed_clients_) > 0 and np.all(np.isfinite(a.elbo_history_))


def test_too_few_clients_skips_the_round(data):
    hook = _Recorder(fail=[(c, "local_phase", 2) for c in IDS[:4]])
    with pytest.warns(RoundSkippedWarning, match="round 2"):
        est = _fit(*data, fault_hook=hook, min_clients=2)
    h = est.elbo_history_
    assert h[1] == h[0]  # the skipped round repeats the round-start value
    assert np.all(np.isfinite(h)) and h[-1] > h[0]


def test_set_up_and_final_failures_exclude_the_client(data):
    X, y, g = data
    est = _fit(X, y, g, fault_hook=_Recorder(fail=[("c1", "pilot", 0), ("c4", "finish", 5)]))
    assert est.excluded_clients_ == ["c1", "c4"]
    assert set(est.clients_) == {"c0", "c2", "c3"}
    assert est.failed_clients_[0][:3] == (0, "c1", "pilot")
    # the model is that of the remaining clients; an excluded one is a new client
    assert np.all(np.isfinite(est.predict(X[g == "c1"], g[g == "c1"])))
    for c in est.clients_.values():
        assert getattr(c, "_Xs", None) is None


def test_no_model_raises_and_leaves_the_estimator_as_it_was(data):
    X, y, g = data
    est = FederatedHierarchicalGPRegressor(**dict(FAST, fault_hook=_Recorder(
        fail=[(c, "summary", 0) for c in IDS])))
    with pytest.raises(TrainingFailedError, match="no client is left"):
        est.fit(X, y, g)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    est.set_params(fault_hook=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y, g)
    before = est.server_.theta_global.copy()
    est.set_params(fault_hook=_Recorder(fail=[(c, "finish", 5) for c in IDS]))
    with pytest.raises(TrainingFailedError):
        est.fit(X, y, g)
    assert_array_equal(est.server_.theta_global, before)


def test_a_warm_start_whose_clients_all_fail_raises_and_keeps_the_model(data):
    """The first evaluation of a continued run has no stored message: every
    client failing there must end in TrainingFailedError (it reached combine
    with no message and raised an IndexError), and the fitted model stays."""
    X, y, g = data
    est = _fit(X, y, g, warm_start=True)
    before = est.server_.theta_global.copy()
    predicted = est.predict(X[:5], g[:5])

    def hook(client_id, method, round_):
        if round_ is not None and round_ >= 1:
            raise RuntimeError("offline")

    est.set_params(fault_hook=hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exclusions' own warnings
        with pytest.raises(TrainingFailedError, match="no client is left"):
            est.fit(X, y, g)
    assert_array_equal(est.server_.theta_global, before)
    assert_array_equal(est.predict(X[:5], g[:5]), predicted)


# --------------------------------------------------------------------------
# partial participation
# --------------------------------------------------------------------------


def test_partial_participation_samples_reproducibly(data, combine_spy):
    hook = _Recorder()
    a = _fit(*data, client_fraction=0.6, fault_hook=hook)
    b = _fit(*data, client_fraction=0.6)
    _same_model(a, b)
    per_round = {}
    for cid, m, r in hook.calls:
        if m == "local_phase":
            per_round.setdefault(r, []).append(cid)
    assert sorted(per_round) == [1, 2, 3, 4]
    assert all(len(v) == 3 for v in per_round.values())  # ceil(0.6 * 5)
    assert len({tuple(v) for v in per_round.values()}) > 1
    # absent clients send nothing: fewer uploads than with everyone
    full = _fit(*data)
    assert sum(r["n_messages"] for r in a.communication_[1:-1]) < sum(
        r["n_messages"] for r in full.communication_[1:-1])
    c = _fit(*data, client_fraction=0.6, random_state=1)
    assert not np.array_equal(c.server_.theta_global, a.server_.theta_global)


def test_final_elbo_is_exact_after_stale_rounds(data):
    est = _fit(*data, client_fraction=0.6)
    assert np.all(np.isfinite(est.elbo_history_))
    last = est.elbo_history_[-1]
    # a warm start without rounds re-evaluates every client at the fitted vectors
    est.set_params(warm_start=True, n_rounds=0, client_fraction=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(*data)
    assert len(est.elbo_history_) == 4
    assert_allclose(est.elbo_history_[-1], last, rtol=1e-12)


def test_participation_parameters_are_checked(data):
    for kw in (dict(client_fraction=0.0), dict(client_fraction=1.5), dict(min_clients=0),
               dict(max_retries=-1), dict(checkpoint=3), dict(resume_from=3)):
        with pytest.raises(ValueError):
            _fit(*data, **kw)
    with pytest.raises(ValueError, match="structured"):
        _fit(*data, variational_family="mean_field", optimizer="adam", client_fraction=0.5)


# --------------------------------------------------------------------------
# checkpoints and warm start
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(), dict(client_fraction=0.6),
    dict(client_fraction=0.8, fault_hook=_Recorder(fail=[("c1", "pilot", 0),
                                                         ("c2", "statistics", 2)]))])
def test_resume_from_checkpoint_is_identical(data, tmp_path, kw):
    X, y, g = data
    full = _fit(X, y, g, n_rounds=5, **kw)
    assert full.n_iter_ == 5
    path = tmp_path / "state.joblib"
    _fit(X, y, g, n_rounds=2, checkpoint=str(path), **kw)
    state = TrainingState.load(path)
    assert state.round == 2 and len(state.history) == 2
    resumed = _fit(X, y, g, n_rounds=3, resume_from=path, **kw)
    _same_model(resumed, full)
    assert resumed.n_iter_ == 5
    assert resumed.failed_clients_ == full.failed_clients_
    assert resumed.excluded_clients_ == full.excluded_clients_


def test_a_state_of_an_older_objective_is_resumed_with_fresh_messages(data):
    """A state written before the objective changed (here: before the level
    prior joined it) holds an ELBO and log prior of another function; the
    resumed run must not compare the first round's objective with them. With
    the saved value taken as is, a stale log prior 1e6 too high made the
    first resumed round 'lose' and stopped training there (3 rounds, not 5)."""
    X, y, g = data
    seen = {}
    full = _fit(X, y, g, n_rounds=5, tol=1e-12, checkpoint=lambda r, s: seen.__setitem__(r, s))
    assert full.n_iter_ == 5
    state = seen[2]
    assert state.objective_version == OBJECTIVE_VERSION
    old = dataclasses.replace(state, log_prior=state.log_prior + 1e6)
    del old.__dict__["objective_version"]  # as a state of an older version unpickles
    assert old.objective_version == 1
    resumed = _fit(X, y, g, n_rounds=3, tol=1e-12, resume_from=old)
    assert resumed.n_iter_ == 5
    _same_model(resumed, full, exact=False)
    # one evaluation more than the uninterrupted run: the fresh messages
    assert resumed.n_evaluations_ == full.n_evaluations_ + 1
    # a state of this version is trusted as saved (no extra evaluation)
    same = _fit(X, y, g, n_rounds=3, tol=1e-12, resume_from=state)
    assert same.n_iter_ == 5 and same.n_evaluations_ == full.n_evaluations_


def test_resume_after_a_round_that_switched_to_learned_inducing_inputs(data):
    """A round that meets the stopping rule with Z_g held makes the "auto"
    rule check again, and training goes on if it now learns Z_g. The
    checkpoint of that round must hold the decision: it was taken before
    the check, and a run resumed from it held Z_g and gave another model."""
    X, y, g = data
    kw = dict(tol=0.1, n_inducing=10)
    seen = {}
    full = _fit(X, y, g, n_rounds=4, checkpoint=lambda r, s: seen.__setitem__(r, s), **kw)
    # this set-up: the check after round 2 switches to learning Z_g for round 3
    assert full.server_.inducing_switch_round_ == 3 and full.n_iter_ == 3
    assert seen[2].server["learn_inducing_"] is True
    resumed = _fit(X, y, g, n_rounds=2, resume_from=seen[2], **kw)
    _same_model(resumed, full)


def test_a_transient_failure_holds_the_global_vector_for_the_round(data):
    """A participant that fails before the global phase (and did not fail in
    the previous round) holds the global vector for that round: moving it
    against the failed client's stored message, a constant on the whitened
    v_g, favoured the others at its expense (KIN40K, 20 % dropout: a final
    ELBO 4.6 % below the run without failures, 0.1 % with the hold). A
    client failing round after round does not stop training: from its
    second failure in a row it is held fixed as before."""
    X, y, g = data
    seen = {}

    def once(cid, method, r):
        if cid == "c2" and method == "local_phase" and r == 2:
            raise TimeoutError("late")

    _fit(X, y, g, n_rounds=3, tol=0.0, fault_hook=once, max_retries=0,
         checkpoint=lambda r, s: seen.__setitem__(r, s))
    assert_array_equal(seen[2].theta_global, seen[1].theta_global)
    assert seen[2].server["failed_when_last_asked_"] == ["c2"]
    assert seen[2].server["held_last_round_"] is True
    assert not np.array_equal(seen[3].theta_global, seen[2].theta_global)
    assert seen[3].server["failed_when_last_asked_"] == []

    def always(cid, method, r):
        if cid == "c2" and method == "local_phase":
            raise TimeoutError("late")

    seen.clear()
    _fit(X, y, g, n_rounds=3, tol=0.0, fault_hook=always, max_retries=0,
         checkpoint=lambda r, s: seen.__setitem__(r, s))
    # round 1 (its first failure) is held; rounds 2 and 3 move on
    start = _fit(X, y, g, n_rounds=0).server_.theta_global
    assert_array_equal(seen[1].theta_global, start)
    assert not np.array_equal(seen[2].theta_global, seen[1].theta_global)
    assert not np.array_equal(seen[3].theta_global, seen[2].theta_global)


def test_holds_are_never_two_rounds_in_a_row_nor_for_a_repeated_failure(data):
    """Review: with many clients failing now and then, holding the vector at
    every new failure froze it; a client that always failed held it each
    time it was sampled after a round it sat out."""
    X, y, g = data
    seen = {}

    def staggered(cid, method, r):  # a new client fails in each round
        if method == "local_phase" and (cid, r) in {("c2", 2), ("c3", 3), ("c4", 4)}:
            raise TimeoutError("late")

    _fit(X, y, g, n_rounds=4, tol=0.0, fault_hook=staggered, max_retries=0,
         checkpoint=lambda r, s: seen.__setitem__(r, s))
    held = [r for r in (2, 3, 4) if seen[r].server["held_last_round_"]]
    assert held == [2, 4]
    assert_array_equal(seen[2].theta_global, seen[1].theta_global)
    assert not np.array_equal(seen[3].theta_global, seen[2].theta_global)
    assert_array_equal(seen[4].theta_global, seen[3].theta_global)

    def always(cid, method, r):
        if cid == "c2" and method == "local_phase":
            raise TimeoutError("late")

    seen.clear()
    _fit(X, y, g, n_rounds=10, tol=0.0, fault_hook=always, max_retries=0,
         client_fraction=0.4, checkpoint=lambda r, s: seen.__setitem__(r, s))
    asked = sorted({f.round for f in seen[10].failed_clients
                    if f.client_id == "c2" and f.method == "local_phase"})
    assert len(asked) >= 2  # sampled (and failing) in several rounds
    held = [r for r in asked if seen[r].server["held_last_round_"]]
    assert held == asked[:1]  # only its first failure holds the vector
    # still on the list in rounds it sat out
    assert all("c2" in seen[r].server["failed_when_last_asked_"] for r in range(asked[0], 11))


@pytest.mark.parametrize("method", ["statistics", "global_gradient"])
def test_a_phase_cut_short_keeps_the_messages_of_its_end_point(data, method):
    """A client lost inside the global phase stops it at the last accepted
    iterate; the round's bound there uses the messages every participant
    sent at that point (review: the lost client's was the one from a later,
    rejected trial point): it equals the exact ELBO of every client's fresh
    statistics at the round's final vector."""
    X, y, g = data
    calls = {}

    def hook(cid, m, r):
        if cid == "c1" and m == method and r == 2:
            calls[m] = calls.get(m, 0) + 1
            if calls[m] == 3:
                raise TimeoutError("late")

    seen = {}
    _fit(X, y, g, n_rounds=2, tol=0.0, fault_hook=hook, max_retries=0,
         checkpoint=lambda r, s: seen.__setitem__(r, s))
    state = seen[2]
    assert state.server["held_last_round_"] is True  # the phase was cut short
    assert any(f.method == method and f.client_id == "c1" for f in state.failed_clients)
    exact = _fit(X, y, g, n_rounds=0, resume_from=state).elbo_history_[-1]
    assert_allclose(state.elbo, exact, rtol=1e-9)


def test_a_warm_start_resets_the_run_bookkeeping(data):
    """A warm start is a new run: a client that failed in the last round of
    the previous fit counts as newly failing (its failure holds the vector),
    and the "auto" inducing check is not skipped."""
    X, y, g = data

    def fails(cid, method, r):
        if cid == "c2" and method == "local_phase" and r == 2:
            raise TimeoutError("late")

    est = _fit(X, y, g, n_rounds=2, tol=0.0, fault_hook=fails, max_retries=0)
    assert est.server_.failed_when_last_asked_ == ["c2"]
    before = est.server_.theta_global.copy()
    seen = {}
    # the warm start's first round is round 3
    est.set_params(warm_start=True, n_rounds=1,
                   fault_hook=lambda cid, m, r: fails(cid, m, r - 1),
                   checkpoint=lambda r, s: seen.__setitem__(r, s))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y, g)
    assert seen[3].server["held_last_round_"] is True
    assert_array_equal(seen[3].theta_global, before)


def test_checkpoint_keeps_the_auto_inducing_bookkeeping(data):
    """The "auto" rule for Z_g keeps, on the server and so in every
    checkpoint, the clients' numbers of observations (which scale a subset's
    trace term up to all clients) and the vector it last checked at (a
    resumed run does not check it again). Both were run attributes that a
    resume lost, so a resumed run could decide otherwise than the
    uninterrupted one."""
    X, y, g = data
    seen = []
    _fit(X, y, g, n_rounds=2, checkpoint=lambda r, s: seen.append(s))
    for state in seen:
        assert state.server["design_n_samples_"] == {c: 40 for c in IDS}
        checked = state.server["inducing_checked_at_"]
        assert isinstance(checked, bytes) and len(checked) == 8 * state.theta_global.size


def test_checkpoint_callable_gets_every_round(data):
    seen = []
    est = _fit(*data, checkpoint=lambda r, s: seen.append((r, s)))
    assert [r for r, _ in seen] == [1, 2, 3, 4]
    assert all(isinstance(s, TrainingState) and s.round == r for r, s in seen)
    assert set(seen[-1][1].client_states) == set(est.clients_)
    # resuming from the state after round 4 with no round reproduces the fit
    again = _fit(*data, n_rounds=0, resume_from=seen[-1][1])
    _same_model(again, est)


def test_warm_start_continues(data, tmp_path):
    X, y, g = data
    full = _fit(X, y, g, n_rounds=5)
    est = _fit(X, y, g, n_rounds=2)
    est.set_params(warm_start=True, n_rounds=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y, g)
    _same_model(est, full, exact=False)
    # new and missing clients: c4 leaves, c5 joins
    X2, y2, g2 = _data(sizes=(40, 40, 40, 40, 0, 30), seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_params(n_rounds=2).fit(X2, y2, g2)
    assert set(est.clients_) == {"c0", "c1", "c2", "c3", "c5"}
    assert len(est.elbo_history_) == 7 and np.all(np.isfinite(est.elbo_history_))
    assert est.y_scale_ == full.y_scale_  # the first fit's standardisation is kept


def test_process_backend_with_failures_matches_threads(data):
    hook = _Recorder(fail=[("c1", "global_gradient", 2), ("c3", "local_phase", 3)])
    a = _fit(*data, fault_hook=hook, client_fraction=0.8, n_rounds=3)
    hook = _Recorder(fail=[("c1", "global_gradient", 2), ("c3", "local_phase", 3)])
    with parallel_config(backend="loky", n_jobs=2):
        b = _fit(*data, fault_hook=hook, client_fraction=0.8, n_rounds=3, n_jobs=2)
    _same_model(a, b)
    assert a.failed_clients_ == b.failed_clients_


def test_client_code_errors_are_contained_mid_round_and_raised_in_set_up(data, monkeypatch):
    orig = StructuredClient.local_phase

    def flaky(self, post, theta_g, gpack, config):
        if self.client_id == "c2" and post.round == 2:  # the local phase of round 3
            raise RuntimeError("disk full")
        return orig(self, post, theta_g, gpack, config)

    monkeypatch.setattr(StructuredClient, "local_phase", flaky)
    est = _fit(*data)
    assert [f[:3] for f in est.failed_clients_] == [(3, "c2", "local_phase")] * 2
    assert "disk full" in est.failed_clients_[0][3] and set(est.clients_) == set(IDS)

    def broken(self, *args):
        if self.client_id == "c2":
            raise RuntimeError("cannot read the data")
        return orig_pilot(self, *args)

    orig_pilot = StructuredClient.pilot
    monkeypatch.setattr(StructuredClient, "pilot", broken)
    with pytest.raises(RuntimeError, match="cannot read the data"):
        _fit(*data)


def test_warm_start_with_a_new_client():
    """A warm start on data with a client the first fit never saw continues
    training (the server's saved fields include ones that are None)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 1))
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.normal(size=60)
    g = np.repeat(["A", "B", "C"], 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=0, warm_start=True, n_rounds=3)
        est.fit(X[:40], y[:40], g[:40])
        est.fit(X, y, g)
    assert set(est.clients_) == {"A", "B", "C"}
    m, s = est.predict(X[40:], g[40:], return_std=True)
    assert np.all(np.isfinite(m)) and np.all(s > 0)


def test_a_new_client_of_a_warm_start_has_its_set_up_download_counted(monkeypatch):
    """The client a warm start adds is sent the global vector and the
    population pilot (``initialise``), as at a first set-up: the resumed
    run's set-up books them, besides every client's standardisation."""
    import skfedgp.federated as fed

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 1))
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.normal(size=60)
    g = np.repeat(["A", "B", "C"], 20)
    sent, counted = {}, []
    orig_init, orig_resume = fed.StructuredClient.initialise, fed._StructuredRun.resume

    def initialise(self, cfg, M_local, theta_g, gpack, pilot, pop, seed):
        sent[self.client_id] = theta_g.nbytes + fed.message_nbytes(pop)
        return orig_init(self, cfg, M_local, theta_g, gpack, pilot, pop, seed)

    def resume(self, state, seeds):
        # the set-up's downloads: up to the first evaluation at the saved vector
        before, msgs = self.counter["down"], self.counter["msgs"]

        def evaluate_all(*args):
            if len(counted) == 0:
                counted.append(self.counter["down"] - before
                               - len(self.active) * fed.message_nbytes(self.init))
                # uploads: every client's summary, the new client's pilot
                # and its input-scale report (the set-up's test)
                counted.append(self.counter["msgs"] - msgs - len(self.active))
            return orig_evaluate(*args)

        orig_evaluate = self.evaluate_all
        self.evaluate_all = evaluate_all
        try:
            return orig_resume(self, state, seeds)
        finally:
            del self.evaluate_all

    monkeypatch.setattr(fed.StructuredClient, "initialise", initialise)
    monkeypatch.setattr(fed._StructuredRun, "resume", resume)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=0, warm_start=True, n_rounds=2)
        est.fit(X[:40], y[:40], g[:40])
        sent.clear()
        est.fit(X, y, g)
    assert list(sent) == ["C"] and sent["C"] > 0
    assert counted == [sent["C"], 2]


@pytest.mark.parametrize("change, field", [
    (dict(components=("local",)), "components"),
    (dict(components=("global",)), "components"),
    (dict(n_inducing=5), "n_inducing"),
    (dict(client_scale=True), "client_scale"),
])
def test_resume_and_warm_start_refuse_other_model_settings(data, tmp_path, change, field):
    """The saved vectors belong to the model they were trained for: continuing
    them under other model settings is refused by name (it used to mix the two
    silently), while settings that only steer the optimisation may change."""
    X, y, g = data
    path = tmp_path / "state.joblib"
    est = _fit(X, y, g, n_rounds=1, checkpoint=str(path))
    with pytest.raises(ValueError, match=f"resume_from: the saved model was trained with "
                                         f"{field}=.*this fit has {field}="):
        _fit(X, y, g, n_rounds=1, resume_from=path, **change)
    before = est.elbo_history_.copy()
    est.set_params(warm_start=True, **change)
    with pytest.raises(ValueError, match=f"warm_start: the saved model was trained with {field}="):
        est.fit(X, y, g)
    assert_array_equal(est.elbo_history_, before)  # the fitted model is untouched
    # settings that do not define the model's vectors may change: the
    # optimiser, steps, tolerances, starting values (also given as another
    # type of the same value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        _fit(X, y, g, n_rounds=1, resume_from=path, local_steps=3, tol=1e-3,
             lengthscale=np.float64(0.5), noise_variance=0.1)
        est2 = _fit(X, y, g, n_rounds=1, optimizer="adam")
        est2.set_params(warm_start=True, optimizer="lbfgs", lengthscale=[0.5, 0.5], n_rounds=1)
        est2.fit(X, y, g)
        assert est2.n_iter_ == 2


def test_continuing_a_one_column_model_with_two_columns_is_refused_by_name(data, tmp_path):
    X, y, g = data
    path = tmp_path / "state.joblib"
    est = _fit(X, y, g, n_rounds=1, checkpoint=str(path))
    Y = np.c_[y, -y]
    msg = "trained on 1 target column\\(s\\), y has 2"
    with pytest.raises(ValueError, match="resume_from: the saved model was " + msg):
        _fit(X, Y, g, n_rounds=1, resume_from=path)
    est.set_params(warm_start=True)
    with pytest.raises(ValueError, match="warm_start: the saved model was " + msg):
        est.fit(X, Y, g)


def test_a_state_without_recorded_settings_still_resumes(data, tmp_path):
    # a checkpoint written before the settings were recorded (config=None)
    X, y, g = data
    path = tmp_path / "state.joblib"
    full = _fit(X, y, g, n_rounds=3)
    _fit(X, y, g, n_rounds=1, checkpoint=str(path))
    state = TrainingState.load(path)
    assert state.config is not None
    state.config = None
    resumed = _fit(X, y, g, n_rounds=2, resume_from=state)
    _same_model(resumed, full)


def test_checkpoint_and_resume_paths_are_checked_before_training(data, tmp_path):
    X, y, g = data
    calls = []
    hook = lambda cid, method, r: calls.append(method)  # noqa: E731
    with pytest.raises(ValueError, match="checkpoint: the folder .* does not exist"):
        _fit(X, y, g, n_rounds=1, fault_hook=hook,
             checkpoint=str(tmp_path / "missing" / "state.joblib"))
    with pytest.raises(ValueError, match="checkpoint: .* is a folder"):
        _fit(X, y, g, n_rounds=1, fault_hook=hook, checkpoint=str(tmp_path))
    assert calls == []  # refused before any client was asked anything
    junk = tmp_path / "junk.joblib"
    junk.write_bytes(b"not a pickle at all")
    with pytest.raises(TypeError, match="is not a saved TrainingState"):
        _fit(X, y, g, n_rounds=1, resume_from=junk)


def test_no_round_is_reported_as_none_and_an_unreachable_min_clients_is_refused(data):
    X, y, g = data
    est = _fit(X, y, g, n_rounds=0)
    assert est.n_iter_ == 0 and len(est.elbo_history_) == 1
    mf = _fit(X, y, g, n_rounds=0, variational_family="mean_field", optimizer="adam")
    assert mf.n_iter_ == 0 and len(mf.elbo_history_) == 1
    with pytest.raises(ValueError, match="min_clients=6 exceeds the number of clients in the "
                                         "data \\(5\\)"):
        _fit(X, y, g, n_rounds=1, min_clients=6)
    assert _fit(X, y, g, n_rounds=1, min_clients=5).n_iter_ == 1


def test_a_client_whose_local_phase_always_fails_is_named(data):
    X, y, g = data

    def hook(cid, method, r):
        if cid == "c2" and method == "local_phase":
            raise TimeoutError("late")

    est = FederatedHierarchicalGPRegressor(**dict(FAST, n_rounds=3, tol=0.0, fault_hook=hook))
    with pytest.warns(ConvergenceWarning, match=r"client\(s\) \['c2'\] failed their local phase "
                                                r"whenever asked in this fit"):
        est.fit(X, y, g)
    # with partial participation: asked in some rounds only, failing each time
    part = FederatedHierarchicalGPRegressor(**dict(FAST, n_rounds=6, tol=0.0, fault_hook=hook,
                                                   client_fraction=0.4))
    with pytest.warns(ConvergenceWarning, match=r"\['c2'\] failed their local phase"):
        part.fit(X, y, g)
    asked = {f[0] for f in part.failed_clients_ if f[1] == "c2" and f[2] == "local_phase"}
    assert 0 < len(asked) < 6  # asked in some rounds only
    assert "c2" in est.clients_
    # failing in some rounds only is not reported by this warning
    hook2 = _Recorder(fail=[("c2", "local_phase", 2)])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        FederatedHierarchicalGPRegressor(**dict(FAST, n_rounds=3, tol=0.0,
                                                fault_hook=hook2)).fit(X, y, g)
    assert not any("failed their local phase" in str(w.message) for w in rec)


def test_continuing_after_changed_settings_and_after_no_round(data, tmp_path):
    """A resume with a changed prior re-evaluates first (its saved ELBO and log
    prior belong to the old objective: the first resumed round's gain was
    measured across two objectives and training stopped after it); a warm
    start of a fit of no round counts only its own rounds."""
    X, y, g = data
    path = tmp_path / "state.joblib"
    _fit(X, y, g, n_rounds=2, checkpoint=str(path), noise_prior_scale=None)

    def before_first_local_phase(**kw):
        rec = _Recorder()
        _fit(X, y, g, n_rounds=1, resume_from=path, fault_hook=rec, **kw)
        methods = [m for _, m, _ in rec.calls]
        return set(methods[:methods.index("local_phase")])

    # the same settings continue from the saved evaluation; a changed prior
    # makes every client send fresh statistics first
    assert "statistics" not in before_first_local_phase(noise_prior_scale=None)
    assert "statistics" in before_first_local_phase(noise_prior_scale=0.05)
    zero = _fit(X, y, g, n_rounds=0)
    zero.set_params(warm_start=True, n_rounds=1)
    zero.fit(X, y, g)
    assert zero.n_iter_ == 1 and len(zero.elbo_history_) == 1
    # normalize_y defines the meaning of the saved offsets: refused
    with pytest.raises(ValueError, match="normalize_y"):
        _fit(X, y, g, n_rounds=1, resume_from=path, normalize_y=False)


def test_a_warm_start_applies_new_learning_rates(data):
    """scikit-learn's warm_start continues with the new parameters: Adam's
    moments continue, at the new step sizes (the saved ones were kept)."""
    X, y, g = data
    est = _fit(X, y, g, n_rounds=1, optimizer="adam", learning_rate=0.05,
               global_learning_rate=0.02)
    seen = []
    est.set_params(warm_start=True, n_rounds=1, learning_rate=1e-3, global_learning_rate=1e-4,
                   checkpoint=lambda r, st: seen.append(st))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y, g)
    assert all(c._adam.learning_rate == 1e-3 for c in est.clients_.values())
    assert seen[-1].adam.learning_rate == 1e-4
    assert seen[-1].adam.t > 1  # the moments continued


def test_warm_start_refuses_labels_that_only_look_like_the_fitted_clients(data):
    """A continuation with '0', '1', ... after 0, 1, ... would drop every fitted
    client and start new ones: it is refused as a fresh fit refuses such a mix,
    and the fitted model stays."""
    X, y, g = data
    g = np.unique(g, return_inverse=True)[1]  # 0, 1, ... as ints
    est = _fit(X, y, g, warm_start=True)
    before = est.server_.theta_global.copy()
    with pytest.raises(ValueError, match="warm_start=True.*look alike.*0 .int. vs '0' .str."):
        est.fit(X, y, g.astype(str))
    assert_array_equal(est.server_.theta_global, before)
    assert list(est.clients_) == list(range(5))


def test_resume_from_ignores_the_fitted_clients_labels_under_warm_start():
    """resume_from continues the saved run, not the fitted model, so the fitted
    clients' labels (ints) do not make the saved run's labels (str) a mix."""
    X, y, g = _data(sizes=(30, 30, 30))
    gi = np.unique(g, return_inverse=True)[1]
    g = gi.astype(str)
    states = []
    _fit(X, y, g, n_rounds=2, checkpoint=lambda r, st: states.append(st))
    est = _fit(X, y, gi, n_rounds=2, warm_start=True)
    est.set_params(resume_from=states[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y, g)
    assert list(est.clients_) == ["0", "1", "2"]
