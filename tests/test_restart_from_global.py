"""Restart of the full model from the global-only fit (``restart_from_global``).

The full model contains the global-only one, so a full fit whose ELBO does
not clearly exceed the global-only fit's has not found its optimum; it is
trained again from the global-only fit's lengthscales and the better run by
final objective is kept. Properties: on many inputs of which a few matter
(the case that motivated it) the kept fit predicts about as well as an exact
GP and far better than the first run; every extra run's traffic and
evaluations are counted; the constructor parameters are left as given; the
option is refused by name when malformed and skipped where it does not apply.
With multi-output targets the global-only fit comes first and every latent
of the full model starts from its smoothest latent's lengthscales (one full
run).
"""

import sys
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression
from _federations import restart_benchmark_case


def _fit(X, y, g, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FederatedHierarchicalGPRegressor(**dict(dict(random_state=0), **kw)).fit(X, y, g)


def _rmse(est, X, y, g):
    return float(np.sqrt(np.mean((est.predict(X, groups=g) - y) ** 2)))


def _traffic(est):
    return {k: sum(r[k] for r in est.communication_)
            for k in ("bytes_up", "bytes_down", "n_messages")}


@pytest.mark.slow
def test_many_inputs_few_relevant_match_the_exact_gp():
    X, y, g, Xt, yt, gt = restart_benchmark_case("dim20", 0)
    est = _fit(X, y, g)
    first = _fit(X, y, g, restart_from_global=False)
    exact = GaussianProcessRegressor(
        ConstantKernel() * RBF(np.ones(X.shape[1])) + WhiteKernel(), normalize_y=True,
        random_state=0).fit(X, y)
    rmse, rmse_first = _rmse(est, Xt, yt, gt), _rmse(first, Xt, yt, gt)
    rmse_exact = float(np.sqrt(np.mean((exact.predict(Xt) - yt) ** 2)))
    # the first run ends below the global-only model it contains
    assert first.elbo_history_[-1] < est.global_only_elbo_
    assert est.restarted_from_global_ is True
    assert est.elbo_history_[-1] > est.global_only_elbo_
    assert est.objective_history_[-1] > first.objective_history_[-1]
    # measured: 0.156 against 0.240 for the first run and 0.126 for the exact GP
    assert rmse < 0.75 * rmse_first
    assert rmse < 1.3 * rmse_exact
    # the constructor parameters are as given
    assert est.get_params()["lengthscale"] is None
    assert est.get_params()["restart_from_global"] == "auto"


def test_every_extra_run_is_counted():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    kw = dict(n_rounds=4)
    forced = _fit(X, y, g, restart_from_global=True, **kw)
    first = _fit(X, y, g, restart_from_global=False, **kw)
    ref = _fit(X, y, g, restart_from_global=False, components=("global",), **kw)
    ell = ref.server_.global_values()["lengthscale_g"] * ref.server_.x_scale
    second = _fit(X, y, g, restart_from_global=False, lengthscale=ell, **kw)
    assert forced.global_only_elbo_ == pytest.approx(ref.elbo_history_[-1])
    kept = second if forced.restarted_from_global_ else first
    assert forced.objective_history_[-1] == pytest.approx(kept.objective_history_[-1])
    # the second run is kept only if it is more than 1 nat better
    assert forced.restarted_from_global_ == (
        second.objective_history_[-1] > first.objective_history_[-1] + 1.0)
    total = {k: sum(_traffic(e)[k] for e in (first, ref, second)) for k in _traffic(first)}
    assert _traffic(forced) == total
    assert forced.n_evaluations_ == (first.n_evaluations_ + ref.n_evaluations_
                                     + second.n_evaluations_)
    # round 1's entry carries the extra runs; the other rounds are the kept run's
    assert forced.communication_[2:] == kept.communication_[2:]


def test_the_reference_fit_runs_at_most_ten_rounds():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=2)[:3]
    est = _fit(X, y, g, n_rounds=30)
    ref = _fit(X, y, g, n_rounds=10, components=("global",), restart_from_global=False)
    assert est.global_only_elbo_ == pytest.approx(ref.elbo_history_[-1])


def test_false_fits_nothing_more():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    est = _fit(X, y, g, restart_from_global=False, n_rounds=3)
    assert est.global_only_elbo_ is None and est.restarted_from_global_ is None


@pytest.mark.parametrize("kw", [
    dict(components=("global",)), dict(lengthscale=0.3),
    dict(variational_family="mean_field", optimizer="adam", n_rounds=3)])
