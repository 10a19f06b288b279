"""Default settings on cases a new user meets.

Seven cases, each at the regressor's defaults (``random_state=0``), printing
RMSE, mean Gaussian NLL, the share of test points beyond 3 predictive std
and the 95 % coverage:

* ``relevance``: d = 10 inputs, 4 of them relevant (``sin(3 u0) + u1^2 +
  0.5 u2 u3`` plus a client-specific slope), 5 clients x 100 training and 60
  test points, noise sd 0.1. References: scikit-learn's exact
  ``GaussianProcessRegressor`` (ARD RBF + white noise, 2 restarts) per
  client. A per-client pilot calls the weakly interacting inputs
  irrelevant; the starting lengthscales are capped at a few spans
  (``federated.start_lengthscale``) so the fit does not stop on a plateau.
* ``small-client``: clients of 40, 40 and 2 points of ``sin x + 0.3 k``
  (``k`` the client) plus noise sd 0.1, x in [0, 10], 100 test points each;
  the 2-point client's band must include the uncertainty of its estimated
  constant mean (``docs/maths.md`` section 13). References: an exact GP
  with the hierarchical kernel (``exact_hierarchical``: shared function,
  random client level, client deviation, hyperparameters by maximum
  likelihood) and the exact GP per client (degenerate on 2 points).
* ``data-poor``: 8 clients of 3-15 points of a shared 1-D function plus
  their own level and a smooth deviation (``a sin(w x + phase)``, ``a ~
  N(0, 0.3^2)``), noise sd 0.1; every other client sees only a window of
  width 4 in [0, 10], and every client is tested on all of [0, 10]. A
  known weakness on some seeds (e.g. ``--seeds 1 4 6``): the band is too
  narrow, while the exact GP with the same hierarchical kernel
  (``exact_hierarchical``, maximum likelihood) stays calibrated. Also shown:
  an exact GP pooled over all clients with the client as one-hot features
  (ARD; calibrated by wide bands, less accurate) and one per client.
* ``unequal-2d``: 5 clients of 15, 40, 80, 120 and 200 points, 2-D inputs
  in [-1.5, 1.5]^2, of ``sin(3 x0) cos(2 x1) + 0.5 x0`` plus each client's
  level (``N(0, 0.5^2)``) and departure ``a sin(2 x1 + b)`` (``a, b ~ N(0,
  0.3^2)``), noise sd 0.1, 200 test points per client. Reference: the exact
  GP pooled over all clients with one-hot client features; the 15-point
  client is also shown alone (docs/maths.md section 11, "A local part
  switched off early").
* ``five-point-2d``: three 2-D clients of 80 points and one of 5, each
  departing from ``sin(3 x0) cos(2 x1) + 0.5 x0`` by ``0.3 k sin(2 x1)``
  (``k`` the client, so the 5-point client departs most), noise sd 0.1,
  300 test points per client. References: the exact GP with the
  hierarchical kernel (``exact_hierarchical``) and the exact GP pooled with
  one-hot client features. The 5-point client takes the larger clients'
  local kernel as its prior from round 2 (docs/maths.md section 10).
* ``disjoint``: 4 clients of 40 points on the four quarters of [0, 10],
  each ``sin x + 0.2 x`` plus its own smooth departure (sd 0.1,
  lengthscale 3) and level (``N(0, 0.3^2)``), noise sd 0.1, every client
  tested at 100 points over all of [0, 10] (mostly where it has no data).
  The likelihood can hardly tell the levels from the shared function; on
  seed 2 they fall with ``x`` and, before the level variance had its
  hyperprior (docs/maths.md section 13), collapsed to 0 (35 % of the test
  points beyond 3 std). References: the exact GP pooled with one-hot client
  features and one per client.
* ``unseen``: 8 clients of 30 points on different levels (``N(0, 1)``) and
  with their own smooth deviations; each client in turn is left out and
  predicted as a never-seen client (its band must include the spread of the
  clients' levels; no exact-GP reference: an exact GP per client has
  nothing to say about a client it never saw).

Usage::

    python benchmarks/bench_new_user_cases.py [--case relevance small-client data-poor
        unequal-2d five-point-2d disjoint unseen]
        [--seeds 0 1 2 3]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from skfedgp import FederatedHierarchicalGPRegressor


def scores(y, mean, std):
    z = (y - mean) / std
    return {"RMSE": float(np.sqrt(np.mean((y - mean) ** 2))),
            "NLL": float(np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * z**2)),
            "beyond 3 sd": float(np.mean(np.abs(z) > 3)),
            "coverage 95": float(np.mean(np.abs(z) < 1.959964))}


def exact_per_client(X, y, g, Xt, gt):
    mean, std = np.empty(len(gt)), np.empty(len(gt))
    for c in np.unique(gt):
        k = ConstantKernel() * RBF(np.ones(X.shape[1])) + WhiteKernel()
        gp = GaussianProcessRegressor(k, normalize_y=True, n_restarts_optimizer=2,
                                      random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp.fit(X[g == c], y[g == c])
        mean[gt == c], std[gt == c] = gp.predict(Xt[gt == c], return_std=True)
    return mean, std


def relevance(seed):
    rng = np.random.default_rng(seed)
    d = 10
    parts = {"train": ([], [], []), "test": ([], [], [])}
    for c in range(5):
        for key, m in (("train", 100), ("test", 60)):
            u = rng.uniform(-1, 1, (m, d))
            f = np.sin(3 * u[:, 0]) + u[:, 1] ** 2 + 0.5 * u[:, 2] * u[:, 3] + 0.2 * c * u[:, 0]
            parts[key][0].append(u)
            parts[key][1].append(f + 0.1 * rng.standard_normal(m))
            parts[key][2].append(np.full(m, c))
    X, y, g = (np.concatenate(a) for a in parts["train"])
    Xt, yt, gt = (np.concatenate(a) for a in parts["test"])
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    sec = time.perf_counter() - t0
    rows = {"skfedgp defaults": scores(yt, *est.predict(Xt, gt, return_std=True)),
            "exact GP per client": scores(yt, *exact_per_client(X, y, g, Xt, gt))}
    return rows, f"fit {sec:.1f} s, {est.n_iter_} rounds, M = {est.n_inducing_}"


def unseen(seed):
    rng = np.random.default_rng(seed)
    K, n = 8, 30
    levels = rng.normal(0, 1.0, K)
    amp = rng.normal(0, 0.5, K)
    phase = rng.uniform(0, 6, K)
    X = rng.uniform(0, 10, (K * n, 1))
    g = np.repeat(np.arange(K), n)

    def f(x, c):
        return np.sin(x) + levels[c] + amp[c] * np.sin(0.7 * x + phase[c])

    y = f(X[:, 0], g) + 0.1 * rng.standard_normal(K * n)
    Xt = rng.uniform(0, 10, (200, 1))
    ys, ms, ss = [], [], []
    for hold in range(K):
        keep = g != hold
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = FederatedHierarchicalGPRegressor(random_state=0).fit(X[keep], y[keep], g[keep])
            m, s = est.predict(Xt, ["new"] * len(Xt), return_std=True)
        ys.append(f(Xt[:, 0], np.full(len(Xt), hold)) + 0.1 * rng.standard_normal(len(Xt)))
        ms.append(m)
        ss.append(s)
    rows = {"skfedgp, never-seen client": scores(np.concatenate(ys), np.concatenate(ms),
                                                 np.concatenate(ss))}
    return rows, f"{K} leave-one-client-out fits"


def small_client(seed):
    rng = np.random.default_rng(seed)
    X, y, g, Xt, yt, gt = [], [], [], [], [], []
    for c, n in enumerate([40, 40, 2]):
        x = rng.uniform(0, 10, (n, 1))
        xt = rng.uniform(0, 10, (100, 1))
        X.append(x)
        y.append(np.sin(x[:, 0]) + 0.3 * c + 0.1 * rng.standard_normal(n))
        g.append(np.full(n, c))
        Xt.append(xt)
        yt.append(np.sin(xt[:, 0]) + 0.3 * c + 0.1 * rng.standard_normal(100))
        gt.append(np.full(100, c))
    X, y, g, Xt, yt, gt = (np.concatenate(a) for a in (X, y, g, Xt, yt, gt))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    m, s = est.predict(Xt, gt, return_std=True)
    me, se = exact_per_client(X, y, g, Xt, gt)
    mh, sh = exact_hierarchical(X, y, g, Xt, gt)
    k = gt == 2
    rows = {"skfedgp, all clients": scores(yt, m, s),
            "skfedgp, 2-point client": scores(yt[k], m[k], s[k]),
            "exact hierarchical GP, all": scores(yt, mh, sh),
            "exact hierarchical, 2-point": scores(yt[k], mh[k], sh[k]),
            "exact GP per client, all": scores(yt, me, se),
            "exact GP, 2-point client": scores(yt[k], me[k], se[k])}
    return rows, f"{est.n_iter_} rounds"


def exact_pooled(X, y, g, Xt, gt):
    """Exact GP on all clients' rows with the client as one-hot features (ARD)."""
    labels = np.unique(g)

    def onehot(gg):
        return (np.asarray(gg)[:, None] == labels[None, :]).astype(float)

    A, At = np.hstack([X, onehot(g)]), np.hstack([Xt, onehot(gt)])
    k = ConstantKernel() * RBF(np.ones(A.shape[1])) + WhiteKernel()
    gp = GaussianProcessRegressor(k, normalize_y=True, n_restarts_optimizer=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp.fit(A, y)
    return gp.predict(At, return_std=True)


def exact_hierarchical(X, y, g, Xt, gt, n_starts=3):
    """Exact GP with the hierarchical kernel, hyperparameters by maximum likelihood.

    ``v_g k(x, x'; l_g) + [same client] (v_c + v_d k(x, x'; l_d)) + s2``:
    a shared function, each client's level as a random effect and its own
    deviation; isotropic squared-exponential ``k``, one noise variance. Dense
    NumPy (small data only); the like-for-like reference for the data-poor
    cases (L-BFGS-B on the log values from ``n_starts`` starts).
    """
    from scipy.optimize import minimize

    X, Xt = np.asarray(X, float), np.asarray(Xt, float)
    ym = float(np.mean(y))
    yc = np.asarray(y, float) - ym

    def sqd(A, B):
        return np.sum((A[:, None, :] - B[None, :, :]) ** 2, axis=-1)

    D, Dt, Dtt = sqd(X, X), sqd(Xt, X), sqd(Xt, Xt)
    S, St, Stt = (g[:, None] == g[None]), (gt[:, None] == g[None]), (gt[:, None] == gt[None])

    def kern(p, Dm, Sm):
        vg, lg, vc, vd, ld, _ = np.exp(p)
        return vg * np.exp(-Dm / (2 * lg**2)) + Sm * (vc + vd * np.exp(-Dm / (2 * ld**2)))

    def nlml(p):
        C = kern(p, D, S) + np.exp(p[5]) * np.eye(len(yc))
        try:
            L = np.linalg.cholesky(C)
        except np.linalg.LinAlgError:
            return 1e10
        a = np.linalg.solve(L, yc)
        return 0.5 * a @ a + np.sum(np.log(np.diag(L)))

    span = float(np.max(np.ptp(X, axis=0))) or 1.0
    v = float(np.var(yc)) or 1.0
    starts = [np.log([v, 0.2 * span, v, 0.1 * v, 0.2 * span, 0.1 * v]),
              np.log([v, 0.5 * span, 0.5 * v, 0.3 * v, 0.1 * span, 0.01 * v]),
              np.log([0.5 * v, 0.1 * span, v, 0.05 * v, 0.5 * span, 0.3 * v])][:n_starts]
    best = min((minimize(nlml, p0, method="L-BFGS-B") for p0 in starts), key=lambda r: r.fun)
    p = best.x
    C = kern(p, D, S) + np.exp(p[5]) * np.eye(len(yc))
    Ks = kern(p, Dt, St)
    mean = ym + Ks @ np.linalg.solve(C, yc)
    var = (np.diag(kern(p, Dtt, Stt)) + np.exp(p[5])
           - np.einsum("ij,ji->i", Ks, np.linalg.solve(C, Ks.T)))
    return mean, np.sqrt(np.maximum(var, 1e-12))


def data_poor(seed):
    rng = np.random.default_rng(seed)
    K = 8
    parts = {"train": ([], [], []), "test": ([], [], [])}

    def shared(x):
        return np.sin(1.3 * x) + 0.5 * np.cos(0.7 * x)

    for c in range(K):
        n = int(rng.integers(3, 16))
        level, amp = rng.normal(0, 1.0), rng.normal(0, 0.3)
        w, phase = rng.uniform(0.3, 1.0), rng.uniform(0, 6)
        lo = rng.uniform(0, 6) if c % 2 else 0.0  # every other client sees a window
        hi = lo + 4.0 if c % 2 else 10.0
        for key, x in (("train", rng.uniform(lo, hi, n)), ("test", rng.uniform(0, 10, 60))):
            parts[key][0].append(x[:, None])
            parts[key][1].append(shared(x) + level + amp * np.sin(w * x + phase)
                                 + 0.1 * rng.standard_normal(x.size))
            parts[key][2].append(np.full(x.size, c))
    X, y, g = (np.concatenate(a) for a in parts["train"])
    Xt, yt, gt = (np.concatenate(a) for a in parts["test"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    rows = {"skfedgp defaults": scores(yt, *est.predict(Xt, gt, return_std=True)),
            "exact hierarchical GP (ML)": scores(yt, *exact_hierarchical(X, y, g, Xt, gt)),
            "exact GP pooled (one-hot)": scores(yt, *exact_pooled(X, y, g, Xt, gt)),
            "exact GP per client": scores(yt, *exact_per_client(X, y, g, Xt, gt))}
    return rows, f"{len(y)} points, {est.n_iter_} rounds, phi_ = {est.phi_:.1e}"


def unequal_2d(seed):
    rng = np.random.default_rng(seed)
    sizes = [15, 40, 80, 120, 200]
    a = rng.normal(0, 0.3, (len(sizes), 2))
    level = rng.normal(0, 0.5, len(sizes))

    def make(ns):
        X = rng.uniform(-1.5, 1.5, (sum(ns), 2))
        g = np.repeat(np.arange(len(ns)), ns)
        f = np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.5 * X[:, 0]
        dev = a[g, 0] * np.sin(2 * X[:, 1] + a[g, 1]) + level[g]
        return X, f + dev + 0.1 * rng.standard_normal(len(g)), g

    X, y, g = make(sizes)
    Xt, yt, gt = make([200] * len(sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    mean, std = est.predict(Xt, gt, return_std=True)
    ref_mean, ref_std = exact_pooled(X, y, g, Xt, gt)
    small = gt == 0
    rows = {"skfedgp defaults": scores(yt, mean, std),
            "skfedgp, 15-point client": scores(yt[small], mean[small], std[small]),
            "exact GP pooled (one-hot)": scores(yt, ref_mean, ref_std),
            "exact pooled, 15-point": scores(yt[small], ref_mean[small], ref_std[small])}
    return rows, f"{est.n_iter_} rounds, M = {est.n_inducing_}"


def five_point_2d(seed):
    rng = np.random.default_rng(seed)
    sizes = [80, 80, 80, 5]

    def make(ns):
        X = rng.uniform(-1.5, 1.5, (sum(ns), 2))
        g = np.repeat(np.arange(len(ns)), ns)
        f = (np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.5 * X[:, 0]
             + 0.3 * g * np.sin(2 * X[:, 1]))
        return X, f + 0.1 * rng.standard_normal(len(g)), g

    X, y, g = make(sizes)
    Xt, yt, gt = make([300] * len(sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    mean, std = est.predict(Xt, gt, return_std=True)
    small = gt == 3
    rows = {"skfedgp defaults": scores(yt, mean, std),
            "skfedgp, 5-point client": scores(yt[small], mean[small], std[small])}
    for name, (m, s_) in (("exact hierarchical GP (ML)", exact_hierarchical(X, y, g, Xt, gt)),
                          ("exact GP pooled (one-hot)", exact_pooled(X, y, g, Xt, gt))):
        rows[name] = scores(yt, m, s_)
        rows[name.split(" (")[0] + ", 5-point"] = scores(yt[small], m[small], s_[small])
    centre = est.server_.local_prior_centre_
    return rows, (f"{est.n_iter_} rounds, local prior "
                  f"{f'variance {centre.variance:.3g}' if centre else 'none'}")


def disjoint_data(seed):
    """The ``disjoint`` case's data: ``X, y, g`` (160 rows), ``Xt, yt, gt`` and
    the noise-free test values ``ft`` (400 rows); ``X`` of shape (n, 1)."""
    rng = np.random.default_rng(seed)

    def departure():  # random Fourier features of an SE kernel, lengthscale 3, sd 0.1
        W = rng.normal(size=(200, 1)) / 3.0
        b = rng.uniform(0, 2 * np.pi, 200)
        a = rng.normal(size=200) * 0.1 * np.sqrt(2.0 / 200)
        return lambda x: np.cos(x[:, None] @ W.T + b) @ a

    funcs = []
    for _ in range(4):
        dev, level = departure(), 0.3 * rng.normal()
        funcs.append(lambda x, d=dev, c=level: np.sin(x) + 0.2 * x + d(x) + c)
    X, y, Xt, yt, ft = [], [], [], [], []
    for i, f in enumerate(funcs):
        x, xt = rng.uniform(2.5 * i, 2.5 * (i + 1), 40), rng.uniform(0, 10, 100)
        X.append(x)
        y.append(f(x) + 0.1 * rng.normal(size=40))
        ft.append(f(xt))
        yt.append(ft[-1] + 0.1 * rng.normal(size=100))
        Xt.append(xt)
    g, gt = np.repeat(np.arange(4), 40), np.repeat(np.arange(4), 100)
    return (np.concatenate(X)[:, None], np.concatenate(y), g, np.concatenate(Xt)[:, None],
            np.concatenate(yt), gt, np.concatenate(ft))


def disjoint(seed):
    X, y, g, Xt, yt, gt, _ = disjoint_data(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, g)
    rows = {"skfedgp defaults": scores(yt, *est.predict(Xt, gt, return_std=True)),
            "exact GP pooled (one-hot)": scores(yt, *exact_pooled(X, y, g, Xt, gt)),
            "exact GP per client": scores(yt, *exact_per_client(X, y, g, Xt, gt))}
    return rows, (f"{est.n_iter_} rounds, level_variance_ = {est.level_variance_:.3g}, "
                  f"phi_ = {est.phi_:.2g}")


CASES = {"relevance": relevance, "unseen": unseen, "small-client": small_client,
         "data-poor": data_poor, "unequal-2d": unequal_2d, "five-point-2d": five_point_2d,
         "disjoint": disjoint}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = p.parse_args(argv)
    for case in args.case:
        for seed in args.seeds:
            rows, info = CASES[case](seed)
            print(f"\n== {case}, seed {seed} ({info})")
            keys = list(next(iter(rows.values())))
            print(f"{'model':30s}" + "".join(f"{k:>14s}" for k in keys))
            for name, r in rows.items():
                print(f"{name:30s}" + "".join(
                    f"{r[k]:14.2%}" if k in ("beyond 3 sd", "coverage 95") else f"{r[k]:14.4f}"
                    for k in keys))


if __name__ == "__main__":
    main()
