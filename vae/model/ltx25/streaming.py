"""LTX-2.5's decoder as the stages of a run (`decode_stages`): one stage per layer, each giving the frames whose
windows it has seen whole, so consecutive chunks of the clip's latent frames give exactly the whole clip's
frames (`network.LTX25Decoder`), late.

Every layer maps frames to frames in order: a linear per token; a pixel-shuffle upsample (a frame to
`stride` frames, the clip's duplicate first one dropped); a neighbourhood-attention block, whose windows
reach `kernel_t // 2` frames back and ahead, further ahead near its grid's first frame and further back
near its last (a window shifts inward at the grid's borders, never at a chunk's). A block handed its input
frames in order gives query frame q once its input holds q's window (`_attend`): between calls it keeps in
the run's causal cache (`ctx.cache`, under itself) its input from the first frame a later query reads, and
counts the frames it has taken and given (`CausalState.advance`); it computes them in bands of query rows
(about `BAND_TOKENS` input tokens), each band with the key rows its windows read. Nothing is computed twice
but the keys and values of the frames a block keeps and of the rows a band reads beyond its own. Every layer
is a stage of its own, so the engine passes the frames a layer gives on at once, a piece at a time
(`strategies.FrameStream`; the clip's last chunk always, where every layer gives the frames it held back):
each block holds about its window's frames, not the clip's.

Stage 5 runs once per sampling step (`LTX25Config.num_inference_steps`; once for the released decoder): the
noised pixels of a pass wait until the pass gives their frames (`_pass_end`: `blocks.sampling_step`, to
the next pass's, or the output), and every diffusion block adds the stage-4 context of the frames it takes,
kept until the last block of the last pass has taken them.

A layer's grid length comes from the clip's latent frames (`RunState.clip_latent_frames`): the windows'
border shift, the crop of the trailing copies' frames after stage 4, and the noise, drawn whole for the clip
as core draws it (`blocks.draw_noise`, by `_entry` with the run's first latent frames: nothing else is held
yet). The clip-long buffers (the noise, the context, each pass's noised pixels) are kept in the cache in
pieces of `PIECE` frames (`_put_frames`), so a call reads only its own frames and a piece goes once used
(offloaded with the caches, a piece at a time).

Between stages tokens B,t,h,w,C travel as B,C,t,h,w views (channels-last 3-D strides: the frame layout of the
stages, the cache and `FrameStream`); pixels are B,3,t,H,W.
"""
import torch

from ...kernels.na_window import key_span, window_start
from ..video_vae import Stage
from .blocks import GridPart, draw_noise, patchify, sampling_step, unpatchify

PIECE = 8  # frames per cache entry of the clip-long buffers (the noise, the context, a pass's noised pixels)
# Input tokens of a band of query rows (its key frames x its rows x the width; its key rows add the windows'
# halo): bands bound a block call's temporaries (its q, k, v, attention and SwiGLU hidden values) whatever the
# frame size and however few of its key frames are queried (one query frame reads kernel_t key frames). A
# smaller band computes more halo rows' keys twice (at 1080p with 26 key frames: 21 rows a band, 10 halo rows).
BAND_TOKENS = 1 << 18


def stages(decoder, seed: int) -> list[Stage]:
    """The decoder's layers as stages: raw latent frames B,C,t,h,w in, pixel frames B,3,t',H,W out; `seed`:
    the noise's."""
    cfg = decoder.config
    out: list[Stage] = [lambda z, ctx: _entry(decoder, z, ctx, seed)]
    for i, (blocks, upsample) in enumerate(zip(decoder.det_stages, decoder.upsamples)):
        out += [lambda x, ctx, block=block, i=i: _frames(_attend(block, block, _tokens(x), ctx, _grid(decoder, ctx, i)))
                for block in blocks]
        out.append(lambda x, ctx, upsample=upsample: _upsample(upsample, x, ctx))
    out.append(lambda x, ctx: _context(decoder, x, ctx))
    modulations = _Modulations(decoder)
    for step in range(cfg.num_inference_steps):
        out += [lambda x, ctx, block=block, step=step: _diffuse(decoder, block, step, x, ctx, modulations)
                for block in decoder.diff_blocks]
        out.append(lambda x, ctx, step=step: _pass_end(decoder, step, x, ctx))
    return out


def _tokens(frames: torch.Tensor | None) -> torch.Tensor | None:
    return None if frames is None else frames.permute(0, 2, 3, 4, 1)  # B,C,t,h,w -> B,t,h,w,C


def _frames(tokens: torch.Tensor) -> torch.Tensor:
    return tokens.permute(0, 4, 1, 2, 3)  # B,t,h,w,C -> B,C,t,h,w (a view)


def _clip_latent_frames(ctx) -> int:
    """The clip's latent frames, which the engine run gives (the windows and the noise span the clip)."""
    if ctx.clip_latent_frames is None:
        raise ValueError("the LTX-2.5 diffusion decoder runs in an engine run (vae.decode): its windows and noise "
                         "span the clip, whose length the run gives")
    return ctx.clip_latent_frames


