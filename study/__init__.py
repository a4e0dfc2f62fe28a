"""The precision study (docs/study.md): a study is arms x seeds x sizes in one YAML file, run on one GPU
and reported with confidence intervals over seeds.

    definition  the study file -> its runs (StudyRun: size, arm, seed, the trainer's arguments)
    runner      runs packed side by side on one GPU, resumable, provenance in run.json
    plan        what the runs will cost on one GPU before any run: step time, memory, wall time per run
    stats       per-run summaries, gaps paired by seed, t intervals, seeds needed for an interval width
    report      tables, figures, the doc's marked blocks (and `python -m reports.compare_runs`' seed groups)

It may import trainer, models, data, benchmarks and reports; nothing imports it but its command lines:
scripts/run_study.py, scripts/study_report.py and reports/compare_runs/__main__.py.
"""
