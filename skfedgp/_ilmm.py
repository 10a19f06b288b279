"""Multi-output (ILMM) form of the structured (collapsed) posterior.

Multi-output generalisation of :mod:`skfedgp._structured`: each client's
``Q`` channels are linear mixtures of independent latent GPs (an
instantaneous linear mixing model, ILMM)::

    y_q(x) = offset_q + sum_r B_g[q, r] h_g,r(x) + sum_r B_d[q, r] h_d,r(x)
             + sum_r B_l[q, r] h_l,r(x) + eps_q,          eps_q ~ N(0, s2_q)

with ``R_g`` global latents ``h_g,r ~ GP(0, k_g,r)`` (shared by all
clients), ``R_d <= R_g`` deviation latents ``h_d,r ~ GP(0, phi k_g,r)``
(one set per client, deviation ``r`` uses global kernel ``r``) and ``R_l``
local latents ``h_l,r ~ GP(0, k_l,r)``.  Every kernel is SE-ARD with *unit*
variance; the loadings ``B_g`` (``Q x R_g``, server), ``B_d`` (``Q x R_d``)
and ``B_l`` (``Q x R_l``, client) carry the scales.  Source: H. Yan (2026),
"Personalized Federated Hierarchical Gaussian Processes for
Privacy-Preserving Modeling of Heterogeneous Distributed Systems", arXiv
preprint arXiv:2609.19337, section 3.9, eqs. 34-39; the collapsed form
follows the scalar structured family (docs/maths.md, sections 9 and 12).

Notation (one client, index ``i`` dropped).  The whitened feature blocks are
``W_g,r = k_g,r(X, Z_g) L_g,r^{-T}`` (``n x M``) and
``W_l,r = k_l,r(X, Z_l) L_l,r^{-T}`` (``n x M_l``);
``F = [W_g,1 .. W_g,R, W_l,1 .. W_l,R_l]`` (``n x M_F``).  The inducing
variables are ``u = (v_g, c)`` with ``v_g = (v_g,1, .., v_g,R_g)``
(latent-major, ``N_g = R_g M``) and ``c = (w_1, .., w_R_d, v_l,1, ..,
v_l,R_l)``, all with prior ``N(0, I)``.  Channel ``q`` of the latent function
on the data is ``f_q = F E_q u``, where ``E_q`` (``M_F x N_u``) has exactly
one non-zero per column: ``v_g,r -> B_g[q, r]`` on block ``g,r``,
``w_r -> sqrt(phi) B_d[q, r]`` on block ``g,r``, ``v_l,r -> B_l[q, r]`` on
block ``l,r``.  With the observed-row mask ``D_q`` of channel ``q``::

    Lambda = sum_q E_q^T F^T D_q F E_q / s2_q,   h = sum_q E_q^T F^T D_q (y_q - offset_q) / s2_q
    P = I + Lambda_cc,  G = Lambda_gc,  r = h_c
    S = Lambda_gg - G P^{-1} G^T,  b = h_g - G P^{-1} r
    e = sum_q [n_q log(2 pi s2_q) + ||D_q (y_q - offset_q)||^2 / s2_q + tr_R,q / s2_q]
        + log|P| - r^T P^{-1} r

which are the conventions of :func:`skfedgp._structured.combine`
(``ELBO = -1/2 [sum_i e_i + log|A| - b^T A^{-1} b]``, ``A = I + sum_i S_i``).
``tr_R,q`` is the VFE trace term of channel ``q``:
``sum_r (B_g[q,r]^2 + phi B_d[q,r]^2)(n_q - ||D_q W_g,r||_F^2) +
B_l[q,r]^2 (n_q - ||D_q W_l,r||_F^2)``.

Every ``n``-sized product streams over row chunks; the per-channel
statistics are ``M_F``-sized (``Q`` Gram matrices of ``M_F x M_F``).
Rows whose channels are all observed share one Gram ``W_all``; only rows
with some channel missing are added per channel (``Wf_q = W_all + Wc_q``,
``Wc_q = 0`` for a channel observed on every row), so complete data costs one
Gram product per chunk and one whitening.  A row with every channel missing
contributes nothing.

Cost.  The channel sums collapse: with ``U = W_all[idx, idx]`` (the shared
Gram on the coordinates of ``u``) and ``C = [c_1 .. c_Q]^T`` (``coef``),
``Lambda = (C^T diag(1/s2) C) o U + sum_q (c_q c_q^T / s2_q) o Wc_q[idx, idx]``;
in the gradient ``tr(Xi_q Wf_q) = c_q^T (U_q o Sig2) c_q`` and
``d/dc_q = [mu_u o wf_q[idx] - (U_q o Sig2) c_q - ...] / s2_q`` with
``Sig2 = Sigma_u + mu_u mu_u^T``, so one Hadamard product serves all
channels, and the adjoints of the whitened Grams are needed summed over the
channels (one back-whitening) plus once per channel with partial rows.  With
few rows (``n < 2 M_F (1 + p)``, ``p`` the channels with partial rows) the
rows are whitened (``F = K Lambda^{-T}``) instead of the Gram matrices.  No
sparse matrices: ``E_q`` is applied by slicing the contiguous groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._hierarchy import Packer
from ._linalg import (DEFAULT_JITTER, cholesky_backward, cholesky_inverse, jittered_cholesky,
                      solve_lower)
from ._structured import CHUNK_ROWS, _se, _se_grad, _se_grad_sym, cached_factor

__all__ = [
    "ILMMState",
    "forward",
    "backward",
    "posterior",
    "offset_uncertainty",
    "predict",
    "global_spec",
    "local_spec",
]

_LOG_2PI = float(np.log(2.0 * np.pi))
_COMPONENTS = ("global", "deviation", "local")


# ---------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------


@dataclass
class _Layout:
    """Feature blocks, the coordinates of ``u`` and their map to features.

    Attributes
    ----------
    Q : int
        Number of channels.
    blocks : list of tuple
        ``(kind, r, Z, lengthscale, start, stop)`` per feature block, kind
        ``"g"`` or ``"l"``; ``[start, stop)`` its columns of ``F``.
    idx : ndarray of shape (N_u,)
        Feature (column of ``F``) of each coordinate of ``u``.
    groups : list of tuple
        ``(name, r, slice)``: the coordinates of ``u`` of latent ``r`` of
        component ``name`` (``"global"``, ``"deviation"``, ``"local"``).
    n_vg : int
        Number of leading coordinates of ``u`` that are ``v_g``.
    coef : ndarray of shape (Q, N_u)
        The non-zero of each column of ``E_q``.
    bsize : ndarray of shape (M_F,)
        Size of the feature block of each feature.
    R_gl : int
        Rows of ``lengthscale_g`` given (0 without global kernels).
    """

    Q: int
    blocks: list
    idx: np.ndarray
    groups: list
    n_vg: int
    coef: np.ndarray
    bsize: np.ndarray
    R_gl: int
    phi: float

    @property
    def Mf(self):
        return int(self.bsize.shape[0])

    @property
    def Nu(self):
        return int(self.idx.shape[0])

    @property
    def n_c(self):
        return self.Nu - self.n_vg

    def pairs(self):
        """``(u-slice, feature-slice)`` per group: ``idx[u-slice]`` is the feature range."""
        return [(sl, slice(int(self.idx[sl.start]), int(self.idx[sl.start]) + sl.stop - sl.start))
                for _, _, sl in self.groups]

    def scatter(self, A):
        """``Sel @ A`` (``Sel`` the ``M_F x N_u`` 0/1 map ``u -> F``; ``E_q = Sel diag(coef[q])``).

        Rows of ``A`` (``N_u``, ...) are summed into their feature (``M_F``, ...).
        """
        out = np.zeros((self.Mf,) + A.shape[1:])
        for us, fs in self.pairs():
            out[fs] += A[us]
        return out

    def scatter2(self, A):
        """``Sel @ A @ Sel^T`` for ``A`` of shape (N_u, N_u): shape (M_F, M_F)."""
        T = self.scatter(A)
        out = np.zeros((self.Mf, self.Mf))
        for us, fs in self.pairs():
            out[:, fs] += T[:, us]
        return out

    def gather2(self, W):
        """``W[idx][:, idx]`` for ``W`` of shape (M_F, M_F): the Gram on ``u`` coordinates.

        Copied block by block (``idx`` is a few contiguous ranges): the same
        numbers as the fancy indexing, at half its cost.
        """
        pairs = self.pairs()
        out = np.empty((self.Nu, self.Nu))
        for us, fs in pairs:
            for ut, ft in pairs:
                out[us, ut] = W[fs, ft]
        return out


def _components(components):
    comps = tuple(components)
    bad = [c for c in comps if c not in _COMPONENTS]
    if bad or not comps:
        raise ValueError(f"components must be a non-empty subset of {_COMPONENTS}, got {comps!r}")
    return comps


def _layout(G, L, components):
    """Build the :class:`_Layout` of one client from the parameter dicts."""
    comps = _components(components)
    has_g, has_d, has_l = ("global" in comps, "deviation" in comps, "local" in comps)
    Bg = np.asarray(G["B_g"], float) if has_g else None
    Bd = np.asarray(L["B_d"], float) if has_d else None
    Bl = np.asarray(L["B_l"], float) if has_l else None
    Qs = {B.shape[0] for B in (Bg, Bd, Bl) if B is not None}
    if len(Qs) != 1:
        raise ValueError(f"the loadings disagree on the number of channels: {sorted(Qs)}")
    Q = Qs.pop()
    for name, B in (("B_g", Bg), ("B_d", Bd), ("B_l", Bl)):
        if B is not None and (B.ndim != 2 or not np.all(np.isfinite(B))):
            raise ValueError(f"{name} must be a finite (Q, R) matrix, got shape {B.shape}")
    blocks, off = [], 0
    R_gl = 0
    if has_g or has_d:
        Zg = np.asarray(G["Z_g"], float)
        ell_g = np.atleast_2d(np.asarray(G["lengthscale_g"], float))
        R_gl = ell_g.shape[0]
        n_gf = Bg.shape[1] if has_g else Bd.shape[1]
        if has_g and Bg.shape[1] != R_gl:
            raise ValueError(f"B_g has {Bg.shape[1]} columns but lengthscale_g has {R_gl} rows")
        if has_d and Bd.shape[1] > R_gl:
            raise ValueError(f"R_d = {Bd.shape[1]} deviation latents need R_d <= R_g = {R_gl}")
        for r in range(n_gf):
            blocks.append(("g", r, Zg, ell_g[r], off, off + Zg.shape[0]))
            off += Zg.shape[0]
    if has_l:
        Zl = np.asarray(L["Z_l"], float)
        ell_l = np.atleast_2d(np.asarray(L["lengthscale_l"], float))
        if Bl.shape[1] != ell_l.shape[0]:
            raise ValueError(f"B_l has {Bl.shape[1]} columns but lengthscale_l has "
                             f"{ell_l.shape[0]} rows")
        for r in range(ell_l.shape[0]):
            blocks.append(("l", r, Zl, ell_l[r], off, off + Zl.shape[0]))
            off += Zl.shape[0]
    Mf = off
    bsize = np.empty(Mf)
    for *_, a, b in blocks:
        bsize[a:b] = b - a
    gblk = [bl for bl in blocks if bl[0] == "g"]
    lblk = [bl for bl in blocks if bl[0] == "l"]
    phi = float(G["phi"]) if has_d else 0.0
    # latent functions in the order of u: (block, loading column) of each
    parts = [("global", r, bl, Bg[:, r]) for r, bl in enumerate(gblk)] if has_g else []
    n_vg = sum(bl[5] - bl[4] for _, _, bl, _ in parts)
    if has_d:
        parts += [("deviation", r, gblk[r], np.sqrt(phi) * Bd[:, r]) for r in range(Bd.shape[1])]
    if has_l:
        parts += [("local", r, bl, Bl[:, r]) for r, bl in enumerate(lblk)]
    idx, groups, coefs, col = [], [], [], 0
    for name, r, bl, b in parts:
        m = bl[5] - bl[4]
        idx.append(np.arange(bl[4], bl[5]))
        groups.append((name, r, slice(col, col + m)))
        coefs.append(np.repeat(b[:, None], m, axis=1))
        col += m
    idx = np.concatenate(idx) if idx else np.zeros(0, int)
    coef = np.hstack(coefs) if coefs else np.zeros((Q, 0))
    return _Layout(Q, blocks, idx.astype(np.intp), groups, n_vg, coef, bsize, R_gl, phi)


def _block_name(kind, r):
    return f"K_zz ({'global' if kind == 'g' else 'local'}, latent {r})"


def _block_factor(kind, r, Z, ell, jitter, client):
    """``K_zz`` (unit variance) of one block and its jittered Cholesky factor, cached.

    A pure function of ``(Z, lengthscales, jitter)``: within a phase of
    training most blocks repeat (the global ones over a client's local phase
    and over the clients, a client's own ones over the server's phase), so
    the factors are kept in :func:`skfedgp._structured.cached_factor`'s
    cache (same memory budget and lock; read-only arrays).
    """
    Z = np.asarray(Z, dtype=float)
    ell = np.asarray(ell, dtype=float)

    def factor():
        K = _se(Z, Z, ell, 1.0)
        Lc, e_ = jittered_cholesky(K, scale=1.0, jitter=jitter, name=_block_name(kind, r),
                                   client=client)
        return K, Lc, e_

    K, Lc, _ = cached_factor(("ilmm", Z.shape, Z.tobytes(), ell.tobytes(), float(jitter)),
                             factor)
    return K, Lc


def _factor_blocks(lay, jitter, client):
    """``K_zz`` (unit variance) and its jittered Cholesky factor per feature block."""
    Kzz, Ls = [], []
    for kind, r, Z, ell, _, _ in lay.blocks:
        K, Lc = _block_factor(kind, r, Z, ell, jitter, client)
        Kzz.append(K)
        Ls.append(Lc)
    return Kzz, Ls


def _kernel_rows(Xc, lay):
    if not lay.blocks:
        return np.zeros((Xc.shape[0], 0))
    return np.hstack([_se(Xc, Z, ell, 1.0) for _, _, Z, ell, _, _ in lay.blocks])


def _lsolve(lay, Ls, B, trans=False):
    """``Lambda^{-1} B`` (or ``Lambda^{-T} B``), ``Lambda`` the block-diagonal factor."""
    out = np.empty_like(B, dtype=float)
    for Lc, (*_, a, b) in zip(Ls, lay.blocks):
        out[a:b] = solve_lower(Lc, B[a:b], trans=trans)
    return out


def _noise(L, Q):
    s2 = np.asarray(L["noise_variance"], float)
    iso = s2.ndim == 0
    s2q = np.full(Q, float(s2)) if iso else s2.reshape(-1)
    if s2q.shape != (Q,):
        raise ValueError(f"noise_variance must be a float or shape ({Q},), got {s2.shape}")
    if not np.all(np.isfinite(s2q)) or np.any(s2q <= 0):
        raise ValueError(f"noise_variance must be finite and positive, got {s2}")
    return s2q, iso, s2.shape


def _offset(L, Q):
    off = np.asarray(L.get("offset", np.zeros(Q)), float).reshape(-1)
    if off.shape != (Q,):
        raise ValueError(f"offset must have shape ({Q},), got {off.shape}")
    return off


def _check_data(X, Y, Q):
    X = np.ascontiguousarray(X, dtype=float)
    Y = np.asarray(Y, dtype=float)
    if Y.ndim == 1 and Q == 1:
        Y = Y[:, None]
    if X.ndim != 2 or Y.ndim != 2 or Y.shape != (X.shape[0], Q):
        raise ValueError(f"X must be (n, d) and Y (n, {Q}); got {X.shape} and {Y.shape}")
    if np.any(np.isinf(Y)):
        raise ValueError("Y contains inf (only NaN marks a missing entry)")
    return X, Y


def _chunk(X, Y, off, a, step=CHUNK_ROWS):
    """Rows ``a:a+step`` with at least one observed channel: ``Xc, O, Yc``."""
    Yc = Y[a:a + step]
    O = ~np.isnan(Yc)
    keep = O.any(axis=1)
    Xc = X[a:a + step][keep]
    O = O[keep]
    Yc = np.where(O, Yc[keep] - off, 0.0)
    return Xc, O, Yc


# ---------------------------------------------------------------------------
# forward: the client's statistics
# ---------------------------------------------------------------------------


@dataclass
class ILMMState:
    """Everything one ILMM client keeps between its two exchanges (never sent).

    Attributes
    ----------
    S : ndarray of shape (N_g, N_g)
        Uploaded precision contribution on ``v_g`` (``N_g = R_g M``, 0
        without the global component).
    b : ndarray of shape (N_g,)
        Uploaded linear term.
    e : float
        Uploaded scalar (``-2 x`` the client's collapsed terms).
    layout : _Layout
        Feature blocks and the map ``E_q`` (internal).
    Wf : ndarray of shape (Q, M_F, M_F)
        Whitened per-channel Grams ``F^T D_q F`` (a property, formed on
        first access from the Grams :func:`forward` keeps apart from
        ``_cache``, so that it survives a cleared cache).
    wf : ndarray of shape (M_F, Q)
        ``F^T D_q (y_q - offset_q)``.
    wk : ndarray of shape (M_F, Q)
        ``F^T D_q 1``.
    yy, ysum, n_q : ndarray of shape (Q,)
        ``||D_q (y_q - offset_q)||^2``, ``sum D_q (y_q - offset_q)`` and the
        number of observed entries per channel.
    s2 : ndarray of shape (Q,)
        Noise variance per channel.
    noise_iso : bool
        Whether the noise variance was given as one float.
    noise_shape : tuple
        Shape of the given noise variance (that of its gradient).
    trR : ndarray of shape (Q,)
        VFE trace term per channel.
    gam : ndarray of shape (Q, M_F)
        Multiplier of ``(n_q / M_b - (F^T D_q F)_ff)`` in ``trR``.
    Kzz, Ls : list of ndarray
        Per feature block, ``K_zz`` and its jittered Cholesky factor.
    Lp, PiGt, Pir : ndarray
        ``chol(P)``, ``P^{-1} G^T`` (N_c, N_g), ``P^{-1} r`` (N_c,).
    offset : ndarray of shape (Q,)
    _cache : dict
        Internal, filled by :func:`forward` and reused by :func:`posterior`
        and :func:`backward`: ``W_all`` (M_F, M_F), its ``U_all = W_all[idx,
        idx]`` (N_u, N_u), ``Wc`` ``{q: (M_F, M_F)}``, ``rows`` (the raw
        and whitened kernel rows of a client of at most ``CHUNK_ROWS``
        rows, which :func:`backward` reuses: it must then be called with
        the same ``X`` and ``Y`` as :func:`forward`) and, once computed,
        ``Pinv`` (N_c, N_c).  Without it :func:`backward` treats every
        channel as partially observed (same results, slower).
    """

    S: np.ndarray
    b: np.ndarray
    e: float
    layout: _Layout
    wf: np.ndarray
    wk: np.ndarray
    yy: np.ndarray
    ysum: np.ndarray
    n_q: np.ndarray
    s2: np.ndarray
    noise_iso: bool
    noise_shape: tuple
    trR: np.ndarray
    gam: np.ndarray
    Kzz: list
    Ls: list
    Lp: np.ndarray
    PiGt: np.ndarray
    Pir: np.ndarray
    offset: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False, compare=False)
    #: ``(W_all, Wc)`` from forward, from which :attr:`Wf` is formed (kept
    #: apart from ``_cache``, which may be cleared), and ``Wf`` once formed
    _grams: tuple = field(default=None, repr=False, compare=False)
    _Wf: np.ndarray = field(default=None, repr=False, compare=False)

    @property
    def Wf(self):
        """Whitened per-channel Grams ``F^T D_q F``, shape (Q, M_F, M_F).

        Formed on first access from forward's ``W_all`` and ``Wc`` (the
        passes themselves never need the ``Q`` copies).
        """
        if self._Wf is None:
            W_all, Wc = self._grams
            Wf = np.empty((self.layout.Q,) + W_all.shape)
            Wf[:] = W_all
            for q, Wq in Wc.items():
                Wf[q] += Wq
            self._Wf = Wf
        return self._Wf


def _whiten_adjoint(lay, Ls, Wbar):
    """``2 sym(Lambda^{-T} Wbar Lambda^{-1})``: adjoint of a raw Gram from that of its whitening."""
    T = _lsolve(lay, Ls, Wbar, trans=True)
    Pq = _lsolve(lay, Ls, np.ascontiguousarray(T.T), trans=True).T
    return Pq + Pq.T


def _use_features(Y, Mf):
    """Form the backward pass's row adjoint on whitened rows rather than through Gram adjoints?

    (The forward statistics always whiten the rows, :func:`_data_statistics`.)
    Whitening a Gram costs ``2 M_F^2 M_b`` per Gram (one shared Gram plus one
    per channel with partially observed rows), whitening the rows ``n M_F
    M_b``: rows win when ``n < 2 M_F (1 + p)``; they are then processed in one
    block.  Both are exact; for large ``n`` the Grams are accumulated over row
    chunks instead.
    """
    O = ~np.isnan(Y)
    O = O[O.any(axis=1)]
    n_k = O.shape[0]
    if n_k > 2 * Mf * (1 + Y.shape[1]):  # cheap bound first
        return False
    p = int(np.count_nonzero(O[~O.all(axis=1)].any(axis=0)))
    return n_k <= 2 * Mf * (1 + p)


def _data_statistics(X, Y, off, lay, Ls):
    """Whitened data statistics of one client.

    The kernel rows are whitened before their Grams are taken
    (``F = K Lambda^{-T}``, one triangular solve per chunk of rows).

    Returns
    -------
    W_all : ndarray of shape (M_F, M_F)
        ``F^T F`` over the rows with every channel observed.
    Wc : dict
        ``{q: F^T D_q F}`` over the rows with some channel missing and ``q``
        observed, for the channels that have such rows (``Wf_q = W_all + Wc[q]``).
    wf, wk : ndarray of shape (M_F, Q)
    yy, ysum, n_q : ndarray of shape (Q,)
    rows : tuple or None
        With a single chunk of rows: ``(Xc, O, Yc, K, F)``, the chunk, its
        kernel rows and their whitening (what :func:`backward` would form
        again), else None.
    """
    Q, Mf = lay.Q, lay.Mf
    rows_kept = None
    # whiten the kernel rows (chunk by chunk), never the raw Grams: Grams of
    # whitened rows stay positive semi-definite whatever the conditioning of
    # the K_zz (docs/maths.md, section 9)
    Phi_all = np.zeros((Mf, Mf))  # rows with every channel observed
    Phi = {}  # per channel with partially observed rows: the Gram of those rows
    psi = np.zeros((Mf, Q))
    kap = np.zeros((Mf, Q))
    yy = np.zeros(Q)
    ysum = np.zeros(Q)
    n_q = np.zeros(Q)
    for a in range(0, X.shape[0], CHUNK_ROWS):
        Xc, O, Yc = _chunk(X, Y, off, a, CHUNK_ROWS)
        if Xc.shape[0] == 0:
            continue
        Kraw = _kernel_rows(Xc, lay)
        Kc = _lsolve(lay, Ls, np.ascontiguousarray(Kraw.T)).T  # K Lambda^{-T}
        if a == 0 and X.shape[0] <= CHUNK_ROWS:
            rows_kept = (Xc, O, Yc, Kraw, Kc)
        full = O.all(axis=1)
        Kf = Kc[full]
        Phi_all += Kf.T @ Kf
        part = ~full
        if part.any():
            for q in range(Q):
                rows = part & O[:, q]
                if rows.any():
                    Kp = Kc[rows]
                    Phi[q] = Phi[q] + Kp.T @ Kp if q in Phi else Kp.T @ Kp
        psi += Kc.T @ Yc
        kap += Kc.T @ O
        yy += np.sum(Yc**2, axis=0)
        ysum += Yc.sum(axis=0)
        n_q += O.sum(axis=0)
    for W in [Phi_all] + list(Phi.values()):  # exactly symmetric
        W += W.T
        W *= 0.5
    return Phi_all, dict(sorted(Phi.items())), psi, kap, yy, ysum, n_q, rows_kept


def forward(X, Y, G, L, components, *, jitter=DEFAULT_JITTER, client=None):
    """Statistics of one ILMM client for the structured posterior (its upload).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Client inputs (the model's scaled units).
    Y : ndarray of shape (n, Q)
        Client targets; NaN marks a missing entry (masked out of the
        likelihood).  A row with every channel missing contributes nothing.
    G : dict
        Global constrained values: ``Z_g`` (M, d) and ``lengthscale_g``
        (R_g, d) when the global or deviation component is used; ``B_g``
        (Q, R_g) with the global component; ``phi`` (float) with the
        deviation component.
    L : dict
        Local constrained values: ``Z_l`` (M_l, d), ``lengthscale_l``
        (R_l, d), ``B_l`` (Q, R_l) with the local component; ``B_d``
        (Q, R_d) with the deviation component; ``noise_variance`` (float, or
        (Q,) per channel); ``offset`` (Q,).
    components : tuple of str
        Non-empty subset of ``("global", "deviation", "local")``.
    jitter : float, default=DEFAULT_JITTER
        Relative jitter of every ``K_zz`` (the kernels have unit variance).
    client : hashable, optional
        Label used in error messages.

    Returns
    -------
    ILMMState
        Its ``S`` (N_g, N_g), ``b`` (N_g,) and ``e`` (float) are the message,
        for :func:`skfedgp._structured.combine` with ``M = N_g``.

    Raises
    ------
    CholeskyError
        If a ``K_zz`` or the client precision ``P`` cannot be factorised
        (names the matrix and the client).
    FloatingPointError
        If the statistics are not finite.
    ValueError
        If the shapes of the parameters or the data disagree.
    """
    lay = _layout(G, L, components)
    Q = lay.Q
    X, Y = _check_data(X, Y, Q)
    s2, iso, s2shape = _noise(L, Q)
    off = _offset(L, Q)
    Kzz, Ls = _factor_blocks(lay, jitter, client)
    Mf = lay.Mf
    W_all, Wc, wf, wk, yy, ysum, n_q, rows = _data_statistics(X, Y, off, lay, Ls)
    idx, C = lay.idx, lay.coef
    Cs = C / s2[:, None]
    # Lambda = sum_q (c_q c_q^T / s2_q) o Wf_q[idx, idx]
    U_all = lay.gather2(W_all)
    Lam = (Cs.T @ C) * U_all
    for q, Wq in Wc.items():
        Lam += np.outer(Cs[q], C[q]) * lay.gather2(Wq)
    h = np.einsum("qj,jq->j", Cs, wf[idx])
    gam = np.zeros((Q, Mf))
    for q in range(Q):
        gam[q] = np.bincount(idx, weights=C[q] ** 2, minlength=Mf)
    dWf = np.repeat(np.diag(W_all)[None], Q, axis=0)
    for q, Wq in Wc.items():
        dWf[q] += np.diag(Wq)
    trR = (np.sum(gam * (n_q[:, None] / lay.bsize[None, :] - dWf), axis=1) if Mf
           else np.zeros(Q))
    ng, n_c = lay.n_vg, lay.n_c
    P = Lam[ng:, ng:].copy()
    P[np.diag_indices(n_c)] += 1.0
    Gm = Lam[:ng, ng:]
    r = h[ng:]
    if n_c:
        # jittered_cholesky reads the lower triangle only
        Lp, _ = jittered_cholesky(P, scale=1.0, jitter=1e-12,
                                  name="P (client posterior precision)", client=client)
        V = solve_lower(Lp, Gm.T)  # Lp^{-1} G^T, (N_c, N_g)
        z = solve_lower(Lp, r)
        PiGt = solve_lower(Lp, V, trans=True)
        Pir = solve_lower(Lp, z, trans=True)
        S = Lam[:ng, :ng] - V.T @ V
        b = h[:ng] - V.T @ z
        rPr = float(z @ z)
        logdetP = 2.0 * float(np.sum(np.log(np.diag(Lp))))
    else:
        Lp, PiGt, Pir = np.zeros((0, 0)), np.zeros((0, ng)), np.zeros(0)
        S, b, rPr, logdetP = Lam[:ng, :ng].copy(), h[:ng].copy(), 0.0, 0.0
    S = 0.5 * (S + S.T)
    e = (float(np.sum(n_q * (_LOG_2PI + np.log(s2)))) + logdetP + float(np.sum(yy / s2))
         - rPr + float(np.sum(trR / s2)))
    if not np.isfinite(e) or not np.all(np.isfinite(S)) or not np.all(np.isfinite(b)):
        where = f" of client {client!r}" if client is not None else ""
        raise FloatingPointError(f"the ILMM structured statistics{where} are not finite")
    return ILMMState(S, b, float(e), lay, wf, wk, yy, ysum, n_q, s2, iso, s2shape, trR,
                     gam, Kzz, Ls, Lp, PiGt, Pir, off,
                     _cache={"W_all": W_all, "U_all": U_all, "Wc": Wc, "rows": rows},
                     _grams=(W_all, Wc))


# ---------------------------------------------------------------------------
# posterior moments of one client
# ---------------------------------------------------------------------------


def posterior(state, mu, A_inv):
    """Mean and covariance of ``u = (v_g, c)`` under the optimal joint ``q``.

    ``q(v_g) = N(mu, A^{-1})`` (from the server) and
    ``q(c | v_g) = N(P^{-1}(r - G^T v_g), P^{-1})`` (the client's own).

    Parameters
    ----------
    state : ILMMState
    mu : ndarray of shape (N_g,)
    A_inv : ndarray of shape (N_g, N_g)

    Returns
    -------
    mu_u : ndarray of shape (N_u,)
        Ordered ``(v_g,1 .. v_g,R_g, w_1 .. w_R_d, v_l,1 .. v_l,R_l)``.
    Sigma_u : ndarray of shape (N_u, N_u)
    H : ndarray of shape (N_u, N_g)
        ``u = H v_g + (a part independent of v_g)``, i.e.
        ``H = [I; -P^{-1} G^T]``; the covariance between two clients'
        variables is ``H_i A^{-1} H_j^T`` (and between their channel-``q``
        feature coefficients ``E_q,i H_i A^{-1} H_j^T E_q',j^T``).  Unlike
        :func:`skfedgp._structured.client_posterior`, whose ``H`` is already
        mapped to the (single) feature coefficients, this ``H`` is on ``u``
        because the map ``E_q`` differs per channel.
    """
    mu_u, Sigma = _joint_moments(state, mu, A_inv)
    H = np.vstack([np.eye(state.layout.n_vg), -state.PiGt])
    return mu_u, Sigma, H


def offset_uncertainty(state, Sigma_u):
    """Estimation uncertainty of the client's constant means (flat prior).

    For the multi-output (ILMM) clients; scalar clients treat their level as
    a Gaussian random effect instead (docs/maths.md, section 13). Here,
    for the outputs ``O`` the client observed, with
    ``A_q = E_q^T F^T D_q 1 / s2_q`` (column ``q`` of ``A``), the joint
    Gaussian over ``(u, c_O)`` has precision
    ``[[Sigma_u^{-1}, A_O], [A_O^T, diag(n_q / s2_q)]]``, so
    ``Cov(c_O) = (diag(n_q / s2_q) - A_O^T Sigma_u A_O)^{-1}`` and
    ``E[u | c_O] = mu_u - Sigma_u A_O (c_O - c_hat_O)``.

    Parameters
    ----------
    state : ILMMState
    Sigma_u : ndarray of shape (N_u, N_u)
        From :func:`posterior`.

    Returns
    -------
    covariance : ndarray of shape (Q_O, Q_O)
        ``Cov(c_O)`` (standardised units squared).
    gain : ndarray of shape (N_u, Q_O)
        ``K = dE[u | c_O] / dc_O = -Sigma_u A_O``.
    observed : ndarray of int of shape (Q_O,)
        The outputs ``O``.
    """
    lay = state.layout
    obs = np.flatnonzero(np.asarray(state.n_q) > 0)
    s2 = np.broadcast_to(np.asarray(state.s2, float), (lay.Q,))
    A = (lay.coef.T * state.wk[lay.idx])[:, obs] / s2[obs]  # (N_u, Q_O)
    K = -(Sigma_u @ A)
    prec = np.asarray(state.n_q, float)[obs] / s2[obs]
    H = np.diag(prec) + A.T @ K
    H = 0.5 * (H + H.T)
    # H is positive definite in exact arithmetic (u's prior is proper); keep
    # round-off from making an eigenvalue vanish
    lam, U = np.linalg.eigh(H)
    lam = np.maximum(lam, 1e-12 * float(np.max(prec, initial=1.0)))
    return (U / lam) @ U.T, K, obs


def _p_inverse(state):
    """``P^{-1}`` (cached on the state: forward's factor serves posterior and backward)."""
    Pinv = state._cache.get("Pinv")
    if Pinv is None:
        if state.layout.n_c:
            Pinv = cholesky_inverse(state.Lp)
        else:
            Pinv = np.zeros((0, 0))
        state._cache["Pinv"] = Pinv
    return Pinv


def _joint_moments(state, mu, A_inv):
    """``mu_u`` (N_u,) and ``Sigma_u`` (N_u, N_u) of :func:`posterior` (without ``H``)."""
    lay = state.layout
    mu = np.asarray(mu, float)
    A_inv = np.asarray(A_inv, float)
    ng = lay.n_vg
    mu_u = np.concatenate([mu, state.Pir - state.PiGt @ mu])
    Sigma = np.empty((lay.Nu, lay.Nu))
    Sgc = -A_inv @ state.PiGt.T
    Sigma[:ng, :ng] = A_inv
    Sigma[:ng, :ng] += A_inv.T
    Sigma[:ng, :ng] *= 0.5
    Sigma[:ng, ng:] = Sgc
    Sigma[ng:, :ng] = Sgc.T
    Scc = state.PiGt @ Sgc
    Scc -= _p_inverse(state)
    Scc += Scc.T
    Scc *= -0.5
    Sigma[ng:, ng:] = Scc
    return mu_u, Sigma


# ---------------------------------------------------------------------------
# backward: gradients (Danskin)
# ---------------------------------------------------------------------------


def _split_grams(state):
    """``(W_all, W_all[idx, idx], {q: correction})`` with ``Wf_q = W_all + correction_q``.

    From forward's cache; a state built otherwise is treated as having every
    channel corrected (``W_all = 0``), which gives the same results.
    """
    c = state._cache
    if "W_all" in c:
        return c["W_all"], c["U_all"], c["Wc"]
    Nu, Mf = state.layout.Nu, state.layout.Mf
    return np.zeros((Mf, Mf)), np.zeros((Nu, Nu)), {q: W for q, W in enumerate(state.Wf)}


def backward(state, X, Y, mu, A_inv, *, want_global=True, want_local=True):
    """Gradient of the client's surrogate with respect to the constrained values.

    The surrogate ``-1/2 e_i + mu^T b_i - 1/2 tr(S_i (A^{-1} + mu mu^T))`` is
    the client's part of the uncollapsed bound with ``q(v_g) = N(mu, A^{-1})``
    fixed and its own ``q(c | v_g)`` optimal; by Danskin's theorem its
    gradient is the partial derivative of the client's expected log
    likelihood (minus the trace term) at the optimal ``q``.  When ``mu``,
    ``A_inv`` come from :func:`skfedgp._structured.combine` at the current
    parameters, the global parts summed over clients are the gradient of the
    whole collapsed ELBO.

    Parameters
    ----------
    state : ILMMState
        From :func:`forward` at the current parameters.
    X : ndarray of shape (n, d)
    Y : ndarray of shape (n, Q)
        The same data as given to :func:`forward` (NaN = missing).
    mu : ndarray of shape (N_g,)
    A_inv : ndarray of shape (N_g, N_g)
    want_global, want_local : bool, default=True
        Which groups of gradients to compute.

    Returns
    -------
    grads : dict
        Global keys (``want_global``) among ``Z_g`` (M, d),
        ``lengthscale_g`` (R_g, d), ``B_g`` (Q, R_g), ``phi`` (float); local
        keys (``want_local``) among ``Z_l`` (M_l, d), ``lengthscale_l``
        (R_l, d), ``B_d`` (Q, R_d), ``B_l`` (Q, R_l), ``noise_variance``
        (float or (Q,), as given) and ``offset`` (Q,).
    """
    lay = state.layout
    Q, idx, C = lay.Q, lay.idx, lay.coef
    X, Y = _check_data(X, Y, Q)
    s2, n_q = state.s2, state.n_q
    mu_u, Sigma_u = _joint_moments(state, mu, A_inv)
    W_all, U_all, Wc = _split_grams(state)
    # Per channel q (E_q = Sel diag(c_q), U_q = Wf_q[idx, idx]):
    #   mu_z = E_q mu_u,  Xi_q = E_q (Sigma_u + mu_u mu_u^T) E_q^T,
    #   tr(Xi_q Wf_q) = c_q^T (U_q o Sig2) c_q,
    #   d/dc_q = [mu_u o (wf_q[idx] - U_q (c_q o mu_u)) - (U_q o Sigma_u) c_q - ...] / s2_q
    #          = [mu_u o wf_q[idx] - (U_q o Sig2) c_q - ...] / s2_q.
    # With U_q = U_all + (correction of the channels with partially observed rows)
    # the Hadamard product is formed once.
    Sig2 = Sigma_u  # (own copy) Sigma_u + mu_u mu_u^T
    Sig2 += mu_u[:, None] * mu_u[None, :]
    CT = C.T  # (N_u, Q)
    MC = (U_all * Sig2) @ CT  # column q: (U_q o Sig2) c_q
    for q, Wq in Wc.items():
        MC[:, q] += (lay.gather2(Wq) * Sig2) @ C[q]
    cmu = CT * mu_u[:, None]  # column q: c_q o mu_u
    wf_u, wk_u = state.wf[idx], state.wk[idx]
    trXW = np.sum(CT * MC, axis=0)
    quad = state.yy - 2.0 * np.sum(cmu * wf_u, axis=0) + trXW + state.trR
    g_s2 = -0.5 * n_q / s2 + quad / (2.0 * s2**2)
    g_off = (state.ysum - np.sum(cmu * wk_u, axis=0)) / s2
    dW = np.diag(W_all)[idx][:, None] + np.zeros((1, Q))
    for q, Wq in Wc.items():
        dW[:, q] += np.diag(Wq)[idx]
    gcoef = ((mu_u[:, None] * wf_u - MC - CT * (n_q[None, :] / lay.bsize[idx][:, None] - dW))
             / s2[None, :]).T  # (Q, N_u)
    grads = {}
    sphi = np.sqrt(lay.phi)
    gB = {"global": None, "deviation": None, "local": None}
    dphi = 0.0
    for name, r, sl in lay.groups:
        tot = gcoef[:, sl].sum(axis=1)  # d/d(coefficient of latent r in channel q), (Q,)
        if gB[name] is None:
            gB[name] = np.zeros((Q, sum(1 for g in lay.groups if g[0] == name)))
        if name == "deviation":
            # coefficient sqrt(phi) B_d[q, r]:
            # d/dB_d = sqrt(phi) tot, d/dphi = B_d tot / (2 sqrt(phi))
            gB[name][:, r] = sphi * tot
            dphi += float(np.sum(tot * C[:, sl.start])) / (2.0 * lay.phi)
        else:
            gB[name][:, r] = tot
    if want_global:
        if gB["global"] is not None:
            grads["B_g"] = gB["global"]
        if gB["deviation"] is not None:
            grads["phi"] = dphi
    if want_local:
        if gB["deviation"] is not None:
            grads["B_d"] = gB["deviation"]
        if gB["local"] is not None:
            grads["B_l"] = gB["local"]
        grads["noise_variance"] = (float(np.sum(g_s2)) if state.noise_iso
                                   else g_s2.reshape(state.noise_shape))
        grads["offset"] = g_off
    want = {"g": want_global, "l": want_local}
    active = [k for k, bl in enumerate(lay.blocks) if want[bl[0]]]
    if not active:
        return grads
    Ls = state.Ls
    Mf = lay.Mf
    # adjoints of the whitened statistics: Wbar_q = -(Xi_q - diag(gam_q)) / (2 s2_q),
    # wbar_q = mu_z,q / s2_q; only their sum over channels is needed for the rows with
    # every channel observed, and per channel only where a channel has partial rows.
    Cs = C / s2[:, None]
    Wbar_all = -0.5 * lay.scatter2((Cs.T @ C) * Sig2)
    Wbar_all[np.diag_indices(Mf)] += 0.5 * (state.gam / s2[:, None]).sum(axis=0)
    wbar = lay.scatter(cmu) / s2[None, :]  # (M_F, Q)

    def wbar_q(q):
        Xi = lay.scatter2(np.outer(C[q], C[q]) * Sig2)
        Xi[np.diag_indices(Mf)] -= state.gam[q]
        return -Xi / (2.0 * s2[q])

    Wbar_c = {q: wbar_q(q) for q in Wc}
    # Rsum = sum_q 2 Wbar_q Wf_q + wbar_q wf_q^T (only its diagonal blocks are used)
    Rblk = {}
    for k in active:
        a, b_ = lay.blocks[k][4:6]
        # the Grams are symmetric: W[:, a:b] = W[a:b].T (a contiguous operand for BLAS)
        R = 2.0 * Wbar_all[a:b_] @ W_all[a:b_].T + wbar[a:b_] @ state.wf[a:b_].T
        for q, Wq in Wc.items():
            R += 2.0 * Wbar_c[q][a:b_] @ Wq[a:b_].T
        Rblk[k] = R
    # the rows' adjoint: Kbar = Y_c psibar^T + sum over the row's channels of K Phibar_q
    # (2 Phibar_q = Lambda^{-T} 2 sym(Wbar_q) Lambda^{-1}); with few rows it is formed
    # on whitened rows, Kbar = (Y_c wbar^T + F 2 sym(Wbar)) Lambda^{-1}, with no Gram
    # whitening.
    use = _use_features(Y, Mf)
    Pb = {}

    def pb(q):  # 2 sym(Wbar_q) (whitened rows) or 2 Phibar_q, for the partially observed rows
        if q not in Pb:
            Wq = Wbar_c[q] if q in Wbar_c else wbar_q(q)
            Pb[q] = Wq + Wq.T if use else _whiten_adjoint(lay, Ls, Wq)
        return Pb[q]

    if use:
        Pb_all = Wbar_all + Wbar_all.T
    else:
        psibar = _lsolve(lay, Ls, wbar, trans=True)  # (M_F, Q)
        Pb_all = _whiten_adjoint(lay, Ls, Wbar_all)  # = 2 Phibar summed over channels

    acc = {}
    for k in active:
        kind, r, Z, ell, a, b_ = lay.blocks[k]
        Lbar = -np.tril(solve_lower(Ls[k], Rblk[k], trans=True))
        Kbar_zz = cholesky_backward(Ls[k], Lbar)
        dZ, dell, _ = _se_grad_sym(Z, state.Kzz[k], Kbar_zz, ell, 1.0)
        acc[k] = [dZ, dell]
    off = state.offset
    step = max(X.shape[0], 1) if use else CHUNK_ROWS
    # forward's single chunk of rows, its kernel rows and their whitening
    # (the same data, the same arrays): not formed again
    kept = state._cache.get("rows") if X.shape[0] <= CHUNK_ROWS else None
    for a0 in range(0, X.shape[0], step):
        if kept is not None:
            Xc, O, Yc, Kc, Fw = kept
        else:
            Xc, O, Yc = _chunk(X, Y, off, a0, step)
            Kc = Fw = None
        if Xc.shape[0] == 0:
            continue
        if Kc is None:
            Kc = _kernel_rows(Xc, lay)
        full = O.all(axis=1)
        part = ~full
        # whitened rows F = K Lambda^{-T} (then back through Lambda^{-1}), or K itself
        if not use:
            F = Kc
        elif Fw is not None:
            F = Fw
        else:
            F = _lsolve(lay, Ls, np.ascontiguousarray(Kc.T)).T
        Kbar = Yc @ (wbar if use else psibar).T
        Kbar[full] += F[full] @ Pb_all
        for q in range(Q) if part.any() else ():
            rows = part & O[:, q]
            if rows.any():
                Kbar[rows] += F[rows] @ pb(q)
        if use:
            Kbar = _lsolve(lay, Ls, np.ascontiguousarray(Kbar.T), trans=True).T
        for k in active:
            kind, r, Z, ell, a, b_ = lay.blocks[k]
            dZ, dell, _ = _se_grad(Xc, Z, Kc[:, a:b_], Kbar[:, a:b_], ell, 1.0)
            acc[k][0] += dZ
            acc[k][1] += dell
    for kind, key in (("g", "g"), ("l", "l")):
        ks = [k for k in active if lay.blocks[k][0] == kind]
        if not ks:
            continue
        Z = lay.blocks[ks[0]][2]
        dZ = np.zeros_like(Z)
        n_rows = lay.R_gl if kind == "g" else len(ks)
        dell = np.zeros((n_rows, Z.shape[1]))
        for k in ks:
            dZ += acc[k][0]
            dell[lay.blocks[k][1]] = acc[k][1]
        grads[f"Z_{key}"] = dZ
        grads[f"lengthscale_{key}"] = dell
    return grads


# ---------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------


def _test_features(Xs, lay, Ls):
    """Whitened test features ``F* = [k_b(X*, Z_b) L_b^{-T}]_b`` (n*, M_F)."""
    Fs = np.empty((Xs.shape[0], lay.Mf))
    for Lc, (_, _, Z, ell, a, b) in zip(Ls, lay.blocks):
        Fs[:, a:b] = solve_lower(Lc, _se(Xs, Z, ell, 1.0).T).T
    return Fs


def _block_of_feature(lay, f):
    for k, (*_, a, b) in enumerate(lay.blocks):
        if a <= f < b:
            return k
    raise IndexError(f)  # pragma: no cover - the layout maps every coordinate


def _offset_map(A, offset, Q):
    """``G = A K + S`` (rows, Q, Q_O): the map from the constants ``c_O`` to the outputs."""
    _, K, obs = offset
    Gm = A @ K
    Gm[..., obs, np.arange(obs.size)] += 1.0
    return Gm


def _moments(Xs, lay, Ls, mu_u, Sigma_u, names, full_cov, offset=None):
    """Latent moments using only the coordinates of ``u`` of components ``names``.

    With ``offset`` (:func:`offset_uncertainty`) the covariance is that of
    ``f + c`` with the client's constants integrated.
    """
    Q, idx = lay.Q, lay.idx
    coef = np.zeros_like(lay.coef)
    Gam = [np.zeros((Q, Q)) for _ in lay.blocks]  # residual loading per feature block
    for name, r, sl in lay.groups:
        if name not in names:
            continue
        coef[:, sl] = lay.coef[:, sl]
        c = lay.coef[:, sl.start]
        Gam[_block_of_feature(lay, int(idx[sl.start]))] += np.outer(c, c)
    nst = Xs.shape[0]
    if full_cov:
        Fs = _test_features(Xs, lay, Ls)
        A = Fs[:, idx][:, None, :] * coef[None]  # (n*, Q, N_u)
        mean = A @ mu_u
        A2 = A.reshape(nst * Q, -1)
        cov = (A2 @ Sigma_u @ A2.T).reshape(nst, Q, nst, Q)
        if offset is not None:
            G2 = _offset_map(A, offset, Q).reshape(nst * Q, -1)
            cov += (G2 @ offset[0] @ G2.T).reshape(nst, Q, nst, Q)
        for k, (_, _, Z, ell, a, b) in enumerate(lay.blocks):
            if np.any(Gam[k]):
                W = Fs[:, a:b]
                Rk = _se(Xs, Xs, ell, 1.0) - W @ W.T
                cov += np.einsum("nm,qp->nqmp", Rk, Gam[k])
        cov = 0.5 * (cov + cov.transpose(2, 3, 0, 1))
        return mean, cov
    mean = np.empty((nst, Q))
    cov = np.empty((nst, Q, Q))
    for a0 in range(0, nst, CHUNK_ROWS):
        Fs = _test_features(Xs[a0:a0 + CHUNK_ROWS], lay, Ls)
        A = Fs[:, idx][:, None, :] * coef[None]  # (c, Q, N_u)
        mean[a0:a0 + CHUNK_ROWS] = A @ mu_u
        cv = np.einsum("nqj,npj->nqp", A @ Sigma_u, A)
        if offset is not None:
            Gm = _offset_map(A, offset, Q)
            cv += np.einsum("nqj,npj->nqp", Gm @ offset[0], Gm)
        for k, (*_, a, b) in enumerate(lay.blocks):
            if np.any(Gam[k]):
                W = Fs[:, a:b]
                rk = np.maximum(1.0 - np.einsum("ij,ij->i", W, W), 0.0)
                cv += rk[:, None, None] * Gam[k][None]
        cov[a0:a0 + CHUNK_ROWS] = 0.5 * (cv + cv.transpose(0, 2, 1))
    return mean, cov


def predict(Xs, G, L, components, mu_u, Sigma_u, *, full_cov=False, per_component=False,
            client=None, jitter=DEFAULT_JITTER, offset=None):
    """Latent predictive mean and covariance of one ILMM client (no offset, no noise).

    Paper eqs. 38-39 (H. Yan 2026, section 3.9) with the structured
    posterior: channel ``q`` at ``x`` is ``f_q(x) = F*(x) E_q u`` plus the
    VFE residual ``sum_b Gamma_b[q, q'] (k_b(x, x') - W*_b(x) W*_b(x')^T)``,
    ``Gamma_{g,r} = B_g[:, r] B_g[:, r]^T + phi B_d[:, r] B_d[:, r]^T``,
    ``Gamma_{l,r} = B_l[:, r] B_l[:, r]^T``.

    Parameters
    ----------
    Xs : ndarray of shape (n*, d)
        Test inputs (the model's scaled units).
    G, L : dict
        Constrained values as for :func:`forward` (``noise_variance`` and
        ``offset`` are not used).
    components : tuple of str
    mu_u : ndarray of shape (N_u,)
    Sigma_u : ndarray of shape (N_u, N_u)
        Moments of ``u = (v_g, c)`` from :func:`posterior`; for a client
        never seen in training pass ``(mu_g, 0)`` and
        ``[[A^{-1}, 0], [0, I]]`` (the prior of its deviation and local
        variables).
    full_cov : bool, default=False
        Return the joint covariance over all test inputs and channels.
    per_component : bool, default=False
        Return ``{name: (mean, cov)}`` for each component present, each using
        only that component's variables and residual (cross-covariances
        between components are left out, so the parts' covariances do not
        add up to the total).
    client : hashable, optional
        Label used in error messages.
    jitter : float, default=DEFAULT_JITTER
        Relative jitter of every ``K_zz`` (use the value given to
        :func:`forward`).
    offset : tuple or None, default=None
        ``(covariance, gain, observed)`` from :func:`offset_uncertainty`:
        the covariance is then that of ``f + c`` with the client's estimated
        constants integrated (not with ``per_component``).

    Returns
    -------
    mean : ndarray of shape (n*, Q)
    cov : ndarray of shape (n*, Q, Q), or (n*, Q, n*, Q) with ``full_cov``
        Per-input ``Q x Q`` blocks, or the full joint covariance.
    parts : dict
        With ``per_component``: ``{"global"|"deviation"|"local": (mean, cov)}``.

    Raises
    ------
    CholeskyError
        If a ``K_zz`` cannot be factorised.
    ValueError
        If ``mu_u`` or ``Sigma_u`` do not match the layout.
    """
    comps = _components(components)
    lay = _layout(G, L, comps)
    Xs = np.ascontiguousarray(Xs, dtype=float)
    mu_u = np.asarray(mu_u, float)
    Sigma_u = np.asarray(Sigma_u, float)
    if mu_u.shape != (lay.Nu,) or Sigma_u.shape != (lay.Nu, lay.Nu):
        raise ValueError(f"mu_u must be ({lay.Nu},) and Sigma_u ({lay.Nu}, {lay.Nu}); got "
                         f"{mu_u.shape} and {Sigma_u.shape}")
    _, Ls = _factor_blocks(lay, jitter, client)
    if per_component:
        return {name: _moments(Xs, lay, Ls, mu_u, Sigma_u, (name,), full_cov)
                for name in _COMPONENTS if name in comps}
    return _moments(Xs, lay, Ls, mu_u, Sigma_u, comps, full_cov, offset)


# ---------------------------------------------------------------------------
# packing
# ---------------------------------------------------------------------------


def global_spec(components, M, d, Q, R_g):
    """Packer of the ILMM global vector (lengthscales and ``phi`` in log space).

    Parameters
    ----------
    components : tuple of str
    M : int
        Number of global inducing points.
    d : int
        Input dimension.
    Q : int
        Number of channels.
    R_g : int
        Number of global latents (and global kernels).

    Returns
    -------
    Packer
        ``Z_g`` (M, d, free) and ``lengthscale_g`` (R_g, d, log) with the
        global or deviation component; ``B_g`` (Q, R_g, free) with the global
        component; ``phi`` ((), log) with the deviation component.
    """
    comps = _components(components)
    spec = []
    if "global" in comps or "deviation" in comps:
        spec += [("Z_g", (M, d), "free"), ("lengthscale_g", (R_g, d), "log")]
    if "global" in comps:
        spec.append(("B_g", (Q, R_g), "free"))
    if "deviation" in comps:
        spec.append(("phi", (), "log"))
    return Packer(spec)


#: The ``noise`` options of a multi-output client (:func:`local_spec`).
NOISE_OPTIONS = ("isotropic", "isotropic_target", "diagonal")


def check_noise(noise):
    """Return ``noise`` if it is one of :data:`NOISE_OPTIONS`.

    ``"isotropic"`` is Yan 2026's ``s2_i I_Q`` (section 3.9, eq. 34) in
    standardised units; ``"isotropic_target"`` and ``"diagonal"`` are this
    package's additions (docs/maths.md, section 12).

    Parameters
    ----------
    noise : str

    Returns
    -------
    str

    Raises
    ------
    ValueError
        Naming the options, otherwise.
    """
    if noise not in NOISE_OPTIONS:
        raise ValueError(
            f"noise must be 'isotropic', 'isotropic_target' or 'diagonal', got {noise!r}")
    return noise


def local_spec(components, M_l, d, Q, R_d, R_l, noise="isotropic"):
    """Packer of one ILMM client's local vector (lengthscales and noise in log space).

    Parameters
    ----------
    components : tuple of str
    M_l : int
        Number of local inducing points.
    d : int
    Q : int
    R_d : int
        Number of deviation latents (``<= R_g``).
    R_l : int
        Number of local latents.
    noise : {"isotropic", "isotropic_target", "diagonal"}, default="isotropic"
        One noise variance for all channels (both isotropic options: the
        client maps it to the channels), or one per channel.

    Returns
    -------
    Packer
        ``Z_l`` (M_l, d, free), ``lengthscale_l`` (R_l, d, log) and ``B_l``
        (Q, R_l, free) with the local component; ``B_d`` (Q, R_d, free) with
        the deviation component; ``noise_variance`` ((), or (Q,), log);
        ``offset`` (Q, free).

    Raises
    ------
    ValueError
        If ``noise`` is not one of the three options.
    """
    comps = _components(components)
    check_noise(noise)
    spec = []
    if "local" in comps:
        spec += [("Z_l", (M_l, d), "free"), ("lengthscale_l", (R_l, d), "log"),
                 ("B_l", (Q, R_l), "free")]
    if "deviation" in comps:
        spec.append(("B_d", (Q, R_d), "free"))
    spec.append(("noise_variance", (Q,) if noise == "diagonal" else (), "log"))
    spec.append(("offset", (Q,), "free"))
    return Packer(spec)
