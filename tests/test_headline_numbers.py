"""The README's headline numbers are the ones in docs/performance.md's and docs/study.md's tables.

The convention: a headline number carries an HTML comment right after it (a Markdown renderer
shows nothing of it), `VALUE<!-- headline: NAME -->`. VALUE is the last number before the
marker; a sign, thousands commas, a unit (x, %, ms, GiB, us, s) and Markdown bold may surround
it: `**1.07x**<!-- headline: slice.nvfp4_vs_bf16 -->` reads 1.07. NAME says where the number
comes from:

- `study:ROW:COLUMN`: docs/study.md's results table, between `<!-- study-9m-arms:begin -->` and
  `<!-- study-9m-arms:end -->` (scripts/study_report.py regenerates it): the row whose first cell
  is ROW (backticks and bold ignored), the first column whose header contains COLUMN (case
  ignored), the first number in that cell. So a cell that gains a confidence interval,
  `+1.49% (+1.21, +1.77)`, still reads +1.49; a renamed row or column fails here, naming it.
- any other NAME: docs/performance.md holds the same marker exactly once, after its number.

Every marker in the README must resolve to an equal number, and every headline marker of
docs/performance.md must be quoted by the README. To change a headline, change the table,
then the README.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
STUDY = ROOT / "docs" / "study.md"

MARKER = re.compile(r"<!-- headline: (.+?) -->")
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?")
TRAILER = re.compile(r"(?:\s*(?:x|%|ms|GiB|us|s)\b|\s*%)?[\s*]*$")
"""What may stand between a number and its marker: a unit, Markdown bold."""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def headline_values(text: str, where: str) -> list:
    """[(name, value, line)] of every marker in text, the value being the number right before it."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = re.sub(r"`[^`]*`", lambda code: " " * len(code.group(0)), line)  # a marker quoted as code is not one
        for marker in MARKER.finditer(line):
            before = line[: marker.start()]
            before = MARKER.sub("", before)  # an earlier marker on the same line is not text
            trailer = TRAILER.search(before)
            head = before[: trailer.start()] if trailer else before
            value = re.search(NUMBER.pattern + r"$", head)
            assert value, f"{where}:{number}: no number right before {marker.group(0)}"
            found.append((marker.group(1).strip(), _number(value.group(0)), f"{where}:{number}"))
    return found


def study_table_value(text: str, row: str, column: str) -> float:
    """The first number of docs/study.md's results table at (row named ROW, column whose header holds COLUMN)."""
    table = re.search(r"<!-- study-(\w+)-arms:begin -->\n(.*?)<!-- study-\1-arms:end -->", text, re.S)
    assert table, "docs/study.md has no <!-- study-SIZE-arms:begin --> ... <!-- study-SIZE-arms:end --> table"
    lines = [line for line in table.group(2).splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    header, rows = cells[0], [c for c in cells[2:]]
    columns = [i for i, name in enumerate(header) if column.lower() in name.lower()]
    assert columns, f"docs/study.md's table has no column named like {column!r}: {header}"
    named = [c for c in rows if c[0].strip("`*") == row]
    assert named, f"docs/study.md's table has no row {row!r}: {[c[0] for c in rows]}"
    value = NUMBER.search(named[0][columns[0]])
    assert value, f"docs/study.md: row {row!r}, column {header[columns[0]]!r} holds no number: {named[0][columns[0]]!r}"
    return _number(value.group(0))


# ----------------------------------------------------------------------------------- the parser
def test_the_value_is_the_number_right_before_its_marker():
    text = ("NVFP4 1.07x<!-- headline: a --> and **0.89x**<!-- headline: b -->\n"
            "| bf16 | **180.0**<!-- headline: c --> | 53.1%<!-- headline: d --> |\n"
            "BF16 72.9<!-- headline: e --> -> 20.7 ms<!-- headline: f -->, gap +0.37%<!-- headline: g -->\n"
            "45,511<!-- headline: h -->")
    values = {name: value for name, value, _ in headline_values(text + "\nthe marker `<!-- headline: NAME -->`", "t")}
    assert values == {"a": 1.07, "b": 0.89, "c": 180.0, "d": 53.1, "e": 72.9, "f": 20.7, "g": 0.37, "h": 45511}
    with pytest.raises(AssertionError, match="no number"):
        headline_values("a headline without a number<!-- headline: x -->", "t")


