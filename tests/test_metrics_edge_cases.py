"""Edge cases of :mod:`skfedgp.metrics`: overflow, non-real input, covariance blocks."""

import warnings

import numpy as np
import pytest

from skfedgp import metrics as M


# --------------------------------------------------------------------------
# large-but-finite values: exact where representable, ValueError otherwise
# --------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_rmse_and_smse_are_scale_equivariant_far_from_unit_scale(scale):
    y = np.array([1.0, -1.0, 3.0])
    p = np.array([0.5, 0.0, 2.0])
    ref_rmse = np.sqrt(np.mean((y - p) ** 2))
    ref_smse = np.mean((y - p) ** 2) / np.var(y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / underflow RuntimeWarning
        assert M.rmse(y * scale, p * scale) == pytest.approx(ref_rmse * scale, rel=1e-12)
        assert M.smse(y * scale, p * scale) == pytest.approx(ref_smse, rel=1e-12)


def test_smse_of_1e200_values_is_finite():
    # the probe: smse([1e200, -1e200, 3e200], 0) was nan
    y = np.array([1e200, -1e200, 3e200])
    got = M.smse(y, np.zeros(3))
    assert got == pytest.approx(M.smse(y / 1e200, np.zeros(3)), rel=1e-12)
    assert got == pytest.approx((1 + 1 + 9) / 8, rel=1e-12)


def test_rmse_of_1e200_values_is_1e200():
    assert M.rmse(np.array([1e200, -1e200]), np.zeros(2)) == pytest.approx(1e200, rel=1e-12)


def test_rmse_of_opposite_values_near_max_float():
    # y - p overflows elementwise, but the RMSE (1e308) is representable
    y = np.array([0.5e308, -0.5e308])
    assert M.rmse(y, -y) == pytest.approx(1e308, rel=1e-12)


def test_crps_of_huge_z_is_the_absolute_error():
    # z = 1e600 overflows; CRPS -> |y - mu| - sigma / sqrt(pi) = 1e300
    got = M.crps_gaussian(np.array([1e300]), np.zeros(1), np.array([1e-300]))
    assert got == pytest.approx(1e300, rel=1e-12)


@pytest.mark.parametrize("call, what", [
    (lambda: M.rmse([1.5e308, -1.5e308], [-1.5e308, 1.5e308]), "RMSE"),
    (lambda: M.smse([1e-300, 0.0], [1e300, 0.0]), "SMSE"),
    (lambda: M.gaussian_nll([1e200], [0.0], [1e-200]), "NLL"),
    (lambda: M.crps_gaussian([1.5e308], [-1.5e308], [1.0]), "CRPS"),
    (lambda: M.interval_width(np.array([1e308, 1e308])), "width"),
])
def test_unrepresentable_metric_raises_the_overflow_error(call, what):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=f"{what} overflowed float64.*rescale"):
            call()


