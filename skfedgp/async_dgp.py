"""Distributed exact-GP experts with asynchronous aggregation (Async DGP).

``AsyncDGPRegressor`` splits the data among ``n_experts`` exact GP experts
with a shared squared-exponential ARD kernel and combines their predictions
with one of six rules: the asynchronous information-set rule of Yang, Dai
and Hirche ("async"), and the baselines MoE, PoE, gPoE, BCM and rBCM
(Deisenroth & Ng 2015; Liu et al. 2018).  docs/async_dgp.md.

Sources
-------
* Z. Yang, X. Dai, S. Hirche, "Asynchronous Distributed Gaussian Process
  Regression for Online Learning and Dynamical Systems", AAAI 2025 (arXiv
  2412.11950): information set (eq. 10), aggregation (eqs. 11-15),
  Lemma 1 (beta), Lemma 3 (Lipschitz constant of the SE kernel), Algorithm 1.
* M. P. Deisenroth, J. W. Ng, "Distributed Gaussian Processes", ICML 2015:
  PoE, gPoE, BCM, rBCM (section 3, eqs. 5-9 and 18-20).
* H. Liu, J. Cai, Y. Wang, Y.-S. Ong, "Generalized Robust Bayesian Committee
  Machine for Large-scale Gaussian Process Regression", ICML 2018: the
  same PoE/gPoE/BCM/rBCM family in one notation (section 3).

Streaming
---------
Each expert keeps its lower Cholesky factor ``L`` of ``K + s2 I`` in a
preallocated buffer.  ``partial_fit`` appends one point with a rank-one
extension (``O(n^2)``) and, once ``max_points_per_expert`` is reached,
first drops the oldest point with a rank-one update of the trailing block
(``O(n^2)``): the factor is never recomputed from scratch.  Both kernels are
compiled with Numba (:func:`chol_append`, :func:`chol_delete_first`).
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings

import numpy as np
from joblib import Parallel, delayed
from numba import njit
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.optimize import minimize
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from ._validation import (check_bool, check_count, check_n_jobs, check_not_strings,
                          check_real, float_param, keep_state_on_error, unmask,
                          user_stacklevel)
from .kernels import se_ard
from .regressor import check_target_values

__all__ = [
    "AsyncDGPRegressor",
    "AGGREGATIONS",
    "aggregate",
    "InformationSet",
    "chol_append",
    "chol_delete_first",
]

#: Aggregation rules understood by :class:`AsyncDGPRegressor`.
AGGREGATIONS = ("async", "moe", "poe", "gpoe", "bcm", "rbcm")

#: Rules that :func:`aggregate` computes (all but "async").
_BASELINES = tuple(r for r in AGGREGATIONS if r != "async")

#: Conventions of the "async" rule (docs/async_dgp.md).
CONVENTIONS = ("paper", "gpgym")

#: Bounds of the log variances (standardised targets) and, shifted by the log
#: of sqrt(d) times each input's spread, of the log lengthscales (about 1e-5 .. 1e5).
_LOG_BOUNDS = (-11.5, 11.5)


def _reference_lengthscale(X):
    """``sqrt(d)`` times each input's standard deviation (1 where it is 0 or
    ``X`` has one row): the default starting lengthscales, and the centre of
    the lengthscales' bounds.

    With ``sqrt(d) * std`` the expected squared scaled distance between two
    points is about 2 whatever ``d`` (with ``std`` alone it grows like
    ``2 d``, and in 32 dimensions every kernel entry starts at about
    ``exp(-32)``: a flat, white-noise start the optimiser cannot leave).
    """
    d = X.shape[1]
    if X.shape[0] > 1:
        with np.errstate(over="ignore", invalid="ignore"):
            s = X.std(axis=0)
        if not np.all(np.isfinite(s)):
            # inputs of magnitude 1e160 or more are finite, their squares
            # are not: the spread of X / m, times m
            m = np.max(np.abs(X), axis=0)
            m = np.where(m > 0, m, 1.0)
            s = (X / m).std(axis=0) * m
    else:
        s = np.ones(d)
    return np.sqrt(d) * np.where(s > 0, s, 1.0)


# ---------------------------------------------------------------------------
# Numba incremental Cholesky
# ---------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _chol_append(L, Xb, n, x, inv_ell, sf2, sn2, work):  # pragma: no cover - compiled
    """Compiled kernel of :func:`chol_append` (no bounds checks: call that)."""
    d = x.shape[0]
    for i in range(n):
        s = 0.0
        for j in range(d):
            t = (Xb[i, j] - x[j]) * inv_ell[j]
            s += t * t
        work[i] = sf2 * math.exp(-0.5 * s)
    sq = 0.0
    for i in range(n):
        s = work[i]
        for j in range(i):
            s -= L[i, j] * work[j]
        v = s / L[i, i]
        work[i] = v
        sq += v * v
    r = sf2 + sn2 - sq
    for j in range(d):
        Xb[n, j] = x[j]
    if not (r > 0.0):
        return False
    for j in range(n):
        L[n, j] = work[j]
    L[n, n] = math.sqrt(r)
    for j in range(n + 1, L.shape[1]):
        L[n, j] = 0.0
    return True


@njit(nogil=True, cache=True)
def _chol_delete_first(L, Xb, yb, n, work):  # pragma: no cover - compiled
    """Compiled kernel of :func:`chol_delete_first` (no bounds checks: call that)."""
    m = n - 1
    for i in range(m):
        work[i] = L[i + 1, 0]
    for k in range(m):
        lkk = L[k + 1, k + 1]
        r = math.sqrt(lkk * lkk + work[k] * work[k])
        c = r / lkk
        s = work[k] / lkk
        L[k + 1, k + 1] = r
        for i in range(k + 1, m):
            lik = (L[i + 1, k + 1] + s * work[i]) / c
            L[i + 1, k + 1] = lik
            work[i] = c * work[i] - s * lik
    for i in range(m):
        for j in range(i + 1):
            L[i, j] = L[i + 1, j + 1]
        L[i, i + 1] = 0.0
        for j in range(Xb.shape[1]):
            Xb[i, j] = Xb[i + 1, j]
        yb[i] = yb[i + 1]
    for j in range(L.shape[1]):
        L[m, j] = 0.0


def _shape(a):
    """``a.shape`` (fast, for ndarrays), else ``np.shape(a)``."""
    try:
        return a.shape
    except AttributeError:
        return np.shape(a)


def _check_chol_buffers(L, Xb, work, n, lo, hi, what):
    """Shapes of the buffers and ``lo <= n <= cap + hi``.

    The compiled kernels do not check indices, so this runs first: a bad
    ``n`` or buffer raises here instead of reading or writing outside them.
    Returns ``cap`` and ``d``.
    """
    shape_L, shape_X, shape_w = _shape(L), _shape(Xb), _shape(work)
    if len(shape_L) != 2 or shape_L[0] != shape_L[1]:
        raise ValueError(f"{what}: L must be a square 2-D buffer of shape (cap, cap), "
                         f"got shape {shape_L}")
    cap = shape_L[0]
    if len(shape_X) != 2 or shape_X[0] != cap:
        raise ValueError(f"{what}: Xb must be of shape (cap, d) = ({cap}, d) like L, "
                         f"got shape {shape_X}")
    if shape_w != (cap,):
        raise ValueError(f"{what}: work must be of shape (cap,) = ({cap},), got shape {shape_w}")
    if not (type(n) is int or (isinstance(n, numbers.Integral)
                               and not isinstance(n, (bool, np.bool_)))) or not lo <= n <= cap + hi:
        full = (" (at n = cap the buffers are full: grow them first)"
                if isinstance(n, numbers.Integral) and n == cap else "")
        raise ValueError(f"{what}: n (the number of stored points) must be an integer in "
                         f"[{lo}, {cap + hi}] for buffers of capacity {cap}, got {n!r}{full}")
    return cap, shape_X[1]


def chol_append(L, Xb, n, x, inv_ell, sf2, sn2, work):
    """Extend the Cholesky factor of ``K + sn2 I`` by one point, in place.

    Parameters
    ----------
    L : ndarray of shape (cap, cap)
        Buffer whose leading ``n x n`` block is the lower factor of the first
        ``n`` points; row ``n`` is overwritten.
    Xb : ndarray of shape (cap, d)
        Input buffer; its first ``n`` rows are the stored points.  Row ``n``
        is set to ``x``.
    n : int
        Number of stored points (``0 <= n < cap``).
    x : ndarray of shape (d,)
        New input.
    inv_ell : ndarray of shape (d,)
        Inverse lengthscales.
    sf2, sn2 : float
        Signal and noise variance.
    work : ndarray of shape (cap,)
        Scratch space.

    Returns
    -------
    ok : bool
        False if the new diagonal entry is not positive (the factor is left
        unchanged apart from row ``n``).

    Raises
    ------
    ValueError
        If ``n`` is not an integer in ``[0, cap - 1]`` (the buffer is full
        at ``n = cap``), or the shapes of ``L``, ``Xb``, ``x``, ``inv_ell``
        and ``work`` are not those above; checked before the compiled
        kernel runs, so nothing is read or written outside the buffers and
        nothing is changed.
    ZeroDivisionError
        If a diagonal entry of the stored factor is zero (``L`` is not a
        Cholesky factor).
    numba.core.errors.TypingError
        If an argument has a type the kernel cannot be compiled for (e.g. a
        list instead of an ndarray).

    Notes
    -----
    ``L21 = L11^{-1} k(X, x)``, ``l22 = sqrt(k(x, x) + sn2 - ||L21||^2)``:
    ``O(n d + n^2)`` operations, in a compiled (Numba) kernel; the shape
    and bounds checks above run once per call, outside its loops.
    """
    cap, d = _check_chol_buffers(L, Xb, work, n, 0, -1, "chol_append")
    if _shape(x) != (d,) or _shape(inv_ell) != (d,):
        raise ValueError(f"chol_append: x and inv_ell must be of shape (d,) = ({d},) like the "
                         f"columns of Xb, got shapes {_shape(x)} and {_shape(inv_ell)}")
    return _chol_append(L, Xb, n, x, inv_ell, sf2, sn2, work)


def chol_delete_first(L, Xb, yb, n, work):
    """Drop the first point from a Cholesky factor and the data buffers, in place.

    Parameters
    ----------
    L : ndarray of shape (cap, cap)
        Buffer whose leading ``n x n`` block is the lower factor of
        ``A = K + sn2 I``; on return its leading ``(n-1) x (n-1)`` block is
        the factor of ``A[1:, 1:]``.
    Xb : ndarray of shape (cap, d)
        Input buffer (rows shifted up by one).
    yb : ndarray of shape (cap,)
        Target buffer (shifted up by one).
    n : int
        Number of stored points, ``1 <= n <= cap``.
    work : ndarray of shape (cap,)
        Scratch space.

    Raises
    ------
    ValueError
        If ``n`` is not an integer in ``[1, cap]`` (there is no point to
        drop at ``n = 0``), or the shapes of ``L``, ``Xb``, ``yb`` and
        ``work`` are not those above; checked before the compiled kernel
        runs, so nothing is read or written outside the buffers and nothing
        is changed.
    ZeroDivisionError
        If a diagonal entry of the stored factor is zero (``L`` is not a
        Cholesky factor).
    numba.core.errors.TypingError
        If an argument has a type the kernel cannot be compiled for (e.g. a
        list instead of an ndarray).

    Notes
    -----
    ``A[1:, 1:] = L22 L22^T + l l^T`` with ``l = L[1:, 0]``: a rank-one
    *update* of ``L22`` (Givens-like recurrence; Golub & Van Loan, "Matrix
    Computations", section 6.5.4), ``O(n^2)`` and always stable, in a
    compiled (Numba) kernel; the shape and bounds checks above run once per
    call, outside its loops.
    """
    cap, _ = _check_chol_buffers(L, Xb, work, n, 1, 0, "chol_delete_first")
    if np.shape(yb) != (cap,):
        raise ValueError(f"chol_delete_first: yb must be of shape (cap,) = ({cap},), "
                         f"got shape {np.shape(yb)}")
    _chol_delete_first(L, Xb, yb, n, work)


# ---------------------------------------------------------------------------
# One exact-GP expert
# ---------------------------------------------------------------------------


class _Expert:
    """Exact GP expert with an incrementally maintained Cholesky factor.

    Targets are stored raw; the (constant) prior mean is subtracted when the
    weights ``alpha = (K + s2 I)^{-1} (y - m)`` are formed.
    """

    def __init__(self, d, lengthscale, variance, noise_variance, max_points=None):
        self.d = d
        self.ell = np.asarray(lengthscale, dtype=float)
        self.sf2 = float(variance)
        self.sn2 = float(noise_variance)
        self.max_points = max_points
        cap = max_points if max_points is not None else 16
        self._alloc(cap)
        self.n = 0
        self._alpha = None
        self._alpha_mean = None

    def _alloc(self, cap):
        self.L = np.zeros((cap, cap))
        self.X = np.zeros((cap, self.d))
        self.y = np.zeros(cap)
        self.work = np.zeros(cap)

    def _grow(self, need):
        cap = self.L.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        L, X, y = self.L, self.X, self.y
        self._alloc(new)
        self.L[: self.n, : self.n] = L[: self.n, : self.n]
        self.X[: self.n] = X[: self.n]
        self.y[: self.n] = y[: self.n]

    def snapshot(self, copy_used=False):
        """What :meth:`restore` needs to undo later :meth:`add` calls.

        An append writes only row ``n`` of the buffers (or moves them to
        larger new ones), so the attributes suffice; dropping the oldest
        point (a full window, or :meth:`set_window` with ``copy_used``)
        rewrites the factor in place, so then the used parts of the
        buffers are copied too.
        """
        snap = dict(vars(self))
        if self.max_points is not None or copy_used:
            n = self.n
            snap["_used"] = (self.L[:n, :n].copy(), self.X[:n].copy(), self.y[:n].copy())
        return snap

    def restore(self, snap):
        """Undo every :meth:`add` since :meth:`snapshot` returned ``snap``."""
        snap = dict(snap)
        used = snap.pop("_used", None)
        vars(self).clear()
        vars(self).update(snap)
        if used is not None:
            n = self.n
            self.L[:n, :n], self.X[:n], self.y[:n] = used

    def set_window(self, max_points):
        """Change the window; drops the oldest points down to it (rank-one downdates)."""
        self.max_points = max_points
        if max_points is not None and self.n > max_points:
            while self.n > max_points:
                chol_delete_first(self.L, self.X, self.y, self.n, self.work)
                self.n -= 1
            self._alpha = None

    def set_batch(self, X, y):
        """Factorise from scratch (used by ``fit``)."""
        X = np.ascontiguousarray(X, dtype=float)
        n = X.shape[0]
        if self.max_points is not None and n > self.max_points:
            X, y = X[-self.max_points :], y[-self.max_points :]
            n = self.max_points
        self.n = 0
        self._grow(n)
        if n:
            K = se_ard(X, X, self.ell, self.sf2)
            K.flat[:: n + 1] += self.sn2
            self.L[:n, :n] = cholesky(K, lower=True, check_finite=False)
            self.X[:n] = X
            self.y[:n] = y
        self.n = n
        self._alpha = None

    def add(self, x, y):
        """Append one point (rank-one), dropping the oldest at the window size."""
        if self.max_points is not None and self.n == self.max_points:
            chol_delete_first(self.L, self.X, self.y, self.n, self.work)
            self.n -= 1
        self._grow(self.n + 1)
        ok = chol_append(
            self.L, self.X, self.n, np.ascontiguousarray(x, dtype=float), 1.0 / self.ell,
            self.sf2, self.sn2, self.work,
        )
        if not ok:
            raise np.linalg.LinAlgError(
                "incremental Cholesky update lost positive definiteness; the "
                "noise variance is too small for a duplicated input"
            )
        self.y[self.n] = y
        self.n += 1
        self._alpha = None

    def alpha(self, mean):
        if self._alpha is None or self._alpha_mean != mean:
            n = self.n
            L = self.L[:n, :n]
            a = solve_triangular(L, self.y[:n] - mean, lower=True, check_finite=False)
            self._v = a  # L^{-1} (y - m)
            self._alpha = solve_triangular(L, a, lower=True, trans="T", check_finite=False)
            self._alpha_mean = mean
        return self._alpha

    def predict(self, Xs, mean):
        """Posterior mean and latent variance at ``Xs`` (shape (q, d))."""
        q = Xs.shape[0]
        if self.n == 0:
            return np.full(q, float(mean)), np.full(q, self.sf2)
        n = self.n
        Ks = se_ard(Xs, self.X[:n], self.ell, self.sf2)  # (q, n)
        mu = mean + Ks @ self.alpha(mean)
        V = solve_triangular(self.L[:n, :n], Ks.T, lower=True, check_finite=False)
        var = self.sf2 - np.einsum("ij,ij->j", V, V)
        return mu, np.clip(var, 1e-12 * self.sf2, self.sf2)

    def quad(self, mean):
        """``(y - m)^T (K + s2 I)^{-1} (y - m)`` (0 when empty)."""
        if self.n == 0:
            return 0.0
        self.alpha(mean)
        return float(self._v @ self._v)


# ---------------------------------------------------------------------------
# Hyperparameters: sum of the experts' log marginal likelihoods
# ---------------------------------------------------------------------------


def _expert_nlml(X, y, theta):
    """Negative log marginal likelihood of one expert and its gradient.

    ``theta = [log ell (d), log sf2, log sn2]``.  ``dNLML/dK = (K^{-1} -
    alpha alpha^T) / 2``; ``dK/dlog ell_d = K_f * (x_d - x'_d)^2 / ell_d^2``,
    ``dK/dlog sf2 = K_f``, ``dK/dlog sn2 = sn2 I`` (Rasmussen & Williams 2006,
    "Gaussian Processes for Machine Learning", eq. 5.9).
    """
    n, d = X.shape
    if n == 0:
        return 0.0, np.zeros(d + 2)
    ell = np.exp(theta[:d])
    sf2, sn2 = np.exp(theta[d]), np.exp(theta[d + 1])
    Kf = se_ard(X, X, ell, sf2)
    K = Kf.copy()
    K.flat[:: n + 1] += sn2
    try:
        L = cholesky(K, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return np.inf, np.zeros(d + 2)
    alpha = cho_solve((L, True), y, check_finite=False)
    nlml = 0.5 * y @ alpha + np.log(np.diag(L)).sum() + 0.5 * n * np.log(2 * np.pi)
    W = 0.5 * (cho_solve((L, True), np.eye(n), check_finite=False) - np.outer(alpha, alpha))
    M = W * Kf
    # centred: the expanded square below cancels for inputs far from the
    # origin (distances do not depend on the centre)
    Xs = (X - X.mean(axis=0)) / ell
    rs = M.sum(axis=1)
    g_ell = 2.0 * ((Xs**2).T @ rs) - 2.0 * np.einsum("ij,ij->j", M @ Xs, Xs)
    grad = np.concatenate([g_ell, [M.sum(), sn2 * np.trace(W)]])
    return float(nlml), grad


def _total_nlml(theta, parts, n_jobs):
    res = Parallel(n_jobs=n_jobs, prefer="threads")(
        delayed(_expert_nlml)(X, y, theta) for X, y in parts
    )
    f = sum(r[0] for r in res)
    if not np.isfinite(f):
        return 1e25, np.zeros_like(theta)
    return f, np.sum([r[1] for r in res], axis=0)


# ---------------------------------------------------------------------------
# Aggregation rules at one input
# ---------------------------------------------------------------------------


def aggregate(mu, var, prior_var, rule, prior_mean=0.0):
    """Combine expert predictions made at the same input.

    Parameters
    ----------
    mu : ndarray of shape (q, M)
        Expert posterior means (units of the target), finite; ``M >= 1``.
        Must be 2-D (one query: ``mu[None, :]``).
    var : ndarray of shape (q, M)
        Expert latent posterior variances, ``0 < var <= prior_var`` (excess
        round-off, up to a relative ``1e-6``, is clipped to ``prior_var``).
    prior_var : float
        Prior (signal) variance ``sigma_f^2`` of the shared kernel, finite
        and positive.
    rule : {"moe", "poe", "gpoe", "bcm", "rbcm"}
        Aggregation rule ("async" is :class:`InformationSet`: it needs the
        inputs of the predictions).
    prior_mean : float, default=0.0
        Constant prior mean ``m``; the BCM family subtracts it before
        combining and adds it back (with ``m = 0`` the formulas are those
        of the papers).

    Returns
    -------
    mean, var : ndarray of shape (q,)

    Raises
    ------
    ValueError
        For an unknown ``rule`` (including "async"), ``prior_var`` not
        finite and positive, a non-finite ``prior_mean``, ``mu`` or ``var``
        not 2-D or of different shapes, no expert (``M = 0``), NaN/inf in
        ``mu``, or ``var`` not in ``(0, prior_var]``.

    Notes
    -----
    Every column is an expert that votes: leave out experts that hold no
    data (their prediction is the prior, which carries no information);
    :meth:`AsyncDGPRegressor.predict` does.  With ``s_k^2`` the expert variances and ``s_**^2`` the prior variance:

    * ``"moe"`` (uniform mixture of experts, Tresp 2000): ``mean = (1/M)
      sum mu_k``; variance of the uniform mixture ``(1/M) sum (s_k^2 +
      mu_k^2) - mean^2``.
    * ``"poe"`` (Deisenroth & Ng 2015, eqs. 5-6): ``1/s^2 = sum 1/s_k^2``,
      ``mean = s^2 sum mu_k / s_k^2``.
    * ``"gpoe"`` (Cao & Fleet 2014) with the weights ``beta_k = 1/M`` that
      Deisenroth & Ng (2015, section 3.2) and Liu et al. (2018, section 3)
      recommend, so that the weights sum to one.
    * ``"bcm"`` (Tresp 2000; Deisenroth & Ng 2015, eqs. 7-8): ``1/s^2 =
      sum 1/s_k^2 + (1 - M) / s_**^2``.
    * ``"rbcm"`` (Deisenroth & Ng 2015, eqs. 9, 18-20): ``beta_k = (log
      s_**^2 - log s_k^2) / 2`` (differential-entropy difference between
      prior and posterior), ``1/s^2 = sum beta_k / s_k^2 + (1 - sum beta_k)
      / s_**^2``, ``mean = s^2 sum beta_k mu_k / s_k^2`` (prior mean 0).

    With one expert MoE, PoE, gPoE and BCM return the expert itself; rBCM
    does not unless ``beta_1 = 1``: it widens towards the prior where
    ``beta_1 < 1`` and, where the expert is confident (``beta_1 > 1``), gives
    the prior a negative weight and a band narrower than the expert's.
    """
    if rule not in _BASELINES:
        raise ValueError(
            f"unknown aggregation {rule!r} for aggregate(); it takes one of {_BASELINES} "
            "(the 'async' rule needs each prediction's input: use InformationSet)")
    prior_var = check_real(prior_var, "prior_var")
    if (not isinstance(prior_mean, numbers.Real) or isinstance(prior_mean, bool)
            or not np.isfinite(prior_mean)):
        raise ValueError(f"prior_mean must be a finite number, got {prior_mean!r}")
    prior_var, prior_mean = float(prior_var), float(prior_mean)
    mu = np.asarray(mu, dtype=float)
    var = np.asarray(var, dtype=float)
    for name, a in (("mu", mu), ("var", var)):
        if a.ndim != 2:
            raise ValueError(
                f"{name} must be 2-D of shape (n_queries, n_experts), got shape {a.shape}; "
                f"for one query pass {name}[None, :], for one expert {name}[:, None]")
    if mu.shape != var.shape:
        raise ValueError(f"mu and var must have the same shape (n_queries, n_experts), "
                         f"got {mu.shape} and {var.shape}")
    if mu.shape[1] == 0:
        raise ValueError("aggregate needs at least one expert (mu and var have 0 columns)")
    if not np.all(np.isfinite(mu)):
        raise ValueError("mu contains NaN or inf")
    if not np.all(np.isfinite(var)) or np.any(var <= 0):
        raise ValueError("var must be finite and positive (0 < var <= prior_var)")
    if np.any(var > prior_var * (1 + 1e-6)):
        raise ValueError(f"var exceeds prior_var={prior_var:.6g} (max {var.max():.6g}): an "
                         "expert's latent variance is at most the prior variance")
    var = np.clip(var, 1e-300, prior_var)  # round-off above the prior
    M = mu.shape[1]
    if rule == "moe":
        m = mu.mean(axis=1)
        return m, np.maximum((var + mu**2).mean(axis=1) - m**2, 0.0)
    r = mu - prior_mean
    if rule in ("poe", "gpoe"):
        b = 1.0 if rule == "poe" else 1.0 / M
        prec = b * (1.0 / var).sum(axis=1)
        v = 1.0 / prec
        return prior_mean + v * b * (r / var).sum(axis=1), v
    if rule == "bcm":
        prec = (1.0 / var).sum(axis=1) + (1 - M) / prior_var
        v = 1.0 / prec
        return prior_mean + v * (r / var).sum(axis=1), v
    if rule == "rbcm":
        b = 0.5 * (np.log(prior_var) - np.log(var))
        prec = (b / var).sum(axis=1) + (1.0 - b.sum(axis=1)) / prior_var
        v = 1.0 / prec
        return prior_mean + v * (b * r / var).sum(axis=1), v
    raise AssertionError(rule)  # pragma: no cover - checked above


def _finite_real(v, name):
    """``float(v)`` for a finite real number (not a string, None or a bool), else ValueError."""
    if (isinstance(v, (bool, np.bool_, str, bytes))
            or not (isinstance(v, numbers.Real)
                    or (isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iuf"))):
        raise ValueError(f"{name} must be a finite real number, got {v!r}")
    v = float(v)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be a finite real number, got {v!r}")
    return v


class InformationSet:
    """Information set ``I(t)`` of the Async DGP (Algorithm 1 of Yang et al.).

    Holds up to ``max_info`` past expert predictions ``(x_k, mu_k, sigma_k)``
    and aggregates them at the current input with eqs. (11)-(15)::

        eta_k   = L_f dist(x_k, x) + beta sigma_k
        rho_k   = max(log(beta sigma_f / eta_k), 0)
        omega^-2 = sum rho_k eta_k^-2 + (1 - sum rho_k) (beta sigma_f)^-2
        f_hat   = omega^2 [sum rho_k eta_k^-2 mu_k + (1 - sum rho_k)(beta sigma_f)^-2 m]

    Parameters
    ----------
    max_info : int
        Capacity ``I >= 1``.
    beta : float
        Error-bound scale ``beta`` (Lemma 1), finite and positive.
    sigma_f : float
        Prior standard deviation of the kernel (target units), finite and
        positive.
    lipschitz : float
        ``L_f`` (target units per unit of distance), finite and ``>= 0``.
    lengthscale : float or ndarray of shape (d,)
        Positive; used for the distance of the "gpgym" convention.
    convention : {"paper", "gpgym"}
        "paper": Euclidean distance, stored entries with ``eta > beta
        sigma_f`` pruned before each reception, newcomers with ``eta <= beta
        sigma_f`` admitted, and the ``max_info`` lowest ``eta`` kept.
        "gpgym": distance in lengthscale units, no pruning, a newcomer
        admitted only if ``L_f dist < beta (sigma_f - sigma_k)`` and, when the
        set is full, replacing the worst entry if it is better.

    Raises
    ------
    ValueError
        If a parameter is outside the ranges above or ``convention`` is
        unknown.

    Notes
    -----
    The aggregated standard deviation returned by :meth:`aggregate` is
    ``omega / beta``: with all entries at the query point (``dist = 0``)
    ``(omega/beta)^-2 = sum rho_k / sigma_k^2 + (1 - sum rho_k) / sigma_f^2``,
    the rBCM precision with weights ``rho_k = log(sigma_f / sigma_k)``
    (clipped at 0) — a variance, in target units, that the paper does not
    define but that reduces to a known rule without delays.
    """

    def __init__(self, max_info, beta, sigma_f, lipschitz, lengthscale, convention="paper"):
        check_count(max_info, "max_info")
        check_real(beta, "beta")
        check_real(sigma_f, "sigma_f")
        check_real(lipschitz, "lipschitz", positive=False)
        if convention not in CONVENTIONS:
            raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
        ell = np.asarray(lengthscale, dtype=float)
        if ell.ndim > 1 or ell.size == 0 or not np.all(np.isfinite(ell)) or np.any(ell <= 0):
            raise ValueError(f"lengthscale must be positive and finite, a scalar or of shape "
                             f"(d,), got {lengthscale!r}")
        self.max_info = int(max_info)
        self.beta = float(beta)
        self.sigma_f = float(sigma_f)
        self.lipschitz = float(lipschitz)
        self.scale = 1.0 / ell if convention == "gpgym" else None
        self.convention = convention
        self.x = []
        self.mu = []
        self.sigma = []

    def __len__(self):
        return len(self.mu)

    def _dist(self, xs, x):
        diff = np.asarray(xs, dtype=float) - x
        if self.scale is not None:
            diff = diff * self.scale
        with np.errstate(over="ignore"):
            dist = np.sqrt((diff**2).sum(axis=-1))
        if diff.size and not np.all(np.isfinite(dist)):
            # inputs of magnitude 1e160 or more are finite, their squares
            # are not: the norm of diff / m, times m
            m = np.max(np.abs(diff), axis=-1, keepdims=True)
            m = np.where(m > 0, m, 1.0)
            dist = m[..., 0] * np.sqrt(((diff / m) ** 2).sum(axis=-1))
        return dist

    def _eta(self, x):
        if not self.mu:
            return np.empty(0)
        return self.lipschitz * self._dist(np.array(self.x), x) + self.beta * np.array(self.sigma)

    def update(self, x, new):
        """Algorithm 1, parts I and II, at the current input ``x``.

        Every item of ``new`` is checked before the set changes: a rejected
        update leaves the set as it was.

        Parameters
        ----------
        x : ndarray of shape (d,)
            Current input ``x(t)``.
        new : iterable of tuples ``(x_k, mu_k, sigma_k)``
            Predictions received since the last call: ``x_k`` of shape (d,),
            ``mu_k`` and ``sigma_k`` floats.

        Raises
        ------
        ValueError
            If ``x`` is not a finite 1-D array of numbers, an item of
            ``new`` is not a triple, an ``x_k`` is not a finite array of
            shape ``(d,)`` like ``x``, ``x`` has another length than the
            stored inputs (or, with "gpgym", than ``lengthscale``), or a
            ``mu_k`` is not a finite real number or a ``sigma_k`` not a
            finite real number ``>= 0`` (e.g. a string, None, a bool or
            NaN). The set is then unchanged.
        TypeError
            If ``new`` is not iterable.
        """
        x, items = self._check_update(x, new)
        bound = self.beta * self.sigma_f
        if self.convention == "paper":
            eta = self._eta(x)
            keep = [i for i in range(len(eta)) if eta[i] <= bound]
            self.x = [self.x[i] for i in keep]
            self.mu = [self.mu[i] for i in keep]
            self.sigma = [self.sigma[i] for i in keep]
            for xk, mk, sk in items:
                ek = self.lipschitz * self._dist(xk, x) + self.beta * sk
                if ek <= bound:
                    self.x.append(np.asarray(xk, dtype=float))
                    self.mu.append(float(mk))
                    self.sigma.append(float(sk))
            if len(self.mu) > self.max_info:
                eta = self._eta(x)
                order = np.argsort(eta, kind="stable")[: self.max_info]
                self.x = [self.x[i] for i in order]
                self.mu = [self.mu[i] for i in order]
                self.sigma = [self.sigma[i] for i in order]
        else:
            for xk, mk, sk in items:
                dk = self._dist(xk, x)
                if not self.lipschitz * dk < self.beta * (self.sigma_f - sk):
                    continue
                item = (np.asarray(xk, dtype=float), float(mk), float(sk))
                if len(self.mu) < self.max_info:
                    self.x.append(item[0]), self.mu.append(item[1]), self.sigma.append(item[2])
                    continue
                eta = self._eta(x)
                worst = int(np.argmax(eta))
                if self.lipschitz * dk + self.beta * sk < eta[worst]:
                    self.x[worst], self.mu[worst], self.sigma[worst] = item

    def _check_update(self, x, new):
        """``x`` and the items of ``new`` as a list, every one checked.

        Nothing is changed here; :meth:`update` mutates the set only after
        this has accepted every item. The values are returned as given
        (:meth:`update` computes with them as before).
        """
        try:
            xa = np.asarray(x, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"x must be a 1-D array of numbers (the current input), "
                             f"got {x!r}") from exc
        if xa.ndim != 1 or xa.size == 0 or not np.all(np.isfinite(xa)):
            raise ValueError(f"x must be a finite 1-D array of shape (d,) (the current input), "
                             f"got {x!r}")
        d = xa.shape[0]
        if self.x and self.x[0].shape != (d,):
            raise ValueError(f"x has {d} entries but the stored inputs have "
                             f"{self.x[0].shape[0]}: every input must have the same d")
        if self.scale is not None and self.scale.size not in (1, d):
            raise ValueError(f"x has {d} entries but lengthscale has {self.scale.size}: "
                             "lengthscale must be a scalar or of shape (d,)")
        items = []
        for k, item in enumerate(new):
            try:
                xk, mk, sk = item
            except (TypeError, ValueError) as exc:
                raise ValueError(f"item {k} of new must be a triple (x_k, mu_k, sigma_k), "
                                 f"got {item!r}") from exc
            try:
                xka = np.asarray(xk, dtype=float)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"x_k of item {k} must be an array of numbers of shape "
                                 f"({d},), got {xk!r}") from exc
            if xka.shape != (d,) or not np.all(np.isfinite(xka)):
                raise ValueError(f"x_k of item {k} must be a finite array of shape ({d},) "
                                 f"like x, got {xk!r}")
            _finite_real(mk, f"mu_k of item {k}")
            if _finite_real(sk, f"sigma_k of item {k}") < 0:
                raise ValueError(f"sigma_k of item {k} must be >= 0 (a standard deviation), "
                                 f"got {sk!r}")
            items.append((xk, mk, sk))
        return x, items

    def aggregate(self, x, prior_mean=0.0):
        """Aggregated mean and standard deviation at ``x`` (eqs. 11-15).

        Returns the prior ``(m, sigma_f)`` when no entry has ``rho > 0``.

        Parameters
        ----------
        x : ndarray of shape (d,)
            Current input ``x(t)``.
        prior_mean : float, default=0.0
            Constant prior mean ``m``.

        Returns
        -------
        mean : float
            Aggregated mean ``f_hat(x)``.
        std : float
            ``omega / beta`` (class Notes), target units.

        Raises
        ------
        ValueError
            If ``x`` and the stored inputs have shapes that do not broadcast
            (another dimension ``d``), or, with an empty set, ``prior_mean``
            is a string that is not a number.
        TypeError
            If ``x`` or ``prior_mean`` is not numeric (e.g. a string, or
            None). ``x`` is read only when the set holds entries.
        """
        bound = self.beta * self.sigma_f
        eta = self._eta(x)
        if eta.size == 0:
            return float(prior_mean), self.sigma_f
        # in units of the bound beta sigma_f: the same weights, but the
        # squares of eta and the bound neither overflow for a huge beta nor
        # underflow for a tiny one (both gave NaN)
        e = np.maximum(eta / bound, 1e-300)
        rho = np.maximum(-np.log(e), 0.0)
        w = rho / e**2
        w0 = 1.0 - rho.sum()
        inv = w.sum() + w0
        mean = (w @ np.array(self.mu) + w0 * prior_mean) / inv
        return float(mean), float(self.sigma_f / np.sqrt(inv))


# ---------------------------------------------------------------------------
# Estimator
# ---------------------------------------------------------------------------


class AsyncDGPRegressor(RegressorMixin, BaseEstimator):
    """Distributed exact-GP experts with asynchronous or classical aggregation.

    ``n_experts`` exact GPs share one SE-ARD kernel ``k(x, z) = variance *
    exp(-0.5 sum_d (x_d - z_d)^2 / ell_d^2)`` and Gaussian noise; the data are
    split among them and their predictions are combined by ``aggregation``
    (docs/async_dgp.md).

    Parameters
    ----------
    n_experts : int, default=4
        Number of experts.
    aggregation : {"async", "moe", "poe", "gpoe", "bcm", "rbcm"}, default="async"
        Rule; see :func:`aggregate` for the baselines and
        :class:`InformationSet` for "async".  Experts holding no data are
        left out of every rule (a prior-only expert carries no information).  In ``predict`` no expert is
        late: every expert answers at the query itself, so the information
        set holds the ``max_info`` experts of lowest ``eta = beta sigma_k``
        and "async" is the rBCM with weights ``max(log(sigma_f/sigma_k), 0)``
        on them.  Delays are simulated by :mod:`skfedgp.simulation`.
    max_info : int, default=10
        Capacity of the information set (>= 1).
    convention : {"paper", "gpgym"}, default="paper"
        Constants of the "async" rule.  "paper" (default): Euclidean
        distance, ``L_f = 2 Gamma sigma_f^2 exp(-1/2) / min(ell)`` (Lemma 3
        with the smallest ARD lengthscale, a valid Lipschitz constant) and
        ``beta`` from Lemma 1; it is the default because these constants
        carry the paper's error bound (Theorem 1) and adapt to the data.
        "gpgym": the authors' MATLAB code — distance in lengthscale units,
        ``beta = 100``, ``L_f = exp(-1/2) sigma_f^2``.
    lengthscale : float or array-like of shape (n_features,), optional
        Initial (or fixed) ARD lengthscales; None: ``sqrt(n_features)``
        times the per-feature standard deviation of the first training data
        (1 where it is 0).
    variance : float or None, default=None
        Initial (or fixed) signal variance ``sigma_f^2``, target units; None:
        the variance of the training targets (1.0 if they are constant).
    noise_variance : float, optional
        Initial (or fixed) noise variance, target units; None:
        ``0.1 * variance``. Learned hyperparameters are optimised on the
        targets standardised by their standard deviation (bounds
        ``exp(+-11.5)`` there), so the fit does not depend on the targets'
        units.
    optimize_hyperparameters : bool, default=True
        Maximise the sum of the experts' log marginal likelihoods (analytic
        gradients, L-BFGS-B on log-parameters) in ``fit`` and in the first
        ``partial_fit``; later ``partial_fit`` calls keep them fixed. Needs
        at least 2 samples (else ``ValueError``).
    max_points_per_expert : int, optional
        Sliding window: each expert keeps its latest points only.  Changed
        with ``set_params`` on a fitted model, it applies at the next
        ``partial_fit`` (experts drop their oldest points down to it) or
        ``fit``.
    partition : {"random", "sequential"}, default="random"
        How points go to experts when ``groups`` is not given.  "random":
        each point independently to a uniform random expert (the same draws
        in ``fit`` and in ``partial_fit`` chunks).  "sequential": contiguous
        blocks in ``fit``; round robin by arrival index in ``partial_fit``.
    rkhs_bound : float, default=1.0
        ``Gamma``, bound on the RKHS norm of ``f`` (Lemma 1).
    lipschitz : float, optional
        ``L_f``; overrides the convention's value.
    beta : float, optional
        ``beta``; overrides the convention's value.
    n_jobs : int, optional
        joblib workers (threads) over experts in the hyperparameter search.
    random_state : int, RandomState or Generator, optional
        Seed of the random partition.

    Attributes
    ----------
    n_features_in_ : int
    lengthscale_ : ndarray of shape (n_features,)
    variance_ : float
    noise_variance_ : float
    prior_mean_ : float
        Mean of all targets seen (the constant prior mean ``m``).
    beta_ : float
        ``beta`` in use; with "paper" and no ``beta`` given, ``max_i
        sqrt(max(Gamma^2 - y_i^T (K_i + s2 I)^{-1} y_i + |D_i|, 0))`` over
        the experts holding data (centred targets); 1 if that is 0 (with a
        warning).
    lipschitz_ : float
        ``L_f`` in use.
    n_points_per_expert_ : ndarray of shape (n_experts,)
    experts_ : list of length n_experts
        The experts (each holds its points and the Cholesky factor of
        ``K + s2 I``).
    """

    def __init__(
        self,
        *,
        n_experts=4,
        aggregation="async",
        max_info=10,
        convention="paper",
        lengthscale=None,
        variance=None,
        noise_variance=None,
        optimize_hyperparameters=True,
        max_points_per_expert=None,
        partition="random",
        rkhs_bound=1.0,
        lipschitz=None,
        beta=None,
        n_jobs=None,
        random_state=None,
    ):
        self.n_experts = n_experts
        self.aggregation = aggregation
        self.max_info = max_info
        self.convention = convention
        self.lengthscale = lengthscale
        self.variance = variance
        self.noise_variance = noise_variance
        self.optimize_hyperparameters = optimize_hyperparameters
        self.max_points_per_expert = max_points_per_expert
        self.partition = partition
        self.rkhs_bound = rkhs_bound
        self.lipschitz = lipschitz
        self.beta = beta
        self.n_jobs = n_jobs
        self.random_state = random_state

    # -- validation ---------------------------------------------------------

    def _check_params(self):
        check_bool(self.optimize_hyperparameters, "optimize_hyperparameters")
        check_count(self.n_experts, "n_experts")
        check_n_jobs(self.n_jobs)
        check_count(self.max_info, "max_info")
        check_count(self.max_points_per_expert, "max_points_per_expert", allow_none=True)
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"unknown aggregation {self.aggregation!r}; expected one of {AGGREGATIONS}"
            )
        if self.convention not in CONVENTIONS:
            raise ValueError(f"unknown convention {self.convention!r}; expected one of {CONVENTIONS}")
        if self.partition not in ("random", "sequential"):
            raise ValueError(f"partition must be 'random' or 'sequential', got {self.partition!r}")
        check_real(self.rkhs_bound, "rkhs_bound")  # no None: it has no default to fall back on
        for name in ("variance", "noise_variance", "lipschitz", "beta"):
            v = getattr(self, name)
            if v is not None:
                check_real(v, name)

    def _assign(self, n, groups, start):
        """Expert index of each of ``n`` points arriving after ``start`` others."""
        M = self.n_experts
        if groups is not None:
            g = np.asarray(groups)
            if g.ndim == 2 and g.shape[1] == 1:
                g = g[:, 0]
            if g.ndim != 1:
                raise ValueError(f"groups must be 1-D (one expert index per sample), "
                                 f"got an array of shape {g.shape}")
            if g.shape[0] != n:
                raise ValueError(f"groups has {g.shape[0]} labels for {n} samples")
            if not np.issubdtype(g.dtype, np.integer) or g.min() < 0 or g.max() >= M:
                raise ValueError(f"groups must be integers in [0, n_experts={M})")
            return g.astype(int)
        if self.partition == "random":
            return np.minimum((self._rng.random(n) * M).astype(int), M - 1)
        if start is None:  # fit: contiguous blocks
            return np.repeat(np.arange(M), [len(b) for b in np.array_split(np.arange(n), M)])
        return (start + np.arange(n)) % M

    def _init_hyper(self, X, y):
        d = X.shape[1]
        if self.lengthscale is None:
            ell = _reference_lengthscale(X)
        else:
            ell = float_param(self.lengthscale, "lengthscale")
            ell = np.full(d, float(ell)) if ell.ndim == 0 else ell
            if ell.shape != (d,) or not np.all(np.isfinite(ell)) or np.any(ell <= 0):
                raise ValueError(
                    f"lengthscale must be positive, scalar or of shape ({d},), got {self.lengthscale!r}"
                )
        if self.variance is None:
            v = float(np.var(y)) if y.shape[0] > 1 else 0.0
            sf2 = v if np.isfinite(v) and v > 0 else 1.0
        else:
            sf2 = float(self.variance)
        sn2 = 0.1 * sf2 if self.noise_variance is None else float(self.noise_variance)
        return ell, sf2, sn2

    def _optimise(self, parts, ell, sf2, sn2, mean):
        d = ell.shape[0]
        parts = [(X, y - mean) for X, y in parts if X.shape[0]]
        if not parts:
            return ell, sf2, sn2
        # standardised targets: the bounds and the optimiser's steps do not
        # depend on the targets' units (variances scale back by s2)
        r = np.concatenate([y for _, y in parts])
        s2 = float(np.mean(r**2)) if r.size else 1.0
        s2 = s2 if np.isfinite(s2) and s2 > 0 else 1.0
        s = np.sqrt(s2)
        parts = [(X, y / s) for X, y in parts]
        # the lengthscales' bounds follow the inputs' units (a factor e^11.5
        # either side of sqrt(d) times each input's spread), as the variances'
        # follow the targets': with fixed bounds inputs in units of 1e-6 or
        # 1e6 pinned the lengthscale at a bound without a word
        ref = np.log(_reference_lengthscale(np.concatenate([X for X, _ in parts])))
        log_lo, log_hi = ref + _LOG_BOUNDS[0], ref + _LOG_BOUNDS[1]
        bounds = list(zip(log_lo, log_hi)) + [_LOG_BOUNDS] * 2
        lo, hi = np.exp(log_lo), np.exp(log_hi)
        theta0 = np.log(np.concatenate([ell, [sf2 / s2, sn2 / s2]]))
        if self.lengthscale is not None and (np.any(ell < lo) or np.any(ell > hi)):
            # clipped to a bound, a given lengthscale far outside started the
            # search on a flat (or white-noise) kernel it could not leave,
            # without a word
            raise ValueError(
                f"lengthscale={self.lengthscale!r} lies outside the range the hyperparameters "
                f"are learned in, [{', '.join(f'{v:.3g}' for v in lo)}] to "
                f"[{', '.join(f'{v:.3g}' for v in hi)}] per input (a factor e^11.5 either side "
                "of sqrt(d) times each input's spread): give a starting value inside it, or "
                "None for the default")
        theta0 = np.clip(theta0, [b[0] for b in bounds], [b[1] for b in bounds])
        res = minimize(
            _total_nlml, theta0, args=(parts, self.n_jobs), jac=True, method="L-BFGS-B",
            bounds=bounds,
        )
        th = res.x
        return np.exp(th[:d]), float(np.exp(th[d]) * s2), float(np.exp(th[d + 1]) * s2)

    # -- fitting -------------------------------------------------------------

    def _start(self, X, y, groups, start):
        self._check_params()
        rs = self.random_state
        if isinstance(rs, np.random.Generator):  # documented; check_random_state refuses it
            seed = int(rs.integers(2**31))
        else:
            seed = check_random_state(rs).randint(2**31)
        self._rng = np.random.default_rng(seed)
        self.n_features_in_ = X.shape[1]
        idx = self._assign(X.shape[0], groups, start)
        if self.optimize_hyperparameters and X.shape[0] < 2:
            raise ValueError(
                f"learning the hyperparameters needs at least 2 samples, got n_samples = {X.shape[0]}; "
                "pass more data, or optimize_hyperparameters=False with the lengthscale, "
                "variance and noise_variance given")
        ell, sf2, sn2 = self._init_hyper(X, y)
        self._y_sum, self._n_seen = float(y.sum()), X.shape[0]
        mean = self._y_sum / self._n_seen
        if self.optimize_hyperparameters:
            parts = []
            for i in range(self.n_experts):
                Xi, yi = X[idx == i], y[idx == i]
                if self.max_points_per_expert is not None:
                    Xi, yi = Xi[-self.max_points_per_expert :], yi[-self.max_points_per_expert :]
                parts.append((Xi, yi))
            ell, sf2, sn2 = self._optimise(parts, ell, sf2, sn2, mean)
        self.lengthscale_, self.variance_, self.noise_variance_ = ell, sf2, sn2
        self.experts_ = [
            _Expert(X.shape[1], ell, sf2, sn2, self.max_points_per_expert)
            for _ in range(self.n_experts)
        ]
        return idx

    @keep_state_on_error
    def fit(self, X, y, groups=None):
        """Partition the data, learn shared hyperparameters, factorise each expert.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        groups : array-like of shape (n_samples,), optional
            Expert index (integers in ``[0, n_experts)``) of each point.

        Returns
        -------
        self : AsyncDGPRegressor

        Raises
        ------
        ValueError
            For NaN/inf, inconsistent shapes (``X`` not 2-D, ``y`` not 1-D
            or of another length), string targets or targets whose spread
            float64 cannot hold, ``groups`` that are not integers in
            ``[0, n_experts)`` or not one per sample, invalid parameters, a
            ``beta`` or ``rkhs_bound`` so large that ``beta sigma_f`` or
            ``L_f`` overflows float64, a given ``lengthscale`` outside the
            range the hyperparameters are learned in (a factor ``e^11.5``
            either side of ``sqrt(d)`` times each input's spread), or fewer
            than 2 samples when the hyperparameters are learned.
        TypeError
            If ``X`` is sparse.
        numpy.linalg.LinAlgError
            If an expert's kernel matrix cannot be factorised (a given noise
            variance too small for duplicated inputs); names the expert.

        Warns
        -----
        UserWarning
            If some experts receive no data (``groups`` naming none of
            their points, ``n_experts > n_samples``, or an unlucky random
            partition): they are left out of ``predict``.

        Notes
        -----
        On any error the estimator keeps its previous fitted state (or stays
        unfitted).
        """
        X, y, groups = unmask(X, "X"), unmask(y, "y"), unmask(groups, "groups")
        check_not_strings(y)
        X, y = validate_data(self, X, y, y_numeric=True, dtype=float)
        check_target_values(y)  # a spread float64 can hold (overflow, underflow)
        idx = self._start(X, y, groups, None)
        self._n_stream = X.shape[0]
        for i, e in enumerate(self.experts_):
            try:
                e.set_batch(X[idx == i], y[idx == i])
            except np.linalg.LinAlgError as exc:
                raise np.linalg.LinAlgError(
                    f"the kernel matrix of expert {i} ({int(np.sum(idx == i))} points) is not "
                    f"positive definite with noise_variance={self.noise_variance_:.3g}: the noise "
                    "variance is too small for duplicated or nearly duplicated inputs; "
                    "learn it (optimize_hyperparameters=True) or give a larger one") from exc
        empty = np.flatnonzero(np.bincount(idx, minlength=self.n_experts) == 0)
        if empty.size:
            if groups is not None:
                why = "groups assigns no sample to them"
            elif self.n_experts > X.shape[0]:
                why = f"n_experts={self.n_experts} > n_samples={X.shape[0]}"
            else:
                why = "the random partition assigned no sample to them"
            warnings.warn(
                f"{empty.size} of {self.n_experts} experts received no data ({why}): "
                f"experts {empty.tolist()[:10]}{'...' if empty.size > 10 else ''}; they are "
                "left out of the aggregation (an expert without data predicts the prior)",
                UserWarning, stacklevel=user_stacklevel())
        self._finish()
        return self

    def partial_fit(self, X, y, groups=None):
        """Stream data into the experts (rank-one Cholesky updates in Numba).

        The first call behaves as ``fit`` on its chunk (hyperparameters are
        learned there, if requested) but adds the points one by one; later
        calls keep the hyperparameters and append each point to its expert,
        dropping the expert's oldest point when ``max_points_per_expert`` is
        reached.  The prior mean is the running mean of all targets seen.

        A ``max_points_per_expert`` changed with ``set_params`` since the
        last call applies from this call on: experts holding more points
        first drop their oldest ones down to the new window (rank-one
        downdates, as when a full window slides).  ``n_experts`` cannot
        change between calls (``ValueError``; refit with ``fit``).  Experts
        that have not received a point yet are left out of ``predict``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        groups : array-like of shape (n_samples,), optional
            Expert index of each point.

        Returns
        -------
        self : AsyncDGPRegressor

        Raises
        ------
        ValueError
            For NaN/inf, inconsistent shapes (``X`` not 2-D, ``y`` not 1-D
            or of another length), a different number of features than
            before, string targets or targets whose spread float64 cannot
            hold, ``groups`` that are not integers in ``[0, n_experts)`` or
            not one per sample, invalid parameters, ``n_experts`` changed
            since the model was fitted, or a first call with fewer than 2
            samples when the hyperparameters are learned.
        TypeError
            If ``X`` is sparse.
        numpy.linalg.LinAlgError
            If a rank-one update loses positive definiteness (a noise
            variance too small for a duplicated input).

        Notes
        -----
        A chunk is applied whole or not at all: on any error the experts,
        the running mean and the stream position are as before the call.
        """
        # a chunk is applied whole or not at all: the experts it touches (changed
        # in place by the rank-one updates) and the partition's generator are
        # copied, the other attributes are replaced, not changed in place
        saved = dict(vars(self))
        if "_rng" in saved:
            saved["_rng"] = copy.deepcopy(saved["_rng"])
        touched = {}
        try:
            first = not hasattr(self, "experts_")
            X, y, groups = unmask(X, "X"), unmask(y, "y"), unmask(groups, "groups")
            check_not_strings(y)
            X, y = validate_data(self, X, y, y_numeric=True, dtype=float, reset=first)
            check_target_values(y)
            if first:
                self._n_stream = 0
                idx = self._start(X, y, groups, 0)
            else:
                self._check_params()
                if self.n_experts != len(self.experts_):
                    raise ValueError(
                        f"n_experts={self.n_experts} changed since the model was fitted with "
                        f"{len(self.experts_)} experts; partial_fit cannot add or remove "
                        "experts: refit with fit, or set n_experts back")
                idx = self._assign(X.shape[0], groups, self._n_stream)
                w = self.max_points_per_expert
                resized = {i for i, e in enumerate(self.experts_) if e.max_points != w}
                touched = {i: self.experts_[i].snapshot(copy_used=i in resized)
                           for i in resized | {int(i) for i in np.unique(idx)}}
                for i in resized:  # a window changed by set_params applies from now on
                    self.experts_[i].set_window(w)
                self._y_sum += float(y.sum())
                self._n_seen += X.shape[0]
            self._n_stream += X.shape[0]
            for k in range(X.shape[0]):
                try:
                    self.experts_[idx[k]].add(X[k], y[k])
                except np.linalg.LinAlgError as exc:
                    raise np.linalg.LinAlgError(
                        f"{exc} (point {k} of this chunk, expert {int(idx[k])}); "
                        "nothing of the chunk was added") from exc
            self._finish()
        except BaseException:
            experts = saved.get("experts_")
            for i, snap in touched.items():
                experts[i].restore(snap)
            vars(self).clear()
            vars(self).update(saved)
            raise
        return self

    def _finish(self):
        self.prior_mean_ = self._y_sum / self._n_seen
        self.n_points_per_expert_ = np.array([e.n for e in self.experts_])
        sf2 = self.variance_
        if self.convention == "paper":
            with np.errstate(over="ignore"):
                L_f = 2.0 * np.float64(self.rkhs_bound) * sf2 * np.exp(-0.5) / self.lengthscale_.min()
            if self.beta is None:
                with np.errstate(over="ignore"):
                    g2 = np.float64(self.rkhs_bound) ** 2  # inf for a huge bound: refused below
                b = max(
                    (np.sqrt(max(g2 - e.quad(self.prior_mean_) + e.n, 0.0))
                     for e in self.experts_ if e.n),  # experts without data do not vote
                    default=float(self.rkhs_bound),
                )
                if not b > 0:
                    warnings.warn(
                        "Lemma 1 gives beta = 0 (for every expert with data, "
                        "(y - m)^T (K + s2 I)^-1 (y - m) - n reaches rkhs_bound**2 = "
                        f"{g2:.3g}: the data look rougher than an "
                        "RKHS norm of rkhs_bound allows, often because the noise variance was "
                        "fitted tiny on few points, e.g. a small first partial_fit chunk); "
                        "using beta = 1. Pass a larger rkhs_bound or an explicit beta, or "
                        "fit the hyperparameters on more rows", RuntimeWarning,
                        stacklevel=user_stacklevel())
                    b = 1.0
            else:
                b = float(self.beta)
        else:
            L_f = np.exp(-0.5) * sf2
            b = 100.0 if self.beta is None else float(self.beta)
        lipschitz = float(L_f if self.lipschitz is None else self.lipschitz)
        with np.errstate(over="ignore"):
            bound = b * np.sqrt(sf2)
        if not (np.isfinite(lipschitz) and np.isfinite(bound)):
            # the parameter behind the value that overflowed (a given
            # lipschitz was checked finite, so a non-finite one is L_f's)
            from_bound = "rkhs_bound" if self.convention == "paper" else "variance"
            source = (("beta" if self.beta is not None else from_bound)
                      if not np.isfinite(bound) else from_bound)
            raise ValueError(
                f"the Async DGP constants overflow float64 (beta = {b:.3g}, L_f = "
                f"{lipschitz:.3g}, sigma_f = {np.sqrt(sf2):.3g}): beta sigma_f and L_f must be "
                f"finite; use a smaller {source} (rkhs_bound={self.rkhs_bound!r}, "
                f"beta={self.beta!r}, lipschitz={self.lipschitz!r})"
            )
        self.lipschitz_ = lipschitz
        self.beta_ = float(b)

    # -- prediction ----------------------------------------------------------

    def predict_experts(self, X):
        """Every expert's posterior mean and latent variance.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)

        Returns
        -------
        mu, var : ndarray of shape (n_queries, n_experts)

        Raises
        ------
        ValueError
            For NaN/inf in ``X``, ``X`` not 2-D, or a different number of
            features than in fit.
        TypeError
            If ``X`` is sparse.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        check_is_fitted(self, "experts_")
        X = validate_data(self, unmask(X, "X"), reset=False, dtype=float)
        out = [e.predict(X, self.prior_mean_) for e in self.experts_]
        return np.stack([o[0] for o in out], axis=1), np.stack([o[1] for o in out], axis=1)

    def score(self, X, y, sample_weight=None):
        """Coefficient of determination R^2 of :meth:`predict` (scikit-learn's).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None

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

    def predict(self, X, return_std=False):
        """Aggregated prediction of the latent function.

        Experts that hold no data are left out of every rule: their
        prediction is the prior, which carries no information (``M`` in
        the rules counts the experts with data).  With no expert holding
        data the prediction is the prior ``(prior_mean_, sqrt(variance_))``.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
        return_std : bool, default=False
            Also return the aggregated standard deviation of the latent
            function (no noise): the rule's variance (see :func:`aggregate`),
            or ``omega / beta`` for "async" (see :class:`InformationSet`).

        Returns
        -------
        mean : ndarray of shape (n_queries,)
        std : ndarray of shape (n_queries,), only if ``return_std``

        Raises
        ------
        ValueError
            For invalid parameters (e.g. an ``aggregation`` set with
            ``set_params``; checked after the fitted state), NaN/inf in
            ``X``, ``X`` not 2-D, or a different number of features than in
            fit.
        TypeError
            If ``X`` is sparse.
        sklearn.exceptions.NotFittedError
            Before fit (checked first, whatever the parameters).
        """
        check_is_fitted(self, "experts_")
        self._check_params()
        mu, var = self.predict_experts(X)
        # an expert without data predicts the prior: it carries no information
        # and is left out of every rule (MoE would average the prior in, gPoE
        # would shrink the weights 1/M of the others)
        has_data = np.array([e.n > 0 for e in self.experts_])
        if not has_data.any():
            m = np.full(mu.shape[0], self.prior_mean_)
            s = np.full(mu.shape[0], np.sqrt(self.variance_))
            return (m, s) if return_std else m
        mu, var = mu[:, has_data], var[:, has_data]
        if self.aggregation == "async":
            m, s = _async_no_delay(
                mu, var, self.variance_, self.beta_, self.max_info, self.prior_mean_
            )
        else:
            m, v = aggregate(mu, var, self.variance_, self.aggregation, self.prior_mean_)
            s = np.sqrt(v)
        return (m, s) if return_std else m

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.regressor_tags.poor_score = False
        return tags


def _async_no_delay(mu, var, sf2, beta, max_info, prior_mean):
    """Async rule when every expert answered at the query (``dist = 0``).

    Vectorised form of :class:`InformationSet` for ``predict``: ``eta_k =
    beta sigma_k``; the ``max_info`` lowest ``eta`` are kept.
    """
    sig = np.sqrt(np.clip(var, 1e-300, sf2))
    sf = np.sqrt(sf2)
    if sig.shape[1] > max_info:
        order = np.argsort(sig, axis=1, kind="stable")[:, :max_info]
        sig = np.take_along_axis(sig, order, axis=1)
        mu = np.take_along_axis(mu, order, axis=1)
    # eta / (beta sigma_f) = sigma_k / sigma_f: beta cancels (squaring
    # beta sigma_k overflowed for beta near 1e154 and underflowed near
    # 1e-154, giving NaN)
    e = sig / sf
    rho = np.maximum(-np.log(e), 0.0)
    w = rho / e**2
    w0 = 1.0 - rho.sum(axis=1)
    inv = w.sum(axis=1) + w0
    mean = ((w * mu).sum(axis=1) + w0 * prior_mean) / inv
    return mean, sf / np.sqrt(inv)
