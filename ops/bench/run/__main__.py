"""python -m ops.bench.run: see the package's docstring."""

from ops.bench.run.cli import main

main()
