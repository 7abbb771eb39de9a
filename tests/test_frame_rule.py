"""A network's frame counts (`VideoVAE.frames_made`, `frames_kept`), as the plan and the engine read them: the 4n+1
rule by default (the released Wan2.1 network, meta device), or a rule of the network's own (a tiny stand-in that
runs clips of 3 frames over the whole clip, whose counts follow no tf*n+1 rule)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vae
from bench import models
from vae.model.video_vae import ClipExtent, VideoVAE
from vae.run import geometry, planning


class ClipsOfThree(VideoVAE):
    """Encode: clips of 3 frames (the last completed with zero frames), one latent frame each; decode: 3 frames per
    latent frame. Pixels B,3,T,H,W, latents B,4,ceil(T/3),H/8,W/8. Its temporal factor, 4, is not its rule's: the
    engine's 4n+1 span of its latent frames is shorter (T=2) or longer (T=8) than the clip."""

    family, spatial_factor, temporal_factor, latent_channels = "clips_of_three", 8, 4, 4

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder, self.decoder = nn.Conv3d(3, 8, 1), nn.Conv3d(4, 3, 1)

    def frames_made(self, op: str, frames: int) -> int:
        return -(-frames // 3) if op == "encode" else 3 * frames

    def frames_kept(self, frames: int) -> int:
        return frames

    def clip_extent(self, op: str) -> ClipExtent:
        return ClipExtent.WHOLE_CLIP

    def _encode(self, x, ctx):
        pad = -x.shape[2] % 3
        x = F.pad(x, (0, 0, 0, 0, 0, pad))  # B,3,3n,H,W
        return self.encoder(F.avg_pool3d(x, (3, 8, 8)))  # B,8,n,H/8,W/8

    def _decode(self, z, ctx):
        y = self.decoder(z).repeat_interleave(3, dim=2)  # B,3,3t,h,w
        return y.repeat_interleave(8, dim=3).repeat_interleave(8, dim=4)  # B,3,3t,8h,8w

    def encode_stages(self):
        return [self._encode]

    def decode_stages(self):
        return [self._decode]

    def moments(self, h):
        return h.chunk(2, dim=1)  # 2 x B,4,t,h,w


def test_the_default_rule_is_4n_plus_1():
    model = models.meta_model("wan21")
    for frames in range(1, 30):
        assert model.frames_made("encode", frames) == geometry.latent_frames(frames)
        assert model.frames_made("decode", frames) == geometry.pixel_frames(frames)
        assert model.frames_kept(frames) == geometry.pixel_frames((frames - 1) // 4 + 1)


@pytest.mark.parametrize("frames", [2, 8])
def test_a_network_s_own_rule_counts_the_frames(frames):
    """The clip reaches the network as it is, in one chunk (temporal_chunk=1 set aside), and the plan counts what
    it makes: 2 frames -> 1 latent frame -> 3 frames, 8 -> 3 -> 9 (the 4n+1 rule: 2 and 3 latent frames)."""
    model = ClipsOfThree()
    video = torch.rand(1, 3, frames, 16, 24) * 2 - 1
    plan = planning.plan(model, "encode", video.shape, vae.Settings(temporal_chunk=1))
    latents = -(-frames // 3)
    assert (plan.clip.latent_frames, plan.temporal_chunk) == (latents, latents)
    expected = model.moments(model._encode(video, None))[0]  # B,4,ceil(T/3),2,3
    z = vae.encode(model, video, vae.Settings(temporal_chunk=1))
    torch.testing.assert_close(z, expected, rtol=0, atol=1e-6)
    assert planning.plan(model, "decode", z.shape).clip.frames == 3 * latents
    torch.testing.assert_close(vae.decode(model, z), model._decode(z, None), rtol=0, atol=1e-6)
