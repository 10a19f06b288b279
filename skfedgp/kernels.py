"""Squared-exponential ARD kernel with analytic gradients.

The kernel (docs/maths.md; pFedHGP paper, section 3.1) is

.. math::

    k(x, x') = \\sigma^2 \\exp\\Big(-\\tfrac12 \\sum_d (x_d - x'_d)^2 / \\ell_d^2\\Big),

with ``variance`` :math:`\\sigma^2` and one ``lengthscale`` :math:`\\ell_d` per
input dimension (in the units of that input).

Two back ends compute the matrix and the gradient contractions

.. math::

    \\partial F/\\partial z_{md} = \\sum_n \\bar K_{nm} K_{nm} (x_{nd} - z_{md}) / \\ell_d^2,\\quad
    \\partial F/\\partial \\ell_d = \\sum_{nm} \\bar K_{nm} K_{nm} (x_{nd} - z_{md})^2 / \\ell_d^3,\\quad
    \\partial F/\\partial \\sigma^2 = \\sum_{nm} \\bar K_{nm} K_{nm} / \\sigma^2,

where :math:`\\bar K = \\partial F / \\partial K` is supplied by the caller:

* ``"numba"``: matrix: the scaled squared distances in a Numba loop (direct
  differences, no cancellation), then NumPy's SIMD ``exp`` in place (Numba
  without Intel SVML calls the scalar libm ``exp`` per entry, which was
  measured about 3x slower); gradient: one fused Numba loop over four rows at
  a time that never stores ``K * Kbar``, let alone an ``n x M x d`` array;
* ``"numpy"``: matrix through the BLAS expansion ``|x|^2 + |z|^2 - 2 x.z``
  of centred inputs; gradient through ``A^T X`` with ``A = K * Kbar`` (one
  chunk-sized temporary, never an ``n x M x d`` array).

Both run over the fixed row partition of :func:`skfedgp._parallel.row_groups`
through :func:`skfedgp._parallel.map_row_groups` (one thread per core, serial
``nogil`` Numba code and single-threaded BLAS inside; see that module for
why), so their results do not depend on the thread count.
``benchmarks/bench_elbo.py`` measures both back ends; :data:`DEFAULT_BACKEND`
holds the faster one: Numba for both (n = 20 000, M = 256, d = 8, 2 cores:
kernel matrix about 0.65x and gradient contraction about 0.55x the NumPy
back end's time).  The Numba code is serial and compiled with ``nogil``:
the parallelism comes from the row groups, not from Numba's own thread
layer (one more thread pool that competed with the two OpenBLAS pools).

The chunk-level building blocks (:class:`_SEPlan`, :class:`_GradAccumulator`,
:func:`_elbo_block_chunk_numba`) are also used by the fused single-pass ELBO
evaluation of :func:`skfedgp._sparse.client_term`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._linalg import nb_gemv_acc, nb_gram_acc, nb_matmul_into
from ._parallel import map_row_groups, row_chunks, row_groups, workers_for

__all__ = [
    "se_ard",
    "se_ard_diag",
    "se_ard_grad",
    "se_ard_grad_sym",
    "DEFAULT_BACKEND",
]

#: Back end used when ``backend=None``: the faster one in
#: ``benchmarks/bench_elbo.py`` (n = 20 000, M = 256, d = 8, 2 cores).
DEFAULT_BACKEND = {"matrix": "numba", "grad": "numba"}

_BACKENDS = ("numba", "numpy")


# ---------------------------------------------------------------------------
# Serial Numba kernels (run inside the row-group worker threads, GIL released)
# ---------------------------------------------------------------------------


@njit(nogil=True, cache=True, error_model="numpy")
def _neg_half_sqdist_numba(Xs, ZsT, out):  # pragma: no cover - compiled
    # out[i, j] = -0.5 * sum_k (Xs[i, k] - ZsT[k, j])^2; Xs, ZsT already
    # divided by the lengthscales.  The inner loop runs over j (contiguous)
    # so that it vectorises.
    n, d = Xs.shape
    m = ZsT.shape[1]
    for i in range(n):
        row = out[i]
        for j in range(m):
            row[j] = 0.0
        for k in range(d):
            xi = Xs[i, k]
            zk = ZsT[k]
            for j in range(m):
                t = xi - zk[j]
                row[j] -= 0.5 * t * t


@njit(nogil=True, cache=True, error_model="numpy")
def _contract_rows_numba(X, ZT, K, B, u, v, gz, glv, gs):  # pragma: no cover
    # With A[i, j] = K[i, j] * (B[i, j] + u[i] * v[j]), accumulate
    #   gz[k, j]  += sum_i A[i, j] (X[i, k] - Z[j, k])
    #   glv[k, j] += sum_i A[i, j] (X[i, k] - Z[j, k])^2
    #   gs[j]     += sum_i A[i, j]
    # Four rows per sweep over (k, j) cut the loads and stores of gz / glv
    # (measured 1.35x faster than two rows, about 2x faster than one); the
    # loops over j are contiguous and vectorise.  Fixed summation order.
    n, d = X.shape
    m = ZT.shape[1]
    a = np.empty((4, m))
    i = 0
    while i + 3 < n:
        for q in range(4):
            Kq = K[i + q]
            Bq = B[i + q]
            uq = u[i + q]
            aq = a[q]
            for j in range(m):
                aq[j] = Kq[j] * (Bq[j] + uq * v[j])
        a0 = a[0]
        a1 = a[1]
        a2 = a[2]
        a3 = a[3]
        for j in range(m):
            gs[j] += (a0[j] + a1[j]) + (a2[j] + a3[j])
        for k in range(d):
            x0 = X[i, k]
            x1 = X[i + 1, k]
            x2 = X[i + 2, k]
            x3 = X[i + 3, k]
            zk = ZT[k]
            gzk = gz[k]
            glk = glv[k]
            for j in range(m):
                z = zk[j]
                t0 = x0 - z
                t1 = x1 - z
                t2 = x2 - z
                t3 = x3 - z
                s0 = a0[j] * t0
                s1 = a1[j] * t1
                s2 = a2[j] * t2
                s3 = a3[j] * t3
                gzk[j] += (s0 + s1) + (s2 + s3)
                glk[j] += (s0 * t0 + s1 * t1) + (s2 * t2 + s3 * t3)
        i += 4
    a0 = a[0]
    while i < n:
        ui = u[i]
        Ki = K[i]
        Bi = B[i]
        for j in range(m):
            p = Ki[j] * (Bi[j] + ui * v[j])
            a0[j] = p
            gs[j] += p
        for k in range(d):
            xi = X[i, k]
            zk = ZT[k]
            gzk = gz[k]
            glk = glv[k]
            for j in range(m):
                t = xi - zk[j]
                s = a0[j] * t
                gzk[j] += s
                glk[j] += s * t
        i += 1


@njit(nogil=True, cache=True, error_model="numpy")
def _elbo_block_chunk_numba(X, ZT, K, r, Pn, v, B, G, ktr, gz, glv, gs, need_grad):  # pragma: no cover
    # One row chunk of one block of the fused ELBO pass
    # (skfedgp._sparse.client_term), without the GIL:
    #   G   += K^T K (lower triangle, BLAS dsyrk)     ktr += K^T r (dgemv)
    #   B    = K Pn (BLAS dgemm, Pn = -P / s2)
    #   contraction of A = K * (B + r v^T) = K * Kbar into gz, glv, gs.
    nb_gram_acc(K, G)
    nb_gemv_acc(K, r, ktr, 1.0, True)
    if need_grad:
        nb_matmul_into(K, Pn, B)
        _contract_rows_numba(X, ZT, K, B, r, v, gz, glv, gs)


@njit(nogil=True, cache=True, error_model="numpy")
def _se_small_numba(X, Z, ell, var, out):  # pragma: no cover - compiled
    # out[i, j] = var * exp(-0.5 * sum_k ((X[i, k] - Z[j, k]) / ell[k])^2):
    # differences, never an expanded square (see _SEPlan.fill)
    n, d = X.shape
    m = Z.shape[0]
    for i in range(n):
        for j in range(m):
            s = 0.0
            for k in range(d):
                t = (X[i, k] - Z[j, k]) / ell[k]
                s += t * t
            out[i, j] = var * np.exp(-0.5 * s)


@njit(nogil=True, cache=True, error_model="numpy")
def _se_grad_small_numba(X, Z, K, Kbar, gz, gl):  # pragma: no cover - compiled
    # With A = Kbar * K: gz[j, k] = sum_i A[i, j] (X[i, k] - Z[j, k]),
    # gl[k] = sum_ij A[i, j] (X[i, k] - Z[j, k])^2; returns sum_ij A[i, j]
    n, d = X.shape
    m = Z.shape[0]
    total = 0.0
    for i in range(n):
        for j in range(m):
            a = Kbar[i, j] * K[i, j]
            total += a
            for k in range(d):
                t = X[i, k] - Z[j, k]
                gz[j, k] += a * t
                gl[k] += a * t * t
    return total


def _check_shapes(X, Z, *nm):
    """``X`` (n, d), ``Z`` (m, d) and each of ``nm`` (n, m), or ``ValueError``."""
    if X.ndim != 2 or Z.ndim != 2 or X.shape[1] != Z.shape[1]:
        raise ValueError(f"X and Z must be 2-D with the same number of columns, got "
                         f"shapes {X.shape} and {Z.shape}")
    for a in nm:
        if a.shape != (X.shape[0], Z.shape[0]):
            raise ValueError(f"expected an array of shape {(X.shape[0], Z.shape[0])}, "
                             f"got {a.shape}")


def se_small(X, Z, ell, var):
    """``K(X, Z)`` of the SE-ARD kernel in one serial compiled loop (internal).

    For the many small matrices of a federation of small clients, where the
    row-group scheduling of :func:`se_ard` and the temporaries of a NumPy
    expression cost more than the arithmetic. The callers pass validated
    values; only the shapes are checked, since the compiled loop does not
    check its indices (``ValueError`` on a mismatch).

    Not :class:`_SEPlan`'s fill, on purpose (nor, in :func:`se_grad_small`,
    :class:`_GradAccumulator`): reusing them changes the order of the
    floating-point operations, and the far-client fit of
    ``tests/test_client_scales.py::test_far_client_2d`` has several optima
    that round-off chooses between (client A's RMSE 1.40 times its own
    instead of 1.09 times, with the same values to round-off).
    """
    X = np.ascontiguousarray(X, dtype=float)
    Z = np.ascontiguousarray(Z, dtype=float)
    _check_shapes(X, Z)
    ell = np.asarray(ell, dtype=float)
    if ell.shape != (X.shape[1],) or not ell.flags.c_contiguous:  # a scalar, (1,), a view
        ell = np.ascontiguousarray(np.broadcast_to(ell, (X.shape[1],)))
    out = np.empty((X.shape[0], Z.shape[0]))
    _se_small_numba(X, Z, ell, float(var), out)
    return out


def se_grad_small(X, Z, K, Kbar, ell, var):
    """``(dZ, dlengthscale, dvariance)`` of ``sum(Kbar * K(X, Z))``, serial (internal).

    The small-size counterpart of :func:`se_ard_grad` (same formulas).
    Shapes are checked as in :func:`se_small` (``ValueError``).
    """
    X = np.ascontiguousarray(X, dtype=float)
    Z = np.ascontiguousarray(Z, dtype=float)
    K = np.ascontiguousarray(K, dtype=float)
    Kbar = np.ascontiguousarray(Kbar, dtype=float)
    _check_shapes(X, Z, K, Kbar)
    ell = np.asarray(ell, dtype=float)  # scalar or (d,): broadcasts below
    gz = np.zeros(Z.shape)
    gl = np.zeros(Z.shape[1])
    total = _se_grad_small_numba(X, Z, K, Kbar, gz, gl)
    return gz / ell**2, gl / ell**3, float(total) / float(var)


# ---------------------------------------------------------------------------
# Chunk-level building blocks
# ---------------------------------------------------------------------------


def _check_backend(backend, kind):
    backend = backend or DEFAULT_BACKEND[kind]
    if backend not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use 'numba' or 'numpy'")
    return backend


class _SEPlan:
    """Precomputed inducing-side quantities to fill rows of ``K(X, Z)`` (internal).

    Parameters
    ----------
    Z : ndarray of shape (m, d)
    ell : ndarray of shape (d,)
    variance : float
    backend : {"numba", "numpy"}
    """

    __slots__ = ("backend", "inv_ell", "variance", "ZsT", "Zs", "m")

    def __init__(self, Z, ell, variance, backend):
        self.backend = backend
        self.inv_ell = 1.0 / ell
        self.variance = float(variance)
        Zs = Z * self.inv_ell
        self.m = Z.shape[0]
        if backend == "numba":
            self.ZsT = np.ascontiguousarray(Zs.T)
        else:
            self.Zs = Zs

    def fill(self, X, out):
        """Write ``K(X, Z)`` into ``out`` (shape ``(len(X), m)``, C-contiguous)."""
        Xs = X * self.inv_ell
        if self.backend == "numba":
            _neg_half_sqdist_numba(Xs, self.ZsT, out)
        else:
            # the differences themselves, never |x|^2 + |z|^2 - 2 x.z, which
            # cancels catastrophically for inputs far apart (a client at 0 and
            # one at 1e4: seven digits of K lost)
            D = Xs[:, None, :] - self.Zs[None, :, :]
            np.einsum("nmd,nmd->nm", D, D, out=out)
            out *= -0.5
        np.exp(out, out=out)
        out *= self.variance
        return out


class _GradAccumulator:
    """Running sums of the kernel-gradient contraction over row chunks (internal).

    For ``A = K * (B + u v^T)`` accumulates, per back end, what
    :meth:`finish` turns into ``sum_n A_nm (x_n - z_m) / ell^2`` (shape
    ``(m, d)``), ``sum_nm A_nm (x_n - z_m)^2 / ell^3`` (shape ``(d,)``) and
    ``sum_nm A_nm / variance``.  ``u v^T`` is the rank-one part of a
    ``Kbar`` that the ELBO builds as ``(r a^T - K P) / s2``: fusing it here
    saves a pass over an ``n x M`` array.
    """

    __slots__ = ("backend", "Z", "ZT", "gz", "glv", "gl", "gs")

    def __init__(self, Z, backend):
        m, d = Z.shape
        self.backend = backend
        self.gs = np.zeros(m)
        if backend == "numba":
            self.ZT = np.ascontiguousarray(Z.T)
            self.gz = np.zeros((d, m))
            self.glv = np.zeros((d, m))
        else:
            self.Z = Z
            self.gz = np.zeros((m, d))
            self.gl = np.zeros(d)

    def add(self, X, K, B, u=None, v=None):
        """Add the rows ``X`` (n_c, d) with ``K``, ``B`` (n_c, m), optional ``u`` (n_c,), ``v`` (m,)."""
        if self.backend == "numba":
            if u is None:
                u = np.zeros(X.shape[0])
                v = np.zeros(K.shape[1])
            _contract_rows_numba(X, self.ZT, K, B, u, v, self.gz, self.glv, self.gs)
            return
        if u is None:
            A = K * B
        else:
            A = np.multiply.outer(u, v)
            A += B
            A *= K
        D = X[:, None, :] - self.Z[None, :, :]  # differences, as in _SEPlan.fill
        self.gz += np.einsum("nm,nmd->md", A, D)
        self.gl += np.einsum("nm,nmd->d", A, D * D)
        self.gs += A.sum(axis=0)

    def merge(self, other):
        """Add another accumulator's sums (callers merge in a fixed order)."""
        self.gz += other.gz
        self.gs += other.gs
        if self.backend == "numba":
            self.glv += other.glv
        else:
            self.gl += other.gl
        return self

    def finish(self, ell, variance):
        """Return ``(dZ (m, d), dlengthscale (d,), dvariance float)``."""
        if self.backend == "numba":
            dz = self.gz.T / ell**2
            gl = self.glv.sum(axis=1)
        else:
            dz = self.gz / ell**2
            gl = self.gl
        return np.ascontiguousarray(dz), gl / ell**3, float(self.gs.sum()) / variance