def _grid(decoder, ctx, i: int) -> int:
    """Frames of stage i's grid (0-3: stages 1-4 with the trailing copies; 4: stage 5, the pixel frames)."""
    return decoder.config.stage_frames(_clip_latent_frames(ctx))[i]


def _entry(decoder, z: torch.Tensor, ctx, seed: int) -> torch.Tensor:
    """Latent frames (with the clip's last one, its trailing copies) through `conv_in`: B,C,t,h,w -> tokens.
    With the run's first frames, the clip's noise is drawn (whole, as core draws it: nothing else is held yet)
    and kept in pieces until stage 5 takes it."""
    if ctx.cache.advance((decoder, "latent"), z.shape[2]) == 0:
        clip = (*z.shape[:2], _clip_latent_frames(ctx), *z.shape[3:])  # B,C,T,h,w of the whole clip
        _put_frames(ctx, (decoder, "noise"), draw_noise(decoder.pixel_shape(clip), seed, z.dtype, z.device))
    if ctx.last_chunk:
        z = torch.cat([z, z[:, :, -1:].expand(-1, -1, decoder.config.trailing_frames, -1, -1)], dim=2)  # B,C,t+n,h,w
    return _frames(decoder.conv_in(z.permute(0, 2, 3, 4, 1)))  # B,C,t,h,w -> B,t,h,w,C -> B,t,h,w,C0


def _upsample(upsample, x: torch.Tensor, ctx) -> torch.Tensor:
    received = ctx.cache.advance(upsample, x.shape[2])
    return _frames(upsample(_tokens(x), drop_first=received == 0))  # its first frame is the clip's: drop the duplicate


def _keep(ctx, key, tokens: torch.Tensor) -> None:
    """Keep `tokens` (B,t,h,w,C) under `key` for the next call (nothing when t is 0)."""
    if tokens.shape[1]:
        ctx.cache.put(key, _frames(tokens))  # a dense copy


def _ready(given: int, received: int, kernel: int, length: int) -> int:
    """The end of the queries from `given` whose windows lie in the first `received` frames of a grid of
    `length` frames (windows start where `window_start` says: ascending with the query)."""
    if received == length:
        return length
    stop = given
    while stop < length and window_start(stop, kernel, length) + min(kernel, length) <= received:
        stop += 1
    return stop


