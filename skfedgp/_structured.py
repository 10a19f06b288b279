"""Structured (collapsed) variational posterior of the pFedHGP hierarchy.

For a Gaussian likelihood the optimal *joint* Gaussian ``q`` over the
whitened inducing variables ``(v_g, w_1, v_1, ..., w_T, v_T)`` has an arrow
shaped precision: clients are independent given ``v_g``.  Each client
eliminates its own variables ``c_i = (w_i, v_i, a_i)`` and sends a fixed-size
Gaussian message on ``v_g``; the server sums them and obtains ``q(v_g)``
exactly.  The bound is the collapsed (Titsias-type) bound of the whole
hierarchy, which equals the exact log marginal likelihood when the inducing
inputs are the training inputs.  Full derivation: ``docs/maths.md``,
"Structured posterior"; docs/maths.md, section 9, "Structured
(collapsed) posterior".  One-level precedent: Gal, van der Wilk and
Rasmussen, "Distributed Variational Inference in Sparse Gaussian Process
Regression and Latent Variable Models", NeurIPS 2014.

Notation (one client, index ``i`` dropped).  The *feature blocks* are the
global kernel's ``W_g = k_g(X, Z_g) L_g^{-T}`` (present when the global or
the deviation component is used), the local kernel's
``W_l = k_l(X, Z_l) L_l^{-T}`` and, when the global values hold
``level_variance`` (``tau^2``), the client level's single feature
``W_c = tau 1``: the client's constant mean is a random level
``tau a``, ``a ~ N(0, 1)``, i.e. the constant kernel ``tau^2`` on the
client's own rows, which one inducing variable represents exactly.
``F = [W_g, W_l, W_c]`` (``n x M_f``).  The client's latent function on its
data is ``f = F z`` with ``z = E u``, ``u = (v_g, c)``, ``c = (w, v, a)``
and ``E`` the ``M_f x N_u`` map ``z_g = v_g + sqrt(phi) w``, ``z_l = v``,
``z_c = a`` (with the client's scale ``s`` on the shared parts,
``z_g = s (v_g + sqrt(phi) w)``; docs/maths.md, section 10).  With ``W_f = F^T F``,
``w_f = F^T y``, ``E_g``/``E_c`` the columns of ``E`` for ``v_g``/``c``::

    P   = I + E_c^T W_f E_c / s2            (client only)
    G   = E_g^T W_f E_c / s2
    r   = E_c^T w_f / s2
    S_i = E_g^T W_f E_g / s2 - G P^{-1} G^T  -> uploaded (M x M)
    b_i = E_g^T w_f / s2 - G P^{-1} r        -> uploaded (M)
    e_i = n log(2 pi s2) + log|P| + y^T y / s2 - r^T P^{-1} r + tr_R / s2
    A   = I + sum_i S_i,  b = sum_i b_i,  mu_g = A^{-1} b       (server)
    ELBO = -1/2 [sum_i e_i + log|A| - b^T A^{-1} b]

Gradients use that the ELBO is the maximum over ``q`` of the uncollapsed
bound (Danskin's theorem): at the optimal joint ``q`` the gradient with
respect to any hyperparameter is the partial derivative of the expected log
likelihood at fixed ``q``.  A client needs only ``mu_g`` and ``A^{-1}``
(broadcast) and its own ``P``, ``G``, ``r`` to form the moments of
``u = (v_g, c)`` and hence of ``z``; the KL terms do not depend on any
hyperparameter in the whitened parametrisation.

Every ``n``-sized product streams over row chunks (memory ``O(chunk x M_f)``);
everything else is ``M_f``-sized.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from ._linalg import (
    DEFAULT_JITTER,
    CholeskyError,
    nonnegative_variance,
    cholesky_backward,
    cholesky_inverse,
    all_finite,
    jittered_cholesky,
    solve_lower,
)
from ._parallel import single_threaded_blas
from .kernels import se_ard, se_ard_grad, se_ard_grad_sym, se_grad_small, se_small

__all__ = [
    "feature_blocks",
    "ClientState",
    "client_forward",
    "client_backward",
    "combine",
    "ServerPosterior",
    "client_posterior",
    "predict_structured",
    "layout_map",
    "residual_coefficients",
    "test_features",
]

_LOG_2PI = float(np.log(2.0 * np.pi))
#: Rows per chunk of the streamed data passes.
CHUNK_ROWS = 2048


# ---------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------


@dataclass
class _Layout:
    """Index sets of one client's feature and latent coordinates.

    Feature order: the global kernel's ``Mg`` features, the local kernel's
    ``Ml``, then (with a random client level) one constant feature
    ``sqrt(level_variance)``. Latent order: ``v_g``, ``w``, ``v``, then the
    level's whitened variable ``a``.
    """

    Mg: int  # size of the global feature block (0 if absent)
    Ml: int  # size of the local feature block (0 if absent)
    has_global: bool
    has_dev: bool
    has_local: bool
    has_level: bool = False
    #: The client's scale ``s_i`` on the shared parts: its function is
    #: ``level + s_i (g + d_i) + l_i`` (docs/maths.md, section 10).
    scale: float = 1.0

    @property
    def Mc(self):
        return 1 if self.has_level else 0

    @property
    def Mf(self):
        return self.Mg + self.Ml + self.Mc

    @property
    def n_vg(self):
        return self.Mg if self.has_global else 0

    @property
    def n_c(self):
        return ((self.Mg if self.has_dev else 0) + (self.Ml if self.has_local else 0)
                + self.Mc)

    def E(self, phi):
        """``E`` (M_f x N_u): feature coefficients from ``u = (v_g, w, v, a)``."""
        Nu = self.n_vg + self.n_c
        E = np.zeros((self.Mf, Nu))
        col = 0
        ig = np.arange(self.Mg)
        if self.has_global:
            E[ig, col + ig] = self.scale
            col += self.Mg
        if self.has_dev:
            E[ig, col + ig] = self.scale * np.sqrt(phi)
            col += self.Mg
        if self.has_local:
            il = np.arange(self.Ml)
            E[self.Mg + il, col + il] = 1.0
            col += self.Ml
        if self.has_level:
            E[self.Mg + self.Ml, col] = 1.0
        return E

    def apply_E(self, phi, U):
        """``E @ U`` for ``U`` with ``N_u`` rows, by slicing (``E`` is a selection)."""
        out = np.zeros((self.Mf,) + U.shape[1:])
        row = 0
        if self.has_global:
            out[: self.Mg] += self.scale * U[row:row + self.Mg]
            row += self.Mg
        if self.has_dev:
            out[: self.Mg] += self.scale * np.sqrt(phi) * U[row:row + self.Mg]
            row += self.Mg
        if self.has_local:
            out[self.Mg:self.Mg + self.Ml] = U[row:row + self.Ml]
            row += self.Ml
        if self.has_level:
            out[self.Mg + self.Ml:] = U[row:row + 1]
        return out

    def EgT(self, U):
        """``E_g^T @ U``: ``scale`` times the global-feature rows of ``U`` (empty without ``v_g``)."""
        return self.scale * U[: self.Mg] if self.has_global else U[:0]

    def EcT(self, phi, U):
        """``E_c^T @ U``: ``scale sqrt(phi)`` times the global-feature rows (for ``w``),
        then the local-feature rows (for ``v``), then the level's row (for ``a``)."""
        parts = []
        if self.has_dev:
            parts.append(self.scale * np.sqrt(phi) * U[: self.Mg])
        if self.has_local:
            parts.append(U[self.Mg:self.Mg + self.Ml])
        if self.has_level:
            parts.append(U[self.Mg + self.Ml:])
        if not parts:
            return U[:0]
        return np.concatenate(parts, axis=0)

    def w_rows(self):
        """Slice of ``u`` holding the deviation variables ``w``."""
        return slice(self.n_vg, self.n_vg + (self.Mg if self.has_dev else 0))

    def level_row(self):
        """Index of the level's variable ``a`` in ``u`` (None without a level)."""
        return self.n_vg + self.n_c - 1 if self.has_level else None

    def vg_rows(self):
        """Slice of ``u`` holding the global variables ``v_g``."""
        return slice(0, self.n_vg)

    def residual_coef(self, phi):
        """``gamma`` per feature: multiplier of ``(n var - ||W||_F^2)`` in ``tr_R``.

        Zero for the level's feature: a constant kernel is rank one and its
        single feature represents it exactly.
        """
        gam = np.zeros(self.Mf)
        gam[: self.Mg] = self.scale**2 * ((1.0 if self.has_global else 0.0)
                                          + (phi if self.has_dev else 0.0))
        gam[self.Mg:self.Mg + self.Ml] = 1.0 if self.has_local else 0.0
        return gam