def _as_params(lengthscale, variance, d):
    ell = np.asarray(lengthscale, dtype=float)
    if ell.ndim == 0:
        ell = np.full(d, float(ell))
    if ell.shape != (d,):
        raise ValueError(
            f"lengthscale must be a scalar or have shape ({d},), got {ell.shape}"
        )
    if not np.all(np.isfinite(ell)) or np.any(ell <= 0):
        raise ValueError(f"lengthscale must be finite and positive, got {ell}")
    variance = float(variance)
    if not np.isfinite(variance) or variance <= 0:
        raise ValueError(f"variance must be finite and positive, got {variance}")
    return ell, variance


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------


def se_ard(X, Z, lengthscale, variance, *, backend=None):
    """Squared-exponential ARD cross-covariance matrix ``K(X, Z)``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        First inputs.
    Z : ndarray of shape (m, d)
        Second inputs (often the inducing points).
    lengthscale : float or ndarray of shape (d,)
        ARD lengthscales, in input units; positive.
    variance : float
        Signal variance (units of the target squared); positive.
    backend : {"numba", "numpy"} or None
        Implementation; None uses ``DEFAULT_BACKEND["matrix"]``.

    Returns
    -------
    K : ndarray of shape (n, m)
        C-contiguous float64 matrix ``variance * exp(-0.5 * r^2)`` with
        ``r^2 = sum_d (x_d - z_d)^2 / lengthscale_d^2``.

    Raises
    ------
    ValueError
        If the shapes disagree, a hyperparameter is not finite and positive
        or the back end is unknown.

    Notes
    -----
    docs/maths.md, "Kernels"; pFedHGP paper section 3.1.  Rows are computed
    in parallel threads over a fixed partition (bitwise identical results
    for any thread count).
    """
    X = np.ascontiguousarray(X, dtype=float)
    Z = np.ascontiguousarray(Z, dtype=float)
    _check_shapes(X, Z)
    ell, variance = _as_params(lengthscale, variance, X.shape[1])
    backend = _check_backend(backend, "matrix")
    plan = _SEPlan(Z, ell, variance, backend)
    out = np.empty((X.shape[0], Z.shape[0]))

    def run(start, stop):
        for a, b in row_chunks(start, stop):
            plan.fill(X[a:b], out[a:b])

    n, m, d = X.shape[0], Z.shape[0], X.shape[1]
    map_row_groups(run, row_groups(n), workers=workers_for(n * m * (3.0 * d + 20.0)))
    return out