def test_interval_width_overflow_names_y_std_not_y_true():
    """interval_width has no y_true; its overflow message said "largest
    |y_true|" about the standard deviations."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"width overflowed float64 \(largest \|y_std\| "
                                             r"= 1e\+308\)") as info:
            M.interval_width(np.array([1e308, 1e308]))
    assert "y_true" not in str(info.value)
    # the other metrics still name y_true
    with pytest.raises(ValueError, match=r"largest \|y_true\|"):
        M.rmse([1.5e308, -1.5e308], [-1.5e308, 1.5e308])


def test_regression_report_of_1e200_data_is_finite_and_scale_equivariant():
    y = np.array([1e200, -1e200, 3e200])
    rep = M.regression_report(y, y * 0.5, np.full(3, 1e199))
    ref = M.regression_report(y / 1e200, y / 2e200, np.full(3, 0.1))
    assert all(np.isfinite(v) for v in rep.values())
    for k in ("RMSE", "CRPS", "width_95"):
        assert rep[k] == pytest.approx(ref[k] * 1e200, rel=1e-10)
    for k in ("SMSE", "coverage_95", "ECE"):
        assert rep[k] == pytest.approx(ref[k], rel=1e-10)


def test_regression_report_raises_when_a_value_is_not_representable():
    # |y - mu| = 3e308 > max float: RMSE itself is not representable
    y = np.array([1.5e308, -1.5e308])
    with pytest.raises(ValueError, match="RMSE overflowed float64"):
        M.regression_report(y, -y, np.full(2, 1e300))


def test_covariance_error_of_1e200_matrices():
    true = np.array([[2.0, 0.5], [0.5, 1.0]])
    pred = true * 1.1
    ref = M.covariance_error(pred, true)
    assert ref == pytest.approx(0.1)
    assert M.covariance_error(pred * 1e200, true * 1e200) == pytest.approx(ref, rel=1e-12)


def test_output_covariance_overflow_is_a_value_error():
    mu = np.array([[1e200, 0.0], [-1e200, 1.0]])
    with pytest.raises(ValueError, match="output covariance overflowed float64"):
        M.output_covariance(mu)


# --------------------------------------------------------------------------
# complex and non-numeric input
# --------------------------------------------------------------------------
@pytest.mark.parametrize("bad, argname", [
    ((np.array([1 + 5j, 2]), [1, 2]), "y_true"),
    (([1, 2], np.array([1, 2], dtype=object) * np.array([1, 1j], dtype=object)), "y_pred"),
    (([1.0, 2.0], np.array([1.0 + 0j, 2.0])), "y_pred"),
])
def test_complex_input_is_rejected_not_truncated(bad, argname):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not just a ComplexWarning
        with pytest.raises(ValueError, match=f"{argname} holds complex values"):
            M.rmse(*bad)


@pytest.mark.parametrize("bad", [["1", "2"], np.array(["1", "2"], dtype=object),
                                 [b"1", b"2"]])
def test_string_input_is_rejected(bad):
    with pytest.raises(ValueError, match="y_true must be an array of real numbers"):
        M.rmse(bad, [1, 2])


def test_complex_std_and_blocks_are_rejected():
    y = np.zeros(3)
    with pytest.raises(ValueError, match="y_std holds complex"):
        M.crps_gaussian(y, y, np.ones(3) + 1j)
    with pytest.raises(ValueError, match="y_cov holds complex"):
        M.gaussian_nll(y, y, y_cov=np.ones((3, 1, 1)) * (1 + 1j))
    with pytest.raises(ValueError, match="y_mean holds complex"):
        M.output_covariance(np.ones((3, 2)) * 1j)
    with pytest.raises(ValueError, match="noise_var must be a real number"):
        M.output_covariance(np.ones((3, 2)), noise_var=1 + 0j)


# --------------------------------------------------------------------------
# output_covariance validates its blocks like gaussian_nll
# --------------------------------------------------------------------------
def _mu():
    return np.random.default_rng(0).standard_normal((20, 2))


def test_output_covariance_rejects_asymmetric_blocks_like_gaussian_nll():
    mu = _mu()
    bad = np.tile(np.array([[1.0, 5.0], [0.0, -1.0]]), (20, 1, 1))
    with pytest.raises(ValueError, match=r"y_cov\[0\] is not symmetric") as e_nll:
        M.gaussian_nll(mu, mu, y_cov=bad)
    with pytest.raises(ValueError, match=r"y_cov\[0\] is not symmetric") as e_oc:
        M.output_covariance(mu, bad)
    assert str(e_oc.value) == str(e_nll.value)


@pytest.mark.parametrize("block, match", [
    ([[1.0, 0.0], [0.0, -1.0]], "negative diagonal"),
    ([[1.0, 2.0], [2.0, 1.0]], "not positive semi-definite"),
])
def test_output_covariance_rejects_non_covariance_blocks(block, match):
    mu = _mu()
    blocks = np.tile(np.array(block), (20, 1, 1))
    blocks[3] = np.eye(2)
    with pytest.raises(ValueError, match=r"y_cov\[0\].*" + match):
        M.output_covariance(mu, blocks)
    # a singular (rank-1) covariance block is still accepted, and the result
    # is the symmetric eq. 49 matrix
    v = np.array([1.0, 2.0])
    got = M.output_covariance(mu, np.tile(np.outer(v, v), (20, 1, 1)))
    centred = mu - mu.mean(axis=0)
    np.testing.assert_allclose(got, got.T)
    np.testing.assert_allclose(got, centred.T @ centred / 20 + np.outer(v, v))


def test_nll_overflow_from_tiny_std_names_the_standardised_error():
    """With errors near 0.1 and y_std = 1e-200 the NLL overflows; the message
    said only "largest |y_true| = 1", about targets of ordinary size."""
    with pytest.raises(ValueError, match=r"NLL overflowed float64 \(largest \|y_true - y_mean\| "
                                         r"/ y_std = 1e\+199, smallest y_std = 1e-200.*too "
                                         r"small for the errors"):
        M.gaussian_nll([1.0, 0.5], [0.9, 0.4], [1e-200, 1e-200])


def test_crps_with_a_subnormal_std_is_quiet():
    """0.5 * 5e-324 is 0: z = inf gives the right limit |y - mu|, but a
    divide-by-zero RuntimeWarning leaked to the caller."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = M.crps_gaussian([1.0, 0.5], [0.9, 0.4], [5e-324, 5e-324])
    assert got == pytest.approx(0.1, rel=1e-12)
