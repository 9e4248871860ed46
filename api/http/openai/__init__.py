"""The OpenAI surface: /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings,
/v1/models, with the request structs, params, tools, grammars and beam search they use.
`surface.py` registers it; the other surfaces reuse its handlers without importing it."""
