"""The official `openai` SDK against the real app on a real socket (tiny model), through the
`client` fixture (tests/server/conftest.py).

The cases live in tests/support/openai_cases.py: the Ray tier runs them too, on both of its
topologies.
"""

from __future__ import annotations

from tests.support.openai_cases import (  # noqa: F401
    test_bad_input_gets_400_naming_the_field,
    test_chat_non_streaming,
    test_chat_streaming_matches_non_streaming,
    test_completions_streaming_and_not,
    test_models_and_unknown_model,
    test_stop_string_never_leaks,
)
