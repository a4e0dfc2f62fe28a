"""reports.compare_runs (its command line: `python -m reports.compare_runs`) on synthetic runs whose relative
difference is known by construction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reports import compare_runs
from scripts_testing import run_script

STEPS = 200
WARMUP, DECAY_START = 10, 160  # lr rises for 10 steps, is flat until step 160, decays linearly after
TOKENS_PER_STEP = 4096 * 8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def lr_at(step: int) -> float:
    if step <= WARMUP:
        return 3e-4 * step / WARMUP
    if step <= DECAY_START:
        return 3e-4
    return 3e-4 * (1 - (step - DECAY_START) / (STEPS - DECAY_START + 1))


def loss_at(step: int) -> float:
    return 2.5 + 6.0 / math.sqrt(step) + 0.05 * math.sin(step)  # noisy-looking but known exactly


def write_run(directory, factor_stable: float, factor_decay: float, *, log_every: int = 1, extra_lines=(),
              nan_at=None):
    """A trainer-like metrics.jsonl: loss = factor x reference loss (stable / decay factor)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = list(extra_lines)
    for step in range(log_every, STEPS + 1, log_every):
        factor = factor_stable if step <= DECAY_START else factor_decay
        record = {"step": step, "tokens": step * TOKENS_PER_STEP, "loss": factor * loss_at(step), "lr": lr_at(step),
                  "grad_norm": 1.0, "tokens_per_s": 1e5, "step_time_s": 0.3, "mfu": 0.4, "skipped_steps": 0}
        if step == nan_at:
            record["loss"] = "nan"  # how trainer.metrics writes a non-finite loss
        if step % 20 == 0:
            record["val_loss"] = factor * (loss_at(step) + 0.1)
        lines.append(json.dumps(record))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_known_relative_difference_in_stable_and_decay_phases(tmp_path, capsys):
    run_a = write_run(tmp_path / "fp8", 1.0, 1.0, nan_at=77)
    # B was resumed from step 50: its first attempt at steps 41..60 was logged and superseded.
    stale = [json.dumps({"step": s, "tokens": s * TOKENS_PER_STEP, "loss": 99.0, "lr": lr_at(s)}) for s in range(41, 61)]
    run_b = write_run(tmp_path / "nvfp4", 1.01, 1.02)
    lines = (run_b / "metrics.jsonl").read_text().splitlines()
    (run_b / "metrics.jsonl").write_text("\n".join(lines[:40] + stale + lines[40:]) + "\n")

    out = tmp_path / "plots" / "compare.png"
    summary = compare_runs.compare_runs([run_a, run_b], out=out, val=True, json_path=tmp_path / "s.json")
    printed = capsys.readouterr().out

    assert summary["phases"]["decay_start_tokens"] == DECAY_START * TOKENS_PER_STEP
    assert summary["phases"]["stable_start_tokens"] == WARMUP * TOKENS_PER_STEP
    (loss,) = summary["metrics"]["loss"]
    assert loss["stable_mean"] == pytest.approx(0.01, abs=1e-12)
    assert loss["decay_mean"] == pytest.approx(0.02, abs=1e-12)
    assert loss["final"] == pytest.approx(0.02, abs=1e-12)
    assert loss["points"] == STEPS - 1  # A's NaN point is dropped, not compared
    (val,) = summary["metrics"]["val_loss"]
    assert val["stable_mean"] == pytest.approx(0.01, abs=1e-12) and val["decay_mean"] == pytest.approx(0.02, abs=1e-12)
    assert "+1.000%" in printed and "+2.000%" in printed and "1 non-finite loss value(s) dropped" in printed
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 10_000
    assert json.loads((tmp_path / "s.json").read_text())["metrics"]["loss"][0]["decay_mean"] == pytest.approx(0.02)


def test_several_runs_smoothing_and_coarser_grid(tmp_path):
    """B = c A survives linear smoothing; A on a coarser grid than B still aligns exactly on A's points."""
    run_a = write_run(tmp_path / "a", 1.0, 1.0, log_every=5)
    run_b = write_run(tmp_path / "b", 0.99, 0.99)
    run_c = write_run(tmp_path / "c", 1.005, 1.005)
    for smoothing in ("window:5", "ema:0.9"):
        # Smoothing runs on each run's own points, so on different grids B != c A after smoothing;
        # compare on equal grids for the exact check.
        summary = compare_runs.compare_runs([run_b, run_c], smoothing=smoothing, out=tmp_path / "s.png")
        (entry,) = summary["metrics"]["loss"]
        assert entry["stable_mean"] == pytest.approx(1.005 / 0.99 - 1, abs=1e-12)
    summary = compare_runs.compare_runs([run_a, run_b, run_c], labels=["A", "B", "C"], out=tmp_path / "abc.png")
    by_run = {entry["run"]: entry for entry in summary["metrics"]["loss"]}
    assert by_run["B"]["stable_mean"] == pytest.approx(-0.01, abs=1e-12)
    assert by_run["C"]["decay_mean"] == pytest.approx(0.005, abs=1e-12)
    assert by_run["B"]["points"] == STEPS // 5


