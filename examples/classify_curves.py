"""Whole-curve classification with MaxEvidenceClassifier.

Two studies:

* **stamping** -- the synthetic press-tonnage stand-in
  (:func:`skfedgp.datasets.make_stamping_waveforms`: 4 channels x 1201
  points, 305 normal cycles and 69 per fault class) with the pFedHGP paper's
  split: the first 40 normal and 10 cycles per fault class for training
  (13.77 %), the remaining 86.23 % for testing, repeated over ``--seeds``.
* **ucr** -- GunPoint, ItalyPowerDemand and BasicMotions from the UCR/UEA
  archive (``.ts`` files under ``<data-dir>/ucr``), train/test splits as
  published, accuracy next to 1-NN Euclidean distance (computed here).

Every class is one client of a
:class:`~skfedgp.FederatedHierarchicalGPRegressor`; a test curve goes to the
class with the largest Gaussian predictive log-likelihood (full covariance).
Saves a confusion-matrix figure per study in ``--out-dir``.

Usage::

    python examples/classify_curves.py --study stamping --seeds 5
    python examples/classify_curves.py --study ucr --data-dir DATA_DIR

Run with ``--help`` for all options.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np

from skfedgp import FederatedHierarchicalGPRegressor, MaxEvidenceClassifier
from skfedgp.classifier import default_curve_regressor
from skfedgp.datasets import load_ucr_ts, make_stamping_waveforms

REPO = Path(__file__).resolve().parents[1]
UCR_SETS = (("GunPoint", 1), ("ItalyPowerDemand", 1), ("BasicMotions", 6))
#: Published 1-NN Euclidean accuracies (UCR archive).
PUBLISHED_1NN = {"GunPoint": 0.913, "ItalyPowerDemand": 0.955, "BasicMotions": 0.675}


def one_nn(Xtr, ytr, Xte):
    d = (Xte**2).sum(1)[:, None] + (Xtr**2).sum(1)[None, :] - 2 * Xte @ Xtr.T
    return ytr[np.argmin(d, axis=1)]


def confusion_figure(cm, labels, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 3.8))
    ax.imshow(cm, cmap="Blues")
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center",
                    color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_xticks(range(len(labels)), labels, rotation=45)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def without_variation(clf):
    """The same fitted classifier scored with the regressor's law only (eq. 31 as
    published, ``curve_variation="none"``), without refitting the regressor."""
    c = copy.copy(clf)
    c.curve_variation_ = None
    return c


def _budget(reg, args):
    upd = {k: v for k, v in (("n_rounds", args.n_rounds), ("local_steps", args.local_steps))
           if v is not None}
    return reg.set_params(**upd)


def stamping(args):
    from sklearn.metrics import confusion_matrix

    accs, accs0, cms = [], [], []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        X, y = make_stamping_waveforms(random_state=seed)
        tr = np.concatenate([np.flatnonzero(y == c)[: 40 if c == 0 else 10] for c in range(5)])
        te = np.setdiff1d(np.arange(len(y)), tr)
        # the classifier's default regressor (None), unless a budget is given
        reg = (None if args.n_rounds is None and args.local_steps is None
               else _budget(default_curve_regressor(), args))
        t0 = time.perf_counter()
        clf = MaxEvidenceClassifier(reg, n_channels=4, random_state=seed,
                                    n_jobs=args.n_jobs).fit(X[tr], y[tr])
        t1 = time.perf_counter()
        pred = clf.predict(X[te])
        t2 = time.perf_counter()
        acc = float(np.mean(pred == y[te]))
        acc0 = float(np.mean(without_variation(clf).predict(X[te]) == y[te]))
        accs.append(acc)
        accs0.append(acc0)
        cms.append(confusion_matrix(y[te], pred, labels=range(5)))
        print(f"seed {seed}: train {len(tr)} ({len(tr) / len(y):.2%}), test {len(te)}, "
              f"accuracy {acc:.4f} (regressor law only: {acc0:.4f}), fit {t1 - t0:.0f} s "
              f"({clf.estimator_.n_iter_} rounds), predict {t2 - t1:.0f} s", flush=True)
    print(f"stamping stand-in: accuracy mean {np.mean(accs):.4f}, min {np.min(accs):.4f} "
          f"over {args.seeds} seed(s); regressor law only: mean {np.mean(accs0):.4f}, "
          f"min {np.min(accs0):.4f}")
    confusion_figure(sum(cms), ["normal", "F1", "F2", "F3", "F4"],
                     f"stamping stand-in, {args.seeds} seed(s) summed",
                     Path(args.out_dir) / "classify_stamping_confusion.png")


def ucr(args):
    from sklearn.metrics import confusion_matrix

    root = Path(args.data_dir) / "ucr"
    if not root.is_dir():
        raise SystemExit(f"UCR folder {root} not found; pass --data-dir")
    print(f"{'data set':18s} {'pFedHGP':>8s} {'eq.31 only':>10s} {'1-NN (here)':>11s} "
          f"{'1-NN (published)':>16s} {'fit s':>6s}")
    for name, n_channels in UCR_SETS:
        Xtr, ytr = load_ucr_ts(root / name / f"{name}_TRAIN.ts")
        Xte, yte = load_ucr_ts(root / name / f"{name}_TEST.ts")
        n_points = Xtr.shape[1] // n_channels
        # the regressor's data-adaptive defaults (pilot GPs, n_inducing="auto")
        reg = _budget(FederatedHierarchicalGPRegressor(), args)
        t0 = time.perf_counter()
        clf = MaxEvidenceClassifier(reg, n_channels=n_channels, random_state=0,
                                    n_jobs=args.n_jobs).fit(Xtr, ytr)
        dt = time.perf_counter() - t0
        pred = clf.predict(Xte)
        acc = float(np.mean(pred == yte))
        acc0 = float(np.mean(without_variation(clf).predict(Xte) == yte))
        acc_nn = float(np.mean(one_nn(Xtr, ytr, Xte) == yte))
        print(f"{name:18s} {acc:8.3f} {acc0:10.3f} {acc_nn:11.3f} {PUBLISHED_1NN[name]:16.3f} "
              f"{dt:6.0f}", flush=True)
        cm = confusion_matrix(yte, pred, labels=clf.classes_)
        confusion_figure(cm, list(clf.classes_), f"{name}: accuracy {acc:.3f}",
                         Path(args.out_dir) / f"classify_{name}_confusion.png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", choices=("stamping", "ucr", "both"), default="both")
    p.add_argument("--data-dir", default=str(REPO / ".." / "shared" / "data"))
    p.add_argument("--out-dir", default=str(REPO / "docs"))
    p.add_argument("--seeds", type=int, default=5, help="number of seeds (stamping)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--n-rounds", type=int, default=None,
                   help="maximum rounds (default: the estimator's own)")
    p.add_argument("--local-steps", type=int, default=None,
                   help="L-BFGS iterations per local phase (default: the estimator's own)")
    p.add_argument("--n-jobs", type=int, default=None)
    args = p.parse_args(argv)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)  # before the long fits
    if args.study in ("stamping", "both"):
        stamping(args)
    if args.study in ("ucr", "both"):
        ucr(args)


if __name__ == "__main__":
    main()
