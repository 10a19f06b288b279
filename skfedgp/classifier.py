"""Maximum-evidence curve classifier: every class is a pFedHGP client
(pFedHGP paper, section 3.8.1 and section 5.1).
"""

from __future__ import annotations

import collections
import hashlib
import numbers
import warnings
from collections.abc import Mapping

import numpy as np
from joblib import Parallel, delayed
from scipy.linalg import cho_factor, solve_triangular
from scipy.special import logsumexp
from scipy.stats import rankdata
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._linalg import CholeskyError
from ._parallel import single_threaded_blas
from ._validation import (check_n_jobs, float_param, keep_state_on_error, unmask,
                          user_stacklevel)
from .federated import default_sizes_quiet, warning_filters_kept
from .regressor import FederatedHierarchicalGPRegressor, SharedPartsOffWarning, TargetScaleError

__all__ = ["MaxEvidenceClassifier", "default_curve_regressor", "fold_order", "impute_ppca",
           "ppca_fit", "ppca_loglik", "proba_floor", "proba_temperature", "select_ppca_rank",
           "select_rank_by_accuracy"]

_LOG_2PI = float(np.log(2.0 * np.pi))
_CHANNEL_MODES = ("concatenate", "multioutput")
_VARIATIONS = ("ppca", "none")
#: Jitter tries (relative to the mean diagonal) if a predictive covariance
#: is numerically singular: 1e-10, 1e-9, ..., 1e-6.
_JITTERS = (0.0, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6)


def default_curve_regressor(step=1.0):
    """The regressor of the pFedHGP tonnage study (pFedHGP paper, section 5.1), adapted.

    ``M = 81`` global and ``M_i = 41`` local inducing points, initial
    lengthscales 50 and 10 grid steps (index units of the default grid;
    :class:`MaxEvidenceClassifier` passes the median spacing of another
    grid as ``step``) and initial
    variances 1.0 and 0.5, as in the paper; the regressor's default training
    (structured family, L-BFGS, 20 iterations per local phase, stopping
    rule) with at most ``n_rounds=2`` rounds.

    The paper's "10 rounds x 100 local steps" was an Adam budget. With
    L-BFGS each round fits the local blocks to near convergence; a class
    mean function is pinned down by its dense training curves after the
    first rounds, and the discriminative part of the classifier (the
    within-class law, ``curve_variation="ppca"``) is fitted afterwards from
    the residuals. On the stamping stand-in (4 x 1201 points, 80 training
    curves) one round costs minutes, and 2 rounds already classify all test
    cycles. A fit that stops at the cap issues the regressor's
    ``ConvergenceWarning``, except inside :class:`MaxEvidenceClassifier`
    with ``estimator=None``, where the cap is the design and the warning
    is not shown (its other warnings, e.g. a noise variance at its floor,
    are). Raise ``n_rounds`` for a converged ELBO.

    Parameters
    ----------
    step : float, default=1.0
        Spacing of the curves' grid, in the grid's units: the initial
        lengthscales are ``50 * step`` and ``10 * step``.

    Returns
    -------
    FederatedHierarchicalGPRegressor
        Unfitted.

    Raises
    ------
    TypeError
        If ``step`` is not a number (``50.0 * step`` fails). Nothing else is
        checked here: the regressor validates its lengthscales in ``fit``.
    """
    return FederatedHierarchicalGPRegressor(
        n_inducing=81, n_inducing_local=41, lengthscale=50.0 * step,
        local_lengthscale=10.0 * step,
        variance=1.0, local_variance=0.5, n_rounds=2,
    )


def _channel_standardisation(X, n_channels, n_points):
    """Per channel: mean and standard deviation of its observed training points.

    Parameters
    ----------
    X : ndarray of shape (n_curves, n_channels * n_points)
        Training curves, channels side by side; NaN marks a missing point.
    n_channels, n_points : int

    Returns
    -------
    offset, scale : ndarray of shape (n_channels,)
        A channel that does not vary (or has one observed point) gets scale
        1; one with no observed point offset 0.
    """
    C = X.reshape(X.shape[0], n_channels, n_points).transpose(1, 0, 2).reshape(n_channels, -1)
    offset = np.zeros(n_channels)
    scale = np.ones(n_channels)
    for c in range(n_channels):
        v = C[c][~np.isnan(C[c])]
        if v.size:
            offset[c] = v.mean()
            sd = v.std()
            if v.size > 1 and np.isfinite(sd) and sd > 0:
                scale[c] = sd
    return offset, scale


def _gaussian_loglik(mean, cov, R, what):
    """``log N(r; mean, cov)`` for every row ``r`` of ``R``, one Cholesky.

    Parameters
    ----------
    mean : ndarray of shape (p,)
    cov : ndarray of shape (p, p)
    R : ndarray of shape (n, p)
    what : str
        Name used in the error message.

    Returns
    -------
    ndarray of shape (n,)
    """
    p = mean.shape[0]
    scale = float(np.mean(np.diag(cov)))
    for jit in _JITTERS:
        try:
            A = cov if jit == 0.0 else cov + (jit * scale) * np.eye(p)
            c, lower = cho_factor(A, lower=True, check_finite=False)
            break
        except np.linalg.LinAlgError:
            continue
    else:
        raise CholeskyError(
            f"Cholesky of the predictive covariance of {what} failed even with "
            f"jitter {_JITTERS[-1]:g} x mean variance",
            matrix=f"predictive covariance ({what})", jitter=_JITTERS[-1] * scale,
        )
    Zs = solve_triangular(c, (R - mean).T, lower=True, check_finite=False)  # (p, n)
    logdet = 2.0 * np.sum(np.log(np.diag(c)))
    return -0.5 * (np.einsum("ij,ij->j", Zs, Zs) + logdet + p * _LOG_2PI)


# ----------------------------------------------------------------------
# within-class (curve-to-curve) variation: probabilistic PCA of residuals
# ----------------------------------------------------------------------
#: Smallest isotropic variance of the within-class law, in the units of the
#: residuals scaled by their channel RMS (where a channel's residuals have
#: mean square 1): identical training curves must not give a singular law.
MIN_WITHIN_VARIANCE = 1e-6


def _column_mean(R):
    """Mean of every column of ``R`` over its observed (non-NaN) entries; 0
    for a column with none."""
    count = np.sum(~np.isnan(R), axis=0)
    return np.where(count > 0, np.nansum(R, axis=0) / np.maximum(count, 1), 0.0)


#: Folds of the cross-validation that picks the rank of the within-class
#: covariance (fewer if a class has fewer curves).
N_RANK_FOLDS = 5


def fold_order(R):
    """Order of curves for cross-validation folds, from their values alone.

    Each curve is coded by the sign of its difference from the (lower)
    median curve, point by point, and the curves are sorted by a hash
    (BLAKE2b) of that code. The folds that :func:`select_ppca_rank` and
    :func:`select_rank_by_accuracy` cut from this order are therefore
    pseudo-random, reproducible, independent of the order in which the
    training curves are given (permuting the rows of the training set
    permutes nothing in the fitted model), and unchanged by a positive
    scaling or a shift of any point or channel (another unit, kelvin for
    celsius). (Contiguous folds in the given order made the chosen rank
    depend on it: ArrowHead's accuracy ranged over 0.811-0.829 across
    shuffles of its training rows.) Curves with the same code (common when
    they differ mostly by level) are ordered by a hash of their ranks among
    all curves, point by point, which those changes leave alone too; only
    identical curves keep their given order among themselves.

    Parameters
    ----------
    R : ndarray of shape (n, p)
        Curves; NaN marks a missing point (coded on its own).

    Returns
    -------
    order : ndarray of int of shape (n,)
        A permutation of ``0 .. n - 1``. Raises nothing for finite or NaN
        input (an empty ``R`` gives an empty order).

    Notes
    -----
    Beyond the pFedHGP paper (H. Yan, "Personalized Federated Hierarchical
    Gaussian Processes for Privacy-Preserving Modeling of Heterogeneous
    Distributed Systems", arXiv:2609.19337, 2026, section 3.8.1 scores eq. 31
    only): the folds of the K-fold cross-validation that chooses the
    within-class rank (docs/classification.md).
    """
    R = np.asarray(R, dtype=float)
    n = R.shape[0]
    if n < 2:
        return np.arange(n)
    miss = np.isnan(R)
    srt = np.sort(np.where(miss, np.inf, R), axis=0)
    count = np.sum(~miss, axis=0)
    med = srt[np.maximum(count - 1, 0) // 2, np.arange(R.shape[1])]  # an observed value
    with np.errstate(invalid="ignore"):
        code = np.sign(R - med).astype(np.int8)
    code[miss] = 2
    # ties of the code (curves that differ mostly by level, short curves) are
    # broken by the curves' ranks among all curves, point by point, which no
    # row order, unit or shift changes either
    ranks = rankdata(np.where(miss, np.inf, R), method="min", axis=0).astype(np.int64)
    ranks[miss] = -1

    def key(a):
        return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=8).digest()

    keys = [(key(c), key(r)) for c, r in zip(code, ranks)]
    return np.array(sorted(range(n), key=keys.__getitem__), dtype=int)


def ppca_fit(R, rank):
    """Maximum-likelihood probabilistic PCA of zero-mean residual curves.

    ``r ~ N(0, W W^T + s2 I)`` with ``W`` of rank ``rank``: the leading
    eigenvectors of ``S = R^T R / n`` scaled by ``sqrt(lambda_j - s2)`` and
    ``s2`` the mean of the other ``p - rank`` eigenvalues (Tipping and
    Bishop (1999), "Probabilistic principal component analysis", J. R.
    Statist. Soc. B 61(3), eq. 7 and 8, with the mean given, not estimated).

    Parameters
    ----------
    R : ndarray of shape (n, p)
        Residual curves (finite), ``n >= 1``.
    rank : int
        ``0 <= rank < p``; ranks above ``n`` give zero columns.

    Returns
    -------
    W : ndarray of shape (p, rank)
    s2 : float
        Isotropic variance, at least ``1e-10`` times the mean of ``S``'s
        diagonal (and positive).

    Raises
    ------
    ValueError
        If ``R`` is not 2-D, has no rows or holds NaN/inf (checked before
        the SVD, which does not return on inf), or ``rank`` is outside
        ``[0, p - 1]`` (at ``rank >= p`` no eigenvalue is left for
        ``s2``).
    TypeError
        If ``rank`` is not an integer.
    numpy.linalg.LinAlgError
        If the SVD of ``R`` does not converge.
    """
    n, p = R.shape
    if n < 1:
        raise ValueError(f"R must hold at least one residual curve, got shape {R.shape}")
    if not np.all(np.isfinite(R)):
        raise ValueError("R contains NaN or inf")
    if not 0 <= rank < p:
        raise ValueError(f"rank must be in [0, p - 1] = [0, {p - 1}] for curves of p = {p} "
                         f"points (s2 is the mean of the other p - rank eigenvalues), "
                         f"got {rank!r}")
    _, sv, Vt = np.linalg.svd(R, full_matrices=False)
    lam = np.zeros(p)
    lam[: sv.size] = sv**2 / n
    total = float(np.sum(R**2)) / n
    s2 = (total - lam[:rank].sum()) / (p - rank)
    s2 = max(s2, 1e-10 * total / p, np.finfo(float).tiny)
    W = np.zeros((p, rank))
    r = min(rank, Vt.shape[0])
    W[:, :r] = Vt[:r].T * np.sqrt(np.maximum(lam[:r] - s2, 0.0))
    return W, s2


