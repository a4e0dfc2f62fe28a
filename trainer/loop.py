"""The training loop. `train(cfg)` builds everything, then runs the steps, top to bottom.

Order of construction (docs/ARCHITECTURE.md): model on the meta device -> materialize and init from the
seed -> precision conversion -> activation checkpointing -> compile -> FSDP2 -> optimizer ->
data -> resume. Each step is one sequence of calls in `_train`: the forward and backward are
`train_step`; every side effect is a component that owns its timing (trainer/components.py:
`StepLog` logs and evaluates, `BatchSkipper`; trainer/checkpoint/checkpointer.py: `Checkpointer.maybe_save`;
trainer/guards.py: `StepGuard`, `PreemptionFlag`) or a callback (trainer/callbacks.py: the
precision runtime, quantization diagnostics, and the caller's). A checkpoint's trainer state is
assembled from named components (`CheckpointedState`).

Batch arithmetic: global_batch_size sequences per optimizer step = micro_batch_size x
data-parallel ranks x gradient-accumulation steps; tokens per step = global_batch_size x seq_len.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from trainer.callbacks import (
    Callback,
    DiagnosticsCallback,
    PrecisionRuntime,
    StepContext,
    TrainState,
    call,
)
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.probe import expected_checkpoint_bytes, probe_checkpoint_directory
from trainer.checkpoint.layout import read_trainer_state
from trainer.checkpoint.resume_changes import check_steps_left, resume_events, start_record_names
from trainer.components import (
    BatchSkipper,
    CheckpointedState,
    Evaluator,
    LogWindow,
    StepLog,
    evaluate,
)
from trainer.config import ParallelConfig, TrainConfig
from trainer.cuda_graph import GraphedMicroStep, check_cuda_graph_supported
from trainer.distributed import (
    DistEnv,
    all_reduce_mean,
    broadcast_object,
    init_distributed,
    parallelize,
    set_fsdp_micro_step,
    shutdown,
)
from trainer.guards import OOM_ADVICE, NonFiniteHalt, PreemptionFlag, StepGuard, stop_after_failure
from trainer.hardware import bf16_peak_flops
from trainer.heartbeat import raise_if_collective_timeout
from trainer.hf.load import adopt_hf_architecture, load_hf_weights
from trainer.metrics import MetricsLogger
from trainer.optim import build_optimizer, lr_at, schedule_warning, set_lr
from trainer.preflight import PlanCheck
from trainer.quant_report import QuantDiagnostics
from trainer.run_info import write_run_description
from trainer.run_lock import DEFAULT_RUN_DIR, hold_run_directory
from trainer.startup import Settled, start_run
from trainer.tensor_parallel import cross_entropy
from trainer.validate import ConfigError

__all__ = ["Callback", "StepContext", "TrainState", "build_model_on", "evaluate", "train", "train_step"]


def train(cfg: TrainConfig, callbacks: Sequence[Callback] = (), *, auto_named_run_dir: bool = False,
          run_files: dict | None = None) -> dict:
    """Run training as configured. Returns a summary (final step, losses, run dir, ...).

    auto_named_run_dir: the entry point named cfg.run_dir (outputs/<date>/<time>): it must hold no earlier
    run, else the next free name is used (trainer/run_lock.py). run_files: {relative path: text} rank 0
    writes into the run directory with its description (the entry point's .hydra/ files)."""
    startup = start_run(cfg)  # fields, parallel=auto, the batch, the preflight, export dir, data: trainer/startup.py
    cfg, run_plan = startup.cfg, startup.plan
    env = init_distributed(cfg.parallel)
    try:
        with hold_run_directory(cfg.run_dir or DEFAULT_RUN_DIR, cfg.checkpoint.dir, env,  # one trainer per run
                                auto_named=auto_named_run_dir) as held:
            if held.renamed_from:
                cfg = dataclasses.replace(cfg, run_dir=str(held.run_dir))
            probe_checkpoint_directory(held.checkpoint_dir, env, expected_checkpoint_bytes(cfg.model),
                                       cfg.checkpoint.keep)  # writable, with room: not found at the first save
            return _train(cfg, env, list(callbacks), run_plan, run_files, startup)
    finally:
        shutdown()


def _train(cfg: TrainConfig, env: DistEnv, user_callbacks: list[Callback], run_plan=None, run_files=None,
           startup: Settled | None = None) -> dict:
    from data import build_tokenizer, build_train_loader, build_validation_batches
    from models.flops import flops_per_token
    from models.quant.recipe import apply_precision

    run_dir = Path(broadcast_object(cfg.run_dir or DEFAULT_RUN_DIR))
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    cfg = _adopt_hf_architecture(cfg, env)

    # ---- data and tokenizer first: a bad data config fails before any model is built
    tokenizer = build_tokenizer(cfg.data)
    accumulation, tokens_per_step = _batch_arithmetic(cfg, env, tokenizer.vocab_size)
    piece = (env.cp_rank, env.cp)  # context parallelism: this rank's tokens of every sequence
    loader = build_train_loader(cfg.data, micro_batch_size=cfg.train.micro_batch_size, dp_rank=env.dp_rank,
                                dp_world_size=env.dp_size, seed=cfg.data.seed, sequence_piece=piece)
    validation = (build_validation_batches(cfg.data, micro_batch_size=cfg.train.micro_batch_size, dp_rank=env.dp_rank,
                                           dp_world_size=env.dp_size, sequence_piece=piece)[: cfg.train.eval_batches]
                  if cfg.train.eval_every > 0 else [])

    # ---- model: meta -> device -> init -> precision -> AC -> compile -> FSDP2
    model = build_model_on(cfg, env.device)
    plan = apply_precision(model, cfg.precision, device=env.device, tensor_parallel=env.tp > 1)
    applied = parallelize(model, cfg.parallel, env, cfg.data.seq_len)
    if cfg.parallel.cuda_graph:  # refused here, before any log file or W&B run is opened
        check_cuda_graph_supported(env, applied, plan.backend)
    autocast = (torch.autocast(env.device.type, dtype=applied["autocast_dtype"])
                if applied["autocast_dtype"] is not None else contextlib.nullcontext())
    optimizer = build_optimizer(model, cfg.optim, env.device)

    # ---- the run's state, by component, and resume
    state, precision = TrainState(), PrecisionRuntime(plan)
    guard = StepGuard(cfg.train.max_consecutive_skips, cfg.train.spike_factor)
    skipper = BatchSkipper(cfg.train.skip_batches, loader, cfg.train.global_batch_size, accumulation)
    log_window = LogWindow()  # the metrics window in progress: a resume continues it
    trainer_state = CheckpointedState(
        flat=[state, skipper],
        nested={"data": loader, "guard": guard, "precision": precision, "log_window": log_window},
        records={"seed": cfg.seed,
                 "model_config": dataclasses.asdict(cfg.model),  # lets `python -m trainer.export_hf` rebuild the model
                 "tokenizer": tokenizer.record,  # and export the tokenizer it was trained with (path, sha256)
                 "corpus": loader.corpus_identity(), "config": dataclasses.asdict(cfg)})  # compared on resume
    checkpointer = Checkpointer(cfg.checkpoint, run_dir, env, model_config=cfg.model, precision_backend=plan.backend)
    checkpointer.track(model, optimizer, trainer_state)
    resume_from = checkpointer.select_resume()  # verified (checksums) before anything of it is read
    saved = {}
    if resume_from is not None:
        check_steps_left(read_trainer_state(resume_from)["step"], cfg.train.steps, resume_from, env.is_main)
        saved = checkpointer.load(resume_from, model, optimizer)  # compares model, tokenizer and corpus first
        trainer_state.load_state_dict(saved)
    elif cfg.checkpoint.init_from_hf:  # weights only: optimizer, schedule and data start fresh
        load_hf_weights(model, cfg.checkpoint.init_from_hf, env)

    logger = MetricsLogger(cfg, run_dir, env.is_main, cfg.train.steps, start_step=state.step)
    _announce(cfg, env, run_dir, logger, plan, applied, tokenizer, checkpointer, resume_from, saved, state,
              accumulation=accumulation, tokens_per_step=tokens_per_step, run_plan=run_plan, run_files=run_files,
              startup=startup)
    step_log = StepLog(logger, Evaluator(model, validation, cfg.train.eval_every, autocast, env.device,
                                             env.tp_mesh),
                       cfg.logging.log_every, env.device, env.world_size,
                       flops_per_token(cfg.model, cfg.data.seq_len),
                       bf16_peak_flops(env.device) if env.device.type == "cuda" else None, window=log_window)
    diagnostics = QuantDiagnostics(model, plan, cfg.logging.quant_diagnostics_every, logger, run_dir, env.is_main)
    callbacks = [precision, DiagnosticsCallback(diagnostics), PlanCheck(run_plan), *user_callbacks]
    run_micro_step = _graphed_micro_step(cfg, env, plan, model, autocast, accumulation, diagnostics, state, logger)
    ctx = StepContext(cfg, env, model, optimizer, state, logger)
    preemption = PreemptionFlag(env.device)
    status = "completed"
    streak: list[int] = []  # global batch indices of the current run of non-finite steps
    phase = "the first step"  # what the collectives in flight belong to, for a timeout's message
    try:
        while state.step < cfg.train.steps:
            batch_index = skipper.next_batch_index(state.step, logger)  # train.skip_batches
            phase = f"step {state.step} (FSDP all-gather / reduce-scatter, loss all-reduce)"
            call(callbacks, "on_step_start", ctx)  # late BF16 switch, SR seeds, diagnostics armed
            lr = lr_at(state.step, cfg.train.steps, cfg.optim)
            set_lr(optimizer, lr)
            try:
                loss, grad_norm = train_step(model, optimizer, loader, accumulation, autocast, env.device,
                                             cfg.optim.grad_clip, lambda: call(callbacks, "on_after_backward", ctx),
                                             lambda micro: call(callbacks, "on_micro_step_start", ctx, micro),
                                             run_micro_step, cfg.parallel, env.tp_mesh)
            except torch.OutOfMemoryError as error:
                raise RuntimeError(f"step {state.step}: {OOM_ADVICE}") from error

            if guard.accept(loss, grad_norm):
                optimizer.step()
                streak = []
            else:  # non-finite: no update, the batch is consumed
                streak.append(batch_index)
                logger.event(state.step, "skipped_step", loss=loss, grad_norm=grad_norm,
                             in_a_row=guard.skipped_in_a_row, batch=batch_index)
            optimizer.zero_grad(set_to_none=True)
            if guard.is_spike(loss):
                logger.event(state.step, "loss_spike", loss=loss)
            state.advance(loss, tokens_per_step)

            phase = f"validation or logging after step {state.step}"
            is_last = state.step == cfg.train.steps
            step_log.observe(tokens=state.tokens, loss=loss, lr=lr, grad_norm=grad_norm,
                             skipped_steps=guard.skipped_total, tokens_per_step=tokens_per_step)
            metrics = step_log.end_step(state.step, last=is_last)  # metrics.jsonl line, val_loss when due
            call(callbacks, "on_step_end", ctx, metrics or {})  # diagnostics report when due

            phase = f"checkpoint or preemption check after step {state.step}"
            if guard.must_halt():
                step_log.flush_partial(state.step)
                checkpointer.save_now(state.step)
                raise NonFiniteHalt(_halt_message(guard, cfg, state.step, streak))
            if checkpointer.maybe_save(state.step, last=is_last):  # checkpoint.every
                logger.event(state.step, "checkpoint", tokens=state.tokens)
            call(callbacks, "on_step_boundary", ctx)
            if preemption.requested(logger.write_failure):  # collective: every rank stops at the same step
                step_log.flush_partial(state.step)
                if preemption.failure:  # the log cannot be written: checkpoint attempt, then RunStopped
                    stop_after_failure(checkpointer, state.step, preemption.failure)
                checkpointer.save_now(state.step)
                logger.event(state.step, "preempted", signal=preemption.signal_name or "peer rank")
                status = "preempted"
                break

        phase = f"the final checkpoint at step {state.step}"
        if checkpointer.save_final(state.step, completed=status == "completed"):  # checkpoint.save_at_end
            logger.event(state.step, "checkpoint", tokens=state.tokens)
        if cfg.checkpoint.export_hf_at_end and status == "completed":
            _export_hf(model, cfg, tokenizer, env, run_dir, logger, state.step)
    except RuntimeError as error:
        raise_if_collective_timeout(error, phase, env.rank, cfg.parallel.collective_timeout_s)
        raise
    finally:
        preemption.restore()
        logger.close()
    return {"status": status, "step": state.step, "tokens": state.tokens, "losses": state.history,
            "run_dir": str(run_dir), "skipped_steps": guard.skipped_total, "plan": plan.summary()}


# ---------------------------------------------------------------------------- the setup's parts
def _adopt_hf_architecture(cfg: TrainConfig, env: DistEnv) -> TrainConfig:
    """checkpoint.init_from_hf: the directory's config.json sets the architecture."""
    if not cfg.checkpoint.init_from_hf:
        return cfg
    adopted, changed = adopt_hf_architecture(cfg.model, cfg.checkpoint.init_from_hf)
    if env.is_main and changed:
        print(f"checkpoint.init_from_hf: model config from {cfg.checkpoint.init_from_hf}/config.json; changed: "
              + ", ".join(f"{k} {was!r} -> {now!r}" for k, (was, now) in changed.items()), flush=True)
    return dataclasses.replace(cfg, model=adopted)


def _batch_arithmetic(cfg: TrainConfig, env: DistEnv, vocab_size: int):
    """(gradient-accumulation steps, tokens per step); errors name the fields to change."""
    if vocab_size > cfg.model.vocab_size:
        raise ConfigError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's vocabulary "
            f"({vocab_size}); raise model.vocab_size or pick another data.tokenizer"
        )
    micro, global_batch = cfg.train.micro_batch_size, cfg.train.global_batch_size
    if global_batch % (micro * env.dp_size):  # the start-up stage adjusted or refused it already
        raise ConfigError(
            f"train.global_batch_size ({global_batch}) must be a multiple of train.micro_batch_size ({micro}) "
            f"x data-parallel ranks ({env.dp_size})"
        )
    return global_batch // (micro * env.dp_size), global_batch * cfg.data.seq_len


