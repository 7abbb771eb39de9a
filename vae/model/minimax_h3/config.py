"""MiniMax-H3 video VAE: the config (every size the weights say is read from them: `checkpoint.py`),
and the constants they cannot say (core 0.33.0's `comfy/ldm/minimax/vae.py` defaults: the model's own
clips and tiles, the RoPE, the latent statistics a file without them uses).

How the sizes are read from a checkpoint's shapes, and its key names: `checkpoint.py`.
"""
import math
from dataclasses import dataclass

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Core's latent statistics (a LATENT is (mean - LATENTS_MEAN) / LATENTS_STD); a file's own win.
LATENTS_MEAN = (
    0.858090341091156, -0.9606591463088989, 1.0661640167236328, -0.5090325474739075,
    -0.2727581858634949, -1.3675414323806763, -0.2553254961967468, -0.26907554268836975,
    -0.5376840829849243, -0.0464097298681736, 0.6657370328903198, 0.19690127670764923,
    -0.5460608005523682, -0.4035342037677765, -0.23683024942874908, 0.25928452610969543,
    -0.30133944749832153, 0.211341992020607, -1.1206848621368408, 0.3581933379173279,
    -0.04225143790245056, 0.2604829967021942, 0.22864092886447906, 0.7056031823158264,
)
LATENTS_STD = (
    1.2223774194717407, 1.2767263650894165, 1.68317747116088865, 1.7549455165863037,
    1.5636216402053833, 2.194143533706665, 0.96531379222869875, 1.05698859691619875,
    0.841948926448822, 0.7729952931404114, 1.8955937623977661, 0.946841835975647,
    0.7996809482574463, 0.44988900423049925, 0.7197399735450745, 0.69362932443618775,
    2.961095094680786, 2.7694199085235595, 3.0496184825897215, 2.1088054180145265,
    3.276226282119751, 3.1627357006073, 2.28168129920959475, 2.6127843856811525,
)


@dataclass(frozen=True)
class MiniMaxH3Config:
    """The released network (core's `MiniMaxH3VideoVAE()`); `from_state_dict` reads the sizes."""

    # encoder: a 3-D causal CNN, one level per entry of `multipliers`
    in_channels: int = 3
    base_channels: int = 128
    multipliers: tuple[int, ...] = (1, 2, 2, 4, 4, 8)
    res_blocks: tuple[int, ...] = (2, 2, 2, 2, 2, 2)
    space_down: tuple[int, ...] = (2, 2, 2, 2, 1, 1)  # not in the weights: core's constants
    time_down: tuple[int, ...] = (1, 2, 2, 1, 1, 1)
    z_channels: int = 24
    embed_dim: int = 24
    # decoder: a ViT over the latent tokens of one tile of one clip
    dim: int = 2048
    head_dim: int = 64  # not in the weights (the q/k norms have no weight): heads = dim / head_dim
    layers: int = 36
    ff_mult: int = 4
    register_tokens: int = 4
    out_channels: int = 3
    rope_theta: float = 100.0
    rope_fraction: float = 0.75  # of each head's channels rotated (48 of 64: 8 frequencies x 3 axes x 2)
    eps: float = 1e-5
    # the model's own clips and tiles (core's constants; the tests shrink the tiles to reach grids cheaply)
    clip_length: int = 17
    token_drop: int = 3
    tile_size: int = 256
    tile_overlap_min: int = 64

    def __post_init__(self):
        if not len(self.multipliers) == len(self.res_blocks) == len(self.space_down) == len(self.time_down):
            raise ValueError("multipliers, res_blocks, space_down and time_down need one entry per encoder level")
        if self.dim % self.head_dim or self.rope_dims % (2 * 3):
            raise ValueError(f"dim {self.dim} must be whole heads of {self.head_dim} channels whose rotated part "
                             f"({self.rope_dims}) splits into 3 axes of pairs")
        if self.tile_size % self.spatial_factor or self.tile_overlap_min % self.spatial_factor:
            raise ValueError(f"tile size {self.tile_size} and overlap {self.tile_overlap_min} must be multiples of "
                             f"the {self.spatial_factor} px latent cell")

    @property
    def heads(self) -> int:
        return self.dim // self.head_dim

    @property
    def rope_dims(self) -> int:
        """Channels of each head that RoPE rotates (the first ones)."""
        return int(self.head_dim * self.rope_fraction)

    @property
    def widths(self) -> tuple[int, ...]:
        """The encoder's channels per level."""
        return tuple(self.base_channels * m for m in self.multipliers)

    @property
    def spatial_factor(self) -> int:
        return math.prod(self.space_down)

    @property
    def temporal_factor(self) -> int:
        return math.prod(self.time_down)

    @property
    def patch_pixels(self) -> int:
        """Pixels one latent token decodes to per channel: temporal x spatial x spatial."""
        return self.temporal_factor * self.spatial_factor ** 2

    def downsamples(self, level: int) -> bool:
        return self.space_down[level] * self.time_down[level] > 1
