"""The workshop: everything that measures or loads a running Switchyard, none of it shipped.

- `ops.harness`: what every measurement shares (results and the machine, processes, servers
  and peers, prompts and texts, the closed-loop load client, the bare baselines).
- `ops.bench`: one driver per question (`python -m ops.bench.<driver>`), each importing only
  the harness; ops/bench/README.md says what each one answers.
- `ops.load`: the load, overload and soak tools (locust, `python -m ops.load.overload`,
  `python -m ops.load.soak`).
- ops/results/: the results kept, each named by what it measured, indexed in its README.md.

pyproject.toml's import contracts keep drivers and tools over the harness and apart from
each other, and the shipped packages (runtime, actors, api) never import any of it.
"""
