"""The run planner: what a config costs on N devices of a kind, before anything is built.

layout (the config's layout on the devices), gemm_costs (the per-GEMM cost model), memory (per-GPU
memory by part), step_time (seconds per step by part), plan (RunPlan, plan_run, smallest_changes).
scripts/plan_run.py prints a plan; trainer/preflight.py plans every run for the devices it sees.
docs/planning.md: the model, its calibration and its accuracy.
"""

from trainer.planning.plan import RunPlan, plan_run, smallest_changes, smallest_fitting_gpus

__all__ = ["RunPlan", "plan_run", "smallest_changes", "smallest_fitting_gpus"]
