"""Squared-exponential ARD kernel with analytic gradients.

The kernel (SPEC section 1; pFedHGP paper, section 3.1) is

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

* ``"numba"``: fused, row-parallel loops; no ``n x M`` temporary beyond the
  output and never an ``n x M x d`` array;
* ``"numpy"``: BLAS products (``A^T X`` with ``A = K * Kbar``), one ``n x M``
  temporary, never an ``n x M x d`` array.

``benchmarks/bench_elbo.py`` measures both; :data:`DEFAULT_BACKEND` is the one
that was faster there.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = [
    "se_ard",
    "se_ard_diag",
    "se_ard_grad",
    "se_ard_grad_sym",
    "DEFAULT_BACKEND",
]

#: Back end used when ``backend=None`` (see ``benchmarks/bench_elbo.py``).
DEFAULT_BACKEND = {"matrix": "numba", "grad": "numba"}

# Number of row chunks of the parallel reductions.  Fixed (not the thread
# count) so that results are bitwise reproducible whatever the thread count.
_N_CHUNKS = 16


@njit(parallel=True, cache=True, fastmath=False)
def _se_ard_numba(Xs, Zs, variance):  # pragma: no cover - compiled
    # Xs, Zs are the inputs divided by the lengthscales
    n, d = Xs.shape
    m = Zs.shape[0]
    out = np.empty((n, m))
    for i in prange(n):
        for j in range(m):
            s = 0.0
            for k in range(d):
                t = Xs[i, k] - Zs[j, k]
                s += t * t
            out[i, j] = variance * np.exp(-0.5 * s)
    return out


@njit(parallel=True, cache=True, fastmath=False)
def _contract_numba(X, Z, K, Kbar, inv_ell2):  # pragma: no cover - compiled
    n, d = X.shape
    m = Z.shape[0]
    nchunk = min(_N_CHUNKS, max(n, 1))
    gz = np.zeros((nchunk, m, d))
    gl = np.zeros((nchunk, d))
    gs = np.zeros(nchunk)
    for c in prange(nchunk):
        start = c * n // nchunk
        stop = (c + 1) * n // nchunk
        gzc = gz[c]
        glc = gl[c]
        sc = 0.0
        diff = np.empty(d)
        for i in range(start, stop):
            for j in range(m):
                a = K[i, j] * Kbar[i, j]
                sc += a
                for k in range(d):
                    t = X[i, k] - Z[j, k]
                    diff[k] = t
                    gzc[j, k] += a * t
                for k in range(d):
                    glc[k] += a * diff[k] * diff[k]
        gs[c] = sc
    dz = np.zeros((m, d))
    dl = np.zeros(d)
    s = 0.0
    for c in range(nchunk):
        dz += gz[c]
        dl += gl[c]
        s += gs[c]
    for j in range(m):
        for k in range(d):
            dz[j, k] *= inv_ell2[k]
    return dz, dl, s


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
        If the shapes disagree or a hyperparameter is not finite and positive.

    Notes
    -----
    SPEC section 1, "Kernels"; pFedHGP paper section 3.1.
    """
    X = np.ascontiguousarray(X, dtype=float)
    Z = np.ascontiguousarray(Z, dtype=float)
    if X.ndim != 2 or Z.ndim != 2 or X.shape[1] != Z.shape[1]:
        raise ValueError(
            f"X and Z must be 2-D with the same number of columns, got "
            f"{X.shape} and {Z.shape}"
        )
    ell, variance = _as_params(lengthscale, variance, X.shape[1])
    backend = backend or DEFAULT_BACKEND["matrix"]
    if backend == "numba":
        return _se_ard_numba(X / ell, Z / ell, variance)
    if backend == "numpy":
        Xs = X / ell
        Zs = Z / ell
        # centre both to limit cancellation in the expanded square
        c = Zs.mean(axis=0) if Zs.shape[0] else 0.0
        Xs = Xs - c
        Zs = Zs - c
        r2 = Xs @ Zs.T
        r2 *= -2.0
        r2 += np.einsum("ij,ij->i", Xs, Xs)[:, None]
        r2 += np.einsum("ij,ij->i", Zs, Zs)[None, :]
        np.maximum(r2, 0.0, out=r2)
        r2 *= -0.5
        np.exp(r2, out=r2)
        r2 *= variance
        return r2
    raise ValueError(f"unknown backend {backend!r}; use 'numba' or 'numpy'")


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
    SPEC section 1, "Kernels".
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
    Formulas of SPEC section 1, "Gradients of one client term". Neither back
    end builds an ``n x m x d`` array.
    """
    X = np.ascontiguousarray(X, dtype=float)
    Z = np.ascontiguousarray(Z, dtype=float)
    ell, variance = _as_params(lengthscale, variance, X.shape[1])
    backend = backend or DEFAULT_BACKEND["grad"]
    if backend == "numba":
        dz, dl, s = _contract_numba(
            X, Z, np.ascontiguousarray(K), np.ascontiguousarray(Kbar), 1.0 / ell**2
        )
        return dz, dl / ell**3, s / variance
    if backend == "numpy":
        A = K * Kbar
        c = Z.mean(axis=0) if Z.shape[0] else np.zeros(X.shape[1])
        Xc = X - c
        Zc = Z - c
        AX = A.T @ Xc  # (m, d)
        col = A.sum(axis=0)  # (m,)
        row = A.sum(axis=1)  # (n,)
        dz = (AX - col[:, None] * Zc) / ell**2
        dl = (row @ (Xc * Xc) - 2.0 * np.einsum("md,md->d", AX, Zc) + col @ (Zc * Zc))
        return dz, dl / ell**3, float(col.sum()) / variance
    raise ValueError(f"unknown backend {backend!r}; use 'numba' or 'numpy'")


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
    SPEC section 1, last formula of "Gradients of one client term".
    """
    dz, dl, dv = se_ard_grad(Z, Z, K, Kbar, lengthscale, variance, backend=backend)
    # se_ard_grad returns the derivative through the second argument only;
    # by symmetry of Kbar the first argument contributes the same amount.
    return 2.0 * dz, dl, dv
