"""W&B layout: comparison groups, validation loss under val/, quantization diagnostics as one
table and one heatmap per diagnostics step (real wandb, offline; its calls are observed)."""

from __future__ import annotations

import pytest

from trainer.config import compose
from trainer.loop import train
from trainer.wandb_report import TABLE_COLUMNS, comparison_group, quant_payload
from trainer_testing import compose_train_config, tiny_overrides

wandb = pytest.importorskip("wandb")


@pytest.mark.parametrize("experiment, group", [
    ("fp8_12b", "12b"), ("nvfp4_12b", "12b"), ("bf16_12b", "12b"), ("nvfp4_8b", "8b"), ("quickstart", "quickstart"),
    ("quickstart_nvfp4", "quickstart"), ("default", "default"), ("fp8", "fp8"),
])
def test_comparison_groups(experiment, group):
    assert comparison_group(experiment) == group


def test_paper_pairs_and_quickstart_precisions_share_a_group():
    groups = {comparison_group(compose([f"+experiment={name}"]).name) for name in ("fp8_12b", "nvfp4_12b", "bf16_12b")}
    assert groups == {"12b"}
    assert {comparison_group(compose(["+experiment=quickstart", f"precision={p}"]).name)
            for p in ("bf16", "fp8", "nvfp4")} == {"quickstart"}


def _records():
    return [{"layer": f"layers.{i}.mixer.in_proj", "gemm": gemm, "operand": operand, "rel_error": 0.1 + 0.01 * i,
             "flushed_to_zero": 0.01, "saturated_elements": 0.0, "scale_saturated": 0.0, "scale_underflow": 0.0,
             "amax": 3.0} for i in range(3) for gemm, operand in (("fprop", "X"), ("fprop", "W"), ("wgrad", "X^T"))]


def test_quant_payload_is_one_table_and_one_heatmap():
    records = _records() + [{"layer": "layers.3.mixer.in_proj", "gemm": "wgrad", "operand": "dY^T",
                             "error": "tokens do not divide 16"}]
    payload = quant_payload(records, step=10)
    assert set(payload) == {"quant/diagnostics", "quant/rel_error"}
    table, image = payload["quant/diagnostics"], payload["quant/rel_error"]
    assert isinstance(table, wandb.Table) and isinstance(image, wandb.Image)
    assert list(table.columns) == list(TABLE_COLUMNS) and len(table.data) == len(records)
    row = table.data[1]
    assert row[:4] == ["layers.0.mixer.in_proj", "fprop", "W", pytest.approx(0.1)]
    assert table.data[-1][-1] == "tokens do not divide 16"


def test_training_reports_groups_val_and_quant_tables(tmp_path, data_cache, monkeypatch):
    from wandb.sdk.wandb_run import Run

    inits, logged = [], []
    real_init, real_log = wandb.init, Run.log
    monkeypatch.setattr(wandb, "init", lambda *a, **k: inits.append(k) or real_init(*a, **k))
    monkeypatch.setattr(Run, "log", lambda self, data, *a, **k: logged.append(dict(data)) or real_log(self, data, *a, **k))
    overrides = [o for o in tiny_overrides(data_cache, steps=4) if not o.startswith("logging.wandb")]
    cfg = compose_train_config(overrides + ["logging.wandb.mode=offline", "logging.quant_diagnostics_every=2",
                                            "train.eval_every=2"], tmp_path)
    cfg.name = "nvfp4_tiny"
    with _no_wandb_failure():
        train(cfg)

    assert len(inits) == 1 and inits[0]["group"] == "tiny" and inits[0]["mode"] == "offline"
    keys = set().union(*logged)
    assert {"train/loss", "train/lr", "val/loss", "quant/diagnostics", "quant/rel_error"} <= keys
    assert not [k for k in keys if k.startswith("quant/layers")]  # no flat per-layer keys
    assert "train/val_loss" not in keys
    tables = [entry for entry in logged if "quant/diagnostics" in entry]
    assert len(tables) == 2  # steps 2 and 4
    assert all(isinstance(entry["quant/rel_error"], wandb.Image) for entry in tables)
    assert len(tables[0]["quant/diagnostics"].data) >= 5 * 12  # 12 quantized layers x 5 operands
    assert any((tmp_path / "wandb").glob("offline-run-*/files/media/table/quant/diagnostics_*.table.json"))


class _no_wandb_failure:
    """Fail if MetricsLogger reports that W&B stopped (it would keep training without it)."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self._warnings = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        failures = [str(w.message) for w in self._warnings if "W&B" in str(w.message)]
        assert not failures, failures
        return False
