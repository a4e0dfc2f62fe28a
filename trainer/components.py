"""The loop's components, each owning its own timing and, where it has any, its checkpointed state.

- `CheckpointedState`: trainer_state.json of a checkpoint, assembled from named components
  (each with state_dict / load_state_dict) instead of a closure over the loop's variables.
- `BatchSkipper`: train.skip_batches, the batches drawn and discarded (docs/reliability.md).
- `Evaluator`: validation loss every train.eval_every steps and at the last step.
- `StepLog`: the metrics.jsonl line every logging.log_every steps (and at the last one); its loss
  is the mean over the steps since the previous line, and a stop between log steps (preemption,
  NaN halt) flushes the partial window, so no step's loss goes unlogged. The window itself
  (`LogWindow`) is checkpointed, so the first line after a resume averages the same steps as an
  uninterrupted run's line would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from trainer.distributed import all_reduce_mean
from trainer.metrics import MetricsLogger, Throughput, mfu
from trainer.tensor_parallel import cross_entropy


class CheckpointedState:
    """What a checkpoint holds besides model and optimizer, by component.

    `nested` components are stored under their name ({"data": loader.state_dict(), ...});
    `flat` ones merge their keys into the top level ("step", "tokens", "skipped_batches");
    `records` are constants of the run, written for readers (seed, model config, tokenizer).
    The top-level layout is trainer_state.json's, unchanged; trainer/checkpoint/checkpointer.py adds world
    size, model config, precision backend and parameter layout when it saves.
    """

    def __init__(self, flat: Sequence, nested: dict[str, object], records: dict):
        self.flat, self.nested, self.records = list(flat), dict(nested), dict(records)

    def state_dict(self) -> dict:
        state = {}
        for component in self.flat:
            state.update(component.state_dict())
        state.update({name: component.state_dict() for name, component in self.nested.items()})
        state.update(self.records)
        return state

    def load_state_dict(self, state: dict) -> None:
        for component in self.flat:
            component.load_state_dict(state)
        for name, component in self.nested.items():
            component.load_state_dict(state.get(name, {}))


class BatchSkipper:
    """train.skip_batches: listed global batches are drawn and discarded before the step that would
    use them (the step counter does not advance). What was skipped is checkpointed, so a resume
    stays exact whether or not it repeats the option."""

    def __init__(self, skip: Sequence[int], loader, global_batch: int, accumulation: int):
        self.skip, self.loader = set(skip), loader
        self.global_batch, self.accumulation = global_batch, accumulation
        self.skipped: list[int] = []  # over the whole run, resumes included

    def next_batch_index(self, step: int, logger: MetricsLogger) -> int:
        """Pass over listed batches; returns the global index of the batch the next step trains on."""
        index = self.loader.global_samples // self.global_batch  # global batches consumed so far
        while index in self.skip:  # consumed, not learned from
            for _ in range(self.accumulation):
                next(self.loader)
            self.skipped.append(index)
            logger.event(step, "skipped_batch", batch=index, reason="train.skip_batches")
            index = self.loader.global_samples // self.global_batch
        return index

    def state_dict(self) -> dict:
        return {"skipped_batches": list(self.skipped)}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = list(state.get("skipped_batches", []))


class Evaluator:
    """Mean validation loss over a fixed list of micro-batches, every `every` steps and at the last."""

    def __init__(self, model, batches: list, every: int, autocast, device: torch.device, tp_mesh=None):
        self.model, self.batches, self.every = model, batches, every
        self.autocast, self.device, self.tp_mesh = autocast, device, tp_mesh

    def should_run(self, step: int, last: bool) -> bool:
        return bool(self.batches) and (step % self.every == 0 or last)

    def run(self) -> float:
        return evaluate(self.model, self.batches, self.autocast, self.device, self.tp_mesh)


@torch.no_grad()
def evaluate(model, batches, autocast, device: torch.device, tp_mesh=None) -> float:
    """Mean loss over a fixed list of validation micro-batches, averaged over ranks (under tensor
    parallelism from each rank's vocabulary columns, trainer.tensor_parallel.cross_entropy)."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    for batch in batches:
        with autocast:
            logits = model(batch["inputs"].to(device))
        total += cross_entropy(logits, batch["labels"].to(device), tp_mesh)
    model.train(was_training)
    return all_reduce_mean(total / max(len(batches), 1)).item()


class LogWindow:
    """The finite losses and the step count since the last metrics line: checkpointed state.

    Saved with every checkpoint, so a resumed run continues the window it stopped in and its
    next regular line covers log_every steps, exactly as without the stop.
    """

    def __init__(self):
        self.losses: list[float] = []  # finite losses of the window
        self.steps = 0  # steps in the window, finite or not

    def add(self, loss: float) -> None:
        if math.isfinite(loss):
            self.losses.append(loss)
        self.steps += 1

    def take(self) -> tuple[float, int]:
        """(mean finite loss, steps) of the window, which starts anew."""
        mean = sum(self.losses) / len(self.losses) if self.losses else float("nan")
        steps = self.steps
        self.losses, self.steps = [], 0
        return mean, steps

    def peek(self) -> tuple[float, int]:
        """(mean finite loss, steps) of the window so far, which goes on."""
        return (sum(self.losses) / len(self.losses) if self.losses else float("nan")), self.steps

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:  # {} from a checkpoint written before the window was saved
        self.losses, self.steps = [float(x) for x in state.get("losses", [])], int(state.get("steps", 0))


class StepLog:
    """Decides when a metrics.jsonl line is written and what its window averages.

    A line at step s (every log_every steps and at the last step) carries the mean loss of the
    finite steps since the previous line; `window_steps` is added when that window is not
    log_every steps (the last line, a partial line). At a stop between log steps, `flush_partial`
    writes the window so far with "partial": true and keeps it: the checkpoint saved next holds it,
    and after a resume the next regular line averages the whole window again (readers drop a
    partial line that a later line covers: reports.compare_runs). A step where only evaluation is
    due writes that step's own loss with val_loss (the window goes on).
    """

    def __init__(self, logger: MetricsLogger, evaluator: Evaluator, log_every: int, device: torch.device,
                 world_size: int, flops_per_token: float, peak_flops: float | None,
                 window: LogWindow | None = None):
        self.logger, self.evaluator, self.log_every = logger, evaluator, log_every
        self.device, self.world_size = device, world_size
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.throughput = Throughput(device)
        self.window = window if window is not None else LogWindow()
        self._last: dict = {}

    def observe(self, *, tokens: int, loss: float, lr: float, grad_norm: float, skipped_steps: int,
                tokens_per_step: int) -> None:
        """Every step, once its update is done."""
        self.throughput.add(tokens_per_step)
        self.window.add(loss)
        self._last = {"tokens": tokens, "loss": loss, "lr": lr, "grad_norm": grad_norm, "skipped_steps": skipped_steps}
        self.logger.advance()

    def end_step(self, step: int, last: bool) -> dict | None:
        """The step's metrics line (with val_loss when evaluation is due), written; None on a silent step."""
        metrics = self._window_line() if step % self.log_every == 0 or last else None
        if self.evaluator.should_run(step, last):
            now = self._last
            metrics = dict(metrics or {"tokens": now["tokens"], "loss": now["loss"], "lr": now["lr"],
                                       "grad_norm": now["grad_norm"], "tokens_per_s": None})
            metrics["val_loss"] = self.evaluator.run()
        if metrics is not None:
            self.logger.log(step, metrics)
        return metrics

    def flush_partial(self, step: int) -> None:
        """At a stop (preemption, halt): the steps since the last line, so none goes unlogged."""
        if self.window.steps and self._last:
            self.logger.log(step, dict(self._window_line(keep=True), partial=True))

    def _window_line(self, keep: bool = False) -> dict:
        speed = self.throughput.read()
        now = self._last
        loss, steps = self.window.peek() if keep else self.window.take()
        metrics = {
            "tokens": now["tokens"],
            "loss": loss,
            "lr": now["lr"],
            "grad_norm": now["grad_norm"],
            "tokens_per_s": speed["tokens_per_s"],
            "step_time_s": speed["step_time_s"],
            "mfu": mfu(speed["tokens_per_s"] / self.world_size, self.flops_per_token, self.peak_flops),
            "skipped_steps": now["skipped_steps"],
        }
        if self.device.type == "cuda":
            metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        if steps != self.log_every:
            metrics["window_steps"] = steps
        return metrics
