"""Seeded discrete-event simulation of an asynchronous network of GP experts.

Reproduces the protocol of Yang, Dai & Hirche, "Asynchronous Distributed
Gaussian Process Regression for Online Learning and Dynamical Systems",
AAAI 2025 (Fig. 1, section "Simulation Results"), as run on the authors'
platform GPgym (Dai & Yang, arXiv 2412.13276).  Point by point:

Iteration
    One sampling step of the centre.  At iteration ``t`` (time ``t``, in
    iterations) the centre receives the input ``x_t`` ("Get current state
    x(t) and send to all GP experts", Algorithm 1, line 2), collects the
    predictions delivered so far, and must output ``f_hat(x_t)`` at time
    ``t + decision_time``; ``y_t`` becomes known after that (test, then
    train).  In GPgym the centre sends ``x_t`` and reads its sockets
    immediately afterwards, so ``decision_time = 0`` (default): an answer
    computed at ``x_t`` can never be used at iteration ``t``.  With
    ``decision_time > 0`` a job shorter than that is delivered in the same
    iteration (an "on-time" prediction).
Experts' jobs (Fig. 1)
    "The temporal sequence of the learning process of each computational
    node i is characterized by discrete phases: a green block representing
    the time frame for receiving and allocating data set D_i at its own time
    t_i^k, and a blue block denoting the computational duration of the
    prediction".  An expert that becomes idle at time ``tau`` takes the
    latest input ``x_s`` (``s = floor(tau)``) if it has not worked on it yet,
    otherwise waits for the next input; it then *receives one streamed data
    point*, the latest labelled one ``(x_{s-1}, y_{s-1})`` ("each GP model
    receives streaming data after the prediction process is finished,
    leading to variations in their training data and predictions. However,
    the real-time streaming data comes from the same dataset"), predicts at
    ``x_s`` and delivers ``(x_s, mu, sigma)`` when the job ends.  So the
    experts' data sets grow with the number of jobs they completed (fast
    experts learn more), all from the one stream.
Duration of a job
    "variations in computation speeds among nodes result in distinct
    computational times, while discrepancies in data volume contribute to
    different processing times": a job of expert ``i`` holding ``n_i``
    points (after the new one) lasts::

        (base_delay + delay_per_point * n_i) * speed_i * LogNormal(0, delay_spread)

    iterations (continuous, no rounding), ``speed_i ~ U(0.5, 2)`` fixed per
    expert.  Early on, with little data, jobs are short.
Delivery
    A job ending at time ``tau_end`` is used at the first iteration ``t`` with
    ``tau_end <= t + decision_time``.  The delay draws come from their own
    random stream, so every aggregation rule sees identical deliveries.
Baselines
    As in GPgym's static aggregation, each expert has one slot holding its
    latest delivered prediction, combined as if made at ``x_t``; a slot not
    yet filled holds the prior ``(m, sigma_f^2)`` (GPgym initialises it so).
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, column_or_1d

from ._validation import check_count, check_real
from .async_dgp import AGGREGATIONS, CONVENTIONS, InformationSet, _Expert, aggregate

__all__ = ["simulate_stream", "simulate_tracking", "reference_dynamics"]


class _Network:
    """Experts, their jobs, the information set and the latest answers.

    Times are in iterations; see the module docstring for the protocol.
    """

    def __init__(self, d, n_experts, hyper, max_points, delays, rng, max_info, convention,
                 rkhs_bound, lipschitz, beta, decision_time=0.0):
        ell, sf2, sn2 = hyper
        self.ell = np.full(d, float(ell)) if np.ndim(ell) == 0 else np.asarray(ell, float)
        self.sf2 = float(sf2)
        self.M = n_experts
        self.experts = [_Expert(d, self.ell, sf2, sn2, max_points) for _ in range(n_experts)]
        self.base, self.per_point, self.spread = delays
        self.rng = rng
        self.decision_time = float(decision_time)
        self.speed = rng.uniform(0.5, 2.0, n_experts)
        self.free_at = np.zeros(n_experts)  # time the current job ends (or ended)
        self.last_input = np.full(n_experts, -1)  # iteration of the last job's input
        self.pending = [None] * n_experts  # (x, mu, sigma) being computed
        self.latest = [None] * n_experts  # last delivered (x, mu, sigma)
        self.log = []  # [expert, input iteration, start, end, delivery iteration or -1]
        self.job_row = [None] * n_experts
        sf = np.sqrt(self.sf2)
        if convention == "paper":
            L_f = 2.0 * rkhs_bound * self.sf2 * np.exp(-0.5) / self.ell.min()
            # Lemma 1 with |D| = max_points (the window), y^T K^-1 y >= 0 dropped: a
            # conservative constant fixed before any data arrive
            b = np.sqrt(rkhs_bound**2 + (max_points or 100))
        else:
            L_f, b = np.exp(-0.5) * self.sf2, 100.0
        self.lipschitz = L_f if lipschitz is None else float(lipschitz)
        self.beta = b if beta is None else float(beta)
        self.info = InformationSet(max_info, self.beta, sf, self.lipschitz, self.ell, convention)

    def _start(self, i, s, tau, X, Y, mean):
        """Expert ``i`` starts at time ``tau`` on input ``s`` (Fig. 1 green block)."""
        e = self.experts[i]
        if s >= 1:
            e.add(X[s - 1], Y[s - 1])  # latest labelled stream point
        mu, var = e.predict(X[s][None, :], mean)
        self.pending[i] = (np.array(X[s], dtype=float), float(mu[0]), float(np.sqrt(var[0])))
        dur = (self.base + self.per_point * e.n) * self.speed[i]
        dur *= self.rng.lognormal(0.0, self.spread)
        self.last_input[i] = s
        self.free_at[i] = tau + dur
        self.job_row[i] = len(self.log)
        self.log.append([i, s, tau, tau + dur, -1])

    def step(self, t, X, Y, mean):
        """Advance to the decision time of iteration ``t``; returns the new deliveries.

        ``X[:t + 1]`` are the inputs received so far; ``Y[:t]`` the labels
        known (``Y[t]`` is not read).
        """
        now = t + self.decision_time
        new = []
        while True:
            # next event: an expert starting (idle, newer input available) or delivering
            best, best_time = None, np.inf
            for i in range(self.M):
                if self.pending[i] is not None:
                    ev = self.free_at[i]
                else:
                    ev = max(self.free_at[i], self.last_input[i] + 1.0)
                if ev < best_time:
                    best, best_time = i, ev
            if best is None or best_time > now:
                break
            i = best
            if self.pending[i] is not None:
                self.latest[i] = self.pending[i]
                new.append(self.pending[i])
                self.pending[i] = None
                self.log[self.job_row[i]][4] = t
            else:
                s = min(int(np.floor(best_time)), t)
                self._start(i, s, best_time, X, Y, mean)
        self.info.update(X[t], new)
        return new

    def predict(self, rule, x, mean):
        if rule == "async":
            return self.info.aggregate(x, mean)[0]
        sf = np.sqrt(self.sf2)
        got = [p if p is not None else (None, mean, sf) for p in self.latest]
        mu = np.array([[p[1] for p in got]])
        var = np.array([[p[2] ** 2 for p in got]])
        return float(aggregate(mu, var, self.sf2, rule, mean)[0][0])


def _check_hyper(lengthscale, variance, noise_variance, d):
    """The experts' fixed hyperparameters must be positive and finite, the
    lengthscale a scalar or of shape ``(d,)``."""
    for name, v in (("lengthscale", lengthscale), ("variance", variance),
                    ("noise_variance", noise_variance)):
        a = np.asarray(v, dtype=float)
        if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise ValueError(f"{name} must be positive and finite, got {v!r}")
    if np.ndim(lengthscale) != 0 and np.shape(lengthscale) != (d,):
        raise ValueError(f"lengthscale must be a scalar or have shape ({d},) (one per input "
                         f"dimension), got shape {np.shape(lengthscale)}")


def _check_network(max_points_per_expert, delays, rkhs_bound, lipschitz, beta):
    """The experts' window, the delay model and the information set's constants."""
    check_count(max_points_per_expert, "max_points_per_expert", allow_none=True)
    for name, v in zip(("base_delay", "delay_per_point", "delay_spread"), delays):
        check_real(v, name, positive=False)
    check_real(rkhs_bound, "rkhs_bound")
    check_real(lipschitz, "lipschitz", allow_none=True)
    check_real(beta, "beta", allow_none=True)


def _check_common(n_experts, aggregations, max_info, convention, decision_time, hyper, d):
    """Checks shared by the simulations (inputs of ``d`` dimensions); returns
    ``aggregations`` as a tuple."""
    # one rule name is that rule ("rbcm", not ("r", "b", "c", "m"))
    aggregations = (aggregations,) if isinstance(aggregations, str) else tuple(aggregations)
    if not (isinstance(decision_time, numbers.Real) and np.isfinite(decision_time)
            and 0.0 <= decision_time < 1.0):
        raise ValueError(f"decision_time must be in [0, 1), got {decision_time!r}")
    check_count(n_experts, "n_experts")
    check_count(max_info, "max_info")
    for a in aggregations:
        if a not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {a!r}; expected one of {AGGREGATIONS}")
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
    _check_hyper(*hyper, d)
    return aggregations


def simulate_stream(
    X,
    y,
    *,
    n_experts=4,
    aggregations=AGGREGATIONS,
    max_info=10,
    lengthscale=1.0,
    variance=1.0,
    noise_variance=0.1,
    max_points_per_expert=1000,
    prior_mean=0.0,
    convention="paper",
    rkhs_bound=1.0,
    lipschitz=None,
    beta=None,
    base_delay=1.0,
    delay_per_point=0.005,
    delay_spread=0.5,
    decision_time=0.0,
    return_jobs=False,
    random_state=None,
):
    """Stream ``(X, y)`` through a simulated asynchronous network of experts.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Inputs in arrival order.
    y : array-like of shape (n,)
        Targets; ``y_t`` becomes known after the centre's prediction at
        ``x_t``; each expert takes the latest labelled point when it starts a
        job (module docstring).  The paper streams each data set's training
        split in its stored order ("the real-time streaming data comes from
        the same dataset").
    n_experts : int, default=4
    aggregations : str or sequence of str, default=all six rules
        Rules to evaluate on the same deliveries (one name: that rule).  Baselines combine the
        latest prediction each expert has delivered (made at a past input)
        as if it were made at ``x_t`` (docs/async_dgp.md); "async" uses the
        information set (:class:`skfedgp.async_dgp.InformationSet`).
    max_info : int, default=10
        Capacity of the information set.
    lengthscale : float or array-like of shape (d,), default=1.0
        Fixed (ARD) lengthscale(s) of the experts' kernel (learn the
        hyperparameters beforehand, e.g. with
        :class:`skfedgp.AsyncDGPRegressor`, on separate data).
    variance : float, default=1.0
        Fixed signal variance of the experts' kernel.
    noise_variance : float, default=0.1
        Fixed noise variance of the experts.
    max_points_per_expert : int or None, default=1000
        Sliding window of each expert (the paper's experts are LoG-GPs,
        whose cost grows like ``log N``; ours are exact GPs with a window).
    prior_mean : float, default=0.0
        Constant prior mean ``m``.
    convention : {"paper", "gpgym"}, default="paper"
        Constants of the async rule.  "paper": Euclidean distance, ``L_f =
        2 Gamma sigma_f^2 exp(-1/2) / min(ell)``, and ``beta = sqrt(Gamma^2 +
        max_points_per_expert)`` (Lemma 1 with the data term dropped, an upper
        bound fixed before data arrive; 100 points if no window).
        "gpgym": the authors' code, ``beta = 100``, ``L_f = exp(-1/2)
        sigma_f^2``, distance in lengthscale units.
    rkhs_bound, lipschitz, beta : float, optional
        ``Gamma``, ``L_f`` and ``beta``; the last two override the convention.
    base_delay, delay_per_point, delay_spread : float
        Delay model (module docstring), in iterations.
    decision_time : float in [0, 1), default=0.0
        Time, in iterations after ``x_t`` arrives, at which the centre
        aggregates.  0 is GPgym's server loop (send ``x_t``, then read the
        sockets at once): no prediction at ``x_t`` can be used at ``t``.
    return_jobs : bool, default=False
        Also return the experts' job log.
    random_state : int, RandomState or None
        Seed of the delays and speed factors.

    Returns
    -------
    pandas.DataFrame
        Long format, one row per (iteration, aggregation): ``iteration``,
        ``aggregation``, ``prediction``, ``target``, ``smse`` (running mean of
        the squared errors up to this iteration divided by the variance of
        all targets ``y``, as in GPgym's post-processing).
    jobs : pandas.DataFrame
        Only if ``return_jobs``: one row per expert job, ``expert``,
        ``input`` (iteration of the input predicted at), ``start``, ``end``
        (times, in iterations), ``delivered`` (iteration whose aggregation
        first used the answer; -1 if never delivered).

    Raises
    ------
    ValueError
        For NaN/inf, inconsistent shapes (``X`` not 2-D, ``y`` not 1-D or
        of another length), unknown rules, ``n_experts`` or ``max_info``
        not an integer >= 1, ``decision_time`` outside ``[0, 1)``, a
        lengthscale, variance or noise variance that is not positive and
        finite, a ``lengthscale`` array not of shape ``(d,)``,
        ``max_points_per_expert`` not an integer >= 1 (or None), a negative
        or non-finite delay parameter, a ``rkhs_bound``, ``lipschitz`` or
        ``beta`` that is not positive and finite, a non-finite
        ``prior_mean`` (or a bool when ``aggregations`` holds a baseline
        rule, which refuses it; checked before the stream starts), or a
        ``random_state`` that cannot seed a generator.
    TypeError
        If ``X`` is sparse or ``aggregations`` is neither a string nor an
        iterable.
    """
    X = check_array(X, dtype=float)
    if np.ndim(y) != 1 and not (np.ndim(y) == 2 and np.shape(y)[1] == 1):
        raise ValueError(f"y must be 1-D (one target per row of X), got shape {np.shape(y)}")
    y = column_or_1d(check_array(np.asarray(y).reshape(-1, 1), dtype=float))
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    aggregations = _check_common(n_experts, aggregations, max_info, convention, decision_time,
                                 (lengthscale, variance, noise_variance), X.shape[1])
    _check_network(max_points_per_expert, (base_delay, delay_per_point, delay_spread),
                   rkhs_bound, lipschitz, beta)
    if not (isinstance(prior_mean, numbers.Real) and np.isfinite(prior_mean)):
        raise ValueError(f"prior_mean must be a finite number, got {prior_mean!r}")
    refusing = [a for a in aggregations if a != "async"]
    if isinstance(prior_mean, bool) and refusing:
        # aggregate() refuses a bool prior mean: say so now, not at the first iteration
        raise ValueError(
            f"prior_mean must be a finite number, not a bool ({prior_mean!r}): the baseline "
            f"rules {refusing} refuse it (only 'async' would read it as {float(prior_mean)}); "
            "pass a float")
    rng = np.random.default_rng(check_random_state(random_state).randint(2**31))
    net = _Network(
        X.shape[1], n_experts, (lengthscale, variance, noise_variance), max_points_per_expert,
        (base_delay, delay_per_point, delay_spread), rng, max_info, convention, rkhs_bound,
        lipschitz, beta, decision_time,
    )
    n, R = X.shape[0], len(aggregations)
    pred = np.empty((n, R))
    for t in range(n):
        net.step(t, X, y, prior_mean)
        for r, rule in enumerate(aggregations):
            pred[t, r] = net.predict(rule, X[t], prior_mean)
    err2 = (pred - y[:, None]) ** 2
    yvar = y.var() if y.var() > 0 else 1.0
    smse = np.cumsum(err2, axis=0) / np.arange(1, n + 1)[:, None] / yvar
    df = pd.DataFrame(
        {
            "iteration": np.repeat(np.arange(n), R),
            "aggregation": np.tile(np.array(aggregations, dtype=object), n),
            "prediction": pred.ravel(),
            "target": np.repeat(y, R),
            "smse": smse.ravel(),
        }
    )
    if not return_jobs:
        return df
    jobs = pd.DataFrame(net.log, columns=["expert", "input", "start", "end", "delivered"])
    return df, jobs.astype({"expert": int, "input": int, "delivered": int})


def reference_dynamics(x):
    """Unknown part ``f(x)`` of the control task (docs/async_dgp.md).

    ``f(x) = 1 + x1 x2 / 10 + cos(x2) / 2 - 10 sin(5 x1) + 1 / (2 (1 +
    exp(-x2 / 10)))`` for ``x`` of shape (2,) or (n, 2); our reading of the
    garbled formula in Yang, Dai & Hirche (AAAI 2025), section "Simulation".

    Parameters
    ----------
    x : array-like of shape (2,) or (n, 2)
        State ``(x1, x2)`` (the last axis; further columns are ignored).

    Returns
    -------
    float or ndarray of shape (n,)
        ``f(x)``: a NumPy scalar for ``x`` of shape (2,).

    Raises
    ------
    ValueError
        If ``x`` cannot be converted to floats (e.g. strings).
    IndexError
        If the last axis of ``x`` has fewer than 2 entries.
    """
    x = np.asarray(x, dtype=float)
    x1, x2 = x[..., 0], x[..., 1]
    return (1 + x1 * x2 / 10 + np.cos(x2) / 2 - 10 * np.sin(5 * x1)
            + 1 / (2 * (1 + np.exp(-x2 / 10))))


def simulate_tracking(
    *,
    dynamics=reference_dynamics,
    amplitude=0.5,
    frequency=5.0,
    gains=(2.0, 10.0),
    n_experts=4,
    aggregations=AGGREGATIONS,
    max_info=20,
    max_points_per_expert=100,
    lengthscale=(0.3, 1.0),
    variance=25.0,
    noise_variance=0.01,
    noise_std=0.1,
    dt=0.02,
    duration=20.0,
    initial_state=None,
    convention="paper",
    rkhs_bound=1.0,
    lipschitz=None,
    beta=None,
    base_delay=2.0,
    delay_per_point=0.1,
    delay_spread=0.5,
    decision_time=0.0,
    n_runs=1,
    random_state=None,
):
    """Tracking control with a learned compensation (docs/async_dgp.md).

    Plant ``x1' = x2, x2' = f(x) + u``, reference ``x_r = a sin(w t)``,
    control ``u = x_r'' - f_hat - l1 (x1 - x_r) - l2 (x2 - x_r')`` (eq. 21).
    Protocol of the authors' GPgym control test (Yang, Dai & Hirche, AAAI
    2025, "Control Task"; Dai & Yang, arXiv 2412.13276): one iteration per
    control step of ``dt = 0.02`` s over 20 s; at every step the centre
    streams the state and a noisy sample ``f(x) + N(0, noise_std^2)`` ("the
    system states are utilized as training data"), aggregates, and holds
    ``f_hat`` constant while the plant is integrated over the step (one RK4
    step with ``u`` evaluated continuously, as GPgym's ``ode45`` call);
    reference ``a = 0.5, w = 5`` and ``x(0) ~ U(0, 1)^2`` are GPgym's
    defaults.  Experts work as in :func:`simulate_stream` (delays in steps).
    Each rule controls its own copy of the plant with the same initial state,
    observation noise and delay draws (separate random streams), so all rules
    see identical delivery times.

    Parameters
    ----------
    dynamics : callable
        ``f`` mapping an array of shape (2,) to a float.
    amplitude, frequency : float
        ``a`` and ``w`` of the reference.
    gains : tuple of two floats
        ``(l1, l2)``.
    initial_state : array-like of shape (2,) or None
        ``x(0)``; None draws it from ``U(0, 1)^2`` per run.
    lengthscale : float or array-like of shape (2,), default=(0.3, 1.0)
        Fixed (ARD) lengthscale(s) of the experts' kernel.
    decision_time : float in [0, 1), default=0.0
        As in :func:`simulate_stream`.
    n_runs : int, default=1
        Monte-Carlo runs (different seeds from ``random_state``).
    Others
        As in :func:`simulate_stream`; ``variance`` and ``noise_variance``
        are the experts' fixed hyperparameters.

    Returns
    -------
    pandas.DataFrame
        One row per (run, aggregation): ``run``, ``aggregation``,
        ``tracking_error`` (RMS over the run of ``||x - x_d||``, the norm of
        the full state error as GPgym's ``norm_e_set``), ``prediction_error``
        (RMS of ``f_hat(x) - f(x)``).

    Raises
    ------
    ValueError
        For bad rules, sizes, ``decision_time``, hyperparameters (not
        positive and finite; a ``lengthscale`` array not of length 2),
        ``dt``/``duration`` (not positive, or shorter than one step), the
        window, delay and information-set constants (as
        :func:`simulate_stream`), ``n_runs < 1``, ``gains`` not two finite
        numbers, a negative or non-finite ``amplitude``, ``frequency`` or
        ``noise_std``, an ``initial_state`` that is not finite or not of 2
        entries, or a ``random_state`` that cannot seed a generator.
    TypeError
        If ``dynamics`` is not callable or ``aggregations`` is neither a
        string nor an iterable.
    FloatingPointError
        If a plant diverges.
    """
    aggregations = _check_common(n_experts, aggregations, max_info, convention, decision_time,
                                 (lengthscale, variance, noise_variance), 2)
    _check_network(max_points_per_expert, (base_delay, delay_per_point, delay_spread),
                   rkhs_bound, lipschitz, beta)
    check_count(n_runs, "n_runs")
    if np.shape(gains) != (2,) or not np.all(np.isfinite(np.asarray(gains, dtype=float))):
        raise ValueError(f"gains must be two finite numbers (l1, l2), got {gains!r}")
    for name, v in (("amplitude", amplitude), ("frequency", frequency),
                    ("noise_std", noise_std)):
        check_real(v, name, positive=False)
    if initial_state is not None:
        x0 = np.asarray(initial_state, dtype=float)
        if x0.size != 2:
            raise ValueError(f"initial_state must be of shape (2,) (x1, x2), got shape "
                             f"{x0.shape}: {initial_state!r}")
        if not np.all(np.isfinite(x0)):
            raise ValueError(f"initial_state must be finite, got {initial_state!r}")
    for name, v in (("dt", dt), ("duration", duration)):
        if not (isinstance(v, numbers.Real) and np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    if duration < dt:
        raise ValueError(f"duration ({duration}) must be at least one step dt ({dt})")
    l1, l2 = gains
    seeds = check_random_state(random_state).randint(2**31, size=(n_runs, 2))
    steps = int(round(duration / dt))
    a, w = amplitude, frequency

    def ref(t):
        return (np.array([a * np.sin(w * t), a * w * np.cos(w * t)]),
                -a * w**2 * np.sin(w * t))

    def rhs(t, x, fh):
        xd, ddxr = ref(t)
        u = ddxr - fh - l1 * (x[0] - xd[0]) - l2 * (x[1] - xd[1])
        return np.array([x[1], float(dynamics(x)) + u])

    rows = []
    for run, (seed_delay, seed_noise) in enumerate(seeds):
        noise = np.random.default_rng(seed_noise)
        if initial_state is None:
            x0 = noise.uniform(0.0, 1.0, 2)
        else:
            x0 = np.asarray(initial_state, dtype=float).reshape(2)
        eps = noise_std * noise.standard_normal(steps)
        for rule in aggregations:
            net = _Network(
                2, n_experts, (np.asarray(lengthscale, float), variance, noise_variance),
                max_points_per_expert, (base_delay, delay_per_point, delay_spread),
                np.random.default_rng(seed_delay), max_info, convention, rkhs_bound,
                lipschitz, beta, decision_time,
            )
            X = np.empty((steps, 2))
            Y = np.empty(steps)
            x = x0.copy()
            te, pe = 0.0, 0.0
            for k in range(steps):
                t = k * dt
                X[k] = x
                net.step(k, X, Y, 0.0)
                fh = net.predict(rule, x, 0.0)
                f = float(dynamics(x))
                Y[k] = f + eps[k]
                xd, _ = ref(t)
                te += float(np.sum((x - xd) ** 2))
                pe += (fh - f) ** 2
                k1 = rhs(t, x, fh)
                k2 = rhs(t + dt / 2, x + dt / 2 * k1, fh)
                k3 = rhs(t + dt / 2, x + dt / 2 * k2, fh)
                k4 = rhs(t + dt, x + dt * k3, fh)
                x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
                if not np.all(np.isfinite(x)) or np.abs(x).max() > 1e6:
                    raise FloatingPointError(f"plant diverged under {rule!r} in run {run}")
            rows.append((run, rule, np.sqrt(te / steps), np.sqrt(pe / steps)))
    return pd.DataFrame(rows, columns=["run", "aggregation", "tracking_error", "prediction_error"])
