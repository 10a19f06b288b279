"""Multi-output generator (pFedHGP sections 4.1, 4.3), its true covariance
and the exact-GP oracle."""

import re

import numpy as np
import pytest
from scipy import stats

from skfedgp.datasets import (
    hierarchical_covariance,
    hierarchical_oracle_predict,
    make_hierarchical_regression,
)
from skfedgp.metrics import coverage, gaussian_nll

PAPER = dict(n_clients=6, n_samples=50, n_outputs=4, n_test=150)


def _gen(**kw):
    return make_hierarchical_regression(**kw)


# ------------------------------------------------------------------ shapes
def test_paper_shapes_grid_and_defaults():
    X, y, g, Xt, yt, gt, truth = _gen(**PAPER, random_state=0, return_truth=True)
    assert X.shape == (300, 1) and y.shape == (300, 4) and g.shape == (300,)
    assert Xt.shape == (900, 1) and yt.shape == (900, 4) and gt.shape == (900,)
    assert np.all((X >= 0) & (X <= 10))
    np.testing.assert_array_equal(np.bincount(g), [50] * 6)
    grid = np.linspace(0, 10, 150)
    for i in range(6):
        np.testing.assert_array_equal(Xt[gt == i, 0], grid)
    assert truth.scenario == "A" and truth.n_outputs == 4 and truth.n_latent == 2
    np.testing.assert_allclose(truth.global_lengthscale, [1.8, 2.5])
    np.testing.assert_allclose(truth.global_variance, [1.0, 0.49])
    np.testing.assert_allclose(truth.deviation_variance, [1.2, 1.2 * 0.49])
    np.testing.assert_allclose(truth.local_lengthscale, [0.25, 0.45])
    np.testing.assert_allclose(truth.local_variance, [1.0, 0.64])
    assert truth.noise == 0.05
    assert truth.loadings_global.shape == (4, 2)
    assert truth.loadings_deviation.shape == truth.loadings_local.shape == (6, 4, 2)
    assert truth.y_clean.shape == (300, 4) and truth.y_test_clean.shape == (900, 4)
    # n_outputs > 1 without a scenario is scenario A, bit for bit
    again = _gen(**PAPER, random_state=0, scenario="A")
    for a, b in zip((X, y, g, Xt, yt, gt), again):
        np.testing.assert_array_equal(a, b)


def test_scenario_with_single_output_is_2d():
    X, y, g = _gen(n_clients=2, n_samples=5, scenario="C", random_state=0)
    assert y.shape == (10, 1)


def test_single_output_unchanged_by_new_options():
    kw = dict(n_clients=3, n_samples=[4, 0, 6], n_test=5, random_state=3)
    base = _gen(**kw, return_components=True)
    out = _gen(**kw, return_components=True, n_outputs=1, scenario=None, return_truth=True)
    assert len(out) == len(base) + 1
    for a, b in zip(base[:6], out[:6]):
        np.testing.assert_array_equal(a, b)
    truth = out[-1]
    np.testing.assert_array_equal(truth.y_clean, sum(base[6].values()))
    np.testing.assert_array_equal(truth.y_test_clean, sum(base[7].values()))
    assert truth.y_clean.shape == base[1].shape  # 1-D, like y


# ------------------------------------------------------------------ scenarios
def test_components_and_common_random_numbers():
    kw = dict(**PAPER, random_state=7, return_components=True, return_truth=True)
    out = {sc: _gen(scenario=sc, **kw) for sc in "ABCD"}
    X, y, g, Xt, yt, gt, comp, comp_t, truth = out["A"]
    noise = y - sum(comp.values())
    assert set(comp) == {"global", "deviation", "local"}
    assert 0.04 < noise.std() < 0.06  # sigma = 0.05
    np.testing.assert_allclose(truth.y_clean, sum(comp.values()))
    np.testing.assert_allclose(truth.y_test_clean, sum(comp_t.values()))
    for sc in "BCD":
        o = out[sc]
        np.testing.assert_array_equal(o[0], X)  # same inputs
        np.testing.assert_array_equal(o[6]["global"], comp["global"])
        np.testing.assert_allclose(o[1] - o[8].y_clean, noise, atol=1e-12)  # same noise
        np.testing.assert_array_equal(o[8].loadings_local, truth.loadings_local)
    # B: a different deviation (periodic part), the rest identical
    cB = out["B"][6]
    np.testing.assert_array_equal(cB["local"], comp["local"])
    assert not np.allclose(cB["deviation"], comp["deviation"])
    assert out["B"][8].periodic == (0.35, 3.0, 0.8)
    # C: eq. 41 product term with gamma_i ~ U(0.35, 0.60)
    cC, tC = out["C"][6], out["C"][8]
    assert tC.gamma.shape == (6,) and np.all((tC.gamma >= 0.35) & (tC.gamma <= 0.60))
    np.testing.assert_allclose(
        cC["interaction"], tC.gamma[g, None] * comp["global"] * comp["deviation"]
    )
    np.testing.assert_allclose(out["C"][1], y + cC["interaction"], atol=1e-12)
    # D: eq. 42, f_i = rho f_delta + sqrt(1 - rho^2) f~ with f~ the A local part
    cD = out["D"][6]
    np.testing.assert_allclose(
        cD["local"], 0.5 * comp["deviation"] + np.sqrt(0.75) * comp["local"]
    )
    assert out["D"][8].rho == 0.5


