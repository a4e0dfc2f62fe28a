"""Hugging Face export and import faults: a damaged checkpoint is refused naming the file (as a resume
refuses it), the exported files are readable by the rest of a team, and init_from_hf names a weight of
the wrong shape with both shapes, in one line and exit status 2 on the command line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from scripts_testing import REPOSITORY
from trainer.loop import train
from trainer_testing import ROOT, compose_train_config, tiny_overrides

pytest.importorskip("transformers")


def _export(*arguments):
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY))
    return subprocess.run([sys.executable, "-m", "trainer.export_hf", *map(str, arguments)],
                          cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=600)


def _flip_bytes_of(checkpoint, fqn: str, count: int = 64):
    """Invert `count` bytes in the middle of tensor `fqn`'s storage in its .distcp file (integrity.json as it was)."""
    import torch.distributed.checkpoint as dcp

    storage = dcp.FileSystemReader(str(checkpoint)).read_metadata().storage_data
    info = next(value for key, value in storage.items() if key.fqn == fqn)
    path = checkpoint / info.relative_path
    data = bytearray(path.read_bytes())
    start = info.offset + info.length // 2
    data[start:start + count] = bytes(255 - b for b in data[start:start + count])
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("export") / "run"
    train(compose_train_config(tiny_overrides(data_cache, steps=2), run_dir))
    return run_dir / "checkpoints" / "step_00000002"


def test_the_export_verifies_the_checkpoint_and_refuses_a_damaged_one_naming_the_file(trained, tmp_path):
    import shutil

    damaged = tmp_path / "step_00000002"
    shutil.copytree(trained, damaged)
    shard = _flip_bytes_of(damaged, "model.lm_head.weight")
    refused = _export(damaged, tmp_path / "hf")
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert lines[0].startswith(f"export_hf: checkpoint {damaged} is corrupt or incomplete: {shard} has sha256 ")
    assert "(its content changed)" in lines[0] and "not exporting it" in lines[0]
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").iterdir())  # nothing half written
    # the knowing opt-out, as checkpoint.verify=false for a resume: sizes only
    assert _export(damaged, tmp_path / "unverified", "--no-verify").returncode == 0


@pytest.mark.parametrize("damage", ["integrity_json_removed", "shard_truncated"])
def test_the_export_refuses_a_checkpoint_without_checksums_or_with_a_truncated_shard(trained, tmp_path, damage):
    import shutil

    from trainer.checkpoint.errors import CorruptCheckpoint
    from trainer.hf.export import export_checkpoint

    damaged = tmp_path / "step_00000002"
    shutil.copytree(trained, damaged)
    if damage == "integrity_json_removed":  # as a trainer without checksums saved it, or damage
        (damaged / "integrity.json").unlink()
        expected = rf"{damaged / 'integrity.json'} is missing"
    else:
        shard = next(damaged.glob("*.distcp"))
        os.truncate(shard, shard.stat().st_size - 100)
        expected = rf"{shard} has \d+ bytes, \d+ were written \(truncated or overwritten\)"
    with pytest.raises(CorruptCheckpoint, match=expected):
        export_checkpoint(damaged, tmp_path / "hf")
    if damage == "integrity_json_removed":  # knowingly, sizes only: as checkpoint.verify=false
        assert export_checkpoint(damaged, tmp_path / "unverified", verify=False) == tmp_path / "unverified"


def test_exported_files_are_readable_by_others(trained, tmp_path):
    previous = os.umask(0o022)  # the usual umask: new files 0644
    try:
        result = _export(trained, tmp_path / "hf")
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr[-3000:]
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "hf").iterdir()}
    assert "model.safetensors" in modes and "tokenizer.json" in modes
    assert modes == {name: 0o644 for name in modes}, modes  # the weights too (their writer makes them 0600)


def test_init_from_hf_names_a_weight_of_the_wrong_shape_with_both_shapes(trained, tmp_path, data_cache):
    from safetensors.torch import load_file, save_file

    exported = tmp_path / "hf"
    assert _export(trained, exported, "--dtype", "float32").returncode == 0
    tensors = load_file(exported / "model.safetensors")
    name = next(key for key in tensors if key.endswith("layers.0.mixer.in_proj.weight"))
    original = tuple(tensors[name].shape)
    tensors[name] = tensors[name][:-16].clone()  # 16 rows fewer: another model's tensor under this name
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})

    overrides = [o for o in tiny_overrides(data_cache, steps=1) if not o.startswith(("model", "precision"))]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "trainer", *overrides, "precision=bf16",
                             f"checkpoint.init_from_hf={exported}", f"run_dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    shorter = [original[0] - 16, original[1]]
    assert lines[0].startswith(f"ConfigError: checkpoint.init_from_hf={exported}: 1 weight(s) have another shape")
    assert f"layers.0.mixer.in_proj.weight: {shorter} in the directory, {list(original)} in the model" in lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained
