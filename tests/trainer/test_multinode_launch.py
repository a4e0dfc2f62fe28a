"""The multi-node launch path on one machine: two torchrun agents (two "nodes" of 2 CPU processes each,
gloo) meet by c10d rendezvous on localhost with README's multi-node line, train HSDP across the nodes,
save into one run directory, and the run resumes on one node; trainer/slurm_train.sh hands torchrun
what that line needs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_testing import ROOT, free_port, losses_by_step, read_jsonl, tiny_overrides


def readme_multinode_line() -> list:
    """README's `torchrun --nnodes ...` command (continuation lines joined), as words."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("torchrun --nnodes"))
    return shlex.split(line)


def launch_line(nodes: int, port: int, run_dir: Path, trainer_args: list) -> list:
    """README's line with this machine's values: nodes of 2 processes, the endpoint on localhost, a tiny run."""
    from torch.distributed.run import get_args_parser

    words = readme_multinode_line()
    readme = get_args_parser().parse_args(words[1:])
    assert (readme.rdzv_backend, readme.module, readme.training_script) == ("c10d", True, "trainer")
    run_dir_keys = [a for a in readme.training_script_args if a.startswith("run_dir=")]
    assert run_dir_keys, "README's multi-node line must give run_dir= (every node writes into one directory)"
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", "2",
            "--rdzv-backend", readme.rdzv_backend, "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", readme.rdzv_id, "-m", "trainer", *trainer_args, f"run_dir={run_dir}"]


def start_agents(run_dir: Path, trainer_args: list, node_dirs: list) -> list:
    """One torchrun agent per node, each in its own working directory (as on separate machines)."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT),
               NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    return [subprocess.Popen(launch_line(len(node_dirs), port, run_dir, trainer_args), cwd=node, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for node in node_dirs]


def wait_all(agents: list, timeout: float = 600) -> list:
    outputs = []
    for agent in agents:
        output, _ = agent.communicate(timeout=timeout)
        outputs.append(output)
    for agent, output in zip(agents, outputs):
        assert agent.returncode == 0, output[-4000:]
    return outputs


@pytest.mark.distributed
def test_two_nodes_train_hsdp_save_and_resume_on_one_node(tmp_path, data_cache):
    run_dir = tmp_path / "shared" / "run"
    hsdp = ["parallel=hsdp", "parallel.dp_shard=2", "parallel.compile=false", "parallel.activation_checkpoint=none",
            "parallel.param_dtype=float32"]
    args = tiny_overrides(data_cache, steps=2) + ["train.global_batch_size=8", "checkpoint.every=2"] + hsdp
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    wait_all(start_agents(run_dir, args, nodes))  # only run_dir= joins the two working directories

    # One run directory: the checkpoint holds the shards of all 4 ranks, one metrics file from rank 0.
    checkpoint = run_dir / "checkpoints" / "step_00000002"
    shards = sorted(p.name for p in checkpoint.glob("*.distcp"))
    assert len(shards) == 4, shards
    assert sorted(losses_by_step(run_dir)) == [1, 2]
    assert not any((node / "outputs").exists() for node in nodes)
    info = (run_dir / "run_info.json").read_text()
    assert '"world_size": 4' in info

    # Resume on one node of 2 processes (FSDP over 2): the step-2 checkpoint of 2 x 2 HSDP ranks continues.
    one_node = args[:-len(hsdp)] + ["parallel.compile=false", "parallel.param_dtype=float32", "train.steps=4"]
    wait_all(start_agents(run_dir, one_node, nodes[1:]))
    events = read_jsonl(run_dir / "events.jsonl")
    assert any(e["event"] == "resumed" and e["step"] == 2 for e in events)
    assert sorted(losses_by_step(run_dir)) == [1, 2, 3, 4]


def test_slurm_script_hands_torchrun_the_multinode_line(tmp_path):
    """Run trainer/slurm_train.sh (`python -m trainer.slurm` prints its path) with srun, scontrol and torchrun
    stubbed: one torchrun per node with the
    node count, 8 processes per node, c10d rendezvous on the first node, the job id as rendezvous id,
    run_dir and HYBRID_RUN_DIR the same shared directory, NVLink multicast off, the user's overrides last."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text("#!/bin/bash\nprintf 'gpu-node-07\\ngpu-node-08\\n'\n")
    (stubs / "srun").write_text('#!/bin/bash\necho "srun $*" >> "$STUB_LOG"\nshift\nexec "$@"\n')
    (stubs / "torchrun").write_text(
        '#!/bin/bash\necho "torchrun $*" >> "$STUB_LOG"\n'
        'echo "env HYBRID_RUN_DIR=$HYBRID_RUN_DIR NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" >> "$STUB_LOG"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    log = tmp_path / "calls.log"
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(log), SLURM_JOB_NAME="hybrid-nvfp4",
               SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu-node-[07-08]", SLURM_NNODES="2")
    subprocess.run(["bash", str(ROOT / "trainer" / "slurm_train.sh"), "+experiment=nvfp4_12b",
                    "data.prepared_dir=/lustre/shards"], cwd=tmp_path, env=env, check=True, timeout=60)
    lines = log.read_text().splitlines()
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in srun
    torchrun = shlex.split(next(line for line in lines if line.startswith("torchrun ")))
    from torch.distributed.run import get_args_parser

    launch = get_args_parser().parse_args(torchrun[1:])
    run_dir = tmp_path / "runs" / "hybrid-nvfp4-4242"
    assert (launch.nnodes, launch.nproc_per_node) == ("2", "8")
    assert (launch.rdzv_backend, launch.rdzv_endpoint, launch.rdzv_id) == ("c10d", "gpu-node-07:29500", "4242")
    assert launch.module and launch.training_script == "trainer"
    assert launch.training_script_args == [f"run_dir={run_dir}", "+experiment=nvfp4_12b",
                                           "data.prepared_dir=/lustre/shards"]
    assert f"env HYBRID_RUN_DIR={run_dir} NCCL_NVLS_ENABLE=0" in lines
    assert run_dir.is_dir()
    # The same trainer arguments pass the trainer's own override check and compose.
    from trainer.__main__ import unknown_key_message

    assert not any(unknown_key_message(a) for a in launch.training_script_args)
    assert re.fullmatch(r"\d+", launch.rdzv_id)
