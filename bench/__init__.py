"""Benchmarks, each run as python -m bench.<name>; see docs/benchmarks.md."""
