"""Data sets for federated Gaussian-process experiments.

* :func:`load_beijing_air_quality` reads the Beijing Multi-Site Air-Quality
  files (one client per monitoring station) from a local folder.
* :func:`fetch_beijing_air_quality` downloads the UCI archive once, caches
  the extracted CSV files and then calls the loader.
* :func:`make_hierarchical_regression` simulates data with the pFedHGP
  global + deviation + local structure, single-output or the paper's
  multi-output benchmark (scenarios A--D); :func:`hierarchical_covariance`
  and :func:`hierarchical_oracle_predict` give its true covariance and the
  exact-GP oracle.
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

from ._validation import check_count, user_stacklevel

__all__ = [
    "DEFAULT_URL",
    "load_beijing_air_quality",
    "fetch_beijing_air_quality",
    "make_hierarchical_regression",
    "hierarchical_covariance",
    "hierarchical_oracle_predict",
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
                stacklevel=user_stacklevel(),
            )
    return chosen


def _validate_hours(hours):
    if hours is None:
        return None
    if isinstance(hours, (bool, np.bool_, str, bytes)):  # "14" would be read digit by digit
        raise ValueError(f"hours must be None or integers in 0..23, got {hours!r}")
    if isinstance(hours, Integral):
        hours = (hours,)
    try:
        if any(isinstance(h, (bool, np.bool_, str, bytes)) for h in hours):
            raise TypeError
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


def _as_timestamp(value, name):
    """``pd.Timestamp(value)``, or a ValueError naming the argument ``name``."""
    import pandas as pd

    try:
        stamp = pd.Timestamp(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(
            f"{name} must be a date or timestamp pandas can parse (e.g. "
            f"'2013-03-01'), got {value!r}: {exc}") from None
    if pd.isna(stamp):
        raise ValueError(f"{name} must be a date or timestamp, got {value!r} (NaT)")
    return stamp


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

    The default ``hours`` reproduce the sampling of the pFedHGP air-quality
    study (H. Yan, "Personalized Federated Hierarchical Gaussian Processes
    for Privacy-Preserving Modeling of Heterogeneous Distributed Systems",
    arXiv:2609.19337, 2026, section 5.2): PM2.5 at 02:00 and 14:00 each day,
    730 rows per station and year before missing values are dropped. The
    dates are *not* restricted by default (``start=None, end=None``): every
    timestamp in the files is kept, 2013-03-01 to 2017-02-28 with the
    original UCI files and 2013-03-01 to 2014-02-28 with the one-year
    subsets. Pass ``start="2013-03-01", end="2014-03-01"`` to keep the first
    year of either.

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
        If ``data_dir`` does not exist, is a file, or holds no matching file.
    ValueError
        If ``target`` is not a string or not a numeric column of the files,
        ``hours`` are not whole numbers in 0..23 (or an empty collection),
        ``stations`` is empty or names an absent station, ``start`` or
        ``end`` is not a parseable date, ``start >= end``, a file lacks the
        time or station columns or holds an invalid date, or no row is left
        after filtering.
    TypeError
        If ``data_dir`` is not a path (e.g. None) or ``stations`` is not a
        string or an iterable.

    Notes
    -----
    The time stamps carry no daylight saving (China uses none), so
    ``time_days`` is exact: hourly rows are spaced by ``1/24``.
    """
    import pandas as pd

    # arguments first, then the file system
    hour_set = _validate_hours(hours)
    if not isinstance(target, str):
        raise ValueError(f"target must be a column name (str), got {target!r}")
    t_start = None if start is None else _as_timestamp(start, "start")
    t_end = None if end is None else _as_timestamp(end, "end")
    if t_start is not None and t_end is not None and t_start >= t_end:
        raise ValueError(f"start ({t_start}) must be before end ({t_end})")
    data_dir = Path(data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise FileNotFoundError(
            f"data_dir {str(data_dir)!r} is a file; pass the folder that holds the station "
            "CSV files")
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory {str(data_dir)!r} does not exist")
    files = _find_station_files(data_dir)
    if not files:
        raise FileNotFoundError(
            f"no Beijing air-quality files (PRSA_Data_<Station>_<YYYYMMDD>-"
            f"<YYYYMMDD>.csv or .csv.gz) found in {str(data_dir)!r}; use "
            "fetch_beijing_air_quality() to download them"
        )
    if stations is not None:
        if isinstance(stations, str):
            stations = [stations]
        stations = list(dict.fromkeys(stations))
        if not stations:
            raise ValueError("stations is empty; use None to load every station")
        missing = [s for s in stations if s not in files]
        if missing:
            raise ValueError(
                f"unknown station(s) {missing}; available: {sorted(files)}"
            )
        files = {s: files[s] for s in stations}

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
    ValueError
        If ``url`` is not a URL :func:`urllib.request.urlopen` can open
        (e.g. no scheme), or as :func:`load_beijing_air_quality` for bad
        ``loader_kwargs``.
    TypeError
        If ``loader_kwargs`` holds a keyword that
        :func:`load_beijing_air_quality` does not take, or as that function
        (``loader_kwargs`` are checked only when the loader is called, after
        any download).
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
_JITTER = 1e-6  # relative to the kernel variance, as in docs/maths.md
_MAX_JITTER_TRIES = 6  # 1e-6 ... 1e-1


def _se_kernel(X, lengthscale, variance):
    Xs = X / lengthscale
    sq = np.sum(Xs**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * Xs @ Xs.T, 0.0)
    return variance * np.exp(-0.5 * d2)


def _sample_gp(X, lengthscale, variance, rng, name):
    """One draw of GP(0, SE) at the rows of ``X`` (duplicates share a value)."""
    return _draw_at_unique(X, variance, rng, name,
                           lambda Xu: _se_kernel(Xu, lengthscale, variance))


def _draw_at_unique(X, variance, rng, name, kernel):
    """One draw of GP(0, kernel) at the rows of ``X``; ``kernel(Xu)`` gives the
    covariance at the unique rows (duplicates share a value); jittered Cholesky."""
    n = X.shape[0]
    z = rng.standard_normal(n)  # always consumed: keeps the stream aligned
    if n == 0 or variance == 0.0:
        return np.zeros(n)
    Xu, inverse = np.unique(X, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    K = kernel(Xu)
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


# ---- multi-output (ILMM) generator: pFedHGP sections 4.1 and 4.3 ------------
_SCENARIOS = ("A", "B", "C", "D")
# paper section 4.1 (R = 2 latent draws per component)
_ILMM_GLOBAL_LENGTHSCALE = (1.8, 2.5)
_ILMM_GLOBAL_VARIANCE = (1.0**2, 0.7**2)  # output scales tau = (1.0, 0.7)
_ILMM_LOCAL_LENGTHSCALE = (0.25, 0.45)
_ILMM_LOCAL_VARIANCE = (1.0**2, 0.8**2)  # output scales tau = (1.0, 0.8)
# scenario B (eq. 40): weight, period and lengthscale of the periodic part
_PERIODIC_WEIGHT = 0.35
_PERIODIC_PERIOD = 3.0
_PERIODIC_LENGTHSCALE = 0.8
_GAMMA_RANGE = (0.35, 0.60)  # scenario C (eq. 41)
_RHO = 0.5  # scenario D (eq. 42)


def _latent_kernel(X1, X2, lengthscale, variance, periodic=None):
    """Kernel of one scalar latent GP between the rows of ``X1`` and ``X2``.

    Squared exponential ``variance * exp(-0.5 * sum_d (x_d - x'_d)^2 / l_d^2)``
    (``lengthscale`` a scalar or an ``(n_features,)`` array). With
    ``periodic = (w, p, l_p)`` the kernel is pFedHGP eq. 40:
    ``(1 - w) * SE + w * variance * exp(-2 sin^2(pi r / p) / l_p^2)`` with
    ``r = ||x - x'||`` (Euclidean).
    """
    A, B = X1 / lengthscale, X2 / lengthscale
    d2 = np.maximum(
        np.sum(A**2, 1)[:, None] + np.sum(B**2, 1)[None, :] - 2.0 * A @ B.T, 0.0
    )
    K = np.exp(-0.5 * d2)
    if periodic is not None:
        w, period, ell_p = periodic
        r2 = np.maximum(
            np.sum(X1**2, 1)[:, None] + np.sum(X2**2, 1)[None, :] - 2.0 * X1 @ X2.T, 0.0
        )
        per = np.exp(-2.0 * np.sin(np.pi * np.sqrt(r2) / period) ** 2 / ell_p**2)
        K = (1.0 - w) * K + w * per
    return variance * K


def _draw_latent(X, lengthscale, variance, periodic, rng, name):
    """One draw of a scalar latent GP at the rows of ``X`` (as ``_sample_gp``)."""
    return _draw_at_unique(X, variance, rng, name,
                           lambda Xu: _latent_kernel(Xu, Xu, lengthscale, variance, periodic))


def _per_latent(name, value, default, n_latent):
    """Resolve an ILMM hyperparameter to an array of shape (n_latent,)."""
    if value is None:
        if n_latent != len(default):
            raise ValueError(
                f"{name} has no default for n_latent={n_latent} (the paper's "
                f"values are for n_latent={len(default)}); pass {n_latent} values"
            )
        value = default
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n_latent, float(arr))
    if arr.ndim != 1 or arr.shape[0] != n_latent:
        raise ValueError(
            f"{name} must be a scalar or have length n_latent={n_latent} in the "
            f"multi-output generator, got {value!r}"
        )
    return arr


#: Keys of the ``truth`` Bunch that :func:`hierarchical_covariance` (and so
#: :func:`hierarchical_oracle_predict`) reads; "gamma" is read in scenario C
#: only, "rho" in scenario D only.
_TRUTH_KEYS = (
    "scenario", "n_outputs", "n_clients", "n_features", "noise", "loadings_global",
    "loadings_deviation", "loadings_local", "global_lengthscale", "global_variance",
    "deviation_variance", "local_lengthscale", "local_variance", "periodic",
)


def _check_truth(truth):
    """``truth`` if it is a dict holding every key read from it; else ValueError naming them."""
    if not isinstance(truth, dict):
        raise ValueError(
            "truth must be the Bunch returned by make_hierarchical_regression("
            f"..., return_truth=True), got a {type(truth).__name__}"
        )
    keys = list(_TRUTH_KEYS)
    scenario = truth.get("scenario")
    if scenario == "C":
        keys.append("gamma")
    elif scenario == "D":
        keys.append("rho")
    missing = [k for k in keys if k not in truth]
    if missing:
        raise ValueError(
            "truth must be the Bunch returned by make_hierarchical_regression("
            f"..., return_truth=True); it lacks the keys {missing}"
        )
    return truth


def _check_client_inputs(truth, X, groups, name):
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != truth["n_features"]:
        raise ValueError(
            f"{name} must have shape (n, {truth['n_features']}), got {X.shape}"
        )
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or inf")
    g = np.asarray(groups)
    if g.shape != (X.shape[0],):
        raise ValueError(
            f"groups for {name} must have shape ({X.shape[0]},), got {g.shape}"
        )
    if g.size and (
        not np.issubdtype(g.dtype, np.integer)
        or g.min() < 0
        or g.max() >= truth["n_clients"]
    ):
        raise ValueError(
            f"groups for {name} must be integer client ids in 0..{truth['n_clients'] - 1}"
        )
    return X, g.astype(np.int64)


def hierarchical_covariance(truth, X1, groups1, X2=None, groups2=None):
    r"""True covariance of the noise-free simulated signal between two input sets.

    For the data of :func:`make_hierarchical_regression` (called with
    ``return_truth=True``), returns
    ``C[a, q, b, p] = Cov(y_clean_q(client g1[a], X1[a]), y_clean_p(client
    g2[b], X2[b]))`` **given the drawn loadings** (they are simulator
    parameters of a run and are stored in ``truth``). With
    :math:`K_c^{(r)}` the kernel of latent ``r`` of component ``c`` and
    :math:`b_{c,r}` the ``r``-th column of its loading matrix:

    * global (all client pairs):
      :math:`\sum_r K_g^{(r)}(x, x')\, b_{g,r} b_{g,r}^\top`;
    * deviation and local (same client ``i`` only; independent between
      clients): :math:`\sum_r K_\delta^{(r)}\, b_{\delta_i,r} b_{\delta_i,r}^\top`
      and :math:`\sum_r K_l^{(r)}\, b_{l_i,r} b_{l_i,r}^\top`, where
      :math:`K_\delta^{(r)} = \phi K_g^{(r)}` (scenarios A, C, D) or the
      RBF + periodic kernel of eq. 40 (scenario B);
    * scenario C adds, for the same client, :math:`\gamma_i^2\, G \odot D`
      (elementwise over ``(q, p)``), the exact covariance of the product
      term ``gamma_i f_g * f_delta_i``: with ``f_g`` and ``f_delta_i``
      independent and zero-mean, ``E[f_gq f_dq f_gp' f_dp'] = G_qp D_qp``
      and the term is uncorrelated with every additive component;
    * scenario D scales the deviation part by :math:`(1 + \rho)^2` and the
      local part by :math:`1 - \rho^2`, since
      ``f_g + f_delta + rho f_delta + sqrt(1 - rho^2) f~``.

    The clean signal is Gaussian in scenarios A, B (the periodic part is a
    GP) and D, and in the single-output generator; in scenario C it is not
    Gaussian (a product of Gaussians) and this is its exact second moment
    only. The latent draws were made with a relative jitter of at least
    ``1e-6 * variance`` on the diagonal, which is not included here.

    Parameters
    ----------
    truth : Bunch
        The ``truth`` returned by ``make_hierarchical_regression(...,
        return_truth=True)``.
    X1 : array-like of shape (n1, n_features)
        Inputs.
    groups1 : array-like of shape (n1,), int
        Client id ``0..T-1`` of every row of ``X1``.
    X2 : array-like of shape (n2, n_features), optional
        Second input set; default ``X1``.
    groups2 : array-like of shape (n2,), int, optional
        Client ids of ``X2``; required when ``X2`` is given.

    Returns
    -------
    ndarray of shape (n1, Q, n2, Q)
        The covariance; ``C.reshape(n1 * Q, n2 * Q)`` is the covariance of
        ``y_clean.reshape(-1)`` (row-major, input-major) and does **not**
        include the observation noise. ``Q = truth.n_outputs`` (1 for the
        single-output generator).

    Raises
    ------
    ValueError
        If ``truth`` is not such a Bunch (not a dict, or lacking a key that
        is read: every key of the Bunch but ``n_latent``, ``phi`` and the
        clean targets, with ``gamma`` in scenario C and ``rho`` in scenario
        D; the message names the missing keys), inputs are not 2-D with
        ``truth.n_features`` columns or hold NaN/inf, a ``groups`` array
        does not have one entry per row, client ids are not integers in
        range, or ``groups2`` is given without ``X2`` or ``X2`` without
        ``groups2``.
    """
    truth = _check_truth(truth)
    X1, g1 = _check_client_inputs(truth, X1, groups1, "X1")
    if X2 is None:
        if groups2 is not None:
            raise ValueError("groups2 given without X2")
        X2, g2 = X1, g1
    else:
        if groups2 is None:
            raise ValueError("groups2 is required when X2 is given")
        X2, g2 = _check_client_inputs(truth, X2, groups2, "X2")
    Q = truth["n_outputs"]
    scenario = truth["scenario"]
    B_g = truth["loadings_global"]
    B_d = truth["loadings_deviation"]
    B_l = truth["loadings_local"]

    def _comp(Xa, Xb, lengthscales, variances, Ba, Bb, periodic=None):
        out = np.zeros((Xa.shape[0], Q, Xb.shape[0], Q))
        for r in range(len(variances)):
            k = _latent_kernel(Xa, Xb, lengthscales[r], variances[r], periodic)
            out += np.einsum("ab,q,p->aqbp", k, Ba[:, r], Bb[:, r])
        return out

    ell_g = truth["global_lengthscale"]
    var_g = truth["global_variance"]
    var_d = truth["deviation_variance"]
    ell_l = truth["local_lengthscale"]
    var_l = truth["local_variance"]
    periodic = truth["periodic"]
    c_dev, c_loc = 1.0, 1.0
    if scenario == "D":
        rho = truth["rho"]
        c_dev, c_loc = (1.0 + rho) ** 2, 1.0 - rho**2

    C = _comp(X1, X2, ell_g, var_g, B_g, B_g)
    for i in np.intersect1d(g1, g2):
        a, b = np.flatnonzero(g1 == i), np.flatnonzero(g2 == i)
        Xa, Xb = X1[a], X2[b]
        dev = _comp(Xa, Xb, ell_g, var_d, B_d[i], B_d[i], periodic)
        block = c_dev * dev + c_loc * _comp(Xa, Xb, ell_l, var_l, B_l[i], B_l[i])
        if scenario == "C":
            block += truth["gamma"][i] ** 2 * C[np.ix_(a, range(Q), b, range(Q))] * dev
        C[np.ix_(a, range(Q), b, range(Q))] += block
    return C


def hierarchical_oracle_predict(
    truth, X, y, groups, X_test, groups_test, *, include_noise=True
):
    r"""Oracle prediction: the exact joint GP posterior under the simulator's covariance.

    Conditions on the training data of **all** clients at once, with the
    true covariance of :func:`hierarchical_covariance` (true kernels, true
    loadings, true ``gamma``/``rho``) plus the true isotropic noise
    ``truth.noise**2 * I``:

    .. math::

        \mu_* = K_{*f} (K_{ff} + \sigma^2 I)^{-1} \mathbf y, \qquad
        \Sigma_{*} = K_{**} - K_{*f} (K_{ff} + \sigma^2 I)^{-1} K_{f*}
                     + \sigma^2 I_Q,

    returning the mean and only the ``Q x Q`` diagonal block of
    :math:`\Sigma_*` at each test input. No fitted model can beat this in
    expectation in scenarios A, B, D (and the single-output generator),
    where the simulated data are Gaussian given the loadings: it is the
    Bayes posterior predictive. In scenario C the data are not Gaussian; the
    mean is then the best *linear* predictor (simple kriging with the exact
    second moments) and the blocks are its exact error covariance, but the
    NLL/coverage assume Gaussian errors.

    Parameters
    ----------
    truth : Bunch
        The ``truth`` returned by ``make_hierarchical_regression(...,
        return_truth=True)``.
    X : array-like of shape (n, n_features)
        Training inputs of all clients.
    y : array-like of shape (n,) or (n, Q)
        Noisy training targets (``(n,)`` only when ``Q == 1``).
    groups : array-like of shape (n,), int
        Client id of every training row.
    X_test : array-like of shape (m, n_features)
        Test inputs.
    groups_test : array-like of shape (m,), int
        Client id of every test row.
    include_noise : bool, default=True
        Add ``noise**2 * I_Q`` to the blocks (predictive covariance of noisy
        ``y``, as the metrics expect); False gives the posterior of the
        noise-free signal.

    Returns
    -------
    mean : ndarray of shape (m,) or (m, Q)
        Posterior mean, 1-D exactly when ``y`` is 1-D.
    cov : ndarray of shape (m, Q, Q)
        Posterior covariance block at every test input.

    Raises
    ------
    ValueError
        On a ``truth`` that is not the generator's (the message names the
        keys it lacks, as in :func:`hierarchical_covariance`), shape
        mismatches, NaN or inf in ``y`` or the inputs, or out-of-range
        client ids.
    numpy.linalg.LinAlgError
        If the training covariance is singular even with a small jitter
        (only possible with ``noise == 0``).

    Notes
    -----
    Cost: one Cholesky of the ``nQ x nQ`` training covariance (``nQ = 1200``
    for the paper's benchmark, a fraction of a second).
    """
    truth = _check_truth(truth)
    X, g = _check_client_inputs(truth, X, groups, "X")
    Xs, gs = _check_client_inputs(truth, X_test, groups_test, "X_test")
    Q = truth["n_outputs"]
    y_arr = np.asarray(y, dtype=np.float64)
    one_d = y_arr.ndim == 1
    if one_d and Q == 1:
        y_arr = y_arr[:, None]
    if y_arr.shape != (X.shape[0], Q):
        raise ValueError(
            f"y must have shape ({X.shape[0]}, {Q})"
            + (f" or ({X.shape[0]},)" if Q == 1 else "")
            + f", got {np.shape(y)}"
        )
    if not np.all(np.isfinite(y_arr)):
        raise ValueError("y contains NaN or inf")
    from scipy.linalg import cho_solve, solve_triangular

    n, m = X.shape[0], Xs.shape[0]
    s2 = float(truth["noise"]) ** 2
    K = hierarchical_covariance(truth, X, g).reshape(n * Q, n * Q)
    scale = float(np.mean(np.diag(K))) if n else 1.0
    jitter = 0.0 if s2 > 0 else 1e-10 * scale
    for _ in range(_MAX_JITTER_TRIES):
        try:
            L = np.linalg.cholesky(K + (s2 + jitter) * np.eye(n * Q))
            break
        except np.linalg.LinAlgError:
            jitter = max(10.0 * jitter, 1e-10 * scale)
    else:
        raise np.linalg.LinAlgError("Cholesky of the oracle's training covariance failed")
    alpha = cho_solve((L, True), y_arr.reshape(-1))
    Ksf = hierarchical_covariance(truth, Xs, gs, X, g).reshape(m * Q, n * Q)
    mean = (Ksf @ alpha).reshape(m, Q)
    V = solve_triangular(L, Ksf.T, lower=True).reshape(n * Q, m, Q)
    cov = np.einsum("kjq,kjp->jqp", V, V)
    prior = np.empty((m, Q, Q))
    for i in np.unique(gs):
        rows = np.flatnonzero(gs == i)
        Kss = hierarchical_covariance(truth, Xs[rows], gs[rows])
        prior[rows] = Kss[np.arange(len(rows)), :, np.arange(len(rows)), :]
    cov = prior - cov
    cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
    if include_noise:
        cov += s2 * np.eye(Q)
    return (mean[:, 0] if one_d else mean), cov


def _make_ilmm_regression(
    counts, n_test, n_features, low, high, n_outputs, n_latent, scenario,
    ell_g, var_g, phi, ell_l, var_l, noise, rng,
):
    """Multi-output generator of pFedHGP sections 4.1 and 4.3 (see the caller)."""
    T, Q, R = len(counts), n_outputs, n_latent
    # ---- inputs (as in the single-output generator) ----------------------
    X_train = [rng.uniform(low, high, size=(c, n_features)) for c in counts]
    if n_test == 0:
        X_test = [np.empty((0, n_features)) for _ in range(T)]
    elif n_features == 1:
        grid = np.linspace(low, high, n_test)[:, None]
        X_test = [grid.copy() for _ in range(T)]
    else:
        X_test = [rng.uniform(low, high, size=(n_test, n_features)) for _ in range(T)]
    X_client = [np.vstack([a, b]) for a, b in zip(X_train, X_test)]
    sizes = np.array([len(x) for x in X_client])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    X_all = np.vstack(X_client)
    N = len(X_all)

    # ---- loadings and scenario constants (drawn in every scenario, so one
    # random_state gives the four scenarios common random numbers) ---------
    B_g = rng.standard_normal((Q, R))
    B_d = rng.standard_normal((T, Q, R))
    B_l = rng.standard_normal((T, Q, R))
    gamma = rng.uniform(*_GAMMA_RANGE, size=T)
    periodic = (
        (_PERIODIC_WEIGHT, _PERIODIC_PERIOD, _PERIODIC_LENGTHSCALE)
        if scenario == "B"
        else None
    )
    var_d = phi * var_g

    # ---- latent draws ------------------------------------------------------
    h_g = np.column_stack(
        [_draw_latent(X_all, ell_g[r], var_g[r], None, rng, f"global latent {r}")
         for r in range(R)]
    )
    f_g = h_g @ B_g.T
    f_d = np.empty((N, Q))
    f_t = np.empty((N, Q))  # independent local GP (f~_i in scenario D)
    for i, Xi in enumerate(X_client):
        h = np.column_stack(
            [_draw_latent(Xi, ell_g[r], var_d[r], periodic, rng,
                          f"deviation latent {r} (client {i})") for r in range(R)]
        )
        f_d[offsets[i] : offsets[i + 1]] = h @ B_d[i].T
    for i, Xi in enumerate(X_client):
        h = np.column_stack(
            [_draw_latent(Xi, ell_l[r], var_l[r], None, rng,
                          f"local latent {r} (client {i})") for r in range(R)]
        )
        f_t[offsets[i] : offsets[i + 1]] = h @ B_l[i].T
    eps = noise * rng.standard_normal((N, Q))

    client = np.repeat(np.arange(T), sizes)
    comps = {"global": f_g, "deviation": f_d}
    if scenario == "D":
        comps["local"] = _RHO * f_d + np.sqrt(1.0 - _RHO**2) * f_t
    else:
        comps["local"] = f_t
    if scenario == "C":
        comps["interaction"] = gamma[client, None] * f_g * f_d
    f_clean = sum(comps.values())
    y_all = f_clean + eps

    truth = Bunch(
        scenario=scenario,
        n_outputs=Q,
        n_latent=R,
        n_clients=T,
        n_features=n_features,
        noise=noise,
        global_lengthscale=ell_g,
        global_variance=var_g,
        phi=phi,
        deviation_variance=var_d,
        local_lengthscale=ell_l,
        local_variance=var_l,
        periodic=periodic,
        gamma=gamma if scenario == "C" else None,
        rho=_RHO if scenario == "D" else None,
        loadings_global=B_g,
        loadings_deviation=B_d,
        loadings_local=B_l,
    )
    return X_all, y_all, f_clean, client, comps, truth


def _multioutput_result(
    counts, n_test, n_features, low, high, n_outputs, n_latent, scenario,
    global_lengthscale, global_variance, phi, local_lengthscale, local_variance,
    noise, rng, return_components, return_truth,
):
    """Validate the multi-output hyperparameters, simulate and pack the outputs."""
    R = n_latent
    ell_g = _per_latent("global_lengthscale", global_lengthscale, _ILMM_GLOBAL_LENGTHSCALE, R)
    var_g = _per_latent("global_variance", global_variance, _ILMM_GLOBAL_VARIANCE, R)
    ell_l = _per_latent("local_lengthscale", local_lengthscale, _ILMM_LOCAL_LENGTHSCALE, R)
    var_l = _per_latent("local_variance", local_variance, _ILMM_LOCAL_VARIANCE, R)
    for name, arr, zero_ok in (
        ("global_lengthscale", ell_g, False),
        ("local_lengthscale", ell_l, False),
        ("global_variance", var_g, True),
        ("local_variance", var_l, True),
    ):
        ok = np.isfinite(arr) & ((arr >= 0) if zero_ok else (arr > 0))
        if not np.all(ok):
            rel = ">= 0" if zero_ok else "> 0"
            raise ValueError(f"{name} must be finite and {rel}, got {arr.tolist()!r}")
    X_all, y_all, f_clean, client, comps, truth = _make_ilmm_regression(
        counts, n_test, n_features, low, high, n_outputs, R, scenario,
        ell_g, var_g, phi, ell_l, var_l, noise, rng,
    )
    is_train = np.concatenate(
        [np.r_[np.ones(c, bool), np.zeros(n_test, bool)] for c in counts]
    )
    groups_all = client.astype(np.int64)

    def _part(mask):
        return (
            X_all[mask], y_all[mask], groups_all[mask],
            {k: v[mask] for k, v in comps.items()},
        )

    X, y, groups, comps_tr = _part(is_train)
    out = [X, y, groups]
    truth.y_clean = f_clean[is_train]
    if n_test > 0:
        Xt, yt, gt, comps_t = _part(~is_train)
        out += [Xt, yt, gt]
        truth.y_test_clean = f_clean[~is_train]
    if return_components:
        out.append(comps_tr)
        if n_test > 0:
            out.append(comps_t)
    if return_truth:
        out.append(truth)
    return tuple(out)


def make_hierarchical_regression(
    n_clients=6,
    n_samples=50,
    *,
    n_features=1,
    x_range=(0.0, 10.0),
    global_lengthscale=None,
    global_variance=None,
    phi=1.2,
    local_lengthscale=None,
    local_variance=None,
    noise=0.05,
    n_test=0,
    random_state=None,
    return_components=False,
    n_outputs=1,
    scenario=None,
    n_latent=None,
    return_truth=False,
):
    """Simulate federated regression data with the pFedHGP hierarchy.

    Two generators share this function: the single-output one below (the
    default, ``n_outputs=1`` and ``scenario=None``) and the paper's
    multi-output benchmark (``n_outputs > 1`` or a ``scenario``), described
    after it.

    **Single output**

    For clients ``i = 0..T-1`` (``T = n_clients``), scalar output
    (pFedHGP section 4.1 / docs/maths.md)::

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

    **Multi-output benchmark** (pFedHGP sections 4.1 and 4.3; used when
    ``n_outputs > 1`` or ``scenario`` is given, ``scenario=None`` then means
    ``"A"``). With ``Q = n_outputs`` and ``R = n_latent``, every component
    ``c`` in {g, delta_i, l_i} is ``f_c(x) = B_c h_c(x)`` with ``R``
    independent scalar latent GPs ``h_c`` and a ``Q x R`` loading matrix
    ``B_c`` of independent N(0, 1) entries (``B_g`` shared; ``B_delta_i``,
    ``B_l_i`` per client), and (eq. 36)::

        y_i(x) = f_g(x) + f_delta_i(x) + f_i(x) + eps,   eps ~ N(0, noise^2 I_Q)

    Latent ``r`` of ``h_g`` has the SE kernel ``(global_lengthscale[r],
    global_variance[r])``; ``h_delta_i`` the same lengthscales with variances
    ``phi * global_variance[r]`` (phi_sim); ``h_l_i`` ``(local_lengthscale[r],
    local_variance[r])``. Defaults are the paper's: ``R = 2``, lengthscales
    (1.8, 2.5) and output scales tau = (1.0, 0.7) -- variances (1.0, 0.49) --
    for the global latents, ``phi = 1.2``, local lengthscales (0.25, 0.45)
    and scales (1.0, 0.8) -- variances (1.0, 0.64) --, ``noise = 0.05``. The
    paper's benchmark is ``n_clients=6, n_samples=50, n_outputs=4,
    n_test=150``. Scenarios (section 4.3):

    * ``"A"`` matched hierarchy: exactly the model above.
    * ``"B"`` deviation-kernel mismatch (eq. 40): every deviation latent has
      ``k(x, x') = 0.65 tau_d^2 exp(-(x - x')^2 / (2 ell^2))
      + 0.35 tau_d^2 exp(-2 sin^2(pi |x - x'| / 3) / 0.8^2)``. Our reading
      of the paper: ``tau_d^2 = phi * global_variance[r]`` and
      ``ell = global_lengthscale[r]`` (the deviation's own scale and
      lengthscale, as in scenario A), period 3 and periodic lengthscale 0.8
      (``|x - x'|`` is the Euclidean distance when ``n_features > 1``). The
      total deviation variance is therefore the same as in A.
    * ``"C"`` non-additive interaction (eq. 41): the clean signal gains
      ``gamma_i * f_g(x) * f_delta_i(x)`` (elementwise over the ``Q``
      channels) with ``gamma_i ~ U(0.35, 0.60)`` drawn once per client.
    * ``"D"`` correlated components (eq. 42): the local component is
      ``f_i = rho f_delta_i + sqrt(1 - rho^2) f~_i`` with ``rho = 0.5``,
      where ``f~_i`` is the scenario-A local component (an independent
      short-lengthscale ILMM GP).

    Readings of the paper's text (section 4.1 names phi_sim a "deviation
    scale" without saying whether it multiplies the variance or the output
    scale): phi multiplies the *variance*, as in the fitted model's
    ``k_delta = phi k_g`` (section 3.2); the deviation latents reuse the
    global lengthscales and output scales; one scalar latent GP is one of
    the "``R = 2`` independent scalar GP draws", each with its own
    lengthscale and scale (latent ``r`` of every component uses entry ``r``
    of the tuples); ``f~_i`` of scenario D has its own ``Q x R`` loadings
    ``B_l_i``, like the scenario-A local component.

    All draws (inputs, loadings, ``gamma``, latents, noise) are made in
    every scenario in the same order, so one ``random_state`` gives the four
    scenarios the same inputs, loadings, global and local latent draws and
    noise (common random numbers). The deviation draws of B use the same
    normals through a different kernel. Latent draws are made jointly at the
    training and test inputs (``f_g`` jointly over all clients), as in the
    single-output generator, and the test inputs are the same ``n_test``-point
    grid for every client when ``n_features == 1``.

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
    global_lengthscale : float or array, default=None
        Lengthscale(s) of ``k_g`` (> 0). Single output: a float or an array
        of shape (n_features,) (ARD); None means 1.8. Multi-output: a float
        or one value per latent, shape (n_latent,); None means (1.8, 2.5).
    global_variance : float or array, default=None
        Variance of ``k_g`` (>= 0; 0 switches ``f_g`` and ``f_delta_i`` off).
        Single output: a float, None means 1.0. Multi-output: a float or
        shape (n_latent,), None means (1.0, 0.49).
    phi : float, default=1.2
        Deviation scale (>= 0): ``f_delta_i`` has variance
        ``phi * global_variance``.
    local_lengthscale : float or array, default=None
        Lengthscale(s) of ``k_l`` (> 0), as ``global_lengthscale``; None
        means 0.25 (single output) or (0.25, 0.45) (multi-output).
    local_variance : float or array, default=None
        Variance of ``k_l`` (>= 0; 0 switches ``f_i`` off); None means 1.0
        (single output) or (1.0, 0.64) (multi-output).
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
    n_outputs : int, default=1
        Number of output channels ``Q >= 1``. ``Q > 1`` selects the
        multi-output generator.
    scenario : {"A", "B", "C", "D"} or None, default=None
        Paper scenario (section 4.3); any value selects the multi-output
        generator (also with ``n_outputs=1``). None: single output if
        ``n_outputs == 1``, else ``"A"``.
    n_latent : int or None, default=None
        Latent GPs per component ``R >= 1`` of the multi-output generator;
        None means 2 (the paper's ``R``). The single-output generator has one
        latent per component and accepts only None.
    return_truth : bool, default=False
        If True, also return the simulator's ground truth (see Returns), for
        :func:`hierarchical_covariance` and :func:`hierarchical_oracle_predict`.

    Returns
    -------
    X : ndarray of shape (n, n_features)
        Training inputs, ``n = sum(n_samples)``, ordered by client.
    y : ndarray of shape (n,) or (n, Q)
        Noisy training targets: ``(n,)`` from the single-output generator,
        ``(n, Q)`` from the multi-output one (also when ``Q == 1``).
    groups : ndarray of shape (n,), int
        Client id ``0..T-1`` of every training row.
    X_test, y_test, groups_test : ndarrays
        Only when ``n_test > 0``: the test triple, shapes
        ``(T * n_test, n_features)``, ``(T * n_test,)`` or
        ``(T * n_test, Q)``, ``(T * n_test,)``.
    components : dict
        Only when ``return_components=True``: ``{"global": f_g(X),
        "deviation": f_delta(X), "local": f(X)}``, each of the shape of
        ``y``; scenario C adds ``"interaction"`` (``gamma_i f_g * f_delta``)
        and in scenario D ``"local"`` is the correlated ``f_i`` of eq. 42.
        ``y - sum(components.values())`` is the noise.
    components_test : dict
        Only when ``return_components=True`` and ``n_test > 0``: the same for
        the test inputs.
    truth : :class:`~sklearn.utils.Bunch`
        Only when ``return_truth=True``: the simulator's parameters --
        ``scenario`` (None for the single-output generator), ``n_outputs``,
        ``n_latent``, ``n_clients``, ``n_features``, ``noise`` (sd),
        ``global_lengthscale``, ``global_variance``, ``phi``,
        ``deviation_variance``, ``local_lengthscale``, ``local_variance``
        (one entry per latent), ``periodic`` (``(0.35, 3.0, 0.8)`` in B, else
        None), ``gamma`` (shape (T,), C only), ``rho`` (D only), the loadings
        ``loadings_global`` (Q, R), ``loadings_deviation`` and
        ``loadings_local`` (T, Q, R) (all ones for the single-output
        generator) -- and the noise-free signal ``y_clean`` (shape of ``y``)
        and, when ``n_test > 0``, ``y_test_clean`` (shape of ``y_test``).

    The return value is therefore one of::

        X, y, groups
        X, y, groups, components
        X, y, groups, X_test, y_test, groups_test
        X, y, groups, X_test, y_test, groups_test, components, components_test

    each followed by ``truth`` when ``return_truth=True``.

    Raises
    ------
    ValueError
        On invalid arguments (``n_clients < 1``, negative or mismatched
        ``n_samples``, non-positive lengthscales, negative variances, ``phi``
        or ``noise``, ``n_test < 0``, ``low >= high``, an unknown
        ``scenario``, ``n_outputs < 1``, ``n_latent`` given to the
        single-output generator, multi-output hyperparameters left at None
        with an ``n_latent`` other than 2 (no default), a non-bool
        ``return_components`` or ``return_truth``, a ``random_state`` that
        cannot seed a generator, ...).
    numpy.linalg.LinAlgError
        If a kernel matrix cannot be factorised even with jitter 0.1 * var.

    Examples
    --------
    >>> from skfedgp.datasets import make_hierarchical_regression
    >>> X, y, g, Xt, yt, gt = make_hierarchical_regression(
    ...     n_clients=6, n_samples=50, n_test=150, random_state=0)
    >>> X.shape, Xt.shape
    ((300, 1), (900, 1))

    The paper's multi-output benchmark, scenario B, with the oracle:

    >>> from skfedgp.datasets import hierarchical_oracle_predict
    >>> X, y, g, Xt, yt, gt, truth = make_hierarchical_regression(
    ...     n_outputs=4, scenario="B", n_test=150, random_state=0,
    ...     return_truth=True)
    >>> y.shape, yt.shape, truth.y_test_clean.shape
    ((300, 4), (900, 4), (900, 4))
    >>> mean, cov = hierarchical_oracle_predict(truth, X, y, g, Xt, gt)
    >>> mean.shape, cov.shape
    ((900, 4), (900, 4, 4))
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
    phi = _check_positive("phi", phi, allow_zero=True)
    noise = _check_positive("noise", noise, allow_zero=True)
    if not isinstance(return_components, (bool, np.bool_)):
        raise ValueError(f"return_components must be a bool, got {return_components!r}")
    if not isinstance(return_truth, (bool, np.bool_)):
        raise ValueError(f"return_truth must be a bool, got {return_truth!r}")
    if not isinstance(n_outputs, Integral) or isinstance(n_outputs, bool) or n_outputs < 1:
        raise ValueError(f"n_outputs must be an integer >= 1, got {n_outputs!r}")
    n_outputs = int(n_outputs)
    if scenario is not None and scenario not in _SCENARIOS:
        raise ValueError(f"scenario must be one of {_SCENARIOS} or None, got {scenario!r}")
    if n_latent is not None and (
        not isinstance(n_latent, Integral) or isinstance(n_latent, bool) or n_latent < 1
    ):
        raise ValueError(f"n_latent must be None or an integer >= 1, got {n_latent!r}")
    multi = n_outputs > 1 or scenario is not None
    rng = check_random_state(random_state)
    if multi:
        return _multioutput_result(
            counts, n_test, n_features, low, high, n_outputs,
            2 if n_latent is None else int(n_latent),
            scenario or "A", global_lengthscale, global_variance, phi,
            local_lengthscale, local_variance, noise, rng,
            return_components, return_truth,
        )
    if n_latent is not None:
        raise ValueError(
            "n_latent applies to the multi-output generator only (give "
            "n_outputs > 1 or a scenario)"
        )

    ell_g = _check_positive(
        "global_lengthscale", 1.8 if global_lengthscale is None else global_lengthscale,
        size=n_features,
    )
    ell_l = _check_positive(
        "local_lengthscale", 0.25 if local_lengthscale is None else local_lengthscale,
        size=n_features,
    )
    var_g = _check_positive(
        "global_variance", 1.0 if global_variance is None else global_variance,
        allow_zero=True,
    )
    var_l = _check_positive(
        "local_variance", 1.0 if local_variance is None else local_variance,
        allow_zero=True,
    )

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
    if return_truth:
        f_clean_all = f_global + f_dev + f_loc
        ones = np.ones((n_clients, 1, 1))
        truth = Bunch(
            scenario=None,
            n_outputs=1,
            n_latent=1,
            n_clients=n_clients,
            n_features=n_features,
            noise=noise,
            global_lengthscale=[ell_g],
            global_variance=np.array([var_g]),
            phi=phi,
            deviation_variance=np.array([phi * var_g]),
            local_lengthscale=[ell_l],
            local_variance=np.array([var_l]),
            periodic=None,
            gamma=None,
            rho=None,
            loadings_global=np.ones((1, 1)),
            loadings_deviation=ones,
            loadings_local=ones.copy(),
            y_clean=f_clean_all[is_train],
        )
        if n_test > 0:
            truth.y_test_clean = f_clean_all[~is_train]
        out.append(truth)
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
    if token in ("?", "NaN", "nan"):
        return np.nan
    if not token:  # "1,2,,3" or a trailing comma: not a missing value ("?")
        raise ValueError(f"{path}, line {lineno}: an empty value (a stray comma?)")
    try:
        value = float(token)
    except ValueError:
        raise ValueError(
            f"{path}, line {lineno}: cannot read {token!r} as a number"
        ) from None
    if not np.isfinite(value):
        raise ValueError(f"{path}, line {lineno}: {token!r} is not a finite number")
    return value


def _ts_to_length(values, n, how):
    """One channel of one series brought to ``n`` points (``how``: "resample" or "pad").

    "resample": linear interpolation at ``n`` equally spaced positions from
    the first to the last value; a position between a missing value (NaN)
    and its neighbour is missing, one on an observed value is that value.
    "pad": NaN appended up to ``n`` (the caller checked the length).
    """
    x = np.asarray(values, dtype=np.float64)
    m = x.shape[0]
    if how == "pad":
        return np.concatenate([x, np.full(n - m, np.nan)])
    if m == 1:
        return np.full(n, x[0])
    # position k of n is k (m - 1) / (n - 1) points along the series: its
    # interval and offset in integers, so that a position on a point is
    # found exactly (floating linspace positions miss some, and the
    # weight 1e-16 of a missing neighbour made them missing)
    k = np.arange(n, dtype=np.int64) * (m - 1)
    i0 = np.minimum(k // (n - 1), m - 2)
    r = k - i0 * (n - 1)
    w = r / (n - 1)
    out = (1.0 - w) * x[i0] + w * x[i0 + 1]
    # exactly on a point: that point's value (its neighbour may be missing)
    on0, on1 = r == 0, r == n - 1
    out[on0] = x[i0[on0]]
    out[on1] = x[i0[on1] + 1]
    return out


def load_ucr_ts(path, *, unequal_length="raise", n_points=None):
    """Read a time-series classification file in the UCR/UEA ``.ts`` format.

    The format (UCR Time Series Classification Archive, Dau et al. 2019; UEA
    multivariate archive, Bagnall et al. 2018) has comment lines starting
    with ``#`` (some archive files use ``%``, as in ARFF; both are read as
    comments), header lines starting with ``@`` (``@problemName``,
    ``@univariate``, ``@dimensions``, ``@equalLength``, ``@seriesLength``,
    ``@classLabel true <labels...>``, ``@timeStamps``, ``@missing``), then
    ``@data`` and one series per line: comma-separated values, channels
    separated by ``:``, the class label last (after the final ``:``).

    Parameters
    ----------
    path : str or path-like
        A ``.ts`` file, e.g. ``GunPoint_TRAIN.ts``.
    unequal_length : {"raise", "resample", "pad"}, default="raise"
        What to do with series of unequal length (the archive's
        ``@equalLength false`` problems, e.g. PickupGestureWiimoteZ or
        JapaneseVowels). ``"raise"``: refuse them (a ``ValueError`` that
        names the lengths). ``"resample"``: linear interpolation of every
        channel of every series onto ``n_points`` equally spaced positions
        from its first to its last value (uniform scaling of the time axis:
        a gesture made slowly or quickly lands on the same grid); a value
        next to a missing one stays missing. ``"pad"``: the series are left
        as recorded and padded at the end with NaN to ``n_points``;
        :class:`skfedgp.MaxEvidenceClassifier` then scores each curve on its
        observed points only, which suits a series cut short by a dropout,
        not one that ends because the movement ended (there the padding
        says where it ended, and ``"resample"`` is the better choice).
        Equal-length files load unchanged whatever the value, unless
        ``n_points`` asks for another length.
    n_points : int, optional
        Length of the output series with ``"resample"`` (at least 2) or
        ``"pad"`` (default: the longest series in the file). Give the same
        value for a problem's training and test files, whose longest series
        may differ, so that both have the same columns. With ``"raise"`` it
        must be None or the series' length.

    Returns
    -------
    X : ndarray of shape (n_series, n_channels * n_points), float64
        One series per row, channels side by side: columns
        ``k * n_points : (k + 1) * n_points`` hold channel ``k`` (the layout
        :class:`skfedgp.MaxEvidenceClassifier` expects); ``n_points`` is
        the series' length, or the argument (by default the longest series)
        with ``"resample"`` or ``"pad"``. Missing values (``?`` or ``NaN``
        in the file) are NaN, and so are the padding and resampled values
        next to a missing one.
    y : ndarray of shape (n_series,), object
        Class label of every series, as the string written in the file.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If ``path`` is a folder or has a line that is not UTF-8 text (other
        than a comment; a byte-order mark is allowed), the file has no ``@data``
        section, no class labels (``@classLabel false``), time stamps
        (``@timeStamps true``, not supported), series of unequal length
        (with ``unequal_length="raise"``) or channel count, series of
        another length than ``@seriesLength``, an ``n_points`` other than
        the series' length with ``"raise"``, a series longer than
        ``n_points`` with ``"pad"``, an ``n_points`` below 2 with
        ``"resample"``, an ``unequal_length`` or ``n_points`` that is not
        one of the allowed values, a
        channel count other than ``@dimensions``, a label not listed in
        ``@classLabel`` or empty, a series line without a label, a value
        that is not a finite number, an empty value (a stray comma; a
        missing value is ``?`` or NaN), a line before ``@data`` that is not
        a header, an ``@data`` section without series, an ``@dimensions`` or
        ``@seriesLength`` that is not an integer, or an ``@timeStamps``
        other than true or false.

    References
    ----------
    Dau, H. A. et al. (2019), "The UCR time series archive", IEEE/CAA Journal
    of Automatica Sinica 6(6). Bagnall, A. et al. (2018), "The UEA
    multivariate time series classification archive, 2018", arXiv:1811.00075.
    """
    if not isinstance(unequal_length, str) or unequal_length not in ("raise", "resample",
                                                                      "pad"):
        raise ValueError(f"unequal_length must be 'raise', 'resample' or 'pad', got "
                         f"{unequal_length!r}")
    n_points = check_count(n_points, "n_points", allow_none=True)
    if n_points is not None and n_points < 2 and unequal_length == "resample":
        raise ValueError(f"n_points={n_points} with unequal_length='resample': a series is "
                         "resampled from its first to its last value, which needs at least "
                         "2 points")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder, not a time-series file")
    if not path.is_file():
        raise FileNotFoundError(f"time-series file {str(path)!r} does not exist")
    header = {}
    rows, labels = [], []
    in_data = False
    lines = []
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
        data = data[3:]
    for lineno, raw in enumerate(data.splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            if raw.lstrip().startswith((b"#", b"%")):  # a comment in another encoding: harmless
                lines.append(raw.decode("utf-8", errors="replace"))
                continue
            # decoding with replacement would merge distinct labels silently
            raise ValueError(f"{path}, line {lineno}: not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start}); convert the file to UTF-8") from None
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "%")):
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
        if not label.strip():
            raise ValueError(f"{path}, line {lineno}: an empty class label")
        rows.append(series)
        labels.append(label.strip())
    if not in_data:
        raise ValueError(f"{path}: no @data section")
    if not rows:
        raise ValueError(f"{path}: the @data section holds no series")
    n_channels = len(rows[0])
    first = len(rows[0][0])
    for i, series in enumerate(rows):
        if len(series) != n_channels:
            raise ValueError(
                f"{path}: series {i} has {len(series)} channel(s), the first has {n_channels}"
            )
    lengths = sorted({len(ch) for series in rows for ch in series})
    longest = lengths[-1]
    if unequal_length == "raise":
        if len(lengths) > 1:
            i = next(i for i, series in enumerate(rows)
                     if {len(ch) for ch in series} != {first})
            found = sorted({len(ch) for ch in rows[i]})
            what = (f"series 0's channels have lengths {found}" if i == 0 else
                    f"series {i} has channel length(s) {found}, the first series has {first}")
            raise ValueError(
                f"{path}: {what} (lengths {lengths[0]} to {longest} in the file); to load "
                "unequal-length series pass unequal_length='resample' (interpolated onto "
                "a common grid) or 'pad' (NaN at the end), with the same n_points for the "
                "training and test files")
        if n_points is not None and n_points != first:
            raise ValueError(f"{path}: the series have {first} points, not n_points="
                             f"{n_points}; pass unequal_length='resample' or 'pad' to "
                             "change their length")
    target = longest if n_points is None else int(n_points)
    if unequal_length == "pad" and longest > target:
        raise ValueError(f"{path}: a series has {longest} points, more than n_points="
                         f"{target}: padding cannot shorten it (use unequal_length="
                         "'resample', or a larger n_points)")
    if lengths != [target] and unequal_length != "raise":
        rows = [[_ts_to_length(ch, target, unequal_length) for ch in series]
                for series in rows]
    n_points = len(rows[0][0])
    for key in ("dimensions", "serieslength"):
        if key in header:
            try:
                header[key] = int(header[key])
            except ValueError:
                raise ValueError(f"{path}: @{key} must be an integer, got "
                                 f"{header[key]!r}") from None
    if "serieslength" in header and lengths != [header["serieslength"]]:
        found = (f"{lengths[0]} points" if len(lengths) == 1
                 else f"{lengths[0]} to {lengths[-1]} points")
        raise ValueError(f"{path}: @seriesLength says {header['serieslength']} but the series "
                         f"have {found}")
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
        Standard deviation of the white measurement noise, in units of the
        shared press waveform's peak (1 before the per-channel gains of
        ``1 + 0.15 cos(2 pi k / n_channels)``, so channel ``k``'s mean
        normal curve peaks near that gain, e.g. 1.15 for channel 0).
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    X : ndarray of shape (n_normal + 4 * n_per_fault, n_channels * n_points)
        One cycle per row, channels side by side (columns
        ``k * n_points : (k + 1) * n_points`` hold channel ``k``); load in
        units of the shared waveform's peak (before the channel gains).
    y : ndarray of shape (n_normal + 4 * n_per_fault,), int64
        0 for normal cycles, ``k`` for fault class ``k``; rows are ordered by
        class (all normal cycles first), each class in generation order.

    Raises
    ------
    ValueError
        For ``n_normal``, ``n_per_fault`` or ``n_channels`` not an integer
        >= 1, ``n_points`` not an integer >= 10, negative or non-finite
        ``variation`` or ``noise``, ``fault_size`` outside ``[0, 1)``, or a
        ``random_state`` that cannot seed a generator.

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