def _attend(key, block, new: torch.Tensor, ctx, length: int, run=None) -> torch.Tensor:
    """A neighbourhood-attention block (`block`, its state under `key`) on its next input frames `new`
    (B,n,h,w,C of a grid of `length` frames) -> its output frames that they complete, in order.
    `run(x, part)`: the block on the frames x with its `GridPart` (default: the block itself)."""
    run = run or block
    received = ctx.cache.advance((key, "in"), new.shape[1]) + new.shape[1]
    given = ctx.cache.advance((key, "out"), 0)
    held = _tokens(ctx.cache.pop(key))
    x = new if held is None else torch.cat([held, new], dim=1)  # input frames [start, received)
    del held  # (read back from an offloaded cache: a copy of its own, not held through the block)
    kernel = block.attn.kernel[0]
    start, stop = window_start(given, kernel, length), _ready(given, received, kernel, length)
    out = new[:, :0]
    if stop > given:
        reach = window_start(stop - 1, kernel, length) + min(kernel, length)  # the last key frame read, + 1
        b, _, h, w, c = x.shape
        out = x.new_empty((b, stop - given, h, w, c))
        rows = max(1, BAND_TOKENS // ((reach - start) * w))  # (its key rows: these and the windows' halo)
        for r0 in range(0, h, rows):  # bands of query rows, each with the key rows its windows read
            r1 = min(h, r0 + rows)
            k0, k1 = key_span(r0, r1, block.attn.kernel[1], h)
            part = GridPart((length, h, w), (start, k0, 0), (given - start, r0 - k0, 0), (stop - given, r1 - r0, w))
            out[:, :, r0:r1] = run(x[:, :reach - start, k0:k1], part)
        ctx.cache.advance((key, "out"), stop - given)
    if stop < length:  # the next query's first key onwards (it also holds that query's own frame)
        _keep(ctx, key, x[:, window_start(stop, kernel, length) - start:])
    return out


def _put_frames(ctx, key, frames: torch.Tensor) -> None:
    """Append `frames` (B,C,n,H,W) to the clip-long buffer `key`, kept in the cache in pieces of PIECE
    frames (each its own entry, offloaded with the caches): so a call reads and drops only its own frames."""
    first = ctx.cache.advance((key, "written"), frames.shape[2])
    while frames.shape[2]:
        k = first // PIECE * PIECE
        part, frames = frames[:, :, :k + PIECE - first], frames[:, :, k + PIECE - first:]
        held = ctx.cache.pop((key, k))  # the piece's frames so far (None: a new piece)
        ctx.cache.put((key, k), part if held is None else torch.cat([held, part], dim=2))
        first += part.shape[2]


def _frames_of(ctx, key, first: int, n: int) -> torch.Tensor:
    """Frames [first, first + n) of the buffer `key` (n >= 1; from pieces not dropped yet)."""
    pieces = [ctx.cache.get((key, k))[:, :, max(0, first - k):first + n - k]
              for k in range(first // PIECE * PIECE, first + n, PIECE)]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


def _drop_frames(ctx, key, stop: int) -> None:
    """Drop the pieces of the buffer `key` that lie wholly before its frame `stop` (no later call reads them)."""
    dropped = ctx.cache.advance((key, "dropped"), 0)
    for k in range(dropped, stop // PIECE * PIECE, PIECE):
        ctx.cache.pop((key, k))
    ctx.cache.advance((key, "dropped"), max(0, stop // PIECE * PIECE - dropped))


def _take_frames(ctx, key, first: int, n: int) -> torch.Tensor:
    """Frames [first, first + n) of the buffer `key` (n >= 1) for their one reader: its pieces before them and
    the ones they end dropped."""
    frames = _frames_of(ctx, key, first, n)
    _drop_frames(ctx, key, first + n)
    return frames


def _last_key(decoder):
    """The state key of the last diffusion block of the last pass (the last to take each context frame)."""
    return decoder.diff_blocks[-1], decoder.config.num_inference_steps - 1


def _context(decoder, x: torch.Tensor, ctx) -> torch.Tensor:
    """Stage 4's next output frames (B,C5,n,H5,W5), the trailing copies' share cropped, kept as the context,
    with their noise: -> the first pass's input tokens of those frames (as frames)."""
    first = ctx.cache.advance((decoder, "context"), x.shape[2])
    context = x[:, :, :max(0, _grid(decoder, ctx, 4) - first)]  # B,C5,n,H5,W5
    if not context.shape[2]:  # (nothing comes: nothing to give)
        return x[:, :, :0]
    _put_frames(ctx, (decoder, "context"), context)
    # the clip's noise of these frames (drawn by `_entry`)
    return _pass_input(decoder, 0, _take_frames(ctx, (decoder, "noise"), first, context.shape[2]), ctx)


def _pass_input(decoder, step: int, x_t: torch.Tensor, ctx) -> torch.Tensor:
    """Noised pixels B,3,n,H,W of pass `step`, kept until the pass gives their frames -> its input tokens (as frames)."""
    _put_frames(ctx, (decoder, "x_t", step), x_t)
    return _frames(decoder.conv_in_x_t(patchify(x_t, decoder.config.patch_size)))  # B,3,n,H,W -> B,n,H5,W5,C5


class _Modulations:
    """Each pass's shared AdaLN values (`LTX25Decoder.modulation` of its timestep), computed once per device, dtype
    and batch for the stages `stages` built (the engine builds them per chunk): every block of a pass reads the same."""

    def __init__(self, decoder):
        self.decoder, self.made = decoder, {}

    def __call__(self, step: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = (step, like.device, like.dtype, like.shape[0])
        if key not in self.made:
            t = self.decoder.timesteps(like.device)[step]
            self.made[key] = self.decoder.modulation(t.expand(like.shape[0]), like.dtype)
        return self.made[key]


def _diffuse(decoder, block, step: int, x: torch.Tensor, ctx, modulations: _Modulations) -> torch.Tensor:
    """A diffusion block of pass `step` on its next input frames (as frames), their context added."""
    if not x.shape[2]:  # (nothing comes: nothing to give)
        return x
    key = (block, step)
    taken = ctx.cache.advance((key, "in"), 0)
    context = _frames_of(ctx, (decoder, "context"), taken, x.shape[2])  # B,C5,n,H5,W5
    added = _tokens(x) + block.context_proj(_tokens(context))
    modulation = modulations(step, added)
    out = _attend(key, block, added, ctx, _grid(decoder, ctx, 4),
                  lambda frames, part: block.with_context_added(frames, modulation, part))
    if key == _last_key(decoder):  # the context frames every block has taken now go
        _drop_frames(ctx, (decoder, "context"), ctx.cache.advance((key, "in"), 0))
    return _frames(out)


def _pass_end(decoder, step: int, x: torch.Tensor, ctx) -> torch.Tensor:
    """Pass `step`'s output tokens (as frames) -> the model's prediction for their frames and, with the noised
    pixels they started from, the next pass's input tokens (`blocks.sampling_step`) or the output pixels
    B,3,n,H,W."""
    cfg = decoder.config
    out = unpatchify(decoder.conv_out(decoder.norm_out(_tokens(x))), cfg.patch_size)  # B,n,H5,W5,C5 -> B,3,n,H,W
    if not out.shape[2]:  # (no frames yet)
        return out if step + 1 == cfg.num_inference_steps else x
    key = (decoder, "x_t", step)
    x_t = _take_frames(ctx, key, ctx.cache.advance((key, "given"), out.shape[2]), out.shape[2])
    y = sampling_step(x_t, out, decoder.timesteps(out.device), step, cfg.model_output_type == "x0")
    return y if step + 1 == cfg.num_inference_steps else _pass_input(decoder, step + 1, y, ctx)
