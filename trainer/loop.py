"""The training loop. `train(cfg)` builds everything, then runs `train_step` until done.

Order of construction (DESIGN.md): model on the meta device -> materialize and init from the
seed -> precision conversion -> activation checkpointing -> compile -> FSDP2 -> optimizer ->
data -> resume. The step itself reads top to bottom in `train_step`; side effects (logging,
evaluation, checkpoints, the late precision switch) are small calls around it in `train`.

Batch arithmetic: global_batch_size sequences per optimizer step = micro_batch_size x
data-parallel ranks x gradient-accumulation steps; tokens per step = global_batch_size x seq_len.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Sequence

import torch
import torch.nn.functional as F

from trainer import faults
from trainer.checkpoint import Checkpointer
from trainer.config import TrainConfig
from trainer.distributed import DistEnv, all_reduce_mean, broadcast_object, init_distributed, parallelize, shutdown
from trainer.guards import OOM_ADVICE, NonFiniteHalt, PreemptionFlag, StepGuard
from trainer.heartbeat import raise_if_collective_timeout
from trainer.hardware import bf16_peak_flops
from trainer.hf_init import adopt_hf_architecture, load_hf_weights
from trainer.metrics import MetricsLogger, Throughput, mfu
from trainer.optim import build_optimizer, lr_at, set_lr
from trainer.quant_report import QuantDiagnostics
from trainer.run_info import write_run_description
from trainer.validate import validate_train_config


@dataclass
class TrainState:
    """What a checkpoint must restore besides model and optimizer."""

    step: int = 0
    tokens: int = 0
    history: List[float] = field(default_factory=list)  # loss of every step of this process's run


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
    """Override what you need. Called on every rank."""

    def on_after_backward(self, ctx: StepContext) -> None:
        pass

    def on_step_end(self, ctx: StepContext, metrics: dict) -> None:
        pass


def train(cfg: TrainConfig, callbacks: Sequence[Callback] = ()) -> dict:
    """Run training as configured. Returns a summary (final step, losses, run dir, ...)."""
    validate_train_config(cfg)  # every field in range before any process group, data or model
    env = init_distributed(cfg.parallel)
    try:
        return _train(cfg, env, list(callbacks))
    finally:
        shutdown()


def _train(cfg: TrainConfig, env: DistEnv, callbacks: List[Callback]) -> dict:
    from data import build_tokenizer, build_train_loader, build_validation_batches
    from models.flops import flops_per_token
    from models.quant.recipe import apply_precision

    run_dir = Path(broadcast_object(cfg.run_dir or "outputs/run"))
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    if cfg.checkpoint.init_from_hf:  # the directory's config.json sets the architecture
        adopted, changed = adopt_hf_architecture(cfg.model, cfg.checkpoint.init_from_hf)
        cfg = dataclasses.replace(cfg, model=adopted)
        if env.is_main and changed:
            print(f"checkpoint.init_from_hf: model config from {cfg.checkpoint.init_from_hf}/config.json; changed: "
                  + ", ".join(f"{k} {was!r} -> {now!r}" for k, (was, now) in changed.items()), flush=True)

    # ---- data and tokenizer first: a bad data config fails before any model is built
    tokenizer = build_tokenizer(cfg.data)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise ValueError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's vocabulary "
            f"({tokenizer.vocab_size}); raise model.vocab_size or pick another data.tokenizer"
        )
    micro, global_batch = cfg.train.micro_batch_size, cfg.train.global_batch_size
    if global_batch % (micro * env.world_size):
        raise ValueError(
            f"train.global_batch_size ({global_batch}) must be a multiple of train.micro_batch_size ({micro}) "
            f"x data-parallel ranks ({env.world_size})"
        )
    accumulation = global_batch // (micro * env.world_size)
    seq_len = cfg.data.seq_len
    tokens_per_step = global_batch * seq_len
    loader = build_train_loader(cfg.data, micro_batch_size=micro, dp_rank=env.rank,
                                dp_world_size=env.world_size, seed=cfg.data.seed)
    validation = (build_validation_batches(cfg.data, micro_batch_size=micro, dp_rank=env.rank,
                                           dp_world_size=env.world_size)[: cfg.train.eval_batches]
                  if cfg.train.eval_every > 0 else [])

    # ---- model: meta -> device -> init -> precision -> AC -> compile -> FSDP2
    model = build_model_on(cfg, env.device)
    plan = apply_precision(model, cfg.precision, device=env.device)
    applied = parallelize(model, cfg.parallel, env)
    autocast = (torch.autocast(env.device.type, dtype=applied["autocast_dtype"])
                if applied["autocast_dtype"] is not None else contextlib.nullcontext())
    optimizer = build_optimizer(model, cfg.optim, env.device)

    # ---- resume
    state, guard = TrainState(), StepGuard(cfg.train.max_consecutive_skips, cfg.train.spike_factor)
    checkpointer = Checkpointer(cfg.checkpoint, run_dir, env, model_config=cfg.model, precision_backend=plan.backend)
    resume_from = checkpointer.select_resume()  # verified (checksums) before anything of it is read
    skipped_batches: List[int] = []  # global batch indices passed over by train.skip_batches, over the run
    if resume_from is not None:
        saved = checkpointer.load(resume_from, model, optimizer)  # compares the model first
        state.step, state.tokens = saved["step"], saved["tokens"]
        loader.load_state_dict(saved["data"])
        guard.load_state_dict(saved["guard"])
        plan.load_state_dict(saved.get("precision", {}))
        skipped_batches = list(saved.get("skipped_batches", []))
    elif cfg.checkpoint.init_from_hf:  # weights only: optimizer, schedule and data start fresh
        load_hf_weights(model, cfg.checkpoint.init_from_hf, env)

    if env.is_main:
        plan_text = plan.render()
        print(plan_text, flush=True)
        (run_dir / "precision_plan.txt").write_text(plan_text + "\n")
        write_run_description(cfg, run_dir, world_size=env.world_size, device=env.device, tokenizer=tokenizer.record)
    logger = MetricsLogger(cfg, run_dir, env.is_main, cfg.train.steps, start_step=state.step)
    if env.is_main:
        logger.log_config_extra({"precision_plan": plan.summary(), "parallel_applied": applied,
                                 "gradient_accumulation": accumulation, "tokens_per_step": tokens_per_step})
        for moved, reason in checkpointer.set_aside:
            logger.event(state.step, "checkpoint_set_aside", path=moved, reason=reason)
        if resume_from is not None:
            logger.event(state.step, "resumed", path=str(resume_from), tokens=state.tokens)
            if "model_changes" in saved:  # checkpoint.allow_model_change
                logger.event(state.step, "model_changed_on_resume", changes=saved["model_changes"],
                             **saved["model_load"])
        elif cfg.checkpoint.init_from_hf:
            logger.event(state.step, "init_from_hf", path=str(cfg.checkpoint.init_from_hf))

    model_flops_per_token = flops_per_token(cfg.model, seq_len)
    peak = bf16_peak_flops(env.device) if env.device.type == "cuda" else None
    diagnostics = QuantDiagnostics(model, plan, cfg.logging.quant_diagnostics_every, logger, run_dir, env.is_main)
    preemption = PreemptionFlag(env.device)
    throughput = Throughput(env.device)
    ctx = StepContext(cfg, env, model, optimizer, state, logger)
    interval_losses: List[float] = []
    last_saved_step = state.step if resume_from is not None else -1
    status = "completed"

    def trainer_state() -> dict:
        return {"step": state.step, "tokens": state.tokens, "seed": cfg.seed, "data": loader.state_dict(),
                "guard": guard.state_dict(), "precision": plan.state_dict(), "skipped_batches": list(skipped_batches),
                "model_config": dataclasses.asdict(cfg.model),  # lets scripts/export_hf.py rebuild the model
                "tokenizer": tokenizer.record}  # and export the tokenizer it was trained with (path, sha256)

    skip_batches = set(cfg.train.skip_batches)
    streak_batches: List[int] = []  # global batch indices of the current run of non-finite steps
    phase = "the first step"  # what the collectives in flight belong to, for a timeout's message
    try:
        while state.step < cfg.train.steps:
            batch_index = loader.global_samples // global_batch  # global batches consumed so far
            while batch_index in skip_batches:  # consumed, not learned from (docs/reliability.md)
                for _ in range(accumulation):
                    next(loader)
                skipped_batches.append(batch_index)
                logger.event(state.step, "skipped_batch", batch=batch_index, reason="train.skip_batches")
                batch_index = loader.global_samples // global_batch
            phase = f"step {state.step} (FSDP all-gather / reduce-scatter, loss all-reduce)"
            switched = plan.maybe_switch(state.step, state.tokens)
            if switched:
                logger.event(state.step, "precision_switch", tokens=state.tokens, **switched)
            plan.set_step(state.step)
            lr = lr_at(state.step, cfg.train.steps, cfg.optim)
            set_lr(optimizer, lr)

            try:
                with diagnostics.recording(state.step):
                    loss, grad_norm = train_step(model, optimizer, loader, accumulation, autocast, env.device,
                                                 cfg.optim.grad_clip,
                                                 lambda: [cb.on_after_backward(ctx) for cb in callbacks])
            except torch.OutOfMemoryError as error:
                raise RuntimeError(f"step {state.step}: {OOM_ADVICE}") from error

            applied_update = guard.accept(loss, grad_norm)
            streak_batches = [] if applied_update else streak_batches + [batch_index]
            if applied_update:
                optimizer.step()
            else:
                logger.event(state.step, "skipped_step", loss=loss, grad_norm=grad_norm,
                             in_a_row=guard.skipped_in_a_row, batch=batch_index)
            optimizer.zero_grad(set_to_none=True)
            if guard.is_spike(loss):
                logger.event(state.step, "loss_spike", loss=loss)

            state.step += 1
            state.tokens += tokens_per_step
            state.history.append(loss)
            throughput.add(tokens_per_step)
            if math.isfinite(loss):
                interval_losses.append(loss)
            logger.advance()

            metrics = None
            is_last = state.step == cfg.train.steps
            if state.step % cfg.logging.log_every == 0 or is_last:
                speed = throughput.read()
                metrics = {
                    "tokens": state.tokens,
                    "loss": sum(interval_losses) / len(interval_losses) if interval_losses else float("nan"),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": speed["tokens_per_s"],
                    "step_time_s": speed["step_time_s"],
                    "mfu": mfu(speed["tokens_per_s"] / env.world_size, model_flops_per_token, peak),
                    "skipped_steps": guard.skipped_total,
                }
                if env.device.type == "cuda":
                    metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated(env.device) / 2**30
                interval_losses = []
            phase = f"validation or logging after step {state.step}"
            if validation and (state.step % cfg.train.eval_every == 0 or is_last):
                metrics = dict(metrics or {"tokens": state.tokens, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                                           "tokens_per_s": None})
                metrics["val_loss"] = evaluate(model, validation, autocast, env.device)
            if metrics is not None:
                logger.log(state.step, metrics)
            diagnostics.report(state.step)
            for callback in callbacks:
                callback.on_step_end(ctx, metrics or {})

            phase = f"checkpoint or preemption check after step {state.step}"
            if guard.must_halt():
                checkpointer.save(state.step, model, optimizer, trainer_state())
                raise NonFiniteHalt(
                    f"{guard.skipped_in_a_row} consecutive steps had a non-finite loss or grad norm "
                    f"(limit train.max_consecutive_skips={cfg.train.max_consecutive_skips}); "
                    f"checkpoint saved at step {state.step}. The newest checkpoint saved before these steps is "
                    f"never pruned: resume from it with a lower optim.lr, or pass over the batches of this run "
                    f"with train.skip_batches={streak_batches} (docs/reliability.md)"
                )
            checkpointer.poll()
            if cfg.checkpoint.every and state.step % cfg.checkpoint.every == 0 and not is_last:
                checkpointer.save(state.step, model, optimizer, trainer_state())
                last_saved_step = state.step
                logger.event(state.step, "checkpoint", tokens=state.tokens)
            faults.maybe_kill(faults.KILL_AT_STEP, state.step)  # after everything step N does
            if preemption.requested():
                checkpointer.save(state.step, model, optimizer, trainer_state())
                last_saved_step = state.step
                logger.event(state.step, "preempted", signal=preemption.signal_name or "peer rank")
                status = "preempted"
                break

        phase = f"the final checkpoint at step {state.step}"
        if cfg.checkpoint.save_at_end and status == "completed" and last_saved_step != state.step:
            checkpointer.save(state.step, model, optimizer, trainer_state())
            logger.event(state.step, "checkpoint", tokens=state.tokens)
        checkpointer.wait()
        if cfg.checkpoint.export_hf_at_end and status == "completed":
            from trainer.hf_export import export_at_end

            exported = export_at_end(model, cfg, tokenizer, env, Path(cfg.checkpoint.export_hf_dir or run_dir / "hf"))
            if exported is not None:
                logger.event(state.step, "export_hf", path=str(exported))
    except RuntimeError as error:
        raise_if_collective_timeout(error, phase, env.rank, cfg.parallel.collective_timeout_s)
        raise
    finally:
        preemption.restore()
        logger.close()
    return {"status": status, "step": state.step, "tokens": state.tokens, "losses": state.history,
            "run_dir": str(run_dir), "skipped_steps": guard.skipped_total, "plan": plan.summary()}


def build_model_on(cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """Build on the meta device (no memory), materialize on `device`, initialize from cfg.seed.

    The full model is materialized on every rank before FSDP shards it, so the initial weights
    are identical for every world size (the basis of resharding and world-size comparisons).
    """
    from models import build_model

    with torch.device("meta"):
        model = build_model(cfg.model)
    model.to_empty(device=device)
    torch.manual_seed(cfg.seed)
    with torch.no_grad():
        model.init_weights()
    return model


def train_step(model, optimizer, loader, accumulation: int, autocast, device: torch.device,
               grad_clip: float, after_backward: Callable[[], None]):
    """Forward and backward over `accumulation` micro-batches; returns (mean loss, global grad norm).

    The optimizer update is the caller's (it may be skipped). One host sync per step: the loss
    and the grad norm are read together to decide whether the update is applied.
    """
    set_sync = getattr(model, "set_requires_gradient_sync", None)  # present under FSDP2
    loss_sum = torch.zeros((), device=device)
    for micro_step in range(accumulation):
        batch = next(loader)
        inputs = batch["inputs"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        if set_sync is not None:
            set_sync(micro_step == accumulation - 1)  # reduce-scatter gradients once, at the end
        with autocast:
            logits = model(inputs)
        # [B, T, V] -> [B*T, V]; the loss in fp32 whatever the compute dtype
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) / accumulation
        loss.backward()
        loss_sum += loss.detach()
    after_backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"),
                                               foreach=device.type == "cuda")
    if hasattr(grad_norm, "full_tensor"):  # DTensor under FSDP2: already reduced over ranks
        grad_norm = grad_norm.full_tensor()
    loss_mean = all_reduce_mean(loss_sum)
    values = torch.stack([loss_mean.float(), grad_norm.float().to(device)]).tolist()
    return values[0], values[1]


@torch.no_grad()
def evaluate(model, batches, autocast, device: torch.device) -> float:
    """Mean loss over a fixed list of validation micro-batches, averaged over ranks."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    for batch in batches:
        with autocast:
            logits = model(batch["inputs"].to(device))
        total += F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].to(device).flatten())
    model.train(was_training)
    return all_reduce_mean(total / max(len(batches), 1)).item()