def test_skipped_where_it_does_not_apply(kw):
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    est = _fit(X, y, g, **dict(dict(n_rounds=3), **kw))
    assert est.global_only_elbo_ is None and est.restarted_from_global_ is None


def _spy_global_first(monkeypatch):
    """Record the global-only fit of a multi-output fit, the full run's starting
    global lengthscales and the traffic booked for the global-only fit."""
    from skfedgp import federated as fed

    seen = {}
    orig_start = FederatedHierarchicalGPRegressor._global_start
    orig_init = fed.Server.structured_initialise
    orig_book = FederatedHierarchicalGPRegressor._book_extra_runs

    def start(self, *args):
        ref = orig_start(self, *args)
        if ref is not None:
            seen["ref"] = ref
        return ref

    def init(self, pop):
        out = orig_init(self, pop)
        theta, gpack = out[0], out[1]
        if len(self.config.components) == 3:  # the full run
            seen["start"] = gpack.unpack(theta)["lengthscale_g"]
        return out

    def book(self, others):
        before = _traffic(self)
        n_eval, n_failed = self.n_evaluations_, len(self.failed_clients_)
        orig_book(self, others)
        seen["booked"] = {k: _traffic(self)[k] - before[k] for k in before}
        seen["booked_evaluations"] = self.n_evaluations_ - n_eval
        seen["booked_failures"] = len(self.failed_clients_) - n_failed

    monkeypatch.setattr(FederatedHierarchicalGPRegressor, "_global_start", start)
    monkeypatch.setattr(fed.Server, "structured_initialise", init)
    monkeypatch.setattr(FederatedHierarchicalGPRegressor, "_book_extra_runs", book)
    return seen


def test_multioutput_targets_start_from_the_global_only_fit(monkeypatch):
    """Multi-output targets: the global-only model is fitted first and every
    global latent of the full model starts from its smoothest latent; its
    traffic and evaluations are counted; ``restart_from_global=False`` keeps
    the pilots' start."""
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=20, n_outputs=2,
                                           random_state=0)[:3]
    seen = _spy_global_first(monkeypatch)
    est = _fit(X, y, g, n_rounds=2)
    ref = seen["ref"]
    assert ref.components == ("global",) and ref.n_iter_ >= 1
    ell = np.asarray(ref.server_.global_values()["lengthscale_g"])
    assert np.ptp(ell, axis=0).max() > 1e-3  # the global-only latents differ
    # every latent starts from one global-only latent: the smoothest
    start = np.asarray(seen["start"])
    np.testing.assert_allclose(start, np.tile(start[0], (ell.shape[0], 1)), rtol=1e-12)
    k = int(np.argmin(np.abs(np.log(ell / start[0])).sum(axis=1)))
    np.testing.assert_allclose(start[0], ell[k], rtol=1e-5)
    assert np.log(ell[k]).sum() == np.log(ell).sum(axis=1).max()
    assert est.global_only_elbo_ == pytest.approx(float(ref.elbo_history_[-1]))
    assert est.restarted_from_global_ is True
    assert seen["booked"] == _traffic(ref)
    assert seen["booked_evaluations"] == ref.n_evaluations_ > 0
    assert seen["booked_failures"] == len(ref.failed_clients_)
    seen.clear()
    off = _fit(X, y, g, n_rounds=2, restart_from_global=False)
    assert "ref" not in seen and off.global_only_elbo_ is None
    assert off.restarted_from_global_ is None
    # the pilots' start: one value per input, the same for every latent
    assert np.ptp(seen["start"], axis=0).max() == 0.0


@pytest.mark.parametrize("params", [
    dict(n_rounds=0), dict(components=("global",)), dict(components=("deviation", "local")),
    dict(lengthscale=1.0), dict(checkpoint=lambda r, state: None),
    dict(fault_hook=lambda c, m, r: None), dict(restart_from_global=False)])
def test_multioutput_fits_without_a_global_only_fit_first(params, monkeypatch):
    """Where the option does not apply (as for 1-D targets) no global-only
    fit is made and the full model starts from the pilots."""
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=20, n_outputs=2,
                                           random_state=0)[:3]
    seen = _spy_global_first(monkeypatch)
    est = _fit(X, y, g, **{"n_rounds": 1, **params})
    assert "ref" not in seen and "booked" not in seen
    assert est.global_only_elbo_ is None and est.restarted_from_global_ is None


def test_a_multioutput_warm_start_continuation_fits_no_global_only_model(monkeypatch):
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=20, n_outputs=2,
                                           random_state=0)[:3]
    est = _fit(X, y, g, n_rounds=1, warm_start=True)
    assert est.restarted_from_global_ is True
    seen = _spy_global_first(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y, g)
    assert "ref" not in seen and est.global_only_elbo_ is None


