import numpy as np
import pytest
from scipy import integrate, stats

from skfedgp.metrics import (
    DEFAULT_CALIBRATION_LEVELS,
    coverage,
    covariance_error,
    crps_gaussian,
    expected_calibration_error,
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
    for level in (0.0, 1.0, 1.5, None, [0.5, 0.9], "high", "0.9"):  # ValueError, not TypeError
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
    assert set(rep) == {"RMSE", "SMSE", "NLL", "CRPS", "coverage_95", "width_95", "ECE"}
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


# ---------------------------------------------------------------- multi-output (n, Q) / (n, Q, Q)
def _blocks_from_std(sd, rng, corr=0.6):
    """(n, Q, Q) blocks with marginal std ``sd`` and non-zero correlations."""
    n, q = sd.shape
    C = np.full((q, q), corr) + (1 - corr) * np.eye(q)
    return sd[:, :, None] * C[None] * sd[:, None, :]


def test_smse_multioutput_hand_value():
    y = np.array([[0.0, 10.0], [2.0, 30.0]])  # var per output: 1, 100
    p = np.array([[1.0, 10.0], [2.0, 20.0]])  # mse per output: 0.5, 50
    assert smse(y, p) == pytest.approx(0.5 * (0.5 / 1.0 + 50.0 / 100.0))


def test_crps_multioutput_and_cov_blocks(rng):
    n, q = 12, 3
    y, mu = rng.normal(size=(n, q)), rng.normal(size=(n, q))
    sd = rng.uniform(0.3, 2.0, size=(n, q))
    # reference: scipy's CDF integrated numerically entry by entry
    ref = []
    for a, b, c in zip(y.ravel(), mu.ravel(), sd.ravel()):
        F = stats.norm(b, c).cdf
        left, _ = integrate.quad(lambda x: F(x) ** 2, min(b - 12 * c, a), a)
        right, _ = integrate.quad(lambda x: (F(x) - 1.0) ** 2, a, max(b + 12 * c, a))
        ref.append(left + right)
    assert crps_gaussian(y, mu, sd) == pytest.approx(np.mean(ref), rel=1e-7)
    cov = _blocks_from_std(sd, rng)
    assert crps_gaussian(y, mu, y_cov=cov) == pytest.approx(np.mean(ref), rel=1e-7)


def test_coverage_and_width_with_cov_blocks(rng):
    z = stats.norm.ppf(0.975)
    mu = np.zeros((2, 2))
    sd = np.array([[1.0, 2.0], [0.5, 1.0]])
    # inside, inside, outside, outside (by hand)
    y = np.array([[0.9 * z, -1.9 * z], [0.6 * z, -1.1 * z]])
    cov = _blocks_from_std(sd, rng, corr=-0.4)
    assert coverage(y, mu, sd) == pytest.approx(0.5)
    assert coverage(y, mu, y_cov=cov) == pytest.approx(0.5)
    assert coverage(y, mu, level=0.5, y_cov=cov) == pytest.approx(0.0)
    assert interval_width(y_cov=cov) == pytest.approx(2 * z * sd.mean())
    assert interval_width(sd) == pytest.approx(2 * z * sd.mean())
    # 1-D targets with (n, 1, 1) blocks: 0.9 z <= z inside, 0.6 z > 0.5 z outside
    assert coverage(y[:, 0], mu[:, 0], y_cov=sd[:, :1, None] ** 2) == pytest.approx(0.5)


def test_marginal_metrics_reject_bad_cov(rng):
    y = rng.normal(size=(4, 2))
    sd = np.ones((4, 2))
    with pytest.raises(ValueError, match="exactly one"):
        crps_gaussian(y, y)
    with pytest.raises(ValueError, match="exactly one"):
        coverage(y, y, sd, y_cov=np.tile(np.eye(2), (4, 1, 1)))
    with pytest.raises(ValueError, match="exactly one"):
        interval_width()
    with pytest.raises(ValueError, match="y_cov has shape"):
        crps_gaussian(y, y, y_cov=np.tile(np.eye(3), (4, 1, 1)))
    with pytest.raises(ValueError, match="strictly positive"):
        coverage(y, y, y_cov=np.tile(np.diag([1.0, 0.0]), (4, 1, 1)))
    with pytest.raises(ValueError, match="symmetric"):
        interval_width(y_cov=np.tile(np.array([[1.0, 0.5], [0.0, 1.0]]), (4, 1, 1)))
    cov = np.tile(np.eye(2), (4, 1, 1))
    cov[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        expected_calibration_error(y, y, y_cov=cov)


# ---------------------------------------------------------------- ECE
def test_ece_hand_computed():
    z50, z90 = stats.norm.ppf(0.75), stats.norm.ppf(0.95)
    mu, sd = np.zeros(4), np.ones(4)
    # |r| = 0.5 z50 (in both), 1.5 z50 < z90 (only 0.9), 2 z90 (none), 0 (both)
    y = np.array([0.5 * z50, -1.5 * z50, 2.0 * z90, 0.0])
    assert 1.5 * z50 < z90
    # coverage: 0.5 at level 0.5 (gap 0), 0.75 at level 0.9 (gap 0.15)
    got = expected_calibration_error(y, mu, sd, levels=[0.5, 0.9])
    assert got == pytest.approx(0.5 * (0.0 + 0.15))


def test_ece_equals_mean_gap_of_coverage(rng):
    y, mu = rng.normal(size=(60, 3)), rng.normal(size=(60, 3))
    sd = rng.uniform(0.5, 2.0, size=(60, 3))
    levels = DEFAULT_CALIBRATION_LEVELS
    assert len(levels) == 99 and levels[0] == 0.01 and levels[-1] == 0.99
    ref = np.mean([abs(coverage(y, mu, sd, level=p) - p) for p in levels])
    assert expected_calibration_error(y, mu, sd) == pytest.approx(ref, abs=1e-15)
    cov = _blocks_from_std(sd, rng)
    assert expected_calibration_error(y, mu, y_cov=cov) == pytest.approx(ref, abs=1e-15)


def test_ece_population_values(rng):
    # calibrated: ECE -> 0; overconfident by 2x: coverage(p) -> 2 Phi(2 z_p) - 1
    y = rng.normal(size=(40000, 2))
    mu, sd = np.zeros_like(y), np.ones_like(y)
    assert expected_calibration_error(y, mu, sd) < 0.01
    levels = DEFAULT_CALIBRATION_LEVELS
    z = stats.norm.ppf(0.5 + levels / 2)
    ref = np.mean(np.abs(2 * stats.norm.cdf(z / 2) - 1 - levels))
    assert expected_calibration_error(y, mu, 0.5 * sd) == pytest.approx(ref, abs=0.01)
    assert ref > 0.2  # a real gap, not a trivially small number


@pytest.mark.parametrize("levels", [[0.0, 0.5], [0.5, 1.0], [], [[0.5]], [np.nan]])
def test_ece_bad_levels(levels):
    with pytest.raises(ValueError, match="level"):
        expected_calibration_error([0.0, 1.0], [0.0, 0.0], [1.0, 1.0], levels=levels)


def test_regression_report_with_cov_blocks(rng):
    n, q = 30, 3
    y, mu = rng.normal(size=(n, q)), rng.normal(size=(n, q))
    cov = _random_spd(rng, n, q)
    rep = regression_report(y, mu, y_cov=cov)
    expected_nll = -np.mean(
        [stats.multivariate_normal.logpdf(y[j], mu[j], cov[j]) for j in range(n)]
    )
    assert rep["NLL"] == pytest.approx(expected_nll, rel=1e-10)
    sd = np.sqrt(np.diagonal(cov, axis1=1, axis2=2))
    marg = regression_report(y, mu, sd)
    for key in ("RMSE", "SMSE", "CRPS", "coverage_95", "width_95", "ECE"):
        assert rep[key] == pytest.approx(marg[key], rel=1e-12)
    assert marg["NLL"] == pytest.approx(-np.mean(stats.norm.logpdf(y, mu, sd).sum(axis=1)))


def test_output_covariance_multioutput_hand(rng):
    mu = np.array([[1.0, 0.0], [-1.0, 2.0]])  # population cov [[1, -1], [-1, 1]]
    blocks = np.array([[[2.0, 0.5], [0.5, 1.0]], [[4.0, -0.5], [-0.5, 3.0]]])
    got = output_covariance(mu, blocks, noise_var=0.1)
    expected = np.array([[1.0, -1.0], [-1.0, 1.0]]) + blocks.mean(axis=0) + 0.1 * np.eye(2)
    np.testing.assert_allclose(got, expected)
    np.testing.assert_allclose(got, np.cov(mu.T, bias=True) + blocks.mean(0) + 0.1 * np.eye(2))


def test_output_covariance_noise_var_must_be_a_number():
    from skfedgp.metrics import output_covariance

    for bad in (None, "x", -1.0):
        with pytest.raises(ValueError, match="noise_var"):
            output_covariance(np.zeros((4, 2)), noise_var=bad)


def test_interval_width_names_non_square_blocks():
    from skfedgp.metrics import interval_width

    with pytest.raises(ValueError, match=r"square Q x Q blocks.*\(3, 1, 2\)"):
        interval_width(y_cov=np.ones((3, 1, 2)))


def test_regression_report_names_an_overflow():
    from skfedgp.metrics import regression_report

    # errors of about 3e308: the RMSE itself cannot be stored in float64
    # (values of 1e200 are fine: the metrics work in units of the largest)
    y = np.array([1.5e308, -1.5e308, 1.5e308])
    with pytest.raises(ValueError, match="overflowed float64"):
        regression_report(y, -y, np.full(3, 1.0))
