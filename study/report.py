"""A study's report from its committed results alone (no GPU): tables with 95% CIs, figures, the doc.

Reads the study file (study/definition.py) and every completed run under its folder
(<size>/<arm>/seed<k>/ with metrics.jsonl, config.yaml, run.json), then writes:
- per size, the arms table: seeds, final validation loss (mean +- sd over seeds), and the gap to the
  reference paired by seed on the final and on the late (last 30%) validation loss, each with its
  95% t interval and a verdict (worse / better / not resolved at this size);
- per size, the differences between arms the study file lists (`comparisons`), in percentage
  points, paired by seed, with intervals;
- per size and arm, the growth of the gap once the learning rate decays (decay-phase minus
  stable-phase mean gap, paired by seed, with its interval);
- across sizes (when there is more than one), the gap against parameters;
- which code and which corpus the runs trained on (commits and corpus content hashes from run.json);
- figures: per size and `figures` entry, validation loss (mean over seeds) and the paired gap in %
  with its 95% band, against tokens; across sizes, the final gap against parameters.

The arithmetic: study/stats.py. `write_doc` replaces the text between the
`<!-- study-NAME:begin -->` / `<!-- study-NAME:end -->` markers of a Markdown file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from study.definition import Study, load_study
from study.runner import run_record
from study.stats import (
    Interval,
    RunSummary,
    decay_growth_interval,
    difference_interval,
    gap_curve,
    gap_interval,
    loss_curve,
    seeds_for_half_width,
    summarize_run,
    t_interval,
)

ROOT = Path(__file__).resolve().parents[1]
STUDY_FILE = ROOT / "results" / "study" / "study.yaml"


@dataclasses.dataclass
class StudyResults:
    """The completed runs of a study: summaries[size][arm][seed] and their run.json records."""

    study: Study
    summaries: dict
    records: dict

    def arms(self, size: str) -> list[str]:
        """The arms of ``size`` with at least one completed run, in the study file's order."""
        return [arm for arm in self.study.arms if self.summaries.get(size, {}).get(arm)]

    def sizes(self) -> list[str]:
        return [size for size in self.study.sizes if self.summaries.get(size)]


def collect(study: Study) -> StudyResults:
    """Every completed run of the study under its results folder."""
    summaries: dict = {}
    records: dict = {}
    for run in study.runs():
        directory = study.results / run.id
        record = run_record(directory)
        if record.get("status") != "completed" or record.get("probe_overrides"):
            continue
        summaries.setdefault(run.size, {}).setdefault(run.arm, {})[run.seed] = summarize_run(directory)
        records[run.id] = record
    return StudyResults(study, summaries, records)


# ---------------------------------------------------------------------------------- tables
def _loss_cell(runs: dict[int, RunSummary]) -> str:
    interval = t_interval([run.final_val for run in runs.values()])
    return f"{interval.mean:.4f}" if interval.n < 2 else f"{interval.mean:.4f} +- {interval.sd:.4f}"


def _verdict(final: Optional[Interval], late: Optional[Interval]) -> str:
    if final is None or late is None:
        return ""
    if final.n < 2:
        return "one seed"
    verdicts = {final.verdict(), late.verdict()}
    return verdicts.pop() if len(verdicts) == 1 else f"final: {final.verdict()}; late: {late.verdict()}"