def feature_blocks(G, B, components, *, jitter=DEFAULT_JITTER):
    """Kernel blocks of one client: ``("g" | "l" | "c", Z, ell, var, jitter)`` tuples.

    Parameters
    ----------
    G : dict
        Global values ``Z_g`` (M, d), ``lengthscale_g`` (d,), ``variance_g``
        and ``phi`` (when the deviation is used).
    B : dict
        Local values ``Z_l`` (M_l, d), ``lengthscale_l`` (d,), ``variance_l``.
    components : tuple of str
    jitter : float
        Relative jitter of every ``K_zz``.

    Returns
    -------
    list of tuple
        ``(name, Z, lengthscale, variance, jitter)`` for the global kernel
        (``"g"``, if the global or deviation component is used), the local
        kernel (``"l"``, if used) and, when ``G`` holds ``level_variance``,
        the client level's constant kernel (``"c"``: ``k(x, x') =
        level_variance``, one inducing variable, exact and unjittered).
    """
    out = []
    if "global" in components or "deviation" in components:
        out.append(("g", np.asarray(G["Z_g"], float), np.asarray(G["lengthscale_g"], float),
                    float(G["variance_g"]), jitter))
    if "local" in components:
        out.append(("l", np.asarray(B["Z_l"], float), np.asarray(B["lengthscale_l"], float),
                    float(B["variance_l"]), jitter))
    if "level_variance" in G:
        d = out[0][1].shape[1] if out else 1
        out.append(("c", np.zeros((1, d)), np.ones(d), float(G["level_variance"]), 0.0))
    return out


def _layout(blocks, components, scale=1.0):
    sizes = {name: Z.shape[0] for name, Z, *_ in blocks}
    return _Layout(
        Mg=sizes.get("g", 0), Ml=sizes.get("l", 0),
        has_global="global" in components, has_dev="deviation" in components,
        has_local="local" in components, has_level="c" in sizes, scale=float(scale),
    )


def _chol(A, name, client):
    """Cholesky factor of a symmetric positive definite ``M``-sized matrix."""
    if A.shape[0] == 0:
        return np.zeros((0, 0))
    L, _ = jittered_cholesky(0.5 * (A + A.T), scale=1.0, jitter=1e-12, name=name,
                             client=client)
    return L


def _chol_solve(L, B):
    if L.shape[0] == 0:
        return np.zeros_like(B)
    return solve_lower(L, solve_lower(L, B), trans=True)


# ---------------------------------------------------------------------------
# the client's forward pass: statistics
# ---------------------------------------------------------------------------


@dataclass
class ClientState:
    """Everything one client keeps between its two exchanges (never sent).

    Attributes hold the inducing-side factors (``Kzz``, ``L``, absolute
    jitters), the whitened statistics ``W_f``, ``w_f``, ``y^T y``, ``n``, the
    client's elimination (``Lp`` = chol ``P``, ``PiGt`` = ``P^{-1} G^T``,
    ``Pir`` = ``P^{-1} r``) and the uploaded ``S``, ``b``, ``e``.
    """

    layout: _Layout
    blocks: list
    Kzz: list
    Ls: list
    eps: list
    Lam: np.ndarray
    Wf: np.ndarray
    wf: np.ndarray
    yy: float
    n: int
    s2: float
    phi: float
    Lp: np.ndarray
    PiGt: np.ndarray
    Pir: np.ndarray
    S: np.ndarray
    b: np.ndarray
    e: float
    tr_R: float
    level_mean: float = 0.0
    #: ``P^{-1}`` when the forward pass formed it (data-space elimination),
    #: else None (then taken from ``Lp``).
    Pinv: np.ndarray = None
    #: The kernel rows ``K(X, Z)`` (``n x M_f``) when the client's rows fit
    #: in one chunk (the backward pass reuses them), else None.
    K_rows: np.ndarray = None

    @property
    def E(self):
        """``E`` (``M_f x N_u``), the map from ``u`` to feature coefficients."""
        return self.layout.E(self.phi)


