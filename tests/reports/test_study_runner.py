"""scripts/run_study.py end to end on the CPU: two tiny arms side by side, stopped mid-training by a
SIGTERM to the runner (each run checkpoints), resumed by the same command to completion (one of them on a
"fresh machine": its work folder gone, it trains again from step 0); run.json records the calls, the source
commit and the corpus hash, and the resumed metrics log has no seam. The deadline
takes the same path as the signal (it is not timed here: a loaded CI machine makes timings unreliable)."""

from __future__ import annotations

import os
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
STEPS = 60
LOG_EVERY = 5


def tiny_data_config(tmp_path: Path) -> Path:
    text = (REPOSITORY / "configs" / "data" / "builtin.yaml").read_text()
    for old, new in (("seq_len: 256", "seq_len: 64"), ("builtin_vocab_size: 4096", "builtin_vocab_size: 512"),
                     ("builtin_corpus_mb: 8.0", "builtin_corpus_mb: 0.3"),
                     ("validation_fraction: 0.02", "validation_fraction: 0.2"),
                     ("validation_batches: 4", "validation_batches: 1")):
        assert old in text, old
        text = text.replace(old, new)
    text = "\n".join(f"cache_dir: {tmp_path / 'cache'}" if line.startswith("cache_dir:") else line
                     for line in text.splitlines())
    path = tmp_path / "data.yaml"
    path.write_text(text + "\n")
    return path


def study_file(tmp_path: Path) -> Path:
    data = ["data.builtin_vocab_size=512", "data.builtin_corpus_mb=0.3", f"data.cache_dir={tmp_path / 'cache'}",
            "data.seq_len=64", "data.validation_batches=1", "data.validation_fraction=0.2"]
    size = ["model=tiny", "model.vocab_size=512", *data, f"train.steps={STEPS}", "train.micro_batch_size=2",
            "train.global_batch_size=4", "train.eval_every=30", "train.eval_batches=1", f"logging.log_every={LOG_EVERY}",
            "logging.progress_bar=false"]
    results = tmp_path / "results"
    results.mkdir()
    path = results / "study.yaml"
    path.write_text(textwrap.dedent(f"""
        name: tiny
        reference: a
        seeds: [0]
        sizes:
          t: {{overrides: {json.dumps(size)}, arms: all}}
        arms:
          a: {{experiment: quickstart, overrides: [precision=bf16]}}
          b: {{experiment: quickstart, overrides: [precision=bf16, optim.lr=1.0e-3]}}
    """))
    return path


def run_study(*arguments: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPOSITORY / "scripts" / "run_study.py"), *arguments],
                          cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_runs_side_by_side_stop_on_a_signal_and_resume(tmp_path):
    import os
    import signal
    import time

    study = study_file(tmp_path)
    common = ["--study", str(study), "--work", str(tmp_path / "work"), "--prepared-dir", str(tmp_path / "prepared"),
              "--data-config", str(tiny_data_config(tmp_path)), "--parallel", "2", "--skip-steps", "0"]
    env = {**os.environ, "STUDY_SOURCE_COMMIT": "0123abc", "STUDY_SOURCE_DIRTY": "1", "PYTHONPATH": str(REPOSITORY)}
    first = subprocess.Popen([sys.executable, str(REPOSITORY / "scripts" / "run_study.py"), *common], cwd=REPOSITORY,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = [tmp_path / "work" / "t" / run / "seed0" / "metrics.jsonl" for run in ("a", "b")]
    deadline = time.monotonic() + 400
    while not all(path.is_file() and path.read_text().strip() for path in metrics):  # both are training
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    output = first.communicate(timeout=300)[0]
    assert first.returncode == 1 and "SIGTERM received: SIGTERM to 2 run(s)" in output, output
    for run in ("a", "b"):
        record = json.loads((study.parent / "t" / run / "seed0" / "run.json").read_text())
        assert record["status"] == "stopped" and record["calls"] == 1, output

    import shutil
    shutil.rmtree(tmp_path / "work" / "t" / "b")  # b's machine is gone, and its checkpoint with it
    second = run_study(*common, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "t/b/seed0: stopped earlier, and" in second.stdout and "t/b/seed0: no complete checkpoint" in second.stdout
    for run in ("a", "b"):
        folder = study.parent / "t" / run / "seed0"
        record = json.loads((folder / "run.json").read_text())
        assert record["status"] == "completed" and record["run"] == f"t/{run}/seed0" and record["exit_code"] == 0
        assert record["calls"] == 2 and len(record["sources_per_call"]) == 2
        assert record["side_by_side_per_call"] == [[f"t/{'b' if run == 'a' else 'a'}/seed0"]] * 2
        assert record["source"] == {"commit": "0123abc", "dirty": True, "from": "environment"}
        assert len(record["corpus"]["content_sha256"]) == 64 and record["corpus"]["tokens"]["train"] > 0
        for name in ("metrics.jsonl", "events.jsonl", "config.yaml", "train.log", "precision_plan.txt"):
            assert (folder / name).is_file(), name
        events = [json.loads(line)["event"] for line in (folder / "events.jsonl").read_text().splitlines()]
        # a resumed from its checkpoint; b trained again from step 0, its first history's lines set aside
        assert "preempted" in events and ("resumed" if run == "a" else "metrics_superseded") in events
        assert (folder / "metrics.superseded.jsonl").is_file() == (run == "b")
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        regular = [line for line in lines if not line.get("partial")]
        # no seam: every regular line averages log_every steps, the one after the resume too
        assert all("window_steps" not in line for line in regular)
        assert [line["step"] for line in regular if line["step"] % LOG_EVERY == 0] == list(
            range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert "completed in" in run_study(*common, env=env).stdout  # nothing is run twice


# ----------------------------------------------- the runner's bookkeeping, with stand-in trainer processes
def _stand_in_runner(monkeypatch, tmp_path: Path, behaviour):
    """study.runner with `python -m trainer` replaced by `behaviour(run, attempt, beside) -> (log text,
    exit code)` run in a short child process; corpus and machine description stubbed. Returns the study."""
    from study import runner as study_runner
    from study.definition import load_study

    attempts: dict = {}

    def start(run, work, shared, beside, echo):
        attempts[run.id] = attempts.get(run.id, 0) + 1
        run_dir = work / run.id
        text, code = behaviour(run, attempts[run.id], beside)
        log = open(run_dir / "train.log", "a")
        offset = (run_dir / "train.log").stat().st_size
        script = f"import sys, time; time.sleep(0.6); print({text!r}); sys.exit({code})"
        process = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)
        return study_runner._Running(run, process, log, beside, log_offset=offset)

    monkeypatch.setattr(study_runner, "_start", start)
    monkeypatch.setattr(study_runner, "prepare_corpus", lambda *args: {"content_sha256": "0" * 64})
    monkeypatch.setattr(study_runner, "source_state", lambda: {"commit": "abc", "dirty": False, "from": "git"})
    monkeypatch.setattr(study_runner, "machine_description", lambda: {"python": "3"})
    return load_study(study_file(tmp_path)), attempts


def test_a_run_out_of_gpu_memory_beside_others_is_queued_again_with_fewer_side_by_side(monkeypatch, tmp_path):
    from study.runner import completed, run_study

    def behaviour(run, attempt, beside):  # b runs out of memory while a is beside it, then fits alone
        if run.arm == "b" and attempt == 1:
            return "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB.", 1
        return "done", 0

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, behaviour)
    said = []
    code = run_study(study, study.runs(), work=tmp_path / "work", prepared_dir=tmp_path / "prepared", parallel=2,
                     echo=said.append)
    assert code == 0 and attempts == {"t/a/seed0": 1, "t/b/seed0": 2}, said
    assert any("t/b/seed0: out of GPU memory with 2 runs side by side: queued again, at most 1" in line
               for line in said), said
    assert all(completed(study.results / run.id) for run in study.runs())
    record = json.loads((study.results / "t" / "b" / "seed0" / "run.json").read_text())
    assert record["calls"] == 2 and record["side_by_side_per_call"][0] == ["t/a/seed0"]
    assert len(record["started_per_call"]) == 2  # one UTC start per call: the dates live in run.json, not in prose
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", date) for date in record["started_per_call"])


def test_out_of_memory_alone_is_a_failure_and_other_failures_are_not_retried(monkeypatch, tmp_path):
    from study.runner import run_study

    def behaviour(run, attempt, beside):
        return ("torch.OutOfMemoryError: CUDA out of memory.", 1) if run.arm == "b" else ("KeyError: 'x'", 1)

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, behaviour)
    said = []
    code = run_study(study, study.runs(), work=tmp_path / "work", prepared_dir=tmp_path / "prepared", parallel=2,
                     echo=said.append)
    # a's KeyError is no memory failure: not retried; b is retried once alone and fails again: a real failure
    assert code == 1 and attempts == {"t/a/seed0": 1, "t/b/seed0": 2}, said
    assert json.loads((study.results / "t" / "b" / "seed0" / "run.json").read_text())["status"] == "failed"