def test_align_interpolates_b_onto_a_inside_the_overlap():
    tokens_a = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    tokens_b = np.array([5.0, 15.0, 25.0, 35.0, 45.0])
    values_b = 2.0 * tokens_b + 1.0  # linear: interpolation is exact
    grid, _, b_on_a = compare_runs.align(tokens_a, tokens_a * 0 + 1, tokens_b, values_b)
    assert grid.tolist() == [10.0, 20.0, 30.0, 40.0]  # 0 lies before B starts: not extrapolated
    assert b_on_a.tolist() == [21.0, 41.0, 61.0, 81.0]
    with pytest.raises(ValueError, match="do not overlap"):
        compare_runs.align(tokens_a, tokens_a, tokens_a + 100, tokens_a)


def test_smoothing_definitions():
    values = np.array([1.0, 3.0, 5.0, 7.0])
    assert compare_runs.smooth(values, "ema:0.5").tolist() == [1.0, 2.0, 3.5, 5.25]
    assert compare_runs.smooth(values, "window:3").tolist() == [2.0, 3.0, 5.0, 6.0]
    assert compare_runs.smooth(values, "none").tolist() == values.tolist()
    for bad in ("ema:1.5", "window:0", "gauss:3", "ema:x"):
        with pytest.raises(ValueError, match="--smooth"):
            compare_runs.smooth(values, bad)


def test_decay_start_override_and_runs_without_lr(tmp_path):
    run_a, run_b = write_run(tmp_path / "a", 1.0, 1.0), write_run(tmp_path / "b", 1.01, 1.02)
    summary = compare_runs.compare_runs([run_a, run_b], decay_start_tokens=180 * TOKENS_PER_STEP, out=tmp_path / "o.png")
    (entry,) = summary["metrics"]["loss"]
    assert entry["decay_mean"] == pytest.approx(0.02, abs=1e-12)  # steps 181..200 are all in B's decay
    # Steps 10..180: 151 at +1% and 20 at +2%.
    assert entry["stable_mean"] == pytest.approx((151 * 0.01 + 20 * 0.02) / 171, abs=1e-12)
    for directory in (run_a, run_b):
        lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
        (directory / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "lr"}) + "\n"
                                                         for r in lines))
    summary = compare_runs.compare_runs([str(run_a / "metrics.jsonl"), str(run_b)], out=tmp_path / "p.png")
    (entry,) = summary["metrics"]["loss"]
    assert entry["decay_mean"] is None
    assert entry["stable_mean"] == pytest.approx((160 * 0.01 + 40 * 0.02) / 200, abs=1e-12)


def test_wandb_history_file_is_read(tmp_path):
    run_a = write_run(tmp_path / "a", 1.0, 1.0)
    files = tmp_path / "b" / "wandb" / "offline-run-20250101_000000-abc" / "files"
    files.mkdir(parents=True)
    with open(files / "wandb-history.jsonl", "w") as handle:
        for step in range(1, STEPS + 1):
            handle.write(json.dumps({"_step": step, "tokens": step * TOKENS_PER_STEP,
                                     "train/loss": 1.03 * loss_at(step), "train/lr": lr_at(step),
                                     "val/loss": 1.1 * loss_at(step)}) + "\n")
    run = compare_runs.load_run(str(tmp_path / "b"))
    assert run.records[0]["step"] == 1 and "loss" in run.records[0] and "lr" in run.records[0]
    assert run.records[0]["val_loss"] == pytest.approx(1.1 * loss_at(1))  # the trainer logs val/loss
    summary = compare_runs.compare_runs([str(run_a), str(tmp_path / "b")], out=tmp_path / "w.png")
    assert summary["metrics"]["loss"][0]["stable_mean"] == pytest.approx(0.03, abs=1e-12)


