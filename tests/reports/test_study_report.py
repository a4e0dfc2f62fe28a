"""reports.study (scripts/study_report.py) on the committed study results: the table agrees with the JSONL it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reports.study import study_report

REPOSITORY = Path(__file__).resolve().parents[2]
RESULTS = REPOSITORY / "results" / "study"


def final_val_loss(run: str) -> float:
    lines = [json.loads(line) for line in (RESULTS / run / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "val_loss" in line][-1]["val_loss"]


def test_table_rows_match_the_metrics_and_the_doc(tmp_path):
    study = yaml.safe_load((RESULTS / "runs.yaml").read_text())
    text = study_report(tmp_path)
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| run")}
    completed = [name for name in study["runs"] if (RESULTS / name / "run.json").is_file()]
    assert sorted(rows) == sorted(completed) and study["reference"] in rows
    reference = final_val_loss(study["reference"])
    for name, cells in rows.items():
        assert float(cells[5]) == pytest.approx(final_val_loss(name), abs=1e-4)
        assert float(cells[6].rstrip("%")) == pytest.approx(100 * (final_val_loss(name) / reference - 1), abs=0.006)
    assert (tmp_path / "study_main.png").is_file()
    assert text in (REPOSITORY / "docs" / "study.md").read_text()  # the doc holds the current table


def test_run_record_accumulates_over_resumed_calls(tmp_path):
    """A run stopped and resumed keeps every call's wall time and its neighbours, not only the last."""
    from reports import study as study_module

    study = {"runs": {"a": {"experiment": "study_nvfp4", "overrides": [], "about": "x"}}}
    run_dir = tmp_path / "a"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "train.log").write_text("preempted at step 5: checkpoint saved\n")
    first = study_module._record_run(study, "a", run_dir, 0, 10.0, 100.0, [], ["b", "c"], {})
    assert first["status"] == "stopped" and first["calls"] == 1
    (run_dir / "train.log").write_text("preempted at step 5: checkpoint saved\ndone\n")
    second = study_module._record_run(study, "a", run_dir, 0, 5.0, 100.0, [], ["b"], {})
    assert second["calls"] == 2 and second["wall_s"] == 15.0
    assert second["side_by_side_per_call"] == [["b", "c"], ["b"]]
    assert second["side_by_side_with"] == ["b", "c"]
