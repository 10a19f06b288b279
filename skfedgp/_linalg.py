"""Dense linear algebra helpers: jittered Cholesky, triangular solves,
reverse-mode differentiation through the Cholesky factor, the softplus
transform used for every positive parameter, and the row-parallel executor
of every ``n``-sized computation.

Row-parallel execution
----------------------
Every product with an ``n``-sized dimension (kernel matrix, Gram matrix,
kernel-gradient contraction) runs over a *fixed* partition of the rows into
at most :data:`MAX_ROW_GROUPS` contiguous groups, each processed sequentially
in chunks of :data:`CHUNK_ROWS` rows by one thread with single-threaded BLAS;
the per-group partial sums are added in group order.  Why (measured with
``benchmarks/bench_elbo.py`` on a 2-core machine):

* NumPy and SciPy wheels each bundle their own OpenBLAS, each with its own
  pool of spinning threads, and Numba's parallel layer has a third.  Mixing
  them on 2 cores made one ELBO + gradient evaluation 17x slower than one
  ``W^T W`` product although its parts add up to ~5x.  Inside
  :func:`map_row_groups` there is exactly one compute thread per core and no
  BLAS or Numba pool runs.
* A chunk of 256 rows of the ``n x M`` matrices stays in the core's cache
  while the kernel, Gram, product and contraction steps reuse it, and no
  ``n x M`` array is ever needed by a fused pass (memory ``O(chunk x M)``).
* The partition depends only on ``n`` (never on the thread count) and each
  group's sums are accumulated in a fixed order, so the results are bitwise
  identical whatever the number of threads (``NUMBA_NUM_THREADS``,
  ``numba.set_num_threads``, joblib / loky limits).

docs/maths.md ("Kernels", "Client ELBO term"); Murray (2016),
"Differentiation of the Cholesky decomposition", arXiv:1602.07527.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

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
    "CHUNK_ROWS",
    "MAX_ROW_GROUPS",
    "row_groups",
    "row_chunks",
    "map_row_groups",
    "parallel_map",
    "single_threaded_blas",
    "n_workers",
    "workers_for",
    "PARALLEL_MIN_FLOPS",
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
# Row-parallel execution (see the module docstring)
# ---------------------------------------------------------------------------

#: Rows per chunk of the row-parallel passes.  256 rows of a 256-column
#: float64 matrix are 512 KiB: two of them fit a core's L2 cache, and a BLAS
#: product with an inner dimension of 256 still runs at full speed.
CHUNK_ROWS = 256
#: Largest number of row groups.  Fixed so that the reduction order does not
#: depend on the thread count; 16 balances up to ~8 threads.
MAX_ROW_GROUPS = 16


def row_groups(n, *, chunk_rows=CHUNK_ROWS, max_groups=MAX_ROW_GROUPS):
    """Fixed partition of ``range(n)`` into contiguous row groups.

    Parameters
    ----------
    n : int
        Number of rows.
    chunk_rows : int, default=CHUNK_ROWS
        Group boundaries fall on multiples of this.
    max_groups : int, default=MAX_ROW_GROUPS
        Largest number of groups.

    Returns
    -------
    groups : list of (int, int)
        ``(start, stop)`` pairs covering ``range(n)`` in order; a single
        ``(0, n)`` group when ``n <= chunk_rows``.  Depends only on the
        arguments, never on the thread count.
    """
    n = int(n)
    n_chunks = max(1, -(-n // chunk_rows))
    g = min(max_groups, n_chunks)
    return [
        ((k * n_chunks // g) * chunk_rows, min(((k + 1) * n_chunks // g) * chunk_rows, n))
        for k in range(g)
    ]


def row_chunks(start, stop, *, chunk_rows=CHUNK_ROWS):
    """``(a, b)`` pairs splitting ``range(start, stop)`` into chunks of ``chunk_rows``."""
    return [(a, min(a + chunk_rows, stop)) for a in range(start, stop, chunk_rows)]


_BLAS_LOCK = threading.Lock()
_BLAS_STATE = {"controllers": None, "depth": 0, "saved": None}


def _blas_controllers():
    """threadpoolctl controllers of every loaded BLAS (NumPy's and SciPy's)."""
    ctrls = _BLAS_STATE["controllers"]
    if ctrls is None:
        try:
            from threadpoolctl import ThreadpoolController

            ctrls = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:  # pragma: no cover - threadpoolctl missing or broken
            ctrls = []
        _BLAS_STATE["controllers"] = ctrls
    return ctrls


@contextmanager
def single_threaded_blas():
    """Limit every loaded BLAS (NumPy's and SciPy's OpenBLAS) to one thread.

    Re-entrant and safe to enter from several threads at once: the first
    entrant saves the thread counts, the last one to leave restores them.
    Setting the limit costs about 2 microseconds per library.

    Notes
    -----
    Uses ``threadpoolctl`` (a scikit-learn dependency).  Besides speed, the
    limit makes results reproducible: OpenBLAS' threaded Cholesky
    (``dpotrf``, M >= 128) and long dot products give different last bits
    with 1 and 2 threads (measured; ``syrk``, ``gemm``, ``gemv`` and ``trsm``
    did not), and joblib's loky workers run with 1 BLAS thread while the
    main process has all of them.  threadpoolctl >= 3.6 lets only the first
    Python thread that changed a limit change OpenBLAS' process-wide thread
    count again; since this context must work in any thread (dask and
    threading-backend workers), it uses threadpoolctl's unrestricted setter
    when there is one, inside its own reference-counted window.
    """
    ctrls = _blas_controllers()
    with _BLAS_LOCK:
        if _BLAS_STATE["depth"] == 0:
            _BLAS_STATE["saved"] = [c.num_threads for c in ctrls]
            for c in ctrls:
                _set_blas_threads(c, 1)
        _BLAS_STATE["depth"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_STATE["depth"] -= 1
            if _BLAS_STATE["depth"] == 0:
                for c, k in zip(ctrls, _BLAS_STATE["saved"]):
                    if k is not None:
                        _set_blas_threads(c, k)


def _set_blas_threads(ctrl, k):
    setter = getattr(ctrl, "_real_set_num_threads", None) or ctrl.set_num_threads
    setter(k)


def n_workers():
    """Number of threads :func:`map_row_groups` uses: Numba's thread count.

    Follows ``NUMBA_NUM_THREADS`` and ``numba.set_num_threads`` (so also the
    limits joblib's loky backend puts on its worker processes).
    """
    try:
        import numba

        return max(1, int(numba.get_num_threads()))
    except Exception:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


#: Estimated floating-point work below which the row-parallel helpers stay
#: in the calling thread: handing work to another thread costs tens of
#: microseconds, and on a busy machine it waits for a free core.
PARALLEL_MIN_FLOPS = 4e6


def workers_for(flops):
    """Thread count for a job of about ``flops`` operations.

    1 below :data:`PARALLEL_MIN_FLOPS`, else None (all of :func:`n_workers`).
    The choice changes only the speed: results never depend on it.
    """
    return 1 if flops < PARALLEL_MIN_FLOPS else None


_POOL = {"executor": None, "size": 0}
_POOL_LOCK = threading.Lock()
_IN_WORKER = threading.local()


def _reset_pool_after_fork():  # pragma: no cover - runs in forked children
    global _POOL_LOCK, _BLAS_LOCK
    _POOL["executor"] = None
    _POOL["size"] = 0
    _POOL_LOCK = threading.Lock()
    _BLAS_LOCK = threading.Lock()
    _BLAS_STATE["depth"] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)


def _executor(size):
    with _POOL_LOCK:
        if _POOL["executor"] is None or _POOL["size"] < size:
            old = _POOL["executor"]
            _POOL["executor"] = ThreadPoolExecutor(
                max_workers=size, thread_name_prefix="skfedgp-rows"
            )
            _POOL["size"] = size
            if old is not None:
                old.shutdown(wait=False)
        return _POOL["executor"]


def map_row_groups(func, groups, *, workers=None, reduce=None):
    """Apply ``func(start, stop)`` to every row group, in parallel threads.

    Parameters
    ----------
    func : callable
        ``func(start, stop)``; must release the GIL for its heavy parts
        (BLAS calls, ``nogil`` Numba functions, NumPy ufuncs) and must not
        write to memory that another group reads.
    groups : list of (int, int)
        Usually :func:`row_groups` ``(n)``.
    workers : int, optional
        Thread count; default :func:`n_workers`.  The calling thread is one
        of them.  Called from inside a worker, runs sequentially.
    reduce : callable, optional
        Called with each group's result in group order as soon as possible
        (see :func:`parallel_map`); the results are then not kept.

    Returns
    -------
    results : list or None
        ``func``'s results in the order of ``groups`` (independent of the
        thread count and of scheduling); None with ``reduce``.

    Notes
    -----
    BLAS is limited to one thread (:func:`single_threaded_blas`) while the
    groups run, so that there is one compute thread per core.  The first
    exception raised by ``func`` is re-raised after all threads stopped.
    """
    return parallel_map(lambda ab: func(*ab), groups, workers=workers, reduce=reduce)


def parallel_map(func, items, *, workers=None, reduce=None):
    """``[func(item) for item in items]`` computed by up to ``workers`` threads.

    The engine of :func:`map_row_groups` (see there); also used to process
    independent blocks at once.  Items are handed out dynamically; BLAS is
    single-threaded meanwhile.

    Parameters
    ----------
    func : callable
        Applied to each item.
    items : iterable
    workers : int, optional
        Thread count (the calling thread included); default :func:`n_workers`.
    reduce : callable, optional
        If given, ``reduce(result)`` is called for each result strictly in
        the order of ``items`` as soon as all earlier ones are reduced (under
        a lock), and the results are not kept: partial sums are then freed
        as the work proceeds, and their reduction order never depends on
        the thread count or the scheduling.

    Returns
    -------
    results : list or None
        ``func``'s results in the order of ``items``; None with ``reduce``.
    """
    items = list(items)
    k = min(workers or n_workers(), len(items))
    with single_threaded_blas():
        if k <= 1 or getattr(_IN_WORKER, "flag", False):
            if reduce is None:
                return [func(it) for it in items]
            for it in items:
                reduce(func(it))
            return None
        results = [None] * len(items)
        lock = threading.Lock()
        merge_lock = threading.Lock()
        state = {"next": 0, "error": None, "merged": 0}
        pending = {}

        def work():
            _IN_WORKER.flag = True
            try:
                while True:
                    with lock:
                        i = state["next"]
                        if i >= len(items) or state["error"] is not None:
                            return
                        state["next"] = i + 1
                    try:
                        res = func(items[i])
                        if reduce is None:
                            results[i] = res
                            continue
                        with merge_lock:
                            pending[i] = res
                            del res
                            while state["merged"] in pending:
                                reduce(pending.pop(state["merged"]))
                                state["merged"] += 1
                    except BaseException as exc:  # noqa: BLE001 - re-raised below
                        with lock:
                            if state["error"] is None:
                                state["error"] = exc
                        return
            finally:
                _IN_WORKER.flag = False

        pool = _executor(k - 1)
        futures = [pool.submit(work) for _ in range(k - 1)]
        work()
        for f in futures:
            f.result()
        if state["error"] is not None:
            raise state["error"]
        return None if reduce is not None else results


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
