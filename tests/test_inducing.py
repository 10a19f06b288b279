"""Learned or held inducing inputs (``learn_inducing_locations``): the trace
residual that decides "auto", that held inputs do not move and learned ones
do, the decisions in the fitted model, checkpoints and bad values."""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp import federated as fed


def se(A, B, ell, var):
    """Plain NumPy SE-ARD kernel (independent of skfedgp.kernels)."""
    D = (A[:, None, :] - B[None, :, :]) / np.asarray(ell)
    return var * np.exp(-0.5 * np.sum(D**2, axis=-1))


def test_design_residual_is_the_nystrom_trace_residual():
    rng = np.random.default_rng(0)
    X, Z = rng.uniform(size=(40, 3)), rng.uniform(size=(7, 3))
    ells = np.array([[0.3, 0.5, 0.9], [0.2, 0.2, 0.4]])
    res, tot = fed.design_residual(X, Z, ells, 1.7, jitter=1e-10)
    want = 0.0
    for ell in ells:
        Kzz = se(Z, Z, ell, 1.7) + 1e-10 * 1.7 * np.eye(7)
        Kxz = se(X, Z, ell, 1.7)
        want += np.trace(se(X, X, ell, 1.7) - Kxz @ np.linalg.solve(Kzz, Kxz.T))
    assert_allclose(res, want, rtol=1e-6)
    assert tot == pytest.approx(2 * 40 * 1.7)
    # inducing inputs at the inputs explain the whole prior
    res0, _ = fed.design_residual(X, X, ells[0], 1.7, jitter=1e-10)
    assert res0 < 1e-6 * tot


def _one_d(seed=0, n_clients=4, n=25):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n_clients * n, 1))
    g = np.repeat(np.arange(n_clients), n)
    y = np.sin(X[:, 0]) + 0.3 * g + 0.1 * rng.normal(size=len(g))
    return X, y, g


def _fit(X, y, g, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return FederatedHierarchicalGPRegressor(random_state=0, **kw).fit(X, y, g)


def _Z(est):
    srv = est.server_
    G = srv.global_pack.unpack(srv.theta_global)
    return G.get("Z_g"), {lab: c.local_values().get("Z_l") for lab, c in est.clients_.items()}


@pytest.mark.parametrize("learn", [False, True])
def test_held_inducing_inputs_stay_where_the_set_up_put_them(learn):
    X, y, g = _one_d()
    start = _fit(X, y, g, n_rounds=0, learn_inducing_locations=learn, n_inducing_local=5)
    est = _fit(X, y, g, n_rounds=4, learn_inducing_locations=learn, n_inducing_local=5)
    Zg0, Zl0 = _Z(start)
    Zg, Zl = _Z(est)
    assert est.learn_inducing_locations_ is learn
    # the hyperparameters moved either way
    assert not np.allclose(start.server_.theta_global, est.server_.theta_global)
    if learn:
        assert not np.allclose(Zg, Zg0)
        assert any(not np.allclose(Zl[k], Zl0[k]) for k in Zl)
    else:
        assert_array_equal(Zg, Zg0)
        for k in Zl:
            assert_array_equal(Zl[k], Zl0[k])


def test_auto_holds_a_design_that_covers_the_inputs():
    X, y, g = _one_d()
    est = _fit(X, y, g)
    assert est.learn_inducing_locations_ is False
    assert est.server_.design_residual_ <= fed.AUTO_LEARN_RESIDUAL
    # and so does every client whose local set explains its own prior
    assert not any(c.learn_local_inducing for c in est.clients_.values())


def test_auto_learns_a_design_too_sparse_for_the_inputs():
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(120, 6))
    g = np.repeat(np.arange(3), 40)
    y = np.sin(4 * X[:, 0]) * np.cos(3 * X[:, 1]) + X[:, 2] + 0.05 * rng.normal(size=120)
    est = _fit(X, y, g, n_inducing=8, n_inducing_local=4, n_rounds=2,
               lengthscale=0.3, local_lengthscale=0.3)
    assert est.server_.design_residual_ > fed.AUTO_LEARN_RESIDUAL
    assert est.learn_inducing_locations_ is True
    assert all(c.learn_local_inducing for c in est.clients_.values())
    # the residual the server combined is the clients' summed Nystrom residual
    srv = est.server_
    assert 0.0 < srv.design_residual_ <= 1.0


