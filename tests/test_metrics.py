import numpy as np
import pytest
from scipy import integrate, stats

from skfedgp.metrics import (
    coverage,
    covariance_error,
    crps_gaussian,
    gaussian_nll,
    interval_width,
    output_covariance,
    regression_report,
    rmse,
    smse,
)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _random_spd(rng, n, q):
    A = rng.normal(size=(n, q, q))
    return A @ np.swapaxes(A, 1, 2) + 0.1 * np.eye(q)


# ---------------------------------------------------------------- RMSE / SMSE
def test_rmse_known_values():
    assert rmse([0.0, 0.0], [3.0, 4.0]) == pytest.approx(np.sqrt(12.5))
    y = np.array([[1.0, 2.0], [3.0, 4.0]])
    p = y + np.array([[1.0, -1.0], [1.0, -1.0]])
    assert rmse(y, p) == pytest.approx(1.0)  # eq. 43: 1/(nQ) sum ||.||^2


def test_smse_mean_predictor_scores_one(rng):
    y = rng.normal(3.0, 2.0, size=40)
    assert smse(y, np.full_like(y, y.mean())) == pytest.approx(1.0)
    assert smse(y, y) == 0.0
    Y = np.column_stack([y, 100 * y])  # per-output standardisation
    assert smse(Y, np.tile(Y.mean(axis=0), (40, 1))) == pytest.approx(1.0)


def test_smse_constant_target_raises():
    with pytest.raises(ValueError, match="zero variance"):
        smse([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])


# ---------------------------------------------------------------- NLL
def test_nll_marginal_matches_scipy(rng):
    y, mu = rng.normal(size=30), rng.normal(size=30)
    sd = rng.uniform(0.2, 2.0, size=30)
    expected = -np.mean(stats.norm.logpdf(y, mu, sd))
    assert gaussian_nll(y, mu, sd) == pytest.approx(expected, rel=1e-12)


def test_nll_marginal_multioutput_sums_outputs(rng):
    y, mu = rng.normal(size=(10, 3)), rng.normal(size=(10, 3))
    sd = rng.uniform(0.2, 2.0, size=(10, 3))
    expected = -np.mean(stats.norm.logpdf(y, mu, sd).sum(axis=1))
    assert gaussian_nll(y, mu, sd) == pytest.approx(expected, rel=1e-12)
    # a diagonal covariance gives the same number
    cov = np.einsum("nq,qr->nqr", sd**2, np.eye(3))
    assert gaussian_nll(y, mu, y_cov=cov) == pytest.approx(expected, rel=1e-10)


def test_nll_full_covariance_matches_scipy(rng):
    n, q = 8, 4
    y, mu = rng.normal(size=(n, q)), rng.normal(size=(n, q))
    cov = _random_spd(rng, n, q)
    expected = -np.mean(
        [stats.multivariate_normal.logpdf(y[j], mu[j], cov[j]) for j in range(n)]
    )
    assert gaussian_nll(y, mu, y_cov=cov) == pytest.approx(expected, rel=1e-10)


def test_nll_cov_1d_targets():
    y, mu, var = np.array([0.3, -1.0]), np.array([0.0, 0.5]), np.array([0.5, 2.0])
    expected = -np.mean(stats.norm.logpdf(y, mu, np.sqrt(var)))
    assert gaussian_nll(y, mu, y_cov=var[:, None, None]) == pytest.approx(expected)


def test_nll_argument_errors(rng):
    y = rng.normal(size=(5, 2))
    with pytest.raises(ValueError, match="exactly one"):
        gaussian_nll(y, y)
    with pytest.raises(ValueError, match="exactly one"):
        gaussian_nll(y, y, np.ones_like(y), y_cov=np.tile(np.eye(2), (5, 1, 1)))
    with pytest.raises(ValueError, match="y_cov has shape"):
        gaussian_nll(y, y, y_cov=np.tile(np.eye(3), (5, 1, 1)))
    bad = np.tile(np.diag([1.0, -1.0]), (5, 1, 1))
    with pytest.raises(ValueError, match="positive definite"):
        gaussian_nll(y, y, y_cov=bad)
    asym = np.tile(np.array([[1.0, 0.5], [0.0, 1.0]]), (5, 1, 1))
    with pytest.raises(ValueError, match="symmetric"):
        gaussian_nll(y, y, y_cov=asym)
    with pytest.raises(ValueError, match="strictly positive"):
        gaussian_nll(y, y, np.zeros_like(y))


# ---------------------------------------------------------------- CRPS
@pytest.mark.parametrize("y,mu,sd", [(0.3, 0.0, 1.0), (2.5, -1.0, 0.7), (-4.0, 1.0, 3.0)])
def test_crps_matches_numerical_integral(y, mu, sd):
    F = stats.norm(mu, sd).cdf
    lo, hi = mu - 12 * sd, mu + 12 * sd
    left, _ = integrate.quad(lambda x: F(x) ** 2, min(lo, y), y)
    right, _ = integrate.quad(lambda x: (F(x) - 1.0) ** 2, y, max(hi, y))
    assert crps_gaussian([y], [mu], [sd]) == pytest.approx(left + right, rel=1e-7)


