"""Does grammar-constrained decoding cost more than 15% of throughput? Constrained against
unconstrained output tok/s at concurrency 16, one server.

    python -m ops.bench.guided [--concurrency 16] [--rounds 3] [--requests-per-round 16] [--max-tokens 64]
                               [--out ops/results/NAME.json]

What it measures. One `switchyard serve` (the default model and dtype) on a free loopback
port, and five request variants:

- `unconstrained`: /v1/chat/completions, plain text, `ignore_eos: true`;
- `unconstrained_long`: the same plus a system message describing the function tool (no
  constraint), cut to exactly as many prompt tokens as `function_tool`'s (calibrated against
  usage.prompt_tokens before the run): the control for the tool variants;
- `json_schema`: the same, with `response_format: {type: json_schema}` (strict);
- `function_tool`: one function tool and `tool_choice` naming it (the call is forced: the
  tool-call wrapper and the arguments' JSON schema are enforced token by token);
- `lark_tool`: /v1/responses with one custom tool whose input is a Lark grammar (a patch
  format), forced by `tool_choice: {type: custom}` (no `ignore_eos` there: the grammar masks
  EOS out until it is complete, which it cannot be).

Every variant sends the same prompts (a 96-token passage with a per-request header, so no
request is served from another's prefix cache, then one instruction), the same `--max-tokens`,
temperature 0, non-streaming, in rounds: each round runs one block of `--requests-per-round`
requests per variant closed-loop at `--concurrency`, the variants' order rotating, after an
unmeasured warmup (compiles and caches each grammar). No constrained output of `--max-tokens`
tokens can complete its schema or grammar (`minItems`, a minimum line count), so every request
stops on its length limit as the unconstrained one does with `ignore_eos`; checked, not assumed
(`short_of_max_tokens`). tok/s is usage's completion tokens over the blocks' wall times.

How to read it. `ratio` = a variant's tok/s / `unconstrained` tok/s of the same run,
`ratio_long` the same over `unconstrained_long`. A variant's `baseline`: `unconstrained` for
`json_schema` (the very same prompt), `unconstrained_long` for the tool variants (their prompts
carry the tools' description, cached after the first request but attended by decode: a cost
not the grammar's; `lark_tool`'s is shorter, see `prompt_tokens_mean`, which flatters it).
The target, a cost of at most 15%, is `ratio_to_baseline` >= 0.85 (`meets_target`);
`round_ratio` gives min / median / max of that ratio per round: their spread is the noise.
`off_format` counts constrained outputs that do not begin as the format says. The machine's
load average at start and end is in the JSON; above ~1 before the start, do not compare runs.
Modules: `workload` (the variants' requests and how a response is read), `rounds` (blocks,
rounds and the length calibration), `report` (summaries, ratios, the table), `cli`.
"""
