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
* Every function that takes marginal standard deviations also accepts the
  full predictive ``Q x Q`` blocks instead, as the keyword ``y_cov`` of shape
  ``(n, Q, Q)`` (``(n, 1, 1)`` for 1-D targets); the marginal standard
  deviations are then ``sqrt(diag(y_cov[j]))``. Give exactly one of the two.
  Only :func:`gaussian_nll` uses the off-diagonal entries (eq. 44); the
  marginal metrics (CRPS, coverage, width, ECE) are per-channel by
  definition (eqs. 45--47).
* Every input must be finite, real and numeric: complex values (whose
  imaginary part would otherwise be dropped) and strings are rejected.
  Violations raise :class:`ValueError` with a message naming the offending
  argument.
* Large-but-finite inputs (e.g. 1e200) are handled without overflow: sums
  of squares are taken in units of the largest value. A metric whose value
  itself is not representable in float64 raises :class:`ValueError`
  ("... overflowed float64 ..."), never returns NaN or inf.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from ._validation import unmask

__all__ = [
    "rmse",
    "smse",
    "gaussian_nll",
    "crps_gaussian",
    "coverage",
    "interval_width",
    "expected_calibration_error",
    "DEFAULT_CALIBRATION_LEVELS",
    "output_covariance",
    "covariance_error",
    "regression_report",
]

_LOG_2PI = float(np.log(2.0 * np.pi))
_INV_SQRT_PI = float(1.0 / np.sqrt(np.pi))

#: Default grid of nominal central-interval levels for
#: :func:`expected_calibration_error`: 0.01, 0.02, ..., 0.99 (99 levels).
DEFAULT_CALIBRATION_LEVELS = np.round(np.arange(1, 100) / 100.0, 2)
DEFAULT_CALIBRATION_LEVELS.setflags(write=False)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------
def _check_real_numbers(a, name):
    """Reject complex and non-numeric (string, bytes, object) input by name.

    ``np.asarray(..., dtype=float)`` would silently drop an imaginary part
    (with only a ComplexWarning) and parse strings such as ``"1"``.
    """
    a = unmask(a, name)  # asarray would read the values under a mask
    try:
        raw = np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of numbers: {exc}") from exc
    kind = raw.dtype.kind
    if kind == "O":
        flat = raw.reshape(-1)
        if any(isinstance(v, (complex, np.complexfloating)) for v in flat):
            kind = "c"
        elif any(isinstance(v, (str, bytes, np.str_, np.bytes_)) for v in flat):
            kind = "U"
    if kind == "c":
        raise ValueError(
            f"{name} holds complex values; the metrics need real numbers (pass the "
            "real part explicitly if the imaginary part is meant to be dropped)")
    if kind in "USV":
        raise ValueError(
            f"{name} must be an array of real numbers, got {raw.dtype.name} "
            "(strings or bytes); convert them to numbers first")
    return raw


def _as_array(a, name, *, ndims=(1, 2)):
    """Convert ``a`` to a finite float64 array with an allowed ``ndim``."""
    raw = _check_real_numbers(a, name)
    try:
        arr = np.asarray(raw, dtype=np.float64)
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
    if isinstance(level, (str, bytes)):
        raise ValueError(f"level must be a number strictly between 0 and 1, got {level!r}")
    try:
        level = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"level must be a number strictly between 0 and 1, got {level!r}") \
            from None
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie strictly between 0 and 1, got {level!r}")
    return level


def _check_cov_blocks(y_cov, y_shape, y_name="y_true"):
    """Validate ``(n, Q, Q)`` predictive blocks for targets of ``y_shape``.

    Returns the blocks as float64; 1-D targets of shape ``(n,)`` need blocks
    of shape ``(n, 1, 1)``. Raises ValueError on a wrong shape, non-finite
    values or an asymmetric block.
    """
    cov = _as_array(y_cov, "y_cov", ndims=(3,))
    n = y_shape[0]
    q = y_shape[1] if len(y_shape) == 2 else 1
    if cov.shape != (n, q, q):
        raise ValueError(
            f"shape mismatch: y_cov has shape {cov.shape}, expected "
            f"({n}, {q}, {q}) for {y_name} of shape {tuple(y_shape)}"
        )
    scale = np.maximum(np.abs(cov).max(axis=(1, 2)), np.finfo(float).tiny)
    with np.errstate(over="ignore"):  # |a - b| of two values near 1e308
        asym = np.abs(cov - np.swapaxes(cov, 1, 2)).max(axis=(1, 2)) / scale
    if np.any(asym > 1e-8):
        bad = int(np.argmax(asym))
        raise ValueError(f"y_cov[{bad}] is not symmetric")
    return cov


