"""Whitened sparse-GP blocks: the terms of the collapsed-free (SVGP-form) VFE
ELBO of one client and their analytic gradients.

A *block* is one kernel ``k`` with its inducing points ``Z`` (M x d) and
Cholesky factor ``L = chol(k(Z, Z) + jitter)``.  Whitened features
``W = k(X, Z) L^{-T}`` (n x M) carry one or more independent variational
*components* ``q(v_k) = N(m_k, C_k C_k^T)``, each entering the latent
function with a coefficient ``c_k``::

    f_block(x) = sum_k c_k  w(x)^T v_k ,   prior  v_k ~ N(0, I)

so the block's prior kernel is ``gamma * k`` with ``gamma = sum_k c_k^2``.
In pFedHGP (SPEC section 1) the *global* block of client ``i`` has the
components ``(m_g, C_g, 1)`` and ``(m_d_i, C_d_i, sqrt(phi))`` on the shared
kernel ``k_g`` and inducing set ``Z_g``; the *local* block has the single
component ``(m_u_i, C_u_i, 1)`` on ``k_i``, ``Z_i``.  A block with one
component is an ordinary whitened SGPR/SVGP block.

With ``a = sum_k c_k m_k``, ``Sigma = sum_k c_k^2 C_k C_k^T`` and
``r = y - sum_blocks W a``, the client's expected log likelihood is::

    E = -n/2 log(2 pi s2) - (||r||^2 + sum_b [tr(Sigma_b W_b^T W_b)
                                             + gamma_b (n var_b - ||W_b||_F^2)]) / (2 s2)

(SPEC section 1, "Client ELBO term"; pFedHGP paper, Theorem 1 /
Proposition 5).  Every product with an ``n``-sized dimension is a BLAS call
on ``K_xz`` itself (``W`` is never formed): the Gram matrix ``K_xz^T K_xz``,
two matrix-vector products, one ``n x M`` by ``M x M`` product for the
kernel sensitivity and the fused kernel-gradient contraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import blas as _blas

from ._linalg import (
    DEFAULT_JITTER,
    cholesky_backward,
    jittered_cholesky,
    solve_lower,
)
from .kernels import se_ard, se_ard_grad, se_ard_grad_sym

__all__ = [
    "Component",
    "Block",
    "BlockGrad",
    "client_term",
    "block_predict",
    "kl_whitened",
]

_LOG_2PI = float(np.log(2.0 * np.pi))


@dataclass
class Component:
    """One whitened variational factor ``q(v) = N(mean, chol chol^T)``.

    Attributes
    ----------
    mean : ndarray of shape (M,)
    chol : ndarray of shape (M, M)
        Lower triangular with positive diagonal.
    coef : float
        Coefficient ``c`` with which ``v`` enters the block (``sqrt(phi)`` for
        the pFedHGP deviation, 1 otherwise).
    """

    mean: np.ndarray
    chol: np.ndarray
    coef: float = 1.0


@dataclass
class Block:
    """Kernel hyperparameters, inducing points and components of one block.

    Attributes
    ----------
    Z : ndarray of shape (M, d)
        Inducing points.
    lengthscale : ndarray of shape (d,)
    variance : float
    components : list of Component
    name : str
        Used in error messages (e.g. ``"global"``).
    """

    Z: np.ndarray
    lengthscale: np.ndarray
    variance: float
    components: list = field(default_factory=list)
    name: str = "block"

    def mean_vector(self):
        """``a = sum_k c_k m_k``, shape (M,)."""
        a = np.zeros(self.Z.shape[0])
        for c in self.components:
            a += c.coef * c.mean
        return a

    def gamma(self):
        """``sum_k c_k^2``: multiplier of the block's prior kernel."""
        return float(sum(c.coef**2 for c in self.components))

    def sigma(self):
        """``sum_k c_k^2 C_k C_k^T``, shape (M, M)."""
        S = np.zeros((self.Z.shape[0],) * 2)
        for c in self.components:
            S += c.coef**2 * (c.chol @ c.chol.T)
        return S


@dataclass
class BlockGrad:
    """Gradient of a client term with respect to one block.

    Attributes
    ----------
    Z : ndarray of shape (M, d)
    lengthscale : ndarray of shape (d,)
    variance : float
    means : list of ndarray of shape (M,)
    chols : list of ndarray of shape (M, M)
        Lower-triangular gradients with respect to the Cholesky factors.
    coefs : list of float
    """

    Z: np.ndarray
    lengthscale: np.ndarray
    variance: float
    means: list
    chols: list
    coefs: list