def test_an_error_of_the_full_run_is_not_first_reported_as_a_failed_global_only_fit():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=20, n_outputs=2,
                                           random_state=0)[:3]
    y = y.copy()
    y[:, 1] = np.nan  # an output observed nowhere: both runs refuse it
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "global-only fit failed"
        with pytest.raises(ValueError, match="no observed"):
            FederatedHierarchicalGPRegressor(n_rounds=1).fit(X, y, g)


def test_setup_errors_come_before_the_global_only_fit():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=20, n_outputs=2,
                                           random_state=0)[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "global-only fit failed"
        with pytest.raises(ValueError, match="min_clients"):
            FederatedHierarchicalGPRegressor(min_clients=5, n_rounds=1).fit(X, y, g)


def _fail_global_only_fits(monkeypatch, exc):
    """Make every global-only fit (``components=("global",)``) raise ``exc``."""
    orig = FederatedHierarchicalGPRegressor._fit

    def fit(self, *args):
        if tuple(self.components) == ("global",):
            raise exc
        return orig(self, *args)

    monkeypatch.setattr(FederatedHierarchicalGPRegressor, "_fit", fit)


def test_a_failed_global_only_fit_leaves_the_pilots_start(monkeypatch):
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=20, n_outputs=2,
                                           random_state=0)[:3]
    _fail_global_only_fits(monkeypatch, RuntimeError("link down"))
    with pytest.warns(UserWarning, match="global-only fit failed.*pilots' lengthscales"):
        est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=2).fit(X, y, g)
    assert est.global_only_elbo_ is None and est.restarted_from_global_ is None
    ref = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=2,
                                           restart_from_global=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.fit(X, y, g)
    np.testing.assert_allclose(est.predict(X, groups=g), ref.predict(X, groups=g))


@pytest.mark.parametrize("bad", ["always", 1, None, 0.5])
def test_bad_values_are_refused_by_name(bad):
    X, y, g = make_hierarchical_regression(n_clients=2, n_samples=10, random_state=0)[:3]
    with pytest.raises(ValueError, match="restart_from_global"):
        FederatedHierarchicalGPRegressor(restart_from_global=bad).fit(X, y, g)


def test_only_the_kept_runs_warnings_are_shown():
    # n_rounds=1 stops every run early: each run warns once that it did not
    # converge, but only the kept run's warning reaches the caller
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1,
                                         restart_from_global=True).fit(X, y, g)
    with warnings.catch_warnings(record=True) as alone:
        warnings.simplefilter("always")
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1,
                                         restart_from_global=False).fit(X, y, g)
    n_conv = sum(issubclass(w.category, ConvergenceWarning)
                 and "n_rounds" in str(w.message) for w in caught)
    assert n_conv == sum(issubclass(w.category, ConvergenceWarning)
                         and "n_rounds" in str(w.message) for w in alone) == 1


def test_a_failed_global_only_fit_keeps_the_first_run(monkeypatch):
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    first = _fit(X, y, g, n_rounds=3, restart_from_global=False)
    _fail_global_only_fits(monkeypatch, FloatingPointError("injected"))
    with pytest.warns(UserWarning, match="restart_from_global: the global-only fit failed"):
        est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=3).fit(X, y, g)
    assert est.global_only_elbo_ is None and est.restarted_from_global_ is None
    np.testing.assert_array_equal(est.predict(X, groups=g), first.predict(X, groups=g))
    assert est.communication_ == first.communication_


def test_verbose_says_what_the_restart_did(capsys):
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    _fit(X, y, g, n_rounds=2, restart_from_global=True, verbose=1)
    out = capsys.readouterr().out
    assert out.count("[skfedgp] global-only fit") == 1
    assert "training the full model again" in out and "kept the " in out


def test_warning_filters_by_module_still_apply():
    # the deferred diagnostics (issued once the runs are compared) point at
    # the caller's line like every warning of the package, so a module
    # filter names the caller's module
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=ConvergenceWarning, module=__name__)
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1,
                                         restart_from_global=True).fit(X, y, g)
    assert not any(issubclass(w.category, ConvergenceWarning) for w in caught)


