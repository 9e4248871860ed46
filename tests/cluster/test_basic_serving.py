"""serve-ray serving: two replicas serve, SSE crosses the hop token by token, a disconnect
frees the replica's blocks, and the official openai client passes its single-node tests.

Every request here goes through Ray's HTTP proxy, the ingress and a replica. A replica is
reached on purpose with `x-session-id` (the router keeps a session on one replica).

The cases (test functions) live in tests/support: the cluster's own, which the direct topology
passes too (test_serving_direct.py), on this module's `cluster`; and the ones the openai SDK
passes against one node (tests/server/http/test_openai_client.py), here against the cluster
through the `client` fixture (tests/cluster/conftest.py).
"""

from __future__ import annotations

from tests.support.cluster_cases import (  # noqa: F401
    test_disconnect_frees_the_replicas_blocks,
    test_sse_arrives_incrementally_and_ends_with_done,
    test_two_replicas_both_serve,
)
from tests.support.openai_cases import (  # noqa: F401
    test_bad_input_gets_400_naming_the_field,
    test_chat_non_streaming,
    test_chat_streaming_matches_non_streaming,
    test_completions_streaming_and_not,
    test_models_and_unknown_model,
    test_stop_string_never_leaks,
)
