"""The load tools, apart from the benchmark drivers: traffic against a server that is already up
(or that the soak starts), each bounded and loopback-only.

- `locustfile`: locust users for chat, completions, embeddings and responses
  (`locust -f ops/load/locustfile.py ...`);
- `overload`: how fast a saturated server refuses the excess (`python -m ops.load.overload`);
- `soak`: steady load for a bounded time while watching the server's memory
  (`python -m ops.load.soak`);
- `prompts`: the prompt and output-length mix the locust users and the soak draw from.

They import the standard library, trio, httpx, psutil and locust, and `prompts`; not the
harness, so they run from any checkout with the `load` extra installed.
"""