def se_ard_diag(X, variance):
    """Diagonal of ``K(X, X)`` for the SE-ARD kernel.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Inputs.
    variance : float
        Signal variance.

    Returns
    -------
    diag : ndarray of shape (n,)
        Every entry equals ``variance`` (the kernel is stationary).

    Notes
    -----
    docs/maths.md, "Kernels".
    """
    X = np.asarray(X)
    return np.full(X.shape[0], float(variance))


def se_ard_grad(X, Z, K, Kbar, lengthscale, variance, *, backend=None):
    """Contract ``Kbar = dF/dK`` with the derivatives of ``K(X, Z)``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        First inputs (held fixed: no gradient is returned for them).
    Z : ndarray of shape (m, d)
        Second inputs, e.g. inducing points.
    K : ndarray of shape (n, m)
        ``se_ard(X, Z, lengthscale, variance)``.
    Kbar : ndarray of shape (n, m)
        Sensitivity of a scalar ``F`` to each entry of ``K``.
    lengthscale : ndarray of shape (d,)
        Lengthscales used to build ``K``.
    variance : float
        Variance used to build ``K``.
    backend : {"numba", "numpy"} or None
        Implementation; None uses ``DEFAULT_BACKEND["grad"]``.

    Returns
    -------
    dZ : ndarray of shape (m, d)
        ``dF/dZ``.
    dlengthscale : ndarray of shape (d,)
        ``dF/dlengthscale``.
    dvariance : float
        ``dF/dvariance``.

    Notes
    -----
    Formulas of docs/maths.md, "Gradients of one client term". Neither back
    end builds an ``n x m x d`` array.  Row groups are contracted in
    parallel threads and their partial sums added in a fixed order, so the
    result is bitwise identical for any thread count.
    """
    X = np.ascontiguousarray(X, dtype=float)
    Z = np.ascontiguousarray(Z, dtype=float)
    K = np.ascontiguousarray(K, dtype=float)
    Kbar = np.ascontiguousarray(Kbar, dtype=float)
    ell, variance = _as_params(lengthscale, variance, X.shape[1])
    backend = _check_backend(backend, "grad")

    def run(start, stop):
        acc = _GradAccumulator(Z, backend)
        for a, b in row_chunks(start, stop):
            acc.add(X[a:b], K[a:b], Kbar[a:b])
        return acc

    n, m, d = X.shape[0], Z.shape[0], X.shape[1]
    total = _GradAccumulator(Z, backend)
    map_row_groups(run, row_groups(n), workers=workers_for(n * m * (6.0 * d + 3.0)),
                   reduce=total.merge)
    return total.finish(ell, variance)


