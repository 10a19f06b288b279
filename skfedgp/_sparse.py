"""Whitened sparse-GP blocks: the terms of the collapsed-free (SVGP-form) VFE
ELBO of one client and their analytic gradients.

A *block* is one kernel ``k`` with its inducing points ``Z`` (M x d) and
Cholesky factor ``L = chol(k(Z, Z) + jitter)``.  Whitened features
``W = k(X, Z) L^{-T}`` (n x M) carry one or more independent variational
*components* ``q(v_k) = N(m_k, C_k C_k^T)``, each entering the latent
function with a coefficient ``c_k``::

    f_block(x) = sum_k c_k  w(x)^T v_k ,   prior  v_k ~ N(0, I)

so the block's prior kernel is ``gamma * k`` with ``gamma = sum_k c_k^2``.
In pFedHGP (docs/maths.md) the *global* block of client ``i`` has the
components ``(m_g, C_g, 1)`` and ``(m_d_i, C_d_i, sqrt(phi))`` on the shared
kernel ``k_g`` and inducing set ``Z_g``; the *local* block has the single
component ``(m_u_i, C_u_i, 1)`` on ``k_i``, ``Z_i``.  A block with one
component is an ordinary whitened SGPR/SVGP block.

With ``a = sum_k c_k m_k``, ``Sigma = sum_k c_k^2 C_k C_k^T`` and
``r = y - sum_blocks W a``, the client's expected log likelihood is::

    E = -n/2 log(2 pi s2) - (||r||^2 + sum_b [tr(Sigma_b W_b^T W_b)
                                             + gamma_b (n var_b - ||W_b||_F^2)]) / (2 s2)

(docs/maths.md, "Client ELBO term"; pFedHGP paper, Theorem 1 /
Proposition 5).  Every product with an ``n``-sized dimension is a BLAS call
on ``K_xz`` itself (``W`` is never formed): the Gram matrix ``K_xz^T K_xz``,
two matrix-vector products, one ``n x M`` by ``M x M`` product for the
kernel sensitivity and the fused kernel-gradient contraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._linalg import (
    DEFAULT_JITTER,
    cholesky_backward,
    jittered_cholesky,
    nonnegative_variance,
    nb_gemv_acc,
    nb_gram_acc,
    solve_lower,
)
from ._parallel import (
    CHUNK_ROWS,
    map_row_groups,
    parallel_map,
    row_chunks,
    row_groups,
    single_threaded_blas,
    workers_for,
)
from .kernels import (
    DEFAULT_BACKEND,
    _as_params,
    _elbo_block_chunk_numba,
    _GradAccumulator,
    _SEPlan,
    se_ard,
    se_ard_grad_sym,
)

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
    jitter : float
        Relative jitter added to ``K_zz`` (times the variance) before the
        Cholesky factorisation; default :data:`skfedgp._linalg.DEFAULT_JITTER`.
    """

    Z: np.ndarray
    lengthscale: np.ndarray
    variance: float
    components: list = field(default_factory=list)
    name: str = "block"
    jitter: float = DEFAULT_JITTER

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
        ``0.5 (||C||_F^2 + ||m||^2 - M - 2 sum log diag C)`` (docs/maths.md).
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
    """Inducing-side quantities of one block in :func:`client_term` (internal).

    ``Kzz``, ``L``, ``jitter``, ``a``, ``la`` (``L^{-T} a``), ``plan`` (kernel
    row filler), ``ell``, ``S``, ``g``, ``D`` (``S - g I``), ``Pn``
    (``-L^{-T} D L^{-1} / s2``); data side: ``Phiw`` (``W^T W``) and
    ``tr_phiw``.  :func:`client_term` never forms ``K_xz``: it streams row
    chunks.
    """

    __slots__ = (
        "Kzz", "L", "jitter", "a", "la", "Phiw", "tr_phiw",
        "plan", "ell", "S", "g", "D", "Pn",
    )