def kl_whitened(mean, chol):
    """KL(N(mean, chol chol^T) || N(0, I)) and its gradients.

    Parameters
    ----------
    mean : ndarray of shape (M,)
    chol : ndarray of shape (M, M)
        Lower triangular, positive diagonal.

    Returns
    -------
    kl : float
        ``0.5 (||C||_F^2 + ||m||^2 - M - 2 sum log diag C)`` (SPEC section 1).
    dmean : ndarray of shape (M,)
        ``m``.
    dchol : ndarray of shape (M, M)
        ``C - diag(1 / diag C)`` (lower triangle).
    """
    diag = np.diag(chol)
    M = mean.shape[0]
    kl = 0.5 * (
        np.sum(np.tril(chol) ** 2) + mean @ mean - M - 2.0 * np.sum(np.log(np.abs(diag)))
    )
    dchol = np.tril(chol).copy()
    dchol.flat[:: M + 1] -= 1.0 / diag
    return float(kl), mean.copy(), dchol


class _BlockCache:
    """Forward quantities of one block on one data set (internal)."""

    __slots__ = ("Kxz", "Kzz", "L", "jitter", "a", "la", "Phiw", "tr_phiw", "mu")


def _gram_lower(A):
    """``A^T A`` (M x M) of a C-contiguous (n x M) ``A`` through BLAS syrk."""
    # A.T is Fortran-ordered (M x n): syrk computes A.T @ A without a copy
    G = _blas.dsyrk(1.0, A.T, trans=0, lower=1)
    G = np.tril(G)
    return G + np.tril(G, -1).T


def _block_forward(X, block, *, client=None, need_kzz=True):
    cache = _BlockCache()
    Z = block.Z
    cache.Kzz = se_ard(Z, Z, block.lengthscale, block.variance)
    cache.L, cache.jitter = jittered_cholesky(
        cache.Kzz,
        scale=block.variance,
        jitter=DEFAULT_JITTER,
        name=f"K_zz ({block.name})",
        client=client,
    )
    cache.Kxz = se_ard(X, Z, block.lengthscale, block.variance)
    cache.a = block.mean_vector()
    cache.la = solve_lower(cache.L, cache.a, trans=True)  # L^{-T} a
    cache.mu = cache.Kxz @ cache.la
    Phi = _gram_lower(cache.Kxz)
    # Phiw = L^{-1} Phi L^{-T}
    T = solve_lower(cache.L, Phi)
    cache.Phiw = solve_lower(cache.L, T.T)
    cache.Phiw = 0.5 * (cache.Phiw + cache.Phiw.T)
    cache.tr_phiw = float(np.trace(cache.Phiw))
    return cache


