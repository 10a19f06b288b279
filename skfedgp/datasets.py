"""Data sets for federated Gaussian-process experiments.

* :func:`load_beijing_air_quality` reads the Beijing Multi-Site Air-Quality
  files (one client per monitoring station) from a local folder.
* :func:`fetch_beijing_air_quality` downloads the UCI archive once, caches
  the extracted CSV files and then calls the loader.
* :func:`make_hierarchical_regression` simulates data with the pFedHGP
  global + deviation + local structure.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
import urllib.parse
import urllib.request
import warnings
import zipfile
from datetime import datetime
from numbers import Integral
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch, check_random_state

__all__ = [
    "DEFAULT_URL",
    "load_beijing_air_quality",
    "fetch_beijing_air_quality",
    "make_hierarchical_regression",
    "load_ucr_ts",
    "make_stamping_waveforms",
]

#: Download location of UCI data set 501 ("Beijing Multi-Site Air Quality").
DEFAULT_URL = (
    "https://archive.ics.uci.edu/static/public/501/"
    "beijing+multi+site+air+quality+data.zip"
)

_STATION_FILE_RE = re.compile(
    r"^PRSA_Data_(?P<station>[A-Za-z]+)_(?P<first>\d{8})-(?P<last>\d{8})\.csv(?P<gz>\.gz)?$"
)
_TIME_COLUMNS = ("year", "month", "day", "hour")
_NON_TARGET_COLUMNS = ("No", "wd", "station")
_DOWNLOAD_TIMEOUT = 60.0  # seconds, per blocking socket operation
_MAX_ZIP_DEPTH = 3  # nesting levels of zip archives searched for CSV files

_BEIJING_DESCR = """\
Beijing Multi-Site Air-Quality data
-----------------------------------

Hourly air-pollutant concentrations (PM2.5, PM10, SO2, NO2, CO, O3) and
weather (TEMP, PRES, DEWP, RAIN, wd, WSPM) at 12 monitoring stations in
Beijing from 2013-03-01 to 2017-02-28, Beijing local time (UTC+8). In the
federated setting every station is one client.

The returned ``data`` is the time in days since midnight of the first day kept;
``target`` is the chosen column (default PM2.5, in ug/m^3); ``groups`` holds
the station names. Rows whose target is missing (``NA``) are dropped.