def test_auto_decision_costs_four_numbers_per_client():
    X, y, g = _one_d()
    auto = _fit(X, y, g, n_rounds=1)
    held = _fit(X, y, g, n_rounds=1, learn_inducing_locations=False)
    up = auto.communication_[0]["bytes_up"] - held.communication_[0]["bytes_up"]
    assert up == 4 * 4 * 8  # four clients, four numbers each
    assert auto.communication_[0]["n_messages"] - held.communication_[0]["n_messages"] == 4


def test_resume_keeps_the_decision(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(90, 5))
    g = np.repeat(np.arange(3), 30)
    y = np.sin(4 * X[:, 0]) + X[:, 1] + 0.05 * rng.normal(size=90)
    kw = dict(n_inducing=6, n_inducing_local=3, lengthscale=0.3, local_lengthscale=0.3)
    full = _fit(X, y, g, n_rounds=3, **kw)
    assert full.learn_inducing_locations_ is True
    path = tmp_path / "state.joblib"
    _fit(X, y, g, n_rounds=1, checkpoint=str(path), **kw)
    resumed = _fit(X, y, g, n_rounds=2, resume_from=str(path), **kw)
    assert resumed.learn_inducing_locations_ is True
    assert_array_equal(resumed.server_.theta_global, full.server_.theta_global)
    assert resumed.elbo_history_ == full.elbo_history_


@pytest.mark.parametrize("bad", ["yes", 1, None, "Auto"])
def test_bad_learn_inducing_locations_is_a_clear_error(bad):
    X, y, g = _one_d()
    with pytest.raises(ValueError, match="learn_inducing_locations must be True, False or 'auto'"):
        FederatedHierarchicalGPRegressor(learn_inducing_locations=bad).fit(X, y, g)


def test_mean_field_family_holds_inducing_inputs_when_asked():
    X, y, g = _one_d(n=15)
    kw = dict(variational_family="mean_field", optimizer="adam", n_rounds=3, n_inducing=6,
              n_inducing_local=4)
    held = _fit(X, y, g, learn_inducing_locations=False, **kw)
    start = _fit(X, y, g, learn_inducing_locations=False, **{**kw, "n_rounds": 0})
    G0 = start.server_.global_pack.unpack(start.server_.theta_global)
    G = held.server_.global_pack.unpack(held.server_.theta_global)
    assert_array_equal(G["Z_g"], G0["Z_g"])
    learned = _fit(X, y, g, **kw)  # "auto" counts as learned for the mean-field family
    G1 = learned.server_.global_pack.unpack(learned.server_.theta_global)
    assert not np.allclose(G1["Z_g"], G0["Z_g"])


def test_noise_dominated_pilot_starts_the_local_part_from_the_population(monkeypatch):
    """A client whose pilot took its targets for noise starts its local kernel
    from the population's pilot values (its own would start it switched off);
    the other clients start from their own pilots."""
    X, y, g = _one_d()
    orig_pilot, orig_init = fed.StructuredClient.pilot, fed.StructuredClient.initialise
    seen = {}

    def pilot(self, random_state):
        p = orig_pilot(self, random_state)
        if self.client_id == 1:  # more noise than signal
            return fed.PilotSummary(p.lengthscale * 50.0, 0.01, 1.0)
        return p

    def initialise(self, config, M_local, theta_g, gpack, own, population, random_state):
        orig_init(self, config, M_local, theta_g, gpack, own, population, random_state)
        seen[self.client_id] = (self.local_values(), own, population,
                                np.ptp(self._Xs, axis=0))

    monkeypatch.setattr(fed.StructuredClient, "pilot", pilot)
    monkeypatch.setattr(fed.StructuredClient, "initialise", initialise)
    _fit(X, y, g, n_rounds=0)
    B, own, pop, span = seen[1]
    assert own.variance < own.noise_variance
    assert_allclose(B["lengthscale_l"], fed.start_lengthscale(pop.lengthscale, span))
    assert B["variance_l"] == pytest.approx(0.1 * pop.variance)
    assert B["noise_variance"] == pytest.approx(1.0)  # its noise still starts at its pilot's
    B0, own0, _, span0 = seen[0]
    assert_allclose(B0["lengthscale_l"], fed.start_lengthscale(own0.lengthscale, span0))
    assert B0["variance_l"] == pytest.approx(0.1 * own0.variance)


def _five_d(seed=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(90, 5))
    g = np.repeat(np.arange(3), 30)
    y = np.sin(4 * X[:, 0]) + X[:, 1] + 0.05 * rng.normal(size=90)
    return X, y, g