def client_term(X, y, blocks, noise_variance, *, need_grad=True, client=None):
    """Expected log likelihood of one client and its gradients.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Client inputs.
    y : ndarray of shape (n,)
        Client targets.
    blocks : list of Block
        The blocks whose sum is the latent function (e.g. global and local).
    noise_variance : float
        Gaussian noise variance ``s2``.
    need_grad : bool, default=True
        Also compute the gradients.
    client : hashable, optional
        Client label, used in error messages.

    Returns
    -------
    value : float
        ``E_i`` of SPEC section 1 (no KL terms).
    grads : list of BlockGrad or None
        One per block, in order.
    dnoise : float or None
        ``dE_i / d s2``.
    parts : dict
        ``{"sq_resid", "tr_S", "tr_R"}`` diagnostics.

    Raises
    ------
    CholeskyError
        If a ``K_zz`` cannot be factorised (names the block and client).
    FloatingPointError
        If the result is not finite.

    Notes
    -----
    SPEC section 1, "Client ELBO term" and "Gradients of one client term";
    Titsias (2009) VFE bound in the whitened SVGP form of Hensman et al.
    (2013).
    """
    n = X.shape[0]
    s2 = float(noise_variance)
    caches = [_block_forward(X, b, client=client) for b in blocks]
    r = np.array(y, dtype=float, copy=True)
    for c in caches:
        r -= c.mu
    sq = float(r @ r)
    tr_S = 0.0
    tr_R = 0.0
    sigmas = []
    gammas = []
    for b, c in zip(blocks, caches):
        S = b.sigma()
        g = b.gamma()
        sigmas.append(S)
        gammas.append(g)
        tr_S += float(np.sum(S * c.Phiw))
        tr_R += g * (n * b.variance - c.tr_phiw)
    value = -0.5 * n * (_LOG_2PI + np.log(s2)) - (sq + tr_S + tr_R) / (2.0 * s2)
    parts = {"sq_resid": sq, "tr_S": tr_S, "tr_R": tr_R}
    if not np.isfinite(value):
        where = f" of client {client!r}" if client is not None else ""
        raise FloatingPointError(f"the ELBO term{where} is not finite ({value})")
    if not need_grad:
        return float(value), None, None, parts

    dnoise = -0.5 * n / s2 + (sq + tr_S + tr_R) / (2.0 * s2**2)
    grads = []
    for b, c, S, g in zip(blocks, caches, sigmas, gammas):
        L = c.L
        M = L.shape[0]
        wr = solve_lower(L, c.Kxz.T @ r)  # W^T r
        dmeans, dchols, dcoefs = [], [], []
        for comp in b.components:
            dmeans.append(comp.coef * wr / s2)
            dchols.append(np.tril(-(comp.coef**2) * (c.Phiw @ comp.chol) / s2))
            Sk = comp.chol @ comp.chol.T
            dcoefs.append(
                float(comp.mean @ wr) / s2
                - comp.coef * (float(np.sum(Sk * c.Phiw)) + n * b.variance - c.tr_phiw) / s2
            )
        D = S - g * np.eye(M)
        # P = L^{-T} D L^{-1}
        P = solve_lower(L, solve_lower(L, D, trans=True).T, trans=True)
        P = 0.5 * (P + P.T)
        # Kbar_xz = (r la^T - Kxz P) / s2, built in place (no extra n x M temporary)
        Kbar = c.Kxz @ P
        Kbar *= -1.0 / s2
        _blas.dger(1.0 / s2, c.la, r, a=Kbar.T, overwrite_a=1)
        dZ, dell, dvar = se_ard_grad(X, b.Z, c.Kxz, Kbar, b.lengthscale, b.variance)
        del Kbar
        # through L: Lbar = -tril(L^{-T} Wbar^T W), Wbar^T W = (a wr^T - D Phiw) / s2
        WbW = (np.outer(c.a, wr) - D @ c.Phiw) / s2
        Lbar = -np.tril(solve_lower(L, WbW, trans=True))
        Kbar_zz = cholesky_backward(L, Lbar)
        dZ2, dell2, dvar2 = se_ard_grad_sym(b.Z, c.Kzz, Kbar_zz, b.lengthscale, b.variance)
        dZ += dZ2
        dell += dell2
        # explicit variance dependence: tr_R and the relative jitter
        dvar = dvar + dvar2 - 0.5 * g * n / s2 + (c.jitter / b.variance) * np.trace(Kbar_zz)
        grads.append(BlockGrad(dZ, dell, float(dvar), dmeans, dchols, dcoefs))
    return float(value), grads, float(dnoise), parts


def block_predict(Xs, block, *, full_cov=False, client=None):
    """Predictive mean and covariance of one block's latent function.

    Parameters
    ----------
    Xs : ndarray of shape (n*, d)
        Test inputs.
    block : Block
    full_cov : bool, default=False
        Return the full ``n* x n*`` covariance instead of its diagonal.
    client : hashable, optional
        Client label for error messages.

    Returns
    -------
    mean : ndarray of shape (n*,)
        ``W* a``.
    cov : ndarray of shape (n*,) or (n*, n*)
        ``W* Sigma W*^T + gamma (K** - W* W*^T)`` (or its diagonal), the
        latent covariance without noise (SPEC section 1, eq. 30 of the paper).
    """
    Kzz = se_ard(block.Z, block.Z, block.lengthscale, block.variance)
    L, _ = jittered_cholesky(
        Kzz, scale=block.variance, name=f"K_zz ({block.name})", client=client
    )
    Ksz = se_ard(Xs, block.Z, block.lengthscale, block.variance)
    Ws = solve_lower(L, Ksz.T).T  # (n*, M)
    mean = Ws @ block.mean_vector()
    g = block.gamma()
    S = block.sigma()
    if full_cov:
        Kss = se_ard(Xs, Xs, block.lengthscale, block.variance)
        cov = Ws @ (S - g * np.eye(S.shape[0])) @ Ws.T + g * Kss
        cov = 0.5 * (cov + cov.T)
        return mean, cov
    var = np.einsum("ij,ij->i", Ws @ S, Ws) + g * (block.variance - np.einsum("ij,ij->i", Ws, Ws))
    return mean, np.maximum(var, 0.0)
