"""Benchmarks of vtrm_gate, runnable as modules (``python -m benchmarks.bench_makespan``)."""
