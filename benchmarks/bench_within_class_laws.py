"""Other within-class laws and rank rules for MaxEvidenceClassifier, measured.

The default classifier (``curve_variation="ppca"``) scores a test curve by
``log N(x; xbar_c, (1 + 1/n_c) D_c (W_c W_c^T + s2_c I) D_c)`` (maximum
likelihood PPCA of the class's centred curves, one rank for all classes by
5-fold cross-validated accuracy). With one channel and no missing point this
law depends on the class's training curves only (the regressor's mean is
replaced by the sample mean, and the channel scale ``D_c`` cancels), so it is
computed here directly, without fitting the regressor; the "ml" rows
reproduce the classifier's accuracies. For several channels ``D_c`` is the
RMS of the class's residuals about its own mean, per channel.

Laws (each for a *new* curve, fitted the same way inside the rank's
cross-validation):

* ``ml`` -- the classifier's law.
* ``unbiased`` -- the sample covariance divided by ``n - 1`` instead of ``n``.
* ``oos`` -- out-of-sample variances: along each retained sample eigenvector
  and in the remainder, the variance a held-out curve has there, by
  leave-one-out (the held-out curve minus the others' mean, projected on the
  others' eigenvectors). ``v^T Sigma v`` is the variance that minimises the
  expected KL divergence of a new curve's law from the fitted one among laws
  with the sample eigenvectors (the Frobenius-loss oracle of Ledoit and Wolf
  2012, estimated by sample splitting in Lam 2016, NERCOME); it
  corrects the upward bias of the leading sample eigenvalues and the downward
  bias of the remainder when ``n_c`` is comparable to the rank.
* ``oos_eig`` / ``oos_rem`` -- only the eigenvalues, or only the remainder,
  out of sample.
* ``t_coord`` -- Student-t with ``n - 1`` degrees of freedom on each retained
  coordinate (unknown variance along a known direction, Jeffreys prior),
  Gaussian remainder.
* ``t_multi`` -- a multivariate t with ``n - 1`` degrees of freedom on the whole
  ``ml`` law.
* ``pooled`` -- one PPCA covariance for all classes (curves centred by class).

Printed per set: test accuracy (rank chosen) and, below it, the mean log
density of the test curves under their own class's law at that rank.

Rank rules (with the ``ml`` law): ``acc5`` (the classifier's: 5-fold accuracy,
ties to the largest held-out density of the curves under their own classes),
``acc_loo`` (leave-one-out accuracy, same ties), ``logloss5`` (5-fold held-out
log loss after a temperature fitted per rank).

Usage::

    python benchmarks/bench_within_class_laws.py --data-dir DIR [NAME[:CHANNELS] ...]

``DIR/<Name>/<Name>_TRAIN.ts`` and ``_TEST.ts``, UCR/UEA format, equal lengths.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import gammaln, logsumexp

from skfedgp.classifier import fold_order
from skfedgp.datasets import load_ucr_ts

LOG2PI = np.log(2 * np.pi)
LAWS = ("ml", "unbiased", "oos", "oos_eig", "oos_rem", "t_coord", "t_multi", "pooled")
RULES = ("acc5", "acc_loo", "logloss5")


def _spectrum(Rc, denom):
    n, p = Rc.shape
    _, sv, Vt = np.linalg.svd(Rc, full_matrices=False)
    lam = np.zeros(p)
    lam[: sv.size] = sv**2 / denom
    return lam, Vt


def _ml_laws(Rc, qmax, denom):
    """Variances along the sample eigenvectors and of the remainder, ranks 0..qmax
    (the classifier's ppca_fit with its floors), without the 1 + 1/n factor."""
    p = Rc.shape[1]
    lam, Vt = _spectrum(Rc, denom)
    total = lam.sum()
    E, S = np.zeros((qmax + 1, qmax)), np.zeros(qmax + 1)
    for q in range(qmax + 1):
        s2 = max((total - lam[:q].sum()) / (p - q), 1e-10 * total / p)
        s2f = max(s2, 1e-6)
        E[q, :q] = np.maximum(lam[:q] - s2, 0) + s2f
        S[q] = s2f
    return Vt[:qmax].T, E, S


def _oos_laws(R, qmax):
    """Leave-one-out variances of a held-out curve along the others' leading
    eigenvectors and in their remainder, rescaled from 1 + 1/(n-1) to 1 + 1/n
    and divided by 1 + 1/n (applied by the caller)."""
    n, p = R.shape
    proj2, rr = np.zeros((n, qmax)), np.zeros(n)
    for i in range(n):
        o = np.delete(R, i, 0)
        mo = o.mean(0)
        _, _, Vo = np.linalg.svd(o - mo, full_matrices=False)
        r = R[i] - mo
        k = min(qmax, Vo.shape[0])
        proj2[i, :k] = (Vo[:k] @ r) ** 2
        rr[i] = r @ r
    f = 1.0 / (1 + 1 / (n - 1))  # the held-out residual's variance is Sigma (1 + 1/(n-1))
    eta = proj2.mean(0) * f
    E, S = np.zeros((qmax + 1, qmax)), np.zeros(qmax + 1)
    for q in range(qmax + 1):
        E[q, :q] = np.maximum(eta[:q], 1e-6)
        S[q] = max((rr.mean() * f - eta[:q].sum()) / (p - q), 1e-6)
    return E, S


def class_law(Rs, qmax, law, pooled_law=None):
    """(mean, V, E, S, dof) of one class from its scaled curves ``Rs`` (n, p)."""
    n = Rs.shape[0]
    m = Rs.mean(0)
    if law == "pooled":
        V, E, S = pooled_law
    else:
        V, E, S = _ml_laws(Rs - m, qmax, n - 1 if law == "unbiased" else n)
        if law.startswith("oos"):
            E2, S2 = _oos_laws(Rs, qmax)
            if law in ("oos", "oos_eig"):
                E = E2
            if law in ("oos", "oos_rem"):
                S = S2
    f = 1 + 1 / n
    return m, V, E * f, S * f, n - 1


def logpdf(Rh, V, e, s, law, dof):
    p, q = Rh.shape[1], e.size
    P = Rh @ V[:, :q]
    rem = np.sum(Rh**2, 1) - np.sum(P**2, 1)
    logdet = (p - q) * np.log(s) + np.sum(np.log(e))
    if law == "t_multi":
        d2 = rem / s + np.sum(P**2 / e, 1)
        return (gammaln((dof + p) / 2) - gammaln(dof / 2) - p / 2 * np.log(dof * np.pi)
                - 0.5 * logdet - (dof + p) / 2 * np.log1p(d2 / dof))
    out = -0.5 * (rem / s + (p - q) * np.log(s) + (p - q) * LOG2PI)
    if law == "t_coord":
        return out + np.sum(gammaln((dof + 1) / 2) - gammaln(dof / 2)
                            - 0.5 * np.log(dof * np.pi * e)
                            - (dof + 1) / 2 * np.log1p(P**2 / (dof * e)), 1)
    return out - 0.5 * (np.sum(P**2 / e, 1) + np.sum(np.log(e)) + q * LOG2PI)


def scores(Xtr, y, Xh, K, scales, caps, law):
    """(n_ranks, n_h, K) log densities for ranks 0..max(caps), capped per class."""
    qmax = max(caps)
    pooled = None
    if law == "pooled":
        Rall = np.vstack([Xtr[y == k] / scales[k] - (Xtr[y == k] / scales[k]).mean(0)
                          for k in range(K)])
        pooled = _ml_laws(Rall, qmax, Rall.shape[0] - K)
    out = np.zeros((qmax + 1, Xh.shape[0], K))
    for k in range(K):
        Rs = Xtr[y == k] / scales[k]
        m, V, E, S, dof = class_law(Rs, caps[k], law, pooled)
        Rh = Xh / scales[k] - m
        for q in range(qmax + 1):
            qq = min(q, caps[k])
            out[q, :, k] = logpdf(Rh, V, E[qq, :qq], S[qq], law, dof) - np.sum(np.log(scales[k]))
    return out


def _choose(ll, own):
    correct = np.sum(np.argmax(ll, 2) == own[None], 1)
    fit = ll[:, np.arange(own.size), own].sum(1)
    best = np.flatnonzero(correct == correct.max())
    return int(best[np.argmax(fit[best])])


def _logloss(ll, own):
    def f(log_t):
        z = ll / np.exp(log_t)
        return -np.mean(z[np.arange(own.size), own] - logsumexp(z, 1))
    return minimize_scalar(f, bounds=(0, 25), method="bounded").fun


def select_rank(Xtr, y, K, scales, law, rule):
    p = Xtr.shape[1]
    if rule == "acc_loo":
        caps = [max(0, min(int((y == k).sum()) - 3, p - 1)) for k in range(K)]
        qmax = max(caps)
        ll = np.zeros((qmax + 1, y.size, K))
        for k in range(K):
            idx, others = np.flatnonzero(y == k), np.flatnonzero(y != k)
            sel = np.minimum(np.arange(qmax + 1), caps[k])
            one = np.zeros(idx.size, dtype=int)
            ll[:, others, k] = scores(Xtr[idx], one, Xtr[others], 1, [scales[k]], [caps[k]],
                                      law)[sel, :, 0]
            for j, i in enumerate(idx):
                rest = np.delete(idx, j)
                ll[:, [i], k] = scores(Xtr[rest], one[:-1], Xtr[[i]], 1, [scales[k]],
                                       [caps[k]], law)[sel, :, 0]
        return _choose(ll, y)
    members = [np.flatnonzero(y == k)[fold_order(Xtr[y == k])] for k in range(K)]
    kf = min([5] + [m.size for m in members])
    parts = [np.array_split(m, kf) for m in members]
    caps = [max(0, min(m.size - max(f.size for f in parts[k]) - 2, p - 1))
            for k, m in enumerate(members)]
    lls, owns = [], []
    for f in range(kf):
        held = np.concatenate([parts[k][f] for k in range(K)])
        tr = np.setdiff1d(np.arange(y.size), held)
        lls.append(scores(Xtr[tr], y[tr], Xtr[held], K, scales, caps, law))
        owns.append(y[held])
    ll, own = np.concatenate(lls, 1), np.concatenate(owns)
    if rule == "logloss5":
        return int(np.argmin([_logloss(ll[q], own) for q in range(ll.shape[0])]))
    return _choose(ll, own)


def load(data_dir, name, n_channels):
    Xtr, ytr = load_ucr_ts(Path(data_dir) / name / f"{name}_TRAIN.ts")
    Xte, yte = load_ucr_ts(Path(data_dir) / name / f"{name}_TEST.ts")
    if n_channels > 1:  # each channel standardised by its training mean and sd
        m = Xtr.shape[1] // n_channels
        C = Xtr.reshape(len(Xtr), n_channels, m)
        off, sc = C.mean(axis=(0, 2))[:, None], C.std(axis=(0, 2))[:, None]
        Xtr, Xte = (((X.reshape(len(X), n_channels, m) - off) / sc).reshape(len(X), -1)
                    for X in (Xtr, Xte))
    return Xtr, ytr, Xte, yte


def one_nn(Xtr, ytr, Xte):
    d = (Xte**2).sum(1)[:, None] + (Xtr**2).sum(1)[None, :] - 2 * Xte @ Xtr.T
    return ytr[np.argmin(d, axis=1)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("sets", nargs="*",
                    default=["GunPoint", "ItalyPowerDemand", "BasicMotions:6"])
    args = ap.parse_args(argv)
    cols = [f"{law}/acc5" for law in LAWS] + [f"ml/{r}" for r in RULES[1:]]
    print(f"{'set':18s} {'1-NN':>6s} " + " ".join(f"{c:>14s}" for c in cols))
    for spec in args.sets:
        name, _, nc = spec.partition(":")
        nc = int(nc or 1)
        Xtr, ytr, Xte, yte = load(args.data_dir, name, nc)
        classes, y = np.unique(ytr, return_inverse=True)
        K, pts = classes.size, Xtr.shape[1] // nc
        scales = []
        for k in range(K):
            Rc = Xtr[y == k] - Xtr[y == k].mean(0)
            rms = np.sqrt(np.mean(Rc.reshape(len(Rc), nc, pts) ** 2, axis=(0, 2)))
            scales.append(np.repeat(np.where(rms > 0, rms, 1.0), pts))
        caps_full = [max(0, min(int((y == k).sum()) - 2, Xtr.shape[1] - 1)) for k in range(K)]
        row, dens = [], []
        own = np.searchsorted(classes, yte)
        for c in cols:
            law, rule = c.split("/")
            q = select_rank(Xtr, y, K, scales, law, rule)
            caps = [min(q, cf) for cf in caps_full]
            ll = scores(Xtr, y, Xte, K, scales, caps, law)[max(caps)]
            row.append(f"{np.mean(classes[np.argmax(ll, 1)] == yte):8.3f} (q{q:2d})")
            dens.append(f"{np.mean(ll[np.arange(own.size), own]):14.1f}")
        acc_nn = np.mean(one_nn(*load(args.data_dir, name, 1)[:3]) == yte)
        print(f"{name:18s} {acc_nn:6.3f} " + " ".join(f"{r:>14s}" for r in row), flush=True)
        # the mean log density of the test curves under their own class's law
        print(f"{'  own-class logpdf':25s} " + " ".join(dens), flush=True)


if __name__ == "__main__":
    main()
