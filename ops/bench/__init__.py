"""The benchmark drivers: one per question, each run as `python -m ops.bench.<driver>`, each
importing only ops.harness (and its own submodules), never another driver.

- `run`: how does Switchyard compare with the bare baselines and its peers, across concurrency?
- `overhead`: what does the server itself cost at one concurrency (bare step and server alternated)?
- `load`: how does a server already running hold up under the sweep?
- `peers`: how fast is transformers serve alone under the same sweep?
- `bare_forward`: how fast is the eager transformers forward with no server?
- `bare_native`: how fast is Switchyard's own model path with no server?
- `step_ab`: which of two model-path variants is faster (interleaved, on a shared machine)?
- `quant_quality`: what does --quantization cost in quality?
- `guided`: does grammar-constrained decoding cost more than 15% of throughput?
- `embeddings`, `bare_embeddings`: how many inputs/s does /v1/embeddings serve, against the bare model?
- `shared_prefill`: do n and best_of share one prefill?
- `ray_serve`: what does Ray Serve add to one replica, and does prefix routing pay?
- `ray_cpu_split`: where does the CPU go when one replica serves behind Ray?

ops/bench/README.md is the guide; results go to ops/results/ (indexed in its README.md).
"""
