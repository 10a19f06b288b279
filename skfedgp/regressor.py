"""scikit-learn estimator for personalised federated hierarchical GP
regression (pFedHGP).

Source: H. Yan, "Personalized Federated Hierarchical Gaussian Processes for
Privacy-Preserving Modeling of Heterogeneous Distributed Systems", arXiv
preprint arXiv:2609.19337 (2026), sections 3.1–3.7; the choices the paper
leaves open are written down in ``docs/maths.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import os
import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import (
    check_array,
    check_is_fitted,
    check_X_y,
    column_or_1d,
    validate_data,
)

from ._hierarchy import COMPONENTS, predict_client
from ._linalg import nonnegative_variance
from ._parallel import single_threaded_blas
from ._structured import (
    feature_blocks,
    layout_map,
    predict_structured,
    residual_coefficients,
    test_features,
)
from ._validation import (
    ClientLabelWarning,
    _listing,
    _object_array,
    check_bool,
    check_groups,
    check_label_types,
    check_not_strings,
    check_n_jobs,
    check_real,
    keep_state_on_error,
    label_source,
    labels_from_column,
    match_labels,
    r2_observed,
    split_client_column,
    unique_labels,
    unmask,
    user_stacklevel,
    validate_predict_input,
    warn_groups_missing,
)
from .federated import (
    _default_lengthscale,
    LOG_BOUNDS,
    NULL_MARGIN,
    START_MAX_SPANS,
    Client,
    ModelConfig,
    Server,
    TrainingState,
    cap_inducing,
    check_participation,
    check_run_setup,
    check_same_model,
    learns_inducing,
    run_federated_training,
    pilot_memo,
    run_structured_training,
    shared_scale,
    start_lengthscale,
    warm_start_state,
)
from .kernels import se_ard

__all__ = ["FederatedHierarchicalGPRegressor", "ClientLabelWarning", "SharedPartsOffWarning",
           "SparseApproximationWarning", "CollinearOutputsWarning"]

#: Smallest number of observations a client must hold.
MIN_SAMPLES_PER_CLIENT = 2

#: Largest joint predictive covariance ``predict(..., return_cov=True)``
#: builds, in bytes of the ``n x n`` float64 result (2 GiB: 16 384 rows).
#: Computing it takes a few times this much at peak; above the budget
#: ``predict`` raises :class:`MemoryError` before allocating anything.
#: Assign another value to this module attribute to change the budget.
MAX_COV_BYTES = 2 * 1024**3

#: Rows per chunk of ``predict`` (without ``return_cov``) and
#: ``predict_components``: a client's test rows are predicted this many at a
#: time, so the intermediate ``n x M`` kernel matrices stay bounded and the
#: memory beyond the outputs does not grow with the number of test rows.
PREDICT_CHUNK_ROWS = 4096

#: ``tol=None``: the stopping rule's relative tolerance with 1-D targets ...
TOL = 1e-4
#: ... and with multi-output targets (see the ``tol`` parameter).
MULTIOUTPUT_TOL = 3e-3


def _warn_below_null(est, server):
    """ConvergenceWarning when the mean-field fit ends far below white noise.

    The final ELBO more than :data:`~skfedgp.federated.NULL_MARGIN` nats per
    observation below :func:`~skfedgp.federated.null_log_likelihood` (the
    clients' targets as independent noise about their own means, or the
    pooled mean for a model without client parts) means a failed fit: in
    practice Adam steps too large for the problem, which oscillate or
    diverge without raising, or far too few rounds. Not after
    ``n_rounds=0`` (nothing was trained).
    """
    null = getattr(server, "null_log_likelihood", None)
    n = getattr(server, "n_total", None)
    final = float(est.elbo_history_[-1])
    if null is None or not n or est.n_iter_ == 0 or final >= null - NULL_MARGIN * n:
        return
    about = ("each client's own mean" if getattr(server, "null_own_means", True)
             else "their pooled mean")
    warnings.warn(
        f"the final ELBO, {final:.6g}, is {(null - final) / n:.3g} nats per observation below "
        f"the log likelihood of the targets as white noise about {about}, {null:.6g} "
        "(standardised units): the fit failed. Usual causes: Adam steps too "
        f"large for these data (learning_rate={est.learning_rate:g}, "
        f"global_learning_rate={est.global_learning_rate:g}: lower them) or too few rounds "
        f"(n_rounds={est.n_rounds}); or use the default variational_family='structured'",
        ConvergenceWarning, stacklevel=user_stacklevel())


def _warn_diagnostics(est, converged, n_rounds):
    """ConvergenceWarning when the budget ended first or a value sits at a bound.

    The tolerance named is the fit's (``tol=None`` resolved at fit).
    """
    tol = getattr(est, "_tol", None)
    if tol is None:
        tol = est.tol
    if not converged and n_rounds > 0:
        warnings.warn(
            f"training stopped after n_rounds={n_rounds} rounds before the ELBO converged "
            f"(tol={tol if tol is None else format(tol, 'g')}); increase n_rounds or tol",
            ConvergenceWarning, stacklevel=user_stacklevel())
    at = []
    why = {
        ("noise_variance", "lower"): (
            f"a noise variance at its floor, {LOG_BOUNDS['noise_variance'][0]:g} times the "
            "client's own target variance, means nearly noise-free data (or duplicated rows)"),
        ("lengthscale", "lower"): (
            f"a lengthscale at its lower bound, {LOG_BOUNDS['lengthscale_g'][0]:g} of the input "
            "range (of the narrowest client's, for the global part; of the client's own, for "
            "a local part), means targets that change faster than the inputs resolve (e.g. "
            "equal inputs with different targets)"),
        ("level_variance", "upper"): (
            "the level variance at its upper bound means clients' levels spread more "
            "than its range (e.g. a warm start or a resumed checkpoint whose first fit "
            "saw levels closer together): refit from scratch"),
        ("noise_variance", "upper"): (
            "a noise variance at its upper bound means the model explains almost nothing "
            "of that client's targets (e.g. a warm start or a resumed checkpoint whose "
            "first fit saw targets in other units or on levels far from these): refit "
            "from scratch"),
    }
    reasons = []

    def check(values, names, where="", value_range=None, resolution=None):
        for name in names:
            if name not in values:
                continue
            lo, hi = LOG_BOUNDS[name] if value_range is None else value_range(name)
            v = np.atleast_1d(values[name])
            at_lo = v <= lo * (1 + 1e-6)
            if resolution is not None and name == "lengthscale_l":
                # a local lengthscale at the client's resolution floor
                # (federated.resolution_floor): the data cannot tell it from
                # a shorter one, a regular outcome on inputs on a grid
                at_lo = at_lo & ~(np.asarray(resolution) >= np.asarray(lo) * (1 - 1e-12))
            low = bool(np.any(at_lo))
            high = bool(np.any(v >= hi * (1 - 1e-6)))
            kind = "lengthscale" if name.startswith("lengthscale") else name
            # documented outcomes, not failures: a variance (or phi, or the
            # level variance: one level for all) at its lower bound is a
            # component the evidence switched off (its
            # lengthscale is then irrelevant); a lengthscale at its upper
            # bound is an input switched off (automatic relevance determination)
            if low and name.startswith(("variance", "phi", "level_variance")):
                return
            # phi at its upper bound: the deviations (variance phi var_g) carry
            # what the clients have, the shared part (var_g) is switched off
            # relative to them; only phi var_g is then identified
            if high and name == "phi":
                return
            if high and kind == "lengthscale" and not low:
                continue
            if low or high:
                side = "lower" if low else "upper"
                at.append(f"{name}{where} ({side} bound)")
                text = why.get((kind, side))
                if text and text not in reasons:
                    reasons.append(text)

    G = est.server_.global_pack.unpack(est.server_.theta_global)
    check(G, ("variance_g",))
    check(G, ("lengthscale_g",), value_range=lambda name: est.server_.lengthscale_range())
    check(G, ("phi",))
    check(G, ("level_variance",), value_range=lambda name: est.server_.level_range())
    for lab, c in est.clients_.items():
        B = dict(c.local_values())
        if getattr(c, "noise_weights", None) is not None and c.noise_weights() is not None:
            # the floor and the range bound the one packed value, not the per-output ones
            B["noise_variance"] = c.pack.unpack(c.theta)["noise_variance"]
        value_range = getattr(c, "value_range", None)  # the client's own floor and range
        check(B, ("variance_l", "lengthscale_l"), f" of client {lab!r}", value_range,
              getattr(c, "_resolution", None))
        check(B, ("noise_variance",), f" of client {lab!r}", value_range)
    if at:
        warnings.warn(
            "hyperparameters ended at a bound of their range: " + ", ".join(at[:10])
            + (" ..." if len(at) > 10 else "") + ("; " + "; ".join(reasons) if reasons else ""),
            ConvergenceWarning, stacklevel=user_stacklevel())
    _warn_shared_off(est, G)
    _warn_input_scale(est)
    _warn_under_observed(est)
    _warn_collinear(est)
    if converged:  # stopped early, the noise says more about the budget than the model
        _warn_fitted_as_noise(est)


#: :class:`ClientFittedAsNoiseWarning` when a client's fitted noise variance
#: exceeds that of an exact GP on its own rows by more than this factor ...
NOISE_ABOVE_OWN_RATIO = 10.0
#: ... and is at least this share of the client's own target variance.
NOISE_SHARE_REPORTED = 0.1


class ClientFittedAsNoiseWarning(UserWarning):
    """The model calls far more of a client's data noise than the client's own exact GP does.

    Issued by :meth:`FederatedHierarchicalGPRegressor.fit` (structured
    family, 1-D ``y``, training converged) when a client's fitted noise variance is at least
    :data:`NOISE_SHARE_REPORTED` of its own target variance and exceeds, by
    more than :data:`NOISE_ABOVE_OWN_RATIO` times, the noise variance of the
    exact GP the client fitted on its own rows at set-up (its pilot, the
    maximum of the marginal likelihood over several starts), where that
    pilot is reliable (at least ``10 (d + 2)`` rows, the rule of
    :func:`skfedgp.federated.own_noise_centre`; its noise identified) and
    found more signal than noise. The model then calls noise much of what
    the client's own exact GP explains, and predicts that client with a
    larger error and a wider band than the client would get alone: a fitted
    model, not an error, but usually not the one wanted. Typical causes: the client's inputs in other
    units or on another scale than the others' (an input in per cent beside
    fractions, a time in seconds beside days), which the global inducing
    design and the shared lengthscales cannot follow; a function far
    rougher than the other clients' with too few local inducing points
    (``n_inducing_local``). Compare with an exact GP on that client's rows
    by a held-out score, rescale its inputs, or raise ``n_inducing_local``.
    Beyond the pFedHGP paper (the package's diagnostics).
    """


def _warn_fitted_as_noise(est):
    """:class:`ClientFittedAsNoiseWarning` for the clients whose noise ended far above their pilot's."""
    if getattr(est, "n_outputs_", 1) != 1:
        return
    found = []
    for lab, c in est.clients_.items():
        own = getattr(c, "pilot_noise", None)
        if own is None or not own > 0:
            continue
        s2 = np.asarray(c.local_values().get("noise_variance", np.nan), dtype=float)
        if s2.size != 1:
            continue
        s2 = float(s2)
        var = max(float(c.own_variance), 1e-300)
        if (np.isfinite(s2) and s2 > NOISE_ABOVE_OWN_RATIO * own
                and s2 >= NOISE_SHARE_REPORTED * var):
            found.append((lab, s2 / own, s2 / var, own / var))
    if not found:
        return
    found.sort(key=lambda t: -t[1])
    listed = "; ".join(
        f"client {lab!r}: {r:.3g} times ({a:.3g} of its targets' variance against {b:.3g})"
        for lab, r, a, b in found[:5]) + (" ..." if len(found) > 5 else "")
    warnings.warn(
        f"{len(found)} client(s) with much of their data fitted as noise: the model's noise "
        f"variance is at least {NOISE_SHARE_REPORTED:g} of the client's target variance and "
        f"more than {NOISE_ABOVE_OWN_RATIO:g} times that of an exact GP on the client's own "
        f"rows ({listed}). Check that their inputs are in "
        "the same units and ranges as the other clients' (e.g. per cent against fractions, "
        "seconds against days), or raise n_inducing_local for a function rougher than the "
        "others'; compare with an exact GP on those clients' rows by a held-out score",
        ClientFittedAsNoiseWarning, stacklevel=user_stacklevel())


class InputScaleWarning(UserWarning):
    """A client's own data vary along some input on a far other scale than the others'.

    Issued by :meth:`FederatedHierarchicalGPRegressor.fit` (structured
    family, 1-D ``y``, with the global or deviation component; the check
    runs when a client is set up, at a fresh fit or when it joins a warm
    start or resumed run, not again for a client rebuilt from its state;
    the Flower server does not issue it) for every client
    and input where the client's own exact GP (its pilot) has a lengthscale
    more than :data:`skfedgp.federated.INPUT_SCALE_RATIO` times the typical
    client's (the median over the clients) either way, its inputs spread
    over a range more than :data:`skfedgp.federated.INPUT_WIDTH_RATIO`
    times the typical one the same way, and a likelihood-ratio test on the
    client's rows confirms it (that input's lengthscale freed from the
    typical client's, the others held:
    :func:`skfedgp.federated.input_scale_mismatch`). With two clients the
    typical values are their midpoint (a unit factor above 100 is seen);
    with three or more, the majority's.
    The usual cause is that input recorded in other units at that client
    (per cent beside fractions, seconds beside days, metres beside
    kilometres). The shared global and deviation parts have one lengthscale
    per input for every client, so they cannot serve both scales. With
    client scales on (``client_scale="auto"``, the default, or True) the
    fit has already kept that client from harming the others: it learns its
    own scale on the shared parts (and detaches from them where they cannot
    serve it), starts its local kernel from its own pilot, and (at a fresh
    fit, when it answered the set-up's check and not every client is
    reported) its box is left out of the region where the global inducing
    inputs are placed
    (one of three inputs in per cent at one client of four: the others'
    RMSE 0.8-1.07 times their value without it, 1.1-11.5 times before; that
    client as accurate as an exact GP on its own rows). It then shares
    little with the others: convert the input to their units before
    fitting. With ``client_scale=False`` (the paper's model) nothing is
    changed, and the others can be predicted several times worse. Beyond
    the pFedHGP paper (the package's diagnostics; docs/maths.md,
    section 10).
    """


def _input_names(est):
    """Names of the model's inputs (``X``'s columns without the client column), or None."""
    names = getattr(est, "feature_names_in_", None)
    if names is None:
        return None
    names = [str(n) for n in names]
    # (during fit, before client_column_ is set, the parameter)
    col = getattr(est, "client_column_", getattr(est, "client_column", None))
    if col is not None:
        k = (names.index(str(col)) if not isinstance(col, numbers.Integral)
             else int(col) % len(names))
        names = names[:k] + names[k + 1:]
    return names


def _warn_input_scale(est):
    """:class:`InputScaleWarning` for clients whose data vary along an input on another scale."""
    if getattr(est, "n_outputs_", 1) != 1:
        return
    clients = getattr(est, "clients_", None) or {}
    try:
        names = _input_names(est)
    except (ValueError, IndexError):
        names = None
    # the reports the clients sent the server (set-up, or joining a warm
    # start): the only record, nothing is read off a client
    server = getattr(est, "server_", None)
    reports = getattr(server, "input_scale_reports_", None) or {}
    found, labels = [], []
    for lab in clients:
        for j, ratio in sorted(reports.get(lab, {}).items()):
            name = f"input {j}" + (f" ({names[j]!r})" if names and j < len(names) else "")
            found.append(f"client {lab!r}, {name}: {ratio:.3g} times")
            labels.append(lab)
    if not found:
        return
    # with client scales on, such a client learned its own scale on the
    # shared parts; those the server left out of the global design at set-up
    left_out = set(getattr(server, "input_scale_excluded_", None) or ())
    if not getattr(est, "client_scale", False):
        acted = (" (client_scale=False: the fit is unchanged, and the others can be predicted "
                 "worse than without that client)")
    else:
        out = [lab for lab in dict.fromkeys(labels) if lab in left_out]
        acted = ("; so that such a client does not harm the others, it learned its own scale "
                 "on the shared parts (client_scale)"
                 + (f", the inputs of {', '.join(repr(lab) for lab in out)} were left out of "
                    "the global inducing design" if out else "")
                 + ", and it shares little with them")
    warnings.warn(
        f"{len(found)} client input(s) along which the client's own data vary on a lengthscale "
        f"far from the typical client's ({'; '.join(found[:5])}{' ...' if len(found) > 5 else ''}"
        "; its own exact GP against the clients' median, over a range of inputs far from "
        "theirs the same way, confirmed by a likelihood-ratio test on its rows). The shared "
        "parts have one lengthscale per input for all clients and cannot follow both"
        + acted + ". If that input is in other units at that client (per cent against "
        "fractions, seconds against days), convert it before fitting; otherwise compare with "
        "a fit without that client by a held-out score",
        InputScaleWarning, stacklevel=user_stacklevel())


#: The global variance (in units of the standardised targets' variance) at
#: or below which :func:`_warn_shared_off` reports the global part as
#: switched off: ten times its lower bound.
SHARED_OFF_VARIANCE = 10 * LOG_BOUNDS["variance_g"][0]


class SharedPartsOffWarning(UserWarning):
    """The fit switched the global part off although several clients took part.

    Issued by :meth:`FederatedHierarchicalGPRegressor.fit` when the global
    variance ends within ten times its lower bound (``1e-5`` of the
    standardised targets' variance) with two or more clients: the clients
    then share no function, only hyperparameters, and each is predicted from
    its own data (its deviation and local parts). That is the right outcome
    for clients with nothing in common; for clients that should share a
    function it usually means inputs or targets in different units, or a
    client whose data the shared function cannot explain. Compare with a
    pooled model or ``components=("local",)`` by a held-out score. When
    every client's targets are constant, the message says so instead: there
    is no function to fit, and each client is predicted at its own level.
    With multi-output targets it is issued when outputs are constant in
    every client, naming them.
    """


def _warn_shared_off(est, G):
    """:class:`SharedPartsOffWarning` when the global part ended switched off
    (multi-output targets: when outputs are constant in every client)."""
    comps = getattr(est, "components_", ())
    if "global" not in comps or len(est.clients_) < 2:
        return
    flat = list(getattr(est.server_, "flat_outputs", None) or ())
    if flat:
        several = len(flat) > 1
        warnings.warn(
            f"output{'s' if several else ''} {', '.join(map(str, flat))} of y "
            f"{'are' if several else 'is'} constant in every client (no spread within any "
            f"of the {len(est.clients_)} clients): there is no function to fit for "
            f"{'them' if several else 'it'}, so each client is predicted by its own "
            f"constant level of {'those outputs' if several else 'that output'}",
            SharedPartsOffWarning, stacklevel=user_stacklevel())
    if "variance_g" in G:
        var_g = float(np.max(G["variance_g"]))
    elif "B_g" in G:
        # multi-output: each output's global variance is the sum of its squared
        # global loadings (unit-variance latents); the constant outputs, named
        # above, have none to switch off
        per_output = np.sum(np.asarray(G["B_g"], dtype=float) ** 2, axis=1)
        rest = np.setdiff1d(np.arange(per_output.shape[0]), flat)
        if rest.size == 0:
            return
        var_g = float(np.max(per_output[rest]))
    else:
        return
    if var_g > SHARED_OFF_VARIANCE:
        return
    if getattr(est.server_, "flat_clients", False):
        warnings.warn(
            f"every client's targets are constant (no spread within any of the "
            f"{len(est.clients_)} clients): there is no function to fit, so the global part "
            f"was switched off (variance_g = {var_g:.3g}) and each client is predicted by its "
            "own constant level", SharedPartsOffWarning, stacklevel=user_stacklevel())
        return
    dev = ""
    if "deviation" in comps and "phi" in G and "variance_g" in G:
        dev = (" and the deviations with it (variance phi * variance_g = "
               f"{float(G['phi']) * var_g:.3g})")
    what = (f"variance_g = {var_g:.3g} of the standardised targets' variance"
            if "variance_g" in G else
            f"largest global variance over the non-constant outputs = {var_g:.3g} of their "
            "standardised variance, the sum of an output's squared global loadings")
    warnings.warn(
        f"the global part was switched off ({what}){dev}: the "
        f"{len(est.clients_)} clients share no function, "
        "each is predicted from its own data alone. Expected if the clients' functions "
        "have nothing in common; otherwise check that every client's inputs are in the "
        "same units and ranges and its targets on a comparable scale, and compare with a "
        "pooled model or components=('local',) by a held-out score",
        SharedPartsOffWarning, stacklevel=user_stacklevel())


class UnderObservedOutputWarning(UserWarning):
    """An output is observed too rarely within the clients to learn how it varies.

    Issued by :meth:`FederatedHierarchicalGPRegressor.fit` (multi-output
    targets) when, for some output, the clients that observe it hold fewer
    than two of its values each on average. Every client has its own
    constant mean per output, which fits a value seen once exactly: such an
    output's loadings and noise are then learned from (almost) nothing, and
    the fit alone would predict it as a flat level with a band far too
    narrow (3 clients seeing an output once each: predictive sd 0.11 for
    errors up to 4, max |z| 36). Its predictive variance is therefore
    raised to at least that of a new value drawn from the output's pooled
    values with unknown mean and variance (Student-t with ``n_q - 1``
    degrees of freedom, as the Gaussian with the same 95 % interval;
    :func:`skfedgp.federated.under_observed_floor`): wide, since little is
    known, and its predictive mean is the clients' levels. A client that
    observed the output at least twice itself keeps its own variance. The
    floor applies to ``predict`` and ``predict_joint``, not to the parts of
    ``predict_components``; the Flower server (:mod:`skfedgp.flower`) does
    not issue this warning nor apply the floor. Record more values of that
    output per client, or fit it on its own. Beyond the pFedHGP paper (the
    package's diagnostics).
    """


def _warn_under_observed(est):
    """:class:`UnderObservedOutputWarning` for the outputs whose variance is floored."""
    floor = getattr(est.server_, "output_variance_floor", None)
    if floor is None:
        return
    floor = np.asarray(floor)
    under = getattr(est.server_, "under_observed_outputs", None)
    under = floor > 0 if under is None else np.asarray(under, dtype=bool)  # older checkpoints
    if not np.any(under):
        return
    counts = getattr(est.server_, "output_counts", None)
    listed = "; ".join(
        f"output {q}" + ("" if counts is None else
                         f": {counts[0][q]} values in {counts[1][q]} client(s)")
        + ("" if floor[q] > 0 else ", all equal")
        for q in np.flatnonzero(under))
    same = ("; an output whose values are all equal has no spread to raise it by, so its "
            "band is the model's own and means nothing" if np.any(floor[under] <= 0) else "")
    warnings.warn(
        f"outputs observed fewer than twice per client on average ({listed}): each client's "
        "own constant mean fits such values exactly, so how the output varies within a "
        "client (its loadings and noise) cannot be learned; its predictions are the "
        "clients' levels, with the predictive variance raised to that of a new draw from "
        f"the output's pooled values (Student-t){same}. Record more values of it per "
        "client, or fit it on its own", UnderObservedOutputWarning,
        stacklevel=user_stacklevel())


class CollinearOutputsWarning(UserWarning):
    """Two outputs are exact affine functions of each other at every client.

    Issued by :meth:`FederatedHierarchicalGPRegressor.fit` (multi-output
    targets) when, at every client that observes both on all its rows, two
    outputs are correlated at 1 (to within 1e-8;
    :func:`skfedgp.federated.collinear_outputs`): a column copied, or one
    channel recorded in two units. Their noises are then one noise, which
    the model's independent noise per output cannot represent: it reads
    one measurement as two, and its predictive bands are too narrow (an
    output duplicated at six clients of 8 rows: 25 % of held-out errors
    beyond 3 std and RMSE 0.27, against none and 0.14 fitted on the output
    alone). Drop one of the two outputs (and rescale the other's
    predictions if it is wanted). Beyond the pFedHGP paper.
    """


def _warn_collinear(est):
    """:class:`CollinearOutputsWarning` for the pairs the server recorded."""
    pairs = getattr(est.server_, "collinear_outputs", None)
    if not pairs:
        return
    listed = ", ".join(f"{q} and {r}" for q, r in pairs[:10]) + (" ..." if len(pairs) > 10 else "")
    warnings.warn(
        f"outputs {listed} are exact affine functions of each other at every client "
        "(correlation 1 within each client): their noises are one noise, which the model's "
        "independent noise per output reads as two measurements, so the predictive bands "
        "are too narrow. Drop one output of each pair", CollinearOutputsWarning,
        stacklevel=user_stacklevel())


#: :class:`SparseApproximationWarning` when the trace term of the collapsed
#: bound at the fitted model exceeds this many nats per observation ...
LOOSE_BOUND_NATS = 0.03
#: ... and this many nats in all.
LOOSE_BOUND_MIN_NATS = 5.0


class SparseApproximationWarning(UserWarning):
    """The inducing points leave much of the prior unexplained at the fitted model.

    Issued by :meth:`FederatedHierarchicalGPRegressor.fit` (structured
    family, training converged; also by the Flower server) when the trace
    term of the collapsed bound at the returned model
    (``trace_term_``: the prior variance the inducing points leave
    unexplained at the clients' inputs, over twice the noise variance;
    Titsias, AISTATS 2009, eq. 9) exceeds :data:`LOOSE_BOUND_NATS` nats per
    observation and :data:`LOOSE_BOUND_MIN_NATS` in all. The bound is then
    loose (Burt, Rasmussen and van der Wilk, JMLR 21, 2020) and the
    hyperparameters that maximise it are pulled towards what the inducing
    points can represent: smaller signal variances or shorter lengthscales
    than an exact GP's, so the predictive standard deviation can be too
    small, above all away from the data. Typical causes: nearly noise-free
    targets (the noise variance near its floor, where the jitter that keeps
    ``K_zz`` factorisable alone leaves a large term, so more inducing
    points do not help and an exact GP is the better model), or a function
    too rough for the number of global (``n_inducing``) or local
    (``n_inducing_local``) inducing points; the message says which.
    """


def trace_summary(sent):
    """The clients' final trace terms summed (``dict``), or None if one sent none.

    Parameters
    ----------
    sent : list of tuple
        Per client ``(total, local, jitter, n_observations)`` from its final
        :class:`~skfedgp.federated.LocalHyperparameters`.

    Returns
    -------
    dict or None
        ``{"total", "local", "jitter": float, "n_observations": int}``
        (nats, and a count of observed target values).

    Notes
    -----
    The trace term of the collapsed bound (Titsias, AISTATS 2009, eq. 9),
    summed over the clients; beyond the pFedHGP paper (docs/maths.md,
    section 11).
    """
    sent = list(sent)
    if not sent or any(v is None for row in sent for v in row):
        return None
    total, local, jitter, n = (sum(col) for col in zip(*sent))
    return {"total": float(total), "local": float(local), "jitter": float(jitter),
            "n_observations": int(n)}


def warn_loose_bound(summary, n_inducing):
    """:class:`SparseApproximationWarning` when the summed trace term is large.

    Parameters
    ----------
    summary : dict or None
        From :func:`trace_summary`.
    n_inducing : int
        The number of global inducing points (to say whether more can help).

    Warns
    -----
    SparseApproximationWarning
        When ``summary["total"]`` exceeds :data:`LOOSE_BOUND_NATS` nats per
        observation and :data:`LOOSE_BOUND_MIN_NATS` in all; the message
        names the likely cause (noise near its floor, where ``summary
        ["jitter"]`` is at least half the term; else the local or the
        global inducing points, whichever leave more).

    Notes
    -----
    The gap of the collapsed bound is bounded by terms proportional to the
    trace term (Burt, Rasmussen and van der Wilk, JMLR 21, 2020); the
    threshold is the package's (docs/maths.md, section 11).
    """
    if summary is None:
        return
    t, n = summary["total"], summary["n_observations"]
    if not np.isfinite(t) or n <= 0 or t <= max(LOOSE_BOUND_NATS * n, LOOSE_BOUND_MIN_NATS):
        return
    if summary["jitter"] >= 0.5 * t:
        why = ("with the noise variance near its floor (nearly noise-free targets), where "
               f"the jitter added to K_zz alone can leave up to {summary['jitter']:.3g} nats "
               "whatever the inducing points: more of them do not remove it, and an exact "
               "GP is the better model")
    elif summary["local"] >= t - summary["local"]:
        why = ("more from the clients' local inducing points than from the global ones: "
               "try a larger n_inducing_local, or compare with an exact GP on a held-out "
               "split")
    elif n_inducing < n:
        why = ("more from the global inducing points than from the clients' local ones: "
               "try a larger n_inducing, or compare with an exact GP on a held-out split")
    else:
        why = "compare with an exact GP on a held-out split"
    warnings.warn(
        f"the sparse approximation is loose: at the fitted model the inducing points leave "
        f"a trace term of {t:.3g} nats ({t / n:.3g} per observation) in the bound, "
        f"{why}. The fit then favours smaller signal variances than an exact GP's, and "
        "the predictive std can be too small away from the data",
        SparseApproximationWarning, stacklevel=user_stacklevel())


def warn_untrained_clients(client_ids, failures, first, done):
    """ConvergenceWarning naming the clients whose local phase never succeeded.

    Such a client stays in the model (it answered the set-up and the final
    exchange) but its own hyperparameters never moved from their initial
    values in this fit; ``failed_clients_`` lists the failures, this says
    what they mean. Counted over the rounds of this fit (after ``first``,
    the rounds of a resumed or warm-started run's history): a client whose
    local phase failed at least once and never succeeded (``done``: the
    clients with a successful one), whether it was asked every round or,
    with partial participation, only in some. Used by ``fit`` and by the
    Flower server (:func:`skfedgp.flower.fit_over_transport`).

    Parameters
    ----------
    client_ids : iterable
        The clients in the model, in their fixed order.
    failures : list of tuple
        ``(round, client_id, method, error)`` records (``failed_clients_``).
    first : int
        Rounds already in the history before this fit (resume, warm start).
    done : iterable
        Clients with at least one successful local phase in this fit.

    Warns
    -----
    sklearn.exceptions.ConvergenceWarning
        Naming up to five such clients. Raises nothing.

    Notes
    -----
    Beyond the pFedHGP paper (which assumes every client answers): the
    failure policy of docs/deployment.md, section 3.
    """
    failed = {cid for r, cid, method, _ in failures
              if method == "local_phase" and r > first}
    done = set(done)
    stuck = [cid for cid in client_ids if cid in failed and cid not in done]
    if stuck:
        warnings.warn(
            f"client(s) {stuck[:5]} failed their local phase whenever asked in this fit "
            "(see failed_clients_): their own hyperparameters are still the values this fit "
            "started from",
            ConvergenceWarning, stacklevel=user_stacklevel())


def _n_target_columns(y):
    """Number of target columns of ``y`` as passed (1 for 1-D), without converting it."""
    shape = getattr(y, "shape", None)
    if shape is None:
        try:
            shape = np.asarray(y).shape
        except (ValueError, TypeError):  # ragged: let the validation report it
            return 1
    return int(shape[1]) if len(shape) == 2 else 1


class TargetScaleError(ValueError):
    """Targets too small or too large for float64 to standardise (a ``ValueError``).

    Raised by :func:`check_target_values`. Its attributes let a caller whose
    targets are something else (the curves of
    :class:`~skfedgp.MaxEvidenceClassifier`) say so in its own terms.

    Parameters
    ----------
    size : {"small", "large"}
    failure : str
        What overflows or underflows, with ``{}`` where the values are named
        (``"the variance of {} overflows float64"``).
    largest : float
        Largest magnitude among the values.

    Notes
    -----
    Input validation of the package (no paper source).
    """

    def __init__(self, size, failure, largest):
        self.size, self.failure, self.largest = size, failure, float(largest)
        super().__init__(self.message("y is", "y", "its values", "rescale the targets"))

    def message(self, subject, symbol, values, advice):
        """The error in other terms.

        Parameters
        ----------
        subject, symbol, values, advice : str
            What is too small or large, with its verb (``"y is"``), its
            symbol (``"y"``), its values (``"its values"``) and what to do.

        Returns
        -------
        str
        """
        return (f"{subject} too {self.size} to standardise: {self.failure.format(values)} "
                f"(largest |{symbol}| = {self.largest:.3g}); {advice}")

    def __reduce__(self):
        return type(self), (self.size, self.failure, self.largest)


def check_target_values(y):
    """Targets must be numbers whose spread float64 can hold.

    Parameters
    ----------
    y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        NaN entries (missing outputs) are ignored; a column with none
        observed is left to the caller's own check.

    Raises
    ------
    ValueError
        If ``y`` holds strings (a class label, not a number).
    TargetScaleError
        (a ``ValueError``) If its values are so large that their variance
        overflows float64, or so small (all below about 1e-146 in magnitude)
        that their squares underflow (the targets are standardised by their
        spread; rescale them, e.g. by a power of ten).

    Notes
    -----
    Input validation of the package (beyond the paper); the target
    standardisation it protects is docs/maths.md section 10.
    """
    check_not_strings(y)
    a = np.asarray(y, dtype=float)
    a = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    seen = ~np.isnan(a)
    with np.errstate(over="ignore", invalid="ignore"):
        for q in range(a.shape[1]):
            col = a[seen[:, q], q]
            if col.size and not np.isfinite(np.var(col)):
                raise TargetScaleError("large", "the variance of {} overflows float64",
                                       np.max(np.abs(col)))
            big = float(np.max(np.abs(col))) if col.size else 0.0
            if 0.0 < big and big**2 < np.finfo(float).tiny / np.finfo(float).eps:
                # squares of the values underflow: their spread would read as
                # 0 (constant targets) and the model would run in wrong units
                raise TargetScaleError("small", "the squares of {} underflow float64", big)


def check_multioutput_targets(y, n_rows, estimator=None):
    """Validate multi-output targets: NaN marks a missing output.

    Shared by :meth:`FederatedHierarchicalGPRegressor.fit` and the Flower
    ClientApp (:mod:`skfedgp.flower`), which validate the same way. Missing
    outputs are left out of the ILMM likelihood (Yan 2026, section 3.9,
    eq. 34, summed over the observed entries; docs/maths.md, section 12).

    Parameters
    ----------
    y : array-like of shape (n_rows, n_outputs)
        Targets; NaN entries are missing outputs.
    n_rows : int
        Number of rows of the inputs ``X``.
    estimator : estimator instance, optional
        Named in scikit-learn's conversion errors.

    Returns
    -------
    y : ndarray of shape (n_rows, n_outputs), float64

    Raises
    ------
    ValueError
        If ``y`` is not 2-D, its length is not ``n_rows``, it holds an
        infinite value, or a row has every output missing.
    """
    check_not_strings(y)  # names the problem before scikit-learn's conversion
    y = check_array(y, ensure_all_finite="allow-nan", dtype=np.float64, input_name="y",
                    estimator=estimator)
    if y.shape[0] != n_rows:
        raise ValueError(
            f"X has {n_rows} rows but y has {y.shape[0]}; they must match")
    if np.any(np.isinf(y)):
        raise ValueError("y contains infinite values; NaN marks a missing output, "
                         "inf is not allowed")
    empty = np.flatnonzero(np.all(np.isnan(y), axis=1))
    if empty.size:
        raise ValueError(
            f"{empty.size} row(s) of y have every output missing (NaN), e.g. row "
            f"{int(empty[0])}; drop them (a row needs at least one observed output)")
    check_target_values(y)
    return y


#: :meth:`FederatedHierarchicalGPRegressor._restart_from_global`: the full
#: model is trained again from the global-only fit's lengthscales when its ELBO
#: does not exceed that fit's by more than the larger of these (nats; per
#: observation).
RESTART_MARGIN_NATS = 2.0
RESTART_MARGIN_PER_OBS = 0.01
#: The second run is kept only if its final objective exceeds the first's by
#: more than this (nats): a near-tie keeps the default run.
RESTART_KEEP_NATS = 1.0
#: The global-only fit runs at most this many rounds (it only has to
#: show that the full fit is below it, and give a start).
RESTART_REFERENCE_ROUNDS = 10


#: :func:`smoothest_latent_start`: a latent of the global-only fit whose
#: loadings carry less than this share of the largest latent's (squared
#: column norms of ``B_g``) is switched off; its lengthscales say nothing.
LIVE_LATENT_SHARE = 1e-2


def smoothest_latent_start(lengthscales, loadings=None):
    """Starting global lengthscales of a multi-output full model: every latent
    from the global-only fit's smoothest latent.

    The global-only model has no client part, so it spends latents on what
    the clients' own parts carry in the full model: cross-channel correlated
    variation on their short scales (pFedHGP scenario A, 12 seeds: 5
    global-only fits had a latent at 0.1-0.35 input units, against the
    shared latents' 1.8 and 2.5). A full-model latent started there competes
    with the local latents, loses its loadings within a few rounds and stays
    switched off (a latent without loadings has no lengthscale gradient). Its
    smoothest latent, the largest ``sum_j log(min(ell_j, START_MAX_SPANS))``
    among the latents with loadings (a switched-off input counts as
    :data:`~skfedgp.federated.START_MAX_SPANS` spans, so a latent that
    ignores an input does not win for that alone), is its best estimate of
    the shared signal's scale; it is capped at that many spans per input
    (:func:`~skfedgp.federated.start_lengthscale`, as the pilots' start is).
    The latents, started equal, are told apart by their initial loadings
    (principal axes of the outputs' covariance) and separate during
    training. The deviation latents share the global latents' kernels
    (``phi k_g``), so they start there too. docs/maths.md, section 12.

    Parameters
    ----------
    lengthscales : array-like of shape (R_g, d)
        The global-only fit's per-latent lengthscales, in the model's units
        (inputs scaled to the clients' joint unit box).
    loadings : array-like of shape (Q, R_g), optional
        Its loadings ``B_g``. Latents whose squared column norm is below
        :data:`LIVE_LATENT_SHARE` times the largest are not chosen (all
        are candidates when None, or when every column is zero).

    Returns
    -------
    ndarray of shape (R_g, d)
        Every row the chosen latent's lengthscales (the first on a tie),
        capped at ``START_MAX_SPANS``.

    Raises
    ------
    ValueError
        If ``lengthscales`` is not a non-empty 2-D array of positive finite
        values, or ``loadings`` has not ``R_g`` finite columns.

    See Also
    --------
    skfedgp.federated.start_lengthscale : the cap applied to the pilots' start.
    """
    ell, live = _live_latents(lengthscales, loadings)
    score = np.sum(np.log(np.minimum(ell, START_MAX_SPANS)), axis=1)
    score[~live] = -np.inf
    smooth = start_lengthscale(ell[int(np.argmax(score))], np.ones(ell.shape[1]))
    return np.tile(smooth, (ell.shape[0], 1))


def _live_latents(lengthscales, loadings):
    """``(ell, live)``: the checked ``(R_g, d)`` lengthscales and which latents carry loadings.

    A latent is live when the squared norm of its column of ``loadings``
    is at least :data:`LIVE_LATENT_SHARE` times the largest (every latent
    when ``loadings`` is None or all zero).
    """
    ell = np.asarray(lengthscales, dtype=float)
    if ell.ndim != 2 or ell.size == 0 or not np.all(np.isfinite(ell) & (ell > 0)):
        raise ValueError("lengthscales must be a non-empty (R_g, d) array of positive "
                         f"finite values, got {lengthscales!r}")
    live = np.ones(ell.shape[0], dtype=bool)
    if loadings is not None:
        B = np.asarray(loadings, dtype=float)
        if B.ndim != 2 or B.shape[1] != ell.shape[0] or not np.all(np.isfinite(B)):
            raise ValueError(f"loadings must be a finite (Q, {ell.shape[0]}) array, got "
                             f"shape {B.shape}")
        share = np.sum(B**2, axis=0)
        if share.max() > 0:
            live = share >= LIVE_LATENT_SHARE * share.max()
    return ell, live


def shortest_live_latent(lengthscales, loadings=None):
    """Lengthscales that size the global inducing design of a multi-output full model.

    Per input, the shortest lengthscale among the global-only fit's latents
    that carry loadings (as :func:`smoothest_latent_start` chooses them),
    capped at :data:`~skfedgp.federated.START_MAX_SPANS` spans. The global
    inducing points carry the global and the deviation parts, whose kernels
    are the global latents'; the pilots' lengthscales, which
    ``n_inducing="auto"`` otherwise uses, follow whichever part varies
    fastest, often the clients' own. The global-only fit sees only what the
    clients share, and in the cases measured its shortest live latent was
    at most as long as the full model's shared latents needed, including a
    periodic deviation that the smoothest latent missed (pFedHGP scenario B,
    seed 2). It is not a guarantee: a weak short shared latent below the
    loadings filter, or ``R_g`` latents all spent on smooth parts, would
    leave it long. The server sizes the design for the larger, per input,
    of these and the pilots' lengthscales (never for a shorter lengthscale
    than the pilots'; docs/maths.md, section 12). Only when the model has a
    local part, which carries the clients' own faster variation; without
    one the deviation must, on the global inducing points. Beyond the
    paper: H. Yan, "Personalized Federated Hierarchical Gaussian Processes
    for Privacy-Preserving Modeling of Heterogeneous Distributed Systems",
    arXiv:2609.19337 (2026), section 4.2, fixes ``M = M_i = 25`` by hand.

    Parameters
    ----------
    lengthscales : array-like of shape (R_g, d)
        The global-only fit's per-latent lengthscales, in the model's units
        (inputs scaled to the clients' joint unit box).
    loadings : array-like of shape (Q, R_g), optional
        Its loadings ``B_g`` (latents below :data:`LIVE_LATENT_SHARE` of the
        largest squared column norm are left out).

    Returns
    -------
    ndarray of shape (d,)

    Raises
    ------
    ValueError
        As :func:`smoothest_latent_start`.
    """
    ell, live = _live_latents(lengthscales, loadings)
    return start_lengthscale(ell[live].min(axis=0), np.ones(ell.shape[1]))


def _is_fit_attribute(name):
    """Whether an instance attribute belongs to the fitted state."""
    return (name.endswith("_") and not name.startswith("__")) or name == "_population_local"


def _copied_rows(X, y):
    """Rows of one client that repeat an earlier row exactly, when every repeat does.

    Returns 0 unless the client has exact copies (same inputs and target) and
    no repeated input with another target: real repeated measurements differ
    by their noise, copies (a table appended to itself) do not.
    """
    if X.shape[0] < 2:
        return 0
    n_xy = np.unique(np.column_stack([X, y]), axis=0).shape[0]
    copies = X.shape[0] - n_xy
    if copies == 0 or np.unique(X, axis=0).shape[0] != n_xy:
        return 0
    return copies


def _warn_copied_rows(X, y, inv, labels):
    """Warn (``UserWarning``) about clients whose repeated rows are all exact copies.

    The likelihood reads an exact repeat as a second, noise-free-consistent
    measurement: copies pull the noise variance down and the lengthscales
    short (every row of a 30-point data set given twice took the test RMSE
    from 0.08 to 0.75), the client's and, through the shared parts, the
    others'. Input validation of the package (no paper source).
    """
    found = []
    for k, lab in enumerate(labels):
        rows = inv == k
        c = _copied_rows(X[rows], y[rows])
        if c:
            found.append((lab, c, int(np.sum(rows))))
    if found:
        listed = ", ".join(f"{lab!r} ({c} of {n} rows)" for lab, c, n in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        warnings.warn(
            f"client(s) {listed}{more} have rows that repeat an earlier row exactly "
            "(inputs and target), and no repeated input with another target: copies of "
            "the data? The likelihood reads exact repeats as measurements that agree "
            "to the last digit, which pulls the noise variance down and the "
            "lengthscales short; drop the copies (e.g. DataFrame.drop_duplicates()) "
            "unless they are real repeated measurements", UserWarning,
            stacklevel=user_stacklevel())


#: Below this many fitted clients, predicting for a never-seen client warns:
#: the spread of the clients' levels cannot be estimated from fewer.
MIN_CLIENTS_FOR_NEW = 3


class FederatedHierarchicalGPRegressor(RegressorMixin, BaseEstimator):
    """Personalised federated hierarchical sparse GP regression (pFedHGP).

    Client ``i``'s function is a shared global GP, plus a client deviation on
    the same inducing basis with kernel ``phi * k_g``, plus a local sparse GP
    with its own kernel (``docs/maths.md``, section 1; Yan 2026, sections
    3.2–3.4), plus the client's own constant mean ``c_i``::

        y_i(x) = c_i + f_g(x) + f_delta_i(x) + f_i(x) + eps,  eps ~ N(0, s2_i)

    Each part is a whitened sparse GP on inducing points (Titsias VFE). With
    the structured family (the default) and a 1-D ``y``, ``c_i`` is a random
    level, ``c_i ~ N(0, level_variance)`` around the mean of the clients'
    means (``y_offset_``, each client counted once), with one
    learned ``level_variance`` shared by all clients (a random intercept;
    cf. the hierarchical GPs of Hensman, Lawrence and Rattray, *BMC
    Bioinformatics* 14:252, 2013); the constant kernel on a client's own rows
    is represented exactly by one extra inducing variable
    (``docs/maths.md``, section 13), so the bound stays the exact log marginal
    likelihood at ``Z = X``, a client's level is integrated out in training
    and prediction, and a client with few points borrows the other clients'
    spread. Multi-output targets and the mean-field family learn ``c_i`` as
    a hyperparameter.
    Training is federated: clients keep their data and send only summaries
    whose sizes depend on ``n_inducing`` and the input dimension, never on
    how many observations they hold (every message is counted in
    ``communication_``).

    **Default training (structured family, L-BFGS).** For a Gaussian
    likelihood the optimal joint variational posterior over all inducing
    variables is available in closed form: each client eliminates its own
    deviation and local variables and uploads a Gaussian message on the
    global ones (an ``M x M`` precision ``S_i``, an ``M``-vector ``b_i`` and a
    scalar); the server sums them and obtains ``q(v_g)`` exactly
    (``docs/maths.md``, section 9). The bound is the collapsed bound of the
    whole hierarchy — the exact log marginal likelihood when the inducing
    inputs are the training inputs — and its gradients are analytic. Each
    round, every client first maximises its own part of the bound over its
    own hyperparameters with ``q(v_g)`` fixed (L-BFGS-B, no communication;
    every such step increases the bound), then the server takes L-BFGS-B
    steps on the global hyperparameters (two exchanges per evaluation).
    Training stops when a round gains less than ``tol`` (relative) or after
    ``n_rounds`` rounds (:class:`~sklearn.exceptions.ConvergenceWarning`),
    and ends with a fresh exchange, so every factor of the returned model is
    exact for its final hyperparameters and ``elbo_history_[-1]`` is its
    ELBO. The paper's mean-field family and Adam (its Algorithm 1) remain
    available (``variational_family="mean_field", optimizer="adam"``).

    **Data-derived defaults.** Each client fits a quick exact GP (the
    objective and optimizer of scikit-learn's ``GaussianProcessRegressor``,
    with compiled kernel gradients) on at most 256 of its own
    points and reports only the fitted hyperparameters; the server takes
    medians for the initial global kernel, each client starts its local
    kernel and noise from its own pilot where that pilot is usable (else
    from the population's values; docs/maths.md, section 11).
    ``n_inducing="auto"`` sizes the
    inducing set from the lengthscales and the region the clients' inputs
    cover; the global inducing points are placed in the union of the
    clients' input boxes. Targets are divided by the median of the clients'
    own standard deviations and every client has its own level, so a client
    on another level or scale does not change the others' units. Each
    client's local kernel gets a weak hyperprior from the population; so
    does its noise variance (for a client whose rows repeat inputs, at
    least 10 pure-error degrees of freedom, from the spread of its targets
    at equal inputs), except for a client with enough points for its own
    pilot to be reliable, whose data alone decide its noise (see
    ``noise_prior_scale``).

    Parameters
    ----------
    n_inducing : int or "auto", default="auto"
        Number ``M`` of global inducing points (shared by the global and the
        deviation parts). "auto": about 2.5 per global lengthscale along each
        input dimension over the region covered by the clients' inputs
        (the pilots' lengthscales; with multi-output targets after the
        global-only fit of ``restart_from_global`` and a ``"local"``
        component, per input the larger of those and that fit's shortest
        latent with loadings, capped at 5 spans,
        :func:`shortest_live_latent`),
        at least 10, at most the number of observations ``N``, at most
        ``max(64, N / 4)`` (more costs far more and gains nothing where the
        design already covers the inputs), except that where this cap binds
        and the design leaves more than 5 % of the prior variance
        unexplained over the region the clients' inputs cover (several
        inputs, or short lengthscales for the number of observations;
        checked on the server at the starting lengthscales, without data),
        it grows by a quarter at a time while that share is above 1 %, up
        to ``N / 2`` and at most 512 points (each check in ``server_.inducing_growth_``; such a fit
        costs about 1.2-7 times more:
        KIN40K, 5 clients x 200 points, ``M`` 250 to 500, RMSE 1.17-1.39
        times a pooled exact GP's to 1.07-1.14, fit time about 100 s to
        300-700 s; docs/maths.md section 11), and at
        most the larger of 256 and what one ELBO evaluation affords within a fixed
        budget (about 2e10 multiply-adds summed over the clients, a few
        seconds on one core; ``federated.auto_inducing`` and
        ``federated.budget_inducing``); the mean-field family uses 25.
        A given number above the number of observations is reduced to it
        with a ``UserWarning`` (more cannot improve the bound).
    n_inducing_local : int or "auto", default="auto"
        Number ``M_i`` of inducing points of each client's local part.
        "auto" (structured family): per client, a scrambled Sobol design over
        its own input box (never its inputs, so the fitted model holds no
        training row), first sized from its lengthscales and box (at most
        ``n_i``), then grown by half while it leaves more than 0.005 nats
        per observation of the local prior unexplained at the client's
        inputs (the bound's trace term), up to 64 points, more than ``n_i``
        if need be; so clients can end up with different ``M_i``. The
        mean-field family uses 25 (a given number above the largest client's size is
        reduced to it, with a ``UserWarning``).
    learn_inducing_locations : bool or "auto", default="auto"
        Whether the inducing inputs (the global ``Z_g`` and every client's
        ``Z_l``) are optimised with the hyperparameters (the name follows
        GPyTorch's ``VariationalStrategy``). False holds them where the
        set-up placed them: a scrambled Sobol design in the region the
        clients' inputs cover (global; sized to the lengthscales by
        ``n_inducing="auto"``) and a scrambled Sobol design over the
        client's own box (local; never its inputs, so the fitted model holds
        no training row). "auto" (structured family):
        a held set starts learning when it leaves more than 1 % of the prior
        variance at the inputs unexplained (``1 - tr Q_ff / tr K_ff``: the
        trace term of the collapsed bound, Titsias 2009, without its noise
        scale; Burt, Rasmussen and van der Wilk, JMLR 21, 2020, bound the
        bound's gap by terms proportional to it) or, once the noise
        variances are fitted, when that trace term is worth more than 0.005
        nats per observation and 5 nats in all. It is checked at the initial
        hyperparameters (the share only) and again before every round while
        the set is held, since training moves the lengthscales; a set once
        learned stays learned. The server decides for the global set from
        four numbers per client per check, each client for its local set
        alone. A given True or False also applies to a warm start or
        resume; "auto" keeps the decision of the fit it continues and goes
        on checking. Where the design already covers the inputs (few input
        dimensions), optimising ``M x d`` more coordinates only makes the
        objective harder: on 8 clients of 12 points in 1-D (5 seeds) a fit
        took 5-58 s and 16-100 rounds with them learned, 2-4 s and 7-12
        rounds without, with a lower mean held-out NLL (1.34 against
        1.50). Where it does not (4-8 inputs, ``M`` capped by the budget),
        learning them matters: KIN40K, 5 clients x 300 points, RMSE 0.34
        learned against 0.44 held (``benchmarks/bench_inducing.py``). The
        final decision is ``learn_inducing_locations_``; the round from
        which the global set was learned is
        ``server_.inducing_switch_round_`` (None: from the start, or never)
        and every check ``server_.design_residual_history_`` (round, share,
        nats per observation); each client's own decision is
        ``clients_[label].learn_local_inducing``. The mean-field family
        treats "auto" as True (the paper's Algorithm 1).
    components : tuple of str, default=("global", "deviation", "local")
        Which parts to use: a non-empty subset. ``("local",)`` is Local-only
        (independent per-client sparse GPs), ``("global",)`` is Global-only,
        and ``("global", "local")`` is No-deviation (paper section 4.4).
    lengthscale : float or array-like of shape (n_features,), default=None
        Initial global lengthscale(s), in input units; None: the median of
        the clients' pilot lengthscales, each client weighted by its number
        of observations (a pilot on a handful of points says little about
        the lengthscales; the clients of 4-31 points count with the pilot
        they fit together, when they form one; mean-field family: 0.2 times
        each feature's range).
    lengthscale_starts : sequence of float or "multi", default=(1.0,)
        Structured family, ``lengthscale=None``: factors of the starting
        global lengthscales (the weighted median of the clients' pilot lengthscales,
        which describe each client's whole function, so the global and
        local kernels start at the same lengthscale). With more than one
        factor a whole run is trained from each start (every other starting
        value the same) and the run with the largest final objective (ELBO
        plus log hyperpriors) is kept, as with scikit-learn's
        ``n_restarts_optimizer``; the other runs' traffic and evaluations are
        counted in round 1's entry of ``communication_`` and in
        ``n_evaluations_``. ``"multi"`` means ``(1, 3)``: the pilots' scale and a
        three times smoother shared part, which finds a shared component
        smoother than the clients' own ones where the single start does not.
        It costs the runs of every start, and a higher objective is not
        always a better predictor (docs/maths.md, section 11, has the
        measurements). Beyond the paper (H. Yan, "Personalized Federated
        Hierarchical Gaussian Processes for Privacy-Preserving Modeling of
        Heterogeneous Distributed Systems", arXiv:2609.19337, 2026, sets
        the initial values by hand); restarts as in Rasmussen and
        Williams, "Gaussian Processes for Machine Learning", MIT Press 2006,
        section 5.4. Simulation (``fit``) only: not used by a warm start,
        a resumed run or a fit over another transport. A ``checkpoint`` is
        written after every round of every start's run and, at the end,
        for the kept run; resuming from a checkpoint written during a run
        continues that run only. ``failed_clients_`` includes the failures
        of every start's run; a client lost while a later start is set up
        is excluded, and that start's run is then kept.
    restart_from_global : {"auto", True, False}, default="auto"
        :meth:`fit` only (the Flower server trains one run), structured family,
        1-D ``y`` (multi-output ``y``: below), ``components`` with ``"global"`` and a client part,
        ``lengthscale=None``, ``n_rounds`` not 0 and a fresh fit (no
        ``warm_start`` continuation, ``resume_from``, ``checkpoint`` or
        ``fault_hook``; elsewhere the setting is ignored): after the fit, the
        global-only model (``components=("global",)``, at most 10 rounds, every
        other setting the same) is fitted too. The full model contains it
        (``phi`` and the local variances at zero), so at its optimum its ELBO
        is at least the global-only model's. ``"auto"``: when the full fit's
        ELBO does not exceed the global-only fit's by more than
        ``max(2, 0.01 N)`` nats (``N`` observations), the client parts have taken structure
        that the shared kernel explains (typical with many inputs of which a
        few matter: an input's global lengthscale left at its upper bound while
        each client's local part fits it), and the full model is trained once
        more from the global-only fit's lengthscales, and that run is kept if
        its final objective (ELBO plus log hyperpriors) exceeds the first run's
        by more than 1 nat; only the kept run's end-of-fit warnings are shown.
        True: that second run always (kept by the same rule); False: neither
        extra fit. An extra run that raises (any ``Exception``, e.g. a warning
        turned into an error) leaves the first run in place, with a
        ``UserWarning``. The extra runs are federated fits on the same clients;
        their traffic and evaluations are counted in round 1's entry of
        ``communication_`` and in ``n_evaluations_``, their client failures in
        ``failed_clients_`` (``global_only_elbo_``,
        ``restarted_from_global_``). Costs the global-only fit (measured:
        10-90 % more time) and, when triggered, a second full fit (small fits
        measured 2-4 times slower in all). With multi-output ``y`` (same
        conditions otherwise), ``"auto"`` and True fit the global-only model
        *first* and start every global latent of the full model from its
        smoothest latent's lengthscales (one full run, no second one): each
        client's pilot GPs fit one output alone and their lengthscales
        follow whichever part varies fastest, often the clients' own, and a
        full model started there lets the clients' parts take the shared
        signal (the global loadings end near zero); the global-only model's
        shorter latents do the same (:func:`smoothest_latent_start`).
        Measured on the paper's scenario A, seeds 0-11 (one fit each):
        pooled RMSE over the Oracle's 1.146 (pilots' start) → 1.110 (each
        latent from the global-only latent of the same index), 95 %
        coverage 0.921 → 0.929; then, from there to the smoothest latent
        (per-client scores), RMSE over the Oracle's 1.110 → 1.102, NLL
        −3.93 → −4.00, coverage 0.929 → 0.931; the global-only fit costs
        about 3 s (docs/maths.md, section 12). With ``n_inducing="auto"``
        and a ``"local"`` component the global-only fit also sizes the
        global inducing design (:func:`shortest_live_latent`; scenarios A-D,
        seeds 0-2: the same scores, Full fits 1.4 times faster in all).
        False: the pilots' start. Beyond the paper (Yan 2026 sets the
        initial values by hand); restarts chosen by the bound as in Rasmussen
        and Williams, *Gaussian Processes for Machine Learning*, MIT Press,
        2006, section 5.4.
    local_lengthscale : float or array-like of shape (n_features,), default=None
        Initial local lengthscale(s); None: each client's own pilot
        lengthscales where usable, else the population's (docs/maths.md,
        section 11; mean-field family: 0.05 times the range).
    variance : float, default=None
        Initial global kernel variance (standardised target units); None: the
        median pilot signal variance, weighted by the clients' numbers of
        observations (mean-field family: 1.0).
    local_variance : float, default=None
        Initial local kernel variance (standardised target units); None: 0.1
        times the client's pilot signal variance (mean-field family: 1.0).
    noise_variance : float, default=None
        Initial noise variance of every client, in squared target units;
        None: each client's pilot noise variance, or, for a client whose
        noise hyperprior is centred on its pure-error variance (see
        ``noise_prior_scale``), that variance (mean-field: 0.1 in
        standardised units). Each client's noise variance stays above its
        own floor, ``1e-6`` times its own target variance (mean-field: 1e-6
        in standardised units); a smaller given value starts just above it.
    phi : float, default=None
        Initial deviation scale ``phi`` (deviation kernel ``phi * k_g``);
        None: 0.1 (mean-field family: 1.0).
    variational_family : {"structured", "mean_field"}, default="structured"
        ``"structured"``: the exact joint posterior over the inducing
        variables (collapsed bound; beyond the paper). ``"mean_field"``: the
        paper's factorised ``q(v_g) q(w_i) q(v_i)``, kept as the reference;
        it needs ``optimizer="adam"`` and ends with a closed-form polish of
        every factor at the final hyperparameters.
    optimizer : {"lbfgs", "adam"}, default="lbfgs"
        Hyperparameter optimiser: SciPy's L-BFGS-B on the deterministic
        collapsed bound (structured family only), or Adam (the paper's
        Algorithm 1).
    n_rounds : int, default=None
        Maximum number of communication rounds; None: 100 with L-BFGS, 20
        (the paper's value) with Adam.
    local_steps : int, default=None
        Per round, the L-BFGS-B iterations (or Adam steps) each client takes
        on its own hyperparameters; None: 20 with L-BFGS, 80 with Adam.
    global_steps : int, default=None
        Structured family: per round, the server's L-BFGS-B iterations (or
        Adam steps) on the global hyperparameters; None: 20 with L-BFGS, 1
        with Adam; 0 holds them. The mean-field family takes one Adam step
        per round (the paper's Algorithm 1: the clients' gradients are those
        of the broadcast vector); another value is ignored there with a
        ``UserWarning``.
    tol : float, default=None
        Structured family: stop when a round increases the objective by less
        than ``tol * max(|objective|, n_samples)`` (``n_samples``: the
        number of training rows). None: 1e-4, or 3e-3 with
        multi-output targets, whose objective creeps up for tens of rounds
        after the predictions have settled, towards optima that predict no
        better (type-II maximum likelihood over many client loadings): on the
        paper's scenarios A-D (19 runs) 16.5 rounds on average against 28.8
        with 1e-3, the same RMSE and NLL (differences -0.001 +- 0.003 and
        0.004 +- 0.039) and 95 % coverage 0.933 against 0.928; earlier, 1e-3
        against 1e-4 had halved the time at the same accuracy
        (docs/multioutput_accuracy.md).
    noise_prior_scale : float or None, default=1.0
        Structured family: standard deviation of a log-normal hyperprior on
        the noise variance of each client whose own pilot is not reliable
        (and, for a client of 32 or more rows, whose centre is identified:
        see below).
        A client with 1-D ``y`` and at least 32 observations and 10 per
        hyperparameter of its pilot (the number of features used by the
        model plus 2) among the at most 256 points its pilot uses has no
        noise hyperprior: its data decide (``clients_[label].noise_hyperprior``
        is False; a prior centred on its own pilot's estimate, the same data
        fitted with a single kernel, pinned its noise there). For another
        client with 1-D ``y`` whose rows repeat inputs (at least 10
        pure-error degrees of freedom, a spread above twice its noise floor;
        with 24 or more features no pilot qualifies, so any such client) the
        prior is centred at the variance of its targets around their means
        at equal inputs, and otherwise at the median of the clients'
        pilot noise variances weighted by their numbers of points (leaving
        out pilots that interpolated their points, with less than one
        residual degree of freedom, unless those left hold fewer than 10
        residual degrees of freedom in all; then the pilots did not identify
        the noise and a client of 32 or more rows centred there has no
        noise hyperprior), the
        clients with 4-31 points (at least 3 of them, 30 points in all,
        1-D ``y``) counting with one pilot they fit together (empirical
        Bayes; docs/maths.md section 10). It keeps a data-poor client
        from driving its noise to zero and interpolating its few points.
        For a client of the pooled pilot, the prior's standard deviation is
        the spread of the pooled clients' log noise variances where they
        measure it (a random-effects, DerSimonian-Laird estimate ``tau``
        from each client's score and Fisher information at the pooled fit,
        ``federated.noise_spread``, at least 0.5): around the population's
        centre, with that centre's distance from the pooled value added (at
        most ``noise_prior_scale``), or, when that distance exceeds
        ``2 tau`` (small clients of another noise level than the larger
        ones around them), around the pooled noise itself
        (``server_.population_pilot.noise_pooled``; 5 clients x 12 points
        of noise sd 0.3 beside 3 x 100 of sd 0.05, seeds 0-5: held-out NLL
        of the small clients 0.227 against 0.781 held near the large
        clients' noise, exact GP given each client's noise 0.211); clients of one noise
        level then share it more closely (5 clients x 12 points, noise sd
        0.3, seeds 0-5: held-out NLL 0.329 and 0.295 against 0.362 and
        0.314 with integer and continuous inputs; exact GP 0.308 and 0.280;
        ``benchmarks/bench_noise_spread.py``), while clients of clearly
        different noise levels mostly keep ``noise_prior_scale`` (noise sd
        0.1-1.0 across 5 clients, seeds 0-5: 5 of 6 unchanged)
        (``server_.population_pilot.noise_spread``,
        ``clients_[label].noise_prior_sd``; None: ``noise_prior_scale``
        applies: no pool, fewer than 3 clients pooled, their standard errors
        above ``noise_prior_scale``, a client lost in that exchange, or a
        client outside the pool).
        With a 1-D ``y``
        each client's local standard deviation ``sigma_l`` also gets the
        penalised-complexity prior ``p(sigma_l) ∝ exp(-lambda sigma_l)``
        with ``P(sigma_l > sigma_pop) = 0.05``, ``sigma_pop`` the larger of
        the pilots' median signal std and the client's own target std
        (Simpson et al., *Statistical Science* 32(1), 2017), so a client
        with a handful of points cannot turn its local part into a second,
        freely scaled level, while a local part not needed can still switch
        off. A client with fewer than 32 observations also gets
        ``log ell_l ~ N(log ell_pop, 1)`` on each local lengthscale,
        ``ell_pop`` the population's lengthscales (the pilots' weighted
        median, the small clients counting with their pooled pilot when
        they form one; a given ``local_lengthscale`` is its own centre): a
        handful of points cannot tell which inputs its departure varies in,
        and a fit that switched inputs off (lengthscales at their upper
        bound) left its band far too narrow away from its points (30 clients
        x 10 points in 5 inputs: 13 % of held-out points beyond 3 std, now
        5 %; an exact GP with one-hot client columns 1.3 %). From round 2 a
        client with fewer than 32 observations on the clients' typical scale
        (and no learned scale of its own) instead
        takes a log-normal prior (sd 1) on its local lengthscales and
        variance centred on the larger clients' local kernels: their
        lengthscales and the mean size of their fitted departures, once at
        least two clients of 32 observations or more on the typical scale
        have fitted theirs, unless that mean is below the size at which a
        local part counts as switched off
        (``server_.local_prior_centre_``; docs/maths.md section 10). With
        a 1-D ``y`` the server puts the gamma prior of shape 2 and rate 0 on
        the clients' level standard deviation ``tau``, ``log p = log tau``
        (Chung, Rabe-Hesketh, Dorie, Gelman and Liu, *Psychometrika* 78(4),
        2013, section 3), which keeps levels the data hardly tell apart
        (clients on disjoint input ranges) from collapsing to one
        (docs/maths.md section 13); not with a single client, whose level
        variance it would push to its upper bound. None: no priors (maximum likelihood;
        also none on ``client_scale``, no local-kernel prior and none on
        the level variance).
    client_scale : {"auto", True, False}, default="auto"
        Structured family, 1-D targets: clients that learn their own scale
        ``s_i`` on the shared parts, so client ``i``'s function is
        ``level_i + s_i (g + d_i) + l_i`` (beyond the paper;
        docs/maths.md, section 10). A client measured in other units, or
        whose series is nearly flat, then uses the shared function at its
        own scale instead of pulling the shared hyperparameters towards
        it. ``"auto"``: the clients whose within-client target variance is
        more than 10 times off the clients' typical one (the median
        within-client standard deviation, squared) either way, beyond what
        chance gives a client of their number of rows, and whose noise is
        not the population's either (another unit, not a flat or steep
        stretch of the same function; ``federated.learns_client_scale``),
        and the clients whose own data reject the population's
        lengthscales, their pilot's being more than 5 times longer or
        shorter (inputs on another scale: the others' function stretched
        over a far wider box; ``federated.lengthscale_mismatch``, a
        likelihood-ratio test on the client's own rows, whose local kernel
        then also keeps its own lengthscales' prior and restart), or whose
        own data vary along one input on another scale and range than the
        typical client's (``federated.input_scale_mismatch``, the test of
        ``InputScaleWarning``; at a fresh fit such a client is also left
        out of the boxes the global inducing inputs are placed in, with
        True as well); the others keep ``s_i = 1``. True: every client. A
        learned ``s_i`` starts at the square root of that ratio (1 for a
        client within it) and is parametrised by the client's amplitude ``s_i sqrt(variance_g)``
        with a weak log-normal prior (sd 3, natural log) centred at its start
        (``noise_prior_scale=None`` removes it). A never-seen client takes
        the median of the clients' log scales
        (``client_scales_``). False: every ``s_i = 1`` (the paper's model).
        Ignored for multi-output targets, whose clients' loadings carry
        their scales, and for the mean-field family.
    n_latent : int or tuple of 3 ints, default=2
        Multi-output (ILMM) targets only: the numbers ``(R_g, R_d, R_l)`` of
        latent functions of the global, deviation and local parts (an int
        sets all three; ``R_d <= R_g``, since deviation latent ``r`` shares
        global latent ``r``'s kernel and inducing inputs). Each latent
        function has its own lengthscales and unit variance; the loadings
        ``B_g`` (``Q x R_g``, on the server) and ``B_d``, ``B_l`` (each
        client's own) carry the scales. Ignored for one target column.
    noise : {"diagonal", "isotropic", "isotropic_target"}, default="diagonal"
        Multi-output targets only; every output is standardised by its own
        scale ``y_scale_[q]``. "diagonal": one noise variance per client and
        output. "isotropic": one per client shared by its outputs in
        standardised units (the paper's ``s2_i I_Q``), i.e. the same share
        of every output's variance; the fit does not depend on the units of
        each column. "isotropic_target": one per client in *target* units,
        for outputs measured in one unit whose noise is the same (as in the
        paper's synthetic benchmark): output ``q`` gets ``s2_i *
        mean(y_scale_**2) / y_scale_[q]**2`` in standardised units.
        "diagonal" is the default (beyond the paper): outputs whose noise
        differs in share of their variance are common, and one shared value
        then makes the noisier outputs' intervals too narrow and the
        cleaner ones' too wide (3 clients, outputs with noise sd 0.05, 0.05
        and 0.8: 10-13 % of the noisy output's held-out points beyond 3 std
        and 95 % coverage 0.67 with "isotropic", 1.7 % and 0.85-0.92 with
        "diagonal"), while on the paper's benchmark, whose noise is the same
        for every output, the two gave the same accuracy (docs/
        multioutput_accuracy.md).
    learning_rate : float, default=0.1
        Adam step size of the clients' local steps (``optimizer="adam"``).
    global_learning_rate : float, default=0.1
        Adam step size of the server's global step (``optimizer="adam"``).
    variational_update : {"closed_form", "adam"}, default="closed_form"
        Mean-field family only: how its Gaussian factors are updated.
        ``"adam"`` is the paper's Algorithm 1: every parameter, the factors
        included, moves by Adam steps. ``"closed_form"`` (``docs/maths.md``
        section 7) sets ``q(v_g)`` exactly each round from the clients'
        ``W_g^T W_g / s2_i`` and ``W_g^T r_i / s2_i`` and the clients' own
        factors every 5 local steps; Adam moves only the hyperparameters.
    normalize_y : bool, default=True
        Subtract a mean of the targets (computed by the server from each
        client's count and sum). With the structured family targets are
        always divided by the median of the clients' own standard deviations
        (so initial values, bounds and floors follow the data's scale
        whatever this flag), and every client has its own level, so the flag
        only sets the centre of the levels: the mean of the clients' means
        (each client counted once; for multi-output targets the pooled mean
        of each output), or 0. Mean-field family: standardise with the
        pooled mean and standard deviation or, with ``normalize_y=False``,
        divide by the root mean square of the targets without an offset (so
        initial values, bounds and floors follow the data's scale either
        way; with a level far above the spread, e.g. ``1e4 + sin x``, the
        noise floor, ``1e-6`` of that scale squared, can then exceed the
        noise and the band is too wide: use ``normalize_y=True`` there).
    client_column : int or str, default=None
        If given, this column of ``X`` holds each row's client label and is
        not used as a feature (so the estimator works inside a Pipeline or
        GridSearchCV without metadata routing). As in
        :class:`~sklearn.compose.ColumnTransformer`, an int is a position
        (negative counts from the end) and a str is a pandas column name.
        The column is taken out before the features are converted to float,
        so it may hold strings (``client_column="station"`` with
        ``df[["station", "temp", "hum"]]``). Overrides ``groups`` (a ``groups`` that
        differs from the column gets a ``ClientLabelWarning``). An int that
        is also the name of another column of a DataFrame gets a
        ``ClientLabelWarning`` (the position is used): give such a frame
        text column names.
    n_jobs : int, default=None
        Number of parallel jobs for the clients (:class:`joblib.Parallel`,
        threads by default; any joblib backend, e.g. dask, applies).
    random_state : int, RandomState instance or None, default=None
        Seeds the pilot subsets, the initial inducing points (Sobol designs)
        and, with ``client_fraction < 1``, the sampling of each round's
        clients.
    verbose : int, default=0
        If > 0, print one line per round (ELBO, time, bytes exchanged).
    client_fraction : float in (0, 1], default=1.0
        Structured family: share of the clients that take part in each round
        (at least ``min_clients``), sampled with ``random_state``. An absent
        client's last Gaussian message ``(S_i, b_i, e_i)`` is held fixed on
        the server (a stale site, as in partitioned variational inference)
        and it skips its local phase; the ELBO of such a round is that of the
        bound with the stale sites, and the final exchange, with every
        client, makes ``elbo_history_[-1]`` exact again
        (:func:`skfedgp.federated.run_structured_training`,
        ``docs/deployment.md``).
    min_clients : int, default=1
        Structured family: fewest clients sampled per round; a round in
        which fewer answer is skipped with a
        :class:`~skfedgp.federated.RoundSkippedWarning`. More than the
        clients in the data is a ``ValueError``.
    max_retries : int, default=1
        Structured family: retries of a failed client call (an exception or
        a message with NaN/inf) before the client counts as absent for the
        round; in the set-up and the final exchange it is then excluded from
        the model (``excluded_clients_``).
    fault_hook : callable or None, default=None
        Structured family: ``fault_hook(client_id, method, round)``, called
        before every client call; raising there makes the call fail
        (failure injection, chaos testing; see
        :class:`~skfedgp.federated.JoblibTransport`).
    warm_start : bool, default=False
        Structured family: when True and the estimator is fitted, ``fit``
        continues from the fitted global vector and each client's local
        vector (every client first sends fresh statistics, as the data may
        have changed) and runs up to ``n_rounds`` more rounds; the histories
        continue. A client not in the fitted model is initialised as in a
        first fit; a fitted client missing from the data is dropped. Labels
        that only look like fitted ones (``'0'`` after ``0``, ``True`` after
        ``1``) raise ``ValueError``, as such a mix does in a first fit. The
        target standardisation and input scaling of the first fit are kept.
        The settings that define the model's vectors (``components``,
        ``n_inducing``, ``n_inducing_local``, ``variational_family``, the
        number of target columns, ``client_scale``, ``normalize_y``; with
        multi-output targets ``n_latent`` and ``noise``) must be those of
        the fitted model (otherwise ``ValueError``; ``n_inducing="auto"``
        must stay ``"auto"``); the optimiser, steps, tolerances, starting
        values, learning rates and priors may change (Adam's moments
        continue from the fitted model).
    checkpoint : str, path-like, callable or None, default=None
        Structured family: after every round, save the
        :class:`~skfedgp.federated.TrainingState` to this path (overwritten;
        its folder must exist, checked before training) or call
        ``checkpoint(round, state)``.
    resume_from : TrainingState, str, path-like or None, default=None
        Structured family: continue from a saved state on the same clients;
        with the same data the result is identical to an uninterrupted run
        (``n_rounds`` more rounds). The saved model settings must match as
        for ``warm_start`` (``ValueError`` naming the setting otherwise).

    Attributes
    ----------
    clients_ : dict
        Client label to that client's model object (its local
        hyperparameters, inducing inputs and, for the structured family, the
        posterior moments of its own variables): what a deployed client would
        keep. No observation is kept after fit.
    server_ : skfedgp.federated.Server
        The server, with the global hyperparameters.
    global_posterior_ : dict
        Structured family: ``{"mean": (M,), "covariance": (M, M)}``, the exact
        ``q(v_g)`` (whitened, standardised units).
    elbo_history_ : list of float
        ELBO after each round (standardised units); the last entry is the
        ELBO of the returned model.
    objective_history_ : list of float
        Structured family: ELBO plus the log hyperpriors, the clients' and
        (1-D ``y``) the level variance's (the
        objective that every L-BFGS-B round increases; Adam rounds may lose
        some of it). A small client's local-kernel prior changes when it
        receives the population's centre (before round 2 with every client
        taking part; docs/maths.md section 10), so the history can drop
        once, between the round before and the round after.
    n_iter_ : int
        Number of rounds run (0 with ``n_rounds=0``: the set-up's model;
        with ``warm_start`` or ``resume_from`` it counts the earlier rounds
        too; a skipped round counts), by the kept run
        (``restart_from_global``).
    n_inducing_ : int
        Number of global inducing points used (0 without the global and
        deviation components, structured family).
    trace_term_ : float or None
        Structured family: the trace term of the collapsed bound at the
        returned model, summed over the clients (nats): the prior variance
        the global and local inducing points leave unexplained at each
        client's inputs over twice its noise variance (Titsias, AISTATS 2009,
        eq. 9; each client sends its own sum with its final message). It
        bounds what better inducing inputs could add to the ELBO at these
        hyperparameters (Burt, Rasmussen and van der Wilk, JMLR 21, 2020):
        large values mean a loose bound and hyperparameters pulled towards
        what the inducing points can represent
        (:class:`~skfedgp.regressor.SparseApproximationWarning`). NaN when
        a client could not compute its part (a Cholesky factorisation
        failed); None when a client sent none (an earlier version).
    n_evaluations_ : int
        Structured family: number of evaluations of the collapsed bound
        during training, two exchanges each (the final exchange is not
        counted), over every run (``lengthscale_starts``,
        ``restart_from_global``).
    n_features_model_ : int
        Number of input features the model uses (``n_features_in_`` without
        the ``client_column``).
    learn_inducing_locations_ : bool
        Whether the global inducing inputs were optimised
        (``learn_inducing_locations``; with "auto", the structured family's
        decision at the end of training; False when there are none, i.e. neither the global
        nor the deviation part). Each structured client's decision for its
        own local inducing inputs is ``clients_[label].learn_local_inducing``
        (False without a local part).
    lengthscale_start_ : float
        Structured family: the factor applied to the kept run (1.0 when none
        was: the default, a given ``lengthscale``, no global kernel,
        ``n_rounds=0``, a kept second run of ``restart_from_global``; a
        warm start or resume keeps its fit's value).
    global_only_elbo_ : float or None
        The final ELBO (as ``elbo_history_``) of the global-only fit made by
        ``restart_from_global`` in this call of :meth:`fit`; None when none
        was made or it raised (also after a ``warm_start`` continuation).
    restarted_from_global_ : bool or None
        Whether the kept run is the one started from the global-only fit's
        lengthscales (``restart_from_global``; with multi-output targets, True
        whenever the global-only fit came first); False when the first run was
        kept, no second run was needed or the second run raised; None when
        no global-only fit was made or it raised.
    client_offsets_ : dict
        Structured family: each client's constant mean in target units (with
        a 1-D ``y``, the posterior mean of its random level).
    client_scales_ : dict
        Structured family, 1-D ``y``: each client's fitted scale ``s_i`` on
        the shared parts (dimensionless; 1 for a client that learned none).
        A never-seen client takes their median.
    level_variance_ : float
        Structured family, 1-D ``y``: fitted variance of the clients' random
        levels around ``y_offset_`` (target units squared); with 2 clients
        or more, a penalised estimate (the gamma(2, 0) prior on its square
        root, ``noise_prior_scale``).
    communication_ : list of dict
        Bytes uploaded and downloaded per round (keys ``"round"``,
        ``"bytes_up"``, ``"bytes_down"``, ``"n_messages"``): round 0 is the
        set-up (summaries, pilot hyperparameters), the last record the final
        exchange (structured) or the closed-form polish (mean-field), marked
        ``"final": True``. After a ``warm_start`` the earlier fit's final
        record stays, with the number of the round that continued it.
        Round 1's record also counts the traffic of every other run
        (``lengthscale_starts``, ``restart_from_global``).
    components_ : tuple of str
        Components used, in canonical order.
    variational_family_ : str
    y_offset_, y_scale_ : float or ndarray of shape (n_outputs_,)
        Target standardisation (``(y - y_offset_) / y_scale_``), per output
        for multi-output targets.
    n_outputs_ : int
        Number of target columns ``Q`` (1 for a 1-D ``y``).
    loadings_ : dict
        Multi-output targets only: ``{"global": B_g (Q, R_g), "deviation":
        {label: B_d (Q, R_d)}, "local": {label: B_l (Q, R_l)}}`` in target
        units (row ``q`` multiplied by ``y_scale_[q]``), for the fitted
        components; the deviation latent functions have variance ``phi_``,
        the others 1.
    phi_ : float
        Fitted deviation scale ``phi`` (when the deviation is used). At its
        upper bound (1e4) the shared global part is switched off relative to
        the clients' deviations (the clients share little); then only
        ``phi_`` times the global variance, the deviations' variance, is
        meaningful, and no warning is given (a documented outcome, as a
        variance at its lower bound).
    failed_clients_ : list of tuple
        Structured family: ``(round, client_id, method, error)`` for every
        failed client call (retries included); round 0 is the set-up.
    excluded_clients_ : list
        Structured family: clients left out of the model because they failed
        in the set-up or the final exchange.
    n_features_in_ : int
        Number of columns of ``X`` seen in fit, *including* the
        ``client_column``: the columns of ``X`` as passed, which is what
        scikit-learn checks at predict and what a Pipeline step hands on.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names of ``X`` seen in fit (label column included), when
        ``X`` was a DataFrame with string column names; predict then checks
        them.
    client_column_ : int, str or None
        The ``client_column`` of the fit, which prediction uses (a value set
        with ``set_params`` after fit applies from the next fit on).

    Notes
    -----
    Client labels are compared by value and type (``1`` and ``"1"`` are two
    clients); None and NaN labels are rejected.  Prediction for a client
    never seen in fit (or for ``groups=None`` when several clients were
    fitted, which issues a :class:`ClientLabelWarning`, as does a label that
    only matches a fitted one up to type, white space or case, or is of a
    type no fitted label has) uses the
    exact posterior of the global part plus the *prior* of the deviation and
    local parts (``docs/maths.md`` section 8), with the population local
    hyperparameters (from the clients' final messages: the mean of their
    local variances, the variance-weighted geometric mean of their local
    lengthscales, the geometric mean of their noise variances); a new client's level is a new draw. With a 1-D ``y`` it is
    centred at ``y_offset_`` with variance ``level_variance (T + 1) /
    (T - 1)`` for ``T`` fitted clients (the level variance and the pooled
    mean are estimates); with multi-output targets it is centred at the
    mean of the clients' constant means with ``(1 + 1/T)`` times their
    sample covariance. Its predictive variance is therefore wider.

    A fitted client's constant mean is an estimate. With a 1-D ``y`` its
    level's posterior is part of the client's posterior, so its uncertainty
    is in every prediction and in ``return_cov``. For multi-output targets
    prediction integrates each constant under a flat prior (the other
    clients' held at their estimates): the variance gains
    ``Var(c_i) (1 + d mean / d c_i)^2``, ordinary kriging's correction for
    an estimated constant mean (Cressie, *Statistics for Spatial Data*,
    revised edition, Wiley, 1993, section 3.2; ``docs/maths.md`` section
    13); across clients, ``return_cov`` holds the other clients' constants
    fixed.

    When not to use it: a single client with a few thousand points or less
    is fitted faster and as well by scikit-learn's exact
    ``GaussianProcessRegressor``; non-Gaussian noise, non-stationary
    functions or kernels other than the squared exponential are not
    covered. To tune: raise ``n_inducing`` if the global function has more
    detail than the automatic size resolves (the ELBO tells), lower ``tol``
    or raise ``n_rounds`` when a ``ConvergenceWarning`` says the budget
    ended first.

    References
    ----------
    H. Yan, "Personalized Federated Hierarchical Gaussian Processes for
    Privacy-Preserving Modeling of Heterogeneous Distributed Systems", arXiv
    preprint arXiv:2609.19337 (2026): sections 3.1–3.7, Algorithm 1, eq. 30.

    M. Titsias, "Variational learning of inducing variables in sparse
    Gaussian processes", AISTATS 2009.

    Y. Gal, M. van der Wilk, C. E. Rasmussen, "Distributed Variational
    Inference in Sparse Gaussian Process Regression and Latent Variable
    Models", NeurIPS 2014 (collapsed bound from summed statistics).

    J. Hensman, N. Fusi, N. D. Lawrence, "Gaussian processes for big data",
    UAI 2013.

    Examples
    --------
    >>> from skfedgp import FederatedHierarchicalGPRegressor
    >>> from skfedgp.datasets import make_hierarchical_regression
    >>> X, y, groups = make_hierarchical_regression(n_clients=3, random_state=0)
    >>> est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups)
    >>> mean, std = est.predict(X[:5], groups[:5], return_std=True)
    """

    #: An estimator pickled before ``learn_inducing_locations`` existed has no
    #: such attribute: it learned its inducing inputs, and refits as it did.
    learn_inducing_locations = True

    def __init__(
        self,
        *,
        n_inducing="auto",
        n_inducing_local="auto",
        learn_inducing_locations="auto",
        components=("global", "deviation", "local"),
        lengthscale=None,
        lengthscale_starts=(1.0,),
        restart_from_global="auto",
        local_lengthscale=None,
        variance=None,
        local_variance=None,
        noise_variance=None,
        phi=None,
        variational_family="structured",
        optimizer="lbfgs",
        n_rounds=None,
        local_steps=None,
        global_steps=None,
        tol=None,
        noise_prior_scale=1.0,
        client_scale="auto",
        n_latent=2,
        noise="diagonal",
        learning_rate=0.1,
        global_learning_rate=0.1,
        variational_update="closed_form",
        normalize_y=True,
        client_column=None,
        n_jobs=None,
        random_state=None,
        verbose=0,
        client_fraction=1.0,
        min_clients=1,
        max_retries=1,
        fault_hook=None,
        warm_start=False,
        checkpoint=None,
        resume_from=None,
    ):
        self.n_inducing = n_inducing
        self.n_inducing_local = n_inducing_local
        self.learn_inducing_locations = learn_inducing_locations
        self.components = components
        self.lengthscale = lengthscale
        self.lengthscale_starts = lengthscale_starts
        self.restart_from_global = restart_from_global
        self.local_lengthscale = local_lengthscale
        self.variance = variance
        self.local_variance = local_variance
        self.noise_variance = noise_variance
        self.phi = phi
        self.variational_family = variational_family
        self.optimizer = optimizer
        self.n_rounds = n_rounds
        self.local_steps = local_steps
        self.global_steps = global_steps
        self.tol = tol
        self.noise_prior_scale = noise_prior_scale
        self.client_scale = client_scale
        self.n_latent = n_latent
        self.noise = noise
        self.learning_rate = learning_rate
        self.global_learning_rate = global_learning_rate
        self.variational_update = variational_update
        self.normalize_y = normalize_y
        self.client_column = client_column
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose
        self.client_fraction = client_fraction
        self.min_clients = min_clients
        self.max_retries = max_retries
        self.fault_hook = fault_hook
        self.warm_start = warm_start
        self.checkpoint = checkpoint
        self.resume_from = resume_from

    # ------------------------------------------------------------------
    # validation helpers
    # ------------------------------------------------------------------
    def _check_global_steps(self, steps, structured):
        """``global_steps`` as validated; the mean-field family takes exactly one."""
        if not structured and steps != 1:
            warnings.warn(
                f"global_steps={self.global_steps!r} is ignored: it applies to the structured "
                "family; variational_family='mean_field' takes one Adam step on the global "
                "block per round (the paper's Algorithm 1)", UserWarning,
                stacklevel=user_stacklevel())
            return 1
        return steps

    def _component_names(self):
        """``components`` as a tuple (a string is one name; a non-sequence gives ())."""
        comps = self.components
        if isinstance(comps, str):
            return (comps,)
        try:
            return tuple(comps)
        except TypeError:  # None, a number: refused by _check_params
            return ()

    def _check_params(self):
        comps = self._component_names()
        unknown = [c for c in comps if c not in COMPONENTS]
        if not comps or unknown:
            raise ValueError(
                f"components must be a non-empty subset of {COMPONENTS}, got {self.components!r}"
            )
        comps = tuple(c for c in COMPONENTS if c in comps)
        # read as a truth value by fit: a string 'False' would continue the fit
        check_bool(self.warm_start, "warm_start")
        check_n_jobs(self.n_jobs)
        if self.fault_hook is not None and not callable(self.fault_hook):
            raise ValueError(
                f"fault_hook must be a callable fault_hook(client_id, method, round) or None, "
                f"got {self.fault_hook!r}")
        if not isinstance(self.verbose, numbers.Integral):
            raise ValueError(
                f"verbose must be an int (0 or less: silent), got {self.verbose!r}")
        family = self.variational_family
        if family not in ("structured", "mean_field"):
            raise ValueError(
                f"variational_family must be 'structured' or 'mean_field', got {family!r}")
        optimizer = self.optimizer
        if optimizer not in ("lbfgs", "adam"):
            raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
        if family == "mean_field" and optimizer == "lbfgs":
            raise ValueError(
                "optimizer='lbfgs' needs variational_family='structured' (the collapsed "
                "bound is deterministic); the mean-field family is trained with "
                "optimizer='adam' (the paper's Algorithm 1)")
        structured = family == "structured"

        def _int(name, minimum=1, default=None, auto=False):
            v = getattr(self, name)
            if v is None and default is not None:
                return default
            if auto and isinstance(v, str) and v == "auto":
                return "auto"
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < minimum:
                extra = " or 'auto'" if auto else ""
                raise ValueError(f"{name} must be an integer >= {minimum}{extra}, got {v!r}")
            return int(v)

        def _pos_float(name, default=None):
            v = getattr(self, name)
            return default if v is None else check_real(v, name)

        lbfgs = optimizer == "lbfgs"
        client_scale = self._check_auto_flag("client_scale")  # validated for every family
        n_inducing = _int("n_inducing", auto=True)
        n_inducing_local = _int("n_inducing_local", auto=True)
        if not structured:
            # the mean-field family keeps its fixed sizes and initial values
            n_inducing = 25 if n_inducing == "auto" else n_inducing
            n_inducing_local = 25 if n_inducing_local == "auto" else n_inducing_local
        mf = not structured
        config = ModelConfig(
            components=comps,
            n_inducing=n_inducing,
            n_inducing_local=n_inducing_local,
            lengthscale=self.lengthscale,
            local_lengthscale=self.local_lengthscale,
            variance=_pos_float("variance", 1.0 if mf else None),
            local_variance=_pos_float("local_variance", 1.0 if mf else None),
            noise_variance=_pos_float("noise_variance"),
            phi=_pos_float("phi", 1.0 if mf else None),
            local_steps=_int("local_steps", 0, default=20 if lbfgs else 80),
            learning_rate=_pos_float("learning_rate"),
            global_learning_rate=_pos_float("global_learning_rate"),
            normalize_y=check_bool(self.normalize_y, "normalize_y"),
            variational_update=self._check_variational_update(),
            variational_family=family,
            optimizer=optimizer,
            tol=(TOL if self.tol is None else check_real(self.tol, "tol", positive=False)),
            global_steps=self._check_global_steps(_int("global_steps", 0,
                                                       default=20 if lbfgs else 1),
                                                  structured),
            noise_prior_scale=_pos_float("noise_prior_scale"),
            n_latent=self._check_n_latent(comps),
            noise=self._check_noise(),
            learn_inducing=self._check_auto_flag("learn_inducing_locations"),
            client_scale=client_scale if structured else False,
            lengthscale_starts=self._check_lengthscale_starts(),
        )
        if config.learning_rate is None or config.global_learning_rate is None:
            raise ValueError("learning_rate and global_learning_rate must be positive numbers")
        # used by fit; checked here for every caller (Flower too)
        self._check_auto_flag("restart_from_global")
        n_rounds = _int("n_rounds", 0, default=100 if lbfgs else 20)
        return config, n_rounds

    def _check_lengthscale_starts(self):
        v = self.lengthscale_starts
        if isinstance(v, str) and v == "multi":
            return (1.0, 3.0)
        try:
            factors = tuple(v)
        except TypeError:
            factors = ()
        if not factors or not all(
                isinstance(f, numbers.Real) and not isinstance(f, bool) and np.isfinite(f)
                and f > 0 for f in factors):
            raise ValueError(
                "lengthscale_starts must be 'multi' or a non-empty sequence of finite positive "
                f"factors, got {v!r}")
        return tuple(float(f) for f in factors)

    def _check_auto_flag(self, name):
        """The parameter ``name`` as ``"auto"``, True or False (ValueError otherwise)."""
        v = getattr(self, name)
        if isinstance(v, str) and v == "auto":
            return "auto"
        if not isinstance(v, (bool, np.bool_)):
            raise ValueError(f"{name} must be True, False or 'auto', got {v!r}")
        return bool(v)

    def _check_n_latent(self, comps):
        v = self.n_latent
        ranks = (v, v, v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
        try:
            ranks = tuple(ranks)
        except TypeError:
            ranks = ()
        if len(ranks) != 3 or not all(
                isinstance(r, numbers.Integral) and not isinstance(r, bool) and r >= 1
                for r in ranks):
            raise ValueError(
                f"n_latent must be an integer >= 1 or a tuple (R_g, R_d, R_l) of three, "
                f"got {v!r}")
        ranks = tuple(int(r) for r in ranks)
        if "deviation" in comps and ranks[1] > ranks[0]:
            raise ValueError(
                f"n_latent=(R_g, R_d, R_l)={ranks}: R_d must be <= R_g (deviation latent r "
                "shares global latent r's kernel)")
        return ranks

    def _check_noise(self):
        from ._ilmm import check_noise

        return check_noise(self.noise)

    def _check_variational_update(self):
        if self.variational_update not in ("adam", "closed_form"):
            raise ValueError(
                f"variational_update must be 'adam' or 'closed_form', got {self.variational_update!r}"
            )
        return self.variational_update

    def _validate_fit_data(self, X, y, groups):
        """Features (float64), targets (1-D) and client labels (or None) of fit.

        With ``client_column`` the label column is taken out of ``X`` before
        the features are converted to float (it may hold strings), and
        ``n_features_in_``/``feature_names_in_`` describe ``X`` as passed,
        label column included (see :func:`skfedgp._validation.split_client_column`).
        """
        multi = _n_target_columns(y) > 1
        X, groups = unmask(X, "X"), unmask(groups, "groups")
        y = unmask(y, "y", missing_ok=multi)  # a masked output of a row is missing
        if multi:  # multi-output: NaN marks a missing output
            return self._validate_multioutput_fit_data(X, y, groups)
        check_not_strings(y)  # names the problem before scikit-learn's conversion
        if self.client_column is None:
            X, y = validate_data(
                self, X, y, y_numeric=True, multi_output=True, ensure_min_samples=1,
                dtype=np.float64,
            )
        else:
            X, labels = split_client_column(self, X, self.client_column, reset=True)
            X, y = check_X_y(X, y, y_numeric=True, multi_output=True, ensure_min_samples=1,
                             dtype=np.float64, estimator=self)
        if y.ndim == 2:
            y = column_or_1d(y, warn=True)  # DataConversionWarning, as scikit-learn does
        missing = np.flatnonzero(np.isnan(y))
        if missing.size:
            # scikit-learn's finite check passes None in an object array, which
            # the float conversion then turns into NaN
            rows = ", ".join(str(r) for r in missing[:10]) + (", ..." if missing.size > 10 else "")
            raise ValueError(
                f"Input y contains {missing.size} missing value(s) (None or NaN) at row(s) "
                f"{rows}; a one-column target must be observed in every row (drop those "
                "rows; only multi-output targets may have missing entries)")
        check_target_values(y)
        groups = check_groups(groups, X.shape[0], "fit")
        if self.client_column is not None:  # the column overrides groups
            groups = labels_from_column(groups, labels, self.client_column, "fit")
        return X, y, groups

    def _validate_multioutput_fit_data(self, X, y, groups):
        """Features, (n, Q) targets with NaN for missing outputs, and client labels.

        Raises
        ------
        ValueError
            As :func:`check_multioutput_targets`, and if an output is missing
            (NaN) in every row: ``"output q has no observed (non-NaN) value in
            any client"``, the server's set-up error, raised here so that a
            ``warm_start`` continuation (which skips that set-up) refuses it
            too and leaves the fitted model as it was.
        """
        labels = None
        if self.client_column is None:
            X = validate_data(self, X, reset=True, ensure_min_samples=1, dtype=np.float64)
        else:
            X, labels = split_client_column(self, X, self.client_column, reset=True)
            X = check_array(X, ensure_min_samples=1, dtype=np.float64, estimator=self)
        y = check_multioutput_targets(y, X.shape[0], estimator=self)
        unobserved = np.flatnonzero(np.all(np.isnan(y), axis=0))
        if unobserved.size:
            raise ValueError(
                f"output {int(unobserved[0])} has no observed (non-NaN) value in any client")
        groups = check_groups(groups, X.shape[0], "fit")
        if labels is not None:
            groups = labels_from_column(groups, labels, self.client_column, "fit")
        return X, y, groups

    def _validate_predict_X(self, X, groups, where):
        """Features (float64) and client labels (or None) at prediction
        (:func:`skfedgp._validation.validate_predict_input`)."""
        return validate_predict_input(self, X, groups, where)

    # ------------------------------------------------------------------
    # fit
    # ------------------------------------------------------------------
    @keep_state_on_error
    def fit(self, X, y, groups=None):
        """Fit the model federatedly, one client per distinct ``groups`` label.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Inputs (finite). With ``client_column`` set, one column holds the
            client labels.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets; a column vector is accepted with a
            ``DataConversionWarning``. With ``n_outputs > 1`` the model is
            the multi-output (ILMM) hierarchy (``n_latent``, ``noise``;
            ``docs/maths.md`` section 12; Yan 2026, section 3.9): a NaN entry
            is a missing output (a sensor that dropped out) and is left out
            of the likelihood, but every row needs at least one observed
            output; a masked entry of a ``numpy.ma.MaskedArray`` is the
            same as NaN there. One-column targets must be finite.
        groups : array-like of shape (n_samples,), default=None
            Client label of each row (any hashable, not None/NaN). None (and
            no ``client_column``) means a single client. Labels are compared
            by value and type, and a bool is never a number: labels of
            different types that look alike (``1`` and ``'1'``, ``True``
            and ``1`` or ``'true'``, ``b'a'`` and ``'a'``) raise a
            ``ValueError`` naming them, as such a mix is almost always a
            column read partly as text; cast the labels to one type. Labels
            all of one type (all bool included) are fine. The same holds for
            the labels of a ``client_column``.

        Returns
        -------
        self : FederatedHierarchicalGPRegressor
            The fitted estimator.

        Raises
        ------
        ValueError
            NaN/inf in ``X``, NaN/inf in a one-column ``y``, inf in a
            multi-output ``y`` or a row of it with every output missing, a
            masked entry in ``X``, ``groups`` or a one-column ``y`` (NumPy
            would read the value under the mask),
            clients with different numbers of outputs, inconsistent
            lengths, 1-D ``X``, wrong ``groups`` length, a
            missing (None/NaN) client label, a ``client_column`` that is
            not a column of ``X``, a client with fewer than 2 observations,
            targets whose spread float64 cannot hold (overflow or
            underflow), or bad hyperparameters; before any client is asked
            anything (structured family): a ``warm_start`` or
            ``resume_from`` with other model settings (or another number of
            target columns), a ``checkpoint`` path that names a folder or
            lies in a missing one, or ``min_clients`` above the number of
            clients. Mean-field family: a round (or the final polish) that
            sent a parameter outside its valid range, named with the round
            and the step sizes; the estimator keeps its earlier fitted
            state.
        TypeError
            If ``resume_from`` is a file that cannot be read as a saved
            :class:`~skfedgp.federated.TrainingState`.
        skfedgp.CholeskyError
            If a ``K_zz`` cannot be factorised even with jitter (names the
            matrix and client).
        FloatingPointError
            If training produces a non-finite ELBO or gradient, or a global
            posterior precision that is not positive definite in floating
            point.
        skfedgp.federated.TrainingFailedError
            If every client failed or was excluded (structured family).

        Warns
        -----
        sklearn.exceptions.ConvergenceWarning
            When ``n_rounds`` ended before the ELBO converged (``tol``), or a
            hyperparameter ended at a bound of its range (named, with the
            likely reason: a noise variance at its floor means nearly
            noise-free data). Not for a variance or ``phi`` at its lower
            bound (a component switched off), ``phi`` at its upper bound
            (the shared part switched off relative to the deviations) or a
            lengthscale at its upper bound (an input switched off): these
            are regular outcomes. Also when a client's local phase failed
            whenever it was asked (its own hyperparameters are still those
            this fit started from). Mean-field family, after at least one
            round: when the final ELBO is more than
            :data:`skfedgp.federated.NULL_MARGIN` (1) nat per observation
            below the targets taken as independent noise about each
            client's own mean (about the pooled mean without client parts;
            :func:`skfedgp.federated.null_log_likelihood`): in practice Adam
            steps too large (``learning_rate``) or far too few rounds.
        UnderObservedOutputWarning
            Multi-output targets: an output whose observing clients hold
            fewer than two of its values each on average (its predictive
            variance is raised to a floor from its pooled values).
        ClientFittedAsNoiseWarning
            When training converged (1-D targets, structured family) and a
            client's fitted noise variance is at least a tenth of its target
            variance and more than 10 times its own exact GP's.
        InputScaleWarning
            Structured family, 1-D targets, a client set up by this fit (at a
            fresh fit, or new at a warm start or resumed run): a client whose
            own data vary along an input on a
            lengthscale more than 10 times the typical client's, over a range
            more than 3 times the typical one the same way (usually that
            input in other units at that client). With ``client_scale`` on,
            that client has learned its own scale on the shared parts and
            (at a fresh fit) was left out of the global inducing design;
            with ``client_scale=False`` the fit is unchanged.
        ClientLabelWarning
            When ``groups`` differs from the ``client_column``, or an int
            ``client_column`` (a position) is also the name of another
            column of a DataFrame ``X``.
        SharedPartsOffWarning
            When two or more clients took part and the global variance ended
            within ten times its lower bound: the clients share no function
            (expected for unrelated clients; otherwise often inputs or
            targets in different units; or every client's targets are
            constant, which the message then says).
        SparseApproximationWarning
            When training converged and ``trace_term_`` exceeds 0.03 nats
            per observation and 5 nats in all: the sparse bound is loose and
            the predictive std may be too small away from the data (typical
            of nearly noise-free targets).
        UserWarning
            When a given ``n_inducing`` exceeds the number of observations
            (it is reduced to it); when an extra run of
            ``restart_from_global`` raised (the first run is kept; with
            multi-output targets, when the global-only fit that comes first
            raised, the full model starts from the pilots' lengthscales).

        Notes
        -----
        On any error the estimator keeps its previous fitted state (or stays
        unfitted): nothing half-fitted is left behind.
        """
        mode = self._check_auto_flag("restart_from_global")
        restart = bool(mode) and self._may_restart_from_global()
        # validate_data sets n_features_in_ (and feature_names_in_) before
        # training can fail: keep_state_on_error restores the fitted state.
        # With a restart possible, the end-of-fit diagnostics wait until the
        # run to keep is known, and _fit keeps the validated data meanwhile
        self._restart_pending = restart
        # the extra runs of restart_from_global reuse the clients' pilots
        with pilot_memo() if restart else contextlib.nullcontext():
            try:
                self._fit(X, y, groups)
            finally:
                del self._restart_pending
            self.client_column_ = self.client_column
            # multi-output targets: set by _fit when the global-only fit came first
            self.global_only_elbo_, self.restarted_from_global_ = self.__dict__.pop(
                "_global_first", (None, None))
            if restart:
                data = self.__dict__.pop("_fit_data", None)
                if data is not None and self.n_outputs_ == 1 and self.n_iter_ > 0:
                    self._restart_from_global(*data, mode)
                self._issue_diagnostics()
        return self

    def _may_restart_from_global(self):
        """Whether the settings allow :meth:`_restart_from_global` (before the fit)."""
        comps = self._component_names()
        return (self.variational_family == "structured" and "global" in comps
                and ("deviation" in comps or "local" in comps) and self.lengthscale is None
                and not (self.warm_start and hasattr(self, "server_"))
                and self.resume_from is None
                and self.checkpoint is None and self.fault_hook is None
                and self.n_rounds != 0)

    def _restart_from_global(self, X, y, groups, mode):
        """Fit the global-only model; maybe train the full model again from its lengthscales.

        The full model contains the global-only one (``phi`` and the local
        variances at zero), so at its optimum its ELBO is at least the
        global-only model's. A full run that ends below that, or within
        ``max(RESTART_MARGIN_NATS, RESTART_MARGIN_PER_OBS * N)`` nats of it,
        has not found the full model's optimum (e.g. many inputs of which a
        few matter, where the clients' local parts take up the shared
        effects: docs/maths.md, section 11). It is then trained once more,
        every setting the same but the starting global lengthscales, which
        are the global-only fit's, and kept if its final objective (ELBO
        plus log hyperpriors) exceeds the first run's by more than
        ``RESTART_KEEP_NATS``. ``mode=True`` trains
        the second run whatever the margin. The global-only fit runs at most
        ``RESTART_REFERENCE_ROUNDS`` rounds and issues no diagnostics.
        Both extra runs are federated fits on the same clients (``X``,
        ``y``, ``groups`` are the validated data of the first run); the
        traffic and evaluations of those that complete are counted in round
        1's entry of ``communication_`` and in ``n_evaluations_``, and their
        client failures in ``failed_clients_``. An extra run that raises
        leaves the first run in place (``UserWarning``).
        """
        n_rounds = (RESTART_REFERENCE_ROUNDS if self.n_rounds is None
                    else min(int(self.n_rounds), RESTART_REFERENCE_ROUNDS))
        ref = self._extra_run(X, y, groups, "the global-only fit", components=("global",),
                              n_rounds=n_rounds, verbose=0, lengthscale_starts=(1.0,))
        if ref is None:
            return
        others = [ref]
        self.global_only_elbo_ = float(ref.elbo_history_[-1])
        self.restarted_from_global_ = False
        first = float(self.elbo_history_[-1])
        if self.verbose > 0:
            print(f"[skfedgp] global-only fit ({ref.n_iter_} rounds): ELBO "
                  f"{self.global_only_elbo_:.6g} (full model {first:.6g})", flush=True)
        margin = max(RESTART_MARGIN_NATS, RESTART_MARGIN_PER_OBS * len(y))
        if mode is True or self.global_only_elbo_ > first - margin:
            # its lengthscales in input units, inside the range they came from
            lo, hi = ref.server_.lengthscale_range()
            ell = np.clip(np.asarray(ref.server_.global_values()["lengthscale_g"], dtype=float),
                          np.asarray(lo) * (1 + 1e-6), np.asarray(hi) * (1 - 1e-6))
            if self.verbose > 0:
                print("[skfedgp] training the full model again from the global-only fit's "
                      "lengthscales", flush=True)
            alt = self._extra_run(X, y, groups, "the second run",
                                  lengthscale=ell * np.asarray(ref.server_.x_scale, dtype=float))
            if alt is not None:
                objectives = (float(self.objective_history_[-1]),
                              float(alt.objective_history_[-1]))
                keep = objectives[1] > objectives[0] + RESTART_KEEP_NATS
                others.append(self._swap_fit(alt) if keep else alt)
                self.restarted_from_global_ = keep
                if self.verbose > 0:
                    print(f"[skfedgp] kept the {'second' if keep else 'first'} run (final "
                          f"objectives {objectives[0]:.6g} and {objectives[1]:.6g})", flush=True)
        self._book_extra_runs(others)

    def _book_extra_runs(self, others):
        """Count extra federated fits in round 1's ``communication_``, ``n_evaluations_``
        and ``failed_clients_``."""
        rec = self.communication_[1]
        for other in others:
            for key in ("bytes_up", "bytes_down", "n_messages"):
                rec[key] += int(sum(r[key] for r in other.communication_))
            self.n_evaluations_ = int(self.n_evaluations_) + int(other.n_evaluations_)
            self.failed_clients_ = list(self.failed_clients_) + list(other.failed_clients_)

    def _global_start(self, config, X, y, groups, server, failed):
        """Multi-output targets: fit the global-only model first and start from its lengthscales.

        With ``restart_from_global`` ``"auto"`` or True and the settings
        :meth:`_may_restart_from_global` allows, the global-only model
        (``components=("global",)``, at most ``RESTART_REFERENCE_ROUNDS``
        rounds, every other setting the same) is fitted first, and the full
        model's global latents start from its smoothest latent's lengthscales
        (:func:`smoothest_latent_start`; ``server.global_start``) instead of
        the pilots'. The pilots fit each
        output of each client alone, so their lengthscales follow whichever
        part varies fastest (often the clients' own), and a full model started
        there lets the clients' parts take the shared signal (the global
        loadings shrink to zero); the global-only fit sees only what the
        clients share. Its shortest live latent also goes to the server
        (:func:`shortest_live_latent`, ``server.global_sizing``), which sizes
        the global inducing design with it (``n_inducing="auto"`` and a
        ``"local"`` component:
        :meth:`skfedgp.federated.Server.structured_initialise`). Returns the
        global-only fit (its traffic is booked by
        the caller), or None when none was made or it raised (then the
        pilots' start is used; the failure's message is appended to
        ``failed``, for a ``UserWarning`` once the full run has succeeded:
        an error that the full run raises too, e.g. a bad setting, is then
        reported once, by that run).
        """
        if not config.n_outputs or not self._check_auto_flag("restart_from_global") \
                or not self._may_restart_from_global():
            return None
        # the run's own set-up errors first (e.g. min_clients above the number
        # of clients), not as a failed global-only fit
        check_run_setup(config, None, self.checkpoint, self.min_clients,
                        len(unique_labels(groups)[0]))
        n_rounds = (RESTART_REFERENCE_ROUNDS if self.n_rounds is None
                    else min(int(self.n_rounds), RESTART_REFERENCE_ROUNDS))
        ref = self._extra_run(X, y, groups, "the global-only fit", components=("global",),
                              n_rounds=n_rounds, verbose=0, lengthscale_starts=(1.0,),
                              fallback="the full model starts from the pilots' lengthscales",
                              failed=failed)
        if ref is None:
            return None
        values = ref.server_.global_values()
        server.global_start = smoothest_latent_start(values["lengthscale_g"], values["B_g"])
        server.global_sizing = shortest_live_latent(values["lengthscale_g"], values["B_g"])
        if self.verbose > 0:
            print(f"[skfedgp] global-only fit ({ref.n_iter_} rounds): ELBO "
                  f"{float(ref.elbo_history_[-1]):.6g}; the full model's global latents "
                  "start from its smoothest latent's lengthscales", flush=True)
        return ref

    def _extra_run(self, X, y, groups, what, fallback="the first run is kept", failed=None,
                   **params):
        """A fit of a clone with ``params`` on validated data, or None if it raised.

        A failure is a ``UserWarning`` at once, or its message is appended to
        the list ``failed`` when one is given.
        """
        if (isinstance(self.n_inducing, numbers.Integral) and not isinstance(self.n_inducing, bool)
                and self.n_inducing > len(y)):
            # reduced to N with a warning by the main run (before or after
            # this one): not again
            params = {"n_inducing": len(y), **params}
        est = clone(self).set_params(restart_from_global=False, client_column=None, **params)
        est._check_copied_rows = False  # said once, by the first run
        est._setup_warnings = False  # the flat-client warning too
        est._restart_pending = True  # its diagnostics wait (issued only if it is kept)
        try:
            est._fit(X, y, groups)
        except Exception as exc:  # the first run stands
            message = f"restart_from_global: {what} failed ({exc!r}); {fallback}"
            if failed is None:
                warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
            else:
                failed.append(message)
            return None
        finally:
            est.__dict__.pop("_fit_data", None)
        return est

    def _swap_fit(self, other):
        """Take ``other``'s fitted state (not the attributes set from the data); return the old.

        The data attributes (``n_features_in_``, ``feature_names_in_``,
        ``n_features_model_``, ``client_column_``) are this fit's: the extra
        runs see the validated arrays. Returns an estimator shell holding this
        fit's previous run (for its traffic and failures).
        """
        old = type(self).__new__(type(self))
        keep = ("n_features_in_", "feature_names_in_", "n_features_model_", "client_column_",
                "global_only_elbo_", "restarted_from_global_")
        for k in [k for k in vars(self) if _is_fit_attribute(k) and k not in keep]:
            setattr(old, k, getattr(self, k))
            delattr(self, k)
        for k in [k for k in vars(other) if _is_fit_attribute(k) and k not in keep]:
            setattr(self, k, getattr(other, k))
        self._pending_diagnostics = other.__dict__.pop("_pending_diagnostics", None)
        return old

    def _issue_diagnostics(self):
        """Issue the end-of-fit warnings :meth:`_fit_structured` left for the kept run."""
        pending = self.__dict__.pop("_pending_diagnostics", None)
        if pending is not None:
            self._warn_fit_diagnostics(*pending)

    def _fit(self, X, y, groups):
        """Body of :meth:`fit` (which restores the fitted state on error)."""
        config, n_rounds = self._check_params()
        Xf, y, groups = self._validate_fit_data(X, y, groups)
        if groups is None:
            groups = np.zeros(Xf.shape[0], dtype=int)
        check_label_types(groups, label_source(self.client_column))
        if getattr(self, "_restart_pending", False):
            # for restart_from_global's extra runs; fit drops it at once
            self._fit_data = (Xf, y, groups)
        labels, inv = unique_labels(groups)
        if self.warm_start and self.resume_from is None and getattr(self, "clients_", None):
            # a continuation keeps the fitted clients whose labels come again
            # and drops the others: '0' after 0 would silently drop them all
            fitted = list(self.clients_)
            check_label_types(
                _object_array(fitted + list(labels)),
                f"{label_source(self.client_column)} with warm_start=True, together with "
                f"the fitted clients' labels ({_listing(fitted)}),")
        counts = np.bincount(inv, minlength=len(labels))
        small = [(lab, c) for lab, c in zip(labels, counts) if c < MIN_SAMPLES_PER_CLIENT]
        if small:
            lab, c = small[0]
            raise ValueError(
                f"client {lab!r} has {c} sample(s); at least {MIN_SAMPLES_PER_CLIENT} "
                f"samples per client are needed ({len(small)} client(s) too small)"
            )
        if y.ndim == 2:
            config = self._multioutput_config(config, y.shape[1])
        elif getattr(self, "_check_copied_rows", True):
            _warn_copied_rows(Xf, y, inv, labels)
        for name in ("lengthscale", "local_lengthscale"):  # before any client sees them
            if getattr(self, name) is not None:
                try:
                    _default_lengthscale(getattr(self, name), np.ones(Xf.shape[1]), 0.0)
                except ValueError as exc:
                    raise ValueError(str(exc).replace("lengthscale", name, 1)) from None
        rng = check_random_state(self.random_state)
        seeds = rng.randint(0, 2**31 - 1, size=len(labels) + 1)
        self.n_features_model_ = Xf.shape[1]
        clients = [Client(lab, Xf[inv == k], y[inv == k]) for k, lab in enumerate(labels)]
        if config.variational_family != "structured":
            # mean-field family: fixed sizes, at most the observations (all, and
            # the largest client's for the local sets)
            # (a warning only for a size the user gave)
            def _cap(name, M, n):
                return cap_inducing(M, n, name) if getattr(self, name) != "auto" else min(M, n)

            config = dataclasses.replace(
                config, n_inducing=_cap("n_inducing", config.n_inducing, Xf.shape[0]),
                n_inducing_local=_cap("n_inducing_local", config.n_inducing_local,
                                      int(counts.max())))
        server = Server(config, Xf.shape[1], int(seeds[-1]))
        client_seeds = [int(s) for s in seeds[:-1]]
        if config.variational_family == "structured":
            failed = []  # a failed global-only fit is reported once the run succeeds
            ref = self._global_start(config, Xf, y, groups, server, failed)
            out = self._fit_structured(clients, server, config, n_rounds, client_seeds,
                                       int(rng.randint(0, 2**31 - 1)))
            for message in failed:
                warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
            if ref is not None:
                self._book_extra_runs([ref])
                self._global_first = (float(ref.elbo_history_[-1]), True)
            return out
        check_participation(self.client_fraction, self.min_clients, self.max_retries)
        if (self.client_fraction != 1.0 or self.fault_hook is not None or self.warm_start
                or self.checkpoint is not None or self.resume_from is not None):
            raise ValueError(
                "client_fraction, fault_hook, warm_start, checkpoint and resume_from need "
                "variational_family='structured'")
        clients, history, comm = run_federated_training(
            clients, server, config, n_rounds=n_rounds, n_jobs=self.n_jobs,
            seeds=client_seeds, verbose=self.verbose,
        )
        # success: commit the fitted state at once (nothing of an earlier fit stays)
        self._drop_fit_attributes()
        self.components_ = config.components
        self.variational_family_ = "mean_field"
        self.server_ = server
        self.clients_ = {c.client_id: c for c in clients}
        self.elbo_history_ = history
        self.communication_ = comm
        # rounds run: with n_rounds=0 the one entry is the final ELBO, no round
        self.n_iter_ = len(history) if n_rounds > 0 else 0
        self.n_outputs_ = 1
        self.y_offset_ = server.y_offset
        self.y_scale_ = server.y_scale
        self.n_inducing_ = config.n_inducing
        self.learn_inducing_locations_ = bool(learns_inducing(config)
                                              and "Z_g" in server.global_pack.slices)
        G = server.global_values()
        if "phi" in G and "deviation" in config.components:
            self.phi_ = float(G["phi"])
        self._population_local = self._population_block()
        _warn_below_null(self, server)
        return self

    def _drop_fit_attributes(self, keep=("n_features_in_", "feature_names_in_",
                                          "n_features_model_")):
        """Delete the fitted attributes but ``keep`` (by default those :meth:`_fit`
        has just set from the data, before a new fit is committed)."""
        for k in [k for k in vars(self) if _is_fit_attribute(k) and k not in keep]:
            delattr(self, k)

    def _multioutput_config(self, config, n_outputs):
        """The model configuration for ``n_outputs > 1`` target columns.

        Parameters
        ----------
        config : ModelConfig
            From :meth:`_check_params`.
        n_outputs : int
            Number of target columns (at least 2).

        Returns
        -------
        ModelConfig
            ``config`` with ``n_outputs`` set.

        Raises
        ------
        ValueError
            For the mean-field family or a given ``variance`` or
            ``local_variance`` (the loadings carry the scale).
        """
        if config.variational_family != "structured":
            raise ValueError(
                "multi-output targets need variational_family='structured' (the "
                "mean-field family takes one target column)")
        given = [k for k in ("variance", "local_variance") if getattr(self, k) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)} must be None with multi-output targets: the latent "
                "functions have unit variance and the loadings carry the scale")
        # the multi-output clients' own loadings B_d, B_l already carry their
        # scales; a per-client scale on B_g is not implemented
        return dataclasses.replace(config, n_outputs=int(n_outputs), client_scale=False,
                                   tol=MULTIOUTPUT_TOL if self.tol is None else config.tol)

    def _fit_structured(self, clients, server, config, n_rounds, seeds, participation_seed):
        """Structured family: collapsed bound, exact q, L-BFGS-B or Adam."""
        state = self.resume_from
        if isinstance(state, (str, os.PathLike)):
            state = TrainingState.load(state)
        elif state is not None and not isinstance(state, TrainingState):
            raise ValueError(f"resume_from must be a TrainingState or a path, got {state!r}")
        # settings of a resumed state, checkpoint path, min_clients: before
        # any client is asked anything (shared with the Flower server)
        check_run_setup(config, state, self.checkpoint, self.min_clients, len(clients))
        fitted_family = getattr(self, "variational_family_", None)
        if state is None and self.warm_start and fitted_family not in (None, "structured"):
            raise ValueError(
                f"warm_start continues the fitted model, whose variational_family is "
                f"{fitted_family!r}, not 'structured'; set warm_start=False to fit the "
                "structured family from scratch")
        if state is None and self.warm_start and fitted_family == "structured":
            # which clients carry a scale, the inducing sizes, the components:
            # all decided at set-up; a change would leave the fitted clients
            # half one model, half the other
            check_same_model(self.server_.config, config, "warm_start")
            state = warm_start_state(self.server_, self.clients_, self.elbo_history_,
                                     self.objective_history_, self.communication_,
                                     self.n_evaluations_, self.failed_clients_,
                                     n_iter=self.n_iter_)
        callback = self.checkpoint
        if isinstance(callback, (str, os.PathLike)):
            path = callback

            def callback(r, st):
                st.save(path)
        elif callback is not None and not callable(callback):
            raise ValueError(f"checkpoint must be a path or a callable, got {callback!r}")
        n_rounds0 = 0 if state is None else len(state.history)
        sclients, res = run_structured_training(
            clients, server, config, n_rounds=n_rounds, n_jobs=self.n_jobs, seeds=seeds,
            verbose=self.verbose, fault_hook=self.fault_hook,
            client_fraction=self.client_fraction, min_clients=self.min_clients,
            max_retries=self.max_retries, random_state=participation_seed, state=state,
            callback=callback, setup_warnings=getattr(self, "_setup_warnings", True))
        post = res["posterior"]
        # success: commit the fitted state at once (nothing of an earlier fit stays)
        self._drop_fit_attributes()
        self.components_ = config.components
        self.variational_family_ = "structured"
        self.server_ = server
        server.theta_global = res["theta_global"]
        self.clients_ = {c.client_id: c for c in sclients}
        self.global_posterior_ = {"mean": post.mean, "covariance": post.covariance}
        self.elbo_history_ = res["elbo_history"]
        self.objective_history_ = res["objective_history"]
        self.communication_ = res["communication"]
        self.n_iter_ = res["n_iter"]
        self.n_evaluations_ = res["n_evaluations"]
        self.failed_clients_ = res["failed_clients"]
        self.excluded_clients_ = res["excluded_clients"]
        self.y_offset_ = server.y_offset
        self.y_scale_ = server.y_scale
        self.n_inducing_ = server.n_inducing_
        # the clients' trace terms at the returned model (None: a client of an
        # earlier version sent none)
        trace = trace_summary(res.get("trace_terms", ()))
        self.trace_term_ = None if trace is None else trace["total"]
        # whether Z_g was learned (False without one; "auto": the decision at the end)
        self.learn_inducing_locations_ = bool(server.learn_inducing_)
        # the factor applied to the kept run (1.0: none applied)
        self.lengthscale_start_ = float(getattr(server, "lengthscale_start_", None) or 1.0)
        self._population_local = res["population"]
        # the clients' levels: posterior means of the random levels
        self.client_offsets_ = {
            lab: server.y_offset + server.y_scale * c.local_values().get(
                "offset", c.posterior.get("level", 0.0))
            for lab, c in self.clients_.items()}
        self.n_outputs_ = config.n_outputs or 1
        self._tol = config.tol  # the stopping rule's tolerance (tol=None resolved)
        G = server.global_pack.unpack(server.theta_global)
        if not config.n_outputs:  # each client's scale on the shared parts (1: not learned)
            self.client_scales_ = {lab: shared_scale(c.local_values(), G)
                                   for lab, c in self.clients_.items()}
        if "phi" in G:
            self.phi_ = float(G["phi"])
        if "level_variance" in G:
            self.level_variance_ = float(server.y_scale**2 * G["level_variance"])
        if config.n_outputs:
            scale = np.asarray(server.y_scale)[:, None]
            self.loadings_ = {}
            if "B_g" in G:
                self.loadings_["global"] = scale * G["B_g"]
            for key, name in (("B_d", "deviation"), ("B_l", "local")):
                if name in config.components:
                    self.loadings_[name] = {lab: scale * c.local_values()[key]
                                            for lab, c in self.clients_.items()}
        pending = (res["converged"], n_rounds, trace, res["failed_clients"], n_rounds0,
                   res.get("local_phase_done", ()))
        if getattr(self, "_restart_pending", False):
            self._pending_diagnostics = pending  # issued by fit for the run it keeps
        else:
            self._warn_fit_diagnostics(*pending)
        return self

    def _warn_fit_diagnostics(self, converged, n_rounds, trace, failed, n_rounds0, done):
        """The end-of-fit warnings of the structured family (see :meth:`fit`, Warns)."""
        _warn_diagnostics(self, converged, n_rounds)
        if converged:  # else the values are not the bound's maximum (a warning says so)
            warn_loose_bound(trace, self.n_inducing_)
        warn_untrained_clients(self.clients_, failed, n_rounds0, done)

    def _population_block(self):
        """Prior local block for never-seen clients (see Notes of the class).

        The hyperparameters are those the server formed (mean variance,
        variance-weighted geometric mean lengthscales, geometric mean noise
        variance) from the clients' final :class:`~skfedgp.federated.LocalHyperparameters`
        messages; the prior of the local part does not depend on the inducing
        inputs, so one point at the centre of the box stands in for them (no
        client's inducing inputs are kept).
        """
        comps = self.components_
        pop = self.server_.population
        B = {"noise_variance": pop["noise_variance"]}
        if "deviation" in comps:
            M = self.server_.config.n_inducing
            B.update(m_d=np.zeros(M), C_d=np.eye(M))
        if "local" in comps:
            B.update(m_u=np.zeros(1), C_u=np.eye(1), Z_l=np.full((1, self.n_features_model_), 0.5),
                     lengthscale_l=pop["lengthscale_l"], variance_l=pop["variance_l"])
        return B

    # ------------------------------------------------------------------
    # prediction
    # ------------------------------------------------------------------
    def _prepare_predict(self, X, groups, where):
        """Standardised features, distinct labels and the row-to-label index."""
        check_is_fitted(self, "clients_")
        Xf, groups = self._validate_predict_X(X, groups, where)
        if groups is None:
            if len(self.clients_) == 1:
                groups = _object_array([next(iter(self.clients_))] * Xf.shape[0])
            else:
                warn_groups_missing(list(self.clients_), where)
                groups = np.array([_Population] * Xf.shape[0], dtype=object)
            labels, inv = unique_labels(groups)
        else:  # True is not client 1 (nor 1 client True), though True == 1
            labels, inv = match_labels(groups, self.clients_, where)
        T = len(self.clients_)
        if T < MIN_CLIENTS_FOR_NEW and any(lab not in self.clients_ for lab in labels):
            warnings.warn(
                f"{where}: rows of a client never seen in fit get a new level drawn from the "
                f"spread of the fitted clients' levels, estimated here from {T} client(s) "
                f"(not identifiable from one, poorly from two): their predictive band is "
                f"unreliable; fit at least {MIN_CLIENTS_FOR_NEW} clients to predict for new ones",
                UserWarning, stacklevel=user_stacklevel())
        Xs = np.ascontiguousarray((Xf - self.server_.x_offset) / self.server_.x_scale)
        return Xs, labels, inv

    def _local_for(self, label):
        client = self.clients_.get(label)
        if client is None:
            return self._population_local, label
        return client.local_values(), label

    def _offset_variance(self, label):
        """Variance of a row's client constant mean (standardised units).

        0 for a fitted client (a learned constant, or a random level whose
        posterior is part of the client's); for a never-seen label the
        population's ``offset_variance``: the part of a new client's level
        variance that its prior block does not hold (1-D targets:
        ``2 level_variance / (T - 1)``; multi-output targets: the spread of
        the clients' constant means, Q x Q). A fitted multi-output client that never
        observed an output never learned that output's level: those rows
        and columns get the population's (see :meth:`_client_offset`).
        """
        pop = self._population_local.get("offset_variance", 0.0)
        if label in self.clients_:
            unseen = self._unobserved_outputs(label)
            if unseen is None:
                return 0.0
            return np.outer(unseen, unseen) * pop
        return pop

    def _unobserved_outputs(self, label):
        """Mask (float, shape (Q,)) of the outputs a fitted client never observed, or None."""
        obs = getattr(self.clients_[label], "offset_observed", None)
        if obs is None or np.all(np.asarray(obs) > 0.5):
            return None
        return (np.asarray(obs) <= 0.5).astype(float)

    def _part_prior_terms(self, outputs=None):
        """The deviation and local parts' prior for a never-seen client.

        One term per latent function ``r``: ``(name, c_r Gamma_r, lengthscale_r)``
        with the population's coregionalisation ``Gamma_r`` (``c_r = phi``
        for the deviation, 1 for the local part); the prior covariance of
        the parts is ``sum_r k_r(x, x') c_r Gamma_r`` (unit-variance latent
        functions). ``outputs`` (a 0/1 mask of shape (Q,)) restricts every
        ``Gamma_r`` to those outputs' rows and columns.
        """
        pop = self._population_local
        G = self.server_.global_pack.unpack(self.server_.theta_global)
        D = None if outputs is None else np.outer(outputs, outputs)
        terms = []
        for name, ells in (("deviation", G.get("lengthscale_g")),
                           ("local", pop.get("lengthscale_l"))):
            if name not in self.components_:
                continue
            for r, Cr in enumerate(pop["coregionalisation"][name]):
                C = self.phi_ * Cr if name == "deviation" else Cr
                terms.append((name, C if D is None else C * D, ells[r]))
        return terms

    def _part_prior_blocks(self, n, outputs=None):
        """Per-row ``Q x Q`` blocks of :meth:`_part_prior_terms` (``k_r(x, x) = 1``).

        Returns
        -------
        dict
            Component name to an ndarray of shape (n, Q, Q).
        """
        pop = self._population_local
        out = {}
        for name in ("deviation", "local"):
            if name in self.components_:
                C = ((self.phi_ if name == "deviation" else 1.0)
                     * pop["coregionalisation"][name].sum(axis=0))
                if outputs is not None:
                    C = C * np.outer(outputs, outputs)
                out[name] = np.broadcast_to(C, (n,) + C.shape).copy()
        return out

    def _unobserved_prior(self, label, Xa, Xb=None):
        """Prior covariance of a fitted client's deviation and local parts on the
        outputs it never observed (multi-output), or None.

        Such an output's rows of the client's loadings ``B_d``, ``B_l`` had no
        data and stay 0, so the client's own posterior gives those parts
        mean 0 and variance 0 there. Nothing was learned about them: they get
        the prior a never-seen client has (:meth:`_part_prior_terms`)
        restricted to the unobserved outputs, uncorrelated with the observed
        outputs.

        Returns
        -------
        dict or None
            Component name (``"deviation"``, ``"local"``) to an ndarray of
            shape (n_a, Q, Q) when ``Xb`` is None (per-row blocks), else
            (n_a, Q, n_b, Q); None when the client observed every output.
        """
        unseen = self._unobserved_outputs(label)
        if unseen is None:
            return None
        if Xb is None:
            return self._part_prior_blocks(Xa.shape[0], unseen)
        Q = unseen.shape[0]
        out = {}
        for name, C, ell in self._part_prior_terms(unseen):
            out[name] = out.get(name, np.zeros((Xa.shape[0], Q, Xb.shape[0], Q))) + np.einsum(
                "ij,qp->iqjp", se_ard(Xa, Xb, ell, 1.0), C)
        return out

    def _population_where_unseen(self, label, key, value):
        """A fitted client's per-output ``value``, the population's ``key`` for
        the outputs it never observed."""
        unseen = self._unobserved_outputs(label)
        if unseen is None:
            return value
        return np.where(unseen > 0, self._population_local[key], value)

    def _client_offset(self, label, offset):
        """A fitted client's levels, the population's for outputs it never observed."""
        return self._population_where_unseen(label, "offset", offset)

    def _client_noise(self, label, s2):
        """A fitted client's noise variances, the population's for outputs it never
        observed (``noise="diagonal"``: its own value there was never trained)."""
        if getattr(self.server_.config, "noise", None) != "diagonal":
            return s2
        return self._population_where_unseen(label, "noise_variance", s2)

    def predict(self, X, groups=None, return_std=False, return_cov=False):
        """Predictive distribution of the targets for each row's client.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Test inputs (same columns as in fit).
        groups : array-like of shape (n_samples,), default=None
            Client label of each row (ignored when ``client_column`` is
            set). Labels not seen in fit get the population (prior-based)
            prediction described in the Notes of the class. None: the single
            fitted client, or the population prediction, with a
            :class:`~skfedgp.regressor.ClientLabelWarning`, if several
            clients were fitted.
        return_std : bool, default=False
            Also return the predictive standard deviation.
        return_cov : bool, default=False
            Also return the joint predictive covariance of all rows (rows of
            different clients are correlated through the global part). The
            ``n_samples x n_samples`` result may take at most
            :data:`MAX_COV_BYTES` bytes (2 GiB, 16 384 rows).

        Returns
        -------
        y_mean : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            Predictive mean, target units.
        y_std : ndarray of shape (n_samples,) or (n_samples, n_outputs), optional
            Predictive standard deviation of a new noisy observation
            (latent variance plus the client's noise variance; with the
            structured family also the uncertainty of a fitted client's
            estimated constant mean, or a never-seen client's level),
            target units.
        y_cov : ndarray of shape (n_samples, n_samples) or (n_samples, n_outputs, n_outputs), optional
            One target column: the joint predictive covariance of the noisy
            observations of all rows. Multi-output targets: the ``Q x Q``
            predictive covariance of the outputs at each row (Yan 2026,
            eqs. 38–39) — never an ``n Q x n Q`` matrix.

        Raises
        ------
        ValueError
            If both ``return_std`` and ``return_cov`` are set, ``X`` is
            invalid (NaN/inf, wrong number of features) or a label is
            missing (None/NaN).
        MemoryError
            If ``return_cov`` is set and the ``n_samples x n_samples``
            covariance would exceed :data:`MAX_COV_BYTES`; raised before
            anything of that size is allocated, with the memory needed.
        FloatingPointError
            If the prediction is not finite, or a predictive variance is
            negative beyond round-off (more than ``1e-6`` of the prior
            variance): a broken posterior covariance, never clipped to 0.
        sklearn.exceptions.NotFittedError
            Before fit.

        Warns
        -----
        ClientLabelWarning
            ``groups=None`` on a model fitted with several clients, or a label
            that is not a fitted client but matches one up to its type (``"1"``
            for ``1``), white space or case, or whose type no fitted label has
            (``0`` for clients fitted as ``"alpha"``, ...): those rows get the
            population prediction.

        Notes
        -----
        ``docs/maths.md``, section 8 (Yan 2026, eq. 30). Without
        ``return_cov`` each client's rows are predicted in chunks of
        :data:`PREDICT_CHUNK_ROWS`, so the working memory beyond the
        returned arrays does not grow with ``n_samples``.
        """
        return self._predict(X, groups, return_std, return_cov, "predict")

    @single_threaded_blas()
    def predict_joint(self, X, groups=None):
        """Joint predictive distribution of all outputs at all rows of one client.

        Multi-output models only: the ``nQ x nQ`` covariance that
        :meth:`predict` never returns (it gives per-row ``Q x Q`` blocks),
        e.g. to score a whole multi-channel curve.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        groups : array-like of shape (n_samples,), default=None
            One label for every row (a fitted client, or a never-seen one for
            the population prediction); None means the single fitted client.

        Returns
        -------
        y_mean : ndarray of shape (n_samples, n_outputs)
        y_cov : ndarray of shape (n_samples * n_outputs, n_samples * n_outputs)
            Covariance of the noisy outputs, ordered point-major (entry
            ``i * Q + q`` is output ``q`` at row ``i``), target units.

        Raises
        ------
        ValueError
            If the model has one output, or the rows belong to several
            clients (cross-client joint covariances are not implemented).
        MemoryError
            If the ``nQ x nQ`` matrix exceeds :data:`MAX_COV_BYTES`.

        Notes
        -----
        Yan 2026, eqs. 38–39 (the ILMM predictive law), taken jointly over
        pairs of rows; ``docs/maths.md``, section 12.
        """
        from ._ilmm import predict as ilmm_predict

        check_is_fitted(self, "clients_")
        if getattr(self, "n_outputs_", 1) < 2 or not hasattr(self, "loadings_"):
            raise ValueError("predict_joint needs a multi-output model; use "
                             "predict(..., return_cov=True)")
        Xf, labels, inv = self._prepare_predict(X, groups, "predict_joint")
        if len(labels) > 1:
            raise ValueError(
                f"predict_joint takes the rows of one client; got {len(labels)} labels "
                "(joint covariances across clients are not implemented)")
        n, Q = Xf.shape[0], self.n_outputs_
        _check_cov_budget(n * Q, n_outputs=Q)
        lab = labels[0]
        comps = self.components_
        G = self.server_.global_pack.unpack(self.server_.theta_global)
        c = self.clients_.get(lab)
        if c is not None:
            L = c.local_values()
            mean, C = ilmm_predict(Xf, G, L, comps, c.posterior["mu_u"],
                                   c.posterior["Sigma_u"], full_cov=True, client=lab,
                                   offset=self._offset_estimate(lab))
            s2 = self._client_noise(lab, L["noise_variance"])
            offset = self._client_offset(lab, L["offset"])
            V_u = self._unobserved_prior(lab, Xf, Xf)
            if V_u is not None:  # nothing learned about the unobserved outputs' parts
                C = np.asarray(C, dtype=float).reshape(n, Q, n, Q) + sum(V_u.values())
        else:
            pop = self._population_local
            s2, offset = pop["noise_variance"], pop["offset"]
            mean, C = np.zeros((n, Q)), np.zeros((n, Q, n, Q))
            if "global" in comps:
                Lg = {"noise_variance": s2, "offset": np.zeros(Q)}
                mean, C = ilmm_predict(Xf, G, Lg, ("global",), self.global_posterior_["mean"],
                                       self.global_posterior_["covariance"], full_cov=True)
            for _, Cr, ell in self._part_prior_terms():
                # unit-variance latent GP mixed by the mean outer product
                C = C + np.einsum("ij,qp->iqjp", se_ard(Xf, Xf, ell, 1.0), Cr)
        C = np.array(C, dtype=float).reshape(n * Q, n * Q)
        # a never-seen client's level is shared by all its rows
        C += np.tile(np.broadcast_to(self._offset_variance(lab), (Q, Q)), (n, n))
        C[np.diag_indices_from(C)] += np.tile(np.broadcast_to(s2, (Q,)), n)
        floor = self._output_floor(lab)
        if floor is not None:  # see _widen_under_observed
            dg = np.diagonal(C).reshape(n, Q)
            C[np.diag_indices_from(C)] += np.maximum(floor - dg, 0.0).ravel()
        scale = np.asarray(self.y_scale_)
        sc = np.tile(scale, n)
        C *= np.outer(sc, sc)
        y_mean = self.y_offset_ + scale * (mean + offset)
        if not (np.all(np.isfinite(y_mean)) and np.all(np.isfinite(C))):
            raise FloatingPointError("prediction produced non-finite values")
        return y_mean, 0.5 * (C + C.T)

    @single_threaded_blas()
    def _predict(self, X, groups, return_std, return_cov, where):
        """Body of :meth:`predict` and :meth:`score` (``where`` names the caller)."""
        if return_std and return_cov:
            raise ValueError("only one of return_std and return_cov can be requested")
        Xf, labels, inv = self._prepare_predict(X, groups, where)
        n = Xf.shape[0]
        if getattr(self, "n_outputs_", 1) > 1 and hasattr(self, "loadings_"):
            return self._predict_ilmm(Xf, labels, inv, return_std, return_cov)
        if return_cov:
            _check_cov_budget(n)
        if getattr(self, "variational_family_", "mean_field") == "structured":
            mean, var, cov = self._predict_structured(Xf, labels, inv, return_cov)
            return self._finish_predict(mean, var, cov, return_std, return_cov)
        G = self.server_.global_values()
        comps = self.components_
        mean = np.zeros(n)
        var = np.zeros(n)
        cov = None
        if return_cov:  # the global part couples all rows; start from it
            if "global" in comps:
                _, cov = predict_client(Xf, G, self._population_local, ("global",),
                                        full_cov=True)
            else:
                cov = np.zeros((n, n))
        for k, lab in enumerate(labels):
            idx = np.flatnonzero(inv == k)
            B, cid = self._local_for(lab)
            cid = None if lab is _Population else cid
            if return_cov:
                parts = predict_client(Xf[idx], G, B, comps, full_cov=True,
                                       per_component=True, client=cid)
                mean[idx] = sum(p[0] for p in parts.values())
                c = sum(p[1] for name, p in parts.items() if name != "global")
                cov[np.ix_(idx, idx)] += c + B["noise_variance"] * np.eye(idx.size)
                continue
            for rows in _chunks(idx):
                m, v = predict_client(Xf[rows], G, B, comps, client=cid)
                mean[rows] = m
                var[rows] = v + B["noise_variance"]
        return self._finish_predict(mean, var, cov, return_std, return_cov)

    def _finish_predict(self, mean, var, cov, return_std, return_cov):
        """Back to target units; refuse non-finite results."""
        y_mean = self.y_offset_ + self.y_scale_ * mean
        if not np.all(np.isfinite(y_mean)):
            raise FloatingPointError("prediction produced non-finite values")
        if return_std:
            return y_mean, self.y_scale_ * np.sqrt(var)
        if return_cov:
            cov *= self.y_scale_**2  # in place: no second n x n array
            return y_mean, cov
        return y_mean

    # -- multi-output (ILMM) targets --------------------------------------------
    def _ilmm_rows(self, Xs, lab, per_component=False):
        """Latent-plus-noise prediction of one label's rows, standardised units.

        Returns ``(mean (n, Q), cov (n, Q, Q))`` of the noisy outputs (offset
        included), or with ``per_component`` a dict of latent ``(mean, cov)``
        per component plus ``"offset"``. A never-seen label gets the exact
        posterior of the global part and the *prior* of its deviation and
        local parts: at one input a unit-variance latent function has
        variance 1, so that prior is ``phi * sum_r C_d,r + sum_r C_l,r`` with
        ``C_r`` the clients' mean ``B[:, r] B[:, r]^T`` (their final messages).
        """
        from ._ilmm import predict as ilmm_predict

        comps = self.components_
        G = self.server_.global_pack.unpack(self.server_.theta_global)
        Q = self.n_outputs_
        n = Xs.shape[0]
        c = self.clients_.get(lab)
        est = self._offset_estimate(lab)  # None for a never-seen label
        if c is not None:
            L = c.local_values()
            P = c.posterior
            cid = lab
            out = ilmm_predict(Xs, G, L, comps, P["mu_u"], P["Sigma_u"],
                               per_component=per_component, client=cid,
                               offset=None if per_component else est)
            s2 = self._client_noise(lab, L["noise_variance"])
            offset = self._client_offset(lab, L["offset"])
            V_u = self._unobserved_prior(lab, Xs)
            if V_u is not None:  # nothing learned about the unobserved outputs' parts
                if per_component:
                    out = dict(out)
                    for name, V in V_u.items():
                        out[name] = (out[name][0], np.asarray(out[name][1], dtype=float) + V)
                else:
                    out = (out[0], np.asarray(out[1], dtype=float) + sum(V_u.values()))
        else:
            pop = self._population_local
            s2, offset = pop["noise_variance"], pop["offset"]
            out = {}
            if "global" in comps:
                Lg = {"noise_variance": s2, "offset": np.zeros(Q)}
                out["global"] = ilmm_predict(Xs, G, Lg, ("global",),
                                             self.global_posterior_["mean"],
                                             self.global_posterior_["covariance"])
            for name, C in self._part_prior_blocks(n).items():
                out[name] = (np.zeros((n, Q)), C)
            if not per_component:
                mean = sum(m for m, _ in out.values()) if out else np.zeros((n, Q))
                cov = sum(cv for _, cv in out.values()) if out else np.zeros((n, Q, Q))
                out = (mean, cov)
        V_off = np.broadcast_to(self._offset_variance(lab), (Q, Q))  # a new client's level
        if per_component:
            out = dict(out)
            V_c = np.array(V_off, dtype=float)
            if est is not None:  # the fitted constants' own estimation covariance
                V_c[np.ix_(est[2], est[2])] += est[0]
            out["offset"] = (np.broadcast_to(offset, (n, Q)).copy(),
                             np.broadcast_to(V_c, (n, Q, Q)).copy())
            return out
        mean, cov = out
        cov = np.array(cov, dtype=float) + V_off
        idx = np.arange(Q)
        cov[:, idx, idx] += np.broadcast_to(s2, (Q,))
        return mean + offset, cov

    def _predict_ilmm(self, Xf, labels, inv, return_std, return_cov):
        """Multi-output prediction: (n, Q) means, (n, Q) std or (n, Q, Q) blocks."""
        n, Q = Xf.shape[0], self.n_outputs_
        mean = np.zeros((n, Q))
        cov = np.zeros((n, Q, Q))
        for k, lab in enumerate(labels):
            for rows in _chunks(np.flatnonzero(inv == k)):
                m, C = self._ilmm_rows(Xf[rows], lab)
                mean[rows], cov[rows] = m, self._widen_under_observed(C, lab)
        scale = np.asarray(self.y_scale_)
        y_mean = self.y_offset_ + scale * mean
        cov *= np.outer(scale, scale)
        if not (np.all(np.isfinite(y_mean)) and np.all(np.isfinite(cov))):
            raise FloatingPointError("prediction produced non-finite values")
        if return_std:
            dg = np.diagonal(cov, axis1=1, axis2=2)
            # per output: a noisy variance is at least the noise, so a negative one
            # beyond round-off of that output's largest is a broken posterior
            return y_mean, np.sqrt(nonnegative_variance(dg, np.max(np.abs(dg), axis=0)))
        if return_cov:
            return y_mean, 0.5 * (cov + np.swapaxes(cov, 1, 2))
        return y_mean

    def _output_floor(self, lab):
        """Variance floor (Q,) of label ``lab``'s outputs, standardised units, or None.

        The server's ``output_variance_floor`` (:func:`skfedgp.federated.under_observed_floor`;
        0 for a well-observed output), except for the outputs this client
        observed at least twice itself (its own values inform them); a
        never-seen label takes the whole floor.
        """
        floor = getattr(self.server_, "output_variance_floor", None)
        if floor is None or not np.any(np.asarray(floor) > 0):
            return None
        floor = np.array(floor, dtype=float)
        counts = getattr(self.server_, "output_client_counts", None) or {}
        if lab in counts:
            floor[np.asarray(counts[lab]) >= 2] = 0.0
        return floor if np.any(floor > 0) else None

    def _widen_under_observed(self, cov, lab):
        """Raise the variance of label ``lab``'s under-observed outputs to their floor, in place.

        ``cov`` holds (n, Q, Q) per-row blocks in standardised units; output
        ``q``'s variance is raised to :meth:`_output_floor`'s value by adding
        the shortfall to the diagonal, so every block stays positive
        semi-definite. Returns ``cov``.
        """
        floor = self._output_floor(lab)
        if floor is None:
            return cov
        dg = np.diagonal(cov, axis1=-2, axis2=-1)
        short = np.maximum(floor - dg, 0.0)
        q = np.arange(cov.shape[-1])
        cov[..., q, q] += short
        return cov

    # -- structured family ---------------------------------------------------
    def _structured_client(self, lab):
        """Blocks, ``mu_u``, ``Sigma_u``, ``H``, ``E`` and noise variance of one label.

        The client's level is a coordinate of ``u`` (its constant mean is not
        a separate value). A label not seen in fit gets the exact posterior of
        the global part and the *prior* of its deviation, local and level
        parts (docs/maths.md), with the
        population local hyperparameters (formed from the clients'); any
        inducing set gives the exact prior, so one point at the centre of the
        box is used (no client's inducing inputs are kept).
        """
        G = self.server_.global_pack.unpack(self.server_.theta_global)
        comps = self.components_
        phi = G.get("phi", 1.0)
        mu_g = self.global_posterior_["mean"]
        A_inv = self.global_posterior_["covariance"]
        c = self.clients_.get(lab)
        if c is not None:
            B = c.local_values()
            blocks = feature_blocks(G, B, comps)
            E, n_vg = layout_map(blocks, comps, phi, self._client_scale(lab))
            P = c.posterior
            return blocks, P["mu_u"], P["Sigma_u"], P["H"], E, B["noise_variance"]
        pop = self._population_local
        d = self.n_features_model_
        B = {"noise_variance": pop["noise_variance"]}
        if "local" in comps:
            B.update(Z_l=np.full((1, d), 0.5), lengthscale_l=pop["lengthscale_l"],
                     variance_l=pop["variance_l"])
        blocks = feature_blocks(G, B, comps)
        E, n_vg = layout_map(blocks, comps, phi, self._client_scale(lab))
        n_c = E.shape[1] - n_vg
        mu_u = np.concatenate([mu_g, np.zeros(n_c)])
        Sigma_u = np.zeros((E.shape[1],) * 2)
        Sigma_u[:n_vg, :n_vg] = A_inv
        Sigma_u[n_vg:, n_vg:] = np.eye(n_c)
        return blocks, mu_u, Sigma_u, E[:, :n_vg], E, B["noise_variance"]

    def _client_scale(self, lab):
        """Scale ``s_i`` of a label on the shared parts (structured family, 1-D targets).

        A fitted client's own (1 when it learned none); a label not seen in
        fit: the clients' median (``client_scale`` in the population block).
        """
        c = self.clients_.get(lab)
        if c is not None:
            G = self.server_.global_pack.unpack(self.server_.theta_global)
            return shared_scale(c.local_values(), G)
        return float(self._population_local.get("client_scale", 1.0))

    def _offset_estimate(self, lab):
        """Estimation uncertainty of a fitted multi-output client's constant means, or None.

        ``(Cov(c_O), gain, outputs O)`` (:func:`skfedgp._ilmm.offset_uncertainty`).
        None for a label not seen in fit (its level is a new draw,
        :meth:`_offset_variance`) and for scalar targets (the structured
        family's client level is a latent variable of the posterior).
        """
        P = getattr(self.clients_.get(lab), "posterior", None) or {}
        if "offset_outputs" not in P:
            return None
        return P["offset_variance"], P["offset_gain"], P["offset_outputs"]

    def _predict_structured(self, Xf, labels, inv, return_cov):
        """Mean, variance (or joint covariance) of the noisy targets, standardised units."""
        comps = self.components_
        G = self.server_.global_pack.unpack(self.server_.theta_global)
        phi = G.get("phi", 1.0)
        n = Xf.shape[0]
        mean = np.zeros(n)
        var = np.zeros(n)
        A_inv = self.global_posterior_["covariance"]
        Mg = A_inv.shape[0]
        cov = np.zeros((n, n)) if return_cov else None
        Phi = np.zeros((n, Mg)) if return_cov else None
        # the part of a never-seen client's level variance that every
        # never-seen client shares (the estimated mean)
        common = float(self._population_local.get("offset_mean_variance", 0.0))
        unseen_rows = []
        s_row = np.ones(n)  # each row's client scale on the shared parts
        for k, lab in enumerate(labels):
            idx = np.flatnonzero(inv == k)
            cid = None if lab is _Population else lab
            blocks, mu_u, Sigma_u, H, E, s2 = self._structured_client(
                _Population if cid is None else cid)
            sc = self._client_scale(_Population if cid is None else cid)
            s_row[idx] = sc
            v_off = float(self._offset_variance(lab))  # a never-seen client's level
            v_common = 0.0 if lab in self.clients_ else common
            if v_common:
                unseen_rows.append(idx)
            if not return_cov:
                for rows in _chunks(idx):
                    m, v = predict_structured(Xf[rows], blocks, comps, phi, mu_u, Sigma_u, E,
                                              scale=sc, client=cid)
                    mean[rows] = m
                    var[rows] = v + s2 + v_off
                continue
            Ws = test_features(Xf[idx], blocks, client=cid)
            Fs = np.hstack(Ws)
            mean[idx] = Fs @ (E @ mu_u)
            Sz = E @ Sigma_u @ E.T - H @ A_inv @ H.T
            within = Fs @ Sz @ Fs.T + s2 * np.eye(idx.size) + (v_off - v_common)
            gam = residual_coefficients(blocks, comps, phi, sc)
            for (name, Z, ell, v_, _), W, g in zip(blocks, Ws, gam):
                # the shared function's residual (s_i s_j R_g) is added below for all rows
                g_eff = g - (sc**2 if (name == "g" and "global" in comps) else 0.0)
                if g_eff:
                    within += g_eff * (se_ard(Xf[idx], Xf[idx], ell, v_) - W @ W.T)
            cov[np.ix_(idx, idx)] += within
            if Mg:
                Phi[idx] = Fs @ H
        if return_cov:
            if unseen_rows:  # never-seen clients' levels share the estimated mean
                u = np.concatenate(unseen_rows)
                cov[np.ix_(u, u)] += common
            if Mg:
                cov += Phi @ A_inv @ Phi.T
            if "global" in comps:
                gb = feature_blocks(G, {}, ("global",))
                Wg = test_features(Xf, gb)[0]
                cov += np.outer(s_row, s_row) * (
                    se_ard(Xf, Xf, G["lengthscale_g"], G["variance_g"]) - Wg @ Wg.T)
            cov = 0.5 * (cov + cov.T)
        return mean, var, cov

    @single_threaded_blas()
    def predict_components(self, X, groups=None):
        """Mean and standard deviation of each latent component.

        The interpretable decomposition of ``docs/maths.md``, section 1: the
        shared global function, the client's deviation and its local part,
        each with its own posterior uncertainty (latent, without noise).
        Rows are predicted in chunks of :data:`PREDICT_CHUNK_ROWS`; labels are
        checked, and warned about, as in :meth:`predict`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        groups : array-like of shape (n_samples,), default=None
            As in :meth:`predict`.

        Returns
        -------
        components : dict
            ``{name: (mean, std)}`` for each fitted component name in
            ``("global", "deviation", "local")``; arrays of shape
            (n_samples,), or (n_samples, n_outputs) for multi-output
            targets, target units. With the structured family (the
            default) an ``"offset"`` entry holds each row's client constant
            mean, ``y_offset_`` included, and its std (1-D targets: the
            posterior of the client's random level; for a never-seen client
            a new level, std ``sqrt(level_variance_ (T + 1) / (T - 1))``;
            where the client's deviation or local part can also carry a
            level, the std is partly cancelled by the level's covariance
            with those parts, which the per-component stds leave out), and
            the predictive mean of :meth:`predict` equals the sum of all the
            means; with the mean-field family it equals ``y_offset_`` plus
            the sum. For a client with a scale ``s_i`` on the shared parts
            (``client_scales_``) ``"global"`` and ``"deviation"`` are
            ``s_i g`` and ``s_i d_i``, in that client's units.
        """
        Xf, labels, inv = self._prepare_predict(X, groups, "predict_components")
        n = Xf.shape[0]
        if getattr(self, "n_outputs_", 1) > 1 and hasattr(self, "loadings_"):
            Q = self.n_outputs_
            scale = np.asarray(self.y_scale_)
            out = {c: (np.zeros((n, Q)), np.zeros((n, Q)))
                   for c in self.components_ + ("offset",)}
            for k, lab in enumerate(labels):
                for rows in _chunks(np.flatnonzero(inv == k)):
                    parts = self._ilmm_rows(Xf[rows], lab, per_component=True)
                    for name, (m, C) in parts.items():
                        dg = np.diagonal(C, axis1=1, axis2=2)
                        # standardised units: unit-variance latent kernels, O(1)
                        # loadings; a switched-off component's round-off is tiny
                        var = nonnegative_variance(
                            dg, np.maximum(np.max(np.abs(dg), axis=0), 1.0), f"{name} variance")
                        out[name][0][rows] = scale * m
                        out[name][1][rows] = scale * np.sqrt(var)
            out["offset"][0][:] += self.y_offset_
            return out
        out = {c: (np.zeros(n), np.zeros(n)) for c in self.components_}
        if getattr(self, "variational_family_", "mean_field") == "structured":
            G = self.server_.global_pack.unpack(self.server_.theta_global)
            out["offset"] = (np.zeros(n), np.zeros(n))
            for k, lab in enumerate(labels):
                blocks, mu_u, Sigma_u, _, E, _ = self._structured_client(lab)
                idx = np.flatnonzero(inv == k)
                v_c = float(self._offset_variance(lab))  # a never-seen client's extra share
                sc = self._client_scale(lab)
                out["offset"][0][idx] = self.y_offset_
                out["offset"][1][idx] = self.y_scale_ * np.sqrt(v_c)
                for rows in _chunks(idx):
                    parts = predict_structured(Xf[rows], blocks, self.components_,
                                               G.get("phi", 1.0), mu_u, Sigma_u, E,
                                               per_component=True, scale=sc)
                    for name, (m, v) in parts.items():
                        if name == "level":  # the client's random level: its constant mean
                            out["offset"][0][rows] += self.y_scale_ * m
                            out["offset"][1][rows] = self.y_scale_ * np.sqrt(v + v_c)
                            continue
                        out[name][0][rows] = self.y_scale_ * m
                        out[name][1][rows] = self.y_scale_ * np.sqrt(v)
            return out
        G = self.server_.global_values()
        for k, lab in enumerate(labels):
            B, cid = self._local_for(lab)
            for rows in _chunks(np.flatnonzero(inv == k)):
                parts = predict_client(Xf[rows], G, B, self.components_, per_component=True,
                                       client=None if lab is _Population else cid)
                for name, (m, v) in parts.items():
                    out[name][0][rows] = self.y_scale_ * m
                    out[name][1][rows] = self.y_scale_ * np.sqrt(v)
        return out

    def score(self, X, y, groups=None, sample_weight=None):
        """Coefficient of determination R^2 of :meth:`predict`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            NaN entries of a multi-output ``y`` (outputs not recorded) are
            left out: each output's R^2 on its observed rows, averaged
            uniformly.
        groups : array-like of shape (n_samples,), default=None
            As in :meth:`predict` (the same :class:`ClientLabelWarning` when
            the rows fall back to the population prediction).
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        score : float
        """
        y_pred = self._predict(X, groups, False, False, "score")
        Q = getattr(self, "n_outputs_", 1)
        y = np.asarray(unmask(y, "y", missing_ok=Q > 1))
        if Q > 1 and (y.ndim != 2 or y.shape[1] != Q):
            raise ValueError(
                f"y has shape {y.shape}; the model was fitted with {Q} outputs, so y must "
                f"have shape (n_samples, {Q})")
        return r2_observed(y, y_pred, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = True
        return tags


def _chunks(idx):
    """Consecutive pieces of the row index ``idx`` of at most PREDICT_CHUNK_ROWS rows."""
    step = max(1, int(PREDICT_CHUNK_ROWS))
    return [idx[start:start + step] for start in range(0, idx.size, step)]


def _check_cov_budget(n, n_outputs=None):
    """Raise MemoryError if an ``n x n`` float64 covariance exceeds MAX_COV_BYTES.

    ``n_outputs``: the call is :meth:`FederatedHierarchicalGPRegressor.predict_joint`
    (``n`` is then rows times outputs), whose message says so.
    """
    needed = 8 * n * n
    if needed > MAX_COV_BYTES:
        gib = 1024**3
        max_n = int(np.sqrt(MAX_COV_BYTES / 8))
        if n_outputs:
            what = (f"predict_joint on {n // n_outputs} rows x {n_outputs} outputs needs a "
                    f"{n} x {n}")
            limit = f"at most {max_n // n_outputs} rows with {n_outputs} outputs"
            advice = ("Use predict(return_cov=True) for the per-row Q x Q blocks, or "
                      "predict_joint on fewer rows.")
        else:
            what = f"predict(return_cov=True) on {n} rows needs a {n} x {n}"
            limit = f"at most {max_n} rows"
            advice = ("Use return_std=True for the marginal variances, or ask for the joint "
                      "covariance of fewer rows.")
        raise MemoryError(
            f"{what} float64 covariance of "
            f"{needed / gib:.1f} GiB ({needed} bytes; computing it takes a few times that), "
            f"above the budget skfedgp.regressor.MAX_COV_BYTES = {MAX_COV_BYTES / gib:.1f} GiB "
            f"({limit}). {advice}"
        )


class _PopulationLabel:
    """Sentinel label: a prediction not tied to any fitted client."""

    def __repr__(self):
        return "<population>"

    def __reduce__(self):
        return (_population_sentinel, ())

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return True


def _population_sentinel():
    return _Population


_Population = _PopulationLabel()