# ------------------------------------------------------------------ true covariance
def _k_se(x, xp, ell, var):
    return var * np.exp(-0.5 * np.sum((x - xp) ** 2) / ell**2)


def _k_dev(x, xp, ell, var, periodic):
    if periodic is None:
        return _k_se(x, xp, ell, var)
    w, p, lp = periodic
    r = np.sqrt(np.sum((x - xp) ** 2))
    return (1 - w) * _k_se(x, xp, ell, var) + w * var * np.exp(
        -2 * np.sin(np.pi * r / p) ** 2 / lp**2
    )


def _dense_cov(truth, X1, g1, X2, g2):
    """Entry-by-entry covariance straight from the definitions (eqs. 36-42)."""
    Q, R = truth.n_outputs, truth.n_latent
    Bg, Bd, Bl = truth.loadings_global, truth.loadings_deviation, truth.loadings_local
    rho = truth.rho if truth.scenario == "D" else 0.0
    C = np.zeros((len(X1), Q, len(X2), Q))
    for a in range(len(X1)):
        for b in range(len(X2)):
            for q in range(Q):
                for p in range(Q):
                    G = sum(
                        Bg[q, r] * Bg[p, r] * _k_se(
                            X1[a], X2[b], truth.global_lengthscale[r],
                            truth.global_variance[r])
                        for r in range(R)
                    )
                    val = G
                    if g1[a] == g2[b]:
                        i = g1[a]
                        D = sum(
                            Bd[i, q, r] * Bd[i, p, r] * _k_dev(
                                X1[a], X2[b], truth.global_lengthscale[r],
                                truth.phi * truth.global_variance[r], truth.periodic)
                            for r in range(R)
                        )
                        L = sum(
                            Bl[i, q, r] * Bl[i, p, r] * _k_se(
                                X1[a], X2[b], truth.local_lengthscale[r],
                                truth.local_variance[r])
                            for r in range(R)
                        )
                        val += (1 + rho) ** 2 * D + (1 - rho**2) * L
                        if truth.scenario == "C":
                            val += truth.gamma[i] ** 2 * G * D
                    C[a, q, b, p] = val
    return C


@pytest.mark.parametrize("scenario", ["A", "B", "C", "D"])
def test_covariance_matches_dense_definition(scenario):
    X, y, g, Xt, yt, gt, truth = _gen(
        n_clients=3, n_samples=3, n_outputs=3, n_test=2, scenario=scenario,
        random_state=11, return_truth=True,
    )
    C = hierarchical_covariance(truth, X, g, Xt, gt)
    np.testing.assert_allclose(C, _dense_cov(truth, X, g, Xt, gt), rtol=1e-10, atol=1e-12)
    S = hierarchical_covariance(truth, X, g).reshape(27, 27)
    np.testing.assert_allclose(S, S.T, atol=1e-12)
    assert np.linalg.eigvalsh(S).min() > -1e-9


def test_covariance_single_output_generator():
    X, y, g, truth = _gen(
        n_clients=2, n_samples=3, n_features=2, global_lengthscale=[1.0, 2.0],
        random_state=2, return_truth=True,
    )
    C = hierarchical_covariance(truth, X, g)[:, 0, :, 0]
    ref = np.zeros((6, 6))
    for a in range(6):
        for b in range(6):
            kg = np.exp(-0.5 * np.sum(((X[a] - X[b]) / [1.0, 2.0]) ** 2))
            kl = np.exp(-0.5 * np.sum((X[a] - X[b]) ** 2) / 0.25**2)
            ref[a, b] = kg + (g[a] == g[b]) * (1.2 * kg + kl)
    np.testing.assert_allclose(C, ref, rtol=1e-12)


