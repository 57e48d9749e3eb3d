"""Benchmarks that drive the real pipeline (``palace bench ...``)."""
