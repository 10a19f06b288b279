"""Parameter blocks of the pFedHGP hierarchy and their flat-vector packing.

The server owns the global block ``G = (m_g, C_g, ell_g, var_g, phi, Z_g)``;
client ``i`` owns ``B_i = (m_d_i, C_d_i, m_u_i, C_u_i, ell_i, var_i, Z_i,
s2_i)`` (docs/maths.md, "Federated training").  Both live as flat vectors of
*unconstrained* parameters:

* positive scalars (lengthscales, variances, ``phi``, noise variance) go
  through softplus, ``theta = log(1 + exp(t))``; the noise variance has a
  floor of :data:`NOISE_FLOOR` added (``s2 = softplus(t) + 1e-6``);
* each variational Cholesky factor ``C`` is stored as its lower triangle,
  row by row; its *diagonal* goes through softplus (so it stays positive),
  off-diagonal entries are free;
* means and inducing points are free.

:func:`client_objective` assembles the blocks of one client from the two
vectors, evaluates ``E_i - KL(q(w_i)) - KL(q(v_i))`` with
:func:`skfedgp._sparse.client_term`, and maps the gradients back to both flat
vectors.  The ILMM extension (docs/maths.md, multi-output) adds loadings as
further entries of the same specs.
"""

from __future__ import annotations

import numpy as np

from ._linalg import jittered_cholesky, sigmoid, softplus, softplus_inv, solve_lower
from ._sparse import Block, Component, block_predict, client_term, kl_whitened
from .kernels import se_ard

__all__ = [
    "COMPONENTS",
    "NOISE_FLOOR",
    "LR_SCALE",
    "Packer",
    "global_spec",
    "local_spec",
    "build_blocks",
    "client_objective",
    "server_objective",
    "predict_client",
    "global_statistics",
    "optimal_global_factor",
    "optimal_local_factors",
    "factor_grams",
    "global_statistics_from_grams",
    "local_factors_from_grams",
]

#: Names of the three pFedHGP components, in order.
COMPONENTS = ("global", "deviation", "local")
#: Lower bound added to every noise variance (standardised units).
NOISE_FLOOR = 1e-6
#: Step-size multipliers per parameter (see :meth:`Packer.learning_rates`).
#: Inducing points move in units of their kernel's *initial lengthscale*
#: (per input dimension): with the default learning rate 0.1 an inducing
#: point moves at most about a tenth of a lengthscale per Adam step, whatever
#: the input units — a step tied to the input range would be far too coarse
#: for a kernel whose lengthscale is a small fraction of that range.
#: Lengthscales (softplus) change by a relative amount of order the
#: learning rate.
LR_SCALE = {"Z_g": "lengthscale", "Z_l": "lengthscale"}
_VARIATIONAL = ("m_g", "C_g", "m_d", "C_d", "m_u", "C_u")


