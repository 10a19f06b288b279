"""The main job ``python -m skfedgp`` (README set-up command (a)), run in-process."""

import re

import numpy as np
import pytest

from skfedgp.__main__ import METRICS, MODELS, client_averaged_metrics, main
from skfedgp.metrics import rmse


def _table_rows(text):
    """Parse the metrics table printed by the main job into {model: [values]}."""
    rows = {}
    for name, _ in MODELS:
        match = re.search(rf"^{re.escape(name)}\s+(.*)$", text, flags=re.MULTILINE)
        assert match is not None, f"no table row for {name!r} in the output:\n{text}"
        fields = match.group(1).split()
        rows[name] = [float(v) for v in fields[: len(METRICS)]]
    return rows


def test_main_job_prints_table_and_saves_png(tmp_path, capsys):
    out_png = tmp_path / "x.png"
    status = main(["--rounds", "2", "--seed", "1", "--output", str(out_png), "--quiet"])
    assert status == 0
    with open(out_png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert out_png.stat().st_size > 10_000  # a real multi-panel figure, not an empty canvas

    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("model") and "RMSE" in line)
    assert header.split()[1 : 1 + len(METRICS)] == list(METRICS)
    rows = _table_rows(text)
    for name, values in rows.items():
        metrics = dict(zip(METRICS, values))
        assert np.all(np.isfinite(values)), name
        assert metrics["RMSE"] > 0 and metrics["CRPS"] > 0 and metrics["width_95"] > 0, name
        assert 0.0 <= metrics["coverage_95"] <= 1.0, name
    # --quiet suppresses the per-round progress lines of the estimator
    assert "[skfedgp] round" not in text
    assert "Communication" in text and str(out_png) in text
    # the rounds column is the rounds run (n_iter_; the final exchange is no round)
    comm = text[text.index("Communication"):].splitlines()
    for name, _ in MODELS:
        row = next(line for line in comm if line.startswith(name + " "))
        assert 1 <= int(row.split()[1]) <= 2, row


def test_main_job_refuses_a_folder_as_output(tmp_path, capsys):
    folder = tmp_path / "x.png"
    folder.mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["--output", str(folder)])
    assert exc.value.code == 2 and "names a folder" in capsys.readouterr().err


def test_main_job_verbose_prints_rounds(tmp_path, capsys):
    main(["--rounds", "2", "--output", str(tmp_path / "v.png")])
    text = capsys.readouterr().out
    # at most two rounds for each of the three models (each stops earlier once
    # converged), and for pFedHGP's second run when it trains one from the
    # global-only fit (restart_from_global; the global-only fit prints one line)
    n = len(re.findall(r"^\[skfedgp\] round", text, flags=re.MULTILINE))
    second = "training the full model again" in text
    assert len(MODELS) <= n <= 2 * len(MODELS) + 2 * second
    assert len(re.findall(r"^\[skfedgp\] global-only fit", text, flags=re.MULTILINE)) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rounds", "0"], "--rounds"),
        (["--local-steps", "5"], "unrecognized arguments"),
        (["--output", "figure.pdf"], ".png"),
        (["--output", "/nonexistent-skfedgp-dir/x.png"], "does not exist"),
        (["--seed", "-1"], "must be >= 0"),
        (["--seed", "99999999999"], "must be <= 4294967295"),
    ],
)
def test_main_job_rejects_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_client_averaged_metrics_is_mean_over_clients():
    rng = np.random.default_rng(0)
    # two clients of different sizes: a pooled RMSE would weight client 0 more
    groups = np.repeat([0, 1], [30, 10])
    y = rng.normal(size=40)
    mean = y + np.where(groups == 0, 0.1, 1.0) * rng.normal(size=40)
    std = np.full(40, 0.5)
    got = client_averaged_metrics(y, mean, std, groups)
    per_client = [rmse(y[groups == g], mean[groups == g]) for g in (0, 1)]
    assert got["RMSE"] == pytest.approx(np.mean(per_client))
    assert got["RMSE"] != pytest.approx(rmse(y, mean))
    assert set(got) == set(METRICS)


@pytest.mark.parametrize("seed", [0, 3])
def test_main_job_full_model_beats_ablations_on_held_out_nll(seed, tmp_path, capsys):
    """The embedded problem is one where sharing matters (issue: seeds 0-4 all hold;
    two are checked here, all five in the benchmark note of the README)."""
    main(["--seed", str(seed), "--output", str(tmp_path / "s.png"), "--quiet"])
    rows = _table_rows(capsys.readouterr().out)
    nll = {name: dict(zip(METRICS, values))["NLL"] for name, values in rows.items()}
    assert nll["pFedHGP"] < nll["Local-only"] and nll["pFedHGP"] < nll["Global-only"]


def test_main_job_checks_that_output_is_writable_before_fitting(tmp_path, capsys):
    target = tmp_path / "read-only" / "x.png"
    target.parent.mkdir()
    target.parent.chmod(0o500)  # read-only folder (root ignores it: then /proc below)
    for path in (target, "/proc/skfedgp-test.png"):
        try:
            open(path, "ab").close()
        except OSError:
            with pytest.raises(SystemExit) as exc:
                main(["--rounds", "1", "--quiet", "--output", str(path)])
            assert exc.value.code == 2
            assert "--output cannot be written" in capsys.readouterr().err
            return
    pytest.skip("every candidate path is writable here")
