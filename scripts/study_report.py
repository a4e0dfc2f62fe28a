"""A study's tables (95% confidence intervals over seeds) and figures, from the committed results alone.

    python scripts/study_report.py                                  # print the tables, redraw the figures
    python scripts/study_report.py --write-doc                      # also replace the tables in docs/study.md
    python scripts/study_report.py --study my_study.yaml --doc my_study.md --images my_images

Reads the study file and every completed run under its folder (<size>/<arm>/seed<k>/). What each
column is: study/report.py and study/stats.py. The doc's tables live between
`<!-- study-NAME:begin -->` / `<!-- study-NAME:end -->` markers (NAME: `<size>-arms`,
`<size>-differences`, `sizes`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from study.report import ROOT, STUDY_FILE, study_report, write_doc


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, default=STUDY_FILE, help="the study's YAML file")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "study.md", help="the Markdown file --write-doc edits")
    parser.add_argument("--write-doc", action="store_true", help="replace the marked tables in --doc")
    parser.add_argument("--images", type=Path, default=ROOT / "docs" / "images", help="where the PNGs go")
    arguments = parser.parse_args(argv)
    try:
        _, texts = study_report(arguments.study, arguments.images)
        for name, text in texts.items():
            print(f"\n## {name}\n\n{text}")
        if arguments.write_doc:
            replaced = write_doc(arguments.doc, texts)
            print(f"\nreplaced in {arguments.doc}: {', '.join(replaced) or 'nothing (no markers)'}")
    except ValueError as error:  # no completed results, a malformed study file, an unclosed marker
        raise SystemExit(str(error)) from None
    return texts


if __name__ == "__main__":
    main()