Source: Zhang, S., Guo, B., Dong, A., He, J., Xu, Z. and Chen, S. X. (2017),
"Cautionary tales on air-quality improvement in Beijing", Proceedings of the
Royal Society A 473(2205): 20170457. UCI Machine Learning Repository, data
set id 501, "Beijing Multi-Site Air Quality", licensed CC BY 4.0 (cite
Zhang et al. 2017).
"""


# ---------------------------------------------------------------------------
# Beijing air quality: local loader
# ---------------------------------------------------------------------------
def _name_span_days(match):
    """Days between the two dates of a station file name (-1 if invalid)."""
    try:
        first = datetime.strptime(match["first"], "%Y%m%d")
        last = datetime.strptime(match["last"], "%Y%m%d")
    except ValueError:
        return -1
    return (last - first).days


def _find_station_files(data_dir):
    """Map station name -> file path for the PRSA files in ``data_dir``."""
    candidates = {}
    for path in sorted(Path(data_dir).iterdir()):
        match = _STATION_FILE_RE.match(path.name)
        if match is None or not path.is_file():
            continue
        candidates.setdefault(match["station"], []).append((match, path))
    chosen = {}
    for station, items in candidates.items():
        # widest date span first, then plain .csv before .csv.gz
        items.sort(key=lambda mp: (-_name_span_days(mp[0]), bool(mp[0]["gz"]), mp[1].name))
        chosen[station] = items[0][1]
        if len(items) > 1:
            warnings.warn(
                f"several files for station {station!r} in {data_dir}: "
                f"{[p.name for _, p in items]}; using {items[0][1].name}",
                UserWarning,
                stacklevel=3,
            )
    return chosen


def _validate_hours(hours):
    if hours is None:
        return None
    if isinstance(hours, Integral):
        hours = (hours,)
    try:
        values = [int(h) for h in hours]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"hours must be None or integers in 0..23, got {hours!r}") from exc
    if any(h != float(orig) for h, orig in zip(values, hours)):
        raise ValueError(f"hours must be whole numbers in 0..23, got {hours!r}")
    bad = [h for h in values if not 0 <= h <= 23]
    if bad:
        raise ValueError(f"hours must lie in 0..23, got {bad}")
    if not values:
        raise ValueError("hours is empty; use None to keep every hour")
    return sorted(set(values))


def load_beijing_air_quality(
    data_dir,
    *,
    hours=(2, 14),
    target="PM2.5",
    start=None,
    end=None,
    stations=None,
):
    """Load the Beijing Multi-Site Air-Quality data from a local folder.

    Reads every station file ``PRSA_Data_<Station>_<YYYYMMDD>-<YYYYMMDD>.csv``
    or ``.csv.gz`` in ``data_dir`` (the original UCI names
    ``..._20130301-20170228.csv`` and the one-year subsets
    ``..._20130301-20140228.csv.gz`` both match). If one station has several
    files, the one with the widest date range in its name is used (plain
    ``.csv`` preferred on a tie) and a :class:`UserWarning` is issued.

    The defaults reproduce the pFedHGP air-quality study: PM2.5 at 02:00 and
    14:00 each day (730 rows per station and year before missing values are
    dropped).

    Parameters
    ----------
    data_dir : str or path-like
        Folder holding the station CSV files.
    hours : iterable of int or int or None, default=(2, 14)
        Hours of the day (0..23, Beijing local time) to keep. ``None`` keeps
        every hour.
    target : str, default="PM2.5"
        Numeric column used as the regression target, e.g. ``"PM2.5"``,
        ``"PM10"``, ``"NO2"``, ``"TEMP"``.
    start, end : str or datetime-like, optional
        Keep timestamps ``start <= t < end`` (start inclusive, end exclusive),
        anything :class:`pandas.Timestamp` accepts, e.g. ``"2013-03-01"``.
        ``None`` means no bound (the whole file).
    stations : iterable of str, optional
        Station names to load (e.g. ``["Dongsi", "Shunyi"]``); default all
        stations found.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        With the fields

        data : ndarray of shape (n, 1), float64
            Time in days since midnight (00:00) of the day of the earliest
            timestamp kept in the whole returned set (over all stations), so
            the fractional part is the hour of day / 24: with the default
            hours the first value is 02:00 -> ``2/24`` and a year of data
            lies in ``[0, 365)``.
        target : ndarray of shape (n,), float64
            The target column, missing values dropped.
        groups : ndarray of shape (n,), object
            Station name of every row (one client per station).
        frame : pandas.DataFrame
            Columns ``time_days``, ``timestamp`` (naive, Beijing local
            time), ``station`` and the target column.
        feature_names : list of str
            ``["time_days"]``.
        target_names : list of str
            ``[target]``.
        DESCR : str
            Description and source citation (Zhang et al. 2017; UCI data set
            501; CC BY 4.0).

        Rows are sorted by station name, then by time.

    Raises
    ------
    FileNotFoundError
        If ``data_dir`` does not exist or holds no matching file.
    ValueError
        If ``target`` is not a numeric column of the files, ``hours`` are
        outside 0..23, a requested station is absent, ``start >= end``, or
        no row is left after filtering.

    Notes
    -----
    The time stamps carry no daylight saving (China uses none), so
    ``time_days`` is exact: hourly rows are spaced by ``1/24``.
    """
    import pandas as pd

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory {str(data_dir)!r} does not exist")
    files = _find_station_files(data_dir)
    if not files:
        raise FileNotFoundError(
            f"no Beijing air-quality files (PRSA_Data_<Station>_<YYYYMMDD>-"
            f"<YYYYMMDD>.csv or .csv.gz) found in {str(data_dir)!r}; use "
            "fetch_beijing_air_quality() to download them"
        )
    hour_set = _validate_hours(hours)
    if not isinstance(target, str):
        raise ValueError(f"target must be a column name (str), got {target!r}")
    if stations is not None:
        if isinstance(stations, str):
            stations = [stations]
        stations = list(dict.fromkeys(stations))
        missing = [s for s in stations if s not in files]
        if missing:
            raise ValueError(
                f"unknown station(s) {missing}; available: {sorted(files)}"
            )
        files = {s: files[s] for s in stations}
    t_start = None if start is None else pd.Timestamp(start)
    t_end = None if end is None else pd.Timestamp(end)
    if t_start is not None and t_end is not None and t_start >= t_end:
        raise ValueError(f"start ({t_start}) must be before end ({t_end})")

    frames = []
    for station, path in sorted(files.items()):
        header = list(pd.read_csv(path, nrows=0).columns)
        missing_cols = [c for c in (*_TIME_COLUMNS, "station") if c not in header]
        if missing_cols:
            raise ValueError(f"file {path.name} lacks the column(s) {missing_cols}")
        numeric = [c for c in header if c not in _NON_TARGET_COLUMNS and c not in _TIME_COLUMNS]
        if target not in numeric:
            raise ValueError(
                f"unknown target column {target!r}; choose one of {numeric}"
            )
        df = pd.read_csv(path, usecols=[*_TIME_COLUMNS, "station", target])
        if hour_set is not None:
            df = df[df["hour"].isin(hour_set)]
        stamp = pd.to_datetime(
            pd.DataFrame({c: df[c] for c in _TIME_COLUMNS}), errors="raise"
        )
        keep = np.ones(len(df), dtype=bool)
        if t_start is not None:
            keep &= (stamp >= t_start).to_numpy()
        if t_end is not None:
            keep &= (stamp < t_end).to_numpy()
        values = pd.to_numeric(df[target], errors="coerce")
        keep &= values.notna().to_numpy()
        frames.append(
            pd.DataFrame(
                {
                    "timestamp": stamp[keep].to_numpy(),
                    "station": df["station"].astype(str).to_numpy()[keep],
                    target: values[keep].to_numpy(dtype=np.float64),
                }
            )
        )
    frame = pd.concat(frames, ignore_index=True)
    if len(frame) == 0:
        raise ValueError(
            "no rows left after filtering by hours/start/end and dropping "
            f"missing {target!r} values"
        )
    frame = frame.sort_values(["station", "timestamp"], kind="stable", ignore_index=True)
    # origin: midnight of the earliest day kept, so the fractional part of
    # time_days is the hour of day / 24 (02:00 -> +2/24)
    t0 = frame["timestamp"].min().normalize()
    time_days = (frame["timestamp"] - t0) / pd.Timedelta(days=1)
    frame.insert(0, "time_days", time_days.to_numpy(dtype=np.float64))
    frame = frame[["time_days", "timestamp", "station", target]]

    return Bunch(
        data=frame[["time_days"]].to_numpy(dtype=np.float64),
        target=frame[target].to_numpy(dtype=np.float64),
        groups=frame["station"].to_numpy(dtype=object),
        frame=frame,
        feature_names=["time_days"],
        target_names=[target],
        DESCR=_BEIJING_DESCR,
    )


# ---------------------------------------------------------------------------
# Beijing air quality: download + cache
# ---------------------------------------------------------------------------
def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(url, dest):
    """Download ``url`` to ``dest`` through a temporary file + atomic rename."""
    fd, tmp_name = tempfile.mkstemp(prefix=".download-", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(
            url, timeout=_DOWNLOAD_TIMEOUT
        ) as response:
            shutil.copyfileobj(response, out, length=1 << 20)
        os.replace(tmp_name, dest)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise


def _extract_station_csvs(zf, out_dir, depth=0):
    """Write every ``PRSA_Data_*.csv(.gz)`` member of ``zf`` (searching nested
    zip archives) flat into ``out_dir``; return the number written."""
    count = 0
    for info in zf.infolist():
        if info.is_dir():
            continue
        parts = info.filename.replace("\\", "/").split("/")
        if "__MACOSX" in parts:
            continue
        base = parts[-1]
        if _STATION_FILE_RE.match(base):
            # only the base name is used: no path from the archive reaches disk
            with zf.open(info) as src, open(out_dir / base, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            count += 1
        elif base.lower().endswith(".zip") and depth < _MAX_ZIP_DEPTH:
            inner_bytes = io.BytesIO(zf.read(info))
            if zipfile.is_zipfile(inner_bytes):
                with zipfile.ZipFile(inner_bytes) as inner:
                    count += _extract_station_csvs(inner, out_dir, depth + 1)
    return count


def _archive_name(url):
    name = Path(urllib.parse.urlparse(url).path).name
    return name if name.lower().endswith(".zip") else "beijing_air_quality.zip"


def fetch_beijing_air_quality(
    data_home=None,
    *,
    url=DEFAULT_URL,
    download_if_missing=True,
    checksum=None,
    **loader_kwargs,
):
    """Download (once) and load the Beijing Multi-Site Air-Quality data.

    On the first call the UCI archive of data set 501 is downloaded with
    :mod:`urllib.request` (so ``file://`` URLs work too) to a temporary file
    that is renamed once complete, checked to be a zip archive (and against
    ``checksum`` if given), and every ``PRSA_Data_<Station>_*.csv`` it holds
    -- directly, in a folder such as ``PRSA_Data_20130301-20170228/``, or
    inside a nested zip such as UCI's ``PRSA2017_Data_20130301-20170228.zip``
    -- is extracted flat into a ``csv/`` folder of the cache. Later calls
    find that folder and neither download nor verify again.

    Cache layout (following scikit-learn's ``fetch_*`` convention,
    ``data_home`` is the root of all data sets)::

        <get_data_home(data_home)>/skfedgp/beijing_air_quality/
            <archive>.zip    the downloaded archive (kept)
            csv/             the extracted station files

    The default root is :func:`sklearn.datasets.get_data_home` (the
    ``SCIKIT_LEARN_DATA`` environment variable or ``~/scikit_learn_data``).
    Delete the ``beijing_air_quality`` folder to force a fresh download.

    Parameters
    ----------
    data_home : str or path-like, optional
        Root folder of the data cache (see above).
    url : str, default=DEFAULT_URL
        Location of the zip archive
        (``https://archive.ics.uci.edu/static/public/501/...``). Any URL
        scheme :func:`urllib.request.urlopen` supports.
    download_if_missing : bool, default=True
        If False and the data are not cached, raise :class:`OSError`
        instead of downloading.
    checksum : str, optional
        Expected SHA-256 hex digest of the archive. Checked before
        extraction; on a mismatch the archive is deleted and
        :class:`OSError` is raised. Not re-checked once the CSV files are
        cached.
    **loader_kwargs
        Passed to :func:`load_beijing_air_quality` (``hours``, ``target``,
        ``start``, ``end``, ``stations``).

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        As returned by :func:`load_beijing_air_quality`.

    Raises
    ------
    OSError
        If the data are missing and ``download_if_missing`` is False, the
        download fails (:class:`urllib.error.URLError` is an ``OSError``),
        the file is not a zip archive, holds no station CSV files, or fails
        the checksum. A bad archive is deleted.
    """
    from sklearn.datasets import get_data_home

    root = Path(get_data_home(data_home)) / "skfedgp" / "beijing_air_quality"
    csv_dir = root / "csv"
    if csv_dir.is_dir() and _find_station_files(csv_dir):
        return load_beijing_air_quality(csv_dir, **loader_kwargs)

    root.mkdir(parents=True, exist_ok=True)
    archive = root / _archive_name(url)
    if not archive.is_file():
        if not download_if_missing:
            raise OSError(
                f"Beijing air-quality data not found in {str(root)!r} and "
                "download_if_missing is False"
            )
        _download(url, archive)

    if checksum is not None:
        actual = _sha256(archive)
        if actual.lower() != str(checksum).strip().lower():
            archive.unlink()
            raise OSError(
                f"SHA-256 checksum mismatch for {archive.name} from {url}: "
                f"expected {checksum}, got {actual}; the file was deleted"
            )
    if not zipfile.is_zipfile(archive):
        archive.unlink()
        raise OSError(f"{url} did not deliver a valid zip archive; the file was deleted")

    tmp_dir = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        with zipfile.ZipFile(archive) as zf:
            n_files = _extract_station_csvs(zf, tmp_dir)
        if n_files == 0:
            archive.unlink()
            raise OSError(
                f"the archive from {url} holds no PRSA_Data_<Station>_*.csv "
                "files; it was deleted"
            )
        try:
            os.replace(tmp_dir, csv_dir)
        except OSError:
            if not (csv_dir.is_dir() and _find_station_files(csv_dir)):
                raise
            # another process finished the same extraction first
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return load_beijing_air_quality(csv_dir, **loader_kwargs)


# ---------------------------------------------------------------------------
# synthetic hierarchical data
# ---------------------------------------------------------------------------
_JITTER = 1e-6  # relative to the kernel variance, as in SPEC section 1
_MAX_JITTER_TRIES = 6  # 1e-6 ... 1e-1


def _se_kernel(X, lengthscale, variance):
    Xs = X / lengthscale
    sq = np.sum(Xs**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * Xs @ Xs.T, 0.0)
    return variance * np.exp(-0.5 * d2)


def _sample_gp(X, lengthscale, variance, rng, name):
    """One draw of GP(0, SE) at the rows of ``X`` (duplicates share a value)."""
    n = X.shape[0]
    z = rng.standard_normal(n)  # always consumed: keeps the stream aligned
    if n == 0 or variance == 0.0:
        return np.zeros(n)
    Xu, inverse = np.unique(X, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    K = _se_kernel(Xu, lengthscale, variance)
    jitter = _JITTER * variance
    for _ in range(_MAX_JITTER_TRIES):
        try:
            L = np.linalg.cholesky(K + jitter * np.eye(len(Xu)))
            break
        except np.linalg.LinAlgError:
            jitter *= 10.0
    else:
        raise np.linalg.LinAlgError(
            f"Cholesky of the {name} kernel matrix failed even with jitter "
            f"{jitter / 10.0:g}"
        )
    # the first len(Xu) normals drive the draw at the unique inputs
    return (L @ z[: len(Xu)])[inverse]


def _check_positive(name, value, *, allow_zero=False, size=None):
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and size is None):
        raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
    if arr.ndim == 1 and arr.shape[0] != size:
        raise ValueError(
            f"{name} must be a scalar or have length n_features={size}, got "
            f"length {arr.shape[0]}"
        )
    ok = np.isfinite(arr) & ((arr >= 0) if allow_zero else (arr > 0))
    if not np.all(ok):
        rel = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {rel}, got {value!r}")
    return arr if arr.ndim else float(arr)


def make_hierarchical_regression(
    n_clients=6,
    n_samples=50,
    *,
    n_features=1,
    x_range=(0.0, 10.0),
    global_lengthscale=1.8,
    global_variance=1.0,
    phi=1.2,
    local_lengthscale=0.25,
    local_variance=1.0,
    noise=0.05,
    n_test=0,
    random_state=None,
    return_components=False,
):
    """Simulate federated regression data with the pFedHGP hierarchy.

    For clients ``i = 0..T-1`` (``T = n_clients``), scalar output
    (pFedHGP section 4.1 / SPEC section 1)::

        y_i(x) = f_g(x) + f_delta_i(x) + f_i(x) + eps,   eps ~ N(0, noise^2)
        f_g       ~ GP(0, k_g)         one function shared by all clients
        f_delta_i ~ GP(0, phi * k_g)   one per client, same kernel shape
        f_i       ~ GP(0, k_l)         one per client, short lengthscale

    with squared-exponential kernels
    ``k(x, x') = var * exp(-0.5 * sum_d (x_d - x'_d)^2 / ell_d^2)``:
    ``k_g`` has ``(global_lengthscale, global_variance)``, ``k_l`` has
    ``(local_lengthscale, local_variance)``. Training inputs are uniform on
    ``x_range`` in every dimension, independently per client. The GP samples
    are drawn exactly at the inputs (a jittered Cholesky of the kernel
    matrix, relative jitter 1e-6 raised tenfold on failure); ``f_g`` is
    drawn once, jointly at the inputs of all clients, and identical inputs
    get identical values.

    **Test data from the same functions.** With ``n_test > 0`` every client
    also gets ``n_test`` test inputs -- an evenly spaced grid
    ``linspace(low, high, n_test)`` over ``x_range`` when ``n_features == 1``
    (the same grid for every client, as in the paper's benchmark), uniform
    draws when ``n_features > 1`` -- and ``f_g``, ``f_delta_i`` and ``f_i``
    are drawn jointly at the training and test inputs, so the test targets
    come from the very same function draws (with fresh noise). Note that
    for a fixed ``random_state`` the training set with ``n_test > 0``
    differs from the one with ``n_test = 0`` (the joint draw uses the random
    stream differently).

    Parameters
    ----------
    n_clients : int, default=6
        Number of clients ``T >= 1``.
    n_samples : int or sequence of int, default=50
        Training points per client: one number for all clients or one
        non-negative number per client (at least one point in total).
    n_features : int, default=1
        Input dimension ``d >= 1``.
    x_range : (float, float), default=(0.0, 10.0)
        ``(low, high)`` with ``low < high``, applied to every dimension.
    global_lengthscale : float or array of shape (n_features,), default=1.8
        Lengthscale(s) of ``k_g`` (> 0); an array gives ARD lengthscales.
    global_variance : float, default=1.0
        Variance of ``k_g`` (>= 0; 0 switches ``f_g`` and ``f_delta_i`` off).
    phi : float, default=1.2
        Deviation scale (>= 0): ``f_delta_i`` has variance
        ``phi * global_variance``.
    local_lengthscale : float or array of shape (n_features,), default=0.25
        Lengthscale(s) of ``k_l`` (> 0).
    local_variance : float, default=1.0
        Variance of ``k_l`` (>= 0; 0 switches ``f_i`` off).
    noise : float, default=0.05
        Standard deviation (not variance) of the Gaussian observation noise
        (>= 0).
    n_test : int, default=0
        Test points per client drawn from the same functions (see above);
        0 returns only the training triple.
    random_state : int, RandomState instance or None, default=None
        Seed, passed to :func:`sklearn.utils.check_random_state`.
    return_components : bool, default=False
        If True, also return the noise-free component values.

    Returns
    -------
    X : ndarray of shape (n, n_features)
        Training inputs, ``n = sum(n_samples)``, ordered by client.
    y : ndarray of shape (n,)
        Noisy training targets.
    groups : ndarray of shape (n,), int
        Client id ``0..T-1`` of every training row.
    X_test, y_test, groups_test : ndarrays
        Only when ``n_test > 0``: the test triple, shapes
        ``(T * n_test, n_features)``, ``(T * n_test,)``, ``(T * n_test,)``.
    components : dict
        Only when ``return_components=True``: ``{"global": f_g(X),
        "deviation": f_delta(X), "local": f(X)}``, each of shape ``(n,)``;
        ``y - sum(components.values())`` is the noise.
    components_test : dict
        Only when ``return_components=True`` and ``n_test > 0``: the same for
        the test inputs.

    The return value is therefore one of::

        X, y, groups
        X, y, groups, components
        X, y, groups, X_test, y_test, groups_test
        X, y, groups, X_test, y_test, groups_test, components, components_test

    Raises
    ------
    ValueError
        On invalid arguments (``n_clients < 1``, negative or mismatched
        ``n_samples``, non-positive lengthscales, negative variances, ``phi``
        or ``noise``, ``n_test < 0``, ``low >= high``, ...).
    numpy.linalg.LinAlgError
        If a kernel matrix cannot be factorised even with jitter 0.1 * var.

    Examples
    --------
    >>> from skfedgp.datasets import make_hierarchical_regression
    >>> X, y, g, Xt, yt, gt = make_hierarchical_regression(
    ...     n_clients=6, n_samples=50, n_test=150, random_state=0)
    >>> X.shape, Xt.shape
    ((300, 1), (900, 1))
    """
    # ---- validation ------------------------------------------------------
    if not isinstance(n_clients, Integral) or isinstance(n_clients, bool) or n_clients < 1:
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    n_clients = int(n_clients)
    if not isinstance(n_features, Integral) or isinstance(n_features, bool) or n_features < 1:
        raise ValueError(f"n_features must be an integer >= 1, got {n_features!r}")
    n_features = int(n_features)
    if isinstance(n_samples, Integral) and not isinstance(n_samples, bool):
        counts = [int(n_samples)] * n_clients
    else:
        try:
            counts = list(n_samples)
        except TypeError as exc:
            raise ValueError(
                f"n_samples must be an int or a sequence of ints, got {n_samples!r}"
            ) from exc
        if len(counts) != n_clients:
            raise ValueError(
                f"n_samples has {len(counts)} entries but n_clients={n_clients}"
            )
        if not all(isinstance(c, Integral) and not isinstance(c, bool) for c in counts):
            raise ValueError(f"n_samples entries must be integers, got {n_samples!r}")
        counts = [int(c) for c in counts]
    if any(c < 0 for c in counts) or sum(counts) == 0:
        raise ValueError(
            f"n_samples must be >= 0 per client with at least one point in "
            f"total, got {n_samples!r}"
        )
    if not isinstance(n_test, Integral) or isinstance(n_test, bool) or n_test < 0:
        raise ValueError(f"n_test must be an integer >= 0, got {n_test!r}")
    n_test = int(n_test)
    try:
        low, high = (float(v) for v in x_range)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"x_range must be a pair (low, high), got {x_range!r}") from exc
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ValueError(f"x_range must be finite with low < high, got {x_range!r}")
    ell_g = _check_positive("global_lengthscale", global_lengthscale, size=n_features)
    ell_l = _check_positive("local_lengthscale", local_lengthscale, size=n_features)
    var_g = _check_positive("global_variance", global_variance, allow_zero=True)
    var_l = _check_positive("local_variance", local_variance, allow_zero=True)
    phi = _check_positive("phi", phi, allow_zero=True)
    noise = _check_positive("noise", noise, allow_zero=True)
    if not isinstance(return_components, (bool, np.bool_)):
        raise ValueError(f"return_components must be a bool, got {return_components!r}")
    rng = check_random_state(random_state)

    # ---- inputs ----------------------------------------------------------
    X_train = [rng.uniform(low, high, size=(c, n_features)) for c in counts]
    if n_test == 0:
        X_test = [np.empty((0, n_features)) for _ in range(n_clients)]
    elif n_features == 1:
        grid = np.linspace(low, high, n_test)[:, None]
        X_test = [grid.copy() for _ in range(n_clients)]
    else:
        X_test = [rng.uniform(low, high, size=(n_test, n_features)) for _ in range(n_clients)]
    # per client: training rows first, then test rows
    X_client = [np.vstack([a, b]) for a, b in zip(X_train, X_test)]
    sizes = np.array([len(x) for x in X_client])
    offsets = np.concatenate([[0], np.cumsum(sizes)])

    # ---- latent functions ------------------------------------------------
    X_all = np.vstack(X_client)
    f_global = _sample_gp(X_all, ell_g, var_g, rng, "global")
    f_dev = np.empty(len(X_all))
    f_loc = np.empty(len(X_all))
    for i, Xi in enumerate(X_client):
        f_dev[offsets[i] : offsets[i + 1]] = _sample_gp(
            Xi, ell_g, phi * var_g, rng, f"deviation (client {i})"
        )
    for i, Xi in enumerate(X_client):
        f_loc[offsets[i] : offsets[i + 1]] = _sample_gp(
            Xi, ell_l, var_l, rng, f"local (client {i})"
        )
    f_clean = f_global + f_dev + f_loc
    y_all = f_clean + noise * rng.standard_normal(len(X_all))

    # ---- split back into training / test --------------------------------
    is_train = np.concatenate(
        [np.r_[np.ones(c, bool), np.zeros(n_test, bool)] for c in counts]
    )
    client = np.repeat(np.arange(n_clients), sizes)

    def _part(mask):
        comps = {
            "global": f_global[mask],
            "deviation": f_dev[mask],
            "local": f_loc[mask],
        }
        return X_all[mask], y_all[mask], client[mask].astype(np.int64), comps

    X, y, groups, comps = _part(is_train)
    out = [X, y, groups]
    if n_test > 0:
        Xt, yt, gt, comps_t = _part(~is_train)
        out += [Xt, yt, gt]
    if return_components:
        out.append(comps)
        if n_test > 0:
            out.append(comps_t)
    return tuple(out)


# ---------------------------------------------------------------------------
# UCR / UEA time-series classification archive: ``.ts`` reader
# ---------------------------------------------------------------------------
def _ts_header_value(line):
    parts = line.split(None, 1)
    return parts[0].lower(), (parts[1].strip() if len(parts) > 1 else "")


def _ts_bool(key, value, path):
    v = value.lower()
    if v not in ("true", "false"):
        raise ValueError(f"{path}: header {key} must be true or false, got {value!r}")
    return v == "true"


def _ts_check_header(header, path):
    if "classlabel" not in header or not header["classlabel"].lower().startswith("true"):
        raise ValueError(f"{path}: the file has no class labels (@classLabel true ...)")
    if "timestamps" in header and _ts_bool("@timeStamps", header["timestamps"], path):
        raise ValueError(f"{path}: series with time stamps (@timeStamps true) are not supported")


def _ts_parse_value(token, path, lineno):
    token = token.strip()
    if token in ("?", "NaN", "nan", ""):
        return np.nan
    try:
        return float(token)
    except ValueError:
        raise ValueError(
            f"{path}, line {lineno}: cannot read {token!r} as a number"
        ) from None


def load_ucr_ts(path):
    """Read a time-series classification file in the UCR/UEA ``.ts`` format.

    The format (UCR Time Series Classification Archive, Dau et al. 2019; UEA
    multivariate archive, Bagnall et al. 2018) has comment lines starting
    with ``#``, header lines starting with ``@`` (``@problemName``,
    ``@univariate``, ``@dimensions``, ``@equalLength``, ``@seriesLength``,
    ``@classLabel true <labels...>``, ``@timeStamps``, ``@missing``), then
    ``@data`` and one series per line: comma-separated values, channels
    separated by ``:``, the class label last (after the final ``:``).

    Parameters
    ----------
    path : str or path-like
        A ``.ts`` file, e.g. ``GunPoint_TRAIN.ts``.

    Returns
    -------
    X : ndarray of shape (n_series, n_channels * n_points), float64
        One series per row, channels side by side: columns
        ``k * n_points : (k + 1) * n_points`` hold channel ``k`` (the layout
        :class:`skfedgp.MaxEvidenceClassifier` expects). Missing values
        (``?`` or ``NaN`` in the file) are NaN.
    y : ndarray of shape (n_series,), object
        Class label of every series, as the string written in the file.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file has no ``@data`` section, no class labels
        (``@classLabel false``), time stamps (``@timeStamps true``, not
        supported), series of unequal length or channel count, a label not
        listed in ``@classLabel``, or a value that is not a number.

    References
    ----------
    Dau, H. A. et al. (2019), "The UCR time series archive", IEEE/CAA Journal
    of Automatica Sinica 6(6). Bagnall, A. et al. (2018), "The UEA
    multivariate time series classification archive, 2018", arXiv:1811.00075.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"time-series file {str(path)!r} does not exist")
    header = {}
    rows, labels = [], []
    in_data = False
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                if not line.startswith("@"):
                    raise ValueError(
                        f"{path}, line {lineno}: expected a header line (@...) "
                        "before @data"
                    )
                key, value = _ts_header_value(line[1:])
                if key == "data":
                    _ts_check_header(header, path)
                    in_data = True
                else:
                    header[key] = value
                continue
            *channels, label = line.split(":")
            if not channels:
                raise ValueError(
                    f"{path}, line {lineno}: no class label (expected "
                    "values:...:label)"
                )
            series = [
                [_ts_parse_value(t, path, lineno) for t in ch.split(",")]
                for ch in channels
            ]
            rows.append(series)
            labels.append(label.strip())
    if not in_data:
        raise ValueError(f"{path}: no @data section")
    if not rows:
        raise ValueError(f"{path}: the @data section holds no series")
    n_channels = len(rows[0])
    n_points = len(rows[0][0])
    for i, series in enumerate(rows):
        if len(series) != n_channels:
            raise ValueError(
                f"{path}: series {i} has {len(series)} channel(s), the first has {n_channels}"
            )
        lengths = {len(ch) for ch in series}
        if lengths != {n_points}:
            raise ValueError(
                f"{path}: series {i} has channel length(s) {sorted(lengths)}, the "
                f"first series has {n_points}; unequal-length series are not supported"
            )
    if "dimensions" in header and int(header["dimensions"]) != n_channels:
        raise ValueError(
            f"{path}: @dimensions says {header['dimensions']} but the series have "
            f"{n_channels} channel(s)"
        )
    allowed = header["classlabel"].split()[1:]
    if allowed:
        unknown = sorted(set(labels) - set(allowed))
        if unknown:
            raise ValueError(
                f"{path}: class label(s) {unknown} not listed in @classLabel {allowed}"
            )
    X = np.asarray(rows, dtype=np.float64).reshape(len(rows), n_channels * n_points)
    return X, np.asarray(labels, dtype=object)


# ---------------------------------------------------------------------------
# synthetic press-tonnage waveforms (stand-in for Lei, Zhang and Jin 2010)
# ---------------------------------------------------------------------------
#: Centres (fraction of the stroke) of the regions each fault class changes.
_FAULT_CENTRES = (0.30, 0.42, 0.55, 0.68)


def _smooth_noise(rng, n_curves, t, lengthscale, size):
    """Smooth random curves: random Fourier features of an SE kernel."""
    n_feat = 40
    omega = rng.standard_normal(n_feat) / lengthscale
    phase = rng.uniform(0.0, 2.0 * np.pi, n_feat)
    w = rng.standard_normal((n_curves, n_feat))
    basis = np.sqrt(2.0 / n_feat) * np.cos(np.outer(t, omega) + phase)  # (n_points, n_feat)
    return size * (w @ basis.T)


def make_stamping_waveforms(
    n_normal=305,
    n_per_fault=69,
    *,
    n_points=1201,
    n_channels=4,
    fault_size=0.3,
    variation=0.01,
    noise=0.01,
    random_state=None,
):
    """Synthetic multi-channel press-tonnage cycles with four fault classes.

    A stand-in for the press-tonnage data of Lei, Zhang and Jin (2010) used in
    the pFedHGP classification study (section 5.1), which are not public.
    Every cycle is ``n_channels`` force curves over the press stroke
    ``t = linspace(0, 1, n_points)``: a shared press waveform (a forming peak
    plus a smaller pre-forming shoulder, with a slightly different gain and
    phase per channel, as four strain gauges on the uprights see the same
    stroke), times a random cycle gain, shifted by a small random phase,
    plus smooth cycle-to-cycle variation and white measurement noise.

    Fault class ``k = 1..4`` ("missing part at station k") removes load in
    its own region of the stroke: the curves are multiplied by
    ``1 - fault_size * exp(-0.5 ((t - c_k) / 0.03)^2)`` with centres
    ``c_k`` in ``(0.30, 0.42, 0.55, 0.68)``, with a channel-dependent depth
    (stations sit closer to some gauges), so each fault changes the curves in
    a different local region.

    Parameters
    ----------
    n_normal : int, default=305
        Number of normal cycles (class 0).
    n_per_fault : int, default=69
        Number of cycles of each fault class 1..4.
    n_points : int, default=1201
        Points per channel (>= 10).
    n_channels : int, default=4
        Number of sensor channels (>= 1).
    fault_size : float, default=0.3
        Largest relative load drop of a fault (0 <= fault_size < 1).
    variation : float, default=0.01
        Size of the cycle-to-cycle variation, relative to the peak load:
        standard deviation of the cycle gain and of the smooth variation;
        the phase jitter has standard deviation ``0.1 * variation`` (as a
        fraction of the stroke). With the defaults, a Gaussian with the
        class's mean curve and one white-noise variance per class, fitted on
        the paper's 13.77 % split, classifies the other cycles perfectly (5
        seeds); with ``variation=0.03`` it does not (about 0.86).
    noise : float, default=0.01
        Standard deviation of the white measurement noise, relative to the
        peak load (peak = 1).
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    X : ndarray of shape (n_normal + 4 * n_per_fault, n_channels * n_points)
        One cycle per row, channels side by side (columns
        ``k * n_points : (k + 1) * n_points`` hold channel ``k``); load
        relative to the peak of the mean normal waveform.
    y : ndarray of shape (n_normal + 4 * n_per_fault,), int64
        0 for normal cycles, ``k`` for fault class ``k``; rows are ordered by
        class (all normal cycles first), each class in generation order.

    Raises
    ------
    ValueError
        For counts below 1, ``n_points < 10``, negative ``variation`` or
        ``noise``, or ``fault_size`` outside ``[0, 1)``.

    References
    ----------
    Lei, Y., Zhang, Z. and Jin, J. (2010), "Automatic tonnage monitoring for
    missing part detection in multi-operation forging processes", Journal of
    Manufacturing Science and Engineering 132(5). pFedHGP paper, section 5.1
    (4 channels x 1201 points; 305 normal and 69 cycles per fault class).
    """
    for name, value, minimum in (
        ("n_normal", n_normal, 1),
        ("n_per_fault", n_per_fault, 1),
        ("n_points", n_points, 10),
        ("n_channels", n_channels, 1),
    ):
        if not isinstance(value, Integral) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    variation = _check_positive("variation", variation, allow_zero=True)
    noise = _check_positive("noise", noise, allow_zero=True)
    fault_size = _check_positive("fault_size", fault_size, allow_zero=True)
    if fault_size >= 1.0:
        raise ValueError(f"fault_size must be in [0, 1), got {fault_size!r}")
    rng = check_random_state(random_state)
    t = np.linspace(0.0, 1.0, n_points)
    counts = [n_normal] + [n_per_fault] * len(_FAULT_CENTRES)
    y = np.repeat(np.arange(len(counts)), counts).astype(np.int64)
    n = y.size

    ch = np.arange(n_channels)
    ch_gain = 1.0 + 0.15 * np.cos(2.0 * np.pi * ch / max(n_channels, 1))
    ch_phase = 0.01 * (ch - (n_channels - 1) / 2.0)
    # channel-dependent depth of each fault (rows: faults, columns: channels)
    depth = 0.6 + 0.4 * np.abs(
        np.cos(np.pi * (np.arange(len(_FAULT_CENTRES))[:, None] + 1) * (ch[None, :] + 1) / 5.0)
    )

    gain = 1.0 + variation * rng.standard_normal(n)
    shift = 0.1 * variation * rng.standard_normal(n)  # phase jitter, fraction of the stroke
    X = np.empty((n, n_channels, n_points))
    for k in range(n_channels):
        tt = t[None, :] - ch_phase[k] - shift[:, None]
        base = np.exp(-0.5 * ((tt - 0.5) / 0.12) ** 2) + 0.35 * np.exp(
            -0.5 * ((tt - 0.3) / 0.05) ** 2
        )
        base = base * np.where((tt > 0.05) & (tt < 0.95), 1.0, np.exp(-((np.minimum(
            np.abs(tt - 0.05), np.abs(tt - 0.95)) / 0.02) ** 2)))
        drop = np.ones((n, n_points))
        for f, c in enumerate(_FAULT_CENTRES):
            rows = y == f + 1
            drop[rows] -= fault_size * depth[f, k] * np.exp(-0.5 * ((tt[rows] - c) / 0.03) ** 2)
        X[:, k, :] = ch_gain[k] * gain[:, None] * base * drop
        X[:, k, :] += _smooth_noise(rng, n, t, 0.15, variation)
        X[:, k, :] += noise * rng.standard_normal((n, n_points))
    return X.reshape(n, n_channels * n_points), y
