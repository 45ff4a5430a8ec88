"""Benchmarks (not installed; run from the checkout with python -m bench.<name>)."""
