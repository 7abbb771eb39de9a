"""`VideoVAE`: the public model object every family implements.

A family subclass says what the network is (`encode_chunk` / `decode_chunk` on one temporal chunk,
the latent space constants, which checkpoint keys identify it). It knows nothing of chunks, tiles or
memory: how a whole clip is run through it (padding, temporal chunks, tiles, caches, output buffers)
is the engine's job (`engine.py`, `vae.encode(model, video)` / `vae.decode(model, z)`).

Latents are raw, i.e. unscaled; ComfyUI's LATENTs are `to_comfy_latent(z)` (for SeedVR2 `to_model_space(z)`).
"""
import torch
import torch.nn as nn


class VideoVAE(nn.Module):
    family: str = ""
    spatial_factor: int = 8
    temporal_factor: int = 4
    latent_channels: int = 16
    in_channels: int = 3

    # --- what a family defines -------------------------------------------------------------
    probe_keys: tuple[str, ...] = ()  # keys whose presence identifies the family's checkpoints

    @classmethod
    def native_state_dict(cls, state_dict: dict) -> dict | None:
        """`state_dict` in this family's own key names, or None when it is not this family's layout."""
        return state_dict if all(k in state_dict for k in cls.probe_keys) else None

    @classmethod
    def config_from_state_dict(cls, state_dict: dict, overrides: dict):
        """The family config the tensor shapes describe, with `overrides` applied."""
        raise NotImplementedError

    def encode_chunk(self, video: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """One temporal chunk of pixels (B,3,t,H,W) -> (mean, logvar) of its latent frames."""
        raise NotImplementedError

    def decode_chunk(self, z: torch.Tensor, ctx) -> torch.Tensor:
        """One temporal chunk of raw latents (B,C,t,h,w) -> its pixel frames (B,3,t',H,W)."""
        raise NotImplementedError

    def encode_modules(self) -> list[nn.Module]:
        return [self.encoder]

    def decode_modules(self) -> list[nn.Module]:
        return [self.decoder]

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent -> the latent the diffusion model sees."""
        raise NotImplementedError

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """Inverse of `to_model_space`."""
        raise NotImplementedError

    # ComfyUI's LATENT of this family (what core's VAE nodes make and take, and its .latent files hold):
    # the raw latent (Wan: its latent format normalises inside the diffusion model), or, where this is
    # True, `to_model_space(z)` (SeedVR2: core's VAE scales after encoding, unscales before decoding).
    comfy_latent_in_model_space: bool = False

    def to_comfy_latent(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent -> ComfyUI's LATENT samples for this family."""
        return self.to_model_space(z) if self.comfy_latent_in_model_space else z

    def from_comfy_latent(self, z: torch.Tensor) -> torch.Tensor:
        """ComfyUI's LATENT samples for this family -> raw latent."""
        return self.from_model_space(z) if self.comfy_latent_in_model_space else z

    # --- dtypes and devices --------------------------------------------------------------------
    @property
    def encode_dtype(self) -> torch.dtype:
        return next(self.encode_modules()[0].parameters()).dtype

    @property
    def decode_dtype(self) -> torch.dtype:
        return next(self.decode_modules()[0].parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def set_dtypes(self, encode: torch.dtype | None = None, decode: torch.dtype | None = None) -> "VideoVAE":
        """Cast the encoder and decoder weights separately (bf16 decode is near-lossless, bf16 encode is not)."""
        for modules, dtype in ((self.encode_modules(), encode), (self.decode_modules(), decode)):
            if dtype is not None:
                for module in modules:
                    module.to(dtype)
        return self
