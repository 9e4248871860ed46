"""POST /v1/completions: request.py (the body), params.py (→ Prompts + SamplingParams),
response.py (`Completion`), beam.py (beam search on top of the engine), view.py (the route)."""