class Packer:
    """Map between a flat unconstrained vector and named constrained arrays.

    Parameters
    ----------
    spec : list of (name, shape, kind)
        ``kind`` is ``"free"``, ``"positive"`` (softplus), ``"log"``
        (``exp``: the structured family's L-BFGS works on log values),
        ``"noise"`` (softplus plus :data:`NOISE_FLOOR`) or ``"tril"``
        (lower-triangular ``(M, M)`` matrix, softplus diagonal; ``shape`` is
        ``(M, M)``).

    Attributes
    ----------
    size : int
        Length of the flat vector.
    slices : dict
        Name to slice of the flat vector.
    """

    def __init__(self, spec):
        self.spec = [(n, tuple(s), k) for n, s, k in spec]
        self.slices = {}
        off = 0
        for name, shape, kind in self.spec:
            if kind == "tril":
                size = shape[0] * (shape[0] + 1) // 2
            else:
                size = int(np.prod(shape, dtype=int))
            self.slices[name] = slice(off, off + size)
            off += size
        self.size = off
        self._tril = {
            name: np.tril_indices(shape[0]) for name, shape, kind in self.spec if kind == "tril"
        }

    def learning_rates(self, base, lengthscales=None):
        """Per-coordinate Adam step sizes.

        Parameters
        ----------
        base : float
            The learning rate.
        lengthscales : dict, optional
            Name of an inducing-point array (``"Z_g"``, ``"Z_l"``) to the
            initial lengthscales ``(d,)`` of its kernel; those coordinates get
            step ``base * lengthscale_d`` (:data:`LR_SCALE`).

        Returns
        -------
        lr : ndarray of shape (size,)
        """
        lr = np.full(self.size, float(base))
        for name, shape, _ in self.spec:
            if LR_SCALE.get(name) == "lengthscale" and lengthscales and name in lengthscales:
                scale = np.broadcast_to(np.asarray(lengthscales[name], dtype=float), shape)
                lr[self.slices[name]] *= scale.ravel()
        return lr

    def variational_mask(self):
        """Boolean mask of the variational coordinates (means and Cholesky factors).

        Returns
        -------
        mask : ndarray of bool, shape (size,)
        """
        mask = np.zeros(self.size, dtype=bool)
        for name in self.slices:
            if name in _VARIATIONAL:
                mask[self.slices[name]] = True
        return mask

    def names(self):
        """Names in the order of the flat vector."""
        return [n for n, _, _ in self.spec]

    def unpack(self, theta):
        """Constrained values from the flat vector.

        Parameters
        ----------
        theta : ndarray of shape (size,)

        Returns
        -------
        values : dict of name to ndarray (0-d arrays become floats)
        """
        out = {}
        for name, shape, kind in self.spec:
            t = theta[self.slices[name]]
            if kind == "free":
                v = t.reshape(shape).copy()
            elif kind == "positive":
                v = softplus(t).reshape(shape)
            elif kind == "log":
                v = np.exp(t).reshape(shape)
            elif kind == "noise":
                v = softplus(t).reshape(shape) + NOISE_FLOOR
            else:  # tril
                M = shape[0]
                C = np.zeros((M, M))
                C[self._tril[name]] = t
                d = np.diag_indices(M)
                C[d] = softplus(C[d])
                v = C
            out[name] = float(v) if shape == () else v
        return out

    def pack(self, values):
        """Flat unconstrained vector from constrained values (inverse of unpack).

        Raises
        ------
        ValueError
            If a positive value is not positive or a shape is wrong.
        """
        theta = np.empty(self.size)
        for name, shape, kind in self.spec:
            v = np.asarray(values[name], dtype=float)
            if v.shape != shape:
                raise ValueError(f"parameter {name!r} has shape {v.shape}, expected {shape}")
            if kind == "free":
                t = v.ravel()
            elif kind == "positive":
                t = softplus_inv(v).ravel()
            elif kind == "log":
                if np.any(v <= 0) or not np.all(np.isfinite(v)):
                    raise ValueError(f"parameter {name!r} must be finite and positive, got {v}")
                t = np.log(v).ravel()
            elif kind == "noise":
                if np.any(v < NOISE_FLOOR) or not np.all(np.isfinite(v)):
                    raise ValueError(f"noise variance must be finite and at least {NOISE_FLOOR}, "
                                     f"got {v}")
                # a value at the floor itself (an unpacked vector whose
                # softplus underflowed) packs to a large negative number
                t = softplus_inv(np.maximum(v - NOISE_FLOOR, np.finfo(float).tiny)).ravel()
            else:
                C = np.tril(v).copy()
                d = np.diag_indices(shape[0])
                C[d] = softplus_inv(C[d])
                t = C[self._tril[name]]
            theta[self.slices[name]] = t
        return theta

    def flat_grad(self, theta, grads):
        """Chain constrained gradients back to the flat unconstrained vector.

        Parameters
        ----------
        theta : ndarray of shape (size,)
            Point at which the gradients were taken.
        grads : dict of name to ndarray
            Gradients with respect to the constrained values; missing names
            count as zero.

        Returns
        -------
        g : ndarray of shape (size,)
        """
        g = np.zeros(self.size)
        for name, shape, kind in self.spec:
            if name not in grads:
                continue
            sl = self.slices[name]
            gv = np.asarray(grads[name], dtype=float)
            if kind == "free":
                g[sl] = gv.ravel()
            elif kind in ("positive", "noise"):
                g[sl] = (gv.reshape(-1)) * sigmoid(theta[sl])
            elif kind == "log":
                g[sl] = gv.reshape(-1) * np.exp(theta[sl])
            else:
                idx = self._tril[name]
                gt = gv[idx].copy()
                diag = idx[0] == idx[1]
                gt[diag] *= sigmoid(theta[sl][diag])
                g[sl] = gt
        return g


