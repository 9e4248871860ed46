"""python -m ops.bench.guided: see the package's docstring."""

from ops.bench.guided.cli import main

main()
