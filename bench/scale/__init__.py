"""Enterprise-size benchmarks (issue #14): ``python -m bench.scale.search`` (filtered dense, hybrid and
lexical search at 1M chunks) and ``python -m bench.scale.runs`` (a claiming tick and its run as the partition key set grows)."""
