"""Tests of :mod:`skfedgp.simulation` (seeded asynchronous network)."""

import numpy as np
import pytest

from skfedgp.async_dgp import AGGREGATIONS
from skfedgp.simulation import reference_dynamics, simulate_stream, simulate_tracking


def _stream(rng, n=150):
    # a slowly moving trajectory: consecutive inputs are close
    t = np.linspace(0, 6, n)
    X = np.c_[np.sin(t), np.cos(0.5 * t)]
    y = np.sin(3 * X[:, 0]) + X[:, 1] + 0.05 * rng.standard_normal(n)
    return X, y


def test_stream_columns_seed_and_smse(rng):
    X, y = _stream(rng)
    kw = dict(lengthscale=0.5, variance=1.0, noise_variance=0.01, random_state=3)
    df = simulate_stream(X, y, **kw)
    assert list(df.columns) == ["iteration", "aggregation", "prediction", "target", "smse"]
    assert len(df) == len(y) * len(AGGREGATIONS)
    pd_again = simulate_stream(X, y, **kw)
    np.testing.assert_array_equal(df["prediction"].to_numpy(), pd_again["prediction"].to_numpy())
    for rule, g in df.groupby("aggregation"):
        err = (g["prediction"].to_numpy() - y) ** 2
        np.testing.assert_allclose(g["smse"].to_numpy(),
                                   np.cumsum(err) / np.arange(1, len(y) + 1) / y.var())
        np.testing.assert_array_equal(g["target"].to_numpy(), y)
    # iteration 0: nothing delivered yet, every rule outputs the prior mean 0
    assert np.all(df[df.iteration == 0]["prediction"].to_numpy() == 0.0)
    # the learning helps: final SMSE of every rule well below 1 on a smooth trajectory
    final = df[df.iteration == len(y) - 1].set_index("aggregation")["smse"]
    assert final.max() < 0.5


def test_baselines_use_latest_deliveries(rng):
    """With one expert, MoE equals PoE equals the latest delivered mean."""
    X, y = _stream(rng, n=60)
    df = simulate_stream(X, y, n_experts=1, aggregations=("moe", "poe", "bcm"),
                         lengthscale=0.5, noise_variance=0.01, random_state=0)
    p = df.pivot(index="iteration", columns="aggregation", values="prediction")
    np.testing.assert_allclose(p["moe"], p["poe"], atol=1e-12)
    np.testing.assert_allclose(p["moe"], p["bcm"], atol=1e-12)
    # predictions are stale: they stay constant between deliveries
    assert (np.diff(p["moe"].to_numpy()) == 0).sum() > 0


def test_same_deliveries_for_subsets_of_rules(rng):
    X, y = _stream(rng, n=80)
    kw = dict(lengthscale=0.5, noise_variance=0.01, random_state=1)
    a = simulate_stream(X, y, aggregations=("gpoe",), **kw)
    b = simulate_stream(X, y, **kw)
    np.testing.assert_array_equal(a["prediction"].to_numpy(),
                                  b[b.aggregation == "gpoe"]["prediction"].to_numpy())


def test_stream_bad_input(rng):
    X, y = _stream(rng, n=20)
    with pytest.raises(ValueError, match="max_info"):
        simulate_stream(X, y, max_info=0)
    with pytest.raises(ValueError, match="unknown aggregation"):
        simulate_stream(X, y, aggregations=("mean",))
    X2 = X.copy()
    X2[3, 1] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        simulate_stream(X2, y)
    with pytest.raises(ValueError, match="rows"):
        simulate_stream(X, y[:-1])
    for bad in (0.0, -1.0, np.nan):  # zero noise: an exact GP on noisy data (SMSE 44-11 433)
        with pytest.raises(ValueError, match="noise_variance must be positive"):
            simulate_stream(X, y, noise_variance=bad)
    # one rule given as a string is that rule, not its letters
    one = simulate_stream(X, y, aggregations="rbcm", random_state=0)
    assert set(one["aggregation"]) == {"rbcm"}


def test_tracking_bad_steps():
    for kw in (dict(duration=0.0), dict(dt=0.0), dict(dt=-0.1), dict(duration=0.01, dt=0.02)):
        with pytest.raises(ValueError, match="dt|duration"):
            simulate_tracking(n_runs=1, aggregations="moe", **kw)


def test_tracking_runs_and_is_seeded():
    kw = dict(duration=2.0, n_runs=2, random_state=0, aggregations=("async", "moe"))
    a = simulate_tracking(**kw)
    b = simulate_tracking(**kw)
    assert list(a.columns) == ["run", "aggregation", "tracking_error", "prediction_error"]
    assert len(a) == 4
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    assert np.all(np.isfinite(a[["tracking_error", "prediction_error"]].to_numpy(dtype=float)))


