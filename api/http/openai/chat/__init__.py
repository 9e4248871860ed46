"""POST /v1/chat/completions: request.py (the body), params.py (→ Prompt + SamplingParams +
the validated tools), response.py (`ChatCompletion`, `ChatCompletionChunk`), tool_calls.py
(calls in Chat's shapes, whole and streamed), view.py (the route)."""
