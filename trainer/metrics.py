"""Where numbers go: a JSONL file, W&B and a progress bar, all on rank 0.

`<run dir>/metrics.jsonl`  one line per log step: step, tokens, loss, lr, grad_norm,
                           tokens_per_s, step_time_s, mfu, ... (see loop.py)
`<run dir>/events.jsonl`   one line per event: precision switch, skipped step, loss spike,
                           checkpoint, preemption
W&B                        the same metrics (x-axis `tokens` available): training ones under
                           `train/`, validation loss under `val/loss`; runs of one comparison in
                           one group (trainer/wandb_report.py), with the full resolved config.
                           Offline by default; any failure of wandb (import, init, network) is
                           reported once and reporting goes on without it: W&B never stops a run.

metrics.jsonl holds one history. A run that starts at step s (a resume, or step 0) moves the lines
of steps after s that an earlier history of the directory wrote (steps retrained after a crash, a
finished run resumed from an older checkpoint, a restart with checkpoint.resume=none) to
`metrics.superseded.jsonl`, never deleting them, and says so in events.jsonl; otherwise the file
would interleave two histories and a reader keeping the last line per step would mix them.

A failed write to metrics.jsonl or events.jsonl (disk full, quota) is different: the run would
go on without a record of its losses. The logger stops writing and keeps the reason, naming the
file, in `write_failure`; the loop reads it at the next step boundary and stops every rank after
a checkpoint attempt (trainer/guards.py: `stop_after_failure`).
"""

from __future__ import annotations

import json
import math
import sys
import time
import uuid
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from fileio.oserrors import explain_write_failure
from trainer.config import TrainConfig
from trainer.wandb_report import comparison_group

_PYTHONS_SHOWWARNING = warnings.showwarning
"""The warnings module's own printer: the bar replaces only this one, never a hook someone installed."""

W_AND_B_KEYS = {"tokens": "tokens", "val_loss": "val/loss"}
"""metrics.jsonl key -> W&B key where it is not train/<key>."""


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/Inf; keep them visible rather than drop the line
    return value