def _inducing_side(block, *, client=None):
    """``K_zz``, its jittered Cholesky factor and ``L^{-T} a`` of one block."""
    cache = _BlockCache()
    Z = block.Z
    cache.Kzz = se_ard(Z, Z, block.lengthscale, block.variance)
    cache.L, cache.jitter = jittered_cholesky(
        cache.Kzz,
        scale=block.variance,
        jitter=block.jitter,
        name=f"K_zz ({block.name})",
        client=client,
    )
    cache.a = block.mean_vector()
    cache.la = solve_lower(cache.L, cache.a, trans=True)  # L^{-T} a
    return cache


def client_term(X, y, blocks, noise_variance, *, need_grad=True, kernel_grad=None,
                client=None):
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
    kernel_grad : sequence of bool, optional
        One flag per block (default: all True). A block whose flag is False
        gets no kernel gradients (``BlockGrad.Z``, ``lengthscale`` and
        ``variance`` are None), which skips its ``n x M x M`` product and
        kernel contraction in the pass and its Cholesky backward step —
        e.g. the global block during a client's local steps, where the
        global hyperparameters are fixed. Its variational gradients are
        still returned.
    client : hashable, optional
        Client label, used in error messages.

    Returns
    -------
    value : float
        ``E_i`` of docs/maths.md (no KL terms).
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
    ValueError
        If ``y`` does not have shape ``(n,)``.

    Notes
    -----
    docs/maths.md, "Client ELBO term" and "Gradients of one client term";
    Titsias (2009) VFE bound in the whitened SVGP form of Hensman et al.
    (2013).

    Implementation: everything that does not involve the data (``K_zz``,
    its Cholesky factor, ``P = L^{-T} (Sigma - gamma I) L^{-1}``) is computed
    first; then one fused pass streams the rows in chunks of
    :data:`skfedgp._parallel.CHUNK_ROWS`, in parallel over the fixed row
    groups of :func:`skfedgp._parallel.map_row_groups`.  Per chunk: the kernel
    rows ``K_b`` of every block, the residual ``r = y - sum_b K_b L_b^{-T} a_b``,
    and per block ``K_b^T K_b`` (BLAS syrk), ``K_b^T r``, ``K_b P_b`` (BLAS
    gemm) and the kernel-gradient contraction with
    ``Kbar_b = (r a_b^T L_b^{-1} - K_b P_b) / s2`` fused in (``Kbar`` is never
    stored).  No ``n x M`` array exists at any time (memory
    ``O(chunk x M)`` per thread), and the per-group sums are added in group
    order, so the result is bitwise identical for any thread count.  All BLAS
    work here runs single-threaded (:func:`skfedgp._parallel.single_threaded_blas`):
    one compute thread per core, no competing BLAS thread pools; the BLAS
    and LAPACK calls of the pass and of the ``M x M`` work are made from
    ``nogil`` Numba code (SciPy's f2py wrappers hold the GIL), and the
    ``M x M`` work of different blocks runs in parallel.
    ``benchmarks/bench_elbo.py`` measures the whole evaluation at about 3x
    one ``W^T W`` product (n = 20 000 and 100 000, M = 256, d = 8, 2 cores).
    """
    X = np.ascontiguousarray(X, dtype=float)
    n = X.shape[0]
    y = np.asarray(y, dtype=float)
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},) to match X, got {y.shape}")
    s2 = float(noise_variance)
    kbackend = DEFAULT_BACKEND["matrix"]
    gbackend = DEFAULT_BACKEND["grad"]
    nb = len(blocks)
    # per block: are the kernel gradients (Z, lengthscale, variance) wanted?
    if kernel_grad is None:
        kernel_grad = [True] * nb
    if len(kernel_grad) != nb:
        raise ValueError(f"kernel_grad needs one flag per block ({nb}), got {len(kernel_grad)}")
    kgrad = [bool(need_grad and f) for f in kernel_grad]

    # ---- inducing side of each block (no data; blocks in parallel) --------
    def prepare(k):
        b = blocks[k]
        c = _inducing_side(b, client=client)
        c.ell, var = _as_params(b.lengthscale, b.variance, X.shape[1])
        c.plan = _SEPlan(np.ascontiguousarray(b.Z, dtype=float), c.ell, var, kbackend)
        c.S = b.sigma()
        c.g = b.gamma()
        if kgrad[k]:
            c.D = c.S - c.g * np.eye(c.L.shape[0])
            # P = L^{-T} D L^{-1}; Kbar_xz = (r la^T - Kxz P) / s2 = K (-P / s2) + ...
            P = solve_lower(c.L, solve_lower(c.L, c.D, trans=True).T, trans=True)
            c.Pn = np.ascontiguousarray(-0.5 / s2 * (P + P.T))
        return c

    # ---- the fused pass over one row group ---------------------------------
    def run(start, stop):
        h_max = max(1, min(stop - start, CHUNK_ROWS))
        # lower triangles of K^T K (C order), accumulated in place by BLAS syrk
        Phi = [np.zeros((M, M)) for M in Ms]
        ktr = [np.zeros(M) for M in Ms]
        Kbuf = [np.empty((h_max, M)) for M in Ms]
        Bbuf = [np.empty((h_max, M)) if kg else None for M, kg in zip(Ms, kgrad)]
        accs = [_GradAccumulator(b.Z, gbackend) if kg else None
                for b, kg in zip(blocks, kgrad)]
        sq = 0.0
        for a, e in row_chunks(start, stop):
            h = e - a
            Xc = X[a:e]
            r = y[a:e].copy()
            Ks = []
            for c, buf in zip(caches, Kbuf):
                K = c.plan.fill(Xc, buf[:h])
                r -= K @ c.la
                Ks.append(K)
            sq += float(r @ r)
            for k, K in enumerate(Ks):
                if kgrad[k] and gbackend == "numba":
                    # syrk, gemv, gemm and contraction in one nogil call
                    acc = accs[k]
                    _elbo_block_chunk_numba(
                        Xc, acc.ZT, K, r, caches[k].Pn, las2[k], Bbuf[k][:h],
                        Phi[k], ktr[k], acc.gz, acc.glv, acc.gs, True,
                    )
                    continue
                # BLAS called from nogil Numba code: SciPy's f2py wrappers
                # would hold the GIL and serialise the worker threads
                nb_gram_acc(K, Phi[k])
                nb_gemv_acc(K, r, ktr[k], 1.0, True)
                if kgrad[k]:
                    B = np.matmul(K, caches[k].Pn, out=Bbuf[k][:h])
                    # A = K * (B + r la^T / s2) = K * Kbar, never stored
                    accs[k].add(Xc, K, B, r, las2[k])
        return sq, Phi, ktr, accs

    # ---- M x M work after the pass, per block ------------------------------
    def finish(k):
        b, c = blocks[k], caches[k]
        L = c.L
        Phi = np.tril(Phis[k])
        Phi += np.tril(Phi, -1).T
        T = solve_lower(L, Phi)  # Phiw = L^{-1} Phi L^{-T} = W^T W
        Phiw = solve_lower(L, T.T)
        Phiw = 0.5 * (Phiw + Phiw.T)
        c.Phiw = Phiw
        c.tr_phiw = float(np.trace(Phiw))
        tr_S_k = float(np.sum(c.S * Phiw))
        if not need_grad:
            return tr_S_k, None
        wr = solve_lower(L, ktrs[k])  # W^T r
        dmeans, dchols, dcoefs = [], [], []
        for comp in b.components:
            PC = Phiw @ comp.chol
            dmeans.append(comp.coef * wr / s2)
            dchols.append(np.tril(-(comp.coef**2) / s2 * PC))
            # tr(C C^T Phiw) = sum(C * (Phiw C)): no second M^3 product
            trSk = float(np.sum(comp.chol * PC))
            dcoefs.append(
                float(comp.mean @ wr) / s2
                - comp.coef * (trSk + n * b.variance - c.tr_phiw) / s2
            )
        if not kgrad[k]:
            return tr_S_k, BlockGrad(None, None, None, dmeans, dchols, dcoefs)
        dZ, dell, dvar = accs[k].finish(c.ell, b.variance)
        # through L: Lbar = -tril(L^{-T} Wbar^T W), Wbar^T W = (a wr^T - D Phiw) / s2
        WbW = (np.outer(c.a, wr) - c.D @ Phiw) / s2
        Lbar = -np.tril(solve_lower(L, WbW, trans=True))
        Kbar_zz = cholesky_backward(L, Lbar)
        dZ2, dell2, dvar2 = se_ard_grad_sym(b.Z, c.Kzz, Kbar_zz, b.lengthscale, b.variance)
        dZ += dZ2
        dell += dell2
        # explicit variance dependence: tr_R and the relative jitter
        dvar = (
            dvar + dvar2 - 0.5 * c.g * n / s2
            + (c.jitter / b.variance) * np.trace(Kbar_zz)
        )
        return tr_S_k, BlockGrad(dZ, dell, float(dvar), dmeans, dchols, dcoefs)

    d = X.shape[1]
    Ms_in = [np.shape(b.Z)[0] for b in blocks]
    # rough operation counts, only to decide whether threads pay off
    mm_flops = 12.0 * sum(M**3 for M in Ms_in) / max(nb, 1)
    pass_flops = n * sum((3.0 if kg else 1.0) * M * M + 10.0 * M * d
                         for M, kg in zip(Ms_in, kgrad))
    with single_threaded_blas():
        caches = parallel_map(prepare, range(nb), workers=workers_for(mm_flops))
        Ms = [c.L.shape[0] for c in caches]
        las2 = [c.la / s2 for c in caches]
        # per-group partial sums, added in group order as soon as possible
        # (bitwise independent of the thread count; few held at a time)
        Phis = [np.zeros((M, M)) for M in Ms]
        ktrs = [np.zeros(M) for M in Ms]
        accs = [_GradAccumulator(b.Z, gbackend) if kg else None
                for b, kg in zip(blocks, kgrad)]
        sq_total = [0.0]

        def reduce(result):
            sq_g, Phi_g, ktr_g, accs_g = result
            sq_total[0] += sq_g
            for k in range(nb):
                Phis[k] += Phi_g[k]
                ktrs[k] += ktr_g[k]
                if kgrad[k]:
                    accs[k].merge(accs_g[k])

        map_row_groups(run, row_groups(n), workers=workers_for(pass_flops), reduce=reduce)
        sq = sq_total[0]
        finished = parallel_map(finish, range(nb), workers=workers_for(mm_flops))

    tr_S = 0.0
    tr_R = 0.0
    for b, c, (tr_S_k, _) in zip(blocks, caches, finished):
        tr_S += tr_S_k
        tr_R += c.g * (n * b.variance - c.tr_phiw)
    value = -0.5 * n * (_LOG_2PI + np.log(s2)) - (sq + tr_S + tr_R) / (2.0 * s2)
    parts = {"sq_resid": sq, "tr_S": tr_S, "tr_R": tr_R}
    if not np.isfinite(value):
        where = f" of client {client!r}" if client is not None else ""
        raise FloatingPointError(f"the ELBO term{where} is not finite ({value})")
    if not need_grad:
        return float(value), None, None, parts
    dnoise = -0.5 * n / s2 + (sq + tr_S + tr_R) / (2.0 * s2**2)
    grads = [g for _, g in finished]
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
        latent covariance without noise (docs/maths.md, eq. 30 of the paper).
    """
    Kzz = se_ard(block.Z, block.Z, block.lengthscale, block.variance)
    L, _ = jittered_cholesky(
        Kzz, scale=block.variance, jitter=block.jitter, name=f"K_zz ({block.name})",
        client=client,
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
    return mean, nonnegative_variance(var, max(g, np.finfo(float).tiny) * block.variance)
