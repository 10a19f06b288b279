"""ClientFittedAsNoiseWarning: a client whose fitted noise variance is far
above that of an exact GP on its own rows (issue: diagnostics; a client
fitted as noise without a word)."""

import warnings

import numpy as np
import pytest

from skfedgp import ClientFittedAsNoiseWarning, FederatedHierarchicalGPRegressor
from skfedgp import regressor


def _three_clients(n_b=40, seed=0):
    """A and C: sin(6x); B: cos(6x), a function the global part alone cannot give it."""
    rng = np.random.default_rng(seed)
    n = 80 + n_b
    x = rng.uniform(size=(n, 1))
    g = np.array(["A"] * 40 + ["B"] * n_b + ["C"] * 40)
    f = np.where(g == "B", np.cos(6 * x[:, 0]), np.sin(6 * x[:, 0]))
    return x, f + 0.05 * rng.normal(size=n), g


def _fit(X, y, g, **params):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        est = FederatedHierarchicalGPRegressor(random_state=0, **params).fit(X, y, g)
    return est, [w for w in rec if issubclass(w.category, ClientFittedAsNoiseWarning)]


def test_a_client_the_model_cannot_follow_is_reported_by_name():
    X, y, g = _three_clients()
    est, rec = _fit(X, y, g, components=("global",))
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "client 'B'" in msg and "'A'" not in msg and "'C'" not in msg
    b = est.clients_["B"]
    assert b.local_values()["noise_variance"] > regressor.NOISE_ABOVE_OWN_RATIO * b.pilot_noise


def test_no_warning_when_the_client_parts_fit_it():
    X, y, g = _three_clients()
    est, rec = _fit(X, y, g)
    assert rec == []
    for c in est.clients_.values():  # each within a few times its own exact GP's noise
        assert c.local_values()["noise_variance"] < 3 * c.pilot_noise


def test_a_small_clients_pilot_noise_is_not_used():
    """12 rows in 1-D are below 10 (d + 2): the pilot's noise is not reliable
    (it often interpolates), so such a client is never reported."""
    X, y, g = _three_clients(n_b=12)
    est, rec = _fit(X, y, g, components=("global",))
    assert est.clients_["B"].pilot_noise is None
    assert not any("client 'B'" in str(w.message) for w in rec)


def test_threshold_is_the_documented_ratio(monkeypatch):
    X, y, g = _three_clients()
    monkeypatch.setattr(regressor, "NOISE_ABOVE_OWN_RATIO", 1e9)
    _, rec = _fit(X, y, g, components=("global",))
    assert rec == []


@pytest.mark.parametrize("share", [None, 0.0])
def test_a_nearly_noise_free_client_fitted_well_is_not_reported(share, monkeypatch):
    """Three identical noise-free curves: the model's noise variance (about
    2e-5 of their variance) is many times their own GP's (at its 1e-6
    bound), but the model explains nearly all of their variance."""
    from skfedgp import MaxEvidenceClassifier

    rng = np.random.default_rng(0)
    t = np.linspace(0, 1, 20)
    X = np.vstack([np.tile(np.sin(3 * t), (3, 1)),
                   np.cos(3 * t) + 0.1 * rng.standard_normal((3, 20))])
    reg = FederatedHierarchicalGPRegressor(n_rounds=2, n_inducing=6, n_inducing_local=4)
    if share is not None:  # without the share rule it is reported
        monkeypatch.setattr(regressor, "NOISE_SHARE_REPORTED", share)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        MaxEvidenceClassifier(reg, random_state=0).fit(X, [0, 0, 0, 1, 1, 1])
    reported = [w for w in rec if issubclass(w.category, ClientFittedAsNoiseWarning)]
    assert len(reported) == (0 if share is None else 1)
