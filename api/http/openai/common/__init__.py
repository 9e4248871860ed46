"""What the OpenAI endpoints share: `Generation` (generation.py), the request fields and
sampling rules Chat and Completions share (fields.py, sampling.py), logprobs and usage in
their OpenAI shapes (logprobs.py, usage.py), structured-output guides and their validation
(grammars.py), and the OpenAI error shape (errors.py). Imports no endpoint."""
