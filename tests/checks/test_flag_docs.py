"""One source for what a flag does: docs/flags.md is `switchyard serve --help`'s words, rendered
from the parser (api/process/flag_table.py), and no help text names a default its flag lacks."""

from __future__ import annotations

import argparse

from api.process.flag_table import markdown, serve_parser, stated_defaults
from tests.support import ROOT


def test_the_flag_table_in_the_docs_is_the_parsers() -> None:
    assert (ROOT / "docs" / "flags.md").read_text() == markdown(), "regenerate: python -m api.process.flag_table > docs/flags.md"


def test_every_default_a_help_text_states_is_the_flags_own() -> None:
    assert stated_defaults(serve_parser()) == []


def test_the_check_finds_a_help_text_stating_another_default() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (default 32)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="compile (default off)")
    parser.add_argument("--mode", default="fast", choices=["fast", "slow"], help="how (default slow)")
    parser.add_argument("--model", default="x", help="which (default: the embedded model)")  # prose: not checked
    parser.add_argument("--port", type=int, default=8000, help="port (default %(default)s)")
    assert stated_defaults(parser) == [
        "--block-size: help says default 32, the flag's is 16",
        "--compile: help says default off, the flag's is on",
        "--mode: help says default slow, the flag's is fast",
    ]
