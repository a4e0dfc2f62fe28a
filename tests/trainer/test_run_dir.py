"""The run directory describes the run (config.yaml, run_info.json, precision plan, Hydra's .hydra/);
nothing lands in outputs/ when run_dir is set; one's own config folder (--config-dir) and
trainer.config.compose give the same configs as the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from trainer.config import TrainConfig, compose
from trainer_testing import ROOT, tiny_overrides

MY_EXPERIMENT = """\
# @package _global_
defaults:
  - override /model: tiny
  - override /precision: nvfp4
train:
  steps: 2
  micro_batch_size: 2
  global_batch_size: 2
logging:
  log_every: 1
"""


@pytest.fixture
def my_configs(tmp_path) -> Path:
    """A folder of one's own configs: experiment/mine.yaml."""
    (tmp_path / "my_configs" / "experiment").mkdir(parents=True)
    (tmp_path / "my_configs" / "experiment" / "mine.yaml").write_text(MY_EXPERIMENT)
    return tmp_path / "my_configs"


def _git_commit():
    try:
        result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def test_cli_run_dir_holds_the_description_and_nothing_goes_to_outputs(tmp_path, data_cache, my_configs):
    work, run_dir = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    overrides = [o for o in tiny_overrides(data_cache) if not o.startswith(("model=", "precision=", "train.", "logging.log"))]
    args = ["--config-dir", str(my_configs), "+experiment=mine", *overrides, f"run_dir={run_dir}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=work, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    assert list(work.iterdir()) == []  # no outputs/<date>/<time>: Hydra's own files went to run_dir
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "precision_plan.txt").is_file()
    written = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig),
                                                  OmegaConf.load(run_dir / "config.yaml")))
    assert written.name == "mine" and written.run_dir == str(run_dir)
    assert (written.model.name, written.precision.name, written.train.steps) == ("tiny", "nvfp4", 2)
    assert written == compose(["+experiment=mine", *overrides, f"run_dir={run_dir}"], config_dir=my_configs)

    run = json.loads((run_dir / "run_info.json").read_text())
    assert run["command"][-len(args):] == args
    assert run["cwd"] == str(work)
    import torch

    assert run["packages"]["torch"] == torch.__version__ and run["python"] == ".".join(map(str, sys.version_info[:3]))
    commit = _git_commit()
    assert (run["git"] or {}).get("commit") == commit
    assert run["tokenizer"]["sha256"] and run["tokenizer"]["vocab_size"] == 512


def test_compose_equals_the_command_line_config():
    cfg = compose(["+experiment=quickstart", "train.steps=3"])
    assert isinstance(cfg, TrainConfig)
    assert (cfg.name, cfg.train.steps, cfg.model.name, cfg.precision.name) == ("quickstart", 3, "quickstart", "nvfp4")
    assert compose().name == "default"


def test_compose_names_a_bad_key_or_folder(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="model.nonexistent"):
        compose(["model.nonexistent=1"])
    with pytest.raises(FileNotFoundError, match="not a directory"):
        compose(config_dir=tmp_path / "missing")


def _cli_in(work: Path, args: list, timeout: int = 600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("HYBRID_RUN_DIR", None)
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_an_auto_named_run_directory_never_resumes_an_earlier_run(tmp_path, data_cache):
    """A clock set back (or a second start in the same second) names an earlier run's outputs/<date>/<time>: the
    new run takes the next free name (<time>-1) and trains from step 0; the earlier run is untouched."""
    import datetime
    import shutil

    earlier, work = tmp_path / "earlier", tmp_path / "work"
    work.mkdir()
    args = tiny_overrides(data_cache, steps=2)
    assert _cli_in(work, [*args, f"run_dir={earlier}"]).returncode == 0
    now = datetime.datetime.now()
    taken = []  # the earlier run under every name this start can get in the next minute: the clock is "behind"
    for second in range(60):
        moment = now + datetime.timedelta(seconds=second)
        name = work / "outputs" / moment.strftime("%Y-%m-%d") / moment.strftime("%H-%M-%S")
        shutil.copytree(earlier, name, copy_function=os.link)
        taken.append(name)
    result = _cli_in(work, args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "holds an earlier run, which an auto-named directory never resumes" in result.stderr
    fresh = [path for path in (work / "outputs").glob("*/*") if path not in taken]
    assert len(fresh) == 1 and fresh[0].name.endswith("-1"), fresh
    events = [json.loads(line) for line in (fresh[0] / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "resumed"]  # trained afresh, from step 0
    assert [json.loads(line)["step"] for line in (fresh[0] / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (fresh[0] / ".hydra" / "config.yaml").is_file()
    twin = fresh[0].with_name(fresh[0].name[:-2])
    assert (twin / "metrics.jsonl").read_text() == (earlier / "metrics.jsonl").read_text()  # the earlier run as it was
    assert sorted(p.name for p in (twin / "checkpoints").iterdir()) == ["step_00000002", "trainer.lock"]


def test_a_multirun_with_one_run_dir_for_every_job_is_refused_and_per_job_directories_train(tmp_path, data_cache):
    work = tmp_path / "work"
    work.mkdir()
    args = ["-m", *tiny_overrides(data_cache, steps=1), "optim.lr=3e-3,1e-2"]
    refused = _cli_in(work, [*args, f"run_dir={tmp_path / 'shared'}"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ConfigError: run_dir={tmp_path / 'shared'} is the same for "
                                                   "several jobs of this multirun (-m)"), refused.stderr[-3000:]
    assert not (tmp_path / "shared").exists()

    per_job = _cli_in(work, [*args, f"run_dir={tmp_path / 'sweep'}/${{hydra:job.num}}"])
    assert per_job.returncode == 0, per_job.stderr[-3000:]
    for job, lr in ((0, 3e-3), (1, 1e-2)):
        written = OmegaConf.load(tmp_path / "sweep" / str(job) / "config.yaml")
        assert written.optim.lr == lr and (tmp_path / "sweep" / str(job) / "checkpoints" / "step_00000001").is_dir()
