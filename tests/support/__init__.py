"""What the tests share: the one place a test module or a conftest imports helpers from.

A test module imports from here and from the code under test, never from another test module
or a conftest (tests/checks/test_test_imports.py holds it so); fixtures stay in conftest.py
files, built from these helpers.

- `tiny_model`: a tiny random-weight Llama-family decoder and its byte-level BPE tokenizer,
  written to disk in-process (`build_tiny_llama`, `build_tiny_decoder`, `build_tokenizer`);
- `device`: `suite_device()`, the engine tier's device (`SWITCHYARD_TEST_DEVICE`: the CPU unless
  it names a CUDA device; ops/gpu/check.sh sets it on a GPU machine);
- `tiny_bert`: a tiny sentence-transformers encoder on the same tokenizer corpus;
- `tiny_tokenizer`: a pure-Python byte tokenizer for the detokenizer's core;
- `fakes`: `FakeRunner` (scripted tokens, latency, failures) and `fake_runtime`, an engine on it;
- `servers`: `Server`, `tiny_config`, `start_server` (the whole stack on 127.0.0.1:0),
  `start_runtime_server` (any engine behind the real app), `platform_server` (keys, limits),
  the default model's `default_config`, `free_port`, and `host_request` for a replica's host;
- `waiting`: `in_thread`, `wait_until`, `wait_idle` and `leaks` (nothing left in flight),
  `settled_statistics`;
- `http`: request shortcuts (`complete`, `chat`), SSE parsing, `serves_normally`, /metrics samples;
- `reference`: the served checkpoint in transformers, the oracle of the generation tests;
- `equivalence`: greedy runs of the engine against transformers' `generate`, and the shapes
  of the tiny decoders the native model path is checked on;
- `sched_driver`: a `Driver` playing the executor for a `SchedulerCore` driven by hand;
- `scripted`: a scripted `Generation` for the HTTP routes, without a model;
- `openai_cases`: the openai SDK's cases, run on one node and on both Ray topologies;
- `cluster`, `cluster_cases`, `stuck_step`: the Ray tier's deployer, its shared cases and
  failure helpers, and the stuck-step hook its replicas load (these import ray);
- `checks`, `budgets`: running ruff, mypy and import-linter, and the size budgets.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
