"""``python -m pipelines.cli``: the ``kbindex`` command from a checkout, without the installed console script."""

from pipelines.cli import main

main()
