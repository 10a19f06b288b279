"""Tests of the curve data sets: ``load_ucr_ts`` and ``make_stamping_waveforms``."""

from pathlib import Path

import numpy as np
import pytest

from skfedgp.datasets import load_ucr_ts, make_stamping_waveforms

UCR_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "ucr"

_UNIVARIATE = """\
# a comment
@problemName Tiny
@timeStamps false
@missing true
@univariate true
@equalLength true
@seriesLength 4
@classLabel true a b
@data
1.0,2.0,3.0,4.0:a
0.5,?,1.5,NaN:b
-1,-2,-3,-4:a
"""

_MULTIVARIATE = """\
@problemName TinyMV
@univariate false
@dimensions 2
@classLabel true x y z
@data
1,2,3:4,5,6:x
7,8,9:10,11,12:z
"""


def _write(tmp_path, text, name="t.ts"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_ucr_univariate_with_missing(tmp_path):
    X, y = load_ucr_ts(_write(tmp_path, _UNIVARIATE))
    assert X.shape == (3, 4) and X.dtype == np.float64
    np.testing.assert_array_equal(X[0], [1, 2, 3, 4])
    np.testing.assert_array_equal(np.isnan(X[1]), [False, True, False, True])
    np.testing.assert_array_equal(X[1, [0, 2]], [0.5, 1.5])
    assert list(y) == ["a", "b", "a"]


def test_ucr_multivariate_channels_side_by_side(tmp_path):
    X, y = load_ucr_ts(_write(tmp_path, _MULTIVARIATE))
    # channel k occupies columns k * n_points : (k + 1) * n_points
    np.testing.assert_array_equal(X, [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    assert list(y) == ["x", "z"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("@classLabel true a\n1,2:a\n", "before @data"),
        ("@classLabel true a b\n", "no @data"),
        ("@classLabel false\n@data\n1,2\n", "class labels"),
        ("@classLabel true a\n@timeStamps true\n@data\n1,2:a\n", "time stamps"),
        ("@classLabel true a\n@data\n1,2,3:a\n1,2:a\n", "unequal-length"),
        ("@classLabel true a\n@data\n1,2:a\n1,2:3,4:a\n", "channel"),
        ("@classLabel true a\n@data\n1,2:q\n", "not listed"),
        ("@classLabel true a\n@data\n1,x:a\n", "cannot read 'x'"),
        ("@classLabel true a\n@dimensions 3\n@data\n1,2:a\n", "@dimensions"),
        ("@classLabel true a\n@dimensions two\n@data\n1,2:a\n", "@dimensions must be an int"),
        ("@classLabel true a\n@seriesLength 3\n@data\n1,2:a\n", "@seriesLength says 3"),
        ("@classLabel true a\n@data\n1,2,:a\n", "an empty value"),
        ("@classLabel true a\n@data\n1,inf:a\n", "not a finite number"),
        ("@classLabel true\n@data\n1,2:\n", "an empty class label"),
    ],
)
def test_ucr_bad_files(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_ucr_ts(_write(tmp_path, text))


_UNEQUAL = """\
@problemName Gestures
@equalLength false
@dimensions 2
@classLabel true a b
@data
0,1,2:5,6,7:a
0,1,2,3,4:1,?,3,4,5:b
"""


def test_ucr_unequal_lengths_are_refused_by_default_with_the_options_named(tmp_path):
    p = _write(tmp_path, _UNEQUAL)
    with pytest.raises(ValueError, match=r"lengths 3 to 5.*unequal_length='resample'.*'pad'"):
        load_ucr_ts(p)


def test_ucr_unequal_lengths_padded(tmp_path):
    X, y = load_ucr_ts(_write(tmp_path, _UNEQUAL), unequal_length="pad")
    nan = np.nan
    np.testing.assert_array_equal(X, [[0, 1, 2, nan, nan, 5, 6, 7, nan, nan],
                                      [0, 1, 2, 3, 4, 1, nan, 3, 4, 5]])
    assert list(y) == ["a", "b"]
    X7, _ = load_ucr_ts(_write(tmp_path, _UNEQUAL), unequal_length="pad", n_points=7)
    assert X7.shape == (2, 14)
    np.testing.assert_array_equal(X7[1, :7], [0, 1, 2, 3, 4, nan, nan])
    with pytest.raises(ValueError, match="more than n_points=4"):
        load_ucr_ts(_write(tmp_path, _UNEQUAL), unequal_length="pad", n_points=4)


def test_ucr_unequal_lengths_resampled(tmp_path):
    p = _write(tmp_path, _UNEQUAL)
    X, _ = load_ucr_ts(p, unequal_length="resample")
    # the 3-point series stretched over 5 points; the 5-point one unchanged,
    # its missing value still missing
    np.testing.assert_allclose(X[0], [0, 0.5, 1, 1.5, 2, 5, 5.5, 6, 6.5, 7])
    np.testing.assert_array_equal(np.isnan(X[1]), [False] * 6 + [True] + [False] * 3)
    np.testing.assert_array_equal(X[1, [0, 1, 2, 3, 4, 5, 7, 8, 9]], [0, 1, 2, 3, 4, 1, 3, 4, 5])
    # onto another length: np.interp where no value is missing; a position
    # between a missing value and its neighbour is missing
    X4, _ = load_ucr_ts(p, unequal_length="resample", n_points=4)
    assert X4.shape == (2, 8)
    grid = np.linspace(0, 1, 4)
    np.testing.assert_allclose(X4[0, :4], np.interp(grid, np.linspace(0, 1, 3), [0, 1, 2]))
    np.testing.assert_allclose(X4[1, :4], np.interp(grid, np.linspace(0, 1, 5), [0, 1, 2, 3, 4]))
    np.testing.assert_array_equal(np.isnan(X4[1, 4:]), [False, True, False, False])
    np.testing.assert_allclose(X4[1, [4, 6, 7]], [1, 3 + 2 / 3, 5])


def test_ucr_resampled_points_on_observed_values_stay_observed(tmp_path):
    # floating positions k (m - 1) / (n - 1) miss whole numbers (0.999...);
    # the observed value there must not take the missing neighbour's NaN
    p = _write(tmp_path, "@classLabel true a\n@data\n?,1,2:a\n")
    X, _ = load_ucr_ts(p, unequal_length="resample", n_points=99)
    assert X[0, 49] == 1.0 and X[0, 98] == 2.0 and np.isnan(X[0, :49]).all()
    rng = np.random.default_rng(0)
    for m in range(2, 30):
        x = rng.normal(size=m)
        for n in (2, 3, 7, 50, 99):
            line = ",".join(repr(float(v)) for v in x)
            Xr, _ = load_ucr_ts(_write(tmp_path, f"@classLabel true a\n@data\n{line}:a\n"),
                                unequal_length="resample", n_points=n)
            np.testing.assert_allclose(Xr[0], np.interp(np.linspace(0, m - 1, n),
                                                        np.arange(m), x), atol=1e-12)


def test_ucr_unequal_channels_within_the_first_series_are_named(tmp_path):
    p = _write(tmp_path, "@classLabel true a b\n@data\n0,1,2,3:5,6:a\n0,1:1,2,3:b\n")
    with pytest.raises(ValueError, match=r"series 0's channels have lengths \[2, 4\]"):
        load_ucr_ts(p)


def test_ucr_equal_lengths_load_unchanged_whatever_the_option(tmp_path):
    p = _write(tmp_path, _UNIVARIATE)
    X, _ = load_ucr_ts(p)
    for how in ("raise", "resample", "pad"):
        Xh, _ = load_ucr_ts(p, unequal_length=how)
        np.testing.assert_array_equal(Xh, X)
    Xr, _ = load_ucr_ts(p, unequal_length="resample", n_points=7)
    np.testing.assert_allclose(Xr[0], np.linspace(1, 4, 7))
    with pytest.raises(ValueError, match="not n_points=7"):
        load_ucr_ts(p, n_points=7)


@pytest.mark.parametrize("kw, match", [
    (dict(unequal_length="truncate"), "unequal_length must be"),
    (dict(unequal_length="pad", n_points=0), r"n_points must be an integer >= 1 or None"),
    (dict(unequal_length="pad", n_points=2.5), r"n_points must be an integer >= 1 or None"),
    (dict(unequal_length="pad", n_points=True), r"n_points must be an integer >= 1 or None"),
    (dict(unequal_length="resample", n_points=1), "at least 2 points"),
    (dict(unequal_length=["pad"]), "unequal_length must be"),
])
def test_ucr_bad_unequal_length_options(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        load_ucr_ts(_write(tmp_path, _UNEQUAL), **kw)


def test_ucr_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_ucr_ts(tmp_path / "nope.ts")
    with pytest.raises(ValueError, match="is a folder"):
        load_ucr_ts(tmp_path)


def test_ucr_file_that_is_not_utf8_is_refused(tmp_path):
    # decoding with replacement used to turn both labels into U+FFFD: one class
    p = tmp_path / "latin1.ts"
    p.write_bytes("@classLabel true \u00e9 \u00e8\n@data\n1,2:\u00e9\n3,4:\u00e8\n"
                  .encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8 text"):
        load_ucr_ts(p)
    # a comment in another encoding is harmless (archive files carry cp1252
    # bytes in comments); a byte-order mark and CRLF line ends load too
    ok = tmp_path / "bom.ts"
    ok.write_bytes(b"\xef\xbb\xbf# caf\xe9 \x96 notes\r\n@classLabel true a b\r\n@data\r\n"
                   b"1,2:a\r\n3,4:b\r\n")
    X, y = load_ucr_ts(ok)
    assert X.shape == (2, 2) and list(y) == ["a", "b"]


def test_ucr_file_with_percent_comments_loads(tmp_path):
    # some archive files (e.g. the archive's UnitTest cut of ChinaTown) open
    # with ARFF-style "%" comment lines before the header
    p = tmp_path / "pct.ts"
    p.write_text("%# a cut-down problem\n% the test set is reduced\n%\n@problemName x\n"
                 "@classLabel true 1 2\n@data\n1,2,3:1\n% a note\n4,5,6:2\n")
    X, y = load_ucr_ts(p)
    assert X.shape == (2, 3) and list(y) == ["1", "2"]
    np.testing.assert_array_equal(X, [[1, 2, 3], [4, 5, 6]])
    # any other line before @data is still refused by name
    bad = tmp_path / "bad.ts"
    bad.write_text("; not a comment\n@classLabel true 1 2\n@data\n1,2:1\n")
    with pytest.raises(ValueError, match="expected a header line"):
        load_ucr_ts(bad)


@pytest.mark.parametrize(
    "name, shape_train, shape_test, n_classes",
    [
        ("GunPoint", (50, 150), (150, 150), 2),
        ("ItalyPowerDemand", (67, 24), (1029, 24), 2),
        ("BasicMotions", (40, 600), (40, 600), 4),
    ],
)
def test_ucr_real_files(name, shape_train, shape_test, n_classes):
    folder = UCR_DIR / name
    if not folder.is_dir():
        pytest.skip(f"UCR data folder {folder} is absent (shared developer data)")
    Xtr, ytr = load_ucr_ts(folder / f"{name}_TRAIN.ts")
    Xte, yte = load_ucr_ts(folder / f"{name}_TEST.ts")
    assert Xtr.shape == shape_train and Xte.shape == shape_test
    assert np.all(np.isfinite(Xtr)) and np.all(np.isfinite(Xte))
    assert len(np.unique(ytr)) == n_classes and set(yte) == set(ytr)


# ---------------------------------------------------------------------------
# stamping stand-in
# ---------------------------------------------------------------------------
def test_stamping_shapes_and_classes():
    X, y = make_stamping_waveforms(random_state=0)
    assert X.shape == (305 + 4 * 69, 4 * 1201)
    np.testing.assert_array_equal(np.bincount(y), [305, 69, 69, 69, 69])
    assert np.all(np.diff(y) >= 0)  # ordered by class
    assert np.all(np.isfinite(X))
    X2, y2 = make_stamping_waveforms(random_state=0)
    np.testing.assert_array_equal(X, X2)
    X3, _ = make_stamping_waveforms(random_state=1)
    assert not np.allclose(X, X3)


def test_stamping_faults_are_local_and_distinct():
    n_points = 401
    X, y = make_stamping_waveforms(50, 50, n_points=n_points, variation=0.0, noise=0.0,
                                   random_state=0)
    Xc = X.reshape(len(y), 4, n_points)
    # without variation or noise, cycles of one class are identical (up to the phase jitter)
    normal = Xc[y == 0].mean(axis=0)
    t = np.linspace(0, 1, n_points)
    centres = (0.30, 0.42, 0.55, 0.68)
    for k, c in enumerate(centres, start=1):
        diff = normal - Xc[y == k].mean(axis=0)  # load removed by the fault, (4, n_points)
        assert np.all(diff.max(axis=1) > 0.02), f"fault {k} too weak"
        # the change sits in its own region: at most 5 % of its energy farther than 0.1
        far = np.abs(t - c) > 0.1
        energy = (diff**2).sum(axis=1)
        assert np.all((diff[:, far] ** 2).sum(axis=1) < 0.05 * energy), f"fault {k} not local"


def test_stamping_variation_and_noise():
    X, y = make_stamping_waveforms(100, 5, n_points=201, variation=0.03, noise=0.01,
                                   random_state=0)
    Xn = X[y == 0]
    # cycle-to-cycle spread exists and is of the requested order near the peak
    sd = Xn.std(axis=0)
    assert 0.005 < np.median(sd) < 0.1
    X0, y0 = make_stamping_waveforms(100, 5, n_points=201, variation=0.0, noise=0.0,
                                     random_state=0)
    assert np.median(X0[y0 == 0].std(axis=0)) < np.median(sd)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_normal=0), "n_normal"),
        (dict(n_per_fault=1.5), "n_per_fault"),
        (dict(n_points=5), "n_points"),
        (dict(n_channels=0), "n_channels"),
        (dict(fault_size=1.0), "fault_size"),
        (dict(noise=-0.1), "noise"),
        (dict(variation=np.inf), "variation"),
    ],
)
def test_stamping_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_stamping_waveforms(**kwargs)
