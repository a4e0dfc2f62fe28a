"""Run runs of the precision study side by side on one GPU and collect their results.

    python scripts/run_study.py --runs bf16,fp8,nvfp4 --out results/study
    python scripts/run_study.py --runs nvfp4 --out /tmp/probe --set train.steps=60     # a throughput probe

The runs are defined in results/study/runs.yaml (experiment + overrides each). The corpus is
prepared once first (scripts/prepare_data.py, all cores), then every selected run starts as
its own `python -m trainer` process at the same time: a model this small leaves most of an
H200 idle, so several processes raise the aggregate tokens/s (docs/study.md has the
measurement). Each run writes into <out>/<run>/: metrics.jsonl, events.jsonl,
precision_plan.txt, config.yaml (the resolved config), train.log, and run.json (command,
wall time, what ran beside it, the GPU and versions). A run that exists there with a
run.json whose exit code is 0 is not run again unless --force.
"""

from __future__ import annotations

import argparse
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

import yaml

REPOSITORY = Path(__file__).resolve().parent.parent
RUNS_FILE = REPOSITORY / "results" / "study" / "runs.yaml"
KEPT_FILES = ("metrics.jsonl", "events.jsonl", "precision_plan.txt", "train.log", "run.json", "config.yaml")


def load_study(path: Path = RUNS_FILE) -> dict:
    """The study definition: {'reference', 'noise_floor', 'runs': {name: {experiment, overrides, about}}}."""
    return yaml.safe_load(path.read_text())


def run_command(study: dict, name: str, extra: list[str]) -> list[str]:
    """The trainer command line of one run (without the run directory)."""
    if name not in study["runs"]:
        raise SystemExit(f"unknown study run {name!r}; runs: {', '.join(study['runs'])}")
    run = study["runs"][name]
    return [sys.executable, "-m", "trainer", f"+experiment={run['experiment']}", *run["overrides"], *extra]


def gpu_description() -> dict:
    try:
        import torch

        info = {"torch": torch.__version__}
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["cuda"] = torch.version.cuda
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
        return info
    except ImportError:
        return {}


def tokens_per_second(metrics_path: Path, skip_steps: int) -> float | None:
    """Median tokens/s of the log lines after `skip_steps` (compilation and warm-up left out)."""
    if not metrics_path.is_file():
        return None
    rates = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if record.get("step", 0) > skip_steps and record.get("tokens_per_s"):
            rates.append(record["tokens_per_s"])
    return statistics.median(rates) if rates else None