def ppca_loglik(R, W, s2):
    """``log N(r; 0, W W^T + s2 I)`` for every row of ``R`` (Woodbury, ``O(p q^2)``).

    Parameters
    ----------
    R : ndarray of shape (n, p)
        Finite.
    W : ndarray of shape (p, q)
        Finite.
    s2 : float
        Finite and positive.

    Returns
    -------
    ndarray of shape (n,)

    Raises
    ------
    ValueError
        If ``R`` or ``W`` is not 2-D, their shapes do not match (``p``),
        ``R`` or ``W`` holds NaN/inf, or ``s2`` is not a finite positive
        number (0, negative, NaN, or not a number).
    numpy.linalg.LinAlgError
        If ``I + W^T W / s2`` is not positive definite.
    """
    try:
        s2_ok = bool(np.ndim(s2) == 0 and np.isfinite(s2) and s2 > 0)
    except TypeError:  # a string, None
        s2_ok = False
    if not s2_ok:
        raise ValueError(f"s2 must be a finite positive number, got {s2!r}")
    if not np.all(np.isfinite(R)):
        raise ValueError("R contains NaN or inf")
    if not np.all(np.isfinite(W)):
        raise ValueError("W contains NaN or inf")
    p, q = W.shape
    M = np.eye(q) + (W.T @ W) / s2
    L = np.linalg.cholesky(M)
    Z = np.linalg.solve(L, W.T @ R.T) / s2 if q else np.zeros((0, R.shape[0]))
    quad = np.sum(R**2, axis=1) / s2 - np.sum(Z**2, axis=0)
    logdet = p * np.log(s2) + 2.0 * np.sum(np.log(np.diag(L)))
    return -0.5 * (quad + logdet + p * _LOG_2PI)


#: Most sweeps of :func:`impute_ppca`.
IMPUTE_MAX_SWEEPS = 100
#: :func:`impute_ppca` stops when no filled entry moves by more than this
#: fraction of the residuals' root mean square in a sweep.
IMPUTE_TOL = 1e-6
#: :func:`impute_ppca` re-selects the rank every this many sweeps.
IMPUTE_RANK_EVERY = 10


def impute_ppca(R, max_sweeps=IMPUTE_MAX_SWEEPS, tol=IMPUTE_TOL):
    """Missing entries of residual curves filled by iterative PPCA imputation.

    Every missing entry starts at its column's observed mean; then each
    sweep fits a probabilistic PCA law ``N(m, W W^T + s2 I)`` to the filled
    curves (:func:`ppca_fit` on the centred curves, ``m`` their mean, the rank
    chosen by held-out likelihood, :func:`select_ppca_rank`, every
    :data:`IMPUTE_RANK_EVERY` sweeps) and replaces the missing entries of
    every curve by their conditional mean given its observed entries,
    ``m_u + W_u (W_o^T W_o + s2 I)^{-1} W_o^T (r_o - m_o)`` (``o``:
    observed, ``u``: missing). This is the EM algorithm for PCA with missing
    values without the conditional-covariance term (Ilin and Raiko (2010),
    "Practical approaches to principal component analysis in the presence
    of missing values", JMLR 11; the regularised iterative PCA
    of Josse and Husson (2012), Journal de la SFdS 153(2)): the filled
    entries follow the curve's observed points along the class's
    directions of variation instead of sitting at the mean.

    Parameters
    ----------
    R : ndarray of shape (n, p)
        Residual curves; NaN marks a missing entry, every other entry is
        finite.
    max_sweeps : int, default=100
    tol : float, default=1e-6
        Stop when no filled entry moves by more than ``tol`` times the root
        mean square of the filled curves.

    Returns
    -------
    ndarray of shape (n, p)
        ``R`` with its missing entries filled (a copy; ``R`` itself when
        nothing is missing). With fewer than 3 curves the column means are
        kept (no covariance to learn from); a column no curve observes is 0.

    Raises
    ------
    ValueError
        If ``R`` is not 2-D or holds inf.
    numpy.linalg.LinAlgError
        If an SVD of the filled curves does not converge.
    """
    R = np.asarray(R, dtype=np.float64)
    if R.ndim != 2:
        raise ValueError(f"R must be 2-D (n_curves, n_points), got shape {R.shape}")
    if np.isinf(R).any():
        raise ValueError("R contains inf")
    miss = np.isnan(R)
    if not miss.any():
        return R
    n, p = R.shape
    count = np.sum(~miss, axis=0)
    col = np.where(miss, 0.0, R).sum(axis=0) / np.maximum(count, 1)  # 0 where unseen
    F = np.where(miss, col, R)
    fill = miss & (count > 0)  # entries to impute; unseen columns stay 0
    rows = np.flatnonzero(fill.any(axis=1))
    if n < 3 or rows.size == 0:
        return F
    rank = 0
    for sweep in range(max_sweeps):
        m = F.mean(axis=0)
        if sweep % IMPUTE_RANK_EVERY == 0:
            rank = select_ppca_rank(F, center=True)
        W, s2 = ppca_fit(F - m, rank)
        move = 0.0
        for i in rows:
            o, u = ~miss[i], fill[i]
            new = m[u].copy()
            if rank:
                Wo = W[o]
                z = np.linalg.solve(Wo.T @ Wo + s2 * np.eye(rank), Wo.T @ (F[i, o] - m[o]))
                new += W[u] @ z
            move = max(move, float(np.max(np.abs(new - F[i, u]))))
            F[i, u] = new
        if move <= tol * np.sqrt(np.mean(F**2)):
            break
    return F


def select_ppca_rank(R, n_folds=N_RANK_FOLDS, center=False):
    """Rank of the within-class covariance by cross-validated likelihood.

    Every rank ``0 .. n_train - 1`` (``n_train``: the smallest training fold;
    ``n_train - 2`` with ``center``) is fitted by :func:`ppca_fit` on the
    training folds and scored by :func:`ppca_loglik` on the held-out curves
    (folds cut from the curves in :func:`fold_order`, so the result does not
    depend on the order of the rows); the rank with the largest total
    held-out log-likelihood wins.

    Parameters
    ----------
    R : ndarray of shape (n, p)
        Residual curves, ``n >= 1``.
    n_folds : int, default=5
    center : bool, default=False
        Estimate the mean too: the training folds' mean is taken off both
        the training and the held-out curves.

    Returns
    -------
    rank : int
        0 if ``n < 3`` (too few curves to hold any out usefully).

    Raises
    ------
    ValueError
        If ``R`` is not 2-D, or, with ``n >= 3``, holds NaN/inf or
        ``n_folds < 1``.
    numpy.linalg.LinAlgError
        If an SVD of the residual curves does not converge.
    """
    n, p = R.shape
    if n < 3:
        return 0
    k = min(n_folds, n)
    folds = np.array_split(fold_order(R), k)
    n_train = n - max(f.size for f in folds)
    ranks = np.arange(0, max(0, min(n_train - 1 - int(center), p - 1)) + 1)
    score = np.zeros(ranks.size)
    for f in folds:
        tr = np.setdiff1d(np.arange(n), f)
        m = R[tr].mean(axis=0) if center else 0.0
        for i, q in enumerate(ranks):
            W, s2 = ppca_fit(R[tr] - m, int(q))
            score[i] += ppca_loglik(R[f] - m, W, s2).sum()
    return int(ranks[np.argmax(score)])


def _ppca_logliks_by_rank(Rc, Rh, ranks):
    """Held-out :func:`ppca_loglik` of the PPCA fits of ``Rc`` at every rank, at once.

    The columns of ``W`` (:func:`ppca_fit`) are orthogonal, along the right
    singular vectors ``v_j`` of ``Rc``: the law has variance
    ``e_j = max(lam_j - s2, 0) + s2'`` along ``v_j`` (``j < q``) and ``s2'``
    elsewhere (``s2'``: ``s2`` floored at :data:`MIN_WITHIN_VARIANCE`), so one
    projection ``P = R_h V`` gives every rank in ``O(n_h q)``.

    Parameters
    ----------
    Rc : ndarray of shape (n, p)
        Centred training residuals.
    Rh : ndarray of shape (n_h, p)
        Held-out residuals (same centring).
    ranks : ndarray of int, shape (n_ranks,)

    Returns
    -------
    ndarray of shape (n_ranks, n_h)
    """
    n, p = Rc.shape
    n = max(n, 1)
    _, sv, Vt = np.linalg.svd(Rc, full_matrices=False)
    lam = np.zeros(p)
    lam[: sv.size] = sv**2 / n
    total = float(np.sum(Rc**2)) / n
    qmax = int(np.max(ranks)) if len(ranks) else 0
    P2 = (Rh @ Vt[:qmax].T) ** 2 if qmax else np.zeros((Rh.shape[0], 0))
    rr = np.sum(Rh**2, axis=1)
    out = np.empty((len(ranks), Rh.shape[0]))
    for i, q in enumerate(ranks):
        q = int(q)
        s2 = (total - lam[:q].sum()) / (p - q)
        s2 = max(s2, 1e-10 * total / p, np.finfo(float).tiny)  # as in ppca_fit
        s2f = max(s2, MIN_WITHIN_VARIANCE)
        e = np.maximum(lam[:q] - s2, 0.0) + s2f
        proj = P2[:, :q]
        quad = proj @ (1.0 / e) + (rr - proj.sum(axis=1)) / s2f
        logdet = float(np.sum(np.log(e))) + (p - q) * np.log(s2f)
        out[i] = -0.5 * (quad + logdet + p * _LOG_2PI)
    return out


