"""Enterprise-size benchmarks (issue 14). ``python -m bench.scale.search``: filtered dense search at 1M chunks."""
