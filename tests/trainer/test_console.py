"""What a person sees in the terminal: the precision plan and the events above the progress bar, each on its
own line; event numbers rounded there (whole in events.jsonl); a warning on a line of its own, never glued
onto the bar with the source line `return func(*args, **kwargs)` of torch's decorator; and no warning at all
from a one-process run's checkpoint (DCP's "torch.distributed is disabled" is the run's intent)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

from trainer.config import compose
from trainer.metrics import MetricsLogger
from trainer_testing import ROOT, read_jsonl, tiny_overrides


def _segments(text: str) -> list:
    """The console's lines as a terminal draws them: a carriage return starts the line over."""
    return [part for line in text.split("\n") for part in line.split("\r")]


def test_a_warning_while_the_bar_is_drawn_gets_its_own_line_and_no_source_line(tmp_path, data_cache, capsys):
    cfg = compose(tiny_overrides(data_cache) + ["logging.progress_bar=true"])
    before = warnings.showwarning
    logger = MetricsLogger(cfg, tmp_path, is_main=True, total_steps=4)
    try:
        logger.advance()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("something the user should read", UserWarning)
        logger.echo("Precision plan: ...")
        logger.event(1, "plan_check", planned_step_time_s=0.6988886899014753, device="CPU", steps=3)
    finally:
        logger.close()
    assert warnings.showwarning is before  # given back at close
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    warning = [s for s in _segments(err) if "something the user should read" in s]
    assert len(warning) == 1, warning
    assert re.fullmatch(r"\S+test_console\.py:\d+: UserWarning: something the user should read", warning[0].strip())
    assert "return func" not in err and "warnings.warn(" not in err
    assert "Precision plan: ..." in _segments(out)
    assert "[step 1] plan_check: planned_step_time_s=0.6989, device=CPU, steps=3" in _segments(out)
    event = read_jsonl(tmp_path / "events.jsonl")[-1]
    assert event["planned_step_time_s"] == 0.6988886899014753  # the file keeps every digit


def test_event_numbers_are_rounded_on_the_console_only(tmp_path, data_cache, capsys):
    cfg = compose(tiny_overrides(data_cache))  # no bar: events are printed
    logger = MetricsLogger(cfg, tmp_path, is_main=True, total_steps=4)
    logger.event(2, "plan_check", planned_step_time_s=0.6988886899014753, step_time_ratio=12.007869187079955,
                 device="CPU", tokens=6144)
    logger.close()
    printed = capsys.readouterr().out.strip()
    assert printed == "[step 2] plan_check: planned_step_time_s=0.6989, step_time_ratio=12.01, device=CPU, tokens=6144"
    assert read_jsonl(tmp_path / "events.jsonl")[-1]["step_time_ratio"] == 12.007869187079955


def test_the_quickstart_console_has_the_plan_and_events_on_their_own_lines_and_no_warning(tmp_path, data_cache):
    """`python -m trainer` as a person runs it (bar on, stdout and stderr on one terminal), a run that checkpoints
    and is shorter than its warm-up: the plan, the rounded plan_check and the warm-up warning each start a line."""
    overrides = tiny_overrides(data_cache, steps=3) + [
        "logging.progress_bar=true", "optim.warmup_steps=5", "checkpoint.every=2", f"run_dir={tmp_path / 'run'}"]
    result = subprocess.run([sys.executable, "-m", "trainer", *overrides], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:]
    lines = _segments(result.stdout)
    assert "Warning" not in result.stdout and "return func" not in result.stdout, result.stdout[-3000:]
    assert any(line.startswith("Precision plan: ") for line in lines)
    plan_check = next(line for line in lines if " plan_check: " in line)
    assert plan_check.startswith("[step ") and re.search(r"planned_step_time_s=[\d.e+-]{1,10},", plan_check)
    assert all(len(number.replace(".", "").lstrip("0")) <= 4
               for number in re.findall(r"=(\d+\.\d+)(?=,|$)", plan_check)), plan_check
    warning = next(line for line in lines if " lr_schedule_warning: " in line)
    assert warning.startswith("[step 0] lr_schedule_warning: warmup_steps=5, steps=3, "), warning
    events = {e["event"]: e for e in read_jsonl(tmp_path / "run" / "events.jsonl")}
    assert events["lr_schedule_warning"]["last_lr"] == json.loads(
        (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["lr"]
