"""Several starts of the global lengthscales (``lengthscale_starts``).

A whole run is trained from each start; the run with the largest final
objective is kept. Properties: the kept run is exactly the run of that start alone;
every start's traffic is counted; a given lengthscale, a warm start and a
single factor run one start; bad values are refused by name.
"""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression


def _data(seed=0):
    X, y, g = make_hierarchical_regression(n_clients=4, n_samples=30, random_state=seed)
    return X, y, g


def _fit(X, y, g, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # one training per start (restart_from_global has its own tests)
        kw = dict(dict(random_state=0, n_rounds=3, restart_from_global=False), **kw)
        return FederatedHierarchicalGPRegressor(**kw).fit(X, y, g)


@pytest.fixture(scope="module")
def fits():
    X, y, g = _data()
    return {starts: _fit(X, y, g, lengthscale_starts=starts)
            for starts in [(1.0,), (3.0,), (1.0, 3.0)]}


def test_the_start_with_the_larger_final_objective_is_kept(fits):
    one, three, both = fits[(1.0,)], fits[(3.0,)], fits[(1.0, 3.0)]
    final = {1.0: one.objective_history_[-1], 3.0: three.objective_history_[-1]}
    kept = max(final, key=final.get)
    assert both.lengthscale_start_ == kept
    assert both.objective_history_[-1] == pytest.approx(max(final.values()), rel=1e-10)
    ref = one if kept == 1.0 else three
    # the kept run is exactly the run from that start alone
    assert_allclose(both.server_.theta_global, ref.server_.theta_global, rtol=1e-10, atol=1e-12)
    for k in ref.clients_:
        assert_allclose(both.clients_[k].theta, ref.clients_[k].theta, rtol=1e-10, atol=1e-12)
    assert_allclose(both.elbo_history_, ref.elbo_history_, rtol=1e-10)
    assert both.n_iter_ == ref.n_iter_
    assert one.lengthscale_start_ == 1.0 and three.lengthscale_start_ == 3.0


def test_every_start_is_counted(fits):
    one, three, both = fits[(1.0,)], fits[(3.0,)], fits[(1.0, 3.0)]
    ref = one if both.lengthscale_start_ == 1.0 else three
    other = three if ref is one else one
    assert both.communication_[0] == one.communication_[0]  # the set-up
    assert [r["round"] for r in both.communication_] == [r["round"] for r in ref.communication_]
    for key in ("bytes_up", "bytes_down", "n_messages"):
        # the other run's rounds in round 1's record (each single run books the
        # set-up's evaluation in its round 1; the second start's run books the
        # evaluation at its own start instead); exact totals against the
        # messages themselves: test_structured.py::
        # test_communication_accounts_for_every_upload
        total = sum(r[key] for r in both.communication_)
        assert total == pytest.approx(sum(r[key] for r in ref.communication_)
                                      + sum(r[key] for r in other.communication_[1:-1]),
                                      rel=0.05)
        assert total > sum(r[key] for r in ref.communication_)
        assert all(b[key] == r[key] for b, r in zip(both.communication_[2:],
                                                     ref.communication_[2:]))
    # the other start's evaluations are added to the kept run's
    assert both.n_evaluations_ > ref.n_evaluations_
    assert both.n_evaluations_ <= ref.n_evaluations_ + other.n_evaluations_


def test_the_kept_start_can_be_the_first(fits):
    X, y, g = _data()
    # with the factors reversed the same start wins and the model is the same
    rev = _fit(X, y, g, lengthscale_starts=(3.0, 1.0))
    both = fits[(1.0, 3.0)]
    assert rev.lengthscale_start_ == both.lengthscale_start_
    assert_allclose(rev.server_.theta_global, both.server_.theta_global, rtol=1e-10,
                    atol=1e-12)


def test_default_is_one_start_and_multi_is_one_and_three():
    X, y, g = _data(1)
    assert FederatedHierarchicalGPRegressor().lengthscale_starts == (1.0,)
    a = _fit(X, y, g, n_rounds=2, lengthscale_starts="multi")
    b = _fit(X, y, g, n_rounds=2, lengthscale_starts=(1, 3))
    assert_array_equal(a.server_.theta_global, b.server_.theta_global)
    assert a.lengthscale_start_ in (1.0, 3.0)
    c = _fit(X, y, g, n_rounds=2)
    assert c.lengthscale_start_ == 1.0
    assert c.communication_ == _fit(X, y, g, n_rounds=2, lengthscale_starts=[1]).communication_


def test_a_given_lengthscale_runs_one_start():
    X, y, g = _data()
    a = _fit(X, y, g, lengthscale=2.0, lengthscale_starts=(1.0, 3.0))
    b = _fit(X, y, g, lengthscale=2.0, lengthscale_starts=(1.0,))
    assert_array_equal(a.server_.theta_global, b.server_.theta_global)
    assert a.communication_ == b.communication_
    assert a.lengthscale_start_ == 1.0


def test_a_warm_start_runs_no_new_starts(fits):
    X, y, g = _data()
    a = _fit(X, y, g, lengthscale_starts=(1.0, 3.0))
    b = _fit(X, y, g, lengthscale_starts=(1.0, 3.0))
    a.set_params(warm_start=True, n_rounds=1)
    b.set_params(warm_start=True, n_rounds=1, lengthscale_starts=(1.0, 5.0, 7.0))
    a, b = _fit_warm(a, X, y, g), _fit_warm(b, X, y, g)
    assert_array_equal(a.server_.theta_global, b.server_.theta_global)
    assert a.communication_ == b.communication_
    assert a.n_iter_ == 4


def _fit_warm(est, X, y, g):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y, g)


