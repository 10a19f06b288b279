"""Operator clustering of federated clients (pFedHGP paper, section 3.8.2 and
section 5.2).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import qmc
from sklearn.base import BaseEstimator, ClusterMixin, clone
from sklearn.cluster import SpectralClustering
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted, validate_data

from ._validation import (_object_array, as_label_array, check_finite_scalar, keep_state_on_error,
                          normalise_labels, unique_labels, unmask, user_stacklevel)
from .federated import default_sizes_quiet
from .kernels import se_ard
from .regressor import FederatedHierarchicalGPRegressor

__all__ = ["OperatorClustering", "default_clustering_regressor"]

_AFFINITIES = ("rbf", "inverse")
_OPERATORS = ("personal", "personal_residual", "published", "posterior")
#: Evaluation points of ``operator="personal"`` (scrambled Sobol points in the
#: clients' joint input box), and the largest number of cells of the regular
#: grid of ``operator="personal_residual"``.
N_EVAL_POINTS = 256
#: ``operator="personal_residual"``: a client reports the mean of its
#: residuals in a cell only when the cell holds at least this many of its rows
#: (a single row's residual is never reported).
MIN_CELL_ROWS = 2


def default_clustering_regressor():
    """The regressor of the pFedHGP air-quality study (pFedHGP paper, section 5.2).

    ``M = 30`` global and ``M_i = 12`` local inducing points; other settings
    are the regressor's defaults.

    Returns
    -------
    FederatedHierarchicalGPRegressor
        Unfitted.
    """
    return FederatedHierarchicalGPRegressor(n_inducing=30, n_inducing_local=12)


def _client_hyperparameters(estimator, label):
    """Fitted kernel hyperparameters of one client, in original units.

    The only place that reads the regressor's internals; to be replaced by a
    public accessor of the regressor.

    Parameters
    ----------
    estimator : FederatedHierarchicalGPRegressor
        Fitted.
    label : hashable
        A fitted client label.

    Returns
    -------
    dict
        ``Z_g`` (M, d) global inducing inputs, ``lengthscale_g`` (d,),
        ``variance_g`` (float), ``Z_l`` (M_i, d), ``lengthscale_l`` (d,),
        ``variance_l`` (float) of the client's local kernel (the three
        local entries are None without a local component), and
        ``noise_variance`` (float). Inputs and lengthscales in input units,
        variances in squared target units. ``variance_g`` is the client's
        own: the global variance times its squared scale on the shared
        parts (``client_scales_``), the variance of ``s_i g``.
    """
    G = estimator.server_.global_values()
    B = estimator.clients_[label].local_values()
    off = np.asarray(estimator.server_.x_offset, dtype=np.float64)
    sc = np.asarray(estimator.server_.x_scale, dtype=np.float64)
    ys2 = float(estimator.y_scale_) ** 2
    out = {"Z_g": None, "lengthscale_g": None, "variance_g": None,
           "Z_l": None, "lengthscale_l": None, "variance_l": None,
           "noise_variance": float(B["noise_variance"]) * ys2}
    if "Z_g" in G:
        s_i = float(getattr(estimator, "client_scales_", {}).get(label, 1.0))
        out.update(Z_g=G["Z_g"] * sc + off, lengthscale_g=G["lengthscale_g"] * sc,
                   variance_g=float(G["variance_g"]) * ys2 * s_i**2)
    if "Z_l" in B:
        out.update(Z_l=B["Z_l"] * sc + off, lengthscale_l=B["lengthscale_l"] * sc,
                   variance_l=float(B["variance_l"]) * ys2)
    return out


def projection_operator(X, Z, lengthscale, variance, noise_variance, *, woodbury=None):
    """``A = k(Z, X) (k(X, X) + s2 I)^{-1} k(X, Z)`` (pFedHGP paper, section 3.8.2).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's inputs.
    Z : ndarray of shape (m, d)
        Inducing inputs.
    lengthscale : ndarray of shape (d,)
    variance, noise_variance : float
    woodbury : bool, default=None
        Use the Woodbury form (below). None means ``n > m``.

    Returns
    -------
    A : ndarray of shape (m, m)
        Symmetric positive semi-definite.

    Raises
    ------
    ValueError
        If ``X`` and ``Z`` are not 2-D with the same number of columns,
        ``X`` or ``Z`` holds NaN/inf, ``noise_variance`` is not a finite
        number (all checked first: in the Woodbury form an inf in ``X``
        would otherwise drop its row silently), ``lengthscale`` is not a
        scalar or of shape (d,), or a hyperparameter of the kernel is not
        finite and positive.
    numpy.linalg.LinAlgError
        If the matrix to factorise (``k(X, X) + s2 I``, or ``s2 K_zz + P``
        in the Woodbury form) is not positive definite, e.g. a negative
        ``noise_variance`` or repeated inputs with ``noise_variance=0``.

    Notes
    -----
    The exact form factorises the ``n x n`` matrix ``k(X, X) + s2 I``
    (``O(n^3)``). The Woodbury form replaces ``k(X, X)`` by its Nystrom
    approximation ``k(X, Z) k(Z, Z)^{-1} k(Z, X)`` (the sparse GP's own
    approximation), which gives ``A = P (s2 K_zz + P)^{-1} K_zz`` with
    ``P = k(Z, X) k(X, Z)``: ``O(n m^2)``, only ``m x m`` factorisations.
    The two agree when ``Z`` covers the inputs densely.
    """
    X = np.asarray(X, dtype=float)
    Z = np.asarray(Z, dtype=float)
    for name, a in (("X", X), ("Z", Z)):
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains NaN or inf")
    check_finite_scalar(noise_variance, "noise_variance")
    # se_ard forms the differences x - z: the expanded square |x|^2 + |z|^2 - 2 x.z
    # cancels far from the origin (a client's Gram at x + 1e5 was not positive definite)
    Kzx = se_ard(Z, X, lengthscale, variance)
    n, m = X.shape[0], Z.shape[0]
    if woodbury is None:
        woodbury = n > m
    if not woodbury:
        Kxx = se_ard(X, X, lengthscale, variance)
        Kxx[np.diag_indices_from(Kxx)] += noise_variance
        A = Kzx @ cho_solve(cho_factor(Kxx, lower=True), Kzx.T)
    else:
        Kzz = se_ard(Z, Z, lengthscale, variance)
        Kzz[np.diag_indices_from(Kzz)] += 1e-6 * variance
        P = Kzx @ Kzx.T
        S = noise_variance * Kzz + P
        # A = P S^{-1} Kzz, symmetrised (S, P, Kzz symmetric)
        A = P @ cho_solve(cho_factor(S, lower=True), Kzz)
    return 0.5 * (A + A.T)


def _pad_pair(u, v):
    """Zero-pad two square blocks to the larger size (local sets of different sizes)."""
    if u.shape == v.shape:
        return u, v
    m = max(u.shape[0], v.shape[0])
    out = []
    for a in (u, v):
        p = np.zeros((m, m))
        p[: a.shape[0], : a.shape[1]] = a
        out.append(p)
    return out[0], out[1]


class OperatorClustering(ClusterMixin, BaseEstimator):
    """Cluster federated clients by their fitted functions or kernel operators.

    By default (``operator="personal"``, beyond the paper) the clients'
    dissimilarity is the expected mean squared difference of their fitted
    personal functions at shared evaluation points; ``"personal_residual"``
    (beyond the paper) adds each client's residuals averaged over the cells
    of a fixed grid, which carries what the fitted model does not resolve
    (see ``operator``). With ``operator="published"`` it is the paper's:
    for every client ``i`` (using only its own inputs ``X_i`` and the fitted
    kernels of a :class:`~skfedgp.FederatedHierarchicalGPRegressor`; pFedHGP
    paper section 3.8.2)::

        A_d_i   = k_g(Z_g, X_i) (k_g(X_i, X_i) + s2_i I)^{-1} k_g(X_i, Z_g)   (M x M)
        A_loc_i = k_i(Z_i, X_i) (k_i(X_i, X_i) + s2_i I)^{-1} k_i(X_i, Z_i)   (M_i x M_i)
        A_i = blockdiag(A_d_i, A_loc_i),   Ahat_i = A_i / tr(A_i)
        rho(i, j) = ||Ahat_i - Ahat_j||_F^2

    then spectral clustering (:class:`sklearn.cluster.SpectralClustering`
    with ``affinity="precomputed"``) of the clients on an affinity built
    from ``rho``.

    Parameters
    ----------
    n_clusters : int, default=2
        Number of client clusters.
    estimator : FederatedHierarchicalGPRegressor, default=None
        A fitted regressor is reused as is (its clients must include every
        label in ``groups``); an unfitted one is cloned and fitted on
        ``(X, y, groups)``. None means the air-quality study's setting
        (:func:`default_clustering_regressor`: ``M = 30``, ``M_i = 12``).
        Its ``client_column`` must be None (the labels come as ``groups``;
        a ``ValueError`` otherwise).
    affinity : {"rbf", "inverse"}, default="rbf"
        ``"rbf"``: ``W_ij = exp(-rho_ij / median(rho))`` (median over the
        off-diagonal pairs; 1 if all are 0). ``"inverse"``: ``W_ij = 1 /
        (1 + rho_ij / median(rho))``.
    operator : {"personal", "personal_residual", "published", "posterior"}, \
            default="personal"
        What each client contributes; all but ``"published"`` are beyond
        the paper. Measured in docs/clustering.md (Beijing zones, 5 seeds;
        eleven synthetic cases, 4 seeds each): ``"personal"`` (the default)
        was never worse than ``"published"``; ``"personal_residual"`` is the
        only operator that recovers the Beijing zones (ARI 1.0 on each seed,
        against mean 0.659 for ``"personal"`` and 0.272 for
        ``"published"``), equals ``"personal"`` on eight synthetic cases,
        beats it where the groups differ on a scale finer than the inducing
        points, and is worse where many noisy rows per client carry a faint
        smooth difference (its cell means keep the noise that the fitted
        functions average out). The published operators depend on a client
        only through its inputs and kernel hyperparameters, not on what its
        data say: they group clients by where their inputs lie (clients
        observing one function on two input ranges are two groups for them,
        one for the personal operators).

        ``"personal_residual"``: the clients' joint input box is cut into a
        regular grid of ``K`` cells (``floor(N_EVAL_POINTS ** (1 / d))``
        along each of the ``d`` input dimensions of positive width, so
        :data:`N_EVAL_POINTS` ``= 256`` cells in 1-D), with centres ``T``.
        The grid is coarse beyond a few inputs (2 cells per dimension for
        ``d`` of 6 to 8, one cell from ``d = 9``): measured in 1-D only, it is
        meant for inputs such as time; use ``"personal"`` for many inputs.
        Scalar targets only (``ValueError`` for a multi-output regressor).
        Client ``i`` computes, from its own rows only, ``m_i = mu_i(T) +
        rbar_i``: ``mu_i`` the posterior mean of its personal function
        ``h_i = c_i + f_delta_i + f_i`` (as for ``"personal"``) and
        ``rbar_i`` (a K-vector) the mean of its residuals ``y - predict(X_i)``
        in each cell holding at least :data:`MIN_CELL_ROWS` ``= 2`` of its
        rows (0 elsewhere, so no single row's residual is reported).
        ``rho_ij = mean_T[(m_i - m_j)^2 + v_i + v_j]`` with ``v_i`` the
        posterior variance of ``h_i`` at ``T``. This is the personal
        function corrected by a regressogram (cell means) of what the fitted
        model left unexplained. Where the model resolves the clients'
        functions, the correction is noise averaged per cell (absent where
        cells hold single rows); where the inducing points are too few for
        the scale on which the clients differ, it carries that scale down
        to the cell width. The cell means are not
        shrunk: what a client's model calls noise counts, which is what
        groups clients whose short-scale fluctuations move together (the
        Beijing stations), and what costs contrast when the noise is
        independent and the group differences faint. Each client reports a
        K-vector of cell means of its residuals: more about its data than
        ``"personal"``, which reports only its fitted function. Needs ``y``
        (1-D, finite).

        ``"personal"``: the client's whole personal function ``h_i = c_i +
        f_delta_i + f_i`` (its learned constant mean, deviation and local
        part, posterior mean ``mu_i`` and marginal variance ``v_i`` from
        :meth:`~skfedgp.FederatedHierarchicalGPRegressor.predict_components`)
        at :data:`N_EVAL_POINTS` shared evaluation points ``T`` (scrambled
        Sobol points in the bounding box of ``X``, seeded by
        ``random_state``), and ``rho_ij = mean_T[(mu_i - mu_j)^2 + v_i +
        v_j]``, the expected mean squared difference of two clients'
        personal functions under independent posteriors (zero diagonal). No
        trace normalisation and no outer product: level and sign of a
        client's departure from the shared function count, which the
        normalised operators discard. Its resolution is the fitted
        model's (its inducing points).

        ``"published"``: the operators above (the paper's section 3.8.2).
        Every client has its own local inducing inputs ``Z_i``; they are
        sorted (lexicographically, by input coordinates) before ``A_loc_i``
        is formed, so block rows of different clients refer to matching
        positions. Clients whose ``M_i`` differ (the regressor's
        ``n_inducing_local="auto"`` sizes each client's own set) have the
        smaller ``A_loc`` padded with zeros to the larger size before the
        difference is taken.

        ``"posterior"``: the client's fitted personal part ``h_i =
        f_delta_i + f_i`` at the shared inducing inputs ``Z_g``, with
        posterior mean ``mu_i`` and variances ``v_i``, gives ``A_i = mu_i
        mu_i^T + diag(v_i)`` (``M x M``, the second moment of ``h_i(Z_g)``
        up to its off-diagonal posterior covariance), trace-normalised the
        same way.

        ``"published"`` and ``"posterior"`` take scalar targets only: their
        operators are built from one kernel variance per component, which a
        multi-output (ILMM) regressor does not have (``ValueError`` before
        any fit when ``y`` has several columns, or for a fitted
        multi-output ``estimator``; use ``"personal"``).
    woodbury : bool, default=None
        Compute ``A_d_i`` and ``A_loc_i`` with the Woodbury form of
        :func:`projection_operator` (``O(n_i M^2)``). None means when
        ``n_i > M + M_i``.
    random_state : int, RandomState instance or None, default=None
        Seeds the spectral clustering and (if not None) the regressor.

    Attributes
    ----------
    estimator_ : FederatedHierarchicalGPRegressor
        The fitted regressor used.
    clients_ : ndarray of shape (n_clients,)
        Client labels, sorted (labels of mixed types, e.g. ``0`` and
        ``"b"``, in first-seen order, as an object array; tuple labels as
        a 1-D object array of tuples).
    client_labels_ : ndarray of int64 of shape (n_clients,)
        Cluster of each client.
    labels_ : ndarray of shape (n_samples,)
        Cluster of each row of ``X`` (its client's cluster).
    operators_ : dict
        Client label to what was compared: for ``"personal"`` (the default)
        the tuple ``(mu_i, v_i)`` of posterior means and variances at the
        evaluation points (arrays of shape (N_EVAL_POINTS,), or (N_EVAL_POINTS,
        n_outputs) for a multi-output regressor); for
        ``"personal_residual"`` the tuple ``(m_i, v_i)`` of corrected means
        and posterior variances at the K cell centres (shape (K,)); for
        ``"published"`` a tuple of the two trace-normalised blocks (``(M,
        M)`` and ``(M_i, M_i)`` arrays); for ``"posterior"`` the
        trace-normalised ``(M, M)`` operator.
    dissimilarity_ : ndarray of shape (n_clients, n_clients)
        ``rho``, symmetric with zero diagonal.
    affinity_matrix_ : ndarray of shape (n_clients, n_clients)
        The affinity passed to spectral clustering.
    n_features_in_ : int

    References
    ----------
    H. Yan, "Personalized Federated Hierarchical Gaussian Processes for
    Privacy-Preserving Modeling of Heterogeneous Distributed Systems", arXiv
    preprint arXiv:2609.19337 (2026): section 3.8.2
    (operator clustering) and section 5.2 (Beijing air quality).
    von Luxburg, U. (2007), "A tutorial on spectral clustering", Statistics
    and Computing 17(4).
    """

    def __init__(self, n_clusters=2, estimator=None, *, affinity="rbf",
                 operator="personal", woodbury=None, random_state=None):
        self.n_clusters = n_clusters
        self.estimator = estimator
        self.affinity = affinity
        self.operator = operator
        self.woodbury = woodbury
        self.random_state = random_state

    def _check_params(self):
        k = self.n_clusters
        if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
            raise ValueError(f"n_clusters must be an integer >= 1, got {k!r}")
        if self.affinity not in _AFFINITIES:
            raise ValueError(f"affinity must be one of {_AFFINITIES}, got {self.affinity!r}")
        if self.operator not in _OPERATORS:
            raise ValueError(f"operator must be one of {_OPERATORS}, got {self.operator!r}")
        if self.woodbury not in (None, True, False):
            raise ValueError(f"woodbury must be None, True or False, got {self.woodbury!r}")

    def _regressor(self, X, y, groups):
        est = self.estimator
        if est is not None and not isinstance(est, FederatedHierarchicalGPRegressor):
            raise TypeError(
                "estimator must be a FederatedHierarchicalGPRegressor (fitted or not) or "
                f"None, got {type(est).__name__}")
        if est is not None and getattr(est, "client_column", None) is not None:
            # the operators evaluate the clients' functions at shared inputs
            # (features only); a label column among X's columns has no place there
            raise ValueError(
                f"estimator has client_column={est.client_column!r}; OperatorClustering takes "
                "the client labels as groups and X as features only: use an estimator with "
                "client_column=None and pass the labels as groups")
        if est is not None:
            try:
                check_is_fitted(est, "clients_")
            except NotFittedError:
                pass
            else:
                if est.n_features_in_ != X.shape[1]:
                    raise ValueError(
                        f"X has {X.shape[1]} features, but the fitted estimator was fitted "
                        f"on {est.n_features_in_}: pass the inputs it was fitted on")
                return est
        reg = default_clustering_regressor() if est is None else clone(est)
        if self.random_state is not None and "random_state" in reg.get_params():
            reg.set_params(random_state=self.random_state)
        if y is None:
            raise ValueError("y is required to fit the regressor (or pass a fitted estimator)")
        with default_sizes_quiet(est is None):
            return reg.fit(X, y, groups=groups)

    def _published(self, reg, label, Xi):
        h = _client_hyperparameters(reg, label)
        M = 0 if h["Z_g"] is None else h["Z_g"].shape[0]
        Ml = 0 if h["Z_l"] is None else h["Z_l"].shape[0]
        wb = (Xi.shape[0] > M + Ml) if self.woodbury is None else self.woodbury
        blocks = []
        if h["Z_g"] is not None:
            blocks.append(projection_operator(Xi, h["Z_g"], h["lengthscale_g"],
                                              h["variance_g"], h["noise_variance"],
                                              woodbury=wb))
        if h["Z_l"] is not None:
            Zl = h["Z_l"][np.lexsort(h["Z_l"].T[::-1])]
            blocks.append(projection_operator(Xi, Zl, h["lengthscale_l"], h["variance_l"],
                                              h["noise_variance"], woodbury=wb))
        tr = sum(np.trace(b) for b in blocks)
        if not tr > 0:
            raise FloatingPointError(
                f"operator of client {label!r} has zero trace: its inputs are many "
                "lengthscales away from every inducing input, so the kernel between them "
                "underflows (a fitted estimator reused with inputs in other units or "
                "another range? pass X as in the regressor's fit, or refit it)")
        return tuple(b / tr for b in blocks)

    def _posterior(self, reg, label):
        h = _client_hyperparameters(reg, label)
        if h["Z_g"] is None:
            raise ValueError("operator='posterior' needs a regressor with a global block")
        Zg = h["Z_g"]
        parts = reg.predict_components(Zg, _object_array([label] * Zg.shape[0]))
        personal = [parts[c] for c in ("deviation", "local") if c in parts]
        if not personal:
            raise ValueError("operator='posterior' needs a deviation or local component")
        mu = sum(p[0] for p in personal)
        var = sum(p[1] ** 2 for p in personal)
        A = np.outer(mu, mu) + np.diag(var)
        return (A / np.trace(A),)

    def _eval_points(self, X):
        """``N_EVAL_POINTS`` scrambled Sobol points in the bounding box of ``X``."""
        lo, hi = X.min(axis=0), X.max(axis=0)
        seed = self.random_state if isinstance(self.random_state, numbers.Integral) else 0
        u = qmc.Sobol(X.shape[1], scramble=True, seed=seed).random(N_EVAL_POINTS)
        return lo + u * (hi - lo)

    @staticmethod
    def _grid(X):
        """Regular grid of cells over the bounding box of ``X``.

        ``floor(N_EVAL_POINTS ** (1 / d))`` cells along each of the ``d``
        input dimensions of positive width (one along a dimension of zero
        width, which does not count in ``d``): 256 cells in 1-D, 16 per
        dimension in 2-D, 2 per dimension for ``d`` of 6 to 8 and a single
        cell from ``d = 9`` on. Returns ``(lo, width, counts, centres)``: the box's lower
        corner and widths, the number of cells per dimension and the cell
        centres, shape (prod(counts), d), in C order of the cell index.
        """
        lo, hi = X.min(axis=0), X.max(axis=0)
        width = hi - lo
        d_cells = max(1, int(np.count_nonzero(width > 0)))  # dimensions that get cells
        per = max(1, int(np.floor(N_EVAL_POINTS ** (1.0 / d_cells) * (1 + 1e-12))))
        counts = np.where(width > 0, per, 1)
        axes = [lo[k] + (np.arange(counts[k]) + 0.5) / counts[k] * width[k]
                for k in range(X.shape[1])]
        centres = np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=1)
        return lo, width, counts, centres

    @staticmethod
    def _cell_index(Xi, lo, width, counts):
        """Cell of every row of ``Xi`` in the grid of :meth:`_grid` (C order)."""
        safe = np.where(width > 0, width, 1.0)
        k = np.floor((Xi - lo) / safe * counts).astype(np.int64)
        k = np.clip(k, 0, counts - 1)
        return np.ravel_multi_index(tuple(k.T), tuple(counts))

    def _personal_residual(self, reg, label, Xi, yi, grid):
        """Personal function at the cell centres plus the client's mean residual per cell.

        Computed from the client's own rows ``Xi`` (n_i, d) and targets
        ``yi`` (n_i,) only. ``grid`` is :meth:`_grid`'s output (K cells).
        Returns ``(m, v)``, arrays of shape (K,): ``m = mu(T) + rbar`` with
        ``rbar`` the mean residual ``yi - predict(Xi)`` in every cell that
        holds at least :data:`MIN_CELL_ROWS` of the client's rows (0 in the
        others), ``v`` the posterior variance of the personal function at
        the centres ``T`` (:meth:`_personal`).
        """
        lo, width, counts, centres = grid
        mu, var = self._personal(reg, label, centres)
        resid = yi - reg.predict(Xi, _object_array([label] * Xi.shape[0]))
        cell = self._cell_index(Xi, lo, width, counts)
        K = centres.shape[0]
        n = np.bincount(cell, minlength=K)
        total = np.bincount(cell, weights=resid, minlength=K)
        keep = n >= MIN_CELL_ROWS
        mu = mu.copy()
        mu[keep] += total[keep] / n[keep]
        return mu, var

    @staticmethod
    def _personal(reg, label, T):
        """Posterior mean and variance of ``h_i = c_i + f_delta_i + f_i`` at ``T``."""
        parts = reg.predict_components(T, _object_array([label] * T.shape[0]))
        names = [c for c in ("offset", "deviation", "local") if c in parts]
        if not any(c in parts for c in ("offset", "deviation", "local")):
            raise ValueError("operator='personal' needs a regressor with a client "
                             "offset, deviation or local component")
        mu = sum(parts[c][0] for c in names)
        # the constant mean enters by its estimate: its estimation variance is
        # mostly cancelled by its covariance with the other parts, which the
        # per-component moments leave out
        var = sum(parts[c][1] ** 2 for c in names if c != "offset")
        return mu, var

    @keep_state_on_error
    def fit(self, X, y=None, groups=None):
        """Fit (or reuse) the regressor and cluster its clients.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Inputs of all clients (each client's rows stay with it: its
            operator is computed from its own rows only).
        y : array-like of shape (n_samples,), default=None
            Targets; needed when the regressor is fitted here and by
            ``operator="personal_residual"``, which averages each client's
            residuals per cell.
        groups : array-like of shape (n_samples,)
            Client label of each row (required).

        Returns
        -------
        self : OperatorClustering

        Raises
        ------
        ValueError
            Without ``groups``, with fewer clients than ``n_clusters`` or
            fewer than 2 clients, a missing or unhashable label, a label
            unknown to a reused fitted regressor (or excluded from it after
            failed calls), X of another width than a reused fitted
            regressor's, invalid input (NaN/inf, wrong lengths), bad
            parameters (``n_clusters``, ``affinity``, ``operator``,
            ``woodbury``), an ``estimator`` with a ``client_column``, no
            ``y`` when the regressor is fitted here, a regressor that lacks
            the components the ``operator`` needs, or, with
            ``operator="personal_residual"``, ``y`` missing, not 1-D or not
            finite or a multi-output regressor; also as the regressor's
            ``fit`` when it is fitted here.
        TypeError
            If ``estimator`` is not a
            :class:`~skfedgp.FederatedHierarchicalGPRegressor` (or None), or
            ``X`` is sparse.
        FloatingPointError
            With ``operator="published"``, if a client's operator has zero
            trace (its inputs lie many lengthscales away from every inducing
            input); also as the regressor's ``fit``.
        numpy.linalg.LinAlgError
            With ``operator="published"``, as :func:`projection_operator`.
        skfedgp.CholeskyError
            As the regressor's ``fit`` when it is fitted here.

        Warns
        -----
        UserWarning
            With ``1 < n_clusters < n_clients`` and clients that are all
            equally dissimilar (to 1e-6 relative; e.g. identical data):
            every partition is as good, so ``client_labels_`` are
            arbitrary.

        Notes
        -----
        On any error the estimator keeps its previous fitted state (or
        stays unfitted).
        """
        self._check_params()
        X = validate_data(self, unmask(X, "X"), dtype=np.float64)
        groups = unmask(groups, "groups")
        if groups is None:
            raise ValueError(
                "OperatorClustering clusters clients: pass groups (the client label "
                "of every row of X)"
            )
        # a list keeps its labels' types (as the regressor's check_groups does):
        # [0, 1, "a"] is not ["0", "1", "a"], and a list of tuples is tuple labels
        groups = as_label_array(groups)
        if groups.ndim != 1 or groups.shape[0] != X.shape[0]:
            raise ValueError(
                f"groups must be 1-D with one label per row of X ({X.shape[0]}), "
                f"got shape {groups.shape}"
            )
        groups = normalise_labels(groups, "groups")  # dates as Timestamps, hashable
        uniq, inv = unique_labels(groups)  # mixed label types too
        n_str = sum(isinstance(u, str) for u in uniq)
        if 0 < n_str < len(uniq) or any(isinstance(u, tuple) for u in uniq):
            # str and other labels (first-seen order), or tuples: a 1-D object array
            clients = _object_array(uniq)
        else:
            clients = np.asarray(uniq)
        if clients.shape[0] < max(2, self.n_clusters):
            raise ValueError(
                f"{clients.shape[0]} client(s) cannot be split into n_clusters="
                f"{self.n_clusters} clusters (need at least 2 clients and one per cluster)"
            )
        if self.operator in ("published", "posterior") and y is not None:
            # checked before any fit (a multi-output fit would run first otherwise)
            shape = np.shape(y)
            if len(shape) == 2 and shape[1] > 1:
                raise ValueError(
                    f"operator={self.operator!r} needs scalar targets (one kernel variance "
                    f"per component), got y of shape {shape}; use operator='personal' for "
                    "multi-output targets")
        if self.operator == "personal_residual":
            # checked before any fit (a multi-output fit would run first otherwise)
            if y is None:
                raise ValueError("operator='personal_residual' needs y (each client's "
                                 "residuals are averaged per cell); pass the targets the "
                                 "regressor was fitted on")
            y = np.asarray(y, dtype=np.float64)
            if y.ndim != 1 or y.shape[0] != X.shape[0]:
                hint = (" (multi-output regressors are not supported by this operator; use "
                        "operator='personal')" if y.ndim == 2 and y.shape[1] > 1 else "")
                raise ValueError(
                    "operator='personal_residual' needs 1-D y with one target per row of X "
                    f"({X.shape[0]}), got shape {y.shape}{hint}")
            if not np.all(np.isfinite(y)):
                raise ValueError("operator='personal_residual' needs finite y (NaN or inf "
                                 "found)")
        reg = self._regressor(X, y, groups)
        labels = uniq  # plain Python values, in the order of clients
        unknown = [lab for lab in labels if lab not in reg.clients_]
        if unknown:
            excluded = [lab for lab in unknown if lab in getattr(reg, "excluded_clients_", [])]
            if excluded:  # the regressor left them out after their calls failed
                raise ValueError(
                    f"client(s) {excluded[:5]} were excluded from the regressor's model after "
                    "their calls failed (see its failed_clients_); without a fitted model "
                    "they cannot be clustered")
            raise ValueError(f"client(s) {unknown[:5]} are not clients of the fitted estimator")

        if self.operator in ("published", "posterior") and getattr(reg, "n_outputs_", 1) != 1:
            raise ValueError(
                f"operator={self.operator!r} needs a regressor fitted on one target column "
                f"(one kernel variance per component), got one with "
                f"n_outputs_={reg.n_outputs_}; use operator='personal'")
        ops = {}
        if self.operator == "personal":
            pts = self._eval_points(X)
        elif self.operator == "personal_residual":
            if getattr(reg, "n_outputs_", 1) != 1:
                raise ValueError(
                    f"operator='personal_residual' needs a regressor fitted on one target "
                    f"column, got one with n_outputs_={reg.n_outputs_}; use operator='personal'")
            grid = self._grid(X)
        for k, lab in enumerate(labels):
            if self.operator == "published":
                ops[lab] = self._published(reg, lab, X[inv == k])
            elif self.operator == "posterior":
                ops[lab] = self._posterior(reg, lab)
            elif self.operator == "personal_residual":
                ops[lab] = self._personal_residual(reg, lab, X[inv == k], y[inv == k], grid)
            else:
                ops[lab] = self._personal(reg, lab, pts)
        # only the M x M (and M_i x M_i) blocks, or the personal functions at
        # the shared evaluation points (with "personal_residual", corrected by
        # the clients' cell means of their residuals), reach this point
        T = len(labels)
        rho = np.zeros((T, T))
        for i in range(T):
            for j in range(i + 1, T):
                a, b = ops[labels[i]], ops[labels[j]]
                if self.operator in ("personal", "personal_residual"):
                    # E ||h_i - h_j||^2 / n_eval, independent posteriors
                    rho[i, j] = float(np.mean((a[0] - b[0]) ** 2 + a[1] + b[1]))
                else:
                    rho[i, j] = sum(float(np.sum((u - v) ** 2))
                                    for u, v in (_pad_pair(u, v) for u, v in zip(a, b)))
                rho[j, i] = rho[i, j]
        off = rho[np.triu_indices(T, 1)]
        if (1 < self.n_clusters < T
                and float(off.max() - off.min()) <= 1e-6 * float(off.max()) + 1e-300):
            warnings.warn(
                f"all {T} clients are equally dissimilar (every dissimilarity is "
                f"{float(off.max()):.3g}; e.g. clients with identical data): no partition "
                f"into {self.n_clusters} clusters is preferred and client_labels_ are "
                "arbitrary", UserWarning, stacklevel=user_stacklevel())
        med = float(np.median(off))
        med = med if med > 0 else 1.0
        W = np.exp(-rho / med) if self.affinity == "rbf" else 1.0 / (1.0 + rho / med)
        sc = SpectralClustering(n_clusters=self.n_clusters, affinity="precomputed",
                                random_state=self.random_state)
        if self.n_clusters == len(clients):
            # one client per cluster: nothing to embed (SciPy's eigensolver
            # would warn that it needs every eigenvector)
            client_labels = np.arange(len(clients))
        else:
            client_labels = sc.fit_predict(W)
        client_labels = client_labels.astype(np.int64)  # one dtype whatever the path

        self.estimator_ = reg
        self.clients_ = clients
        self.operators_ = ops
        self.dissimilarity_ = rho
        self.affinity_matrix_ = W
        self.client_labels_ = client_labels
        self.labels_ = client_labels[inv]
        return self

    def fit_predict(self, X, y=None, groups=None):
        """Fit and return ``labels_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            As in :meth:`fit`.
        y : array-like of shape (n_samples,), default=None
            As in :meth:`fit`.
        groups : array-like of shape (n_samples,)
            As in :meth:`fit` (required).

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Cluster of each row of ``X``.

        Raises
        ------
        ValueError
            As :meth:`fit`.
        TypeError
            As :meth:`fit`.
        FloatingPointError
            As :meth:`fit`.
        numpy.linalg.LinAlgError
            As :meth:`fit`.
        skfedgp.CholeskyError
            As :meth:`fit`.
        """
        return self.fit(X, y, groups).labels_