#: Below this many kernel entries, the structured family's kernel matrices and
#: their gradient contractions use serial compiled loops
#: (:func:`skfedgp.kernels.se_small`, :func:`skfedgp.kernels.se_grad_small`) instead of
#: :func:`skfedgp.kernels.se_ard` (whose row-group scheduling costs tens of
#: microseconds per call, which dominates for the many small clients of a
#: federation; same values to round-off).
SMALL_KERNEL = 1 << 12

#: Largest ``n x M_f`` kernel-row block a client keeps from its forward pass
#: for its backward pass (a few client rows: the many small clients of a
#: federation; larger blocks are recomputed rather than held between rounds).
KEEP_ROWS_ENTRIES = 1 << 16

#: Largest ``||B_j||^2 / s2`` (prior variance of a client variable's share of
#: one observation over the noise variance) for which a client with fewer
#: observations than variables eliminates them in data space
#: (:func:`_eliminate_in_data_space`); above it, in ``N_c`` space.
DATA_SPACE_MAX_RATIO = 1e8


def _se(X, Z, ell, var):
    """SE-ARD ``k(X, Z)`` (a serial compiled loop for small sizes, else :func:`se_ard`).

    Both paths form the differences ``x - z`` themselves, never the expanded
    square ``|x|^2 + |z|^2 - 2 x.z``: with inputs far apart (clients at 0
    and at 1e4) the expansion cancels catastrophically, and the bound became
    noisy to finite differences in the lengthscales (relative errors of
    1e-7 in ``K_zz``, enough to stop L-BFGS-B's line search).
    """
    if X.shape[0] * Z.shape[0] > SMALL_KERNEL:
        return se_ard(X, Z, ell, var)
    return se_small(X, Z, ell, var)


def _se_grad(X, Z, K, Kbar, ell, var):
    """``(dZ, dlengthscale, dvariance)`` of ``sum(Kbar * K(X, Z))`` (see :func:`se_ard_grad`)."""
    if X.shape[0] * Z.shape[0] > SMALL_KERNEL:
        return se_ard_grad(X, Z, K, Kbar, ell, var)
    return se_grad_small(X, Z, K, Kbar, ell, var)


def _se_grad_sym(Z, K, Kbar, ell, var):
    """Symmetric version (both arguments are ``Z``): see :func:`se_ard_grad_sym`."""
    if Z.shape[0] ** 2 > SMALL_KERNEL:
        return se_ard_grad_sym(Z, K, Kbar, ell, var)
    dz, dl, dv = _se_grad(Z, Z, K, Kbar, ell, var)
    return 2.0 * dz, dl, dv


def _block_kernel(name, X, Z, ell, var):
    """``k(X, Z)`` of one block: SE-ARD, or the level's constant kernel (``"c"``)."""
    if name == "c":
        return np.full((X.shape[0], Z.shape[0]), float(var))
    return _se(X, Z, ell, var)


def _block_grad(name, X, Z, K, Kbar, ell, var, *, sym=False):
    """``(dZ, dlengthscale, dvariance)`` of ``sum(Kbar * k(X, Z))`` for one block.

    ``sym``: both arguments are ``Z`` (``X`` is ignored).
    """
    if name == "c":
        return np.zeros_like(Z), np.zeros_like(ell), float(np.sum(Kbar * K)) / var
    if sym:
        return _se_grad_sym(Z, K, Kbar, ell, var)
    return _se_grad(X, Z, K, Kbar, ell, var)


_BLOCK_NAMES = {"g": "global", "l": "local", "c": "client level"}


def _kernel_rows(Xc, blocks):
    return np.hstack([_block_kernel(name, Xc, Z, ell, var) for name, Z, ell, var, _ in blocks])


#: Recently factorised global ``K_zz`` (key: exact parameter bytes).
#: Simulated clients in one process evaluate the same broadcast global
#: kernel, and a client's local phase keeps the global values fixed, so the
#: global ``K_zz`` and its factor are computed once per global vector rather
#: than once per client and evaluation. A pure function of its key: results
#: are bitwise those of computing it each time.
_FACTOR_CACHE = OrderedDict()
#: Memory budget of the cache (bytes of ``K_zz``, ``L`` and the key; oldest out first).
_FACTOR_CACHE_BYTES = 64 * 2**20
_FACTOR_CACHE_USED = 0
_FACTOR_LOCK = threading.Lock()


def _inducing_factor(name, Z, ell, var, jit, client):
    """``(K_zz, L, absolute jitter)`` of one block, from the cache when possible."""

    def factor():
        K = _block_kernel(name, Z, Z, ell, var)
        L, e_ = jittered_cholesky(K, scale=var, jitter=jit,
                                  name=f"K_zz ({_BLOCK_NAMES[name]})", client=client)
        return K, L, e_

    if name == "c":  # the level's 1 x 1 constant kernel, unjittered: sqrt(level_variance)
        var = float(var)
        if not (np.isfinite(var) and var > 0):
            return factor()  # the factorisation's own error names the matrix
        return np.full((1, 1), var), np.full((1, 1), np.sqrt(var)), 0.0
    if name != "g":  # a client's own blocks change with its own vector: not cached
        return factor()
    Z = np.asarray(Z, dtype=float)
    key = (name, Z.shape, Z.tobytes(), np.asarray(ell, float).tobytes(), float(var), float(jit))
    return cached_factor(key, factor)


