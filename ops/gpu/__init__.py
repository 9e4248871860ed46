"""The GPU check: one prepared command for a bare GPU machine (ops/gpu/README.md).

check.sh runs the stages; these modules are its Python steps, each `python -m ops.gpu.<name>`:
`preflight` (the packages and the device, one line per problem), `models` (random-weight
models built on the machine, and the spec they are built from, exported here), `bandwidth`
(the card's copy bandwidth), `report` (the results JSON and the summary table). They import
only the harness (an import contract says so), and run the drivers as subprocesses.
"""
