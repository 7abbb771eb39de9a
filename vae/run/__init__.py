"""How a model is run: the `Plan` (planning.py: chunks, tiles, cache placement, activation layout, from
`Settings` and the memory model), the engine that executes it chunk by chunk (engine.py) with its
`RunContext`, causal caches, strategies (exact tiles, frame streaming, fast tiles), progress,
out-of-memory recovery and torch.compile. It imports `vae.model` and `vae.kernels`, never
`vae.distributed` (whose row bands it runs through the declared `strategies.Bands`).
"""
