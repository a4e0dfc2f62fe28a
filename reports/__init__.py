"""Reports for people: the GEMM report over the cost model of trainer.planning.gemm_costs (gemm_report), loss-curve
comparisons of runs (compare_runs) and the precision study (study: run it, tabulate and plot it).

Library code only: scripts/gemm_report.py, compare_runs.py, run_study.py and study_report.py
are their command lines and printing.
"""