def cached_factor(key, factor):
    """``factor()``'s ``(K_zz, L, absolute jitter)``, kept in the factor cache under ``key``.

    ``key`` must determine the result exactly (the inputs' bytes among its
    entries). On a miss ``factor`` runs with one BLAS thread, so that a
    cached factor has the same bits whichever context (process, thread,
    BLAS setting) first computed it; the result is stored (read-only arrays:
    callers must not modify them in place) when it fits the memory budget,
    oldest entries out first. Shared by the structured family's global
    blocks and the multi-output (ILMM) blocks.

    Parameters
    ----------
    key : tuple
        Hashable; its ``bytes`` entries count towards the entry's size.
    factor : callable
        ``factor() -> (K, L, jitter)``, ``K`` and ``L`` of shape (M, M).

    Returns
    -------
    K, L : ndarray of shape (M, M)
    jitter : float
    """
    global _FACTOR_CACHE_USED
    with _FACTOR_LOCK:
        hit = _FACTOR_CACHE.get(key)
        if hit is not None:
            _FACTOR_CACHE.move_to_end(key)
            return hit[:3]
    with single_threaded_blas():
        K, L, e_ = factor()
    size = K.nbytes + L.nbytes + sum(len(k) for k in key if isinstance(k, bytes))
    if 4 * size <= _FACTOR_CACHE_BYTES:
        K.flags.writeable = False
        L.flags.writeable = False
        with _FACTOR_LOCK:
            if key not in _FACTOR_CACHE:
                _FACTOR_CACHE[key] = (K, L, e_, size)
                _FACTOR_CACHE_USED += size
            while _FACTOR_CACHE_USED > _FACTOR_CACHE_BYTES:
                _FACTOR_CACHE_USED -= _FACTOR_CACHE.popitem(last=False)[1][3]
    return K, L, e_


def client_forward(X, y, blocks, components, noise_variance, phi, *, level_mean=0.0,
                   scale=1.0, client=None):
    """Statistics of one client for the structured posterior (its upload).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Client inputs (scaled units of the model).
    y : ndarray of shape (n,)
        Client targets (standardised units of the model).
    blocks : list
        From :func:`feature_blocks`.
    components : tuple of str
    noise_variance : float
        ``s2_i``.
    phi : float
        Deviation scale (ignored without the deviation component).
    level_mean : float, default=0.0
        Prior mean of the client level's whitened variable ``a`` (prior
        ``N(level_mean, 1)``; used only with a level block). A client that
        centres its targets at its own mean ``m`` passes ``y - m`` and
        ``level_mean = -m / sqrt(level_variance)``: the same bound, without
        quadratic forms of size ``m^2`` (docs/maths.md, section 10).
    scale : float, default=1.0
        The client's scale ``s_i > 0`` on the shared parts: its latent
        function is ``level + s_i (g + d_i) + l_i``, i.e. the global and
        deviation columns of ``E`` are multiplied by ``s_i`` (docs/maths.md,
        section 10).
    client : hashable, optional
        Label used in error messages.

    Returns
    -------
    ClientState
        Its ``S`` (M x M), ``b`` (M,) and ``e`` (scalar) are the message; the
        rest stays on the client.

    Raises
    ------
    CholeskyError
        If a ``K_zz`` or ``P`` cannot be factorised.
    """
    X = np.ascontiguousarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    n = X.shape[0]
    s2 = float(noise_variance)
    lay = _layout(blocks, components, scale)
    Kzz, Ls, eps = [], [], []
    for name, Z, ell, var, jit in blocks:
        K, L, e_ = _inducing_factor(name, Z, ell, var, jit, client)
        Kzz.append(K)
        Ls.append(L)
        eps.append(e_)
    Mf = lay.Mf
    Lam = np.zeros((Mf, Mf))
    off = 0
    for L in Ls:
        m = L.shape[0]
        Lam[off:off + m, off:off + m] = L
        off += m
    yy = float(y @ y)
    mu0 = float(level_mean) if lay.has_level else 0.0
    small = None
    K_rows = None
    if 0 < n <= CHUNK_ROWS and Mf:
        # one chunk
        Kr = _kernel_rows(X, blocks)
        if n * Mf <= KEEP_ROWS_ENTRIES:  # small: kept for the backward pass
            K_rows = Kr
        F = solve_lower(Lam, Kr.T).T
        Wf = F.T @ F
        Wf, wf = 0.5 * (Wf + Wf.T), F.T @ y  # as _whitened_statistics forms them
        if n < lay.n_c:
            # fewer observations than client variables: eliminate in data
            # space (None when that is not accurate here: then in N_c
            # space, with the same W_f and w_f)
            small = _eliminate_in_data_space(F, y, lay, phi, s2, mu0, client)
    else:
        Wf, wf = _whitened_statistics(X, y, blocks, Lam)
    if small is not None:
        Lp, PiGt, Pir, S, b, logdetP, Pinv, quad = small
    else:
        # E_g^T and E_c^T select (and scale) rows: slicing, never dense products
        WEc = lay.EcT(phi, Wf).T  # W_f E_c
        P = np.eye(lay.n_c) + lay.EcT(phi, WEc) / s2
        Lp = _chol(P, "P (client posterior precision)", client)
        Gm = lay.EgT(WEc) / s2
        r = lay.EcT(phi, wf) / s2
        if mu0:  # the level's prior N(mu0, 1): its natural shift, and mu0^2 in e
            r[lay.n_c - 1] += mu0
        PiGt = _chol_solve(Lp, Gm.T)
        Pir = _chol_solve(Lp, r)
        S = lay.EgT(lay.EgT(Wf).T) / s2 - Gm @ PiGt
        S = 0.5 * (S + S.T)
        b = lay.EgT(wf) / s2 - Gm @ Pir
        logdetP = 2.0 * float(np.sum(np.log(np.diag(Lp)))) if lay.n_c else 0.0
        quad = yy / s2 - float(r @ Pir) + mu0**2
        Pinv = None
    gam = lay.residual_coef(phi)
    # tr_R = sum over feature blocks of gamma_b (n var_b - tr(W_b^T W_b))
    tr_R, off = 0.0, 0
    for _, Z, _, var, _ in blocks:
        m = Z.shape[0]
        if m:
            tr_R += float(gam[off]) * (n * var - float(np.trace(Wf[off:off + m, off:off + m])))
        off += m
    e = n * (_LOG_2PI + np.log(s2)) + logdetP + quad + tr_R / s2
    if not (np.isfinite(e) and all_finite(S, b)):
        where = f" of client {client!r}" if client is not None else ""
        raise FloatingPointError(f"the structured statistics{where} are not finite")
    return ClientState(lay, blocks, Kzz, Ls, eps, Lam, Wf, wf, yy, n, s2, float(phi),
                       Lp, PiGt, Pir, S, b, float(e), tr_R, mu0, Pinv, K_rows)


