"""What the benchmark scripts (scripts/benchmark.py, scripts/bench_*.py, gemm_report --measure) measure.

`benchmarks.timing` is the one CUDA-event timer they all use; the other modules hold the
set-ups of each benchmark (the layers, operands and step built as the trainer builds them),
so that a script is its command line and its printing.
"""
