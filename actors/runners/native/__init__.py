"""The native model path: our own Llama-family decoder on the paged KV cache.

config.py decides whether a checkpoint can run here; loader.py reads its safetensors into the
fused layout; llama.py is the forward; attention.py the paged attention it calls; path.py what
the runner sees (actors/runners/model_paths.py chooses between this and transformers).
"""