def _eliminate_in_data_space(F, y, lay, phi, s2, mu0, client):
    """The client's elimination through its ``n x n`` data covariance (``n < N_c``).

    With ``F`` the whitened features (``n x M_f``), ``F_g = F E_g``,
    ``B = F E_c`` and ``C = s2 I + B B^T`` (the covariance of the client's
    targets given ``v_g``), ``P = I + B^T B / s2``, and the Woodbury identity
    gives, with ``y~ = y - mu0 B_a`` (``B_a`` the level's column) and
    ``alpha = C^{-1} y~``::

        P^{-1} G^T = B^T C^{-1} F_g
        S_i        = F_g^T C^{-1} F_g
        b_i        = F_g^T alpha
        P^{-1} r   = B^T alpha + mu0 e_a
        log|P|     = log|C| - n log s2
        y^T y / s2 - r^T P^{-1} r + mu0^2 = y~^T alpha
        P^{-1}     = I - B^T C^{-1} B

    the same quantities as the ``N_c``-space elimination, in ``O(n M_f^2)``
    rather than ``O(N_c^3 + N_c^2 M)`` operations, so that the cost of a
    client with a few observations follows its data. No term of the bound
    is a difference of two ``1/s2``-sized ones (the ``N_c``-space form's
    ``y^T y / s2 - r^T P^{-1} r`` is): with a tiny noise variance this form
    is the more accurate of the two (measured against a 50-digit
    reference), but not with a dominant level (see below).

    A prior variance far above the noise variance (``||B_j||^2 / s2`` above
    :data:`DATA_SPACE_MAX_RATIO` for a row ``j``, e.g. a huge level variance)
    makes ``C`` nearly singular along a direction spread over every entry,
    while ``P`` keeps it on one coordinate: the caller then eliminates in
    ``N_c`` space. Below that limit a dominant level still costs digits
    that ``P`` keeps: at ``tau^2 / s2 = 3e7`` the statistics carry relative
    errors of about ``1e-9`` against ``1e-12`` in ``N_c`` space (measured
    against a 50-digit reference), harmless for the fit but visible in
    finite differences of the bound with steps below ``1e-6``.

    Parameters
    ----------
    F : ndarray of shape (n, M_f)
        The client's whitened features (:func:`_whitened_rows`).
    y : ndarray of shape (n,)

    Returns
    -------
    tuple or None
        ``(Lp, PiGt, Pir, S, b, logdetP, Pinv, quad)``: ``Lp`` is None
        (``P`` is never formed); ``quad`` is the data-fit term
        ``y~^T C^{-1} y~`` of ``e``. None when the data-space form is not
        accurate here (see above).
    """
    if not (np.isfinite(s2) and s2 > 0):
        raise FloatingPointError(f"the noise variance of client {client!r} is not positive")
    n = F.shape[0]
    Fg = lay.EgT(F.T).T  # n x n_vg
    B = lay.EcT(phi, F.T).T  # n x N_c
    # C = s2 (I + B B^T / s2): factor the bracket, whose eigenvalues are at
    # least 1 (as P's), so that a huge level variance over a tiny noise
    # variance factorises whenever the N_c-space P would
    Cn = (B / s2) @ B.T
    if not all_finite(Cn) or float(Cn.diagonal().max()) > DATA_SPACE_MAX_RATIO:
        return None
    Cn.flat[:: n + 1] += 1.0
    try:
        Lc, _ = jittered_cholesky(Cn, scale=1.0, jitter=0.0, max_tries=1)
    except CholeskyError:
        return None
    yt = y - mu0 * B[:, lay.n_c - 1] if mu0 else y
    alpha = _chol_solve(Lc, yt) / s2
    CiFg = _chol_solve(Lc, Fg) / s2
    S = Fg.T @ CiFg
    S = 0.5 * (S + S.T)
    b = Fg.T @ alpha
    Pir = B.T @ alpha
    if mu0:
        Pir[lay.n_c - 1] += mu0
    PiGt = B.T @ CiFg
    logdetP = 2.0 * float(np.log(Lc.diagonal()).sum())
    Wc = solve_lower(Lc, B) / np.sqrt(s2)  # P^{-1} = I - B^T C^{-1} B = I - Wc^T Wc
    Pinv = -(Wc.T @ Wc)
    Pinv.flat[:: lay.n_c + 1] += 1.0
    return None, PiGt, Pir, S, b, logdetP, Pinv, float(yt @ alpha)


def _whitened_statistics(X, y, blocks, Lam):
    """``W_f = F^T F`` and ``w_f = F^T y`` with ``F = K Lambda^{-T}``, streamed over row chunks.

    The kernel rows are whitened first (a triangular solve per chunk), so
    ``W_f`` is a Gram matrix of computed rows: positive semi-definite to
    round-off whatever the conditioning of ``Lambda``. Whitening the raw
    Gram instead (``Lambda^{-1} K^T K Lambda^{-T}``, cheaper when
    ``n > 2 M_f``) loses about ``eps cond(K_zz) ||W_f||``, which made
    ``P = I + ... / s2`` indefinite for a nearly noise-free straight line
    (docs/maths.md, section 9) and makes the bound noisy to finite
    differences when ``K_zz`` is ill conditioned.
    """
    n = X.shape[0]
    Mf = Lam.shape[0]
    Wf = np.zeros((Mf, Mf))
    wf = np.zeros(Mf)
    if Mf == 0:
        return Wf, wf
    for a in range(0, n, CHUNK_ROWS):
        Fc = _whitened_rows(X[a:a + CHUNK_ROWS], blocks, Lam)
        Wf += Fc.T @ Fc
        wf += Fc.T @ y[a:a + CHUNK_ROWS]
    return 0.5 * (Wf + Wf.T), wf


def _whitened_rows(X, blocks, Lam):
    """Whitened kernel rows ``F = K(X, Z) Lambda^{-T}`` (``n x M_f``) of one chunk."""
    return solve_lower(Lam, _kernel_rows(X, blocks).T).T



# ---------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------


