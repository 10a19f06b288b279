"""Tests of skfedgp._linalg: jittered Cholesky with escalation, triangular
solves, reverse mode through the Cholesky factor and the softplus transform
(SPEC section 1, "Kernels" and "Client ELBO term"; Murray 2016)."""

import numpy as np
import pytest

from skfedgp._linalg import (
    DEFAULT_JITTER,
    MAX_JITTER_TRIES,
    CholeskyError,
    cholesky_backward,
    gram,
    jittered_cholesky,
    sigmoid,
    softplus,
    softplus_inv,
    solve_lower,
    solve_upper,
)
from skfedgp.kernels import se_ard


def _spd(rng, m):
    A = rng.normal(size=(m, m))
    return A @ A.T + m * np.eye(m)


def test_jittered_cholesky_factorises_with_relative_jitter(rng):
    K = _spd(rng, 6)
    L, jit = jittered_cholesky(K, scale=2.5)
    assert jit == pytest.approx(DEFAULT_JITTER * 2.5, rel=1e-15)
    assert np.array_equal(L, np.tril(L)), "factor must be lower triangular"
    assert L.flags.c_contiguous
    np.testing.assert_allclose(L @ L.T, K + jit * np.eye(6), rtol=1e-13, atol=1e-13)


def test_duplicated_inducing_points_still_factorise(rng):
    Z = rng.normal(size=(6, 2))
    Z = np.vstack([Z, Z[:3]])  # three duplicated rows: K_zz is singular
    var = 1.4
    K = se_ard(Z, Z, np.array([0.9, 1.2]), var)
    assert np.linalg.matrix_rank(K, tol=1e-10) < K.shape[0]
    L, jit = jittered_cholesky(K, scale=var, name="K_zz (global)", client="A")
    assert np.all(np.isfinite(L)) and np.all(np.diag(L) > 0)
    assert DEFAULT_JITTER * var <= jit <= DEFAULT_JITTER * 10 ** (MAX_JITTER_TRIES - 1) * var
    np.testing.assert_allclose(L @ L.T, K + jit * np.eye(K.shape[0]), atol=1e-12)


def test_jitter_escalates_tenfold_until_success(rng):
    # Singular PSD matrix shifted down by 5e-6: the first jitter (1e-6) is not
    # enough, the second (1e-5) is.
    Z = rng.normal(size=(4, 2))
    Z = np.vstack([Z, Z[:2]])
    K = se_ard(Z, Z, 1.0, 1.0) - 5e-6 * np.eye(6)
    assert np.linalg.eigvalsh(K).min() < -DEFAULT_JITTER
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(K + DEFAULT_JITTER * np.eye(6))
    L, jit = jittered_cholesky(K, scale=1.0)
    assert jit == pytest.approx(10 * DEFAULT_JITTER, rel=1e-12)
    np.testing.assert_allclose(L @ L.T, K + jit * np.eye(6), atol=1e-12)


def test_nan_matrix_raises_cholesky_error_naming_matrix_and_client():
    K = np.eye(3)
    K[1, 2] = K[2, 1] = np.nan
    with pytest.raises(CholeskyError) as info:
        jittered_cholesky(K, name="K_zz (local)", client="station-7")
    msg = str(info.value)
    assert "K_zz (local)" in msg and "station-7" in msg and "NaN" in msg
    assert info.value.matrix == "K_zz (local)" and info.value.client == "station-7"
    assert isinstance(info.value, np.linalg.LinAlgError)


def test_negative_definite_matrix_raises_after_escalation():
    K = -np.eye(4)
    with pytest.raises(CholeskyError) as info:
        jittered_cholesky(K, scale=1.0, name="K_zz (global)", client=3)
    msg = str(info.value)
    assert "K_zz (global)" in msg and "client 3" in msg
    assert str(MAX_JITTER_TRIES) in msg
    # the largest jitter tried is reported and is the documented limit
    assert info.value.jitter == pytest.approx(DEFAULT_JITTER * 10 ** (MAX_JITTER_TRIES - 1))
    assert isinstance(info.value, np.linalg.LinAlgError)


def test_triangular_solves(rng):
    L = np.linalg.cholesky(_spd(rng, 5))
    B = rng.normal(size=(5, 3))
    np.testing.assert_allclose(L @ solve_lower(L, B), B, atol=1e-12)
    np.testing.assert_allclose(L.T @ solve_lower(L, B, trans=True), B, atol=1e-12)
    b = rng.normal(size=5)
    x = solve_lower(L, b)
    assert x.shape == (5,)
    np.testing.assert_allclose(L @ x, b, atol=1e-12)
    C = rng.normal(size=(4, 5))
    np.testing.assert_allclose(solve_upper(L, C) @ L, C, atol=1e-12)
    A = rng.normal(size=(7, 5))
    np.testing.assert_allclose(gram(A), A.T @ A, rtol=1e-14)


