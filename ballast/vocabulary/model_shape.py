"""Model shapes: the numbers of a Transformer that the cost model and the runtime's models share."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from .diffusers_config import DIFFUSERS_PREFIX, wan_shape_fields
from .hf_config import HF_PREFIX, hf_shape_fields
from .patterns import AttentionPattern, attention_pattern
from .value_checks import check_types, from_fields, read_json


@dataclass(frozen=True)
class VideoGeometry:
    """How a clip in pixels becomes latent patches: the VAE's compression, then patchify. The
    one place the conversion is stated (`latent_patches`)."""

    frames_in: int
    """Pixel frames the VAE turns into `frames_out` latent frames (Open-Sora 1.2: 17 -> 5)."""
    frames_out: int
    causal_first_frame: bool = False
    """The VAE encodes the first frame alone, then `frames_in` per `frames_out` (Wan 2.1's
    causal VAE: 1 + (F - 1) / 4 latent frames)."""
    space: int = 8
    """Pixels per latent pixel along height and width."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Latent (frames, height, width) per token."""
    latent_channels: int = 4

    def __post_init__(self) -> None:
        if min(self.frames_in, self.frames_out, self.space, self.latent_channels, *self.patch) < 1:
            raise ValueError(f"video geometry {self}: every field must be >= 1")
        object.__setattr__(self, "patch", tuple(self.patch))

    def latent_patches(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        """(frames, height, width) in latent patches of a clip of frames x height x width pixels."""
        if min(frames, height, width) < 1:
            raise ValueError(f"a clip of {frames} frames of {height} x {width} pixels: every size must be >= 1")
        if self.causal_first_frame:
            latent = 1 + math.ceil((frames - 1) * self.frames_out / self.frames_in)
        else:
            latent = max(1, round(frames * self.frames_out / self.frames_in))
        pf, ph, pw = self.patch
        return (math.ceil(latent / pf), math.ceil(height / (self.space * ph)), math.ceil(width / (self.space * pw)))


# Open-Sora 1.2's VAE (17 frames -> 5 latent frames, 8x space, 4 channels) and STDiT3's 1x2x2
# patches: the geometry of DCP's any-size video buckets, and the default for models without one.
OPEN_SORA_VIDEO = VideoGeometry(frames_in=17, frames_out=5)
# Wan 2.1's causal VAE (1 + (F - 1) / 4 latent frames, 8x space, 16 channels), 1x2x2 patches.
WAN_VIDEO = VideoGeometry(frames_in=4, frames_out=1, causal_first_frame=True, latent_channels=16)


@dataclass(frozen=True)
class ModelShape:
    """A Transformer of attention + MLP blocks: a Llama/GPT-style decoder, or a video DiT (its
    blocks also cross-attend to a condition; its "vocabulary" is a patch's latent values)."""

    name: str
    """Preset or file name, for reports."""
    layers: int
    """Number of Transformer blocks."""
    hidden: int
    """Model width."""
    heads: int
    """Query heads; every SP degree must divide it (Ulysses shards heads: `layouts.py`)."""
    kv_heads: int
    """Key/value heads (grouped-query attention); a degree that does not divide them replicates
    them (`layouts.HeadLayout.exchanged_kv_heads`)."""
    ffn: int
    """Inner width of the MLP."""
    vocab: int
    """Vocabulary size (embedding and output layer)."""
    gated_mlp: bool = True
    """SwiGLU MLP (three matrices) rather than GELU (two)."""
    tied_embeddings: bool = False
    """The output layer is the embedding's transpose (one matrix, not two)."""
    attention_window: int | None = None
    """Longest sequence the model's attention covers whole (a sliding window, e.g. Mistral's);
    None: any length. ballast attends over whole sequences, so no sequence may be longer."""
    max_positions: int | None = None
    """Positions the model was made for (a Hugging Face config's max_position_embeddings); None:
    any. No sequence may be longer: its last tokens would sit at positions the model never
    trained (RoPE) or has no embedding for (a position table)."""
    source: str | None = None
    """Where the model comes from: None for ballast's own model built from this shape, `hf:PATH`
    for a Hugging Face causal LM folder, or `diffusers:PATH` for a diffusers Wan transformer
    folder (`ballast.models.build_model` reads them)."""
    attention: str = "causal"
    """Attention pattern, by name (`patterns.PATTERNS`: causal, full or spatial-temporal); the
    value is `pattern`. It decides what a sample of a given shape costs in attention, which
    layout the model's groups run and which model family builds it."""
    spatial_share: float = 0.5
    """spatial-temporal: the share of blocks that attend within a frame (the rest attend along
    time); STDiT alternates them, 0.5."""
    cross_attention: bool = False
    """Every block also attends to a per-sample condition (a caption embedding): query and
    output projections per token, keys and values per condition token."""
    video: VideoGeometry | None = None
    """How clips in pixels become this model's latent patches; None: Open-Sora 1.2's."""
    caption_dim: int = 0
    """Width of a caption embedding token, what a video DiT's condition encoder reads (T5-XXL's
    and umT5-XXL's 4096); 0: the model is conditioned on class labels only."""
    max_axis_patches: int | None = None
    """A video model's longest clip axis (frames, height or width) in latent patches: the
    positions per axis its RoPE table holds (a diffusers Wan's rope_max_seq_len); None: any."""

    def __post_init__(self) -> None:
        if isinstance(self.video, dict):
            object.__setattr__(self, "video", VideoGeometry(**self.video))
        check_types(self, "model", self.name)
        try:
            attention_pattern(self.attention)
        except ValueError as e:
            raise ValueError(f"model {self.name!r}: {e}") from None
        if self.caption_dim < 0:
            raise ValueError(f"model {self.name!r}: caption_dim {self.caption_dim} must be >= 0 (0: labels only)")
        if self.max_axis_patches is not None and self.max_axis_patches < 1:
            raise ValueError(f"model {self.name!r}: max_axis_patches {self.max_axis_patches} must be >= 1 (None: any)")
        if not 0.0 <= self.spatial_share <= 1.0:
            raise ValueError(f"model {self.name!r}: spatial_share {self.spatial_share} is not in [0, 1]")
        for field_name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"model {self.name!r}: {field_name} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name!r}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")

    @property
    def hf_folder(self) -> Path | None:
        """The Hugging Face model folder of an `hf:PATH` model; None for ballast's own."""
        if self.source is None or not self.source.startswith(HF_PREFIX):
            return None
        return Path(self.source[len(HF_PREFIX):])

    @property
    def diffusers_folder(self) -> Path | None:
        """The diffusers model folder of a `diffusers:PATH` model; None otherwise."""
        if self.source is None or not self.source.startswith(DIFFUSERS_PREFIX):
            return None
        return Path(self.source[len(DIFFUSERS_PREFIX):])

    @property
    def pattern(self) -> AttentionPattern:
        """The attention pattern `attention` names."""
        return attention_pattern(self.attention)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """The matrices of one block (cross-attention's four included)."""
        cross = 2 * self.hidden * self.hidden if self.cross_attention else 0
        return self.layer_token_params + cross

    @property
    def layer_token_params(self) -> int:
        """The matrix weights one token of a block goes through: q, k, v, output and the MLP,
        and cross-attention's query and output (its keys and values are the condition's)."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        cross = 2 * self.hidden * self.hidden if self.cross_attention else 0
        return attention + mlp + cross

    @property
    def video_geometry(self) -> VideoGeometry:
        return self.video or OPEN_SORA_VIDEO

    @property
    def params(self) -> int:
        """All parameters (embedding and output layer, one matrix if tied; norms included)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return self.layers * (self.layer_matmul_params + 2 * self.hidden) + embeddings + self.hidden

    def check_degree(self, degree: int, cp: int = 1) -> None:
        """Raise ValueError unless a group of `degree` ranks, split u = degree / cp Ulysses x `cp`
        context-parallel (`plans.Group.cp`), can run this model's attention: the Ulysses part
        under the model's layout rule, a CP part only for a pattern that can run it."""
        if (why := self.pattern.split_why_not(degree, cp, self.heads)) is not None:
            raise ValueError(f"model {self.name!r}: {why}")

    def supports_degree(self, degree: int) -> bool:
        return self.pattern.layout.allows(degree, self.heads)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelShape:
        return from_fields(cls, data, "model")