@dataclass
class ServerPosterior:
    """``q(v_g) = N(mu_g, A^{-1})`` and the collapsed ELBO.

    Attributes
    ----------
    mu : ndarray of shape (M,)
    A_inv : ndarray of shape (M, M)
    elbo : float
    logdet_A : float
    """

    mu: np.ndarray
    A_inv: np.ndarray
    elbo: float
    logdet_A: float


def combine(S_list, b_list, e_list, M):
    """The server's step: ``A = I + sum S_i``, ``mu_g = A^{-1} sum b_i``, ELBO.

    Parameters
    ----------
    S_list : list of ndarray of shape (M, M)
    b_list : list of ndarray of shape (M,)
    e_list : list of float
    M : int
        Size of ``v_g`` (0 without the global component).

    Returns
    -------
    ServerPosterior

    Raises
    ------
    FloatingPointError
        If the ELBO is not finite, or ``A`` is not positive definite in
        floating point (ill-conditioned statistics; the message says so).
    """
    e_sum = float(np.sum(e_list))
    if M == 0:
        elbo = -0.5 * e_sum
        post = ServerPosterior(np.zeros(0), np.zeros((0, 0)), elbo, 0.0)
    else:
        A = np.eye(M) + np.sum(S_list, axis=0)
        b = np.sum(b_list, axis=0)
        try:
            c = cho_factor(0.5 * (A + A.T), lower=True)
        except np.linalg.LinAlgError:
            # A >= I in exact arithmetic: failing here means the clients'
            # statistics lost their positive semi-definiteness to rounding
            raise FloatingPointError(
                "the global posterior precision I + sum_i S_i is not positive definite in "
                "floating point: the clients' statistics are ill-conditioned (typically "
                "nearly noise-free targets with as many inducing points as observations); "
                "use fewer inducing points (n_inducing) or set a larger noise_variance"
            ) from None
        mu = cho_solve(c, b)
        A_inv = cho_solve(c, np.eye(M))
        A_inv = 0.5 * (A_inv + A_inv.T)
        logdet = 2.0 * float(np.sum(np.log(np.diag(c[0]))))
        elbo = -0.5 * (e_sum + logdet - float(b @ mu))
        post = ServerPosterior(mu, A_inv, float(elbo), logdet)
    if not np.isfinite(post.elbo):
        raise FloatingPointError(f"the collapsed ELBO is not finite ({post.elbo})")
    return post


# ---------------------------------------------------------------------------
# posterior moments of one client
# ---------------------------------------------------------------------------


def client_posterior(state, mu, A_inv, *, want_H=True):
    """Mean and covariance of ``u = (v_g, c)`` under the optimal joint ``q``.

    Parameters
    ----------
    state : ClientState
    mu : ndarray of shape (M,)
    A_inv : ndarray of shape (M, M)
    want_H : bool, default=True
        Also return ``H`` (None otherwise; it costs an ``M_f x N_c x M``
        product the gradients do not need).

    Returns
    -------
    mu_u : ndarray of shape (N_u,)
    Sigma_u : ndarray of shape (N_u, N_u)
    H : ndarray of shape (M_f, M) or None
        ``z = H v_g + (independent of v_g)``: loading of the client's feature
        coefficients on ``v_g`` (for covariances between clients).
    """
    lay = state.layout
    ng = lay.n_vg
    mu_c = state.Pir - state.PiGt @ mu
    Sgc = -A_inv @ state.PiGt.T
    Sigma = np.empty((ng + lay.n_c, ng + lay.n_c))
    Sigma[:ng, :ng] = 0.5 * (A_inv + A_inv.T)
    Sigma[:ng, ng:] = Sgc
    Sigma[ng:, :ng] = Sgc.T
    Scc = _p_inverse(state) - state.PiGt @ Sgc  # P^{-1} + P^{-1} G^T A^{-1} G P^{-1}
    Sigma[ng:, ng:] = 0.5 * (Scc + Scc.T)
    mu_u = np.concatenate([mu, mu_c])
    H = None
    if want_H:
        E = state.E
        H = E[:, :ng] - E[:, ng:] @ state.PiGt
    return mu_u, Sigma, H


def _p_inverse(state):
    """``P^{-1}`` from the forward pass's factor (LAPACK ``dpotri``, not two solves)."""
    n_c = state.layout.n_c
    if not n_c:
        return np.zeros((0, 0))
    if state.Pinv is not None:
        return state.Pinv
    return cholesky_inverse(state.Lp)


# ---------------------------------------------------------------------------
# the client's backward pass: gradients
# ---------------------------------------------------------------------------


