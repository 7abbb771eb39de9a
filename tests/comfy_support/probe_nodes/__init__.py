"""Test probes installed into every test server's custom_nodes (as `streamvae_test_probes`): they let a
prompt look inside core's conditioning nodes without a text encoder or a diffusion model.

- StreamVAETestEmptyConditioning: a CONDITIONING with one zero text embedding and no extras, what a
  text encoder would hand WanImageToVideo.
- StreamVAETestConcatLatent: the `concat_latent_image` WanImageToVideo put into a CONDITIONING (the
  start image encoded by its VAE input), or the tensor under another `key` (LTXVAddGuide's
  `keyframe_idxs`, computed from its VAE's frame ratios), as a LATENT for Save Latent.
- StreamVAETestTone: an AUDIO (core's {"waveform": 1,2,S, "sample_rate"}) of a sine tone, what LTX-2's audio
  VAE decode hands a video saver, without an audio model.
"""
import math

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
        return {"required": {"conditioning": ("CONDITIONING",), "key": ("STRING", {"default": "concat_latent_image"})}}

    def take(self, conditioning, key):
        return ({"samples": conditioning[0][1][key].float()},)


class Tone:
    RETURN_TYPES = ("AUDIO",)
    FUNCTION = "make"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"hz": ("FLOAT", {"default": 440.0}), "seconds": ("FLOAT", {"default": 2.0}),
                             "sample_rate": ("INT", {"default": 44100})}}

    def make(self, hz, seconds, sample_rate):
        t = torch.arange(int(seconds * sample_rate)) / sample_rate
        wave = 0.5 * torch.sin(2 * math.pi * hz * t)
        return ({"waveform": torch.stack([wave, wave])[None], "sample_rate": sample_rate},)


NODE_CLASS_MAPPINGS = {"StreamVAETestEmptyConditioning": EmptyConditioning, "StreamVAETestConcatLatent": ConcatLatent,
                       "StreamVAETestTone": Tone}
