"""The study report (scripts/study_report.py) on the committed results: the doc's tables are the ones the
report regenerates, and their numbers agree with the metrics.jsonl files, recomputed here independently
(losses read directly, confidence intervals from scipy's one-sample t-test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from scipy import stats

from study.report import collect, sections, study_report, write_doc
from study.definition import load_study

REPOSITORY = Path(__file__).resolve().parents[2]
STUDY_FILE = REPOSITORY / "results" / "study" / "study.yaml"
DOC = REPOSITORY / "docs" / "study.md"


def validation_points(directory: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["val_loss"] for line in lines if line.get("val_loss") is not None}


def scipy_interval(values: list[float]) -> tuple[float, float, float]:
    result = stats.ttest_1samp(values, 0.0)
    low, high = result.confidence_interval(0.95)
    return sum(values) / len(values), low, high


def parse_interval(cell: str) -> tuple[float, float, float]:
    """'+1.24% [+0.40, +2.08]' -> (1.24, 0.40, 2.08)."""
    match = re.fullmatch(r"([+-]\d+\.\d+)(?:%| pts) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\]", cell.strip())
    assert match, cell
    return tuple(float(x) for x in match.groups())


def table_rows(text: str) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| arm")
            and not line.startswith("| difference")}


def test_the_doc_holds_the_tables_the_report_regenerates(tmp_path):
    _, texts = study_report(STUDY_FILE, images=tmp_path)
    doc = DOC.read_text()
    for name, text in texts.items():
        assert f"<!-- study-{name}:begin -->\n{text}\n<!-- study-{name}:end -->" in doc, name
    assert sorted(p.name for p in tmp_path.glob("*.png"))  # the figures were drawn


def test_the_gaps_agree_with_the_metrics_recomputed_independently():
    study = load_study(STUDY_FILE)
    results = collect(study)
    doc = DOC.read_text()
    for size in results.sizes():
        rows = table_rows(doc.split(f"<!-- study-{size}-arms:begin -->")[1].split("<!-- study-")[0])
        reference = {seed: validation_points(study.results / size / study.reference / f"seed{seed}")
                     for seed in results.summaries[size][study.reference]}
        for arm in results.arms(size):
            runs = {seed: validation_points(study.results / size / arm / f"seed{seed}")
                    for seed in results.summaries[size][arm]}
            finals = [points[max(points)] for points in runs.values()]
            assert float(rows[arm][4].split()[0]) == pytest.approx(sum(finals) / len(finals), abs=6e-5)
            if arm == study.reference or len(runs) < 2:
                continue
            gaps = [100 * (runs[s][max(runs[s])] / reference[s][max(reference[s])] - 1) for s in runs]
            for printed, expected in zip(parse_interval(rows[arm][5]), scipy_interval(gaps)):
                assert printed == pytest.approx(expected, abs=0.006), (size, arm)
            steps = max(runs[0])
            bound = steps * 7 // 10  # the last 30%: steps past 70%, the bound in integers (0.7 * 1400 < 980)
            window = sorted(k for k in runs[0] if k > bound)
            if size == "9m":
                assert (steps, window) == (1400, list(range(1050, 1401, 70))), window  # six points
            late = [100 * (sum(runs[s][k] for k in window) / len(window) /
                           (sum(reference[s][k] for k in window) / len(window)) - 1) for s in runs]
            for printed, expected in zip(parse_interval(rows[arm][6]), scipy_interval(late)):
                assert printed == pytest.approx(expected, abs=0.006), (size, arm)


def test_the_doc_states_a_claim_only_where_the_interval_excludes_zero():
    results = collect(load_study(STUDY_FILE))
    for size in results.sizes():
        for line in sections(results)[f"{size}-arms"].splitlines():
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            if len(cells) < 9 or "[" not in cells[6]:
                continue
            (_, low, high), (_, late_low, late_high) = parse_interval(cells[6]), parse_interval(cells[7])
            resolved = (low > 0 or high < 0) and (late_low > 0 or late_high < 0)
            assert (cells[8] in ("worse", "better")) == resolved, line


def test_the_seeds_each_unresolved_effect_needs_recompute_from_the_metrics():
    """docs/study.md's seeds table: for every unresolved difference, the sd of its paired values recomputed from
    the JSONL, and the fewest seeds n with t_{0.975, n-1} * sd / sqrt(n) <= 0.2 points, searched here with
    scipy's t quantile."""
    import math

    study = load_study(STUDY_FILE)
    doc = DOC.read_text()
    table = doc.split("<!-- study-9m-seeds:begin -->")[1].split("<!-- study-9m-seeds:end -->")[0]
    rows = {(cells[0], cells[1]): cells[2:] for cells in
            ([cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| unresolved"))}
    final = {arm: {seed: validation_points(study.results / "9m" / arm / f"seed{seed}") for seed in (0, 1, 2)}
             for arm in ("bf16", "fp8", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht")}
    last = {arm: {seed: points[max(points)] for seed, points in runs.items()} for arm, runs in final.items()}
    effects = {"fp8 - bf16": [100 * (last["fp8"][s] / last["bf16"][s] - 1) for s in (0, 1, 2)]}
    for arm in ("nvfp4_no_sr", "nvfp4_no_rht"):
        effects[f"{arm} - nvfp4"] = [100 * (last[arm][s] - last["nvfp4"][s]) / last["bf16"][s] for s in (0, 1, 2)]
    for label, values in effects.items():
        sd = stats.tstd(values)
        needed = next(n for n in range(2, 1000) if stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) <= 0.2)
        seeds, printed_sd, now, printed_needed = rows[(label, "final val")]
        assert seeds == "0, 1, 2" and float(printed_sd) == pytest.approx(sd, abs=0.006), label
        assert int(printed_needed) == needed, label
    assert ("nvfp4 - fp8", "final val") not in rows  # resolved: no row


def test_write_doc_replaces_only_the_marked_blocks(tmp_path):
    document = tmp_path / "doc.md"
    document.write_text("intro\n<!-- study-a:begin -->\nold\n<!-- study-a:end -->\nmiddle\n"
                        "<!-- study-b:begin -->\nold b\n<!-- study-b:end -->\nend\n")
    assert write_doc(document, {"a": "new a", "c": "nowhere"}) == ["a"]
    assert document.read_text() == ("intro\n<!-- study-a:begin -->\nnew a\n<!-- study-a:end -->\nmiddle\n"
                                    "<!-- study-b:begin -->\nold b\n<!-- study-b:end -->\nend\n")
    document.write_text("<!-- study-a:begin -->\nunclosed\n")
    with pytest.raises(ValueError, match="study-a:end"):
        write_doc(document, {"a": "x"})


def test_compare_runs_takes_seed_groups_and_agrees_with_the_report(tmp_path):
    import subprocess
    import sys

    runs = STUDY_FILE.parent / "9m"
    groups = [",".join(str(runs / arm / f"seed{seed}") for seed in (0, 1, 2)) for arm in ("bf16", "nvfp4")]
    command = [sys.executable, "-m", "reports.compare_runs", *groups, "--labels", "bf16", "nvfp4",
               "--out", str(tmp_path / "seeds.png"), "--json", str(tmp_path / "seeds.json")]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    numbers = json.loads((tmp_path / "seeds.json").read_text())
    rows = table_rows(DOC.read_text().split("<!-- study-9m-arms:begin -->")[1].split("<!-- study-")[0])
    final = numbers["arms"]["nvfp4"]["final"]
    assert (round(final["mean"], 2), round(final["low"], 2), round(final["high"], 2)) == parse_interval(rows["nvfp4"][5])
    assert (tmp_path / "seeds.png").is_file()

    unequal = subprocess.run([*command[:3], groups[0], groups[1].rsplit(",", 1)[0], "--out", str(tmp_path / "x.png")],
                             cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
    assert unequal.returncode != 0 and "same number of runs" in unequal.stderr


def test_the_size_axis_reports_each_sizes_gap_from_its_own_runs(tmp_path):
    """Two sizes made from the committed 9m runs: the wider one's NVFP4 validation losses scaled by a
    known factor per seed, so its paired gap is known exactly; the sizes table and figure follow."""
    import shutil

    import yaml

    source = STUDY_FILE.parent / "9m"
    factors = {0: 1.004, 1: 1.006, 2: 1.008}  # the wider size's NVFP4 / BF16 final losses, per seed
    for size, hidden in (("small", 256), ("wide", 384)):
        for arm in ("bf16", "nvfp4"):
            for seed in (0, 1, 2):
                target = tmp_path / size / arm / f"seed{seed}"
                shutil.copytree(source / arm / f"seed{seed}", target)
                config = yaml.safe_load((target / "config.yaml").read_text())
                config["model"]["hidden_size"] = hidden
                (target / "config.yaml").write_text(yaml.safe_dump(config))
                if size == "wide":  # the same BF16 curve for both arms, NVFP4 scaled by its factor
                    lines = [json.loads(line) for line in
                             (source / "bf16" / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()]
                    for line in lines:
                        if arm == "nvfp4" and line.get("val_loss") is not None:
                            line["val_loss"] *= factors[seed]
                    (target / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "sizes", "reference": "bf16", "seeds": [0, 1, 2], "seed_overrides": ["seed={seed}"],
        "sizes": {"small": {"overrides": [], "arms": "all"}, "wide": {"overrides": ["model.hidden_size=384"],
                                                                      "arms": "all"}},
        "arms": {"bf16": {"experiment": "study_bf16", "overrides": []},
                 "nvfp4": {"experiment": "study_nvfp4", "overrides": []}},
    }, sort_keys=False))
    results, texts = study_report(study, images=tmp_path / "images")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in texts["sizes"].splitlines()[2:]}
    assert list(rows) == ["small", "wide"]
    small_parameters, wide_parameters = (float(rows[size][0].rstrip("M")) for size in ("small", "wide"))
    assert wide_parameters > small_parameters
    expected = scipy_interval([100 * (factor - 1) for factor in factors.values()])  # 0.6% [0.35, 0.85]
    assert parse_interval(rows["wide"][4]) == pytest.approx(expected, abs=0.006)
    committed = table_rows(DOC.read_text().split("<!-- study-9m-arms:begin -->")[1].split("<!-- study-")[0])
    assert rows["small"][4] == committed["nvfp4"][5]  # the unchanged size keeps the committed gap
    assert (tmp_path / "images" / "study_sizes.png").is_file()