def _check_cov_psd(cov):
    """Raise ValueError unless every symmetric block of ``cov`` is positive semi-definite.

    A block counts as PSD if its smallest eigenvalue is at least ``-1e-10``
    times its largest absolute entry (round-off of a singular block).
    """
    diag = np.diagonal(cov, axis1=1, axis2=2)
    if np.any(diag < 0.0):
        bad = int(np.flatnonzero((diag < 0.0).any(axis=1))[0])
        raise ValueError(
            f"y_cov[{bad}] has a negative diagonal entry (a negative variance); "
            "the blocks must be covariance matrices (symmetric positive semi-definite)")
    scale = np.maximum(np.abs(cov).max(axis=(1, 2)), np.finfo(float).tiny)
    eig_min = np.linalg.eigvalsh(cov / scale[:, None, None])[:, 0]
    if np.any(eig_min < -1e-10):
        bad = int(np.argmin(eig_min))
        raise ValueError(
            f"y_cov[{bad}] is not positive semi-definite (smallest eigenvalue "
            f"{eig_min[bad] * scale[bad]:.3g}); the blocks must be covariance matrices")


def _overflow_error(what, y, name="y_true"):
    """The ValueError for a metric whose value is not representable in float64.

    ``y`` is the input whose largest magnitude the message gives, ``name``
    its name in the message.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        big = float(np.max(np.abs(y)))
    return ValueError(
        f"{what} overflowed float64 (largest |{name}| = {big:.3g}); rescale the "
        "targets and predictions")


def _finite(value, what, y, name="y_true"):
    """``float(value)``, or :func:`_overflow_error` if it is not finite."""
    value = float(value)
    if not np.isfinite(value):
        raise _overflow_error(what, y, name)
    return value


def _half_diff(a, b):
    """``(a - b) / 2`` without overflow (the difference of two values near 1e308)."""
    return 0.5 * a - 0.5 * b


def _marginal_std(y_std, y_cov, y_shape):
    """Marginal standard deviations from exactly one of ``y_std``/``y_cov``."""
    if (y_std is None) == (y_cov is None):
        raise ValueError("give exactly one of y_std and y_cov")
    if y_std is not None:
        return _check_std(y_std, tuple(y_shape))
    cov = _check_cov_blocks(y_cov, y_shape)
    var = np.diagonal(cov, axis1=1, axis2=2)
    if np.any(var <= 0.0):
        raise ValueError(
            "the diagonal of y_cov (marginal variances) must be strictly "
            f"positive; found {int(np.sum(var <= 0))} value(s) <= 0"
        )
    return np.sqrt(var).reshape(y_shape)


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
        If the shapes differ, an array is empty, not 1-D/2-D, holds a
        complex, non-numeric or non-finite value, or if the RMSE itself
        exceeds the float64 range.
    """
    y, p = _pair(y_true, y_pred)
    # scaled by the largest |residual| so large-but-finite values neither
    # overflow (1e200 ** 2) nor small ones underflow before the square root
    h = _half_diff(y, p)
    s = float(np.max(np.abs(h)))
    if s == 0.0:
        return 0.0
    with np.errstate(over="ignore"):
        return _finite(2.0 * (s * np.sqrt(np.mean((h / s) ** 2))), "RMSE", y)


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
        On a shape mismatch, an empty array or one that is not 1-D/2-D,
        complex, non-numeric or non-finite values, if an output of
        ``y_true`` is constant (zero variance, SMSE undefined), or if the
        SMSE itself exceeds the float64 range.
    """
    y, p = _pair(y_true, y_pred)
    # per output: Var(y) in units of s = max|y| and the MSE in units of
    # t = max|y - p| / 2, so values near 1e200 neither overflow nor underflow
    s = np.max(np.abs(y), axis=0)
    var = np.var(y / np.where(s > 0.0, s, 1.0), axis=0)
    if np.any(var <= 0.0):
        raise ValueError(
            "y_true has zero variance (constant output); SMSE is undefined"
        )
    h = _half_diff(y, p)
    t = np.max(np.abs(h), axis=0)
    mse = np.mean((h / np.where(t > 0.0, t, 1.0)) ** 2, axis=0)
    with np.errstate(over="ignore", under="ignore"):
        ratio = mse / var * ((t / s) * 2.0) ** 2
        return _finite(np.mean(ratio), "SMSE", y)


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
        an array is empty or of the wrong number of dimensions (1-D/2-D,
        ``y_cov`` 3-D), a value is complex, non-numeric or non-finite, a
        standard deviation is not positive, a covariance block is not
        symmetric positive definite, or the NLL itself exceeds the float64
        range.
    """
    if (y_std is None) == (y_cov is None):
        raise ValueError("give exactly one of y_std and y_cov")
    y, mu = _pair(y_true, y_mean, "y_mean")
    if y_std is not None:
        std = _check_std(y_std, y.shape)
        with np.errstate(over="ignore"):
            z = _half_diff(y, mu) / std * 2.0
            nll = 0.5 * _LOG_2PI + np.log(std) + 0.5 * z**2
            if nll.ndim == 2:
                nll = nll.sum(axis=1)
            value = float(np.mean(nll))
        if not np.isfinite(value):
            # the square of a standardised error overflowed: name it, not
            # only |y_true| (a y_std of 1e-200 with errors near 1 blamed
            # targets of size 1)
            with np.errstate(over="ignore", invalid="ignore"):
                big = float(np.max(np.abs(y)))
            raise ValueError(
                f"NLL overflowed float64 (largest |y_true - y_mean| / y_std = "
                f"{float(np.max(np.abs(z))):.3g}, smallest y_std = {float(np.min(std)):.3g}, "
                f"largest |y_true| = {big:.3g}): the standard deviations are too small for the "
                "errors; check y_std, or rescale the targets and predictions")
        return value

    cov = _check_cov_blocks(y_cov, y.shape)
    resid = y if y.ndim == 2 else y[:, None]
    with np.errstate(over="ignore"):  # an infinite residual: the NLL's own overflow error
        resid = resid - (mu if mu.ndim == 2 else mu[:, None])
    q = resid.shape[1]
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError as exc:
        raise ValueError(
            "y_cov is not positive definite (Cholesky failed for at least one "
            "block)"
        ) from exc
    # solve L a = r for each block; |Sigma| = prod diag(L)^2
    with np.errstate(over="ignore", invalid="ignore"):
        alpha = np.linalg.solve(chol, resid[:, :, None])[:, :, 0]
        logdet = 2.0 * np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
        nll = 0.5 * (q * _LOG_2PI + logdet + np.sum(alpha**2, axis=1))
        return _finite(np.mean(nll), "NLL", y)


