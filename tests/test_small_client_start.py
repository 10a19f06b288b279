"""Known weakness: a small client's local part can be switched off for good in the first rounds.

Not fixed (docs/maths.md, section 11, "Known weakness: a local part switched
off early"). Starting a small client's noise at its hyperprior's centre
instead of its interpolating pilot's value fixed the case below but switched
off the local part of a noise-free far client in
``test_client_scales.py::test_far_client_2d[10000.0]``, so it was not kept.
"""

import warnings

import numpy as np
import pytest

from skfedgp import FederatedHierarchicalGPRegressor


def _federation(seed=777001):
    # five 2-D clients of 15-200 points around one function; the 15-point
    # client departs from it far more than the others (amplitude 0.65 of a
    # sine along x2 and a level of -1.2, against 0.04-0.16 for the others)
    rng = np.random.default_rng(seed)
    sizes = [15, 40, 80, 120, 200]
    a = rng.normal(0, 0.3, (5, 2))
    off = rng.normal(0, 0.5, 5)

    def make(ns):
        X = rng.uniform(-1.5, 1.5, (sum(ns), 2))
        g = np.repeat(np.arange(5), ns)
        f = np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.5 * X[:, 0]
        dev = a[g, 0] * np.sin(2 * X[:, 1] + a[g, 1]) + off[g]
        return X, f + dev + 0.1 * rng.standard_normal(len(g)), g, f + dev

    X, y, g, _ = make(sizes)
    Xt, _, gt, ft = make([100] * 5)
    return X, y, g, Xt, gt, ft


@pytest.mark.xfail(strict=True, reason="known weakness, not fixed: the 15-point client's "
                   "local part is switched off in round 1 from its interpolating pilot noise "
                   "(RMSE 0.39; 0.11 from a better start; docs/maths.md section 11)")
def test_small_client_with_a_large_departure_keeps_its_local_part():
    X, y, g, Xt, gt, ft = _federation()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=777001).fit(X, y, g)
    mean = est.predict(Xt, gt)
    k = gt == 0
    rmse_small = float(np.sqrt(np.mean((mean[k] - ft[k]) ** 2)))
    # from the interpolating start its local part switched off and the
    # departure became noise: RMSE 0.38 against the clean function; now 0.05
    assert rmse_small < 0.15, rmse_small
    values = est.clients_[0].pack.unpack(est.clients_[0].theta)
    assert float(np.ravel(values["variance_l"])[0]) > 0.05
