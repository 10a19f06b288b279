"""Every warning of the package points at the caller's line (one policy).

A warning is attributed to the first frame outside ``skfedgp``: the user's
``fit``/``predict`` line for a direct call, a scikit-learn line for a call
through a ``Pipeline``. So ``warnings.filterwarnings(..., category=...)``
selects one kind everywhere, and the reported location is the call to change.
"""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import sklearn
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

import skfedgp
from skfedgp import ClientLabelWarning, FederatedHierarchicalGPRegressor
from skfedgp.datasets import make_hierarchical_regression
from skfedgp.federated import RoundSkippedWarning

PACKAGE = os.path.dirname(os.path.abspath(skfedgp.__file__))


def _data():
    return make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]


def _recorded(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, caught


def _of(caught, category):
    return [w for w in caught if issubclass(w.category, category)]


def test_fit_warnings_point_at_the_callers_line():
    X, y, g = _data()
    # one round: the round cap's ConvergenceWarning, issued at the end of fit
    # (with restart_from_global, after the runs it compares)
    for restart in (False, True):
        _, caught = _recorded(lambda: FederatedHierarchicalGPRegressor(
            n_rounds=1, random_state=0, restart_from_global=restart).fit(X, y, g))
        conv = _of(caught, ConvergenceWarning)
        assert conv, "the one-round fit should warn that it stopped at n_rounds"
        assert {w.filename for w in conv} == {__file__}
        # none of the fit's warnings is attributed inside the package
        assert not [w for w in caught if os.path.abspath(w.filename).startswith(PACKAGE)]


def test_a_script_run_from_inside_the_package_folder_is_the_caller():
    # frames are told apart by module name, not by path: code run with the
    # package's folder as working directory is still the user's
    code = (
        "import warnings\n"
        "from skfedgp import FederatedHierarchicalGPRegressor\n"
        "from skfedgp.datasets import make_hierarchical_regression\n"
        "X, y, g = make_hierarchical_regression(n_clients=3, n_samples=25, random_state=1)[:3]\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    FederatedHierarchicalGPRegressor(n_rounds=1, random_state=0).fit(X, y, g)\n"
        "print(sorted({w.filename for w in caught}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert out.strip() == "['<string>']"


def test_a_warning_from_the_training_loop_points_at_the_callers_line():
    X, y, g = _data()

    def hook(cid, method, r):
        if r == 2 and method == "statistics":
            raise TimeoutError("late")

    _, caught = _recorded(lambda: FederatedHierarchicalGPRegressor(
        n_rounds=3, random_state=0, fault_hook=hook).fit(X, y, g))
    skipped = _of(caught, RoundSkippedWarning)
    assert skipped and {w.filename for w in skipped} == {__file__}


def test_predict_warnings_point_at_the_callers_line():
    X, y, g = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(n_rounds=2, random_state=0).fit(X, y, g)
    for call in (lambda: est.predict(X[:5]),  # no groups with several clients
                 lambda: est.predict(X[:5], groups=["nobody"] * 5),
                 lambda: est.predict(X[:5], return_std=True),
                 lambda: est.score(X[:5], y[:5])):
        _, caught = _recorded(call)
        labels = _of(caught, ClientLabelWarning)
        assert labels and {w.filename for w in labels} == {__file__}


def test_a_category_filter_silences_a_kind_wherever_it_is_issued():
    X, y, g = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1,
                                         restart_from_global=True).fit(X, y, g)
    assert not _of(caught, ConvergenceWarning)


def test_through_a_pipeline_the_warning_points_at_scikit_learn():
    X, y, g = _data()
    Xg = np.column_stack([g, X])
    pipe = make_pipeline(FunctionTransformer(),
                         FederatedHierarchicalGPRegressor(n_rounds=1, random_state=0,
                                                          client_column=0))
    _, caught = _recorded(lambda: pipe.fit(Xg, y))
    conv = _of(caught, ConvergenceWarning)
    assert conv
    sk = os.path.dirname(os.path.abspath(sklearn.__file__))
    assert all(os.path.abspath(w.filename).startswith(sk) for w in conv)


@pytest.mark.parametrize("kind", ["flat", "duplicated"])
def test_set_up_warnings_point_at_the_callers_line(kind):
    X, y, g = _data()
    if kind == "flat":  # a client whose targets are constant
        y = y.copy()
        y[g == g[0]] = 1.0
    else:  # rows repeated many times over
        X, y, g = np.repeat(X, 4, axis=0), np.repeat(y, 4), np.repeat(g, 4)
    _, caught = _recorded(lambda: FederatedHierarchicalGPRegressor(
        n_rounds=2, random_state=0).fit(X, y, g))
    mine = [w for w in caught if w.category.__module__.startswith(("skfedgp", "sklearn"))
            or issubclass(w.category, UserWarning)]
    assert mine, f"the {kind} data should give at least one warning"
    assert {w.filename for w in mine} == {__file__}
