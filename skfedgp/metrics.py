"""Evaluation metrics for probabilistic (federated) GP regression.

The metrics follow the evaluation protocol of the pFedHGP paper, section 4.5
(equations 43--50). The paper averages every metric over clients
``i = 1..T``; the functions here compute the value for **one** client (one
set of test points). To reproduce the paper's client-averaged numbers, call a
function once per client and average the results, e.g.::

    np.mean([rmse(y[g == i], mu[g == i]) for i in np.unique(g)])

Conventions
-----------
* ``y_true`` and the predictive arrays have shape ``(n,)`` (single output)
  or ``(n, Q)`` (``Q`` outputs). Shapes must agree exactly; nothing is
  broadcast or silently raveled.
* Predictive standard deviations (``y_std``) are in the units of ``y``; they
  must be strictly positive. Variances are never accepted in their place.
* Every input must be finite. Violations raise :class:`ValueError` with a
  message naming the offending argument.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

__all__ = [
    "rmse",
    "smse",
    "gaussian_nll",
    "crps_gaussian",
    "coverage",
    "interval_width",
    "output_covariance",
    "covariance_error",
    "regression_report",
]

_LOG_2PI = float(np.log(2.0 * np.pi))
_INV_SQRT_PI = float(1.0 / np.sqrt(np.pi))


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------
def _as_array(a, name, *, ndims=(1, 2)):
    """Convert ``a`` to a finite float64 array with an allowed ``ndim``."""
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of numbers: {exc}") from exc
    if arr.ndim not in ndims:
        allowed = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(
            f"{name} must be {allowed}, got an array of shape {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        n_bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} contains {n_bad} non-finite value(s) (NaN or inf)")
    return arr


def _check_same_shape(a, a_name, b, b_name):
    if a.shape != b.shape:
        raise ValueError(
            f"shape mismatch: {a_name} has shape {a.shape} but {b_name} has "
            f"shape {b.shape}"
        )


def _check_std(y_std, shape, name="y_std"):
    std = _as_array(y_std, name)
    if std.shape != shape:
        raise ValueError(
            f"shape mismatch: {name} has shape {std.shape} but y_true has "
            f"shape {shape}"
        )
    if np.any(std <= 0.0):
        raise ValueError(
            f"{name} must be strictly positive; found {int(np.sum(std <= 0))} "
            f"value(s) <= 0 (min {std.min():g})"
        )
    return std


def _check_level(level):
    level = float(level)
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie strictly between 0 and 1, got {level!r}")
    return level


def _pair(y_true, y_pred, pred_name="y_pred"):
    y = _as_array(y_true, "y_true")
    p = _as_array(y_pred, pred_name)
    _check_same_shape(y, "y_true", p, pred_name)
    return y, p


# ---------------------------------------------------------------------------
# point metrics
# ---------------------------------------------------------------------------
def rmse(y_true, y_pred):
    r"""Root mean squared error of a point prediction (pFedHGP eq. 43).

    .. math::

        \mathrm{RMSE} = \Big\{ \frac{1}{n Q} \sum_{j=1}^{n}
            \lVert y_j - \hat\mu_j \rVert_2^2 \Big\}^{1/2}

    This is the inner term of eq. 43 for one client; the paper reports the
    mean of this value over clients.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_pred : array-like of the same shape as ``y_true``
        Predicted values (for example the predictive mean).

    Returns
    -------
    float
        RMSE, in the units of ``y``.

    Raises
    ------
    ValueError
        If the shapes differ, an array is empty, not 1-D/2-D, or holds a
        non-finite value.
    """
    y, p = _pair(y_true, y_pred)
    return float(np.sqrt(np.mean((y - p) ** 2)))


def smse(y_true, y_pred):
    r"""Standardised mean squared error.

    ``SMSE = MSE / Var(y_true)`` with the population variance (``ddof=0``) of
    the test targets, so predicting the test mean everywhere scores 1 and a
    perfect prediction scores 0 (Rasmussen & Williams 2006, sec. 2.5). For
    ``(n, Q)`` targets each output is standardised by its own variance and the
    ``Q`` ratios are averaged, so outputs on different scales weigh equally.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_pred : array-like of the same shape as ``y_true``
        Predicted values.

    Returns
    -------
    float
        Dimensionless SMSE.

    Raises
    ------
    ValueError
        On a shape mismatch, non-finite values, or if an output of ``y_true``
        is constant (zero variance, SMSE undefined).
    """
    y, p = _pair(y_true, y_pred)
    var = np.var(y, axis=0)
    if np.any(var <= 0.0):
        raise ValueError(
            "y_true has zero variance (constant output); SMSE is undefined"
        )
    mse = np.mean((y - p) ** 2, axis=0)
    return float(np.mean(mse / var))


# ---------------------------------------------------------------------------
# probabilistic metrics
# ---------------------------------------------------------------------------
def gaussian_nll(y_true, y_mean, y_std=None, *, y_cov=None):
    r"""Mean negative log predictive density of a Gaussian prediction (eq. 44).

    Exactly one of ``y_std`` and ``y_cov`` must be given.

    * ``y_std`` (marginal Gaussians): each output is scored independently,

      .. math:: -\log p(y_{jq}) = \tfrac12 \log(2\pi\sigma_{jq}^2)
                 + \tfrac12 (y_{jq} - \mu_{jq})^2 / \sigma_{jq}^2 .

    * ``y_cov`` (full ``Q x Q`` blocks, eq. 44): for each test input ``j``

      .. math:: -\log p(\mathbf y_j) = \tfrac12 \big[ Q \log 2\pi
                 + \log|\Sigma_j| + (\mathbf y_j - \boldsymbol\mu_j)^\top
                 \Sigma_j^{-1} (\mathbf y_j - \boldsymbol\mu_j) \big],

      evaluated through the Cholesky factor of each block.

    In both cases the value is summed over the ``Q`` outputs of a test input
    and averaged over the ``n`` test inputs ("per point" = per input), so a
    diagonal ``y_cov`` gives the same number as the matching ``y_std``. For
    single-output data this is the usual mean NLL per observation. Units: nats
    (natural logarithm); the value depends on the units of ``y``.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Predictive means.
    y_std : array-like of the same shape as ``y_true``, optional
        Marginal predictive standard deviations (strictly positive).
    y_cov : array-like of shape (n, Q, Q), keyword-only, optional
        Full predictive covariance block at every test input (symmetric
        positive definite). With 1-D ``y_true`` it must have shape
        ``(n, 1, 1)``.

    Returns
    -------
    float
        Mean negative log predictive density per test input, in nats.

    Raises
    ------
    ValueError
        If both or neither of ``y_std``/``y_cov`` are given, shapes disagree,
        a value is non-finite, a standard deviation is not positive, or a
        covariance block is not symmetric positive definite.
    """
    if (y_std is None) == (y_cov is None):
        raise ValueError("give exactly one of y_std and y_cov")
    y, mu = _pair(y_true, y_mean, "y_mean")
    if y_std is not None:
        std = _check_std(y_std, y.shape)
        z = (y - mu) / std
        nll = 0.5 * _LOG_2PI + np.log(std) + 0.5 * z**2
        if nll.ndim == 2:
            nll = nll.sum(axis=1)
        return float(np.mean(nll))

    cov = _as_array(y_cov, "y_cov", ndims=(3,))
    resid = y if y.ndim == 2 else y[:, None]
    resid = resid - (mu if mu.ndim == 2 else mu[:, None])
    n, q = resid.shape
    if cov.shape != (n, q, q):
        raise ValueError(
            f"shape mismatch: y_cov has shape {cov.shape}, expected "
            f"({n}, {q}, {q}) for y_true of shape {y.shape}"
        )
    scale = np.maximum(np.abs(cov).max(axis=(1, 2)), np.finfo(float).tiny)
    asym = np.abs(cov - np.swapaxes(cov, 1, 2)).max(axis=(1, 2)) / scale
    if np.any(asym > 1e-8):
        bad = int(np.argmax(asym))
        raise ValueError(f"y_cov[{bad}] is not symmetric")
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError as exc:
        raise ValueError(
            "y_cov is not positive definite (Cholesky failed for at least one "
            "block)"
        ) from exc
    # solve L a = r for each block; |Sigma| = prod diag(L)^2
    alpha = np.linalg.solve(chol, resid[:, :, None])[:, :, 0]
    logdet = 2.0 * np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    nll = 0.5 * (q * _LOG_2PI + logdet + np.sum(alpha**2, axis=1))
    return float(np.mean(nll))


def crps_gaussian(y_true, y_mean, y_std):
    r"""Continuous ranked probability score of Gaussian marginals (eq. 45).

    Closed form (Gneiting & Raftery 2007): with
    ``z = (y - mu) / sigma``,

    .. math:: \mathrm{CRPS} = \sigma \big[ z\{2\Phi(z) - 1\} + 2\varphi(z)
              - 1/\sqrt{\pi} \big],

    which equals :math:`\int (F(x) - \mathbb 1\{x \ge y\})^2 \, dx` for the
    Gaussian CDF ``F``. Averaged over all ``n * Q`` entries (lower is better).

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Marginal predictive means.
    y_std : array-like of the same shape as ``y_true``
        Marginal predictive standard deviations (strictly positive).

    Returns
    -------
    float
        Mean CRPS, in the units of ``y``.

    Raises
    ------
    ValueError
        On a shape mismatch, non-finite values or non-positive ``y_std``.
    """
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _check_std(y_std, y.shape)
    z = (y - mu) / std
    crps = std * (z * (2.0 * norm.cdf(z) - 1.0) + 2.0 * norm.pdf(z) - _INV_SQRT_PI)
    return float(np.mean(crps))


def coverage(y_true, y_mean, y_std, level=0.95):
    r"""Empirical coverage of the central predictive interval (eq. 46).

    Fraction of entries with :math:`|y - \mu| \le z_{\alpha}\sigma`, where
    ``z_alpha = scipy.stats.norm.ppf(0.5 + level / 2)`` (1.95996... for
    ``level=0.95``). A calibrated model has coverage close to ``level``.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Marginal predictive means.
    y_std : array-like of the same shape as ``y_true``
        Marginal predictive standard deviations (strictly positive).
    level : float, default=0.95
        Nominal probability of the central interval, in (0, 1).

    Returns
    -------
    float
        Fraction in [0, 1] of the ``n * Q`` entries inside the interval.

    Raises
    ------
    ValueError
        On a shape mismatch, non-finite values, non-positive ``y_std`` or a
        ``level`` outside (0, 1).
    """
    level = _check_level(level)
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _check_std(y_std, y.shape)
    z = norm.ppf(0.5 + 0.5 * level)
    return float(np.mean(np.abs(y - mu) <= z * std))


def interval_width(y_std, level=0.95):
    r"""Mean width of the central predictive interval (eq. 47).

    ``mean(2 * z_alpha * y_std)`` with ``z_alpha = norm.ppf(0.5 + level / 2)``.
    Lower is sharper; compare only at similar coverage.

    Parameters
    ----------
    y_std : array-like of shape (n,) or (n, Q)
        Marginal predictive standard deviations (strictly positive).
    level : float, default=0.95
        Nominal probability of the central interval, in (0, 1).

    Returns
    -------
    float
        Mean interval width, in the units of ``y``.

    Raises
    ------
    ValueError
        On non-finite or non-positive ``y_std`` or a ``level`` outside (0, 1).
    """
    level = _check_level(level)
    std = _as_array(y_std, "y_std")
    std = _check_std(std, std.shape)
    z = norm.ppf(0.5 + 0.5 * level)
    return float(np.mean(2.0 * z * std))


# ---------------------------------------------------------------------------
# covariance recovery
# ---------------------------------------------------------------------------
def output_covariance(y_mean, y_cov=None, *, noise_var=0.0):
    r"""Output covariance implied over a test grid (eqs. 48 and 49).

    .. math:: \hat\Sigma_y = \mathrm{Cov}_{x \in \mathcal X}\{\mu(x)\}
              + \frac1n \sum_j \Sigma_j + \sigma^2 I_Q

    * Eq. 49 (model-implied): pass the predictive means and the predictive
      ``Q x Q`` blocks ``y_cov``; leave ``noise_var=0`` (the blocks already
      contain the noise when they are predictive covariances of ``y``).
    * Eq. 48 (ground truth): pass the clean function values as ``y_mean``,
      no ``y_cov``, and the simulation noise variance as ``noise_var``.

    The covariance over the grid is the population covariance (``ddof=0``):
    the test grid is treated as the whole (empirical) input distribution.

    Parameters
    ----------
    y_mean : array-like of shape (n, Q)
        Predictive means (or clean function values) at ``n`` test inputs.
    y_cov : array-like of shape (n, Q, Q), optional
        Predictive covariance blocks at the same inputs.
    noise_var : float, default=0.0
        Non-negative variance added to the diagonal.

    Returns
    -------
    ndarray of shape (Q, Q)
        The implied output covariance.

    Raises
    ------
    ValueError
        On shape mismatches, non-finite values or a negative ``noise_var``.
    """
    mu = _as_array(y_mean, "y_mean", ndims=(2,))
    n, q = mu.shape
    centred = mu - mu.mean(axis=0)
    sigma = centred.T @ centred / n
    if y_cov is not None:
        cov = _as_array(y_cov, "y_cov", ndims=(3,))
        if cov.shape != (n, q, q):
            raise ValueError(
                f"shape mismatch: y_cov has shape {cov.shape}, expected "
                f"({n}, {q}, {q}) for y_mean of shape {mu.shape}"
            )
        sigma = sigma + cov.mean(axis=0)
    noise_var = float(noise_var)
    if not np.isfinite(noise_var) or noise_var < 0:
        raise ValueError(f"noise_var must be finite and >= 0, got {noise_var!r}")
    return sigma + noise_var * np.eye(q)


def covariance_error(cov_pred, cov_true):
    r"""Relative Frobenius error of output covariances, CovErr (eq. 50).

    .. math:: \mathrm{CovErr} = \frac1T \sum_{i=1}^T
              \frac{\lVert \hat\Sigma_{y,i} - \Sigma^{true}_{y,i} \rVert_F}
                   {\lVert \Sigma^{true}_{y,i} \rVert_F}

    Build the matrices with :func:`output_covariance` (eqs. 48--49).

    Parameters
    ----------
    cov_pred : array-like of shape (Q, Q) or (T, Q, Q)
        Model-implied output covariance(s), one per client.
    cov_true : array-like of the same shape as ``cov_pred``
        Ground-truth output covariance(s).

    Returns
    -------
    float
        The relative error, averaged over the leading (client) axis when the
        inputs are 3-D. Dimensionless; 0 is a perfect recovery.

    Raises
    ------
    ValueError
        On a shape mismatch, non-square matrices, non-finite values or a
        ``cov_true`` with zero Frobenius norm.
    """
    pred = _as_array(cov_pred, "cov_pred", ndims=(2, 3))
    true = _as_array(cov_true, "cov_true", ndims=(2, 3))
    if pred.shape != true.shape:
        raise ValueError(
            f"shape mismatch: cov_pred has shape {pred.shape} but cov_true has "
            f"shape {true.shape}"
        )
    if pred.shape[-1] != pred.shape[-2]:
        raise ValueError(f"covariance matrices must be square, got shape {pred.shape}")
    if pred.ndim == 2:
        pred, true = pred[None], true[None]
    denom = np.linalg.norm(true, ord="fro", axis=(1, 2))
    if np.any(denom == 0.0):
        raise ValueError("cov_true has a zero Frobenius norm; relative error undefined")
    num = np.linalg.norm(pred - true, ord="fro", axis=(1, 2))
    return float(np.mean(num / denom))


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def regression_report(y_true, y_mean, y_std):
    """All scalar regression metrics for one client in a dictionary.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Predictive means.
    y_std : array-like of the same shape as ``y_true``
        Marginal predictive standard deviations (strictly positive).

    Returns
    -------
    dict
        ``{"RMSE": rmse, "SMSE": smse, "NLL": marginal gaussian_nll,
        "CRPS": crps_gaussian, "coverage_95": coverage at 0.95,
        "width_95": interval_width at 0.95}``, all Python floats. See the
        individual functions for definitions (pFedHGP eqs. 43--47).

    Raises
    ------
    ValueError
        As the individual metrics (shape mismatch, non-finite values,
        non-positive ``y_std``, constant ``y_true``).
    """
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _check_std(y_std, y.shape)
    return {
        "RMSE": rmse(y, mu),
        "SMSE": smse(y, mu),
        "NLL": gaussian_nll(y, mu, std),
        "CRPS": crps_gaussian(y, mu, std),
        "coverage_95": coverage(y, mu, std, level=0.95),
        "width_95": interval_width(std, level=0.95),
    }