def select_rank_by_accuracy(X, y_idx, means, scales, log_prior, n_folds=N_RANK_FOLDS):
    """One within-class rank for all classes, by cross-validated accuracy.

    The curves of every class are split into ``n_folds`` folds, cut from
    the class's curves in :func:`fold_order` (so the rank does not depend on
    the order of the rows; fold ``f`` holds the ``f``-th part of every
    class). For every fold and
    every candidate rank ``q``, each class's law ``N(mu_c + D_c m_c,
    D_c (W_c W_c^T + s2_c I) D_c)`` is fitted by :func:`ppca_fit` on its
    training-fold curves (``q`` capped by what the class's training curves
    support, as in :func:`select_ppca_rank`), the held-out curves of all
    classes are assigned to the class of largest log density plus log
    prior, and the correct assignments are counted. The rank with the most
    correct assignments wins. The regressor's
    class means ``mu_c`` are held fixed and its latent covariance is left
    out of this selection.

    Held-out *likelihood* (:func:`select_ppca_rank`) asks how well a class
    law describes its own curves; a classifier needs laws that tell classes
    apart, and on the UCR curves the likelihood choice (ranks 3-4 on
    GunPoint) is far below the rank that classifies best. Among ranks that
    classify equally well, the one whose held-out curves have the largest
    log density under their own classes wins.

    Source: beyond the pFedHGP paper (its section 3.8.1 scores eq. 31 only);
    the class laws are probabilistic PCA (Tipping and Bishop 1999, J. R.
    Statist. Soc. B 61(3), eqs. 7-8), the rank chosen as a classifier
    hyperparameter by K-fold cross-validation.

    Parameters
    ----------
    X : ndarray of shape (n_curves, p)
        Training curves (NaN points count as zero residuals;
        :class:`MaxEvidenceClassifier` passes its curves with missing points
        imputed, :func:`impute_ppca`).
    y_idx : ndarray of shape (n_curves,)
        Class index of every curve, ``0 .. n_classes - 1``.
    means, scales : list of ndarray of shape (p,)
        Per class: the regressor's predictive mean ``mu_c`` and the channel
        scale ``D_c`` (:class:`MaxEvidenceClassifier` passes the RMS of the
        class's residuals about their own mean, per channel).
    log_prior : ndarray of shape (n_classes,)
    n_folds : int, default=5

    Returns
    -------
    rank : int
        0 if no class has at least 3 curves.

    Raises
    ------
    ValueError
        If ``y_idx`` does not hold one class index in ``0 .. n_classes - 1``
        (``n_classes = len(means)``) per row of ``X`` (an index outside
        that range would leave its curve out silently), or ``means``,
        ``scales`` or ``log_prior`` do not match the columns of ``X`` or
        the number of classes.
    IndexError
        If ``X`` is not 2-D.
    numpy.linalg.LinAlgError
        If an SVD of the residual curves does not converge (e.g. a zero
        entry in ``scales``).
    """
    K = len(means)
    y = np.asarray(y_idx)
    if y.shape != (np.shape(X)[0],):
        raise ValueError(f"y_idx must hold one class index per curve, shape "
                         f"({np.shape(X)[0]},), got shape {y.shape}")
    bad = ~np.isin(y, np.arange(K))
    if np.any(bad):
        raise ValueError(f"y_idx must hold class indices in 0 .. {K - 1} (n_classes = "
                         f"len(means) = {K}); got {y[bad][:5].tolist()}")
    return _select_rank_by_accuracy(X, y_idx, means, scales, log_prior, n_folds)[0]


def _select_rank_by_accuracy(X, y_idx, means, scales, log_prior, n_folds=N_RANK_FOLDS):
    """:func:`select_rank_by_accuracy`, with the held-out log-likelihoods at the chosen rank.

    Returns
    -------
    rank : int
    loglik : ndarray of shape (n_held, n_classes) or None
        Held-out log densities (no prior) at ``rank`` (None without a
        cross-validation), for :func:`proba_temperature`.
    own : ndarray of shape (n_held,) or None
    """
    K = len(means)
    folds = _cv_folds(X, y_idx, K, n_folds)
    caps = folds[2]
    if caps is None:
        return 0, None, None
    ranks = np.arange(max(caps) + 1)
    ll, own = _cv_scores(X, y_idx, means, scales, np.zeros(K), ranks[:, None], n_folds,
                         folds=folds)
    joint = ll + np.asarray(log_prior, dtype=float)
    correct = np.sum(np.argmax(joint, axis=2) == own[None, :], axis=1)
    fit = joint[:, np.arange(own.size), own].sum(axis=1)  # held-out log density, own classes
    best = np.flatnonzero(correct == correct.max())
    i = best[np.argmax(fit[best])]
    return int(ranks[i]), ll[i], own


def _cv_folds(X, y_idx, K, n_folds):
    """``(members, parts, caps, k_folds)`` of the within-class cross-validation.

    The curves ``X`` (n_curves, p) of every class with at least 3 curves are
    split into ``k_folds`` folds, in :func:`fold_order` within the class;
    ``caps[k]`` is the largest rank class ``k``'s training folds support.
    ``caps`` is None when fewer than 2 folds are possible.
    """
    p = X.shape[1]
    members = []
    for k in range(K):
        m = np.flatnonzero(y_idx == k)
        members.append(m[fold_order(X[m])])
    k_folds = min([n_folds] + ([m.size for m in members if m.size >= 3] or [0]))
    if k_folds < 2:
        return members, None, None, k_folds
    parts = [np.array_split(m, k_folds) if m.size >= 3 else [m[:0]] * k_folds
             for m in members]
    caps = []
    for k, m in enumerate(members):
        n_train = m.size - max(f.size for f in parts[k])
        caps.append(max(0, min(n_train - 2, p - 1)) if m.size >= 3 else 0)
    return members, parts, caps, k_folds


def _cv_scores(X, y_idx, means, scales, log_prior, rank_table, n_folds=N_RANK_FOLDS,
               X_held=None, folds=None):
    """Held-out scores of the training curves under K-fold within-class laws.

    Parameters
    ----------
    X, y_idx, means, scales, log_prior
        As in :func:`select_rank_by_accuracy`.
    X_held : ndarray of shape X.shape, default=None
        The curves as scored when held out (None: ``X``). :class:`MaxEvidenceClassifier`
        passes its curves with missing points filled as ``X`` (the training
        folds) and unfilled here: a missing point is then a zero residual
        under every class, while a filled one would carry its own class's
        law into its score.
    rank_table : ndarray of int of shape (n_candidates, n_classes) or (n_candidates, 1)
        Candidate ``r`` gives class ``k`` the rank ``rank_table[r, k]``
        (capped by what its training folds support).
    n_folds : int, default=5
    folds : tuple, default=None
        :func:`_cv_folds` of ``X``, ``y_idx`` and ``n_folds`` when the caller
        has them already (None: computed here).

    Returns
    -------
    scores : ndarray of shape (n_candidates, n_held, n_classes) or None
        Log density of every held-out curve under every class's law plus
        the log prior. None when fewer than 2 folds are possible.
    own : ndarray of shape (n_held,) or None
        The held-out curves' class indices.
    """
    K = len(means)
    p = X.shape[1]
    Xh = X if X_held is None else X_held
    if folds is None:
        folds = _cv_folds(X, y_idx, K, n_folds)
    members, parts, caps, k_folds = folds
    if caps is None:
        return None, None
    table = np.broadcast_to(np.asarray(rank_table, dtype=int),
                            (np.shape(rank_table)[0], K))
    logs = [np.sum(np.log(sc)) for sc in scales]
    out, owns = [], []
    for f in range(k_folds):
        held = np.concatenate([parts[k][f] for k in range(K)])
        if held.size == 0:
            continue
        ll = np.empty((table.shape[0], held.size, K))
        for k in range(K):
            tr = np.setdiff1d(members[k], parts[k][f])
            Rtr = np.nan_to_num((X[tr] - means[k]) / scales[k], nan=0.0)
            center = members[k].size >= 3
            m = Rtr.mean(axis=0) if center else np.zeros(p)
            Rh = np.nan_to_num((Xh[held] - means[k]) / scales[k], nan=0.0) - m
            ll[:, :, k] = (_ppca_logliks_by_rank(Rtr - m, Rh, np.minimum(table[:, k], caps[k]))
                           - logs[k] + log_prior[k])
        out.append(ll)
        owns.append(y_idx[held])
    return np.concatenate(out, axis=1), np.concatenate(owns)


#: Largest temperature of :func:`proba_temperature` (probabilities then
#: equal the prior to within ``log-likelihood range / MAX_TEMPERATURE``).
MAX_TEMPERATURE = 1e8


def proba_floor(loglik, own, log_prior=None, sample_weight=None):
    """Share ``eps`` of the prior mixed into the class probabilities.

    The probabilities are ``(1 - eps) softmax(loglik / T + log_prior) + eps
    prior``: with probability ``eps`` the model's assignment says nothing
    and the class follows the prior. ``eps = K / (K - 1) * (e + 1) / (n +
    2)``: Laplace's rule of succession (the posterior mean of an error rate
    under a uniform prior) for the held-out error rate ``e / n`` of the arg
    max of ``loglik + log_prior`` (``e`` the weighted number of wrong
    curves, ``n`` the number of curves), scaled so that, with a uniform
    prior, a confidently wrong curve keeps probability ``eps / K`` for its
    true class: the error rate shared among the ``K - 1`` other classes
    (the error rate itself for two classes). A classifier whose held-out curves
    are all right on a handful of them is not certain to be right on new
    ones: with 20 held-out curves and 2 equally likely classes no
    probability exceeds ``1 - 1/22``.

    Parameters
    ----------
    loglik, own, log_prior, sample_weight
        As in :func:`proba_temperature`.

    Returns
    -------
    float
        ``eps`` in ``(0, 1]`` (1.0: the probabilities are the prior, the
        classifier being no better than chance on the held-out curves; also
        without held-out curves), 0.0 with non-finite log-likelihoods.

    Raises
    ------
    ValueError
        If ``loglik`` is not a 2-D array of numbers with at least 2
        columns, or ``log_prior`` or ``sample_weight`` does not match it.
    IndexError
        If ``own`` is not an integer array of one valid column per row.
    """
    loglik = np.asarray(loglik, dtype=float)
    if loglik.ndim != 2 or loglik.shape[1] < 2:
        raise ValueError(f"loglik must have shape (n_curves, n_classes >= 2), got {loglik.shape}")
    n, K = loglik.shape
    if n == 0:
        return 1.0
    if not np.all(np.isfinite(loglik)):
        return 0.0
    lp = np.zeros(K) if log_prior is None else np.asarray(log_prior, dtype=float)
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    if lp.shape != (K,) or w.shape != (n,):
        raise ValueError(f"log_prior must have shape ({K},) and sample_weight ({n},), got "
                         f"{lp.shape} and {w.shape}")
    wrong = np.argmax(loglik + lp, axis=1) != np.asarray(own)
    e = n * float(w @ wrong) / float(w.sum())
    return float(min(1.0, K / (K - 1) * (e + 1.0) / (n + 2.0)))