def test_study_values_survive_a_table_that_gains_confidence_intervals():
    plain = ("<!-- study-9m-arms:begin -->\n"
             "| run | final val loss | gap to BF16 | beyond seed noise |\n|---|---|---|---|\n"
             "| bf16 | 1.6812 | +0.00% | (reference) |\n| nvfp4 | 1.7063 | +1.49% | yes |\n"
             "<!-- study-9m-arms:end -->\n")
    with_ci = ("<!-- study-9m-arms:begin -->\n"
               "| run | seeds | final val loss, mean (95% CI) | gap to BF16, mean (95% CI) |\n|---|---|---|---|\n"
               "| `nvfp4` | 3 | 1.7063 (1.7001, 1.7125) | +1.49% (+1.21%, +1.77%) |\n"
               "<!-- study-9m-arms:end -->\n")
    assert study_table_value(plain, "nvfp4", "gap to BF16") == 1.49
    assert study_table_value(with_ci, "nvfp4", "gap to bf16") == 1.49
    assert study_table_value(with_ci, "nvfp4", "final val loss") == 1.7063
    with pytest.raises(AssertionError, match="no row 'mxfp4'"):
        study_table_value(with_ci, "mxfp4", "gap to BF16")
    with pytest.raises(AssertionError, match="no column"):
        study_table_value(plain, "nvfp4", "tokens to match")


# ----------------------------------------------------------------------------------- the documents
def _resolve(name: str, performance: dict) -> float:
    if name.startswith("study:"):
        _, row, column = name.split(":", 2)
        return study_table_value(STUDY.read_text(), row, column)
    assert name in performance, f"docs/performance.md has no <!-- headline: {name} --> marker"
    return performance[name]


def _performance_values() -> dict:
    values = {}
    for name, value, where in headline_values(PERFORMANCE.read_text(), "docs/performance.md"):
        assert name not in values, f"{where}: a second <!-- headline: {name} --> marker"
        values[name] = value
    return values


def test_the_readme_quotes_the_tables_numbers():
    performance = _performance_values()
    quoted = headline_values(README.read_text(), "README.md")
    names = {name for name, _, _ in quoted}
    # The headlines a newcomer reads: the slice against BF16 and Megatron-Core, the study-size step, the study.
    for required in ("slice.bf16_ms", "slice.nvfp4_vs_bf16", "slice.fp8_vs_bf16", "megatron.bf16_ms",
                     "study_step.all_quantized", "study:nvfp4:gap to BF16", "study:fp8:gap to BF16"):
        assert required in names, f"README.md quotes no <!-- headline: {required} -->"
    wrong = [f"{where}: {name} is {value:g} in README.md, {_resolve(name, performance):g} in its table"
             for name, value, where in quoted if value != _resolve(name, performance)]
    assert not wrong, "\n".join(wrong)


def test_every_headline_of_performance_md_is_quoted_by_the_readme():
    quoted = {name for name, _, _ in headline_values(README.read_text(), "README.md")}
    unquoted = sorted(set(_performance_values()) - quoted)
    assert not unquoted, f"docs/performance.md marks headlines the README does not quote: {unquoted}"


def test_the_readme_and_performance_md_stay_short():
    readme = README.read_text().splitlines()
    assert len(readme) <= 260, f"README.md has {len(readme)} lines (at most 260: details go to docs/)"
    assert len(PERFORMANCE.read_text().splitlines()) <= 400, "docs/performance.md is over 400 lines"
    # The paragraph after the test command (read by .ci/run) says what it runs in at most 6 lines.
    start = next(i for i, line in enumerate(readme) if "<!-- test-command" in line)
    end = next(i for i in range(start + 2, len(readme)) if readme[i].startswith("```"))
    paragraph = []
    for line in readme[end + 1:]:
        if not line.strip() and paragraph:
            break
        if line.strip():
            paragraph.append(line)
    assert 0 < len(paragraph) <= 6, f"the README's test paragraph has {len(paragraph)} lines (at most 6)"


def _table_row(text: str, label: str) -> list:
    """The numbers of the Markdown table row whose first cell is ``label`` (None for an empty cell)."""
    row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [float(cell) if cell.strip() else None for cell in row.strip().strip("|").split("|")[1:]]


def test_the_quickstart_table_states_a_tolerance_its_fresh_run_keeps():
    """README's quickstart table gives a tolerance; docs/reporting.md's fresh run of the same command lies within
    it, the README's largest difference seen is that run's, and the reference rows there are the README's."""
    readme, reporting = README.read_text(), (ROOT / "docs" / "reporting.md").read_text()
    stated = re.search(r"A fresh run lands within ([\d.]+)% of these \(the largest difference seen: ([\d.]+)%\)",
                       readme.replace("\n", " "))
    assert stated, "README.md: the quickstart's tolerance sentence is gone"
    tolerance, largest = float(stated.group(1)) / 100, float(stated.group(2)) / 100
    differences = []
    for readme_label, label in (("loss (mean of the last 10 steps)", "loss"), ("validation loss", "validation loss")):
        reference = _table_row(readme, readme_label)
        assert _table_row(reporting, f"{label}, README") == reference
        for was, now in zip(reference, _table_row(reporting, f"{label}, fresh run")):
            if was is not None:
                differences.append(abs(now / was - 1))
    assert len(differences) == 9 and max(differences) <= tolerance
    assert round(max(differences), 4) == pytest.approx(largest)