def client_backward(state, X, y, mu, A_inv, *, want_global=True, want_local=True):
    """Gradient of the collapsed ELBO with respect to this client's parameters.

    By Danskin's theorem the gradient of the ELBO (a maximum over the joint
    ``q``) is the partial derivative of the client's expected log likelihood
    at the optimal ``q``, which needs only ``mu_g`` and ``A^{-1}`` from the
    server.  The global parts of all clients' gradients add up to the
    gradient of the whole ELBO with respect to the global hyperparameters.

    Parameters
    ----------
    state : ClientState
        From :func:`client_forward` at the current parameters.
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,)
    mu : ndarray of shape (M,)
    A_inv : ndarray of shape (M, M)
    want_global, want_local : bool
        Which kernel blocks need gradients (the noise variance gradient is
        part of the local result; ``phi`` of the global one).

    Returns
    -------
    grads : dict
        Keys among ``Z_g``, ``lengthscale_g``, ``variance_g``, ``phi``
        (global) and ``Z_l``, ``lengthscale_l``, ``variance_l``,
        ``noise_variance`` and, with a global feature block,
        ``client_scale`` (the client's scale on the shared parts, whichever
        of ``want_global``/``want_local``), gradients with respect to the
        constrained values.
    """
    lay = state.layout
    s2, n, phi = state.s2, state.n, state.phi
    mu_u, Sigma_u, _ = client_posterior(state, mu, A_inv, want_H=False)
    # E is a selection and scaling: E @ M by slicing, never a dense product
    mu_z = lay.apply_E(phi, mu_u)
    ES = lay.apply_E(phi, Sigma_u)  # E Sigma_u, (M_f, N_u)
    Sigma_z = lay.apply_E(phi, ES.T).T
    Xi = Sigma_z + mu_z[:, None] * mu_z  # an outer product (np.outer costs more)
    gam = lay.residual_coef(phi)
    Wf, wf = state.Wf, state.wf
    quad = state.yy - 2.0 * float(mu_z @ wf) + float(np.sum(Xi * Wf)) + state.tr_R
    grads = {}
    if want_local:
        grads["noise_variance"] = -0.5 * n / s2 + quad / (2.0 * s2**2)
    Mg, sc = lay.Mg, lay.scale
    if Mg and (want_global or want_local):
        var_g = state.blocks[0][3]
        resid = wf - Wf @ mu_z
        # dl/dE = (resid mu_u^T - W_f E Sigma_u) / s2; summed over the entries of
        # E that map a block of u (v_g or w) onto the global features:
        # sum_k (dl/dE)[k, u_k] = (mu_u[rows] . resid[:Mg] - tr(W_f[:Mg] ES[:, rows])) / s2
        def on_global(rows):
            return (float(mu_u[rows] @ resid[:Mg])
                    - float(np.sum(Wf[:Mg] * ES[:, rows].T))) / s2
        t_w = on_global(lay.w_rows()) if lay.has_dev else 0.0
        unexplained = n * var_g - float(np.trace(Wf[:Mg, :Mg]))  # tr_R's global part / gamma
        if want_global and lay.has_dev:
            # E[k, w_k] = scale sqrt(phi); gamma_g = scale^2 (1 + phi)
            grads["phi"] = sc * t_w / (2.0 * np.sqrt(phi)) - sc**2 * unexplained / (2.0 * s2)
        # E[k, v_k] = scale, E[k, w_k] = scale sqrt(phi): linear in the scale
        # (a caller whose scale depends on a global value chains it there)
        t_v = on_global(lay.vg_rows()) if lay.has_global else 0.0
        g_share = (1.0 if lay.has_global else 0.0) + (phi if lay.has_dev else 0.0)
        grads["client_scale"] = (t_v + np.sqrt(phi) * t_w
                                 - sc * g_share * unexplained / s2)
    # adjoints of the whitened statistics W_f = Lam^{-1} K^T K Lam^{-T} and
    # w_f = Lam^{-1} K^T y, with Lam = blockdiag(L_b): only the wanted blocks'
    # columns are formed (Phibar[:, b] = Lam^{-T} Wbar[:, b] L_b^{-1}, and the
    # diagonal block of Lambar), O(M_f^2 M_b) rather than O(M_f^3)
    Wbar = -(Xi - np.diag(gam)) / (2.0 * s2)
    wbar = mu_z / s2
    Mf = lay.Mf
    if Mf == 0:
        return grads
    want = {"g": want_global, "l": want_local, "c": want_global}
    offs = []
    off = 0
    for name, Z, *_ in state.blocks:
        offs.append((off, off + Z.shape[0]))
        off += Z.shape[0]
    acc = {}
    cols = {}  # name -> (2 Phibar[:, b], psibar[b])
    for k, (name, Z, ell, var, _) in enumerate(state.blocks):
        if not want[name]:
            continue
        a, b_ = offs[k]
        Lb = state.Ls[k]
        R = 2.0 * Wbar[a:b_] @ Wf[:, a:b_] + wbar[a:b_, None] * wf[a:b_]
        Lbar = -solve_lower(Lb, R, trans=True)  # only its lower triangle is read
        Kbar_zz = cholesky_backward(Lb, Lbar)
        dZ, dell, dvar = _block_grad(name, Z, Z, state.Kzz[k], Kbar_zz, ell, var, sym=True)
        dvar += (state.eps[k] / var) * float(np.trace(Kbar_zz))
        # explicit n var_b in tr_R
        dvar += -float(gam[a]) * n / (2.0 * s2)
        acc[name] = [dZ, dell, dvar]
        T = solve_lower(Lb, Wbar[a:b_], trans=True).T  # Wbar[:, b] L_b^{-1} (Wbar symmetric)
        Pb = solve_lower(state.Lam, T, trans=True)  # Lam^{-T} T (Lam block diagonal)
        cols[name] = (2.0 * Pb, solve_lower(Lb, wbar[a:b_], trans=True))
    # data pass: Kbar[:, b] = K (Phibar + Phibar^T)[:, b] + y psibar[b]^T
    if acc:
        for a0 in range(0, n, CHUNK_ROWS):
            Xc = X[a0:a0 + CHUNK_ROWS]
            Kc = state.K_rows if state.K_rows is not None else _kernel_rows(Xc, state.blocks)
            yc = y[a0:a0 + CHUNK_ROWS]
            for k, (name, Z, ell, var, _) in enumerate(state.blocks):
                if name not in acc:
                    continue
                a, b_ = offs[k]
                Pb2, psib = cols[name]
                Kbar = Kc @ Pb2 + yc[:, None] * psib
                dZ, dell, dvar = _block_grad(name, Xc, Z, Kc[:, a:b_], Kbar, ell, var)
                acc[name][0] += dZ
                acc[name][1] += dell
                acc[name][2] += dvar
    for name, (dZ, dell, dvar) in acc.items():
        if name == "c":  # the client level's constant kernel: its variance only
            if state.level_mean:
                # the prior mean mu0 = -m / tau moves with tau^2: d(-KL)/d mu0 =
                # E[a] - mu0, d mu0 / d tau^2 = -mu0 / (2 tau^2)
                tau2 = next(v for nm, _, _, v, _ in state.blocks if nm == "c")
                dvar += ((float(mu_u[lay.level_row()]) - state.level_mean)
                         * (-state.level_mean / (2.0 * tau2)))
            grads["level_variance"] = float(dvar)
            continue
        grads[f"Z_{name}"] = dZ
        grads[f"lengthscale_{name}"] = dell
        grads[f"variance_{name}"] = float(dvar)
    return grads


# ---------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------


