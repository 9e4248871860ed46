"""The OpenAI surface, by endpoint: chat/ (/v1/chat/completions), completions/
(/v1/completions, beam search included), responses/ (/v1/responses), embeddings.py
(/v1/embeddings), models.py (/v1/models), lora.py (/v1/load_lora_adapter, /v1/unload_lora_adapter).

Each endpoint holds its request structs (request.py), the one place a request becomes the
engine's Prompt + SamplingParams (params.py), its typed response structs (response.py) and its
view (view.py). What the endpoints share is in common/ (Generation, logprobs, usage, grammars,
the shared request fields and sampling rules, the error shape) and tools/ (declared tools, the
tool-call format, its grammar and parser). `surface.py` registers it all; the other surfaces
reuse its handlers without importing it.
"""
