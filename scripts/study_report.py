"""The precision study's table and plots, from the committed results alone (no GPU).

    python scripts/study_report.py                 # print the table, redraw docs/images/study_*.png
    python scripts/study_report.py --write-doc     # also replace the table in docs/study.md

Reads results/study/runs.yaml and every results/study/<run>/ that holds a completed run
(metrics.jsonl, config.yaml, run.json). What each column is: reports/study.py. The plots are
compare_runs figures with the noise band: the main comparison (BF16, FP8, NVFP4, the late
switch) and the NVFP4 ablations.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reports.study import ROOT, study_report, write_table

REPOSITORY = ROOT
DOC = REPOSITORY / "docs" / "study.md"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-doc", action="store_true", help=f"replace the table in {DOC.relative_to(REPOSITORY)}")
    parser.add_argument("--images", type=Path, default=REPOSITORY / "docs" / "images", help="where the PNGs go")
    arguments = parser.parse_args(argv)
    try:
        text = study_report(arguments.images)
        print("\n" + text)
        if arguments.write_doc:
            write_table(DOC, text)
            print(f"wrote the table into {DOC}")
    except ValueError as error:  # no reference results, or a doc without the table markers
        raise SystemExit(str(error)) from None
    return text


if __name__ == "__main__":
    main()
