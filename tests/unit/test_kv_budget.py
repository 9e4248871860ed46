"""The KV cache's size when none is given (runtime/kv_budget.py): a share of the device's memory,
less what is held and a reserve, capped at what max_num_seqs full-length sequences use, at
least 1 GiB where free; the host's memory read as RAM or the cgroup's limit, whichever is lower;
the flag and the TOML key refused in one line outside (0, 1]; several models split the share."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.process.config_file import ConfigFile, model_configs
from api.process.flags import parse_args
from runtime.config import RuntimeConfig
from runtime.kv_budget import GIB, Memory, auto_kv_bytes, host_memory, utilization
from tests.support.cli import assert_one_line_usage_error, run_cli

PER_TOKEN = 114_688  # Qwen3-0.6B in bf16: 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes


def test_the_share_less_what_is_held_capped_at_what_sequences_can_use() -> None:
    host = Memory(total=24 * GIB, in_use=2 * GIB, available=20 * GIB)
    got = auto_kv_bytes(host, 0.5, GIB // 4, PER_TOKEN, 40_960, 128)
    assert got == 12 * GIB - 2 * GIB - GIB // 4  # the share, not all 24 GiB
    assert got // PER_TOKEN > 40_960  # Qwen3-0.6B gets its whole window (a fixed 1 GiB held 9,360 tokens)
    small = auto_kv_bytes(host, 0.5, GIB // 4, 23_040, 8_192, 4)
    assert small == 23_040 * 8_192 * 4  # no more than the sequences can use


def test_what_is_free_bounds_it_and_the_old_gib_is_the_floor() -> None:
    crowded = Memory(total=24 * GIB, in_use=2 * GIB, available=3 * GIB)
    assert auto_kv_bytes(crowded, 0.5, GIB // 4, PER_TOKEN, 40_960, 128) == 3 * GIB - GIB // 4
    heavy = Memory(total=24 * GIB, in_use=14 * GIB, available=9 * GIB)  # a 7B model's weights
    assert auto_kv_bytes(heavy, 0.5, GIB // 4, PER_TOKEN, 40_960, 128) == GIB
    starved = Memory(total=24 * GIB, in_use=23 * GIB, available=GIB // 2)
    assert auto_kv_bytes(starved, 0.5, GIB // 4, PER_TOKEN, 40_960, 128) == GIB // 4


def test_a_gpu_takes_more_than_a_host_by_default() -> None:
    assert utilization("cuda", None) == 0.9 and utilization("cpu", None) == 0.5 and utilization("cpu", 0.2) == 0.2


def test_the_host_is_ram_or_the_cgroups_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemFree:         1000 kB\nMemAvailable:   20971520 kB\n")
    statm = tmp_path / "statm"
    statm.write_text("1000 262144 0 0 0 0 0\n")  # 1 GiB resident in 4 KiB pages
    limit = tmp_path / "memory.max"
    limit.write_text("max\n")
    whole = host_memory(str(meminfo), (str(limit),), str(statm))
    assert whole.total == 24 * GIB and whole.available == 20 * GIB
    limit.write_text(str(8 * GIB))
    boxed = host_memory(str(meminfo), (str(limit),), str(statm))
    assert boxed.total == 8 * GIB and boxed.available == 8 * GIB - boxed.in_use
    assert host_memory(str(meminfo), (str(tmp_path / "none"),), str(statm)).total == 24 * GIB


def test_several_models_in_a_process_split_the_share() -> None:
    base = RuntimeConfig()
    chat, embed = model_configs(base, None, with_embeddings=True)
    assert chat.memory_parts == 1 and embed.task == "embeddings"
    file = ConfigFile(path="x.toml", models=[{"model": "a"}, {"model": "b"}, {"model": "c", "kv_cache_gib": 2.0}])
    parts = [c.memory_parts for c in model_configs(base, file, with_embeddings=False)]
    assert parts == [2, 2, 1]


def test_the_flags_reach_the_config_and_bad_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["serve"]).config.kv_cache_gib is None and parse_args(["serve"]).config.memory_utilization is None
    assert parse_args(["serve", "--memory-utilization", "0.3"]).config.memory_utilization == 0.3
    for flag, value in (("--memory-utilization", "1.5"), ("--memory-utilization", "0"), ("--kv-cache-gib", "-1"), ("--kv-cache-gib", "nan")):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["serve", flag, value])
        assert exit_.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err
    config = tmp_path / "switchyard.toml"
    config.write_text('[[models]]\nmodel = "x"\nmemory_utilization = 2\n')
    proc = run_cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, str(config), "models[0].memory_utilization must be a number above 0 and at most 1")
