"""The command line refuses bad input at once: one line naming the flag, exit status 2.

`switchyard serve --model /nonexistent` and `--port P` with P taken used to load every model
first and end in a traceback (FileNotFoundError; an exception group ending in OSError
Errno 98). Each test runs the real CLI in a subprocess on this worktree's code, and checks
that the process never imported torch or transformers: no model was loaded.
"""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.cli import assert_one_line_usage_error, run_cli


def test_missing_model_directory_fails_at_once(tmp_path: Path) -> None:
    proc = run_cli("serve", "--model", "/nonexistent", "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--model", "/nonexistent")


def test_directory_without_a_model_fails_at_once(tmp_path: Path) -> None:
    proc = run_cli("serve", "--model", str(tmp_path), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--model", "config.json")


def test_port_in_use_fails_before_loading_models(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("serve", "--host", "127.0.0.1", "--port", str(port), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--port", str(port), "in use")


def test_model_in_config_file_is_checked_by_name(tmp_path: Path) -> None:
    config = tmp_path / "switchyard.toml"
    config.write_text('[[models]]\nname = "a"\nmodel = "/nonexistent/model"\n')
    proc = run_cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, str(config), "models[0].model", "/nonexistent/model")


def test_bad_config_file_keeps_failing_the_same_way(tmp_path: Path) -> None:
    config = tmp_path / "switchyard.toml"
    config.write_text("[server]\nport = 1\n")
    proc = run_cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, str(config), "unknown top-level entries")


def test_an_architecture_that_cannot_be_served_fails_at_once(tmp_path: Path) -> None:
    """A vision-language family not served (LLaVA-NeXT here) used to crash the start with a long
    traceback ending in transformers' `Unrecognized configuration class`."""
    import json

    model = tmp_path / "llava-next"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"]}))
    proc = run_cli("serve", "--model", str(model), "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--model", "LlavaNextForConditionalGeneration", "cannot be served")


def test_the_served_vision_families_pass_the_start_up_check(tmp_path: Path) -> None:
    """The check reads config.json alone; every family the engine serves passes it (Qwen2.5-VL
    was refused here before it was served), the one refused above does not."""
    import json

    from runtime.model_store import architecture_error

    served = {"llava": "Llava", "qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "idefics3": "Idefics3", "llava_next": None}
    for model_type, prefix in served.items():
        model = tmp_path / model_type
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [f"{prefix or 'LlavaNext'}ForConditionalGeneration"]}))
        assert (architecture_error(str(model)) is None) == (prefix is not None), model_type


def test_a_file_that_is_no_gguf_fails_at_once(tmp_path: Path) -> None:
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"GGUF" + bytes(10))
    proc = run_cli("serve", "--model", str(junk), "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--model", "model.gguf", "not a GGUF v2+ file")


def test_front_ends_are_counted_from_one_and_are_serves_alone(tmp_path: Path) -> None:
    proc = run_cli("serve", "--api-servers", "0", "--no-embeddings", tmp_path=tmp_path)
    assert proc.returncode == 2 and "argument --api-servers: must be at least 1" in proc.stderr.splitlines()[-1], proc.stderr  # argparse's usage, then the line
    proc = run_cli("serve-ray", "--api-servers", "2", "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--api-servers", "serve-ray")


def test_front_ends_by_default_follow_the_cores_only_with_the_engine_process() -> None:
    from api.process.flags import parse_args
    from runtime.config import front_ends_for

    assert [front_ends_for(False, cores) for cores in (2, 16, 64)] == [1, 1, 1]  # one process: one front end
    assert [front_ends_for(True, cores) for cores in (2, 8, 16, 24, 64)] == [1, 1, 2, 3, 4]
    assert parse_args(["serve", "--api-servers", "3"]).config.api_servers == 3
    assert parse_args(["serve"]).config.api_servers == 1
    assert parse_args(["serve", "--engine-process", "--enable-lora", "--lora-dir", "/tmp"]).config.api_servers == 1  # run-time adapters: one front end
