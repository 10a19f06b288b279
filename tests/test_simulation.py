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
    compensation is exact and the PD loop alone tracks the reference."""
    df = simulate_tracking(dynamics=lambda x: 0.0, duration=5.0, aggregations=("moe",),
                           noise_std=0.0, random_state=0)
    assert df["prediction_error"].iloc[0] < 1e-6
    assert df["tracking_error"].iloc[0] < 0.2


def test_reference_dynamics_value():
    x = np.array([0.3, -1.2])
    want = (1 + 0.3 * -1.2 / 10 + np.cos(-1.2) / 2 - 10 * np.sin(1.5)
            + 1 / (2 * (1 + np.exp(0.12))))
    assert reference_dynamics(x) == pytest.approx(want)
