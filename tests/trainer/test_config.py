"""Config composition: every experiment composes into a valid TrainConfig; bad keys fail clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.__main__ import unknown_key_message
from trainer.config import TrainConfig, register_configs

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def compose_config(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_into_the_schema(experiment):
    cfg = OmegaConf.to_object(compose_config([f"+experiment={experiment}"]))
    assert isinstance(cfg, TrainConfig)
    assert cfg.model.pattern and cfg.data.seq_len > 0
    assert cfg.train.global_batch_size % cfg.train.micro_batch_size == 0


def test_paper_experiments_carry_the_paper_setup():
    cfg = OmegaConf.to_object(compose_config(["+experiment=nvfp4_12b"]))
    assert (cfg.model.name, cfg.precision.name, cfg.data.seq_len) == ("hybrid_12b", "nvfp4", 8192)
    assert (cfg.precision.bf16_layers_at_start, cfg.precision.bf16_layers_at_end) == (2, 8)
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.schedule, cfg.optim.decay_fraction) == (4.5e-4, 4.5e-6, "wsd", 0.2)
    assert (cfg.optim.beta1, cfg.optim.beta2, cfg.optim.weight_decay) == (0.9, 0.95, 0.1)
    fp8 = OmegaConf.to_object(compose_config(["+experiment=fp8_12b"]))
    assert (fp8.precision.format, fp8.precision.bf16_layers_at_start, fp8.precision.bf16_layers_at_end) == ("fp8_block", 1, 2)


def test_parallel_on_off_survive_yaml():
    """YAML 1.1 reads a bare `on` as true: the parallel files must still mean FSDP on."""
    from trainer.distributed import DistEnv, fsdp_enabled

    for name in ("fsdp_ac", "hsdp"):
        cfg = OmegaConf.to_object(compose_config([f"parallel={name}"]))
        assert fsdp_enabled(cfg.parallel, DistEnv(0, 0, 1, device=None))


def test_every_precision_group_file_composes():
    for path in sorted((CONFIGS / "precision").glob("*.yaml")):
        cfg = OmegaConf.to_object(compose_config([f"precision={path.stem}"]))
        assert cfg.precision.name == path.stem


def test_unknown_key_message_lists_valid_keys():
    message = unknown_key_message("model.nonexistent=1")
    assert "nonexistent" in message and "ModelConfig" in message
    assert "hidden_size" in message and "pattern" in message
    assert unknown_key_message("+logging.wandb.modee=online") is not None
    assert unknown_key_message("model.hidden_size=64") is None
    assert unknown_key_message("model=tiny") is None  # a group choice
    assert unknown_key_message("hydra.run.dir=/tmp/x") is None


def _run_trainer(*args):
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_bad_key_exits_nonzero_naming_it():
    result = _run_trainer("+experiment=quickstart", "model.nonexistent=1")
    assert result.returncode != 0
    assert "model.nonexistent" in result.stderr and "hidden_size" in result.stderr


def test_cli_unknown_experiment_lists_the_available_ones():
    result = _run_trainer("+experiment=nope")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "nope" in output
    for name in EXPERIMENTS:
        assert name in output


def test_a_required_value_of_a_group_file_must_be_given():
    """configs/data/mixture_example.yaml requires the tokenizer and prepared_dir: not given, it is an error naming
    the key (a plain ??? there would silently keep the schema's default)."""
    import subprocess
    import sys

    from omegaconf.errors import OmegaConfBaseException

    from trainer.config import compose

    with pytest.raises(OmegaConfBaseException, match="data.tokenizer must be set"):
        compose(["data=mixture_example", "data.prepared_dir=/p", "data.sources.1.path=/c"])
    given = compose(["data=mixture_example", "data.tokenizer=/t", "data.prepared_dir=/p", "data.sources.1.path=/c"])
    assert (given.data.tokenizer, given.data.prepared_dir) == ("/t", "/p")
    result = subprocess.run([sys.executable, "-m", "trainer", "data=mixture_example", "data.sources.1.path=/c"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "must be set" in result.stderr and "Traceback" not in result.stderr
