"""The flag table: `switchyard serve`'s flags as docs/flags.md shows them, from the parser itself.

Owns: rendering every serve flag (its TOML key in a `[[models]]` table, where it has one, its
default, its help text) as markdown, and `stated_defaults`, which finds a help text that names a
default the flag does not have. The help texts are the one source: `--help`, docs/flags.md and
the README read the same words (tests/checks/test_flag_docs.py keeps the file in step).

    python -m api.process.flag_table > docs/flags.md
"""

from __future__ import annotations

import argparse
import re

from api.process import flags
from api.process.config_file import MODEL_KEYS

_STATED = re.compile(r"\bdefault:? ([^\s;,)]+)")


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard serve")
    flags._add_serve_arguments(parser)
    return parser


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    return text % {"default": action.default, "prog": "switchyard serve"} if "%(" in text else text


def _shown(value: object) -> str:
    """A default as a help text says it: on/off for switches, none for nothing, else the value."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None:
        return "none"
    return str(value)


def stated_defaults(parser: argparse.ArgumentParser) -> list[str]:
    """Flags whose help states a literal default (a number, on/off, none, one of its choices)
    that differs from the flag's own default. Prose after 'default' is not checked, nor a flag
    whose default is None: its help says what None resolves to, per model or machine."""
    wrong = []
    for action in _actions(parser):
        if action.default is None:
            continue
        for stated in _STATED.findall(_help(action)):
            number = re.fullmatch(r"-?\d+(\.\d+)?", stated)
            literal = stated in ("on", "off", "none", "auto") or stated in (action.choices or ()) or number
            if not literal or isinstance(action, argparse._StoreTrueAction):
                continue
            actual = _shown(action.default)
            if number and re.fullmatch(r"-?\d+(\.\d+)?", actual):
                if float(stated) != float(actual):
                    wrong.append(f"{action.option_strings[0]}: help says default {stated}, the flag's is {actual}")
            elif stated != actual:
                wrong.append(f"{action.option_strings[0]}: help says default {stated}, the flag's is {actual}")
    return wrong


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    parser = parser or serve_parser()
    lines = [
        "# `switchyard serve` flags",
        "",
        "Generated from the command's own parser (`python -m api.process.flag_table > docs/flags.md`):",
        "these are `switchyard serve --help`'s words. A flag with a TOML key is also a key of a",
        "`[[models]]` table in the config file ([operations.md](operations.md#the-config-file)), where",
        "it applies to that model alone. `serve-ray` takes the same flags and its own cluster flags",
        "([scaling-out.md](scaling-out.md)).",
        "",
        "| flag | TOML key | default | what it does |",
        "|---|---|---|---|",
    ]
    for action in _actions(parser):
        names = ", ".join(f"`{name}`" for name in action.option_strings)
        key = f"`{action.dest}`" if action.dest in MODEL_KEYS else ""
        default = "" if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction) else f"`{_shown(action.default)}`"
        lines.append(f"| {names} | {key} | {default} | {_help(action).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