@pytest.mark.parametrize("first, then", [(True, False), ("auto", False), (False, True)])
def test_a_given_setting_applies_to_a_warm_start(first, then):
    """A given True/False applies to the global and the local inducing inputs
    of a warm start, whatever the first fit decided."""
    X, y, g = _five_d()
    kw = dict(n_inducing=6, n_inducing_local=3, lengthscale=0.3, local_lengthscale=0.3)
    est = _fit(X, y, g, n_rounds=1, learn_inducing_locations=first, warm_start=True, **kw)
    Zg0, Zl0 = _Z(est)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_params(learn_inducing_locations=then, n_rounds=2).fit(X, y, g)
    Zg, Zl = _Z(est)
    assert est.learn_inducing_locations_ is then
    # each client's recorded decision is the one this training used
    assert all(c.learn_local_inducing is then for c in est.clients_.values())
    if then:  # learned: Z_g moves, and the Z_l of a client whose local part is on
        assert not np.allclose(Zg, Zg0)
        assert any(not np.allclose(Zl[k], Zl0[k], rtol=0, atol=1e-4) for k in Zl)
    else:  # held exactly
        assert_array_equal(Zg, Zg0)
        for k in Zl:
            assert_array_equal(Zl[k], Zl0[k])


def test_no_global_part_learns_no_global_inducing_inputs():
    X, y, g = _one_d()
    for learn in ("auto", True):
        est = _fit(X, y, g, n_rounds=1, components=("local",), learn_inducing_locations=learn)
        assert est.learn_inducing_locations_ is False
        # and no local part learns no local ones
        est = _fit(X, y, g, n_rounds=1, components=("global",), learn_inducing_locations=learn)
        assert not any(c.learn_local_inducing for c in est.clients_.values())
    # the deviation alone has global inducing inputs
    est = _fit(X, y, g, n_rounds=1, components=("deviation", "local"),
               learn_inducing_locations=True)
    assert est.learn_inducing_locations_ is True
    mf = _fit(X, y, g, n_rounds=1, components=("local",), variational_family="mean_field",
              optimizer="adam")
    assert mf.learn_inducing_locations_ is False