def prepare(data_overrides: list[str]) -> None:
    command = [sys.executable, str(REPOSITORY / "scripts" / "prepare_data.py"), "--config", "study", *data_overrides]
    print("+", shlex.join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPOSITORY)
    print(f"corpus ready in {time.perf_counter() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="comma-separated run names of results/study/runs.yaml, or 'all'")
    parser.add_argument("--out", default=str(REPOSITORY / "results" / "study"), help="results root (one folder per run)")
    parser.add_argument("--work", default="/tmp/study_runs", help="where the runs write while training")
    parser.add_argument("--prepared-dir", default="/tmp/study_data", help="data.prepared_dir shared by the runs")
    parser.add_argument("--set", nargs="*", default=[], help="extra trainer overrides for every run (probes)")
    parser.add_argument("--skip-steps", type=int, default=50, help="steps left out of the tokens/s median")
    parser.add_argument("--force", action="store_true", help="run again even where results exist")
    parser.add_argument("--stop-after", type=float, default=None,
                        help="seconds after which every run gets SIGTERM: it checkpoints and exits (a later call "
                             "with the same --work resumes it)")
    parser.add_argument("--fresh", action="store_true", help="delete the runs' work directories first (no resume)")
    arguments = parser.parse_args(argv)

    study = load_study()
    names = list(study["runs"]) if arguments.runs == "all" else arguments.runs.split(",")
    out, work = Path(arguments.out), Path(arguments.work)
    pending = [name for name in names if arguments.force or not _finished(out / name)]
    for name in sorted(set(names) - set(pending)):
        print(f"{name}: results exist in {out / name}, not run again (--force to redo)")
    if not pending:
        return 0
    for name in pending:
        run_command(study, name, [])  # unknown names fail before any work

    data_overrides = [f"prepared_dir={arguments.prepared_dir}", "num_proc=0"]
    prepare(data_overrides)
    shared = [f"data.prepared_dir={arguments.prepared_dir}", "data.auto_prepare=false", "logging.wandb.mode=disabled",
              *arguments.set]
    processes = {}
    for name in pending:
        run_dir = work / name
        if arguments.fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True, exist_ok=True)  # a checkpoint left there by --stop-after is resumed
        command = run_command(study, name, [*shared, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"])
        log = open(run_dir / "train.log", "a")
        print(f"{name}: {shlex.join(command[1:])}", flush=True)
        processes[name] = (subprocess.Popen(command, cwd=REPOSITORY, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"}),
                           time.perf_counter(), command, log)
    exit_codes, walls = {}, {}
    launched, stopped = time.perf_counter(), False
    while len(exit_codes) < len(processes):  # poll, so that each run's own end time is its wall time
        for name, (process, started, command, log) in processes.items():
            if name not in exit_codes and process.poll() is not None:
                exit_codes[name], walls[name] = process.returncode, time.perf_counter() - started
                log.close()
        if arguments.stop_after is not None and not stopped and time.perf_counter() - launched > arguments.stop_after:
            print(f"stopping after {arguments.stop_after:.0f} s: SIGTERM to every run (they checkpoint)", flush=True)
            for name, (process, *_) in processes.items():
                if name not in exit_codes:
                    process.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(1)

    system = {"python": platform.python_version(), **gpu_description()}
    print(f"\n{'run':18s} {'end':>4s} {'wall s':>7s} {'tokens/s':>10s} {'final loss':>10s} {'val loss':>9s}")
    total_rate = 0.0
    for name in pending:
        run_dir, target = work / name, out / name
        rate = tokens_per_second(run_dir / "metrics.jsonl", arguments.skip_steps)
        total_rate += rate or 0.0
        hydra_config = run_dir / ".hydra" / "config.yaml"
        if not (run_dir / "config.yaml").is_file() and hydra_config.is_file():
            shutil.copy(hydra_config, run_dir / "config.yaml")
        # train.log accumulates over calls: only its last line says how this call's part ended
        last_lines = (run_dir / "train.log").read_text().rstrip().splitlines()
        preempted = bool(last_lines) and "preempted at step" in last_lines[-1]
        previous = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
        record = {
            "run": name,
            "status": "stopped" if preempted else ("completed" if exit_codes[name] == 0 else "failed"),
            "about": study["runs"][name].get("about", ""),
            "command": "python -m trainer " + shlex.join(command_for_docs(study, name)),
            "probe_overrides": arguments.set,
            "exit_code": exit_codes[name],
            "wall_s": round(walls[name] + previous.get("wall_s", 0.0), 1),
            "calls": previous.get("calls", 0) + 1,
            "side_by_side_with": [other for other in pending if other != name],
            "tokens_per_s_median": rate,
            "system": system,
        }
        (run_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
        target.mkdir(parents=True, exist_ok=True)
        for file in KEPT_FILES:
            if (run_dir / file).is_file():
                shutil.copy(run_dir / file, target / file)
        last = _last_metrics(run_dir / "metrics.jsonl")
        print(f"{name:18s} {record['status'][:4]:>4s} {walls[name]:>7.0f} {rate or 0:>10,.0f} "
              f"{last.get('loss', float('nan')):>10.4f} {last.get('val_loss', float('nan')):>9.4f}")
    print(f"aggregate tokens/s of {len(pending)} runs side by side: {total_rate:,.0f}")
    return 0 if all(code == 0 for code in exit_codes.values()) else 1


def command_for_docs(study: dict, name: str) -> list[str]:
    run = study["runs"][name]
    return [f"+experiment={run['experiment']}", *run["overrides"]]


def _finished(directory: Path) -> bool:
    path = directory / "run.json"
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    return record.get("status") == "completed" and not record.get("probe_overrides")


def _last_metrics(path: Path) -> dict:
    if not path.is_file():
        return {}
    last: dict = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        last.update({key: value for key, value in record.items() if value is not None})
    return last


if __name__ == "__main__":
    sys.exit(main())
