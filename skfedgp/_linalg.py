"""Dense linear algebra helpers: jittered Cholesky, triangular solves,
reverse-mode differentiation through the Cholesky factor, the softplus
transform used for every positive parameter, and BLAS routines callable from
compiled (Numba) code without the GIL.

The row groups, thread pool and BLAS thread control that run every
``n``-sized computation live in :mod:`skfedgp._parallel`.

docs/maths.md ("Kernels", "Client ELBO term"); Murray (2016),
"Differentiation of the Cholesky decomposition", arXiv:1602.07527.
"""

from __future__ import annotations

import llvmlite.binding as _llvm
import numpy as np
from numba import njit
from numba import types as _nbt
from numba.extending import get_cython_function_address
from scipy.special import expit as _expit

__all__ = [
    "CholeskyError",
    "nonnegative_variance",
    "jittered_cholesky",
    "solve_lower",
    "solve_upper",
    "cholesky_backward",
    "cholesky_inverse",
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
        is relative (docs/maths.md: ``1e-6 * var``).
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
    if not all_finite(K):
        raise CholeskyError(
            f"{name}{where} contains NaN or inf; cannot factorise",
            matrix=name,
            client=client,
        )
    m = K.shape[0]
    eps = jitter * float(scale)
    K = np.ascontiguousarray(K)
    A = np.empty((m, m))
    for _ in range(max_tries):
        # the lower triangle of K plus eps on the diagonal, factorised in
        # place by LAPACK dpotrf (which reads only that triangle), called
        # from Numba without the GIL
        if _nb_shifted_potrf(K, A, eps) == 0:
            return A, eps
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


#: Relative size (to the prior variance) below which a negative predictive
#: variance counts as round-off and is set to 0 (:func:`nonnegative_variance`).
VARIANCE_ROUNDOFF = 1e-6


def all_finite(*arrays):
    """Whether every entry of every array is finite.

    A compiled loop over the float arrays (no boolean temporary and no
    floating-point state to switch, which matters for the many small
    matrices of a federation: about 1 microsecond per call against 25 for
    a NumPy sum under ``np.errstate``); other arrays go through NumPy.

    Parameters
    ----------
    *arrays : array-like
        Any shapes.

    Returns
    -------
    bool
        Raises nothing for numeric input.

    Notes
    -----
    A numerical utility, not from the papers.
    """
    for a in arrays:
        a = np.asarray(a)
        if a.dtype == np.float64 and a.ndim:
            if not _nb_all_finite(a.reshape(-1) if a.flags.c_contiguous else a.ravel()):
                return False
        elif not np.all(np.isfinite(a)):
            return False
    return True


def nonnegative_variance(var, scale, what="predictive variance"):
    """Set round-off negatives of a variance to 0; refuse real negatives.

    A predictive variance ``k(x, x) - q(x, x) + (posterior term)`` is a
    difference of nearly equal numbers where the data pin the function down,
    so it can come out slightly below 0. A value below
    ``-VARIANCE_ROUNDOFF * scale`` is not round-off: the posterior
    covariance (or the model) is broken, and clipping it would hide that.

    Parameters
    ----------
    var : ndarray
        Variances (any shape).
    scale : float or ndarray broadcastable to ``var``
        Prior variance at the same inputs (the size round-off is measured
        against).
    what : str, default="predictive variance"
        Name used in the error message.

    Returns
    -------
    ndarray
        ``var`` with entries in ``[-VARIANCE_ROUNDOFF * scale, 0)`` set to 0.

    Raises
    ------
    FloatingPointError
        If an entry is not finite, or below ``-VARIANCE_ROUNDOFF * scale``.
    """
    var = np.asarray(var, dtype=float)
    scale = np.abs(np.asarray(scale, dtype=float))
    if not np.all(np.isfinite(var)):
        raise FloatingPointError(f"the {what} is not finite")
    bad = var < -VARIANCE_ROUNDOFF * np.maximum(scale, np.finfo(float).tiny)
    if np.any(bad):
        worst = float(var[bad].min())
        raise FloatingPointError(
            f"the {what} is negative ({worst:.3g}, prior variance "
            f"{float(np.max(scale)):.3g}) beyond round-off: the posterior covariance is not "
            "positive semi-definite")
    return np.maximum(var, 0.0)


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
    L = np.ascontiguousarray(L, dtype=float)
    X = np.array(B, dtype=float, order="C", copy=True)
    vec = X.ndim == 1
    # BLAS dtrsm called from Numba without the GIL (see the end of this module)
    _nb_trsm_c(L, X[:, None] if vec else X, False, bool(trans))
    return X


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
    L = np.ascontiguousarray(L, dtype=float)
    X = np.array(B, dtype=float, order="C", copy=True)
    _nb_trsm_c(L, X, True, False)
    return X


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
    docs/maths.md).
    """
    Lbar = np.array(Lbar, dtype=float, order="C", copy=True)
    _nb_phi_lower(Lbar, 1.0)
    P = L.T @ Lbar
    _nb_phi_lower(P, 0.5)
    S = solve_lower(L, solve_upper(L, P), trans=True)
    return 0.5 * (S + S.T)


def cholesky_inverse(L):
    """``K^{-1}`` from the lower Cholesky factor ``L`` of ``K`` (LAPACK ``dpotri``).

    One call in place of two triangular solves against the identity.

    Parameters
    ----------
    L : ndarray of shape (m, m)
        Lower Cholesky factor of a symmetric positive definite ``K`` (only
        its lower triangle is read).

    Returns
    -------
    ndarray of shape (m, m)
        ``K^{-1}``, exactly symmetric.

    Raises
    ------
    numpy.linalg.LinAlgError
        If ``L`` has a zero on its diagonal (not a Cholesky factor).
    """
    from scipy.linalg import lapack

    inv, info = lapack.dpotri(L, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"dpotri failed (info={info})")
    # the lower triangle mirrored into the upper one, in place (was two np.tril
    # copies and a transposed add: the same numbers, without three temporaries)
    _nb_mirror_lower(inv)
    return inv.T  # symmetric: the C-ordered view holds the same numbers


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
    return _expit(np.asarray(t, dtype=float))  # accurate for large negative t


# ---------------------------------------------------------------------------
# BLAS callable from Numba code, without the GIL
# ---------------------------------------------------------------------------
# SciPy's f2py BLAS wrappers (scipy.linalg.blas) hold the GIL during the call
# (measured: two threads calling dsyrk took twice as long as one), so worker
# threads running them do not run in parallel.  The same routines of SciPy's
# OpenBLAS are called here through ``scipy.linalg.cython_blas`` from
# ``nogil`` Numba functions.  The symbols are registered under fixed names so
# that the compiled functions can be cached on disk (a ctypes pointer would be
# baked into the machine code).  BLAS integers of cython_blas are C ints.

for _mod, _name in (
    ("cython_blas", "dsyrk"),
    ("cython_blas", "dgemm"),
    ("cython_blas", "dgemv"),
    ("cython_blas", "dtrsm"),
    ("cython_lapack", "dpotrf"),
):
    _llvm.add_symbol(
        "skfedgp_" + _name,
        get_cython_function_address("scipy.linalg." + _mod, _name),
    )
_VP = _nbt.voidptr
_dsyrk = _nbt.ExternalFunction("skfedgp_dsyrk", _nbt.void(*([_VP] * 10)))
_dgemm = _nbt.ExternalFunction("skfedgp_dgemm", _nbt.void(*([_VP] * 13)))
_dgemv = _nbt.ExternalFunction("skfedgp_dgemv", _nbt.void(*([_VP] * 11)))
_dtrsm = _nbt.ExternalFunction("skfedgp_dtrsm", _nbt.void(*([_VP] * 11)))
_dpotrf = _nbt.ExternalFunction("skfedgp_dpotrf", _nbt.void(*([_VP] * 5)))
_CHAR_N = ord("N")
_CHAR_T = ord("T")
_CHAR_U = ord("U")
_CHAR_L = ord("L")
_CHAR_R = ord("R")


@njit(nogil=True, cache=True)
def _nb_all_finite(a):  # pragma: no cover - compiled
    for i in range(a.shape[0]):
        if not np.isfinite(a[i]):
            return False
    return True


@njit(nogil=True, cache=True)
def _nb_trsm_c(L, B, right, trans):  # pragma: no cover - compiled
    # In place on C-ordered B: right=False: B := L^{-1} B (or L^{-T} B if
    # trans), B of shape (m, k); right=True: B := B L^{-1}, B of shape (k, m).
    # Fortran views: L is L^T (upper), B is B^T.
    m = L.shape[0]
    if B.size == 0 or m == 0:
        return
    uplo = np.array([_CHAR_U], dtype=np.uint8)
    diag = np.array([_CHAR_N], dtype=np.uint8)
    one = np.array([1.0])
    mm = np.array([m], dtype=np.int32)
    if right:
        # X L = B  <=>  L^T X^T = B^T: left side, upper, no transpose
        k = B.shape[0]
        side = np.array([_CHAR_L], dtype=np.uint8)
        ta = np.array([_CHAR_N], dtype=np.uint8)
        kk = np.array([k], dtype=np.int32)
        _dtrsm(side.ctypes, uplo.ctypes, ta.ctypes, diag.ctypes, mm.ctypes, kk.ctypes,
               one.ctypes, L.ctypes, mm.ctypes, B.ctypes, mm.ctypes)
    else:
        # L X = B  <=>  X^T L^T = B^T: right side, upper, no transpose;
        # L^T X = B  <=>  X^T L = B^T: right side, upper, transposed
        k = B.shape[1]
        side = np.array([_CHAR_R], dtype=np.uint8)
        ta = np.array([_CHAR_T if trans else _CHAR_N], dtype=np.uint8)
        kk = np.array([k], dtype=np.int32)
        _dtrsm(side.ctypes, uplo.ctypes, ta.ctypes, diag.ctypes, kk.ctypes, mm.ctypes,
               one.ctypes, L.ctypes, mm.ctypes, B.ctypes, kk.ctypes)


@njit(nogil=True, cache=True)
def _nb_potrf_c(A):  # pragma: no cover - compiled
    # In place on a C-ordered symmetric A: its lower triangle becomes the
    # lower Cholesky factor (LAPACK 'U' on the Fortran view A^T = A), the
    # strict upper triangle is zeroed.  Returns LAPACK's info.
    m = A.shape[0]
    if m == 0:
        return 0
    uplo = np.array([_CHAR_U], dtype=np.uint8)
    mm = np.array([m], dtype=np.int32)
    info = np.zeros(1, dtype=np.int32)
    _dpotrf(uplo.ctypes, mm.ctypes, A.ctypes, mm.ctypes, info.ctypes)
    for i in range(m):
        for j in range(i + 1, m):
            A[i, j] = 0.0
    return info[0]


@njit(nogil=True, cache=True)
def _nb_shifted_potrf(K, A, eps):  # pragma: no cover - compiled
    # A := lower Cholesky factor of (lower triangle of K) + eps I, zeros
    # above the diagonal; returns LAPACK's info (0: success)
    m = K.shape[0]
    for i in range(m):
        for j in range(i + 1):
            A[i, j] = K[i, j]
        A[i, i] += eps
    return _nb_potrf_c(A)


@njit(nogil=True, cache=True)
def _nb_mirror_lower(A):  # pragma: no cover - compiled
    # In place: A[i, j] = A[j, i] for j > i (the strict lower triangle copied
    # to the strict upper one)
    m = A.shape[0]
    for j in range(m):
        for i in range(j + 1, m):
            A[j, i] = A[i, j]


@njit(nogil=True, cache=True)
def _nb_phi_lower(A, diag):  # pragma: no cover - compiled
    # In place: zero the strict upper triangle and multiply the diagonal by diag
    m = A.shape[0]
    for i in range(m):
        A[i, i] *= diag
        for j in range(i + 1, m):
            A[i, j] = 0.0


@njit(nogil=True, cache=True)
def nb_gram_acc(K, G):  # pragma: no cover - compiled
    """``G += K^T K`` on the lower triangle of C-ordered ``G`` (m x m); ``K`` (h x m) C-ordered.

    One BLAS ``dsyrk``; the strict upper triangle of ``G`` is not touched.
    """
    h, m = K.shape
    if h == 0 or m == 0:
        return
    # Fortran view: K is K^T (m x h), G is G^T; C := A A^T + C on the upper
    # triangle of the Fortran view = lower triangle of the C-ordered G
    uplo = np.array([_CHAR_U], dtype=np.uint8)
    trans = np.array([_CHAR_N], dtype=np.uint8)
    mm = np.array([m], dtype=np.int32)
    hh = np.array([h], dtype=np.int32)
    one = np.array([1.0])
    _dsyrk(uplo.ctypes, trans.ctypes, mm.ctypes, hh.ctypes, one.ctypes, K.ctypes,
           mm.ctypes, one.ctypes, G.ctypes, mm.ctypes)


@njit(nogil=True, cache=True)
def nb_matmul_into(A, B, out):  # pragma: no cover - compiled
    """``out[:] = A @ B`` for C-ordered ``A`` (h x k), ``B`` (k x m), ``out`` (h x m); BLAS dgemm."""
    h, k = A.shape
    m = B.shape[1]
    if h == 0 or m == 0:
        return
    if k == 0:
        out[:] = 0.0
        return
    # Fortran view: out^T (m x h) = B^T (m x k) A^T (k x h)
    nt = np.array([_CHAR_N], dtype=np.uint8)
    mm = np.array([m], dtype=np.int32)
    hh = np.array([h], dtype=np.int32)
    kk = np.array([k], dtype=np.int32)
    one = np.array([1.0])
    zero = np.array([0.0])
    _dgemm(nt.ctypes, nt.ctypes, mm.ctypes, hh.ctypes, kk.ctypes, one.ctypes, B.ctypes,
           mm.ctypes, A.ctypes, kk.ctypes, zero.ctypes, out.ctypes, mm.ctypes)


@njit(nogil=True, cache=True)
def nb_gemv_acc(A, x, y, alpha, transpose):  # pragma: no cover - compiled
    """``y += alpha * A @ x`` (or ``A.T @ x`` if ``transpose``) for C-ordered ``A``; BLAS dgemv."""
    h, m = A.shape
    if h == 0 or m == 0:
        return
    # Fortran view of A is A^T (m x h): A^T x is 'N', A x is 'T'
    tr = np.array([_CHAR_N if transpose else _CHAR_T], dtype=np.uint8)
    mm = np.array([m], dtype=np.int32)
    hh = np.array([h], dtype=np.int32)
    one_i = np.array([1], dtype=np.int32)
    al = np.array([alpha])
    one = np.array([1.0])
    _dgemv(tr.ctypes, mm.ctypes, hh.ctypes, al.ctypes, A.ctypes, mm.ctypes, x.ctypes,
           one_i.ctypes, one.ctypes, y.ctypes, one_i.ctypes)
