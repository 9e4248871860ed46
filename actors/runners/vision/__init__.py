"""Vision-language models on the paged engine: the families served (families.py), the encoder
cache (encoder_cache.py) and the model path that feeds image features into the text tower's
prefill (path.py)."""