def layout_map(blocks, components, phi, scale=1.0):
    """``(E, n_vg)``: the map from ``u = (v_g, w, v, a)`` to feature coefficients.

    Parameters
    ----------
    blocks : list
        From :func:`feature_blocks`.
    components : tuple of str
    phi : float
    scale : float, default=1.0
        The client's scale on the shared parts (:func:`client_forward`).

    Returns
    -------
    E : ndarray of shape (M_f, N_u)
    n_vg : int
        Number of leading coordinates of ``u`` that are ``v_g``.
    """
    lay = _layout(blocks, components, scale)
    return lay.E(phi), lay.n_vg


def residual_coefficients(blocks, components, phi, scale=1.0):
    """``gamma_b`` of each block (multiplier of ``K_b - W_b W_b^T``; ``scale`` as in
    :func:`layout_map`)."""
    lay = _layout(blocks, components, scale)
    gam = lay.residual_coef(phi)
    out, off = [], 0
    for _, Z, *_ in blocks:
        out.append(float(gam[off]))
        off += Z.shape[0]
    return out


def test_features(Xs, blocks, client=None):
    """Whitened test features ``W_b* = k_b(X*, Z_b) L_b^{-T}`` of every block.

    Parameters
    ----------
    Xs : ndarray of shape (n*, d)
    blocks : list
        From :func:`feature_blocks`.
    client : hashable, optional

    Returns
    -------
    list of ndarray of shape (n*, M_b)
    """
    return _test_features(Xs, blocks, client)


def _test_features(Xs, blocks, client=None):
    """``W*`` per block and the prior diagonal / matrices."""
    Ws = []
    for (name, Z, ell, var, jit) in blocks:
        if name == "c":  # the level's single whitened feature: sqrt(level_variance)
            Ws.append(np.full((Xs.shape[0], 1), np.sqrt(var)))
            continue
        K = se_ard(Z, Z, ell, var)
        L, _ = jittered_cholesky(K, scale=var, jitter=jit, name=f"K_zz ({_BLOCK_NAMES[name]})",
                                 client=client)
        Ws.append(solve_lower(L, se_ard(Xs, Z, ell, var).T).T)
    return Ws


def predict_structured(Xs, blocks, components, phi, mu_u, Sigma_u, layout_E, *,
                       full_cov=False, per_component=False, scale=1.0, client=None):
    """Latent predictive mean and (co)variance of one client.

    Parameters
    ----------
    Xs : ndarray of shape (n*, d)
    blocks : list
        From :func:`feature_blocks`.
    components : tuple of str
    phi : float
    mu_u : ndarray of shape (N_u,)
    Sigma_u : ndarray of shape (N_u, N_u)
        Moments of ``u = (v_g, w, v, a)`` (:func:`client_posterior`), or the
        prior of the deviation, local and level parts for a never-seen client.
    layout_E : ndarray of shape (M_f, N_u)
        The map ``E`` at ``phi``.
    full_cov : bool
    per_component : bool
        Return ``{name: (mean, var)}`` per component (``"global"``,
        ``"deviation"``, ``"local"`` and, with a random client level,
        ``"level"``).
    scale : float, default=1.0
        The client's scale on the shared parts (:func:`client_forward`);
        ``layout_E`` must be the map at the same scale.
    client : hashable, optional

    Returns
    -------
    mean : ndarray of shape (n*,)
    cov : ndarray of shape (n*,) or (n*, n*)
        Latent covariance (no noise):
        ``F* Sigma_z F*^T + gamma_g (K_g** - W_g* W_g*^T) + (K_l** - W_l* W_l*^T)``
        (the level's feature is exact: no residual term).
    """
    lay = _layout(blocks, components, scale)
    Ws = _test_features(Xs, blocks, client)
    Fs = np.hstack(Ws) if Ws else np.zeros((Xs.shape[0], 0))
    nst = Xs.shape[0]
    if per_component:
        out = {}
        col = 0
        parts = []
        if lay.has_global:
            parts.append(("global", slice(col, col + lay.Mg), lay.scale**2, 0))
            col += lay.Mg
        if lay.has_dev:
            parts.append(("deviation", slice(col, col + lay.Mg), lay.scale**2 * phi, 0))
            col += lay.Mg
        index = {blk[0]: k for k, blk in enumerate(blocks)}
        if lay.has_local:
            parts.append(("local", slice(col, col + lay.Ml), 1.0, index["l"]))
            col += lay.Ml
        if lay.has_level:
            parts.append(("level", slice(col, col + 1), 1.0, index["c"]))
        for name, sl, coef, bi in parts:
            W = Ws[bi]
            c = np.sqrt(coef)
            m = c * (W @ mu_u[sl])
            S = Sigma_u[sl, sl]
            var = blocks[bi][3]
            if name == "level":  # exact rank-one feature: no residual term
                cv = W @ S @ W.T
                out[name] = (m, cv if full_cov else nonnegative_variance(
                    np.diag(cv).copy(), var, "level variance"))
                continue
            if full_cov:
                Kss = se_ard(Xs, Xs, blocks[bi][2], var)
                cv = coef * (W @ S @ W.T + Kss - W @ W.T)
                out[name] = (m, 0.5 * (cv + cv.T))
            else:
                v = coef * (np.einsum("ij,ij->i", W @ S, W) + var - np.einsum("ij,ij->i", W, W))
                out[name] = (m, nonnegative_variance(v, coef * var, f"{name} variance"))
        return out
    E = layout_E
    mean = Fs @ (E @ mu_u)
    Sz = E @ Sigma_u @ E.T
    gam = lay.residual_coef(phi)
    if full_cov:
        cov = Fs @ Sz @ Fs.T
        off = 0
        for k, (name, Z, ell, var, _) in enumerate(blocks):
            W = Ws[k]
            g = gam[off]
            off += Z.shape[0]
            if g:
                cov += g * (se_ard(Xs, Xs, ell, var) - W @ W.T)
        return mean, 0.5 * (cov + cov.T)
    var = np.einsum("ij,ij->i", Fs @ Sz, Fs)
    prior = 0.0
    off = 0
    for k, (name, Z, ell, v, _) in enumerate(blocks):
        W = Ws[k]
        g = gam[off]
        off += Z.shape[0]
        prior += (g if g else 1.0) * v
        if g:
            var += g * (v - np.einsum("ij,ij->i", W, W))
    return mean, nonnegative_variance(var, prior) if nst else var
