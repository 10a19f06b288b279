"""Federated training of pFedHGP: clients, server, messages and rounds.

Raw observations and each client's local block stay inside its
:class:`Client`; the :class:`Server` only ever sees the message types below,
whose arrays have sizes fixed by the model (``M``, ``d``), never by a
client's number of observations ``n_i``.

One communication round (docs/maths.md, "Federated training"; pFedHGP paper,
Algorithm 1):

1. the server broadcasts the global vector (:class:`GlobalBroadcast`);
2. every client runs ``local_steps`` Adam steps on
   ``E_i - KL(q(w_i)) - KL(q(v_i))`` over its local block, global fixed —
   the clients run through :class:`joblib.Parallel`, so any joblib backend
   (loky, threading, dask) scales them out;
3. each client returns the gradient of that objective with respect to the
   global vector (:class:`ClientUpdate`);
4. the server adds the gradient of ``-KL(q(v_g))`` and takes one Adam step.

With ``variational_update="closed_form"`` (the default) each round starts
with an extra exchange: the server broadcasts ``G``, every client uploads a
:class:`ClientStatistics` computed at that ``G``, and the server sets
``q(v_g)`` to its exact optimum (:meth:`Server.set_global_factor`) before
step 1; clients set their own factors exactly every :data:`LOCAL_REFRESH`
local steps and Adam moves only hyperparameters.

Set-up exchange (before round 1): each client sends a :class:`ClientSummary`
(count, sum and centred sum of squares of its targets, per-feature minimum and
maximum of its inputs); the server derives the target standardisation and
the bounding box in which it places the global inducing points (scrambled
Sobol design, :mod:`scipy.stats.qmc`) and broadcasts an
:class:`InitBroadcast`.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import numbers
import operator
import os
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np
from joblib import Parallel, delayed
from scipy.linalg import cho_factor, cho_solve, cholesky, solve_triangular
from scipy.stats import qmc
from scipy.stats import t as student_t

from ._hierarchy import (
    NOISE_FLOOR,
    client_objective,
    global_spec,
    global_statistics,
    local_spec,
    optimal_global_factor,
    optimal_local_factors,
    server_objective,
)
from ._linalg import DEFAULT_JITTER, cholesky_inverse, jittered_cholesky, solve_lower
from ._parallel import single_threaded_blas
from ._validation import user_stacklevel
from .kernels import se_ard, se_ard_grad_sym
from .optim import Adam

__all__ = [
    "ClientSummary",
    "InitBroadcast",
    "GlobalBroadcast",
    "ClientUpdate",
    "ClientStatistics",
    "message_arrays",
    "message_nbytes",
    "ModelConfig",
    "Client",
    "Server",
    "run_federated_training",
    "null_log_likelihood",
    "collinear_outputs",
    "under_observed_outputs",
    "PilotSummary",
    "DesignResidual",
    "InputScaleReport",
    "PoolEvidence",
    "StructuredStatistics",
    "PosteriorBroadcast",
    "GlobalGradient",
    "LocalHyperparameters",
    "ClientUpdateValue",
    "StructuredClient",
    "run_structured_training",
    "ClientFailure",
    "ClientState",
    "JoblibTransport",
    "TrainingState",
    "TrainingFailedError",
    "RoundSkippedWarning",
    "ClientExcludedWarning",
    "warm_start_state",
    "check_participation",
]


# --------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------


def _sobol_next(sob, n):
    """The next ``n`` points of the Sobol engine ``sob``, drawn without a warning.

    SciPy warns when the first draw from a fresh engine is not a power of 2
    (the balance properties of the sequence need one), and a warnings filter
    set around the draw is not thread-safe (clients are set up in threads).
    The same ``n`` points are drawn as power-of-2 chunks, largest first (the
    binary digits of ``n``): the sequence and the engine's state continue
    exactly as after one ``sob.random(n)``.

    Raises
    ------
    ValueError
        If ``n`` is negative or the engine has fewer than ``n`` points left.
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"cannot draw {n} Sobol points")
    if sob.num_generated + n > sob.maxn:
        raise ValueError(f"the Sobol engine has {sob.maxn - sob.num_generated} points left, "
                         f"{n} were asked for")
    parts = [sob.random(1 << b) for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1]
    return np.vstack(parts) if parts else np.zeros((0, sob.d))


@dataclass(frozen=True)
class ClientSummary:
    """Set-up upload of one client: aggregate statistics only.

    Attributes
    ----------
    n_samples : int
        Number of observations ``n_i``.
    y_sum : float
        Sum of the targets.
    y_centred_sumsq : float
        Sum of squared deviations of the targets from the client's own mean
        (the sum of squares in a form that keeps its precision when the
        targets have a large offset).
    x_min, x_max : ndarray of shape (d,)
        Per-feature minimum and maximum of the inputs (the bounding box).
    y_count : ndarray of shape (Q,) or None
        Multi-output targets only: observed (non-NaN) entries per output;
        ``y_sum`` and ``y_centred_sumsq`` are then per-output arrays (Q,)
        over the observed entries.
    y_cov : ndarray of shape (Q, Q) or None
        Multi-output targets only: the client's covariance between outputs
        (pairwise over the rows where both are observed; 0 where no row has
        both), for the initial global loadings. ``Q + Q^2`` more numbers,
        whatever ``n_i``.
    """

    n_samples: int
    y_sum: float
    y_centred_sumsq: float
    x_min: np.ndarray
    x_max: np.ndarray
    y_count: np.ndarray = None
    y_cov: np.ndarray = None


@dataclass(frozen=True)
class InitBroadcast:
    """Set-up download: target standardisation and the initial global vector.

    Attributes
    ----------
    y_offset, y_scale : float or ndarray of shape (Q,)
        Targets are standardised as ``(y - y_offset) / y_scale`` (per output
        for multi-output targets).
    theta_global : ndarray of shape (P,)
        Initial global unconstrained vector.
    x_min, x_max : ndarray of shape (d,)
        Bounding box of all clients' inputs, rounded outward
        (:func:`outer_box`): no corner is a training input.
    """

    y_offset: float
    y_scale: float
    theta_global: np.ndarray
    x_min: np.ndarray
    x_max: np.ndarray


@dataclass(frozen=True)
class GlobalBroadcast:
    """Per-round download: the global unconstrained vector ``G``.

    Attributes
    ----------
    round : int
    theta_global : ndarray of shape (P,)
    """

    round: int
    theta_global: np.ndarray


@dataclass(frozen=True)
class ClientUpdate:
    """Per-round upload of one client; its size does not depend on ``n_i``.

    Attributes
    ----------
    round : int
    grad_global : ndarray of shape (P,)
        Gradient of ``E_i - KL(q(w_i)) - KL(q(v_i))`` with respect to the
        global unconstrained vector, after the local steps.
    objective : float
        Value of that objective at the same point (for the ELBO history).
    """

    round: int
    grad_global: np.ndarray
    objective: float


@dataclass(frozen=True)
class ClientStatistics:
    """Upload for the closed-form ``q(v_g)`` (``variational_update="closed_form"``).

    Sent at the start of a round, at the broadcast global block and the
    client's current local block; sizes are fixed by ``M``.

    Attributes
    ----------
    round : int
    precision : ndarray of shape (M, M) or None
        ``W_g^T W_g / s2_i`` (None in the later sweeps of the final polish,
        where it does not change).
    shift : ndarray of shape (M,)
        ``W_g^T (y_i - deviation and local means) / s2_i``.
    """

    round: int
    precision: np.ndarray
    shift: np.ndarray


def message_arrays(msg):
    """All array payloads of a message, by field name.

    Parameters
    ----------
    msg : ClientSummary, InitBroadcast, GlobalBroadcast, ClientUpdate or ClientStatistics

    Returns
    -------
    dict of str to ndarray
        Scalars are returned as 0-d arrays; absent (None) fields are left out;
        a dict field gives one entry per key (``"field.key"``).
    """
    out = {}
    for f in dataclasses.fields(msg):
        v = getattr(msg, f.name)
        if v is None:
            continue
        if isinstance(v, dict):  # e.g. per-component arrays: one entry per key
            out.update({f"{f.name}.{k}": np.asarray(a) for k, a in v.items()})
        else:
            out[f.name] = np.asarray(v)
    return out


def message_nbytes(msg):
    """Payload size of a message in bytes.

    Parameters
    ----------
    msg : message dataclass
        E.g. ``ClientSummary``, ``InitBroadcast``, ``GlobalBroadcast``,
        ``StructuredStatistics``.

    Returns
    -------
    nbytes : int
        Sum of the ``nbytes`` of its arrays (8 bytes per float64 number;
        Python numbers count as 8 bytes; a single flag, ``True`` or
        ``False``, counts nothing, as in the Flower transport's payload).
        This is what ``communication_`` records.
    """
    if hasattr(msg, "nbytes") and callable(msg.nbytes):
        return int(msg.nbytes())
    flags = {f.name for f in dataclasses.fields(msg)
             if isinstance(getattr(msg, f.name), (bool, np.bool_))}
    return int(sum(a.nbytes for k, a in message_arrays(msg).items() if k not in flags))


# --------------------------------------------------------------------------
# configuration shared by server and clients
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Model hyperparameters agreed by server and clients before training.

    Given lengthscales are in input units, variances in standardised target
    units.  Internally every input feature is scaled to the unit interval of
    the clients' joint bounding box (``(x - x_min) / (x_max - x_min)``; a
    constant feature keeps scale 1), so that Adam steps on the softplus
    lengthscales are relative to the input range.  ``lengthscale=None``
    means ``0.2`` (in those scaled units: ``0.2 x`` the range per feature)
    for the global kernel; ``local_lengthscale=None`` means ``0.05``.
    ``noise_variance=None`` means 0.1 (standardised units).
    ``variational_update="closed_form"`` sets the variational factors to
    their exact optima (server: ``q(v_g)`` each round; clients: ``q(w_i)``,
    ``q(v_i)`` every :data:`LOCAL_REFRESH` local steps).
    """

    components: tuple
    n_inducing: int
    n_inducing_local: int
    lengthscale: object
    local_lengthscale: object
    variance: float
    local_variance: float
    noise_variance: object
    phi: float
    local_steps: int
    learning_rate: float
    global_learning_rate: float
    normalize_y: bool
    variational_update: str = "closed_form"
    variational_family: str = "mean_field"
    optimizer: str = "adam"
    tol: float = 1e-4
    global_steps: int = 1
    jitter: float = 1e-6
    noise_prior_scale: object = 1.0
    #: number of target columns Q of multi-output (ILMM) targets; 0 = scalar targets
    n_outputs: int = 0
    #: latent ranks (R_g, R_d, R_l) of the ILMM loadings (multi-output only)
    n_latent: tuple = (1, 1, 1)
    #: "isotropic" (one noise variance per client) or "diagonal" (one per output);
    #: the estimator always sets it (its default is "diagonal"): this default is
    #: what a configuration from an earlier version, which has no such field, meant
    noise: str = "isotropic"
    #: whether the inducing inputs (``Z_g`` and every client's ``Z_l``) are
    #: optimised with the hyperparameters: True, False (held where the set-up
    #: placed them) or "auto" (see :data:`AUTO_LEARN_RESIDUAL`)
    learn_inducing: object = True
    #: structured family, 1-D targets: which clients learn their own scale
    #: ``s_i`` on the shared parts, ``f_i = level_i + s_i (g + d_i) + l_i``
    #: (docs/maths.md, section 10): False (none), True (all) or "auto" (those
    #: whose spread is clearly another scale, :func:`learns_client_scale`)
    client_scale: object = False
    #: structured family, no given ``lengthscale``: factors of the starting
    #: global lengthscales; with more than one, a whole run is trained from
    #: each and the run with the largest final objective is kept
    #: (:meth:`_StructuredRun.select_start`)
    lengthscale_starts: tuple = (1.0,)


#: ``learn_inducing="auto"`` (structured family): a set of inducing inputs
#: is learned when, at set-up or at a later check, it leaves more than this
#: share of the prior variance at the inputs unexplained (``1 - tr Q_ff /
#: tr K_ff``, :func:`design_residual`), and held where the set-up placed it
#: otherwise; the global set is decided by the server from every client's
#: sums, each client's local set by the client alone (docs/maths.md,
#: section 11). Measured shares: 1e-6 to 2e-4 where holding was as good or
#: better (1-D, 2-D and 5-D problems whose design covers the inputs),
#: 0.018 to 0.23 where learning was as good or better (4-8 inputs with
#: short lengthscales, ``M`` capped by the budget or by ``N / 4``).
AUTO_LEARN_RESIDUAL = 0.01

#: ``learn_inducing="auto"``: a held set of inducing inputs is also learned
#: when the trace term it leaves in the collapsed bound, ``sum_i gamma_i
#: tr(K_ff,i - Q_ff,i) / (2 s2_i)`` (nats, summed over the clients sharing
#: it; ``gamma`` the set's prior amplitude, ``s2_i`` the client's noise
#: variance), exceeds this many nats per observed target value and
#: :data:`AUTO_LEARN_MIN_NATS` in all. The gap between the bound and the
#: exact log marginal likelihood at the current hyperparameters is bounded
#: by terms proportional to it (Burt, Rasmussen and van der Wilk, JMLR 21,
#: 2020), and the term pulls the hyperparameters towards lengthscales the
#: held set can represent. Checked before every round while the set is held (the
#: hyperparameters move in training; at set-up the noise variances are the
#: pilots' rough values, so only the share :data:`AUTO_LEARN_RESIDUAL`
#: counts there); a set once learned stays learned (docs/maths.md,
#: section 11). Measured after the first round: at most 0.005 nats per
#: observation and 0.5 nats in all where holding was as good or better (1-D
#: and 2-D generators, multi-output scenario A), 0.0097 and 67 nats on
#: Beijing PM2.5 (12 x 575 readings), where holding lost accuracy.
AUTO_LEARN_NATS = 0.005

#: The least trace term (nats) for which ``"auto"`` learns a held set of
#: inducing inputs (:data:`AUTO_LEARN_NATS`): 5 nats is "very strong"
#: evidence on the scale of Kass and Raftery ("Bayes factors", JASA 90,
#: 1995); below it the ``M x d`` more coordinates to optimise (slower,
#: harder rounds) are not worth what moving them could add to the bound.
AUTO_LEARN_MIN_NATS = 5.0


def learns_inducing(config):
    """Whether the configuration asks to learn the inducing inputs.

    ``"auto"`` counts as True here; the structured family resolves it at
    set-up (:data:`AUTO_LEARN_RESIDUAL`). A configuration pickled before the
    field existed learned them.

    Parameters
    ----------
    config : ModelConfig

    Returns
    -------
    bool
    """
    v = getattr(config, "learn_inducing", True)
    return True if isinstance(v, str) else bool(v)


def resolved_learn_inducing(config, decision):
    """Whether a set of inducing inputs moves in this training.

    A given ``True``/``False`` in ``config.learn_inducing`` applies (also to
    a warm start or resume); ``"auto"`` takes the set-up ``decision``
    (``None``, from a state saved before the option existed: learned).

    Parameters
    ----------
    config : ModelConfig
    decision : bool or None
        The stored ``"auto"`` decision (the server's ``learn_inducing_`` or a
        client's ``learn_local_inducing``).

    Returns
    -------
    bool

    Notes
    -----
    Beyond the pFedHGP paper (whose Algorithm 1 always learns them): the
    ``"auto"`` rule of docs/maths.md, section 11, built on the trace term of
    the collapsed bound (Titsias, "Variational learning of inducing variables
    in sparse Gaussian processes", AISTATS 2009, eq. 9).
    """
    mode = getattr(config, "learn_inducing", True)
    if isinstance(mode, str):
        return True if decision is None else bool(decision)
    return bool(mode)


def auto_learns(residual, total, nats=None, n_samples=1):
    """The ``"auto"`` rule: whether a held set of inducing inputs should be learned.

    Parameters
    ----------
    residual, total : float
        ``tr(K_ff - Q_ff)`` and ``tr K_ff`` over the inputs the set serves
        (:func:`design_residual`).
    nats : float or None
        The trace term of the collapsed bound, ``gamma tr(K_ff - Q_ff) /
        (2 s2)`` summed over those inputs' clients; None at set-up, where
        the noise variances are the pilots' rough values (a client's can
        sit at its floor), so only the share counts.
    n_samples : int
        The number of observed target values behind them.

    Returns
    -------
    bool
        ``residual / total > AUTO_LEARN_RESIDUAL`` or ``nats > max(
        AUTO_LEARN_MIN_NATS, AUTO_LEARN_NATS * n_samples)``.

    Notes
    -----
    Beyond the pFedHGP paper: docs/maths.md, section 11, built on the trace
    term of the collapsed bound (Titsias, AISTATS 2009, eq. 9).
    """
    share = residual / total if total > 0 else 0.0
    if share > AUTO_LEARN_RESIDUAL:
        return True
    return bool(nats is not None
                and nats > max(AUTO_LEARN_MIN_NATS, AUTO_LEARN_NATS * max(n_samples, 0)))


def latent_design_residuals(X, Z, lengthscales, variance, jitter=DEFAULT_JITTER,
                            per_row=False):
    """Per-kernel :func:`design_residual`: one residual per row of ``lengthscales``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Z : ndarray of shape (M, d)
    lengthscales : ndarray of shape (d,) or (R, d)
    variance : float
    jitter : float
    per_row : bool, default=False
        Return the residual of every input instead of the sums.

    Returns
    -------
    residuals : ndarray of shape (R,), or (n, R) with ``per_row``
        ``k(x, x) - q(x, x)`` of each kernel (clipped at 0 per point),
        summed over the inputs unless ``per_row``; in the units of
        ``variance`` (standardised target units squared in the package).
    total : float
        ``n * variance`` per kernel.

    Raises
    ------
    CholeskyError
        If ``K_zz`` cannot be factorised even with the largest jitter.

    Notes
    -----
    The per-point terms of the trace term of the collapsed bound (Titsias,
    "Variational learning of inducing variables in sparse Gaussian
    processes", AISTATS 2009, eq. 9); the ``"auto"`` rule of docs/maths.md,
    section 11, weights them per output and latent (beyond the pFedHGP
    paper).
    """
    from ._structured import CHUNK_ROWS, _se

    X = np.asarray(X, dtype=float)
    Z = np.asarray(Z, dtype=float)
    ells = np.atleast_2d(np.asarray(lengthscales, dtype=float))
    out = np.zeros((X.shape[0], ells.shape[0]))
    if X.shape[0] and Z.shape[0]:
        for r, ell in enumerate(ells):
            L, _ = jittered_cholesky(_se(Z, Z, ell, variance), scale=variance, jitter=jitter,
                                     name="K_zz (design residual)")
            for a in range(0, X.shape[0], CHUNK_ROWS):
                A = solve_lower(L, _se(Z, X[a:a + CHUNK_ROWS], ell, variance))
                out[a:a + CHUNK_ROWS, r] = np.maximum(variance - np.sum(A * A, axis=0), 0.0)
    return (out if per_row else out.sum(axis=0)), X.shape[0] * float(variance)


def design_residual(X, Z, lengthscales, variance, jitter=DEFAULT_JITTER):
    """How much of an SE-ARD prior at ``X`` the inducing inputs ``Z`` leave unexplained.

    ``sum_x [k(x, x) - q(x, x)]`` with the Nystrom approximation ``q(x, x) =
    k(x, Z) K_zz^{-1} k(Z, x)``: the trace term of the collapsed bound
    (Titsias 2009), which bounds what moving the inducing inputs could add
    to it at fixed hyperparameters (Burt, Rasmussen and van der Wilk,
    "Convergence of sparse variational inference in Gaussian processes
    regression", JMLR 21, 2020).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Z : ndarray of shape (M, d)
    lengthscales : ndarray of shape (d,) or (R, d)
        One row per latent kernel (each with ``variance``).
    variance : float
    jitter : float
        Relative jitter of ``K_zz``.

    Returns
    -------
    residual, total : float
        ``tr(K_ff - Q_ff)`` (clipped at 0 per point) and ``tr K_ff``, summed
        over the rows of ``lengthscales``.
    """
    res, tot = latent_design_residuals(X, Z, lengthscales, variance, jitter)
    return float(np.sum(res)), tot * res.size


def design_share(X, Z, lengthscales, jitter=DEFAULT_JITTER):
    """Share of an SE-ARD prior's variance at ``X`` that inducing inputs ``Z`` leave unexplained.

    ``sum_x [k(x, x) - q(x, x)] / sum_x k(x, x)`` (:func:`design_residual`
    over its total; the kernel variance cancels).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Z : ndarray of shape (M, d)
    lengthscales : ndarray of shape (d,)
    jitter : float
        Relative jitter of ``K_zz``.

    Returns
    -------
    float
        In ``[0, 1]``.
    """
    res, tot = design_residual(X, Z, np.asarray(lengthscales, float), 1.0, jitter)
    return float(res / tot) if tot > 0 else 0.0


@dataclass(frozen=True)
class DesignResidual:
    """Upload of ``learn_inducing_locations="auto"`` (four numbers).

    Attributes
    ----------
    residual, total : float
        The client's :func:`design_residual` of the global kernel(s) at the
        current global vector: its sum of ``k(x, x) - q(x, x)`` and of
        ``k(x, x)`` over its inputs (standardised target units squared;
        the message's size does not depend on ``n_i``), both times
        ``min(s_i^2, 1)`` for a client that learns its scale ``s_i`` on the
        shared parts, and 0 at set-up for a client that learns it because
        its own data rejected the population's lengthscales
        (:func:`lengthscale_mismatch`, :func:`input_scale_mismatch`;
        docs/maths.md, section 11).
    nats : float
        The trace term of the collapsed bound that ``Z_g`` leaves at the
        client's inputs: the residuals weighted by the global and deviation
        amplitudes (and ``s_i^2``) over the client's noise variance, halved
        (nats; 0 before the client's first local phase, while its noise
        variance is the pilot's).
    n_samples : int
        The client's number of observed target values.

    Notes
    -----
    The server learns ``Z_g`` when ``sum residual / sum total`` exceeds
    :data:`AUTO_LEARN_RESIDUAL` or, after set-up, ``sum nats`` exceeds both
    :data:`AUTO_LEARN_NATS` times ``sum n_samples`` and
    :data:`AUTO_LEARN_MIN_NATS` (:func:`auto_learns`; docs/maths.md, section 11;
    the trace term of Titsias, AISTATS 2009, eq. 9). Sent at set-up and
    before rounds while ``Z_g`` is held.
    """

    residual: float
    total: float
    nats: float = 0.0
    n_samples: int = 0


@dataclass(frozen=True)
class InputScaleReport:
    """Upload of the set-up's input-scale check (``d`` numbers).

    Attributes
    ----------
    ratios : ndarray of shape (d,)
        Per input, the ratio of the client's own pilot lengthscale to the
        typical client's where :func:`input_scale_mismatch` reports that
        input (the client's rows vary along it on a far other scale, over a
        far other range, confirmed by a likelihood-ratio test), else 0.
        Lengthscale ratios, not data.

    Notes
    -----
    Beyond the pFedHGP paper (H. Yan, "Personalized Federated Hierarchical
    Gaussian Processes for Privacy-Preserving Modeling of Heterogeneous
    Distributed Systems", arXiv:2609.19337, 2026), whose model has one
    lengthscale per input for every client; docs/maths.md, section 10. With
    client scales on, the server leaves a client with a reported input out
    of the boxes the global inducing inputs are placed in.
    """

    ratios: np.ndarray


def fix_entries(bounds, theta, index):
    """Bounds with the entries ``index`` of ``theta`` held fixed (``lo = hi``).

    L-BFGS-B keeps a variable whose bounds are equal at that value, and
    :func:`clip_to_bounds` does the same for Adam steps.

    Parameters
    ----------
    bounds : list of (float or None, float or None)
        One ``(lower, upper)`` pair per entry of ``theta`` (length ``P``).
    theta : ndarray of shape (P,)
        The unconstrained parameter vector whose entries are held.
    index : slice or None
        The entries to fix (None: none).

    Returns
    -------
    list of (float or None, float or None)
        A new list of length ``P``; the input is not modified.

    Notes
    -----
    How held inducing inputs (``learn_inducing_locations``) stay put; an
    implementation device, not from the papers.
    """
    bounds = list(bounds)
    if index is not None:
        for k in range(*index.indices(len(bounds))):
            bounds[k] = (float(theta[k]), float(theta[k]))
    return bounds


#: With ``variational_update="closed_form"``, clients reset their own
#: variational factors to the exact optimum every this many local steps.
LOCAL_REFRESH = 5

#: Local phase (L-BFGS-B): after a chunk of ``local_steps`` iterations that
#: gained more than this many nats per observation, another chunk follows ...
LOCAL_CHUNK_GAIN = 1e-3
#: ... up to this many chunks in all. 1 (the default) is one chunk: the local
#: phase as it always was. Larger values were measured and not adopted
#: (docs/maths.md, section 11, "Local phases in chunks").
LOCAL_MAX_CHUNKS = 1
#: A client's local part counts as switched off when its variance is below
#: this fraction of its restart value (:meth:`StructuredClient._restart_local`).
LOCAL_OFF_RATIO = 1e-3


#: :func:`outer_box` rounds the joint box outward on a grid of this many
#: significant digits of its width.
BOX_DIGITS = 3


def outer_box(x_min, x_max, digits=BOX_DIGITS):
    """The clients' joint bounding box, rounded outward to lie strictly outside every input.

    The joint box sets the input scaling and is kept in the fitted model and
    sent to every client (:class:`InitBroadcast`). Its exact corners would be
    training inputs (in 1-D, two of the training rows), so the server widens
    each side to the next multiple of ``q = 10**(floor(log10(width)) -
    digits)`` beyond it, plus one more ``q`` (at most 0.4 % wider in all with
    the default ``digits=3``, where the width is far above the floating-point
    spacing of the values; ``q`` is never below four such spacings); a corner
    is then never a training value. A feature without spread (width 0) keeps
    width 0 (scale 1, :func:`input_scaling`) at a corner ``q`` to ``2 q``
    below its value with ``q = 1e-3`` (or four spacings of a value beyond
    about 1e12), so its one value is not kept either and its scaled value
    stays in ``(0, 2 q]`` whatever its size.

    Parameters
    ----------
    x_min, x_max : ndarray of shape (d,)
        Per-feature minima and maxima over all clients (from their
        :class:`ClientSummary` boxes); finite.
    digits : int, default=BOX_DIGITS

    Returns
    -------
    lo, hi : ndarray of shape (d,)
        In the inputs' units: ``lo < x_min`` and ``hi > x_max`` where the
        width is positive; ``lo = hi < x_min`` where it is 0.

    Notes
    -----
    Beyond the pFedHGP paper (Yan 2026, arXiv:2609.19337, which scales
    inputs without saying how): package plumbing so that the fitted model
    holds no training input (docs/maths.md, section 1; docs/api.md,
    "What a fitted model holds").
    """
    lo = np.asarray(x_min, dtype=float)
    hi = np.asarray(x_max, dtype=float)
    width = hi - lo
    ulp = 4.0 * np.spacing(np.maximum(np.abs(lo), np.abs(hi)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.where(width > 0, 10.0 ** (np.floor(np.log10(width)) - digits), 1e-3)
        q = np.maximum(np.where(np.isfinite(q), q, 0.0), ulp)
        out_lo = (np.floor(lo / q) - 1.0) * q
        out_hi = (np.ceil(hi / q) + 1.0) * q
    # strictly outside even where q is near the floating-point spacing of the values
    below, above = np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf)
    out_lo = np.where(np.isfinite(out_lo), np.minimum(out_lo, below), below)
    out_hi = np.where(np.isfinite(out_hi), np.maximum(out_hi, above), above)
    out_hi = np.where(width > 0, out_hi, out_lo)
    return out_lo, out_hi


def input_scaling(x_min, x_max):
    """Offset and scale mapping the bounding box to the unit cube.

    Parameters
    ----------
    x_min, x_max : ndarray of shape (d,)

    Returns
    -------
    offset, scale : ndarray of shape (d,)
        Scaled inputs are ``(x - offset) / scale``; a constant feature gets
        scale 1.
    """
    rng = np.asarray(x_max, dtype=float) - np.asarray(x_min, dtype=float)
    return np.asarray(x_min, dtype=float), np.where(rng > 0, rng, 1.0)


def _default_lengthscale(value, ranges, fraction):
    """Initial lengthscales in scaled units (``ranges`` = input scales)."""
    if value is None:
        return np.full(ranges.shape, fraction)
    from ._validation import float_param

    try:
        ell = float_param(value, "lengthscale")  # no string, None or bool
    except ValueError:
        raise ValueError(f"lengthscale must be a positive number or an array of them, got "
                         f"{value!r}") from None
    if ell.ndim == 0:
        ell = np.full(ranges.shape, float(ell))
    if ell.shape != ranges.shape:
        raise ValueError(
            f"lengthscale must be a scalar or have {ranges.shape[0]} entries, got shape {ell.shape}"
        )
    if not np.all(np.isfinite(ell)) or np.any(ell <= 0):
        raise ValueError(f"lengthscales must be finite and positive, got {ell}")
    return ell / ranges


# --------------------------------------------------------------------------
# client
# --------------------------------------------------------------------------


def _multioutput_summary(X, Y):
    """:class:`ClientSummary` of multi-output targets ``Y`` (n, Q), NaN = missing."""
    obs = ~np.isnan(Y)
    count = obs.sum(axis=0)
    Y0 = np.where(obs, Y, 0.0)
    ysum = Y0.sum(axis=0)
    mean = np.where(count > 0, ysum / np.maximum(count, 1), 0.0)
    R = np.where(obs, Y - mean, 0.0)
    both = obs.T.astype(float) @ obs.astype(float)
    cov = np.where(both > 0, (R.T @ R) / np.maximum(both, 1.0), 0.0)
    return ClientSummary(
        n_samples=int(Y.shape[0]), y_sum=ysum, y_centred_sumsq=np.sum(R**2, axis=0),
        x_min=X.min(axis=0), x_max=X.max(axis=0), y_count=count.astype(float), y_cov=cov)


class Client:
    """One federated client: private data and the local block ``B_i``.

    Parameters
    ----------
    client_id : hashable
        Label of the client (as in ``groups``).
    X : ndarray of shape (n_i, d)
        Private inputs; never sent.
    y : ndarray of shape (n_i,)
        Private targets (original units); never sent.

    Attributes
    ----------
    client_id : hashable
    n_samples : int
    theta_local : ndarray of shape (P_i,)
        Local unconstrained vector (after :meth:`initialise`).
    local_pack : Packer
    objective_ : float
        Last value of the local objective.
    """

    def __init__(self, client_id, X, y):
        self.client_id = client_id
        self._X = np.ascontiguousarray(X, dtype=float)
        self._y = np.asarray(y, dtype=float)
        self.n_samples = self._X.shape[0]
        self.theta_local = None
        self.local_pack = None
        self._adam = None
        self.objective_ = np.nan

    def prepare(self, init):
        """Standardise the private targets and scale the private inputs.

        Parameters
        ----------
        init : InitBroadcast

        Returns
        -------
        offset, scale : ndarray of shape (d,)
            The input scaling.
        """
        self._y_std = (self._y - init.y_offset) / init.y_scale
        self._y_scale = init.y_scale
        offset, scale = input_scaling(init.x_min, init.x_max)
        self._x_scale = scale
        self._Xs = np.ascontiguousarray((self._X - offset) / scale)
        return offset, scale

    # -- messages ---------------------------------------------------------
    def summary(self):
        """Aggregate statistics for the set-up exchange.

        Returns
        -------
        ClientSummary
            Count, sum and centred sum of squares of the targets and the
            per-feature bounding box of the inputs: ``3 + 2 d`` numbers,
            whatever ``n_i`` (multi-output targets: per output, plus the
            ``Q x Q`` covariance between outputs).
        """
        if self._y.ndim == 2:
            return _multioutput_summary(self._X, self._y)
        return ClientSummary(
            n_samples=int(self.n_samples),
            y_sum=float(self._y.sum()),
            y_centred_sumsq=float(np.sum((self._y - self._y.mean()) ** 2)),
            x_min=self._X.min(axis=0),
            x_max=self._X.max(axis=0),
        )

    def initialise(self, init, config, random_state):
        """Set up the local block from the server's :class:`InitBroadcast`.

        Local inducing points are a scrambled Sobol design over the client's
        own bounding box (:func:`_local_inducing`: never its inputs, so the
        fitted model holds no training row); the variational factors start at
        the prior (``m = 0``, ``C = I``).

        Parameters
        ----------
        init : InitBroadcast
        config : ModelConfig
        random_state : int
            Seed of this client's initialisation.
        """
        offset, scale = self.prepare(init)
        d = self._X.shape[1]
        M, Ml = config.n_inducing, config.n_inducing_local
        self.local_pack = local_spec(config.components, M, Ml, d)
        values = {}
        if "deviation" in config.components:
            values.update(m_d=np.zeros(M), C_d=np.eye(M))
        if "local" in config.components:
            ell_l = _default_lengthscale(config.local_lengthscale, scale, 0.05)
            Zl = _local_inducing(self._Xs, Ml, random_state, pad=LOCAL_DESIGN_PAD * ell_l)
            values.update(
                m_u=np.zeros(Ml),
                C_u=np.eye(Ml),
                Z_l=Zl,
                lengthscale_l=ell_l,
                variance_l=float(config.local_variance),
            )
        s2 = 0.1 if config.noise_variance is None else float(config.noise_variance) / init.y_scale**2
        # the noise variance has a floor (NOISE_FLOOR, standardised units): a
        # smaller initial value (e.g. noise-free data) starts just above it
        s2 = max(s2, 2.0 * NOISE_FLOOR)
        values["noise_variance"] = s2
        self.theta_local = self.local_pack.pack(values)
        self._adam = Adam(self.local_pack.learning_rates(
            config.learning_rate,
            {"Z_l": values["lengthscale_l"]} if "lengthscale_l" in values else None,
        ))
        return self

    @single_threaded_blas()
    def local_round(self, broadcast, config, gpack):
        """Run the local Adam steps, then report the global gradient.

        Parameters
        ----------
        broadcast : GlobalBroadcast
        config : ModelConfig
        gpack : Packer
            Layout of the global vector.

        Returns
        -------
        ClientUpdate

        Raises
        ------
        CholeskyError, FloatingPointError
            If the local model becomes numerically invalid (names the client).
        """
        theta_g = broadcast.theta_global
        theta = self.theta_local
        closed = config.variational_update == "closed_form" and (
            "deviation" in config.components or "local" in config.components
        )
        # with closed-form updates the variational factors are set exactly
        # (every LOCAL_REFRESH steps) and Adam moves only the hyperparameters
        frozen = self.local_pack.variational_mask() if closed else None
        if not learns_inducing(config) and "Z_l" in self.local_pack.slices:
            # the inducing inputs stay where the set-up placed them
            if frozen is None:
                frozen = np.zeros(self.local_pack.size, dtype=bool)
            frozen[self.local_pack.slices["Z_l"]] = True
        for step in range(config.local_steps):
            if closed and step % LOCAL_REFRESH == 0:
                theta = optimal_local_factors(
                    theta_g, theta, self._Xs, self._y_std, gpack, self.local_pack,
                    config.components, client=self.client_id,
                )
            _, g_loc, _ = client_objective(
                theta_g, theta, self._Xs, self._y_std, gpack, self.local_pack,
                config.components, need_global_grad=False, client=self.client_id,
            )
            if not np.all(np.isfinite(g_loc)):
                raise FloatingPointError(
                    f"client {self.client_id!r} produced a non-finite local gradient "
                    f"at local step {step + 1} of round {broadcast.round}"
                )
            if frozen is not None:
                g_loc[frozen] = 0.0
            theta = self._adam.step(theta, g_loc)
        if closed:
            theta = optimal_local_factors(
                theta_g, theta, self._Xs, self._y_std, gpack, self.local_pack,
                config.components, client=self.client_id,
            )
        value, _, g_glob = client_objective(
            theta_g, theta, self._Xs, self._y_std, gpack, self.local_pack,
            config.components, need_global_grad=True, client=self.client_id,
        )
        if not np.all(np.isfinite(g_glob)):
            raise FloatingPointError(
                f"client {self.client_id!r} produced a non-finite global gradient"
            )
        self.theta_local = theta
        self.objective_ = value
        return ClientUpdate(round=broadcast.round, grad_global=g_glob, objective=value)

    @single_threaded_blas()
    def statistics(self, broadcast, config, gpack):
        """Statistics for the server's closed-form ``q(v_g)`` (:class:`ClientStatistics`).

        Parameters
        ----------
        broadcast : GlobalBroadcast
        config : ModelConfig
        gpack : Packer

        Returns
        -------
        ClientStatistics
        """
        precision, shift = global_statistics(
            broadcast.theta_global, self.theta_local, self._Xs, self._y_std, gpack,
            self.local_pack, config.components, client=self.client_id,
        )
        return ClientStatistics(round=broadcast.round, precision=precision, shift=shift)

    def forget_data(self):
        """Drop the private data after training (the fitted model keeps none)."""
        self._X = self._y = self._Xs = self._y_std = None

    def local_values(self):
        """Unpacked local block (constrained values), for prediction.

        Returns
        -------
        dict
            Name to value, as laid out by :func:`skfedgp._hierarchy.local_spec`
            (inputs in the scaled unit-box coordinates, variances in
            standardised units).
        """
        return self.local_pack.unpack(self.theta_local)


def _client_statistics(client, broadcast, config, gpack):
    return client, client.statistics(broadcast, config, gpack)


def _client_round(client, broadcast, config, gpack):
    update = client.local_round(broadcast, config, gpack)
    return client, update


# --------------------------------------------------------------------------
# server
# --------------------------------------------------------------------------


class Server:
    """The server: owns the global block ``G`` and its Adam state.

    Parameters
    ----------
    config : ModelConfig
    d : int
        Input dimension.
    random_state : int
        Seed of the Sobol design of the global inducing points.

    Attributes
    ----------
    global_pack : Packer
    theta_global : ndarray of shape (P,)
    y_offset, y_scale : float
    """

    def __init__(self, config, d, random_state):
        self.config = config
        self.d = d
        self.random_state = random_state
        # the structured family builds its own (log-parametrised) global pack
        self.global_pack = (global_spec(config.components, config.n_inducing, d)
                            if config.variational_family == "mean_field" else None)
        self.theta_global = None
        self._adam = Adam(config.global_learning_rate)  # per-coordinate in initialise
        self.inducing_growth_ = []  # n_inducing="auto" growth checks (structured_initialise)

    def initialise(self, summaries):
        """Standardisation and initial global block from the client summaries.

        Parameters
        ----------
        summaries : list of ClientSummary

        Returns
        -------
        InitBroadcast
        """
        init = self.standardise(summaries)
        # the yardstick of a failed fit (the regressor warns well below it):
        # about each client's own mean only if the model has a client part
        # that can follow it
        own = "deviation" in self.config.components or "local" in self.config.components
        self.null_log_likelihood = (null_log_likelihood(summaries, self.y_scale, own)
                                    if all(s.y_count is None for s in summaries) else None)
        self.null_own_means = own
        self.client_boxes = None  # the mean-field set-up places Z_g in the joint box
        ranges = self.x_scale
        values = {}
        gp = self.global_pack
        if "Z_g" in gp.slices:
            M = self.config.n_inducing
            sob = qmc.Sobol(self.d, scramble=True, seed=self.random_state)
            values["Z_g"] = _sobol_next(sob, M)  # unit cube = scaled bounding box
            values["lengthscale_g"] = _default_lengthscale(self.config.lengthscale, ranges, 0.2)
            values["variance_g"] = float(self.config.variance)
        if "phi" in gp.slices:
            values["phi"] = float(self.config.phi)
        if "m_g" in gp.slices:
            M = self.config.n_inducing
            values.update(m_g=np.zeros(M), C_g=np.eye(M))
        self.theta_global = gp.pack(values) if gp.size else np.zeros(0)
        if gp.size:
            self._adam = Adam(gp.learning_rates(
                self.config.global_learning_rate,
                {"Z_g": values["lengthscale_g"]} if "lengthscale_g" in values else None,
            ))
        return InitBroadcast(self.y_offset, self.y_scale, self.theta_global.copy(),
                             init.x_min, init.x_max)

    def record_outputs(self, summaries):
        """What the diagnostics of multi-output targets need, from this run's set-up summaries.

        Sets ``flat_outputs`` (:func:`flat_outputs`), ``collinear_outputs``
        (:func:`collinear_outputs`), and with multi-output
        targets ``output_variance_floor`` (:func:`under_observed_floor`, in
        the units of ``y_scale``), ``under_observed_outputs``
        (:func:`under_observed_outputs`), ``output_counts`` (per output: observed
        values, observing clients) and ``output_client_counts`` (client id
        to its values per output). Called at a fresh set-up (after
        :meth:`standardise`) and at a warm start or resume, whose data may
        differ from the first fit's.

        Parameters
        ----------
        summaries : dict
            Client id to its ``ClientSummary``.

        Raises
        ------
        ValueError
            If an output has a single observed value over all clients.
        """
        sums = list(summaries.values())
        self.flat_outputs = flat_outputs(sums)
        self.collinear_outputs = collinear_outputs(sums)
        if not sums or sums[0].y_count is None:
            return
        self.output_variance_floor = under_observed_floor(
            sums, np.asarray(self.y_scale, dtype=float))
        self.under_observed_outputs = under_observed_outputs(sums)
        count = np.sum([s.y_count for s in sums], axis=0)
        self.output_counts = np.array(
            [count, np.sum([np.asarray(s.y_count) > 0 for s in sums], axis=0)], dtype=int)
        self.output_client_counts = {c: np.asarray(summaries[c].y_count, dtype=int)
                                     for c in summaries}

    def standardise(self, summaries):
        """Target standardisation and input scaling from the client summaries.

        Parameters
        ----------
        summaries : list of ClientSummary

        Returns
        -------
        InitBroadcast
            With an empty ``theta_global``.
        """
        if any(s.y_count is not None for s in summaries):
            return self._standardise_multioutput(summaries)
        n, mean, m2, tiny = _pooled_target_moments(summaries)
        # the clients' own (within-client) standard deviations
        stds = [np.sqrt(s.y_centred_sumsq / s.n_samples) for s in summaries
                if s.n_samples >= 2 and s.y_centred_sumsq > tiny * s.n_samples]
        self.flat_clients = flat_targets(summaries)
        if self.config.variational_family == "structured":
            # every client has its own learned constant mean, so the scale is
            # the median of the clients' own standard deviations: a client on
            # another level or another scale does not change the other
            # clients' units
            var = float(np.median(stds)) ** 2 if stds else m2 / n
            scale = float(np.sqrt(var)) if var > tiny else 1.0
            # the clients' levels are centred at the mean of the clients'
            # means, each client counted once: a large client does not pull
            # the centre that a never-seen client's level is drawn around
            mean = (float(np.mean([s.y_sum / s.n_samples for s in summaries]))
                    if self.config.normalize_y else 0.0)
        elif self.config.normalize_y:
            var = max(m2 / n, 0.0)
            scale = float(np.sqrt(var)) if var > tiny else 1.0
        else:
            # no offset, but the scale still comes from the data (initial
            # values, bounds and floors are in standardised units, and Adam
            # moves by fixed-size steps: unit scale never reaches targets in
            # the thousands): the root mean square of the targets, the scale
            # a zero-mean prior has to cover without an offset
            ms = max(m2 / n, 0.0) + mean**2
            scale = float(np.sqrt(ms)) if ms > tiny else 1.0
            mean = 0.0
        self.y_offset, self.y_scale = float(mean), float(scale)
        # start of the clients' level variance (structured family): the
        # spread of the clients' means around that centre
        between = float(np.mean([(s.y_sum / s.n_samples - mean) ** 2 for s in summaries]))
        self.level_start = between / scale**2
        # the level variance's upper bound follows the clients' spread of
        # means, so that clients on levels far apart are not capped
        self.level_upper = max(LOG_BOUNDS["level_variance"][1],
                               LEVEL_BOUND_FACTOR * self.level_start)
        # the structured family centres each client's targets at its own mean
        # (StructuredClient._centre); the mean-field family works with the
        # pooled targets, whose spread then swamps the within-client spread
        ratio = np.sqrt(between) / float(np.median(stds)) if stds else 0.0
        if self.config.variational_family != "structured" and ratio > LEVEL_PRECISION_LIMIT:
            warnings.warn(
                f"the clients' mean targets differ by about {ratio:.3g} times their typical "
                f"within-client spread (more than {LEVEL_PRECISION_LIMIT:g}): the mean-field "
                "family may lose floating-point precision (predictive bands far too wide or "
                "too narrow); use variational_family='structured', or subtract a rough level "
                "per client (e.g. its median) before fitting and add it back to the "
                "predictions", UserWarning, stacklevel=user_stacklevel())
        self.n_total = int(n)
        self.client_sizes = [int(s.n_samples) for s in summaries]  # for the "auto" M budget
        return InitBroadcast(self.y_offset, self.y_scale, np.zeros(0), *self._input_box(summaries))

    def _standardise_multioutput(self, summaries):
        """Per-output standardisation of multi-output targets (structured family).

        Output ``q`` is divided by the median over clients of their own
        standard deviations of that output and, with ``normalize_y``, offset
        by its pooled mean; each client then learns its own constant mean per
        output. The clients' output covariances, in those units, are averaged
        into ``channel_covariance`` (used once, for the initial global
        loadings, then dropped).

        Raises
        ------
        ValueError
            If the clients do not all report the same number of outputs, or
            an output is observed nowhere.
        """
        shapes = {np.shape(s.y_sum) for s in summaries}
        if len(shapes) != 1 or any(s.y_count is None for s in summaries):
            raise ValueError(
                "the clients disagree on the number of outputs: target shapes "
                f"{sorted(shapes)} (every client must hold the same Q target columns)")
        Q = int(np.shape(summaries[0].y_sum)[0])
        count = np.sum([s.y_count for s in summaries], axis=0)
        if np.any(count == 0):
            q = int(np.flatnonzero(count == 0)[0])
            raise ValueError(f"output {q} has no observed (non-NaN) value in any client")
        mean = np.sum([s.y_sum for s in summaries], axis=0) / count
        scale = np.ones(Q)
        for q in range(Q):
            # "no spread" relative to the output's own magnitude (see standardise)
            within = sum(s.y_centred_sumsq[q] for s in summaries) / count[q]
            tiny = 1e-24 * max(mean[q] ** 2, within)
            stds = [np.sqrt(s.y_centred_sumsq[q] / s.y_count[q]) for s in summaries
                    if s.y_count[q] >= 2 and s.y_centred_sumsq[q] > tiny * s.y_count[q]]
            if stds:
                scale[q] = float(np.median(stds))
        if not self.config.normalize_y:
            mean = np.zeros(Q)
        self.y_offset, self.y_scale = mean.astype(float), scale
        self.n_total = int(sum(s.n_samples for s in summaries))
        self.client_sizes = [int(s.n_samples) for s in summaries]  # for the "auto" M budget
        self.n_outputs = Q
        w = np.array([max(s.n_samples, 1) for s in summaries], dtype=float)
        self.channel_covariance = np.average(
            [s.y_cov / np.outer(scale, scale) for s in summaries], axis=0, weights=w)
        return InitBroadcast(self.y_offset, self.y_scale, np.zeros(0), *self._input_box(summaries))

    def _input_box(self, summaries):
        """The joint input box from the clients' boxes (:func:`outer_box`), and the scaling.

        Sets ``x_offset``, ``x_scale`` (:func:`input_scaling`) and
        ``client_boxes`` (the clients' own boxes, for the placement of the
        global inducing points only). Returns ``(x_min, x_max)``, each of
        shape (d,), for the :class:`InitBroadcast`.
        """
        x_min, x_max = outer_box(np.min([s.x_min for s in summaries], axis=0),
                                 np.max([s.x_max for s in summaries], axis=0))
        self.x_offset, self.x_scale = input_scaling(x_min, x_max)
        self.client_boxes = [(s.x_min, s.x_max) for s in summaries]
        return x_min, x_max

    def client_widths(self):
        """The clients' input widths from their boxes (set-up only).

        Returns
        -------
        ndarray of shape (n_clients, d)
            ``(x_max - x_min) / x_scale`` per client (scaled units), in the
            order of ``client_boxes``.
        """
        return np.array([(np.asarray(b[1], float) - np.asarray(b[0], float)) / self.x_scale
                         for b in self.client_boxes])

    def structured_initialise(self, pop):
        """Initial global vector of the structured family from the pilot medians.

        Global lengthscales: the given ones, else the clients' median pilot
        lengthscales; variance: the given one, else the median pilot signal
        variance (medians weighted by the clients' numbers of observations,
        the set-up of :func:`run_structured_training`); ``phi``: the given
        one, else 0.1; ``n_inducing="auto"``:
        :func:`auto_inducing` from the global lengthscales (with
        ``self.global_sizing``, set with ``global_start`` below, and a
        ``"local"`` component, the larger of it and them, per input, also
        for the padding of the clients' boxes; used once and removed)
        (:data:`AUTO_PER_LENGTHSCALE` points per lengthscale and dimension,
        at least :data:`AUTO_MIN_INDUCING`, at most the total number of
        observations and at most the larger of :data:`AUTO_MAX_INDUCING` and
        the size an ELBO evaluation can afford, :func:`budget_inducing`, and
        at most :data:`AUTO_MAX_SHARE` of the observations or
        :data:`AUTO_SHARE_FLOOR`; where that share cap binds,
        :meth:`_grow_inducing` may grow it, see :data:`AUTO_GROW_SHARE`).
        Inducing points: a scrambled Sobol design over the union of the
        clients' boxes (``client_boxes``; without those of the clients that
        reported an input on another scale, with client scales on:
        :meth:`_StructuredRun._input_scale_check`). With multi-output
        targets, ``self.global_start``
        (``R_g x d``, scaled units; set by
        :class:`~skfedgp.FederatedHierarchicalGPRegressor` from a global-only
        fit, used once and removed) replaces the starting global lengthscales
        after the inducing inputs are set.

        Returns
        -------
        theta_global : ndarray
        global_pack : Packer
        M, M_local : int
        """
        cfg = self.config
        d = self.d
        if self.client_boxes:
            # the narrowest client's extent: a client far from the others must
            # not leave the rest unable to resolve their own inputs
            widths = self.client_widths()
            widths = np.where(widths > 0, widths, np.inf).min(axis=0)
            self.lengthscale_floor_ = lengthscale_floor(widths)
        ell = (pop.lengthscale if cfg.lengthscale is None
               else _default_lengthscale(cfg.lengthscale, self.x_scale, 0.0))
        ell = check_in_bounds("lengthscale_g", ell, cfg.lengthscale is not None,
                              self.lengthscale_range())
        sizing = self.__dict__.pop("global_sizing", None)
        if (sizing is not None and cfg.lengthscale is None and cfg.n_inducing == "auto"
                and "local" in cfg.components):
            # multi-output targets after a global-only fit: the design is
            # sized and placed for the shortest scale the shared latents
            # showed there, not for the clients' own faster variation that
            # the pilots see (never for less than the pilots' lengthscales).
            # That variation is the local part's to carry; without one the
            # global inducing points must resolve it (through the deviation)
            # and keep the pilots' size
            ell = np.maximum(ell, np.asarray(sizing, dtype=float).reshape(d))
        cand, frac = self._union_candidates(ell)
        self.inducing_growth_ = []  # (M, share) of each check (_grow_inducing)
        if not {"global", "deviation"} & set(cfg.components):
            M = 0  # no global inducing set (and no warning about its size)
        elif cfg.n_inducing == "auto":
            # the number of lengthscale-sized cells in the union of the clients' boxes
            cap = max(AUTO_MAX_INDUCING, budget_inducing(
                self.client_sizes, cfg.components,
                n_latent=max(cfg.n_latent) if cfg.n_outputs else 1))
            share_max = min(cap, self.n_total, max(
                AUTO_SHARE_FLOOR, int(np.ceil(AUTO_MAX_SHARE * self.n_total))))
            M = auto_inducing(ell, np.ones(d), per_lengthscale=AUTO_PER_LENGTHSCALE,
                              minimum=AUTO_MIN_INDUCING, maximum=share_max, fraction=frac)
            grow_max = min(cap, self.n_total, max(share_max, min(
                AUTO_GROW_MAX, int(np.ceil(AUTO_GROW_MAX_SHARE * self.n_total)))))
            if M == share_max and grow_max > M:
                # Z_g is taken from the same candidates as the checked designs
                cand, M = self._grow_inducing(M, grow_max, ell, ell if cfg.lengthscale is not None
                                              else start_lengthscale(ell, 1.0), cand)
        else:
            M = cap_inducing(int(cfg.n_inducing), self.n_total)
        # "auto": each client sizes its own local set (StructuredClient.initialise)
        M_local = None if cfg.n_inducing_local == "auto" else int(cfg.n_inducing_local)
        if cfg.n_outputs:
            from ._ilmm import global_spec as ilmm_global_spec

            gpack = ilmm_global_spec(cfg.components, M, d, cfg.n_outputs, cfg.n_latent[0])
        else:
            gpack = structured_global_spec(cfg.components, M, d)
        values = {}
        if "Z_g" in gpack.slices:
            if cand.shape[0] < M:
                cand, _ = self._union_candidates(ell, at_least=M)
            values["Z_g"] = cand[:M]
            # a given value is used as given; the pilots' at most a few spans
            # of the unit box (start_lengthscale)
            ell0 = ell if cfg.lengthscale is not None else start_lengthscale(ell, 1.0)
            if cfg.n_outputs:
                values["lengthscale_g"] = np.tile(ell0, (cfg.n_latent[0], 1))
                start = self.__dict__.pop("global_start", None)
                if start is not None:
                    # from the global-only fit (FederatedHierarchicalGPRegressor with
                    # multi-output targets): one row per latent, all equal
                    # (regressor.smoothest_latent_start), inside the range
                    lo, hi = self.lengthscale_range()
                    values["lengthscale_g"] = np.clip(
                        np.asarray(start, dtype=float).reshape(cfg.n_latent[0], d),
                        np.asarray(lo) * (1 + 1e-6), np.asarray(hi) * (1 - 1e-6))
            else:
                var = pop.variance if cfg.variance is None else float(cfg.variance)
                values.update(lengthscale_g=ell0, variance_g=check_in_bounds(
                    "variance_g", var, cfg.variance is not None))
        if "B_g" in gpack.slices:
            signal = pop.variance / max(pop.variance + pop.noise_variance, 1e-12)
            values["B_g"] = initial_loadings(self.channel_covariance * signal,
                                             cfg.n_latent[0], self.random_state)
        self.channel_covariance = None  # used for the initial loadings only
        if "phi" in gpack.slices:
            values["phi"] = check_in_bounds("phi", 0.1 if cfg.phi is None else cfg.phi,
                                            cfg.phi is not None)
        if "level_variance" in gpack.slices:
            values["level_variance"] = check_in_bounds(
                "level_variance", max(getattr(self, "level_start", 0.0), LEVEL_START_MIN), False,
                self.level_range())
        self.global_pack = gpack
        self.theta_global = gpack.pack(values) if gpack.size else np.zeros(0)
        self.client_boxes = None  # used for the placement only; not kept in the model
        self.n_inducing_ = M
        self.n_inducing_local_ = M_local
        return self.theta_global.copy(), gpack, M, M_local

    def _grow_inducing(self, M, grow_max, ell, ell0, cand):
        """Grow ``M`` while the design leaves much of the prior unexplained (server only).

        Only when the first check exceeds :data:`AUTO_GROW_START`, and then
        while above :data:`AUTO_GROW_SHARE`: the share of the prior variance
        that the first ``M`` points of the union's design
        (:meth:`_union_candidates` with the lengthscales ``ell``) leave
        unexplained at :data:`AUTO_GROW_POINTS` later points of the same
        design (:func:`design_share`, kernel lengthscales ``ell0``, the
        starting ones). Each check is kept in ``inducing_growth_`` as
        ``(M, share)``.

        Returns
        -------
        candidates : ndarray of shape (k, d)
            The design whose first ``M`` points become ``Z_g`` (so the
            checked designs are the used one); ``cand`` (the set-up's
            candidates) and ``M`` unchanged when the union yields too few
            points for the check.
        M : int
        """
        pts, _ = self._union_candidates(ell, at_least=grow_max + AUTO_GROW_POINTS)
        if pts.shape[0] < grow_max + AUTO_MIN_INDUCING:
            return cand, M
        X_eval = pts[grow_max:grow_max + AUTO_GROW_POINTS]
        first = True
        while True:
            share = design_share(X_eval, pts[:M], ell0, self.config.jitter)
            self.inducing_growth_.append((int(M), float(share)))
            if (share <= (AUTO_GROW_START if first else AUTO_GROW_SHARE)
                    or M >= grow_max):
                return pts, M
            first = False
            M = min(grow_max, int(np.ceil(1.25 * M)))

    def _union_candidates(self, ell, at_least=0):
        """Sobol points of the scaled box that fall in the union of the clients' boxes.

        Each client's reported box (:class:`ClientSummary`) is widened by half
        a lengthscale on every side; a scrambled Sobol sequence over the whole
        box is filtered to that union, so the global inducing points follow
        where the clients' inputs are, not the single box around all of them
        (a client far from the others would otherwise leave them in a sliver
        of it). When the union is too small a share of the box for the
        filter to find the points needed (clients far apart: 2 clients in
        ``[0, 1]^2`` and one at ``[1e4, 1e4 + 1]^2`` cover 4e-8 of it), the
        points are drawn from the union itself instead
        (:func:`union_design`). A client's small box that such a design
        would leave unresolved (inside a far wider union) gets points
        reserved for it, in every other place of the sequence
        (:func:`reserved_design`, :func:`interleave_design`).

        Returns
        -------
        points : ndarray of shape (k, d)
            In Sobol order (any prefix is spread over the union).
        fraction : float
            Share of the box covered by the union (from the candidates; from
            :func:`union_design` when the filter found too few of them).
        """
        d = self.d
        lo = np.array([(b[0] - self.x_offset) / self.x_scale for b in self.client_boxes])
        hi = np.array([(b[1] - self.x_offset) / self.x_scale for b in self.client_boxes])
        box_lo, box_hi = lo, hi
        pad = 0.5 * np.asarray(ell)
        lo, hi = lo - pad, hi + pad
        sob = qmc.Sobol(d, scramble=True, seed=self.random_state)
        pts = np.zeros((0, d))
        frac = 1.0
        for k in range(12, 19):  # 4 096 ... 262 144 candidates
            cand = sob.random_base2(k) if k == 12 else np.vstack([cand, _sobol_next(sob, 2**k - cand.shape[0])])
            inside = np.zeros(cand.shape[0], dtype=bool)
            for a, b in zip(lo, hi):
                inside |= np.all((cand >= a) & (cand <= b), axis=1)
            pts = cand[inside]
            frac = max(float(inside.mean()), 1.0 / cand.shape[0])
            if pts.shape[0] >= max(at_least, AUTO_MAX_INDUCING):
                break
        if pts.shape[0] < max(at_least, AUTO_MIN_INDUCING):
            # a vanishing union: draw from it directly
            lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
            pts, frac = union_design(lo, hi, max(at_least, AUTO_MAX_INDUCING), self.random_state)
        reserved = reserved_design(box_lo, box_hi, ell, frac, self.random_state)
        if reserved.shape[0]:
            pts = interleave_design(reserved, pts)
        return pts, frac

    def lengthscale_range(self):
        """Range of the global lengthscales (scaled units).

        :data:`LOG_BOUNDS`, with the lower end per dimension lowered to
        :func:`lengthscale_floor` of the narrowest client's input width
        (set at set-up from the clients' boxes).

        Returns
        -------
        lo : float or ndarray of shape (d,)
        hi : float
        """
        lo, hi = LOG_BOUNDS["lengthscale_g"]
        floor = getattr(self, "lengthscale_floor_", None)
        return (lo if floor is None else floor), hi

    def level_range(self):
        """Range of the clients' level variance ``tau^2`` (docs/maths.md, sections 10 and 13).

        :data:`LOG_BOUNDS`, with the upper bound at least
        :data:`LEVEL_BOUND_FACTOR` times the spread of the clients' means
        (``level_start``, set by :meth:`standardise`), so that clients on
        levels far apart are not capped.

        Returns
        -------
        lo, hi : float
            Standardised target units squared. Without ``level_upper`` (a
            multi-output server, or one restored from an older checkpoint)
            the :data:`LOG_BOUNDS` range.
        """
        lo, hi = LOG_BOUNDS["level_variance"]
        upper = getattr(self, "level_upper", None)  # None: multi-output, older checkpoints
        return lo, hi if upper is None else max(hi, float(upper))

    def global_bounds(self, gpack, theta=None, learn_inducing=None):
        """L-BFGS-B bounds of the packed global vector.

        Parameters
        ----------
        gpack : Packer
            Layout of the global vector.
        theta : ndarray of shape (gpack.size,), optional
            The current global vector: unless the inducing inputs are learned,
            the entries of ``Z_g`` are held at their values in it.
        learn_inducing : bool, optional
            Whether they are learned; None: as the configuration says
            (:func:`learns_inducing`).

        Returns
        -------
        list of (float or None, float or None)
            One pair per entry, of length ``gpack.size``: :func:`log_bounds`
            (log space; None for free entries such as ``Z_g``), with
            ``lengthscale_g`` in :meth:`lengthscale_range` and
            ``level_variance`` in :meth:`level_range`.
        """
        b = log_bounds(gpack)
        if "lengthscale_g" in gpack.slices:  # (d,) or (R_g, d)
            _set_log_bounds(b, gpack.slices["lengthscale_g"], *self.lengthscale_range())
        if "level_variance" in gpack.slices:
            _set_log_bounds(b, gpack.slices["level_variance"], *self.level_range())
        if learn_inducing is None:
            learn_inducing = learns_inducing(self.config)
        if theta is not None and not learn_inducing:
            b = fix_entries(b, theta, gpack.slices.get("Z_g"))
        return b

    def broadcast(self, round_):
        """The per-round download.

        Parameters
        ----------
        round_ : int
            Round number (1-based).

        Returns
        -------
        GlobalBroadcast
            A copy of the global unconstrained vector, shape ``(P,)``.
        """
        return GlobalBroadcast(round=round_, theta_global=self.theta_global.copy())

    def apply(self, updates):
        """Aggregate the client gradients and take one Adam step on ``G``.

        Parameters
        ----------
        updates : list of ClientUpdate

        Returns
        -------
        elbo : float
            ELBO at the broadcast global vector (after the local steps).
        """
        kl_value, kl_grad = server_objective(self.theta_global, self.global_pack)
        elbo = kl_value + sum(u.objective for u in updates)
        if self.global_pack.size:
            grad = kl_grad + np.sum([u.grad_global for u in updates], axis=0)
            if self.config.variational_update == "closed_form":
                # q(v_g) is set by set_global_factor; Adam moves hyperparameters only
                grad[self.global_pack.variational_mask()] = 0.0
            if not learns_inducing(self.config) and "Z_g" in self.global_pack.slices:
                grad[self.global_pack.slices["Z_g"]] = 0.0  # inducing inputs held fixed
            self.theta_global = self._adam.step(self.theta_global, grad)
        return float(elbo)

    def set_global_factor(self, statistics, precision_sum=None):
        """Set ``q(v_g)`` to its exact optimum from the clients' statistics.

        ``S_g = (I + sum_i W_i^T W_i / s2_i)^{-1}``,
        ``m_g = S_g sum_i W_i^T r_i / s2_i`` (docs/maths.md, "Beyond the
        paper"); the statistics were computed at the current global block,
        so the update is an exact coordinate-ascent step on the ELBO.

        Parameters
        ----------
        statistics : list of ClientStatistics
        precision_sum : ndarray of shape (M, M), optional
            ``sum_i W_i^T W_i / s2_i`` when the messages carry only the shift
            (the final polish, where the hyperparameters are fixed and the
            precision was sent in its first sweep).
        """
        if precision_sum is None:
            precision_sum = np.sum([s.precision for s in statistics], axis=0)
        m, C = optimal_global_factor(
            precision_sum, np.sum([s.shift for s in statistics], axis=0))
        values = self.global_pack.unpack(self.theta_global)
        values.update(m_g=m, C_g=C)
        self.theta_global = self.global_pack.pack(values)

    def global_values(self):
        """Unpacked global block (constrained values).

        Returns
        -------
        dict
            Name to value, as laid out by :func:`skfedgp._hierarchy.global_spec`
            (inputs in the scaled unit-box coordinates, variances in
            standardised units).
        """
        return self.global_pack.unpack(self.theta_global)


# --------------------------------------------------------------------------
# the training loop
# --------------------------------------------------------------------------


def run_federated_training(clients, server, config, *, n_rounds, n_jobs=None,
                           seeds=None, verbose=0):
    """Set-up exchange followed by ``n_rounds`` communication rounds.

    Parameters
    ----------
    clients : list of Client
    server : Server
    config : ModelConfig
    n_rounds : int
    n_jobs : int or None
        Passed to :class:`joblib.Parallel` for the clients' local steps.
    seeds : list of int
        Per-client initialisation seeds.
    verbose : int
        If > 0, print one line per round (ELBO, time, bytes).

    Returns
    -------
    clients : list of Client
        Updated clients (process-based backends return copies).
    elbo_history : list of float
    communication : list of dict
        One entry per exchange: ``round`` (0 = set-up), ``bytes_up``,
        ``bytes_down``, ``n_messages``.
    """
    T = len(clients)
    summaries = [c.summary() for c in clients]
    init = server.initialise(summaries)
    for c, seed in zip(clients, seeds):
        c.initialise(init, config, seed)
    communication = [{
        "round": 0,
        "bytes_up": int(sum(message_nbytes(s) for s in summaries)),
        "bytes_down": T * message_nbytes(init),
        "n_messages": T,
    }]
    elbo_history = []
    gpack = server.global_pack
    closed_global = config.variational_update == "closed_form" and "m_g" in gpack.slices
    where = [0]
    try:
        clients = _mean_field_rounds(clients, server, config, n_rounds, n_jobs, verbose, gpack,
                                     closed_global, communication, elbo_history, where)
    except ValueError as exc:
        # a kernel parameter out of its valid range (e.g. a variance sent to
        # exp(-1000) = 0); FloatingPointError and CholeskyError already name
        # the client and round, and keep their types
        if isinstance(exc, np.linalg.LinAlgError):  # a ValueError subclass
            raise
        stage = f"in round {where[0]}" if where[0] <= n_rounds else "in its final polish"
        raise ValueError(
            f"the mean-field fit failed {stage}: {exc}. With Adam steps this means the "
            "parameters left their valid range: lower learning_rate (now "
            f"{config.learning_rate:g}) or global_learning_rate (now "
            f"{config.global_learning_rate:g})") from exc
    return clients, elbo_history, communication


def _mean_field_rounds(clients, server, config, n_rounds, n_jobs, verbose, gpack,
                       closed_global, communication, elbo_history, where):
    """The rounds and the final polish of :func:`run_federated_training`.

    Appends to ``communication`` and ``elbo_history`` and keeps the round
    under way in ``where[0]`` (``n_rounds + 1``: the polish); returns the
    clients (copies under process-based backends).
    """
    T = len(clients)
    with Parallel(n_jobs=n_jobs) as parallel:
        for r in range(1, n_rounds + 1):
            where[0] = r
            t0 = time.perf_counter()
            up = down = n_msg = 0
            if closed_global:
                # phase A: exact q(v_g) at the current global hyperparameters
                bc = server.broadcast(r)
                out = parallel(delayed(_client_statistics)(c, bc, config, gpack) for c in clients)
                clients = [o[0] for o in out]
                server.set_global_factor([o[1] for o in out])
                up += sum(message_nbytes(o[1]) for o in out)
                down += T * message_nbytes(bc)
                n_msg += T
            bc = server.broadcast(r)
            out = parallel(delayed(_client_round)(c, bc, config, gpack) for c in clients)
            clients = [o[0] for o in out]
            updates = [o[1] for o in out]
            elbo = server.apply(updates)
            elbo_history.append(elbo)
            communication.append({
                "round": r,
                "bytes_up": int(up + sum(message_nbytes(u) for u in updates)),
                "bytes_down": int(down + T * message_nbytes(bc)),
                "n_messages": n_msg + T,
            })
            if verbose > 0:
                print(
                    f"[skfedgp] round {r:3d}/{n_rounds}  ELBO {elbo: .6e}  "
                    f"time {time.perf_counter() - t0:6.2f}s  "
                    f"up {communication[-1]['bytes_up']} B  down {communication[-1]['bytes_down']} B",
                    flush=True,
                )
        where[0] = n_rounds + 1
        # -- polish: every Gaussian factor to its exact optimum at the final
        #    hyperparameters (coordinate ascent on cached Gram matrices), then
        #    the ELBO of exactly the returned model --------------------------------
        bc = server.broadcast(n_rounds + 1)
        out = parallel(delayed(_client_polish_start)(c, bc, config, gpack) for c in clients)
        clients = [o[0] for o in out]
        up = down = n_msg = 0
        has_g = "m_g" in gpack.slices
        # the sweeps are M-sized work on each client's cached Gram matrices: a
        # plain loop (dispatching them through joblib would cost far more)
        precision_sum = None
        for sweep in range(POLISH_MAX_SWEEPS):
            if has_g:
                # the hyperparameters are fixed, so W_g^T W_g / s2_i is sent once;
                # later sweeps send only the M-vector
                stats = [_client_polish_stats(c, bc, config, gpack, sweep > 0)
                         for c in clients]
                if precision_sum is None:
                    precision_sum = np.sum([m.precision for m in stats], axis=0)
                old_g = server.theta_global.copy()
                server.set_global_factor(stats, precision_sum=precision_sum)
                up += sum(message_nbytes(m) for m in stats)
                n_msg += T
                bc = server.broadcast(n_rounds + 1)
                down += T * message_nbytes(bc)
            out = [_client_polish_local(c, bc, config, gpack) for c in clients]
            change = max([o[1] for o in out] + (
                [float(np.max(np.abs(server.theta_global - old_g)))] if has_g else [0.0]))
            if change < POLISH_TOL:
                break
        out = parallel(delayed(_client_final_value)(c, bc, config, gpack) for c in clients)
        clients = [o[0] for o in out]
        finals = [o[1] for o in out]
        kl_value, _ = server_objective(server.theta_global, gpack)
        elbo = kl_value + sum(f.objective for f in finals)
        server.population = _population_from(
            [f.hyperparameters for f in finals], config.components)
        up += sum(message_nbytes(f) for f in finals)
        down += T * message_nbytes(bc)
        communication.append({"round": n_rounds + 1, "bytes_up": int(up),
                              "bytes_down": int(down), "n_messages": n_msg + 2 * T,
                              "final": True})
        if not np.isfinite(elbo):
            raise FloatingPointError(f"the final ELBO is not finite ({elbo})")
        if elbo_history:
            elbo_history[-1] = float(elbo)
        else:
            elbo_history.append(float(elbo))
    return clients


#: The final polish of the mean-field factors stops when no whitened
#: variational parameter moves by more than this in a sweep ...
POLISH_TOL = 1e-9
#: ... or after this many sweeps (each is ``M``-sized work on cached Gram
#: matrices plus one exchange of M x M statistics).
POLISH_MAX_SWEEPS = 2000


def _client_polish_start(client, bc, config, gpack):
    from ._hierarchy import factor_grams

    client._grams = factor_grams(bc.theta_global, client.theta_local, client._Xs,
                                 client._y_std, gpack, client.local_pack, config.components,
                                 client=client.client_id)
    return client, None


def _client_polish_stats(client, bc, config, gpack, shift_only=False):
    from ._hierarchy import global_statistics_from_grams

    p, sh = global_statistics_from_grams(bc.theta_global, client.theta_local, client._grams,
                                         gpack, client.local_pack, config.components)
    return ClientStatistics(round=bc.round, precision=None if shift_only else p, shift=sh)


def _client_polish_local(client, bc, config, gpack):
    from ._hierarchy import local_factors_from_grams

    old = client.theta_local
    client.theta_local = local_factors_from_grams(bc.theta_global, old, client._grams, gpack,
                                                  client.local_pack, config.components)
    return client, float(np.max(np.abs(client.theta_local - old))) if old.size else 0.0


@single_threaded_blas()
def _client_final_value(client, bc, config, gpack):
    value, _, _ = client_objective(bc.theta_global, client.theta_local, client._Xs,
                                   client._y_std, gpack, client.local_pack, config.components,
                                   need_global_grad=False, client=client.client_id)
    B = client.local_values()
    msg = LocalHyperparameters(B.get("lengthscale_l"), B.get("variance_l"),
                               B["noise_variance"])
    client._grams = None
    client.forget_data()
    return client, ClientUpdateValue(bc.round, float(value), msg)


@dataclass(frozen=True)
class ClientUpdateValue:
    """Final upload of a mean-field client: its objective and local hyperparameters.

    Attributes
    ----------
    round : int
    objective : float
        ``E_i - KL(q(w_i)) - KL(q(v_i))`` at the polished factors.
    hyperparameters : LocalHyperparameters
    """

    round: int
    objective: float
    hyperparameters: object

    def nbytes(self):
        return 16 + message_nbytes(self.hyperparameters)


# ==========================================================================
# structured (collapsed) variational family
# ==========================================================================
#
# docs/maths.md, "Structured (collapsed) posterior"; skfedgp._structured.
# Each *evaluation* of the collapsed ELBO at a global vector is two
# exchanges: (1) the server broadcasts the global vector, each client uploads
# StructuredStatistics (S_i, b_i, e_i); (2) the server broadcasts
# PosteriorBroadcast (mu_g, A^{-1}), each client uploads the gradient of the
# ELBO with respect to the global vector (GlobalGradient).  A round is a
# local phase (every client maximises its own part of the bound with
# q(v_g) fixed -- no communication, monotone) followed by a global phase
# (L-BFGS-B or Adam steps of the server on the global vector).

#: Bounds of the log-parametrised hyperparameters (scaled input units,
#: standardised target units).
LOG_BOUNDS = {
    "lengthscale_g": (1e-3, 1e3),
    "lengthscale_l": (1e-3, 1e3),
    "variance_g": (1e-6, 1e6),
    "variance_l": (1e-6, 1e6),
    "phi": (1e-6, 1e4),
    "level_variance": (1e-8, 1e8),
    "noise_variance": (NOISE_FLOOR, 1e4),
    "shared_amplitude": (1e-12, 1e12),
}
#: Standard deviation (natural-log units) of the prior on a client's amplitude
#: on the shared parts, ``log a_i ~ N(log a_c, CLIENT_SCALE_PRIOR_SD^2)``
#: (:meth:`StructuredClient.log_prior`).
CLIENT_SCALE_PRIOR_SD = 3.0
#: ``client_scale="auto"``: a client learns its scale when its variance ratio
#: to the population has at most this chance on either side for a client of
#: its size on the population's scale (:func:`learns_client_scale`).
CLIENT_SCALE_CHANCE = 1e-3
#: ``client_scale="auto"``: a client also learns its scale when its own pilot's
#: lengthscales are more than this many times the population's (or less than
#: its inverse; geometric mean over the inputs) and its own data reject the
#: population's lengthscales (:func:`lengthscale_mismatch`).
CLIENT_LENGTHSCALE_RATIO = 5.0

#: :func:`input_scale_mismatch` reports an input along which a client's own
#: pilot lengthscale is more than this many times the typical client's (or
#: less than its inverse) and its own rows confirm it ...
INPUT_SCALE_RATIO = 10.0
#: ... when its width (range) along that input is also more than this many
#: times the typical client's the same way.
INPUT_WIDTH_RATIO = 3.0
#: Penalised-complexity prior of a client's local standard deviation: rate
#: ``ln(20) / sigma_pop`` (P(sigma_l > sigma_pop) = 0.05), ``sigma_pop`` the
#: larger of the pilots' median signal std and the client's own target std.
LOCAL_SD_RATE = float(np.log(20.0))
#: Smallest start of the clients' level variance (standardised units): the
#: spread of the clients' means when they agree, so the level can grow.
LEVEL_START_MIN = 1.0
#: Shape ``a`` of the gamma hyperprior on the standard deviation ``tau`` of
#: the clients' random levels, with rate 0: ``log p(tau) = (a - 1) log tau``
#: (:func:`level_log_prior`). ``a = 2`` is the boundary-avoiding prior of
#: Chung, Rabe-Hesketh, Dorie, Gelman and Liu (2013), "A nondegenerate
#: penalized likelihood estimator for variance parameters in multilevel
#: models", Psychometrika 78(4), section 3: it keeps the estimate off 0 when
#: the data hardly tell the group-level variance (few clients, clients on
#: disjoint input ranges) and moves it little when they do.
LEVEL_PRIOR_SHAPE = 2.0
#: The upper bound of ``level_variance`` is at least this many times the
#: spread of the clients' means (standardised units; LOG_BOUNDS otherwise).
LEVEL_BOUND_FACTOR = 100.0
#: Spread of the clients' mean targets, in within-client standard deviations,
#: beyond which the mean-field family may lose floating-point precision (a
#: UserWarning; the structured family centres each client at its own mean).
#: Probe, one of three clients of 40 points on a level L = 1e7 (the others at
#: 0, noise sd 0.05): mean-field RMSE 83 with predictive sd 5300 (at L = 1e3:
#: 0.05 and 0.5); the structured family, before it centred the clients, had
#: that client's noise at its floor and 90 % of its readings beyond 3 std for
#: L = 3e6 and 1e7, and now 0 % (RMSE 0.054).
LEVEL_PRECISION_LIMIT = 1e6
#: ``n_inducing="auto"``: about this many inducing points per lengthscale
#: along each input dimension (:func:`auto_inducing`) ...
AUTO_PER_LENGTHSCALE = 2.5
#: ... and at least this many global inducing points, at most the larger of
#: this many and what :data:`AUTO_EVALUATION_BUDGET` affords (never more than
#: the total number of observations) ...
AUTO_MIN_INDUCING = 10
AUTO_MAX_INDUCING = 256
#: ... and at most this share of the observations: beyond it a fit costs far
#: more and gains nothing (6 clients x 30 points in 2-D: M = 180 took 316 s,
#: 92 rounds, held-out NLL 0.03 and 4.3 % beyond 3 std; M = 64, 7 s, -0.34
#: and 2.8 %; 5 clients x 300 points of KIN40K, 8-D: M = 899 had not finished
#: after 20 min, M = 375 took 7 min), except that up to this many are always
#: allowed (a small problem stays cheap with as many as it has points) ...
AUTO_MAX_SHARE = 0.25
AUTO_SHARE_FLOOR = 64
#: Where that share caps ``M``, the server checks how much of the prior
#: variance the design leaves unexplained over the region the clients cover
#: (:func:`design_share`: ``1 - mean q(x, x) / k(x, x)`` at
#: :data:`AUTO_GROW_POINTS` Sobol points of the union of the clients'
#: boxes, at the starting lengthscales; no data needed). If that is above
#: :data:`AUTO_GROW_START`, it grows ``M`` by a quarter while the share is
#: above :data:`AUTO_GROW_SHARE`, up to :data:`AUTO_GROW_MAX_SHARE` of the
#: observations and at most :data:`AUTO_GROW_MAX` points (what a federation
#: of ``4 x 512`` = 2048 observations gets anyway, so the cost stays within
#: what that size costs) and the budget. KIN40K (8-D), 5 clients x 200
#: points, left 20 % of the prior variance unexplained at ``M = 250`` and
#: 11 % at 500; the RMSE went from 1.17-1.39 to 1.07-1.14 times a pooled
#: exact GP's (docs/maths.md, section 11). The stop is low because
#: training shortens the lengthscales (the share of the used design is
#: then larger than checked); it is the share at which a held design starts
#: learning its inducing inputs (:data:`AUTO_LEARN_RESIDUAL`, 1 %).
AUTO_GROW_SHARE = 0.01
#: ... but growth starts only where the design of ``max(64, N / 4)`` points
#: leaves more than this share: below it, growing bought little for its
#: cost (4 clients x 200 points of a 6-D function with noise sd 0.02-0.2,
#: share 2-3 %: ``M`` 200 to 392 took 427-585 s instead of about 30 s, 61
#: rounds instead of 18, for an RMSE 6 % lower, already 0.92 times a pooled
#: exact GP's without growth; 4 x 150 points of 4-D and 6-D functions with
#: shares 3-5 % do lose: RMSE 1.12-1.37 times the exact GP's at 150 points,
#: 0.98-1.15 at 300).
AUTO_GROW_START = 0.05
#: A client without a reliable pilot starts its noise variance at least at the
#: shared parts' prior variance that the global inducing points leave
#: unexplained at its inputs when that is at most this share of the prior
#: (StructuredClient._shared_residual): the same share above which the design
#: clearly does not cover the inputs.
NOISE_START_MAX_SHARE = AUTO_GROW_START
AUTO_GROW_MAX_SHARE = 0.5
AUTO_GROW_MAX = 512
AUTO_GROW_POINTS = 2048
#: Multiply-adds of one client forward pass summed over the clients (about
#: ``n_i (M + m_i)^2 + 4 (M + m_i)^3`` each, ``m_i`` its local inducing
#: points) that ``n_inducing="auto"`` may spend: roughly one to five seconds
#: per ELBO evaluation (forward and backward) on one core.
AUTO_EVALUATION_BUDGET = 2e10
#: ... and at most this many local ones per client (never more than its
#: number of observations; a client with at most that many distinct inputs
#: uses them all, which makes its local part exact).
AUTO_MAX_LOCAL = 64
#: A client's pilot exact GP uses at most this many of its observations.
PILOT_MAX_POINTS = 256
#: Starting lengthscales (from the pilots) are at most this many times the
#: span of the inputs along each dimension (:func:`start_lengthscale`).
START_MAX_SPANS = 5.0
#: Fewest observations for a client to run a pilot fit.
PILOT_MIN_POINTS = 5
#: At most this many starting lengthscales per pilot fit (:func:`pilot_starts`).
PILOT_MAX_STARTS = 3
#: A pilot on fewer points starts once, at ``sqrt(d)`` (:func:`pilot_fit`).
PILOT_MULTI_START_POINTS = 32
#: The finest starting lengthscale of a pilot (standardised units) is at
#: least this (ten times the optimiser's lower bound).
PILOT_MIN_START = 1e-2
#: A pilot in several inputs also starts from each input's own lengthscale,
#: fitted on that input alone (:func:`marginal_lengthscales`), when it has
#: :data:`OWN_NOISE_POINTS_PER_PARAMETER` points per hyperparameter (enough
#: to tell its ARD lengthscales apart).
PILOT_MARGINAL_START = True
#: Those one-input fits use at most this many of the pilot's points.
PILOT_MARGINAL_POINTS = 128
#: Largest value of such a start (standardised units): an input that explains
#: nothing alone starts where the kernel is flat along it, not at the bound.
PILOT_MAX_MARGINAL_START = 1e2
#: Starting lengthscales of a pilot, as factors of ``sqrt(d)``, where the
#: inputs' nearest-neighbour distance is not below ``sqrt(d) / 3`` (high
#: dimensions, few points; :func:`pilot_starts`): the typical distance
#: first, then a finer and a much coarser start.
HIGH_DIM_PILOT_FACTORS = (1.0, 1.0 / 3.0, 10.0)
#: Clients with at least :data:`PILOT_POOL_MIN_POINTS` and fewer than this
#: many observations also fit one pooled pilot together (:func:`pool_evidence`,
#: :meth:`_StructuredRun._pooled_noise`): in the weighted median that sets the
#: population's noise variance their pooled value, weighted by their points,
#: stands in for their own pilots', which interpolate a handful of points.
#: Probe, 30 clients of 4-8 points (1-D, noise variance 0.01): the pilots'
#: median noise variance 0.0031, the pooled one 0.0084, an exact GP over all
#: clients 0.009.
PILOT_POOL_POINTS = 32
#: A client (1-D targets, with a pilot) has no noise hyperprior (its data
#: decide; the centre, unused by the prior, is its own pilot's noise
#: variance) when it has at least :data:`PILOT_POOL_POINTS`
#: observations and, among the points its pilot uses, this many per
#: hyperparameter of the pilot (``d + 2``: the lengthscales, the signal and
#: the noise variance; :func:`own_noise_centre`). PUMADYN-32nm, a client
#: of 100 points in 32-D: its pilot's noise variance was below 1e-4 of its
#: targets' (it interpolated), and centred there its band was too narrow
#: (6 % of test points beyond 3 std against 1.5 % with the population's
#: centre).
OWN_NOISE_POINTS_PER_PARAMETER = 10
#: A client (1-D targets) whose rows repeat inputs and give at least this
#: many pure-error degrees of freedom (observations minus distinct input
#: rows) centres its noise hyperprior on its pure-error variance, the
#: spread of its targets around their means at repeated inputs
#: (:func:`pure_error_variance`), unless its own pilot is reliable
#: (:func:`own_noise_centre`; then it has no noise hyperprior). That
#: estimate needs no model: its relative
#: standard deviation is ``sqrt(2 / df)``, 0.45 at 10 degrees of freedom,
#: against the several log units by which clients' noise can differ.
PURE_ERROR_MIN_DOF = 10
#: Fewest observations of a client in the pooled pilot.
PILOT_POOL_MIN_POINTS = 4
#: The pooled pilot runs only with at least this many such clients ...
PILOT_POOL_MIN_CLIENTS = 3
#: ... holding at least this many observations in all.
PILOT_POOL_MIN_TOTAL = 30
#: A pooled client whose restricted log-likelihood per observation at the
#: pooled optimum lies more than this many standard deviations below the
#: median is left out and the pool is fitted again once: one gross outlier
#: would otherwise set every client's noise centre. The standard deviation
#: is the larger of the robust spread over the pooled clients (1.4826 x the
#: median absolute deviation) and the client's own sampling standard
#: deviation under the pooled model, ``sqrt(1 / (2 n_i))`` (its quadratic
#: form is chi-squared with about ``n_i`` degrees of freedom): with a few
#: clients the robust spread alone can be far below what chance gives, and
#: clients whose noise draws were merely larger were left out.
PILOT_POOL_OUTLIER_Z = 5.0
#: The pooled pilot's noise variance counts only when the pool identifies it:
#: the conditional standard error of its log (given the pool's other
#: hyperparameters), ``1 / sqrt(sum_i I_i)`` over the pooled clients'
#: expected Fisher informations ``I_i`` at the optimum (:func:`pool_evidence`),
#: at most this (log units: a factor ``e``; the marginal one, with the
#: lengthscales and variance unknown too, is larger). The pool models the
#: clients as independent draws, so only pairs of points within a client
#: inform it; in several inputs a client's handful of points lies too far
#: apart to tell noise from short-scale signal. 30 clients of 10 rows in 5
#: inputs, each with its own smooth departure (noise variance 0.0079 in
#: standardised units): 2.0, pooled noise 0.003, and the clients' noise
#: hyperprior centred there left 5.3 % of held-out points beyond 3 std;
#: without departures about 0.5-0.7, in 1-2 inputs 0.06-0.21. The
#: weighted median of the pilots that did not interpolate
#: (:func:`population_noise`, the pooled clients' own among them) then
#: stays, when there are such pilots (there 0.016: 1.3 % beyond 3 std, as
#: an exact GP with one-hot client columns); else the pool's value is
#: kept as before.
PILOT_POOL_MAX_NOISE_SE = 1.0


def own_noise_centre(n_samples, n_features):
    """Whether a client's own pilot is reliable: then it has no noise hyperprior.

    True with at least :data:`PILOT_POOL_POINTS` observations and
    :data:`OWN_NOISE_POINTS_PER_PARAMETER` per hyperparameter of the pilot
    (``n_features + 2``) among the points the pilot uses (at most
    :data:`PILOT_MAX_POINTS`); otherwise a client whose rows repeat inputs
    with at least :data:`PURE_ERROR_MIN_DOF` pure-error degrees of freedom
    centres it on its pure-error variance (:func:`pure_error_variance`), and
    any other client on the population's noise variance (docs/maths.md,
    section 10, "Noise hyperprior"). Used for 1-D targets by clients that
    ran a pilot; multi-output clients always take the population's centre.

    Parameters
    ----------
    n_samples : int
        The client's number of observations.
    n_features : int
        Number of input features.

    Returns
    -------
    bool
    """
    return (n_samples >= PILOT_POOL_POINTS
            and min(n_samples, PILOT_MAX_POINTS)
            >= OWN_NOISE_POINTS_PER_PARAMETER * (n_features + 2))


def pure_error_variance(X, y):
    """Pure-error variance of targets at repeated inputs.

    Rows of ``X`` that are exactly equal form a group; the pure-error sum of
    squares is the sum over groups of the squared deviations of ``y`` from
    the group's mean, and its degrees of freedom are ``n`` minus the number
    of distinct rows (the replication error of the classical lack-of-fit
    test; Draper and Smith, "Applied Regression Analysis", 3rd ed., Wiley
    1998, section 2.1). It estimates the noise variance whatever the
    function, since the function is the same at equal inputs.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        Inputs.
    y : ndarray of shape (n_samples,)
        Targets.

    Returns
    -------
    variance : float
        The pure-error sum of squares over its degrees of freedom (NaN with
        no degree of freedom).
    dof : int
        Degrees of freedom: ``n_samples`` minus the number of distinct rows.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    if y.size == 0:
        return float("nan"), 0
    _, inverse, counts = np.unique(X.reshape(len(X), -1), axis=0,
                                   return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    dof = int(len(y) - len(counts))
    if dof <= 0:
        return float("nan"), 0
    means = np.bincount(inverse, weights=y) / counts
    ss = float(np.sum((y - means[inverse]) ** 2))
    return ss / dof, dof


@dataclass(frozen=True)
class PilotSummary:
    """Set-up upload: hyperparameters of a client's quick exact GP.

    A client fits an exact GP (an ARD squared-exponential kernel times a
    constant, plus white noise; maximum marginal likelihood as scikit-learn's
    ``GaussianProcessRegressor`` does it, :func:`_pilot_gp`) on at most
    :data:`PILOT_MAX_POINTS` of its own observations and reports only the
    fitted hyperparameters, ``d + 2`` numbers whatever ``n_i``; the server
    takes medians.

    Attributes
    ----------
    lengthscale : ndarray of shape (d,)
        Scaled input units.
    variance : float
        Signal variance (standardised target units).
    noise_variance : float
        Noise variance (standardised target units).
    noise_variance_target : float or None
        Multi-output clients: the median over outputs of the pilot noise in
        target-variance units divided by ``mean(y_scale^2)`` (the unit of
        ``noise="isotropic_target"``); None otherwise.
    noise_variance_outputs : ndarray of shape (Q,) or None
        Multi-output clients: each output's pilot noise variance
        (standardised units; an output whose pilot did not run takes the
        median of the others), the centre of ``noise="diagonal"``'s
        per-output hyperprior once pooled over the clients; None otherwise.
    noise_outputs_observed : ndarray of shape (Q,) or None
        Multi-output clients: 1.0 for the outputs whose pilot ran, 0.0 for
        the others (their entry of ``noise_variance_outputs`` is a stand-in,
        left out of the pooled centres and spread); None otherwise.
    residual_dof : float or None
        Scalar targets: the pilot's residual degrees of freedom, ``n -
        tr(S)`` with ``S = K (K + s2 I)^-1`` its smoother matrix on the
        ``n`` points it used (Hastie and Tibshirani, *Generalized Additive
        Models*, Chapman and Hall, 1990, section 3.5). Below
        :data:`PILOT_MIN_RESIDUAL_DOF` the pilot interpolates its points and
        its noise variance is not identified (:func:`noise_identified`);
        None: not computed (counted as identified).
    """

    lengthscale: np.ndarray
    variance: float
    noise_variance: float
    noise_variance_target: float = None
    residual_dof: float = None
    noise_variance_outputs: np.ndarray = None
    noise_outputs_observed: np.ndarray = None


#: A pilot with fewer residual degrees of freedom (``n - tr(S)``,
#: :attr:`PilotSummary.residual_dof`) has interpolated its points: its noise
#: variance sits at its lower bound whatever the noise, and it is left out of
#: the population's noise median (:func:`noise_identified`). Probe: clients of
#: 40 points in 3-D of ``make_hierarchical_regression`` (a part on a
#: lengthscale far below the inputs' spacing): half the pilots had 0.0
#: residual degrees of freedom at a noise variance of 1e-6 (their bound), the
#: others 10-28 at 0.2-0.45; noise-free smooth targets keep several (Branin on
#: 40 points 12, ``sin`` on 60 points 49) although their noise is at the bound.
PILOT_MIN_RESIDUAL_DOF = 1.0


#: Lower bound of the noise hyperprior's scale estimated from the pooled
#: small clients (:func:`noise_spread`): with a handful of clients the
#: estimate is itself uncertain (with 5 clients of 12 points, the 95 % upper
#: limit of the spread is above 1 even when the point estimate is 0), and a
#: tighter prior would impose the pool's own error on every small client.
NOISE_SPREAD_MIN = 0.5


#: The pooled clients are centred on their pooled noise variance, not on the
#: population's, when the two differ by more than this many times the pooled
#: clients' spread (log units; :meth:`_StructuredRun._pooled_noise`): small
#: clients of another noise level than the larger ones around them. Within
#: it the population's centre stays, with the distance added to the spread.
NOISE_POOLED_OFFSET = 2.0


def noise_spread(scores, informations, scale):
    """Spread of the small clients' log noise variances around the pooled one.

    A random-effects reading of the pooled pilot (:func:`pool_evidence`):
    client ``i``'s log noise variance is the pooled one plus
    ``delta_i ~ N(0, tau^2)``. At the pooled optimum each client's score
    ``u_i`` (the derivative of its restricted log-likelihood with respect to
    the log noise variance) and its expected Fisher information ``I_i`` give
    the one-step estimate ``delta_i = u_i / I_i`` with variance ``1 / I_i``,
    and ``tau^2`` is the DerSimonian-Laird moment estimate
    ``max(0, (Q - (k - 1)) / (sum I - sum I^2 / sum I))``,
    ``Q = sum I_i (delta_i - mean)^2`` (DerSimonian and Laird, "Meta-analysis
    in clinical trials", *Controlled Clinical Trials* 7(3), 1986).

    Parameters
    ----------
    scores, informations : array-like of shape (k,)
        ``u_i`` and ``I_i`` of the clients (entries with ``I_i <= 0`` are
        left out).
    scale : float
        The configured prior scale (``noise_prior_scale``): the result is at
        most this.

    Returns
    -------
    float or None
        ``tau`` clipped to ``[NOISE_SPREAD_MIN, scale]``; None (keep
        ``scale``) with fewer than :data:`PILOT_POOL_MIN_CLIENTS` clients or
        when their median standard error ``1 / sqrt(I_i)`` exceeds ``scale``
        (their own data cannot tell a spread below ``scale`` from one of
        ``scale``: a pooled fit that left the noise poorly identified would
        otherwise be imposed on every client).
    """
    u = np.asarray(scores, dtype=float).ravel()
    info = np.asarray(informations, dtype=float).ravel()
    ok = np.isfinite(u) & np.isfinite(info) & (info > 0)
    u, info = u[ok], info[ok]
    k = u.size
    if scale is None or k < PILOT_POOL_MIN_CLIENTS or np.median(1.0 / np.sqrt(info)) > scale:
        return None
    delta = u / info
    mean = float(np.sum(info * delta) / np.sum(info))
    q = float(np.sum(info * (delta - mean) ** 2))
    denom = float(np.sum(info) - np.sum(info**2) / np.sum(info))
    tau2 = max(0.0, (q - (k - 1)) / denom) if denom > 0 else 0.0
    return float(np.clip(np.sqrt(tau2), NOISE_SPREAD_MIN, scale))


def population_noise(pilots, sizes, return_identified=False):
    """The population's noise variance from the clients' pilots: a weighted median.

    The median of the pilots' noise variances weighted by ``sizes`` (the
    clients' numbers of observations), over the pilots whose noise is
    identified (:func:`noise_identified`) when those hold at least
    :data:`PURE_ERROR_MIN_DOF` residual degrees of freedom in all (the
    evidence a noise estimate needs elsewhere, e.g. from replicates);
    otherwise over every pilot (then the pilots say little about the noise
    either way, e.g. every one interpolated).

    Parameters
    ----------
    pilots : sequence of PilotSummary
    sizes : sequence of float
        One weight per pilot.
    return_identified : bool, default=False
        Also return whether the pilots identified the noise (the first
        case above); when they did not, a client of
        :data:`PILOT_POOL_POINTS` rows or more that would centre its noise
        hyperprior on this value has none.

    Returns
    -------
    float, or (float, bool) with ``return_identified``
    """
    pilots, sizes = list(pilots), list(sizes)
    keep = [i for i, p in enumerate(pilots) if noise_identified(p)]
    dof = sum(float(pilots[i].residual_dof) for i in keep
              if getattr(pilots[i], "residual_dof", None) is not None)
    known = all(getattr(pilots[i], "residual_dof", None) is not None for i in keep)
    identified = bool(keep) and not (known and dof < PURE_ERROR_MIN_DOF)
    if not identified:
        keep = range(len(pilots))
    value = _weighted_median([pilots[i].noise_variance for i in keep], [sizes[i] for i in keep])
    return (value, identified) if return_identified else value


def noise_identified(pilot):
    """Whether a pilot's noise variance is an estimate (it did not interpolate).

    Parameters
    ----------
    pilot : PilotSummary

    Returns
    -------
    bool
        False when ``pilot.residual_dof`` is below
        :data:`PILOT_MIN_RESIDUAL_DOF`; True otherwise (also when it is None).
    """
    r = getattr(pilot, "residual_dof", None)
    return r is None or not r < PILOT_MIN_RESIDUAL_DOF


#: A pilot kernel whose inputs are, at the median, farther than this many
#: lengthscales from their nearest neighbour is white noise at the inputs
#: (:func:`white_at_inputs`).
WHITE_PILOT_DISTANCE = 1.0


def white_at_inputs(X, lengthscale):
    """Whether an SE-ARD kernel is white noise at the inputs ``X``.

    A GP whose lengthscales are shorter than the gaps between the inputs
    leaves most points nearly uncorrelated with any other: at the data it
    can hardly be told from noise (with the noise at its bound it
    interpolates any targets). A pilot with such a kernel that interpolated
    its points identifies neither its lengthscale nor its noise. A pilot
    that interpolates noise-free data with lengthscales longer than the gaps
    is not white.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's inputs, all rows (the same units as ``lengthscale``).
    lengthscale : array-like of shape (d,)
        The kernel's lengthscales (positive).

    Returns
    -------
    bool
        True when the median over the points of the distance to the nearest
        other row, in lengthscales (``sqrt(sum_j ((x_j - x'_j) / l_j)^2)``;
        a repeated input is at distance 0), exceeds
        :data:`WHITE_PILOT_DISTANCE`: at least half the points then share
        less than ``exp(-1/2)`` (61 %) of their prior variance with any
        other; False for fewer than 2 rows or non-finite inputs.

    Notes
    -----
    Beyond the pFedHGP paper: an implementation device of the data-derived
    initialisation (docs/maths.md, section 11). A k-d tree query, ``O(n log
    n)`` for few inputs.
    """
    from scipy.spatial import cKDTree

    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] < 2 or not np.all(np.isfinite(X)):
        return False
    Xs = X / np.asarray(lengthscale, dtype=float)
    if not np.all(np.isfinite(Xs)):
        return False
    dist, _ = cKDTree(Xs).query(Xs, k=2)
    return bool(np.median(dist[:, 1]) > WHITE_PILOT_DISTANCE)


#: Population prior of the small clients' local kernels (round 2,
#: :meth:`_StructuredRun._share_local_prior`): at least this many clients with
#: :data:`PILOT_POOL_POINTS` observations or more must report their local
#: kernel, and the prior's standard deviation on each log local lengthscale and
#: on the log local variance (natural log: a factor e at one sd).
LOCAL_PRIOR_MIN_CLIENTS = 2
LOCAL_PRIOR_SD = 1.0

#: A client with fewer observations than this has ``log ell_l ~ N(log
#: ell_pop, LOCAL_PRIOR_SD^2)`` on each local lengthscale, ``ell_pop`` the
#: population's lengthscales (:meth:`StructuredClient.log_prior`): its few
#: points cannot tell which inputs its departure varies in (docs/maths.md,
#: section 13).
LOCAL_LENGTHSCALE_PRIOR_POINTS = PILOT_POOL_POINTS


@dataclass(frozen=True)
class LocalKernelSummary:
    """A local kernel's hyperparameters: a large client's report or the population's centre.

    Round 2 of training with scalar targets: every client with at least
    :data:`PILOT_POOL_POINTS` observations on the clients' typical scale sends
    its local lengthscales and the size of its fitted departure after its
    first local phase; the server sends the population's centre (mean size,
    size-weighted geometric mean of the lengthscales) to the clients with
    fewer observations, as the centre of a log-normal prior on their own
    local kernel (:meth:`_StructuredRun._share_local_prior`).

    Attributes
    ----------
    lengthscale : ndarray of shape (d,)
        Local lengthscales (scaled inputs).
    variance : float
        Variance of a local part (standardised units): from a large client,
        the size of its fitted departure (:meth:`StructuredClient.local_prior_summary`);
        from the server, the centre of the small clients' prior on their
        local variance.

    Notes
    -----
    Beyond the pFedHGP paper (whose local kernels have no shared prior):
    docs/maths.md, section 10, "A small client's local kernel". A plain
    message: it validates nothing and raises nothing; a report with a
    non-finite number is dropped by the transport like any message.
    """

    lengthscale: np.ndarray
    variance: float


#: Tiny variance (standardised units) added to a multi-output client's
#: per-output loading sums of squares inside the logarithm of their prior
#: (:meth:`ILMMStructuredClient.log_prior`), so that a row of zeros gives a
#: finite value and gradient.
LOADING_PRIOR_EPS = 1e-12


@dataclass(frozen=True)
class DepartureSummary:
    """Multi-output counterpart of :class:`LocalKernelSummary`: the size of a client's departure per output.

    Round 2 of training with multi-output (ILMM) targets: every client with
    at least :data:`PILOT_POOL_POINTS` rows on the clients' typical scale
    sends, after its first local phase, its local lengthscales (one ``d``
    vector, the geometric mean over its local latents weighted by their
    loadings' squared norms) and, per output ``q``, the prior variance of
    its local part ``sum_r B_l[q, r]^2`` and the squared norm
    ``sum_r B_d[q, r]^2`` of its deviation loadings (whose shared factor
    ``phi`` is the same for every client), and which outputs it observed;
    ``d + 3 Q`` numbers whatever its size. The server sends the population's centre (the means over the
    clients, the lengthscales' geometric mean weighted by the local
    variances) to the clients with fewer rows, as the centre of log-normal
    priors on their own local lengthscales and per-output loading sizes
    (:meth:`ILMMStructuredClient.log_prior`).

    Attributes
    ----------
    lengthscale : ndarray of shape (d,)
        Local lengthscales (scaled inputs).
    local : ndarray of shape (Q,)
        ``sum_r B_l[q, r]^2`` (standardised units). In the centre, 0 for an
        output without a prior: one no large client observed, or whose
        clients' local parts are all but switched off.
    deviation : ndarray of shape (Q,) or None
        ``sum_r B_d[q, r]^2`` (None without the deviation component); in the
        centre, 0 for an output no large client observed.
    observed : ndarray of shape (Q,) or None
        In a report, 1.0 for the outputs the client observed and 0.0 for the
        others (their rows are untrained and left out of the centre; a NaN
        would make the transport drop the message); None in the centre.

    Notes
    -----
    Beyond the pFedHGP paper (whose client loadings have no shared prior):
    docs/maths.md, section 12, "A small client's loadings". The departures
    are a random effect per client (Gelman et al., *Bayesian Data
    Analysis*, 3rd ed., 2013, section 5.3): a client with a handful of rows
    takes the others' sizes as its prior. A plain message: it validates
    nothing and raises nothing.
    """

    lengthscale: np.ndarray
    local: np.ndarray
    deviation: np.ndarray = None
    observed: np.ndarray = None


def ilmm_noise_spread(noise, centre, large):
    """Spread of the larger multi-output clients' log noise variances around the centre.

    Parameters
    ----------
    noise : ndarray of shape (C, Q)
        Each client's per-output pilot noise variances
        (:attr:`PilotSummary.noise_variance_outputs`); NaN for an output
        the client did not observe (left out).
    centre : ndarray of shape (Q,)
        The per-output centres (weighted medians over the clients).
    large : sequence of bool of length C
        The clients with at least :data:`PILOT_POOL_POINTS` rows (their
        pilots estimate their noise).

    Returns
    -------
    float or None
        ``sqrt(mean_{c, q} (log s2_cq - log centre_q)^2)`` over the large
        clients: the scale of a random effect's prior, the counterpart for
        multi-output targets of the pooled 1-D clients' :func:`noise_spread`
        (Gelman et al., *Bayesian Data Analysis*, 3rd ed., 2013, section
        5.3); the small clients' noise hyperprior takes the larger of it and
        :data:`NOISE_SPREAD_MIN` (:meth:`ILMMStructuredClient._initial_noise`).
        None with fewer than two large clients.
    """
    big = np.asarray(large, dtype=bool)
    if big.sum() < 2:
        return None
    V = np.asarray(noise, dtype=float)[big]
    c = np.asarray(centre, dtype=float)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(V) & (V > 0) & (c > 0)  # NaN: an output the client did not observe
    if not np.any(ok):
        return None
    dev = np.log(np.where(ok, V, 1.0)) - np.log(np.where(c > 0, c, 1.0))
    return float(np.sqrt(np.mean(dev[ok] ** 2)))


def _noise_centre_copy(value):
    """A noise hyperprior centre to save: a float, or a copy of a per-output array."""
    return float(value) if np.ndim(value) == 0 else np.array(value, dtype=float)


def departure_centre(reports, off):
    """The population's centre of the small clients' loading priors (multi-output targets).

    Parameters
    ----------
    reports : list of DepartureSummary
        The large clients' reports (:meth:`ILMMStructuredClient.local_prior_summary`).
    off : float
        A local variance at or below this (standardised units) counts as a
        switched-off local part: an output whose mean is below it gets no
        local prior (the clients need no local part there, and a small
        client that departs from them must still be able to switch its own
        on), as with scalar targets (:meth:`_StructuredRun._share_local_prior`).

    Returns
    -------
    DepartureSummary or None
        Per output, the means over the clients that observed it of
        ``sum_r B_l[q, r]^2`` and ``sum_r B_d[q, r]^2`` (the departures are a
        random effect per client: a mean, not a median, which would call them
        zero as soon as half the clients need none; Gelman et al., *Bayesian
        Data Analysis*, 3rd ed., 2013, section 5.3), 0 where there is no
        prior; the local lengthscales' geometric mean weighted by each
        client's total local variance. None when no output has a prior.
    """
    obs = np.array([np.asarray(m.observed, dtype=float) for m in reports])
    n = obs.sum(axis=0)
    keep = n > 0
    local = np.array([np.asarray(m.local, dtype=float) for m in reports]).sum(axis=0)
    local = np.where(keep, local / np.maximum(n, 1.0), 0.0)
    local[local <= off] = 0.0
    dev = None
    if all(m.deviation is not None for m in reports):
        dev = np.array([np.asarray(m.deviation, dtype=float) for m in reports]).sum(axis=0)
        dev = np.where(keep, dev / np.maximum(n, 1.0), 0.0)
    w = np.array([float(np.sum(m.local)) for m in reports])
    log_ell = np.log(np.array([np.asarray(m.lengthscale, dtype=float) for m in reports]))
    ell = np.exp(w @ log_ell / w.sum() if w.sum() > 0 else log_ell.mean(axis=0))
    if not np.any(local > 0) and (dev is None or not np.any(dev > 0)):
        return None
    return DepartureSummary(ell, local, dev)


@dataclass(frozen=True)
class PoolEvidence:
    """Set-up upload: one client's term of the pooled pilot's objective.

    The pooled pilot (:func:`pool_evidence`) gives every small client the
    same ``d + 2`` kernel hyperparameters; a client reports only its restricted
    log-likelihood at the broadcast value and the gradient, ``d + 3``
    numbers whatever its number of points.

    Attributes
    ----------
    value : float
        Restricted (constant mean integrated out) log marginal likelihood.
    grad : ndarray of shape (d + 2,)
        Its gradient with respect to ``(log lengthscale, log variance, log
        noise_variance)``.
    noise_information : float
        Expected Fisher information of the log noise variance,
        ``s2^2 tr(P^2) / 2`` (:func:`noise_spread`); 0 for a client of fewer
        than 2 points.
    """

    value: float
    grad: np.ndarray
    noise_information: float = 0.0


@dataclass(frozen=True)
class StructuredStatistics:
    """Upload of one client for one evaluation of the collapsed ELBO.

    Attributes
    ----------
    round : int
    precision : ndarray of shape (M, M)
        ``S_i`` (the client's Gaussian message on ``v_g``; docs/maths.md).
    shift : ndarray of shape (M,)
        ``b_i``.
    constant : float
        ``e_i``.
    log_prior : float
        The client's log hyperprior (:meth:`StructuredClient.log_prior`).
    """

    round: int
    precision: np.ndarray
    shift: np.ndarray
    constant: float
    log_prior: float = 0.0


@dataclass(frozen=True)
class PosteriorBroadcast:
    """Download: the exact ``q(v_g) = N(mean, covariance)`` at the broadcast global vector.

    Attributes
    ----------
    round : int
    mean : ndarray of shape (M,)
        ``mu_g = A^{-1} b``.
    covariance : ndarray of shape (M, M)
        ``A^{-1}``.
    """

    round: int
    mean: np.ndarray
    covariance: np.ndarray


@dataclass(frozen=True)
class GlobalGradient:
    """Upload: gradient of the ELBO with respect to the global vector (one client's share).

    Attributes
    ----------
    round : int
    grad_global : ndarray of shape (P,)
    """

    round: int
    grad_global: np.ndarray


@dataclass(frozen=True)
class LocalHyperparameters:
    """Final upload: a client's local kernel and noise hyperparameters.

    The server forms the population local block from them (the mean of the
    clients' local variances, the variance-weighted geometric mean of their
    local lengthscales, the geometric mean of their noise variances), used to
    predict for clients never seen in fit.

    Attributes
    ----------
    lengthscale : ndarray of shape (d,) or None
    variance : float or None
    noise_variance : float
    offset : float or ndarray of shape (Q,)
        The client's learned constant mean (standardised units; structured
        family). The server keeps the mean and the spread (sample
        (co)variance) over clients for unseen clients.
    coregionalisation : dict or None
        Multi-output targets: ``{"deviation": (R_d, Q, Q), "local": (R_l, Q, Q)}``,
        the outer products ``B[:, r] B[:, r]^T`` of the client's loadings;
        the server keeps their means for never-seen clients.
    offset_observed : ndarray of shape (Q,) or None
        Multi-output targets: 1.0 for each output the client observed at
        least once, else 0.0 (that output's constant mean was never learned
        and is left out of the population's mean and spread). None: all.
    scale : float or None
        The client's scale on the shared parts (structured family with
        ``client_scale``; None: not learned, 1).
    trace_nats, trace_nats_local, jitter_nats : float or None
        The trace term of the collapsed bound at the final vectors (nats;
        NaN if it could not be computed), its part from the client's local
        inducing inputs, and the jitter's scale: what the jitter on ``K_zz``
        leaves at most with the inducing inputs on the training inputs
        (:meth:`StructuredClient.trace_terms`). None: not sent (a client of
        an earlier version).
    n_observations : int or None
        The number of observed target values those terms are summed over.
    """

    lengthscale: np.ndarray
    variance: float
    noise_variance: float
    offset: float = 0.0
    coregionalisation: dict = None
    offset_observed: np.ndarray = None
    scale: float = None
    trace_nats: float = None
    trace_nats_local: float = None
    jitter_nats: float = None
    n_observations: int = None


def structured_global_spec(components, M, d):
    """Packer of the structured family's global vector (log-parametrised).

    Parameters
    ----------
    components : tuple of str
    M : int
    d : int

    Returns
    -------
    Packer
        ``Z_g`` (free), ``lengthscale_g``, ``variance_g``, ``phi`` and
        ``level_variance`` (log): the variance of the clients' random levels
        (every client's constant mean is ``N(0, level_variance)`` around the
        mean of the clients' means, standardised units).
    """
    from ._hierarchy import Packer

    spec = []
    if "global" in components or "deviation" in components:
        spec += [("Z_g", (M, d), "free"), ("lengthscale_g", (d,), "log"),
                 ("variance_g", (), "log")]
    if "deviation" in components:
        spec.append(("phi", (), "log"))
    spec.append(("level_variance", (), "log"))
    return Packer(spec)


def level_log_prior(gpack, theta_g, config, n_clients):
    """Log hyperprior of the clients' level variance and its gradient (packed scale).

    The gamma prior of shape :data:`LEVEL_PRIOR_SHAPE` and rate 0 on the
    levels' standard deviation ``tau`` (Chung et al. 2013, Psychometrika
    78(4), section 3), ``log p = (a - 1) log tau = (a - 1) theta / 2`` with
    ``theta = log tau^2`` the packed entry, used without the log-scale
    Jacobian (the estimate maximises the penalised likelihood in ``tau``).
    Maximum likelihood can put ``tau = 0`` when the clients' levels are
    not identified, e.g. clients on disjoint input ranges whose levels the
    shared function can absorb as a trend; every client is then predicted
    with no departure from the others where it has no data (docs/maths.md,
    section 13). ``config.noise_prior_scale=None`` switches it off with the
    other hyperpriors. With fewer than 2 clients there is none: the bound
    then falls like ``-log tau`` for large ``tau`` (one level, confounded
    with the shared function's constant), and with the prior's ``+log tau``
    the objective would rise towards the upper bound of ``tau``.

    Parameters
    ----------
    gpack : Packer
        Layout of the global vector (:func:`structured_global_spec`).
    theta_g : ndarray of shape (P_g,)
        Packed global vector.
    config : ModelConfig
    n_clients : int
        Number of clients in the model.

    Returns
    -------
    value : float
        ``(a - 1) log tau`` (nats; constants dropped); 0 without a level or
        with fewer than 2 clients.
    grad : ndarray of shape (P_g,)
        Its gradient with respect to ``theta_g``.
    """
    grad = np.zeros(gpack.size)
    sl = gpack.slices.get("level_variance")
    if sl is None or config.noise_prior_scale is None or n_clients < 2:
        return 0.0, grad
    w = 0.5 * (LEVEL_PRIOR_SHAPE - 1.0)
    grad[sl] = w
    return w * float(np.sum(np.asarray(theta_g, dtype=float)[sl])), grad


def structured_local_spec(components, M_local, d, client_scale=False):
    """Packer of one client's structured local vector (log-parametrised).

    Parameters
    ----------
    components : tuple of str
    M_local : int
    d : int
    client_scale : bool, default=False
        Whether the client learns its scale ``s_i`` on the shared parts (only
        with the global or the deviation component), parametrised by its
        amplitude ``a_i = s_i sqrt(variance_g)`` (the standard deviation of
        its shared global part, standardised units), which the global
        variance does not move.

    Returns
    -------
    Packer
        ``Z_l`` (free), ``lengthscale_l``, ``variance_l`` (log),
        ``noise_variance`` (log) and, with ``client_scale``,
        ``shared_amplitude`` (log). The client's level is a latent variable
        (its variance ``level_variance`` is global), not a hyperparameter.
    """
    from ._hierarchy import Packer

    spec = []
    if "local" in components:
        spec += [("Z_l", (M_local, d), "free"), ("lengthscale_l", (d,), "log"),
                 ("variance_l", (), "log")]
    spec.append(("noise_variance", (), "log"))
    if client_scale and ("global" in components or "deviation" in components):
        spec.append(("shared_amplitude", (), "log"))
    return Packer(spec)


def log_bounds(pack):
    """L-BFGS-B bounds of a log-parametrised packer (``None`` for free entries).

    Parameters
    ----------
    pack : Packer

    Returns
    -------
    list of (float or None, float or None)
    """
    out = [(None, None)] * pack.size
    for name, _, kind in pack.spec:
        if kind == "log" and name in LOG_BOUNDS:
            _set_log_bounds(out, pack.slices[name], *LOG_BOUNDS[name])
    return out


def check_in_bounds(name, value, given, bounds=None):
    """Clip a data-derived initial value into its range; refuse a given one outside it.

    Parameters
    ----------
    name : str
        Key of :data:`LOG_BOUNDS`.
    value : float or ndarray
        Initial value (scaled input units, standardised target units).
    given : bool
        Whether the user set it (then a value outside the range is an error).
    bounds : (float, float), optional
        The range, if not ``LOG_BOUNDS[name]`` (a client's own,
        :meth:`StructuredClient.value_range`).

    Returns
    -------
    float or ndarray

    Raises
    ------
    ValueError
        If a user-given value lies outside the range.
    """
    lo, hi = LOG_BOUNDS[name] if bounds is None else bounds
    v = np.asarray(value, dtype=float)
    if given and (np.any(v < lo) or np.any(v > hi)):
        raise ValueError(
            f"the initial {name} {value} (in the model's scaled units: inputs scaled to the "
            f"unit box, targets standardised) lies outside the optimiser's range "
            f"[{float(np.min(lo)):g}, {hi:g}]")
    v = np.clip(v, lo * 1.01, hi * 0.99)
    return float(v) if v.ndim == 0 else v


#: Smallest input width (scaled units, a share of the joint box) that
#: :func:`lengthscale_floor` follows.
MIN_INPUT_WIDTH = 1e-6


#: A lengthscale below the smallest gap between distinct values of an input
#: divided by this gives kernel values below ``exp(-8)`` (3.4e-4) between
#: any two distinct values of that input: the data cannot tell it from any
#: shorter one (:func:`resolution_floor`).
RESOLUTION_FACTOR = 4.0


def resolution_floor(X):
    """Shortest lengthscale the inputs can tell apart, per input dimension.

    Parameters
    ----------
    X : ndarray of shape (n, d)

    Returns
    -------
    ndarray of shape (d,)
        The smallest gap between distinct values of each input divided by
        :data:`RESOLUTION_FACTOR` and rounded down to a power of two (units
        of ``X``); 0 for an input with fewer than two distinct values.

    Notes
    -----
    With the SE kernel, at any lengthscale below this every pair of distinct
    values of that input has a kernel factor below ``exp(-8)``: the marginal
    likelihood is flat there, and an optimiser started short drifts to its
    bound. On inputs on a grid (integers, rounded values) that makes the
    function white noise between grid values and leaves inducing points
    between them useless (docs/maths.md, section 11, "Inputs on a grid").
    Beyond the pFedHGP paper: an implementation device.
    """
    X = np.asarray(X, dtype=float)
    out = np.zeros(X.shape[1])
    for j in range(X.shape[1]):
        u = np.unique(X[:, j])
        if u.size > 1:
            gap = float(np.min(np.diff(u))) / RESOLUTION_FACTOR
            # rounded down to a power of two: the bound only grows, and the
            # value (kept in the fitted model, sent in the pilot's message
            # where it binds) gives away no input, only an order of magnitude
            out[j] = 2.0 ** np.floor(np.log2(gap))
    return out


def lengthscale_floor(widths):
    """Lower bounds of the lengthscales, per input dimension (scaled units).

    :data:`LOG_BOUNDS`' lower end (``1e-3`` of the unit box) times the width
    of the clients' inputs when that is smaller than the box: a client whose
    inputs fill a sliver of the box (another client far away) can still
    resolve ``1e-3`` of its own extent. Never above the :data:`LOG_BOUNDS`
    value.

    Parameters
    ----------
    widths : ndarray of shape (d,)
        Width of the inputs per dimension (scaled units); zero or negative
        widths (a single point) leave that dimension's bound unchanged, and
        widths below :data:`MIN_INPUT_WIDTH` count as that (inputs that are
        numerically one point do not get lengthscales below ``1e-9`` of the
        box).

    Returns
    -------
    ndarray of shape (d,)

    Notes
    -----
    Beyond the pFedHGP paper (which uses one input range); docs/maths.md,
    section 11, "Rounds".
    """
    lo = LOG_BOUNDS["lengthscale_g"][0]
    w = np.asarray(widths, dtype=float)
    w = np.where(np.isfinite(w) & (w > 0), np.clip(w, MIN_INPUT_WIDTH, 1.0), 1.0)
    return lo * w


def _set_log_bounds(bounds, sl, lo, hi):
    """Set ``bounds[sl]`` to ``(log lo, log hi)`` in place.

    ``lo`` is a float, or one value per input dimension (an array of shape
    (d,)) for entries laid out dimension-last, such as ``(d,)`` or
    ``(R, d)`` lengthscales.
    """
    lo = np.asarray(lo, dtype=float)
    for k in range(sl.start, sl.stop):
        lo_k = lo if lo.ndim == 0 else lo[(k - sl.start) % lo.size]
        bounds[k] = (float(np.log(lo_k)), float(np.log(hi)))


def scale_ratio(own_variance, population):
    """A client's target variance over the population's, when clearly another scale.

    Parameters
    ----------
    own_variance : float
        The client's target variance (standardised units).
    population : PilotSummary
        The population's pilot values: medians of the pilots, the noise
        variance with the small clients pooled (:meth:`_StructuredRun._pooled_noise`;
        ``variance + noise_variance`` is the
        population's total variance).

    Returns
    -------
    float
        ``own_variance / (variance + noise_variance)`` when that is more than
        10 or less than 0.1, else 1: a client on another scale (other units,
        another sensor) takes the population's values in its own units, while
        the clients on one scale share them as they are (docs/maths.md
        section 10).
    """
    total = population.variance + population.noise_variance
    ratio = own_variance / total if own_variance > 0 and total > 0 else 1.0
    return ratio if (ratio > 10.0 or ratio < 0.1) else 1.0


def client_scale_ratio(own_variance):
    """A client's within-client variance over the clients' typical one, when clearly another scale.

    Parameters
    ----------
    own_variance : float
        The client's target variance in standardised units, whose unit is
        the median over clients of the within-client standard deviations
        (:meth:`Server.standardise`), so a typical client has about 1.

    Returns
    -------
    float
        ``own_variance`` when it is more than 10 or less than 0.1 (and
        positive), else 1. Unlike :func:`scale_ratio` this does not compare
        with the pilots' kernel variance, which long pilot lengthscales can
        make many times the data's spread (a 5-D trend: 9 against a spread
        of about 1, so a client of that same function looked 13 times
        flatter). Dimensionless.

    Notes
    -----
    Beyond the pFedHGP paper (whose shared parts have one scale for all
    clients); docs/maths.md, section 10, "The scale of the shared parts".
    """
    v = float(own_variance)
    return v if v > 0 and (v > 10.0 or v < 0.1) else 1.0


def shared_scale(local, global_values):
    """A client's scale ``s_i`` on the shared parts from its local and the global values.

    Parameters
    ----------
    local : dict
        The client's constrained local values; ``shared_amplitude`` ``a_i``
        when it learns its scale.
    global_values : dict
        The constrained global values (``variance_g``).

    Returns
    -------
    float
        ``a_i / sqrt(variance_g)`` (dimensionless), or 1 for a client that
        learns none.

    Raises
    ------
    KeyError
        If the client has an amplitude but ``global_values`` holds no
        ``variance_g``.

    Notes
    -----
    Beyond the pFedHGP paper; docs/maths.md, section 10: client ``i``'s
    function is ``level_i + s_i (g + d_i) + l_i``.
    """
    a = local.get("shared_amplitude")
    if a is None:
        return 1.0
    return float(a) / float(np.sqrt(global_values["variance_g"]))


def _test_rows(X, y, own):
    """The rows and starting values of the lengthscale tests on a client's own data.

    Shared by :func:`lengthscale_mismatch` and :func:`input_scale_mismatch`:
    at most :data:`PILOT_MAX_POINTS` evenly spaced rows, their centred
    targets and variance, and the pilot's noise share (its noise variance
    over its signal variance, within ``[1e-6, 10]``) to start the noise at.

    Returns
    -------
    X : ndarray of shape (m, d)
    yc : ndarray of shape (m,)
    variance : float
    noise_share : float
    """
    n = X.shape[0]
    if n > PILOT_MAX_POINTS:
        keep = np.round(np.linspace(0, n - 1, PILOT_MAX_POINTS)).astype(int)
        X, y = X[keep], y[keep]
    yc = y - y.mean()
    noise_share = float(np.clip(own.noise_variance / max(own.variance, 1e-12), 1e-6, 10.0))
    return X, yc, float(np.var(yc)), noise_share


def lengthscale_mismatch(X, y, own, population_lengthscale):
    """Whether a client's own data reject the population's lengthscales.

    The shared parts have the population's kernel; a client whose function
    varies on a far longer (or shorter) input scale than the others' (its
    inputs spread over a box many times wider, in other units) cannot use
    them at its own scale ``s_i = 1``: at the population's short lengthscale
    the shared prior is white noise at its inputs, and without its own scale
    the client explained its targets as noise, with the shared parts left on
    for the others (one of three clients, 30 rows of the others' function
    stretched over a box 100 times wider in 2-D: RMSE 0.42 against its own
    exact GP's 0.03) or pulled the shared lengthscale to its own (the
    others' RMSE up to 1.5 times their value without it).

    Only the inputs along which the client's rows vary count (``d`` of
    them). The population's lengthscales are rejected when the pilot's are
    more than :data:`CLIENT_LENGTHSCALE_RATIO` times theirs either way
    (geometric mean over those inputs) and the client's own data say so:
    two exact GPs (constant x ARD RBF + white noise, :func:`_pilot_gp`, as in
    :func:`pilot_fit`, on at most :data:`PILOT_MAX_POINTS` evenly spaced
    rows, inputs standardised per feature), one started at the pilot's
    lengthscales with every hyperparameter free and one with the
    lengthscales held at the population's, differ in log marginal
    likelihood by more than half the ``1 - CLIENT_SCALE_CHANCE`` quantile
    of ``chi2(d)`` (a likelihood-ratio test of the ``d`` lengthscales; a
    handful of rows cannot pass it by chance). With two clients the
    population's values are the median of both pilots, so both can be
    flagged; each then learns its scale.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's scaled inputs.
    y : ndarray of shape (n,)
        Its standardised targets.
    own : PilotSummary
        The client's own pilot (scaled units).
    population_lengthscale : ndarray of shape (d,)
        The population's lengthscales (scaled units).

    Returns
    -------
    bool

    Notes
    -----
    Beyond the pFedHGP paper; docs/maths.md, section 10, "The scale of the
    shared parts". The test: S. S. Wilks, "The large-sample distribution of
    the likelihood ratio for testing composite hypotheses", *Annals of
    Mathematical Statistics* 9(1), 1938.
    """
    from scipy.stats import chi2

    ell_own = np.asarray(own.lengthscale, dtype=float).ravel()
    ell_pop = np.asarray(population_lengthscale, dtype=float).ravel()
    X = np.asarray(X, dtype=float)
    if ell_own.shape != ell_pop.shape or ell_own.shape[0] != X.shape[1]:
        return False
    # only the inputs the client varies in: along a constant one its
    # lengthscale says nothing
    cols = np.ptp(X, axis=0) > 0
    ell_own, ell_pop, X = ell_own[cols], ell_pop[cols], X[:, cols]
    if not cols.any() or not (np.all(ell_own > 0) and np.all(ell_pop > 0)):
        return False
    ratio = float(np.exp(np.mean(np.log(ell_own / ell_pop))))
    if 1.0 / CLIENT_LENGTHSCALE_RATIO <= ratio <= CLIENT_LENGTHSCALE_RATIO:
        return False
    n, d = X.shape
    if n < PILOT_MIN_POINTS or np.var(y) < 1e-12:
        return False
    X, yc, v, noise_share = _test_rows(X, y, own)
    spread = X.std(axis=0)
    Xs = (X - X.mean(axis=0)) / spread
    fits = []
    for ell, bounds in ((ell_own / spread, (1e-3, 1e3)), (ell_pop / spread, "fixed")):
        try:
            gp = _pilot_gp(Xs, yc, v, np.clip(ell, 1e-3, 1e3), noise_share,
                           lengthscale_bounds=bounds)
        except (np.linalg.LinAlgError, ValueError):
            return False
        fits.append(float(gp.log_marginal_likelihood))
    gain = fits[0] - fits[1]
    return bool(np.isfinite(gain) and gain > 0.5 * chi2.ppf(1.0 - CLIENT_SCALE_CHANCE, d))


def input_scale_mismatch(X, y, own, population_lengthscale, population_width):
    """The inputs along which a client's own data vary on another scale than the typical client's.

    Behind :class:`~skfedgp.InputScaleWarning`, and, with client scales on,
    behind the set-up's :meth:`StructuredClient.input_scale_check` (such a
    client learns its own scale on the shared parts and is left out of the
    global design; docs/maths.md, section 10): an input in other units at one client
    (per cent beside fractions, seconds beside days) gives that client's
    function a lengthscale along it many times the others', although along
    its other inputs it agrees with them, so :func:`lengthscale_mismatch`
    (a geometric mean over the inputs) may not reject the population's
    lengthscales while the shared parts cannot serve both scales.

    The references are the typical client's, medians over the clients not
    weighted by their sizes (:class:`_PopulationPilot`'s
    ``input_lengthscale`` and ``input_width``), so that one large client in
    other units does not set them; with two clients the median is their
    midpoint, and a unit factor must exceed ``INPUT_SCALE_RATIO ** 2`` to
    be seen (three or more clients: a majority in one unit). For each
    input ``j`` the client varies in whose pilot lengthscale is more than
    :data:`INPUT_SCALE_RATIO` times the typical one either way, and whose
    width (the range of its inputs) is more than :data:`INPUT_WIDTH_RATIO`
    times the typical width the same way (other units change both; a
    client that only found an effect the others' lengthscales missed, on
    inputs spread as theirs, is not reported), two exact GPs on the
    client's rows (:func:`_pilot_gp`, at most :data:`PILOT_MAX_POINTS`
    evenly spaced rows, inputs standardised per feature) are compared:
    every lengthscale held at the typical client's, and the same with input
    ``j``'s free. The input is reported when the second is above the first
    by more than half the ``1 - CLIENT_SCALE_CHANCE`` quantile of
    ``chi2(1)``: a likelihood-ratio test of one lengthscale (S. S. Wilks,
    *Annals of Mathematical Statistics* 9(1), 1938), at a nominal level
    only: the inputs tested were chosen by the pilot on the same rows, and
    several inputs are tested without a correction.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's scaled inputs.
    y : ndarray of shape (n,)
        Its standardised targets.
    own : PilotSummary
        The client's own pilot (scaled units).
    population_lengthscale : ndarray of shape (d,) or None
        The typical client's pilot lengthscales (scaled units); None:
        nothing is reported.
    population_width : ndarray of shape (d,) or None
        The typical client's input widths (scaled units); None: nothing is
        reported.

    Returns
    -------
    dict
        ``{input index: ratio}``, the client's fitted lengthscale along the
        input (the free one of the second GP) over the typical client's;
        empty when no input is reported.

    Notes
    -----
    Beyond the pFedHGP paper; docs/maths.md, section 10, "Inputs on another
    scale".
    """
    from scipy.stats import chi2

    if population_lengthscale is None or population_width is None:
        return {}
    ell_own = np.asarray(own.lengthscale, dtype=float).ravel()
    ell_pop = np.asarray(population_lengthscale, dtype=float).ravel()
    w_pop = np.asarray(population_width, dtype=float).ravel()
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    if (ell_own.shape != (d,) or ell_pop.shape != (d,) or w_pop.shape != (d,)
            or n < PILOT_MIN_POINTS or np.var(y) < 1e-12
            or not (np.all(np.isfinite(ell_own)) and np.all(np.isfinite(ell_pop))
                    and np.all(ell_own > 0) and np.all(ell_pop > 0))):
        return {}
    spread = X.std(axis=0)
    width = np.ptp(X, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ell = np.log(ell_own / ell_pop)
        log_width = np.log(width / w_pop)
    # the lengthscale far off, and the width far off the same way
    far = ((np.abs(log_ell) > np.log(INPUT_SCALE_RATIO))
           & (np.sign(log_width) == np.sign(log_ell))
           & (np.abs(log_width) > np.log(INPUT_WIDTH_RATIO)))
    cand = np.flatnonzero(far & np.isfinite(log_width) & (width > 0) & (spread > 0))
    if not cand.size:
        return {}
    X, yc, v, noise_share = _test_rows(X, y, own)
    spread = np.where(spread > 0, spread, 1.0)
    Xs = (X - X.mean(axis=0)) / spread
    if not v > 0:
        return {}
    pop = ell_pop / spread  # held where it is, however far (standardised units)
    try:
        held = _pilot_gp(Xs, yc, v, pop, noise_share, lengthscale_bounds="fixed")
    except (np.linalg.LinAlgError, ValueError):
        return {}
    level = 0.5 * chi2.ppf(1.0 - CLIENT_SCALE_CHANCE, 1)
    out = {}
    for j in cand:
        start = pop.copy()
        start[j] = ell_own[j] / spread[j]
        bounds = np.column_stack([pop, pop])
        # the free lengthscale's usual range, widened to hold its start and
        # the typical client's value
        bounds[j] = (min(1e-3, pop[j], start[j]), max(1e3, pop[j], start[j]))
        try:
            free = _pilot_gp(Xs, yc, v, start, noise_share, lengthscale_bounds=bounds)
        except (np.linalg.LinAlgError, ValueError):
            continue
        gain = free.log_marginal_likelihood - held.log_marginal_likelihood
        ratio = float(np.asarray(free.lengthscale)[j] / pop[j])
        if (np.isfinite(gain) and gain > level
                and abs(np.log(ratio)) > np.log(INPUT_SCALE_RATIO)):
            out[int(j)] = ratio
    return out


def spread_chance(X, y, lengthscale, variance, noise_variance):
    """Chance that a client's rows spread this little under the population's GP.

    The rows' sum of squared deviations from their mean,
    ``S = sum_j (y_j - ybar)^2``, is under ``y ~ N(m 1, K + s2 I)`` (the
    population's kernel at the client's own inputs, any constant mean) a
    weighted sum of ``chi2(1)`` variables, its weights the non-zero
    eigenvalues of ``P (K + s2 I) P`` (``P`` the centring matrix). Its
    distribution function at the observed ``S`` is computed by Imhof's
    integral, kept between two bounds: ``chi2(k).cdf(S / lambda_max)``
    below and ``prod_j chi2(1).cdf(S / lambda_j)`` above (both exact with
    one weight, which is returned as such).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's inputs (scaled units).
    y : ndarray of shape (n,)
        Its targets (standardised units).
    lengthscale : ndarray of shape (d,)
    variance, noise_variance : float
        The population's pilot values (:class:`_PopulationPilot`), in the
        same units.

    Returns
    -------
    float
        ``P(S' <= S)``, in [0, 1]; 1 for fewer than 2 rows.

    Notes
    -----
    J. P. Imhof, "Computing the distribution of quadratic forms in normal
    variables", Biometrika 48(3/4), 1961, eq. 3.2. Used by
    :func:`learns_client_scale` (beyond the pFedHGP paper; docs/maths.md,
    section 10).
    """
    from scipy import integrate
    from scipy.stats import chi2

    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    n = y.size
    if n < 2:
        return 1.0
    K = se_ard(X, X, np.asarray(lengthscale, dtype=float), float(variance))
    K[np.diag_indices(n)] += float(noise_variance)
    P = np.eye(n) - 1.0 / n
    lam = np.linalg.eigvalsh(P @ K @ P)
    lam = lam[lam > 1e-12 * max(lam.max(), 0.0)]
    stat = float(np.sum((y - y.mean()) ** 2))
    if lam.size == 0:
        return 1.0
    # bounds: every term below S (upper), all weight on the largest (lower);
    # with one weight both are the exact chi2(1) value, where the integral
    # (decaying like u^-3/2) is not computed reliably
    upper = float(np.prod(chi2.cdf(stat / lam, 1)))
    lower = float(chi2.cdf(stat / lam.max(), lam.size))
    if lam.size == 1 or upper <= lower:
        return upper

    def integrand(u):
        theta = 0.5 * np.sum(np.arctan(lam * u)) - 0.5 * stat * u
        rho = np.prod((1.0 + (lam * u) ** 2) ** 0.25)
        return np.sin(theta) / (u * rho)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        val, _ = integrate.quad(integrand, 0.0, np.inf, limit=500)
    return float(np.clip(0.5 - val / np.pi, lower, upper))


def learns_client_scale(config, ratio, n_samples, own_variance=None, pilot_noise=None,
                        population_noise=None, other_input_scale=False, spread_chance=None):
    """Whether a client learns its scale ``s_i`` on the shared parts.

    Parameters
    ----------
    config : ModelConfig
        ``client_scale``: False (no client), True (every client) or
        ``"auto"``; only with the global or the deviation component.
    ratio : float
        The client's :func:`client_scale_ratio`.
    n_samples : int
        The client's number of rows.
    own_variance : float, optional
        The client's target variance (standardised units).
    pilot_noise : float, optional
        The noise variance of the client's own pilot fit (None: it ran none).
    population_noise : float, optional
        The population's noise variance (standardised units): the pilots'
        weighted median with the small clients pooled
        (:meth:`_StructuredRun._pooled_noise`).
    other_input_scale : bool, default=False
        Whether the client's own data reject the population's lengthscales
        (:func:`lengthscale_mismatch`) or vary along some input on another
        scale than the typical client's (:func:`input_scale_mismatch`).
    spread_chance : callable, optional
        A client without a usable pilot: returns the chance that its rows
        spread as little as they do under the population's GP at its own
        inputs (:func:`spread_chance`); called only when the decision needs
        it. None: its whole spread is compared with a tenth of
        ``population_noise`` instead.

    Returns
    -------
    bool
        With ``"auto"``: True when ``other_input_scale`` (the client's
        inputs are on another scale: the shared parts at the population's
        lengthscales cannot describe it at ``s_i = 1``), or when the client
        is clearly *in another unit* (or a nearly flat, noise-free series),
        which needs two things.

        1. Its spread is clearly another scale: ``ratio != 1`` and, since the
           variance of a few rows is itself uncertain, ``ratio`` outside the
           central ``1 - 2 CLIENT_SCALE_CHANCE`` interval of
           ``chi2(n - 1) / (n - 1)``, the ratio a client of ``n`` rows on the
           typical scale shows by chance (for 3 rows: below 1e-3; three noisy
           rows of a data-poor client often vary 10 times less by chance, and
           a scale learned from them put 21 % of the data-poor case's test
           points beyond 3 std, against 8 % without).
        2. Its noise is not the population's either: its own pilot's noise
           variance is more than 10 times off ``population_noise`` either
           way, or, without a usable pilot (fewer than
           :data:`PILOT_MIN_POINTS` rows, or a pilot that found no signal),
           its rows spread less than the population's GP (kernel
           and noise at the client's own inputs) lets them with chance
           :data:`CLIENT_SCALE_CHANCE` (``spread_chance``). Rows close
           together on a flat stretch of the shared function may spread
           little; rows far apart that agree are another unit. Compared
           with a tenth of ``population_noise`` instead (the rule before),
           4 rows on a flat stretch, a 6 % chance under noise alone, learned
           ``s_i = 0.62``, and 41 % of that client's held-out points over
           the whole range fell beyond 3 std.
           Spread alone does not tell another unit from a flat or steep part
           of the same function seen through the same sensor: a client of
           12 points on a flat stretch of the main job's function (seed 1,
           a tenth of the others' variance, the population's noise) learned
           ``s_i = 0.25`` and its held-out NLL went from 1.3 to 4.1 (the
           point estimate of ``s_i`` shrank the shared function where it
           was not flat).

        Clients on the population's scale keep ``s_i = 1``: learning it for
        every client adds a direction along which only the priors separate
        ``s_i`` from the global variance, and on data of one scale it led
        the optimiser to worse optima (the five-client exact-GP check of
        docs/maths.md, section 10: ELBO 25 against 40).

    Notes
    -----
    Beyond the pFedHGP paper; docs/maths.md, section 10, "The scale of the
    shared parts".
    """
    mode = getattr(config, "client_scale", False)
    if mode is False or not ("global" in config.components
                             or "deviation" in config.components):
        return False
    if mode is True or other_input_scale:
        return True
    if ratio == 1.0 or n_samples < 2:
        return False
    from scipy.stats import chi2

    k = n_samples - 1
    lo, hi = chi2.ppf([CLIENT_SCALE_CHANCE, 1.0 - CLIENT_SCALE_CHANCE], k) / k
    ratio = ratio * n_samples / k  # own_variance is np.var (ddof=0); chi2 is for ddof=1
    if not (ratio < lo or ratio > hi):
        return False
    if population_noise is None or not population_noise > 0:
        return True
    if pilot_noise is not None:
        r_noise = float(pilot_noise) / float(population_noise)
        return bool(r_noise > 10.0 or r_noise < 0.1)
    if spread_chance is not None:
        return bool(spread_chance() < CLIENT_SCALE_CHANCE)
    return bool(own_variance is not None and own_variance < 0.1 * float(population_noise))


def prior_scale(own_variance, population, pilot_noise=None):
    """Factor of a client's noise-hyperprior centre: its scale when clearly another unit.

    A client on a larger scale because it measures in another unit (x1000)
    gets the population's noise in its own units; without it the prior held
    its noise about 30 % low in std and its band too narrow (x1000: 1 % of
    held-out readings beyond 3 std, x1e6: 99.7 %). A larger target variance
    alone cannot tell another unit from more signal in the same unit (a
    client whose function is 30 times the others' but whose sensor noise is
    theirs), so when the client ran a pilot the factor is at most its pilot
    noise over the population's: in another unit both ratios are large, with
    more signal the noise ratio is about 1 and the centre stays the
    population's. A client with no pilot (fewer than
    :data:`PILOT_MIN_POINTS` rows) takes the variance ratio, as its initial
    values do. A client whose targets vary far less than the others' keeps
    the population's centre here: scaled down, a few of its points would
    become near-exact constraints on the shared function and deviation
    (three readings at 50 +/- 0.001 raised another client's RMSE by a
    third). If it learns its own scale on the shared parts
    (:func:`learns_client_scale`: another unit), those constraints are
    scaled too, and :meth:`StructuredClient.initialise` then centres its
    prior in its own units, ``r_i s2_pop`` with ``r_i`` its
    :func:`client_scale_ratio` (docs/maths.md section 10).

    Parameters
    ----------
    own_variance : float
        The client's target variance (standardised units).
    population : PilotSummary
        The population's pilot values (medians; the noise variance with the
        small clients pooled, :meth:`_StructuredRun._pooled_noise`).
    pilot_noise : float, optional
        The client's own pilot noise variance (standardised units); None if
        it ran no pilot.

    Returns
    -------
    float
        At least 1.
    """
    ratio = scale_ratio(own_variance, population)
    if ratio <= 1.0:
        return 1.0
    if pilot_noise is not None and np.isfinite(pilot_noise) and population.noise_variance > 0:
        ratio = min(ratio, max(1.0, float(pilot_noise) / population.noise_variance))
    return float(ratio)


def clip_to_bounds(theta, bounds):
    """Clip a vector into L-BFGS-B bounds."""
    lo = np.array([-np.inf if b[0] is None else b[0] for b in bounds])
    hi = np.array([np.inf if b[1] is None else b[1] for b in bounds])
    return np.clip(theta, lo, hi)


def _filters_mutated():
    """Tell the warnings machinery that ``warnings.filters`` changed in place."""
    mutated = getattr(warnings, "_filters_mutated", None)  # CPython 3.10-3.13
    if mutated is not None:
        mutated()


@contextlib.contextmanager
def warning_filters_kept():
    """Put the process's warning filters back as they were if a threaded call changed them.

    Code run in worker threads that uses :class:`warnings.catch_warnings`
    (scikit-learn's input validation does, around every ``check_array``)
    can, when two such blocks overlap, leave a filter installed after the
    threads finish. The calling thread waits for its pool meanwhile, so any
    change of the list seen after the call is such a leftover, and the
    saved list is restored.

    Yields
    ------
    None

    Raises
    ------
    Nothing of its own; an exception of the block propagates after the
    filters are restored.

    Notes
    -----
    Package plumbing; no paper source. Filter changes that other threads
    of the user's make while the block runs are undone as well.
    """
    saved = list(warnings.filters)
    try:
        yield
    finally:
        if warnings.filters != saved:
            warnings.filters[:] = saved
            _filters_mutated()


#: Pilot fits made within :func:`pilot_memo` (one call of ``fit``), by a key
#: of the client's arrays and seed; None outside it.
_PILOT_MEMO = None
_PILOT_MEMO_LOCK = threading.Lock()
_PILOT_MEMO_USERS = 0


@contextlib.contextmanager
def pilot_memo():
    """Reuse pilot fits of the same client data within the block.

    A call of :meth:`FederatedHierarchicalGPRegressor.fit` may train more
    than one model on the same data (``restart_from_global``: the global-only
    fit before or after the full one). Each run's set-up asks every client
    for its pilot (:func:`pilot_fit`), a deterministic function of the
    client's scaled inputs, standardised targets and seed; within this block
    a client answers a repeated request from the first answer (a deployed
    client would keep its pilot), so the exact-GP fits run once. The upload
    is still sent and counted in ``communication_`` by every run. The memo
    holds a digest of the arrays, never the arrays, and is dropped when the
    last block that uses it ends (with fits overlapping in several threads,
    when the last of them returns). Pilots run in other processes (a process-based
    joblib backend) do not share it and are simply fitted again.
    """
    global _PILOT_MEMO, _PILOT_MEMO_USERS
    with _PILOT_MEMO_LOCK:
        if _PILOT_MEMO_USERS == 0:
            _PILOT_MEMO = {}
        _PILOT_MEMO_USERS += 1
    try:
        yield
    finally:
        with _PILOT_MEMO_LOCK:
            _PILOT_MEMO_USERS -= 1
            if _PILOT_MEMO_USERS == 0:
                _PILOT_MEMO = None


def pilot_fit(X, y, random_state):
    """Quick exact GP on at most :data:`PILOT_MAX_POINTS` rows (:func:`_pilot_gp`).

    Within :func:`pilot_memo` a repeated call with equal arrays and seed
    returns a copy of the first call's result.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Scaled inputs.
    y : ndarray of shape (n,)
        Standardised targets.
    random_state : int

    Returns
    -------
    PilotSummary or None
        None when the client has fewer than :data:`PILOT_MIN_POINTS` rows or
        (almost) constant targets.

    Raises
    ------
    numpy.linalg.LinAlgError or ValueError
        When the fit from every start fails (scikit-learn's error of the
        last one).

    Notes
    -----
    The pilot works on the client's inputs standardised per feature (its own
    mean and standard deviation) and reports lengthscales back in the model's
    scaled units; bounds ``[1e-3, 1e3]`` (standardised units). The marginal
    likelihood of a GP often has two optima, a rough function with little
    noise and a smooth trend that calls the rest noise, and which one
    L-BFGS-B reaches depends on where it starts. So the pilot starts from
    :func:`pilot_starts` (``sqrt(d)`` standard deviations, at which the
    kernel between points stays far from 0 in any dimension, down to the
    median nearest-neighbour distance, the finest scale the inputs can
    resolve; in high dimensions, where that range is empty, ``sqrt(d)``,
    ``sqrt(d) / 3`` and ``10 sqrt(d)``), with several inputs and at least
    :data:`OWN_NOISE_POINTS_PER_PARAMETER` points per hyperparameter also
    from each input's own lengthscale (:func:`marginal_lengthscales`), and
    keeps the fit with the largest log marginal likelihood
    (the first start on a tie; a start whose fit fails is skipped, and the
    error is raised only when every start fails). A pilot on fewer than
    :data:`PILOT_MULTI_START_POINTS` points starts at ``sqrt(d)`` only: on
    a handful of points the rough optimum mostly interpolates them (the
    main job's 12-point clients, seed 1: held-out NLL -0.06 with every
    start, -0.15 with one). A pilot on more points also starts from the
    best point of a grid of the profile likelihood when that point is above
    every fit from the other starts (:func:`profile_grid_start`). With
    multi-output targets the rule applies to
    each output's observed rows. A lengthscale that ends below
    :func:`resolution_floor` of the client's inputs (all its rows), where
    the likelihood is flat, is raised to it.
    """
    memo = _PILOT_MEMO
    if memo is None:
        return _pilot_fit(X, y, random_state)
    import hashlib

    X = np.ascontiguousarray(X, dtype=float)
    y = np.ascontiguousarray(y, dtype=float)
    h = hashlib.blake2b(digest_size=32)
    for a in (X, y):
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    key = (h.hexdigest(), repr(random_state))
    if key not in memo:
        # an error is not kept: a repeated request fits again and raises again
        memo[key] = _pilot_fit(X, y, random_state)
    return copy.deepcopy(memo[key])


#: Jitter added to the diagonal of a pilot's covariance, as scikit-learn's
#: ``GaussianProcessRegressor(alpha=1e-10)`` does.
PILOT_JITTER = 1e-10


@dataclass
class PilotGP:
    """One exact GP fitted by :func:`_pilot_gp` (a client's private result).

    Attributes
    ----------
    log_marginal_likelihood : float
        At the returned hyperparameters (nats; ``-inf`` where the covariance
        was not positive definite).
    variance : float
        Signal variance (units of the targets given, squared).
    lengthscale : float or ndarray of shape (d,)
        A float for an isotropic start, else one per input (units of the
        inputs given).
    noise_variance : float
        Noise variance (units of the targets given, squared).
    L : ndarray of shape (n, n)
        Lower Cholesky factor of ``K + (noise_variance + PILOT_JITTER) I``.

    Notes
    -----
    Type II maximum likelihood of an exact GP (Rasmussen and Williams,
    *Gaussian Processes for Machine Learning*, MIT Press, 2006, section
    5.4.1, eqs. 5.8-5.9). Beyond the pFedHGP paper: the package's
    data-derived initialisation.
    """

    log_marginal_likelihood: float
    variance: float
    lengthscale: object
    noise_variance: float
    L: np.ndarray


def _pilot_objective(theta, X, y, iso, fixed_lengthscale):
    """Negative log marginal likelihood of a pilot GP and its gradient.

    ``theta`` is ``log`` of (variance, lengthscale(s), noise variance); the
    lengthscales are left out when ``fixed_lengthscale`` is given. A
    covariance that is not positive definite gives ``(inf, 0)``, as
    scikit-learn's objective does.
    """
    n, d = X.shape
    variance = float(np.exp(theta[0]))
    if fixed_lengthscale is not None:
        ell = fixed_lengthscale
    elif iso:
        ell = np.full(d, np.exp(theta[1]))
    else:
        ell = np.exp(theta[1:1 + d])
    s2 = float(np.exp(theta[-1]))
    Kf = se_ard(X, X, ell, variance)
    K = Kf.copy()
    K[np.diag_indices(n)] += s2 + PILOT_JITTER
    try:
        L = cholesky(K, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return np.inf, np.zeros_like(theta)
    a = cho_solve((L, True), y, check_finite=False)
    lml = (-0.5 * float(y @ a) - float(np.sum(np.log(np.diag(L))))
           - 0.5 * n * np.log(2.0 * np.pi))
    # d lml / dK = (a a' - K^-1) / 2
    # K^-1 by solving against the identity: cholesky_inverse (LAPACK potri)
    # is faster but rounds differently, and the optimizer's path, hence a
    # classifier test that compares two fits to 5 %, moved with it
    Kbar = 0.5 * (np.outer(a, a) - cho_solve((L, True), np.eye(n), check_finite=False))
    _, dl, dv = se_ard_grad_sym(X, Kf, Kbar, ell, variance)
    grad = [dv * variance]
    if fixed_lengthscale is None:
        grad.extend([float(np.sum(dl * ell))] if iso else list(dl * ell))
    grad.append(float(np.trace(Kbar)) * s2)
    return -lml, -np.asarray(grad, dtype=float)


def _pilot_gp(X, y, variance, lengthscale, noise_share, lengthscale_bounds=(1e-3, 1e3)):
    """One pilot-style exact GP fitted from one start.

    Constant x SE-ARD + white noise on centred ``y``: the variance starts at
    ``variance`` within ``[1e-6, 1e3]`` times it, the lengthscale(s) at
    ``lengthscale`` (a float: isotropic; an array: ARD) within
    ``lengthscale_bounds`` (standardised units; ``"fixed"`` holds them), the
    noise variance at ``noise_share * variance`` within ``[1e-6, 10]`` times
    ``variance``. The log marginal likelihood (with :data:`PILOT_JITTER` on
    the diagonal) is maximised by L-BFGS-B over the logs of the free
    hyperparameters with analytic gradients, from the start clipped to the
    bounds: the objective, parameters, bounds and optimizer of scikit-learn's
    ``GaussianProcessRegressor(ConstantKernel * RBF + WhiteKernel)`` with
    its defaults, whose optima it reproduces, at a fraction of the cost (its
    kernel gradients are built in Python; the package's SE-ARD kernel and
    its contraction are compiled).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Inputs (standardised per feature by the callers).
    y : ndarray of shape (n,)
        Centred targets.
    variance : float
        Starting signal variance (units of ``y`` squared; the bounds scale with it).
    lengthscale : float or ndarray of shape (d,)
        Starting lengthscale(s), units of ``X``.
    noise_share : float
        Starting noise variance over ``variance``.
    lengthscale_bounds : tuple of float, "fixed" or ndarray of shape (d, 2), default=(1e-3, 1e3)
        One range for every lengthscale, ``"fixed"`` (held at
        ``lengthscale``), or one range per input (ARD; a range whose ends
        are equal holds that input's lengthscale there).

    Returns
    -------
    PilotGP

    Raises
    ------
    numpy.linalg.LinAlgError
        When the covariance at the optimum is not positive definite.
    ValueError
        On non-finite values, or ``lengthscale_bounds`` a string other than "fixed".

    Notes
    -----
    Rasmussen and Williams (2006), section 5.4.1, eqs. 5.8-5.9 (the
    objective and its gradient).
    """
    from scipy.optimize import minimize

    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ValueError("pilot GP: inputs or targets contain NaN or inf")
    n, d = X.shape
    v = float(variance)
    ell0 = np.asarray(lengthscale, dtype=float)
    iso = ell0.ndim == 0
    fixed = None
    if isinstance(lengthscale_bounds, str):
        if lengthscale_bounds != "fixed":
            raise ValueError(f"lengthscale_bounds: {lengthscale_bounds!r}")
        fixed = np.broadcast_to(ell0, (d,)).astype(float)
    var_bounds = (np.log(1e-6 * v), np.log(1e3 * v))
    noise_bounds = (np.log(1e-6 * v), np.log(10.0 * v))
    theta0, bounds = [np.log(v)], [var_bounds]
    if fixed is None:
        k = 1 if iso else d
        theta0.extend(np.log(np.broadcast_to(ell0, (k,))))
        lb = np.log(np.asarray(lengthscale_bounds, dtype=float))
        if lb.ndim == 2:  # per input (ARD only)
            if iso or lb.shape != (d, 2):
                raise ValueError(f"lengthscale_bounds of shape {lb.shape} for {k} lengthscale(s)")
            bounds.extend([tuple(b) for b in lb])
        else:
            bounds.extend([tuple(lb)] * k)
    theta0.append(np.log(noise_share * v))
    bounds.append(noise_bounds)
    res = minimize(_pilot_objective, np.asarray(theta0, dtype=float), args=(X, y, iso, fixed),
                   method="L-BFGS-B", jac=True, bounds=np.asarray(bounds))
    theta = res.x
    if fixed is not None:
        ell = fixed
    elif iso:
        ell = float(np.exp(theta[1]))
    else:
        ell = np.exp(theta[1:1 + d])
    var, s2 = float(np.exp(theta[0])), float(np.exp(theta[-1]))
    K = se_ard(X, X, np.broadcast_to(ell, (d,)).astype(float), var)
    K[np.diag_indices(n)] += s2 + PILOT_JITTER
    L = cholesky(K, lower=True, check_finite=False)  # LinAlgError when not PD
    return PilotGP(-float(res.fun), var, ell, s2, L)


def _pilot_fit(X, y, random_state):
    """:func:`pilot_fit` without the memo."""
    n, d = X.shape
    if n < PILOT_MIN_POINTS or np.var(y) < 1e-12:
        return None
    rng = np.random.default_rng(random_state)
    resolution = resolution_floor(X)  # all rows: a subsample's gaps are wider
    if n > PILOT_MAX_POINTS:
        idx = np.sort(rng.choice(n, PILOT_MAX_POINTS, replace=False))
        X, y = X[idx], y[idx]
    # the client's own inputs standardised per feature, so the starting
    # lengthscale is relative to where its data are (a client whose inputs
    # fill a sliver of the joint box still starts at a sensible value)
    # a constant column (std a round-off 1e-16, not 0) is left unscaled: its
    # lengthscale is not identified and stays at its start, where divided by
    # that std it was reported as about 0 and pulled the population's to 0
    spread = np.where(np.ptp(X, axis=0) > 0, X.std(axis=0), 1.0)
    X = (X - X.mean(axis=0)) / spread
    v = float(np.var(y))
    # below PILOT_MULTI_START_POINTS the rough optimum mostly interpolates a
    # handful of points
    multi = n >= PILOT_MULTI_START_POINTS
    iso = pilot_starts(X) if multi else np.array([np.sqrt(d)])
    starts = [np.full(d, s) for s in iso]
    if (multi and d > 1 and PILOT_MARGINAL_START
            and X.shape[0] >= OWN_NOISE_POINTS_PER_PARAMETER * (d + 2)):
        # an input on which the targets vary fast while the others are
        # smooth (time among weather covariates) is far from every isotropic start
        own = marginal_lengthscales(X, y - y.mean())
        if np.any(own < PILOT_MAX_MARGINAL_START):  # not flat in every input
            starts.append(own)
    fits, error = [], None
    for start in starts:
        try:
            fits.append(_pilot_gp(X, y - y.mean(), v, np.array(start, dtype=float), 0.1))
        except (np.linalg.LinAlgError, ValueError) as exc:  # this start only
            error = exc
    if multi and PILOT_GRID_START:
        # the best point of a coarse grid of the profile likelihood: an
        # optimum far from every start (a fast wiggle on a steep trend, whose
        # noise is a tiny share of the variance) is found from there. Fitted
        # only when that point is already above every fit so far (a fit
        # from it at its optimal scale ends at least as high)
        ell, ratio, value, scale = profile_grid_start(X, y - y.mean(), iso)
        done = max((gp.log_marginal_likelihood for gp in fits
                    if np.isfinite(gp.log_marginal_likelihood)), default=-np.inf)
        if value > done:
            try:
                fits.append(_pilot_gp(X, y - y.mean(), scale, np.full(d, ell), ratio))
            except (np.linalg.LinAlgError, ValueError) as exc:  # this start only
                error = exc
    if not fits:
        raise error
    # the largest log marginal likelihood; the first start on a tie, and a
    # non-finite value only when every start has one
    best = max(fits, key=lambda gp: (np.isfinite(gp.log_marginal_likelihood),
                                     np.nan_to_num(gp.log_marginal_likelihood, nan=-np.inf)))
    noise = best.noise_variance
    # residual degrees of freedom n - tr(K C^-1) = (s2 + alpha) tr(C^-1), with
    # C = K + (s2 + alpha) I, whose Cholesky factor is L (alpha: the pilot's
    # jitter, which matters only for a noise variance near 1e-10)
    L_inv = solve_triangular(best.L, np.eye(best.L.shape[0]), lower=True)
    residual_dof = (noise + PILOT_JITTER) * float(np.sum(L_inv**2))
    # below the inputs' resolution the likelihood is flat (resolution_floor)
    return PilotSummary(
        lengthscale=np.maximum(spread * np.atleast_1d(np.asarray(best.lengthscale, dtype=float)),
                               resolution),
        variance=best.variance,
        noise_variance=noise,
        residual_dof=residual_dof if np.isfinite(residual_dof) else None,
    )


#: A pilot on at least :data:`PILOT_MULTI_START_POINTS` points also starts
#: from the best point of a grid of the profile likelihood
#: (:func:`profile_grid_start`).
PILOT_GRID_START = True
#: Noise-to-signal ratios of that grid.
PILOT_GRID_RATIOS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: Number of isotropic lengthscales of that grid.
PILOT_GRID_LENGTHSCALES = 8


def profile_grid_start(X, y, starts=None):
    """The best point of a grid of (isotropic lengthscale, noise-to-signal ratio).

    Scored by :func:`profile_log_marginal_likelihood` (the scale maximised
    out): :data:`PILOT_GRID_LENGTHSCALES` lengthscales log-spaced from the
    finest to the coarsest of :func:`pilot_starts` (``sqrt(d)`` standard
    deviations and the median nearest-neighbour distance; from ``sqrt(d) /
    10`` when that range is empty) times :data:`PILOT_GRID_RATIOS`.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Inputs standardised per feature.
    y : ndarray of shape (n,)
        Centred targets.
    starts : ndarray of shape (k,), optional
        :func:`pilot_starts` of ``X`` when the caller has them (None:
        computed here).

    Returns
    -------
    lengthscale : float
        Standardised units.
    ratio : float
        Noise variance over signal variance, one of :data:`PILOT_GRID_RATIOS`.
    value : float
        Its profile log marginal likelihood (``-inf`` if no grid point
        could be scored).
    scale : float
        Its optimal signal variance ``s = y^T C^-1 y / n`` (units of ``y``
        squared; ``var(y)`` if no grid point could be scored).

    Notes
    -----
    The pilot's starts (:func:`pilot_starts`) all begin at a noise share of
    0.1. Five clients of a steep linear trend plus a small fast wiggle (50
    points each, noise 1e-4 of the variance): every client's pilot ended
    in the smooth optimum that calls the wiggle noise, 10-25 nats below the
    wiggle's optimum at a lengthscale between two starts (and the fit,
    started from the pilots, at 3-7 times the RMSE of a pooled exact GP).
    The grid costs ``56`` Cholesky factorisations of the pilot's rows
    (at most :data:`PILOT_MAX_POINTS`); :func:`pilot_fit` runs one more
    L-BFGS-B fit from the best point, at its optimal scale, only when that
    point's value is above every fit from the other starts (the fit then
    ends at least as high). Beyond the pFedHGP paper (Yan 2026 sets the
    initial values by hand): the package's data-derived initialisation. No
    error is raised: a grid point that cannot be scored is skipped.
    """
    starts = pilot_starts(X) if starts is None else starts
    hi, lo = float(np.max(starts)), float(np.min(starts))
    if not lo < hi / 3:
        lo = hi / 10.0
    d = X.shape[1]
    best, arg = -np.inf, (hi, 0.1, -np.inf, float(np.var(y)))
    for ell in np.geomspace(hi, lo, PILOT_GRID_LENGTHSCALES):
        for r in PILOT_GRID_RATIOS:
            v, s = profile_log_marginal_likelihood(X, y, np.full(d, ell), r, return_scale=True)
            if v > best:
                best, arg = v, (float(ell), float(r), float(v), float(s))
    return arg


def profile_log_marginal_likelihood(X, y, lengthscale, ratio, return_scale=False):
    """Exact GP log marginal likelihood with the overall scale maximised out.

    ``y ~ N(0, s (k_ell(X, X) + ratio I))`` (unit-variance SE-ARD kernel
    ``k_ell``) at its optimal scale ``s = y^T C^-1 y / n``, ``C = k_ell +
    ratio I``: ``-n/2 (log(2 pi s) + 1) - 1/2 log|C|``. It scores a
    lengthscale and a noise-to-signal ratio whatever the units of ``y``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,)
        Centred targets.
    lengthscale : ndarray of shape (d,)
        Units of ``X``.
    ratio : float
        Noise variance over signal variance (positive).
    return_scale : bool, default=False
        Also return the optimal scale ``s``.

    Returns
    -------
    value : float
        ``-inf`` when ``C`` is not positive definite or ``y`` is 0.
    scale : float
        ``s`` (NaN where ``value`` is ``-inf``); only with ``return_scale``.

    Notes
    -----
    Rasmussen and Williams, *Gaussian Processes for Machine Learning* (MIT
    Press, 2006), section 5.4.1, eq. 5.8, with the signal variance set to
    its maximiser in closed form. Beyond the pFedHGP paper: it scores the
    pilots' grid start (:func:`profile_grid_start`). No error is raised: a
    covariance that is not positive definite scores ``-inf``.
    """
    n = X.shape[0]
    K = se_ard(X, X, np.asarray(lengthscale, dtype=float), 1.0)
    K[np.diag_indices(n)] += ratio + PILOT_JITTER
    try:
        L = cholesky(K, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return (-np.inf, np.nan) if return_scale else -np.inf
    a = solve_triangular(L, y, lower=True, check_finite=False)
    s = float(a @ a) / n
    if not (np.isfinite(s) and s > 0):
        return (-np.inf, np.nan) if return_scale else -np.inf
    value = float(-0.5 * n * (np.log(2.0 * np.pi * s) + 1.0) - np.sum(np.log(np.diag(L))))
    return (value, s) if return_scale else value


def marginal_lengthscales(X, y):
    """Each input's lengthscale when the targets are fitted on that input alone.

    For every column ``j`` of ``X`` a one-input exact GP (constant x RBF +
    white noise, :func:`_pilot_gp`) is fitted to
    ``y`` (at most :data:`PILOT_MARGINAL_POINTS` rows, evenly spaced in the
    given order, re-centred) from the coarsest and the finest of the starts
    :func:`pilot_starts` gives for that column, and the lengthscale of the
    larger log marginal likelihood is kept, within ``[PILOT_MIN_START,
    PILOT_MAX_MARGINAL_START]`` (standardised units). Deterministic; it costs
    at most ``2 d`` one-input fits.

    A column where the input alone explains
    nothing gets ``PILOT_MAX_MARGINAL_START`` (a start where the kernel is
    flat along it): one with a single distinct value, whose fits all fail,
    whose best log marginal likelihood is not above that of white noise
    alone (``y ~ N(0, var(y) I)``) by more than ``log n`` (the BIC's price
    of a variance and a lengthscale), or whose best kernel is white noise
    at its values (:func:`white_at_inputs`, at all the given rows: noise
    fitted as signal; a start there would leave the fit where the gradient
    along it vanishes). When every column is flat, :func:`pilot_fit` does
    not use the vector.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's inputs, standardised per feature.
    y : ndarray of shape (n,)
        Its targets, centred.

    Returns
    -------
    ndarray of shape (d,)
        Starting ARD lengthscales (standardised units) for the pilot fit.

    Notes
    -----
    Isotropic starts (:func:`pilot_starts`) miss an optimum where one input
    varies on a far shorter scale than the others: 4 Beijing air-quality
    stations, 120 hourly rows over three weeks each, inputs time, hour,
    temperature, dew point, pressure and wind speed, log PM2.5 (three draws
    of the rows): the fit from these starts ended 1.5-9 nats above the best
    isotropic start on 5 of the 12 pilots (time at 0.3-0.5 days), and the
    default regressor's held-out RMSE went from 0.500, 0.445, 0.529 to
    0.446, 0.427, 0.387 (an exact GP with one-hot client columns and random
    restarts: about 0.40, 0.43, 0.39; docs/maths.md section 11). Where the
    isotropic starts do better, their fit is kept. Beyond the paper: the
    package's data-derived initialisation.

    See Also
    --------
    pilot_fit : uses the result as one more start.
    pilot_starts : the isotropic starts (and each column's two starts here).
    white_at_inputs : the white-kernel rule.
    """
    X_all = X
    if X.shape[0] > PILOT_MARGINAL_POINTS:  # evenly spaced rows, in the given order
        keep = np.round(np.linspace(0, X.shape[0] - 1, PILOT_MARGINAL_POINTS)).astype(int)
        X, y = X[keep], y[keep] - np.mean(y[keep])
    v = float(np.var(y))
    n = X.shape[0]
    # the input alone explains nothing when its fit is not clearly above
    # white noise alone (BIC: log n for its variance and lengthscale)
    noise_only = -0.5 * n * (np.log(2 * np.pi * v) + 1.0)
    out = np.full(X.shape[1], PILOT_MAX_MARGINAL_START)
    for j in range(X.shape[1]):
        col = X[:, [j]]
        if np.ptp(col) <= 0:
            continue
        best = None
        starts = pilot_starts(col)
        for start in sorted({float(starts.max()), float(starts.min())}, reverse=True):
            try:
                gp = _pilot_gp(col, y, v, start, 0.5)
            except (np.linalg.LinAlgError, ValueError):
                continue
            lml = gp.log_marginal_likelihood
            if np.isfinite(lml) and (best is None or lml > best[0]):
                best = (lml, float(gp.lengthscale))
        # nor when its kernel is white at the column's values (noise as signal)
        if (best is not None and best[0] - noise_only > np.log(n)
                and not white_at_inputs(X_all[:, [j]], [best[1]])):
            out[j] = min(max(best[1], PILOT_MIN_START), PILOT_MAX_MARGINAL_START)
    return out


def pilot_starts(X):
    """Starting lengthscales of a pilot fit, from coarse to fine.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The client's inputs, standardised per feature.

    Returns
    -------
    ndarray of shape (k,)
        ``k`` in 1..:data:`PILOT_MAX_STARTS` isotropic starting lengthscales
        (standardised units), log-spaced from ``sqrt(d)`` down to the median
        distance from a point to its nearest distinct neighbour (at least
        :data:`PILOT_MIN_START`), one start per decade of their ratio up to
        :data:`PILOT_MAX_STARTS`. When that distance is not below ``sqrt(d)
        / 3`` (high dimensions, few points): ``sqrt(d)``, ``sqrt(d) / 3``
        and ``10 sqrt(d)`` (:data:`HIGH_DIM_PILOT_FACTORS`; a start above
        ``max(sqrt(d), 100)`` is lowered to it). Only
        ``sqrt(d)`` for one point or all inputs equal.

    Notes
    -----
    ``sqrt(d)`` is a typical distance between two standardised points
    (``sqrt(2 d)``) up to a constant; the nearest-neighbour distance is the
    finest scale the data can show. A fit started at the coarse end alone
    often ends in the smooth-trend optimum even when the rough one has a
    much larger marginal likelihood (one station of the Beijing air-quality
    data over 120 days: 30 nats; docs/maths.md section 11). In high
    dimensions an isotropic start at ``sqrt(d)`` alone often ends in an
    optimum that calls most of the signal noise, every lengthscale short:
    10 inputs of which 2 matter, 200 points per client, the pilots of 2-4
    of 4 clients ended with noise variance 0.5-0.6 of the targets' (about
    0.015 from the better starts, 300 nats higher), and the fit then
    switched the shared parts off (held-out RMSE 0.75 against 0.10 for an
    exact GP); KIN40K (8-D) and PUMADYN-32nm clients of 200 points had
    such pilots too (40 and 34 nats lower). No single start found the
    best optimum on every client; the three do. Beyond the paper
    (Yan 2026 sets the initial values by hand): the package's data-derived
    initialisation.
    """
    from scipy.spatial.distance import squareform, pdist

    coarse = float(np.sqrt(X.shape[1]))
    if X.shape[0] < 2:
        return np.array([coarse])
    dist = squareform(pdist(X))
    dist[dist <= 0] = np.inf
    nearest = dist.min(axis=1)
    nearest = nearest[np.isfinite(nearest)]
    if nearest.size == 0:
        return np.array([coarse])
    fine = max(float(np.median(nearest)), PILOT_MIN_START)
    if not fine < coarse / 3:
        # within the pilot's bound (1e3) whatever d
        return np.minimum(coarse * np.asarray(HIGH_DIM_PILOT_FACTORS), max(coarse, 1e2))
    k = int(min(PILOT_MAX_STARTS, 1 + np.ceil(np.log10(coarse / fine))))
    return np.geomspace(coarse, fine, k)


def pool_evidence(X, y, theta):
    """Restricted log marginal likelihood of one client under the pooled pilot's kernel.

    The pooled pilot models every small client as an independent exact GP
    ``y_i = c_i + f_i + e_i`` with its own constant mean ``c_i`` (flat prior,
    integrated out: the restricted, or REML, likelihood of Harville,
    *JASA* 72(358), 1977) and a shared kernel ``variance * SE-ARD(lengthscale)
    + noise_variance * I``. Summed over the clients, the objective borrows
    strength across them the way one exact GP over all their points would,
    where each client's own pilot, on a handful of points, interpolates them
    and reports too small a noise variance.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Scaled inputs.
    y : ndarray of shape (n,)
        Standardised targets (a client on clearly another scale,
        :func:`client_scale_ratio`, stays out of the pool).
    theta : ndarray of shape (d + 2,)
        ``(log lengthscale, log variance, log noise_variance)``.

    Returns
    -------
    PoolEvidence
        ``value = -(r' P r + log|K| + log(1' K^{-1} 1)) / 2`` with
        ``P = K^{-1} - K^{-1} 1 1' K^{-1} / (1' K^{-1} 1)`` (constant terms
        dropped), its gradient ``tr((P r r' P - P) dK) / 2`` and the expected
        Fisher information of the log noise variance ``s2^2 tr(P P) / 2``. A
        client with fewer than 2 points contributes 0.

    Raises
    ------
    numpy.linalg.LinAlgError
        When ``K`` is not positive definite (a noise variance far below the
        signal's on repeated inputs).
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    theta = np.asarray(theta, dtype=float)
    n, d = X.shape
    if n < 2:
        return PoolEvidence(0.0, np.zeros(d + 2))
    ell, var, s2 = np.exp(theta[:d]), float(np.exp(theta[d])), float(np.exp(theta[d + 1]))
    Kf = se_ard(X, X, ell, var)
    L, _ = cho_factor(Kf + s2 * np.eye(n), lower=True)
    Ki = cholesky_inverse(L)
    u = Ki.sum(axis=1)
    c = float(u.sum())
    P = Ki - np.outer(u, u) / c
    a = P @ y
    value = -0.5 * (float(y @ a) + 2.0 * float(np.sum(np.log(np.diag(L)))) + np.log(c))
    Kbar = 0.5 * (np.outer(a, a) - P)
    _, dl, dv = se_ard_grad_sym(X, Kf, Kbar, ell, var)
    grad = np.concatenate([dl * ell, [dv * var, float(np.trace(Kbar)) * s2]])
    return PoolEvidence(float(value), grad, 0.5 * s2**2 * float(np.sum(P * P)))


def start_lengthscale(lengthscale, span):
    """Starting lengthscales: the pilot's, at most :data:`START_MAX_SPANS` spans.

    A pilot fit on a few hundred of one client's points may call an input
    irrelevant (lengthscale hundreds of times its span) that the whole
    model can resolve. Started there, the gradient with respect to that
    lengthscale scales like ``(span / lengthscale)^2`` and is practically
    zero, so the optimiser sits on a plateau and stops. At five spans the
    kernel still varies by less than 2 % across the data (the input is as
    good as switched off) while the gradient can bring it back. The
    inducing-point budget (``n_inducing="auto"``) still uses the pilot's
    values (with multi-output targets, the larger of those and the
    global-only fit's shortest live latent, which this cap applies to:
    :func:`~skfedgp.regressor.shortest_live_latent`).

    Parameters
    ----------
    lengthscale : ndarray of shape (d,)
        Pilot lengthscales (model units).
    span : ndarray of shape (d,)
        Extent of the inputs per dimension (model units); 0 leaves that
        dimension's value unchanged.

    Returns
    -------
    ndarray of shape (d,)
        Model units (inputs scaled to the clients' joint unit box).

    Notes
    -----
    Beyond the paper (Yan 2026 sets the initial values by hand): the
    package's data-derived initialisation, docs/maths.md section 11.
    """
    ell = np.asarray(lengthscale, dtype=float)
    span = np.broadcast_to(np.asarray(span, dtype=float), ell.shape[-1:])
    cap = np.where(span > 0, START_MAX_SPANS * span, np.inf)
    return np.minimum(ell, cap)


#: A client whose targets' within-client standard deviation is below this
#: share of the median over clients is named in a warning at set-up
#: (:func:`warn_flat_clients`).
FLAT_CLIENT_RATIO = 0.05

#: Clients with fewer rows are not named by :func:`warn_flat_clients` (the
#: spread of two or three noisy values is small by chance too often).
FLAT_CLIENT_MIN_SAMPLES = 5


def warn_flat_clients(summaries, ratio=FLAT_CLIENT_RATIO):
    """Warn about clients whose targets vary far less than the others'.

    The shared function ``g``, its kernel and the deviation scale ``phi``
    are the same for every client, in the same units: a client whose
    targets vary, say, 1e4 times less than the others' (another unit, or a
    nearly constant series) can only be fitted by cancelling ``g`` with its
    own parts, which pulls the shared hyperparameters towards it and can
    make the other clients' fits worse (a client of 20 rows of ``1e-4
    sin``, beside two of ``sin``, made one of them 2.5 times less accurate
    in 2-D; ``benchmarks/bench_one_client_harm.py``). Called only for models
    without per-client scales on the shared parts (``client_scale=False``
    or the multi-output family), which remove this.

    Parameters
    ----------
    summaries : dict
        Client id to :class:`ClientSummary` (1-D targets; multi-output
        summaries are skipped).
    ratio : float, default=FLAT_CLIENT_RATIO

    Warns
    -----
    UserWarning
        Naming each such client, its within-client standard deviation and
        the median over clients (target units).

    Notes
    -----
    A diagnostic beyond the pFedHGP paper, whose model has one scale for
    the shared parts; docs/maths.md, section 10.
    """
    sds = {c: np.sqrt(s.y_centred_sumsq / s.n_samples) for c, s in summaries.items()
           if getattr(s, "y_count", None) is None and s.n_samples >= 2}
    if len(sds) < 2:
        return
    med = float(np.median(list(sds.values())))
    flat = [(c, sd) for c, sd in sds.items()
            if sd < ratio * med and summaries[c].n_samples >= FLAT_CLIENT_MIN_SAMPLES]
    if not flat:  # (a median of 0 flags none)
        return
    named = ", ".join(f"{c!r} (sd {sd:.3g})" for c, sd in flat[:10])
    warnings.warn(
        f"client(s) {named} have targets that vary far less than the others' (median "
        f"within-client sd {med:.3g}, target units): the shared function and the deviation "
        "scale phi have one scale for all clients (client_scale=False), so a client whose "
        "function is much flatter than the shared one pulls them towards it and can make the "
        "other clients' fits worse. Use client_scale='auto' (the default), or if a client "
        "measures in another unit, convert its targets first; if "
        "its targets are flat because its inputs cover a flat part of the shared function, "
        "this warning can be ignored.", UserWarning, stacklevel=user_stacklevel())


def union_design(lo, hi, n, random_state):
    """Points spread uniformly over a union of boxes, and the union's volume.

    Quasi-random acceptance sampling from the union: a scrambled Sobol
    sequence in ``d + 2`` dimensions picks a box with probability
    proportional to its volume (first coordinate), a point in it (next
    ``d``), and accepts the point with probability ``1 / c`` (last), ``c``
    the number of boxes holding it, so overlaps are not counted twice. The
    union's volume is estimated without bias by ``sum_b vol_b * mean(1 / c)``
    over all draws, however small a share of the enclosing box it is.

    Parameters
    ----------
    lo, hi : ndarray of shape (n_boxes, d)
        Lower and upper corners of the boxes (``hi >= lo``; boxes of zero
        volume are dropped unless all are).
    n : int
        Number of points wanted.
    random_state : int or None
        Seed of the scrambled Sobol sequence.

    Returns
    -------
    points : ndarray of shape (n, d)
        In draw order (any prefix is spread over the union).
    volume : float
        Estimated volume of the union (scaled units, a share of the unit
        box when the boxes lie in it).

    Notes
    -----
    Beyond the pFedHGP paper (which places the global inducing points in
    one bounding box); docs/maths.md, section 11, "Inducing points".
    """
    lo, hi = np.atleast_2d(np.asarray(lo, float)), np.atleast_2d(np.asarray(hi, float))
    if n <= 0:
        return np.zeros((0, lo.shape[1])), 0.0
    vol = np.prod(hi - lo, axis=1)
    flat = not np.any(vol > 0)  # boxes of zero volume only: points on them, volume 0
    if flat:
        vol = np.ones(len(lo))
    else:
        lo, hi, vol = lo[vol > 0], hi[vol > 0], vol[vol > 0]
    cdf = np.cumsum(vol) / vol.sum()
    d = lo.shape[1]
    sob = qmc.Sobol(d + 2, scramble=True, seed=random_state)
    pts, inv_count = [], []
    while sum(p.shape[0] for p in pts) < n:
        u = _sobol_next(sob, max(2 * n, 256))
        b = np.minimum(np.searchsorted(cdf, u[:, 0], side="right"), len(vol) - 1)
        x = lo[b] + u[:, 1:d + 1] * (hi[b] - lo[b])
        count = np.zeros(x.shape[0])
        for a, c in zip(lo, hi):
            count += np.all((x >= a) & (x <= c), axis=1)
        count = np.maximum(count, 1.0)
        inv_count.append(1.0 / count)
        pts.append(x[u[:, d + 1] < 1.0 / count])
    volume = 0.0 if flat else float(vol.sum() * np.mean(np.concatenate(inv_count)))
    return np.vstack(pts)[:n], volume


def _pooled_target_moments(summaries):
    """Pooled count, mean, sum of squared deviations and "no spread" threshold of 1-D targets.

    The pooled sum of squares is the within-client plus the between-client
    part (Chan, Golub and LeVeque, *The American Statistician* 37, 1983);
    the threshold, ``1e-24`` of the data's own magnitude (level or spread),
    lets targets on any scale (1e-12 as well as 1e12) be standardised.

    Parameters
    ----------
    summaries : sequence of ClientSummary
        With 1-D targets.

    Returns
    -------
    n : int
    mean, m2, tiny : float
    """
    n = sum(s.n_samples for s in summaries)
    mean = sum(s.y_sum for s in summaries) / n
    within = sum(s.y_centred_sumsq for s in summaries)
    m2 = within + sum(s.n_samples * (s.y_sum / s.n_samples - mean) ** 2 for s in summaries)
    return n, mean, m2, 1e-24 * max(mean**2, m2 / n)


def under_observed_outputs(summaries):
    """Which outputs are seen too rarely within the clients to learn how they vary.

    Output ``q`` is under-observed when the clients that observe it hold
    fewer than two of its values each on average: ``sum_i (n_iq - 1) <
    T_q`` over the ``T_q`` clients with ``n_iq > 0`` (see
    :func:`under_observed_floor`). Whatever its values: an output seen once
    per client with the same value everywhere is under-observed too (its
    floor is then 0, as its pooled spread).

    Parameters
    ----------
    summaries : sequence of ClientSummary
        Multi-output summaries (``y_count`` per output).

    Returns
    -------
    ndarray of shape (Q,), bool

    Notes
    -----
    Input diagnostics of the package (beyond the pFedHGP paper); raises
    nothing.
    """
    counts = np.array([s.y_count for s in summaries], dtype=float)  # (T, Q)
    return np.array([bool(np.count_nonzero(c)) and
                     np.sum(np.maximum(c - 1, 0)) < np.count_nonzero(c) for c in counts.T])


def under_observed_floor(summaries, scale):
    """Predictive variance floor of the outputs seen too rarely within the clients.

    With its own constant mean per client and output, a client that
    observes an output once fits that value exactly by its mean: nothing
    about the output's variation within a client (its loadings, its noise)
    can be learned from it, and the fit then predicts such an output as a
    flat level with a band far too narrow. An output is *under-observed*
    when the clients that observe it hold fewer than two of its values each
    on average (``sum_i (n_iq - 1) < T_q``). Its predictive variance is
    then at least that of a new value drawn from the pooled ``n_q`` values
    with unknown mean and variance (Jeffreys prior: Student-t with
    ``n_q - 1`` degrees of freedom, scale ``s_q sqrt(1 + 1/n_q)``, ``s_q``
    the sample standard deviation), as the Gaussian with the same central
    95 % interval. Computed from the set-up summaries (counts, sums and
    centred sums of squares).

    Parameters
    ----------
    summaries : sequence of ClientSummary
        Multi-output summaries (``y_count`` per output).
    scale : ndarray of shape (Q,)
        The outputs' scales (the floor is in standardised units).

    Returns
    -------
    ndarray of shape (Q,)
        Standardised variance floor; 0 for a well-observed output.

    Raises
    ------
    ValueError
        If an output has a single observed value over all clients.

    Notes
    -----
    The predictive law of a new draw from a normal sample with unknown mean
    and variance under the noninformative prior: Gelman et al., *Bayesian
    Data Analysis* (3rd ed., CRC Press, 2013), section 3.2. Beyond the
    pFedHGP paper (the package's diagnostics).
    """
    counts = np.array([s.y_count for s in summaries], dtype=float)  # (T, Q)
    mean = np.sum([s.y_sum for s in summaries], axis=0) / np.maximum(counts.sum(axis=0), 1.0)
    floor = np.zeros(counts.shape[1])
    under = under_observed_outputs(summaries)
    for q in range(counts.shape[1]):
        n_iq = counts[:, q]
        n_q = float(n_iq.sum())
        if n_q == 1:
            raise ValueError(
                f"output {q} has a single observed (non-NaN) value over all clients: at least "
                "2 are needed to learn anything about it")
        if not under[q]:
            continue
        m2 = sum(float(s.y_centred_sumsq[q]) + float(s.y_count[q]) * (
            float(s.y_sum[q]) / max(float(s.y_count[q]), 1.0) - float(mean[q])) ** 2
            for s in summaries if s.y_count[q] > 0)
        ratio = float(student_t.ppf(0.975, n_q - 1) / student_t.ppf(0.975, np.inf))
        floor[q] = m2 / (n_q - 1) * (1 + 1 / n_q) * ratio**2 / float(scale[q]) ** 2
    return floor


def null_log_likelihood(summaries, y_scale, own_means=True):
    """Log likelihood of the clients' targets as independent Gaussian noise about a mean.

    The yardstick of a failed fit (:data:`NULL_MARGIN`): each client's
    targets as white noise, with the client's own maximum-likelihood
    variance, about its own mean (``own_means=True``) or about the pooled
    mean of all clients (``own_means=False``, for a model with no
    client-specific part, which cannot follow the clients' own means). No
    function at all. In standardised units (targets divided by
    ``y_scale``), as the ELBO is reported; a client's variance is taken at
    least ``NOISE_FLOOR``.

    Parameters
    ----------
    summaries : sequence of ClientSummary
        1-D targets' set-up summaries (count, sum and centred sum of
        squares).
    y_scale : float
        The standardisation's scale (target units).
    own_means : bool, default=True
        About each client's own mean, or about the pooled mean.

    Returns
    -------
    float
        ``sum_i -n_i / 2 log(2 pi v_i) - css_i / (2 v_i)``, with
        ``css_i`` the sum of squares about the mean in standardised units
        and ``v_i = max(css_i / n_i, NOISE_FLOOR)``.

    Notes
    -----
    A diagnostic of the package (beyond the paper). The ELBO is a lower
    bound on the log marginal likelihood (Titsias, "Variational Learning of
    Inducing Variables in Sparse Gaussian Processes", AISTATS 2009, eq. 9);
    this yardstick has two free parameters per client and no penalty, so a
    well-fitted model of data with no signal ends a few nats below it, not
    a large share of a nat per observation.
    """
    total = 0.0
    s2 = float(y_scale) ** 2
    n_all = sum(int(s.n_samples) for s in summaries)
    pooled = sum(float(s.y_sum) for s in summaries) / max(n_all, 1)
    for s in summaries:
        n = int(s.n_samples)
        if n == 0:
            continue
        css = float(s.y_centred_sumsq)
        if not own_means:
            css += n * (float(s.y_sum) / n - pooled) ** 2
        css /= s2
        v = max(css / n, NOISE_FLOOR)
        total += -0.5 * n * np.log(2.0 * np.pi * v) - 0.5 * css / v
    return float(total)


#: The regressor's mean-field fit warns (a ``ConvergenceWarning``) when its
#: final ELBO is more than this many nats per observation below
#: :func:`null_log_likelihood`: a fit worse than white noise by that much
#: on average has failed (in practice Adam steps too large, which oscillate
#: or diverge without raising, or far too few rounds).
NULL_MARGIN = 1.0


def flat_targets(summaries):
    """Whether every client's (1-D) targets are constant, from the set-up summaries.

    True when each client has at least two rows and no spread beyond
    round-off (``1e-24`` of the pooled targets' magnitude, as
    :meth:`Server.standardise` measures it): there is no function to fit,
    only the clients' levels (:class:`~skfedgp.SharedPartsOffWarning` says
    so). False for multi-output targets.

    Parameters
    ----------
    summaries : sequence of ClientSummary

    Returns
    -------
    bool
    """
    if not summaries or any(s.y_count is not None for s in summaries):
        return False
    tiny = _pooled_target_moments(summaries)[3]
    return all(s.n_samples >= 2 and s.y_centred_sumsq <= tiny * s.n_samples for s in summaries)


def flat_outputs(summaries):
    """Outputs of multi-output targets that are constant in every client, from the set-up summaries.

    Output ``q`` is flat when every client that observes it has at least two
    observations of it and no spread beyond round-off (``1e-24`` of that
    output's magnitude, as :meth:`Server.standardise` measures it): there is
    no function to fit for it, only the clients' levels
    (:class:`~skfedgp.SharedPartsOffWarning` says so). The multi-output
    counterpart of :func:`flat_targets`.

    Parameters
    ----------
    summaries : sequence of ClientSummary

    Returns
    -------
    list of int
        The flat outputs, in order; empty for 1-D targets.

    Notes
    -----
    Input diagnostics of the package (beyond the pFedHGP paper); raises
    nothing.
    """
    if not summaries or any(s.y_count is None for s in summaries):
        return []
    count = np.sum([s.y_count for s in summaries], axis=0)
    flat = []
    for q in np.flatnonzero(count > 0):
        mean = sum(s.y_sum[q] for s in summaries) / count[q]
        within = sum(s.y_centred_sumsq[q] for s in summaries) / count[q]
        tiny = 1e-24 * max(mean**2, within)
        if all(s.y_count[q] >= 2 and s.y_centred_sumsq[q] <= tiny * s.y_count[q]
               for s in summaries if s.y_count[q] > 0):
            flat.append(int(q))
    return flat


#: :func:`collinear_outputs`: two outputs are exact copies (up to an affine
#: map) at a client when their correlation over its rows is at least this.
COLLINEAR_CORRELATION = 1.0 - 1e-8


def collinear_outputs(summaries):
    """Pairs of outputs that are affine functions of each other at every client, from the set-up summaries.

    Outputs ``q`` and ``r`` are collinear when every client that observes
    both on all its rows (at least 3) has them correlated at
    :data:`COLLINEAR_CORRELATION` or more in absolute value over its rows
    (from the summaries' ``y_cov``; clients with missing values of either
    are not counted), and at least one such client exists. Their noises are
    then the same noise: the model's independent noise per output cannot
    hold that, reads one measurement as two, and its predictive bands are
    too narrow (an output duplicated: 25 % of held-out errors beyond 3
    std, against none for the output alone).

    Parameters
    ----------
    summaries : sequence of ClientSummary

    Returns
    -------
    list of (int, int)
        ``(q, r)`` with ``q < r``; empty for 1-D targets.

    Notes
    -----
    Input diagnostics of the package (beyond the pFedHGP paper); raises
    nothing.
    """
    if not summaries or any(s.y_count is None or s.y_cov is None for s in summaries):
        return []
    Q = len(summaries[0].y_count)
    pairs = []
    for q in range(Q):
        for r in range(q + 1, Q):
            seen = False
            for s in summaries:
                n = s.n_samples
                if n < 3 or s.y_count[q] < n or s.y_count[r] < n:
                    continue
                c = np.asarray(s.y_cov, dtype=float)
                vq, vr = c[q, q], c[r, r]
                if not (vq > 0 and vr > 0) or abs(c[q, r]) < COLLINEAR_CORRELATION * np.sqrt(vq * vr):
                    break
                seen = True
            else:
                if seen:
                    pairs.append((q, r))
    return pairs


def reserved_design(lo, hi, lengthscale, fraction, random_state):
    """Inducing points reserved for clients whose small boxes a uniform design would miss.

    A design uniform over the union of the clients' boxes puts points in a
    client's box in proportion to its volume. A client whose inputs fill a
    small box inside a much wider union (another client's inputs spread
    100 times wider, say) then gets none or one, although a few would
    resolve its whole box at the lengthscales; the global part cannot fit
    it, the sparse bound's trace term charges its whole prior variance to
    its noise, and its local part is switched off in the first round.

    The boxes are first merged into regions (:func:`_design_regions`:
    clients on one box, or on overlapping boxes whose union is still
    resolvable, count once). A region is *starved* when a design of
    :data:`AUTO_SHARE_FLOOR` points could resolve it (``need_b = prod_d (1
    + AUTO_PER_LENGTHSCALE * w_bd / ell_d) <= AUTO_SHARE_FLOOR``, ``w_bd``
    its width) yet a uniform design of that size puts fewer than half of
    them in it (its padded volume over the union's, ``fraction``). A
    starved region is served when its ``ceil(need_b)`` points and those of
    every starved region needing no more add up to at most
    :data:`AUTO_SHARE_FLOOR` (cheapest first, ties decided together, so the
    same whatever the clients' order; many small starved regions, as
    clients scattered in small boxes over a wide box, get none); each
    served region gets ``ceil(need_b)``
    scrambled Sobol points in the region padded by half a lengthscale
    (clipped to the unit box); the others' placement is left to the
    uniform design. Uses only the boxes (server side, no data).

    Parameters
    ----------
    lo, hi : ndarray of shape (n_boxes, d)
        The clients' boxes (scaled units, not padded).
    lengthscale : ndarray of shape (d,) or float
        Starting lengthscales (scaled units).
    fraction : float
        Share of the unit box the padded union covers.
    random_state : int or None
        Seed of the Sobol sequences.

    Returns
    -------
    ndarray of shape (k, d)
        The reserved points, regions taken in turn (``k = 0`` when no
        region is starved).

    Notes
    -----
    Beyond the pFedHGP paper (one bounding box); docs/maths.md, section 11,
    "Inducing points".
    """
    lo, hi = np.atleast_2d(np.asarray(lo, float)), np.atleast_2d(np.asarray(hi, float))
    d = lo.shape[1]
    budget = AUTO_SHARE_FLOOR
    ell = np.broadcast_to(np.asarray(lengthscale, float), (d,))

    def expected(lo, hi):
        # points a uniform design of `budget` points puts in each padded box
        plo, phi_ = np.clip(lo - 0.5 * ell, 0.0, 1.0), np.clip(hi + 0.5 * ell, 0.0, 1.0)
        return budget * np.prod(phi_ - plo, axis=1) / max(float(fraction), 1e-300), plo, phi_

    # a region's padded box holds its boxes' padded boxes, and a starved one
    # gets fewer than budget / 2 uniform points: if every box gets more, no
    # region can be starved (clients sharing one box, the usual case)
    if lo.shape[0] < 2 or np.all(expected(lo, hi)[0] >= 0.5 * budget):
        return np.zeros((0, d))
    lo, hi, need = _design_regions(lo, hi, ell, budget)
    if lo.shape[0] < 2:
        return np.zeros((0, d))
    exp_, plo, phi_ = expected(lo, hi)
    starved = np.flatnonzero((need <= budget) & (exp_ < 0.5 * need))
    # cheapest first: a region is served if its points and those of every
    # starved region needing no more fit in one design together (ties
    # decided together, so the same for any client order)
    count = np.ceil(need[starved])
    served = starved[(count[None, :] * (count[None, :] <= count[:, None])).sum(axis=1)
                     <= budget]
    if not served.size:
        return np.zeros((0, d))
    per_box = []
    for b in served:
        k = int(np.ceil(need[b]))
        seed = None if random_state is None else np.random.SeedSequence(
            [int(random_state) % 2**32, int(b)])
        sob = qmc.Sobol(d, scramble=True, seed=np.random.default_rng(seed))
        per_box.append(plo[b] + _sobol_next(sob, k) * (phi_[b] - plo[b]))
    # boxes in turn, so that any prefix is shared among them
    out = [box[i] for i in range(max(len(p) for p in per_box)) for box in per_box
           if i < len(box)]
    return np.asarray(out).reshape(-1, d)


def _design_regions(lo, hi, ell, budget):
    """Merge clients' boxes into regions where one box costs no more points than two.

    Two boxes are merged into their bounding box while some pair's bounding
    box needs at most as many inducing points as the two apart (``need =
    prod_d (1 + AUTO_PER_LENGTHSCALE * w_d / ell_d)``) and at most
    ``budget``: clients sharing a region (equal or overlapping boxes) count
    once, clients far apart stay apart, and a small box inside one too wide
    to resolve keeps its own region.

    Parameters
    ----------
    lo, hi : ndarray of shape (n_boxes, d)
    ell : ndarray of shape (d,)
    budget : float

    Returns
    -------
    lo, hi : ndarray of shape (n_regions, d)
    need : ndarray of shape (n_regions,)
    """
    def cost(a, b):
        return np.prod(1.0 + AUTO_PER_LENGTHSCALE * np.maximum(b - a, 0.0) / ell, axis=-1)

    def gains(k):
        # gain of merging region k with each region (-inf: not allowed)
        mlo, mhi = np.minimum(lo[k], lo), np.maximum(hi[k], hi)
        merged = cost(mlo, mhi)
        g = np.where(alive & (merged <= budget), need[k] + need - merged, -np.inf)
        g[k] = -np.inf
        return g

    # equal boxes first (clients on one box): one region each
    boxes = np.unique(np.concatenate([lo, hi], axis=1), axis=0)
    d = lo.shape[1]
    lo, hi = boxes[:, :d].copy(), boxes[:, d:].copy()
    n = lo.shape[0]
    alive = np.ones(n, dtype=bool)
    need = cost(lo, hi)
    G = np.stack([gains(k) for k in range(n)]) if n > 1 else np.full((n, n), -np.inf)
    # greedy: the best pair while it gains; only the merged region's gains change
    while n > 1:
        i, j = np.unravel_index(np.argmax(G), G.shape)
        if not G[i, j] >= 0.0:
            break
        lo[i], hi[i] = np.minimum(lo[i], lo[j]), np.maximum(hi[i], hi[j])
        need[i] = cost(lo[i], hi[i])
        alive[j] = False
        G[j, :] = G[:, j] = -np.inf
        G[i, :] = G[:, i] = gains(i)
    return lo[alive], hi[alive], need[alive]


def interleave_design(reserved, uniform):
    """Reserved points in every other place of the design, then the uniform points.

    Any prefix of ``M`` points holds at most ``ceil(M / 2)`` reserved ones,
    so a small given ``n_inducing`` still spreads over the union.

    Parameters
    ----------
    reserved : ndarray of shape (k, d)
    uniform : ndarray of shape (m, d)

    Returns
    -------
    ndarray of shape (k + m, d)
    """
    k, m = reserved.shape[0], uniform.shape[0]
    out, i, j = [], 0, 0
    while i < k or j < m:
        if i < k and (len(out) % 2 == 0 or j >= m):
            out.append(reserved[i])
            i += 1
        else:
            out.append(uniform[j])
            j += 1
    return np.asarray(out).reshape(k + m, reserved.shape[1])


def auto_inducing(lengthscale, ranges, *, per_lengthscale, minimum, maximum, fraction=1.0):
    """Number of inducing points from the lengthscales and the input box.

    ``ceil(fraction * prod_d (1 + per_lengthscale * range_d / lengthscale_d))``
    clipped to ``[minimum, maximum]``: about ``per_lengthscale`` points per
    lengthscale along each input dimension, over the share ``fraction`` of
    the box where there are inputs.

    Parameters
    ----------
    lengthscale, ranges : ndarray of shape (d,)
    per_lengthscale : float
    minimum, maximum : int
    fraction : float, default=1.0

    Returns
    -------
    int
    """
    with np.errstate(over="ignore"):
        m = fraction * float(np.prod(1.0 + per_lengthscale * np.asarray(ranges)
                                     / np.asarray(lengthscale)))
    if not np.isfinite(m):
        m = float(maximum)
    return int(np.clip(np.ceil(m), minimum, max(minimum, maximum)))


def cap_inducing(M, n_total, name="n_inducing"):
    """A given number of global inducing points, at most the number of observations.

    More inducing points than observations cannot improve the bound (with
    ``M = N`` inducing inputs at the training inputs the collapsed bound is
    already the exact marginal likelihood) but cost ``O(M^3)`` time and
    ``O(M^2)`` memory per evaluation; like scikit-learn's ``Nystroem``, a
    larger request is reduced to ``N`` with a warning.

    Parameters
    ----------
    M : int
        Requested number.
    n_total : int
        Number of training observations over all clients.
    name : str
        Parameter name for the warning.

    Returns
    -------
    int

    Warns
    -----
    UserWarning
        When ``M > n_total``.

    Notes
    -----
    A resource guard of the package (beyond the paper); the bound it keeps
    exact at ``M = N`` is Titsias (2009), "Variational learning of inducing
    variables in sparse Gaussian processes", AISTATS, eq. 9 (docs/maths.md
    section 9).
    """
    if M > n_total:
        warnings.warn(f"{name}={M} exceeds the number of training observations "
                      f"({n_total}); {n_total} inducing points are used", UserWarning,
                      stacklevel=user_stacklevel())
        return int(n_total)
    return int(M)


@contextlib.contextmanager
def default_sizes_quiet(active=True):
    """Silence :func:`cap_inducing`'s warning for sizes the user did not set.

    The classifier's and the clustering's default regressors fix their
    inducing sizes; on small data the cap applies without a warning the user
    could act on.

    Parameters
    ----------
    active : bool, default=True
        False leaves the warnings as they are (a regressor the user gave).

    Yields
    ------
    None

    Notes
    -----
    Package plumbing around :func:`cap_inducing`; no paper source.
    """
    with warnings.catch_warnings():
        if active:
            warnings.filterwarnings("ignore", message=r"n_inducing(_local)?=\d+ exceeds",
                                    category=UserWarning)
        yield


def budget_inducing(sizes, components, budget=None, n_latent=1):
    """Largest number of global inducing points one ELBO evaluation affords.

    The structured family's evaluation costs each client about
    ``n_i (M + m_i)^2 + 4 (M + m_i)^3`` multiply-adds (its feature products,
    whitening and elimination; ``m_i = min(n_i, AUTO_MAX_LOCAL)`` local
    inducing points when the local component is used; the factor 4 stands
    for the whitening solves and, with the deviation, the elimination of the
    client's own ``M + m_i`` variables), and the server ``M^3``. This
    returns the largest ``M`` whose total stays within ``budget``.

    Source: a cost model of this implementation (docs/maths.md, section
    "Inducing points"), not of the pFedHGP paper, which fixes ``M``.

    Parameters
    ----------
    sizes : list of int
        Observations per client.
    components : tuple of str
    budget : float or None, default=None
        Multiply-adds; None: :data:`AUTO_EVALUATION_BUDGET`.
    n_latent : int, default=1
        Latent functions per component (multi-output targets): ``M`` inducing
        points then carry ``n_latent * M`` variables (``m_i`` likewise).

    Returns
    -------
    int
    """
    budget = AUTO_EVALUATION_BUDGET if budget is None else float(budget)
    n = np.asarray(sizes, dtype=float)
    m = np.minimum(n, AUTO_MAX_LOCAL) if "local" in components else np.zeros_like(n)

    def cost(M):
        f = n_latent * (M + m)
        return float(np.sum(n * f**2 + 4.0 * f**3) + (n_latent * M) ** 3)

    lo, hi = 1, 1
    while cost(hi) <= budget and hi < 1 << 20:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # cost(lo) <= budget < cost(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    return lo


def _local_design(Xs, M_local, lengthscale, variance, noise_variance, jitter, random_state,
                  grow=True):
    """A client's local inducing inputs: a Sobol design (:func:`_local_inducing`)
    sized so that it explains the local prior at the client's inputs.

    Starting from ``M_local`` points, the design grows by half (up to
    :data:`AUTO_MAX_LOCAL` points, more than the client's rows if need be)
    while the trace term of the collapsed bound at the starting values,
    ``tr(K_ff - Q_ff) / (2 s2)`` (Titsias, AISTATS 2009, eq. 9), is above
    :data:`AUTO_LEARN_NATS` nats per observation and the residual
    ``tr(K_ff - Q_ff)`` above 10 times its floor from the jitter (``jitter
    * variance`` per row, which no design goes below): with little noise a few
    points per lengthscale are not enough (a client of 10 rows of ``30 sin(6
    x)`` and noise sd 0.05 needs about 4 per lengthscale). Inducing inputs at
    the client's own rows would make the local part exact at once, but the
    fitted model keeps every client's local block, so they would put the
    client's inputs into it.

    Parameters
    ----------
    Xs : ndarray of shape (n, d)
        The client's scaled inputs.
    M_local : int
        Starting number of points.
    lengthscale : ndarray of shape (d,)
    variance, noise_variance : float
        Starting local signal and noise variances (standardised units).
    jitter : float
    random_state : int
    grow : bool, default=True
        False keeps ``M_local`` points (a given ``n_inducing_local``).

    Returns
    -------
    Z : ndarray of shape (M, d)
    """
    n = Xs.shape[0]
    M = int(M_local)
    pad = LOCAL_DESIGN_PAD * np.asarray(lengthscale, float)
    while True:
        Z = _local_inducing(Xs, M, random_state, pad=pad)
        if not grow or M >= AUTO_MAX_LOCAL:
            return Z
        res, _ = design_residual(Xs, Z, lengthscale, variance, jitter)
        if (res / (2.0 * max(noise_variance, 1e-300)) <= AUTO_LEARN_NATS * n
                or res <= 10.0 * jitter * variance * n):
            return Z
        M = min(AUTO_MAX_LOCAL, int(np.ceil(1.5 * M)))


#: In a dimension where a client's inputs do not vary, its local design
#: spans this many starting lengthscales on each side of their one value
#: (:func:`_local_inducing`).
LOCAL_DESIGN_PAD = 0.25


def _local_inducing(Xs, M_local, random_state, pad=0.0):
    """A client's own local inducing inputs: a scrambled Sobol design over its box.

    Not its inputs and not k-means centres of them, so the fitted model (which
    keeps every client's local block for personalised prediction) holds no
    training row; whether the design explains the local prior well enough is
    checked by the client afterwards (``learn_inducing_locations="auto"``).
    In a dimension where the client's inputs do not vary the design spans
    ``pad`` on each side of their one value (the callers use
    :data:`LOCAL_DESIGN_PAD` starting lengthscales), so that value is not
    copied into every point. Elsewhere the design spans the client's box
    exactly: widening it changed which of two nearly equal optima training
    ended in (a far client in 2-D: client A's RMSE 1.05x or 1.4x its value
    without it, at the same ELBO).

    The box itself (the client's per-feature minimum and maximum, which the
    set-up message sends to the server, :class:`ClientSummary`) can be
    estimated from the design; for a client of two rows its corners are
    those rows' coordinates.
    """
    Xs = np.asarray(Xs, float)
    lo, hi = Xs.min(axis=0), Xs.max(axis=0)
    pad = np.where(hi > lo, 0.0, np.broadcast_to(np.asarray(pad, float), lo.shape))
    lo, hi = lo - pad, hi + pad
    d = Xs.shape[1]
    u = _sobol_next(qmc.Sobol(d, scramble=True, seed=random_state), int(M_local))
    return lo + u * (hi - lo)


class StructuredClient:
    """Client side of the structured family: wraps a :class:`Client`'s data.

    Parameters
    ----------
    client : Client
        Holds the private data (after :meth:`Client.prepare`).

    Attributes
    ----------
    client_id : hashable
    n_samples : int
    theta : ndarray
        Local log-parametrised vector (:func:`structured_local_spec`).
    pack : Packer
    posterior : dict or None
        After training: ``mu_u``, ``Sigma_u``, ``H`` (see
        :func:`skfedgp._structured.client_posterior`; the client level's
        variable is the last coordinate of ``u``) and ``level``, the
        posterior mean of the client's level (standardised units); model
        parameters only.
    prior_noise : float or ndarray of shape (Q,)
        Centre of the noise hyperprior (standardised units; set up by
        :meth:`initialise`); one per output for a multi-output client with
        ``noise="diagonal"``.
    noise_hyperprior : bool
        Whether the noise variance has that hyperprior: False for a client
        with 1-D targets whose own pilot is reliable
        (:func:`own_noise_centre`), and for one of at least
        :data:`PILOT_POOL_POINTS` rows centred on the population's noise
        when no pilot identified it (:func:`population_noise`); their data
        alone decide their noise.
    """

    #: the noise variance has its hyperprior unless :meth:`initialise` finds
    #: the client's own pilot reliable or the population's noise not
    #: identified (multi-output clients always have it)
    noise_hyperprior = True
    #: Scale of the noise hyperprior when it is the pooled small clients'
    #: spread (:func:`noise_spread`); None: ``noise_prior_scale``.
    noise_prior_sd = None

    def __init__(self, client):
        self.client_id = client.client_id
        self.n_samples = client.n_samples
        self.theta = None
        self.pack = None
        self.posterior = None
        self._state = None
        if getattr(client, "_Xs", None) is not None:  # already prepared
            self._take(client)
            self._client = None
        else:  # prepared by the server's InitBroadcast (:meth:`prepare`)
            self._client = client
            self._Xs = self._y = None

    def _take(self, client):
        self._Xs = client._Xs
        self._y = client._y_std
        self._y_scale = client._y_scale
        self._x_scale = client._x_scale
        # the client's own target variance (standardised units): the upper
        # bounds of its local variance and noise variance scale with it
        # (:meth:`value_range`), so a client on a larger scale is not capped
        # in the others' units
        self.own_variance = self._own_variance()

    def _own_variance(self):
        """Variance of this client's standardised targets (0 for fewer than 2)."""
        return float(np.var(self._y)) if self.n_samples >= 2 else 0.0

    def value_range(self, name):
        """Range ``(lo, hi)`` of one of this client's log-parametrised values.

        :data:`LOG_BOUNDS`, except that the noise variance stays above the
        client's own floor, the upper bounds of the local variance and
        the noise variance are multiplied by the client's own target
        variance when it exceeds 1, and the lower bound of the local variance
        by that variance when it is below 1 (standardised units; docs/maths.md
        section 10).

        Parameters
        ----------
        name : str
            Key of :data:`LOG_BOUNDS`.

        Returns
        -------
        lo, hi : float
            (``lo`` of ``lengthscale_l``: an array of shape (d,), the client's
            own :func:`lengthscale_floor`.)
        """
        lo = self.noise_floor if name == "noise_variance" else LOG_BOUNDS[name][0]
        if name == "variance_l":
            # a client on a far smaller scale can switch its local part off
            # in its own units (at 1e-4 of the others' units the floor 1e-6 was
            # 50 times its whole target variance, and the local part's band
            # several times its spread)
            own = getattr(self, "own_variance", 1.0)
            lo = lo * min(1.0, own if own > 1e-12 else 1.0)  # constant targets: as noise_floor
        if name == "lengthscale_l":
            floor = self._lengthscale_floor()
            if floor is not None:
                lo = floor
        return lo, self._upper_bound(name)

    def _lengthscale_floor(self):
        """Per-dimension lower bound of the local lengthscales (:func:`lengthscale_floor`
        of the client's own input widths, at least its :func:`resolution_floor`),
        or None before the data are known."""
        floor = getattr(self, "_ell_floor", None)
        if floor is None and getattr(self, "_Xs", None) is not None and self._Xs.shape[0]:
            self._resolution = resolution_floor(self._Xs)
            floor = np.maximum(self._width_floor(), self._resolution)
            self._ell_floor = floor
        return floor

    def _width_floor(self):
        """:func:`lengthscale_floor` of the client's own input widths."""
        return lengthscale_floor(np.ptp(self._Xs, axis=0))

    def _above_resolution(self, ell):
        """Local lengthscales raised to the client's :func:`resolution_floor`.

        Shorter ones cannot be told apart on its inputs, so a given
        ``local_lengthscale`` below it starts there instead of being refused.
        """
        floor = self._lengthscale_floor()
        res = getattr(self, "_resolution", None)
        if res is None:
            return ell
        ell = np.asarray(ell, dtype=float)
        # a value below the width floor too is left as given: the range check
        # then names the user's value
        width = self._width_floor() if floor is not None else 0.0
        return np.where(ell >= width, np.maximum(ell, res), ell)

    def _upper_bound(self, name):
        """Upper end of :meth:`value_range` (needs no noise floor yet)."""
        hi = LOG_BOUNDS[name][1]
        if name in ("variance_l", "noise_variance"):
            hi = hi * max(1.0, getattr(self, "own_variance", 1.0))
        return hi

    # -- set-up -------------------------------------------------------------
    def summary(self):
        """Set-up upload (:class:`ClientSummary`) of the wrapped :class:`Client`."""
        if self._client is None:
            raise RuntimeError(f"client {self.client_id!r} holds no raw data any more")
        return self._client.summary()

    def prepare(self, init):
        """Standardise and scale the private data with the server's :class:`InitBroadcast`.

        Keeps only the scaled inputs and standardised targets (the raw data
        are dropped). Returns None.
        """
        if self._client is None:
            raise RuntimeError(f"client {self.client_id!r} holds no raw data any more")
        self._client.prepare(init)
        self._take(self._client)
        self._client = None
        self._input_scale_checked = False  # a new set-up: no input-scale check of it yet

    def close(self):
        """Forget the private data (end of training). Returns None."""
        self._Xs = self._y = self._state = self._client = None

    def get_state(self):
        """This client's own checkpoint (:class:`ClientState`): its vector and optimiser state."""
        return ClientState(self.theta.copy(), self.pack, float(self.noise_floor),
                           _noise_centre_copy(self.prior_noise), copy.deepcopy(getattr(self, "_adam", None)),
                           getattr(self, "_noise_mode", None),
                           copy.deepcopy(getattr(self, "prior_local", None)),
                           getattr(self, "learn_local_inducing", None),
                           bool(getattr(self, "_noise_fitted", False)),
                           getattr(self, "_inducing_checked", None),
                           int(getattr(self, "_local_phases", 0)),
                           bool(self.noise_hyperprior), self.noise_prior_sd,
                           getattr(self, "pilot_noise", None))

    def set_state(self, state):
        """Restore :meth:`get_state` (after :meth:`prepare`). Returns None."""
        self.theta = np.array(state.theta, dtype=float, copy=True)
        self.pack = state.pack
        self.noise_floor = state.noise_floor
        self.prior_noise = state.prior_noise
        self._adam = copy.deepcopy(state.adam)
        if getattr(state, "noise_mode", None) is not None:
            self._noise_mode = state.noise_mode
        self.prior_local = copy.deepcopy(getattr(state, "prior_local", None))
        learn = getattr(state, "learn_local_inducing", None)
        self.learn_local_inducing = True if learn is None else bool(learn)
        fitted = getattr(state, "noise_fitted", None)
        self._noise_fitted = True if fitted is None else bool(fitted)  # None: saved after a round
        checked = getattr(state, "inducing_checked_at", None)
        if checked is not None:
            self._inducing_checked = checked
        self._local_phases = int(getattr(state, "local_phases", None) or 0)
        self.pilot_noise = getattr(state, "pilot_noise", None)
        # computed when a client is set up (a fresh fit, or a client new at
        # a warm start or resumed run): a client rebuilt from its state
        # reports nothing
        self.input_scale_ratios = {}
        # None: a state saved before the field existed (the prior applied).
        # A warm start that leaves a client fewer than PILOT_POOL_POINTS rows
        # gives it the prior back (no client that small goes without); else
        # the saved decision stands (a client grown beyond that keeps its
        # state), so a resumed run optimises the same objective
        prior = getattr(state, "noise_hyperprior", None)
        self.noise_hyperprior = (prior is None or bool(prior)
                                 or self.n_samples < PILOT_POOL_POINTS)
        # the pooled clients' spread belongs to clients of the pool's size: a
        # client grown past it in a warm start takes noise_prior_scale again
        # (on the same data, a resumed run, nothing changes)
        sd = getattr(state, "noise_prior_sd", None)
        self.noise_prior_sd = (None if sd is None or self.n_samples >= PILOT_POOL_POINTS
                               else float(sd))
        self._state = None

    # -- set-up -------------------------------------------------------------
    def pilot(self, random_state):
        """Quick exact-GP hyperparameters of this client (:class:`PilotSummary` or None)."""
        return pilot_fit(self._Xs, self._y, random_state)

    def _shares_local_prior(self):
        """Whether this client takes part in the small clients' local prior (either side).

        Scalar targets with a local kernel, targets on the clients' typical
        scale (:func:`client_scale_ratio` 1) and no learned scale of its own.
        """
        sl = getattr(getattr(self, "pack", None), "slices", {})
        return ("lengthscale_l" in sl and "variance_l" in sl and "shared_amplitude" not in sl
                and client_scale_ratio(self.own_variance) == 1.0)

    def local_prior_summary(self, post, theta_g, gpack, config):
        """This client's local kernel for the small clients' prior (:class:`LocalKernelSummary`).

        Its local lengthscales, and as the variance the size of the departure
        its data show: the mean over its inputs of the squared posterior mean
        of its local part (at the current ``q(v_g)``, the broadcast ``post``),
        floored at the local variance's lower bound. The kernel's own
        variance is not sent: where the global and local parts can explain
        the same structure (many inputs, a capped ``M``) a large client's
        local variance can be large while its fitted departure is small
        (PUMADYN-32nm, 400 points: 3.4 against 0.007 in standardised units).
        None (nothing sent) when the client has fewer than
        :data:`PILOT_POOL_POINTS` observations, is not on the clients' typical
        scale, learns its own scale, or has no local kernel.
        """
        from ._structured import (CHUNK_ROWS, client_posterior, feature_blocks, layout_map,
                                  predict_structured)

        if self.n_samples < PILOT_POOL_POINTS or not self._shares_local_prior():
            return None
        state = self._forward(theta_g, gpack, config)
        mu_u, Sigma_u, _ = client_posterior(state, post.mean, post.covariance)
        G, B = gpack.unpack(theta_g), self.pack.unpack(self.theta)
        comps = config.components
        phi = G.get("phi", 1.0)
        blocks = feature_blocks(G, B, comps, jitter=config.jitter)
        E, _ = layout_map(blocks, comps, phi, 1.0)
        total = 0.0
        for start in range(0, self.n_samples, CHUNK_ROWS):
            parts = predict_structured(self._Xs[start:start + CHUNK_ROWS], blocks, comps, phi, mu_u,
                                       Sigma_u, E, per_component=True)
            total += float(np.sum(parts["local"][0] ** 2))
        departure = max(total / self.n_samples, LOG_BOUNDS["variance_l"][0])
        return LocalKernelSummary(np.array(B["lengthscale_l"], dtype=float), departure)

    def set_local_prior(self, centre):
        """Centre this small client's local-kernel hyperprior on the population's.

        A client with fewer than :data:`PILOT_POOL_POINTS` observations on the
        clients' typical scale replaces the penalised-complexity prior of its
        local standard deviation and the prior of its local lengthscales
        centred on the population's lengthscales by ``log ell_l ~ N(log
        ell_c, s^2)`` per input and ``log sigma_l^2 ~ N(log sigma_c^2, s^2)``, ``s =``
        :data:`LOCAL_PRIOR_SD`, ``(ell_c, sigma_c^2)`` the ``centre``
        (:class:`LocalKernelSummary`). Returns None (nothing sent).
        """
        if (centre is None or self.n_samples >= PILOT_POOL_POINTS
                or not self._shares_local_prior()):
            return None
        prior = {k: v for k, v in (getattr(self, "prior_local", None) or {}).items()
                 if k != "population_tried"}  # a new centre: one more start from it
        self.prior_local = {**prior,
                            "population": (np.log(np.asarray(centre.lengthscale, dtype=float)),
                                           float(np.log(centre.variance)))}
        return None

    def pool_evidence(self, theta):
        """This client's term of the pooled pilot at ``theta`` (:func:`pool_evidence`).

        Returns None (the client stays out of the pool) when its targets are
        (almost) constant or clearly on another scale than the clients'
        typical one (:func:`client_scale_ratio`): the pooled noise variance
        is in the typical client's units.
        """
        if not self._poolable():
            return None
        return pool_evidence(self._Xs, self._y, theta)

    def _poolable(self):
        """Whether this client's rows can join the pooled pilot (see :meth:`pool_evidence`)."""
        return (PILOT_POOL_MIN_POINTS <= self.n_samples < PILOT_POOL_POINTS
                and self.own_variance >= 1e-12 and client_scale_ratio(self.own_variance) == 1.0)

    def _starts_own(self, own, population):
        """Whether the client's local kernel starts from its own pilot ``own``.

        Not when it ran none, nor when that pilot interpolated its points
        with a kernel that is white noise at them while the population's
        noise is identified (:func:`noise_identified`, :func:`white_at_inputs`).
        """
        return own is not None and (
            noise_identified(own) or not getattr(population, "noise_identified", True)
            or not white_at_inputs(self._Xs, own.lengthscale))

    @staticmethod
    def _tests_scale(starts_own, own, config):
        """Whether the lengthscale tests apply: shared parts, and an own pilot
        (``starts_own``, :meth:`_starts_own`) that found signal."""
        return bool(("global" in config.components or "deviation" in config.components)
                    and starts_own and own.variance > own.noise_variance)

    def _input_scale_ratios(self, own, population, config, starts_own):
        """:func:`input_scale_mismatch` of this client against the typical client's."""
        if not self._tests_scale(starts_own, own, config):
            return {}
        return input_scale_mismatch(self._Xs, self._y, own,
                                    getattr(population, "input_lengthscale", None),
                                    getattr(population, "input_width", None))

    def input_scale_check(self, config, own, population):
        """Set-up exchange before the global design: the inputs on another scale here.

        The client tests its own rows against the typical client's
        lengthscales and input widths (``population.input_lengthscale`` and
        ``input_width``; :func:`input_scale_mismatch`) and keeps the result
        (``input_scale_ratios``, used again by :meth:`initialise`).

        Parameters
        ----------
        config : ModelConfig
            The model's settings (its ``components`` decide whether the
            test applies: only with the global or deviation part).
        own : PilotSummary or None
            The client's own pilot (:meth:`pilot`; None if it ran none).
        population : _PopulationPilot
            The population's pilot values, with the typical client's
            ``input_lengthscale`` and ``input_width`` (scaled input units).

        Returns
        -------
        InputScaleReport
            Per input, the ratio of the client's pilot lengthscale to the
            typical client's where the test reports it, else 0 (``d``
            numbers, dimensionless). The server leaves a client with a
            reported input out of the global design when client scales are
            on.

        Notes
        -----
        Raises nothing of its own: an exact GP of the test that cannot be
        fitted (a failed factorisation) leaves that input unreported
        (:func:`input_scale_mismatch`). Beyond the pFedHGP paper (H. Yan, "Personalized Federated
        Hierarchical Gaussian Processes for Privacy-Preserving Modeling of
        Heterogeneous Distributed Systems", arXiv:2609.19337, 2026), whose
        model has one lengthscale per input for every client: the package's
        extension of docs/maths.md, section 10 (the likelihood-ratio test of
        S. S. Wilks, Annals of Mathematical Statistics 9(1), 1938).
        """
        self.input_scale_ratios = self._input_scale_ratios(
            own, population, config, self._starts_own(own, population))
        self._input_scale_checked = True
        out = np.zeros(self._Xs.shape[1])
        for k, r in self.input_scale_ratios.items():
            out[int(k)] = float(r)
        return InputScaleReport(out)

    def initialise(self, config, M_local, theta_g, gpack, own, population, random_state):
        """Initial local vector.

        Local inducing inputs: a scrambled Sobol design over the client's own
        box (:func:`_local_inducing`; never its inputs). Local lengthscales:
        its own pilot's (or the population median if it ran none, if its
        pilot interpolated its points with a kernel that is white noise at
        them while the population's noise is identified
        (:func:`noise_identified`, :func:`white_at_inputs`), or if it
        explained its targets as more noise than signal); local
        variance: 0.1 x the same pilot's signal variance; noise: its pilot
        noise variance (the population's, rescaled as the initial values of
        a client on another scale, when it ran none or when its pilot
        interpolated with a kernel white at its inputs while the population's
        noise is identified; floored); unless ``noise_variance`` is given or
        the client's pilot is reliable (:func:`own_noise_centre`), raised to
        the shared parts' prior variance that the global inducing points
        leave unexplained at its inputs (at the client's starting scale when
        it learns one) where that is at most 5 % of their prior variance, but
        not above half its own target variance (:meth:`_shared_residual`;
        docs/maths.md, section 10).
        """
        d = self._Xs.shape[1]
        # a client too small for a pilot fit takes the population's values,
        # rescaled to its own spread when that is clearly another scale (more
        # than 10x off the population's total variance either way); so does
        # a client whose pilot interpolated its points with a kernel that is
        # white noise at them (noise_identified, white_at_inputs), where the
        # population's noise is identified: that pilot's lengthscale and
        # noise are not, and a local part started at them begins as white
        # noise at the client's inputs, an optimum of its own that the rounds
        # do not leave (a pilot that interpolates noise-free data smoothly
        # is kept)
        starts_own = self._starts_own(own, population)
        p = own if starts_own else population
        own_var = self.own_variance
        scale = scale_ratio(own_var, population)
        ratio = 1.0 if starts_own else scale
        # the local kernel starts from the population's values too when the
        # client's own pilot explained its targets as more noise than signal
        # (the noise-only optimum of a GP's marginal likelihood: a local part
        # started from it begins switched off and stays so)
        pl, ratio_l = p, ratio
        if starts_own and own.variance <= own.noise_variance:
            pl, ratio_l = population, scale
        values = {}
        if "local" in config.components:
            span = np.ptp(self._Xs, axis=0)
            if M_local is None:
                M_local = auto_inducing(pl.lengthscale, span, per_lengthscale=AUTO_PER_LENGTHSCALE,
                                        minimum=min(AUTO_MIN_INDUCING, self.n_samples),
                                        maximum=min(AUTO_MAX_LOCAL, self.n_samples))
            ell = (start_lengthscale(pl.lengthscale, span)
                   if config.local_lengthscale is None
                   else _default_lengthscale(config.local_lengthscale, self._x_scale, 0.0))
            ell = self._above_resolution(ell)
            var = (0.1 * pl.variance * ratio_l if config.local_variance is None
                   else float(config.local_variance))
            values.update(
                lengthscale_l=check_in_bounds("lengthscale_l", ell,
                                              config.local_lengthscale is not None,
                                              self.value_range("lengthscale_l")),
                variance_l=check_in_bounds("variance_l", var, config.local_variance is not None,
                                           self.value_range("variance_l")))
            # hyperpriors from the population's values (the clients' pilot
            # medians), not the client's own pilot, which a few points make
            # unreliable (see log_prior)
            self.prior_local = {
                # the larger of the population's signal and the client's own
                # spread: a client on another scale keeps a local part of its size
                "sd_rate": float(LOCAL_SD_RATE / np.sqrt(max(population.variance, own_var,
                                                             1e-12))),
                # the small clients' local lengthscale prior (log_prior): a
                # given local lengthscale is its own centre
                "lengthscale_centre": np.log(np.asarray(
                    population.lengthscale if config.local_lengthscale is None else ell,
                    dtype=float)),
                # where a switched-off local part is restarted from
                # (:meth:`_restart_local`): the start of a client without a pilot
                "restart": (np.asarray(
                    start_lengthscale(population.lengthscale, span)
                    if config.local_lengthscale is None else ell, dtype=float).copy(),
                    float(0.1 * population.variance * scale
                          if config.local_variance is None else var))}
        s2 = (p.noise_variance * ratio if config.noise_variance is None
              else float(config.noise_variance) / self._y_scale**2)
        # the client's own noise floor: NOISE_FLOOR times its own target variance
        # (standardised units), so a client on a small scale is not floored in
        # the others' units
        self.noise_floor = NOISE_FLOOR * (own_var if own_var > 1e-12 else 1.0)
        lo, hi = self.value_range("noise_variance")
        # the hyperprior's centre: a client whose pilot is reliable
        # (own_noise_centre), its own pilot's noise (unused by the prior,
        # which such a client does not have: a population centre pulled a
        # noisy client among nearly noise-free ones towards their noise, and
        # its local part then fitted its noise); otherwise the
        # population's noise, in the client's own units when its targets are
        # clearly on a larger scale (prior_scale)
        # (a pilot white at the client's inputs counts as none: starts_own)
        own_centre = starts_own and own_noise_centre(self.n_samples, d)
        pilot_noise = own.noise_variance if starts_own else None
        # the noise variance of an exact GP on the client's own rows, where
        # it is reliable and found signal: the end of fit compares the
        # model's noise with it (regressor.ClientFittedAsNoiseWarning); a
        # hyperparameter, not data
        self.pilot_noise = (float(own.noise_variance)
                            if own_centre and noise_identified(own)
                            and own.variance > own.noise_variance else None)
        replicate_var, replicate_dof = ((np.nan, 0) if own_centre
                                        else pure_error_variance(self._Xs, self._y))
        # a client too small for that whose rows repeat inputs: the spread
        # of its targets at equal inputs (pure error; needs no model), if
        # above the client's noise floor (a client that repeats noise-free
        # readings keeps the population's centre)
        replicate_centre = (not own_centre and replicate_dof >= PURE_ERROR_MIN_DOF
                            and replicate_var > 2.0 * self.noise_floor)
        # a client of the pooled pilot (without a centre of its own) takes
        # the pooled clients' spread as its prior's scale where the pool
        # measured one (noise_spread), and is centred on the pooled noise,
        # not on the population's, where the two are clearly apart
        # (noise_pooled): the population's centre is the larger clients'
        # noise wherever they outnumber the pool, and small clients of
        # another noise level than theirs were held near it
        pooled_client = not own_centre and not replicate_centre and self._poolable()
        pooled_centre = pooled_client and getattr(population, "noise_pooled", None) is not None
        s_ratio = client_scale_ratio(own_var)
        # a client whose own pilot found signal on an input scale the
        # population's lengthscales clearly do not fit (lengthscale_mismatch)
        # both lengthscale tests need shared parts and a pilot that found signal
        tests_scale = self._tests_scale(starts_own, own, config)
        mismatch = (getattr(config, "client_scale", False) == "auto" and tests_scale
                    and lengthscale_mismatch(self._Xs, self._y, own, population.lengthscale))
        # inputs along which the client's own rows vary on another scale than
        # the typical client's (InputScaleWarning; lengthscale ratios, not
        # data): found in the set-up exchange before the global design
        # (input_scale_check), else here (a client joining a warm start)
        checked, self._input_scale_checked = getattr(self, "_input_scale_checked", False), False
        if not checked:
            self.input_scale_ratios = self._input_scale_ratios(own, population, config,
                                                               starts_own)
        # with client scales on, such a client too learns its scale on the
        # shared parts (it detaches from them where they cannot serve it) and
        # starts its local kernel from its own pilot: one input in other units
        # (per cent beside fractions) barely moves the geometric mean that
        # lengthscale_mismatch tests
        mismatch = mismatch or bool(getattr(config, "client_scale", False)
                                    and self.input_scale_ratios)
        chance = None
        if pilot_noise is None and population.noise_variance > 0:
            # no usable pilot: how little the population's GP lets its rows
            # spread (from its own inputs and the broadcast values; at most
            # PILOT_MAX_POINTS rows, evenly spaced, as a pilot's), computed
            # only if learns_client_scale needs it
            def chance():
                rows = np.unique(np.linspace(0, self.n_samples - 1,
                                             min(self.n_samples, PILOT_MAX_POINTS)).astype(int))
                return spread_chance(self._Xs[rows], self._y[rows], population.lengthscale,
                                     population.variance, population.noise_variance)
        learn_scale = learns_client_scale(
            config, s_ratio, self.n_samples, own_var,
            pilot_noise, population.noise_variance, other_input_scale=mismatch,
            spread_chance=chance)
        # set-up's "auto" inducing check leaves such a client out (design_residual)
        self._lengthscales_rejected = bool(mismatch and learn_scale)
        if own_centre:
            centre = own.noise_variance
        elif replicate_centre:
            centre = replicate_var
            if config.noise_variance is None:
                s2 = replicate_var
        elif pooled_centre:
            centre = population.noise_pooled
        else:
            centre = population.noise_variance * prior_scale(
                own_var, population, pilot_noise)
        if learn_scale and s_ratio < 1.0 and not (own_centre or replicate_centre):
            # a client in another, far smaller unit (it learns its scale on the
            # shared parts): the population's noise in its own units, r_i s2_c
            # (r_i its variance over the typical client's). Its shared parts
            # are scaled by s_i too, so its points constrain the shared
            # function no more than a typical client's do (a client of 3 rows
            # at 1e-4 of the others' units was centred on their noise, 1e8
            # times its own variance: the prior held its noise there and its
            # level 28 of its spreads from its data). The centre is fixed: tied
            # to the learned scale (s2_c a_i^2 / variance_g) it pulled a
            # precise sensor of the others' units, whose scale should return to
            # 1, towards a small scale (test_precise_sensor_on_a_short_window...)
            centre = centre * s_ratio
        self.prior_noise = float(np.clip(centre, 2.0 * self.noise_floor, hi))
        # a client whose own pilot is reliable takes no noise hyperprior: its
        # data decide its noise. Centred on that pilot (the same data, fitted
        # with one kernel that counts short-scale structure as noise, or
        # interpolates it) the prior pinned the noise there and the shared
        # parts took the rest (docs/maths.md, section 10). The centre is still
        # where a restarted local part starts its noise (_try_local_start).
        # So does a client of PILOT_POOL_POINTS rows or more centred on the
        # population's noise when no pilot identified it (population_noise:
        # every pilot interpolated; the centre is then their noise bound)
        self.noise_hyperprior = not own_centre and (
            replicate_centre or self.n_samples < PILOT_POOL_POINTS
            or bool(getattr(population, "noise_identified", True)))
        # other clients (larger ones, another scale, too few rows) keep
        # noise_prior_scale
        self.noise_prior_sd = (getattr(population, "noise_spread", None) if pooled_client
                               else None)
        if config.noise_variance is None and not own_centre:
            # Without a reliable pilot of its own, the start is not below the
            # shared prior variance that Z_g leaves unexplained at the
            # client's inputs. From a pilot that interpolated a few points
            # (noise near its floor) the trace term of that residual over the
            # noise would cost thousands of nats, and the first global phase
            # would switch the shared parts off for every client to remove it.
            # Only where the design covers the inputs (else the residual is a
            # large part of the prior and says nothing about the noise); at
            # the client's starting scale s_i when it learns one (s_i^2 r_i);
            # never above half its own variance.
            shared = self._shared_residual(theta_g, gpack, config)
            if learn_scale:
                shared *= float(np.clip(np.sqrt(s_ratio), 1e-10, 1e10)) ** 2
            s2 = max(s2, min(shared, 0.5 * own_var))
        # a given noise variance below the floor (e.g. noise-free data) starts just above it
        if config.noise_variance is not None and s2 > hi:
            check_in_bounds("noise_variance", s2, True, (lo, hi))  # raises: above the range
        values["noise_variance"] = float(np.clip(max(s2, 2.0 * self.noise_floor),
                                                 self.noise_floor * 1.01, hi * 0.99))
        if "local" in config.components:
            values["Z_l"] = _local_design(
                self._Xs, M_local, values["lengthscale_l"], values["variance_l"],
                values["noise_variance"], config.jitter, random_state,
                grow=config.n_inducing_local == "auto")
        if mismatch and "local" in config.components and config.local_lengthscale is None:
            # its data rejected the population's lengthscales (and its local
            # kernel started from its own pilot: mismatch needs that): where
            # _restart_local also starts from, should the first phase switch
            # the local part off, and the centre of its local lengthscale
            # prior (a client of few rows), its own starting lengthscales
            self.prior_local["own_start"] = (
                np.asarray(values["lengthscale_l"], dtype=float).copy(),
                float(values["variance_l"]))
            self.prior_local["lengthscale_centre"] = np.log(self.prior_local["own_start"][0])
        if learn_scale:
            # the client's scale on the shared parts starts at, and its prior is
            # centred on, the square root of its spread over the clients'
            # typical one (docs/maths.md, section 10); it is parametrised by
            # its amplitude a = s sqrt(variance_g), which the server's steps on
            # variance_g leave alone (else the two drift along a ridge, s up
            # and variance_g down, one round at a time)
            centre = float(np.clip(np.sqrt(s_ratio), 1e-10, 1e10))
            G0 = gpack.unpack(theta_g)
            amp = centre * float(np.sqrt(G0["variance_g"]))
            amp = float(np.clip(amp, *(1.01 * LOG_BOUNDS["shared_amplitude"][0],
                                       0.99 * LOG_BOUNDS["shared_amplitude"][1])))
            self.prior_local = {**(getattr(self, "prior_local", None) or {}),
                                "log_amplitude_centre": float(np.log(amp))}
            values["shared_amplitude"] = amp
        self.pack = structured_local_spec(
            config.components, values["Z_l"].shape[0] if "Z_l" in values else 0, d,
            client_scale=learn_scale)
        self.theta = self.pack.pack(values)
        self._decide_local_inducing(config)

    def _shared_residual(self, theta_g, gpack, config):
        """Mean over the inputs of the global and deviation prior variance left
        unexplained by the global inducing points (``k(x, x) - q(x, x)``, the
        per-point trace term of the bound; standardised units).

        0 without those parts, or where the residual is more than
        :data:`NOISE_START_MAX_SHARE` of their prior variance (the design
        does not cover the inputs at the starting lengthscales).
        """
        comps = tuple(config.components)
        G = gpack.unpack(theta_g)
        if "Z_g" not in G or not self.n_samples or not ("global" in comps
                                                         or "deviation" in comps):
            return 0.0
        var = float(G.get("variance_g", 1.0))
        weight = (1.0 if "global" in comps else 0.0) + (
            float(G.get("phi", 0.0)) if "deviation" in comps else 0.0)
        try:
            res, _ = self._global_residuals(G, config.jitter)
        except np.linalg.LinAlgError:
            return 0.0
        mean = float(np.mean(res))
        return weight * mean if mean <= NOISE_START_MAX_SHARE * var else 0.0

    def _global_residuals(self, G, jitter):
        """Per-input ``k(x, x) - q(x, x)`` of the global kernel(s) at the unpacked
        global values ``G`` (``(n_i, R)``) and ``n_i variance_g``
        (:func:`latent_design_residuals`); shared by :meth:`design_residual`
        and :meth:`_shared_residual`."""
        return latent_design_residuals(self._Xs, G["Z_g"], G["lengthscale_g"],
                                       float(G.get("variance_g", 1.0)), jitter, per_row=True)

    def _local_residuals(self, L, jitter):
        """Per-input ``k(x, x) - q(x, x)`` of the local kernel(s) at the unpacked
        local values ``L`` (``(n_i, R)``) and ``n_i variance_l``; shared by
        :meth:`_decide_local_inducing` and :meth:`trace_terms`."""
        return latent_design_residuals(self._Xs, L["Z_l"], L["lengthscale_l"],
                                       float(L.get("variance_l", 1.0)), jitter, per_row=True)

    def _decide_local_inducing(self, config, recheck=False):
        """Whether this client learns its local inducing inputs (``learn_local_inducing``).

        With ``learn_inducing="auto"``: when, at the current values, they
        leave more than :data:`AUTO_LEARN_RESIDUAL` of the local prior
        variance at the client's inputs unexplained, or (after set-up) a
        trace term above :data:`AUTO_LEARN_NATS` nats per observation and
        :data:`AUTO_LEARN_MIN_NATS` (:func:`auto_learns`; 0
        when they are the client's own inputs). Called at set-up and, while
        they are held, at the start of every local phase. A decision of the
        client alone: nothing is sent.
        """
        mode = getattr(config, "learn_inducing", True)
        self._jitter = float(config.jitter)  # for the two-argument set-up call
        if "Z_l" not in self.pack.slices:  # no local part: nothing to learn
            self.learn_local_inducing = False
            return
        if not isinstance(mode, str):
            self.learn_local_inducing = bool(mode)
            return
        L = self.local_values()
        res, tot = self._local_residuals(L, config.jitter)
        self._inducing_checked = self.theta.tobytes()
        nats = self._trace_nats("l", res, L) if recheck else None
        self.learn_local_inducing = auto_learns(float(np.sum(res)), tot * res.shape[1], nats,
                                                self._n_observations())

    def _n_observations(self):
        """Number of observed target values (rows here; observed entries for ILMM)."""
        return int(self.n_samples)

    def _trace_nats(self, kind, residuals, L, G=None, components=()):
        """Trace term (nats) of the collapsed bound from per-input residuals.

        ``kind`` is ``"g"`` (the global inducing inputs: global and deviation
        amplitudes, ``components`` tells which are used) or ``"l"`` (the
        local ones); ``residuals`` (n, R) from :func:`latent_design_residuals`
        with ``per_row`` (they include the kernel variance).
        """
        s2 = float(np.asarray(L["noise_variance"], float).reshape(-1)[0])
        if kind == "l":
            return float(np.sum(residuals)) / (2.0 * s2)
        gamma = (1.0 if "global" in components else 0.0) + (
            float(G["phi"]) if "deviation" in components and "phi" in G else 0.0)
        return gamma * float(np.sum(residuals)) / (2.0 * s2)

    def design_residual(self, theta_g, gpack, config=None):
        """:class:`DesignResidual` of the global kernel(s) at the global vector.

        Exchange of ``learn_inducing="auto"`` at set-up and before rounds
        while ``Z_g`` is held: four numbers. ``nats`` is 0 until this client
        has run a local phase (its noise variance is the pilot's until then).
        ``config`` is sent with the checks during training; the set-up call
        sends two arguments, as servers of earlier versions did (``nats`` is
        0 then, and the jitter the client's set-up one).
        """
        jitter = float(config.jitter) if config is not None else self._jitter
        G, L = gpack.unpack(theta_g), self.local_values()
        res, tot = self._global_residuals(G, jitter)
        # the shared parts' prior at this client is s_i^2 times the global
        # one (s_i = 1 unless it learns its scale): its trace term carries
        # s_i^2 (as in trace_terms), and its share of the population's
        # residual is weighted by s_i^2, at most 1 (a client in a far larger
        # unit does not decide for every client). At set-up, a client that
        # learns its scale because its own data rejected the population's
        # lengthscales (lengthscale_mismatch, input_scale_mismatch) is left
        # out: the residual at those lengthscales says nothing about the part
        # it will keep, and the checks before later rounds count it at its
        # learned scale
        a2 = float(shared_scale(L, G)) ** 2
        weight = (0.0 if config is None and getattr(self, "_lengthscales_rejected", False)
                  else min(a2, 1.0))
        nats = (a2 * self._trace_nats("g", res, L, G, tuple(config.components))
                if config is not None and getattr(self, "_noise_fitted", False) else 0.0)
        return DesignResidual(weight * float(np.sum(res)), weight * tot * res.shape[1], nats,
                              self._n_observations())

    # -- one evaluation -------------------------------------------------------
    def _blocks(self, theta_g, gpack, config, theta=None):
        from ._structured import feature_blocks

        G = gpack.unpack(theta_g)
        B = self.pack.unpack(self.theta if theta is None else theta)
        return G, B, feature_blocks(G, B, config.components, jitter=config.jitter)

    def _centre(self, has_level):
        """The centre ``m`` of this client's targets in the passes: its mean with a level, else 0.

        With a random level the client works with ``y - m`` and gives the
        level's whitened variable the prior mean ``mu0 = -m / tau``: the same
        bound, without ``O(m^2)`` quadratic forms, which lose float64
        precision when the clients' levels are far apart (docs/maths.md,
        section 10).
        """
        return float(np.mean(self._y)) if has_level and self.n_samples else 0.0

    def _forward(self, theta_g, gpack, config, theta=None):
        """The client's statistics (``.S``, ``.b``, ``.e``) at the given vectors."""
        from ._structured import client_forward

        G, B, blocks = self._blocks(theta_g, gpack, config, theta)
        m = self._centre("level_variance" in G)
        mu0 = -m / float(np.sqrt(G["level_variance"])) if m else 0.0
        return client_forward(self._Xs, self._y - m, blocks, config.components,
                              B["noise_variance"], G.get("phi", 1.0), level_mean=mu0,
                              scale=shared_scale(B, G), client=self.client_id)

    def _backward(self, state, mu, A_inv, *, want_global, want_local):
        """Gradient dict of the client's surrogate at ``state`` (:meth:`_forward`)."""
        from ._structured import client_backward

        y = self._y - self._centre(state.layout.has_level)
        grads = client_backward(state, self._Xs, y, mu, A_inv,
                                want_global=want_global, want_local=want_local)
        g_s = grads.pop("client_scale", None)
        if g_s is not None and "shared_amplitude" in self.pack.slices:
            # s = a / sqrt(variance_g): ds/da = 1 / sqrt(variance_g),
            # ds/dvariance_g = -s / (2 variance_g)
            var_g = float(next(v for nm, _, _, v, _ in state.blocks if nm == "g"))
            if want_local:
                grads["shared_amplitude"] = g_s / np.sqrt(var_g)
            if want_global:
                grads["variance_g"] = (grads.get("variance_g", 0.0)
                                       - g_s * state.layout.scale / (2.0 * var_g))
        return grads

    @single_threaded_blas()
    def statistics(self, theta_g, gpack, config, round_):
        """Forward pass at the broadcast global vector: :class:`StructuredStatistics`."""
        self._state = self._forward(theta_g, gpack, config)
        st = self._state
        lp, _ = self.log_prior(self.theta, config)
        return StructuredStatistics(round_, st.S, st.b, st.e, lp)

    @single_threaded_blas()
    def global_gradient(self, post, theta_g, gpack, config):
        """Backward pass: this client's share of the global gradient (:class:`GlobalGradient`)."""
        if self._state is None:  # e.g. a process-based backend dropped it
            self.statistics(theta_g, gpack, config, post.round)
        g = self._backward(self._state, post.mean, post.covariance, want_global=True,
                           want_local=False)
        grad = gpack.flat_grad(theta_g, g) if gpack.size else np.zeros(0)
        if not np.all(np.isfinite(grad)):
            raise FloatingPointError(
                f"client {self.client_id!r} produced a non-finite global gradient")
        return GlobalGradient(post.round, grad)

    def _surrogate(self, theta, theta_g, gpack, config, mu, A_inv):
        """Client part of the bound with ``q(v_g)`` fixed, and its gradient."""
        st = self._forward(theta_g, gpack, config, theta)
        value = -0.5 * st.e
        if mu.size:
            value += float(st.b @ mu) - 0.5 * (float(np.sum(st.S * A_inv)) + float(mu @ st.S @ mu))
        g = self._backward(st, mu, A_inv, want_global=False, want_local=True)
        flat = self.pack.flat_grad(theta, g)
        lp, dlp = self.log_prior(theta, config)
        return value + lp, flat + dlp

    def log_prior(self, theta, config):
        """Log hyperprior of the client's own hyperparameters and its gradient (log scale).

        ``log s2_i ~ N(log s2_c, tau^2)``, except for a client with 1-D targets
        whose own pilot is reliable (:func:`own_noise_centre`: at least
        :data:`PILOT_POOL_POINTS` observations and
        :data:`OWN_NOISE_POINTS_PER_PARAMETER` per pilot hyperparameter),
        which has no noise hyperprior (``noise_hyperprior`` False: centred on
        that pilot's noise variance, an estimate from the same data with one
        kernel, it pinned the noise there; docs/maths.md, section 10), nor
        for one of at least :data:`PILOT_POOL_POINTS` observations centred on
        a population noise that no pilot identified
        (:func:`population_noise`). A
        client whose rows repeat inputs centres it on its pure-error variance
        (:func:`pure_error_variance`), another on the
        population's ``s2_pop``, the median of the
        clients' pilot noise variances weighted by their numbers of points
        (set-up exchange; a pilot on more points interpolates less; pilots
        that interpolated their points left out, :func:`population_noise`), the
        small clients counting with one pooled pilot
        (:meth:`_StructuredRun._pooled_noise`), and
        ``tau = config.noise_prior_scale`` (None: no prior), or, for a
        client of the pooled small clients where they measured the spread of
        their noise, that spread (``noise_prior_sd``, :func:`noise_spread`;
        between :data:`NOISE_SPREAD_MIN` and ``noise_prior_scale``), around
        their pooled noise where it is clearly not the population's
        (:data:`NOISE_POOLED_OFFSET`). A client with
        few observations cannot then drive its noise variance to zero and
        interpolate its points; with many observations the prior is
        negligible. With scalar targets the local kernel's standard
        deviation ``sigma_l`` (square root of its variance) gets the
        exponential penalised-complexity prior of
        Simpson et al. (*Statistical Science* 32(1), 2017, section 3)
        ``log p = -lambda sigma_l``, ``lambda = ln(20) / sigma_pop``,
        ``sigma_pop`` the larger of the pilots' median signal std and the
        client's own target std (a larger local part has prior probability
        0.05), used without the log-scale Jacobian so that the
        local part can still be switched off. A client with a handful of
        points cannot then turn its local part into a second, freely scaled
        level. A client with fewer than
        :data:`LOCAL_LENGTHSCALE_PRIOR_POINTS` observations also has ``log
        ell_l ~ N(log ell_pop, LOCAL_PRIOR_SD^2)`` per input, ``ell_pop`` the
        population's lengthscales at set-up, or the given
        ``local_lengthscale`` (``prior_local["lengthscale_centre"]``): its few
        points cannot tell which inputs its departure varies in. An input
        the population switched off has a centre far beyond the box, so the
        prior pushes the client's local part to switch it off too. The
        larger clients' local kernels, once they form a prior
        (:meth:`set_local_prior`), replace both local priors. A client that
        learns its scale ``s_i`` on the shared parts has, on its amplitude
        ``a_i = s_i sqrt(variance_g)``,
        ``log a_i ~ N(log a_start, CLIENT_SCALE_PRIOR_SD^2)``, ``a_start`` its
        set-up value (a weak prior: the data decide); if its targets vary far
        less than the others', its noise centre ``s2_c`` is in its own units
        (:meth:`initialise`). ``noise_prior_scale=None``
        switches all these priors off.
        Constant terms are dropped.

        Returns
        -------
        value : float
        grad : ndarray of shape (P_i,)
        """
        grad = np.zeros_like(theta)
        tau = config.noise_prior_scale
        if tau is None:
            return 0.0, grad
        value = 0.0
        if self.noise_hyperprior:
            sl = self.pack.slices["noise_variance"]  # one entry, or one per output
            sd = tau if self.noise_prior_sd is None else min(tau, self.noise_prior_sd)
            delta = theta[sl] - np.log(np.asarray(self.prior_noise, dtype=float))
            grad[sl] = -delta / sd**2
            value = float(-0.5 * np.sum((delta / sd) ** 2))
        prior = getattr(self, "prior_local", None) or {}
        if "population" in prior and self.n_samples < PILOT_POOL_POINTS:
            # a small client: the population's local kernel (a client grown
            # beyond PILOT_POOL_POINTS by a warm start keeps its own prior)
            for key, centre in zip(("lengthscale_l", "variance_l"), prior["population"]):
                sl = self.pack.slices[key]
                delta = (theta[sl] - centre) / LOCAL_PRIOR_SD
                value -= 0.5 * float(np.sum(delta**2))
                grad[sl] -= delta / LOCAL_PRIOR_SD
        elif "sd_rate" in prior:
            k = self.pack.slices["variance_l"].start
            sd = float(np.exp(0.5 * theta[k]))
            value -= prior["sd_rate"] * sd
            grad[k] = -0.5 * prior["sd_rate"] * sd
            if ("lengthscale_centre" in prior
                    and self.n_samples < LOCAL_LENGTHSCALE_PRIOR_POINTS):
                sl = self.pack.slices["lengthscale_l"]
                delta = (theta[sl] - prior["lengthscale_centre"]) / LOCAL_PRIOR_SD
                value -= 0.5 * float(np.sum(delta**2))
                grad[sl] -= delta / LOCAL_PRIOR_SD
        if "shared_amplitude" in self.pack.slices and "log_amplitude_centre" in prior:
            k = self.pack.slices["shared_amplitude"].start
            delta = float(theta[k]) - prior["log_amplitude_centre"]
            value -= 0.5 * (delta / CLIENT_SCALE_PRIOR_SD) ** 2
            grad[k] -= delta / CLIENT_SCALE_PRIOR_SD**2
        return value, grad

    @single_threaded_blas()
    def local_phase(self, post, theta_g, gpack, config):
        """Maximise this client's part of the bound over its own vector, ``q(v_g)`` fixed.

        ``-1/2 e_i + b_i^T mu_g - 1/2 tr(S_i (A^{-1} + mu_g mu_g^T))`` is a lower
        bound on the collapsed ELBO as a function of the client's own
        hyperparameters that touches it at the current point, so every
        improvement of it improves the ELBO (block coordinate ascent; no
        communication).  L-BFGS-B (``config.optimizer="lbfgs"``) or Adam.
        """
        from scipy.optimize import minimize

        mu, A_inv = post.mean, post.covariance
        n = max(self.n_samples, 1)
        if (isinstance(getattr(config, "learn_inducing", True), str)
                and getattr(self, "learn_local_inducing", None) is False
                and getattr(self, "_inducing_checked", None) != self.theta.tobytes()):
            # "auto" with Z_l held and the local vector moved since the last check
            self._decide_local_inducing(config, recheck=True)
        bounds = self.bounds(config)
        last = {}  # the latest evaluation: L-BFGS-B starts where the chunk test evaluated

        def fun(t):
            key = np.asarray(t, dtype=float).tobytes()
            if key not in last:
                v, g = self._surrogate(t, theta_g, gpack, config, mu, A_inv)
                last.clear()
                last[key] = (-v / n, -g / n)
            f, g = last[key]
            return f, g.copy()

        def fun_trial(t):
            # a trial point where the bound cannot be evaluated in floating
            # point (e.g. an extreme step of a nearly noise-free client) is
            # rejected, and the line search backs off, as in the server's phase
            try:
                return fun(t)
            except (np.linalg.LinAlgError, FloatingPointError):
                return np.inf, np.zeros_like(t)

        def lbfgs(start):
            # one run of at most local_steps iterations (a chunk, or the restart)
            return minimize(fun_trial, start, jac=True, method="L-BFGS-B", bounds=bounds,
                            options={"maxiter": config.local_steps, "ftol": 1e-12,
                                     "gtol": 1e-9})

        theta0 = self.theta.copy()
        self._local_phases = getattr(self, "_local_phases", 0)
        failed = False  # the phase could not evaluate its start
        if config.local_steps == 0:
            pass  # held (SciPy's L-BFGS-B would still take one step with maxiter=0)
        elif config.optimizer == "lbfgs":
            # chunks of local_steps iterations, more (LOCAL_MAX_CHUNKS > 1)
            # while the last one still gained more than LOCAL_CHUNK_GAIN nats
            # per observation: a client whose state the new q(v_g) made very
            # poor can be far from its optimum after local_steps iterations
            try:
                f = fun(theta0)[0]
                for _ in range(LOCAL_MAX_CHUNKS):
                    res = lbfgs(self.theta)
                    if not (np.isfinite(res.fun) and res.fun <= f):
                        break
                    gain, f = f - res.fun, res.fun
                    self.theta = res.x
                    if res.nit < config.local_steps or gain <= LOCAL_CHUNK_GAIN:
                        break
            except (np.linalg.LinAlgError, FloatingPointError):
                # a failed trial point: keep the last good vector (a phase
                # that failed does not count: the restart waits for one that ran)
                failed = True
            if not failed and self._local_phases == 0:
                self._restart_local(fun, lbfgs, bounds)
            if not failed:
                self._start_from_population(fun, lbfgs, bounds)
        else:
            adam = self._adam_state(config)
            t = theta0
            for _ in range(config.local_steps):
                _, g = fun(t)
                t = clip_to_bounds(adam.step(t, -g * n), bounds)
            self.theta = t
        if config.local_steps and not failed:
            self._local_phases += 1
        self._noise_fitted = True
        self._state = None

    def _local_switched_off(self, theta=None):
        """Whether the local part is switched off (at ``theta``, default the
        client's vector): its variance below :data:`LOCAL_OFF_RATIO` times
        its restart value (False for a client without one: multi-output
        targets, no local component)."""
        restart = (getattr(self, "prior_local", None) or {}).get("restart")
        if restart is None or "variance_l" not in self.pack.slices:
            return False
        theta = self.theta if theta is None else theta
        var = float(np.exp(theta[self.pack.slices["variance_l"].start]))
        return var < LOCAL_OFF_RATIO * restart[1]

    def _start_from_population(self, fun, lbfgs, bounds):
        """Once, after the population prior arrives: one more run from the population's kernel.

        A small client's local phase continues from its own vector, which may
        sit in the basin of a fit that interpolates its few points (noise
        variance near its floor). The first local phase after
        :meth:`set_local_prior` therefore also runs L-BFGS-B from the
        population's local lengthscales and variance with the noise variance
        at its hyperprior's centre (other entries unchanged), and keeps that
        end if the client's objective (with the new prior) is higher there.
        """
        prior = getattr(self, "prior_local", None) or {}
        if "population" not in prior or prior.get("population_tried"):
            return
        self.prior_local = {**prior, "population_tried": True}
        self._try_local_start(fun, lbfgs, bounds, *prior["population"])

    def _restart_local(self, fun, lbfgs, bounds):
        """Restart a local part switched off by the first local phase; keep it if better.

        A local variance driven to its lower bound has no gradient left to
        return, and a client's first local phase starts from its pilot,
        which on a few points may interpolate them and so switch the local
        part off (docs/maths.md, section 11, "A local part switched off
        early"). Called by :meth:`local_phase` at the end of the client's
        first local phase (L-BFGS-B only; the count of local phases is part
        of :class:`ClientState`). When the local part is switched off
        (:meth:`_local_switched_off`), one more L-BFGS-B run starts from the
        start of a client without a pilot (the population's local
        lengthscales and variance, or the given ``local_lengthscale`` and
        ``local_variance``) with the noise variance at its hyperprior's
        centre, other entries unchanged. Its end replaces the current vector
        only if the local part is switched on there and the client's
        objective (the surrogate bound plus log hyperpriors, ``q(v_g)``
        fixed) is higher, so the bound never goes down. ``fun(theta)`` is
        the phase's objective (to minimise) and gradient, ``lbfgs(start)``
        one of its L-BFGS-B runs, ``bounds`` their bounds.

        A client whose own data rejected the population's lengthscales
        (:func:`lengthscale_mismatch`; it learns its scale on the shared
        parts and started its local kernel from its own pilot) also runs once
        from that start (at the scale the phase reached;
        ``prior_local["own_start"]``), and the better accepted end is kept.
        Its first phase starts at scale 1, where the shared parts' trace
        term at its inputs can switch the local part off before the scale
        has fallen; the population's start does not help a client whose
        inputs are on another scale.
        """
        if not self._local_switched_off():
            return
        ell, var = self.prior_local["restart"]
        on = lambda t: not self._local_switched_off(t)  # noqa: E731
        self._try_local_start(fun, lbfgs, bounds, np.log(ell), np.log(var), accept=on)
        own = self.prior_local.get("own_start")
        if own is not None:
            self._try_local_start(fun, lbfgs, bounds, np.log(own[0]), np.log(own[1]), accept=on)

    def _try_local_start(self, fun, lbfgs, bounds, log_lengthscale, log_variance,
                         accept=None):
        """One more L-BFGS-B run of the local phase from another local kernel; keep it if better.

        The start is the client's vector with its local log lengthscales and
        log variance replaced and its noise variance at its hyperprior's
        centre, ``prior_noise`` (for a client without a noise hyperprior,
        its own pilot's noise; clipped to ``bounds``). Its end replaces the current vector
        only if the objective is higher there (and ``accept(end)`` holds,
        when given); a run that fails numerically keeps the current vector.
        """
        sl = self.pack.slices
        start = self.theta.copy()
        start[sl["lengthscale_l"]] = log_lengthscale
        start[sl["variance_l"]] = log_variance
        start[sl["noise_variance"]] = np.log(self.prior_noise)
        start = clip_to_bounds(start, bounds)
        try:
            f = fun(self.theta)[0]
            res = lbfgs(start)
        except (np.linalg.LinAlgError, FloatingPointError):
            return  # keep the current vector
        if np.isfinite(res.fun) and res.fun < f and (accept is None or accept(res.x)):
            self.theta = res.x

    def bounds(self, config=None):
        """L-BFGS-B bounds of the local vector, with this client's own noise floor.

        Parameters
        ----------
        config : ModelConfig, optional
            Unless the client learns its inducing inputs
            (:meth:`learns_local_inducing`), the entries of ``Z_l`` are held
            at their current values.

        Returns
        -------
        list of (float or None, float or None)
        """
        b = log_bounds(self.pack)
        for name, _, kind in self.pack.spec:
            if kind == "log" and name in LOG_BOUNDS:
                # noise: one entry, or one per output
                _set_log_bounds(b, self.pack.slices[name], *self.value_range(name))
        if config is not None and not self.learns_local_inducing(config):
            b = fix_entries(b, self.theta, self.pack.slices.get("Z_l"))
        return b

    def learns_local_inducing(self, config):
        """Whether this client's local inducing inputs move (``config.learn_inducing``).

        ``"auto"``: the client's own decision (at set-up, then re-checked)
        (:meth:`_decide_local_inducing`; True for a client restored from a
        state saved before the option existed).
        """
        if "Z_l" not in self.pack.slices:
            return False
        return resolved_learn_inducing(config, getattr(self, "learn_local_inducing", None))

    def _adam_state(self, config):
        if getattr(self, "_adam", None) is None:
            self._adam = Adam(config.learning_rate)
        else:  # a warm start or resume: the moments continue at this run's step size
            self._adam.set_learning_rate(config.learning_rate)
        return self._adam

    def finish(self, post, theta_g, gpack, config):
        """Posterior moments at the final vectors (:meth:`close` then forgets the data).

        Returns
        -------
        LocalHyperparameters
        """
        from ._structured import client_posterior

        if self._state is None:  # a process-based backend dropped it: recompute (identical)
            self.statistics(theta_g, gpack, config, post.round)
        mu_u, Sigma_u, H = client_posterior(self._state, post.mean, post.covariance)
        # the decision this training used (a given True/False overrides the
        # one recorded at set-up, e.g. on a warm start)
        self.learn_local_inducing = self.learns_local_inducing(config)
        a = self._state.layout.level_row()
        if a is not None and self._state.level_mean:
            # the passes centred the targets at m, i.e. worked with a - mu0
            # (mu0 = -m / tau): back to the level's variable a ~ N(0, 1)
            mu_u = mu_u.copy()
            mu_u[a] -= self._state.level_mean
        self.posterior = {"mu_u": mu_u, "Sigma_u": Sigma_u, "H": H}
        B = self.pack.unpack(self.theta)
        level = 0.0
        if a is not None:  # the level's posterior mean: sqrt(level_variance) E[a]
            level = float(np.sqrt(gpack.unpack(theta_g)["level_variance"]) * mu_u[a])
            self.posterior["level"] = level
        # with client scales on (any client may learn one) every client sends
        # its own, 1 when it learned none, for the never-seen clients' median
        scale = (shared_scale(B, gpack.unpack(theta_g))
                 if getattr(config, "client_scale", False) is not False else None)
        return LocalHyperparameters(B.get("lengthscale_l"), B.get("variance_l"),
                                    B["noise_variance"], level, scale=scale,
                                    **self._trace_message(theta_g, gpack, config))

    def _trace_message(self, theta_g, gpack, config):
        """The trace-term fields of the final message (:meth:`trace_terms`)."""
        total, local, jitter = self.trace_terms(theta_g, gpack, config)
        return {"trace_nats": total, "trace_nats_local": local, "jitter_nats": jitter,
                "n_observations": self._n_observations()}

    def trace_terms(self, theta_g, gpack, config):
        """Trace term of the collapsed bound at the given vectors (nats).

        ``sum_x [k(x, x) - q(x, x)] / (2 sigma^2)`` over this client's inputs
        for the global inducing inputs (global and deviation amplitudes,
        times the client's scale squared when it learns one) and its local
        ones (Titsias, AISTATS 2009, eq. 9): the prior variance the inducing
        points leave unexplained, in units of the noise. It bounds what
        better inducing inputs could add to the bound at these
        hyperparameters (Burt, Rasmussen and van der Wilk, JMLR 21, 2020).

        Parameters
        ----------
        theta_g : ndarray
            The global vector.
        gpack : Packer
            Its layout.
        config : ModelConfig

        Returns
        -------
        total, local, jitter : float
            The whole term, its part from the local inducing inputs, and the
            jitter's scale (``jitter`` times the prior variance at each
            input, over twice the noise variance: the most the jitter on
            ``K_zz`` leaves with the inducing inputs on the training inputs
            themselves; more if the factorisation had to raise the jitter).
            It is negligible unless the noise variance is near its floor
            (nearly noise-free targets), where it can exceed the whole term.
            NaN if a Cholesky factorisation fails.
        """
        G, L = gpack.unpack(theta_g), self.local_values()
        comps = tuple(config.components)
        jitter = float(config.jitter)
        total = local = floor = 0.0
        try:
            if "Z_g" in G and ("global" in comps or "deviation" in comps):
                res, _ = self._global_residuals(G, jitter)
                a2 = float(shared_scale(L, G)) ** 2  # the client's scale, squared (1: none)
                total += a2 * self._trace_nats("g", res, L, G, comps)
                var = float(G.get("variance_g", 1.0))
                floor += a2 * self._trace_nats("g", np.full_like(res, jitter * var), L, G, comps)
            if "Z_l" in L:
                res, _ = self._local_residuals(L, jitter)
                var = float(L.get("variance_l", 1.0))
                local = self._trace_nats("l", res, L)
                total += local
                floor += self._trace_nats("l", np.full_like(res, jitter * var), L)
        except np.linalg.LinAlgError:
            return float("nan"), float("nan"), float("nan")
        return float(total), float(local), float(floor)

    def local_values(self):
        """Constrained local values (scaled inputs, standardised units)."""
        return self.pack.unpack(self.theta)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_state"] = None  # cheap to recompute; never shipped between processes
        return state


# --------------------------------------------------------------------------
# transport: every server -> client interaction of the structured family
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientState:
    """A structured client's own checkpoint (:meth:`StructuredClient.get_state`).

    In simulation it is part of a :class:`TrainingState`; in a real
    deployment each client checkpoints its own part and the server's state
    holds none of it.

    Attributes
    ----------
    theta : ndarray of shape (P_i,)
        Local log-parametrised vector.
    pack : Packer
        Its layout.
    noise_floor, prior_noise : float
        The client's noise floor and the centre of its noise hyperprior
        (for a client without one, its own pilot's noise variance; the
        units of its packed noise variance; ``prior_noise`` is an array of
        shape (Q,) for a multi-output client with ``noise="diagonal"``).
    adam : Adam or None
        State of the local Adam optimiser (``optimizer="adam"``).
    noise_mode : str or None
        Multi-output clients: the ``noise`` option the vector was trained
        with (a resumed run must use the same); None otherwise.
    prior_local : dict or None
        Scalar targets: ``"sd_rate"``, the rate of the prior of the client's
        local standard deviation, and ``"log_amplitude_centre"`` for a client
        that learns its scale (:meth:`StructuredClient.log_prior`);
        ``"restart"``, the local lengthscales and variance a switched-off
        local part restarts from (:meth:`StructuredClient._restart_local`),
        and for a client whose data rejected the population's lengthscales
        (:func:`lengthscale_mismatch`), ``"own_start"``, its own starting
        local kernel (a second restart).
    learn_local_inducing : bool or None
        The client's decision for its local inducing inputs under
        ``learn_inducing="auto"`` (None: not recorded; then learned).
    noise_fitted : bool or None
        Whether the client has run a local phase (its noise variance is its
        own fit, not its pilot's); None: not recorded, then True.
    inducing_checked_at : bytes or None
        The local vector (its bytes) at the client's last ``"auto"`` check
        of its local inducing inputs (None: not recorded).
    local_phases : int or None
        Number of local phases the client has run with ``local_steps > 0``
        (a phase that could not evaluate its start does not count; a
        switched-off local part is restarted at the end of the first,
        :meth:`StructuredClient._restart_local`; None: not recorded, then 0).
    noise_hyperprior : bool or None
        Whether the client's noise variance has its hyperprior (False for a
        client whose own pilot is reliable, :func:`own_noise_centre`, or one
        of at least :data:`PILOT_POOL_POINTS` rows centred on a population
        noise no pilot identified, :func:`population_noise`; None: not
        recorded, then True).
    noise_prior_sd : float or None
        The scale of the noise hyperprior when it is the pooled small
        clients' spread (:func:`noise_spread`); None: ``noise_prior_scale``.
    pilot_noise : float or None
        The noise variance of the client's own pilot where it is reliable
        (what ``ClientFittedAsNoiseWarning`` compares the fitted noise
        with); None: none, or not recorded.
    """

    theta: np.ndarray
    pack: object
    noise_floor: float
    prior_noise: float
    adam: object = None
    noise_mode: str = None
    prior_local: dict = None
    learn_local_inducing: object = None
    noise_fitted: object = None
    inducing_checked_at: object = None
    local_phases: object = None
    noise_hyperprior: object = None
    noise_prior_sd: object = None
    pilot_noise: object = None


@dataclass(frozen=True)
class ClientFailure:
    """What a transport returns for a client call that did not deliver a message.

    Attributes
    ----------
    client_id : hashable
    method : str
        The client method called (``"statistics"``, ``"local_phase"``, ...).
    round : int
        Round of the call (0: set-up).
    error : str
        ``repr`` of the exception (or of the reason, e.g. a non-finite message).
    exception : Exception or None
        The exception raised by the client's own code, when the transport
        has it (in-process); not compared, not shown.
    numerical : bool
        Whether the client's own code raised a numerical error
        (:class:`numpy.linalg.LinAlgError`, :class:`FloatingPointError`) or
        sent non-finite values: in the server's global phase such a failure
        at a trial point rejects the point (as an infinite objective) instead
        of counting against the client.
    """

    client_id: object
    method: str
    round: int
    error: str
    numerical: bool = False
    exception: object = dataclasses.field(default=None, compare=False, repr=False)


def _transport_call(client, method, args):
    """Run one client method; never raises (a failure comes back as a value)."""
    try:
        return client, True, getattr(client, method)(*args)
    except Exception as exc:  # noqa: BLE001 -- any client error is a client failure
        numerical = isinstance(exc, (np.linalg.LinAlgError, FloatingPointError))
        return None, False, (repr(exc), numerical, exc)


class JoblibTransport:
    """In-process transport: the client objects, called through :class:`joblib.Parallel`.

    The structured training loop (:func:`run_structured_training`) never
    touches a client object: every server -> client interaction is
    ``transport.call(method, args, ids)``, and a client method returns only
    a message dataclass (or None). Another transport (e.g. one sending the
    calls to remote clients) implements the same three members:
    ``client_ids``, ``call`` and the context manager (``__enter__`` /
    ``__exit__``).

    Parameters
    ----------
    clients : list of StructuredClient
        Client objects, in a fixed order (the order of every sum on the
        server).
    n_jobs : int or None, default=None
        Number of parallel jobs; threads by default, any joblib backend
        through :func:`joblib.parallel_config` (e.g. ``"loky"`` processes or
        ``"dask"``). With a process-based backend the client objects updated
        in the workers are stored back after every call.
    fault_hook : callable or None, default=None
        ``fault_hook(client_id, method, round) -> None``, called in the
        server's process before each client call (every protocol method;
        ``"close"`` and the checkpoint calls excepted), in client order. If
        it raises, that call is not made and the client's result is a
        :class:`ClientFailure` with the exception's ``repr``: a way to
        inject failures, time-outs or dropouts (chaos testing).

    Notes
    -----
    **Threads only where they pay.** With joblib's default thread backend
    and more than one job, many small clients gain nothing from threads:
    their work is a stream of short NumPy calls that hold the GIL, and two
    threads then run slower than one. For each of the repeated protocol
    methods (:data:`_TIMED_METHODS`) the transport therefore times its first
    calls both ways -- after one warm-up call, alternately in a plain loop
    and through the thread pool, :data:`_TIMING_CALLS` calls each,
    wall-clock seconds per client -- and then keeps the faster way (the
    smaller median) for that method. Once ``statistics`` (called every ELBO
    evaluation) is decided, methods still undecided follow it, so the local
    phase (once per round) is not timed over many rounds. Calls with a
    single client are neither timed nor pooled. Clients are independent
    within a call, so the results are identical either way; only the wall
    time changes. Process-based backends (``"loky"``, ``"dask"``) set with
    :func:`joblib.parallel_config` are always used as configured.

    Attributes
    ----------
    clients : dict
        Client id to client object (updated after every call).
    dispatch_ : dict
        Method name to ``"loop"`` or ``"threads"``: the way chosen for it
        (with ``n_jobs > 1`` and the thread backend; empty otherwise).
    """

    def __init__(self, clients, n_jobs=None, fault_hook=None):
        self.clients = {c.client_id: c for c in clients}
        if len(self.clients) != len(clients):
            raise ValueError("client ids must be distinct")
        self.n_jobs = n_jobs
        self.fault_hook = fault_hook
        self._parallel = None
        self._timings = {}
        self.dispatch_ = {}

    @property
    def client_ids(self):
        """Ids of the clients, in their fixed order."""
        return list(self.clients)

    def __enter__(self):
        self._parallel = Parallel(n_jobs=self.n_jobs, prefer="threads")
        self._parallel.__enter__()
        return self

    def __exit__(self, *exc):
        parallel, self._parallel = self._parallel, None
        if parallel is not None:
            parallel.__exit__(*exc)
        return False

    def call(self, method, args=(), ids=None, *, round_=0):
        """Call ``method(*args)`` on clients; failures are returned, not raised.

        Parameters
        ----------
        method : str
            Name of a client method.
        args : tuple or dict
            Arguments common to all called clients, or ``{client_id: tuple}``.
        ids : list or None, default=None
            Clients to call (None: all).
        round_ : int, default=0
            Round of the call (for the fault hook and :class:`ClientFailure`).

        Returns
        -------
        dict
            ``{client_id: result}`` in the order of ``ids``; ``result`` is the
            method's return value or a :class:`ClientFailure`.
        """
        ids = self.client_ids if ids is None else list(ids)
        out = {}
        todo = []
        for cid in ids:
            if self.fault_hook is not None and method not in _UNHOOKED:
                try:
                    self.fault_hook(cid, method, round_)
                except Exception as exc:  # noqa: BLE001 -- an injected failure
                    out[cid] = ClientFailure(cid, method, round_, repr(exc))
                    continue
            todo.append((cid, args[cid] if isinstance(args, dict) else tuple(args)))
        if todo:
            parallel = self._parallel or Parallel(n_jobs=self.n_jobs, prefer="threads")
            way = self._way(parallel, method, len(todo))
            t0 = time.perf_counter()
            if way in ("loop", "warm-up"):
                res = [_transport_call(self.clients[cid], method, a) for cid, a in todo]
            else:
                with warning_filters_kept():
                    res = parallel(delayed(_transport_call)(self.clients[cid], method, a)
                                   for cid, a in todo)
            if way in ("warm-up", "loop", "threads") and method not in self.dispatch_:
                self._timings[method][way].append((time.perf_counter() - t0) / len(todo))
            for (cid, _), (client, ok, value) in zip(todo, res):
                if ok:
                    self.clients[cid] = client  # process backends: the updated copy
                    out[cid] = value
                else:
                    out[cid] = ClientFailure(cid, method, round_, *value)
        return {cid: out[cid] for cid in ids}

    def _way(self, parallel, method, n_calls):
        """``"loop"`` or ``"threads"`` for this call (see the class notes)."""
        from joblib.parallel import ThreadingBackend

        if (not isinstance(parallel._backend, ThreadingBackend) or method not in _TIMED_METHODS
                or n_calls < 2 or parallel.n_jobs in (None, 1)):
            return "configured"  # the pool as configured (one job: calls in turn)
        if method in self.dispatch_:
            return self.dispatch_[method]
        lead = self.dispatch_.get(_TIMED_METHODS[0])
        if lead is not None:  # the clients' work is alike across methods: follow it
            self.dispatch_[method] = lead
            return lead
        t = self._timings.setdefault(method, {"warm-up": [], "loop": [], "threads": []})
        if not t["warm-up"]:
            return "warm-up"  # first call: caches, compilation; not compared
        if min(len(t["loop"]), len(t["threads"])) >= _TIMING_CALLS:
            faster = np.median(t["threads"]) < np.median(t["loop"])
            self.dispatch_[method] = "threads" if faster else "loop"
            return self.dispatch_[method]
        return "loop" if len(t["loop"]) <= len(t["threads"]) else "threads"

    def client_states(self, ids=None):
        """Checkpoints of the clients' own parts (simulation only): ``{id: ClientState}``."""
        ids = self.client_ids if ids is None else ids
        return {cid: self.clients[cid].get_state() for cid in ids}


#: Client methods the fault hook is not called for.
_UNHOOKED = ("close",)
#: Repeated protocol methods whose dispatch (loop or threads) the
#: :class:`JoblibTransport` chooses by timing ...
_TIMED_METHODS = ("statistics", "global_gradient", "local_phase")
#: ... after this many calls each way.
_TIMING_CALLS = 3


def _offset_moments(offsets, seen):
    """Mean, new-client covariance and shared-mean covariance of the levels.

    Parameters
    ----------
    offsets : ndarray of shape (T, Q)
        The clients' constant means.
    seen : ndarray of shape (T, Q), bool
        Which were learned (the client observed that output).

    Returns
    -------
    mean : ndarray of shape (Q,)
        Over the clients that observed each output (0 if none did).
    new : ndarray of shape (Q, Q)
        ``S + G o S``: the covariance of a new client's level about
        ``mean``; ``S`` is the pairwise-complete sample covariance
        (``ddof=1``, over the clients that observed both outputs; 0 where
        fewer than 2 did) projected onto the positive semi-definite cone,
        ``G = D^-1 N D^-1`` with ``N_qp`` the number of clients that observed
        both outputs and ``D = diag(N)``, so that ``G o S`` is the covariance
        of ``mean`` (``S_qq / T_q`` on the diagonal). Both terms are PSD
        (``G`` is a Gram matrix; Schur product theorem).
    shared : ndarray of shape (Q, Q)
        ``G o S``: the covariance of two different new clients' levels.
    """
    T, Q = offsets.shape
    seen = np.asarray(seen, dtype=bool)
    mean = np.array([offsets[seen[:, q], q].mean() if seen[:, q].any() else 0.0
                     for q in range(Q)])
    S = np.zeros((Q, Q))
    for q in range(Q):
        for p in range(q, Q):
            both = seen[:, q] & seen[:, p]
            k = int(both.sum())
            if k >= 2:
                a = offsets[both, q] - offsets[both, q].mean()
                b = offsets[both, p] - offsets[both, p].mean()
                S[q, p] = S[p, q] = float(a @ b) / (k - 1)
    if Q > 1:  # a pairwise-complete estimate need not be PSD: nearest PSD matrix
        S = _nearest_psd(S)
    N = seen.T.astype(float) @ seen.astype(float)
    d = np.where(np.diag(N) > 0, 1.0 / np.maximum(np.diag(N), 1.0), 0.0)
    G = d[:, None] * N * d[None, :]
    shared = G * S
    return mean, S + shared, shared


def _nearest_psd(S):
    """The nearest (Frobenius) positive semi-definite matrix to symmetric ``S``."""
    w, V = np.linalg.eigh(0.5 * (S + S.T))
    return (V * np.maximum(w, 0.0)) @ V.T


def _masked_mean(values, mask):
    """Mean over axis 0 of ``values`` where ``mask`` (same shape) holds; all rows where none does."""
    values = np.asarray(values, dtype=float)
    mask = np.broadcast_to(mask, values.shape)
    count = mask.sum(axis=0)
    masked = np.where(mask, values, 0.0).sum(axis=0) / np.maximum(count, 1)
    return np.where(count > 0, masked, values.mean(axis=0))


def _median_lengthscale(log_lengthscales, weights):
    """Per-input weighted median of lengthscales given as logs (interpolated).

    Parameters
    ----------
    log_lengthscales : array-like of shape (k, d)
        One row of log lengthscales per source.
    weights : array-like of shape (k,)
        Its weight (number of observations).

    Returns
    -------
    ndarray of shape (d,)
        The lengthscales (not their logs).
    """
    log_ell = np.asarray(log_lengthscales, dtype=float)
    return np.exp(np.array([_weighted_median(log_ell[:, j], weights, interpolate=True)
                            for j in range(log_ell.shape[1])]))


def _weighted_median(values, weights, interpolate=False):
    """Weighted median: the smallest value whose cumulative weight reaches half.

    With ``interpolate``, a cumulative weight of half at a value (to a
    relative ``1e-12`` of the total, for round-off of float weights) gives
    the mean of it and the next value of positive weight, so equal weights
    give :func:`numpy.median` (as does repeating each value by an integer
    weight, zero weights included).
    """
    order = np.argsort(values, kind="stable")
    v = np.asarray(values, float)[order]
    w = np.asarray(weights, float)[order]
    c = np.cumsum(w)
    half = 0.5 * c[-1]
    tol = 1e-12 * abs(c[-1])
    k = min(int(np.searchsorted(c, half - tol)), len(v) - 1)
    if interpolate and abs(c[k] - half) <= tol:
        nxt = np.flatnonzero(w[k + 1:] > 0)
        if nxt.size:
            return float(0.5 * (v[k] + v[k + 1 + nxt[0]]))
    return float(v[k])


def _population_from(hypers, components, noise="isotropic"):
    """Population local block from the clients' :class:`LocalHyperparameters`.

    The mean of the local variances, the variance-weighted geometric mean of
    the local lengthscales and the geometric mean of the noise variances;
    the mean of the clients' constant means ``c_i`` and, as
    ``offset_variance``, the predictive variance of a new client's constant
    mean: ``c_new ~ N(mean c_i, (1 + 1/T) var c_i)`` (sample variance,
    ``ddof=1``, over the ``T`` clients; 0 for one client), the spread of the
    clients' levels, which a never-seen client's prediction must include
    (a Q x Q covariance for multi-output targets; a normal approximation of
    the Student-t predictive, which also accounts for the estimated
    variance); and, as ``offset_mean_variance``, ``var c_i / T``, the
    covariance of two different new clients' levels (they share the
    estimated mean).
    """
    offsets = np.array([np.atleast_1d(np.asarray(h.offset, dtype=float)) for h in hypers])
    offsets = offsets.reshape(len(hypers), -1) if hypers else np.zeros((0, 1))
    seen = np.array([np.ones(offsets.shape[1]) if getattr(h, "offset_observed", None) is None
                     else np.asarray(h.offset_observed, dtype=float) for h in hypers]) > 0.5
    seen = seen.reshape(offsets.shape)
    off_mean, off_cov, mean_cov = _offset_moments(offsets, seen)
    if hypers and hypers[0].coregionalisation is not None:  # multi-output targets
        # an output a client never observed never trained its own noise
        # variance (noise="diagonal"; the isotropic options train one value on
        # the outputs it observed) or its loadings' rows: averages over the
        # clients that observed it (pairs of outputs: that observed both), a
        # pairwise average projected back onto the PSD cone
        log_s2 = np.array([np.log(h.noise_variance) for h in hypers])
        s2_pop = np.exp(_masked_mean(log_s2, seen) if noise == "diagonal"
                        else np.mean(log_s2, axis=0))
        pair = seen[:, :, None] & seen[:, None, :]
        pop = {"noise_variance": s2_pop,
               "offset": off_mean,
               "offset_variance": off_cov, "offset_mean_variance": mean_cov,
               "coregionalisation": {
                   k: np.stack([_nearest_psd(_masked_mean(
                       np.array([h.coregionalisation[k][r] for h in hypers]), pair))
                       for r in range(len(hypers[0].coregionalisation[k]))])
                   for k in hypers[0].coregionalisation}}
        if "local" in components:
            # the local variance lives in the loadings (their outer products
            # are averaged above); the lengthscales' plain geometric mean
            pop["lengthscale_l"] = np.exp(np.mean([np.log(h.lengthscale) for h in hypers],
                                                  axis=0))
        return pop
    pop = {"noise_variance": float(np.exp(np.mean([np.log(h.noise_variance) for h in hypers]))),
           "offset": float(off_mean[0]),
           "offset_variance": float(off_cov[0, 0]),
           "offset_mean_variance": float(mean_cov[0, 0])}
    scales = [h.scale for h in hypers if getattr(h, "scale", None) is not None]
    if scales:
        # a never-seen client's scale on the shared parts: the median of the
        # clients' log scales (robust to a client in other units; with an even
        # number the geometric mean of the middle two; the spread of the
        # scales is not propagated)
        pop["client_scale"] = float(np.exp(np.median(np.log(scales))))
    if "local" in components:
        # a never-seen client's local part is a draw from a randomly chosen
        # client's prior: its variance at a point is the mean of the clients'
        # variances (a geometric mean is pulled to ~0 by the clients that
        # switched their local part off, and made a never-seen client's band
        # far too narrow); its lengthscale the variance-weighted geometric
        # mean (a switched-off client's lengthscale is not identified)
        # (mean-field: h.scale is None). A client that learned its own scale
        # s_i has its local variance in its own units: averaged as v_i / s_i^2
        # and put back at the never-seen client's (median) scale, so that a
        # client in other units does not set the others' band
        s_pop = pop.get("client_scale", 1.0)
        var = np.array([float(h.variance) / (h.scale if getattr(h, "scale", None) else 1.0) ** 2
                        for h in hypers])
        log_ell = np.array([np.log(h.lengthscale) for h in hypers])
        w = var / var.sum() if var.sum() > 0 else np.full(len(hypers), 1.0 / len(hypers))
        pop["lengthscale_l"] = np.exp(w @ log_ell)
        pop["variance_l"] = float(var.mean()) * s_pop**2
    return pop


@dataclass
class _PopulationPilot:
    """Set-up download: the population's pilot hyperparameters.

    The server sends it to every client with the initial global vector
    (:meth:`StructuredClient.initialise`); ``communication_`` counts every
    field (:func:`message_nbytes`; the flag ``noise_identified`` counts
    nothing).

    Attributes
    ----------
    lengthscale : ndarray of shape (d,)
        Weighted median of the clients' pilot lengthscales (scaled input
        units).
    variance, noise_variance : float
        Signal and noise variances (standardised target units).
    ranges : ndarray of shape (d,) or None
        Not used (None, not sent); states saved by earlier versions carry
        the input ranges in scaled units (ones) here, and nodes of earlier
        versions read it as an optional field.
    noise_variance_target : float or None
        Multi-output targets: the noise in the unit of
        ``noise="isotropic_target"`` (:class:`PilotSummary`).
    noise_identified : bool
        False when the pilots did not identify the noise
        (:func:`population_noise`).
    noise_spread, noise_pooled : float or None
        Scale and, when set, centre of the pooled small clients' noise
        hyperprior (:func:`noise_spread`; multi-output targets: the larger
        clients' spread around the per-output centres,
        :func:`ilmm_noise_spread`, and no pooled centre); None when not
        measured.
    noise_variance_outputs : ndarray of shape (Q,) or None
        Multi-output targets: per output, the weighted median of the
        clients' pilot noise variances of that output
        (:attr:`PilotSummary.noise_variance_outputs`), the centre of each
        output's noise hyperprior with ``noise="diagonal"``; None otherwise.
    input_width, input_lengthscale : ndarray of shape (d,) or None
        1-D targets: the median over the clients (not weighted by their
        sizes) of their input widths, from their boxes, rounded to the
        nearest power of 2 (so that no client's exact range is kept), and
        of their pilots' lengthscales (scaled units), for
        :func:`input_scale_mismatch`; None when not set.
    """

    lengthscale: np.ndarray
    variance: float
    noise_variance: float
    ranges: np.ndarray = None
    noise_variance_target: float = None
    noise_identified: bool = True
    noise_spread: float = None
    noise_pooled: float = None
    input_width: np.ndarray = None
    input_lengthscale: np.ndarray = None
    noise_variance_outputs: np.ndarray = None



class TrainingFailedError(RuntimeError):
    """The server could not form a model (every client failed or was excluded)."""


class RoundSkippedWarning(UserWarning):
    """A round was skipped: fewer than ``min_clients`` clients answered."""


class ClientExcludedWarning(UserWarning):
    """A client failed in the set-up or the final exchange and was left out of the model."""


class _TooFewClients(Exception):
    pass


class _MembershipChanged(Exception):
    pass


class _TrialRejected(Exception):
    """A trial point failed numerically at a client; carries what the call got.

    ``replies`` (the clients' good messages) and ``n_calls`` (messages sent):
    the exchange happened and counts in ``communication_``.
    """

    def __init__(self, replies=None, n_calls=0):
        super().__init__()
        self.replies = {} if replies is None else replies
        self.n_calls = n_calls


#: Version of the structured training objective (the ELBO plus the log
#: hyperpriors) that a :class:`TrainingState` records: 2 added the server's
#: level-variance prior (:func:`level_log_prior`). Bump it whenever the
#: objective's value at the same vectors changes.
OBJECTIVE_VERSION = 2


@dataclass
class TrainingState:
    """Server state of structured training after a round: enough to resume it.

    Resuming (``run_structured_training(..., state=s)``, or the regressor's
    ``resume_from``) on the same clients with the same data continues
    exactly as the uninterrupted run would have: same global and local
    vectors, same ELBO history. Saved with :meth:`save` (joblib).

    Attributes
    ----------
    round : int
        Rounds completed.
    init : InitBroadcast
        Target standardisation and input box of the set-up exchange.
    server : dict
        The server's set-up results (``y_offset``, ``y_scale``, ``x_offset``,
        ``x_scale``, ``n_total``, ``n_inducing_``, ``n_inducing_local_``,
        ``population_pilot``).
    theta_global : ndarray of shape (P,)
    global_pack : Packer
    post : PosteriorBroadcast or None
        ``q(v_g)`` at the last evaluation.
    elbo, log_prior : float
        ELBO and summed log hyperpriors at the last evaluation.
    messages : dict
        Client id to the last :class:`StructuredStatistics` received from it
        (the stale sites of absent clients).
    fresh : list
        Ids whose stored message was computed at the current global vector
        and their current local vector.
    history, objectives : list of float
    communication : list of dict
    n_evaluations : int
    rng_state : tuple or None
        State of the participation sampler (:class:`numpy.random.RandomState`).
    adam : Adam or None
        The server's Adam state (``optimizer="adam"``).
    failed_clients : list of tuple
    excluded_clients : list
    client_states : dict
        Client id to :class:`ClientState`. In simulation the clients' own
        vectors are saved with the server's; in a real deployment each
        client checkpoints its own part and this is empty.
    config : ModelConfig or None
        The model settings of the saved run (None in a state written by an
        older version); resuming with other settings is refused
        (:func:`check_same_model`).
    objective_version : int
        Version of the objective whose value ``elbo + log_prior`` holds
        (:data:`OBJECTIVE_VERSION` when written by ``snapshot``; 1 in a
        state written before the field existed). A state of another version
        is resumed with fresh messages from every client, so that the first
        resumed round's gain compares values of one objective.
    """

    round: int
    init: object
    server: dict
    theta_global: np.ndarray
    global_pack: object
    post: object = None
    elbo: float = np.nan
    log_prior: float = 0.0
    messages: dict = dataclasses.field(default_factory=dict)
    fresh: list = dataclasses.field(default_factory=list)
    history: list = dataclasses.field(default_factory=list)
    objectives: list = dataclasses.field(default_factory=list)
    communication: list = dataclasses.field(default_factory=list)
    n_evaluations: int = 0
    rng_state: object = None
    adam: object = None
    failed_clients: list = dataclasses.field(default_factory=list)
    excluded_clients: list = dataclasses.field(default_factory=list)
    client_states: dict = dataclasses.field(default_factory=dict)
    config: object = None
    # the class default is what an unpickled older state reads: keep it 1
    objective_version: int = 1

    def save(self, path):
        """Write the state to ``path`` (:func:`joblib.dump`)."""
        import joblib

        joblib.dump(self, path)

    @classmethod
    def load(cls, path):
        """Read a state written by :meth:`save`.

        Raises
        ------
        TypeError
            If the file cannot be read as a saved state or holds something else.
        FileNotFoundError
            If there is no such file.
        """
        import joblib

        try:
            obj = joblib.load(path)
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except Exception as exc:  # not a joblib/pickle file, truncated, ...
            raise TypeError(f"{str(path)!r} is not a saved TrainingState (it cannot be read: "
                            f"{type(exc).__name__}: {exc})") from exc
        if not isinstance(obj, cls):
            raise TypeError(f"{path!r} holds a {type(obj).__name__}, not a TrainingState")
        return obj


_SERVER_FIELDS = ("y_offset", "y_scale", "x_offset", "x_scale", "n_total", "n_inducing_",
                  "n_inducing_local_", "population_pilot", "level_upper", "learn_inducing_",
                  "design_residual_", "design_residual_history_", "inducing_switch_round_",
                  "inducing_checked_at_", "design_n_samples_", "failed_when_last_asked_",
                  "held_last_round_", "lengthscale_start_", "local_prior_centre_",
                  "local_prior_sent_", "local_fitted_", "inducing_growth_",
                  "output_variance_floor", "under_observed_outputs", "output_counts",
                  "output_client_counts", "input_scale_reports_", "input_scale_excluded_")
#: Server fields that belong to one run (kept in its checkpoints, reset by a warm start).
_RUN_FIELDS = ("inducing_checked_at_", "design_n_samples_", "failed_when_last_asked_",
               "held_last_round_", "local_prior_centre_", "local_prior_sent_", "local_fitted_",
               "input_scale_reports_")


def _is_finite_message(msg):
    """Whether every number in a message dataclass is finite (None: True)."""
    if msg is None or not dataclasses.is_dataclass(msg):
        return True
    for a in message_arrays(msg).values():
        if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            return False
    return True


def check_participation(client_fraction, min_clients, max_retries):
    """Validate the participation and failure policy.

    Returns
    -------
    client_fraction : float
    min_clients, max_retries : int

    Raises
    ------
    ValueError
        ``client_fraction`` outside ``(0, 1]``, ``min_clients < 1`` or
        ``max_retries < 0``.
    """
    import numbers

    if (not isinstance(client_fraction, numbers.Real) or isinstance(client_fraction, bool)
            or not (0.0 < client_fraction <= 1.0)):
        raise ValueError(f"client_fraction must be a number in (0, 1], got {client_fraction!r}")
    for name, v, lo in (("min_clients", min_clients, 1), ("max_retries", max_retries, 0)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return float(client_fraction), int(min_clients), int(max_retries)


#: One start's run in :meth:`_StructuredRun.select_start`: its final objective,
#: whether it converged, its snapshot, its traffic and evaluations after set-up,
#: its client failures and the clients that ran a local phase.
_StartRun = collections.namedtuple(
    "_StartRun", "objective converged state traffic evaluations failures local_done")


class _StructuredRun:
    """The server side of structured training (see :func:`run_structured_training`)."""

    def __init__(self, transport, server, config, n_rounds, verbose, client_fraction,
                 min_clients, max_retries, random_state, callback, setup_warnings=True):
        self.transport = transport
        self.setup_warnings = setup_warnings
        self.server = server
        self.config = config
        self.n_rounds = n_rounds
        self.verbose = verbose
        self.fraction, self.min_clients, self.max_retries = check_participation(
            client_fraction, min_clients, max_retries)
        self.rng = np.random.RandomState(random_state)
        self.callback = callback
        self.failures = []
        self.excluded = []
        self.local_done = set()  # clients with a successful local phase in this run
        self.active = list(transport.client_ids)
        self.messages = {}
        self.fresh = set()
        self.counter = {"up": 0, "down": 0, "msgs": 0, "evals": 0}
        # bytes of received replies dropped as non-finite, since the last booked call
        self.unusable_up = 0

    # -- calls ------------------------------------------------------------------
    def call(self, method, args, ids, r, trial=False, strict=False):
        """Call clients with the retry policy; returns ({id: message}, n_calls, lost ids).

        With ``trial`` (a trial point of the global phase) a numerical failure
        of a client's own code raises :class:`_TrialRejected` instead. With
        ``strict`` (set-up, final exchange) an exception of a client's own
        code that the transport holds is raised after the retries.
        """
        ids = list(ids)
        ok = {}
        todo, attempt, n_calls = ids, 0, 0
        while todo:
            a = {c: args[c] for c in todo} if isinstance(args, dict) else args
            out = self.transport.call(method, a, todo, round_=r)
            n_calls += len(todo)
            failed = []
            for cid in todo:
                res = out[cid]
                if not isinstance(res, ClientFailure) and not _is_finite_message(res):
                    # it came over the wire: its bytes count (see _booked_call)
                    self.unusable_up += message_nbytes(res)
                    res = ClientFailure(cid, method, r, "non-finite values in the message",
                                        True)
                if isinstance(res, ClientFailure):
                    failed.append(res)
                else:
                    ok[cid] = res
            if failed and trial and any(f.numerical for f in failed):
                raise _TrialRejected(ok, n_calls)
            self.failures.extend(failed)
            attempt += 1
            todo = [f.client_id for f in failed] if attempt <= self.max_retries else []
            if strict and not todo:
                for f in failed:
                    if f.exception is not None:
                        raise f.exception
        return {c: ok[c] for c in ids if c in ok}, n_calls, [c for c in ids if c not in ok]

    def exclude(self, ids):
        for c in ids:
            if c in self.active:
                self.active.remove(c)
                self.excluded.append(c)
                last = [f for f in self.failures if f.client_id == c]
                warnings.warn(
                    f"client {c!r} is left out of the model: it failed in "
                    + (f"{last[-1].method} (round {last[-1].round}): {last[-1].error}"
                       if last else "the set-up"), ClientExcludedWarning,
                       stacklevel=user_stacklevel())
            self.messages.pop(c, None)
            self.fresh.discard(c)
        if not self.active:
            msg = ("no client is left to form a model: every client failed or was excluded "
                   f"({len(self.failures)} failure(s); last: {self._last_failure()})")
            raise TrainingFailedError(msg)

    def _last_failure(self):
        if not self.failures:
            return "none"
        f = self.failures[-1]
        return f"client {f.client_id!r}, {f.method} in round {f.round}: {f.error}"

    def setup_all(self, method, args, r=0, ids=None):
        """A set-up call every (given) client must answer: failing ones are excluded."""
        out, n_calls, lost = self.call(method, args, self.active if ids is None else ids, r,
                                       strict=True)
        self.exclude(lost)
        return out, n_calls

    def _input_scale_check(self, pilots, pop, order, comm):
        """Set-up, before the global design: which clients vary along an input on another scale.

        Only with shared parts (the global or deviation component). Every
        client runs :meth:`StructuredClient.input_scale_check`
        with its own pilot and the typical client's lengthscales and widths
        and answers ``d`` lengthscale ratios. A client that reports an input
        leaves the boxes the global inducing inputs are placed in when client
        scales are on (``client_scale`` not False; as long as one client
        remains; ``server.input_scale_excluded_``): its shared
        parts cannot follow the others' scale along that input, it learns
        its own scale ``s_i`` on them (:meth:`StructuredClient.initialise`),
        and the design would otherwise spend inducing points on its range
        (docs/maths.md, section 10). An advisory exchange: a client that
        fails it keeps its box in the design (its ``initialise`` runs the
        test again, and a client it flags still learns its scale). The
        reports are kept in ``server.input_scale_reports_`` (client id to
        ``{input: ratio}``), the only record :class:`InputScaleWarning` reads
        (a client that fails the exchange is not reported). ``order`` gives
        the clients of ``server.client_boxes``; ``order=None``: clients
        joining a warm start, whose reports are added to the record (the
        design is kept).
        """
        cfg, server = self.config, self.server
        if (getattr(pop, "input_width", None) is None
                or getattr(pop, "input_lengthscale", None) is None
                or not {"global", "deviation"} & set(cfg.components)):
            return
        ids = [c for c in self.active if c in pilots]
        # (only the clients' usable replies: failures are recorded by call)
        replies, n_calls, _ = self.call(
            "input_scale_check", {c: (cfg, pilots[c], pop) for c in ids}, ids, 0)
        comm["bytes_down"] += n_calls * message_nbytes(pop)
        self._population_sent = set(replies)
        self._book_up(comm, replies)
        flagged = [c for c, r in replies.items() if np.any(r.ratios > 0)]
        reports = {
            c: {int(k): float(replies[c].ratios[k]) for k in np.flatnonzero(replies[c].ratios)}
            for c in flagged}
        if order is None:  # clients joining a warm start: the design is kept
            server.input_scale_reports_ = {**(getattr(server, "input_scale_reports_", None)
                                              or {}), **reports}
            return
        server.input_scale_reports_ = reports
        if (not flagged or not getattr(cfg, "client_scale", False) or not server.client_boxes
                or len(order) != len(server.client_boxes)):
            return
        kept = [b for c, b in zip(order, server.client_boxes) if c not in flagged]
        if kept:
            server.client_boxes = kept
            server.input_scale_excluded_ = [c for c in order if c in flagged]

    def _initialise_clients(self, ids, M_local, theta_g, gpack, pilots, pop, seeds):
        """Send the clients ``ids`` their initial values (:meth:`StructuredClient.initialise`).

        Returns the bytes sent: for every call made, the global vector, and
        the population pilot (its every number, :func:`message_nbytes`)
        unless the client received it in the input-scale check
        (:meth:`_input_scale_check`).
        """
        cfg = self.config
        # the clients that received the population's values in the input-scale
        # check hold them already (the Flower transport does not send them again)
        held = len(set(ids) & getattr(self, "_population_sent", set()))
        _, n_calls = self.setup_all("initialise", {
            c: (cfg, M_local, theta_g, gpack, pilots[c], pop, seeds[c]) for c in ids}, ids=ids)
        return n_calls * theta_g.nbytes + max(n_calls - held, 0) * message_nbytes(pop)

    def _book_up(self, comm, replies):
        """Add the replies of a set-up call to the round-0 record ``comm``.

        Replies that are None (nothing sent) are not counted; the bytes of
        replies dropped as non-finite since the last booking
        (``unusable_up``) are, since they came over the wire.
        """
        comm["bytes_up"] += int(sum(message_nbytes(m) for m in replies.values()
                                    if m is not None)) + self.unusable_up
        comm["n_messages"] += sum(m is not None for m in replies.values())
        self.unusable_up = 0

    def _pooled_noise(self, pilots, pop, comm):
        """The population's noise variance with the small clients pooled (set-up).

        The clients with ``PILOT_POOL_MIN_POINTS <= n_i <`` :data:`PILOT_POOL_POINTS`
        observations, targets that are not constant and on the clients'
        typical scale (:meth:`StructuredClient.pool_evidence`) fit one pooled
        pilot together: L-BFGS-B on the server over the ``d + 2`` shared log
        hyperparameters of :func:`pool_evidence`, each evaluation one exchange
        of :class:`PoolEvidence` messages. A client whose restricted
        log-likelihood per observation at the optimum is an outlier
        (:data:`PILOT_POOL_OUTLIER_Z`, against the larger of the clients'
        robust spread and its own sampling spread) is left out and the pool
        fitted once more. The pooled noise variance, at least the weighted median of the
        pooled clients' own pilots' (the pool corrects their downward bias;
        a pool that ends below it has itself interpolated), then counts with
        their total number of points in the weighted median of the other
        clients' own pilot noise variances (those that did not interpolate
        their points, :func:`noise_identified`).
        The pooled lengthscales likewise stand for the pooled clients' own in
        the weighted median of the pilots' lengthscales (``pop.lengthscale``,
        set here): pilots of a handful of points in several inputs switch
        inputs off, and their median sized the global inducing set for a
        function of fewer inputs.

        The clients that joined the pool also give, at its optimum, the
        spread ``tau`` of their log noise variances around the pooled one
        (:func:`noise_spread`), the scale of the pooled clients' noise
        hyperprior (``pop.noise_spread``). When the population's centre is
        more than :data:`NOISE_POOLED_OFFSET` ``* tau`` from the pooled value
        (``offset``, log units), the pooled clients are centred on the pooled
        value (``pop.noise_pooled``) with scale ``tau``; otherwise on the
        population's centre with scale ``sqrt(tau^2 + offset^2)`` (at most
        ``noise_prior_scale``) and ``pop.noise_pooled`` None. A client lost
        in that last exchange leaves the pooled noise in place and both
        None (the failure is recorded).

        The pilots' weighted median (``pop.noise_variance``) is kept when
        there are fewer than :data:`PILOT_POOL_MIN_CLIENTS` such clients or
        :data:`PILOT_POOL_MIN_TOTAL` points, and when any pooled client fails
        an exchange (the failure is recorded; the client stays in the model).
        Messages are booked in ``comm`` (round 0).
        """
        from scipy.optimize import minimize

        class _PoolFailed(Exception):
            pass

        replies = {}  # theta bytes -> {id: message}: a vector is sent to a client once

        def exchange(theta, ids):
            # only the clients not yet asked at this vector are asked
            known = replies.get(theta.tobytes(), {})
            missing = [c for c in ids if c not in known]
            if missing:
                res, n_calls, lost = self.call("pool_evidence", (theta,), missing, 0)
                comm["bytes_down"] += n_calls * int(theta.nbytes)
                self._book_up(comm, res)
                if lost:
                    raise _PoolFailed
                known = replies[theta.tobytes()] = {**known, **res}
            return {c: known[c] for c in ids}

        def enough(ids):
            return (len(ids) >= PILOT_POOL_MIN_CLIENTS
                    and sum(self.n_samples[c] for c in ids) >= PILOT_POOL_MIN_TOTAL)

        small = [c for c in self.active
                 if PILOT_POOL_MIN_POINTS <= self.n_samples[c] < PILOT_POOL_POINTS]
        if not enough(small):
            return pop.noise_variance
        d = len(pop.lengthscale)
        lo = np.log(np.r_[np.full(d, LOG_BOUNDS["lengthscale_g"][0]), 1e-4, 1e-6])
        hi = np.log(np.r_[np.full(d, 1e3), 1e2, 1e1])
        x = np.clip(np.log(np.r_[pop.lengthscale, pop.variance,
                                 max(pop.noise_variance, 0.1 * pop.variance)]), lo, hi)

        def member_replies(theta, ids):
            res = exchange(theta, ids)
            if any(m is None for m in res.values()):
                raise _PoolFailed  # a member left the pool
            return res

        def fit(start, ids):
            def objective(theta):
                res = member_replies(theta, ids)
                return (-sum(m.value for m in res.values()),
                        -np.sum([m.grad for m in res.values()], axis=0))

            return minimize(objective, start, jac=True, method="L-BFGS-B",
                            bounds=list(zip(lo, hi)), options={"maxiter": 200}).x

        try:
            first = exchange(x, small)
            members = [c for c in small if first[c] is not None]
            if not enough(members):
                return pop.noise_variance
            x = fit(x, members)
            # one outlier pass
            at = member_replies(x, members)
            n_m = np.array([self.n_samples[c] for c in members], dtype=float)
            u = np.array([at[c].value for c in members]) / n_m
            # the robust spread, at least each client's own sampling sd
            spread = np.maximum(1.4826 * np.median(np.abs(u - np.median(u))),
                                np.sqrt(0.5 / n_m))
            keep = [c for c, ui, si in zip(members, u, spread)
                    if ui >= np.median(u) - PILOT_POOL_OUTLIER_Z * si]
            if len(keep) < len(members) and enough(keep):
                members = keep
                x = fit(x, members)
        except _PoolFailed:
            return pop.noise_variance
        # a noise variance or a lengthscale within 10x of its lower bound: the
        # signal and the noise were not told apart (e.g. targets of pure
        # noise, which a white kernel of any split explains); no pool
        if x[d + 1] <= lo[d + 1] + np.log(10.0) or np.any(x[:d] <= lo[:d] + np.log(10.0)):
            return pop.noise_variance
        rest = [c for c, p in pilots.items()
                if p is not None and c in self.active and c not in members]
        # the other clients' pilots that did not interpolate (noise_identified)
        others = [c for c in rest if noise_identified(pilots[c])]
        own = [c for c in members if pilots.get(c) is not None]
        n_members = sum(self.n_samples[c] for c in members)
        # the pooled lengthscales stand for the pooled clients' own in the
        # population's weighted median, as the pooled noise does below
        pop.lengthscale = _median_lengthscale(
            [np.log(pilots[c].lengthscale) for c in rest] + [x[:d]],
            [self.n_samples[c] for c in rest] + [n_members])
        try:
            # the members' replies at x (held already, unless the optimum was
            # never evaluated): no other client decides the check
            info = [m.noise_information for m in member_replies(x, members).values()]
        except _PoolFailed:
            info = None
        if (getattr(pop, "noise_identified", False) and info is not None
                and not (np.sum(info) > 0
                         and np.sum(info) ** -0.5 <= PILOT_POOL_MAX_NOISE_SE)):
            # the pool does not identify the noise (PILOT_POOL_MAX_NOISE_SE)
            # while the pilots that did not interpolate do: their weighted
            # median stays; the pool's lengthscales count (above)
            return pop.noise_variance
        pooled = float(np.exp(x[d + 1]))
        pop.noise_identified = True
        if own:
            pooled = max(pooled, _weighted_median([pilots[c].noise_variance for c in own],
                                                  [self.n_samples[c] for c in own]))
        centre = _weighted_median([pilots[c].noise_variance for c in others] + [pooled],
                                  [self.n_samples[c] for c in others] + [n_members])
        # the spread of the small clients' log noise variances around the
        # pooled optimum, from every client that joined the pool (an outlier
        # left out of the kernel fit too: it is evidence of spread): the
        # scale of their noise
        # hyperprior (noise_spread). Around the population's centre, which
        # the other pilots can move away from the pooled value, their
        # expected squared distance adds that offset: sqrt(tau^2 + offset^2)
        joined = [c for c in small if first[c] is not None]
        try:
            at = exchange(x, joined)
        except _PoolFailed:
            at = {}
        if all(at.get(c) is not None for c in joined):
            tau = noise_spread([at[c].grad[d + 1] for c in joined],
                               [at[c].noise_information for c in joined],
                               self.config.noise_prior_scale)
            if tau is not None:
                offset = float(np.log(centre) - x[d + 1])
                if abs(offset) > NOISE_POOLED_OFFSET * tau:
                    # the other clients' noise is clearly not the pooled
                    # clients': they are centred on the pooled value, with
                    # their own spread
                    pop.noise_spread, pop.noise_pooled = float(tau), pooled
                else:
                    pop.noise_spread = float(min(np.hypot(tau, offset),
                                                 self.config.noise_prior_scale))
        return centre

    # -- one evaluation of the (pseudo-)ELBO: two exchanges -------------------------
    def _level_log_prior(self, tg):
        """:func:`level_log_prior` at ``tg`` for the clients in the model."""
        return level_log_prior(self.gpack, tg, self.config, len(self.active))

    def evaluate(self, tg, r, live, trial=False, strict=False):
        """ELBO, its gradient and q(v_g) at ``tg``; ``live`` clients send fresh messages.

        Absent (or failed) clients count with their last stored message. Returns
        ``(elbo, grad, post, log_prior)`` and the ids lost in this evaluation.
        """
        from ._structured import combine

        cfg, gpack = self.config, self.gpack
        # each exchange is booked as it happens: a trial point rejected after
        # it (a client's numerical failure, q(v_g) failing in combine) still
        # sent the broadcast and received the replies
        stats, lost1 = self._booked_call("statistics", (tg, gpack, cfg, r), live, r, trial,
                                         strict, 8 * tg.size)
        # the live clients' fresh messages, the others' stored ones, in client order
        order = [c for c in self.active if c in self.messages or c in stats]
        msgs = [stats[c] if c in stats else self.messages[c] for c in order]
        if not msgs:
            # every client failed and none had a stored message (the first
            # evaluation of a resumed or warm-started run): no q(v_g) exists
            if strict:  # an evaluation every client must answer: they are out
                self.exclude(lost1)  # raises TrainingFailedError once no client is left
            raise TrainingFailedError(
                "no client message to form a model: every client failed in this "
                f"evaluation and none had sent one before (last: {self._last_failure()})")
        post_s = combine([m.precision for m in msgs], [m.shift for m in msgs],
                         [m.constant for m in msgs], self.Mg)
        post = PosteriorBroadcast(r, post_s.mu, post_s.A_inv)
        # the clients' own hyperpriors and the server's (the level variance)
        lp = float(sum(m.log_prior for m in msgs)) + self._level_log_prior(tg)[0]
        grads, lost2 = self._booked_call("global_gradient", (post, tg, gpack, cfg), list(stats),
                                         r, trial, strict, message_nbytes(post))
        self.messages.update(stats)
        self.fresh = set(stats)
        grad = (np.sum([g.grad_global for g in grads.values()], axis=0)
                if gpack.size and grads else np.zeros(gpack.size))
        self.counter["evals"] += 1
        return (post_s.elbo, grad, post, lp), set(lost1) | set(lost2)

    def _booked_call(self, method, args, ids, r, trial, strict, down_each):
        """:meth:`call`, its messages added to the round's counts (also when the
        trial point is rejected); ``down_each``: bytes of one request."""
        def book(replies, n_calls):
            c = self.counter
            c["up"] += sum(message_nbytes(m) for m in replies.values()) + self.unusable_up
            c["down"] += n_calls * down_each
            c["msgs"] += len(replies)
            self.unusable_up = 0

        self.unusable_up = 0
        try:
            out, n_calls, lost = self.call(method, args, ids, r, trial, strict)
        except _TrialRejected as exc:
            book(exc.replies, exc.n_calls)
            raise
        book(out, n_calls)
        return out, lost

    def evaluate_all(self, tg, r):
        """An evaluation every active client must answer (set-up, resume)."""
        while True:
            res, lost = self.evaluate(tg, r, list(self.active), strict=True)
            if not lost:
                return res
            self.exclude(lost)

    # -- participation ------------------------------------------------------------
    def sample(self):
        n = len(self.active)
        k = min(n, max(self.min_clients, int(np.ceil(self.fraction * n - 1e-12))))
        if k >= n:
            return list(self.active)
        pick = np.sort(self.rng.choice(n, k, replace=False))
        return [self.active[i] for i in pick]

    # -- set-up ---------------------------------------------------------------------
    def setup(self, seeds):
        server, cfg = self.server, self.config
        # the set-up's input-scale check (_input_scale_check) fills these
        server.input_scale_excluded_, server.input_scale_reports_ = [], {}
        self._population_sent = set()
        summaries, _ = self.setup_all("summary", ())
        init = server.standardise(list(summaries.values()))
        server.record_outputs(summaries)
        if (self.setup_warnings and "global" in cfg.components
                and not getattr(cfg, "client_scale", False)):
            # with client scales each such client uses the shared parts at its own scale
            warn_flat_clients(summaries)
        T = len(summaries)
        comm = {"round": 0, "bytes_up": 0, "bytes_down": T * message_nbytes(init),
                "n_messages": 0}
        self._book_up(comm, summaries)
        self.setup_all("prepare", (init,))
        self.n_samples = {c: summaries[c].n_samples for c in self.active}
        pilots, _ = self.setup_all("pilot", {c: (seeds[c],) for c in self.active})
        self._book_up(comm, pilots)
        good = [p for p in pilots.values() if p is not None]
        d = server.d
        if good:
            # medians over the clients' pilots, each weighted by its client's
            # number of observations: a pilot on a handful of points carries
            # almost no information on the lengthscales (with 32 inputs and
            # clients of 400, 100, 30, 10 and 5 points the plain median was
            # the 30-point client's, lengthscales far beyond the box, and
            # the shared part learned nothing); with equal sizes, the median
            sizes = [self.n_samples[c] for c, p in pilots.items() if p is not None]
            with_target = [(p.noise_variance_target, n) for p, n in zip(good, sizes)
                           if getattr(p, "noise_variance_target", None) is not None]

            noise_pop, identified = population_noise(good, sizes, return_identified=True)
            pop = _PopulationPilot(
                _median_lengthscale([np.log(p.lengthscale) for p in good], sizes),
                _weighted_median([p.variance for p in good], sizes, interpolate=True),
                # pilots that interpolated their points say nothing about the
                # noise (population_noise)
                noise_pop,
                noise_variance_target=(_weighted_median(*zip(*with_target), interpolate=True)
                                       if with_target else None))
            pop.noise_identified = identified
            per = [(np.asarray(p.noise_variance_outputs, dtype=float), n,
                    np.ones(np.shape(p.noise_variance_outputs), dtype=bool)
                    if getattr(p, "noise_outputs_observed", None) is None
                    else np.asarray(p.noise_outputs_observed, dtype=float) > 0)
                   for p, n in zip(good, sizes)
                   if getattr(p, "noise_variance_outputs", None) is not None]
            if per and len({v.shape for v, _, _ in per}) == 1:
                # multi-output targets: each output's noise from the pilots
                # that ran on it (the stand-in value of an output a client
                # never observed is left out)
                V = np.array([v for v, _, _ in per])
                seen = np.array([o for _, _, o in per], dtype=bool)
                w = np.array([n for _, n, _ in per], dtype=float)
                centre = np.array([
                    _weighted_median(V[seen[:, q], q], w[seen[:, q]], interpolate=True)
                    if np.any(seen[:, q]) else float(np.median(V[:, q]))
                    for q in range(V.shape[1])])
                pop.noise_variance_outputs = centre
                pop.noise_spread = ilmm_noise_spread(
                    np.where(seen, V, np.nan), centre, w >= PILOT_POOL_POINTS)
        else:
            pop = _PopulationPilot(np.full(d, 0.5 * np.sqrt(d)), 1.0, 0.1)
        if not cfg.n_outputs:
            pop.noise_variance = self._pooled_noise(pilots, pop, comm)
            # the typical client's input widths (from the boxes) and pilot
            # lengthscales: medians over the clients, not weighted by their
            # sizes (one large client in other units must not set them), what
            # input_scale_mismatch compares a client's with
            widths = server.client_widths()
            # to the nearest power of 2: the median can be one client's exact
            # range (two of its inputs' difference), which is kept in the
            # model and sent to every client; the test's thresholds are
            # factors of 3 and 10
            w = np.median(widths, axis=0)
            pos = w > 0
            pop.input_width = np.where(pos, 2.0 ** np.round(np.log2(np.where(pos, w, 1.0))), 0.0)
            if good:
                pop.input_lengthscale = _median_lengthscale(
                    [np.log(p.lengthscale) for p in good], np.ones(len(good)))
                self._input_scale_check(pilots, pop, list(summaries), comm)
        theta_g, gpack, M, M_local = server.structured_initialise(pop)
        comm["bytes_down"] += self._initialise_clients(list(self.active), M_local, theta_g,
                                                       gpack, pilots, pop, seeds)
        # learn_inducing_ is resolved in run(); only "auto" decides it here
        server.learn_inducing_, server.design_residual_ = None, None
        server.local_prior_centre_ = None  # decided from round 2 (_share_local_prior)
        server.local_prior_sent_, server.local_fitted_ = [], []
        server.design_residual_history_, server.inducing_switch_round_ = [], None
        if isinstance(getattr(cfg, "learn_inducing", True), str) and "Z_g" in gpack.slices:
            # "auto": learn Z_g when the initial design leaves a large share of
            # the prior variance at the clients' inputs unexplained
            res, _ = self.setup_all("design_residual", (theta_g, gpack))
            # per client (on the server, so that checkpoints keep it)
            server.design_n_samples_ = {c: m.n_samples for c, m in res.items()}
            self._book_up(comm, res)
            server.learn_inducing_ = self._decide_global_inducing(res, 0)
        server.population_pilot = pop
        server.init_broadcast = init
        self.init, self.gpack, self.theta_g = init, gpack, theta_g
        self.Mg = 0 if "global" not in cfg.components else (
            M * cfg.n_latent[0] if cfg.n_outputs else M)
        self.comm = [comm]
        self.history, self.objectives = [], []
        self.adam = Adam(cfg.global_learning_rate)
        self.round0 = 0
        self.last = self.evaluate_all(theta_g, 0)

    def resume(self, state, seeds):
        """Continue from a :class:`TrainingState` (checkpoint or warm start)."""
        server, cfg = self.server, self.config
        # fields a checkpoint of an older version lacks
        server.input_scale_excluded_, server.input_scale_reports_ = [], {}
        for name in _SERVER_FIELDS:
            if name in state.server:  # a checkpoint of an older version may lack one
                setattr(server, name, state.server[name])
        server.global_pack = state.global_pack
        server.theta_global = state.theta_global.copy()
        server.init_broadcast = state.init
        self.init, self.gpack = state.init, state.global_pack
        d_state = state.init.x_min.shape[0]
        if d_state != server.d:
            raise ValueError(
                f"the saved state was trained on {d_state} input features, the data have "
                f"{server.d}: continue with data of {d_state} features, or fit from scratch "
                "(warm_start=False, resume_from=None)")
        self.theta_g = state.theta_global.copy()
        # clients the interrupted run had excluded stay out
        self.active = [c for c in self.active if c not in state.excluded_clients]
        M = server.n_inducing_
        self.Mg = 0 if "global" not in cfg.components else (
            M * cfg.n_latent[0] if cfg.n_outputs else M)
        summaries, n_calls = self.setup_all("summary", ())
        server.flat_clients = flat_targets(list(summaries.values()))
        # this run's data decide (a warm start may bring values the first fit lacked)
        server.record_outputs(summaries)
        # the server needs the clients' counts again; the standardisation is kept
        self.counter["up"] += int(sum(message_nbytes(s) for s in summaries.values()))
        self.counter["msgs"] += len(summaries)
        self.setup_all("prepare", (self.init,))
        self.counter["down"] += len(summaries) * message_nbytes(self.init)
        self.n_samples = {c: summaries[c].n_samples for c in self.active}
        known = [c for c in self.active if c in state.client_states]
        new = [c for c in self.active if c not in state.client_states]
        self.setup_all("set_state", {c: (state.client_states[c],) for c in known}, ids=known)
        if new:
            pop = server.population_pilot
            pilots, _ = self.setup_all("pilot", {c: (seeds[c],) for c in new}, ids=new)
            new = [c for c in new if c in pilots]
            self.counter["up"] += int(sum(message_nbytes(p) for p in pilots.values()
                                          if p is not None))
            self.counter["msgs"] += sum(p is not None for p in pilots.values())
            new = [c for c in new if c in self.active]
            # the input-scale test of set-up, its reports added to the record
            comm = {"bytes_up": 0, "bytes_down": 0, "n_messages": 0}
            self._input_scale_check(pilots, pop, None, comm)
            self.counter["up"] += comm["bytes_up"]
            self.counter["down"] += comm["bytes_down"]
            self.counter["msgs"] += comm["n_messages"]
            # a new client is sent what a client is sent at set-up
            self.counter["down"] += self._initialise_clients(
                new, server.n_inducing_local_, self.theta_g, self.gpack, pilots, pop, seeds)
        self.messages = {c: m for c, m in state.messages.items() if c in known}
        self.fresh = set(state.fresh) & set(known)
        self.comm = copy.deepcopy(state.communication)
        self.history, self.objectives = list(state.history), list(state.objectives)
        self.counter["evals"] = state.n_evaluations
        self.failures = list(state.failed_clients)
        self.excluded = list(state.excluded_clients) + self.excluded
        self.adam = copy.deepcopy(state.adam) if state.adam is not None else Adam(
            cfg.global_learning_rate)
        self.adam.set_learning_rate(cfg.global_learning_rate)  # the moments continue
        if state.rng_state is not None:
            self.rng.set_state(state.rng_state)
        self.round0 = state.round
        changed = (getattr(state, "config", None) is not None
                   and configs_differ(state.config, cfg))
        # a state of an older objective (e.g. without the level prior): its
        # saved ELBO and log prior are not values of this one
        changed = changed or getattr(state, "objective_version", 1) != OBJECTIVE_VERSION
        if new or changed or set(self.messages) != set(self.active) or state.post is None:
            # new clients, missing messages, or changed settings (e.g. a prior,
            # whose saved ELBO and log prior belong to the old objective):
            # every client sends fresh ones
            self.last = self.evaluate_all(self.theta_g, state.round)
        else:
            self.last = (state.elbo, None, state.post, state.log_prior)

    def snapshot(self, r):
        """The :class:`TrainingState` after round ``r``."""
        states = (self.transport.client_states(self.active)
                  if hasattr(self.transport, "client_states") else {})
        elbo, _, post, lp = self.last
        return TrainingState(
            round=r, init=self.init,
            server={name: copy.deepcopy(getattr(self.server, name, None))
                    for name in _SERVER_FIELDS},
            theta_global=self.theta_g.copy(), global_pack=self.gpack, post=post,
            elbo=float(elbo), log_prior=float(lp), messages=dict(self.messages),
            fresh=[c for c in self.active if c in self.fresh],
            history=list(self.history), objectives=list(self.objectives),
            communication=copy.deepcopy(self.comm), n_evaluations=self.counter["evals"],
            rng_state=self.rng.get_state(), adam=copy.deepcopy(self.adam),
            failed_clients=list(self.failures), excluded_clients=list(self.excluded),
            client_states=states, config=self.config, objective_version=OBJECTIVE_VERSION)

    # -- one round ------------------------------------------------------------------
    def round(self, r):
        """Local phase of the participants, then the server's global phase.

        Returns whether the round may count for the convergence test, the
        objective at its start and the number of observations.
        """
        cfg, gpack = self.config, self.gpack
        N = max(sum(self.n_samples[c] for c in self.active), 1)
        live = self.sample()
        server = self.server
        # clients whose last asked round failed: a repeated failure does not
        # hold the global vector again (a client that always fails must not
        # stop training); nor does any failure right after a held round
        repeat = set(getattr(server, "failed_when_last_asked_", None) or ())
        may_hold = not getattr(server, "held_last_round_", False)
        sampled = set(live)
        failed = set()
        if not set(live) <= self.fresh:
            # a participant's stored message is stale: fresh messages from the
            # participants (the others' stored ones held fixed) first, so the
            # local phase works against the current q(v_g)
            self.last, lost = self.evaluate(self.theta_g, r, live)
            live = [c for c in live if c not in lost]
            failed |= set(lost)
        elbo, grad, post, lp = self.last
        prev = elbo + lp
        start_theta, start_last = self.theta_g, self.last
        saved_msgs = dict(self.messages)
        try:
            if len(live) < self.min_clients:
                raise _TooFewClients
            # -- local phase: participants, q(v_g) fixed, no communication -----
            _, _, lost = self.call("local_phase", (post, self.theta_g, gpack, cfg), live, r)
            self.fresh -= set(live)
            live = [c for c in live if c not in lost]
            self.local_done.update(live)
            # every client that has fitted its local part (kept in checkpoints)
            server.local_fitted_ = list(dict.fromkeys(
                [*(getattr(server, "local_fitted_", None) or []), *live]))
            failed |= set(lost)
            if len(live) < self.min_clients:
                raise _TooFewClients
            # a participant that failed before the global phase (and not in
            # the previous round too) holds the global vector this round; a
            # held round does not count for the stopping rule
            hold = may_hold and bool(failed - repeat)
            changed, cut = self.global_phase(r, live, N, hold=hold, repeat=repeat,
                                             failed=failed, may_cut=may_hold)
            changed = changed or hold
        except _TooFewClients:
            answered = len([c for c in live if c not in failed])
            warnings.warn(
                f"round {r}: fewer than min_clients={self.min_clients} clients answered "
                f"({answered}); the round is skipped (global vector unchanged)",
                RoundSkippedWarning, stacklevel=user_stacklevel())
            self.theta_g, self.last = start_theta, start_last
            self.messages = saved_msgs
            self.fresh = set()
            server.failed_when_last_asked_ = sorted((repeat - sampled) | failed, key=repr)
            server.held_last_round_ = False
            return False, prev, N
        server.failed_when_last_asked_ = sorted((repeat - sampled) | failed, key=repr)
        server.held_last_round_ = bool(hold or cut)
        return not changed, prev, N

    def global_phase(self, r, live, N, hold=False, repeat=(), failed=None, may_cut=False):
        """The server's L-BFGS-B (or Adam) steps on the global vector.

        ``hold``: a participant failed before this phase: the global vector
        stays (only ``q(v_g)`` is refreshed). With ``may_cut``, a participant
        lost inside an L-BFGS-B phase stops it at the last iterate accepted
        with every participant's message fresh, unless it is in ``repeat``
        (its last asked round failed too); otherwise L-BFGS-B starts again
        from that iterate with its message held fixed. Adam's steps go on
        with the message held fixed. Lost participants are added to
        ``failed`` as they are lost (also when :class:`_TooFewClients` ends
        the phase).

        Returns
        -------
        changed : bool
            Whether a participant was lost (the objective changed).
        cut : bool
            Whether the phase was stopped early for a lost participant.
        """
        from scipy.optimize import minimize

        cfg, gpack = self.config, self.gpack
        live = list(live)
        cache = {}
        anchor = {"key": self.theta_g.tobytes()}
        changed = [False]
        new = [False]  # a participant lost in this phase that did not fail last round
        cut = False
        # evaluations at which every participant answered: the latest one, and
        # the one at the last accepted iterate (result, messages, fresh set), so
        # that a phase cut short ends with the messages sent at its end point
        latest, accepted = {}, {}
        start_key = self.theta_g.tobytes()
        lbfgs = cfg.optimizer == "lbfgs"

        def fun(tg):
            key = tg.tobytes()
            if key not in cache:
                try:
                    cache.clear()
                    res, lost = self.evaluate(tg, r, live, trial=key != anchor["key"])
                except (np.linalg.LinAlgError, FloatingPointError, _TrialRejected):
                    return np.inf, np.zeros_like(tg)
                cache[key] = res
                if not lost:
                    latest.clear()
                    latest[key] = (res, dict(self.messages), set(self.fresh))
                    if key == start_key:
                        accepted.clear()
                        accepted[key] = latest[key]
                if lost:
                    live[:] = [c for c in live if c not in lost]
                    changed[0] = True
                    if failed is not None:
                        failed.update(lost)
                    new[0] = new[0] or bool(set(lost) - set(repeat))
                    if len(live) < self.min_clients:
                        raise _TooFewClients
                    if lbfgs:
                        anchor["key"] = key
                        raise _MembershipChanged
            e, g, _, _ = cache[key]
            # the ELBO and the server's own hyperprior (the clients' are
            # constant in this phase)
            lp_g, g_lp = self._level_log_prior(tg)
            return -(e + lp_g) / N, -(g + g_lp) / N

        theta_g = self.theta_g
        if gpack.size and cfg.global_steps and not hold:
            gbounds = self.gbounds
            start = theta_g
            last = [theta_g]

            def record(xk):
                last[0] = np.array(xk, dtype=float, copy=True)
                k = last[0].tobytes()
                if k in latest:
                    accepted.clear()
                    accepted[k] = latest[k]

            while True:
                try:
                    if lbfgs:
                        res = minimize(fun, start, jac=True, method="L-BFGS-B", bounds=gbounds,
                                       callback=record,
                                       options={"maxiter": cfg.global_steps, "ftol": 1e-12,
                                                "gtol": 1e-9})
                        cand = res.x
                    else:
                        cand = theta_g
                        for _ in range(cfg.global_steps):
                            _, g = fun(cand)
                            cand = clip_to_bounds(self.adam.step(cand, -g * N), gbounds)
                    f_c, _ = fun(cand)
                    break
                except _MembershipChanged:
                    if new[0] and may_cut:
                        cut = True
                        # a participant failed: keep the last iterate accepted
                        # with every participant's message fresh
                        cand, f_c = last[0], 0.0
                        snap = accepted.get(cand.tobytes()) or latest.get(cand.tobytes())
                        if snap is not None:
                            # the messages every participant sent there (the
                            # lost one's too, computed at its current local
                            # vector): not those of later trial points
                            cache.clear()
                            cache[cand.tobytes()] = snap[0]
                            self.messages, self.fresh = dict(snap[1]), set(snap[2])
                        # else evaluated below with those left
                        break
                    # a participant failed: the objective changed; L-BFGS-B starts
                    # again from its last accepted iterate
                    start = last[0]
                    anchor["key"] = start.tobytes()
            if np.isfinite(f_c):
                theta_g = cand
        key = theta_g.tobytes()
        if key in cache:
            self.last = cache[key]
        else:
            self.last, lost = self.evaluate(theta_g, r, live)
            if lost:
                changed[0] = True
                live[:] = [c for c in live if c not in lost]
                if failed is not None:
                    failed.update(lost)
                if len(live) < self.min_clients:
                    raise _TooFewClients
        self.theta_g = theta_g
        return changed[0], cut

    # -- "auto" inducing inputs ---------------------------------------------------------
    def _decide_global_inducing(self, res, r):
        """The ``"auto"`` decision for ``Z_g`` from the clients' :class:`DesignResidual`.

        Records ``(round, share, nats per observation)`` in the server's
        ``design_residual_history_`` and the share in ``design_residual_``
        (the latest check's). When only some clients answered, their trace
        term per observation stands for every active client's.
        """
        server = self.server
        total = sum(m.total for m in res.values())
        residual = sum(m.residual for m in res.values())
        share = residual / total if total > 0 else 0.0
        nats = float(sum(m.nats for m in res.values()))
        n = int(sum(m.n_samples for m in res.values()))
        n_all = getattr(server, "design_n_samples_", None)
        if r > 0 and n_all and n > 0:
            # a subset answered (partial participation, failures): its trace
            # term per observation, over every active client's observations
            N = sum(n_all.get(c, 0) for c in self.active)
            nats, n = nats * max(N, n) / n, max(N, n)
        server.design_residual_ = float(share)
        hist = getattr(server, "design_residual_history_", None)
        if hist is None or r == 0:
            hist = server.design_residual_history_ = []
        hist.append((int(r), float(share), nats / max(n, 1)))
        return auto_learns(residual, total, nats if r > 0 else None, n)

    def _share_local_prior(self, r):
        """From round 2: the large clients' local kernels become the small clients' prior.

        Once, before the first round in which at least
        :data:`LOCAL_PRIOR_MIN_CLIENTS` clients with :data:`PILOT_POOL_POINTS`
        observations or more have run a local phase (scalar targets, a local
        component, hyperpriors on): those clients send their local
        lengthscales and the size of their fitted departure
        (:class:`LocalKernelSummary`, :meth:`StructuredClient.local_prior_summary`),
        and the server forms the centre of a prior for the clients with fewer
        observations (:meth:`StructuredClient.set_local_prior`): as the local
        variance the mean of the reported departure sizes (the departures are
        a random effect per client: a median would call them zero as soon as
        half the clients need no local part), as the lengthscales the
        geometric mean of the reported ones weighted by those sizes (the
        lengthscales of a switched-off local part say nothing). No prior is
        formed when the mean departure is below :data:`LOCAL_OFF_RATIO` times
        ``0.1 x`` the population's signal variance (the threshold at which a
        client's own local part counts as switched off,
        :meth:`StructuredClient._local_switched_off`): the others then need no
        local part, and a small client that departs from them must still be
        able to switch its own on. Once formed, the centre is sent before
        every round to the small clients that have not received it (a failed
        delivery). A warm start forms it again from the fits of its own run
        (the three fields below belong to one run).

        A client with a handful of points cannot tell its local kernel's
        shape and size; its own fit either switches the part off or
        interpolates its points, and both leave its band far too narrow where
        it has no data. The population's kernel is the hierarchical answer: the
        size and shape of the others' departures from the shared function
        (docs/maths.md section 10). The decision is ``server_.local_prior_centre_``
        (None: not yet made; False: no prior formed), the clients that hold
        the prior ``server_.local_prior_sent_``, the clients that have fitted
        their local part ``server_.local_fitted_``; all three are kept in
        checkpoints and reset by a warm start.
        """
        server, cfg = self.server, self.config
        parts = ("local", "deviation") if cfg.n_outputs else ("local",)
        if not any(p in cfg.components for p in parts) or cfg.noise_prior_scale is None:
            return
        counter = self.counter
        centre = getattr(server, "local_prior_centre_", None)
        if centre is None:
            # the large clients that have fitted their local part at least once
            fitted = set(getattr(server, "local_fitted_", None) or [])
            big = [c for c in self.active
                   if self.n_samples[c] >= PILOT_POOL_POINTS and c in fitted]
            if len(big) < LOCAL_PRIOR_MIN_CLIENTS or not any(
                    self.n_samples[c] < PILOT_POOL_POINTS for c in self.active):
                return  # not yet (or nobody to send it to): asked again next round
            server.local_prior_centre_ = False
            # q(v_g) and the global vector: what a client holds if it sent the
            # latest evaluation's statistics, else sent to it with the request
            post = self.last[2]
            self.unusable_up = 0
            res, _, _ = self.call("local_prior_summary", (post, self.theta_g, self.gpack, cfg),
                                  big, r)
            kind = DepartureSummary if cfg.n_outputs else LocalKernelSummary
            got = {c: m for c, m in res.items() if isinstance(m, kind)}
            counter["up"] += sum(message_nbytes(m) for m in got.values()) + self.unusable_up
            counter["down"] += ((8 * self.theta_g.size + message_nbytes(post))
                                * sum(c not in self.fresh for c in big))
            counter["msgs"] += len(got)
            self.unusable_up = 0
            if len(got) < LOCAL_PRIOR_MIN_CLIENTS:
                return
            off = LOCAL_OFF_RATIO * 0.1 * server.population_pilot.variance
            if cfg.n_outputs:
                # per output, the loadings' sizes (departure_centre; None:
                # departures all but absent)
                formed = departure_centre(list(got.values()), off)
            else:
                # the departures' variance: their mean over the clients (a random
                # effect per client); their shape: the local lengthscales averaged on
                # the log scale with weights the departures' sizes (a switched-off
                # local part's lengthscales say nothing)
                dep = np.array([m.variance for m in got.values()], dtype=float)
                log_ell = np.log(np.array([m.lengthscale for m in got.values()], dtype=float))
                formed = LocalKernelSummary(np.exp((dep / dep.sum()) @ log_ell),
                                            float(dep.mean()))
                # departures all but absent: no prior (see above)
                formed = formed if formed.variance > off else None
            if formed is None:
                return
            server.local_prior_centre_ = centre = formed
            server.local_prior_sent_ = []
        if not isinstance(centre, (LocalKernelSummary, DepartureSummary)):
            return
        sent = list(getattr(server, "local_prior_sent_", None) or [])
        small = [c for c in self.active
                 if self.n_samples[c] < PILOT_POOL_POINTS and c not in sent]
        if not small:
            return
        _, n_calls, lost = self.call("set_local_prior", (centre,), small, r)
        counter["down"] += n_calls * message_nbytes(centre)
        received = [c for c in small if c not in lost]
        server.local_prior_sent_ = sent + received
        # their objective changed: the round starts from fresh messages
        self.fresh -= set(received)

    def _recheck_global_inducing(self, r):
        """Before round ``r``: learn a held ``Z_g`` from now on if the rule says so.

        Only with ``learn_inducing="auto"`` while ``Z_g`` is held, and only
        when the global vector moved since the last check. Asked: the clients
        that evaluated the current global vector (every active client with
        full participation). Clients that fail to answer are left out of this
        check (it is advisory; the failure is still recorded). Returns
        whether ``Z_g`` is learned from now on.
        """
        server, cfg = self.server, self.config
        if (server.learn_inducing_ or not isinstance(getattr(cfg, "learn_inducing", True), str)
                or "Z_g" not in self.gpack.slices):
            return False
        key = self.theta_g.tobytes()
        # kept on the server (and in checkpoints): a resumed run skips the
        # check at the vector the interrupted run last checked, as that run would
        if getattr(server, "inducing_checked_at_", None) == key:
            return False
        server.inducing_checked_at_ = key
        # the clients that evaluated the current vector (all of them with full
        # participation): they hold it, and they have fitted their noise
        ids = [cid for cid in self.active if cid in self.fresh] or list(self.active)
        # with the configuration: a client restored from a checkpoint has not
        # seen it yet (a node of an earlier version fails this advisory check)
        res, _, _ = self.call("design_residual", (self.theta_g, self.gpack, cfg), ids, r)
        c = self.counter
        c["up"] += sum(message_nbytes(m) for m in res.values())
        # only the asked clients that did not evaluate the current vector need it
        c["down"] += 8 * self.theta_g.size * sum(cid not in self.fresh for cid in ids)
        c["msgs"] += len(res)
        if not res or not self._decide_global_inducing(res, r):
            return False
        server.learn_inducing_ = True
        server.inducing_switch_round_ = int(r)
        self.gbounds = server.global_bounds(self.gpack, self.theta_g, learn_inducing=True)
        if self.verbose > 0:
            print(f"[skfedgp] round {r:3d}: the global inducing inputs are learned from now on "
                  f"(design residual {server.design_residual_:.2e} of the prior variance, "
                  f"trace term {server.design_residual_history_[-1][2]:.3g} nats per "
                  "observation)", flush=True)
        return True

    # -- the whole run ----------------------------------------------------------------
    def run(self, seeds, state):
        cfg = self.config
        if state is None:
            self.setup(seeds)
        else:
            self.resume(state, seeds)
        # Z_g: a given True/False applies (also to a resumed or warm-started
        # run); "auto" keeps the decision of the run it continues (a
        # state saved before the option existed: learned)
        server = self.server
        server.learn_inducing_ = ("Z_g" in self.gpack.slices and resolved_learn_inducing(
            cfg, getattr(server, "learn_inducing_", None)))
        self.gbounds = server.global_bounds(self.gpack, self.theta_g,
                                            learn_inducing=server.learn_inducing_)
        if state is None:
            server.inducing_checked_at_ = self.theta_g.tobytes()  # set-up decided at this vector
        self.last_round = self.round0 + self.n_rounds
        starts = self._start_factors() if state is None else ()
        if starts and self.n_rounds >= 1:
            converged = self.select_start(starts)
        else:
            converged = self._train(self.round0 + 1)
        return self.final(converged)

    def _train(self, first):
        """Rounds ``first`` .. ``last_round`` until the stopping rule; whether it stopped them."""
        for r in range(first, self.last_round + 1):
            if self.one_round(r):
                return True
        return False

    def one_round(self, r):
        """Round ``r`` with its bookkeeping; returns whether training has converged."""
        cfg, c = self.config, self.counter
        t0 = time.perf_counter()
        self._recheck_global_inducing(r)
        self._share_local_prior(r)
        ok, prev, N = self.round(r)
        elbo, _, _, lp = self.last
        self.history.append(float(elbo))
        self.objectives.append(float(elbo + lp))
        self.comm.append({"round": r, "bytes_up": int(c["up"]), "bytes_down": int(c["down"]),
                          "n_messages": c["msgs"]})
        if self.verbose > 0:
            print(f"[skfedgp] round {r:3d}/{self.last_round}  ELBO {elbo: .6e}  "
                  f"time {time.perf_counter() - t0:6.2f}s  up {c['up']} B  "
                  f"down {c['down']} B", flush=True)
        c.update(up=0, down=0, msgs=0)
        converged = False
        # stop when a whole round (local and global phase) gains less than
        # tol times max(|ELBO|, number of observations); not after a round
        # whose objective changed (a skipped round, a participant lost). An
        # L-BFGS-B round cannot lose (a loss is round-off: converged); an Adam
        # round can, and a loss larger than the tolerance is not convergence
        gain = elbo + lp - prev
        if cfg.optimizer != "lbfgs":
            gain = abs(gain)
        if ok and gain <= cfg.tol * max(abs(elbo + lp), N, 1.0):
            # converged with Z_g held: go on only if "auto" now learns it
            # (decided before the checkpoint, which must hold the decision)
            converged = not (r < self.last_round and self._recheck_global_inducing(r + 1))
        if self.callback is not None:
            self.callback(r, self.snapshot(r))
        return converged

    # -- several starts of the global lengthscales ------------------------------------
    def _start_factors(self):
        """The factors of :attr:`ModelConfig.lengthscale_starts` that apply to this run.

        ``()`` when none does: the single factor 1, a given lengthscale, no
        global kernel, or a transport that cannot return the clients' states.
        """
        cfg = self.config
        factors = tuple(getattr(cfg, "lengthscale_starts", (1.0,)) or (1.0,))
        if (factors == (1.0,) or cfg.lengthscale is not None
                or "lengthscale_g" not in self.gpack.slices
                or not hasattr(self.transport, "client_states")):
            return ()
        return factors

    def _scaled_start(self, theta, factor):
        """``theta`` with every global lengthscale times ``factor`` (within its bounds)."""
        values = self.gpack.unpack(theta)
        lo, hi = self.server.lengthscale_range()
        values["lengthscale_g"] = np.clip(np.asarray(values["lengthscale_g"]) * factor, lo, hi)
        return self.gpack.pack(values)

    def _restore(self, state):
        """Go back to a :meth:`snapshot` of this run (the clients keep their data).

        The server's fields and vectors, the clients' own states (restored
        by each client), the stored messages, histories and optimiser
        states; without a stored posterior (``state.post is None``) every
        client sends fresh statistics at the restored vectors.
        """
        server = self.server
        for name in _SERVER_FIELDS:
            if name in state.server:
                setattr(server, name, copy.deepcopy(state.server[name]))
        server.theta_global = state.theta_global.copy()
        self.theta_g = state.theta_global.copy()
        self.setup_all("set_state", {c: (state.client_states[c],) for c in self.active})
        self.messages = dict(state.messages)
        self.fresh = set(state.fresh)
        self.comm = copy.deepcopy(state.communication)
        self.history, self.objectives = list(state.history), list(state.objectives)
        self.counter["evals"] = state.n_evaluations
        self.adam = copy.deepcopy(state.adam)
        if state.rng_state is not None:
            self.rng.set_state(state.rng_state)
        self.round0 = state.round
        self.gbounds = server.global_bounds(self.gpack, self.theta_g,
                                            learn_inducing=bool(server.learn_inducing_))
        if state.post is None:
            self.last = self.evaluate_all(self.theta_g, state.round)
        else:
            self.last = (state.elbo, None, state.post, state.log_prior)

    def select_start(self, factors):
        """Train from each start of the global lengthscales; keep the best run.

        Start ``k`` multiplies the set-up's starting global lengthscales
        (the median of the clients' pilot lengthscales, which describe the
        whole of each client's function) by ``factors[k]``, every other
        starting value unchanged. When the global and local kernels start
        at the same lengthscale, a shared component that is in truth
        smoother than the clients' own ones is often not found from there;
        a smoother start can instead end below the first (docs/maths.md,
        section 11). Each start is trained as a whole run (up to
        ``n_rounds`` rounds, the same stopping rule); the run with the
        largest final objective (ELBO plus log hyperpriors) is kept (the
        first one on a tie), as with several optimiser restarts. The other
        runs' traffic and evaluations are counted in round 1's record and
        in the evaluation count; their failures are kept. A start whose run
        loses a client ends the selection (that run is kept). Between
        starts the clients go back to the state they saved after the
        set-up (each restores its own), so this needs a transport that
        returns them (simulation). Returns whether the kept run converged.
        """
        s0 = self.snapshot(0)
        base = s0.theta_global.copy()
        runs = []
        for k, factor in enumerate(factors):
            self.local_done = set()  # each run's own (untrained-client warning)
            if k > 0:
                st = copy.copy(s0)
                st.theta_global = self._scaled_start(base, factor)
                st.post, st.messages, st.fresh = None, {}, []
                self._restore(st)
            elif factor != 1.0:
                self.theta_g = self._scaled_start(base, factor)
                self.server.theta_global = self.theta_g.copy()
                self.last = self.evaluate_all(self.theta_g, 0)
            # recorded in this run's checkpoints too
            self.server.lengthscale_start_ = float(factor)
            if self.verbose > 0 and len(factors) > 1:
                print(f"[skfedgp] start {k + 1}/{len(factors)}: global lengthscales x {factor:g}",
                      flush=True)
            n_fail, evals0 = len(self.failures), s0.n_evaluations
            converged = self._train(1)
            traffic = {key: sum(rec[key] for rec in self.comm[1:])
                       for key in ("bytes_up", "bytes_down", "n_messages")}
            runs.append(_StartRun(self.objectives[-1] if self.objectives else -np.inf,
                                  converged, self.snapshot(len(self.history)), traffic,
                                  self.counter["evals"] - evals0, list(self.failures[n_fail:]),
                                  set(self.local_done)))
            lost = len(self.active) != len(s0.client_states)
            if lost:
                break
        objectives = [r.objective if np.isfinite(r.objective) else -np.inf for r in runs]
        # a start that lost a client ends the selection, and its run is kept
        best = len(runs) - 1 if lost else int(np.argmax(objectives))
        if best != len(runs) - 1:
            self._restore(runs[best].state)
            if self.callback is not None:  # the last checkpoint is the kept run's
                self.callback(len(self.history), self.snapshot(len(self.history)))
        self.local_done = runs[best].local_done
        # every other start's traffic and evaluations in round 1's record
        rec = self.comm[1] if len(self.comm) > 1 and self.comm[1]["round"] == 1 else None
        for k, run in enumerate(runs):
            if k == best:
                continue
            if rec is not None:
                for key in ("bytes_up", "bytes_down", "n_messages"):
                    rec[key] += run.traffic[key]
            self.counter["evals"] += run.evaluations
            self.failures.extend(f for f in run.failures if f not in self.failures)
        if self.verbose > 0 and len(factors) > 1:
            print(f"[skfedgp] kept start {best + 1} (final objectives: "
                  + ", ".join(f"{v:.6g}" for v in objectives) + ")", flush=True)
        return runs[best].converged

    def final(self, converged):
        """Final exchange with every client at the final vectors; failing ones are excluded."""
        from ._structured import combine

        cfg, gpack, theta_g = self.config, self.gpack, self.theta_g
        c = self.counter
        r_final = len(self.history) + 1
        stats, n1, lost = self.call("statistics", (theta_g, gpack, cfg, r_final), self.active,
                                    r_final, strict=True)
        self.exclude(lost)
        up = sum(message_nbytes(s) for s in stats.values())
        down = n1 * 8 * theta_g.size
        msgs = len(stats)
        while True:
            live = list(self.active)
            post_s = combine([stats[k].precision for k in live], [stats[k].shift for k in live],
                             [stats[k].constant for k in live], self.Mg)
            post = PosteriorBroadcast(r_final, post_s.mu, post_s.A_inv)
            finals, n2, lost = self.call("finish", (post, theta_g, gpack, cfg), live, r_final,
                                         strict=True)
            down += n2 * message_nbytes(post)
            if not lost:
                break
            # a client lost here is left out of the model: q(v_g) without it
            self.exclude(lost)
        up += sum(message_nbytes(f) for f in finals.values())
        msgs += len(finals)
        # "final": a warm start continues with round r_final, so an earlier
        # fit's final exchange and the continued run's first round share it
        self.comm.append({"round": r_final, "bytes_up": int(c["up"] + up),
                          "bytes_down": int(c["down"] + down), "n_messages": c["msgs"] + msgs,
                          "final": True})
        # every client forgets its data (excluded ones too)
        self.transport.call("close", (), self.transport.client_ids, round_=r_final)
        lp = float(sum(stats[k].log_prior for k in live)) + self._level_log_prior(theta_g)[0]
        history, objectives = self.history, self.objectives
        n_iter = len(history)  # rounds run (0: none; the entry appended below is no round)
        if history:
            history[-1] = float(post_s.elbo)  # the ELBO of exactly the returned model
            objectives[-1] = float(post_s.elbo + lp)
        else:
            history.append(float(post_s.elbo))
            objectives.append(float(post_s.elbo + lp))
        population = _population_from([finals[k] for k in live], cfg.components, cfg.noise)
        if "level_variance" in gpack.slices:
            # a never-seen client's level is a draw from its prior N(0,
            # level_variance), which its prior block already carries; the
            # level variance and the centre (the mean of the clients' means) are
            # estimates from T clients: the predictive variance of a new
            # level is taken as level_variance (T + 1) / (T - 1) (the
            # estimated mean's share 1/T, and T / (T - 1) for a variance
            # estimated around an estimated mean), of which the estimated
            # mean's share is common to all never-seen clients
            tau2 = float(gpack.unpack(theta_g)["level_variance"])
            common = tau2 / max(len(live) - 1, 1)
            population.update(offset=0.0, offset_variance=2.0 * common,
                              offset_mean_variance=common)
        clients = getattr(self.transport, "clients", None)
        return ([clients[k] for k in live] if clients is not None else None), {
            "elbo_history": history, "objective_history": objectives,
            "communication": self.comm, "n_iter": n_iter,
            "converged": converged, "posterior": post, "theta_global": theta_g,
            "global_pack": gpack, "population": population,
            "n_evaluations": c["evals"],
            "failed_clients": [(f.round, f.client_id, f.method, f.error) for f in self.failures],
            "local_phase_done": sorted(self.local_done, key=repr),
            "excluded_clients": list(self.excluded),
            "trace_terms": [(finals[k].trace_nats, finals[k].trace_nats_local,
                             finals[k].jitter_nats, finals[k].n_observations) for k in live],
        }


def warm_start_state(server, clients, history, objectives, communication, n_evaluations,
                     failed_clients=(), n_iter=None):
    """A :class:`TrainingState` from a fitted structured model (``warm_start=True``).

    It holds the fitted global vector and every client's local vector but no
    stored messages: the clients' data may have changed, so the resumed run
    starts with an evaluation in which every client sends fresh ones. A
    client excluded from the fitted model takes part again as a new client.

    Parameters
    ----------
    server : Server
        The fitted server (after :func:`run_structured_training`).
    clients : dict
        Client id to fitted :class:`StructuredClient`.
    history, objectives : list of float
    communication : list of dict
    n_evaluations : int
    failed_clients : sequence of tuple, optional
        ``(round, client_id, method, error)``, kept in the history.
    n_iter : int, optional
        Rounds the fit ran (its ``n_iter_``): the history is cut to them (a
        fit of no round keeps its final ELBO, which is no round).

    Returns
    -------
    TrainingState
    """
    if n_iter is not None:  # a fit of no round keeps its final ELBO: not a round
        history, objectives = list(history)[:n_iter], list(objectives)[:n_iter]
    return TrainingState(
        round=len(history), init=server.init_broadcast,
        # bookkeeping that belongs to one run starts afresh: the "auto"
        # check runs again before the first round, and no failure is recent
        server={name: (None if name in _RUN_FIELDS else copy.deepcopy(getattr(server, name, None)))
                for name in _SERVER_FIELDS},
        theta_global=server.theta_global.copy(), global_pack=server.global_pack,
        history=list(history), objectives=list(objectives),
        communication=copy.deepcopy(list(communication)), n_evaluations=int(n_evaluations),
        failed_clients=[ClientFailure(c, m, r, e) for r, c, m, e in failed_clients],
        # the data may have changed: each client checks its local inducing
        # inputs again ("auto") rather than trusting its last check
        client_states={cid: dataclasses.replace(c.get_state(), inducing_checked_at=None)
                       for cid, c in clients.items()},
        config=server.config, objective_version=OBJECTIVE_VERSION)


#: :class:`ModelConfig` fields that define the model's vectors (their layout
#: and meaning): a resumed or warm-started run must keep them (``n_latent``
#: and ``noise`` only with multi-output targets). Every other field (the
#: optimiser and its steps, tolerances, starting values such as
#: ``lengthscale`` or ``noise_variance``, priors, learning rates) may change;
#: Adam's moments continue from the saved run.
MODEL_FIELDS = ("components", "n_inducing", "n_inducing_local", "variational_family",
                "n_outputs", "n_latent", "noise", "client_scale", "normalize_y")


def _same_setting(a, b):
    """Whether two setting values are equal by value (1 == 1.0, a list == a tuple)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_setting(u, v) for u, v in zip(a, b))
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    try:  # numbers, arrays: by value
        return bool(np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float)))
    except (TypeError, ValueError):
        try:
            return bool(a == b)
        except (TypeError, ValueError):
            return False


def configs_differ(a, b):
    """Whether two :class:`ModelConfig` differ in any field, compared by value.

    Beyond the paper (continuation of a federated run): a resumed run whose
    settings changed re-evaluates before its first round.

    Parameters
    ----------
    a, b : ModelConfig

    Returns
    -------
    bool
        True if any field differs (``1 == 1.0``; a list equals a tuple of
        the same items), the set-up choices of :data:`_SETUP_ONLY_FIELDS`
        excepted. Raises nothing.
    """
    return any(not _same_setting(getattr(a, f.name, None), getattr(b, f.name, None))
               for f in dataclasses.fields(ModelConfig) if f.name not in _SETUP_ONLY_FIELDS)


#: :class:`ModelConfig` fields that only the set-up of a new run uses (a
#: resumed run does not): :func:`configs_differ` ignores them.
_SETUP_ONLY_FIELDS = ("lengthscale_starts",)


def check_same_model(saved, config, what):
    """Refuse to continue a saved or fitted model under other model settings.

    Parameters
    ----------
    saved : ModelConfig or None
        The settings the state was trained with (None: not recorded, no check).
    config : ModelConfig
        The settings of the run that would continue it.
    what : str
        ``"resume_from"`` or ``"warm_start"`` (for the message).

    Raises
    ------
    ValueError
        If the number of target columns differs, or any of
        :data:`MODEL_FIELDS` (components, inducing sizes, family, latent
        counts, noise model, client scales): the saved vectors belong to
        another model, and continuing would mix the two silently. Other
        settings (optimiser, steps, tolerances, starting values, priors)
        may change.
    """
    if saved is None:
        return
    q_saved, q_now = saved.n_outputs or 1, config.n_outputs or 1
    if q_saved != q_now:
        raise ValueError(
            f"{what}: the saved model was trained on {q_saved} target column(s), y has "
            f"{q_now}; fit a new model (warm_start=False, resume_from=None)")

    fields = MODEL_FIELDS if (config.n_outputs or 0) > 0 else tuple(
        n for n in MODEL_FIELDS if n not in ("n_latent", "noise"))  # no vector for them in 1-D
    diff = [n for n in fields
            if not _same_setting(getattr(saved, n, None), getattr(config, n, None))]
    if diff:
        parts = "; ".join(f"the saved model was trained with {n}={getattr(saved, n, None)!r}, "
                          f"this fit has {n}={getattr(config, n, None)!r}" for n in diff)
        raise ValueError(
            f"{what}: {parts}. These settings define the model's vectors; continue with "
            "the saved ones or fit a new model")


def check_run_setup(config, state, checkpoint, min_clients, n_clients):
    """Checks of a structured run made before any client is asked anything.

    Shared by :meth:`FederatedHierarchicalGPRegressor.fit` and the Flower
    server (:func:`skfedgp.flower.fit_over_transport`).

    Parameters
    ----------
    config : ModelConfig
        The run's settings.
    state : TrainingState or None
        The state to resume from (``resume_from``).
    checkpoint : str, path-like, callable or None
    min_clients : int
    n_clients : int
        Clients taking part.

    Raises
    ------
    ValueError
        If ``state`` was trained with other model settings
        (:func:`check_same_model`), a checkpoint path names a folder or lies
        in a folder that does not exist (found only after round 1
        otherwise), or ``min_clients`` exceeds ``n_clients`` (every round
        would be skipped).
    """
    if state is not None:
        check_same_model(getattr(state, "config", None), config, "resume_from")
        n_clients -= len(getattr(state, "excluded_clients", ()))  # they stay out
    if isinstance(checkpoint, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(checkpoint))
        if os.path.isdir(path):
            raise ValueError(f"checkpoint: {os.fspath(checkpoint)!r} is a folder; give the path "
                             "of the file to write")
        if not os.path.isdir(os.path.dirname(path)):
            raise ValueError(f"checkpoint: the folder {os.path.dirname(path)!r} of "
                             f"{os.fspath(checkpoint)!r} does not exist")
    if isinstance(min_clients, numbers.Integral) and min_clients > n_clients:
        raise ValueError(f"min_clients={min_clients} exceeds the number of clients in the "
                         f"data ({n_clients}); no round could run")


@single_threaded_blas()
def run_structured_training(clients, server, config, *, n_rounds, n_jobs=None, seeds=None,
                            verbose=0, transport=None, fault_hook=None, client_fraction=1.0,
                            min_clients=1, max_retries=1, random_state=None, state=None,
                            callback=None, setup_warnings=True):
    """Set-up and rounds of the structured (collapsed) family.

    The server never touches a client object: every interaction is a
    ``transport.call(method, args, ids)`` (:class:`JoblibTransport` by
    default) returning messages or :class:`ClientFailure` values.

    **Partial participation.** Each round ``max(min_clients,
    ceil(client_fraction * T))`` of the ``T`` active clients are sampled
    (seeded by ``random_state``). The server keeps every client's last
    received Gaussian message ``(S_i, b_i, e_i)`` and uses it, held fixed,
    for a client absent this round: a stale site, as in expectation
    propagation and partitioned variational inference (T. D. Bui, C. V.
    Nguyen, S. Swaroop, R. E. Turner, "Partitioned Variational Inference: A
    unified framework encompassing federated and continual learning",
    arXiv:1811.11206, 2018; M. Ashman et al., "Partitioned Variational
    Inference: A Framework for Probabilistic Federated Learning",
    arXiv:2202.12275, 2022). Within a round the global phase therefore optimises
    a deterministic objective: the collapsed bound in which the absent
    clients' terms are constants (their gradient is zero) while ``A = I +
    sum_i S_i`` still contains their precision. Absent clients skip their
    local phase. When a participant's stored message is stale, the round
    starts with one evaluation in which the participants send fresh
    messages, so the local phase (which needs ``q(v_g)`` at the current
    point) stays a monotone step. The ELBO recorded for such a round is
    this pseudo-ELBO, not the ELBO of the model; the final exchange, in
    which every client takes part, makes ``elbo_history[-1]`` exact again.
    With ``client_fraction=1`` and no failure every client is fresh at
    every round start and the computation is the full-participation one.

    **Failures.** A client call that raises, or returns a message with a
    NaN/inf (which never reaches ``combine``), is a failure: it is retried
    ``max_retries`` times, then the client is absent for the rest of the
    round (its last message held fixed), and the round does not count for
    the convergence test. A participant that fails before the global phase
    (round-start evaluation, local phase) holds the global vector for the
    round (only ``q(v_g)`` is refreshed); one lost inside an L-BFGS-B
    global phase stops it at the last iterate accepted with every
    participant fresh: moving the global vector against a failed client's
    stale message favours the others at its expense (docs/deployment.md,
    section 3). Never two rounds in a row: after a held (or stopped) round
    the next one goes on as below whatever fails, so a population of
    clients that fail now and then moves the vector at least every other
    round. Nor for a client whose last asked round failed too (server
    attribute ``failed_when_last_asked_``, kept in checkpoints): the
    global phase goes on with its message held fixed (L-BFGS-B restarting
    from its last accepted iterate if it is lost inside the phase; Adam
    steps on), so a client that always fails cannot stop training. A numerical error of the client's own code
    (Cholesky failure, non-finite values) at a *trial* point of the global
    phase rejects the point (infinite objective), as in full participation.
    If fewer than ``min_clients`` clients answer in a round, the round is
    skipped (:class:`RoundSkippedWarning`): the global vector and the
    stored messages stay at their round-start values and the ELBO entry
    repeats the round-start value. The set-up exchanges (summary, prepare,
    pilot, initialise, the first evaluation) and the final exchange need
    every client: a client failing there (after its retries) is excluded
    from the model, :class:`TrainingFailedError` if no client is left;
    but an exception of the client's own code that the transport holds
    (in process: a bad hyperparameter, a failed factorisation) is raised
    there, as without a transport, since leaving the client out would hide
    an error in the model or the data.

    Parameters
    ----------
    clients : list of Client or None
        The clients' data holders (ignored when ``transport`` is given).
    server : Server
    config : ModelConfig
    n_rounds : int
        Maximum number of rounds (run in this call, after ``state``'s).
    n_jobs : int or None
    seeds : list of int
        Per-client seeds, in client order.
    verbose : int
    transport : object, optional
        Default: ``JoblibTransport([StructuredClient(c) for c in clients],
        n_jobs, fault_hook)``.
    fault_hook : callable, optional
        See :class:`JoblibTransport`.
    client_fraction : float in (0, 1], default=1.0
    min_clients : int, default=1
    max_retries : int, default=1
    random_state : int or None
        Seed of the participation sampler.
    state : TrainingState, optional
        Resume from it (same clients and data: identical to an
        uninterrupted run). Clients not in it are initialised as in the
        set-up (pilot fit, population values); clients of the state that
        are missing are left out. Without stored messages for every client
        (a warm start), all clients first send fresh ones.
    callback : callable, optional
        ``callback(round, state)`` after every round, ``state`` a
        :class:`TrainingState` (e.g. ``state.save(path)``).
    setup_warnings : bool, default=True
        Issue the set-up's warning about clients far flatter than the
        others (:func:`warn_flat_clients`); False for a further run on the
        same clients (``restart_from_global``), which has said it already.

    Returns
    -------
    clients : list of StructuredClient or None
        The transport's client objects (None if it holds none), holding
        only parameters and posterior moments (no data).
    result : dict
        ``elbo_history``, ``communication``, ``n_iter``, ``converged``,
        ``posterior`` (:class:`PosteriorBroadcast` at the final vectors),
        ``theta_global``, ``global_pack``, ``population`` (the population
        local block formed from the clients' local hyperparameters,
        :class:`LocalHyperparameters`), ``n_evaluations``,
        ``failed_clients`` (``(round, client_id, method, error)`` for every
        failed call), ``excluded_clients``.

    Raises
    ------
    TrainingFailedError
        If no client is left to form a model.
    Exception
        A client's own exception in the set-up or the final exchange (see
        above).

    Warns
    -----
    ClientExcludedWarning
        For every client left out of the model.
    RoundSkippedWarning
        For every skipped round.
    """
    if transport is None:
        transport = JoblibTransport([structured_client(c, config) for c in clients], n_jobs=n_jobs,
                                    fault_hook=fault_hook)
    ids = transport.client_ids
    seeds = dict(zip(ids, seeds if seeds is not None else range(len(ids))))
    run = _StructuredRun(transport, server, config, n_rounds, verbose, client_fraction,
                         min_clients, max_retries, random_state, callback, setup_warnings)
    with transport:
        return run.run(seeds, state)


# --------------------------------------------------------------------------
# multi-output (ILMM) targets, structured family
# --------------------------------------------------------------------------


def initial_loadings(covariance, rank, random_state):
    """Initial ``Q x R`` loadings from an output covariance (principal axes).

    Column ``r`` is the ``r``-th eigenvector of ``covariance`` times the
    square root of its eigenvalue (floored at 1 % of the largest), so that
    ``B B^T`` is the best rank-``R`` approximation of the covariance; columns
    beyond ``Q`` (or with a vanishing eigenvalue) get small random entries,
    seeded, so that no two latent functions start identical.

    Parameters
    ----------
    covariance : ndarray of shape (Q, Q)
    rank : int
    random_state : int

    Returns
    -------
    ndarray of shape (Q, rank)
    """
    C = 0.5 * (covariance + covariance.T)
    Q = C.shape[0]
    w, V = np.linalg.eigh(C)
    w, V = w[::-1], V[:, ::-1]
    top = max(float(w[0]), 1e-12)
    rng = np.random.default_rng(random_state)
    B = 0.1 * np.sqrt(top / max(Q, 1)) * rng.standard_normal((Q, rank))
    k = min(rank, Q)
    B[:, :k] = V[:, :k] * np.sqrt(np.maximum(w[:k], 0.01 * top))
    return B


def _target_noise_weights(y_scale, shape):
    """``w_q = mean(y_scale^2) / y_scale_q^2``: one variance in target units, per output."""
    ys2 = np.broadcast_to(np.asarray(y_scale, dtype=float) ** 2, shape)
    return float(np.mean(ys2)) / ys2


def structured_client(client, config):
    """The structured-family client of ``client``: scalar or multi-output targets."""
    return ILMMStructuredClient(client) if config.n_outputs else StructuredClient(client)


class ILMMStructuredClient(StructuredClient):
    """Client side of the structured family for multi-output (ILMM) targets.

    The client's outputs are ``y_q = offset_q + sum_r B_g[q, r] h_g,r +
    sum_r B_d[q, r] h_d,r + sum_r B_l[q, r] h_l,r + eps_q``
    (:mod:`skfedgp._ilmm`; Yan 2026, section 3.9, eqs. 34–39). The global
    loadings ``B_g`` live on the server (in the global vector); the
    deviation and local loadings ``B_d``, ``B_l``, the local kernels, the
    noise variance(s) and the per-output constant mean are this client's own
    vector. NaN entries of the targets are missing outputs, left out of the
    likelihood.

    Noise (``config.noise``; every output is standardised by its own scale
    ``y_scale_q``): ``"isotropic"``, one variance in standardised units (the
    same share of every output's variance; invariant to each column's
    units); ``"isotropic_target"``, one variance in *target* units (for
    outputs in one unit): the packed scalar ``s2`` (in units of the mean of
    the ``y_scale_q^2``) enters output ``q`` as ``s2 * w_q``, ``w_q =
    mean(y_scale^2) / y_scale_q^2`` (:meth:`noise_weights`), so every output
    gets ``s2 * mean(y_scale^2)`` in target units; ``"diagonal"``, one per
    output. :meth:`local_values` returns the per-output values.
    """

    def noise_weights(self):
        """Per-output factors ``w`` of the one noise variance (``"isotropic_target"`` only, else None).

        ``w_q = mean(y_scale^2) / y_scale_q^2``: Yan 2026's ``s2_i I_Q``
        (section 3.9, eq. 34) in target units, mapped to the standardised
        outputs (docs/maths.md, section 12).

        Returns
        -------
        ndarray of shape (Q,) or None
        """
        if getattr(self, "_noise_mode", "isotropic") != "isotropic_target":
            return None
        shapes = {name: shape for name, shape, _ in self.pack.spec}
        return _target_noise_weights(self._y_scale, shapes["offset"])

    def _values(self, theta=None):
        """Unpacked local vector with the noise variance per output."""
        L = self.pack.unpack(self.theta if theta is None else theta)
        w = self.noise_weights()
        if w is not None:
            L["noise_variance"] = float(L["noise_variance"]) * w
        return L

    def _n_observations(self):
        """Number of observed target values (entries of ``y`` that are not NaN)."""
        return int(np.sum(np.isfinite(self._y)))

    def _trace_nats(self, kind, residuals, L, G=None, components=()):
        """Trace term (nats): ``sum_q sum_r c_qr^2 residual_r / (2 s2_q)``.

        ``c_qr^2`` is ``B_l[q, r]^2`` for the local inducing inputs and
        ``B_g[q, r]^2 + phi B_d[q, r]^2`` for the global ones (the
        ``tr_R,q`` of :mod:`skfedgp._ilmm`: each output over the rows where
        it is observed).
        """
        Q = self._y.shape[1]
        s2 = np.broadcast_to(np.asarray(L["noise_variance"], float).reshape(-1), (Q,))
        R = residuals.shape[1]
        # per output q, the residuals summed over the rows where q is observed
        S = np.isfinite(self._y).astype(float).T @ residuals  # (Q, R)
        W = np.zeros((Q, R))
        if kind == "l":
            W += np.asarray(L["B_l"], float)[:, :R] ** 2
        else:
            if G is not None and "B_g" in G:
                W += np.asarray(G["B_g"], float)[:, :R] ** 2
            if "B_d" in L and G is not None and "phi" in G:
                Bd = np.asarray(L["B_d"], float)
                W[:, :Bd.shape[1]] += float(G["phi"]) * Bd[:, :R] ** 2
        return float(np.sum(W / s2[:, None] * S)) / 2.0

    def local_values(self):
        """Constrained local values (scaled inputs, standardised units).

        ``noise_variance`` in standardised units: a float (``"isotropic"``)
        or shape (Q,) (``"diagonal"``; ``"isotropic_target"``: the packed
        value times :meth:`noise_weights`).
        """
        return self._values()

    # -- the small clients' prior on their loadings ---------------------------
    def _shares_local_prior(self):
        """Whether this client takes part in the small clients' loading prior (either side).

        A deviation or local part (loadings ``B_d`` or ``B_l``) and targets
        on the clients' typical scale (:func:`client_scale_ratio` 1).
        """
        sl = getattr(getattr(self, "pack", None), "slices", {})
        return (("B_l" in sl or "B_d" in sl)
                and client_scale_ratio(self.own_variance) == 1.0)

    def local_prior_summary(self, post, theta_g, gpack, config):
        """This client's departure sizes for the small clients' prior (:class:`DepartureSummary`).

        Per output ``q`` the local part's prior variance ``sum_r B_l[q, r]^2``
        and the squared norm ``sum_r B_d[q, r]^2`` of the deviation
        loadings (0 for an output the client never observed, flagged in
        ``observed``), and the local lengthscales' geometric mean over its
        local latents weighted by ``sum_q B_l[q, r]^2`` (a switched-off
        latent's lengthscales say nothing). ``post``, ``theta_g``, ``gpack``
        and ``config`` are not used (the signature is the scalar client's).
        None (nothing sent) when the client has fewer than
        :data:`PILOT_POOL_POINTS` rows or is not on the clients' typical scale.
        """
        if self.n_samples < PILOT_POOL_POINTS or not self._shares_local_prior():
            return None
        L = self._values()
        Q, d = self._y.shape[1], self._Xs.shape[1]
        obs = (~np.all(np.isnan(self._y), axis=0)).astype(float)
        local, ell = np.zeros(Q), np.ones(d)
        if "B_l" in L:
            Bl = np.asarray(L["B_l"], dtype=float)
            local = np.sum(Bl**2, axis=1) * obs
            w = np.sum(Bl**2, axis=0)
            log_ell = np.log(np.asarray(L["lengthscale_l"], dtype=float))
            ell = np.exp(w @ log_ell / w.sum() if w.sum() > 0 else log_ell.mean(axis=0))
        dev = (np.sum(np.asarray(L["B_d"], dtype=float) ** 2, axis=1) * obs
               if "B_d" in L else None)
        return DepartureSummary(ell, local, dev, obs)

    def set_local_prior(self, centre):
        """Centre this small client's loading and local-lengthscale priors on the population's.

        A client with fewer than :data:`PILOT_POOL_POINTS` rows on the
        clients' typical scale gets, from the centre
        (:class:`DepartureSummary`), ``log ell_l,r ~ N(log ell_c, s^2)`` per
        local latent and input, and per output ``q`` it observed
        ``log sum_r B_l[q, r]^2 ~ N(log v_l,c[q], s^2)`` and
        ``log sum_r B_d[q, r]^2 ~ N(log v_d,c[q], s^2)``, ``s =``
        :data:`LOCAL_PRIOR_SD` (:meth:`log_prior`). Returns None (nothing sent).
        """
        if (not isinstance(centre, DepartureSummary) or self.n_samples >= PILOT_POOL_POINTS
                or not self._shares_local_prior()):
            return None
        sl = self.pack.slices
        obs = ~np.all(np.isnan(self._y), axis=0)
        entry = {}
        local = np.asarray(centre.local, dtype=float) * obs
        if "B_l" in sl and np.any(local > 0):
            entry["local"] = local
            entry["log_lengthscale"] = np.log(np.asarray(centre.lengthscale, dtype=float))
        if "B_d" in sl and centre.deviation is not None:
            dev = np.asarray(centre.deviation, dtype=float) * obs
            if np.any(dev > 0):
                entry["deviation"] = dev
        self.prior_local = {**(getattr(self, "prior_local", None) or {}), "loadings": entry}
        return None

    def log_prior(self, theta, config):
        """Log hyperprior of the client's own hyperparameters and its gradient (packed scale).

        The noise hyperprior of :meth:`StructuredClient.log_prior` and, for a
        client with fewer than :data:`PILOT_POOL_POINTS` rows that received
        the population's centre (:meth:`set_local_prior`), log-normal priors
        on its local lengthscales and on the per-output sizes of its
        loadings, ``v_q = sum_r B[q, r]^2 + eps`` (``eps =``
        :data:`LOADING_PRIOR_EPS`) for ``B = B_l`` and ``B = B_d``:
        ``-1/2 sum_q (log v_q - log c_q)^2 / s^2`` with gradient
        ``-(log v_q - log c_q) / s^2 * 2 B[q, r] / v_q``, ``s =``
        :data:`LOCAL_PRIOR_SD`; an output with centre 0 has none. The
        multi-output counterpart of the scalar clients' local variance
        prior: the local variance of output ``q`` is ``sum_r B_l[q, r]^2``
        (unit-variance latent kernels). Without it, a client with a handful
        of rows can switch its local part off and put all its departure in
        one direction of its deviation loadings, leaving the outputs outside
        that direction with a band narrower than the noise (docs/maths.md,
        section 12, "A small client's loadings"). Constant terms are
        dropped; ``noise_prior_scale=None`` switches all priors off.

        Returns
        -------
        value : float
        grad : ndarray of shape (P_i,)
        """
        value, grad = super().log_prior(theta, config)
        prior = (getattr(self, "prior_local", None) or {}).get("loadings")
        if (config.noise_prior_scale is None or not prior
                or self.n_samples >= PILOT_POOL_POINTS):
            return value, grad
        sl = self.pack.slices
        shapes = {name: shape for name, shape, _ in self.pack.spec}
        sd = LOCAL_PRIOR_SD
        if "log_lengthscale" in prior and "lengthscale_l" in sl:
            delta = (theta[sl["lengthscale_l"]].reshape(shapes["lengthscale_l"])
                     - prior["log_lengthscale"]) / sd
            value -= 0.5 * float(np.sum(delta**2))
            grad[sl["lengthscale_l"]] -= (delta / sd).ravel()
        for key, name in (("B_l", "local"), ("B_d", "deviation")):
            centre = prior.get(name)
            if centre is None or key not in sl:
                continue
            B = theta[sl[key]].reshape(shapes[key])
            v = np.sum(B**2, axis=1) + LOADING_PRIOR_EPS
            on = centre > 0
            delta = np.where(on, np.log(v) - np.log(np.where(on, centre, 1.0)), 0.0) / sd
            value -= 0.5 * float(np.sum(delta**2))
            grad[sl[key]] -= ((delta / sd * 2.0 / v)[:, None] * B).ravel()
        return value, grad

    def pilot(self, random_state):
        """Pilot exact GPs on each output's observed rows; medians over outputs.

        Also reports each output's pilot noise variance
        (:attr:`PilotSummary.noise_variance_outputs`).

        Returns
        -------
        PilotSummary or None
        """
        Y = self._y
        fits = []
        for q in range(Y.shape[1]):
            rows = ~np.isnan(Y[:, q])
            fits.append(pilot_fit(self._Xs[rows], Y[rows, q], random_state))
        # per output (standardised units; NaN where no pilot ran): initialise
        # converts them to the chosen noise model's own units
        self._pilot_noise = np.array([np.nan if p is None else p.noise_variance for p in fits])
        good = [p for p in fits if p is not None]
        if not good:
            return None
        ok = np.isfinite(self._pilot_noise)
        w = _target_noise_weights(self._y_scale, (Y.shape[1],))
        noise = float(np.median([p.noise_variance for p in good]))
        return PilotSummary(
            np.exp(np.median([np.log(p.lengthscale) for p in good], axis=0)),
            float(np.median([p.variance for p in good])),
            noise,
            float(np.median(self._pilot_noise[ok] / w[ok])),
            noise_variance_outputs=np.where(ok, self._pilot_noise, noise),
            noise_outputs_observed=ok.astype(float))

    def _own_covariance(self):
        """This client's output covariance (standardised units, pairwise complete)."""
        s = _multioutput_summary(self._Xs, self._y)
        return s.y_cov, s.y_sum / np.maximum(s.y_count, 1)

    def _own_variance(self):
        """Mean over outputs of this client's target variances (standardised units)."""
        d = np.diag(self._own_covariance()[0])
        return float(np.mean(d)) if np.any(d > 1e-12) else 0.0

    def initialise(self, config, M_local, theta_g, gpack, own, population, random_state):
        """Initial local vector of a multi-output client.

        Local inducing inputs and lengthscales as for scalar targets (every
        local latent function starts from the same lengthscales); loadings:
        the principal axes of the client's own output covariance
        (:func:`initial_loadings`), at full scale for the deviation (whose
        prior scale is ``phi``) and at ``sqrt(0.1)`` of it for the local part;
        noise: the pilot's (per output when ``noise="diagonal"``); constant
        mean: the client's mean of each output.
        """
        from ._ilmm import local_spec as ilmm_local_spec

        d = self._Xs.shape[1]
        Q = self._y.shape[1]
        R_g, R_d, R_l = config.n_latent
        p = own if own is not None else population
        cov, mean = self._own_covariance()
        values = {}
        M_l = 0
        if "local" in config.components:
            span = np.ptp(self._Xs, axis=0)
            if M_local is None:
                M_local = auto_inducing(p.lengthscale, span, per_lengthscale=AUTO_PER_LENGTHSCALE,
                                        minimum=min(AUTO_MIN_INDUCING, self.n_samples),
                                        maximum=min(AUTO_MAX_LOCAL, self.n_samples))
            ell = (start_lengthscale(p.lengthscale, span)
                   if config.local_lengthscale is None
                   else _default_lengthscale(config.local_lengthscale, self._x_scale, 0.0))
            ell = self._above_resolution(ell)
            ell = check_in_bounds("lengthscale_l", ell, config.local_lengthscale is not None,
                                  self.value_range("lengthscale_l"))
            values.update(lengthscale_l=np.tile(ell, (R_l, 1)),
                          B_l=np.sqrt(0.1) * initial_loadings(cov, R_l, random_state))
        if "deviation" in config.components:
            values["B_d"] = initial_loadings(cov, R_d, random_state + 1)
        self._noise_mode = config.noise
        values["noise_variance"] = self._initial_noise(config, cov, population, Q)
        if "local" in config.components:
            # a Sobol design of M_local points, not grown: on the paper's
            # scenario A (seeds 0-4) growing it to explain the local prior
            # gave RMSE / Oracle 1.172 on average against 1.139 without
            # (the multi-output local parts overfit with more points)
            values["Z_l"] = _local_inducing(self._Xs, M_local, random_state,
                                            pad=LOCAL_DESIGN_PAD * ell)
            M_l = values["Z_l"].shape[0]
        values["offset"] = np.asarray(mean, dtype=float)
        self.pack = ilmm_local_spec(config.components, M_l, d, Q, R_d, R_l, noise=config.noise)
        self.theta = self.pack.pack(values)
        self._decide_local_inducing(config)

    def _initial_noise(self, config, cov, population, Q):
        """Initial noise value(s), noise floor and hyperprior centre, in the packed units.

        Standardised units for ``"isotropic"`` and ``"diagonal"``; for
        ``"isotropic_target"`` the packed unit is ``mean(y_scale^2)`` (target
        variance), so output ``q``'s standardised pilot noise ``s_q`` counts
        as ``s_q / w_q``, the floor is that of the output with the largest
        weight, and the hyperprior centre is the median of the clients'
        values in that unit (:attr:`PilotSummary.noise_variance_target`).
        Every option starts from the median over the client's outputs (one
        value for every output with ``"diagonal"``). With ``"diagonal"`` the
        hyperprior centre is one value per output, the weighted median of the
        clients' pilot noise of that output
        (:attr:`_PopulationPilot.noise_variance_outputs`): the outputs'
        noise-to-scale ratios differ. A client with fewer than
        :data:`PILOT_POOL_POINTS` rows takes as the hyperprior's scale the
        larger clients' spread (:func:`ilmm_noise_spread`), at least
        :data:`NOISE_SPREAD_MIN` (``noise_prior_sd``; docs/maths.md, section
        12, "The noise of a small client, per output").
        """
        own_var = self.own_variance if self.own_variance > 0 else 1.0
        floor = NOISE_FLOOR * own_var
        hi = self._upper_bound("noise_variance")
        pilot = getattr(self, "_pilot_noise", None)
        ran = pilot is not None and pilot.shape == (Q,) and bool(np.any(np.isfinite(pilot)))
        if not ran:
            pilot = np.full(Q, population.noise_variance)
        ok = np.isfinite(pilot)  # outputs whose pilot ran
        own = pilot_median = float(np.median(pilot[ok]))
        if config.noise == "isotropic_target":
            w = _target_noise_weights(self._y_scale, (Q,))
            floor = floor / float(np.max(w))
            # the population centre: the median of the clients' own values in
            # this unit (PilotSummary.noise_variance_target)
            target = getattr(population, "noise_variance_target", None)
            own = float(np.median(pilot[ok] / w[ok])) if ran or target is None else target
            centre = own if target is None else target
        else:
            centre = population.noise_variance
            per = getattr(population, "noise_variance_outputs", None)
            if config.noise == "diagonal" and per is not None and np.shape(per) == (Q,):
                # one centre per output: the outputs' noise-to-scale ratios
                # differ (one standardised centre put an output of noise sd
                # 0.1 at 0.019 in target units, and a 5-row client's noise
                # followed it)
                centre = np.asarray(per, dtype=float)
        # a client clearly on a larger scale: the centre in its own units (prior_scale)
        centre = centre * prior_scale(self.own_variance, population,
                                      pilot_median if ran else None)
        self.noise_floor = floor
        self.prior_noise = (float(np.clip(centre, 2.0 * floor, hi)) if np.ndim(centre) == 0
                            else np.clip(centre, 2.0 * floor, hi))
        spread = getattr(population, "noise_spread", None)
        if (self.n_samples < PILOT_POOL_POINTS and spread is not None
                and np.ndim(self.prior_noise) == 1):
            # (measured around the per-output centres: "diagonal" only)
            # the larger clients' spread of their log noise variances around
            # the centre (a random effect; ilmm_noise_spread),
            # at least NOISE_SPREAD_MIN as for the pooled 1-D clients: five
            # values per output do not determine their own noise
            self.noise_prior_sd = float(max(spread, NOISE_SPREAD_MIN))
        if config.noise_variance is not None:  # target units
            ys2 = np.broadcast_to(np.asarray(self._y_scale, dtype=float) ** 2, (Q,))
            s2 = (float(config.noise_variance) / ys2 if config.noise == "diagonal"
                  else np.array([float(config.noise_variance) / float(np.mean(ys2))]))
            if np.any(s2 > hi):
                q = int(np.argmax(s2))
                raise ValueError(
                    f"noise_variance={config.noise_variance!r} (target units) is out of range: "
                    f"output {q} (scale {float(np.sqrt(ys2[q])):.4g}) would start at "
                    f"{float(s2[q]):.4g} times its variance, above {hi:g}")
        else:
            s2 = np.full(Q if config.noise == "diagonal" else 1, own)
        s2 = np.clip(np.maximum(s2, 2.0 * floor), floor * 1.01, hi * 0.99)
        return s2 if config.noise == "diagonal" else float(s2[0])

    def _forward(self, theta_g, gpack, config, theta=None):
        from ._ilmm import forward

        mode = getattr(self, "_noise_mode", None)
        if mode is not None and mode != config.noise:
            raise ValueError(
                f"client {self.client_id!r} was trained with noise={mode!r}; a warm start or "
                f"resumed run must keep it, got noise={config.noise!r}")
        self._noise_mode = config.noise
        return forward(self._Xs, self._y, gpack.unpack(theta_g), self._values(theta),
                       config.components, jitter=config.jitter, client=self.client_id)

    def _backward(self, state, mu, A_inv, *, want_global, want_local):
        from ._ilmm import backward

        grads = backward(state, self._Xs, self._y, mu, A_inv, want_global=want_global,
                         want_local=want_local)
        w = self.noise_weights()
        if w is not None and "noise_variance" in grads:  # chain rule to the one parameter
            grads["noise_variance"] = float(np.asarray(grads["noise_variance"]) @ w)
        return grads

    def finish(self, post, theta_g, gpack, config):
        """Posterior moments at the final vectors (:meth:`close` then forgets the data).

        Returns
        -------
        LocalHyperparameters
            With ``coregionalisation``: ``B[:, r] B[:, r]^T`` per latent
            function of the deviation and local parts (what a never-seen
            client's prior needs; the loadings themselves stay here).
        """
        from ._ilmm import offset_uncertainty, posterior

        if self._state is None:
            self.statistics(theta_g, gpack, config, post.round)
        mu_u, Sigma_u, H = posterior(self._state, post.mean, post.covariance)
        self.learn_local_inducing = self.learns_local_inducing(config)
        V_c, K_c, obs = offset_uncertainty(self._state, Sigma_u)
        self.posterior = {"mu_u": mu_u, "Sigma_u": Sigma_u, "H": H,
                          "offset_variance": V_c, "offset_gain": K_c, "offset_outputs": obs}
        L = self._values()
        coreg = {}
        for key, name in (("B_d", "deviation"), ("B_l", "local")):
            if key in L:
                coreg[name] = np.einsum("qr,pr->rqp", L[key], L[key])
        observed = (~np.all(np.isnan(self._y), axis=0)).astype(float)
        self.offset_observed = observed  # kept (a flag per output, no data) for prediction
        return LocalHyperparameters(L.get("lengthscale_l"), None, L["noise_variance"],
                                    L["offset"], coreg, observed,
                                    **self._trace_message(theta_g, gpack, config))
