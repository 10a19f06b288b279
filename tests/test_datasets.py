import functools
import gzip
import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from skfedgp.datasets import (
    fetch_beijing_air_quality,
    load_beijing_air_quality,
    make_hierarchical_regression,
)

BEIJING_DIR = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "beijing_air_quality"
)
STATIONS = [
    "Aotizhongxin", "Changping", "Dingling", "Dongsi", "Guanyuan", "Gucheng",
    "Huairou", "Nongzhanguan", "Shunyi", "Tiantan", "Wanliu", "Wanshouxigong",
]


@pytest.fixture(scope="module")
def beijing_dir():
    if not BEIJING_DIR.is_dir() or not any(BEIJING_DIR.glob("PRSA_Data_*.csv*")):
        pytest.skip(
            f"Beijing air-quality developer copy not found at {BEIJING_DIR} "
            "(expected shared/data/beijing_air_quality beside the repository)"
        )
    return BEIJING_DIR


def _write_csv(src_dir, dest_dir, stations, *, gz=False, full_name=False, rows=None):
    """Copy station files (optionally un-gzipped / renamed to UCI names)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    for st in stations:
        (src,) = src_dir.glob(f"PRSA_Data_{st}_*.csv.gz")
        raw = gzip.decompress(src.read_bytes())
        if rows is not None:
            raw = b"".join(raw.splitlines(keepends=True)[: rows + 1])
        dates = "20130301-20170228" if full_name else "20130301-20140228"
        name = f"PRSA_Data_{st}_{dates}.csv"
        if gz:
            (dest_dir / (name + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (dest_dir / name).write_bytes(raw)


# ------------------------------------------------------------------ loader
def test_real_data_loader(beijing_dir):
    data = load_beijing_air_quality(beijing_dir)
    # raw rows at hours 2 and 14, before dropping missing PM2.5
    for st in STATIONS:
        (path,) = beijing_dir.glob(f"PRSA_Data_{st}_*.csv.gz")
        raw = pd.read_csv(path, usecols=["hour", "PM2.5"])
        sel = raw[raw["hour"].isin([2, 14])]
        assert len(sel) == 730
        n_kept = int((data.groups == st).sum())
        assert n_kept == 730 - int(sel["PM2.5"].isna().sum())
        assert 700 <= n_kept <= 730
    assert sorted(np.unique(data.groups)) == STATIONS
    assert data.groups.dtype == object
    assert data.data.shape == (len(data.target), 1)
    assert np.all(np.isfinite(data.data)) and np.all(np.isfinite(data.target))
    t = data.data[:, 0]
    assert t.min() >= 0.0 and t.max() < 365.0
    assert t.min() == pytest.approx(2 / 24)  # first row: 2013-03-01 02:00
    assert set(np.round((t % 1) * 24, 6)) == {2.0, 14.0}
    assert list(data.frame.columns) == ["time_days", "timestamp", "station", "PM2.5"]
    assert data.feature_names == ["time_days"] and data.target_names == ["PM2.5"]
    assert "Zhang" in data.DESCR and "501" in data.DESCR and "CC BY 4.0" in data.DESCR
    # sorted by station, then time
    f = data.frame
    assert f["station"].is_monotonic_increasing
    assert all(g["timestamp"].is_monotonic_increasing for _, g in f.groupby("station"))


def test_loader_options(beijing_dir):
    data = load_beijing_air_quality(
        beijing_dir, hours=None, target="TEMP", start="2013-06-01",
        end="2013-06-03", stations=["Dongsi", "Shunyi"],
    )
    assert set(data.groups) == {"Dongsi", "Shunyi"}
    assert len(data.target) == 2 * 48  # TEMP is complete on these days
    assert data.frame["timestamp"].min() == pd.Timestamp("2013-06-01 00:00")
    assert data.frame["timestamp"].max() == pd.Timestamp("2013-06-02 23:00")
    assert data.data[:, 0].min() == 0.0
    assert data.data[:, 0].max() == pytest.approx(1 + 23 / 24)
    assert data.target_names == ["TEMP"]


def test_loader_plain_csv_and_uci_names(beijing_dir, tmp_path):
    _write_csv(beijing_dir, tmp_path, ["Dongsi"], full_name=True, rows=100)
    _write_csv(beijing_dir, tmp_path, ["Tiantan"], gz=True, rows=100)
    data = load_beijing_air_quality(tmp_path, hours=(2,))
    assert set(data.groups) == {"Dongsi", "Tiantan"}
    assert data.frame.groupby("station").size().max() <= 5


def test_loader_errors(beijing_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no Beijing"):
        load_beijing_air_quality(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_beijing_air_quality(tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown target column"):
        load_beijing_air_quality(beijing_dir, target="PM1")
    with pytest.raises(ValueError, match="unknown target column"):
        load_beijing_air_quality(beijing_dir, target="wd")
    with pytest.raises(ValueError, match="0..23"):
        load_beijing_air_quality(beijing_dir, hours=(2, 24))
    with pytest.raises(ValueError, match="0..23"):
        load_beijing_air_quality(beijing_dir, hours=-1)
    with pytest.raises(ValueError, match="unknown station"):
        load_beijing_air_quality(beijing_dir, stations=["Atlantis"])
    for bad in ("14", True, (2, True), b"2"):  # a string is not read digit by digit
        with pytest.raises(ValueError, match="hours must be None or integers in 0..23"):
            load_beijing_air_quality(beijing_dir, hours=bad)
    with pytest.raises(ValueError, match="stations is empty"):
        load_beijing_air_quality(beijing_dir, stations=[])
    with pytest.raises(ValueError, match="before end"):
        load_beijing_air_quality(beijing_dir, start="2013-05-01", end="2013-04-01")
    with pytest.raises(ValueError, match="no rows left"):
        load_beijing_air_quality(beijing_dir, start="2020-01-01")


# ------------------------------------------------------------------ fetch
@pytest.fixture(scope="module")
def uci_zip(beijing_dir, tmp_path_factory):
    """A zip laid out like UCI's: an outer zip holding a nested zip whose
    folder PRSA_Data_20130301-20170228/ holds the CSV files."""
    root = tmp_path_factory.mktemp("uci")
    csv_dir = root / "csv"
    _write_csv(beijing_dir, csv_dir, STATIONS)
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for path in sorted(csv_dir.iterdir()):
            zf.write(path, f"PRSA_Data_20130301-20170228/{path.name}")
    outer = root / "serve" / "beijing+multi+site+air+quality+data.zip"
    outer.parent.mkdir()
    with zipfile.ZipFile(outer, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("PRSA2017_Data_20130301-20170228.zip", inner.getvalue())
    return outer


@pytest.fixture
def http_url(uci_zip, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(QuietHandler, directory=str(uci_zip.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{uci_zip.name}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _check_full_year(data):
    assert sorted(set(data.groups)) == STATIONS
    assert 12 * 700 <= len(data.target) <= 12 * 730


def test_fetch_file_url_and_cache(uci_zip, tmp_path):
    data = fetch_beijing_air_quality(tmp_path, url=uci_zip.as_uri())
    _check_full_year(data)
    cache = tmp_path / "skfedgp" / "beijing_air_quality"
    assert len(list((cache / "csv").glob("PRSA_Data_*.csv"))) == 12
    assert not list(cache.glob(".download-*")) and not list(cache.glob(".extract-*"))
    # second call: the URL points nowhere, the cache is used
    nowhere = (tmp_path / "does-not-exist.zip").as_uri()
    again = fetch_beijing_air_quality(
        tmp_path, url=nowhere, download_if_missing=False, hours=(14,),
        stations=["Dongsi"],
    )
    assert set(again.groups) == {"Dongsi"}
    assert len(again.target) > 350


def test_fetch_http_server(http_url, uci_zip, tmp_path):
    digest = hashlib.sha256(uci_zip.read_bytes()).hexdigest()
    data = fetch_beijing_air_quality(tmp_path, url=http_url, checksum=digest.upper())
    _check_full_year(data)
    assert (tmp_path / "skfedgp" / "beijing_air_quality" / uci_zip.name).is_file()


def test_fetch_checksum_mismatch(uci_zip, tmp_path):
    cache = tmp_path / "skfedgp" / "beijing_air_quality"
    with pytest.raises(OSError, match="checksum mismatch"):
        fetch_beijing_air_quality(tmp_path, url=uci_zip.as_uri(), checksum="0" * 64)
    assert not list(cache.glob("*.zip"))  # bad file deleted
    assert not (cache / "csv").exists()


def test_fetch_missing_without_download(tmp_path):
    with pytest.raises(OSError, match="download_if_missing"):
        fetch_beijing_air_quality(tmp_path, url="file:///nowhere.zip",
                                  download_if_missing=False)


def test_fetch_folder_layout_and_bad_archives(beijing_dir, tmp_path):
    src = tmp_path / "src"
    _write_csv(beijing_dir, src / "csv", ["Dongsi", "Shunyi"], rows=200)
    flat = src / "flat.zip"
    with zipfile.ZipFile(flat, "w") as zf:
        for p in sorted((src / "csv").iterdir()):
            zf.write(p, f"PRSA_Data_20130301-20170228/{p.name}")
        zf.writestr("__MACOSX/PRSA_Data_20130301-20170228/._x.csv", b"junk")
    data = fetch_beijing_air_quality(tmp_path / "home1", url=flat.as_uri(), hours=None)
    assert set(data.groups) == {"Dongsi", "Shunyi"}

    not_zip = src / "notzip.zip"
    not_zip.write_bytes(b"<html>error page</html>")
    with pytest.raises(OSError, match="valid zip"):
        fetch_beijing_air_quality(tmp_path / "home2", url=not_zip.as_uri())
    empty = src / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("README.txt", b"nothing here")
    with pytest.raises(OSError, match="no PRSA_Data"):
        fetch_beijing_air_quality(tmp_path / "home3", url=empty.as_uri())
    assert not list((tmp_path / "home3" / "skfedgp" / "beijing_air_quality").iterdir())


# ------------------------------------------------------------------ synthetic
def test_make_hierarchical_shapes():
    X, y, g = make_hierarchical_regression(random_state=0)
    assert X.shape == (300, 1) and y.shape == (300,) and g.shape == (300,)
    assert np.issubdtype(g.dtype, np.integer)
    assert list(np.bincount(g)) == [50] * 6
    assert X.min() >= 0.0 and X.max() <= 10.0

    out = make_hierarchical_regression(
        n_clients=3, n_samples=[5, 7, 9], n_features=2, n_test=11,
        global_lengthscale=[1.0, 2.0], random_state=1, return_components=True,
    )
    assert len(out) == 8
    X, y, g, Xt, yt, gt, comps, comps_t = out
    assert X.shape == (21, 2) and list(np.bincount(g)) == [5, 7, 9]
    assert Xt.shape == (33, 2) and yt.shape == (33,)
    assert list(np.bincount(gt)) == [11] * 3
    assert set(comps) == {"global", "deviation", "local"}
    assert all(v.shape == (21,) for v in comps.values())
    assert all(v.shape == (33,) for v in comps_t.values())


def test_make_hierarchical_test_grid_same_functions():
    X, y, g, Xt, yt, gt, comps, comps_t = make_hierarchical_regression(
        n_clients=4, n_samples=30, n_test=150, noise=0.0, random_state=3,
        return_components=True,
    )
    grid = np.linspace(0.0, 10.0, 150)
    for i in range(4):
        np.testing.assert_array_equal(Xt[gt == i, 0], grid)
    # f_g is one function: identical on the shared grid for every client
    fg = comps_t["global"].reshape(4, 150)
    np.testing.assert_allclose(fg, np.broadcast_to(fg[0], fg.shape))
    # deviations differ between clients
    dev = comps_t["deviation"].reshape(4, 150)
    assert not np.allclose(dev[0], dev[1])
    # training and test values come from the same smooth draws: the global
    # part at a training input is close to its value at the nearest grid point
    idx = np.abs(X[:, 0][:, None] - grid[None, :]).argmin(axis=1)
    np.testing.assert_allclose(comps["global"], fg[0][idx], atol=0.1)
    assert make_hierarchical_regression(n_test=0, random_state=0)[0].shape == (300, 1)


def test_make_hierarchical_reproducible():
    a = make_hierarchical_regression(n_test=20, random_state=42)
    b = make_hierarchical_regression(n_test=20, random_state=np.random.RandomState(42))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    c = make_hierarchical_regression(n_test=20, random_state=43)
    assert not np.allclose(a[1], c[1])
    assert not np.allclose(a[4], c[4])


def test_make_hierarchical_components_sum():
    X, y, g, comps = make_hierarchical_regression(
        noise=0.0, random_state=0, return_components=True
    )
    np.testing.assert_array_equal(y, comps["global"] + comps["deviation"] + comps["local"])
    X, y, g, comps = make_hierarchical_regression(
        n_clients=20, noise=0.3, random_state=0, return_components=True
    )
    resid = y - sum(comps.values())
    assert np.std(resid) == pytest.approx(0.3, rel=0.1)


def test_make_hierarchical_prior_variances():
    # pooled mean squares over seeds estimate the prior variances
    sums = {"global": [], "deviation": [], "local": []}
    for seed in range(10):
        _, _, _, comps = make_hierarchical_regression(
            n_clients=40, n_samples=15, global_lengthscale=0.5,
            global_variance=2.0, phi=0.5, local_lengthscale=0.1,
            local_variance=0.7, random_state=seed, return_components=True,
        )
        for k, v in comps.items():
            sums[k].append(np.mean(v**2))
    assert np.mean(sums["global"]) == pytest.approx(2.0, rel=0.3)
    assert np.mean(sums["deviation"]) == pytest.approx(1.0, rel=0.15)
    assert np.mean(sums["local"]) == pytest.approx(0.7, rel=0.15)


def test_make_hierarchical_zero_variances():
    X, y, g, comps = make_hierarchical_regression(
        phi=0.0, local_variance=0.0, noise=0.0, random_state=0,
        return_components=True,
    )
    assert np.all(comps["deviation"] == 0) and np.all(comps["local"] == 0)
    np.testing.assert_array_equal(y, comps["global"])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"n_clients": 0}, "n_clients"),
        ({"n_samples": -1}, "n_samples"),
        ({"n_samples": [5, 5]}, "n_samples"),
        ({"n_features": 0}, "n_features"),
        ({"global_lengthscale": 0.0}, "global_lengthscale"),
        ({"local_lengthscale": -1.0}, "local_lengthscale"),
        ({"global_lengthscale": [1.0, 2.0]}, "n_features"),
        ({"global_variance": -1.0}, "global_variance"),
        ({"phi": -0.1}, "phi"),
        ({"noise": np.nan}, "noise"),
        ({"n_test": -3}, "n_test"),
        ({"x_range": (1.0, 1.0)}, "x_range"),
    ],
)
def test_make_hierarchical_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_hierarchical_regression(**kwargs)


def test_beijing_loader_names_a_file_given_as_folder(tmp_path):
    path = tmp_path / "station.csv"
    path.write_text("x\n")
    with pytest.raises(FileNotFoundError, match="is a file; pass the folder"):
        load_beijing_air_quality(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_beijing_air_quality(tmp_path / "absent")
