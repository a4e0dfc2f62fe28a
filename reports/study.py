"""The precision study (docs/study.md): run its runs side by side, then tabulate and plot the results.

The runs are defined in results/study/runs.yaml (experiment + overrides each); the results live
beside it, one folder per run. Both are the checkout's (results/ is not installed with the
packages), so these tools run from a checkout.

Running (`run_study`, scripts/run_study.py): the corpus is prepared once first
(scripts/prepare_data.py, all cores), then every selected run starts as its own
`python -m trainer` process at the same time: a model this small leaves most of an H200 idle,
so several processes raise the aggregate tokens/s (docs/study.md has the measurement). Each
run writes into <out>/<run>/: metrics.jsonl, events.jsonl, precision_plan.txt, config.yaml
(the resolved config), train.log, and run.json (command, wall time, what ran beside it, the GPU
and versions). A run that exists there with a run.json whose exit code is 0 is not run again
unless forced.

Reporting (`study_table`, `study_plots`, `write_table`; scripts/study_report.py), from the
committed results alone (no GPU). Per completed run:
- final train loss: the mean of the logged training loss over the last 5% of steps (each log
  line is the mean of its log interval, so this is the mean over those steps);
- final validation loss: the last val_loss (the same fixed validation batches for every run);
- gap: (run - reference) / reference of the final validation loss, in %;
- beyond noise: whether |gap| exceeds the noise run's |gap| (the reference with another seed).
The plots are reports.compare_runs figures with the noise band: the main comparison (BF16,
FP8, NVFP4, the late switch) and the NVFP4 ablations.
"""

from __future__ import annotations

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

import yaml

from reports.compare_runs import compare_runs, finite, keep_last_per_step, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: the study's definition and results, the scripts."""
RESULTS = ROOT / "results" / "study"
RUNS_FILE = RESULTS / "runs.yaml"
KEPT_FILES = ("metrics.jsonl", "events.jsonl", "precision_plan.txt", "train.log", "run.json", "config.yaml")
TABLE_BEGIN, TABLE_END = "<!-- study-table:begin -->", "<!-- study-table:end -->"
MAIN_RUNS = ("fp8", "nvfp4", "nvfp4_late_bf16")
ABLATION_RUNS = ("nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_no_2d", "nvfp4_all_layers", "mxfp4")


def load_study(path: Path = RUNS_FILE) -> dict:
    """The study definition: {'reference', 'noise_floor', 'runs': {name: {experiment, overrides, about}}}."""
    return yaml.safe_load(Path(path).read_text())


# ------------------------------------------------------------------------------------ running
def run_command(study: dict, name: str, extra: Sequence[str]) -> list[str]:
    """The trainer command line of one run (without the run directory)."""
    if name not in study["runs"]:
        raise ValueError(f"unknown study run {name!r}; runs: {', '.join(study['runs'])}")
    run = study["runs"][name]
    return [sys.executable, "-m", "trainer", f"+experiment={run['experiment']}", *run["overrides"], *extra]


def command_for_docs(study: dict, name: str) -> list[str]:
    run = study["runs"][name]
    return [f"+experiment={run['experiment']}", *run["overrides"]]


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


def finished(directory: Path) -> bool:
    """A completed run of the study itself (not a probe with extra overrides) has results here."""
    path = directory / "run.json"
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    return record.get("status") == "completed" and not record.get("probe_overrides")


def last_metrics(path: Path) -> dict:
    """The latest value of every key of a metrics.jsonl (empty when there is none)."""
    if not path.is_file():
        return {}
    last: dict = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        last.update({key: value for key, value in record.items() if value is not None})
    return last


def _print_now(line: str) -> None:
    print(line, flush=True)


def _child_environment() -> dict:
    """The environment of the study's processes: they import the packages this process imported."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def prepare_corpus(prepared_dir: str, echo: Optional[Callable[[str], None]] = None) -> None:
    """The study's corpus (configs/data/study.yaml) into ``prepared_dir``, with all cores."""
    echo = echo or _print_now
    command = [sys.executable, str(ROOT / "scripts" / "prepare_data.py"), "--config", "study",
               f"prepared_dir={prepared_dir}", "num_proc=0"]
    echo("+ " + shlex.join(command))
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env=_child_environment())
    echo(f"corpus ready in {time.perf_counter() - started:.0f} s")


