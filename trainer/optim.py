"""AdamW with the weight-decay rule, and the learning-rate schedules.

Schedules are pure functions of the optimizer step, so resuming needs only the step number.

WSD (warmup-stable-decay), with W warmup steps, S total steps, D = round(decay_fraction * S):
  step < W:              lr * (step + 1) / W
  W <= step < S - D:     lr
  S - D <= step:         min_lr + (lr - min_lr) * shape(p),  p = (step - (S - D) + 1) / D in (0, 1]
      shape: linear 1 - p;  cosine (1 + cos(pi p)) / 2;  1-sqrt 1 - sqrt(p)
Cosine: warmup as above, then min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2 over the remaining steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from trainer.config import OptimConfig

# Parameters named like this never take weight decay (Mamba-2's SSM parameters), whatever their rank.
NO_DECAY_NAMES = ("A_log", "D", "dt_bias")


def takes_weight_decay(name: str, param: torch.Tensor) -> bool:
    """Matrices decay; 1-D params (norms, biases, conv bias) and SSM params do not."""
    if getattr(param, "_no_weight_decay", False):
        return False
    if name.rsplit(".", 1)[-1] in NO_DECAY_NAMES:
        return False
    return param.ndim >= 2


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    if cfg.name != "adamw":
        raise ValueError(f"optim.name must be 'adamw'; got {cfg.name!r}")
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if takes_weight_decay(name, param) else no_decay).append(param)
    fused = cfg.fused if cfg.fused is not None else device.type == "cuda"
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def lr_at(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Learning rate for optimizer step `step` (0-based) of `total_steps`."""
    warmup = min(cfg.warmup_steps, total_steps)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "wsd":
        decay_steps = max(1, round(cfg.decay_fraction * total_steps)) if cfg.decay_fraction > 0 else 0
        decay_start = total_steps - decay_steps
        if decay_steps == 0 or step < decay_start:
            return cfg.lr
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * _decay_shape(cfg.decay_shape, progress)
    if cfg.schedule == "cosine":
        span = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup + 1) / span)
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * _decay_shape("cosine", progress)
    raise ValueError(f"optim.schedule must be wsd, cosine or constant; got {cfg.schedule!r}")


def schedule_warning(cfg: OptimConfig, total_steps: int) -> dict | None:
    """The `lr_schedule_warning` event's fields when the warm-up does not end before the schedule moves on.

    A run of no more steps than its warm-up ends at the top of the ramp: the learning rate only rose, and
    the stable and decay phases never came. A WSD decay that starts inside the warm-up makes the rate
    drop from the ramp onto the decay curve where the warm-up ends. Both are what the numbers say, and
    both are legitimate for a smoke test (`train.steps=3` of the quickstart, whose warm-up is 20), so the
    trainer starts and says so once (printed, and in events.jsonl) rather than refusing.
    """
    warmup = cfg.warmup_steps
    if warmup >= total_steps:
        return {"warmup_steps": warmup, "steps": total_steps, "last_lr": lr_at(total_steps - 1, total_steps, cfg),
                "means": "the run ends inside its warm-up: the learning rate only rises and never decays; "
                         "raise train.steps or lower optim.warmup_steps"}
    if cfg.schedule == "wsd" and cfg.decay_fraction > 0:
        decay_start = total_steps - max(1, round(cfg.decay_fraction * total_steps))
        if decay_start < warmup:
            return {"warmup_steps": warmup, "steps": total_steps, "decay_start_step": decay_start,
                    "means": f"the decay starts inside the warm-up: at step {warmup} the learning rate drops from "
                             f"the ramp onto the decay curve; lower optim.warmup_steps or optim.decay_fraction"}
    return None


def _decay_shape(shape: str, progress: float) -> float:
    """Fraction of the way from min_lr to lr left at `progress` in [0, 1] of the decay."""
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(progress)
    raise ValueError(f"optim.decay_shape must be linear, cosine or 1-sqrt; got {shape!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
