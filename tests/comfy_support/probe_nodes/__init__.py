"""Test probes installed into every test server's custom_nodes (as `streamvae_test_probes`): they let a
prompt look inside core's conditioning nodes without a text encoder or a diffusion model.

- StreamVAETestEmptyConditioning: a CONDITIONING with one zero text embedding and no extras, what a
  text encoder would hand WanImageToVideo.
- StreamVAETestConcatLatent: the `concat_latent_image` WanImageToVideo put into a CONDITIONING (the
  start image encoded by its VAE input), or the tensor under another `key` (LTXVAddGuide's
  `keyframe_idxs`, computed from its VAE's frame ratios), as a LATENT for Save Latent.
- StreamVAETestClip: a CLIP whose every prompt encodes to that empty conditioning, for a conditioning node that
  takes the text encoder itself (MiniMax H3 Image to Video).
- StreamVAETestTone: an AUDIO (core's {"waveform": 1,2,S, "sample_rate"}) of a sine tone, what LTX-2's audio
  VAE decode hands a video saver, without an audio model.
- StreamVAETestImageLatent: an IMAGE as a LATENT, so Save Latent stores its float values (a preview's PNG
  rounds them to 8 bits).
- StreamVAETestCoreVAEAtFileWidths: core's own Load VAE (its node class VAELoader) on a HunyuanVideo 1.5
  file of reduced stage widths. Core builds that VAE at the released widths (128..1024) whatever the file
  holds, so a small test file could not load; here its `vae_refiner` Encoder and Decoder get the file's
  widths (`encoder.down.<i>` conv widths) while core's loader runs, and nothing else of core changes.
"""
import contextlib
import math

import torch


class Source:
    """A node of no inputs that makes one value (`make`)."""
    FUNCTION = "make"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}


class EmptyConditioning(Source):
    RETURN_TYPES = ("CONDITIONING",)

    def make(self):
        return ([[torch.zeros(1, 1, 16), {}]],)


class Clip(Source):
    RETURN_TYPES = ("CLIP",)

    def make(self):
        return (EmptyTextEncoder(),)


class EmptyTextEncoder:
    """What a conditioning node asks of its CLIP: tokens of a prompt (with any images), then their conditioning."""

    def tokenize(self, text, **kwargs):
        return {"text": text}

    def encode_from_tokens_scheduled(self, tokens, **kwargs):
        return EmptyConditioning().make()[0]


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


class ImageLatent:
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "wrap"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}

    def wrap(self, image):
        return ({"samples": image.float()},)


def file_widths(path: str) -> list[int]:
    """The stage widths of a HunyuanVideo 1.5 checkpoint in core's key names (its encoder's order)."""
    from safetensors import safe_open

    with safe_open(path, "pt") as file:
        keys, widths = set(file.keys()), []
        while (key := f"encoder.down.{len(widths)}.block.0.conv1.conv.weight") in keys:
            widths.append(file.get_slice(key).get_shape()[0])
    return widths


@contextlib.contextmanager
def built_at(widths: list[int]):
    """Core's HunyuanVideo 1.5 Encoder and Decoder made with `widths` as `block_out_channels` meanwhile."""
    from comfy.ldm.hunyuan_video import vae_refiner

    originals = {cls: cls.__init__ for cls in (vae_refiner.Encoder, vae_refiner.Decoder)}

    def at_widths(init):
        def init_at_widths(self, *args, **kwargs):
            init(self, *args, **{**kwargs, "block_out_channels": list(widths)})
        return init_at_widths

    for cls, init in originals.items():
        cls.__init__ = at_widths(init)
    try:
        yield
    finally:
        for cls, init in originals.items():
            cls.__init__ = init


class CoreVAEAtFileWidths:
    RETURN_TYPES = ("VAE",)
    FUNCTION = "load"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae_name": ("STRING", {"default": ""})}}

    def load(self, vae_name):
        import folder_paths
        import nodes

        with built_at(file_widths(folder_paths.get_full_path_or_raise("vae", vae_name))):
            return nodes.VAELoader().load_vae(vae_name)


NODE_CLASS_MAPPINGS = {"StreamVAETestEmptyConditioning": EmptyConditioning, "StreamVAETestClip": Clip,
                       "StreamVAETestConcatLatent": ConcatLatent,
                       "StreamVAETestTone": Tone, "StreamVAETestImageLatent": ImageLatent,
                       "StreamVAETestCoreVAEAtFileWidths": CoreVAEAtFileWidths}
