"""Does grammar-constrained decoding cost more than 15% of throughput? Constrained against
unconstrained output tok/s at concurrency 16, one server.

    python -m ops.bench.guided [--concurrency 16] [--rounds 3] [--requests-per-round 16] [--max-tokens 64]
                               [--out ops/results/NAME.json]

What it measures. One `switchyard serve` (default model, the embedded SmolLM2-135M-Instruct;
the server picks its dtype) on a free loopback port, and five request variants:

- `unconstrained`: /v1/chat/completions, plain text, `ignore_eos: true`;
- `unconstrained_long`: the same plus a system message (a text describing the function tool,
  with no constraint) cut so that the prompt has exactly as many tokens as `function_tool`'s
  (calibrated against the server's usage.prompt_tokens before the run): the control for the
  tool variants, whose prompts carry the tools' description;
- `json_schema`: the same, with `response_format: {type: json_schema}` (strict);
- `function_tool`: the same, with one function tool and `tool_choice` naming it (the call is
  forced: the tool-call wrapper and the arguments' JSON schema are enforced token by token);
- `lark_tool`: /v1/responses with one custom tool whose input is a Lark grammar (a patch
  format), forced by `tool_choice: {type: custom}`. The Responses API has no `ignore_eos`;
  the grammar masks EOS out until it is complete, which it cannot be (below).

Every variant sends the same prompts (a 96-token passage, `--prompt-tokens`, with a per-request
header `Request 00042.` so no request's user message is served from another's prefix cache,
then the same one-line instruction), the same `--max-tokens` (64), temperature 0,
non-streaming. Variants run in rounds: in each round every variant runs one block of
`--requests-per-round` requests closed-loop at `--concurrency` (c workers, each keeping one
request in flight), the variants' order rotating from round to round, so machine noise (and
any drift) falls on all variants alike. Unmeasured warmup first: one request per variant
(compiles and caches each grammar) plus a few plain ones.

Why the constrained runs cannot end early. A grammar ends when it is complete, and a shorter
answer would make a variant's tok/s incomparable (fewer tokens per prefill, shorter lock-step
batches). So the schemas and the grammar are chosen so that no output of `--max-tokens`
tokens can complete them: the JSON has an array of at least `--max-tokens` person objects
(`minItems`), and the Lark grammar wants at least `--max-tokens` lines of at least three
characters each. Every request therefore stops on its length limit with exactly `--max-tokens`
completion tokens, as the unconstrained one does with `ignore_eos`; that is checked, not
assumed (`short_of_max_tokens` counts any that stopped earlier). Even so, tok/s is generated
tokens / time: completion tokens (from each response's usage) summed over the variant's
blocks / the sum of those blocks' wall times (first send to last response), so a short
response could not inflate it.

How to read it. `ratio` = a variant's tok/s / `unconstrained` tok/s of the same run,
`ratio_long` the same over `unconstrained_long`. Each constrained variant has a baseline
(`baseline`): `json_schema` sends the very prompt of `unconstrained`; the tool variants'
prompts are longer (the tools are described in the system prompt, see `prompt_tokens`; that
part is the same for every request and comes from the prefix cache after the first, see
`cached_tokens`, but decode attends over it, a cost that is not the grammar's), so they are held
against `unconstrained_long` (matched to `function_tool`; `lark_tool`'s prompt is shorter,
see `prompt_tokens_mean`, which flatters it slightly). The issue's target, a cost of at most
15%, is `ratio_to_baseline` >= 0.85 (`meets_target`); `round_ratio` gives min / median / max of that
ratio per round: their spread is the noise.
`off_format` counts constrained outputs that do not begin as the format says (a sign the
guide was not applied). The machine's load average at start and end is in the JSON; with a
1-minute load above ~1 before the start, do not compare runs.

Modules: `workload` (the variants' requests and how a response is read), `rounds` (blocks,
rounds and the length calibration), `report` (summaries, ratios, the table), `cli`.
"""
