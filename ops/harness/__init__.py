"""What every measurement in the workshop shares; drivers (ops.bench) and tools (ops.load)
import it, it imports neither.

- `results`: where a run writes, how it starts and ends, JSON in and out, the machine it ran on;
- `processes`: bounded subprocesses, a server in its own process group, free ports;
- `servers`: `switchyard serve` (a subprocess, or the whole stack in-process) and the log's facts;
- `peers`: transformers serve and llama-server under the same sweep;
- `prompts`: exact-token prompts for chat models and seeded texts for embedding models;
- `prefix_mix`: the multi-tenant shared-prefix chat workload and its cache hit rate;
- `load`: the closed-loop streaming client and its per-level summary;
- `stats`: percentiles and the small arithmetic every summary repeats;
- `baselines`: the bare baselines (ops.bench.bare_forward, bare_native) in bounded
  subprocesses, and a bare batch's tok/s over the server's own workload;
- `native_step`: a runner's model path stepped in a plain loop (bare_native, step_ab, quant_quality).
"""