def global_spec(components, M, d):
    """Packer of the server's global block for the given ``components``.

    Parameters
    ----------
    components : tuple of str
        Subset of :data:`COMPONENTS`.
    M : int
        Number of global inducing points.
    d : int
        Input dimension.

    Returns
    -------
    Packer
        Empty (size 0) when neither ``"global"`` nor ``"deviation"`` is used.
    """
    spec = []
    if "global" in components or "deviation" in components:
        spec += [("Z_g", (M, d), "free"), ("lengthscale_g", (d,), "positive"),
                 ("variance_g", (), "positive")]
    if "deviation" in components:
        spec.append(("phi", (), "positive"))
    if "global" in components:
        spec += [("m_g", (M,), "free"), ("C_g", (M, M), "tril")]
    return Packer(spec)


def local_spec(components, M, M_local, d):
    """Packer of one client's local block ``B_i``.

    Parameters
    ----------
    components : tuple of str
    M : int
        Number of global inducing points (size of the deviation factor).
    M_local : int
        Number of local inducing points.
    d : int
        Input dimension.

    Returns
    -------
    Packer
    """
    spec = []
    if "deviation" in components:
        spec += [("m_d", (M,), "free"), ("C_d", (M, M), "tril")]
    if "local" in components:
        spec += [("m_u", (M_local,), "free"), ("C_u", (M_local, M_local), "tril"),
                 ("Z_l", (M_local, d), "free"), ("lengthscale_l", (d,), "positive"),
                 ("variance_l", (), "positive")]
    spec.append(("noise_variance", (), "noise"))
    return Packer(spec)


def build_blocks(G, B, components):
    """Blocks of one client from constrained global and local values.

    Parameters
    ----------
    G : dict
        Unpacked global values (see :func:`global_spec`).
    B : dict
        Unpacked local values (see :func:`local_spec`).
    components : tuple of str

    Returns
    -------
    blocks : list of Block
        ``[global block]`` (components ``global`` and/or ``deviation``) then
        ``[local block]``, as present.
    """
    blocks = []
    if "global" in components or "deviation" in components:
        comps = []
        if "global" in components:
            comps.append(Component(G["m_g"], G["C_g"], 1.0))
        if "deviation" in components:
            comps.append(Component(B["m_d"], B["C_d"], float(np.sqrt(G["phi"]))))
        blocks.append(Block(G["Z_g"], G["lengthscale_g"], G["variance_g"], comps, "global"))
    if "local" in components:
        blocks.append(Block(B["Z_l"], B["lengthscale_l"], B["variance_l"],
                            [Component(B["m_u"], B["C_u"], 1.0)], "local"))
    return blocks


def client_objective(theta_g, theta_l, X, y, gpack, lpack, components, *,
                     need_global_grad=True, client=None):
    """``E_i - KL(q(w_i)) - KL(q(v_i))`` of one client and its gradients.

    Parameters
    ----------
    theta_g : ndarray of shape (gpack.size,)
        Global unconstrained vector (as broadcast by the server).
    theta_l : ndarray of shape (lpack.size,)
        The client's local unconstrained vector.
    X : ndarray of shape (n_i, d)
    y : ndarray of shape (n_i,)
        Standardised targets.
    gpack, lpack : Packer
    components : tuple of str
    need_global_grad : bool, default=True
    client : hashable, optional

    Returns
    -------
    value : float
    grad_local : ndarray of shape (lpack.size,)
    grad_global : ndarray of shape (gpack.size,) or None

    Notes
    -----
    docs/maths.md, "Client ELBO term" and step 2–3 of "Federated training".
    """
    G = gpack.unpack(theta_g)
    B = lpack.unpack(theta_l)
    blocks = build_blocks(G, B, components)
    # the global block's kernel gradients are needed only for the upload
    kernel_grad = [need_global_grad if blk.name == "global" else True for blk in blocks]
    value, bgrads, dnoise, _ = client_term(X, y, blocks, B["noise_variance"],
                                           kernel_grad=kernel_grad, client=client)
    gl = {"noise_variance": dnoise}
    gg = {}
    bi = 0
    if "global" in components or "deviation" in components:
        bg = bgrads[bi]
        bi += 1
        if need_global_grad:
            gg.update(Z_g=bg.Z, lengthscale_g=bg.lengthscale, variance_g=bg.variance)
        k = 0
        if "global" in components:
            gg.update(m_g=bg.means[k], C_g=bg.chols[k])
            k += 1
        if "deviation" in components:
            sq = np.sqrt(G["phi"])
            gg["phi"] = bg.coefs[k] / (2.0 * sq)
            kl, dm, dC = kl_whitened(B["m_d"], B["C_d"])
            value -= kl
            gl.update(m_d=bg.means[k] - dm, C_d=bg.chols[k] - dC)
    if "local" in components:
        bl = bgrads[bi]
        kl, dm, dC = kl_whitened(B["m_u"], B["C_u"])
        value -= kl
        gl.update(m_u=bl.means[0] - dm, C_u=bl.chols[0] - dC, Z_l=bl.Z,
                  lengthscale_l=bl.lengthscale, variance_l=bl.variance)
    grad_local = lpack.flat_grad(theta_l, gl)
    grad_global = gpack.flat_grad(theta_g, gg) if need_global_grad else None
    return float(value), grad_local, grad_global


