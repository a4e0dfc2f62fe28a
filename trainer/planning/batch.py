"""The global batch a layout runs: the configured one, the nearest one it can run, or a refusal.

A step trains ``micro_batch x dp_ranks x accumulation`` sequences (dp_ranks = world size / (parallel.tp x
parallel.cp): the tp and cp ranks of a group train the same sequences),
so a layout runs only multiples of ``q = micro_batch x dp_ranks``. For the configured batch B:

    B % q == 0                    runs the configured B (accumulation B / q), whatever the policy
    train.batch_policy=nearest    runs b = the multiple of q nearest to B (ties go up; never below q)
                                  if |b - B| <= train.batch_tolerance x B, else refused
    train.batch_policy=exact      refused

A refusal is a ``ConfigError`` of one line naming train.global_batch_size and train.batch_policy, with
the GPU counts that run the configured batch at this micro-batch and tensor- and context-parallel degree. The trainer and the planner
(layout, preflight, parallel=auto) call ``resolve_batch`` alike, so both accept and refuse the same
launches with the same message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from trainer.validate import ConfigError

MAX_LISTED_GPUS = 4096
"""GPU counts a refusal lists go up to this."""


@dataclass(frozen=True)
class ResolvedBatch:
    """The batch a layout runs, and how it was reached."""

    configured: int
    """train.global_batch_size."""
    global_batch: int
    """Sequences per optimizer step actually run."""
    micro_batch: int
    dp_ranks: int
    accumulation: int
    """Micro-batches per optimizer step on each rank: global_batch / (micro_batch x dp_ranks)."""
    policy: str

    @property
    def adjusted(self) -> bool:
        return self.global_batch != self.configured

    @property
    def deviation(self) -> float:
        """(run - configured) / configured."""
        return (self.global_batch - self.configured) / self.configured

    def announcement(self) -> str:
        """One line for the start of a run whose batch was adjusted ('' when it was not)."""
        if not self.adjusted:
            return ""
        return (f"train.global_batch_size {self.configured} -> {self.global_batch} ({100 * self.deviation:+.1f}%): "
                f"micro-batch {self.micro_batch} x {self.dp_ranks} data-parallel ranks x {self.accumulation} "
                f"accumulation (train.batch_policy={self.policy})")

    def event_fields(self) -> dict:
        """The fields of a `batch_adjusted` event."""
        return {"configured": self.configured, "global_batch": self.global_batch, "micro_batch": self.micro_batch,
                "dp_ranks": self.dp_ranks, "accumulation": self.accumulation, "policy": self.policy}


def gpu_counts_for_batch(batch: int, micro_batch: int, tp: int = 1, limit: int = MAX_LISTED_GPUS) -> List[int]:
    """GPU counts (``tp`` GPUs per data-parallel rank, tp x cp, x data-parallel ranks, up to ``limit``) that run
    ``batch`` exactly at this micro-batch."""
    if batch % micro_batch:
        return []
    per_micro = batch // micro_batch
    return [tp * ranks for ranks in range(1, per_micro + 1) if per_micro % ranks == 0 and tp * ranks <= limit]


def nearest_multiple(target: int, step: int) -> int:
    """The multiple of ``step`` nearest to ``target``, ties up, at least ``step``."""
    below = (target // step) * step
    above = below if below == target else below + step
    if below < step:
        return above
    return below if target - below < above - target else above


def accepted_batch(configured: int, micro_batch: int, dp_ranks: int, policy: str = "nearest",
                   tolerance: float = 0.05) -> Optional[int]:
    """The batch the policy runs for these ranks, or None where resolve_global_batch refuses (no message)."""
    per_micro_step = micro_batch * dp_ranks
    if configured % per_micro_step == 0:
        return configured
    if policy != "nearest":
        return None
    nearest = nearest_multiple(configured, per_micro_step)
    return nearest if abs(nearest - configured) / configured <= tolerance else None


def _runs_it(batch: int, micro_batch: int, tp: int, cp: int = 1) -> str:
    counts = gpu_counts_for_batch(batch, micro_batch, tp * cp)
    shown = ", ".join(str(count) for count in counts) if counts else "none"
    degrees = f"tp {tp}" if cp == 1 else f"tp {tp} x cp {cp}"
    return f"GPU counts that run {batch} at micro-batch {micro_batch} and {degrees}: {shown}"


def resolve_global_batch(configured: int, micro_batch: int, dp_ranks: int, policy: str = "nearest",
                         tolerance: float = 0.05, tp: int = 1, cp: int = 1) -> ResolvedBatch:
    """The batch ``dp_ranks`` ranks of ``micro_batch`` sequences run for ``configured`` (module docstring)."""
    if dp_ranks < 1 or micro_batch < 1:
        raise ValueError(f"dp_ranks and micro_batch must be >= 1, got {dp_ranks} and {micro_batch}")
    per_micro_step = micro_batch * dp_ranks
    gpus = dp_ranks * tp * cp
    if configured % per_micro_step == 0:
        return ResolvedBatch(configured, configured, micro_batch, dp_ranks, configured // per_micro_step, policy)
    nearest = nearest_multiple(configured, per_micro_step)
    away = abs(nearest - configured) / configured
    if policy == "exact":
        raise ConfigError(
            f"train.global_batch_size ({configured}) must be a multiple of train.micro_batch_size ({micro_batch}) x "
            f"data-parallel ranks ({dp_ranks}) with train.batch_policy=exact (nearest would run {nearest}, "
            f"{100 * away:.1f}% away); {_runs_it(configured, micro_batch, tp, cp)}")
    if policy != "nearest":
        raise ConfigError(f"train.batch_policy must be 'nearest' or 'exact', got {policy!r}")
    if away > tolerance:
        raise ConfigError(
            f"train.global_batch_size ({configured}) cannot run on {gpus} GPUs: train.micro_batch_size ({micro_batch}) "
            f"x data-parallel ranks ({dp_ranks}) runs multiples of {per_micro_step}, the nearest ({nearest}) is "
            f"{100 * away:.1f}% away, beyond train.batch_tolerance ({tolerance:g}) of train.batch_policy=nearest; "
            f"{_runs_it(configured, micro_batch, tp, cp)}")
    return ResolvedBatch(configured, nearest, micro_batch, dp_ranks, nearest // per_micro_step, policy)


def resolve_batch(cfg, world_size: int) -> ResolvedBatch:
    """The batch ``cfg`` runs on ``world_size`` ranks (data-parallel ranks = world_size / (parallel.tp x parallel.cp)).

    What the trainer calls at start (and the planner for every layout); ConfigError when it is refused.
    """
    tp, cp = cfg.parallel.tp, cfg.parallel.cp
    if world_size % tp:
        raise ConfigError(f"parallel.tp ({tp}) must divide the world size ({world_size})")
    if world_size % (tp * cp):
        raise ConfigError(f"parallel.tp ({tp}) x parallel.cp ({cp}) must divide the world size ({world_size})")
    train = cfg.train
    return resolve_global_batch(train.global_batch_size, train.micro_batch_size, world_size // (tp * cp),
                                train.batch_policy, train.batch_tolerance, tp, cp)
