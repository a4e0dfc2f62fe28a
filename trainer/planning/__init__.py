"""The run planner: what a config costs on N devices of a kind, before anything is built.

layout (the config's layout on the devices: mesh, TP, policies), batch (the global batch a layout runs:
train.batch_policy), parameters (every parameter, its TP split and FSDP unit), tensor_parallel (one TP
rank's GEMMs), collectives (every collective of a step: the communication model), gemm_costs (the
per-GEMM cost model), memory (per-GPU memory by part), step_time (seconds per step by part), overheads
(start-up, compilation, evaluation), plan (RunPlan, plan_run, smallest_changes), auto
(parallel=auto: choose_layout), commands (plan_run.py's command lines and cost), buyers_table (the
12B table of docs/planning.md).
`python -m trainer.plan_run` prints a plan; trainer/preflight.py plans every run for the devices it sees.
docs/planning.md: the model, its calibration and its accuracy.
"""

from trainer.planning.batch import ResolvedBatch, resolve_batch
from trainer.planning.plan import RunPlan, plan_run, smallest_changes, smallest_fitting_gpus

__all__ = ["RunPlan", "ResolvedBatch", "plan_run", "resolve_batch", "smallest_changes", "smallest_fitting_gpus"]