def _announce(cfg, env, run_dir, logger, plan, applied, tokenizer, checkpointer, resume_from, saved, state,
              **config_extra) -> None:
    """Rank 0: the precision plan, the run description, and the events of the start."""
    if not env.is_main:
        return
    plan_text = plan.render()
    logger.echo(plan_text)  # above the progress bar, which is drawn already
    (run_dir / "precision_plan.txt").write_text(plan_text + "\n")
    run_plan = config_extra["run_plan"].as_dict() if config_extra["run_plan"] is not None else None
    startup = config_extra["startup"]
    layout_record = startup.record() if startup is not None else None
    if startup is not None and startup.choice is not None:
        logger.echo(startup.choice.line())  # parallel=auto's layout, planned step time and MFU
    if startup is not None and startup.batch.adjusted:
        logger.echo(startup.batch.announcement())
    if cfg.parallel.gather_nvfp4_weights:  # none where no layer takes codes (TE's, 1D weight tiles, no FSDP...)
        logger.echo(f"FSDP2 gathers {applied['nvfp4_weights_gathered_as_codes']} NVFP4 weights as their codes "
                    "(parallel.gather_nvfp4_weights)")
    write_run_description(cfg, run_dir, world_size=env.world_size, device=env.device, tokenizer=tokenizer.record,
                          plan=run_plan, start=layout_record,
                          names=start_record_names(run_dir, state.step),  # each start's own
                          extra_files=config_extra["run_files"])
    logger.log_config_extra({"precision_plan": plan.summary(), "parallel_applied": applied, "run_plan": run_plan,
                             "start": layout_record,
                             "gradient_accumulation": config_extra["accumulation"],
                             "tokens_per_step": config_extra["tokens_per_step"]})
    if startup is not None and startup.choice is not None:
        logger.event(state.step, "layout_chosen", line=startup.choice.line(), overrides=startup.choice.overrides())
    if startup is not None and startup.batch.adjusted:
        logger.event(state.step, "batch_adjusted", **startup.batch.event_fields())
    for moved, reason in checkpointer.set_aside:
        logger.event(state.step, "checkpoint_set_aside", path=moved, reason=reason)
    if resume_from is not None:
        logger.event(state.step, "resumed", path=str(resume_from), tokens=state.tokens)
        if "model_changes" in saved:  # checkpoint.allow_model_change
            logger.event(state.step, "model_changed_on_resume", changes=saved["model_changes"],
                         **saved["model_load"])
        for name, fields in resume_events(saved, cfg, env.world_size):  # tokenizer, data, config, world size
            logger.event(state.step, name, **fields)
    elif cfg.checkpoint.init_from_hf:
        logger.event(state.step, "init_from_hf", path=str(cfg.checkpoint.init_from_hf))
    warning = schedule_warning(cfg.optim, cfg.train.steps)  # a run no longer than its warm-up, say
    if warning is not None:
        logger.event(state.step, "lr_schedule_warning", **warning)