def _shown(value) -> str:
    """An event field as the console shows it: floats to 4 significant digits (events.jsonl keeps them whole)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


SUPERSEDED_METRICS = "metrics.superseded.jsonl"


def move_superseded_lines(path: Path, start_step: int) -> dict:
    """Move the lines of `path` past `start_step` (and any line that is not a JSON object with a step:
    a write cut off by a crash) to SUPERSEDED_METRICS beside it, appended; `path` keeps the rest in
    order, replaced atomically. Returns {} when nothing moved, else what moved (for events.jsonl)."""
    if not path.is_file():
        return {}
    kept, moved, steps = [], [], []
    for line in path.read_text().splitlines(keepends=True):
        try:
            record = json.loads(line)
            step = record.get("step") if isinstance(record, dict) else None
        except json.JSONDecodeError:
            step = None
        if isinstance(step, (int, float)) and step <= start_step:
            kept.append(line)
        elif line.strip():
            moved.append(line if line.endswith("\n") else line + "\n")
            if isinstance(step, (int, float)):
                steps.append(step)
    if not moved:
        return {}
    target = path.with_name(SUPERSEDED_METRICS)
    with open(target, "a") as handle:  # first: a crash between the two writes duplicates, never loses
        handle.write(f'{{"superseded_at_start_step": {start_step}, "time": {time.time()}}}\n')
        handle.writelines(moved)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("".join(kept))
    temporary.replace(path)
    return {"lines": len(moved), "first_step": min(steps) if steps else None,
            "last_step": max(steps) if steps else None, "moved_to": str(target)}


class MetricsLogger:
    """Rank-0 reporting. On other ranks every method is a no-op."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, is_main: bool, total_steps: int, start_step: int = 0):
        self.is_main = is_main
        self.run_dir = Path(run_dir)
        self.write_failure: Optional[str] = None  # why a log file could not be written (then none is)
        self._wandb = None
        self._bar = None
        if not is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.superseded = move_superseded_lines(self.run_dir / "metrics.jsonl", start_step)
        self._metrics = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self._events = open(self.run_dir / "events.jsonl", "a", buffering=1)
        if self.superseded:
            self.event(start_step, "metrics_superseded", **self.superseded)
        self._shown_warning = None  # warnings.showwarning as it was before the bar took it over
        if cfg.logging.progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc=cfg.name or "train", unit="step",
                             dynamic_ncols=True)
            # A warning printed while the bar is drawn would land on the bar's line (both go to stderr,
            # and the bar's line has no newline): each is written above the bar instead, in one line.
            if warnings.showwarning is _PYTHONS_SHOWWARNING:
                self._shown_warning, warnings.showwarning = warnings.showwarning, self._show_warning
        self._wandb = _start_wandb(cfg, self.run_dir)

    def echo(self, text: str) -> None:
        """Print a message for the console (rank 0), above the progress bar when one is drawn."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def _show_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """warnings.showwarning while the bar is drawn: `file:line: Category: message`, above the bar.

        Without the source line that warnings.formatwarning adds: it is the line at the warning's
        stack level, which for a warning raised inside a decorated torch function is the decorator's
        `return func(*args, **kwargs)`, telling the reader nothing."""
        if file not in (None, sys.stderr) or self._bar is None:
            self._shown_warning(message, category, filename, lineno, file, line)
            return
        self._bar.write(f"{filename}:{lineno}: {category.__name__}: {message}", file=sys.stderr)

    def log(self, step: int, metrics: dict) -> None:
        if not self.is_main:
            return
        line = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._write(self._metrics, json.dumps(line) + "\n")
        if self._wandb is not None:
            try:
                self._wandb.log({W_AND_B_KEYS.get(k, f"train/{k}"): v for k, v in metrics.items()
                                 if isinstance(v, (int, float))}, step=step)
            except Exception as error:  # noqa: BLE001 - W&B must never stop training
                self._disable_wandb(error)
        if self._bar is not None:
            postfix = {"loss": f"{metrics['loss']:.4f}"}
            if metrics.get("tokens_per_s"):
                postfix["tok/s"] = f"{metrics['tokens_per_s']:,.0f}"
            if metrics.get("mfu") is not None:
                postfix["mfu"] = f"{100 * metrics['mfu']:.1f}%"
            self._bar.set_postfix(postfix, refresh=False)

    def _write(self, handle, text: str) -> None:
        """One whole line (line-buffered: one write each); after a failure nothing more is written."""
        if self.write_failure is not None:
            return
        try:
            handle.write(text)
        except OSError as error:
            self.write_failure = f"the run's log cannot be written: {explain_write_failure(error, Path(handle.name))}"
            print(f"error: {self.write_failure}; stopping at the end of this step", file=sys.stderr, flush=True)

    @property
    def wandb_active(self) -> bool:
        """True on rank 0 while W&B reporting runs (callers skip building W&B-only objects otherwise)."""
        return self.is_main and self._wandb is not None

    def log_values(self, step: int, values: dict) -> None:
        """Extra values for W&B only (e.g. the quantization diagnostics table; files are the caller's)."""
        if not self.is_main or self._wandb is None:
            return
        try:
            self._wandb.log(values, step=step)
        except Exception as error:  # noqa: BLE001
            self._disable_wandb(error)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def event(self, step: int, name: str, **fields) -> None:
        if not self.is_main:
            return
        line = {"step": step, "event": name, "time": time.time(), **{k: _jsonable(v) for k, v in fields.items()}}
        self._write(self._events, json.dumps(line) + "\n")
        self.echo(f"[step {step}] {name}: " + ", ".join(f"{k}={_shown(v)}" for k, v in fields.items()))
        if self._wandb is not None:
            try:
                self._wandb.log({f"events/{name}": 1}, step=step)
            except Exception as error:  # noqa: BLE001
                self._disable_wandb(error)

    def summary(self, values: dict) -> None:
        """Final or static values: W&B summary and a line in events.jsonl."""
        if not self.is_main:
            return
        if self._wandb is not None:
            try:
                self._wandb.summary.update(values)
            except Exception as error:  # noqa: BLE001
                self._disable_wandb(error)

    def log_config_extra(self, values: dict) -> None:
        """Extra config entries (e.g. the precision plan) added to the W&B run config."""
        if self.is_main and self._wandb is not None:
            try:
                self._wandb.config.update(values, allow_val_change=True)
            except Exception as error:  # noqa: BLE001
                self._disable_wandb(error)

    def _disable_wandb(self, error: Exception) -> None:
        warnings.warn(f"W&B reporting stopped ({type(error).__name__}: {error}); metrics.jsonl continues")
        self._wandb = None

    def close(self) -> None:
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.close()
            if self._shown_warning is not None and warnings.showwarning == self._show_warning:  # not if replaced since
                warnings.showwarning = self._shown_warning
        for handle in (self._metrics, self._events):
            try:
                handle.close()
            except OSError:  # the buffered rest of a failed line: write_failure says so already
                pass
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass


def _start_wandb(cfg: TrainConfig, run_dir: Path):
    """wandb.init with our config; None (and one warning) if disabled or anything fails."""
    settings = cfg.logging.wandb
    if settings.mode == "disabled":
        return None
    if settings.mode not in ("online", "offline"):
        raise ValueError(f"logging.wandb.mode must be online, offline or disabled; got {settings.mode!r}")
    try:
        import wandb
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"wandb is not importable ({error}); reporting to metrics.jsonl only")
        return None
    try:
        # One W&B run per run directory: a resumed run continues the same W&B run.
        id_file = run_dir / "wandb_run_id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            group=settings.group or comparison_group(cfg.name or "default"),
            name=settings.name or f"{cfg.name}-{cfg.precision.name}-{run_id}",
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=settings.mode,
            config=asdict(cfg),
            settings=wandb.Settings(init_timeout=60, silent=True, console="off"),
        )
        run.define_metric("tokens")
        run.define_metric("train/*", step_metric="tokens", step_sync=True)
        run.define_metric("val/*", step_metric="tokens", step_sync=True)
        return run
    except Exception as error:  # noqa: BLE001 - unreachable service, bad key...: train anyway
        warnings.warn(f"W&B could not start ({type(error).__name__}: {error}); reporting to metrics.jsonl only")
        return None


class Throughput:
    """Tokens/s and step time over the last log interval (synchronizes CUDA once per interval)."""

    def __init__(self, device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self._sync()
        self._start = time.perf_counter()
        self._tokens = 0
        self._steps = 0

    def add(self, tokens: int) -> None:
        self._tokens += tokens
        self._steps += 1

    def read(self) -> dict:
        self._sync()
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        values = {"tokens_per_s": self._tokens / elapsed, "step_time_s": elapsed / max(self._steps, 1)}
        self.reset()
        return values

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak_flops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilization: model FLOPs/s per GPU over the GPU's dense BF16 peak."""
    if not peak_flops:
        return None
    return tokens_per_s_per_gpu * flops_per_token / peak_flops