def test_failures_of_every_run_are_recorded(monkeypatch):
    import skfedgp.federated as fed

    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    orig = fed.StructuredClient.local_phase
    injected = []

    def once(self, *args, **kwargs):
        # client 0 of every run fails its first local phase
        if self.client_id == 0 and not getattr(self, "_failed_once", False):
            self._failed_once = True
            injected.append(True)
            raise RuntimeError("transient")
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(fed.StructuredClient, "local_phase", once)
    est = _fit(X, y, g, n_rounds=3, restart_from_global=True)
    assert len(injected) == 3  # the first run, the global-only fit, the second run
    assert sum(f[1] == 0 and f[2] == "local_phase" for f in est.failed_clients_) == 3


def test_the_setting_is_checked_with_the_others():
    with pytest.raises(ValueError, match="restart_from_global"):
        FederatedHierarchicalGPRegressor(restart_from_global="bogus")._check_params()


def test_the_extra_runs_do_not_repeat_the_inducing_cap_warning():
    X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=3, n_inducing=500,
                                         restart_from_global=True).fit(X, y, g)
    assert sum("n_inducing=500 exceeds" in str(w.message) for w in caught) == 1


def test_extra_runs_do_not_repeat_the_flat_client_warning():
    """With ``client_scale=False`` a client far flatter than the others is
    named at set-up; the restart's extra runs (global-only fit, second run)
    set up the same clients and used to name it twice more under the
    "always" filter. Once now."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (100, 1))
    g = np.repeat(["A", "B", "C", "D", "E"], 20)
    y = np.sin(6 * X[:, 0]) + 0.05 * rng.standard_normal(100)
    y[g == "E"] *= 1e-4
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=2, client_scale=False,
                                               restart_from_global=True).fit(X, y, groups=g)
    flat = [x for x in w if "vary far less than the others" in str(x.message)]
    assert len(flat) == 1, [str(x.message)[:80] for x in flat]
    # both extra runs ran and completed
    assert est.global_only_elbo_ is not None and est.restarted_from_global_ is not None
    assert not any("restart_from_global:" in str(x.message) for x in w)


def test_smoothest_latent_start():
    """Every latent starts from the latent with the largest geometric mean
    lengthscale among those with loadings (not the per-input maximum, which
    would mix latents); a switched-off input counts as START_MAX_SPANS and
    the start is capped there; ties go to the first latent."""
    from skfedgp.federated import START_MAX_SPANS
    from skfedgp.regressor import smoothest_latent_start

    ell = np.array([[0.17, 0.02], [0.01, 0.5], [0.05, 0.05]])
    np.testing.assert_array_equal(smoothest_latent_start(ell), np.tile([0.01, 0.5], (3, 1)))
    np.testing.assert_array_equal(smoothest_latent_start([[0.18], [0.0099]]), [[0.18], [0.18]])
    np.testing.assert_array_equal(smoothest_latent_start([[0.3], [0.3]]), [[0.3], [0.3]])
    # a latent without loadings is not chosen, however smooth
    B = np.array([[1.0, 0.0, 1e-3], [0.5, 0.0, 0.0]])
    np.testing.assert_array_equal(smoothest_latent_start(ell, B), np.tile([0.17, 0.02], (3, 1)))
    np.testing.assert_array_equal(smoothest_latent_start(ell, np.zeros((2, 3))),
                                  np.tile([0.01, 0.5], (3, 1)))
    # an input switched off (1e3 spans) neither wins alone nor stays switched off
    off = np.array([[0.3, 1e3], [2.0, 2.0]])
    np.testing.assert_array_equal(smoothest_latent_start(off), [[2.0, 2.0], [2.0, 2.0]])
    np.testing.assert_array_equal(smoothest_latent_start([[1e3, 1e3], [0.1, 0.1]]),
                                  [[START_MAX_SPANS, START_MAX_SPANS]] * 2)
    for bad in ([1.0, 2.0], [[1.0], [0.0]], [[np.nan]], np.zeros((0, 2))):
        with pytest.raises(ValueError, match="positive finite"):
            smoothest_latent_start(bad)
    with pytest.raises(ValueError, match="loadings"):
        smoothest_latent_start(ell, np.ones((2, 2)))


def test_shortest_live_latent():
    """Per input, the shortest lengthscale among the latents with loadings
    (a latent without loadings is left out, however short), capped at
    START_MAX_SPANS; the same checks of its arguments as the start."""
    from skfedgp.federated import START_MAX_SPANS
    from skfedgp.regressor import shortest_live_latent

    ell = np.array([[0.17, 0.02], [0.01, 0.5], [0.05, 0.05]])
    np.testing.assert_array_equal(shortest_live_latent(ell), [0.01, 0.02])
    B = np.array([[1.0, 0.0, 1e-3], [0.5, 0.0, 0.0]])  # only latent 0 live
    np.testing.assert_array_equal(shortest_live_latent(ell, B), [0.17, 0.02])
    B = np.array([[1.0, 0.0, 1.0], [0.5, 0.0, 0.0]])  # latents 0 and 2 live
    np.testing.assert_array_equal(shortest_live_latent(ell, B), [0.05, 0.02])
    np.testing.assert_array_equal(shortest_live_latent([[1e3, 2.0], [1e4, 1e3]]),
                                  [START_MAX_SPANS, 2.0])
    for bad in ([1.0, 2.0], [[1.0], [0.0]], [[np.nan]]):
        with pytest.raises(ValueError, match="positive finite"):
            shortest_live_latent(bad)
    with pytest.raises(ValueError, match="loadings"):
        shortest_live_latent(ell, np.ones((2, 2)))


@pytest.mark.slow
def test_multioutput_design_is_sized_for_the_shared_latents(monkeypatch):
    """With multi-output targets the global-only fit also sizes the global
    inducing design: ``n_inducing="auto"`` from the larger of the pilots'
    lengthscales and that fit's shortest live latent. Data whose shared part
    is smooth and whose clients' own parts vary fast get fewer global
    inducing points than from the pilots (restart_from_global=False), sized
    for exactly the lengthscales the rule gives; the record is not kept on
    the server."""
    from skfedgp import federated as fed
    from skfedgp.regressor import shortest_live_latent

    # the paper's scenario A (smooth shared latents, short client latents)
    X, y, g = make_hierarchical_regression(n_clients=6, n_samples=50, n_outputs=4,
                                           scenario="A", random_state=1)[:3]
    seen = {}
    orig_auto = fed.auto_inducing

    def auto(lengthscale, *args, **kw):
        if sys._getframe(1).f_code.co_name == "structured_initialise":  # the global design
            seen.setdefault("sized", []).append(np.array(lengthscale, dtype=float))
        return orig_auto(lengthscale, *args, **kw)

    monkeypatch.setattr(fed, "auto_inducing", auto)
    spy = _spy_global_first(monkeypatch)
    est = _fit(X, y, g, n_rounds=4)  # (the global-only fit gets as many)
    values = spy["ref"].server_.global_values()
    rule = shortest_live_latent(values["lengthscale_g"], values["B_g"])
    sized_full = seen["sized"][-1]  # the full run's design (the global-only run's first)
    assert np.all(sized_full >= rule - 1e-12)
    seen.clear()
    off = _fit(X, y, g, n_rounds=1, restart_from_global=False)
    pilots = seen["sized"][-1]
    # the same pilots (same data and seed): the full run used the larger of the two
    np.testing.assert_allclose(sized_full, np.maximum(pilots, rule), rtol=1e-12)
    assert np.all(rule > pilots)  # these data: the shared part is the smoother
    assert est.n_inducing_ < off.n_inducing_
    assert not hasattr(est.server_, "global_sizing")
    assert not hasattr(est.server_, "global_start")


@pytest.mark.parametrize("params", [dict(components=("global", "deviation")),
                                    dict(n_inducing=30)])
def test_multioutput_design_keeps_the_pilots_scale_without_local_part_or_auto(
        params, monkeypatch):
    """Without a local part (the deviation must then carry the clients' own
    variation on the global inducing points) or with a given number of
    points, the global design is placed for the pilots' lengthscales, as
    without the global-only fit, although that fit's shortest live latent
    is longer on these data."""
    from skfedgp import federated as fed
    from skfedgp.regressor import shortest_live_latent

    X, y, g = make_hierarchical_regression(n_clients=6, n_samples=50, n_outputs=4,
                                           scenario="A", random_state=1)[:3]
    placed = []
    orig = fed.Server._union_candidates

    def union(self, ell, at_least=0):
        if sys._getframe(1).f_code.co_name == "structured_initialise" and not at_least:
            placed.append(np.array(ell, dtype=float))
        return orig(self, ell, at_least)

    monkeypatch.setattr(fed.Server, "_union_candidates", union)
    spy = _spy_global_first(monkeypatch)
    _fit(X, y, g, n_rounds=4, **params)
    values = spy["ref"].server_.global_values()
    rule = shortest_live_latent(values["lengthscale_g"], values["B_g"])
    with_global_only = placed[-1]
    placed.clear()
    _fit(X, y, g, n_rounds=1, restart_from_global=False, **params)
    np.testing.assert_array_equal(with_global_only, placed[-1])
    assert np.all(rule > placed[-1])  # the rule would have changed the design
