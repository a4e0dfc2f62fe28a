"""The docs and the code describe the product as it is, not the history of how it was made.

README.md, docs/ and the product packages (code, comments, docstrings, configs) may not name
work sessions ("the sixth session"), issue numbers ("issue 10", "#12"), benchmark run letters
("run AK", "runs Z and AA"), branch names or commit narratives (commit hashes, "not merged"):
history lives in `git log` and CHANGELOG.md. Nothing in the repository may cite a file outside
it (`DESIGN.md`, `../shared`): users do not have them.

Each rule is a regular expression checked against positive and negative examples below, so
that a rule that flags ordinary words ("instruction issue", "Hopper runs FP8", a colour
"#000000", an upstream "pytorch/pytorch#189271") or misses its target fails here first.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRODUCT = ["README.md", "CHANGELOG.md", "docs", "models", "data", "fileio", "trainer", "reports", "study", "benchmarks", "scripts",
           "configs"]
"""What the voice rules read: the docs and the product packages (tests and results/ are not product)."""
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ""}

_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
             r"\w+teenth|twentieth|\d+(?:st|nd|rd|th)")

RULES = {
    # "Sixth session", "the tenth session's kernels", "in this session"; not start_new_session or
    # "a new process session" (setsid).
    "session": re.compile(
        rf"\b(?:{_ORDINALS}|this|that|the|next|previous|last|earlier|later|same)\s+sessions?\b(?:'s)?",
        re.IGNORECASE),
    # "issue 10", "issue-16 refactor", "issues 5 and 9", "issue17-combo", "#12"; not "instruction
    # issue", "issue-bound", the verb ("can issue 2 loads"), an upstream "pytorch/pytorch#189271"
    # or a colour "#000000" in quotes.
    "issue number": re.compile(
        r"\bissues?[ -]?#?\d+(?!\d|\.\d|\s+(?:instructions?|loads?|stores?|requests?|warps?|cycles?|launches)\b)"
        r"|(?<![\w/\"'#&])#\d+\b", re.IGNORECASE),
    # "run AK", "Run A", "runs Z and AA", "(runs AA, AB)"; not "runs FP8", "run A/B tests", "runs CI".
    "run letter": re.compile(r"\b[Rr]uns? (?!(?:CI|OK|IO|UI|ID)\b)[A-Z]{1,2}(?![\w/])"),
    # branch `issue17-combo`, "(branch)", "left unmerged", "merged since"; not the code sense of a
    # branch ("the non-RHT branch") or a variable named merged.
    "branch": re.compile(
        r"\bbranch(?:es)?\s+`|\(branch(?:es)?[),;]|\bunmerged\b|\b(?:not|was|were|been|since|later|then)\s+merged\b"
        r"|\bmerged\s+(?:since|after|before|into|on)\b", re.IGNORECASE),
    # "commit 8568320", "(code 7f585dd)", a bare abbreviated hash; not 0x9E3779B9, deadbeef,
    # 1048576, 1e-5 or a 64-digit sha256.
    "commit": re.compile(
        r"\bcommits?\s+[0-9a-f]{7,40}\b"
        r"|(?<![\w.\-/])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.\-])"),
}

PROVENANCE = "Provenance: "
"""A line that records which code and data produced a table (the study report writes it from run.json):
its commit and corpus hashes are a record of the result, not a narrative, so no pattern applies to it."""

OUTSIDE = re.compile(r"\bDESIGN\.md\b|(?:\.\./|/work/)shared\b")
"""A citation of a file that is not in the repository."""

EXAMPLES = {
    "session": (
        ["### Sixth session (2026-12-03)", "32.3 ms with the tenth session's kernels", "measured in this session",
         "27 of the session's 30 minutes", "the 13th session"],
        ["subprocess.Popen(..., start_new_session=True)", "a new process session (setsid)", "wandb.init(...)",
         "the W&B run's session id"]),
    "issue number": (
        ["are still to be made (issue 10)", "after the issue-16 refactor", "FP8 linear layer (issues 5 and 9)",
         "branch `issue17-combo`", "Issue 9 quotes 93.9 TFLOP", "see #12", "(#7)", "as asked in issue 9."],
        ["bound by instruction issue, not HBM", "issue-bound kernels", "pytorch/pytorch#189271",
         "color='#000000'", "an issue with the input", "&#8203;", "x = y  # 16 x 16 tiles",
         "a warp can issue 2 instructions per cycle", "threads issue 4 loads in flight"]),
    "run letter": (
        ["(run AK)", "**Run A**, code at commit", "runs Z and AA", "default launches (runs AA, AB)",
         "run Y: the 2D kernel both ways", "in run X"],
        ["Hopper runs FP8 only", "precision.backend=torch runs FP8 formats", "run A/B comparisons",
         "it runs CI's command", "the run directory", "runs AdamW outside the graph", "a run Kit"]),
    "branch": (
        ["branch `issue17-dual`, bit-identical", "measured no faster (branch)", "branches left unmerged",
         "not merged", "merged since", "That code was merged after these runs"],
        ["the non-RHT branch was dead", "A/B-only branches", "merged = OmegaConf.merge(a, b)",
         "the merged config", "a constexpr branch is compiled"]),
    "commit": (
        ["code at commit 35dd261", "run AH, code 7f585dd", "commit 8568320", "(c56cbc2)"],
        ["0x9E3779B9", "deadbeef", "1048576 tokens", "lr 1e-5", "e4m3fn", "sha256 " + "ab12" * 16,
         "bf16 fp32 fp8"]),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_flags_its_examples_and_spares_ordinary_words(rule):
    flagged, spared = EXAMPLES[rule]
    for text in flagged:
        assert RULES[rule].search(text), f"{rule} misses {text!r}"
    for text in spared:
        assert not RULES[rule].search(text), f"{rule} flags {text!r}: {RULES[rule].search(text).group(0)!r}"


def test_the_outside_citation_rule():
    for text in ["The design is `../shared/DESIGN.md`", "measured ceilings (DESIGN.md)", "see /work/shared/device"]:
        assert OUTSIDE.search(text), text
    for text in ["docs/numerics.md", "shared memory", "a shared amax pass", "DESIGN_NOTES = 1"]:
        assert not OUTSIDE.search(text), text


def _tracked_files() -> list:
    """Every file git tracks, plus untracked ones it does not ignore (a new file counts before its commit)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    return [ROOT / name for name in listed if name and (ROOT / name).is_file()]


def _text(path: Path):
    if path.suffix not in TEXT_SUFFIXES:
        return None
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None


def _hits(pattern: re.Pattern, files) -> list:
    found = []
    for path in files:
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if line.startswith(PROVENANCE):
                continue
            for match in pattern.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:140]}")
    return found


def _product_files() -> list:
    return [path for path in _tracked_files()
            if path.relative_to(ROOT).parts[0] in PRODUCT]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_docs_and_the_product_speak_of_the_product_not_its_history(rule):
    found = _hits(RULES[rule], _product_files())
    assert not found, f"{len(found)} {rule} reference(s); say what the product is, history is in git log:\n" + \
        "\n".join(found)


def test_nothing_cites_a_file_outside_the_repository():
    files = [path for path in _tracked_files() if path != Path(__file__).resolve()]
    found = _hits(OUTSIDE, files)
    assert not found, f"{len(found)} citation(s) of files users do not have; move what they need into docs/:\n" + \
        "\n".join(found)