def server_objective(theta_g, gpack):
    """``-KL(q(v_g))`` and its gradient with respect to the global vector.

    Parameters
    ----------
    theta_g : ndarray of shape (gpack.size,)
    gpack : Packer

    Returns
    -------
    value : float
    grad : ndarray of shape (gpack.size,)
    """
    if "m_g" not in gpack.slices:
        return 0.0, np.zeros(gpack.size)
    G = gpack.unpack(theta_g)
    kl, dm, dC = kl_whitened(G["m_g"], G["C_g"])
    return -kl, gpack.flat_grad(theta_g, {"m_g": -dm, "C_g": -dC})


def predict_client(Xs, G, B, components, *, full_cov=False, per_component=False,
                   client=None):
    """Latent predictive mean and (co)variance of one client (standardised units).

    Parameters
    ----------
    Xs : ndarray of shape (n*, d)
    G, B : dict
        Unpacked global and local values; a never-seen client passes the
        prior for its deviation and local factors (``m = 0``, ``C = I``).
    components : tuple of str
    full_cov : bool, default=False
    per_component : bool, default=False
        Return a dict ``{name: (mean, var)}`` per component instead of the sum.
    client : hashable, optional

    Returns
    -------
    mean : ndarray of shape (n*,)
    cov : ndarray of shape (n*,) or (n*, n*)
        Latent covariance, without the noise variance (docs/maths.md,
        "Prediction for client i", eq. 30 of the paper).
    """
    blocks = build_blocks(G, B, components)
    if per_component:
        out = {}
        for blk in blocks:
            for comp, name in zip(blk.components, _component_names(blk, components)):
                sub = Block(blk.Z, blk.lengthscale, blk.variance, [comp], blk.name)
                out[name] = block_predict(Xs, sub, full_cov=full_cov, client=client)
        return out
    mean = np.zeros(Xs.shape[0])
    cov = 0.0
    for blk in blocks:
        m, c = block_predict(Xs, blk, full_cov=full_cov, client=client)
        mean += m
        cov = cov + c
    if np.isscalar(cov):
        cov = np.zeros((Xs.shape[0],) * 2) if full_cov else np.zeros(Xs.shape[0])
    return mean, cov


def _component_names(block, components):
    if block.name == "local":
        return ["local"]
    return [c for c in ("global", "deviation") if c in components]


#: Rows per chunk when the closed-form statistics stream over the data.
STAT_CHUNK_ROWS = 2048


