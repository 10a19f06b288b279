"""Time MaxEvidenceClassifier's scoring: 500 curves of 4 x 1201 points, 5 classes.

Fits a classifier on the stamping stand-in (the paper's 13.77 % split; a
small training budget, since only scoring is timed), then times
``log_evidence`` on 500 test curves. It also counts the regressor's
``predict(..., return_cov=True)`` calls and the Cholesky factorisations of
the 4804 x 4804 covariances, to show both happen once per class.

Target: under 30 s on 2 cores.

Usage::

    python benchmarks/bench_classifier.py [--n-jobs 2]
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import numpy as np

import skfedgp.classifier as clf_mod
from skfedgp import FederatedHierarchicalGPRegressor, MaxEvidenceClassifier
from skfedgp.classifier import default_curve_regressor
from skfedgp.datasets import make_stamping_waveforms


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-jobs", type=int, default=2)
    p.add_argument("--n-curves", type=int, default=500)
    args = p.parse_args(argv)

    X, y = make_stamping_waveforms(random_state=0)
    tr = np.concatenate([np.flatnonzero(y == c)[: 40 if c == 0 else 10] for c in range(5)])
    te = np.setdiff1d(np.arange(len(y)), tr)[: args.n_curves]
    reg = default_curve_regressor().set_params(n_rounds=1, local_steps=5)
    t0 = time.perf_counter()
    clf = MaxEvidenceClassifier(reg, n_channels=4, random_state=0, n_jobs=args.n_jobs)
    clf.fit(X[tr], y[tr])
    print(f"fit (1 round x 5 L-BFGS iterations, not the benchmark; includes the "
          f"within-class PPCA): {time.perf_counter() - t0:.1f} s")

    n_pred, n_chol = [0], [0]
    orig_predict = FederatedHierarchicalGPRegressor.predict
    orig_cho = clf_mod.cho_factor

    def counting_predict(self, *a, **k):
        n_pred[0] += 1
        return orig_predict(self, *a, **k)

    def counting_cho(A, *a, **k):
        if A.shape[0] == X.shape[1]:
            n_chol[0] += 1
        return orig_cho(A, *a, **k)

    with mock.patch.object(FederatedHierarchicalGPRegressor, "predict", counting_predict), \
            mock.patch.object(clf_mod, "cho_factor", counting_cho):
        t0 = time.perf_counter()
        ll = clf.log_evidence(X[te])
        dt = time.perf_counter() - t0
    print(f"scoring {len(te)} curves of {X.shape[1]} points against {len(clf.classes_)} "
          f"classes (n_jobs={args.n_jobs}): {dt:.1f} s")
    print(f"predict calls: {n_pred[0]}, full-size Cholesky factorisations: {n_chol[0]} "
          f"(classes: {len(clf.classes_)})")
    print(f"all finite: {bool(np.all(np.isfinite(ll)))}, target < 30 s: {dt < 30}")


if __name__ == "__main__":
    main()