def test_tracking_with_exact_compensation_tracks():
    """With f = 0 and noise-free observations the experts learn zero, the
    compensation is exact and the error obeys e' = A e (eq. 23): zero from
    a start on the reference, expm(A t) e0 otherwise."""
    from scipy.linalg import expm

    kw = dict(dynamics=lambda x: 0.0, duration=5.0, aggregations=("moe",), noise_std=0.0,
              random_state=0)
    a, w = 0.5, 5.0  # default reference
    df = simulate_tracking(initial_state=(0.0, a * w), **kw)
    assert df["prediction_error"].iloc[0] < 1e-6
    assert df["tracking_error"].iloc[0] < 1e-4  # RK4 error only
    e0 = np.array([0.3, -0.4]) - np.array([0.0, a * w])
    df = simulate_tracking(initial_state=(0.3, -0.4), **kw)
    A = np.array([[0.0, 1.0], [-2.0, -10.0]])
    ts = np.arange(250) * 0.02
    want = np.sqrt(np.mean([np.sum((expm(A * t) @ e0) ** 2) for t in ts]))
    assert df["tracking_error"].iloc[0] == pytest.approx(want, rel=1e-4)


def test_reference_dynamics_value():
    x = np.array([0.3, -1.2])
    want = (1 + 0.3 * -1.2 / 10 + np.cos(-1.2) / 2 - 10 * np.sin(1.5)
            + 1 / (2 * (1 + np.exp(0.12))))
    assert reference_dynamics(x) == pytest.approx(want)


def _jobs(out):
    df, jobs = out
    assert len(df) > 0
    return jobs


def test_fast_jobs_are_delivered_in_the_same_iteration(rng):
    """A job shorter than the decision time is used at its own iteration; the
    baselines then combine predictions made at x_t itself."""
    X, y = _stream(rng, n=40)
    kw = dict(lengthscale=0.5, noise_variance=0.01, base_delay=0.1, delay_per_point=0.0,
              delay_spread=0.0, random_state=0)
    df, jobs = simulate_stream(X, y, n_experts=1, aggregations=("moe",), decision_time=0.5,
                               return_jobs=True, **kw)
    # speed factors are in [0.5, 2], so every job lasts at most 0.2 < 0.5 iteration
    assert len(jobs) == len(y)
    np.testing.assert_array_equal(jobs["input"], np.arange(len(y)))
    np.testing.assert_array_equal(jobs["delivered"], jobs["input"])
    # with one expert, MoE = that expert's prediction at x_t from the points before t
    from skfedgp.async_dgp import _Expert

    e = _Expert(2, np.full(2, 0.5), 1.0, 0.01, 1000)
    want = []
    for t in range(len(y)):
        if t:
            e.add(X[t - 1], y[t - 1])
        want.append(e.predict(X[t][None, :], 0.0)[0][0])
    np.testing.assert_allclose(df["prediction"].to_numpy(), want, rtol=1e-10, atol=1e-12)
    # GPgym's loop (decision_time 0): never on time, the same job is used one step later
    df0, j0 = simulate_stream(X, y, n_experts=1, aggregations=("moe",), return_jobs=True, **kw)
    np.testing.assert_array_equal(j0["delivered"][j0.delivered >= 0],
                                  j0["input"][j0.delivered >= 0] + 1)
    np.testing.assert_allclose(df0["prediction"].to_numpy()[1:], want[:-1], rtol=1e-10,
                               atol=1e-12)
    assert df0["prediction"].iloc[0] == 0.0


def test_job_schedule_follows_the_protocol(rng):
    """Inputs increase, a job starts when the expert is idle and a newer input
    exists, and its length is (base + per_point n) speed with n its data size."""
    X, y = _stream(rng, n=120)
    base, per = 0.7, 0.05
    _, jobs = simulate_stream(X, y, aggregations=("moe",), lengthscale=0.5, noise_variance=0.01,
                              base_delay=base, delay_per_point=per, delay_spread=0.0,
                              max_points_per_expert=None, return_jobs=True, random_state=5)
    assert set(jobs.expert) == {0, 1, 2, 3}
    for _, g in jobs.groupby("expert"):
        s, st, en = g["input"].to_numpy(), g["start"].to_numpy(), g["end"].to_numpy()
        assert np.all(np.diff(s) >= 1)
        np.testing.assert_allclose(st[1:], np.maximum(en[:-1], s[:-1] + 1.0))
        np.testing.assert_array_equal(s, np.floor(st).astype(int))
        n = np.cumsum(s >= 1)  # one streamed point per job (none before the first input)
        speed = (en - st) / (base + per * n)
        np.testing.assert_allclose(speed, speed[0], rtol=1e-12)
        assert 0.5 <= speed[0] <= 2.0
        d = g["delivered"].to_numpy()
        done = d >= 0
        # delivered at the first iteration whose decision time (here t) follows the end
        np.testing.assert_array_equal(d[done], np.ceil(en[done]).astype(int))


def test_all_rules_and_conventions_see_identical_deliveries(rng):
    X, y = _stream(rng, n=80)
    kw = dict(lengthscale=0.5, noise_variance=0.01, random_state=11, return_jobs=True)
    a = _jobs(simulate_stream(X, y, aggregations=("async",), convention="gpgym", max_info=3,
                              **kw))
    b = _jobs(simulate_stream(X, y, **kw))
    c = _jobs(simulate_stream(X, y, **kw))
    pd_testing = pytest.importorskip("pandas.testing")
    pd_testing.assert_frame_equal(a, b)
    pd_testing.assert_frame_equal(b, c)
    d = _jobs(simulate_stream(X, y, lengthscale=0.5, noise_variance=0.01, random_state=12,
                              return_jobs=True))
    assert not np.array_equal(d["end"].to_numpy(), b["end"].to_numpy())


