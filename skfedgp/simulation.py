"""Seeded discrete-event simulation of an asynchronous network of GP experts.

Experts are exact GPs (:class:`skfedgp.async_dgp._Expert`, incremental
Cholesky with a sliding window).  Time is counted in *iterations*: at
iteration ``t`` the centre receives the input ``x_t``, must output a
prediction of ``f(x_t)`` at once, and afterwards observes ``y_t``.  An idle
expert takes the current input, absorbs the observations sent to it since
its last job, predicts, and delivers its answer ``(x_t, mu, sigma)`` only
when its job finishes, so predictions arrive late and refer to past inputs
(Yang, Dai & Hirche, "Asynchronous Distributed Gaussian Process Regression
for Online Learning and Dynamical Systems", AAAI 2025, Fig. 1).

Delay model: a job of expert ``i`` holding ``n_i`` points lasts::

    (base_delay + delay_per_point * n_i) * speed_i * LogNormal(0, delay_spread)

iterations, with fixed per-expert speed factors ``speed_i ~ U(0.5, 2)``
(heterogeneous nodes); it is delivered at the first iteration at or after its
end, and never in the iteration it started.  All aggregation rules see the
same deliveries (one shared random stream).
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, column_or_1d

from .async_dgp import AGGREGATIONS, CONVENTIONS, InformationSet, _Expert, aggregate

__all__ = ["simulate_stream", "simulate_tracking", "reference_dynamics"]


class _Network:
    """Experts, their job queue, the information set and the latest answers."""

    def __init__(self, d, n_experts, hyper, max_points, delays, rng, max_info, convention,
                 rkhs_bound, lipschitz, beta):
        ell, sf2, sn2 = hyper
        self.ell = np.full(d, float(ell)) if np.ndim(ell) == 0 else np.asarray(ell, float)
        self.sf2 = float(sf2)
        self.M = n_experts
        self.experts = [_Expert(d, self.ell, sf2, sn2, max_points) for _ in range(n_experts)]
        self.base, self.per_point, self.spread = delays
        self.rng = rng
        self.speed = rng.uniform(0.5, 2.0, n_experts)
        self.busy_until = np.zeros(n_experts)
        self.pending = [None] * n_experts  # (x, mu, sigma) being computed
        self.latest = [None] * n_experts  # last delivered (x, mu, sigma)
        self.inbox = [[] for _ in range(n_experts)]
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

    def step(self, t, x, mean):
        """Deliver finished jobs, start new ones; returns the new deliveries."""
        new = []
        for i in range(self.M):
            if self.pending[i] is not None and self.busy_until[i] <= t:
                self.latest[i] = self.pending[i]
                new.append(self.pending[i])
                self.pending[i] = None
            if self.pending[i] is None:
                e = self.experts[i]
                for xo, yo in self.inbox[i]:
                    e.add(xo, yo)
                self.inbox[i].clear()
                mu, var = e.predict(x[None, :], mean)
                self.pending[i] = (x.copy(), float(mu[0]), float(np.sqrt(var[0])))
                dur = (self.base + self.per_point * e.n) * self.speed[i]
                dur *= self.rng.lognormal(0.0, self.spread)
                self.busy_until[i] = max(t + dur, t + 1)
        self.info.update(x, new)
        return new

    def predict(self, rule, x, mean):
        if rule == "async":
            return self.info.aggregate(x, mean)[0]
        got = [p for p in self.latest if p is not None]
        if not got:
            return mean
        mu = np.array([[p[1] for p in got]])
        var = np.array([[p[2] ** 2 for p in got]])
        return float(aggregate(mu, var, self.sf2, rule, mean)[0][0])


def _check_common(n_experts, aggregations, max_info, convention):
    if not isinstance(n_experts, numbers.Integral) or n_experts < 1:
        raise ValueError(f"n_experts must be an integer >= 1, got {n_experts!r}")
    if not isinstance(max_info, numbers.Integral) or max_info < 1:
        raise ValueError(f"max_info must be an integer >= 1, got {max_info!r}")
    for a in aggregations:
        if a not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {a!r}; expected one of {AGGREGATIONS}")
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")


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
    random_state=None,
):
    """Stream ``(X, y)`` through a simulated asynchronous network of experts.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Inputs in arrival order.
    y : array-like of shape (n,)
        Targets; ``y_t`` is observed after the prediction at ``x_t`` and sent
        to expert ``t mod n_experts``.
    n_experts : int, default=4
    aggregations : sequence of str, default=all six rules
        Rules to evaluate on the same deliveries.  Baselines combine the
        latest prediction each expert has delivered (made at a past input)
        as if it were made at ``x_t`` (SPEC section 3); "async" uses the
        information set (:class:`skfedgp.async_dgp.InformationSet`).
    max_info : int, default=10
        Capacity of the information set.
    lengthscale, variance, noise_variance : float or ndarray
        Fixed kernel hyperparameters of the experts (learn them beforehand,
        e.g. with :class:`skfedgp.AsyncDGPRegressor`, on separate data).
    max_points_per_expert : int or None, default=1000
        Sliding window of each expert.
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
    random_state : int, RandomState or None
        Seed of the delays and speed factors.

    Returns
    -------
    pandas.DataFrame
        Long format, one row per (iteration, aggregation): ``iteration``,
        ``aggregation``, ``prediction``, ``target``, ``smse`` (running mean of
        the squared errors up to this iteration divided by the variance of
        all targets ``y``).

    Raises
    ------
    ValueError
        For NaN/inf, inconsistent shapes, unknown rules or ``max_info < 1``.
    """
    X = check_array(X, dtype=float)
    y = column_or_1d(check_array(np.asarray(y).reshape(-1, 1), dtype=float))
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    aggregations = tuple(aggregations)
    _check_common(n_experts, aggregations, max_info, convention)
    rng = np.random.default_rng(check_random_state(random_state).randint(2**31))
    net = _Network(
        X.shape[1], n_experts, (lengthscale, variance, noise_variance), max_points_per_expert,
        (base_delay, delay_per_point, delay_spread), rng, max_info, convention, rkhs_bound,
        lipschitz, beta,
    )
    n, R = X.shape[0], len(aggregations)
    pred = np.empty((n, R))
    for t in range(n):
        x = X[t]
        net.step(t, x, prior_mean)
        for r, rule in enumerate(aggregations):
            pred[t, r] = net.predict(rule, x, prior_mean)
        net.inbox[t % n_experts].append((x, y[t]))
    err2 = (pred - y[:, None]) ** 2
    yvar = y.var() if y.var() > 0 else 1.0
    smse = np.cumsum(err2, axis=0) / np.arange(1, n + 1)[:, None] / yvar
    return pd.DataFrame(
        {
            "iteration": np.repeat(np.arange(n), R),
            "aggregation": np.tile(np.array(aggregations, dtype=object), n),
            "prediction": pred.ravel(),
            "target": np.repeat(y, R),
            "smse": smse.ravel(),
        }
    )


def reference_dynamics(x):
    """Unknown part ``f(x)`` of the control task (SPEC section 3).

    ``f(x) = 1 + x1 x2 / 10 + cos(x2) / 2 - 10 sin(5 x1) + 1 / (2 (1 +
    exp(-x2 / 10)))`` for ``x`` of shape (2,) or (n, 2); our reading of the
    garbled formula in Yang, Dai & Hirche (AAAI 2025), section "Simulation".
    """
    x = np.asarray(x, dtype=float)
    x1, x2 = x[..., 0], x[..., 1]
    return (1 + x1 * x2 / 10 + np.cos(x2) / 2 - 10 * np.sin(5 * x1)
            + 1 / (2 * (1 + np.exp(-x2 / 10))))


def simulate_tracking(
    *,
    dynamics=reference_dynamics,
    amplitude=1.0,
    frequency=1.0,
    gains=(2.0, 10.0),
    n_experts=4,
    aggregations=AGGREGATIONS,
    max_info=20,
    max_points_per_expert=100,
    lengthscale=(0.3, 1.0),
    variance=25.0,
    noise_variance=0.01,
    noise_std=0.1,
    dt=0.01,
    duration=10.0,
    sample_every=10,
    convention="paper",
    rkhs_bound=1.0,
    lipschitz=None,
    beta=None,
    base_delay=2.0,
    delay_per_point=0.1,
    delay_spread=0.5,
    n_runs=1,
    random_state=None,
):
    """Tracking control with a learned compensation (SPEC section 3).

    Plant ``x1' = x2, x2' = f(x) + u`` (Euler steps of ``dt``), reference
    ``x_r = a sin(w t)``, control ``u = x_r'' - f_hat(x) - l1 (x1 - x_r) -
    l2 (x2 - x_r')``.  Every ``sample_every`` steps the centre observes
    ``f(x) + N(0, noise_std^2)`` and sends it to the next expert (round robin);
    experts answer late as in :func:`simulate_stream` (delays in steps).
    Each rule controls its own copy of the plant, with the same initial state
    and the same delay and noise draws.

    Parameters
    ----------
    dynamics : callable
        ``f`` mapping an array of shape (2,) to a float.
    amplitude, frequency : float
        ``a`` and ``w`` of the reference.
    gains : tuple of two floats
        ``(l1, l2)``.
    n_runs : int, default=1
        Monte-Carlo runs (different seeds from ``random_state``).
    Others
        As in :func:`simulate_stream`; ``lengthscale``, ``variance`` and
        ``noise_variance`` are the experts' fixed hyperparameters.

    Returns
    -------
    pandas.DataFrame
        One row per (run, aggregation): ``run``, ``aggregation``,
        ``tracking_error`` (RMS of ``|x1 - x_r|`` over the run),
        ``prediction_error`` (RMS of ``f_hat(x) - f(x)``).
    """
    aggregations = tuple(aggregations)
    _check_common(n_experts, aggregations, max_info, convention)
    l1, l2 = gains
    seeds = check_random_state(random_state).randint(2**31, size=n_runs)
    steps = int(round(duration / dt))
    rows = []
    for run, seed in enumerate(seeds):
        for rule in aggregations:
            rng = np.random.default_rng(seed)
            x = np.array([0.0, amplitude * frequency]) + 0.1 * rng.standard_normal(2)
            net = _Network(
                2, n_experts, (np.asarray(lengthscale, float), variance, noise_variance),
                max_points_per_expert, (base_delay, delay_per_point, delay_spread), rng,
                max_info, convention, rkhs_bound, lipschitz, beta,
            )
            te, pe = 0.0, 0.0
            k_obs = 0
            for k in range(steps):
                t = k * dt
                xr = amplitude * np.sin(frequency * t)
                dxr = amplitude * frequency * np.cos(frequency * t)
                ddxr = -amplitude * frequency**2 * np.sin(frequency * t)
                net.step(k, x, 0.0)
                fh = net.predict(rule, x, 0.0)
                f = float(dynamics(x))
                te += (x[0] - xr) ** 2
                pe += (fh - f) ** 2
                u = ddxr - fh - l1 * (x[0] - xr) - l2 * (x[1] - dxr)
                if k % sample_every == 0:
                    net.inbox[k_obs % n_experts].append((x.copy(), f + noise_std * rng.standard_normal()))
                    k_obs += 1
                x = x + dt * np.array([x[1], f + u])
                if not np.all(np.isfinite(x)) or np.abs(x).max() > 1e6:
                    raise FloatingPointError(f"plant diverged under {rule!r} in run {run}")
            rows.append((run, rule, np.sqrt(te / steps), np.sqrt(pe / steps)))
    return pd.DataFrame(rows, columns=["run", "aggregation", "tracking_error", "prediction_error"])