def _whitened_grams(X, y, blocks, client):
    """Whitened Gram matrices of all block pairs and ``W_b^T y``, streamed.

    ``W_b = K_b(X, Z_b) L_b^{-T}``; returns ``grams[a][b] = W_a^T W_b``
    ``(M_a, M_b)`` and ``wy[b] = W_b^T y`` ``(M_b,)``, accumulated over row
    chunks of :data:`STAT_CHUNK_ROWS` so that no ``n x M`` array is formed.
    """
    Ls = []
    for blk in blocks:
        Kzz = se_ard(blk.Z, blk.Z, blk.lengthscale, blk.variance)
        L, _ = jittered_cholesky(Kzz, scale=blk.variance, jitter=blk.jitter,
                                 name=f"K_zz ({blk.name})", client=client)
        Ls.append(L)
    nb = len(blocks)
    KK = [[np.zeros((a.Z.shape[0], b.Z.shape[0])) for b in blocks] for a in blocks]
    Ky = [np.zeros(b.Z.shape[0]) for b in blocks]
    for start in range(0, X.shape[0], STAT_CHUNK_ROWS):
        Xc = X[start:start + STAT_CHUNK_ROWS]
        yc = y[start:start + STAT_CHUNK_ROWS]
        Ks = [se_ard(Xc, b.Z, b.lengthscale, b.variance) for b in blocks]
        for a in range(nb):
            Ky[a] += Ks[a].T @ yc
            for b in range(a, nb):
                KK[a][b] += Ks[a].T @ Ks[b]
    grams = [[None] * nb for _ in range(nb)]
    wy = []
    for a in range(nb):
        wy.append(solve_lower(Ls[a], Ky[a]))
        for b in range(a, nb):
            # W_a^T W_b = L_a^{-1} (K_a^T K_b) L_b^{-T}
            G = solve_lower(Ls[b], solve_lower(Ls[a], KK[a][b]).T).T
            if a == b:
                G = 0.5 * (G + G.T)
            grams[a][b] = G
            grams[b][a] = G.T
    return grams, wy


def _factor_posterior(W_gram, W_r, coef, s2):
    """Optimal ``q(v) = N(m, C C^T)`` for ``coef * W v`` against a residual.

    ``W_gram = W^T W`` and ``W_r = W^T r``: precision ``I + coef^2 W^T W / s2``,
    mean ``S coef W^T r / s2``.
    """
    M = W_r.shape[0]
    P = np.eye(M) + (coef**2 / s2) * 0.5 * (W_gram + W_gram.T)
    Lp, _ = jittered_cholesky(P, jitter=1e-12, name="variational precision")
    Linv = solve_lower(Lp, np.eye(M))
    S = Linv.T @ Linv
    C, _ = jittered_cholesky(0.5 * (S + S.T), jitter=1e-12, name="variational covariance")
    m = Linv.T @ (Linv @ ((coef / s2) * W_r))
    return m, C


def _factors(blocks, components):
    """``(block index, name, component)`` of every variational factor."""
    return [(bi, name, comp)
            for bi, blk in enumerate(blocks)
            for comp, name in zip(blk.components, _component_names(blk, components))]


def _w_residual(bi, grams, wy, factors):
    """``W_b^T r`` with ``r = y - sum_k c_k W_{b(k)} m_k`` from the Gram matrices."""
    t = wy[bi].copy()
    for bk, _, comp in factors:
        t -= comp.coef * (grams[bi][bk] @ comp.mean)
    return t


def global_statistics(theta_g, theta_l, X, y, gpack, lpack, components, *, client=None):
    """Sufficient statistics of one client for the closed-form ``q(v_g)``.

    Given everything else, the Gaussian likelihood makes the optimal
    whitened global factor closed form (docs/maths.md, "Beyond the paper")::

        S_g^{-1} = I + sum_i W_i^T W_i / s2_i
        m_g      = S_g sum_i W_i^T (y_i - sqrt(phi) W_i m_d_i - W_l m_u_i) / s2_i

    Parameters
    ----------
    theta_g, theta_l : ndarray
        Global and local unconstrained vectors.
    X : ndarray of shape (n_i, d)
    y : ndarray of shape (n_i,)
        Standardised targets.
    gpack, lpack : Packer
    components : tuple of str
        Must contain ``"global"``.
    client : hashable, optional

    Returns
    -------
    precision : ndarray of shape (M, M)
        ``W_i^T W_i / s2_i``.
    shift : ndarray of shape (M,)
        ``W_i^T (y_i - [everything but the global mean]) / s2_i``.
        Both sizes are fixed by ``M``; neither depends on ``n_i``.

    Notes
    -----
    Computed from row-chunked Gram matrices: memory ``O(chunk x M)``.
    """
    grams = factor_grams(theta_g, theta_l, X, y, gpack, lpack, components, client=client)
    return global_statistics_from_grams(theta_g, theta_l, grams, gpack, lpack, components)


