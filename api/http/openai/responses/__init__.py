"""POST /v1/responses: request.py (the body), params.py (→ Prompt + SamplingParams + the
validated tools + the settings the Response repeats), input.py (input items → chat messages),
response.py (`ResponseObject` and its output items), events.py (the typed stream events and
the builder that makes them), view.py (the route)."""