def se_ard_grad_sym(Z, K, Kbar, lengthscale, variance, *, backend=None):
    """Contract a symmetric ``Kbar = dF/dK`` with the derivatives of ``K(Z, Z)``.

    Both arguments of the kernel are ``Z``, so the inducing-point gradient
    collects both: ``dF/dz_jd = -2 sum_k Kbar_jk K_jk (z_jd - z_kd) / ell_d^2``.

    Parameters
    ----------
    Z : ndarray of shape (m, d)
        Inducing points.
    K : ndarray of shape (m, m)
        ``se_ard(Z, Z, lengthscale, variance)`` without jitter.
    Kbar : ndarray of shape (m, m)
        Symmetric sensitivity ``dF/dK``.
    lengthscale : ndarray of shape (d,)
        Lengthscales.
    variance : float
        Variance.
    backend : {"numba", "numpy"} or None
        Implementation.

    Returns
    -------
    dZ : ndarray of shape (m, d)
    dlengthscale : ndarray of shape (d,)
    dvariance : float

    Notes
    -----
    docs/maths.md, last formula of "Gradients of one client term".
    """
    dz, dl, dv = se_ard_grad(Z, Z, K, Kbar, lengthscale, variance, backend=backend)
    # se_ard_grad returns the derivative through the second argument only;
    # by symmetry of Kbar the first argument contributes the same amount.
    return 2.0 * dz, dl, dv