def test_verbose_names_the_starts(capsys):
    X, y, g = _data()
    _fit(X, y, g, n_rounds=1, verbose=1, lengthscale_starts="multi")
    out = capsys.readouterr().out
    assert "start 1/2: global lengthscales x 1" in out
    assert "start 2/2: global lengthscales x 3" in out
    assert "kept start" in out


@pytest.mark.parametrize("bad", [(), (0.0,), (1.0, -2.0), (np.inf,), "auto", 3.0, (True,)])
def test_bad_factors_are_refused_by_name(bad):
    X, y, g = _data()
    with pytest.raises(ValueError, match="lengthscale_starts"):
        FederatedHierarchicalGPRegressor(lengthscale_starts=bad).fit(X, y, g)


def test_multioutput_targets_use_the_starts_too():
    X, Y, g = make_hierarchical_regression(n_clients=3, n_samples=25, n_outputs=2,
                                           scenario="A", random_state=0)
    a = _fit(X, Y, g, n_rounds=2, lengthscale_starts="multi")
    b = _fit(X, Y, g, n_rounds=2, lengthscale_starts=(a.lengthscale_start_,))
    assert_allclose(a.server_.theta_global, b.server_.theta_global, rtol=1e-10, atol=1e-12)
    assert_allclose(a.elbo_history_, b.elbo_history_, rtol=1e-10)


def test_the_last_checkpoint_is_the_kept_run(tmp_path):
    from skfedgp.federated import TrainingState

    X, y, g = _data()
    path = tmp_path / "state.joblib"
    est = _fit(X, y, g, lengthscale_starts=(1.0, 3.0), checkpoint=str(path))
    st = TrainingState.load(path)
    assert_array_equal(st.theta_global, est.server_.theta_global)
    assert st.server["lengthscale_start_"] == est.lengthscale_start_
    assert_allclose(st.objectives[:-1], est.objective_history_[:-1], rtol=1e-12)


def test_changing_only_the_starts_does_not_change_a_resume(tmp_path):
    X, y, g = _data()
    path = tmp_path / "state.joblib"
    _fit(X, y, g, n_rounds=2, client_fraction=0.6, checkpoint=str(path))
    a = _fit(X, y, g, n_rounds=1, client_fraction=0.6, resume_from=str(path))
    b = _fit(X, y, g, n_rounds=1, client_fraction=0.6, resume_from=str(path),
             lengthscale_starts=(1.0, 3.0))
    assert_array_equal(a.server_.theta_global, b.server_.theta_global)
    assert_array_equal(a.objective_history_, b.objective_history_)
