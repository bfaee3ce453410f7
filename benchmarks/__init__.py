"""Benchmarks: each reports ratios against a baseline measured in the same run.

Run from the repository root, e.g. `python -m benchmarks.bench_verify`. Results are printed and
written as JSON under benchmarks/results/ (not tracked).
"""