def _whitened(truth, X, g, y, cov_truth=None):
    cov_truth = truth if cov_truth is None else cov_truth
    n, Q = y.shape
    K = hierarchical_covariance(cov_truth, X, g).reshape(n * Q, n * Q)
    L = np.linalg.cholesky(K + truth.noise**2 * np.eye(n * Q))
    return np.linalg.solve(L, y.reshape(-1))


@pytest.mark.parametrize("scenario", ["A", "B", "C", "D"])
def test_generator_draws_match_true_covariance(scenario):
    # y ~ N(0, C + s^2 I) given the loadings => L^{-1} y ~ N(0, I) exactly
    # (second moments only in scenario C, whose signal is not Gaussian)
    z, z_wrong = [], []
    for seed in range(40):
        X, y, g, truth = _gen(
            n_clients=3, n_samples=5, n_outputs=4, scenario=scenario,
            random_state=seed, return_truth=True,
        )
        z.append(_whitened(truth, X, g, y))
        if scenario != "A":
            # the scenario-A covariance with the same loadings is wrong here
            wrong = dict(truth, scenario="A", periodic=None, gamma=None, rho=None)
            z_wrong.append(_whitened(truth, X, g, y, wrong))
    z = np.concatenate(z)  # 40 * 60 values
    assert np.mean(z**2) == pytest.approx(1.0, abs=0.12)  # 4 sd of chi2 mean
    if scenario != "C":
        assert stats.kstest(z, "norm").pvalue > 1e-3
    if z_wrong:
        zw = np.concatenate(z_wrong)
        assert abs(np.mean(zw**2) - 1.0) > 0.12 or stats.kstest(zw, "norm").pvalue < 1e-3


# ------------------------------------------------------------------ oracle
def _dense_posterior(truth, X, g, y, Xt, gt):
    n, m, Q = len(X), len(Xt), truth.n_outputs
    Xa, ga = np.vstack([X, Xt]), np.concatenate([g, gt])
    K = _dense_cov(truth, Xa, ga, Xa, ga).reshape((n + m) * Q, (n + m) * Q)
    f, s = slice(0, n * Q), slice(n * Q, None)
    Kff = K[f, f] + truth.noise**2 * np.eye(n * Q)
    mean = K[s, f] @ np.linalg.solve(Kff, y.reshape(-1))
    cov = K[s, s] - K[s, f] @ np.linalg.solve(Kff, K[f, s])
    cov = cov + truth.noise**2 * np.eye(m * Q)
    blocks = np.array([cov[j * Q:(j + 1) * Q, j * Q:(j + 1) * Q] for j in range(m)])
    return mean.reshape(m, Q), blocks


@pytest.mark.parametrize("scenario", ["A", "C"])
def test_oracle_matches_dense_numpy(scenario):
    X, y, g, Xt, yt, gt, truth = _gen(
        n_clients=3, n_samples=4, n_outputs=2, n_test=3, scenario=scenario,
        random_state=5, return_truth=True,
    )
    mean, cov = hierarchical_oracle_predict(truth, X, y, g, Xt, gt)
    ref_mean, ref_cov = _dense_posterior(truth, X, g, y, Xt, gt)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-8, atol=1e-12)
    _, cov_clean = hierarchical_oracle_predict(
        truth, X, y, g, Xt, gt, include_noise=False
    )
    np.testing.assert_allclose(cov - cov_clean, np.broadcast_to(0.0025 * np.eye(2), cov.shape))


def test_oracle_single_output_shapes_and_values():
    X, y, g, Xt, yt, gt, truth = _gen(
        n_clients=2, n_samples=4, n_test=3, random_state=1, return_truth=True
    )
    mean, cov = hierarchical_oracle_predict(truth, X, y, g, Xt, gt)
    assert mean.shape == (6,) and cov.shape == (6, 1, 1)
    ref_mean, ref_cov = _dense_posterior(truth, X, g, y[:, None], Xt, gt)
    np.testing.assert_allclose(mean, ref_mean[:, 0], rtol=1e-8)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-8)


