"""Model shapes: the numbers of a decoder that the cost model and the runtime's models share."""
from __future__ import annotations

import math
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
    """Key/value heads (grouped-query attention); a degree that does not divide them replicates
    them (`exchanged_kv_heads`)."""
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
    source: str | None = None
    """Where the model comes from: None for ballast's own GPT built from this shape, or
    `hf:PATH` for a Hugging Face causal LM folder (`ballast.models.build_model` reads it)."""

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
    def hf_folder(self) -> Path | None:
        """The Hugging Face model folder of an `hf:PATH` model; None for ballast's own."""
        if self.source is None or not self.source.startswith(HF_PREFIX):
            return None
        return Path(self.source[len(HF_PREFIX):])

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
        """All parameters (embedding and output layer, one matrix if tied; norms included)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return self.layers * (self.layer_matmul_params + 2 * self.hidden) + embeddings + self.hidden

    def check_degree(self, degree: int) -> None:
        """Raise ValueError if Ulysses cannot shard this model's heads over `degree` ranks."""
        if not self.supports_degree(degree):
            raise ValueError(f"model {self.name!r}: SP degree {degree} must divide the attention heads ({self.heads})")

    def supports_degree(self, degree: int) -> bool:
        return self.heads % degree == 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelShape:
        return from_fields(cls, data, "model")


def exchanged_kv_heads(kv_heads: int, degree: int) -> int:
    """The kv heads Ulysses exchanges at SP degree `degree`: lcm(kv_heads, degree).

    Each rank receives heads / degree query heads and the kv heads they read. When the degree
    divides the kv heads that is kv_heads / degree of them; when it does not (kv_heads < degree,
    common with GQA), every kv head is replicated degree / gcd(kv_heads, degree) times so each
    rank receives the copies its query heads need. The replicas' gradients sum in backward."""
    return math.lcm(kv_heads, degree)


MODEL_PRESETS: dict[str, ModelShape] = {
    # FlexSP's GPT models (docs/design.md: 32/40/60 layers, hidden 4096/5120/6656, 64 heads).
    "gpt-7b": ModelShape("gpt-7b", 32, 4096, 64, 64, 4 * 4096, 50304, gated_mlp=False),
    "gpt-13b": ModelShape("gpt-13b", 40, 5120, 64, 64, 4 * 5120, 50304, gated_mlp=False),
    "gpt-30b": ModelShape("gpt-30b", 60, 6656, 64, 64, 4 * 6656, 50304, gated_mlp=False),
    # Llama 3 8B (Meta's model card / config.json).
    "llama3-8b": ModelShape("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    # Trains on a CPU in seconds per step; 4 kv heads, so degrees 1, 2 and 4 exchange no replicas.
    "tiny": ModelShape("tiny", 4, 128, 8, 4, 352, 256),
}


HF_PREFIX = "hf:"


def get_model_shape(spec: str) -> ModelShape:
    """A preset name, `hf:PATH` (a Hugging Face model folder), or a path to a JSON file with
    `ModelShape`'s fields."""
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    if spec.startswith(HF_PREFIX):
        return hf_model_shape(spec[len(HF_PREFIX):])
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        data = read_json(path, "model file")
        data.setdefault("name", path.stem)
        return ModelShape.from_dict(data)
    raise ValueError(f"unknown model {spec!r}; presets: {', '.join(MODEL_PRESETS)}, hf:PATH or a .json file")


def hf_model_shape(folder: str) -> ModelShape:
    """The shape of the Hugging Face causal LM in `folder`, from its `config.json` alone (no
    weights read, transformers not imported): what the cost model and the planners need."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ValueError(f"hf:{folder}: no config.json there (a Hugging Face model folder has one)")
    config = read_json(path / "config.json", "model config")
    kind = config.get("model_type", "?")
    architectures = config.get("architectures") or []
    if architectures and not any(a.endswith("ForCausalLM") for a in architectures):
        raise ValueError(f"hf:{folder}: model type {kind!r} is {', '.join(architectures)}, not a causal LM "
                         f"(...ForCausalLM)")
    missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                           "vocab_size") if k not in config]
    if missing:
        raise ValueError(f"hf:{folder}: config.json of model type {kind!r} lacks {', '.join(missing)}: not a "
                         f"decoder ballast can price")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim * heads != config["hidden_size"]:
        raise ValueError(f"hf:{folder}: model type {kind!r} has head_dim {head_dim} x {heads} heads != hidden "
                         f"{config['hidden_size']}: not supported")
    return ModelShape(
        name=path.name, layers=config["num_hidden_layers"], hidden=config["hidden_size"], heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads, ffn=config["intermediate_size"],
        vocab=config["vocab_size"], gated_mlp=config.get("hidden_act", "silu") in ("silu", "swiglu"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), source=f"{HF_PREFIX}{folder}",
        # Qwen2-style configs keep a window that is off unless use_sliding_window says otherwise.
        attention_window=config.get("sliding_window") if config.get("use_sliding_window", True) else None)
