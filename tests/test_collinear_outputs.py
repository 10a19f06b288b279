"""Multi-output targets with two outputs that are one measurement.

A copied column (or one channel in two units) has the same noise as its
original: the model's independent noise per output reads it as a second
measurement. Found by fitting ``OperatorClustering`` on ``np.c_[y, y]``:
its clusters changed, and the regressor behind it had 25 % of held-out
errors beyond 3 std (RMSE 0.27 against 0.14 on ``y`` alone).
"""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skfedgp import CollinearOutputsWarning, FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression
from skfedgp.federated import _multioutput_summary, collinear_outputs


def _clients(rng, n_clients=4, n=12):
    X = rng.uniform(0, 5, (n_clients * n, 1))
    g = np.repeat(np.arange(n_clients), n)
    y = np.sin(X[:, 0]) + 0.3 * g + 0.05 * rng.standard_normal(len(g))
    return X, y, g


def _summaries(X, Y, g):
    return [_multioutput_summary(X[g == c], Y[g == c]) for c in np.unique(g)]


@pytest.mark.parametrize("copy", [lambda y: y, lambda y: 2.0 * y + 3.0, lambda y: -y])
def test_copies_up_to_an_affine_map_are_found(rng, copy):
    X, y, g = _clients(rng)
    other = np.cos(X[:, 0]) + 0.05 * rng.standard_normal(len(y))
    Y = np.c_[other, y, copy(y)]
    assert collinear_outputs(_summaries(X, Y, g)) == [(1, 2)]


def test_independent_noise_is_not_a_copy_and_partial_clients_are_not_counted(rng):
    """Two sensors of the same quantity with their own noise (correlation
    0.99) are two measurements: not flagged. A client missing values of
    either output is not counted; with no client left, nothing is flagged."""
    X, y, g = _clients(rng)
    Y = np.c_[y, y + 0.01 * rng.standard_normal(len(y))]
    assert collinear_outputs(_summaries(X, Y, g)) == []
    Y = np.c_[y, y]
    Y[g == 0, 1] = np.nan
    Y[np.flatnonzero(g == 1)[:2], 0] = np.nan
    Y[g == 2, 1] = rng.standard_normal((g == 2).sum())  # not a copy, but partly missing
    Y[np.flatnonzero(g == 2)[0], 1] = np.nan
    assert collinear_outputs(_summaries(X, Y, g)) == [(0, 1)]  # client 3 alone
    Y[g == 3, 1] = np.nan
    assert collinear_outputs(_summaries(X, Y, g)) == []
    assert collinear_outputs([_multioutput_summary(X[:2], np.c_[y, y][:2])]) == []  # 2 rows


def test_fit_with_a_copied_output_warns_and_the_paper_scenario_does_not(rng):
    X, y, g = _clients(rng)
    est = FederatedHierarchicalGPRegressor(n_rounds=3, random_state=0)
    with pytest.warns(CollinearOutputsWarning, match="outputs 0 and 1 are exact affine"):
        est.fit(X, np.c_[y, 10.0 * y], groups=g)
    X, Y, g, *_ = make_hierarchical_regression(
        n_clients=3, n_samples=20, n_outputs=3, scenario="A", n_test=5, random_state=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("error", CollinearOutputsWarning)
        FederatedHierarchicalGPRegressor(n_rounds=3, random_state=0).fit(X, Y, groups=g)