def factor_grams(theta_g, theta_l, X, y, gpack, lpack, components, *, client=None):
    """Whitened Gram matrices ``W_a^T W_b`` and ``W_b^T y`` of one client (streamed).

    They depend on the hyperparameters only, so with the hyperparameters
    fixed every closed-form factor update can reuse them (``M``-sized work).

    Returns
    -------
    tuple
        ``(grams, wy)`` as used by :func:`global_statistics_from_grams` and
        :func:`local_factors_from_grams`.
    """
    G = gpack.unpack(theta_g)
    B = lpack.unpack(theta_l)
    return _whitened_grams(X, y, build_blocks(G, B, components), client)


def global_statistics_from_grams(theta_g, theta_l, grams, gpack, lpack, components):
    """:func:`global_statistics` from precomputed :func:`factor_grams`."""
    G = gpack.unpack(theta_g)
    B = lpack.unpack(theta_l)
    blocks = build_blocks(G, B, components)
    gr, wy = grams
    others = [f for f in _factors(blocks, components) if f[1] != "global"]
    s2 = B["noise_variance"]
    return gr[0][0] / s2, _w_residual(0, gr, wy, others) / s2


def optimal_global_factor(precision_sum, shift_sum):
    """Closed-form ``q(v_g) = N(m_g, C_g C_g^T)`` from summed client statistics.

    Parameters
    ----------
    precision_sum : ndarray of shape (M, M)
        ``sum_i W_i^T W_i / s2_i``.
    shift_sum : ndarray of shape (M,)

    Returns
    -------
    m_g : ndarray of shape (M,)
    C_g : ndarray of shape (M, M)
        Lower Cholesky factor of ``S_g = (I + precision_sum)^{-1}``;
        ``m_g = S_g shift_sum``.
    """
    return _factor_posterior(precision_sum, shift_sum, 1.0, 1.0)


def optimal_local_factors(theta_g, theta_l, X, y, gpack, lpack, components, *,
                          sweeps=2, client=None):
    """Coordinate ascent on the client's own factors ``q(w_i)``, ``q(v_i)``.

    Each factor is set to its exact optimum given the others (Gaussian
    likelihood; docs/maths.md, "The same holds for each client's own
    q(w_i), q(v_i) given the rest"), in turn, ``sweeps`` times; every update
    increases the ELBO.  Works on the whitened Gram matrices (one streamed
    pass over the data, memory ``O(chunk x M)``); the sweeps are ``M``-sized.

    Parameters
    ----------
    theta_g, theta_l : ndarray
        Global and local unconstrained vectors.
    X : ndarray of shape (n_i, d)
    y : ndarray of shape (n_i,)
    gpack, lpack : Packer
    components : tuple of str
    sweeps : int, default=2
    client : hashable, optional

    Returns
    -------
    theta_l : ndarray of shape (lpack.size,)
        New local vector (hyperparameters unchanged).
    """
    G = gpack.unpack(theta_g)
    B = lpack.unpack(theta_l)
    blocks = build_blocks(G, B, components)
    if not [f for f in _factors(blocks, components) if f[1] in ("deviation", "local")]:
        return theta_l
    grams = _whitened_grams(X, y, blocks, client)
    return local_factors_from_grams(theta_g, theta_l, grams, gpack, lpack, components,
                                    sweeps=sweeps)


def local_factors_from_grams(theta_g, theta_l, grams, gpack, lpack, components, *, sweeps=1):
    """:func:`optimal_local_factors` from precomputed :func:`factor_grams`."""
    G = gpack.unpack(theta_g)
    B = lpack.unpack(theta_l)
    blocks = build_blocks(G, B, components)
    factors = _factors(blocks, components)
    own = [f for f in factors if f[1] in ("deviation", "local")]
    if not own:
        return theta_l
    grams, wy = grams
    s2 = B["noise_variance"]
    keys = {"deviation": ("m_d", "C_d"), "local": ("m_u", "C_u")}
    for _ in range(sweeps):
        for bi, name, comp in own:
            # W_b^T (residual without this factor's own contribution)
            t = _w_residual(bi, grams, wy, factors) + comp.coef * (grams[bi][bi] @ comp.mean)
            comp.mean, comp.chol = _factor_posterior(grams[bi][bi], t, comp.coef, s2)
            km, kc = keys[name]
            B[km], B[kc] = comp.mean, comp.chol
    return lpack.pack(B)
