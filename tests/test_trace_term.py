"""The trace term of the collapsed bound at the fitted model (``trace_term_``)
and :class:`skfedgp.SparseApproximationWarning`."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor, SparseApproximationWarning


def _se(A, B, ell, var):
    d = (A[:, None, :] - B[None, :, :]) / ell
    return var * np.exp(-0.5 * np.sum(d**2, axis=-1))


def _residual(X, Z, ell, var, jitter):
    """sum_x k(x, x) - k(x, Z) K_zz^-1 k(Z, x), dense NumPy reference (the model's
    relative jitter on K_zz, as in the bound it maximises)."""
    Kzz = _se(Z, Z, ell, var) + jitter * var * np.eye(len(Z))
    Kxz = _se(X, Z, ell, var)
    q = np.einsum("ij,ji->i", Kxz, np.linalg.solve(Kzz, Kxz.T))
    return float(np.sum(np.maximum(var - q, 0.0)))


@pytest.mark.parametrize("components", [("global",), ("global", "deviation", "local")])
def test_trace_term_matches_a_dense_reference(components):
    """trace_term_ is sum over clients of [gamma_g res_g + res_l] / (2 noise),
    recomputed here from the fitted values and the scaled inputs."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 4, (90, 1))
    g = np.repeat([0, 1, 2], 30)
    y = np.sin(2 * X[:, 0]) + 0.05 * rng.standard_normal(90)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(components=components, n_inducing=6,
                                               random_state=0).fit(X, y, groups=g)
    srv = est.server_
    G = srv.global_pack.unpack(srv.theta_global)
    Xs = (X - srv.x_offset) / srv.x_scale
    jit = float(srv.config.jitter)
    gamma = 1.0 + (float(G["phi"]) if "deviation" in components else 0.0)
    want = 0.0
    for lab, c in est.clients_.items():
        L = c.local_values()
        xi = Xs[g == lab]
        s2 = float(np.ravel(L["noise_variance"])[0])
        res = gamma * _residual(xi, G["Z_g"], G["lengthscale_g"], float(G["variance_g"]), jit)
        if "Z_l" in L:
            res += _residual(xi, L["Z_l"], L["lengthscale_l"], float(L["variance_l"]), jit)
        want += res / (2 * s2)
    assert want > 1e-3  # six inducing points leave something unexplained
    np.testing.assert_allclose(est.trace_term_, want, rtol=1e-4)


def _extrapolated(sd, seed=0, n_clients=3):
    rng = np.random.default_rng(seed)
    f = lambda x: np.sin(2 * x[:, 0]) * np.exp(-0.2 * x[:, 0]) + 0.1 * x[:, 0] ** 2  # noqa: E731
    X = rng.uniform(0, 5, (50 * n_clients, 1))
    g = np.repeat(np.arange(n_clients), 50)
    return X, f(X) + sd * rng.standard_normal(len(X)), g


def test_noise_free_data_warn_that_the_approximation_is_loose():
    """Noise-free targets: the trace term (0.24-0.34 nats per observation)
    pulls the signal variance down; extrapolated to [5, 6.5] the predictions
    had 53-95 % of points beyond 3 std, against none for an exact GP."""
    X, y, g = _extrapolated(0.0)
    with pytest.warns(SparseApproximationWarning, match="per observation"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
    assert est.trace_term_ > 0.03 * len(y)


def test_noisy_data_do_not_warn():
    X, y, g = _extrapolated(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparseApproximationWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
    assert 0 <= est.trace_term_ < 0.03 * len(y)


@pytest.mark.parametrize("noise, missing", [("isotropic", False), ("diagonal", True)])
def test_multioutput_trace_term_matches_a_dense_reference(noise, missing):
    """ILMM: sum over clients, latents r and observed entries of output q of
    c_qr^2 res_r(x) / (2 s2_q), with c_qr^2 = B_g[q,r]^2 + phi B_d[q,r]^2
    (global inducing inputs) or B_l[q,r]^2 (local ones)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 4, (60, 1))
    g = np.repeat([0, 1, 2], 20)
    Y = np.c_[np.sin(2 * X[:, 0]), 3 * np.cos(1.5 * X[:, 0]) + 2]
    Y = Y + 0.05 * rng.standard_normal((60, 2))
    if missing:
        Y[rng.random(60) < 0.3, 1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_inducing=5, n_latent=1, noise=noise,
                                               random_state=0).fit(X, Y, groups=g)
    srv = est.server_
    G = srv.global_pack.unpack(srv.theta_global)
    Xs = (X - srv.x_offset) / srv.x_scale
    jit = float(srv.config.jitter)
    want = 0.0
    for lab, c in est.clients_.items():
        L = c.local_values()
        xi, obs = Xs[g == lab], np.isfinite(Y[g == lab])
        s2 = np.broadcast_to(np.asarray(L["noise_variance"], float).reshape(-1), (2,))
        for Z, ells, weight in (
                (G["Z_g"], G["lengthscale_g"],
                 lambda q, r: G["B_g"][q, r] ** 2 + float(G["phi"]) * L["B_d"][q, r] ** 2),
                (L["Z_l"], L["lengthscale_l"], lambda q, r: L["B_l"][q, r] ** 2)):
            for r, ell in enumerate(np.atleast_2d(ells)):
                per_row = np.array([_residual(x[None], Z, ell, 1.0, jit) for x in xi])
                for q in range(2):
                    want += weight(q, r) * per_row[obs[:, q]].sum() / (2 * s2[q])
    assert want > 1e-3
    np.testing.assert_allclose(est.trace_term_, want, rtol=1e-6)
