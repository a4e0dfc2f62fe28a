"""Reports for people: the GEMM report over the cost model of trainer.planning.gemm_costs (gemm_report) and
loss-curve comparisons of runs (compare_runs). The precision study (run it, tabulate and plot it) is its own
package, study/.

Library code only: scripts/gemm_report.py and compare_runs.py are their command lines and printing.
"""
