"""The shared HTTP layer under every API surface: the route table, body decoding, the
error-shape registry, load shedding, API keys and rate limits, request ids and metrics, SSE,
OpenAPI and the server's own routes. It never imports a surface (tests/checks)."""