def test_bad_runs_fail_naming_the_culprit(tmp_path):
    good = write_run(tmp_path / "good", 1.0, 1.0)
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "metrics.jsonl").write_text('{"step": 1, "tokens": 5, "loss": 3.0}\n{"step": 2, oops\n')
    with pytest.raises(ValueError, match=r"bad_json/metrics.jsonl:2"):
        compare_runs.compare_runs([str(good), str(bad_json)], out=tmp_path / "x.png")
    no_tokens = tmp_path / "no_tokens"
    no_tokens.mkdir()
    (no_tokens / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    with pytest.raises(ValueError, match="tokens"):
        compare_runs.load_run(str(no_tokens))
    binary_only = tmp_path / "binary" / "wandb" / "offline-run-x"
    binary_only.mkdir(parents=True)
    (binary_only / "run-x.wandb").write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match="wandb sync"):
        compare_runs.load_run(str(tmp_path / "binary"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        compare_runs.load_run(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="--wandb-online"):
        compare_runs.load_run("wandb:me/project/abc")
    with pytest.raises(SystemExit):
        run_script("reports.compare_runs", good)  # one run is nothing to compare


def test_wandb_report_logs_the_figure_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_a, run_b = write_run(tmp_path / "a", 1.0, 1.0), write_run(tmp_path / "b", 1.01, 1.02)
    summary = compare_runs.compare_runs([str(run_a), str(run_b)], out=tmp_path / "report" / "c.png", wandb_report=True)
    images = list((tmp_path / "report" / "wandb").glob("offline-run-*/files/media/images/compare_runs/*.png"))
    assert len(images) == 1 and images[0].read_bytes()[:8] == PNG_MAGIC
    assert summary["wandb_dir"].startswith(str(tmp_path / "report" / "wandb"))


def test_noise_band_is_the_seed_twins_difference(tmp_path, capsys):
    write_run(tmp_path / "a", 1.0, 1.0)
    write_run(tmp_path / "b", 1.02, 1.03)
    write_run(tmp_path / "twin", 0.995, 1.004)  # the reference with another seed: 0.5% / 0.4% apart
    summary = compare_runs.compare_runs([str(tmp_path / "a"), str(tmp_path / "b")], noise=str(tmp_path / "twin"),
                                         out=tmp_path / "plot.png")
    band = summary["noise"]["loss"]
    assert band["stable_mean"] == pytest.approx(0.005, abs=1e-9) and band["decay_mean"] == pytest.approx(0.004, abs=1e-9)
    assert "noise +-" in capsys.readouterr().out
    assert (tmp_path / "plot.png").read_bytes()[:8] == PNG_MAGIC


def _short_run(directory, steps: int, decay_start: int, val_every: int, factor: float = 1.0):
    """A run of ``steps`` with its own WSD schedule (warm-up 3 steps, decay after ``decay_start``)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, steps + 1):
        lr = 3e-3 * min(1.0, step / 3) if step <= decay_start else 3e-3 * (steps - step + 1) / (steps - decay_start + 1)
        record = {"step": step, "tokens": step * TOKENS_PER_STEP, "loss": factor * loss_at(step), "lr": lr}
        if step % val_every == 0:
            record["val_loss"] = factor * (loss_at(step) + 0.1)
        lines.append(json.dumps(record))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_each_run_has_its_own_lr_phases_and_a_phase_counts_where_both_runs_are_in_it(tmp_path, capsys, monkeypatch):
    """A 30-step reference (decay after step 24) against a 200-step run (decay after 160): the reference's decay
    is B's stable phase, so no point of the overlap is in both runs' decay; B's decay is shaded from its own
    step 160 in its colour, not from the reference's step 24 to B's end."""
    reference = _short_run(tmp_path / "short", 30, 24, val_every=10)
    long_run = _short_run(tmp_path / "long", 200, 160, val_every=10, factor=1.01)
    spans = []
    import matplotlib.axes

    original = matplotlib.axes.Axes.axvspan
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan",
                        lambda self, start, end, **kw: spans.append((start, end)) or original(self, start, end, **kw))
    summary = compare_runs.compare_runs([reference, long_run], out=tmp_path / "p.png", json_path=tmp_path / "s.json")
    printed = capsys.readouterr().out
    (loss,) = summary["metrics"]["loss"]
    assert loss["stable_mean"] == pytest.approx(0.01, abs=1e-12) and loss["decay_mean"] is None
    per_run = summary["phases"]["per_run"]
    assert per_run["short"]["decay_start_tokens"] == 24 * TOKENS_PER_STEP
    assert per_run["long"]["decay_start_tokens"] == 160 * TOKENS_PER_STEP
    assert "phases differ between the runs" in printed and "long: stable from" in printed
    assert set(spans) == {(24 * TOKENS_PER_STEP, 30 * TOKENS_PER_STEP), (160 * TOKENS_PER_STEP, 200 * TOKENS_PER_STEP)}


def test_runs_of_one_schedule_print_one_set_of_phases(tmp_path, capsys):
    compare_runs.compare_runs([write_run(tmp_path / "a", 1.0, 1.0), write_run(tmp_path / "b", 1.01, 1.02)],
                              out=tmp_path / "p.png")
    assert "phases (from a's lr, the same in every run): stable from" in capsys.readouterr().out


def test_validation_points_that_do_not_overlap_are_named_as_such_and_the_training_loss_still_compares(tmp_path, capsys):
    """A validated only at step 30, B every 50 steps from step 50: no validation point in common."""
    reference = _short_run(tmp_path / "ref", 30, 24, val_every=30)
    other = _short_run(tmp_path / "other", 200, 160, val_every=50, factor=1.01)
    summary = compare_runs.compare_runs([reference, other], out=tmp_path / "p.png", val=True)
    printed = capsys.readouterr().out
    assert "val_loss" not in summary["metrics"] and summary["metrics"]["loss"][0]["points"] == 30
    assert "note: --val: the validation points of ref (tokens 9.83e+05..9.83e+05, 1) and other" in printed
    assert "do not overlap: validation ran at other steps; other's val_loss is not compared" in printed


def test_the_command_line_answers_help_as_an_installed_module():
    printed = run_script("reports.compare_runs", "--help").stdout
    assert printed.startswith("usage: python -m reports.compare_runs") and "--val" in printed