def arms_table(results: StudyResults, size: str) -> str:
    study, runs = results.study, results.summaries[size]
    reference = runs.get(study.reference, {})
    corpus_tokens = _corpus_tokens(results, size)
    lines = ["| arm | seeds | parameters | tokens | epochs | final val loss (mean +- sd) | "
             f"gap to {study.reference}, final val | gap, last-30% val | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm in results.arms(size):
        arm_runs = runs[arm]
        first = next(iter(arm_runs.values()))
        epochs = f"{first.tokens / corpus_tokens:.2f}" if corpus_tokens else "?"
        if arm == study.reference:
            gap_cells, verdict = "(reference)", "(reference)"
            cells = f"{gap_cells} | {gap_cells}"
        else:
            final, late = gap_interval(arm_runs, reference, "final"), gap_interval(arm_runs, reference, "late")
            cells = f"{final.format(unit='%') if final else 'no paired seed'} | {late.format(unit='%') if late else ''}"
            verdict = _verdict(final, late)
        lines.append(f"| {arm} | {', '.join(map(str, sorted(arm_runs)))} | {first.parameters / 1e6:.2f}M | "
                     f"{first.tokens / 1e6:.2f}M | {epochs} | {_loss_cell(arm_runs)} | {cells} | {verdict} |")
    missing = [arm for arm in study.arms if arm not in results.arms(size) and _size_has_arm(study, size, arm)]
    if missing:
        lines += ["", f"Not run yet at this size: {', '.join(missing)}."]
    return "\n".join(lines)


def differences_table(results: StudyResults, size: str) -> str:
    study, runs = results.study, results.summaries[size]
    reference = runs.get(study.reference, {})
    lines = ["| difference (percentage points of the reference's loss) | seeds | final val | last-30% val | verdict |",
             "|---|---|---|---|---|"]
    for first, second in study.comparisons:
        if first not in runs or second not in runs:
            continue
        final = difference_interval(runs[first], runs[second], reference, "final")
        late = difference_interval(runs[first], runs[second], reference, "late")
        if final is None:
            continue
        seeds = sorted(set(runs[first]) & set(runs[second]) & set(reference))
        verdict = _verdict(final, late).replace("worse", f"{first} worse").replace("better", f"{first} better")
        lines.append(f"| {first} - {second} | {', '.join(map(str, seeds))} | {final.format(unit=' pts')} | "
                     f"{late.format(unit=' pts')} | {verdict} |")
    return "\n".join(lines) if len(lines) > 2 else "No pair of the study's comparisons has results at this size yet."


def phases_table(results: StudyResults, size: str) -> str:
    """Per arm: does its gap grow once the learning rate decays? (decay-phase minus stable-phase mean gap)"""
    study, runs = results.study, results.summaries[size]
    reference = runs.get(study.reference, {})
    lines = [f"| arm | seeds | gap growth in the decay phase (percentage points) | verdict |", "|---|---|---|---|"]
    for arm in results.arms(size):
        if arm == study.reference:
            continue
        growth = decay_growth_interval(runs[arm], reference)
        if growth is None:
            continue
        verdict = growth.verdict(above="grows", below="shrinks")
        lines.append(f"| {arm} | {', '.join(map(str, sorted(set(runs[arm]) & set(reference))))} | "
                     f"{growth.format(unit=' pts')} | {verdict} |")
    return "\n".join(lines)


SEEDS_HALF_WIDTH = 0.2
"""The half-width (percentage points) of the 95% interval the seeds table asks each unresolved effect for."""


def seeds_table(results: StudyResults, size: str, half_width: float = SEEDS_HALF_WIDTH) -> str:
    """Per unresolved effect (a gap to the reference, a difference, a decay-phase growth whose interval
    includes zero): the sd of its paired values over the seeds at hand, and how many seeds would give a
    95% interval of +-``half_width`` points at that spread (study.stats.seeds_for_half_width)."""
    study, runs = results.study, results.summaries[size]
    reference = runs.get(study.reference, {})
    effects = []  # (label, seeds, {measure: interval})
    for arm in results.arms(size):
        if arm != study.reference and reference:
            effects.append((f"{arm} - {study.reference}", sorted(set(runs[arm]) & set(reference)),
                            {m: gap_interval(runs[arm], reference, m) for m in ("final", "late")}))
    for first, second in study.comparisons:
        if first in runs and second in runs and reference:
            effects.append((f"{first} - {second}", sorted(set(runs[first]) & set(runs[second]) & set(reference)),
                            {m: difference_interval(runs[first], runs[second], reference, m)
                             for m in ("final", "late")}))
    for arm in results.arms(size):
        if arm != study.reference and reference:
            effects.append((f"{arm}: gap growth in the decay phase", sorted(set(runs[arm]) & set(reference)),
                            {"decay": decay_growth_interval(runs[arm], reference)}))
    lines = ["| unresolved effect (percentage points) | measure | seeds | sd over seeds | 95% interval now | "
             f"seeds for a +-{half_width:g}-point interval |", "|---|---|---|---|---|---|"]
    names = {"final": "final val", "late": "last-30% val", "decay": "decay minus stable phase"}
    for label, seeds, intervals in effects:
        for measure, interval in intervals.items():
            if interval is None or interval.n < 2 or interval.resolved:
                continue
            needed = seeds_for_half_width(interval.sd, half_width)
            lines.append(f"| {label} | {names[measure]} | {', '.join(map(str, seeds))} | {interval.sd:.2f} | "
                         f"{interval.mean:+.2f} +- {interval.high - interval.mean:.2f} | "
                         f"{needed if needed else 'over 1000'} |")
    return "\n".join(lines) if len(lines) > 2 else "Every effect at this size is resolved."


def sizes_table(results: StudyResults, arms: tuple[str, ...] = ("fp8", "nvfp4")) -> str:
    study = results.study
    lines = ["| size | parameters | tokens | tokens per parameter | "
             + " | ".join(f"{arm} gap, final val" for arm in arms) + " |",
             "|---|---|---|---|" + "---|" * len(arms)]
    for size in results.sizes():
        runs = results.summaries[size]
        if study.reference not in runs:
            continue
        first = next(iter(runs[study.reference].values()))
        cells = []
        for arm in arms:
            interval = gap_interval(runs[arm], runs[study.reference], "final") if arm in runs else None
            cells.append(interval.format(unit="%") if interval else "")
        lines.append(f"| {size} | {first.parameters / 1e6:.2f}M | {first.tokens / 1e6:.1f}M | "
                     f"{first.tokens / first.parameters:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def provenance(results: StudyResults, size: str) -> str:
    """Which code, corpus, GPU and dates the runs of ``size`` trained on, each with the runs it covers."""
    groups: dict = {"code": {}, "corpus": {}, "GPU": {}, "dates": {}}
    for run_id, record in results.records.items():
        if not run_id.startswith(f"{size}/"):
            continue
        for source in record.get("sources_per_call", [record.get("source", {})]):
            label = f"`{(source.get('commit') or 'unknown')[:10]}`" + (" (dirty)" if source.get("dirty") else "")
            groups["code"].setdefault(label, set()).add(run_id)
        groups["corpus"].setdefault(_corpus_label(record.get("corpus") or {}), set()).add(run_id)
        groups["GPU"].setdefault((record.get("system") or {}).get("gpu") or "unknown", set()).add(run_id)
        for date in _run_dates(results.study.results / run_id, record):
            groups["dates"].setdefault(date, set()).add(run_id)
    parts = []
    for name, labels in groups.items():
        if name == "dates":  # one group per set of runs: "2026-12-04 (...)", "2026-12-06 (...)"
            by_runs: dict = {}
            for date, runs in sorted(labels.items()):
                by_runs.setdefault(frozenset(runs), []).append(date)
            labels = {" to ".join(sorted({dates[0], dates[-1]})): set(runs) for runs, dates in by_runs.items()}
        parts.append(f"{name} " + "; ".join(f"{label} ({_runs_label(results.study, runs)})"
                                            for label, runs in labels.items()))
    return "Provenance: " + "; ".join(parts) + "."


def _runs_label(study: Study, run_ids: set) -> str:
    """'bf16, fp8, nvfp4_no_rht seeds 1, 2': an arm by its name when every one of its runs here is in
    ``run_ids``, else with the seeds that are."""
    by_arm: dict = {}
    for run_id in run_ids:
        size, arm, seed = run_id.split("/")
        by_arm.setdefault(arm, set()).add(int(seed.removeprefix("seed")))
    labels = []
    for arm in (a for a in study.arms if a in by_arm):
        seeds = sorted(by_arm[arm])
        every = {run.seed for run in study.runs() if run.size == size and run.arm == arm}
        labels.append(arm if set(seeds) >= every else
                      f"{arm} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}")
    return ", ".join(labels)


def _run_dates(directory: Path, record: dict) -> list[str]:
    """The UTC dates (YYYY-MM-DD) a run trained on: run.json's started_per_call, else its events.jsonl's times."""
    import datetime
    import json

    if len(record.get("started_per_call", [])) == record.get("calls"):
        return sorted({date[:10] for date in record["started_per_call"]})
    events = Path(directory) / "events.jsonl"
    times = [json.loads(line).get("time") for line in events.read_text().splitlines()] if events.is_file() else []
    return sorted({datetime.datetime.fromtimestamp(time, datetime.timezone.utc).strftime("%Y-%m-%d")
                   for time in times if isinstance(time, (int, float))})


def _corpus_label(corpus: dict) -> str:
    """The content hash of the tokens (data.shards.content_sha256); older runs recorded only a hash of the
    manifest files, which includes the preparation time, so it tells apart preparations, not corpora."""
    train = (corpus.get("tokens") or {}).get("train")
    tokens = f", {train:,} training tokens" if train else ""
    if corpus.get("content_sha256"):
        return f"content sha256 `{corpus['content_sha256'][:16]}`{tokens}"
    if corpus.get("manifest_sha256"):
        return f"no content hash, manifest sha256 `{corpus['manifest_sha256'][:16]}`{tokens}"
    return "unknown"


def _corpus_tokens(results: StudyResults, size: str) -> Optional[int]:
    for run_id, record in results.records.items():
        if run_id.startswith(f"{size}/"):
            tokens = (record.get("corpus") or {}).get("tokens", {}).get("train")
            if tokens:
                return int(tokens)
    return None


def _size_has_arm(study: Study, size: str, arm: str) -> bool:
    chosen = study.sizes[size].get("arms", "all")
    return chosen == "all" or arm in chosen


# ---------------------------------------------------------------------------------- figures
def gap_figure(groups: dict[str, dict[int, RunSummary]], reference: str, title: str, path: Path) -> Path:
    """Validation loss (mean over seeds) and the gap to ``reference`` paired by seed with its 95% band, vs tokens.

    groups: label -> {seed: summary}, the reference among them. The legend sits outside the axes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, layout="constrained")
    ceiling = []
    for label in [reference, *(name for name in groups if name != reference)]:
        curve = loss_curve(groups[label])
        tokens = [t / 1e6 for t, _ in curve]
        line, = top.plot(tokens, [i.mean for _, i in curve], label=f"{label} (n={len(groups[label])})")
        ceiling += [i.mean for t, i in curve if t >= 0.15 * curve[-1][0]]  # past the first steep drop
        if label == reference:
            continue
        gaps = gap_curve(groups[label], groups[reference])
        x = [t / 1e6 for t, _ in gaps]
        bottom.plot(x, [i.mean for _, i in gaps], color=line.get_color())
        if gaps and all(i.n >= 2 for _, i in gaps):
            bottom.fill_between(x, [i.low for _, i in gaps], [i.high for _, i in gaps],
                                color=line.get_color(), alpha=0.15, linewidth=0)
    bottom.axhline(0, color="black", linewidth=0.8)
    first = next(iter(groups[reference].values()))
    if first.decay_start < first.steps:  # shade the learning-rate decay
        start = first.tokens * first.decay_start / first.steps / 1e6
        for axis in (top, bottom):
            axis.axvspan(start, first.tokens / 1e6, color="grey", alpha=0.1, linewidth=0)
    if ceiling:
        top.set_ylim(top=max(ceiling) * 1.02)
    low, high = bottom.get_ylim()
    bottom.set_ylim(max(low, -4.0), min(high, 8.0))  # the first points' bands can be far wider than the rest
    top.set_ylabel("validation loss (mean over seeds)")
    bottom.set_ylabel(f"gap to {reference} (%), 95% CI")
    bottom.set_xlabel("tokens (M)")
    figure.legend(loc="outside right upper")
    figure.suptitle(title + (" (grey: learning-rate decay)" if first.decay_start < first.steps else ""))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def figures(results: StudyResults, images: Path) -> list[Path]:
    study, written = results.study, []
    images.mkdir(parents=True, exist_ok=True)
    for size in results.sizes():
        runs = results.summaries[size]
        if study.reference not in runs:
            continue
        drawn: set[str] = set()
        for name, members in study.figures.items():
            present = [arm for arm in members if arm in runs and arm != study.reference]
            if not set(present) - drawn:
                continue  # nothing this figure would add to an earlier one
            drawn |= set(present)
            groups = {arm: runs[arm] for arm in [study.reference, *present]}
            written.append(gap_figure(groups, study.reference, f"{study.name} study, size {size}: {name}",
                                      images / f"study_{size}_{name}.png"))
    if len(results.sizes()) > 1:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        written.append(_sizes_figure(results, images, plt))
    return written


def _sizes_figure(results: StudyResults, images: Path, plt) -> Path:
    study = results.study
    figure, axis = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for arm in study.arms:
        points = []
        for size in results.sizes():
            runs = results.summaries[size]
            if arm == study.reference or arm not in runs or study.reference not in runs:
                continue
            interval = gap_interval(runs[arm], runs[study.reference], "final")
            parameters = next(iter(runs[arm].values())).parameters
            points.append((parameters / 1e6, interval))
        if len(points) > 1:
            x = [p for p, _ in points]
            axis.errorbar(x, [i.mean for _, i in points], yerr=[[i.mean - i.low for _, i in points],
                                                                [i.high - i.mean for _, i in points]],
                          marker="o", capsize=3, label=arm)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("parameters (M)")
    axis.set_ylabel(f"final validation gap to {study.reference} (%), 95% CI")
    figure.legend(loc="outside right upper")
    path = images / "study_sizes.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# ------------------------------------------------------------------- seed groups (compare_runs)
def compare_seed_groups(groups: dict[str, list[Path]], out: Path, json_path: Optional[Path] = None,
                        echo=print) -> dict:
    """Arms given as run folders, one per seed, paired by position; the first arm is the reference.

    Prints (through ``echo``) each arm's gap to the reference on the final and the last-30%
    validation loss with 95% t intervals and the growth of the gap in the decay phase, draws the
    gap figure to ``out``, and returns (and writes to ``json_path``) the numbers.
    """
    import json

    sizes = {len(folders) for folders in groups.values()}
    if len(sizes) != 1:
        raise ValueError("every group needs the same number of runs (one per seed, in the same seed order): "
                         + ", ".join(f"{label}: {len(folders)}" for label, folders in groups.items()))
    summaries = {label: {index: summarize_run(folder) for index, folder in enumerate(folders)}
                 for label, folders in groups.items()}
    reference = next(iter(summaries))
    numbers = {"reference": reference, "seeds": sizes.pop(), "arms": {}}
    echo(f"{'arm':24s} {'gap, final val':28s} {'gap, last-30% val':28s} {'decay growth':26s}")
    for label, runs in summaries.items():
        if label == reference:
            continue
        final, late = gap_interval(runs, summaries[reference], "final"), gap_interval(runs, summaries[reference], "late")
        growth = decay_growth_interval(runs, summaries[reference])
        echo(f"{label:24s} {final.format(unit='%'):28s} {late.format(unit='%'):28s} "
             f"{growth.format(unit=' pts') if growth else '(no decay phase)':26s}")
        numbers["arms"][label] = {name: dataclasses.asdict(interval) if interval else None
                                  for name, interval in (("final", final), ("late", late), ("decay_growth", growth))}
    numbers["figure"] = str(gap_figure(summaries, reference, f"{' vs '.join(summaries)} ({numbers['seeds']} seeds)",
                                       Path(out)))
    if json_path is not None:
        Path(json_path).write_text(json.dumps(numbers, indent=1) + "\n")
    return numbers


# ---------------------------------------------------------------------------------- the doc
def sections(results: StudyResults) -> dict[str, str]:
    """Marker name -> Markdown, for every table the doc holds."""
    out = {}
    for size in results.sizes():
        out[f"{size}-arms"] = arms_table(results, size) + "\n\n" + provenance(results, size)
        out[f"{size}-differences"] = differences_table(results, size)
        out[f"{size}-phases"] = phases_table(results, size)
        out[f"{size}-seeds"] = seeds_table(results, size)
    if len(results.sizes()) > 1:
        out["sizes"] = sizes_table(results)
    return out


def write_doc(document: Path, texts: dict[str, str]) -> list[str]:
    """Replace each `<!-- study-NAME:begin -->` ... `end` block of ``document``; returns the names replaced."""
    content, replaced = Path(document).read_text(), []
    for name, text in texts.items():
        begin, end = f"<!-- study-{name}:begin -->", f"<!-- study-{name}:end -->"
        before, found, rest = content.partition(begin)
        if not found:
            continue
        _, closed, after = rest.partition(end)
        if not closed:
            raise ValueError(f"{document}: {begin} has no {end}")
        content = f"{before}{begin}\n{text}\n{end}{after}"
        replaced.append(name)
    Path(document).write_text(content)
    return replaced


def study_report(study_file: Path = STUDY_FILE, images: Optional[Path] = None) -> tuple[StudyResults, dict]:
    """Collect the results, draw the figures (when ``images`` is given) and return (results, sections)."""
    results = collect(load_study(study_file))
    if not results.sizes():
        raise ValueError(f"no completed run of {study_file} under {results.study.results}")
    if images is not None:
        figures(results, images)
    return results, sections(results)
