"""Test probes installed into every test server's custom_nodes (as `streamvae_test_probes`): they let a
prompt look inside core's conditioning nodes without a text encoder or a diffusion model.

- StreamVAETestEmptyConditioning: a CONDITIONING with one zero text embedding and no extras, what a
  text encoder would hand WanImageToVideo.
- StreamVAETestConcatLatent: the `concat_latent_image` WanImageToVideo put into a CONDITIONING (the
  start image encoded by its VAE input), as a LATENT for Save Latent.
"""
import torch


class EmptyConditioning:
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    def make(self):
        return ([[torch.zeros(1, 1, 16), {}]],)


class ConcatLatent:
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "take"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"conditioning": ("CONDITIONING",)}}

    def take(self, conditioning):
        return ({"samples": conditioning[0][1]["concat_latent_image"]},)


NODE_CLASS_MAPPINGS = {"StreamVAETestEmptyConditioning": EmptyConditioning, "StreamVAETestConcatLatent": ConcatLatent}
