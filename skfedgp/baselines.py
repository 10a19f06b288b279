"""Comparison baselines for pFedHGP: the pFedGP baseline.

:class:`PFedGPRegressor` is the personalised federated GP baseline of the
pFedHGP paper's benchmark (H. Yan, "Personalized Federated Hierarchical
Gaussian Processes for Privacy-Preserving Modeling of Heterogeneous
Distributed Systems", arXiv:2609.19337, 2026, section 4.4), after
I. Achituve, A. Shamsian, A. Navon, G. Chechik and E. Fetaya, "Personalized
Federated Learning with Gaussian Processes", NeurIPS 2021: every client keeps
its own exact multi-output GP, and only the input-kernel hyperparameters are
shared, averaged FedAvg-style on the server each round. There is no
global/deviation/local decomposition.

The model of client ``i`` is a linear model of coregionalisation (LMC)::

    K((x, q), (x', q')) = sum_r B_i[q, r] B_i[q', r] k_r(x, x')
                          + s2_i [x = x', q = q'],
    k_r(x, x') = exp(-0.5 * sum_k (x_k - x'_k)^2 / ell[r, k]^2)

with ``R = n_latent`` unit-variance SE-ARD kernels ``k_r`` whose lengthscales
``ell`` (an ``R x d`` array) are shared by all clients, and a loading matrix
``B_i`` (``Q x R``) and noise variance ``s2_i`` kept by client ``i``.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np
from joblib import Parallel, delayed
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.optimize import minimize
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import (
    check_array,
    check_consistent_length,
    check_is_fitted,
    validate_data,
)

from ._linalg import cholesky_inverse
from ._parallel import single_threaded_blas
from ._validation import (
    ClientLabelWarning,
    user_stacklevel,
    _object_array,
    check_finite_scalar,
    check_groups,
    check_label_types,
    check_n_jobs,
    check_real,
    float_param,
    keep_state_on_error,
    label_source,
    labels_from_column,
    match_labels,
    r2_observed,
    split_client_column,
    unique_labels,
    unmask,
    validate_predict_input,
)
from .federated import input_scaling, outer_box
from .regressor import _Population as _UNSEEN  # the population-prediction sentinel label
from .regressor import (_check_cov_budget, _n_target_columns, _warn_copied_rows,
                        check_target_values)

__all__ = [
    "PFedGPRegressor",
    "lmc_log_marginal_likelihood",
    "fedavg_log_mean",
    "MAX_ENTRIES_PER_CLIENT",
]

#: Largest number of observed target entries (``n_i`` rows times the observed
#: channels) one client may hold: the exact GP factorises an
#: ``n_i Q x n_i Q`` matrix (``O((n_i Q)^3)`` time, ``O((n_i Q)^2)`` memory);
#: 4000 entries take about 0.13 GB per matrix and a second per factorisation.
MAX_ENTRIES_PER_CLIENT = 4000

#: Smallest number of rows a client must hold.
MIN_SAMPLES_PER_CLIENT = 2

#: Bounds of the optimised parameters (standardised units): log lengthscale
#: (unit input box) and log noise variance.
_LOG_ELL_BOUNDS = (np.log(1e-3), np.log(1e3))
_LOG_NOISE_BOUNDS = (np.log(1e-6), np.log(10.0))

#: L-BFGS-B iterations of the final local refit (ell fixed).
_REFIT_MAXITER = 500


# ---------------------------------------------------------------------------
# the exact LMC marginal likelihood of one client
# ---------------------------------------------------------------------------
def _sq_dist(Xa, Xb, ell):
    """``sum_k (x_k - x'_k)^2 / ell_k^2``: (n, m)."""
    A = Xa / ell
    Bm = Xb / ell
    d2 = (A * A).sum(1)[:, None] + (Bm * Bm).sum(1)[None, :] - 2.0 * A @ Bm.T
    return np.maximum(d2, 0.0)


def _lmc_cov(Xe, qe, B, ell, noise_variance):
    """Covariance of the observed entries and the per-latent pieces.

    Parameters
    ----------
    Xe : ndarray of shape (m, d)
        Input of every observed entry.
    qe : ndarray of shape (m,), int
        Channel of every observed entry.
    B : ndarray of shape (Q, R)
    ell : ndarray of shape (R, d)
    noise_variance : float

    Returns
    -------
    K : ndarray of shape (m, m)
    kr : list of R ndarrays of shape (m, m)
        Input kernels ``k_r`` of the entries.
    """
    m = Xe.shape[0]
    K = noise_variance * np.eye(m)
    kr = []
    for r in range(B.shape[1]):
        k = np.exp(-0.5 * _sq_dist(Xe, Xe, ell[r]))
        b = B[qe, r]
        K += (b[:, None] * b[None, :]) * k
        kr.append(k)
    return K, kr


def _cholesky(K, where="client"):
    """Lower Cholesky factor, with a little jitter if needed."""
    jitter = 0.0
    scale = max(float(np.mean(np.diag(K))), 1e-300)
    for _ in range(6):
        try:
            return cholesky(K + jitter * np.eye(K.shape[0]), lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            jitter = scale * (1e-10 if jitter == 0.0 else 10.0 * jitter / scale)
    raise np.linalg.LinAlgError(
        f"the LMC covariance of {where} is not positive definite even with jitter "
        f"{jitter:.1e}")


def lmc_log_marginal_likelihood(Xe, qe, v, B, ell, noise_variance, *, gradient=True):
    r"""Exact log marginal likelihood of one client's LMC GP and its gradient.

    .. math::

        \log p(v) = -\tfrac12 v^\top K^{-1} v - \tfrac12 \log|K|
                    - \tfrac m2 \log 2\pi,\qquad
        \frac{\partial \log p}{\partial \theta}
            = \tfrac12 \operatorname{tr}\big((\alpha\alpha^\top - K^{-1})
              \partial K / \partial\theta\big),\ \alpha = K^{-1} v

    (Rasmussen and Williams, "Gaussian Processes for Machine Learning", MIT
    Press 2006, eqs. 5.8--5.9), with ``K`` the LMC covariance of the module
    docstring restricted to the observed entries.

    Parameters
    ----------
    Xe : ndarray of shape (m, d)
        Input of every observed entry (standardised units).
    qe : ndarray of shape (m,), int
        Channel (0..Q-1) of every observed entry.
    v : ndarray of shape (m,)
        Observed (standardised) targets.
    B : ndarray of shape (Q, R)
        Loadings.
    ell : ndarray of shape (R, d)
        Lengthscales of the unit-variance SE-ARD latent kernels, positive.
    noise_variance : float
        Isotropic noise variance ``s2``, positive.
    gradient : bool, default=True

    Returns
    -------
    lml : float
    grads : dict, only if ``gradient``
        ``"log_ell"`` (R, d): derivative with respect to ``log ell``;
        ``"B"`` (Q, R); ``"log_noise"`` float: with respect to ``log s2``.

    Raises
    ------
    numpy.linalg.LinAlgError
        If the covariance ``K`` is not positive definite even with jitter
        (e.g. a negative ``noise_variance``).
    ValueError
        If ``Xe``, ``v``, ``B`` or ``ell`` holds NaN/inf, ``ell`` is not
        positive, ``noise_variance`` is not a finite number (each would
        make the result NaN), or the shapes of ``Xe``, ``qe``, ``v`` and
        ``ell`` do not match (``m`` entries, ``d`` columns).
    IndexError
        If ``qe`` holds a channel outside ``0..Q-1`` or is not an integer
        array, or ``ell`` has fewer than ``R`` rows.
    """
    for name, a in (("Xe", Xe), ("v", v), ("B", B), ("ell", ell)):
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains NaN or inf")
    if np.any(np.asarray(ell) <= 0):
        raise ValueError("ell (the lengthscales) must be positive")
    check_finite_scalar(noise_variance, "noise_variance")
    m = Xe.shape[0]
    K, kr = _lmc_cov(Xe, qe, B, ell, noise_variance)
    L = _cholesky(K)
    alpha = cho_solve((L, True), v, check_finite=False)
    lml = (-0.5 * float(v @ alpha) - float(np.log(np.diag(L)).sum())
           - 0.5 * m * np.log(2.0 * np.pi))
    if not gradient:
        return lml
    Kinv = cholesky_inverse(L)
    W = np.outer(alpha, alpha) - Kinv  # d lml = 0.5 tr(W dK)
    Q, R = B.shape
    gB = np.zeros((Q, R))
    gell = np.zeros_like(ell)
    x2 = Xe * Xe
    for r in range(R):
        b = B[qe, r]
        Wk = W * kr[r]
        # d K / d B[p, r] = (e_p b^T + b e_p^T) o k_r  ->  (W o k_r) b summed by channel
        gB[:, r] = np.bincount(qe, weights=Wk @ b, minlength=Q)
        # d K / d log ell_rk = (b b^T o k_r) o (x_k - x'_k)^2 / ell_rk^2
        Mr = Wk * b[:, None] * b[None, :]
        s = Mr.sum(1)
        quad = (2.0 * (x2 * s[:, None]).sum(0) - 2.0 * (Xe * (Mr @ Xe)).sum(0))
        gell[r] = 0.5 * quad / ell[r] ** 2
    g_noise = 0.5 * noise_variance * float(np.trace(W))
    return lml, {"log_ell": gell, "B": gB, "log_noise": g_noise}


def fedavg_log_mean(lengthscales, weights):
    """FedAvg step of the server: weighted mean of the clients' log lengthscales.

    Parameters
    ----------
    lengthscales : sequence of ndarrays of shape (R, d)
        Each client's lengthscales after its local steps (positive).
    weights : array-like of shape (n_clients,)
        Non-negative weights (the clients' numbers of observed entries).

    Returns
    -------
    ell : ndarray of shape (R, d)
        ``exp(sum_i w_i log ell_i / sum_i w_i)``.

    Raises
    ------
    ValueError
        If ``lengthscales`` is empty, its arrays differ in shape or hold a
        lengthscale that is not finite and positive (its log would be
        NaN or -inf), or ``weights`` does not have one entry per array,
        holds a negative or non-finite weight or sums to zero.
    """
    w = np.asarray(weights, dtype=float)
    ells = np.stack([np.asarray(e, dtype=float) for e in lengthscales])
    if not np.all(np.isfinite(ells)) or np.any(ells <= 0):
        raise ValueError("lengthscales must be finite and positive (their logs are averaged)")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be finite and non-negative, got {w!r}")
    if not w.sum() > 0:
        raise ValueError("weights sum to zero: the weighted mean of the log lengthscales is "
                         "undefined; give at least one positive weight")
    logs = np.log(ells)
    return np.exp(np.tensordot(w / w.sum(), logs, axes=1))


# ---------------------------------------------------------------------------
# one client
# ---------------------------------------------------------------------------
@dataclass
class _Client:
    """What client ``label`` keeps: its own data, loadings, noise and factor.

    ``X`` are its standardised inputs (n_i, d); ``Y`` its standardised
    targets (n_i, Q) with NaN where missing; ``y_offset`` (Q,) and
    ``y_scale`` (float) map them back to target units. None of these leave
    the client; only ``ell`` does.
    """

    label: object
    X: np.ndarray
    Y: np.ndarray
    y_offset: np.ndarray
    y_scale: float
    B: np.ndarray
    noise_variance: float
    L: np.ndarray = None
    alpha: np.ndarray = None
    lml: float = np.nan

    @property
    def entries(self):
        """Rows, channels and values of the observed entries."""
        rows, qs = np.nonzero(~np.isnan(self.Y))
        return rows, qs, self.Y[rows, qs]

    @property
    def n_entries(self):
        return int(np.count_nonzero(~np.isnan(self.Y)))

    def _objective(self, ell_fixed=None):
        rows, qe, v = self.entries
        Xe = self.X[rows]
        Q, R = self.B.shape

        def unpack(theta):
            k = 0
            if ell_fixed is None:
                ell = np.exp(theta[:ell_size].reshape(R, -1))
                k = ell_size
            else:
                ell = ell_fixed
            B = theta[k:k + Q * R].reshape(Q, R)
            return ell, B, float(np.exp(theta[-1]))

        ell_size = R * self.X.shape[1]

        def f(theta):
            ell, B, s2 = unpack(theta)
            lml, g = lmc_log_marginal_likelihood(Xe, qe, v, B, ell, s2)
            parts = [g["B"].ravel(), [g["log_noise"]]]
            if ell_fixed is None:
                parts.insert(0, g["log_ell"].ravel())
            grad = np.concatenate(parts)
            if not (np.isfinite(lml) and np.all(np.isfinite(grad))):
                raise FloatingPointError(
                    f"client {self.label!r}: non-finite log marginal likelihood or gradient")
            return -lml, -grad

        return f, unpack, ell_size

    def local_round(self, ell, steps):
        """``steps`` L-BFGS-B iterations on (log ell, B, log s2); returns new ell."""
        f, unpack, ell_size = self._objective()
        Q, R = self.B.shape
        theta0 = np.concatenate([np.log(ell).ravel(), self.B.ravel(),
                                 [np.log(self.noise_variance)]])
        bounds = ([_LOG_ELL_BOUNDS] * ell_size + [(None, None)] * (Q * R)
                  + [_LOG_NOISE_BOUNDS])
        res = minimize(f, np.clip(theta0, *_bound_arrays(bounds)), jac=True,
                       method="L-BFGS-B", bounds=bounds, options={"maxiter": steps})
        ell_new, self.B, self.noise_variance = unpack(res.x)
        self.lml = -float(res.fun)
        return ell_new

    def refit(self, ell):
        """Refit B and s2 with ``ell`` fixed, then store the posterior factor."""
        f, unpack, _ = self._objective(ell_fixed=ell)
        Q, R = self.B.shape
        theta0 = np.concatenate([self.B.ravel(), [np.log(self.noise_variance)]])
        bounds = [(None, None)] * (Q * R) + [_LOG_NOISE_BOUNDS]
        theta0 = np.clip(theta0, *_bound_arrays(bounds))
        res = minimize(f, theta0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": _REFIT_MAXITER})
        _, self.B, self.noise_variance = unpack(res.x)
        rows, qe, v = self.entries
        K, _ = _lmc_cov(self.X[rows], qe, self.B, ell, self.noise_variance)
        self.L = _cholesky(K, f"client {self.label!r}")
        self.alpha = cho_solve((self.L, True), v, check_finite=False)
        self.lml = -float(res.fun)
        return self


def _bound_arrays(bounds):
    lo = np.array([-np.inf if b[0] is None else b[0] for b in bounds])
    hi = np.array([np.inf if b[1] is None else b[1] for b in bounds])
    return lo, hi


def _local_round(client, ell, steps):
    with single_threaded_blas():
        ell_new = client.local_round(ell, steps)
    return client, ell_new


def _refit(client, ell):
    with single_threaded_blas():
        return client.refit(ell)


# ---------------------------------------------------------------------------
# estimator
# ---------------------------------------------------------------------------
class PFedGPRegressor(RegressorMixin, BaseEstimator):
    """pFedGP baseline: per-client exact multi-output GPs, FedAvg-averaged kernels.

    Every client fits its own exact GP with a linear-model-of-coregionalisation
    (LMC) covariance over its ``Q`` target channels::

        K((x, q), (x', q')) = sum_r B_i[q, r] B_i[q', r] k_r(x, x')
                              + s2_i [x = x' and q = q']

    with ``R = n_latent`` unit-variance SE-ARD input kernels ``k_r`` whose
    lengthscales ``ell`` (an ``(n_latent, n_features)`` array) are shared by
    all clients. Each round every client takes ``local_steps`` L-BFGS-B steps
    on its own exact log marginal likelihood over ``(log ell, B_i, log s2_i)``
    (analytic gradients) starting from the broadcast ``ell``, and sends its
    new ``ell`` -- an ``(n_latent, n_features)`` array, **nothing else leaves
    the client**. The server averages the clients' ``log ell`` weighted by
    their numbers of observed target entries (FedAvg in log space) and
    broadcasts the result. After the last round every client refits its own
    ``B_i`` and ``s2_i`` with ``ell`` fixed at the final average (L-BFGS-B to
    convergence, at most 500 iterations), so the posterior it predicts with
    belongs to the final shared hyperparameters. There is no
    global/deviation/local decomposition: clients share nothing but ``ell``.

    **Units.** Inputs are mapped to the unit box spanned by all clients'
    inputs (the server learns each client's per-feature minimum and maximum
    once; lengthscales are averaged in those units and reported in input
    units in :attr:`lengthscales_`). Targets are standardised *per client*:
    each channel's own mean is subtracted (that client's observed entries)
    and all channels are divided by one scale, the client's pooled standard
    deviation of the centred entries, so the isotropic noise stays isotropic.

    **Missing channels.** Entries of ``y`` that are NaN (a sensor that
    dropped out) are left out of the likelihood: the GP is over the observed
    ``(row, channel)`` entries only. A row with every channel missing, NaN in
    ``X``, or a client with no observation of some channel is a
    ``ValueError``.

    **Cost.** Exact GP: ``O((n_i Q)^3)`` per likelihood evaluation; a client
    with more than :data:`MAX_ENTRIES_PER_CLIENT` (4000) observed entries is
    refused with a ``ValueError`` (use
    :class:`~skfedgp.FederatedHierarchicalGPRegressor` for larger clients).
    Each client keeps its own training data after fit (an exact GP needs
    it to predict); it is never sent anywhere.

    Parameters
    ----------
    n_latent : int, default=2
        Number ``R`` of latent input kernels (rank of the LMC).
    n_rounds : int, default=20
        Communication rounds (0: no round, only the local refit at the
        initial lengthscales).
    local_steps : int, default=20
        L-BFGS-B iterations per client per round.
    tol : float, default=1e-3
        Stop before ``n_rounds`` when no averaged log lengthscale moved by
        more than ``tol`` in a round (the shared hyperparameters have
        converged; the clients' loadings are refitted anyway). 0: always run
        ``n_rounds`` rounds.
    lengthscale : float or array-like of shape (n_latent,) or (n_latent, n_features), default=None
        Initial lengthscales in input units; None: latent ``r`` starts at a
        fraction of each feature's range, log-spaced from 0.2 (r = 0) to 0.05
        (r = R - 1) -- a long and a short scale for ``R = 2``. Learned
        within 1e-3 to 1e3 times each feature's range over all clients; a
        given value outside that range is an error.
    noise_variance : float, default=None
        Initial noise variance of every client in squared target units;
        None: 0.1 times each client's own target variance (0.1 in its
        standardised units). Bounds: 1e-6 to 10 times the client's target
        variance.
    client_column : int or str, default=None
        Column of ``X`` holding the client labels (not a feature), as in
        :class:`~skfedgp.FederatedHierarchicalGPRegressor`; overrides
        ``groups``.
    n_jobs : int, default=None
        Parallel jobs over clients (:class:`joblib.Parallel`, threads).
    random_state : int, RandomState instance or None, default=None
        Seeds the initial loadings ``B_i ~ N(0, 1/R)`` (standardised units)
        and nothing else.
    verbose : int, default=0
        If > 0, print the summed log marginal likelihood after each round.

    Attributes
    ----------
    clients_ : dict
        Client label to the client's model (its standardised data, loadings,
        noise variance, Cholesky factor): what a deployed client keeps.
    lengthscales_ : ndarray of shape (n_latent, n_features_model_)
        Final averaged lengthscales, input units.
    lengthscale_unit_ : ndarray of shape (n_latent, n_features_model_)
        The same in unit-box units (what the clients use).
    x_offset_, x_scale_ : ndarray of shape (n_features_model_,)
        Input scaling to the unit box, ``(x - x_offset_) / x_scale_``.
    n_features_model_ : int
        Number of input features (without a ``client_column``).
    loadings_ : dict
        Client label to its loadings ``B_i`` of shape (Q, n_latent), in
        target units (``y_scale * B_i``).
    noise_variance_ : dict
        Client label to its noise variance, squared target units.
    lml_history_ : list of float
        Sum over clients of the log marginal likelihoods (standardised units)
        after each round's local steps; the last entry is after the final
        refit.
    lengthscale_history_ : list of ndarray of shape (n_latent, n_features_model_)
        Broadcast lengthscales (unit-box units): the initial one and one per
        round.
    communication_ : list of dict
        One dict per round with keys ``"round"`` (1, 2, ...),
        ``"upload_bytes"`` and ``"download_bytes"`` (8 bytes per float64).
    n_iter_ : int
        Rounds run (at most ``n_rounds``; fewer when ``tol`` stopped it).
    n_outputs_ : int
        Number ``Q`` of target channels (1 for 1-D ``y``).
    n_features_in_ : int
        Columns of ``X`` seen in fit, including a ``client_column``.
    feature_names_in_ : ndarray
        Column names of ``X`` (pandas input with string names).
    client_column_ : int, str or None
        The ``client_column`` of the fit, which prediction uses (a value set
        with ``set_params`` after fit applies from the next fit on).

    Notes
    -----
    A label never seen in fit (or ``groups=None`` with several fitted
    clients, which warns with :class:`ClientLabelWarning`) gets the
    *population prior*: mean the average of the clients' channel means, and
    covariance ``sum_r Bbar_r k_r(x, x') + s2bar I`` where ``Bbar_r`` is the
    average over clients of ``B_i[:, r] B_i[:, r]^T`` and ``s2bar`` the
    average noise variance (all in target units). No data of any client is
    used for it.

    Unlike :class:`~skfedgp.FederatedHierarchicalGPRegressor`, this baseline
    is an exact GP per client: each fitted client keeps its own training
    inputs (scaled) and targets (standardised) and their Cholesky factor,
    which its predictions need, so a pickled model holds every client's
    training data. Use it as a comparison, not where the fitted object must
    be free of client data.

    References
    ----------
    I. Achituve, A. Shamsian, A. Navon, G. Chechik and E. Fetaya,
    "Personalized Federated Learning with Gaussian Processes", NeurIPS 2021.

    H. Yan, "Personalized Federated Hierarchical Gaussian Processes for
    Privacy-Preserving Modeling of Heterogeneous Distributed Systems", arXiv
    preprint arXiv:2609.19337 (2026), section 4.4 (the pFedGP baseline of
    the multi-output benchmark).

    M. A. Alvarez, L. Rosasco and N. D. Lawrence, "Kernels for Vector-Valued
    Functions: A Review", Foundations and Trends in Machine Learning 4(3),
    2012, section 4.2 (the LMC).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedgp import PFedGPRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(0, 10, (60, 1))
    >>> Y = np.hstack([np.sin(X), np.cos(X)]) + 0.05 * rng.normal(size=(60, 2))
    >>> groups = np.repeat([0, 1, 2], 20)
    >>> est = PFedGPRegressor(n_rounds=3, random_state=0).fit(X, Y, groups)
    >>> mean, cov = est.predict(X[:5], groups[:5], return_cov=True)
    >>> mean.shape, cov.shape
    ((5, 2), (5, 2, 2))
    """

    def __init__(self, *, n_latent=2, n_rounds=20, local_steps=20, tol=1e-3, lengthscale=None,
                 noise_variance=None, client_column=None, n_jobs=None, random_state=None,
                 verbose=0):
        self.n_latent = n_latent
        self.n_rounds = n_rounds
        self.local_steps = local_steps
        self.tol = tol
        self.lengthscale = lengthscale
        self.noise_variance = noise_variance
        self.client_column = client_column
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose

    # -- validation -----------------------------------------------------------
    def _check_params(self):
        def _int(name, minimum):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
            return int(v)

        if not isinstance(self.verbose, numbers.Integral):
            raise ValueError(
                f"verbose must be an int (0 or less: silent), got {self.verbose!r}")
        check_n_jobs(self.n_jobs)
        R = _int("n_latent", 1)
        n_rounds = _int("n_rounds", 0)
        steps = _int("local_steps", 1)
        check_real(self.tol, "tol", positive=False)
        if self.noise_variance is not None:
            check_real(self.noise_variance, "noise_variance")
        return R, n_rounds, steps

    def _initial_lengthscale(self, R, d, x_scale):
        """Initial ``ell`` in unit-box units, (R, d)."""
        if self.lengthscale is None:
            return np.repeat(np.geomspace(0.2, 0.05, R)[:, None] if R > 1
                             else np.array([[0.2]]), d, axis=1)
        ell = float_param(self.lengthscale, "lengthscale")
        if ell.ndim == 0:
            ell = np.full((R, d), float(ell))
        elif ell.ndim == 1 and ell.shape[0] == R:
            ell = np.repeat(ell[:, None], d, axis=1)
        if ell.shape != (R, d) or not np.all(np.isfinite(ell)) or np.any(ell <= 0):
            raise ValueError(
                f"lengthscale must be a positive finite float, or of shape ({R},) or "
                f"({R}, {d}) (n_latent, n_features), got {self.lengthscale!r}")
        lo, hi = np.exp(_LOG_ELL_BOUNDS[0]) * x_scale, np.exp(_LOG_ELL_BOUNDS[1]) * x_scale
        if np.any(ell < lo) or np.any(ell > hi):
            # clipped to a bound, 1e308 started (and stayed) on a flat kernel
            # without a word
            raise ValueError(
                f"lengthscale={self.lengthscale!r} lies outside the range the lengthscales "
                f"are learned in, [{', '.join(f'{v:.3g}' for v in lo)}] to "
                f"[{', '.join(f'{v:.3g}' for v in hi)}] per input (1e-3 to 1e3 times the "
                "clients' joint input range): give a starting value inside it (one per "
                "feature, shape (n_latent, n_features), for features of different ranges), "
                "or None for the default")
        return ell / x_scale

    def _validate_fit_data(self, X, y, groups):
        X, groups = unmask(X, "X"), unmask(groups, "groups")
        # a masked channel of a multi-output y is missing
        y = unmask(y, "y", missing_ok=_n_target_columns(y) > 1)
        if self.client_column is None:
            X = validate_data(self, X, reset=True, dtype=np.float64)
            labels = None
        else:
            X, labels = split_client_column(self, X, self.client_column, reset=True)
            X = check_array(X, dtype=np.float64, estimator=self, input_name="X")
        if y is None:
            raise ValueError("requires y to be passed, but the target y is None")
        y = check_array(y, ensure_2d=False, dtype=np.float64, ensure_all_finite="allow-nan",
                        estimator=self, input_name="y")
        if y.ndim not in (1, 2):
            raise ValueError(f"y must have shape (n,) or (n, Q), got {y.shape}")
        check_consistent_length(X, y)
        if np.any(np.isinf(y)):
            raise ValueError("Input y contains infinity; targets must be finite or NaN "
                             "(a missing channel)")
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        if Y.shape[1] == 0:
            raise ValueError("y has no columns")
        check_target_values(Y)  # a spread float64 can hold (overflow, underflow)
        empty = np.flatnonzero(np.all(np.isnan(Y), axis=1))
        if empty.size:
            raise ValueError(
                f"{empty.size} row(s) of y have every channel missing (NaN), first at row(s) "
                f"{', '.join(str(r) for r in empty[:10])}; drop those rows (NaN marks a "
                "missing channel, at least one channel per row must be observed)")
        groups = check_groups(groups, X.shape[0], "fit")
        if labels is not None:
            groups = labels_from_column(groups, labels, self.client_column, "fit")
        return X, Y, y.ndim, groups

    # -- fit --------------------------------------------------------------------
    @keep_state_on_error
    def fit(self, X, y, groups=None):
        """Fit one exact LMC GP per client with FedAvg-averaged lengthscales.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Inputs (finite).
        y : array-like of shape (n_samples,) or (n_samples, Q)
            Targets; NaN marks a missing channel (masked out), inf is an
            error.
        groups : array-like of shape (n_samples,), default=None
            Client label of each row; None (and no ``client_column``): one
            client.

        Returns
        -------
        self : PFedGPRegressor

        Raises
        ------
        ValueError
            NaN/inf in ``X``, ``X`` not 2-D, inf in ``y``, ``y`` missing,
            not numeric or not of shape (n_samples,) or (n_samples, Q), a
            row of ``y`` with every channel NaN, targets whose spread float64
            cannot hold, inconsistent lengths, a ``groups`` of the wrong
            length, a missing or unhashable client label, labels of
            different types that look alike (``1`` and ``"1"``), a
            ``client_column`` that is not a column of ``X``, a client with
            fewer than 2 rows, with no observation of some channel, or with
            more than :data:`MAX_ENTRIES_PER_CLIENT` observed entries, or bad
            parameters (``n_latent``, ``n_rounds``, ``local_steps``, ``tol``,
            ``noise_variance``, ``verbose``, ``lengthscale``, or a
            ``lengthscale`` outside the range it is learned in), or a masked
            entry in ``X``, ``groups`` or a one-column ``y``.
        TypeError
            If ``X`` is sparse.
        FloatingPointError
            A non-finite likelihood or gradient during training.
        numpy.linalg.LinAlgError
            If a client's LMC covariance is not positive definite even with
            jitter (not expected above the noise floor of 1e-6 times the
            client's target variance).

        Notes
        -----
        On any error the estimator keeps its previous fitted state (or stays
        unfitted).
        """
        out = self._fit(X, y, groups)
        self.client_column_ = self.client_column
        return out

    def _fit(self, X, y, groups):
        """Body of :meth:`fit` (which restores the fitted state on error)."""
        R, n_rounds, steps = self._check_params()
        X, Y, y_ndim, groups = self._validate_fit_data(X, y, groups)
        if groups is None:
            groups = np.zeros(X.shape[0], dtype=int)
        check_label_types(groups, label_source(self.client_column))
        labels, inv = unique_labels(groups)
        counts = np.bincount(inv, minlength=len(labels))
        for lab, c in zip(labels, counts):
            if c < MIN_SAMPLES_PER_CLIENT:
                raise ValueError(f"client {lab!r} has {c} sample(s); at least "
                                 f"{MIN_SAMPLES_PER_CLIENT} samples per client are needed")
        if y_ndim == 1:  # exact copies of rows (the regressor's check and warning)
            _warn_copied_rows(X, Y[:, 0], inv, labels)
        Q = Y.shape[1]
        d = X.shape[1]
        # server: union box of the clients' per-feature minima and maxima
        lo = np.min([X[inv == k].min(0) for k in range(len(labels))], axis=0)
        hi = np.max([X[inv == k].max(0) for k in range(len(labels))], axis=0)
        x_offset, x_scale = input_scaling(*outer_box(lo, hi))
        ell = self._initial_lengthscale(R, d, x_scale)
        rng = check_random_state(self.random_state)
        clients = []
        for k, lab in enumerate(labels):
            clients.append(self._make_client(lab, (X[inv == k] - x_offset) / x_scale,
                                             Y[inv == k], R, rng))
        weights = [c.n_entries for c in clients]
        history, ell_hist, comm = [], [ell.copy()], []
        upload = len(clients) * ell.size * 8
        parallel = Parallel(n_jobs=self.n_jobs, prefer="threads")
        for rnd in range(n_rounds):
            out = parallel(delayed(_local_round)(c, ell, steps) for c in clients)
            clients = [c for c, _ in out]
            ell = fedavg_log_mean([e for _, e in out], weights)
            ell_hist.append(ell.copy())
            history.append(float(sum(c.lml for c in clients)))
            comm.append({"round": rnd + 1, "upload_bytes": upload,
                         "download_bytes": len(clients) * ell.size * 8})
            if self.verbose > 0:
                print(f"[PFedGPRegressor] round {rnd + 1}/{n_rounds}: "
                      f"sum LML {history[-1]:.3f}")
            if np.max(np.abs(np.log(ell_hist[-1]) - np.log(ell_hist[-2]))) <= self.tol:
                break
        clients = parallel(delayed(_refit)(c, ell) for c in clients)
        history.append(float(sum(c.lml for c in clients)))
        # success: commit the fitted state at once
        self.clients_ = {c.label: c for c in clients}
        self.x_offset_, self.x_scale_ = x_offset, x_scale
        self.n_features_model_ = d
        self.n_outputs_ = Q
        self._y_ndim = y_ndim
        self.lengthscale_unit_ = ell
        self.lengthscales_ = ell * x_scale
        self.loadings_ = {c.label: c.y_scale * c.B for c in clients}
        self.noise_variance_ = {c.label: c.y_scale**2 * c.noise_variance for c in clients}
        self.lml_history_ = history
        self.lengthscale_history_ = ell_hist
        self.communication_ = comm
        self.n_iter_ = len(ell_hist) - 1
        return self

    def _make_client(self, label, Xc, Yc, R, rng):
        Q = Yc.shape[1]
        n_obs = np.count_nonzero(~np.isnan(Yc), axis=0)
        if np.any(n_obs == 0):
            raise ValueError(
                f"client {label!r} has no observation of channel(s) "
                f"{np.flatnonzero(n_obs == 0).tolist()} (every value NaN); each client "
                "must observe every channel at least once")
        if n_obs.sum() > MAX_ENTRIES_PER_CLIENT:
            raise ValueError(
                f"client {label!r} has {n_obs.sum()} observed target entries ({Yc.shape[0]} "
                f"rows x {Q} channels); the exact GP of PFedGPRegressor is limited to "
                f"MAX_ENTRIES_PER_CLIENT = {MAX_ENTRIES_PER_CLIENT} per client "
                "(O((n_i Q)^3) cost); subsample the client or use "
                "FederatedHierarchicalGPRegressor")
        offset = np.nanmean(Yc, axis=0)
        centred = Yc - offset
        scale = float(np.sqrt(np.nanmean(centred**2)))
        if not np.isfinite(scale) or scale <= 0:
            scale = 1.0
        s2 = 0.1 if self.noise_variance is None else float(self.noise_variance) / scale**2
        s2 = float(np.clip(s2, np.exp(_LOG_NOISE_BOUNDS[0]) * 1.01,
                           np.exp(_LOG_NOISE_BOUNDS[1]) * 0.99))
        B = rng.normal(scale=np.sqrt(1.0 / R), size=(Q, R))
        return _Client(label, np.ascontiguousarray(Xc), centred / scale, offset, scale, B, s2)

    # -- prediction -------------------------------------------------------------
    def _validate_predict_X(self, X, groups, where):
        # the label column of the fit (validate_predict_input)
        return validate_predict_input(self, X, groups, where)

    def _population(self):
        """Average offsets (Q,), per-latent Q x Q loadings outer products, noise."""
        cs = list(self.clients_.values())
        offset = np.mean([c.y_offset for c in cs], axis=0)
        BB = np.mean([c.y_scale**2 * np.einsum("qr,pr->rqp", c.B, c.B) for c in cs], axis=0)
        s2 = float(np.mean([c.y_scale**2 * c.noise_variance for c in cs]))
        return offset, BB, s2

    def predict(self, X, groups=None, return_std=False, return_cov=False):
        """Predictive distribution of the targets for each row's client.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        groups : array-like of shape (n_samples,), default=None
            Client label of each row. None: the single fitted client or, with
            several, the population prior (with a :class:`ClientLabelWarning`);
            labels not seen in fit get the population prior (class Notes).
        return_std : bool, default=False
            Also return the predictive standard deviations (noise included).
        return_cov : bool, default=False
            Also return the predictive covariance (noise included): for 1-D
            ``y`` in fit the joint ``(n_samples, n_samples)`` covariance (rows
            of different clients are independent, zero); for 2-D ``y`` the
            per-input ``Q x Q`` blocks, shape (n_samples, Q, Q). The joint
            matrix takes ``8 n_samples^2`` bytes, at most
            :data:`skfedgp.regressor.MAX_COV_BYTES` (2 GiB, 16 384 rows; the
            budget of :class:`~skfedgp.FederatedHierarchicalGPRegressor`).

        Returns
        -------
        y_mean : ndarray of shape (n_samples,) or (n_samples, Q)
            Target units; 1-D exactly when ``y`` was 1-D in fit.
        y_std : ndarray, same shape as ``y_mean``, optional
        y_cov : ndarray of shape (n_samples, n_samples) or (n_samples, Q, Q), optional

        Raises
        ------
        ValueError
            Both ``return_std`` and ``return_cov``, NaN/inf in ``X``, ``X``
            not 2-D, wrong number of features or other column names than in
            fit, a ``groups`` of the wrong length, a missing or unhashable
            label.
        TypeError
            If ``X`` is sparse.
        FloatingPointError
            If the prediction is not finite.
        MemoryError
            If ``return_cov`` is set with 1-D ``y`` in fit and the joint
            ``(n_samples, n_samples)`` covariance would exceed
            :data:`skfedgp.regressor.MAX_COV_BYTES`; raised before anything
            of that size is allocated, with the memory needed.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        if return_std and return_cov:
            raise ValueError("only one of return_std and return_cov can be requested")
        check_is_fitted(self, "clients_")
        X, groups = self._validate_predict_X(X, groups, "predict")
        n, Q = X.shape[0], self.n_outputs_
        if return_cov and self._y_ndim == 1:
            _check_cov_budget(n)  # before anything n x n is allocated
        if groups is None:
            if len(self.clients_) == 1:
                groups = _object_array([next(iter(self.clients_))] * n)
            else:
                warnings.warn(
                    f"predict was called with groups=None on a PFedGPRegressor fitted with "
                    f"{len(self.clients_)} clients: every row gets the population prior "
                    "(average loadings and channel means), not any client's posterior. Pass "
                    "groups= to predict for fitted clients.", ClientLabelWarning,
                    stacklevel=user_stacklevel())
                groups = np.array([_UNSEEN] * n, dtype=object)
            labels, inv = unique_labels(groups)  # no user label to match
        else:  # True is not client 1 (nor 1 client True), though True == 1
            labels, inv = match_labels(
                groups, self.clients_, "predict",
                population="the population prior: the clients' averaged means and loadings")
        Xs = (X - self.x_offset_) / self.x_scale_
        mean = np.zeros((n, Q))
        blocks = np.zeros((n, Q, Q))
        joint = np.zeros((n, n)) if (return_cov and self._y_ndim == 1) else None
        with single_threaded_blas():
            for k, lab in enumerate(labels):
                idx = np.flatnonzero(inv == k)
                c = self.clients_.get(lab) if lab is not _UNSEEN else None
                m, S, J = self._predict_client(c, Xs[idx], joint is not None)
                mean[idx], blocks[idx] = m, S
                if joint is not None:
                    joint[np.ix_(idx, idx)] = J
        if not np.all(np.isfinite(mean)) or not np.all(np.isfinite(blocks)):
            raise FloatingPointError("prediction produced non-finite values")
        if self._y_ndim == 1:
            mean = mean[:, 0]
            if return_std:
                return mean, np.sqrt(blocks[:, 0, 0])
            if return_cov:
                return mean, joint
            return mean
        if return_std:
            return mean, np.sqrt(np.diagonal(blocks, axis1=1, axis2=2))
        if return_cov:
            return mean, blocks
        return mean

    def _predict_client(self, c, Xs, want_joint):
        """Mean (n, Q), blocks (n, Q, Q) and, for Q = 1, the joint (n, n): target units."""
        ell = self.lengthscale_unit_
        n, Q = Xs.shape[0], self.n_outputs_
        R = ell.shape[0]
        if c is None:
            offset, BB, s2 = self._population()
            mean = np.tile(offset, (n, 1))
            blocks = np.broadcast_to(BB.sum(0) + s2 * np.eye(Q), (n, Q, Q)).copy()
            J = None
            if want_joint:
                J = sum(BB[r, 0, 0] * np.exp(-0.5 * _sq_dist(Xs, Xs, ell[r]))
                        for r in range(R)) + s2 * np.eye(n)
            return mean, blocks, J
        rows, qe, _ = c.entries
        Xe = c.X[rows]
        # test entries: every channel at every test input, input-major
        mean = np.empty((n, Q))
        blocks = np.empty((n, Q, Q))
        prior = sum(np.einsum("q,p->qp", c.B[:, r], c.B[:, r]) for r in range(R))
        prior = prior + c.noise_variance * np.eye(Q)
        step = max(1, 2048 // Q)
        for start in range(0, n, step):
            sl = slice(start, min(n, start + step))
            Kfs = np.zeros((Xe.shape[0], sl.stop - sl.start, Q))
            for r in range(R):
                k = np.exp(-0.5 * _sq_dist(Xe, Xs[sl], ell[r]))
                Kfs += (c.B[qe, r][:, None, None] * k[:, :, None]) * c.B[None, None, :, r]
            Kf = Kfs.reshape(Xe.shape[0], -1)
            mean[sl] = (Kf.T @ c.alpha).reshape(-1, Q)
            V = solve_triangular(c.L, Kf, lower=True, check_finite=False).reshape(
                Xe.shape[0], -1, Q)
            blocks[sl] = prior - np.einsum("mjq,mjp->jqp", V, V)
        J = None
        if want_joint:  # Q == 1
            Kfs = sum(c.B[qe, r][:, None] * c.B[0, r] * np.exp(-0.5 * _sq_dist(Xe, Xs, ell[r]))
                      for r in range(R))
            V = solve_triangular(c.L, Kfs, lower=True, check_finite=False)
            Kss = sum(c.B[0, r] ** 2 * np.exp(-0.5 * _sq_dist(Xs, Xs, ell[r]))
                      for r in range(R))
            J = (Kss - V.T @ V + c.noise_variance * np.eye(n)) * c.y_scale**2
        return c.y_offset + c.y_scale * mean, c.y_scale**2 * blocks, J

    def score(self, X, y, groups=None, sample_weight=None):
        """R^2 of :meth:`predict` (uniform average over channels for 2-D ``y``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, Q)
            NaN entries (channels not recorded) are left out: each
            channel's R^2 on its observed rows.
        groups : array-like of shape (n_samples,), default=None
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        score : float

        Raises
        ------
        ValueError
            As :meth:`predict`, or if ``y`` or ``sample_weight`` does not
            match ``X`` in length, a 1-D ``y`` holds NaN, or a channel of a
            2-D ``y`` has no observed entry.
        TypeError
            If ``X`` is sparse.
        FloatingPointError
            If the prediction is not finite.
        sklearn.exceptions.NotFittedError
            Before fit.
        """
        y_pred = self.predict(X, groups)
        y = unmask(y, "y", missing_ok=_n_target_columns(y) > 1)
        return r2_observed(y, y_pred, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = True
        return tags

