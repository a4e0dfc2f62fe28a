"""The precision study's table and plots, from the committed results alone (no GPU).

    python scripts/study_report.py                 # print the table, redraw docs/images/study_*.png
    python scripts/study_report.py --write-doc     # also replace the table in docs/study.md

Reads results/study/runs.yaml and every results/study/<run>/ that holds a completed run
(metrics.jsonl, config.yaml, run.json). Per run:
- final train loss: the mean of the logged training loss over the last 5% of steps (each log
  line is the mean of its log interval, so this is the mean over those steps);
- final validation loss: the last val_loss (the same fixed validation batches for every run);
- gap: (run - reference) / reference of the final validation loss, in %;
- beyond noise: whether |gap| exceeds the noise run's |gap| (the reference with another seed).
The plots are scripts/compare_runs.py figures with the noise band: the main comparison
(BF16, FP8, NVFP4, the late switch) and the NVFP4 ablations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPOSITORY = Path(__file__).resolve().parent.parent
for folder in (REPOSITORY, REPOSITORY / "scripts"):  # the packages from a checkout; compare_runs beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import compare_runs  # noqa: E402

RESULTS = REPOSITORY / "results" / "study"
DOC = REPOSITORY / "docs" / "study.md"
TABLE_BEGIN, TABLE_END = "<!-- study-table:begin -->", "<!-- study-table:end -->"
MAIN_RUNS = ("fp8", "nvfp4", "nvfp4_late_bf16")
ABLATION_RUNS = ("nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_no_2d", "nvfp4_all_layers", "mxfp4")


def completed_runs(study: dict) -> dict[str, Path]:
    found = {}
    for name in study["runs"]:
        directory = RESULTS / name
        run_file = directory / "run.json"
        if run_file.is_file() and json.loads(run_file.read_text()).get("status") == "completed":
            found[name] = directory
    return found


def summarize(directory: Path) -> dict:
    from models.config import ModelConfig
    from models.flops import count_parameters

    records = compare_runs.keep_last_per_step(compare_runs.read_jsonl(directory / "metrics.jsonl"))
    config = yaml.safe_load((directory / "config.yaml").read_text())
    steps = config["train"]["steps"]
    tail = [r["loss"] for r in records if r["step"] > 0.95 * steps and compare_runs._finite(r.get("loss"))]
    validation = [r for r in records if compare_runs._finite(r.get("val_loss"))]
    run = json.loads((directory / "run.json").read_text())
    return {
        "parameters": count_parameters(ModelConfig(**config["model"])),
        "tokens": records[-1]["tokens"],
        "steps": records[-1]["step"],
        "wall_minutes": run["wall_s"] / 60,
        # training time: each log line's step time x the steps it covers (start-up and compilation left out)
        "train_minutes": sum(r["step_time_s"] * (r["step"] - previous["step"]) for previous, r in zip(
            [{"step": 0}] + records[:-1], records) if compare_runs._finite(r.get("step_time_s"))) / 60,
        "final_train_loss": sum(tail) / len(tail),
        "final_val_loss": validation[-1]["val_loss"],
        "command": run["command"],
        "about": run.get("about", ""),
    }


def table(study: dict, summaries: dict[str, dict]) -> str:
    reference = summaries[study["reference"]]
    noise = summaries.get(study["noise_floor"])
    noise_gap = abs(noise["final_val_loss"] / reference["final_val_loss"] - 1) if noise else None
    corpus_tokens = study.get("corpus", {}).get("train_tokens")
    lines = [
        "| run | parameters | tokens | epochs | train min (GPU shared) | final train loss | final val loss | gap to BF16 | beyond seed noise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, summary in summaries.items():
        gap = summary["final_val_loss"] / reference["final_val_loss"] - 1
        if name == study["reference"]:
            verdict = "(reference)"
        elif name == study["noise_floor"]:
            verdict = "(the noise floor)"
        else:
            verdict = "n/a" if noise_gap is None else ("yes" if abs(gap) > noise_gap else "no")
        epochs = f"{summary['tokens'] / corpus_tokens:.2f}" if corpus_tokens else "?"
        lines.append(
            f"| {name} | {summary['parameters'] / 1e6:.2f}M | {summary['tokens'] / 1e6:.2f}M | {epochs} | "
            f"{summary['train_minutes']:.1f} | {summary['final_train_loss']:.4f} | {summary['final_val_loss']:.4f} | "
            f"{100 * gap:+.2f}% | {verdict} |"
        )
    missing = [name for name in study["runs"] if name not in summaries]
    if missing:
        lines.append("")
        lines.append(f"Not run yet: {', '.join(missing)}.")
    return "\n".join(lines)


def plots(study: dict, found: dict[str, Path], images: Path) -> list[Path]:
    reference, noise = study["reference"], study["noise_floor"]
    written = []
    for name, members, title in (
        ("study_main.png", MAIN_RUNS, "BF16 vs FP8 vs NVFP4 (emulated), 9.2M-parameter hybrid"),
        ("study_ablations.png", ABLATION_RUNS, "NVFP4 recipe ablations vs BF16"),
    ):
        present = [run for run in members if run in found]
        if reference not in found or not [run for run in present if run != "nvfp4"]:
            continue  # the ablation figure waits for an ablation (nvfp4 alone is in the main figure)
        arguments = [str(found[reference]), *(str(found[run]) for run in present), "--val", "--smooth", "ema:0.8",
                     "--out", str(images / name), "--title", title]
        if noise in found:
            arguments += ["--noise", str(found[noise])]
        compare_runs.main(arguments)
        written.append(images / name)
    return written


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-doc", action="store_true", help=f"replace the table in {DOC.relative_to(REPOSITORY)}")
    parser.add_argument("--images", type=Path, default=REPOSITORY / "docs" / "images", help="where the PNGs go")
    arguments = parser.parse_args(argv)
    study = yaml.safe_load((RESULTS / "runs.yaml").read_text())
    found = completed_runs(study)
    if study["reference"] not in found:
        raise SystemExit(f"the reference run {study['reference']!r} has no completed results in {RESULTS}")
    summaries = {name: summarize(directory) for name, directory in found.items()}
    text = table(study, summaries)
    plots(study, found, arguments.images)
    print("\n" + text)
    if arguments.write_doc:
        document = DOC.read_text()
        before, begin, rest = document.partition(TABLE_BEGIN)
        _, end, after = rest.partition(TABLE_END)
        if not begin or not end:
            raise SystemExit(f"{DOC} has no {TABLE_BEGIN} ... {TABLE_END} markers")
        DOC.write_text(f"{before}{TABLE_BEGIN}\n{text}\n{TABLE_END}{after}")
        print(f"wrote the table into {DOC}")
    return text


if __name__ == "__main__":
    main()
