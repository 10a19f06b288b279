"""Does one unusual client harm the others? Client A's RMSE with and without it.

What is measured: two clients "A" and "B" of 40 points each of a smooth
function plus noise sd 0.05 (1-D: ``sin 6x`` on [0, 1]; 2-D: ``sin 4x0 cos
3x1`` on [0, 1]^2, ``default_rng(12)``), fitted at the regressor's defaults
(``random_state=0``), then fitted again with one more client of each kind
below. Printed per case: client A's RMSE against the true function on 200
random test inputs, its ratio to the fit without the extra client (target:
at most 1.2), the share of A's test inputs beyond 3 predictive std, the fit
time and any warnings.

Kinds (issue "one client must not harm the others"):

* target scale and level: a client "C" of 3 rows near a constant (at 0, 5
  or -1e4, spread 1e-4 or 1e-2), or of 20 rows of the same function at
  1e5 + 1e3 f or at 1e-4 f (another unit);
* input range: a client "D" of 15 points of the same function on a unit
  box far from the others (at 50, 1e3, 1e4, 1e5, -1e5); or a client "W" of
  30 points of the same function stretched over a box 10, 100 or 1000
  times wider, which holds A's and B's inputs in a sliver of it.

Usage::

    python benchmarks/bench_one_client_harm.py [--dims 1 2] [--kinds scale range]

A few seconds per fit; about two minutes in all.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor


def _functions(d):
    if d == 1:
        return lambda X: np.sin(6 * X[:, 0])
    return lambda X: np.sin(4 * X[:, 0]) * np.cos(3 * X[:, 1])


def _ab(d):
    rng = np.random.default_rng(12)
    f = _functions(d)
    X = rng.uniform(size=(80, d))
    y = f(X) + 0.05 * rng.normal(size=80)
    return X, y, np.array(["A"] * 40 + ["B"] * 40), f


def _fit(X, y, g):
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    return est, time.perf_counter() - t0, [f"{w.category.__name__}: {str(w.message)[:70]}"
                                           for w in caught]


def _score_a(est, f, d):
    Xt = np.random.default_rng(5).uniform(size=(200, d))
    m, s = est.predict(Xt, ["A"] * 200, return_std=True)
    e = m - f(Xt)
    return float(np.sqrt(np.mean(e**2))), float(np.mean(np.abs(e) > 3 * s))


def cases(kind, d, f):
    rng = np.random.default_rng(7)
    out = {}
    if kind == "scale":
        XC3, XC20 = rng.uniform(size=(3, d)), rng.uniform(size=(20, d))
        spread = np.array([0.0, 1.0, -1.0])
        out["C: 3 rows at 1e-4 * (0, 1, -1)"] = (XC3, 1e-4 * spread, "C")
        out["C: 3 rows at 1e-2 * (0, 1, -1)"] = (XC3, 1e-2 * spread, "C")
        out["C: 3 rows at 5 + 1e-4 * (0, 1, -1)"] = (XC3, 5 + 1e-4 * spread, "C")
        out["C: 3 rows at -1e4 + (0, 1, -1)"] = (XC3, -1e4 + spread, "C")
        out["C: 20 rows of 1e5 + 1e3 f"] = (XC20, 1e5 + 1e3 * f(XC20), "C")
        out["C: 20 rows of 1e-4 f (another unit)"] = (
            XC20, 1e-4 * f(XC20) + 1e-6 * rng.normal(size=20), "C")
    else:
        for where in (50.0, 1e3, 1e4, 1e5, -1e5):
            XD = rng.uniform(where, where + 1, size=(15, d))
            out[f"D: 15 rows on [{where:g}, {where:g} + 1]^{d}"] = (
                XD, f(XD - where) + 0.05 * rng.normal(size=15), "D")
        for width in (10.0, 100.0, 1000.0):
            # the same function stretched over a box `width` times wider,
            # which holds A's and B's inputs in a sliver of it
            U = rng.uniform(size=(30, d))
            out[f"W: 30 rows of f(x / {width:g}) on [0, {width:g}]^{d}"] = (
                width * U, f(U) + 0.05 * rng.normal(size=30), "W")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    p.add_argument("--kinds", nargs="+", default=["scale", "range"], choices=["scale", "range"])
    args = p.parse_args(argv)
    for d in args.dims:
        X, y, g, f = _ab(d)
        ref, sec, _ = _fit(X, y, g)
        r0, b0 = _score_a(ref, f, d)
        print(f"\n{d}-D: client A without an extra client: RMSE {r0:.4f}, "
              f"{100 * b0:.1f} % beyond 3 sd ({sec:.1f} s)")
        print(f"{'extra client':44s} {'A RMSE':>8s} {'ratio':>6s} {'>3 sd':>6s} {'time':>6s}")
        for kind in args.kinds:
            for name, (Xc, yc, lab) in cases(kind, d, f).items():
                try:
                    est, sec, warned = _fit(np.r_[X, Xc], np.r_[y, yc], np.r_[g, [lab] * len(yc)])
                except Exception as exc:  # report, go on with the next case
                    print(f"{name:44s} fit failed: {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                r, b = _score_a(est, f, d)
                flag = "" if r <= 1.2 * r0 else "  <- above 1.2x"
                print(f"{name:44s} {r:8.4f} {r / r0:6.2f} {100 * b:5.1f}% {sec:5.1f}s{flag}"
                      + (f"  [{'; '.join(warned[:2])}]" if warned else ""))


if __name__ == "__main__":
    main()