def _halt_message(guard: StepGuard, cfg: TrainConfig, step: int, streak: list[int]) -> str:
    return (f"{guard.skipped_in_a_row} consecutive steps had a non-finite loss or grad norm "
            f"(limit train.max_consecutive_skips={cfg.train.max_consecutive_skips}); "
            f"checkpoint saved at step {step}. The newest checkpoint saved before these steps is "
            f"never pruned: resume from it with a lower optim.lr, or pass over the batches of this run "
            f"with train.skip_batches={streak} (docs/reliability.md)")


def _export_hf(model, cfg: TrainConfig, tokenizer, env: DistEnv, run_dir: Path, logger: MetricsLogger,
               step: int) -> None:
    from trainer.hf.export import export_at_end

    exported = export_at_end(model, cfg, tokenizer, env, Path(cfg.checkpoint.export_hf_dir or run_dir / "hf"))
    if exported is not None:
        logger.event(step, "export_hf", path=str(exported))


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


def _graphed_micro_step(cfg: TrainConfig, env: DistEnv, plan, model, autocast, accumulation: int,
                        diagnostics: QuantDiagnostics, state: TrainState, logger: MetricsLogger):
    """parallel.cuda_graph: train_step's micro-step replayed from a CUDA graph (None: run eagerly).

    Steps with quantization diagnostics due run eagerly (their hooks are Python); the late BF16
    switch is a new variant, recorded anew (trainer/cuda_graph.py). Each recording is an event.
    """
    if not cfg.parallel.cuda_graph:
        return None
    graphed = GraphedMicroStep(model, lambda batch: forward_backward(model, batch, autocast, env.device, accumulation),
                               env.device)

    def run_micro_step(batch, micro_step: int) -> torch.Tensor:
        captures = graphed.captures
        loss = graphed(batch, micro_step, eager=diagnostics.due(state.step), variant=plan.switched)
        if graphed.captures != captures:
            logger.event(state.step, "cuda_graph_recorded", micro_step=micro_step, switched_to_bf16=plan.switched)
        return loss

    return run_micro_step


