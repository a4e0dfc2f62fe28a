"""The README's and trainer/slurm_train.sh's launch lines start: each line's overrides, at its GPU count (and
the SLURM line at 1 to 128 nodes of 8), pass the start-up stage the trainer runs (trainer/startup.py: the
fields, parallel=auto's layout, the batch policy) and plan to fit on B200s."""

from __future__ import annotations

import re
import shlex

import pytest

from trainer.config import compose
from trainer.hardware import GPUS
from trainer.planning import plan_run
from trainer.startup import settle_config
from trainer_testing import ROOT

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)


def _commands(text: str) -> list:
    """Shell commands of the fenced bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = []
    for block in blocks:
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


def readme_launches() -> list:
    """(GPUs, trainer overrides) of every README line that starts the 12B with torchrun or sbatch."""
    launches = []
    for line in _commands((ROOT / "README.md").read_text()):
        words = shlex.split(line)
        if not words or words[0] not in ("torchrun", "sbatch") or not any("_12b" in w or "_8b" in w for w in words):
            continue
        overrides = [w for w in words if "=" in w and not w.startswith("-") and not w.startswith("$")]
        if words[0] == "torchrun":
            nodes = int(words[words.index("--nnodes") + 1]) if "--nnodes" in words else 1
            per_node = int(words[words.index("--nproc-per-node") + 1])
        else:
            nodes, per_node = int(words[words.index("--nodes") + 1]), 8
        launches.append((nodes * per_node, overrides))
    return launches


def slurm_plan_overrides() -> list:
    """The overrides of the plan line in trainer/slurm_train.sh's header."""
    header = (ROOT / "trainer" / "slurm_train.sh").read_text()
    line = next(l for l in header.splitlines() if "trainer.plan_run" in l)
    words = shlex.split(line.lstrip("#").strip())
    return [w for w in words[words.index("trainer.plan_run") + 1:] if "=" in w and not w.startswith("-")]


def _starts(overrides: list, gpus: int) -> None:
    cfg = compose(overrides)
    settled = settle_config(cfg, GPUS["B200"], gpus, 8)
    plan = plan_run(settled.cfg, GPUS["B200"], gpus, 8)
    assert plan.fits, (gpus, overrides, plan.render())
    assert abs(settled.batch.deviation) <= cfg.train.batch_tolerance


def test_the_readme_has_the_launch_lines():
    gpus = sorted(g for g, _ in readme_launches())
    assert gpus[0] == 8 and gpus[-1] >= 128, gpus  # one node and the multi-node line (torchrun and SLURM)


@pytest.mark.parametrize("gpus, overrides", readme_launches(), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_every_readme_launch_line_starts_at_its_gpu_count(gpus, overrides):
    _starts(overrides, gpus)


@pytest.mark.parametrize("nodes", NODE_COUNTS)
def test_the_slurm_line_starts_on_any_number_of_nodes(nodes):
    _starts(slurm_plan_overrides(), nodes * 8)


def _data_overrides(words: list) -> list:
    return [w for w in words if w.startswith("data=") or w.startswith("data.")]


def readme_prepare_line() -> list:
    line = next(l for l in _commands((ROOT / "README.md").read_text()) if "trainer.prepare_data" in l
                and "_12b" in l)
    return shlex.split(line)


def test_the_readme_trains_on_the_shards_its_prepare_line_writes(tmp_path):
    """Every 12B launch line repeats the prepare line's data overrides (num_proc aside), and a corpus prepared
    with them (paths pointed at a small stand-in, the builtin tokenizer) is the one a run with them accepts."""
    import json

    from data import build_tokenizer
    from data.prepare import check_prepared_source, prepared_directory

    prepare = [w for w in _data_overrides(readme_prepare_line()) if not w.startswith("data.num_proc")]
    for gpus, overrides in readme_launches():
        assert _data_overrides(overrides) == prepare, (gpus, overrides)
    assert _data_overrides(slurm_plan_overrides()) == [] or _data_overrides(slurm_plan_overrides()) == prepare

    corpus, shards = tmp_path / "corpus", tmp_path / "shards"
    corpus.mkdir()
    (corpus / "part.jsonl").write_text("".join(json.dumps({"text": f"document {i} " + "words " * 50}) + "\n"
                                               for i in range(200)))
    here = {"/data/corpus": str(corpus), "/lustre/shards": str(shards), "/models/nemotron-tokenizer": "builtin"}

    def local(words):
        return [w.split("=", 1)[0] + "=" + here.get(w.split("=", 1)[1], w.split("=", 1)[1]) for w in words]

    import trainer.prepare_data as script

    assert script.main(["--no-progress", "+experiment=nvfp4_12b", *local(prepare)]) == 0

    cfg = compose(local(readme_launches()[0][1]))  # the one-node line, +experiment included
    source = cfg.data.sources[0]
    directory = prepared_directory(cfg.data, source, build_tokenizer(cfg.data))
    assert (directory / "manifest.json").is_file(), directory
    check_prepared_source(directory, cfg.data, source)  # raises DataError for another source