def crps_gaussian(y_true, y_mean, y_std=None, *, y_cov=None):
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
    y_std : array-like of the same shape as ``y_true``, optional
        Marginal predictive standard deviations (strictly positive).
    y_cov : array-like of shape (n, Q, Q), keyword-only, optional
        Predictive ``Q x Q`` blocks instead of ``y_std``; only their
        diagonals (the marginal variances) are used.

    Returns
    -------
    float
        Mean CRPS, in the units of ``y``.

    Raises
    ------
    ValueError
        On a shape mismatch, an empty array or one of the wrong number of
        dimensions (1-D/2-D, ``y_cov`` 3-D), complex, non-numeric or
        non-finite values, non-positive ``y_std`` (or diagonal of
        ``y_cov``), an asymmetric block, if both or neither of
        ``y_std``/``y_cov`` are given, or if the CRPS itself exceeds the
        float64 range.
    """
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _marginal_std(y_std, y_cov, y.shape)
    # z (2 Phi(z) - 1) = |z| (2 Phi(|z|) - 1), so with d = y - mu
    # CRPS = |d| (2 Phi(|z|) - 1) + sigma (2 phi(z) - 1/sqrt(pi)), which stays
    # finite as |z| -> inf; |d| / 2 and sigma / 2 are taken in units of their
    # largest value so entries near 1e300 do not overflow.
    h = np.abs(_half_diff(y, mu))
    sh = 0.5 * std
    s = float(max(np.max(h), np.max(sh)))
    # divide: a subnormal sigma halves to 0, z = inf (the limit is right)
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        z = h / sh
        crps = (h / s) * (2.0 * norm.cdf(z) - 1.0) + (sh / s) * (
            2.0 * norm.pdf(z) - _INV_SQRT_PI)
        return _finite(2.0 * (s * np.mean(crps)), "CRPS", y)


def coverage(y_true, y_mean, y_std=None, level=0.95, *, y_cov=None):
    r"""Empirical coverage of the central predictive interval (eq. 46).

    Fraction of entries with :math:`|y - \mu| \le z_{\alpha}\sigma`, where
    ``z_alpha = scipy.stats.norm.ppf(0.5 + level / 2)`` (1.95996... for
    ``level=0.95``). A calibrated model has coverage close to ``level``.
    With ``(n, Q)`` targets every channel is one entry (marginal intervals,
    as in eq. 46), so the fraction is over all ``n * Q`` entries.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Marginal predictive means.
    y_std : array-like of the same shape as ``y_true``, optional
        Marginal predictive standard deviations (strictly positive).
    level : float, default=0.95
        Nominal probability of the central interval, in (0, 1).
    y_cov : array-like of shape (n, Q, Q), keyword-only, optional
        Predictive ``Q x Q`` blocks instead of ``y_std`` (diagonals used).

    Returns
    -------
    float
        Fraction in [0, 1] of the ``n * Q`` entries inside the interval.

    Raises
    ------
    ValueError
        On a shape mismatch, an empty array or one of the wrong number of
        dimensions (1-D/2-D, ``y_cov`` 3-D), complex, non-numeric or
        non-finite values, non-positive ``y_std`` (or diagonal of
        ``y_cov``), an asymmetric block of ``y_cov``, a ``level`` that is
        not a number in (0, 1), or if both or neither of ``y_std``/``y_cov``
        are given.
    """
    level = _check_level(level)
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _marginal_std(y_std, y_cov, y.shape)
    z = norm.ppf(0.5 + 0.5 * level)
    with np.errstate(over="ignore"):  # |y - mu| beyond float64 is outside any interval
        return float(np.mean(np.abs(y - mu) <= z * std))


def interval_width(y_std=None, level=0.95, *, y_cov=None):
    r"""Mean width of the central predictive interval (eq. 47).

    ``mean(2 * z_alpha * y_std)`` with ``z_alpha = norm.ppf(0.5 + level / 2)``.
    Lower is sharper; compare only at similar coverage.

    Parameters
    ----------
    y_std : array-like of shape (n,) or (n, Q), optional
        Marginal predictive standard deviations (strictly positive).
    level : float, default=0.95
        Nominal probability of the central interval, in (0, 1).
    y_cov : array-like of shape (n, Q, Q), keyword-only, optional
        Predictive ``Q x Q`` blocks instead of ``y_std``; the width is then
        averaged over all ``n * Q`` marginal intervals.

    Returns
    -------
    float
        Mean interval width, in the units of ``y``.

    Raises
    ------
    ValueError
        On non-finite or non-positive ``y_std``, a ``y_std`` that is empty,
        not 1-D/2-D, complex or non-numeric, a ``y_cov`` that is empty or
        not 3-D with square blocks, is not finite or symmetric or has a
        non-positive diagonal, a ``level`` that is not a number in (0, 1),
        if both or neither of ``y_std``/``y_cov`` are given, or if the width
        itself exceeds the float64 range (the message gives the largest
        ``y_std``).
    """
    level = _check_level(level)
    if (y_std is None) == (y_cov is None):
        raise ValueError("give exactly one of y_std and y_cov")
    if y_std is not None:
        std = _as_array(y_std, "y_std")
        std = _check_std(std, std.shape)
    else:
        cov = _as_array(y_cov, "y_cov", ndims=(3,))
        if cov.shape[1] != cov.shape[2]:
            raise ValueError(
                f"y_cov must hold square Q x Q blocks, shape (n, Q, Q); got shape {cov.shape}")
        std = _marginal_std(None, cov, cov.shape[:2])
    z = norm.ppf(0.5 + 0.5 * level)
    s = float(np.max(std))
    name = "y_std" if y_std is not None else "sqrt(diag(y_cov))"
    with np.errstate(over="ignore"):
        return _finite(2.0 * z * s * np.mean(std / s), "width", std, name)


def _check_levels(levels):
    if levels is None:
        return np.asarray(DEFAULT_CALIBRATION_LEVELS, dtype=np.float64)
    levels = unmask(levels, "levels")
    try:
        arr = np.asarray(levels, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"levels must be numbers in (0, 1): {exc}") from exc
    if arr.ndim == 0:
        arr = arr[None]
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"levels must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr) & (arr > 0.0) & (arr < 1.0)):
        raise ValueError(f"every level must lie strictly between 0 and 1, got {levels!r}")
    return arr


def expected_calibration_error(y_true, y_mean, y_std=None, *, y_cov=None, levels=None):
    r"""Expected calibration error of central predictive intervals (ECE).

    Mean absolute gap between the nominal probability ``p`` of the central
    Gaussian interval and its empirical coverage, over a grid of levels
    :math:`p_1, \dots, p_L`:

    .. math:: \mathrm{ECE} = \frac1L \sum_{l=1}^{L}
              \big| \mathrm{Cov}_{p_l} - p_l \big|,
              \qquad \mathrm{Cov}_{p} = \frac{1}{nQ} \sum_{j,q}
              \mathbb 1\{ |y_{jq} - \mu_{jq}| \le z_p \sigma_{jq} \},

    with ``z_p = scipy.stats.norm.ppf(0.5 + p / 2)``; ``Cov_p`` is exactly
    :func:`coverage` at ``level=p`` (eq. 46 at every level). The grid is
    unweighted, so every level counts equally. ECE lies in ``[0, 1)``; 0 is
    perfect calibration on the grid. It says nothing about sharpness (an
    always-calibrated but wide predictor scores 0), so read it with
    :func:`interval_width`.

    Convention and source: the pFedHGP paper (section 4.6, Fig. 4) reports an
    "ECE across nominal levels" without defining the grid. This function uses
    the interval form of the mean absolute calibration error of Kuleshov,
    Fenner & Ermon, "Accurate uncertainties for deep learning using
    calibrated regression", ICML 2018 (sec. 3.5, with the absolute instead of
    the squared gap and equal weights), as implemented by the Uncertainty
    Toolbox (Chung, Char, Guo, Schneider & Neiswanger, 2021,
    ``mean_absolute_calibration_error`` with ``prop_type="interval"``), with
    the default grid :data:`DEFAULT_CALIBRATION_LEVELS` = 0.01, 0.02, ...,
    0.99 (99 levels; the toolbox's default is 100 evenly spaced levels on
    the same range, so values are close but not identical).

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Marginal predictive means.
    y_std : array-like of the same shape as ``y_true``, optional
        Marginal predictive standard deviations (strictly positive).
    y_cov : array-like of shape (n, Q, Q), keyword-only, optional
        Predictive ``Q x Q`` blocks instead of ``y_std`` (diagonals used).
    levels : array-like of shape (L,), keyword-only, optional
        Nominal levels, each strictly in (0, 1). Default
        :data:`DEFAULT_CALIBRATION_LEVELS`.

    Returns
    -------
    float
        The expected calibration error, a dimensionless number in [0, 1).

    Raises
    ------
    ValueError
        On a shape mismatch, an empty array or one of the wrong number of
        dimensions (1-D/2-D, ``y_cov`` 3-D), complex, non-numeric or
        non-finite values, non-positive ``y_std`` (or diagonal of
        ``y_cov``), an asymmetric block of ``y_cov``, ``levels`` that are
        not a non-empty 1-D sequence of numbers, a level outside (0, 1), or
        if both or neither of ``y_std``/``y_cov`` are given.
    """
    lv = _check_levels(levels)
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _marginal_std(y_std, y_cov, y.shape)
    z = norm.ppf(0.5 + 0.5 * lv)
    with np.errstate(over="ignore"):
        resid = np.abs(y - mu).reshape(-1)
    std = std.reshape(-1)
    # same inequality as coverage(): |y - mu| <= z * std, for every level
    cov_emp = np.array([np.mean(resid <= zl * std) for zl in z])
    return float(np.mean(np.abs(cov_emp - lv)))


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
        On shape mismatches (``y_mean`` not 2-D, ``y_cov`` not of shape
        (n, Q, Q)), an empty array, complex, non-numeric or non-finite
        values, a block of ``y_cov`` that is not symmetric positive
        semi-definite (the symmetry check of :func:`gaussian_nll`), a
        ``noise_var`` that is negative, not finite or not a real number, or
        a result that exceeds the float64 range.
    """
    mu = _as_array(y_mean, "y_mean", ndims=(2,))
    n, q = mu.shape
    cov = None
    if y_cov is not None:
        # the same block checks as gaussian_nll / the marginal metrics, plus
        # positive semi-definiteness (these blocks are summed, not factorised)
        cov = _check_cov_blocks(y_cov, mu.shape, y_name="y_mean")
        _check_cov_psd(cov)
    if isinstance(noise_var, (str, bytes, complex, np.complexfloating)):
        raise ValueError(f"noise_var must be a real number >= 0, got {noise_var!r}")
    try:
        noise_var = float(noise_var)
    except (TypeError, ValueError):
        raise ValueError(f"noise_var must be a number >= 0, got {noise_var!r}") from None
    if not np.isfinite(noise_var) or noise_var < 0:
        raise ValueError(f"noise_var must be finite and >= 0, got {noise_var!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        centred = mu - mu.mean(axis=0)
        sigma = centred.T @ centred / n
        if cov is not None:
            sigma = sigma + cov.mean(axis=0)
        sigma = sigma + noise_var * np.eye(q)
    if not np.all(np.isfinite(sigma)):
        raise ValueError(
            "the output covariance overflowed float64 (largest |y_mean| = "
            f"{float(np.max(np.abs(mu))):.3g}); rescale the predictions")
    return sigma


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
        On a shape mismatch, an empty array or one that is not 2-D/3-D,
        non-square matrices, complex, non-numeric or non-finite values, a
        ``cov_true`` with zero Frobenius norm, or if CovErr itself exceeds
        the float64 range.
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
    if np.any(np.all(true == 0.0, axis=(1, 2))):
        raise ValueError("cov_true has a zero Frobenius norm; relative error undefined")
    # the ratio is scale-free: take both norms in units of max|cov_true| so
    # entries near 1e200 do not overflow when squared
    scale = np.abs(true).max(axis=(1, 2))[:, None, None]
    with np.errstate(over="ignore", under="ignore"):
        denom = np.linalg.norm(true / scale, ord="fro", axis=(1, 2))
        num = np.linalg.norm(pred / scale - true / scale, ord="fro", axis=(1, 2))
        value = np.mean(num / denom)
    if not np.isfinite(value):
        raise ValueError(
            "CovErr overflowed float64: cov_pred is more than ~1e308 times larger than "
            "cov_true; rescale them")
    return float(value)


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def regression_report(y_true, y_mean, y_std=None, *, y_cov=None):
    """All scalar regression metrics for one client in a dictionary.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, Q)
        Observed targets.
    y_mean : array-like of the same shape as ``y_true``
        Predictive means.
    y_std : array-like of the same shape as ``y_true``, optional
        Marginal predictive standard deviations (strictly positive).
    y_cov : array-like of shape (n, Q, Q), keyword-only, optional
        Full predictive ``Q x Q`` blocks instead of ``y_std``. The NLL is
        then the joint one of eq. 44; the other metrics use the diagonals.

    Returns
    -------
    dict
        ``{"RMSE": rmse, "SMSE": smse, "NLL": gaussian_nll (marginal with
        y_std, joint with y_cov), "CRPS": crps_gaussian, "coverage_95":
        coverage at 0.95, "width_95": interval_width at 0.95, "ECE":
        expected_calibration_error on the default grid}``, all Python
        floats. See the individual functions for definitions (pFedHGP eqs.
        43--47).

    Raises
    ------
    ValueError
        As the individual metrics (shape mismatch, non-finite values,
        non-positive ``y_std``, constant ``y_true``, both or neither of
        ``y_std``/``y_cov``), if ``y_cov`` is not symmetric positive
        definite, or if a metric's value itself exceeds the float64 range
        (e.g. an RMSE above ~1.8e308; rescale the data). Large-but-finite
        data such as 1e200 are handled without overflow.
    """
    y, mu = _pair(y_true, y_mean, "y_mean")
    std = _marginal_std(y_std, y_cov, y.shape)
    # every metric raises the same "overflowed float64" ValueError
    # (_overflow_error) if its own value is not representable
    nll = gaussian_nll(y, mu, std) if y_cov is None else gaussian_nll(y, mu, y_cov=y_cov)
    report = {
        "RMSE": rmse(y, mu),
        "SMSE": smse(y, mu),
        "NLL": nll,
        "CRPS": crps_gaussian(y, mu, std),
        "coverage_95": coverage(y, mu, std, level=0.95),
        "width_95": interval_width(std, level=0.95),
        "ECE": expected_calibration_error(y, mu, std),
    }
    bad = [k for k, v in report.items() if not np.isfinite(v)]
    if bad:  # pragma: no cover - each metric checks its own value
        raise _overflow_error(", ".join(bad), y)
    return report