def test_bad_decision_time(rng):
    X, y = _stream(rng, n=10)
    for bad in (-0.1, 1.0, np.nan):
        with pytest.raises(ValueError, match="decision_time"):
            simulate_stream(X, y, decision_time=bad)
        with pytest.raises(ValueError, match="decision_time"):
            simulate_tracking(decision_time=bad, duration=0.1)


@pytest.mark.parametrize("kw, name", [
    (dict(max_points_per_expert=0), "max_points_per_expert"),
    (dict(max_points_per_expert=2.5), "max_points_per_expert"),
    (dict(base_delay=np.nan), "base_delay"),
    (dict(base_delay=-1.0), "base_delay"),
    (dict(delay_per_point=np.inf), "delay_per_point"),
    (dict(delay_spread=-1.0), "delay_spread"),
    (dict(beta=np.nan), "beta"),
    (dict(beta=-1.0), "beta"),
    (dict(lipschitz=-1.0), "lipschitz"),
    (dict(rkhs_bound=-1.0), "rkhs_bound"),
    (dict(prior_mean=np.nan), "prior_mean"),
    (dict(decision_time="x"), "decision_time"),
])
def test_stream_bad_network_parameters_named(kw, name):
    """Such values crashed the interpreter (a window of 0) or silently gave
    prior-only or NaN predictions (NaN delays, beta, prior mean)."""
    X = np.random.default_rng(0).uniform(0, 5, (25, 1))
    with pytest.raises(ValueError, match=name):
        simulate_stream(X, np.sin(X[:, 0]), random_state=0, **kw)


@pytest.mark.parametrize("kw, name", [
    (dict(n_runs=0), "n_runs"), (dict(gains=(1.0,)), "gains"),
    (dict(amplitude=np.nan), "amplitude"), (dict(initial_state=[np.nan, 0.0]), "initial_state"),
    (dict(max_points_per_expert=0), "max_points_per_expert"),
])
def test_tracking_bad_parameters_named(kw, name):
    with pytest.raises(ValueError, match=name):
        simulate_tracking(duration=0.1, random_state=0, **kw)


def test_stream_two_column_y_named():
    X = np.random.default_rng(0).uniform(0, 5, (25, 1))
    with pytest.raises(ValueError, match="y must be 1-D"):
        simulate_stream(X, np.c_[X[:, 0], X[:, 0]], random_state=0)


def test_tracking_initial_state_of_the_wrong_shape_is_named_up_front():
    """A 3-entry initial_state passed the checks and failed when the first run
    started, with NumPy's "cannot reshape array of size 3 into shape (2,)"."""
    with pytest.raises(ValueError, match=r"initial_state must be of shape \(2,\) \(x1, x2\), "
                                         r"got shape \(3,\)"):
        simulate_tracking(duration=0.1, random_state=0, initial_state=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"initial_state must be of shape \(2,\)"):
        simulate_tracking(duration=0.1, random_state=0, initial_state=0.5)
    df = simulate_tracking(duration=0.1, random_state=0, initial_state=[0.1, 0.2],
                           aggregations="moe")
    assert np.isfinite(df["tracking_error"]).all()


def test_stream_bool_prior_mean_is_refused_up_front_for_the_baseline_rules(rng):
    """prior_mean=True passed simulate_stream's own check, then aggregate()
    refused it at the first iteration; now the up-front check names the rules
    that refuse it. The "async" rule alone reads it as a number, as before."""
    X, y = _stream(rng, n=10)
    with pytest.raises(ValueError, match=r"prior_mean must be a finite number, not a bool "
                                         r"\(True\): the baseline rules \['moe', 'bcm'\]"):
        simulate_stream(X, y, prior_mean=True, aggregations=("async", "moe", "bcm"),
                        random_state=0)
    a = simulate_stream(X, y, prior_mean=True, aggregations="async", random_state=0)
    b = simulate_stream(X, y, prior_mean=1.0, aggregations="async", random_state=0)
    np.testing.assert_array_equal(a["prediction"].to_numpy(), b["prediction"].to_numpy())


def test_stream_lengthscale_of_the_wrong_length_is_named_up_front(rng):
    """A lengthscale array not of length d used to fail only when the kernel
    first ran with data (after the incremental Cholesky had read past it), and
    not at all on a stream too short for an expert to receive a point."""
    X, y = _stream(rng, n=10)
    for n in (1, 10):
        with pytest.raises(ValueError, match=r"lengthscale must be a scalar or have shape "
                                             r"\(2,\)"):
            simulate_stream(X[:n], y[:n], lengthscale=[1.0, 1.0, 1.0], random_state=0)
    with pytest.raises(ValueError, match=r"lengthscale must be a scalar or have shape \(2,\)"):
        simulate_tracking(duration=0.1, random_state=0, lengthscale=[0.3])