def forward_backward(model, batch, autocast, device: torch.device, accumulation: int = 1, tp_mesh=None) -> torch.Tensor:
    """One micro-batch: forward, the fp32 loss divided by ``accumulation``, backward; the loss, detached.

    batch: "inputs" and "labels", [B, T] token ids. No host sync (the benchmark times this alone).
    Under tensor parallelism (``tp_mesh``) the model returns this rank's vocabulary columns of the
    logits and the loss is reduced over the tp group: every tp rank backpropagates the same loss of
    the whole micro-batch (trainer.tensor_parallel.cross_entropy).
    """
    inputs = batch["inputs"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    with autocast:
        logits = model(inputs)
    loss = cross_entropy(logits, labels, tp_mesh) / accumulation  # in fp32 whatever the compute dtype
    loss.backward()
    return loss.detach()


def train_step(model, optimizer, loader, accumulation: int, autocast, device: torch.device,
               grad_clip: float, after_backward: Callable[[], None],
               before_micro_step: Callable[[int], None] = lambda micro_step: None,
               run_micro_step: Callable[[dict, int], torch.Tensor] | None = None,
               parallel: ParallelConfig | None = None, tp_mesh=None):
    """Forward and backward over `accumulation` micro-batches; returns (mean loss, global grad norm).

    ``before_micro_step(i)`` runs before micro-batch i's forward (the stochastic-rounding seeds).
    ``run_micro_step(batch, i)`` replaces `forward_backward` (parallel.cuda_graph replays it).
    Under FSDP2, ``parallel`` says in which micro-batches gradients are reduce-scattered and gathered
    parameters freed (parallel.grad_reduce, parallel.reshard; trainer.distributed.set_fsdp_micro_step);
    under tensor parallelism (``tp_mesh``) the gradients of the parameters replicated over tp are summed
    over it after the backward.

    The optimizer update is the caller's (it may be skipped). One host sync per step: the loss
    and the grad norm are read together to decide whether the update is applied.
    """
    parallel = parallel or ParallelConfig()
    loss_sum = torch.zeros((), device=device)
    for micro_step in range(accumulation):
        set_fsdp_micro_step(model, parallel, micro_step, accumulation)
        before_micro_step(micro_step)
        batch = next(loader)
        loss_sum += (forward_backward(model, batch, autocast, device, accumulation, tp_mesh) if run_micro_step is None
                     else run_micro_step(batch, micro_step))
    if tp_mesh is not None:
        from trainer.tensor_parallel import reduce_tp_replicated_grads

        reduce_tp_replicated_grads(model)
    after_backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"),
                                               foreach=device.type == "cuda")
    if hasattr(grad_norm, "full_tensor"):  # DTensor under FSDP2: already reduced over ranks
        grad_norm = grad_norm.full_tensor()
    loss_mean = all_reduce_mean(loss_sum)
    values = torch.stack([loss_mean.float(), grad_norm.float().to(device)]).tolist()
    return values[0], values[1]
