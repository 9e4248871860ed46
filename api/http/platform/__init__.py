"""Settings shared by the HTTP layer and the surfaces: API keys, rate limits, the state
directory (`config.py`)."""
