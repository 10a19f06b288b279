"""The Beijing PM2.5 example (``examples/beijing_pm25.py``) on the real data, tiny settings."""

import contextlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "beijing_pm25.py"
DATA_DIR = REPO.parent / "shared" / "data" / "beijing_air_quality"
STATIONS = ["Dingling", "Dongsi", "Shunyi"]

pytestmark = pytest.mark.skipif(
    not any(DATA_DIR.glob("PRSA_Data_*.csv*")) if DATA_DIR.is_dir() else True,
    reason=f"Beijing air-quality data not found in {DATA_DIR} (the real data set lives "
    "outside the repository, in <repo>/../shared/data/beijing_air_quality)",
)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("beijing_pm25_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_run(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("beijing") / "fig.png"
    argv = [
        "--data-dir", str(DATA_DIR), "--stations", *STATIONS, "--station", "Dongsi",
        "--rounds", "2", "--local-steps", "3", "--n-inducing", "32",
        "--n-inducing-local", "8", "--gpr-restarts", "0", "--seed", "3",
        "--output", str(out),
    ]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = example.main(argv)
    return result, out, buf.getvalue()


def test_table_has_four_methods_and_finite_metrics(example, tiny_run):
    result, _, _ = tiny_run
    table = result["table"]
    assert list(table.index) == list(example.METHODS)
    assert len(example.METHODS) == 4
    assert list(table.columns[: len(example.METRICS)]) == list(example.METRICS)
    values = table[list(example.METRICS)].to_numpy()
    assert np.all(np.isfinite(values))
    assert np.all((table["coverage_95"] >= 0) & (table["coverage_95"] <= 1))
    assert np.all(table[["RMSE", "CRPS", "width_95"]].to_numpy() > 0)
    # one row per (method, station) behind the averages
    per = result["per_station"]
    assert sorted(per["station"].unique()) == STATIONS
    assert len(per) == 4 * len(STATIONS)


def test_printed_output_names_log_scale_and_methods(example, tiny_run):
    _, out, text = tiny_run
    assert "log(PM2.5)" in text
    # the first and last dates read (the one-year files here)
    assert "readings at 02:00 and 14:00, 2013-03-01..2014-02-28" in text
    lines = text.splitlines()
    for name in example.METHODS:
        # a table row starting with the method name, followed by numbers
        row = next((ln for ln in lines if ln.startswith(name + " ")), None)
        assert row is not None, f"no table row for {name!r} in:\n{text}"
        fields = row[len(name):].split()
        assert len(fields) >= len(example.METRICS)
        assert all(np.isfinite(float(v)) for v in fields[: len(example.METRICS)])
    assert str(out) in text


def test_png_written(tiny_run):
    _, out, _ = tiny_run
    assert out.exists()
    with open(out, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_day_split_holds_out_whole_days(example):
    from skfedgp.datasets import load_beijing_air_quality

    data = load_beijing_air_quality(DATA_DIR, stations=STATIONS)
    frame = data.frame
    test = example.split_days(frame, 0.2, seed=5)
    day = np.floor(frame["time_days"].to_numpy()).astype(int)
    for s in STATIONS:
        rows = (frame["station"] == s).to_numpy()
        test_days = set(day[rows & test])
        train_days = set(day[rows & ~test])
        assert not test_days & train_days  # both readings of a held-out day are in test
        frac = len(test_days) / len(test_days | train_days)
        assert abs(frac - 0.2) < 0.01
    # seeded: same seed, same split; another seed, another split
    assert np.array_equal(test, example.split_days(frame, 0.2, seed=5))
    assert not np.array_equal(test, example.split_days(frame, 0.2, seed=6))


def test_checkpoint_dir_resumes_an_interrupted_run_exactly(example, tmp_path, monkeypatch):
    from skfedgp.federated import TrainingState

    argv = ["--data-dir", str(DATA_DIR), "--stations", *STATIONS[:2], "--station", "Dongsi",
            "--rounds", "3", "--local-steps", "3", "--n-inducing", "16",
            "--n-inducing-local", "6", "--gpr-restarts", "0", "--seed", "1"]

    def run(folder, name):
        with contextlib.redirect_stdout(io.StringIO()):
            return example.main(argv + ["--checkpoint-dir", str(tmp_path / folder),
                                        "--output", str(tmp_path / name)])

    whole = run("whole", "a.png")
    save = TrainingState.save

    def interrupted(self, path):
        save(self, path)
        if self.round == 1 and "pfedhgp" in str(path):
            raise KeyboardInterrupt("simulated interruption after round 1")

    monkeypatch.setattr(TrainingState, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run("cut", "b.png")
    assert (tmp_path / "cut" / "pfedhgp.state.joblib").exists()
    assert not (tmp_path / "cut" / "pfedhgp.fitted.joblib").exists()
    monkeypatch.setattr(TrainingState, "save", save)
    resumed = run("cut", "b.png")
    a, b = whole["models"]["pFedHGP"], resumed["models"]["pFedHGP"]
    np.testing.assert_array_equal(a.elbo_history_, b.elbo_history_)
    np.testing.assert_array_equal(a.server_.theta_global, b.server_.theta_global)
    cols = list(example.METRICS)
    np.testing.assert_array_equal(whole["table"][cols].to_numpy(),
                                  resumed["table"][cols].to_numpy())
    # a finished fit is reused; other options are refused
    again = run("cut", "c.png")
    np.testing.assert_array_equal(again["models"]["pFedHGP"].elbo_history_, b.elbo_history_)
    with pytest.raises(SystemExit, match="other options"):
        with contextlib.redirect_stdout(io.StringIO()):
            example.main(argv[:-1] + ["2", "--checkpoint-dir", str(tmp_path / "cut"),
                                      "--output", str(tmp_path / "d.png")])


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
@pytest.mark.parametrize("n_rounds", [None, 7])
def test_rounds_left_resolves_the_default_budget(example, optimizer, n_rounds):
    # a run at the default n_rounds=None must be resumable: the budget is the
    # estimator's own resolved default, less the rounds already done
    from types import SimpleNamespace

    from skfedgp import FederatedHierarchicalGPRegressor

    est = FederatedHierarchicalGPRegressor(n_rounds=n_rounds, optimizer=optimizer)
    budget = est._check_params()[1]
    assert example._rounds_left(est, SimpleNamespace(round=3)) == budget - 3
