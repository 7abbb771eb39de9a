"""Names of the pack-private ComfyUI types (sockets only StreamVAE nodes accept)."""
STREAMVAE = "STREAMVAE"  # nodes.model.StreamVAEHandle
COMPILE = "STREAMVAE_COMPILE"  # vae.kernels.CompileSettings
GPU_OPTIONS = "STREAMVAE_GPU_OPTIONS"  # nodes.model.GpuOptions
DEVICES = "STREAMVAE_DEVICES"  # nodes.multi_device.DeviceSet
