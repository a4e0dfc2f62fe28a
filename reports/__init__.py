"""Reports for people: the GEMM report over the cost model of trainer.planning.gemm_costs (gemm_report) and
loss-curve comparisons of runs (compare_runs). The precision study (run it, tabulate and plot it) is its own
package, study/.

Each tool is a package: its library in `__init__`, its command line and printing in `__main__`
(`python -m reports.gemm_report`, `python -m reports.compare_runs`, installed with the wheel).
"""
