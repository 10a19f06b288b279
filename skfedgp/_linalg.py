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

SPEC section 1 ("Kernels", "Client ELBO term"); Murray (2016),
"Differentiation of the Cholesky decomposition", arXiv:1602.07527.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
from scipy.linalg import blas as _blas
from scipy.special import expit as _expit
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
    "CHUNK_ROWS",
    "MAX_ROW_GROUPS",
    "row_groups",
    "row_chunks",
    "map_row_groups",
    "single_threaded_blas",
    "n_workers",
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
    Uses ``threadpoolctl`` (a scikit-learn dependency).  threadpoolctl lets
    only one Python thread at a time change OpenBLAS' process-wide thread
    count; called from another thread this context does nothing, which
    changes only the speed, never the results of :func:`map_row_groups`
    callers (each BLAS call there has a fixed operand size and OpenBLAS
    splits level-3 products over the output, not over the summation).
    """
    ctrls = _blas_controllers()
    with _BLAS_LOCK:
        if _BLAS_STATE["depth"] == 0:
            _BLAS_STATE["saved"] = [c.num_threads for c in ctrls]
            for c in ctrls:
                c.set_num_threads(1)
        _BLAS_STATE["depth"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_STATE["depth"] -= 1
            if _BLAS_STATE["depth"] == 0:
                for c, k in zip(ctrls, _BLAS_STATE["saved"]):
                    if k is not None:
                        c.set_num_threads(k)


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


def map_row_groups(func, groups, *, workers=None):
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

    Returns
    -------
    results : list
        ``func``'s results in the order of ``groups`` (independent of the
        thread count and of scheduling).

    Notes
    -----
    BLAS is limited to one thread (:func:`single_threaded_blas`) while the
    groups run, so that there is one compute thread per core.  The first
    exception raised by ``func`` is re-raised after all threads stopped.
    """
    groups = list(groups)
    k = min(workers or n_workers(), len(groups))
    with single_threaded_blas():
        if k <= 1 or getattr(_IN_WORKER, "flag", False):
            return [func(a, b) for a, b in groups]
        results = [None] * len(groups)
        lock = threading.Lock()
        state = {"next": 0, "error": None}

        def work():
            _IN_WORKER.flag = True
            try:
                while True:
                    with lock:
                        i = state["next"]
                        if i >= len(groups) or state["error"] is not None:
                            return
                        state["next"] = i + 1
                    try:
                        results[i] = func(*groups[i])
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
        return results
