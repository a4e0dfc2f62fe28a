"""The start-up stage: every check and decision a run makes before anything is written or built, in one order.

`start_run(cfg)` runs in `trainer.loop.train` before the process group, the run directory, the data or the
model; each refusal is one line naming the field (`ConfigError`, exit 2) or the preflight's plan
(`PreflightError`, exit 2):

  1. the config's fields                                  trainer.validate.validate_train_config
  2. the devices seen: this process's GPU (or the CPU), the world size, the processes of this node
  3. parallel.auto: the planner's fastest layout for that world replaces the layout fields
                                                          trainer.planning.auto.choose_layout
  4. the global batch the data-parallel ranks run: the configured one, the nearest one (announced), or a
     refusal listing the GPU counts that run it            trainer.planning.batch.resolve_batch
  5. the preflight: the run planned on those devices; one that cannot fit stops   trainer.preflight
  6. the HF export directory (checkpoint.export_hf_at_end) and the experiment's data requirement

`python -m trainer.plan_run` runs steps 1, 3 and 4 (`settle_config`) for the world it is asked about, so the planner
and the trainer accept and refuse the same inputs with the same message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from trainer.config import TrainConfig
from trainer.hardware import GpuSpec
from trainer.planning.batch import ResolvedBatch, resolve_batch
from trainer.validate import validate_train_config


@dataclass
class Settled:
    """The config a run trains with on its world, and how it was reached."""

    cfg: TrainConfig
    """The layout chosen by parallel=auto and the batch the world runs, written into the config."""
    batch: ResolvedBatch
    choice: Optional[object] = None
    """parallel=auto's AutoChoice (trainer.planning.auto), None for an explicit layout."""
    plan: Optional[object] = None
    """The preflight's RunPlan (start_run only; None with train.preflight=false)."""

    def record(self) -> dict:
        """What run_info.json and the W&B config hold about the layout and the batch."""
        out = {"batch": self.batch.event_fields() | {"adjusted": self.batch.adjusted}}
        if self.choice is not None:
            out["auto"] = {"line": self.choice.line(), "overrides": self.choice.overrides(),
                           "step_time_s": self.choice.plan.step_time_s, "mfu": self.choice.plan.mfu}
        return out


def settle_config(cfg: TrainConfig, gpu: GpuSpec, world_size: int, gpus_per_node: Optional[int] = None,
                  model=None) -> Settled:
    """Steps 1, 3 and 4 for ``world_size`` devices like ``gpu``: the checked config with parallel=auto's layout
    and the batch the world runs. ConfigError (one line naming the field) when refused."""
    validate_train_config(cfg)
    return _layout_and_batch(cfg, gpu, world_size, gpus_per_node, model)


def _layout_and_batch(cfg: TrainConfig, gpu: GpuSpec, world_size: int, gpus_per_node: Optional[int],
                      model) -> Settled:
    """Steps 3 and 4 on a config whose fields are checked."""
    choice = None
    if cfg.parallel.auto:
        from trainer.planning.auto import choose_layout

        choice = choose_layout(cfg, gpu, world_size, gpus_per_node, model=model)
        cfg = choice.config
    batch = resolve_batch(cfg, world_size)
    if batch.adjusted:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, global_batch_size=batch.global_batch))
    return Settled(cfg, batch, choice)


def start_run(cfg: TrainConfig) -> Settled:
    """The whole start-up stage for the launched world (the module docstring's order)."""
    from trainer.hf.export import check_export_directory_at_start
    from trainer.preflight import devices_seen, preflight
    from trainer.validate import check_data_requirement

    validate_train_config(cfg)  # before the devices are looked at: a bad parallel.device is a field error
    gpu, world, local_world = devices_seen(cfg)
    model = None
    if cfg.checkpoint.init_from_hf:  # the directory's config.json sets the architecture the layout is for
        from trainer.hf.load import adopt_hf_architecture

        model, _ = adopt_hf_architecture(cfg.model, cfg.checkpoint.init_from_hf)
    settled = _layout_and_batch(cfg, gpu, world, local_world, model)
    settled.plan = preflight(settled.cfg)
    check_export_directory_at_start(settled.cfg)
    check_data_requirement(settled.cfg)
    return settled
