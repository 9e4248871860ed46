"""How does Switchyard compare with the bare forward, the bare native step and its peers,
across concurrency? The load sweep, the project's main benchmark.

    python -m ops.bench.run [--levels 1,4,16,32,64] [--peers] [--llama-server PATH] [--out ops/results/NAME.json]

1. bare forward (ops.bench.bare_forward, in a subprocess): decode tok/s per batch, bf16 and
   fp32, and the batch-1 TTFT baseline (prefill 128 + one decode step); with --bare-native,
   the bare native step (ops.bench.bare_native) for the variants named.
2. `switchyard serve` on a free loopback port (its log beside the results), wait for
   GET /health = 200, run the sweep (ops.harness.load), stop it (SIGTERM, SIGKILL after a
   timeout); then one more server per --switchyard-variants entry.
3. with --peers: transformers serve --continuous-batching under the same sweep, and with
   --llama-server llama.cpp's server (ops.harness.peers).

Writes one JSON (config, machine, load, every section, ratios) and prints a markdown table.
Every step is bounded: subprocess timeouts, health-check timeouts, per-level time caps and
per-request timeouts.

Modules: `cli` (the flags and the run's order), `sections` (one section per server or
baseline), `ratios` (each server over the baselines), `report` (the markdown table).
"""
