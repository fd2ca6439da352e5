"""Data types, bytes per element, and precision recipes (a dtype per tensor role).

This is the shared vocabulary below ``nas``: the architecture's memory accounting and the
cost model both read it. Bytes per element include block-scale overhead for the
micro-scaled formats (NVFP4: 4-bit E2M1 values plus one E4M3 scale per 16 values ->
0.5625 bytes; MXFP4: 4-bit values plus one 8-bit scale per 32 -> 0.53125 bytes).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwprofiles.errors import InputError, first_error, read_json


class DType(str, Enum):
    """A storage or compute data type."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"

    @property
    def bytes(self) -> float:
        """Bytes per element, scale overhead included."""
        return BYTES_PER_ELEMENT[self]

    @property
    def is_fp4(self) -> bool:
        return self in (DType.NVFP4, DType.MXFP4)


BYTES_PER_ELEMENT: dict[DType, float] = {
    DType.FP32: 4.0,
    DType.BF16: 2.0,
    DType.FP16: 2.0,
    DType.FP8: 1.0,
    DType.INT8: 1.0,
    DType.NVFP4: 0.5625,
    DType.MXFP4: 0.53125,
}

_ALIASES = {
    "float32": DType.FP32,
    "fp32": DType.FP32,
    "bfloat16": DType.BF16,
    "bf16": DType.BF16,
    "float16": DType.FP16,
    "fp16": DType.FP16,
    "half": DType.FP16,
    "fp8": DType.FP8,
    "float8": DType.FP8,
    "fp8_e4m3": DType.FP8,
    "e4m3": DType.FP8,
    "int8": DType.INT8,
    "nvfp4": DType.NVFP4,
    "mxfp4": DType.MXFP4,
}


def parse_dtype(value: str | DType) -> DType:
    """Parse a dtype name (``bf16``, ``bfloat16``, ``fp8``, ``nvfp4``, ...)."""
    if isinstance(value, DType):
        return value
    key = str(value).strip().lower()
    if key not in _ALIASES:
        raise InputError(
            f"unknown dtype {value!r}; expected one of {sorted({d.value for d in DType})}"
        )
    return _ALIASES[key]


def bytes_per_element(dtype: str | DType) -> float:
    """Bytes per element of ``dtype`` (scale overhead included for FP4 formats)."""
    return parse_dtype(dtype).bytes


class TensorRole(str, Enum):
    """Which part of a model a weight tensor belongs to; a recipe gives each a dtype."""

    ROUTED_EXPERTS = "routed_experts"
    SHARED_EXPERTS = "shared_experts"
    ATTENTION = "attention"
    MAMBA = "mamba"  # Mamba in/out projections
    FFN = "ffn"  # dense MLP weights
    EMBEDDINGS = "embeddings"
    LM_HEAD = "lm_head"
    OTHER = "other"  # norms, biases, conv, router, latent projections, linear replacements