def test_a_run_completed_in_the_work_folder_is_copied_back_not_trained_again(monkeypatch, tmp_path):
    from study.runner import run_study

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, lambda run, attempt, beside: ("done", 0))
    work = tmp_path / "work"
    assert run_study(study, study.runs(), work=work, prepared_dir=tmp_path / "p", parallel=2, echo=lambda _: None) == 0
    folder = study.results / "t" / "a" / "seed0"
    kept = (folder / "run.json").read_text()
    for name in os.listdir(folder):  # the results tree replaced by a copy from before the runs
        os.remove(folder / name)
    said = []
    assert run_study(study, study.runs(), work=work, prepared_dir=tmp_path / "p", parallel=2, echo=said.append) == 0
    assert attempts == {"t/a/seed0": 1, "t/b/seed0": 1}, said
    assert (folder / "run.json").read_text() == kept and (folder / "train.log").is_file()
    assert any("t/a/seed0: completed in" in line and "copied there, not run again" in line for line in said), said


def test_a_stopped_run_whose_work_folder_is_gone_continues_its_record(monkeypatch, tmp_path):
    """A run stopped by one command, then a fresh machine (no work folder, so no checkpoint): the next
    command copies the results' record into the new work folder before training again, so calls and
    sources accumulate and the earlier metrics are there for the trainer to move aside, not overwritten."""
    import shutil
    from study.runner import run_study

    def behaviour(run, attempt, beside):
        return ("preempted at step 5: checkpoint saved", 0) if attempt == 1 else ("done", 0)

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, behaviour)
    work = tmp_path / "work"
    assert run_study(study, study.runs(), work=work, prepared_dir=tmp_path / "p", parallel=2, echo=lambda _: None) == 1
    folder = study.results / "t" / "a" / "seed0"
    assert json.loads((folder / "run.json").read_text())["status"] == "stopped"
    earlier = '{"step": 5, "loss": 3.0}\n'
    (folder / "metrics.jsonl").write_text(earlier)  # what the stopped launch logged
    shutil.rmtree(work)
    said = []
    assert run_study(study, study.runs(), work=work, prepared_dir=tmp_path / "p", parallel=2, echo=said.append) == 0
    assert any(line.startswith("t/a/seed0: stopped earlier, and") and "record copied there" in line for line in said)
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "completed" and record["calls"] == 2 and len(record["sources_per_call"]) == 2
    assert (work / "t" / "a" / "seed0" / "metrics.jsonl").read_text() == earlier  # the stand-in wrote none


def test_a_launch_killed_from_outside_is_counted_by_the_next(monkeypatch, tmp_path):
    """A runner killed with its run (the machine's time limit) leaves the run's launch mark, status "running";
    the next command counts that launch: a call more, its time to the last train.log write, killed_launches."""
    import time
    from study.runner import run_study

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, lambda run, attempt, beside: ("done", 0))
    run_dir = tmp_path / "work" / "t" / "a" / "seed0"
    run_dir.mkdir(parents=True)
    started = time.time() - 300
    (run_dir / "run.json").write_text(json.dumps({  # what _mark_launch left when the launch was killed
        "status": "running", "launch_started": started, "launch_beside": ["t/b/seed0"],
        "launch_source": {"commit": "killed", "dirty": False, "from": "environment"}}))
    (run_dir / "train.log").write_text("step 100\n")
    os.utime(run_dir / "train.log", (started + 120, started + 120))  # its last write, 120 s in
    said = []
    assert run_study(study, study.runs(), work=tmp_path / "work", prepared_dir=tmp_path / "p", parallel=1,
                     echo=said.append) == 0
    record = json.loads((study.results / "t" / "a" / "seed0" / "run.json").read_text())
    assert record["status"] == "completed" and record["calls"] == 2 and record["killed_launches"] == 1, said
    assert len(record["started_per_call"]) == 2  # the killed launch's date too
    assert 120 <= record["wall_s"] < 150 and [s["commit"] for s in record["sources_per_call"]] == ["killed", "abc"]
    assert record["side_by_side_per_call"] == [["t/b/seed0"], []]
    assert not any(key.startswith("launch_") for key in record)
    assert any("t/a/seed0: its launch of" in line and "counted as a call of 120 s" in line for line in said), said
    other = json.loads((study.results / "t" / "b" / "seed0" / "run.json").read_text())
    assert other["calls"] == 1 and "killed_launches" not in other


def test_a_runner_that_dies_leaves_its_launches_marked_and_the_next_command_counts_them(monkeypatch, tmp_path):
    """The runner dies (here: starting b raises) with a's launch under way: a's work run.json says "running";
    the next command counts that launch for a (and b's, marked before its start failed)."""
    import time
    from study import runner as study_runner

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, lambda run, attempt, beside: ("done", 0))
    real_start = study_runner._start
    monkeypatch.setattr(study_runner, "_start", lambda run, *args: (
        (_ for _ in ()).throw(RuntimeError("machine lost")) if run.arm == "b" and attempts.get(run.id) is None
        else real_start(run, *args)))
    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match="machine lost"):
        study_runner.run_study(study, study.runs(), work=work, prepared_dir=tmp_path / "p", parallel=2,
                               echo=lambda _: None)
    attempts["t/b/seed0"] = 0  # b starts normally from now on
    time.sleep(1.0)  # a's stand-in process ends, never collected
    marked = json.loads((work / "t" / "a" / "seed0" / "run.json").read_text())
    assert marked["status"] == "running" and marked["launch_beside"] == []
    monkeypatch.setattr(study_runner, "_start", real_start)
    said = []
    assert study_runner.run_study(study, study.runs(), work=work, prepared_dir=tmp_path / "p", parallel=2,
                                  echo=said.append) == 0
    for arm in ("a", "b"):
        record = json.loads((study.results / "t" / arm / "seed0" / "run.json").read_text())
        assert record["status"] == "completed" and record["calls"] == 2 and record["killed_launches"] == 1, said
    assert json.loads((study.results / "t" / "b" / "seed0" / "run.json").read_text())["side_by_side_per_call"][0] == [
        "t/a/seed0"]


def test_force_keeps_a_killed_launch_s_checkpoint_and_record(tmp_path):
    from study.runner import _work_folder
    from study.definition import load_study

    study = load_study(study_file(tmp_path))
    run = study.runs()[0]
    for status, kept in (("running", True), ("stopped", True), ("completed", False), ("failed", False)):
        folder = tmp_path / "work" / run.id
        (folder / "checkpoints" / "step_00000005").mkdir(parents=True, exist_ok=True)
        (folder / "run.json").write_text(json.dumps({"status": status, "calls": 1}))
        _work_folder(run, tmp_path / "work", force=True)
        assert (folder / "checkpoints").is_dir() == kept and folder.is_dir(), status
        _work_folder(run, tmp_path / "work", force=False)


def test_a_probe_s_record_is_not_continued_into_the_study_run(monkeypatch, tmp_path):
    from study.runner import continue_record_from_results

    study, _ = _stand_in_runner(monkeypatch, tmp_path, lambda run, attempt, beside: ("done", 0))
    run = study.runs()[0]
    folder = study.results / run.id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"status": "stopped", "calls": 1, "probe_overrides": ["train.steps=9"]}))
    said = []
    assert not continue_record_from_results(run, tmp_path / "work", study.results, said.append)
    assert continue_record_from_results(run, tmp_path / "work", study.results, said.append, ["train.steps=9"])
    assert (tmp_path / "work" / run.id / "run.json").is_file() and len(said) == 1


def test_an_earlier_launch_s_preempted_line_does_not_hide_a_failure(monkeypatch, tmp_path):
    """A launch stopped at the deadline ends train.log with "preempted at step"; the next launch dies writing
    nothing (say the kernel's OOM killer): that is a failure, read from this launch's part of the log."""
    from study.runner import run_study

    def behaviour(run, attempt, beside):
        return ("preempted at step 5: checkpoint saved", 0) if attempt == 1 else ("", -9)

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, behaviour)
    runs = study.select(["t/a/seed0"])
    work = tmp_path / "work"
    assert run_study(study, runs, work=work, prepared_dir=tmp_path / "p", parallel=1, echo=lambda _: None) == 1
    log = work / "t" / "a" / "seed0" / "train.log"
    log.write_text(log.read_text().rstrip("\n"))  # the killed launch writes no newline either
    assert run_study(study, runs, work=work, prepared_dir=tmp_path / "p", parallel=1, echo=lambda _: None) == 1
    assert json.loads((study.results / "t" / "a" / "seed0" / "run.json").read_text())["status"] == "failed"


def test_the_deadline_stops_the_runs_and_returns_with_runs_still_queued(monkeypatch, tmp_path):
    """One run at a time and a deadline inside the first: the runner stops it, leaves the second queued for
    the next command and returns (it once waited forever on the queue it would no longer start)."""
    import time
    from study import runner as study_runner

    study, attempts = _stand_in_runner(monkeypatch, tmp_path, lambda run, attempt, beside: ("done", 0))
    polls, sleep = [], time.sleep

    def counted_sleep(seconds):  # the runner polls every 0.5 s: 120 polls is a minute, a hang by then
        polls.append(seconds)
        if len(polls) > 120:
            raise RuntimeError("the runner did not return")
        sleep(seconds)

    monkeypatch.setattr(study_runner.time, "sleep", counted_sleep)
    said = []
    returned = [study_runner.run_study(study, study.runs(), work=tmp_path / "work", prepared_dir=tmp_path / "p",
                                       parallel=1, deadline_s=0.2, echo=said.append)]
    assert returned == [1], said
    assert attempts == {"t/a/seed0": 1}, said
    assert json.loads((study.results / "t" / "a" / "seed0" / "run.json").read_text())["status"] == "stopped"
    assert "t/b/seed0: not started, the runs were stopped" in said, said


def test_only_the_last_launch_s_out_of_memory_error_counts(tmp_path):
    from study.runner import ran_out_of_gpu_memory

    log = tmp_path / "train.log"
    log.write_text("step 10\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB.\n")
    earlier = log.stat().st_size
    assert ran_out_of_gpu_memory(log) and ran_out_of_gpu_memory(log, since=0)
    with open(log, "a") as handle:
        handle.write("resumed\nKeyError: 'optim'\n")
    assert not ran_out_of_gpu_memory(log, since=earlier)  # this launch failed otherwise
    assert not ran_out_of_gpu_memory(tmp_path / "absent.log")
