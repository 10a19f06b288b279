"""Client labels: the ``groups`` argument, the ``client_column`` of ``X``,
and the checks that keep a label mistake from passing silently.

Shared by the estimators (:mod:`skfedgp.regressor` today).  Nothing here
depends on the model; the functions only validate and split inputs.

Conventions
-----------
* A client label is any hashable value that is not missing: ``None``,
  ``float('nan')``, ``pandas.NA`` and ``NaT`` are rejected (``ValueError``
  naming how many rows and which).
* Labels are compared as Python dictionary keys do, by value *and* type:
  ``1``, ``1.0`` and ``np.int64(1)`` are the same client, ``"1"`` is
  another one.  Booleans are the exception: ``True == 1`` in Python, but a
  bool label is never the same client as a number.  A label at prediction
  time that is not a fitted client but looks like one (``"1"`` or ``True``
  when ``1`` was fitted, ``"A "`` or ``"a"`` when ``"A"`` was) gets the
  population prediction *and* a :class:`ClientLabelWarning` naming both
  labels.
* In fit, labels of different types that look alike (``1`` and ``"1"``,
  ``True`` and ``1`` or ``"true"``, ``b"a"`` and ``"a"``) are refused
  (``ValueError`` naming them): such a mix is almost always a column read
  partly as text, and would make two clients of one site (or, for ``True``
  and ``1``, one client of two).  Labels all of one type, bools included,
  are fine.
* ``client_column`` follows :class:`sklearn.compose.ColumnTransformer`: an
  int is a position (negative counts from the end), a string is a pandas
  column name.  The label column is taken out of ``X`` before the features
  are converted to float, so it may hold strings.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import numbers
import sys
import warnings

import numpy as np
from scipy import sparse
from sklearn.utils.validation import check_array, validate_data

__all__ = [
    "ClientLabelWarning",
    "unique_labels",
    "as_label_array",
    "check_groups",
    "normalise_labels",
    "check_labels_present",
    "check_label_types",
    "label_source",
    "match_labels",
    "check_not_strings",
    "split_client_column",
    "labels_from_column",
    "validate_predict_input",
    "warn_groups_overridden",
    "warn_unmatched_labels",
    "warn_groups_missing",
    "keep_state_on_error",
    "check_count",
    "check_n_jobs",
    "check_real",
    "float_param",
    "unmask",
]

#: What the population prediction is, in the warnings (the hierarchical model's).
_POPULATION = "global part plus the prior of the client parts"

#: How many labels a warning or error message lists before it shortens.
_MAX_LISTED = 10


class ClientLabelWarning(UserWarning):
    """A prediction falls back to the population model because of its labels.

    Issued by ``predict``, ``predict_components`` and ``score`` when

    * ``groups`` is None (and there is no ``client_column``) although the
      model was fitted with several clients: every row gets the population
      prediction (global part plus the prior of the client parts), not any
      fitted client's; or
    * a label was not seen in fit but matches a fitted client's label up to
      its type, surrounding white space or letter case (for example ``"1"``
      or ``True`` when the integer ``1`` was fitted, ``1`` when ``True``
      was), or is of a type no fitted label has (for example the integer
      codes ``0, 1, 2`` for clients fitted as ``"alpha", "beta", "gamma"``):
      its rows get the population prediction, which is probably not what was
      meant.

    Also issued by ``fit`` and ``predict`` when an int ``client_column``,
    read as a position, is also the name of another column of a DataFrame
    ``X`` (the position is used).

    Pass an explicit label of the fitted labels' type that was never fitted
    (e.g. ``"new-site"`` for clients named by text, ``-1`` for integer
    labels) to ask for the population prediction without this warning, or
    filter it with :func:`warnings.filterwarnings`.
    """



def user_stacklevel():
    """The ``stacklevel`` that points a warning at the first caller outside the package.

    Called by the function that calls :func:`warnings.warn` (its own frame
    is level 1); frames of this package's modules and of :mod:`contextlib`
    (the decorators around ``fit``) are skipped, by module name (so a user's
    script run from inside the package's folder, or ``python -m skfedgp``,
    whose module is ``__main__``, is not skipped). The frame found is the first
    outside them: the user's line for a direct call, a scikit-learn line
    for a call through a ``Pipeline`` or a search. Every warning of the
    package is issued with it (one policy: a ``module=`` filter names the
    caller's module, a ``category=`` filter selects one kind everywhere).

    Returns
    -------
    int
        At least 1.
    """
    pkg = __name__.partition(".")[0]
    frame, level = sys._getframe(1), 1
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module.partition(".")[0] not in (pkg, "contextlib"):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def _listing(labels):
    """``'a', 'b', ... (N in all)`` for messages."""
    labels = list(labels)
    shown = ", ".join(repr(lab) for lab in labels[:_MAX_LISTED])
    if len(labels) > _MAX_LISTED:
        shown += f", ... ({len(labels)} in all)"
    return shown


def check_bool(value, name):
    """A flag parameter: True or False (NumPy's booleans too).

    Parameters
    ----------
    value : object
        The value given.
    name : str
        Parameter name for the message.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        ``"<name> must be True or False, got <value>"`` (a string such as
        ``"False"`` would otherwise count as True).

    Notes
    -----
    Package plumbing; no paper source.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_count(value, name, *, allow_none=False):
    """A count parameter: an integer ``>= 1`` (a bool is not one).

    Parameters
    ----------
    value : object
        The value given.
    name : str
        Parameter name for the message.
    allow_none : bool, default=False
        Whether None is accepted (and returned).

    Returns
    -------
    int or None

    Raises
    ------
    ValueError
        ``"<name> must be an integer >= 1[ or None], got <value>"``.

    Notes
    -----
    Package plumbing; no paper source.
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return int(value)


def float_param(value, name):
    """A numeric array parameter as float64, or a ValueError naming it.

    Parameters
    ----------
    value : object
        The value given (a number or an array-like of numbers).
    name : str
        Parameter name for the message.

    Returns
    -------
    ndarray of float64

    Raises
    ------
    ValueError
        ``"<name> must be a number or an array of numbers, got <value>"``
        for a string (even a numeric one such as ``"0.5"``), None, a bool,
        an array holding any of these, or a value NumPy cannot convert (a
        ragged list); the bare conversion error named no parameter, and
        NumPy converts ``"0.5"``, None (to NaN) and True (to 1) silently.

    Notes
    -----
    Package plumbing; no paper source. Range and shape checks stay with the
    caller.
    """
    bad = value is None or isinstance(value, (str, bytes, bool, np.bool_))
    if not bad:
        try:
            raw = np.asarray(value)
        except (TypeError, ValueError):
            raw = None
        # numeric strings ("0.5") convert silently, None to NaN, True to 1:
        # refused too
        bad = raw is None or raw.dtype.kind in "USVb" or (
            raw.dtype.kind == "O"
            and any(v is None or isinstance(v, (str, bytes, bool, np.bool_))
                    for v in raw.ravel()))
    if not bad:
        try:
            return np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            pass
    raise ValueError(f"{name} must be a number or an array of numbers, got {value!r}")


def check_n_jobs(value):
    """The ``n_jobs`` parameter: None or a non-zero integer (a bool is not one).

    Parameters
    ----------
    value : object
        The value given.

    Returns
    -------
    int or None

    Raises
    ------
    ValueError
        ``"n_jobs must be None or a non-zero integer ..., got <value>"``
        (joblib itself raised an OverflowError for ``inf``, a message about
        a long expression for ``1e308``, and took ``1.5`` or ``True`` as
        ``1``).

    Notes
    -----
    Package plumbing; no paper source.
    """
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) or value == 0:
        raise ValueError(
            "n_jobs must be None or a non-zero integer (the number of parallel jobs; -1: "
            f"all cores), got {value!r}")
    return int(value)


def check_real(value, name, *, positive=True, allow_none=False):
    """A real scalar parameter: finite and positive (or ``>= 0``); a bool is not one.

    Parameters
    ----------
    value : object
        The value given.
    name : str
        Parameter name for the message.
    positive : bool, default=True
        ``> 0`` (True) or ``>= 0`` (False).
    allow_none : bool, default=False
        Whether None is accepted (and returned).

    Returns
    -------
    float or None

    Raises
    ------
    ValueError
        ``"<name> must be a finite positive number[ or None], got <value>"``
        (``"a finite number >= 0"`` with ``positive=False``).

    Notes
    -----
    Package plumbing; no paper source.
    """
    if value is None and allow_none:
        return None
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not np.isfinite(value) or value < 0 or (positive and value == 0)):
        what = "a finite positive number" if positive else "a finite number >= 0"
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return float(value)


def check_finite_scalar(value, name):
    """A finite real scalar of any sign (NumPy scalars and 0-d arrays too).

    Unlike :func:`check_real`, negative values pass (a caller may document
    its own error for them) and nothing is converted.

    Parameters
    ----------
    value : object
        The value given.
    name : str
        Parameter name for the message.

    Raises
    ------
    ValueError
        ``"<name> must be a finite number, got <value>"`` for NaN, inf, an
        array with more than one entry, a string or None.

    Notes
    -----
    Package plumbing; no paper source.
    """
    try:
        ok = bool(np.ndim(value) == 0 and np.isfinite(value))
    except TypeError:  # a string, None
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_not_strings(y):
    """Refuse regression targets (array-like, pandas included) that hold strings.

    Called before scikit-learn's float conversion so that the error names
    the problem. Input validation of the package (no paper source).

    Parameters
    ----------
    y : array-like of shape (n_samples,) or (n_samples, n_outputs)

    Raises
    ------
    ValueError
        If ``y`` has a string dtype or is an object array holding a string.
    """
    a = np.asarray(y)
    if a.dtype.kind in "US" or (a.dtype.kind == "O" and any(isinstance(v, str)
                                                             for v in a.ravel())):
        raise ValueError(
            f"y must hold numbers (a regression target), got an array of dtype "
            f"{a.dtype} with strings; for class labels use a classifier")


def _object_array(labels):
    """A sequence of labels as a 1-D object array, each element kept as given
    (``np.asarray`` would turn ``[0, 1, "new"]`` into strings, and a list of
    tuples into a 2-D array)."""
    return np.asarray(list(labels) + [None], dtype=object)[:-1]


def as_label_array(groups):
    """Client labels as an array, a list keeping its labels' types.

    An array (or a pandas Series) is taken as it is; a list or tuple becomes
    an object array, so ``[0, 1, "new"]`` keeps its int labels as ints. A
    list holding tuples is a list of tuple labels, one a row: it becomes a
    1-D object array of those tuples (``np.asarray`` would read
    ``[("site", 0), ("site", 1)]`` as a 2-D array of shape ``(2, 2)``),
    except a list of 1-tuples only (``list(zip(g))``), which stays a column
    of labels as before.

    Parameters
    ----------
    groups : array-like of shape (n,) or (n, 1)

    Returns
    -------
    ndarray
        Of shape ``(n,)``, or as ``np.asarray`` gives it (the caller checks
        the shape).

    Notes
    -----
    Input validation of the package (no paper source).
    """
    if hasattr(groups, "dtype"):
        return np.asarray(groups)
    if (isinstance(groups, (list, tuple)) and any(isinstance(lab, tuple) for lab in groups)
            and not all(isinstance(lab, tuple) and len(lab) == 1 for lab in groups)):
        # (a list of 1-tuples, e.g. list(zip(g)), stays a column of labels)
        return _object_array(groups)
    return np.asarray(groups, dtype=object)


def label_source(client_column):
    """How ``fit``'s labels are named in messages: ``"groups passed to fit"``
    or ``"client_column='station'"``."""
    return ("groups passed to fit" if client_column is None
            else f"client_column={client_column!r}")


def unique_labels(labels):
    """Sorted unique labels and the inverse index (first-seen order if unorderable).

    Parameters
    ----------
    labels : array-like of shape (n,)
        Hashable labels. A list is taken as objects: ``[0, 1, "new"]`` keeps
        the int labels as ints (NumPy would turn them all into strings).

    Returns
    -------
    uniq : list of length n_labels
        Distinct labels as plain Python values (``0``, ``'a'``, not
        ``np.int64(0)``), sorted when they can be compared.
    inv : ndarray of shape (n,), int
        ``uniq[inv[r]]`` is the label of row ``r``.
    """
    if not isinstance(labels, np.ndarray):
        labels = _object_array(labels)
    if labels.dtype.kind != "O":
        uniq, inv = np.unique(labels, return_inverse=True)
        # plain Python labels (``0``, ``'a'``, not ``np.int64(0)``) in clients_ and messages
        return [u.item() if isinstance(u, np.generic) else u for u in uniq], inv.ravel()
    # objects are grouped by equality and hash, as dictionary keys (np.unique
    # sorts with ``<``, which for sets means "subset of", and then merges only
    # neighbours, so frozenset labels split into many clients)
    order = {}
    inv = np.empty(len(labels), dtype=int)
    for i, lab in enumerate(labels):
        inv[i] = order.setdefault(lab, len(order))
    uniq = [u.item() if isinstance(u, np.generic) else u for u in order]
    try:
        perm = sorted(range(len(uniq)), key=uniq.__getitem__)
        ordered = all(uniq[a] < uniq[b] for a, b in zip(perm, perm[1:]))
    except TypeError:  # labels of types that do not compare: first-seen order
        ordered = False
    if not ordered:  # no total order (mixed types, sets): first-seen order
        return uniq, inv
    rank = np.empty(len(uniq), dtype=int)
    rank[perm] = np.arange(len(uniq))
    return [uniq[k] for k in perm], rank[inv]


def normalise_labels(labels, source):
    """Client labels in the one form they are compared in.

    * Dates and times (``datetime64`` arrays of any unit, ``datetime.date``,
      ``datetime.datetime``, ``numpy.datetime64`` and ``pandas.Timestamp``
      values) become ``pandas.Timestamp``, so the same day given as
      ``datetime64[D]``, ``datetime64[ns]`` or a pandas Series is one
      client (without this, ``datetime64[ns]`` labels turn into integers).
    * Every label must be hashable (it keys the client's messages).

    Parameters
    ----------
    labels : ndarray of shape (n,)
    source : str
        What the labels are, for the message.

    Returns
    -------
    labels : ndarray of shape (n,)
        ``labels`` itself when nothing changes, else an object array.

    Raises
    ------
    ValueError
        If a label is not hashable (a list, a dict, an array); names its row.

    Notes
    -----
    Input validation of the package (no paper source).
    """
    labels = np.asarray(labels)
    if labels.dtype.kind == "M":
        # the distinct values only (a year of hourly rows has few clients)
        uniq, inv = np.unique(labels, return_inverse=True)
        stamps = np.empty(uniq.shape[0], dtype=object)
        try:
            stamps[:] = [_timestamp(u) for u in uniq]
        except _OUT_OF_BOUNDS:  # beyond pandas' range: kept as they are
            return labels
        return stamps[inv.ravel()]
    if labels.dtype.kind != "O":
        return labels
    out = None
    for i, lab in enumerate(labels):
        try:
            hash(lab)
        except TypeError:
            raise ValueError(
                f"{source} holds an unhashable client label at row {i}: {lab!r} (of type "
                f"{type(lab).__name__}); client labels must be hashable values such as "
                "ints or strings (a tuple instead of a list)") from None
        if isinstance(lab, (datetime.date, np.datetime64)) and not _is_timestamp(lab):
            try:
                stamp = _timestamp(lab)
            except _OUT_OF_BOUNDS:  # beyond pandas' range (pandas < 2): as it is
                continue
            if out is None:
                out = labels.copy()
            out[i] = stamp
    return labels if out is None else out


#: Errors of a date beyond ``pandas.Timestamp``'s range (and of NaT-like input).
_OUT_OF_BOUNDS = (OverflowError, ValueError)


def _timestamp(value):
    """``pandas.Timestamp(value)`` (pandas' OutOfBoundsDatetime is a ValueError)."""
    import pandas as pd  # a dependency; imported only for date labels

    return pd.Timestamp(value)


def _missing_mask(labels):
    """Boolean mask of missing labels (None, NaN, pandas.NA, NaT)."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "fc":
        return np.isnan(labels)
    if labels.dtype.kind == "M" or labels.dtype.kind == "m":
        return np.isnat(labels)
    if labels.dtype.kind != "O":
        return np.zeros(labels.shape, dtype=bool)
    import pandas as pd  # a dependency; imported only for object labels

    return np.asarray(pd.isna(labels), dtype=bool)


def check_labels_present(labels, source):
    """Raise if any client label is missing.

    Parameters
    ----------
    labels : ndarray of shape (n,)
    source : str
        What the labels are, for the message (``"groups passed to fit"``,
        ``"client_column 'station'"``).

    Raises
    ------
    ValueError
        If a label is None, NaN, ``pandas.NA`` or ``NaT``; the message gives
        the number of such rows and the first row indices.
    """
    bad = np.flatnonzero(_missing_mask(labels))
    if bad.size:
        rows = ", ".join(str(r) for r in bad[:_MAX_LISTED])
        more = ", ..." if bad.size > _MAX_LISTED else ""
        raise ValueError(
            f"{source} has {bad.size} missing client label(s) (None or NaN) of "
            f"{len(labels)} rows, at row(s) {rows}{more}; client labels must be "
            "non-missing (drop those rows or give them a label)"
        )


def check_groups(groups, n, where):
    """Validate ``groups``: one non-missing label per row of ``X``.

    Parameters
    ----------
    groups : array-like of shape (n,) or (n, 1), or None
        A list of tuples is one tuple label a row (:func:`as_label_array`).
    n : int
        Number of rows of ``X``.
    where : str
        ``"fit"``, ``"predict"``, ... for the messages.

    Returns
    -------
    groups : ndarray of shape (n,) or None

    Raises
    ------
    ValueError
        Wrong length or shape, a missing label or an unhashable one.

    Notes
    -----
    Dates and times come back as ``pandas.Timestamp`` (:func:`normalise_labels`).
    """
    if groups is None:
        return None
    groups = as_label_array(groups)
    if groups.ndim != 1:
        groups = groups.reshape(-1) if groups.ndim == 2 and 1 in groups.shape else groups
    if groups.ndim != 1 or groups.shape[0] != n:
        raise ValueError(
            f"groups passed to {where} must be 1-D with one label per row of X "
            f"({n} rows), got shape {np.shape(groups)}"
        )
    check_labels_present(groups, f"groups passed to {where}")
    return normalise_labels(groups, f"groups passed to {where}")


def _column_position(X, column, n_columns):
    """Position of ``client_column`` in ``X`` (int position or pandas name)."""
    is_frame = hasattr(X, "columns") and hasattr(X, "iloc")
    if isinstance(column, numbers.Integral) and not isinstance(column, bool):
        if not -n_columns <= column < n_columns:
            raise ValueError(
                f"client_column={column!r} is not a column index of X with {n_columns} columns"
            )
        j = int(column) % n_columns
        if is_frame:
            named = [k for k, name in enumerate(X.columns)
                     if isinstance(name, numbers.Integral) and not isinstance(name, bool)
                     and name == column]
            if named and named[0] != j:
                warnings.warn(
                    f"client_column={column!r} is read as a position (column {j}, named "
                    f"{_plain(X.columns[j])!r}), as scikit-learn's ColumnTransformer reads an "
                    f"int, but X also has a column named {column!r} (position {named[0]}): X's "
                    "integer column names are not their positions, so an int client_column is "
                    "ambiguous. Rename the columns to text (X.columns = X.columns.astype(str)) "
                    "and pass the label column's name", ClientLabelWarning,
                    stacklevel=user_stacklevel())
        return j
    if isinstance(column, str):
        if not is_frame:
            raise ValueError(
                f"client_column={column!r} is a column name, but X has no column names "
                f"(it is a {type(X).__name__}, not a pandas DataFrame); pass X as a "
                "DataFrame holding that column, or set client_column to the column's "
                "integer position (for a fitted model: and fit again)"
            )
        # (scikit-learn has already rejected duplicate string column names)
        matches = np.flatnonzero(np.asarray(X.columns == column))
        if matches.size == 0:
            raise ValueError(
                f"client_column={column!r} is not a column of X; X has columns "
                f"{_listing(X.columns)}"
            )
        return int(matches[0])
    raise ValueError(
        f"client_column={column!r} is not a column index of X with {n_columns} columns "
        "(expected an int position or, for a pandas DataFrame, a column name)"
    )


def warn_groups_overridden(groups, labels, column, where):
    """Warn when ``groups`` was passed with a ``client_column`` and disagrees with it.

    The column is the client label (it overrides ``groups``); a ``groups``
    that names other clients for some rows is most likely a mistake, which
    silently ignoring it would hide.

    Parameters
    ----------
    groups : ndarray of shape (n_samples,) or None
        As passed (after :func:`check_groups`).
    labels : ndarray of shape (n_samples,)
        The labels read from the column.
    column : int or str
        ``client_column`` (for the message).
    where : str
        ``"fit"``, ``"predict"``, ... (for the message).

    Warns
    -----
    ClientLabelWarning
        If ``groups`` differs from the column in any row.
    """
    if groups is None:
        return
    a = np.asarray(groups, dtype=object)
    b = np.asarray(labels, dtype=object)
    differ = int(np.sum([not (x == y) for x, y in zip(a, b)]))
    if differ:
        warnings.warn(
            f"groups passed to {where} differs from client_column={column!r} in {differ} of "
            f"{len(b)} rows; the column is used (groups is ignored when client_column is "
            "set)", ClientLabelWarning, stacklevel=user_stacklevel())


def split_client_column(estimator, X, column, *, reset):
    """Take the client-label column out of ``X`` before numeric validation.

    ``estimator.n_features_in_`` (and ``feature_names_in_`` for a DataFrame
    with string column names) describe ``X`` *as passed*, label column
    included, as scikit-learn expects of any estimator: they are set when
    ``reset`` is true (fit) and checked otherwise (predict).

    Parameters
    ----------
    estimator : BaseEstimator
    X : array-like or pandas.DataFrame of shape (n_samples, n_columns)
        May hold strings in the label column (the features must be numeric).
    column : int or str
        ``client_column``: an int position (negative counts from the end) or,
        for a DataFrame, a column name.
    reset : bool
        True in fit, False in predict.

    Returns
    -------
    features : ndarray or pandas.DataFrame of shape (n_samples, n_columns - 1)
        The other columns, not yet converted to float.
    labels : ndarray of shape (n_samples,), object or numeric
        The label column.

    Raises
    ------
    ValueError
        ``X`` not 2-D, ``column`` not a position or name of ``X``, no feature
        left besides the labels, wrong number of columns or different
        column names at predict.
    TypeError
        Sparse ``X`` (not supported).
    """
    if sparse.issparse(X):
        raise TypeError(
            "Sparse data was passed to a federated GP estimator; it needs dense X "
            "(call X.toarray())"
        )
    is_frame = hasattr(X, "columns") and hasattr(X, "iloc")
    if not is_frame:
        X = X if isinstance(X, np.ndarray) else np.asarray(X, dtype=object)
        if X.ndim != 2:
            raise ValueError(
                f"Expected a 2D array X with the client labels in column {column!r}, got an "
                f"array of shape {X.shape}; reshape a single feature with X.reshape(-1, 1) "
                "and add the label column"
            )
    validate_data(estimator, X, reset=reset, skip_check_array=True)
    n_columns = X.shape[1]
    j = _column_position(X, column, n_columns)
    if n_columns < 2:
        raise ValueError("client_column needs X with at least one feature besides the labels")
    keep = [k for k in range(n_columns) if k != j]
    if is_frame:
        return X.iloc[:, keep], X.iloc[:, j].to_numpy(dtype=object)
    return X[:, keep], X[:, j]



def labels_from_column(groups, labels, column, where):
    """The client labels read from a ``client_column``, checked and normalised.

    Parameters
    ----------
    groups : ndarray of shape (n,) or None
        ``groups`` as given (from :func:`check_groups`); the column overrides
        it, with a warning where they differ.
    labels : ndarray of shape (n,)
        The label column (from :func:`split_client_column`).
    column : int or str
        ``client_column``, for the messages.
    where : str
        ``"fit"``, ``"predict"``, ... for the messages.

    Returns
    -------
    labels : ndarray of shape (n,)
        As :func:`normalise_labels` returns them.

    Raises
    ------
    ValueError
        A missing or an unhashable label.

    Notes
    -----
    Input validation of the package (no paper source).
    """
    source = f"client_column={column!r}"
    check_labels_present(labels, source)
    labels = normalise_labels(labels, source)
    warn_groups_overridden(groups, labels, column, where)
    return labels


def unmask(value, name, *, missing_ok=False):
    """A NumPy masked array as a plain array, its masked entries never read.

    NumPy's ``asarray`` (and so scikit-learn's ``check_array``) drops a
    mask and reads the values under it. Where a missing entry has a
    meaning (a multi-output target's unrecorded output, a curve's missing
    point) the masked entries become NaN; elsewhere they are an error.

    Parameters
    ----------
    value : object
        Anything passed as ``name``; returned unchanged unless it is a
        :class:`numpy.ma.MaskedArray`.
    name : str
        The argument's name, for the message (``"X"``, ``"y"``, ``"groups"``).
    missing_ok : bool, default=False
        Whether NaN marks a missing entry of ``name`` in this call.

    Returns
    -------
    value : object or ndarray
        ``value`` itself if it is not a masked array; its data if nothing
        is masked; with ``missing_ok``, a float64 copy with NaN at the
        masked entries.

    Raises
    ------
    ValueError
        If entries are masked and ``missing_ok`` is False, naming how many
        and the first one.

    Notes
    -----
    Input validation of the package (no paper source).
    """
    if not np.ma.isMaskedArray(value):
        return value
    mask = np.ma.getmaskarray(value)
    data = np.ma.getdata(value)
    if not mask.any():
        return data
    if missing_ok:
        filled = np.array(data, dtype=np.float64, copy=True)
        filled[mask] = np.nan
        return filled
    first = tuple(int(i) for i in np.argwhere(mask)[0])
    where = first[0] if len(first) == 1 else first
    raise ValueError(
        f"{name} is a masked array with {int(mask.sum())} masked entr"
        f"{'y' if mask.sum() == 1 else 'ies'} (first at index {where}); NumPy and "
        f"scikit-learn would read the values under the mask. Drop those rows, or "
        f"fill them (e.g. {name}.filled(value)) if the values are real")


def validate_predict_input(estimator, X, groups, where):
    """Features (float64) and client labels (or None) of a prediction.

    The label column is the one of the fit (``estimator.client_column_``;
    ``client_column`` before any fit): a value set with ``set_params``
    after fit applies from the next fit on.

    Parameters
    ----------
    estimator : BaseEstimator
        A fitted estimator with ``client_column``.
    X : array-like or pandas.DataFrame of shape (n_samples, n_columns)
    groups : array-like of shape (n_samples,) or None
    where : str
        Method name for the messages.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
    labels : ndarray of shape (n_samples,) or None

    Raises
    ------
    ValueError
        As :func:`split_client_column`, :func:`check_groups` and
        :func:`labels_from_column`, or for non-finite features.

    Notes
    -----
    Input validation of the package (no paper source).
    """
    X = unmask(X, "X")
    groups = unmask(groups, "groups")
    column = getattr(estimator, "client_column_", estimator.client_column)
    if column is None:
        X = validate_data(estimator, X, reset=False, dtype=np.float64)
        return X, check_groups(groups, X.shape[0], where)
    X, labels = split_client_column(estimator, X, column, reset=False)
    X = check_array(X, dtype=np.float64, estimator=estimator, input_name="X")
    groups = check_groups(groups, X.shape[0], where)
    return X, labels_from_column(groups, labels, column, where)

def _loose_key(label):
    """A label with type, surrounding space and case ignored (for hints only)."""
    if isinstance(label, (bytes, np.bytes_)):
        label = label.decode("utf-8", errors="replace")
    if isinstance(label, str):
        text = label.strip()
        try:
            return ("number", float(text))
        except ValueError:
            return ("text", text.casefold())
    if isinstance(label, (numbers.Real, decimal.Decimal)):  # Decimal is not a Real
        try:
            return ("number", float(label))
        except (OverflowError, ValueError):  # an int beyond float range
            return ("text", str(label))
    return ("other", str(label).strip().casefold())


def _plain(label):
    """A label as a plain Python value: unwrapped, ``np.int64(1)`` -> ``1``."""
    if isinstance(label, _TypeMismatch):
        label = label.label
    return label.item() if isinstance(label, np.generic) else label


def _is_bool(label):
    return isinstance(label, (bool, np.bool_))


def _type_kind(t):
    """The family of a label type: 'bool', 'number', 'str', 'bytes', else the type name.

    Labels of one family never look alike by accident (``'1'`` and ``'01'``
    are two names); labels of two families that look alike are a type mix-up.
    """
    if issubclass(t, (bool, np.bool_)):
        return "bool"
    if issubclass(t, numbers.Number):
        return "number"
    if issubclass(t, str):
        return "str"
    if issubclass(t, (bytes, np.bytes_)):
        return "bytes"
    return t.__name__


def _loose_keys(label):
    """Every loose key of a label: a bool looks like ``1`` and like ``'true'``."""
    label = _plain(label)
    if isinstance(label, bool):
        return (("number", float(label)), ("text", str(label).casefold()))
    if _is_timestamp(label):
        # a date label (normalise_labels makes every date a Timestamp) looks
        # like its ISO text, with and without the time of a midnight
        keys = [("text", label.isoformat().casefold()), ("text", str(label).casefold())]
        if label == label.normalize():
            keys.append(("text", label.date().isoformat()))
        return tuple(dict.fromkeys(keys))
    key = _loose_key(label)
    if key[0] == "other":  # its string form, as a label read as text would be
        return (("text", key[1]),)
    return (key,)


def _is_timestamp(label):
    """Whether ``label`` is a ``pandas.Timestamp`` (without importing pandas)."""
    return type(label).__name__ == "Timestamp" and hasattr(label, "normalize")


def _described(label):
    """``1 (int)``, ``'1' (str)`` for messages."""
    label = _plain(label)
    return f"{label!r} ({type(label).__name__})"


def check_label_types(labels, source):
    """Raise if labels of different types look alike (``1`` and ``'1'``, ``True`` and ``1``).

    Labels are compared by value and type, so ``1`` and ``'1'`` would make
    two clients and ``True`` and ``1`` (equal in Python) one. A mix like
    that almost always comes from a label column read partly as text (a CSV
    column, an object column built from several sources), so ``fit``
    refuses it instead of guessing. Labels all of one type (bools included),
    and mixed types that do not look alike (``0``, ``1``, ``'new'``), pass.

    Parameters
    ----------
    labels : array-like of shape (n,)
        Non-missing client labels (see :func:`check_labels_present`).
    source : str
        What the labels are, for the message (``"groups passed to fit"``,
        ``"client_column='station'"``).

    Raises
    ------
    ValueError
        Naming each set of look-alike labels with their types, and how to
        fix it (cast the labels to one type).
    """
    if not isinstance(labels, np.ndarray):
        labels = _object_array(labels)
    if labels.dtype != object:
        return  # one NumPy dtype, one type
    labels = labels.ravel()
    kind_of = {t: _type_kind(t) for t in set(map(type, labels))}
    if len(set(kind_of.values())) < 2:
        return
    row_kind = np.array([kind_of[type(v)] for v in labels])
    alike = {}
    for kind in dict.fromkeys(row_kind.tolist()):  # in first-seen order
        uniq, _ = unique_labels(labels[row_kind == kind])
        for lab in uniq:
            for key in _loose_keys(lab):
                alike.setdefault(key, []).append(lab)
    clashes = {}
    for labs in alike.values():
        if len({_type_kind(type(lab)) for lab in labs}) > 1:
            text = " vs ".join(_described(lab) for lab in labs)
            clashes.setdefault(text, None)
    if not clashes:
        return
    described = "; ".join(list(clashes)[:_MAX_LISTED])
    if len(clashes) > _MAX_LISTED:
        described += f"; ... ({len(clashes)} such sets)"
    raise ValueError(
        f"{source} mixes client labels of different types that look alike: {described}. "
        "Labels are compared by value and type, so 1 and '1' would be fitted as two "
        "different clients and True and 1 (equal in Python) as one; a mix like this "
        "usually comes from a label column read partly as text. Cast the labels to one "
        "type before fit (e.g. groups.astype(str), or df[column].astype(str) for "
        "client_column)."
    )


class _TypeMismatch:
    """A prediction label equal to a fitted client's label but of another type.

    ``True == 1`` (and ``hash(True) == hash(1)``), so Python would find the
    bool ``True`` among the fitted clients ``{1: ...}``. Wrapped, the label
    matches no fitted client: its rows get the population prediction, as a
    ``'1'`` does, and :func:`warn_unmatched_labels` names it.
    """

    __slots__ = ("label",)

    def __init__(self, label):
        self.label = label

    def __repr__(self):
        return repr(self.label)


def match_labels(groups, fitted, where, population=None):
    """Distinct labels of ``groups`` at prediction and their fitted clients.

    As :func:`unique_labels`, but a bool label is never a numeric fitted
    client nor a number a bool one (``True`` is not client ``1``, though
    ``True == 1``): such a label is returned wrapped so that it matches no
    fitted client, and a :class:`ClientLabelWarning` names it, as for the
    other look-alikes of :func:`warn_unmatched_labels`.

    Parameters
    ----------
    groups : ndarray of shape (n,)
        Non-missing labels (from :func:`check_groups` or the client column).
    fitted : collection
        Labels of the fitted clients.
    where : str
        Method name for the message.
    population : str, optional
        Passed to :func:`warn_unmatched_labels`.

    Returns
    -------
    labels : list of length n_labels
        Distinct labels; each is a fitted client's label or one that
        matches none (never fitted, or of the wrong type).
    inv : ndarray of shape (n,), int
        ``labels[inv[r]]`` is the label of row ``r``.

    Warns
    -----
    ClientLabelWarning
        For labels that are not fitted clients but look like one.
    """
    if not isinstance(groups, np.ndarray):
        groups = _object_array(groups)
    groups = groups.ravel()
    is_bool = None
    if groups.dtype == object:
        is_bool = np.fromiter(map(_is_bool, groups), dtype=bool, count=groups.size)
    if is_bool is not None and is_bool.any() and not is_bool.all():
        # bools apart from numbers: True and 1 are two labels here
        rest, inv_rest = unique_labels(groups[~is_bool])
        bools, inv_bools = unique_labels(groups[is_bool])
        labels = rest + bools
        inv = np.empty(groups.size, dtype=int)
        inv[~is_bool] = inv_rest
        inv[is_bool] = inv_bools + len(rest)
    else:
        labels, inv = unique_labels(groups)
    own = {lab: lab for lab in fitted}  # a lookup gives the fitted label itself
    labels = [
        _TypeMismatch(lab) if lab in own and _is_bool(lab) != _is_bool(own[lab]) else lab
        for lab in labels
    ]
    warn_unmatched_labels(labels, fitted, where, population=population)
    return labels, inv


def warn_unmatched_labels(labels, fitted, where, population=None):
    """Warn about labels that are not fitted clients but look like one.

    Parameters
    ----------
    labels : list
        Distinct labels passed to ``where`` (as :func:`match_labels` returns
        them: a bool label of a number-labelled model counts as not fitted).
    fitted : collection
        Labels of the fitted clients.
    where : str
        Method name for the message.
    population : str, optional
        What the model predicts for an unfitted label, for the message
        (default: the hierarchical model's global part plus the prior of the
        client parts).

    Warns
    -----
    ClientLabelWarning
        Naming each such label, its type, and the fitted label it resembles.
    """
    unseen = [lab for lab in labels if lab not in fitted]
    if not unseen:
        return
    keys = {}
    for lab in fitted:
        for key in _loose_keys(lab):
            keys.setdefault(key, lab)
    pairs, foreign = [], []
    kinds = {_type_kind(type(_plain(lab))) for lab in fitted}
    for lab in unseen:
        found = [keys[key] for key in _loose_keys(lab) if key in keys]
        if found:
            pairs.append((lab, found[0]))
        elif _type_kind(type(_plain(lab))) not in kinds:
            foreign.append(lab)
    if not pairs and not foreign:
        return
    parts = [f"{_described(new)} is not a fitted client, but {_described(old)} is"
             for new, old in pairs[:_MAX_LISTED]]
    if len(pairs) > _MAX_LISTED:
        parts.append(f"... ({len(pairs)} such labels)")
    if foreign:
        fitted_types = sorted({type(_plain(lab)).__name__ for lab in fitted})
        shown = ", ".join(_described(lab) for lab in foreign[:_MAX_LISTED])
        if len(foreign) > _MAX_LISTED:
            shown += f", ... ({len(foreign)} in all)"
        verb = "is not a fitted client" if len(foreign) == 1 else "are not fitted clients"
        parts.append(f"{shown} {verb}, and "
                     f"no fitted client has a label of that type (the fitted labels are "
                     f"{_listing(fitted)}, of type "
                     f"{' and '.join(fitted_types)})")
    warnings.warn(
        f"{where}: {'; '.join(parts)}. Client labels must match the labels given to fit in "
        "value and type (1, '1' and True are three different clients), so these rows get "
        f"the population prediction ({population or _POPULATION}), not a fitted "
        "client's. Convert the labels to the type used in fit (for the population "
        "prediction on purpose, pass a never-fitted label of that type).",
        ClientLabelWarning,
        stacklevel=user_stacklevel(),
    )


def warn_groups_missing(fitted, where):
    """Warn that ``groups=None`` on a several-client model means population rows.

    Parameters
    ----------
    fitted : collection
        Labels of the fitted clients (more than one).
    where : str
        Method name for the message.

    Warns
    -----
    ClientLabelWarning
    """
    warnings.warn(
        f"{where} was called with groups=None on a model fitted with {len(fitted)} clients "
        f"({_listing(fitted)}): every row gets the population prediction (global part "
        "plus the prior of the client parts), not any fitted client's prediction. Pass "
        "groups= (one client label per row) to predict for fitted clients, or an explicit "
        "label of their type that was never fitted (e.g. 'new-site' for text labels) to "
        "ask for the population prediction without this warning.",
        ClientLabelWarning,
        stacklevel=user_stacklevel(),
    )


def r2_observed(y, y_pred, sample_weight=None):
    """R^2 (scikit-learn's ``r2_score``) with NaN targets left out.

    Multi-output targets may hold NaN for outputs a sensor did not record
    (accepted by ``fit``); each output's R^2 is then computed on its observed
    rows and the outputs are averaged uniformly, as ``r2_score`` does. Without
    NaN the result is ``r2_score``'s exactly.

    Parameters
    ----------
    y, y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
    sample_weight : ndarray of shape (n_samples,) or None

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If an output has no observed entry.
    """
    from sklearn.metrics import r2_score

    y = np.asarray(y, dtype=float)
    y_pred = np.asarray(y_pred, dtype=float)
    sample_weight = unmask(sample_weight, "sample_weight")
    if y.ndim != 2 or not np.any(np.isnan(y)):
        return r2_score(y, y_pred, sample_weight=sample_weight)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    scores = []
    for q in range(y.shape[1]):
        seen = ~np.isnan(y[:, q])
        if not np.any(seen):
            raise ValueError(f"output {q} of y has no observed entry to score")
        scores.append(r2_score(y[seen, q], y_pred[seen, q],
                               sample_weight=None if w is None else w[seen]))
    return float(np.mean(scores))


def keep_state_on_error(method):
    """Decorate a ``fit``-like method so that an error leaves the estimator as it was.

    The instance's attributes are saved before the call (a shallow copy of
    ``vars(self)``: the method must replace attributes, not change them in
    place) and put back, with any attribute the call added removed, if the
    call raises. ``validate_data`` sets ``n_features_in_`` before the later
    checks run, so without this a refit that fails validation would leave a
    model whose fitted parts expect one input width and whose
    ``n_features_in_`` says another.

    Parameters
    ----------
    method : callable
        The method to wrap.

    Returns
    -------
    callable
        The wrapped method; it returns what ``method`` returns and re-raises
        its exception unchanged.

    Notes
    -----
    No paper source: an implementation convention (scikit-learn does not
    require it; this package promises it for every estimator).
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        saved = dict(vars(self))
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            vars(self).clear()
            vars(self).update(saved)
            raise

    return wrapper
