"""Row groups, the thread pool and BLAS thread control.

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
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

__all__ = [
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
