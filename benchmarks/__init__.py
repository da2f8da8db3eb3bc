"""Reproducible benchmarks on the real services; run each with ``python -m benchmarks.NAME``."""