MODEL_PRESETS: dict[str, ModelShape] = {
    # FlexSP's GPT models (docs/design.md: 32/40/60 layers, hidden 4096/5120/6656, 64 heads).
    "gpt-7b": ModelShape("gpt-7b", 32, 4096, 64, 64, 4 * 4096, 50304, gated_mlp=False),
    "gpt-13b": ModelShape("gpt-13b", 40, 5120, 64, 64, 4 * 5120, 50304, gated_mlp=False),
    "gpt-30b": ModelShape("gpt-30b", 60, 6656, 64, 64, 4 * 6656, 50304, gated_mlp=False),
    # Llama 3 8B (Meta's model card / config.json).
    "llama3-8b": ModelShape("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    # Llama 3 70B (Meta's config.json): the model users train with TP 8 x PP 4.
    "llama3-70b": ModelShape("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    # Trains on a CPU in seconds per step; 4 kv heads, so degrees 1, 2 and 4 exchange no replicas.
    "tiny": ModelShape("tiny", 4, 128, 8, 4, 352, 256),
    # Video DiTs (shapes for the cost model). "Layers" count blocks; the "vocabulary" is a
    # patch's latent values (channels x patch volume), what the patch embedding reads and the
    # final layer writes. GELU MLPs (two matrices), no GQA, cross-attention to a caption.
    # Captions: STDiT3 reads T5-XXL embeddings (caption_channels 4096), Wan umT5-XXL's (text_dim
    # 4096); the tiny ones are conditioned on the synthetic data's class labels.
    # Open-Sora 1.2's STDiT3-XL/2: 28 spatial + 28 temporal blocks, hidden 1152, 16 heads, MLP 4x.
    "stdit3-1b": ModelShape("stdit3-1b", 56, 1152, 16, 16, 4 * 1152, 4 * 4, gated_mlp=False,
                            attention="spatial-temporal", cross_attention=True, video=OPEN_SORA_VIDEO,
                            caption_dim=4096),
    # A 5B STDiT3 (no public one exists): 24 block pairs at hidden 2560, 5.0B parameters. Width
    # grows 2.2x over the XL (DiT scales width first) and depth barely falls, and 32 heads of 80
    # keep every SP degree up to 32 usable (heads must be a multiple of the degree).
    "stdit3-5b": ModelShape("stdit3-5b", 48, 2560, 32, 32, 4 * 2560, 4 * 4, gated_mlp=False,
                            attention="spatial-temporal", cross_attention=True, video=OPEN_SORA_VIDEO,
                            caption_dim=4096),
    # Wan 2.1's full-attention DiTs (its configs: layers/hidden/heads/FFN).
    "wan-1.3b": ModelShape("wan-1.3b", 30, 1536, 12, 12, 8960, 16 * 4, gated_mlp=False,
                           attention="full", cross_attention=True, video=WAN_VIDEO, caption_dim=4096),
    "wan-14b": ModelShape("wan-14b", 40, 5120, 40, 40, 13824, 16 * 4, gated_mlp=False,
                          attention="full", cross_attention=True, video=WAN_VIDEO, caption_dim=4096),
    # CPU-sized video DiTs (the video-model issue trains them): 2 block pairs / 4 blocks.
    "stdit-tiny": ModelShape("stdit-tiny", 4, 128, 8, 8, 512, 4 * 4, gated_mlp=False,
                             attention="spatial-temporal", cross_attention=True, video=OPEN_SORA_VIDEO),
    "dit-tiny": ModelShape("dit-tiny", 4, 128, 8, 8, 512, 4 * 4, gated_mlp=False,
                           attention="full", cross_attention=True, video=OPEN_SORA_VIDEO),
}


def get_model_shape(spec: str) -> ModelShape:
    """A preset name, `hf:PATH` (a Hugging Face model folder), `diffusers:PATH` (a diffusers Wan
    transformer folder) or a path to a JSON file with `ModelShape`'s fields."""
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    if spec.startswith(HF_PREFIX):
        return ModelShape(**hf_shape_fields(spec[len(HF_PREFIX):]))
    if spec.startswith(DIFFUSERS_PREFIX):
        return ModelShape(**wan_shape_fields(spec[len(DIFFUSERS_PREFIX):]))
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        data = read_json(path, "model file")
        data.setdefault("name", path.stem)
        return ModelShape.from_dict(data)
    raise ValueError(f"unknown model {spec!r}; presets: {', '.join(MODEL_PRESETS)}, hf:PATH, diffusers:PATH or a "
                     f".json file")
