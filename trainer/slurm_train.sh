#!/bin/bash
# Multi-node training under SLURM: one torchrun per node, torchrun starts one process per GPU.
#   sbatch --nodes=16 "$(python -m trainer.slurm)" +experiment=nvfp4_12b data.prepared_dir=/lustre/shards
# (`python -m trainer.slurm` prints where this installed script is; copy it to adapt the #SBATCH lines.)
# Plan it first (the layout parallel=auto picks, memory per GPU, step time, days): the same overrides with
#   python -m trainer.plan_run +experiment=nvfp4_12b --gpu B200 --gpus 128
# every rank also plans itself at start: the 12B experiments' parallel=auto picks tensor parallelism,
# FSDP/HSDP and micro-batch for the GPUs launched, and a run that cannot fit stops, exit status 2.
# Checkpoints and metrics go to $RUN_DIR (a shared filesystem); a requeued job resumes from the
# latest complete checkpoint there. SLURM sends SIGTERM 120 s before the time limit; torchrun
# passes it to its workers, which save a checkpoint at the next step boundary and exit cleanly
# (torchrun allows them 30 s before SIGKILL: enough for a sharded save of the 12B on 8+ GPUs).
#SBATCH --job-name=hybrid-nvfp4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --signal=TERM@120
#SBATCH --output=slurm-%j.out
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
export RUN_DIR=${RUN_DIR:-$PWD/runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}
export HYBRID_RUN_DIR=$RUN_DIR        # every rank's Hydra output dir (configs/train.yaml)
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=${MASTER_PORT:-29500}
# Keep NVLink multicast (NVLS) off: see README, "Multi-node".
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=8
mkdir -p "$RUN_DIR"

srun --kill-on-bad-exit=1 torchrun \
  --nnodes "$SLURM_NNODES" --nproc-per-node "$GPUS_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID" \
  -m trainer run_dir="$RUN_DIR" "$@"