def test_cholesky_backward_finite_differences(rng, numgrad, assert_grad_close):
    m = 5
    K = _spd(rng, m)
    Lbar = np.tril(rng.normal(size=(m, m)))

    def F(K_):
        K_ = 0.5 * (K_ + K_.T)
        return float(np.sum(Lbar * np.linalg.cholesky(K_)))

    Kbar = cholesky_backward(np.linalg.cholesky(K), Lbar)
    np.testing.assert_allclose(Kbar, Kbar.T, rtol=0, atol=1e-14)
    # F depends on K only through its symmetric part, so each entry's
    # derivative is the symmetric sensitivity Kbar.
    assert_grad_close(Kbar, numgrad(F, K), "cholesky_backward Kbar")
    # along a random symmetric direction: dF = sum(Kbar * dK)
    E = rng.normal(size=(m, m))
    E = E + E.T
    h = 1e-6
    fd = (F(K + h * E) - F(K - h * E)) / (2 * h)
    assert abs(fd - np.sum(Kbar * E)) < 1e-6 * max(abs(fd), 1.0)


def test_cholesky_backward_ignores_upper_triangle_of_lbar(rng):
    L = np.linalg.cholesky(_spd(rng, 4))
    Lbar = rng.normal(size=(4, 4))
    np.testing.assert_array_equal(cholesky_backward(L, Lbar), cholesky_backward(L, np.tril(Lbar)))


def test_softplus_transform():
    t = np.array([-40.0, -3.0, 0.0, 2.0, 50.0])
    theta = softplus(t)
    np.testing.assert_allclose(theta, np.log1p(np.exp(t)), rtol=1e-14)
    np.testing.assert_allclose(softplus_inv(theta[1:]), t[1:], rtol=1e-12)
    # derivative of softplus is sigmoid
    h = 1e-6
    np.testing.assert_allclose((softplus(t + h) - softplus(t - h)) / (2 * h), sigmoid(t), atol=1e-9)
    with pytest.raises(ValueError, match="positive"):
        softplus_inv(np.array([1.0, -1.0]))


def test_sigmoid_relative_accuracy_for_negative_arguments():
    # sigmoid is the chain-rule factor of every softplus-transformed
    # parameter; for small parameters (phi -> 0, lengthscales or noise near
    # their floor) t is very negative and sigmoid(t) ~ exp(t) must keep its
    # relative accuracy, otherwise the gradient is wrong (or exactly 0, so the
    # parameter can never move).
    t = np.array([-40.0, -20.0, -3.0, 0.0, 2.0, 50.0])
    expected = np.exp(-np.logaddexp(0.0, -t))  # 1 / (1 + exp(-t)), stable
    np.testing.assert_allclose(sigmoid(t), expected, rtol=1e-12, atol=0)


def test_nonnegative_variance_clips_round_off_and_refuses_real_negatives():
    from skfedgp._linalg import VARIANCE_ROUNDOFF, nonnegative_variance

    v = np.array([1.0, 0.0, -0.5 * VARIANCE_ROUNDOFF * 2.0])
    np.testing.assert_array_equal(nonnegative_variance(v, 2.0), [1.0, 0.0, 0.0])
    with pytest.raises(FloatingPointError, match="negative .* beyond round-off"):
        nonnegative_variance(np.array([1.0, -1e-3]), 2.0)
    with pytest.raises(FloatingPointError, match="not finite"):
        nonnegative_variance(np.array([1.0, np.nan]), 2.0)


def test_all_finite_finds_every_non_finite_entry_in_any_layout():
    from skfedgp._linalg import all_finite

    rng = np.random.default_rng(0)
    A = rng.normal(size=(7, 5))
    assert all_finite(A, A.T, A[:, ::2], A[0], 1.0, np.arange(3))
    # finite entries whose sum overflows are finite
    assert all_finite(np.full((2, 3), 1e308))
    for bad in (np.nan, np.inf, -np.inf):
        for i, j in [(0, 0), (3, 2), (6, 4)]:
            B = A.copy()
            B[i, j] = bad
            assert not all_finite(B)
            assert not all_finite(A, B.T)  # F-ordered view
            assert all_finite(B[:, [c for c in range(5) if c != j]])
            assert not all_finite(B[:, j::1])
        assert not all_finite(bad)
        assert not all_finite(np.array([1.0, bad], dtype=np.float32))