def test_crps_is_mean_over_points():
    y, mu, sd = np.array([0.3, 2.5]), np.array([0.0, -1.0]), np.array([1.0, 0.7])
    each = [crps_gaussian([a], [b], [c]) for a, b, c in zip(y, mu, sd)]
    assert crps_gaussian(y, mu, sd) == pytest.approx(np.mean(each))
    # perfect mean: sigma * (2 phi(0) - 1/sqrt(pi)) = sigma (sqrt 2 - 1)/sqrt(pi)
    assert crps_gaussian([0.0], [0.0], [2.0]) == pytest.approx(
        2.0 * (np.sqrt(2) - 1) / np.sqrt(np.pi)
    )


# ---------------------------------------------------------------- coverage / width
def test_coverage_known_case():
    z = stats.norm.ppf(0.975)
    mu = np.zeros(4)
    sd = np.ones(4)
    y = np.array([0.0, 0.99 * z, -1.01 * z, 3.0])
    assert coverage(y, mu, sd) == pytest.approx(0.5)
    assert coverage(y, mu, sd, level=0.999) == pytest.approx(1.0)
    assert coverage(y, mu, sd, level=0.5) == pytest.approx(0.25)


def test_coverage_calibrated_gaussian(rng):
    y = rng.normal(size=20000)
    assert coverage(y, np.zeros_like(y), np.ones_like(y)) == pytest.approx(0.95, abs=0.01)


def test_interval_width():
    z = stats.norm.ppf(0.975)
    assert interval_width([1.0, 3.0]) == pytest.approx(2 * z * 2.0)
    assert interval_width(np.ones((3, 2)), level=0.5) == pytest.approx(
        2 * stats.norm.ppf(0.75)
    )
    for level in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="level"):
            interval_width([1.0], level=level)


# ---------------------------------------------------------------- CovErr
def test_output_covariance_and_coverr(rng):
    n, q = 50, 3
    clean = rng.normal(size=(n, q))
    true = output_covariance(clean, noise_var=0.01)  # eq. 48
    centred = clean - clean.mean(axis=0)
    np.testing.assert_allclose(true, centred.T @ centred / n + 0.01 * np.eye(q))
    blocks = np.tile(0.01 * np.eye(q), (n, 1, 1))
    pred = output_covariance(clean, blocks)  # eq. 49 with the exact blocks
    np.testing.assert_allclose(pred, true)
    assert covariance_error(pred, true) == pytest.approx(0.0, abs=1e-12)
    # relative Frobenius error, averaged over the leading axis
    A = np.eye(2)
    assert covariance_error(1.5 * A, A) == pytest.approx(0.5)
    stacked = covariance_error(np.stack([1.5 * A, A]), np.stack([A, A]))
    assert stacked == pytest.approx(0.25)


def test_coverr_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        covariance_error(np.eye(2), np.eye(3))
    with pytest.raises(ValueError, match="zero Frobenius"):
        covariance_error(np.eye(2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="square"):
        covariance_error(np.ones((2, 3)), np.ones((2, 3)))


# ---------------------------------------------------------------- report / validation
def test_regression_report(rng):
    y = rng.normal(size=100)
    mu = y + 0.1 * rng.normal(size=100)
    sd = np.full(100, 0.1)
    rep = regression_report(y, mu, sd)
    assert set(rep) == {"RMSE", "SMSE", "NLL", "CRPS", "coverage_95", "width_95"}
    assert all(isinstance(v, float) for v in rep.values())
    assert rep["RMSE"] == rmse(y, mu)
    assert rep["NLL"] == gaussian_nll(y, mu, sd)
    assert rep["width_95"] == pytest.approx(2 * stats.norm.ppf(0.975) * 0.1)


@pytest.mark.parametrize(
    "func,nargs",
    [(rmse, 2), (smse, 2), (gaussian_nll, 3), (crps_gaussian, 3), (coverage, 3),
     (regression_report, 3)],
)
def test_nan_rejected(func, nargs):
    good = [np.array([0.1, 0.5, 1.0]) for _ in range(nargs)]
    for k in range(nargs):
        args = [a.copy() for a in good]
        args[k][1] = np.nan
        with pytest.raises(ValueError, match="non-finite"):
            func(*args)


@pytest.mark.parametrize(
    "func,nargs",
    [(rmse, 2), (smse, 2), (gaussian_nll, 3), (crps_gaussian, 3), (coverage, 3),
     (regression_report, 3)],
)
def test_shape_mismatch_rejected(func, nargs):
    args = [np.ones(4) + np.arange(4)] * (nargs - 1) + [np.ones(3)]
    with pytest.raises(ValueError, match="shape"):
        func(*args)
    with pytest.raises(ValueError, match="shape"):
        func(np.ones((4, 1)), *([np.ones(4)] * (nargs - 1)))


def test_bad_dimensions_and_empty():
    with pytest.raises(ValueError, match="1-D or 2-D"):
        rmse(np.ones((2, 2, 2)), np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="empty"):
        rmse([], [])
    with pytest.raises(ValueError, match="strictly positive"):
        crps_gaussian([1.0], [1.0], [-1.0])
