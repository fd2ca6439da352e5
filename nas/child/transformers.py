"""The same model as a Hugging Face ``transformers`` model instance and back (when
transformers is installed): :func:`to_transformers` / :func:`from_transformers`.
"""

from __future__ import annotations

from typing import Any

from hwprofiles.errors import InputError
from nas.child.checkpoint import (
    export_config,
    hf_layout,
    load_pretrained,
)
from nas.hf.common import hf_floats
from nas.modules.model import CausalLM


# ---------------------------------------------------------------------------------------
# transformers interop
# ---------------------------------------------------------------------------------------
def to_transformers(model: CausalLM, model_type: str | None = None, copy: bool = True
                    ) -> Any:
    """The equivalent Hugging Face ``transformers`` model instance (same weights, same dtype)
    for a type transformers ships (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe,
    qwen3_moe, nemotron_h, deepseek_v3, gpt_oss, ...); hand it to HF Trainer or any other
    training loop.

    With ``copy`` (default) its weights are independent of ``model``'s; ``copy=False``
    saves the memory of a second copy by sharing storage wherever the two layouts agree
    (then training one changes the other; drop ``model`` after converting).

    Raises :class:`InputError` when transformers is not installed or the architecture only
    fits a type it lacks (``nemotron_h_puzzle``, ``nemotron-nas``: ``docs/build.md`` says
    what loads those).
    """
    try:
        import transformers
    except ImportError:
        raise InputError("to_transformers needs the transformers package "
                         "(pip install transformers)") from None
    # a config built in memory: transformers validates time_step_limit's floats (5.25)
    cfg = hf_floats(export_config(model, model_type))
    mt = cfg["model_type"]
    if "puzzle_layers" in cfg:  # nas.hf.qwen3_next's extension for heterogeneous children
        raise InputError(f"this {mt} child has per-layer shapes (the puzzle_layers "
                         "extension), which transformers' class cannot hold; save it with "
                         "save_pretrained and load it here")
    try:
        hcfg = transformers.AutoConfig.for_model(**cfg)
        # a model class: the private mapping is annotated with the tokenizer mapping's pairs
        cls: Any = transformers.AutoModelForCausalLM._model_mapping[type(hcfg)]
    except (ValueError, KeyError):
        raise InputError(f"transformers {transformers.__version__} has no {mt} model; save "
                         "the checkpoint and load it with a stack that has one (docs/build.md)"
                         ) from None
    own = model.state_dict()
    sd = {name: own[key] if j is None else own[key][j] for key, name, j in hf_layout(model, mt)}
    if copy:
        sd = {k: v.clone() for k, v in sd.items()}
    hf = cls.from_pretrained(None, config=hcfg, state_dict=sd,
                             dtype=model.embed.weight.dtype)
    return hf


def from_transformers(hf_model: Any) -> CausalLM:
    """The :class:`CausalLM` equivalent of a ``transformers`` model of a supported type
    (written through a temporary checkpoint folder, so never two copies in memory beyond
    the file cache)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="puzzle-nas-hf-") as tmp:
        hf_model.save_pretrained(tmp)
        return load_pretrained(tmp)
