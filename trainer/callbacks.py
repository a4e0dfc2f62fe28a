"""Callbacks: what runs around the step without being the step.

The loop calls, on every rank and in this order for each step:

  on_step_start(ctx)         before the forward (the step's batch not yet drawn); ctx.state.step = steps done
  on_micro_step_start(ctx, i) before micro-batch i's forward (gradient accumulation: i = 0 .. n-1)
  on_after_backward(ctx)     gradients complete, before clipping and the optimizer update
  on_step_end(ctx, metrics)  after the update, the metrics line and evaluation; ctx.state.step counts this step
  on_step_boundary(ctx)      after everything step N does (halt check, periodic checkpoint), before the
                             preemption check: a restart from here resumes from what is on disk

Two callbacks of the trainer's own are always installed first:
- `PrecisionRuntime`: the late switch to BF16 (precision.switch_to_bf16_at_step / _at_tokens) and the
  per-step re-seeding of stochastic rounding; its state (switched or not) goes into every checkpoint.
- `DiagnosticsCallback`: quantization diagnostics every logging.quant_diagnostics_every steps
  (trainer/quant_report.py).
Tests add their own (tests/trainer: NaN gradients, kills at a step).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from trainer.config import TrainConfig
from trainer.distributed import DistEnv
from trainer.metrics import MetricsLogger


@dataclass
class TrainState:
    """Where the run is: steps and tokens done (checkpointed), and this process's losses (not)."""

    step: int = 0
    tokens: int = 0
    history: list[float] = field(default_factory=list)  # loss of every step of this process's run

    def advance(self, loss: float, tokens: int) -> None:
        self.step += 1
        self.tokens += tokens
        self.history.append(loss)

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens = state["step"], state["tokens"]


@dataclass
class StepContext:
    """Handed to callbacks: everything a side effect might need."""

    cfg: TrainConfig
    env: DistEnv
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: TrainState
    logger: MetricsLogger


class Callback:
    """Override what you need. Called on every rank (module docstring: when)."""

    def on_step_start(self, ctx: StepContext) -> None:
        pass

    def on_micro_step_start(self, ctx: StepContext, micro_step: int) -> None:
        pass

    def on_after_backward(self, ctx: StepContext) -> None:
        pass

    def on_step_end(self, ctx: StepContext, metrics: dict) -> None:
        pass

    def on_step_boundary(self, ctx: StepContext) -> None:
        pass


class PrecisionRuntime(Callback):
    """The precision plan over time: late switch to BF16, stochastic-rounding seeds per step.

    Stateful: `state_dict()` is the plan's (whether the switch happened), saved in every checkpoint
    under "precision", so a run resumed after the switch continues in BF16.
    """

    def __init__(self, plan):
        self.plan = plan

    def on_step_start(self, ctx: StepContext) -> None:
        switched = self.plan.maybe_switch(ctx.state.step, ctx.state.tokens)
        if switched:
            ctx.logger.event(ctx.state.step, "precision_switch", tokens=ctx.state.tokens, **switched)
        self.plan.set_step(ctx.state.step)  # SR draws from (seed, layer, step, rank): resumes round alike

    def on_micro_step_start(self, ctx: StepContext, micro_step: int) -> None:
        if micro_step:  # set_step wrote micro-batch 0's seeds
            self.plan.set_micro_step(micro_step)  # each micro-batch rounds with its own draws

    def state_dict(self) -> dict:
        return self.plan.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.plan.load_state_dict(state)


class DiagnosticsCallback(Callback):
    """Arms `QuantDiagnostics`' recorder for the forward and backward of a due step, reports after it."""

    def __init__(self, diagnostics):
        self.diagnostics = diagnostics
        self._recording = contextlib.ExitStack()

    def on_step_start(self, ctx: StepContext) -> None:
        self._recording.enter_context(self.diagnostics.recording(ctx.state.step))

    def on_after_backward(self, ctx: StepContext) -> None:
        self._recording.close()  # disarmed before clipping, evaluation or anything else runs the model

    def on_step_end(self, ctx: StepContext, metrics: dict) -> None:
        self.diagnostics.report(ctx.state.step)


def call(callbacks: list[Callback], hook: str, *args) -> None:
    """Run one hook of every callback, in order."""
    for callback in callbacks:
        getattr(callback, hook)(*args)
