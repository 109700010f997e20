"""Model shapes: the numbers of a decoder that the cost model and the runtime's models share."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .value_checks import check_types, from_fields, read_json


@dataclass(frozen=True)
class ModelShape:
    """A Llama/GPT-style decoder: attention + MLP blocks, tied to nothing else."""

    name: str
    """Preset or file name, for reports."""
    layers: int
    """Number of Transformer blocks."""
    hidden: int
    """Model width."""
    heads: int
    """Query heads; every SP degree must divide it (Ulysses shards heads)."""
    kv_heads: int
    """Key/value heads (grouped-query attention); every SP degree must divide it too."""
    ffn: int
    """Inner width of the MLP."""
    vocab: int
    """Vocabulary size (embedding and output layer)."""
    gated_mlp: bool = True
    """SwiGLU MLP (three matrices) rather than GELU (two)."""

    def __post_init__(self) -> None:
        check_types(self, "model", self.name)
        for field_name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"model {self.name!r}: {field_name} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name!r}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attention + mlp

    @property
    def params(self) -> int:
        """All parameters (untied embedding and output layer; norms included)."""
        return self.layers * (self.layer_matmul_params + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def check_degree(self, degree: int) -> None:
        """Raise ValueError if Ulysses cannot shard this model's heads over `degree` ranks."""
        if self.heads % degree or self.kv_heads % degree:
            raise ValueError(
                f"model {self.name!r}: SP degree {degree} must divide heads ({self.heads}) "
                f"and kv heads ({self.kv_heads})")

    def supports_degree(self, degree: int) -> bool:
        return self.heads % degree == 0 and self.kv_heads % degree == 0

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
    # Trains on a CPU in seconds per step; 4 kv heads so that degrees 1, 2 and 4 all work.
    "tiny": ModelShape("tiny", 4, 128, 8, 4, 352, 256),
}


def get_model_shape(spec: str) -> ModelShape:
    """A preset name or a path to a JSON file with `ModelShape`'s fields."""
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        data = read_json(path, "model file")
        data.setdefault("name", path.stem)
        return ModelShape.from_dict(data)
    raise ValueError(f"unknown model {spec!r}; presets: {', '.join(MODEL_PRESETS)} or a .json file")