def test_an_estimator_pickled_before_the_option_refits_as_it_did():
    import pickle

    X, y, g = _one_d(n=10)
    est = _fit(X, y, g, n_rounds=1)
    del est.__dict__["learn_inducing_locations"]  # as pickled by an older version
    old = pickle.loads(pickle.dumps(est))
    assert old.get_params()["learn_inducing_locations"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        old.fit(X, y, g)
    assert old.learn_inducing_locations_ is True


# --------------------------------------------------------------------------
# the trace term in nats, and the re-check as the hyperparameters move
# --------------------------------------------------------------------------


def test_auto_rule_share_and_nats():
    # the share alone decides at set-up (nats=None)
    assert fed.auto_learns(2.0, 100.0) is True
    assert fed.auto_learns(0.5, 100.0) is False
    n = 100_000  # per observation
    lim = fed.AUTO_LEARN_NATS * n
    assert lim > fed.AUTO_LEARN_MIN_NATS
    assert fed.auto_learns(0.5, 100.0, None, n) is False
    assert fed.auto_learns(0.5, 100.0, 1.01 * lim, n) is True
    assert fed.auto_learns(0.5, 100.0, 0.99 * lim, n) is False
    n = 10  # a small data set: at least AUTO_LEARN_MIN_NATS in all
    assert fed.auto_learns(0.5, 100.0, 0.99 * fed.AUTO_LEARN_MIN_NATS, n) is False
    assert fed.auto_learns(0.5, 100.0, 1.01 * fed.AUTO_LEARN_MIN_NATS, n) is True


def test_latent_design_residuals_sum_to_the_design_residual():
    rng = np.random.default_rng(3)
    X, Z = rng.uniform(size=(30, 2)), rng.uniform(size=(5, 2))
    ells = np.array([[0.3, 0.5], [0.2, 0.9], [1.0, 1.0]])
    res, tot = fed.latent_design_residuals(X, Z, ells, 0.7, jitter=1e-10)
    assert res.shape == (3,)
    for r, ell in enumerate(ells):
        assert_allclose(res[r], fed.design_residual(X, Z, ell, 0.7, jitter=1e-10)[0])
    assert tot == pytest.approx(30 * 0.7)


def _capture_at_finish(monkeypatch, cls):
    """Run a fit and, in every client's final exchange, record the trace term
    of the bound's own state next to what the "auto" rule computes."""
    seen = []
    orig = cls.finish

    def finish(self, post, theta_g, gpack, config):
        self.statistics(theta_g, gpack, config, post.round)
        st, L = self._state, self.local_values()
        if hasattr(st, "trR"):  # multi-output: one trace term per channel
            bound = float(np.sum(st.trR / np.broadcast_to(st.s2, st.trR.shape))) / 2.0
        else:
            bound = st.tr_R / (2.0 * st.s2)
        mine = self.design_residual(theta_g, gpack, config).nats
        if "Z_l" in L:
            res, _ = fed.latent_design_residuals(self._Xs, L["Z_l"], L["lengthscale_l"],
                                                 float(L.get("variance_l", 1.0)), config.jitter,
                                                 per_row=True)
            mine += self._trace_nats("l", res, L)
        seen.append((bound, mine))
        return orig(self, post, theta_g, gpack, config)

    monkeypatch.setattr(cls, "finish", finish)
    return seen


def test_trace_nats_is_the_trace_term_of_the_bound(monkeypatch):
    seen = _capture_at_finish(monkeypatch, fed.StructuredClient)
    X, y, g = _one_d(n=15)
    _fit(X, y, g, n_rounds=2, n_inducing=6, n_inducing_local=4, restart_from_global=False)
    assert len(seen) == 4
    for bound, mine in seen:
        assert bound > 0
        assert_allclose(mine, bound, rtol=1e-6)


@pytest.mark.parametrize("missing", [False, True])
def test_trace_nats_of_a_multi_output_client(monkeypatch, missing):
    seen = _capture_at_finish(monkeypatch, fed.ILMMStructuredClient)
    rng = np.random.default_rng(4)
    X = rng.uniform(0, 5, size=(60, 1))
    g = np.repeat([0, 1, 2], 20)
    Y = np.c_[np.sin(2 * X[:, 0]), np.cos(X[:, 0]) + 0.1 * g] + 0.05 * rng.normal(size=(60, 2))
    if missing:  # a third of the second output dropped out: those rows count once
        Y[rng.permutation(60)[:20], 1] = np.nan
    # one run (no global-only fit first, whose clients would finish too)
    _fit(X, Y, g, n_rounds=2, n_inducing=5, n_inducing_local=3, n_latent=(2, 1, 1),
         noise="diagonal", restart_from_global=False)
    assert len(seen) == 3
    for bound, mine in seen:
        assert bound > 0
        assert_allclose(mine, bound, rtol=1e-6)


def _shrinking_lengthscale_case():
    # a wiggly function fitted from a long starting lengthscale: at the start
    # the 12 inducing points cover the inputs; once training shortens the
    # lengthscale they cannot
    rng = np.random.default_rng(5)
    X = rng.uniform(0, 10, size=(160, 1))
    g = np.repeat([0, 1], 80)
    y = np.sin(3 * X[:, 0]) + 0.05 * rng.normal(size=160)
    return X, y, g, dict(n_inducing=12, lengthscale=4.0, components=("global",))


def test_auto_learns_a_held_design_once_the_lengthscale_shrinks():
    X, y, g, kw = _shrinking_lengthscale_case()
    est = _fit(X, y, g, n_rounds=12, **kw)
    srv = est.server_
    hist = srv.design_residual_history_
    assert hist[0][0] == 0 and hist[0][1] <= fed.AUTO_LEARN_RESIDUAL  # held at set-up
    assert est.learn_inducing_locations_ is True
    r = srv.inducing_switch_round_
    assert r is not None and r >= 2
    # the switch is recorded in the round it took effect, with a reason
    assert hist[-1][0] == r
    assert hist[-1][1] > fed.AUTO_LEARN_RESIDUAL or hist[-1][2] > fed.AUTO_LEARN_NATS
    # and the learned design moved afterwards
    G0 = _fit(X, y, g, n_rounds=0, **kw)
    assert not np.allclose(_Z(est)[0], _Z(G0)[0])
    # a given False keeps it held whatever the residual
    held = _fit(X, y, g, n_rounds=12, learn_inducing_locations=False, **kw)
    assert held.learn_inducing_locations_ is False
    assert held.server_.design_residual_history_ == []
    assert_array_equal(_Z(held)[0], _Z(G0)[0])


def test_auto_switch_by_the_trace_term_alone(monkeypatch):
    X, y, g, kw = _shrinking_lengthscale_case()
    monkeypatch.setattr(fed, "AUTO_LEARN_RESIDUAL", 1.0)  # the share never decides
    est = _fit(X, y, g, n_rounds=12, **kw)
    hist = est.server_.design_residual_history_
    assert est.learn_inducing_locations_ is True
    T = hist[-1][2] * len(y)
    assert T > max(fed.AUTO_LEARN_MIN_NATS, fed.AUTO_LEARN_NATS * len(y))
    assert all(h[2] * len(y) <= max(fed.AUTO_LEARN_MIN_NATS, fed.AUTO_LEARN_NATS * len(y))
               for h in hist[1:-1])
    monkeypatch.setattr(fed, "AUTO_LEARN_NATS", np.inf)
    monkeypatch.setattr(fed, "AUTO_LEARN_MIN_NATS", np.inf)
    never = _fit(X, y, g, n_rounds=12, **kw)
    assert never.learn_inducing_locations_ is False
    assert never.server_.inducing_switch_round_ is None
    assert len(never.server_.design_residual_history_) >= 3  # checked on every round


def test_held_design_does_not_move_before_the_switch_round():
    X, y, g, kw = _shrinking_lengthscale_case()
    states = {}
    est = _fit(X, y, g, n_rounds=6, checkpoint=lambda r, st: states.__setitem__(r, st), **kw)
    r = est.server_.inducing_switch_round_
    assert r is not None and r >= 2
    pack = est.server_.global_pack
    Z0 = _Z(_fit(X, y, g, n_rounds=0, **kw))[0]
    for k in range(1, r):
        assert_array_equal(pack.unpack(states[k].theta_global)["Z_g"], Z0)
    assert not np.allclose(pack.unpack(states[r].theta_global)["Z_g"], Z0)


def test_a_client_learns_its_local_design_once_its_lengthscale_shrinks():
    X, y, g, kw = _shrinking_lengthscale_case()
    kw = dict(components=("local",), n_inducing_local=12, local_lengthscale=4.0)
    start = _fit(X, y, g, n_rounds=0, **kw)
    assert not any(c.learn_local_inducing for c in start.clients_.values())
    est = _fit(X, y, g, n_rounds=12, **kw)
    assert all(c.learn_local_inducing for c in est.clients_.values())
    Zl0, Zl = _Z(start)[1], _Z(est)[1]
    assert all(not np.allclose(Zl[k], Zl0[k]) for k in Zl)


def test_union_design_spreads_points_over_the_union_and_measures_it():
    """Boxes overlapping, disjoint and tiny: the volume matches inclusion-
    exclusion, every point lies in the union, overlaps are not counted
    twice, and each disjoint piece gets points in proportion to its area."""
    lo = np.array([[0.0, 0.0], [0.5, 0.5], [0.9, 0.9]])
    hi = np.array([[0.6, 0.6], [0.8, 0.8], [0.9 + 1e-4, 0.9 + 1e-4]])
    want = 0.36 + 0.09 - 0.01 + 1e-8
    pts, vol = fed.union_design(lo, hi, 2000, 0)
    assert pts.shape == (2000, 2)
    assert vol == pytest.approx(want, rel=0.02)
    inside = np.zeros(len(pts), dtype=bool)
    for a, b in zip(lo, hi):
        inside |= np.all((pts >= a) & (pts <= b), axis=1)
    assert inside.all()
    # uniform over the union: the overlap [0.5, 0.6]^2 holds 0.01 / 0.44 of it
    overlap = np.all((pts >= 0.5) & (pts <= 0.6), axis=1).mean()
    assert overlap == pytest.approx(0.01 / 0.44, abs=0.01)
    # two far, tiny boxes of areas 1 : 4 (in 1e-8 units)
    lo2 = np.array([[0.0, 0.0], [1 - 2e-4, 1 - 2e-4]])
    hi2 = np.array([[1e-4, 1e-4], [1.0, 1.0]])
    pts2, vol2 = fed.union_design(lo2, hi2, 500, 1)
    assert vol2 == pytest.approx(5e-8, rel=1e-9)
    assert np.mean(pts2[:, 0] < 0.5) == pytest.approx(0.2, abs=0.03)
    np.testing.assert_array_equal(pts2, fed.union_design(lo2, hi2, 500, 1)[0])
    # edges: no points asked for; boxes of zero volume only
    assert fed.union_design(lo2, hi2, 0, 1)[0].shape == (0, 2)
    pts3, vol3 = fed.union_design(np.zeros((2, 2)), np.array([[1.0, 0.0], [0.0, 1.0]]), 50, 0)
    assert vol3 == 0.0 and pts3.shape == (50, 2) and np.all(pts3.min(axis=1) == 0.0)