def _mix_prior(logp, log_prior, eps):
    """``log((1 - eps) exp(logp) + eps exp(log_prior))``, stably."""
    if eps <= 0:
        return logp
    if eps >= 1:
        return np.broadcast_to(log_prior, np.shape(logp)).copy()
    return np.logaddexp(np.log1p(-eps) + logp, np.log(eps) + log_prior)


def proba_temperature(loglik, own, log_prior=None, sample_weight=None, floor=0.0):
    """Temperature ``T >= 1`` that calibrates ``softmax(loglik / T + log_prior)``.

    Class scores of a generative classifier are log densities of whole
    curves: differences of hundreds of nats are common even between classes
    that cannot be told apart (finite-sample differences of their fitted
    laws), so the posterior ``softmax(loglik + log_prior)`` is close to 0
    or 1 whether or not the assignment is right. The temperature divides
    the log-likelihoods (not the prior) and minimises the (weighted) mean
    held-out log loss ``-log softmax(loglik / T + log_prior)[own]`` over
    ``1 <= T <=`` :data:`MAX_TEMPERATURE` (the loss is convex in ``1 / T``;
    bounded Brent search on ``log T``). ``T`` only softens: probabilities
    are never made sharper than the model's; at the largest ``T`` they are
    the prior. With a uniform prior the arg max is that of ``loglik``.

    Source: temperature scaling (Guo, Pleiss, Sun and Weinberger, "On
    Calibration of Modern Neural Networks", ICML 2017, section 4.2), fitted
    on cross-validated scores; beyond the pFedHGP paper (which does not
    give probabilities).

    Parameters
    ----------
    loglik : ndarray of shape (n_curves, n_classes)
        Held-out log densities of the curves under every class (nats).
    own : ndarray of int of shape (n_curves,)
        Column of each curve's true class.
    log_prior : ndarray of shape (n_classes,), default=None
        Log prior class probabilities (None: uniform).
    sample_weight : ndarray of shape (n_curves,), default=None
        Weight of each curve in the mean (None: equal), e.g. ``prior_k /
        frequency_k`` of its class when the prior is not the training
        frequencies.
    floor : float, default=0.0
        Share ``eps`` of the prior mixed into the probabilities
        (:func:`proba_floor`): the loss is that of ``(1 - eps) softmax(...)
        + eps prior``.

    Returns
    -------
    float
        ``T`` (1.0 when softening does not lower the held-out log loss, with
        no held-out curve, or with non-finite log-likelihoods).

    Raises
    ------
    ValueError
        If ``loglik`` is not a 2-D array of numbers, or ``log_prior`` or
        ``sample_weight`` does not match its shape.
    IndexError
        If ``own`` is not an integer array of one valid column per row of
        ``loglik``.
    """
    from scipy.optimize import minimize_scalar

    loglik = np.asarray(loglik, dtype=float)
    if loglik.shape[0] == 0 or not np.all(np.isfinite(loglik)):
        return 1.0
    z = loglik - loglik.max(axis=1, keepdims=True)
    lp = np.zeros(z.shape[1]) if log_prior is None else np.asarray(log_prior, dtype=float)
    w = (np.ones(z.shape[0]) if sample_weight is None
         else np.asarray(sample_weight, dtype=float))
    w = w / w.sum()
    rows = np.arange(z.shape[0])

    lprior = lp - logsumexp(lp)  # the prior, normalised

    def loss(log_t):
        s = z / np.exp(log_t) + lp
        logp = _mix_prior(s[rows, own] - logsumexp(s, axis=1), lprior[own], floor)
        return float(-(w @ logp))

    res = minimize_scalar(loss, bounds=(0.0, float(np.log(MAX_TEMPERATURE))), method="bounded",
                          options={"xatol": 1e-3})
    if not np.isfinite(res.fun) or res.fun >= loss(0.0):
        return 1.0
    return float(np.exp(res.x))




def _check_label_kinds(y):
    """Raise a ValueError for missing (None) class labels, or text mixed with numbers.

    Checked on ``y`` as given, before NumPy converts a list (where ``1`` and
    ``'1'`` would become one class) and before scikit-learn's target check
    (whose message for such labels is "Unknown label type").
    """
    if y is None or (isinstance(y, np.ndarray) and y.dtype != object):
        return  # no y (scikit-learn's check says so), or one NumPy dtype: one kind
    try:
        values = list(np.ravel(np.asarray(y, dtype=object)))
    except (TypeError, ValueError):
        return  # scikit-learn's own checks report it
    if any(v is None for v in values):
        raise ValueError("y holds missing class labels (None); drop those curves or give them "
                         "their class before fit")
    text = any(isinstance(v, str) for v in values)
    number = any(isinstance(v, numbers.Number) for v in values)
    if text and number:
        kinds = sorted({type(v).__name__ for v in values})
        raise ValueError(
            f"y mixes text and numeric class labels ({', '.join(kinds)}; e.g. 1 and '1', from "
            "a label column read partly as text), which would be compared by type or "
            "merged; cast y to one type before fit (e.g. y.astype(str))")


def _check_curve_lengths(X):
    """Raise a ValueError naming the lengths when ``X`` is a sequence of curves of unequal length.

    NumPy's own message for such a list ("inhomogeneous shape") does not
    say which curves differ.
    """
    if not isinstance(X, (list, tuple)):
        return
    lengths = [len(row) if hasattr(row, "__len__") and not isinstance(row, str) else None
               for row in X]
    if None in lengths or len(set(lengths)) < 2:
        return
    counts = collections.Counter(lengths)
    common = counts.most_common(1)[0][0]
    odd = [i for i, n in enumerate(lengths) if n != common]
    raise ValueError(
        f"the curves in X have different lengths: {counts[common]} of {common} values, and "
        f"curve(s) {odd[:5]}{' ...' if len(odd) > 5 else ''} of "
        f"{sorted({lengths[i] for i in odd})[:5]}; every curve needs n_channels x n_points "
        "values on the shared grid (mark missing points as NaN)")


