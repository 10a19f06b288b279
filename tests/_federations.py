"""Synthetic federations shared by several test modules (not a test module)."""

import functools
import importlib.util
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=None)
def _benchmark(name):
    """``benchmarks/<name>.py`` of this repository, as a module."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def restart_benchmark_case(case, seed):
    """One case of ``benchmarks/bench_restart_from_global.py`` (its ``make_case``).

    The tests use the benchmark's generators themselves, so the two cannot
    drift apart (e.g. ``"dim20"``: 20 inputs of which 5 matter, one function
    shared by 3 clients; ``"dim15"``: 4 clients of 50 points in 15-D).

    Returns
    -------
    X, y, g, X_test, y_test, g_test : ndarray
    """
    return _benchmark("bench_restart_from_global").make_case(case, seed)


def noise_spread_case(case, seed):
    """One case of ``benchmarks/bench_noise_spread.py`` (its ``make_case``).

    Five clients of 12 points, ``case`` ``"integer"``, ``"continuous"``
    (one noise level, sd 0.3) or ``"mixed"`` (sd 0.1 to 1.0 across the
    clients), or the ``"beside-large"`` cases (the same beside three
    clients of 100 points; held-out points at the five small clients only);
    the tests use the benchmark's generator itself.

    Returns
    -------
    X, y, g, X_test, y_test, g_test : ndarray
        ``X`` and ``X_test`` of shape (n, 1).
    """
    return _benchmark("bench_noise_spread").make_case(case, seed)


def small_clients_nd_case(seed, n_clients, n, d):
    """One case of ``benchmarks/bench_small_clients_nd.py`` (its ``make_case``).

    ``n_clients`` clients of ``n`` rows (and 20 held-out rows each) on
    ``[0, 1]^d``: a shared random-Fourier function, each client's level and
    its own smooth departure, noise sd 0.1; the tests use the benchmark's
    generator itself.

    Returns
    -------
    X, y, g, X_test, y_test, g_test : ndarray
    """
    return _benchmark("bench_small_clients_nd").make_case(seed, n_clients, n, d)


def five_point_federation(seed=7, n_test=150):
    """Three 2-D clients of 80 points and one of 5 that departs most.

    Client ``k`` departs from the shared function by ``0.3 k sin(2 x2)``;
    noise sd 0.1. The same generator as ``five_point_2d`` in
    ``benchmarks/bench_new_user_cases.py`` (which cannot import tests).

    Returns
    -------
    X, y, g, X_test, y_test, g_test : ndarray
        Training rows (260, 2), (260,), (260,) and ``n_test`` test rows per client.
    """
    rng = np.random.default_rng(seed)
    sizes = [80, 80, 80, 5]

    def make(ns):
        X = rng.uniform(-1.5, 1.5, (sum(ns), 2))
        g = np.repeat(np.arange(len(ns)), ns)
        f = (np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.5 * X[:, 0]
             + 0.3 * g * np.sin(2 * X[:, 1]))
        return X, f + 0.1 * rng.standard_normal(len(g)), g

    X, y, g = make(sizes)
    Xt, yt, gt = make([n_test] * len(sizes))
    return X, y, g, Xt, yt, gt


def disjoint_case(seed):
    """The ``disjoint`` case of ``benchmarks/bench_new_user_cases.py`` (its ``disjoint_data``).

    Four clients of 40 points on the four quarters of [0, 10], each
    ``sin x + 0.2 x`` plus its own smooth departure and level
    (``N(0, 0.3^2)``), noise sd 0.1, each tested at 100 points over all of
    [0, 10].

    Returns
    -------
    X, y, g, X_test, y_test, g_test, f_test : ndarray
        ``X`` and ``X_test`` of shape (n, 1); ``f_test`` noise-free.
    """
    return _benchmark("bench_new_user_cases").disjoint_data(seed)
