"""Federated training of pFedHGP: clients, server, messages and rounds.

Raw observations and each client's local block stay inside its
:class:`Client`; the :class:`Server` only ever sees the message types below,
whose arrays have sizes fixed by the model (``M``, ``d``), never by a
client's number of observations ``n_i``.

One communication round (SPEC section 1, "Federated training"; pFedHGP paper,
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

import dataclasses
import time
import warnings
from dataclasses import dataclass

import numpy as np
from joblib import Parallel, delayed
from scipy.stats import qmc

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
from ._linalg import single_threaded_blas
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
]


# --------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------


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
    """

    n_samples: int
    y_sum: float
    y_centred_sumsq: float
    x_min: np.ndarray
    x_max: np.ndarray


@dataclass(frozen=True)
class InitBroadcast:
    """Set-up download: target standardisation and the initial global vector.

    Attributes
    ----------
    y_offset, y_scale : float
        Targets are standardised as ``(y - y_offset) / y_scale``.
    theta_global : ndarray of shape (P,)
        Initial global unconstrained vector.
    x_min, x_max : ndarray of shape (d,)
        Bounding box of all clients' inputs.
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
    precision : ndarray of shape (M, M)
        ``W_g^T W_g / s2_i``.
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
        Scalars are returned as 0-d arrays; absent (None) fields are left out.
    """
    return {
        f.name: np.asarray(getattr(msg, f.name))
        for f in dataclasses.fields(msg)
        if getattr(msg, f.name) is not None
    }


def message_nbytes(msg):
    """Payload size of a message in bytes.

    Parameters
    ----------
    msg : ClientSummary, InitBroadcast, GlobalBroadcast, ClientUpdate or ClientStatistics

    Returns
    -------
    nbytes : int
        Sum of the ``nbytes`` of its arrays (8 bytes per float64 number;
        Python scalars count as 8 bytes). This is what ``communication_``
        records.
    """
    return int(sum(a.nbytes for a in message_arrays(msg).values()))


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


#: With ``variational_update="closed_form"``, clients reset their own
#: variational factors to the exact optimum every this many local steps.
LOCAL_REFRESH = 5


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
    ell = np.asarray(value, dtype=float)
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

    # -- messages ---------------------------------------------------------
    def summary(self):
        """Aggregate statistics for the set-up exchange.

        Returns
        -------
        ClientSummary
            Count, sum and centred sum of squares of the targets and the
            per-feature bounding box of the inputs: ``3 + 2 d`` numbers,
            whatever ``n_i``.
        """
        return ClientSummary(
            n_samples=int(self.n_samples),
            y_sum=float(self._y.sum()),
            y_centred_sumsq=float(np.sum((self._y - self._y.mean()) ** 2)),
            x_min=self._X.min(axis=0),
            x_max=self._X.max(axis=0),
        )

    def initialise(self, init, config, random_state):
        """Set up the local block from the server's :class:`InitBroadcast`.

        Local inducing points are k-means centres of the client's own inputs
        (``sklearn.cluster.KMeans``), or a scrambled Sobol design over its own
        bounding box when it has fewer distinct inputs than ``M_i``; the
        variational factors start at the prior (``m = 0``, ``C = I``).

        Parameters
        ----------
        init : InitBroadcast
        config : ModelConfig
        random_state : int
            Seed of this client's initialisation.
        """
        from sklearn.cluster import KMeans

        self._y_std = (self._y - init.y_offset) / init.y_scale
        offset, scale = input_scaling(init.x_min, init.x_max)
        self._Xs = np.ascontiguousarray((self._X - offset) / scale)
        d = self._X.shape[1]
        M, Ml = config.n_inducing, config.n_inducing_local
        self.local_pack = local_spec(config.components, M, Ml, d)
        values = {}
        if "deviation" in config.components:
            values.update(m_d=np.zeros(M), C_d=np.eye(M))
        if "local" in config.components:
            n_unique = np.unique(self._Xs, axis=0).shape[0]
            if n_unique >= Ml:
                km = KMeans(n_clusters=Ml, n_init=1, random_state=random_state)
                Zl = km.fit(self._Xs).cluster_centers_
            else:
                lo, hi = self._Xs.min(axis=0), self._Xs.max(axis=0)
                hi = np.where(hi > lo, hi, lo + 1.0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    Zl = qmc.scale(
                        qmc.Sobol(d, scramble=True, seed=random_state).random(Ml), lo, hi
                    )
            ranges = scale
            values.update(
                m_u=np.zeros(Ml),
                C_u=np.eye(Ml),
                Z_l=Zl,
                lengthscale_l=_default_lengthscale(config.local_lengthscale, ranges, 0.05),
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
            if closed:
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
        self.global_pack = global_spec(config.components, config.n_inducing, d)
        self.theta_global = None
        self._adam = Adam(config.global_learning_rate)  # per-coordinate in initialise

    def initialise(self, summaries):
        """Standardisation and initial global block from the client summaries.

        Parameters
        ----------
        summaries : list of ClientSummary

        Returns
        -------
        InitBroadcast
        """
        n = sum(s.n_samples for s in summaries)
        if self.config.normalize_y:
            # pooled variance = within-client + between-client parts (Chan et al.)
            mean = sum(s.y_sum for s in summaries) / n
            m2 = sum(s.y_centred_sumsq + s.n_samples * (s.y_sum / s.n_samples - mean) ** 2
                     for s in summaries)
            var = max(m2 / n, 0.0)
            scale = float(np.sqrt(var)) if var > 1e-24 * max(1.0, mean**2) else 1.0
        else:
            mean, scale = 0.0, 1.0
        self.y_offset, self.y_scale = float(mean), float(scale)
        x_min = np.min([s.x_min for s in summaries], axis=0)
        x_max = np.max([s.x_max for s in summaries], axis=0)
        self.x_offset, self.x_scale = input_scaling(x_min, x_max)
        ranges = self.x_scale
        values = {}
        gp = self.global_pack
        if "Z_g" in gp.slices:
            M = self.config.n_inducing
            sob = qmc.Sobol(self.d, scramble=True, seed=self.random_state)
            with warnings.catch_warnings():  # balance needs a power of 2; not required here
                warnings.simplefilter("ignore", UserWarning)
                values["Z_g"] = sob.random(M)  # unit cube = scaled bounding box
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
        return InitBroadcast(self.y_offset, self.y_scale, self.theta_global.copy(), x_min, x_max)

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
            self.theta_global = self._adam.step(self.theta_global, grad)
        return float(elbo)

    def set_global_factor(self, statistics):
        """Set ``q(v_g)`` to its exact optimum from the clients' statistics.

        ``S_g = (I + sum_i W_i^T W_i / s2_i)^{-1}``,
        ``m_g = S_g sum_i W_i^T r_i / s2_i`` (SPEC section 1, "Beyond the
        paper"); the statistics were computed at the current global block,
        so the update is an exact coordinate-ascent step on the ELBO.

        Parameters
        ----------
        statistics : list of ClientStatistics
        """
        m, C = optimal_global_factor(
            np.sum([s.precision for s in statistics], axis=0),
            np.sum([s.shift for s in statistics], axis=0),
        )
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
    with Parallel(n_jobs=n_jobs) as parallel:
        for r in range(1, n_rounds + 1):
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
            if verbose:
                print(
                    f"[skfedgp] round {r:3d}/{n_rounds}  ELBO {elbo: .6e}  "
                    f"time {time.perf_counter() - t0:6.2f}s  "
                    f"up {communication[-1]['bytes_up']} B  down {communication[-1]['bytes_down']} B",
                    flush=True,
                )
    return clients, elbo_history, communication