def run_study(names: Sequence[str], out: Path, work: Path, prepared_dir: str, extra: Sequence[str] = (),
              skip_steps: int = 50, force: bool = False, stop_after: Optional[float] = None, fresh: bool = False,
              echo: Optional[Callable[[str], None]] = None) -> int:
    """Run the named runs side by side (see the module docstring); 0 when every run ended with status 0."""
    echo = echo or _print_now
    study = load_study()
    out, work = Path(out), Path(work)
    pending = [name for name in names if force or not finished(out / name)]
    for name in sorted(set(names) - set(pending)):
        echo(f"{name}: results exist in {out / name}, not run again (--force to redo)")
    if not pending:
        return 0
    for name in pending:
        run_command(study, name, [])  # unknown names fail before any work

    prepare_corpus(prepared_dir, echo)
    shared = [f"data.prepared_dir={prepared_dir}", "data.auto_prepare=false", "logging.wandb.mode=disabled", *extra]
    processes = {}
    for name in pending:
        run_dir = work / name
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True, exist_ok=True)  # a checkpoint left there by stop_after is resumed
        command = run_command(study, name, [*shared, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"])
        log = open(run_dir / "train.log", "a")
        echo(f"{name}: {shlex.join(command[1:])}")
        processes[name] = (subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            env=_child_environment()),
                           time.perf_counter(), command, log)
    exit_codes, walls = {}, {}
    launched, stopped = time.perf_counter(), False
    while len(exit_codes) < len(processes):  # poll, so that each run's own end time is its wall time
        for name, (process, started, command, log) in processes.items():
            if name not in exit_codes and process.poll() is not None:
                exit_codes[name], walls[name] = process.returncode, time.perf_counter() - started
                log.close()
        if stop_after is not None and not stopped and time.perf_counter() - launched > stop_after:
            echo(f"stopping after {stop_after:.0f} s: SIGTERM to every run (they checkpoint)")
            for name, (process, *_) in processes.items():
                if name not in exit_codes:
                    process.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(1)

    system = {"python": platform.python_version(), **gpu_description()}
    echo(f"\n{'run':18s} {'end':>4s} {'wall s':>7s} {'tokens/s':>10s} {'final loss':>10s} {'val loss':>9s}")
    total_rate = 0.0
    for name in pending:
        run_dir, target = work / name, out / name
        rate = tokens_per_second(run_dir / "metrics.jsonl", skip_steps)
        total_rate += rate or 0.0
        record = _record_run(study, name, run_dir, exit_codes[name], walls[name], rate, list(extra),
                             [other for other in pending if other != name], system)
        target.mkdir(parents=True, exist_ok=True)
        for file in KEPT_FILES:
            if (run_dir / file).is_file():
                shutil.copy(run_dir / file, target / file)
        last = last_metrics(run_dir / "metrics.jsonl")
        echo(f"{name:18s} {record['status'][:4]:>4s} {walls[name]:>7.0f} {rate or 0:>10,.0f} "
             f"{last.get('loss', float('nan')):>10.4f} {last.get('val_loss', float('nan')):>9.4f}")
    echo(f"aggregate tokens/s of {len(pending)} runs side by side: {total_rate:,.0f}")
    return 0 if all(code == 0 for code in exit_codes.values()) else 1


def _record_run(study: dict, name: str, run_dir: Path, exit_code: int, wall: float, rate: Optional[float],
                probe_overrides: list, beside: list, system: dict) -> dict:
    """Write <run_dir>/run.json for this call (wall time and calls accumulate over resumed calls)."""
    hydra_config = run_dir / ".hydra" / "config.yaml"
    if not (run_dir / "config.yaml").is_file() and hydra_config.is_file():
        shutil.copy(hydra_config, run_dir / "config.yaml")
    # train.log accumulates over calls: only its last line says how this call's part ended
    last_lines = (run_dir / "train.log").read_text().rstrip().splitlines()
    preempted = bool(last_lines) and "preempted at step" in last_lines[-1]
    previous = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
    record = {
        "run": name,
        "status": "stopped" if preempted else ("completed" if exit_code == 0 else "failed"),
        "about": study["runs"][name].get("about", ""),
        "command": "python -m trainer " + shlex.join(command_for_docs(study, name)),
        "probe_overrides": probe_overrides,
        "exit_code": exit_code,
        "wall_s": round(wall + previous.get("wall_s", 0.0), 1),
        "calls": previous.get("calls", 0) + 1,
        "side_by_side_with": sorted(set(previous.get("side_by_side_with", [])) | set(beside)),
        "side_by_side_per_call": previous.get("side_by_side_per_call", []) + [beside],
        "tokens_per_s_median": rate,
        "system": system,
    }
    (run_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


# ------------------------------------------------------------------------------------ reporting
def completed_runs(study: dict, results: Path = RESULTS) -> dict[str, Path]:
    found = {}
    for name in study["runs"]:
        directory = results / name
        run_file = directory / "run.json"
        if run_file.is_file() and json.loads(run_file.read_text()).get("status") == "completed":
            found[name] = directory
    return found


def summarize(directory: Path) -> dict:
    from models.config import ModelConfig
    from models.flops import count_parameters

    records = keep_last_per_step(read_jsonl(directory / "metrics.jsonl"))
    config = yaml.safe_load((directory / "config.yaml").read_text())
    steps = config["train"]["steps"]
    tail = [r["loss"] for r in records if r["step"] > 0.95 * steps and finite(r.get("loss"))]
    validation = [r for r in records if finite(r.get("val_loss"))]
    run = json.loads((directory / "run.json").read_text())
    return {
        "parameters": count_parameters(ModelConfig(**config["model"])),
        "tokens": records[-1]["tokens"],
        "steps": records[-1]["step"],
        "wall_minutes": run["wall_s"] / 60,
        # training time: each log line's step time x the steps it covers (start-up and compilation left out)
        "train_minutes": sum(r["step_time_s"] * (r["step"] - previous["step"]) for previous, r in zip(
            [{"step": 0}] + records[:-1], records) if finite(r.get("step_time_s"))) / 60,
        "final_train_loss": sum(tail) / len(tail),
        "final_val_loss": validation[-1]["val_loss"],
        "command": run["command"],
        "about": run.get("about", ""),
    }


def table(study: dict, summaries: dict[str, dict]) -> str:
    reference = summaries[study["reference"]]
    noise = summaries.get(study["noise_floor"])
    noise_gap = abs(noise["final_val_loss"] / reference["final_val_loss"] - 1) if noise else None
    corpus_tokens = study.get("corpus", {}).get("train_tokens")
    lines = [
        "| run | parameters | tokens | epochs | train min (GPU shared) | final train loss | final val loss | gap to BF16 | beyond seed noise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, summary in summaries.items():
        gap = summary["final_val_loss"] / reference["final_val_loss"] - 1
        if name == study["reference"]:
            verdict = "(reference)"
        elif name == study["noise_floor"]:
            verdict = "(the noise floor)"
        else:
            verdict = "n/a" if noise_gap is None else ("yes" if abs(gap) > noise_gap else "no")
        epochs = f"{summary['tokens'] / corpus_tokens:.2f}" if corpus_tokens else "?"
        lines.append(
            f"| {name} | {summary['parameters'] / 1e6:.2f}M | {summary['tokens'] / 1e6:.2f}M | {epochs} | "
            f"{summary['train_minutes']:.1f} | {summary['final_train_loss']:.4f} | {summary['final_val_loss']:.4f} | "
            f"{100 * gap:+.2f}% | {verdict} |"
        )
    missing = [name for name in study["runs"] if name not in summaries]
    if missing:
        lines.append("")
        lines.append(f"Not run yet: {', '.join(missing)}.")
    return "\n".join(lines)


def plots(study: dict, found: dict[str, Path], images: Path) -> list[Path]:
    reference, noise = study["reference"], study["noise_floor"]
    written = []
    for name, members, title in (
        ("study_main.png", MAIN_RUNS, "BF16 vs FP8 vs NVFP4 (emulated), 9.2M-parameter hybrid"),
        ("study_ablations.png", ABLATION_RUNS, "NVFP4 recipe ablations vs BF16"),
    ):
        present = [run for run in members if run in found]
        if reference not in found or not [run for run in present if run != "nvfp4"]:
            continue  # the ablation figure waits for an ablation (nvfp4 alone is in the main figure)
        compare_runs([found[reference], *(found[run] for run in present)], val=True, smoothing="ema:0.8",
                     out=images / name, title=title, noise=found[noise] if noise in found else None)
        written.append(images / name)
    return written


def study_report(images: Path, results: Path = RESULTS) -> str:
    """The study's table (Markdown) from the completed runs under ``results``; redraws the plots into ``images``."""
    study = load_study(results / "runs.yaml")
    found = completed_runs(study, results)
    if study["reference"] not in found:
        raise ValueError(f"the reference run {study['reference']!r} has no completed results in {results}")
    summaries = {name: summarize(directory) for name, directory in found.items()}
    text = table(study, summaries)
    plots(study, found, images)
    return text


def write_table(document: Path, text: str) -> None:
    """Replace the table between the study-table markers of ``document`` by ``text``."""
    before, begin, rest = document.read_text().partition(TABLE_BEGIN)
    _, end, after = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"{document} has no {TABLE_BEGIN} ... {TABLE_END} markers")
    document.write_text(f"{before}{TABLE_BEGIN}\n{text}\n{TABLE_END}{after}")
