"""``python -m bench.parse``: parser throughput per format on the shared corpus (pages/s, MB/s), the two PDF
engines side by side, OCR pages/s on scanned pages, and each group's peak memory (issue 16).

Each group runs in its own process, so its peak RSS (ru_maxrss) is its own. The corpus has no slides,
sheets or mail: those groups are generated (python-pptx, openpyxl, the email package) and say so."""