class MaxEvidenceClassifier(ClassifierMixin, BaseEstimator):
    """Classify whole curves by the class model that explains them best.

    Every class is one client of a federated hierarchical GP regressor
    (:class:`~skfedgp.FederatedHierarchicalGPRegressor`): the training curves
    of class ``c`` are that client's rows. A test curve ``y*`` on the grid
    is scored by the Gaussian predictive log-likelihood of each class with
    the *full* predictive covariance (pFedHGP paper, section 3.8.1, eq. 31)::

        score_c(y*) = log N(y*; mu_c(X*), Sigma_c(X*))

    and assigned to the class with the largest ``score_c + log prior_c``.

    ``Sigma_c`` must be the law of a *new* curve of class ``c``. The
    regressor alone (``curve_variation="none"``, eq. 31 as published) gives
    the posterior covariance of the class *mean function* plus white noise:
    with many training points per class the first is tiny, so curve-to-curve
    variation (gain, phase, smooth departures, correlated along the curve)
    is modelled as independent noise at every point. The default
    (``curve_variation="ppca"``, beyond the paper) replaces that white noise
    by a within-class covariance fitted on the residual curves
    ``x_n - mu_c(X*)`` of the class (channels scaled by ``D``, the RMS of
    the residuals about their own mean, with at least 3 curves)::

        Sigma_c = Sigma_c^latent + D (W_c W_c^T + s2_c I) D

    with ``W_c`` of rank ``q_c`` by maximum-likelihood probabilistic PCA
    (:func:`ppca_fit`) and the rank chosen by ``ppca_rank`` (default: one
    rank for all classes, by cross-validated accuracy on the training
    curves, :func:`select_rank_by_accuracy`); ``Sigma_c^latent`` is the
    regressor's covariance without its noise variance.

    With at least 3 curves the residuals' own mean ``m_c`` is estimated too
    (the part of the class function the sparse regressor misses): the
    class mean is then ``mu_c + D m_c``, whose uncertainty is the ``1/n_c``
    share of the within-class law (the factor ``1 + 1/n_c`` on ``W_c`` and
    ``s2_c``), and ``Sigma_c^latent`` (the uncertainty of ``mu_c`` alone,
    which ``m_c`` corrects) is left out, so it is not counted twice. A class
    whose curves do not vary (mean square of the centred scaled residuals at
    most :data:`MIN_WITHIN_VARIANCE`, e.g. identical curves) keeps the
    regressor's law ``Sigma_c^latent`` plus its noise variance: its curves
    say nothing about the spread of a new one.

    Because every curve lies on one shared grid, ``mu_c`` and ``Sigma_c`` are
    the same for all test curves: each class's covariance is predicted and
    factorised once per call and all curves are solved together.

    Parameters
    ----------
    estimator : FederatedHierarchicalGPRegressor, default=None
        Regressor to clone (one fitted copy, with one client per class).
        None means the settings of the paper's tonnage study
        (:func:`default_curve_regressor`: ``M = 81``, ``M_i = 41``, initial
        lengthscales 50 and 10, variances 1.0 and 0.5; at most
        ``n_rounds=2`` rounds), tuned for the default index grid of long curves.
    grid : array-like of shape (n_points,), default=None
        Input location of each point of a channel (the same for every
        curve), e.g. times, with at least 2 distinct values. None means
        ``arange(n_points)``. With the default ``estimator`` the initial
        lengthscales 50 and 10 are in units of the grid's median spacing
        (``50 * step`` and ``10 * step``), so any unit (index, seconds, ...)
        gives the same model as the index grid.
    n_channels : int, default=1
        Number of channels per curve. Columns ``k * n_points : (k + 1) *
        n_points`` of ``X`` hold channel ``k``.
    channel_mode : {"concatenate", "multioutput"}, default="concatenate"
        ``"concatenate"`` puts the channels one after another on one index
        axis, as the paper does: point ``j`` of channel ``k`` sits at
        ``k * (span + step) + grid[j]`` where ``span = max(grid) -
        min(grid)`` and ``step`` is the median grid spacing (for the default
        grid: ``k * n_points + j``). ``"multioutput"``
        models the channels as the outputs of the ILMM extension (pFedHGP paper,
        section 3.9): one class model with ``n_channels`` outputs on the grid,
        scored with the joint covariance of all points and channels of a curve
        (the regressor's ``predict_joint``). ``fit`` does not accept NaN
        points in this mode; test curves with NaN points are scored on their
        observed points, as in ``"concatenate"``. With ``n_channels=1`` both
        modes fit the same scalar model (``channel_mode_`` is then
        ``"concatenate"``).
    curve_variation : {"ppca", "none"}, default="ppca"
        Within-class law of a new curve: ``"ppca"`` fits the covariance
        above on each class's residual curves (a class with fewer than 3
        curves gets rank 0, i.e. per-channel white noise); ``"none"`` uses
        the regressor's predictive covariance unchanged (eq. 31).
    ppca_rank : "accuracy", "likelihood" or int, default="accuracy"
        Rank ``q_c`` of the within-class covariance (``curve_variation=
        "ppca"``): ``"accuracy"`` one rank for all classes, the one that
        classifies the held-out training curves best in a 5-fold
        cross-validation (:func:`select_rank_by_accuracy`; folds cut in
        :func:`fold_order`, so the order of the training rows does not
        matter); ``"likelihood"`` per class, the rank of largest held-out
        likelihood of the class's own curves (:func:`select_ppca_rank`); an
        int ``>= 0`` fixes it (capped by what each class's curves support).
    class_prior : "uniform", "empirical", array-like of shape (n_classes,) or dict, default="uniform"
        Prior class probabilities added (as logs) to the scores in
        :meth:`predict`, :meth:`predict_proba` and :meth:`decision_function`.
        ``"empirical"`` uses the training class frequencies; an array is
        normalised to sum to one (order of ``classes_``); a dict maps every
        class label to its (positive) weight, normalised the same way, and
        must have exactly one key per class.
    n_jobs : int, default=None
        Classes scored in parallel (threads, each with one BLAS thread);
        also passed to the regressor if not None.
    random_state : int, RandomState instance or None, default=None
        Passed to the regressor if not None.
    verbose : int, default=0
        Passed to the regressor if > 0.

    Attributes
    ----------
    estimator_ : FederatedHierarchicalGPRegressor
        The fitted regressor; its client ``k`` is class ``classes_[k]``.
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    class_log_prior_ : ndarray of shape (n_classes,)
        Log prior probabilities.
    grid_ : ndarray of shape (n_points,)
        The grid used.
    curve_variation_ : list of dict or None
        Per class (order of ``classes_``): ``"scale"`` (n_features_in_,)
        channel scale ``D`` (the RMS of the class's residuals in the channel,
        about their own mean with at least 3 curves, about ``mu_c``
        otherwise), ``"W"`` (n_features_in_, q_c), ``"noise_variance"``
        ``s2_c`` (scaled units), ``"rank"`` ``q_c``, ``"mean"`` ``m_c``,
        ``"n_curves"`` and ``"spread"`` (mean square of the centred
        residuals scaled by their channel RMS about ``mu_c``: at most
        :data:`MIN_WITHIN_VARIANCE` when the curves do not vary). None with
        ``curve_variation="none"``.
    proba_temperature_ : float
        Temperature ``T >= 1`` dividing the log-evidence in
        :meth:`predict_proba`, ``(1 - eps) softmax(log_evidence / T + log
        prior) + eps prior``, fitted for that mixture on the cross-validated
        log-evidence of the training curves (:func:`proba_temperature` with
        ``floor=proba_floor_``); 1.0 with ``curve_variation="none"`` or too
        few curves to cross-validate.
    decision_temperature_ : float
        Temperature ``T_d >= 1`` of :meth:`decision_function` and
        :meth:`predict`, ``log_evidence / T_d + log prior``: the one that
        minimises the cross-validated log loss of ``softmax(log_evidence /
        T + log prior)`` alone (:func:`proba_temperature` without a floor),
        so that classes the curves cannot tell apart are decided by the
        prior. With a uniform prior it does not change :meth:`predict`.
    proba_floor_ : float
        ``eps``, the share of the prior mixed into the probabilities
        (:func:`proba_floor`: Laplace's rule of succession for the
        cross-validated error rate); 0.0 with ``curve_variation="none"``;
        1.0 (the probabilities are the prior, with a ``UserWarning`` at
        fit) when no class has the 3 training curves a held-out fold needs.
    inputs_ : ndarray of shape (n_channels * n_points,) or (n_points,)
        Regressor input of each column of ``X`` (shape
        (n_channels * n_points,), concatenate mode), or the grid (shape
        (n_points,), multioutput mode).
    channel_mode_ : {"concatenate", "multioutput"}
        The mode used: ``channel_mode``, except ``"concatenate"`` for one
        channel.
    n_points_ : int
        Points per channel.
    n_features_in_ : int
        ``n_channels * n_points``.
    channel_offset_, channel_scale_ : ndarray of shape (n_channels,)
        Mean and standard deviation of each channel's observed training
        points (units of ``X``). With ``channel_mode="concatenate"`` and
        several channels every channel is centred and scaled by them before
        the regressor and the within-class laws see it, so the channels'
        units do not change the model (scaling one channel by 1000 changes
        no prediction); the log-evidence is still the density in the units
        of ``X`` (the scaling's Jacobian, the same for every class, is
        added). Zeros and ones otherwise (one channel: the regressor
        standardises its targets itself; ``"multioutput"``: it standardises
        each output).

    Notes
    -----
    A point that no training
    curve of a class observed keeps the regressor's predictive law there
    (mean and noisy variance, uncorrelated with the observed points): the
    within-class law has no information about it.

    A curve with NaN entries is scored on its observed points only (the
    marginal of the predictive Gaussian on those points); curves with the
    same NaN pattern share one factorisation. NaN training points are left
    out of the class's rows. A masked entry of a ``numpy.ma.MaskedArray``
    counts as NaN. Infinite values are an error.

    The log-evidences are log densities of curves of ``n_channels *
    n_points`` values, so they are large in magnitude, and the posterior
    ``softmax(log_evidence + log prior)`` is close to 0 or 1 even when the
    classes cannot be told apart. The scores therefore divide the
    log-evidence (not the prior) by a temperature ``T >= 1`` fitted on
    held-out training curves (:func:`proba_temperature`; with
    ``curve_variation="ppca"``, from the same 5-fold cross-validation of
    the within-class laws, the classes' mean functions held at the
    regressor's, each held-out curve weighted by its class's prior over its
    training frequency): with two classes drawn from one law (3 seeds, 80
    training curves of 60 points) the held-out log loss went from 3.0-15.2
    to about chance, ``log 2``. With the default uniform prior ``T`` does
    not change ``predict``. The held-out scores are an approximation of the
    test-time ones (missing training points are imputed, the ``1 + 1/n_c``
    factor and the regressor's covariance are left out, and the regressor's
    class means saw the held-out curves), so ``T`` is somewhat below the
    one that minimises the test log loss.

    A temperature alone cannot calibrate heavy-tailed score differences:
    where the held-out curves were all right (a handful of them, or the
    rank chosen because it classified them best) it stays at 1, and a
    wrong test curve then gets probability near 0 for its class (test
    log loss 4.25 on ItalyPowerDemand with 10 training curves per class,
    152 of 169 errors at probability above 0.99). The probabilities
    therefore mix in a share ``eps`` of the prior, ``(1 - eps) softmax(...)
    + eps prior`` (:func:`proba_floor`, Laplace's rule of succession for the
    cross-validated error rate), and ``T`` is fitted for that mixture:
    test log loss 0.53 there, and on the full UCR training sets 0.28
    (GunPoint), 0.13 (ItalyPowerDemand) and 0.28 (BasicMotions), against
    0.47, 0.22 and 0.72 with the temperature alone. ``predict`` stays the
    arg max of :meth:`decision_function`; with the default uniform prior
    it is also the arg max of the probabilities (unless ``eps = 1``, where
    they are all the prior). With missing training points the rank is
    chosen on the imputed curves, but the temperatures and ``eps`` are
    fitted on held-out curves whose missing points count as zero residuals
    under every class: an imputed held-out curve carries its own class's
    law into its scores, and the cross-validated error came out too low
    (0 of 30 curves wrong with half the points missing, against a test
    error of 0.22-0.32).

    A missing point of a training curve (NaN) is left out of the
    regressor's rows and, for the within-class law, takes its conditional
    mean under the class's PPCA law given the curve's observed points
    (:func:`impute_ppca`); counting it as a zero residual, as before,
    shrank the fitted variation (GunPoint with 3 % of the training points
    missing: 0.76 test accuracy then, 0.913 now, 0.92 without missing
    points).

    References
    ----------
    H. Yan, "Personalized Federated Hierarchical Gaussian Processes for
    Privacy-Preserving Modeling of Heterogeneous Distributed Systems", arXiv
    preprint arXiv:2609.19337 (2026): section 3.8.1
    (classification by maximum predictive evidence, eq. 31) and section 5.1
    (press tonnage). Tipping, M. E. and Bishop, C. M. (1999),
    "Probabilistic principal component analysis", J. R. Statist. Soc. B
    61(3) (the within-class covariance). Lei, Zhang and Jin (2010), J. Manuf. Sci.
    Eng. 132(5) (the tonnage data).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedgp import MaxEvidenceClassifier, FederatedHierarchicalGPRegressor
    >>> rng = np.random.default_rng(0)
    >>> t = np.linspace(0, 1, 30)
    >>> X = np.vstack([np.sin(6 * t) + 0.1 * rng.standard_normal((20, 30)),
    ...                np.cos(6 * t) + 0.1 * rng.standard_normal((20, 30))])
    >>> y = np.repeat([0, 1], 20)
    >>> reg = FederatedHierarchicalGPRegressor(n_inducing=8, n_inducing_local=4,
    ...                                        n_rounds=2, local_steps=10)
    >>> clf = MaxEvidenceClassifier(reg, grid=t, random_state=0).fit(X, y)
    >>> clf.score(X, y)
    1.0
    """

    def __init__(
        self,
        estimator=None,
        *,
        grid=None,
        n_channels=1,
        channel_mode="concatenate",
        class_prior="uniform",
        curve_variation="ppca",
        ppca_rank="accuracy",
        n_jobs=None,
        random_state=None,
        verbose=0,
    ):
        self.estimator = estimator
        self.curve_variation = curve_variation
        self.ppca_rank = ppca_rank
        self.grid = grid
        self.n_channels = n_channels
        self.channel_mode = channel_mode
        self.class_prior = class_prior
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------
    # validation
    # ------------------------------------------------------------------
    def _check_layout(self, n_features):
        nc = self.n_channels
        if not isinstance(nc, numbers.Integral) or isinstance(nc, bool) or nc < 1:
            raise ValueError(f"n_channels must be an integer >= 1, got {nc!r}")
        if self.curve_variation not in _VARIATIONS:
            raise ValueError(
                f"curve_variation must be one of {_VARIATIONS}, got {self.curve_variation!r}"
            )
        if self.channel_mode not in _CHANNEL_MODES:
            raise ValueError(
                f"channel_mode must be one of {_CHANNEL_MODES}, got {self.channel_mode!r}"
            )
        r = self.ppca_rank
        if not (r in ("accuracy", "likelihood") if isinstance(r, str) else (
                isinstance(r, numbers.Integral) and not isinstance(r, bool) and r >= 0)):
            raise ValueError(
                f"ppca_rank must be 'accuracy', 'likelihood' or an integer >= 0, got {r!r}")
        if n_features % nc:
            raise ValueError(
                f"X has {n_features} columns, not a multiple of n_channels={nc}: "
                "each row must hold n_channels curves of equal length side by side"
            )
        n_points = n_features // nc
        if n_points < 2:
            raise ValueError(
                f"each channel needs at least 2 points; X has {n_features} feature(s) "
                f"for n_channels={nc}, i.e. {n_points} point(s) per channel"
            )
        if self.grid is None:
            grid = np.arange(n_points, dtype=np.float64)
        else:
            grid = float_param(self.grid, "grid")
            if grid.ndim != 1 or grid.shape[0] != n_points:
                raise ValueError(
                    f"grid must be 1-D with one entry per point of a channel "
                    f"({n_points}), got shape {grid.shape}; curves of the wrong length?"
                )
            if not np.all(np.isfinite(grid)):
                raise ValueError("grid must be finite")
            if np.unique(grid).size < 2:
                raise ValueError(
                    f"grid must hold at least 2 distinct values (the input locations of a "
                    f"curve's points), got all points at {float(grid[0]):g}; pass None for "
                    "arange(n_points)")
        return int(nc), n_points, grid

    @staticmethod
    def _grid_step(grid):
        """Median spacing of the distinct grid values (1.0 for ``arange``)."""
        return float(np.median(np.diff(np.unique(grid))))

    def _check_prior(self, counts, classes):
        prior = self.class_prior
        k = counts.shape[0]
        forms = ("'uniform', 'empirical', an array of one weight per class (order of "
                 "classes_) or a dict {class label: weight}")
        if isinstance(prior, str):
            if prior == "uniform":
                return np.full(k, -np.log(k))
            if prior == "empirical":
                return np.log(counts / counts.sum())
            raise ValueError(f"class_prior must be {forms}, got {prior!r}")
        if isinstance(prior, Mapping):
            labels = classes.tolist()
            unknown = [c for c in prior if c not in labels]
            missing = [c for c in labels if c not in prior]
            if unknown or missing:
                raise ValueError(
                    f"class_prior as a dict must have exactly one key per class {labels}; "
                    + (f"unknown class(es) {unknown}" if unknown else "")
                    + ("; " if unknown and missing else "")
                    + (f"missing class(es) {missing}" if missing else ""))
            prior = [prior[c] for c in labels]
        try:
            p = np.asarray(prior, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"class_prior must be {forms}, got {prior!r}") from None
        if p.shape != (k,) or not np.all(np.isfinite(p)) or np.any(p <= 0):
            raise ValueError(
                f"class_prior must hold {k} positive finite values (one per class), got {prior!r}"
            )
        # normalised in the log domain: weights whose sum overflows (1e308 each)
        # give the same prior as any other weights in the same proportions
        logp = np.log(p)
        return logp - logsumexp(logp)

    def _make_regressor(self, step=1.0):
        if self.estimator is not None and not isinstance(self.estimator,
                                                         FederatedHierarchicalGPRegressor):
            raise TypeError(
                "estimator must be a FederatedHierarchicalGPRegressor or None, got "
                f"{type(self.estimator).__name__}")
        if self.estimator is not None and self.estimator.client_column is not None:
            # the classifier builds the regressor's inputs (the grid) and
            # labels (the classes) itself
            raise ValueError(
                f"estimator has client_column={self.estimator.client_column!r}; the "
                "classifier passes each class as the regressor's client itself: use an "
                "estimator with client_column=None")
        reg = (default_curve_regressor(step) if self.estimator is None
               else clone(self.estimator))
        params = reg.get_params(deep=False)
        upd = {}
        if self.random_state is not None and "random_state" in params:
            upd["random_state"] = self.random_state
        if check_n_jobs(self.n_jobs) is not None and "n_jobs" in params:
            upd["n_jobs"] = self.n_jobs
        if self.verbose and self.verbose > 0 and "verbose" in params:
            upd["verbose"] = self.verbose
        return reg.set_params(**upd)

    # ------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------
    @keep_state_on_error
    def fit(self, X, y):
        """Fit one regressor whose clients are the classes.

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)
            Training curves on the shared grid, channels side by side. NaN
            marks a missing point (left out); inf is an error.
        y : array-like of shape (n_curves,)
            Class labels (at least two classes).

        Returns
        -------
        self : MaxEvidenceClassifier

        Raises
        ------
        ValueError
            Fewer than two classes, continuous (non-class) ``y``, class
            labels that mix text and numbers (``1`` and ``'1'``) or are
            missing (None), curves of unequal length (a list of rows),
            inconsistent lengths of ``X`` and ``y``, ``X`` not 2-D, a
            column count that is not ``n_channels`` times the grid length,
            fewer than 2 points per channel, an all-NaN curve, a class with
            fewer than 2 observed points, inf values, bad parameters (e.g. a
            ``grid`` with fewer than 2 distinct values, a ``class_prior``
            dict whose keys are not the classes), an ``estimator`` with a
            ``client_column``, NaN points or a regressor without multi-output
            support with ``channel_mode="multioutput"``, a class whose client
            the regressor excluded after failed calls, curves whose values
            are too small (below about 1e-146) or too large for float64 to
            standardise (``"the curves X are too small to standardise ...
            rescale the curves X"``), or as the regressor's ``fit``.
        TypeError
            If ``estimator`` is not a
            :class:`~skfedgp.FederatedHierarchicalGPRegressor` (or None), or
            ``X`` is sparse.
        skfedgp.CholeskyError
            As the regressor's ``fit``: a ``K_zz`` that cannot be
            factorised even with jitter.
        FloatingPointError
            As the regressor's ``fit``: a non-finite ELBO or gradient.

        Notes
        -----
        On any error the classifier keeps its previous fitted state (or
        stays unfitted).
        """
        X, y = unmask(X, "X", missing_ok=True), unmask(y, "y")  # a masked point is missing
        _check_curve_lengths(X)
        _check_label_kinds(y)
        X, y = validate_data(self, X, y, ensure_all_finite="allow-nan", dtype=np.float64)
        check_classification_targets(y)
        classes, y_idx = np.unique(y, return_inverse=True)
        nc, n_points, grid = self._check_layout(X.shape[1])
        if classes.shape[0] < 2:
            raise ValueError(
                f"MaxEvidenceClassifier needs at least 2 classes; only one class "
                f"({classes[0]!r}) is present in y"
            )
        observed = ~np.isnan(X)
        empty = np.flatnonzero(~observed.any(axis=1))
        if empty.size:
            raise ValueError(f"curve(s) {empty[:5].tolist()} have no observed (non-NaN) point")
        counts = np.bincount(y_idx, minlength=classes.shape[0]).astype(np.float64)
        log_prior = self._check_prior(counts, classes)
        n_obs = np.bincount(y_idx, weights=observed.sum(axis=1), minlength=classes.shape[0])
        if np.any(n_obs < 2):
            bad = classes[np.flatnonzero(n_obs < 2)[0]]
            raise ValueError(f"class {bad!r} has fewer than 2 observed points in total")
        step = self._grid_step(grid)
        # the default lengthscales are in grid steps (the grid's own units)
        reg = self._make_regressor(step)
        # one channel: both modes are the scalar model of that channel
        mode = "concatenate" if nc == 1 else self.channel_mode
        # concatenated channels share one kernel and one noise variance: each
        # is centred and scaled by its own training mean and standard
        # deviation first, so the channels' units do not change the model
        # (the multi-output regressor standardises each output itself)
        self.channel_offset_, self.channel_scale_ = (
            _channel_standardisation(X, nc, n_points) if mode == "concatenate" and nc > 1
            else (np.zeros(nc), np.ones(nc)))
        X = self._standardise(X)

        if mode == "multioutput":
            if self.estimator is None:
                # multi-output signal variances live in the loadings: the scalar
                # defaults of default_curve_regressor do not apply
                reg.set_params(variance=None, local_variance=None)
            if not hasattr(reg, "predict_joint"):
                raise ValueError(
                    "channel_mode='multioutput' needs a multi-output (ILMM) regressor with "
                    f"predict_joint (the joint covariance of a whole curve); "
                    f"{type(reg).__name__} has none: use channel_mode='concatenate'")
            if np.any(~observed):
                raise ValueError("channel_mode='multioutput' does not accept NaN points yet")
            n = X.shape[0]
            Y = X.reshape(n, nc, n_points).transpose(0, 2, 1).reshape(n * n_points, nc)
            fit_args = (np.tile(grid, n)[:, None], Y, np.repeat(y_idx, n_points))
            inputs_ = grid.copy()
        else:
            span = float(grid.max() - grid.min())
            diffs = np.diff(np.sort(grid))
            step = float(np.median(diffs)) if diffs.size else 1.0
            step = step if step > 0 else 1.0
            inputs = np.concatenate([k * (span + step) + grid for k in range(nc)])
            rows, cols = np.nonzero(observed)
            fit_args = (inputs[cols][:, None], X[rows, cols], y_idx[rows])
            inputs_ = inputs
        # identical training curves of a class are legitimate here (the
        # within-class law handles them), not copies of a table
        reg._check_copied_rows = False
        with default_sizes_quiet(self.estimator is None), warnings.catch_warnings():
            # classes with no mean function in common are no fault here
            warnings.simplefilter("ignore", SharedPartsOffWarning)
            if self.estimator is None:
                # the default regressor's round cap is by design (default_curve_regressor):
                # "increase n_rounds" is no advice a user of the default can act on
                warnings.filterwarnings("ignore", message=r"training stopped after n_rounds=",
                                        category=ConvergenceWarning)
            try:
                reg.fit(fit_args[0], fit_args[1], groups=fit_args[2])
            except TargetScaleError as exc:  # the regressor's targets are the curves' values
                raise ValueError(exc.message(
                    "the curves X are", "X", "the curves' values",
                    "rescale the curves X (e.g. by a power of ten), not the class labels y"),
                ) from exc
            except ValueError as exc:
                if "initial lengthscale" not in str(exc):
                    raise
                raise ValueError(
                    f"{exc}. The estimator's lengthscales are in the units of grid "
                    f"(median spacing {step:g}, span {float(np.ptp(grid)):g}): set them "
                    "to a fraction of the span in those units") from exc
        lost = [classes[k].item() if hasattr(classes[k], "item") else classes[k]
                for k in range(classes.shape[0]) if k not in reg.clients_]
        if lost:  # its client's calls failed: it would be scored with the population's law
            raise ValueError(
                f"class(es) {list(lost[:5])} have no fitted model: the regressor excluded "
                "their clients after their calls failed (fault_hook or transport "
                "failures); the classifier needs a model of every class")
        self.inputs_ = inputs_
        self.channel_mode_ = mode
        self.estimator_ = reg
        self.classes_ = classes
        self.class_log_prior_ = log_prior
        self.grid_ = grid
        self.n_points_ = n_points
        if self.curve_variation == "ppca":
            self._fit_within_class(X, y_idx, log_prior)
        else:
            self.curve_variation_ = None
            self.decision_temperature_ = self.proba_temperature_ = 1.0
            self.proba_floor_ = 0.0
        return self

    def _fit_within_class(self, X, y_idx, log_prior):
        """The within-class laws (``curve_variation="ppca"``), their rank and
        the temperatures, from the standardised training curves ``X``; the
        regressor ``estimator_`` is fitted already."""
        classes = self.classes_
        with single_threaded_blas():
            K = classes.shape[0]
            means = [self._class_mean_and_cov(k, with_cov=False)[0] for k in range(K)]
            raw = [X[y_idx == k] - means[k] for k in range(K)]  # NaN: missing
            # about the regressor's mean: the yardstick of "the curves vary"
            raw_scales = [self._residual_scale(R) for R in raw]
            # the channel scale D: the RMS of the residuals about the class's
            # own mean (with at least 3 curves, the mean the law uses, mu_c +
            # D m_c), so the regressor's error in mu_c, which m_c corrects,
            # does not count as curve-to-curve spread a second time
            scales = [self._residual_scale(R - _column_mean(R)) if R.shape[0] >= 3 else sc
                      for R, sc in zip(raw, raw_scales)]
            # a missing training point takes its conditional mean under
            # the class's within-class law (a zero residual, the class
            # mean, would shrink the fitted variation)
            resid = [impute_ppca(R / sc) * sc if np.isnan(R).any() else R
                     for R, sc in zip(raw, scales)]
            X_held = X  # held out in the cross-validation: missing points unfilled
            missing = bool(np.isnan(X).any())
            if missing:
                X = X.copy()  # the training folds: missing points filled
                for k in range(K):
                    X[y_idx == k] = means[k] + resid[k]
            rank = self.ppca_rank
            held = None
            if rank == "accuracy":
                # one cross-validation: the rank, and the held-out
                # log-likelihoods at it for the temperature below
                rank, held, own = _select_rank_by_accuracy(X, y_idx, means, scales,
                                                           log_prior)
            self.curve_variation_ = [
                self._fit_variation(R, sc, rank, rsc)
                for R, sc, rsc in zip(resid, scales, raw_scales)]
            for k, V in enumerate(self.curve_variation_):
                # points no training curve of the class observed
                V["observed"] = ~np.all(np.isnan(raw[k]), axis=0)
            # the probabilities' temperature from held-out log-likelihoods
            # at the fitted ranks (for "accuracy", the rank selection's own
            # cross-validation: its caps give the same per-class ranks),
            # each curve weighted by prior / training frequency of its class
            if self.ppca_rank != "accuracy" or missing:
                held, own = _cv_scores(X, y_idx, means, scales, np.zeros(K),
                                       [[V["rank"] for V in self.curve_variation_]],
                                       X_held=X_held)
                held = None if held is None else held[0]
            if held is None:
                # no class has the 3 curves a held-out fold needs: nothing
                # shows the assignments beat chance, so the probabilities
                # are the prior (proba_floor's rule with no held-out curve:
                # eps = 1); the scores and predict are the model's
                self.decision_temperature_ = self.proba_temperature_ = 1.0
                self.proba_floor_ = proba_floor(np.zeros((0, K)), np.zeros(0, dtype=int))
                warnings.warn(
                    "every class has fewer than 3 training curves, too few to cross-validate "
                    "the class probabilities: predict_proba returns the class prior "
                    "(predict and decision_function still use the curves' log-evidence); "
                    "fit at least 3 curves of some class to calibrate them", UserWarning,
                    stacklevel=user_stacklevel())
            else:
                freq = np.bincount(y_idx, minlength=K) / y_idx.size
                weight = np.exp(log_prior)[own] / freq[own]
                # the scores: temperature alone (classes that cannot be
                # told apart are decided by the prior); the probabilities:
                # the prior's share eps and a temperature fitted with it
                self.decision_temperature_ = proba_temperature(held, own, log_prior, weight)
                self.proba_floor_ = proba_floor(held, own, log_prior, weight)
                self.proba_temperature_ = proba_temperature(held, own, log_prior, weight,
                                                            floor=self.proba_floor_)

    def _residual_scale(self, R):
        """Per column: the root mean square of the class's residuals ``R`` in its channel."""
        n, n_points = R.shape[0], self.n_points_
        R = R.reshape(n, self.n_channels, n_points)
        seen = ~np.isnan(R)  # missing points left out
        ss = np.sum(np.where(seen, R, 0.0) ** 2, axis=(0, 2))
        count = np.sum(seen, axis=(0, 2))
        rms = np.sqrt(ss / np.maximum(count, 1))
        rms = np.where(rms > 0, rms, 1.0)
        return np.repeat(rms, n_points)

    def _fit_variation(self, R, scale, rank, spread_scale=None):
        """Within-class law of one class from its residual curves.

        Residuals ``R`` (rows ``x_n - mu_k``, ``mu_k`` the regressor's
        predictive mean of the class, missing points imputed by
        :func:`impute_ppca`), scaled per
        channel by ``scale`` (the channel RMS ``D`` of the residuals about
        their own mean, with at least 3 curves); with at least 3 curves their
        mean ``m`` is estimated and taken off (standard PPCA), then
        :func:`ppca_fit` with rank ``rank`` (``"likelihood"``: chosen by
        :func:`select_ppca_rank`), capped by what the curves support.
        ``"spread"`` is the mean square of the centred residuals scaled by
        ``spread_scale`` (the channel RMS about ``mu_k``; None: ``scale``),
        which is at most :data:`MIN_WITHIN_VARIANCE` when the curves do not
        vary.
        """
        n = R.shape[0]
        Rs = R / scale
        center = n >= 3
        m = Rs.mean(axis=0) if center else np.zeros(Rs.shape[1])
        if rank == "likelihood":
            rank = select_ppca_rank(Rs, center=center)
        else:
            rank = int(min(rank, max(0, min(n - 2, Rs.shape[1] - 1)))) if center else 0
        Rc = Rs - m
        W, s2 = ppca_fit(Rc, rank)
        s2 = max(s2, MIN_WITHIN_VARIANCE)  # identical curves: no zero-variance law
        # how much the curves vary about their own mean (two identical curves
        # too, whose law is not centred), relative to their residuals about
        # mu_k (scaled by ``scale`` itself, identical curves would give 0 / 0)
        Rsp = Rs if spread_scale is None else R / spread_scale
        spread = (float(np.mean((Rsp - Rsp.mean(axis=0)) ** 2)) if n >= 2
                  else float(np.mean(Rsp**2)))
        # a new curve: within-class spread plus the uncertainty of m (1 / n)
        inflate = 1.0 + 1.0 / n if center else 1.0
        return {"scale": scale, "mean": m, "W": W * np.sqrt(inflate),
                "noise_variance": s2 * inflate, "rank": rank, "n_curves": n,
                "spread": spread}

    # ------------------------------------------------------------------
    # scoring
    # ------------------------------------------------------------------
    def _class_predictive(self, k):
        """Predictive mean and covariance of a new whole curve of class ``k``."""
        var = getattr(self, "curve_variation_", None)
        if (var is not None and var[k]["n_curves"] >= 3
                and var[k]["spread"] > MIN_WITHIN_VARIANCE):
            # the class mean is mu_k + D m: its uncertainty is the 1/n part of
            # the within-class law (already in W and s2), not the regressor's
            # posterior covariance of mu_k, which m corrects
            V = var[k]
            unseen = ~V.get("observed", np.ones(V["mean"].shape[0], dtype=bool))
            mean, reg_cov = self._class_mean_and_cov(k, with_cov=bool(np.any(unseen)))
            mean = mean + V["scale"] * V["mean"]
            SW = V["scale"][:, None] * V["W"]
            cov = SW @ SW.T
            cov[np.diag_indices_from(cov)] += V["noise_variance"] * V["scale"] ** 2
            if np.any(unseen):
                # points no training curve of the class observed: the residual
                # law knows nothing there (their residuals were zeros), so they
                # keep the regressor's predictive law (its mean's uncertainty
                # included), uncorrelated with the observed points
                cov[unseen, :] = 0.0
                cov[:, unseen] = 0.0
                cov[np.ix_(unseen, unseen)] = reg_cov[np.ix_(unseen, unseen)]
            return mean, cov
        mean, cov = self._class_mean_and_cov(k)
        if var is None:
            return mean, cov
        # regressor: latent class function + white noise; replace the white
        # noise by the fitted within-class law of a new curve, unless the
        # class's curves do not vary: they say nothing about the spread of a
        # new one, so the regressor's noise stays (the residual scale of a
        # class fitted exactly is itself about 0 and cannot set a floor)
        V = var[k]
        if V["spread"] > MIN_WITHIN_VARIANCE:
            cov[np.diag_indices_from(cov)] -= self._regressor_noise(k)
        mean = mean + V["scale"] * V["mean"]
        SW = V["scale"][:, None] * V["W"]
        cov += SW @ SW.T
        cov[np.diag_indices_from(cov)] += V["noise_variance"] * V["scale"] ** 2
        return mean, cov

    def _regressor_noise(self, k):
        """Noise variance of the regressor's client ``k`` (target units)."""
        reg = self.estimator_
        B = reg.clients_[k].local_values()  # client k is class classes_[k]
        if self.channel_mode_ == "multioutput":  # per channel, channel-major like X
            s2 = np.broadcast_to(B["noise_variance"], (self.n_channels,))
            return np.repeat(s2 * np.asarray(reg.y_scale_) ** 2, self.n_points_)
        return float(B["noise_variance"]) * float(reg.y_scale_) ** 2

    def _class_mean_and_cov(self, k, with_cov=True):
        """The regressor's predictive mean (and noisy covariance) on the curve grid."""
        inputs = self.inputs_
        p = inputs.shape[0]
        if not with_cov:
            mean = self.estimator_.predict(inputs[:, None], [k] * p)
            if self.channel_mode_ == "multioutput":
                mean = np.asarray(mean).T.ravel()  # channel-major, the column order of X
            return mean, None
        if self.channel_mode_ == "multioutput":
            mean, cov = self.estimator_.predict_joint(inputs[:, None], [k] * p)
        else:
            mean, cov = self.estimator_.predict(inputs[:, None], [k] * p, return_cov=True)
        if self.channel_mode_ == "multioutput":
            mean = np.asarray(mean)
            nc = self.n_channels
            if mean.shape != (p, nc) or cov.shape != (p * nc, p * nc):
                raise ValueError(
                    "channel_mode='multioutput' expects predict(..., return_cov=True) to "
                    f"return a ({p}, {nc}) mean and a ({p * nc}, {p * nc}) covariance in "
                    f"point-major order, got {mean.shape} and {cov.shape}"
                )
            # point-major (p, nc) -> channel-major, the column order of X
            order = np.arange(p * nc).reshape(p, nc).T.ravel()
            mean = mean.T.ravel()
            cov = cov[np.ix_(order, order)]
        return mean, cov

    def _score_class(self, k, X, patterns, inv):
        mean, cov = self._class_predictive(k)
        out = np.empty(X.shape[0])
        label = self.classes_[k]
        for j, obs in enumerate(patterns):
            idx = np.flatnonzero(inv == j)
            if obs.all():
                out[idx] = _gaussian_loglik(mean, cov, X[idx], f"class {label!r}")
            else:
                o = np.flatnonzero(obs)
                out[idx] = _gaussian_loglik(
                    mean[o], cov[np.ix_(o, o)], X[np.ix_(idx, o)],
                    f"class {label!r} (observed points of a curve with NaN)",
                )
        return out

    def log_evidence(self, X):
        """Predictive log-likelihood of every curve under every class (eq. 31).

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)
            Curves on the training grid; NaN points are left out of the
            curve's score.

        Returns
        -------
        log_evidence : ndarray of shape (n_curves, n_classes)
            ``log N(y*_obs; mu_c, Sigma_c)`` in nats (target units of ``X``),
            without the class prior.

        Raises
        ------
        ValueError
            Wrong number of columns, curves of unequal length (a list of
            rows), ``X`` not 2-D or not numeric, inf values or an all-NaN
            curve.
        TypeError
            If ``X`` is sparse.
        skfedgp.CholeskyError
            If a predictive covariance cannot be factorised.
        FloatingPointError
            If a log-evidence is not finite.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        check_is_fitted(self, "estimator_")
        X = unmask(X, "X", missing_ok=True)  # a masked point is missing
        _check_curve_lengths(X)
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan",
                          dtype=np.float64)
        observed = ~np.isnan(X)
        empty = np.flatnonzero(~observed.any(axis=1))
        if empty.size:
            raise ValueError(f"curve(s) {empty[:5].tolist()} have no observed (non-NaN) point")
        patterns, inv = np.unique(observed, axis=0, return_inverse=True)
        inv = np.asarray(inv).ravel()
        n_classes = self.classes_.shape[0]
        X = self._standardise(X)
        if check_n_jobs(self.n_jobs) in (None, 1):  # set_params after fit: checked again
            cols = [self._score_class(k, X, patterns, inv) for k in range(n_classes)]
        else:
            def _one(k):
                with single_threaded_blas():
                    return self._score_class(k, X, patterns, inv)

            with warning_filters_kept():  # scikit-learn's validation in the threads
                cols = Parallel(n_jobs=self.n_jobs, prefer="threads")(
                    delayed(_one)(k) for k in range(n_classes)
                )
        ll = np.column_stack(cols)
        # densities of the curves in the units of X: the Jacobian of the
        # channel standardisation, the same for every class
        ll = ll - observed @ np.log(self._column_scale())[:, None]
        if not np.all(np.isfinite(ll)):
            raise FloatingPointError("log-evidence produced non-finite values")
        return ll

    def _column_scale(self):
        """``channel_scale_`` repeated over each channel's points (ones for a
        model pickled before the channels were standardised)."""
        sc = getattr(self, "channel_scale_", None)
        if sc is None:
            return np.ones(self.n_features_in_)
        return np.repeat(sc, self.n_points_)

    def _standardise(self, X):
        """``X`` with every channel centred and scaled as in ``fit``."""
        off = getattr(self, "channel_offset_", None)
        if off is None:
            return X
        n_points = X.shape[1] // off.shape[0]
        return (X - np.repeat(off, n_points)) / np.repeat(self.channel_scale_, n_points)

    def _joint(self, X, proba=False):
        """``log_evidence / T + log prior``: ``T = decision_temperature_``, or
        ``proba_temperature_`` with ``proba``."""
        ll = self.log_evidence(X)  # checks the fitted state first
        # a model pickled before the temperatures were kept: T = 1; before
        # the two were told apart: the one temperature
        T = getattr(self, "proba_temperature_", 1.0)
        if not proba:
            T = getattr(self, "decision_temperature_", T)
        return ll / T + self.class_log_prior_

    def decision_function(self, X):
        """Class scores: log-evidence over the temperature, plus log prior.

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)

        Returns
        -------
        scores : ndarray of shape (n_curves, n_classes) or (n_curves,)
            ``log_evidence(X) / decision_temperature_ + class_log_prior_`` (with
            ``T = 1``, eq. 31 plus the log prior; with a uniform prior the
            arg max is the same for any ``T``); with two classes, the
            difference ``score(classes_[1]) - score(classes_[0])`` (the
            scikit-learn convention: positive means ``classes_[1]``).

        Raises
        ------
        ValueError
            As :meth:`log_evidence`: wrong number of columns, ``X`` not 2-D
            or not numeric, inf values or an all-NaN curve.
        TypeError
            If ``X`` is sparse.
        skfedgp.CholeskyError
            If a predictive covariance cannot be factorised.
        FloatingPointError
            If a log-evidence is not finite.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        j = self._joint(X)
        if j.shape[1] == 2:
            return j[:, 1] - j[:, 0]
        return j

    def predict_proba(self, X):
        """Class probabilities: ``(1 - eps) softmax(log_evidence / T + log prior) + eps prior``.

        ``T = proba_temperature_`` (:func:`proba_temperature`, at least 1)
        and ``eps = proba_floor_`` (:func:`proba_floor`) calibrate the
        log-evidence on held-out training curves; with the default uniform
        prior the arg max is that of :meth:`predict` (with ``eps = 1``, a
        classifier no better than chance on its held-out curves, every
        probability is the prior).

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)

        Returns
        -------
        proba : ndarray of shape (n_curves, n_classes)

        Raises
        ------
        ValueError
            As :meth:`log_evidence`: wrong number of columns, ``X`` not 2-D
            or not numeric, inf values or an all-NaN curve.
        TypeError
            If ``X`` is sparse.
        skfedgp.CholeskyError
            If a predictive covariance cannot be factorised.
        FloatingPointError
            If a log-evidence is not finite.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        return np.exp(self._log_proba(X))

    def predict_log_proba(self, X):
        """Log of :meth:`predict_proba` (computed stably).

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)

        Returns
        -------
        log_proba : ndarray of shape (n_curves, n_classes)

        Raises
        ------
        ValueError
            As :meth:`log_evidence`: wrong number of columns, ``X`` not 2-D
            or not numeric, inf values or an all-NaN curve.
        TypeError
            If ``X`` is sparse.
        skfedgp.CholeskyError
            If a predictive covariance cannot be factorised.
        FloatingPointError
            If a log-evidence is not finite.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        return self._log_proba(X)

    def _log_proba(self, X):
        """``log((1 - eps) softmax(log_evidence / T + log prior) + eps prior)``."""
        j = self._joint(X, proba=True)  # checks the fitted state first
        logp = j - logsumexp(j, axis=1, keepdims=True)
        # eps = 0: a model pickled before the floor was kept
        return _mix_prior(logp, self.class_log_prior_, getattr(self, "proba_floor_", 0.0))

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict` (scikit-learn's).

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)
            A masked point counts as NaN (missing), as in :meth:`predict`.
        y : array-like of shape (n_curves,)
        sample_weight : array-like of shape (n_curves,), default=None

        Returns
        -------
        score : float

        Raises
        ------
        ValueError
            As :meth:`predict`, or for a masked entry in ``y`` or
            ``sample_weight`` (NumPy would read the value under the mask).
        """
        return super().score(X, unmask(y, "y"),
                             sample_weight=unmask(sample_weight, "sample_weight"))

    def predict(self, X):
        """Class with the largest score (:meth:`decision_function`).

        With a uniform prior (the default): the largest log-evidence
        (pFedHGP paper, eq. 31), for any ``T``, and the arg max of
        :meth:`predict_proba`. Otherwise the largest
        ``log_evidence / decision_temperature_ + log prior``
        (:meth:`predict_proba`, with its own temperature and the share
        ``eps`` of the prior, can then have another arg max for a curve the
        scores hardly separate).

        Parameters
        ----------
        X : array-like of shape (n_curves, n_channels * n_points)

        Returns
        -------
        y_pred : ndarray of shape (n_curves,)

        Raises
        ------
        ValueError
            As :meth:`log_evidence`: wrong number of columns, ``X`` not 2-D
            or not numeric, inf values or an all-NaN curve.
        TypeError
            If ``X`` is sparse.
        skfedgp.CholeskyError
            If a predictive covariance cannot be factorised.
        FloatingPointError
            If a log-evidence is not finite.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        joint = self._joint(X)  # checks the fitted state first
        return self.classes_[np.argmax(joint, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags
