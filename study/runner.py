"""Run a study's runs on one GPU, packed side by side, resumable; record what each ran on.

A model of the study's size leaves most of an H200 idle, so several `python -m trainer`
processes share it (docs/study.md has the aggregate tokens/s). The runner:

1. prepares the corpus once into ``prepared_dir`` (python -m trainer.prepare_data, all cores) and
   hashes what it holds (tokenizer and shard checksums, data.shards.content_sha256: the same
   tokens prepared again give the same hash), so every run records which tokens it trained on;
2. keeps up to ``parallel`` runs going, starting the next as one ends; a run is not started when
   the deadline would cut it (its expected wall time, from finished runs of the same size and arm,
   is longer than what is left). A run that fails for want of GPU memory while others share the
   GPU is queued again and ``parallel`` drops to one fewer than were running (runs failing in the
   same moment count once): a card smaller than the one the study was planned on loses no run, it
   runs fewer side by side. A run completed in
   ``work`` whose files are missing from the results (a results tree replaced by an older copy)
   is copied back, never trained again;
3. at the deadline, or when the runner itself gets SIGTERM or SIGINT (a scheduler's preemption,
   Ctrl-C), sends every run SIGTERM: the trainer checkpoints and exits, and a later call with the
   same ``work`` folder resumes it (the metrics window is checkpointed too: no seam); runs still
   queued are not started, and the runner returns once the stopped runs have exited;
4. copies each run's metrics.jsonl, events.jsonl, precision_plan.txt, config.yaml, train.log, a
   run.json and any metrics.superseded.jsonl into ``<results>/<size>/<arm>/seed<k>/``. A run not
   completed whose work folder is gone (a fresh machine: no checkpoint) starts from those files, so
   it trains again from step 0 with its record continued and its earlier metrics set aside.

run.json: the run's id, size, arm, seed, status ("completed", "stopped", "failed"; "running" in the
work folder while a launch is under way), the trainer command, exit code, wall time and calls
(accumulated over launches: resumes, retries, and launches killed from outside, counted by the next
launch as "killed_launches" with their time up to their last log write), what ran
beside it in each call, the median tokens/s, the GPU and versions, the source commit of each call
(the STUDY_SOURCE_COMMIT / STUDY_SOURCE_DIRTY environment variables of a copied tree, else git's),
the start of each launch in UTC ("started_per_call"; records older than the field have fewer dates than
calls, and the report reads their dates from events.jsonl), and the prepared corpus's content hash and
token counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from study.definition import Study, StudyRun
from trainer.checkpoint.layout import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
KEPT_FILES = ("metrics.jsonl", "events.jsonl", "precision_plan.txt", "train.log", "run.json", "config.yaml",
              "metrics.superseded.jsonl")  # the last: lines of a history trained again (trainer/metrics.py)
Echo = Callable[[str], None]


def _print_now(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------- what a run ran on
def source_state(root: Path = ROOT) -> dict:
    """{commit, dirty, from} of the source tree.

    STUDY_SOURCE_COMMIT (and STUDY_SOURCE_DIRTY=1 for uncommitted changes), set by whoever copied
    the tree to the machine, wins over git: a synced copy can carry a stale .git whose HEAD is not
    the code that runs. Otherwise git's own state; "unknown" outside a work tree.
    """
    from trainer.run_info import git_state

    commit = os.environ.get("STUDY_SOURCE_COMMIT")
    if commit:
        return {"commit": commit, "dirty": os.environ.get("STUDY_SOURCE_DIRTY", "") not in ("", "0", "false"),
                "from": "environment"}
    state = git_state(root)
    if state is not None:
        return {"commit": state["commit"], "dirty": state["dirty"], "from": "git"}
    return {"commit": None, "dirty": None, "from": "unknown"}


def corpus_identity(prepared_dir: Path) -> dict:
    """{"content_sha256", "tokens"}: sha256 over each prepared source's content hash (its tokenizer and its
    shards' checksums, data.shards.content_sha256) with the source's folder name, and the token counts.
    Not a hash of the manifest files: they hold the preparation time, so the same tokens prepared on
    another machine would hash differently."""
    from data.shards import content_sha256

    manifests = sorted(Path(prepared_dir).rglob("manifest.json"))
    if not manifests:
        return {"content_sha256": None}
    digest, splits = hashlib.sha256(), {}
    for manifest in manifests:
        content = json.loads(manifest.read_text())
        digest.update(f"{manifest.parent.relative_to(prepared_dir)}\0{content_sha256(content)}\n".encode())
        for split, info in content.get("splits", {}).items():
            if isinstance(info, dict) and "tokens" in info:
                splits[split] = splits.get(split, 0) + int(info["tokens"])
    return {"content_sha256": digest.hexdigest(), "tokens": splits}


def machine_description() -> dict:
    # CUDA MPS lets the side-by-side runs' kernels overlap: their tokens/s are not comparable without it
    mps_control = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control"
    info = {"python": platform.python_version(), "cuda_mps": mps_control.exists()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"], info["cuda"] = torch.cuda.get_device_name(), torch.version.cuda
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info


def tokens_per_second(metrics_path: Path, skip_steps: int) -> Optional[float]:
    """Median tokens/s of the log lines after `skip_steps` (compilation and warm-up left out)."""
    if not metrics_path.is_file():
        return None
    rates = [record["tokens_per_s"] for record in map(json.loads, metrics_path.read_text().splitlines())
             if record.get("step", 0) > skip_steps and record.get("tokens_per_s")]
    return statistics.median(rates) if rates else None


def run_record(directory: Path) -> dict:
    path = Path(directory) / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def completed(directory: Path) -> bool:
    """A completed run of the study itself (not a probe with extra overrides) has results here."""
    record = run_record(directory)
    return record.get("status") == "completed" and not record.get("probe_overrides")


OUT_OF_MEMORY_MARKS = ("torch.OutOfMemoryError", "CUDA out of memory")


def ran_out_of_gpu_memory(log: Path, since: int = 0, tail_lines: int = 60) -> bool:
    """Whether a run's train.log ends with CUDA's out-of-memory error, in what was written from byte
    ``since`` on (the launch that just ended: an earlier launch's error does not count)."""
    if not log.is_file():
        return False
    tail = _lines_from(log, since)[-tail_lines:]
    return any(mark in line for line in tail for mark in OUT_OF_MEMORY_MARKS)


def _lines_from(log: Path, offset: int) -> list[str]:
    """The lines of ``log`` from byte ``offset`` on: what one launch wrote to a log that accumulates."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace").rstrip().splitlines()


def recover_completed(run: StudyRun, work: Path, results: Path, echo: Echo) -> bool:
    """Copy a run completed in ``work`` into the results when they lack it; True if it was copied."""
    if completed(results / run.id) or not completed(work / run.id):
        return False
    _copy_kept_files(work / run.id, results / run.id)
    echo(f"{run.id}: completed in {work / run.id} but missing from {results / run.id}: copied there, not run again")
    return True


def continue_record_from_results(run: StudyRun, work: Path, results: Path, echo: Echo,
                                 extra: Sequence[str] = ()) -> bool:
    """A run not completed whose work folder is gone (a fresh machine) while its results hold an earlier
    launch: copy those files into the work folder, so the next launch adds to its record (calls, wall
    time, sources) and the trainer, starting again from step 0 with no checkpoint, moves the earlier
    history's metrics to metrics.superseded.jsonl rather than the results losing them. Only a record of
    the same overrides (``extra``: none for the study's own runs) is continued. True if copied."""
    run_dir, kept = work / run.id, results / run.id
    record = run_record(kept)
    if (run_record(run_dir) or not record or completed(kept)
            or list(record.get("probe_overrides", [])) != list(extra)):
        return False
    _copy_kept_files(kept, run_dir)
    status = record.get("status")
    echo(f"{run.id}: {status} earlier, and {run_dir} held nothing of it: its record copied there from {kept}")
    return True


def _copy_kept_files(source: Path, target: Path) -> None:
    """The run's KEPT_FILES from one of its folders to another (work to results, or back to a new work folder)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in KEPT_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)


# ---------------------------------------------------------------------------------- running
def prepare_corpus(prepared_dir: Path, data_config: str, echo: Echo) -> dict:
    command = [sys.executable, "-m", "trainer.prepare_data", "--config", data_config,
               f"prepared_dir={prepared_dir}", "num_proc=0"]
    echo("+ " + shlex.join(command))
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env=_child_environment())
    identity = corpus_identity(prepared_dir)
    echo(f"corpus ready in {time.perf_counter() - started:.0f} s: content sha256 {identity['content_sha256']}")
    return identity


def _child_environment() -> dict:
    """The environment of the runs: they import the packages this process imported."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


class _Running:
    def __init__(self, run: StudyRun, process: subprocess.Popen, log, beside: set[str], log_offset: int = 0):
        self.run, self.process, self.log = run, process, log
        self.log_offset = log_offset  # train.log's size before this launch: what earlier launches wrote
        self.started = time.perf_counter()
        self.started_at = time.time()  # the launch's date, for run.json's started_per_call
        self.beside = set(beside)  # every run that shared the GPU with it in this call
        self.signalled = False  # SIGTERM sent at the deadline


def run_study(study: Study, runs: Sequence[StudyRun], *, work: Path, prepared_dir: Path, parallel: int = 4,
              deadline_s: Optional[float] = None, extra: Sequence[str] = (), force: bool = False,
              skip_steps: int = 50, data_config: str = "study", echo: Optional[Echo] = None) -> int:
    """Run ``runs`` (see the module docstring); 0 when every one of them has completed."""
    echo = echo or _print_now
    work, results = Path(work), study.results
    if not force:
        for run in runs:
            recover_completed(run, work, results, echo) or continue_record_from_results(run, work, results, echo,
                                                                                        extra)
    pending = [run for run in runs if force or not completed(results / run.id)]
    for run in runs:
        if run not in pending:
            echo(f"{run.id}: completed in {results / run.id}, not run again (--force to redo)")
    if not pending:
        return 0
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")

    launched = time.perf_counter()
    corpus = prepare_corpus(Path(prepared_dir), data_config, echo)
    shared = [f"data.prepared_dir={prepared_dir}", "data.auto_prepare=false", "logging.wandb.mode=disabled", *extra]
    source, machine = source_state(), machine_description()
    expected = _expected_walls(results, pending)
    queue, running, outcomes = list(pending), [], {}
    stopping = False
    requested: list[str] = []  # a signal the runner itself received: stop the runs as at the deadline
    handlers = {sig: signal.signal(sig, lambda number, frame: requested.append(signal.Signals(number).name))
                for sig in (signal.SIGTERM, signal.SIGINT)}

    def elapsed() -> float:
        return time.perf_counter() - launched

    try:
        while running or (queue and not stopping):  # once stopping, the queue waits for the next command
            while queue and len(running) < parallel and not stopping:
                run = queue.pop(0)
                left = None if deadline_s is None else deadline_s - elapsed()
                guess = expected.get((run.size, run.arm))
                if requested or (left is not None and (left <= 0 or (guess is not None and guess > left))):
                    echo(f"{run.id}: not started" + (f", {requested[0]} received" if requested else
                         f", {max(left, 0):.0f} s left" + (f" and it takes about {guess:.0f} s" if guess else "")))
                    continue
                beside = {r.run.id for r in running}
                _work_folder(run, work, force)
                _mark_launch(run, work / run.id, beside, source, echo)  # before the trainer writes train.log
                running.append(_start(run, work, shared, beside, echo))
                for other in running[:-1]:
                    other.beside.add(run.id)
            side_by_side = len(running)  # before this pass: runs that fail together count once
            for entry in list(running):
                if entry.process.poll() is not None:
                    running.remove(entry)
                    wall = time.perf_counter() - entry.started
                    entry.log.close()
                    outcomes[entry.run.id] = _collect(study, entry, wall, results, work, extra, skip_steps,
                                                      source, corpus, machine)
                    if (outcomes[entry.run.id]["status"] == "failed" and side_by_side > 1 and not stopping
                            and ran_out_of_gpu_memory(work / entry.run.id / "train.log", entry.log_offset)):
                        parallel = max(1, min(parallel, side_by_side - 1))
                        queue.insert(0, entry.run)
                        echo(f"{entry.run.id}: out of GPU memory with {side_by_side} runs side by side: "
                             f"queued again, at most {parallel} side by side from now on")
                        continue
                    if outcomes[entry.run.id]["status"] == "completed":
                        key = (entry.run.size, entry.run.arm)
                        expected[key] = max(expected.get(key, 0.0), wall)
                    _echo_outcome(entry.run, outcomes[entry.run.id], echo)
            past_deadline = deadline_s is not None and elapsed() > deadline_s
            if (past_deadline or requested) and not stopping and running:
                reason = f"{requested[0]} received" if requested else f"deadline of {deadline_s:.0f} s"
                echo(f"{reason}: SIGTERM to {len(running)} run(s) (they checkpoint)")
                for entry in running:
                    entry.process.send_signal(signal.SIGTERM)
                    entry.signalled = True
                stopping = True
            time.sleep(0.5)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    for run in queue:
        echo(f"{run.id}: not started, the runs were stopped")

    total = sum(o.get("tokens_per_s_median") or 0.0 for o in outcomes.values())
    echo(f"{len(outcomes)} run(s) in {elapsed():.0f} s; sum of median tokens/s: {total:,.0f}")
    done = sum(o["status"] == "completed" for o in outcomes.values())
    if done < len(pending):
        echo(f"{len(pending) - done} of {len(pending)} run(s) not completed: run the same command again to resume")
    return 0 if done == len(pending) else 1


def _expected_walls(results: Path, runs: Sequence[StudyRun]) -> dict:
    """(size, arm) -> the longest single-call wall time of a completed run on record (a guess for the deadline)."""
    expected = {}
    for run in runs:
        for seed_dir in (results / run.size / run.arm).glob("seed*"):
            record = run_record(seed_dir)
            if record.get("status") == "completed" and record.get("calls") == 1:
                key = (run.size, run.arm)
                expected[key] = max(expected.get(key, 0.0), float(record["wall_s"]))
    return expected


def _work_folder(run: StudyRun, work: Path, force: bool) -> None:
    """The run's work folder; with --force a finished or failed run's is emptied first. A stopped launch's
    or a killed one's ("running") is kept: its checkpoint resumes the forced run."""
    run_dir = work / run.id
    if force and run_dir.exists() and run_record(run_dir).get("status") not in ("stopped", "running"):
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # a checkpoint left there by a deadline is resumed


def _start(run: StudyRun, work: Path, shared: Sequence[str], beside: set[str], echo: Echo) -> _Running:
    run_dir = work / run.id
    if run_record(run_dir).get("calls") and not list_checkpoints(run_dir / "checkpoints"):
        echo(f"{run.id}: no complete checkpoint in {run_dir / 'checkpoints'}: trained again from step 0 (the "
             f"earlier launches' metrics lines move to metrics.superseded.jsonl)")
    command = [sys.executable, "-m", "trainer", *run.trainer_arguments(), *shared,
               f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"]
    echo(f"{run.id}: {shlex.join(command[1:])}")
    log = open(run_dir / "train.log", "a")
    offset = (run_dir / "train.log").stat().st_size
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=_child_environment())
    return _Running(run, process, log, beside, log_offset=offset)


LAUNCH_MARKS = ("launch_started", "launch_source", "launch_beside")


def _mark_launch(run: StudyRun, run_dir: Path, beside: set[str], source: dict, echo: Echo) -> None:
    """Set the run's run.json to status "running" just before its launch, with the launch's start, source and
    neighbours. A launch killed from outside (the machine's time limit, a lost node) never reaches _collect,
    so the next launch finds the mark and counts it: a call more, and wall time up to the killed launch's
    last write to train.log, under "killed_launches" (neighbours started after it are not known)."""
    record = run_record(run_dir)
    if record.get("status") == "running":
        ended = max(_last_write(run_dir / "train.log", record["launch_started"]), record["launch_started"])
        wall = ended - record["launch_started"]
        record.update(wall_s=round(record.get("wall_s", 0.0) + wall, 1), calls=record.get("calls", 0) + 1,
                      killed_launches=record.get("killed_launches", 0) + 1,
                      side_by_side_per_call=record.get("side_by_side_per_call", []) + [record["launch_beside"]],
                      sources_per_call=record.get("sources_per_call", []) + [record["launch_source"]],
                      started_per_call=record.get("started_per_call", []) + [utc_date(record["launch_started"])])
        echo(f"{run.id}: its launch of {time.ctime(record['launch_started'])} ended with no record (killed "
             f"from outside): counted as a call of {wall:.0f} s, to its last write to train.log")
    record.update(status="running", launch_started=time.time(), launch_source=source, launch_beside=sorted(beside))
    _write_record(run_dir, record)


def utc_date(seconds: float) -> str:
    """A launch's start as run.json records it: ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _write_record(run_dir: Path, record: dict) -> None:
    """run.json, replaced atomically: a runner killed mid-write leaves the old record, never half a file."""
    temporary = run_dir / "run.json.tmp"
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    temporary.replace(run_dir / "run.json")


def _last_write(path: Path, otherwise: float) -> float:
    return path.stat().st_mtime if path.is_file() else otherwise


def _collect(study: Study, entry: _Running, wall: float, results: Path, work: Path, extra: Sequence[str],
             skip_steps: int, source: dict, corpus: dict, machine: dict) -> dict:
    """Write the run's run.json (accumulated over calls) and copy its files into the results."""
    run, run_dir = entry.run, work / entry.run.id
    hydra_config = run_dir / ".hydra" / "config.yaml"
    if not (run_dir / "config.yaml").is_file() and hydra_config.is_file():
        shutil.copy(hydra_config, run_dir / "config.yaml")
    lines = _lines_from(run_dir / "train.log", entry.log_offset)  # this launch's part of the log
    code = entry.process.returncode
    # "preempted at step": it checkpointed; killed by the deadline's SIGTERM before the trainer installed
    # its handler (still starting up): nothing trained in this call, and nothing is lost either
    preempted = (bool(lines) and "preempted at step" in lines[-1]) or (entry.signalled and code == -signal.SIGTERM)
    previous = run_record(run_dir)
    for key in LAUNCH_MARKS:  # this launch's own mark (_mark_launch)
        previous.pop(key, None)
    record = {
        "run": run.id, "size": run.size, "arm": run.arm, "seed": run.seed, "study": study.name,
        "status": "stopped" if preempted else ("completed" if code == 0 else "failed"),
        "about": run.about,
        "command": "python -m trainer " + shlex.join(run.trainer_arguments()),
        "probe_overrides": list(extra),
        "exit_code": code,
        "wall_s": round(wall + previous.get("wall_s", 0.0), 1),
        "calls": previous.get("calls", 0) + 1,
        "side_by_side_per_call": previous.get("side_by_side_per_call", []) + [sorted(entry.beside)],
        "tokens_per_s_median": tokens_per_second(run_dir / "metrics.jsonl", skip_steps),
        "source": source,
        "sources_per_call": previous.get("sources_per_call", []) + [source],
        "started_per_call": previous.get("started_per_call", []) + [utc_date(entry.started_at)],
        "corpus": corpus,
        "system": machine,
    }
    if previous.get("killed_launches"):
        record["killed_launches"] = previous["killed_launches"]
    _write_record(run_dir, record)
    _copy_kept_files(run_dir, results / run.id)
    return record


def _echo_outcome(run: StudyRun, record: dict, echo: Echo) -> None:
    echo(f"{run.id}: {record['status']} (exit {record['exit_code']}) after {record['wall_s']:.0f} s, "
         f"median {record['tokens_per_s_median'] or 0:,.0f} tokens/s")