class PrecisionRecipe(BaseModel):
    """A dtype per weight role, plus KV-cache, SSM-state, conv-state and activation dtypes.

    Roles missing from ``weights`` take ``default``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    default: DType = DType.BF16
    weights: dict[TensorRole, DType] = Field(default_factory=dict)
    kv_cache: DType = DType.BF16
    ssm_state: DType = DType.FP32
    conv_state: DType = DType.BF16
    activations: DType = DType.BF16
    source: str = ""

    def weight_dtype(self, role: TensorRole | str) -> DType:
        """The storage dtype of weights of ``role``."""
        return self.weights.get(TensorRole(role), self.default)

    def weight_bytes_per_param(self, role: TensorRole | str) -> float:
        return self.weight_dtype(role).bytes

    def __hash__(self) -> int:  # dict field: hash a canonical form
        return hash(self.model_dump_json())


_NVFP4_SUPER_SOURCE = (
    "NVIDIA's published NVFP4 recipe for Nemotron-3-Super: routed experts NVFP4, shared "
    "experts and Mamba in/out projections FP8, KV cache FP8, everything else BF16, SSM "
    "cache FP32"
)
_NVFP4_SOURCE = (
    "ModelOpt NVFP4 checkpoints (nvidia/*-FP4 on the Hub, as benchmarked in TensorRT-LLM's "
    "perf overview): every linear layer (attention, MLP, experts, Mamba projections) NVFP4, "
    "KV cache FP8; embeddings, LM head, norms and router BF16; SSM state FP32"
)

_LINEARS = (TensorRole.ROUTED_EXPERTS, TensorRole.SHARED_EXPERTS, TensorRole.ATTENTION,
            TensorRole.MAMBA, TensorRole.FFN)

_MXFP4_SOURCE = (
    "OpenAI's gpt-oss checkpoints (gpt-oss model card, arXiv 2508.10925, Sec. 2: 'we quantize "
    "the MoE weights to MXFP4'; config.json quantization_config.modules_to_not_convert: "
    "attention, router, embeddings, LM head): routed-expert weights MXFP4 (OCP MX: 4-bit E2M1 "
    "values in 32-element blocks sharing one 8-bit E8M0 scale = 4.25 bits per weight), "
    "everything else and the KV cache BF16, SSM state FP32"
)

RECIPES: dict[str, PrecisionRecipe] = {
    "bf16": PrecisionRecipe(
        name="bf16",
        default=DType.BF16,
        kv_cache=DType.BF16,
        ssm_state=DType.FP32,
        source="all weights and KV cache BF16, SSM state FP32",
    ),
    "fp8": PrecisionRecipe(
        name="fp8",
        default=DType.FP8,
        weights={
            TensorRole.EMBEDDINGS: DType.BF16,
            TensorRole.LM_HEAD: DType.BF16,
            TensorRole.OTHER: DType.BF16,
        },
        kv_cache=DType.FP8,
        ssm_state=DType.FP32,
        source="all projection/expert weights FP8, embeddings/LM head/norms BF16, KV FP8",
    ),
    "nvfp4": PrecisionRecipe(
        name="nvfp4",
        default=DType.BF16,
        weights={r: DType.NVFP4 for r in _LINEARS},
        kv_cache=DType.FP8,
        ssm_state=DType.FP32,
        source=_NVFP4_SOURCE,
    ),
    "nvfp4-super": PrecisionRecipe(
        name="nvfp4-super",
        default=DType.BF16,
        weights={
            TensorRole.ROUTED_EXPERTS: DType.NVFP4,
            TensorRole.SHARED_EXPERTS: DType.FP8,
            TensorRole.MAMBA: DType.FP8,
        },
        kv_cache=DType.FP8,
        ssm_state=DType.FP32,
        source=_NVFP4_SUPER_SOURCE,
    ),
    "mxfp4": PrecisionRecipe(
        name="mxfp4",
        default=DType.BF16,
        weights={TensorRole.ROUTED_EXPERTS: DType.MXFP4},
        kv_cache=DType.BF16,
        ssm_state=DType.FP32,
        source=_MXFP4_SOURCE,
    ),
}


def get_recipe(name_or_path: str | Path | PrecisionRecipe) -> PrecisionRecipe:
    """A named preset (``bf16``, ``fp8``, ``nvfp4``, ``nvfp4-super``, ``mxfp4``) or a recipe
    JSON file."""
    if isinstance(name_or_path, PrecisionRecipe):
        return name_or_path
    key = str(name_or_path)
    if key in RECIPES:
        return RECIPES[key]
    path = Path(key)
    if not path.suffix and not path.exists():
        raise InputError(
            f"unknown precision recipe {key!r}; expected one of {sorted(RECIPES)} or a JSON file"
        )
    return load_recipe(path)


def load_recipe(path: str | Path) -> PrecisionRecipe:
    """Load a precision recipe from a JSON file (the fields of :class:`PrecisionRecipe`)."""
    return recipe_from_dict(read_json(path), source=str(path))


def recipe_from_dict(data: object, source: str = "recipe") -> PrecisionRecipe:
    """Validate a recipe object; errors name the field."""
    if isinstance(data, dict):
        data = dict(data)
        if "default" in data:
            data["default"] = parse_dtype(data["default"])
        for key in ("kv_cache", "ssm_state", "conv_state", "activations"):
            if key in data:
                data[key] = parse_dtype(data[key])
        if isinstance(data.get("weights"), dict):
            data["weights"] = {k: parse_dtype(v) for k, v in data["weights"].items()}
    try:
        return PrecisionRecipe.model_validate(data)
    except ValidationError as exc:
        loc, msg = first_error(exc, "(root)")
        raise InputError(msg, path=source, field=loc) from None