def test_oracle_scenario_a_is_calibrated_and_uses_all_clients():
    """On scenario A the oracle is the Bayes posterior predictive, so its
    squared error must match its own predictive variance (the floor no model
    can beat in expectation) and its intervals must cover ~95 %; conditioning
    on every client's data can only shrink a client's posterior covariance
    compared with conditioning on its own data alone."""
    mse, var, cover, nll, logdet = [], [], [], [], []
    for seed in range(3):
        X, y, g, Xt, yt, gt, truth = _gen(**PAPER, random_state=seed, return_truth=True)
        mean, cov = hierarchical_oracle_predict(truth, X, y, g, Xt, gt)
        sd = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
        mse.append(np.mean((yt - mean) ** 2))
        var.append(np.mean(sd**2))
        cover.append(coverage(yt, mean, sd))
        nll.append(gaussian_nll(yt, mean, y_cov=cov))
        logdet.append(np.mean(np.linalg.slogdet(cov)[1]))
        if seed == 0:
            k, kt = g == 0, gt == 0
            _, own = hierarchical_oracle_predict(truth, X[k], y[k], g[k], Xt[kt], gt[kt])
            gap = np.linalg.eigvalsh(own - cov[kt])  # PSD: more data, less variance
            assert gap.min() > -1e-9
            assert np.trace(own - cov[kt], axis1=1, axis2=2).mean() > 1e-4
            assert np.mean(sd[kt] ** 2) < np.mean(np.diagonal(own, axis1=1, axis2=2))
    ratio = np.mean(mse) / np.mean(var)
    assert 0.8 < ratio < 1.25
    assert 0.925 < np.mean(cover) < 0.975
    assert np.sqrt(np.mean(mse)) > 0.05  # never below the noise sd
    # NLL near its expectation under the model, 0.5 E[Q log 2 pi + log|S| + Q]
    expected = 0.5 * (4 * np.log(2 * np.pi) + np.mean(logdet) + 4)
    assert np.mean(nll) == pytest.approx(expected, abs=0.6)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scenario="E"), "scenario"),
        (dict(n_outputs=0), "n_outputs"),
        (dict(n_outputs=2.0), "n_outputs"),
        (dict(n_latent=2), "multi-output generator only"),
        (dict(n_outputs=4, n_latent=0), "n_latent"),
        (dict(n_outputs=4, n_latent=3), "no default"),
        (dict(n_outputs=4, global_lengthscale=[1.0, 2.0, 3.0]), "length n_latent"),
        (dict(n_outputs=4, local_lengthscale=[1.0, -2.0]), "local_lengthscale"),
        (dict(n_outputs=4, global_variance=-1.0), "global_variance"),
        (dict(return_truth="yes"), "return_truth"),
    ],
)
def test_multioutput_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_hierarchical_regression(**kwargs)


@pytest.mark.parametrize("scenario, drop", [
    ("A", ["loadings_local"]), ("A", ["global_lengthscale", "periodic"]),
    ("C", ["gamma"]), ("D", ["rho"]), (None, ["local_variance"]),
])
def test_covariance_names_the_missing_keys_of_truth(scenario, drop):
    """hierarchical_covariance checked six keys of truth and then read others:
    a KeyError on a truth lacking them. Every key it reads is checked first."""
    kw = dict(n_outputs=2, scenario=scenario) if scenario else {}
    X, y, g, truth = _gen(n_clients=2, n_samples=3, random_state=0, return_truth=True, **kw)
    hierarchical_covariance(truth, X, g)  # complete: fine
    partial = {k: v for k, v in truth.items() if k not in drop}
    with pytest.raises(ValueError, match=r"truth must be .*it lacks the keys " + re.escape(
            str(drop))):
        hierarchical_covariance(partial, X, g)
    with pytest.raises(ValueError, match="it lacks the keys"):
        hierarchical_oracle_predict(partial, X, y, g, X, g)


def test_covariance_and_oracle_errors():
    X, y, g, Xt, yt, gt, truth = _gen(
        n_clients=2, n_samples=3, n_outputs=2, n_test=2, random_state=0, return_truth=True
    )
    with pytest.raises(ValueError, match="truth must be"):
        hierarchical_covariance({"a": 1}, X, g)
    with pytest.raises(ValueError, match="shape"):
        hierarchical_covariance(truth, np.ones((3, 2)), [0, 0, 0])
    with pytest.raises(ValueError, match="client ids"):
        hierarchical_covariance(truth, X, g + 5)
    with pytest.raises(ValueError, match="groups2 is required"):
        hierarchical_covariance(truth, X, g, Xt)
    with pytest.raises(ValueError, match="y must have shape"):
        hierarchical_oracle_predict(truth, X, y[:, 0], g, Xt, gt)
    bad = y.copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        hierarchical_oracle_predict(truth, X, bad, g, Xt, gt)
    Xn = Xt.copy()
    Xn[0, 0] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        hierarchical_oracle_predict(truth, X, y, g, Xn, gt)
