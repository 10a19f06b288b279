"""Dense linear algebra helpers: jittered Cholesky, triangular solves,
reverse-mode differentiation through the Cholesky factor, and the softplus
transform used for every positive parameter.

SPEC section 1 ("Kernels", "Client ELBO term"); Murray (2016),
"Differentiation of the Cholesky decomposition", arXiv:1602.07527.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas as _blas
from scipy.linalg import lapack as _lapack

__all__ = [
    "CholeskyError",
    "jittered_cholesky",
    "solve_lower",
    "solve_upper",
    "cholesky_backward",
    "gram",
    "softplus",
    "softplus_inv",
    "sigmoid",
    "DEFAULT_JITTER",
    "MAX_JITTER_TRIES",
]

#: Relative jitter added to every ``K_zz`` before the Cholesky factorisation.
DEFAULT_JITTER = 1e-6
#: Number of tries: the jitter is multiplied by 10 after each failure, so the
#: largest jitter tried is ``DEFAULT_JITTER * 10**(MAX_JITTER_TRIES - 1)``
#: times the kernel variance (1e-1 with the defaults).
MAX_JITTER_TRIES = 6


class CholeskyError(np.linalg.LinAlgError):
    """A Cholesky factorisation failed even after jitter escalation.

    Attributes
    ----------
    matrix : str
        Name of the matrix (for example ``"K_zz (global)"``).
    client : hashable or None
        Client whose matrix failed, when known.
    jitter : float
        Largest absolute jitter tried.
    """

    def __init__(self, message, *, matrix="matrix", client=None, jitter=float("nan")):
        super().__init__(message)
        self.matrix = matrix
        self.client = client
        self.jitter = jitter


def jittered_cholesky(
    K,
    *,
    scale=1.0,
    jitter=DEFAULT_JITTER,
    max_tries=MAX_JITTER_TRIES,
    name="K_zz",
    client=None,
):
    """Lower Cholesky factor of ``K + jitter * scale * I`` with escalation.

    Parameters
    ----------
    K : ndarray of shape (m, m)
        Symmetric matrix (only the lower triangle is read).
    scale : float, default=1.0
        Scale of the jitter, normally the kernel variance, so that the jitter
        is relative (SPEC section 1: ``1e-6 * var``).
    jitter : float, default=1e-6
        First relative jitter; multiplied by 10 after each failure.
    max_tries : int, default=6
        Number of attempts before giving up.
    name : str, default="K_zz"
        Name of the matrix, used in the error message.
    client : hashable, optional
        Client owning the matrix, used in the error message.

    Returns
    -------
    L : ndarray of shape (m, m)
        Lower-triangular factor, C-contiguous, zeros above the diagonal.
    used_jitter : float
        Absolute jitter added to the diagonal.

    Raises
    ------
    CholeskyError
        If ``K`` holds non-finite values, or the factorisation fails for every
        jitter up to ``jitter * 10**(max_tries-1) * scale``. The message names
        the matrix and the client.
    """
    K = np.asarray(K, dtype=float)
    where = f" of client {client!r}" if client is not None else ""
    if not np.all(np.isfinite(K)):
        raise CholeskyError(
            f"{name}{where} contains NaN or inf; cannot factorise",
            matrix=name,
            client=client,
        )
    m = K.shape[0]
    eps = jitter * float(scale)
    for _ in range(max_tries):
        A = K.copy(order="F")
        A.flat[:: m + 1] += eps
        c, info = _lapack.dpotrf(A, lower=1, clean=1, overwrite_a=1)
        if info == 0:
            return np.ascontiguousarray(c), eps
        eps *= 10.0
    eps /= 10.0
    raise CholeskyError(
        f"Cholesky factorisation of {name}{where} failed after {max_tries} tries "
        f"(largest jitter {eps:.3g}); the matrix is not positive definite — "
        "check for duplicated inducing points or extreme hyperparameters",
        matrix=name,
        client=client,
        jitter=eps,
    )


def solve_lower(L, B, *, trans=False):
    """Solve ``L X = B`` (or ``L^T X = B`` if ``trans``) for lower-triangular ``L``.

    Parameters
    ----------
    L : ndarray of shape (m, m)
        Lower-triangular matrix.
    B : ndarray of shape (m,) or (m, k)
        Right-hand side.
    trans : bool, default=False
        Solve with ``L^T`` instead.

    Returns
    -------
    X : ndarray of the shape of ``B``
    """
    B = np.asarray(B, dtype=float)
    vec = B.ndim == 1
    Bm = B[:, None] if vec else B
    X = _blas.dtrsm(1.0, L, Bm, side=0, lower=1, trans_a=1 if trans else 0)
    return X[:, 0] if vec else X


def solve_upper(L, B):
    """Solve ``X L = B`` for lower-triangular ``L`` (right division).

    Parameters
    ----------
    L : ndarray of shape (m, m)
        Lower-triangular matrix.
    B : ndarray of shape (k, m)
        Right-hand side.

    Returns
    -------
    X : ndarray of shape (k, m)
        ``B L^{-1}``.
    """
    return _blas.dtrsm(1.0, L, np.asarray(B, dtype=float), side=1, lower=1)


def gram(A):
    """Return ``A^T A`` for a tall matrix ``A`` of shape (n, m) (symmetric, full)."""
    A = np.asarray(A, dtype=float)
    return A.T @ A


def cholesky_backward(L, Lbar):
    """Reverse-mode derivative through ``L = chol(K)``.

    Parameters
    ----------
    L : ndarray of shape (m, m)
        Lower Cholesky factor of ``K``.
    Lbar : ndarray of shape (m, m)
        ``dF/dL``; only its lower triangle is used.

    Returns
    -------
    Kbar : ndarray of shape (m, m)
        Symmetric ``dF/dK`` such that ``dF = sum(Kbar * dK)`` for symmetric
        perturbations ``dK``.

    Notes
    -----
    ``P = Phi(L^T Lbar)`` (lower triangle, halved diagonal),
    ``S = L^{-T} P L^{-1}``, ``Kbar = (S + S^T) / 2`` (Murray 2016;
    SPEC section 1).
    """
    P = np.tril(L.T @ np.tril(Lbar))
    P.flat[:: P.shape[0] + 1] *= 0.5
    S = solve_lower(L, solve_upper(L, P), trans=True)
    return 0.5 * (S + S.T)


def softplus(t):
    """Softplus ``log(1 + exp(t))``, computed stably; maps R to (0, inf)."""
    t = np.asarray(t, dtype=float)
    return np.logaddexp(0.0, t)


def softplus_inv(theta):
    """Inverse of :func:`softplus` for ``theta > 0``: ``log(expm1(theta))``."""
    theta = np.asarray(theta, dtype=float)
    if np.any(theta <= 0) or not np.all(np.isfinite(theta)):
        raise ValueError(f"softplus_inv needs finite positive values, got {theta}")
    return theta + np.log(-np.expm1(-theta))


def sigmoid(t):
    """Logistic sigmoid, the derivative of :func:`softplus`."""
    t = np.asarray(t, dtype=float)
    return 0.5 * (1.0 + np.tanh(0.5 * t))
