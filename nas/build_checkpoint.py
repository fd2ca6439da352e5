"""HF checkpoints: ``config.json`` + ``model.safetensors`` with the tensor names of the type.

Tensor names (``i`` = block index; ``L = i // 2`` = layer of a paired type, where even
blocks are the attention slot and odd blocks the MLP slot):

* ``nemotron_h`` / ``nemotron_h_puzzle``: ``backbone.embeddings.weight``,
  ``backbone.layers.{i}.norm.weight``, ``backbone.layers.{i}.mixer.<name>``,
  ``backbone.norm_f.weight``, ``lm_head.weight``. Mixer names: attention ``q_proj``,
  ``k_proj``, ``v_proj``, ``o_proj`` (``.weight`` / ``.bias``), ``q_norm``, ``k_norm``;
  Mamba ``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm.weight``,
  ``out_proj``; MLP ``up_proj``, ``down_proj`` (+ ``gate_proj`` when gated); MoE
  ``gate.weight``, ``gate.e_score_correction_bias``, ``fc1_latent_proj.weight``,
  ``fc2_latent_proj.weight``, ``experts.{j}.up_proj.weight``, ``experts.{j}.down_proj.weight``
  (+ ``experts.{j}.gate_proj.weight`` when gated), ``shared_experts.up_proj.weight``,
  ``shared_experts.down_proj.weight``, ``shared_expert_gate.weight``; linear block
  ``linear.weight`` (extension); a no-op block has no tensors.
* ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``qwen2_moe``, ``qwen3_moe``, ``mixtral``,
  ``nemotron-nas`` (DeciLM): ``model.embed_tokens.weight``, ``model.norm.weight``,
  ``lm_head.weight``; even block: ``model.layers.{L}.input_layernorm.weight`` and
  ``model.layers.{L}.self_attn.<attention names>``; odd block:
  ``model.layers.{L}.post_attention_layernorm.weight`` and ``model.layers.{L}.mlp.<name>``
  (``gate_proj``, ``up_proj``, ``down_proj``; MoE ``gate.weight``,
  ``experts.{j}.{gate,up,down}_proj.weight``, Qwen2-MoE ``shared_expert.*`` and
  ``shared_expert_gate.weight``); Mixtral uses ``block_sparse_moe.`` instead of ``mlp.``
  and names its experts ``w1`` (gate), ``w2`` (down), ``w3`` (up). DeciLM linear
  replacements are ``self_attn.linear_attn.weight`` and ``mlp.linear_mlp.weight``.

Each saved file carries per-tensor SHA-256 digests in its safetensors metadata
(``puzzle_nas_sha256``) so that a modified tensor is caught on load; files from other
tools (no digests) load without that check. Loading never unpickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.hf import NEMOTRON_H, ExportError, load_config, to_hf
from nas.modules.model import CausalLM

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
DIGESTS_KEY = "puzzle_nas_sha256"
_EXPERT_PARAMS = {"experts_gate": "gate_proj", "experts_up": "up_proj",
                  "experts_down": "down_proj"}
_MIXTRAL_EXPERTS = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


def _mixer_name(sub: str, mt: str, attn_slot: bool) -> str:
    """HF name of a mixer parameter (internal name ``sub``) for type ``mt``."""
    if mt == "nemotron-nas" and sub == "linear.weight":
        return "linear_attn.weight" if attn_slot else "linear_mlp.weight"
    if mt == "qwen2_moe" and sub.startswith("shared_experts."):
        return "shared_expert." + sub[len("shared_experts."):]
    return sub


def hf_layout(model: CausalLM, model_type: str) -> list[tuple[str, str, int | None]]:
    """``(internal state_dict key, HF tensor name, expert index or None)`` for every HF
    tensor of ``model`` saved as ``model_type``; stacked expert parameters give one row per
    expert."""
    nemo = model_type in NEMOTRON_H
    rows: list[tuple[str, str, int | None]] = []
    base = "backbone." if nemo else "model."
    rows.append(("embed.weight", base + ("embeddings.weight" if nemo else "embed_tokens.weight"),
                 None))
    for key, t in model.state_dict(keep_vars=True).items():
        if not key.startswith("blocks."):
            continue
        _, i_s, part, rest = key.split(".", 3)
        i = int(i_s)
        attn_slot = i % 2 == 0
        if nemo:
            prefix = f"backbone.layers.{i}."
            norm_name = prefix + "norm.weight"
            mixer = prefix + "mixer."
        else:
            prefix = f"model.layers.{i // 2}."
            norm_name = prefix + ("input_layernorm.weight" if attn_slot
                                  else "post_attention_layernorm.weight")
            sub = "block_sparse_moe." if model_type == "mixtral" and \
                model.arch.blocks[i].kind == "moe" else "mlp."
            mixer = prefix + ("self_attn." if attn_slot else sub)
        if part == "norm":
            rows.append((key, norm_name, None))
        elif rest in _EXPERT_PARAMS:
            name = _EXPERT_PARAMS[rest]
            if model_type == "mixtral":
                name = _MIXTRAL_EXPERTS[name]
            for j in range(t.shape[0]):
                rows.append((key, f"{mixer}experts.{j}.{name}.weight", j))
        else:
            rows.append((key, mixer + _mixer_name(rest, model_type, attn_slot), None))
    if model.norm is not None:
        rows.append(("norm.weight", "backbone.norm_f.weight" if nemo else "model.norm.weight",
                     None))
    if model.lm_head is not None:
        rows.append(("lm_head.weight", "lm_head.weight", None))
    return rows


def hf_state_dict(model: CausalLM, model_type: str) -> dict[str, torch.Tensor]:
    """The model's tensors under their HF names for ``model_type`` (contiguous copies)."""
    sd = model.state_dict()
    out = {}
    for key, name, j in hf_layout(model, model_type):
        t = sd[key] if j is None else sd[key][j]
        out[name] = t.detach().contiguous().clone()
    return out


def _digest(t: torch.Tensor) -> str:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(memoryview(data)).hexdigest()


def _export_config(model: CausalLM, model_type: str | None) -> dict[str, Any]:
    try:
        cfg = to_hf(model.arch, model_type)
    except ExportError as exc:
        raise InputError(f"cannot export as {model_type or 'any HF type'}: {exc}") from None
    cfg["torch_dtype"] = str(model.embed.weight.dtype).removeprefix("torch.")
    return cfg


def save_pretrained(model: CausalLM, path: str | Path, model_type: str | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into folder ``path``.

    The type is ``model_type`` or the one :func:`nas.hf.to_hf` picks. Files are written in
    a temporary folder beside ``path`` and moved into place only when both are complete,
    so a failed save leaves nothing behind (and an existing checkpoint untouched).
    """
    from safetensors.torch import save_file

    path = Path(path)
    cfg = _export_config(model, model_type)
    tensors = hf_state_dict(model, cfg["model_type"])
    meta = {"format": "pt",
            DIGESTS_KEY: json.dumps({k: _digest(v) for k, v in tensors.items()})}
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a folder", path=str(path))
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata=meta)
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
        if not path.exists():
            os.replace(tmp, path)
        else:
            (path / INDEX).unlink(missing_ok=True)  # a stale sharded index would win on load
            os.replace(tmp / WEIGHTS, path / WEIGHTS)
            os.replace(tmp / CONFIG, path / CONFIG)
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------
def _open(file: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt")
    except FileNotFoundError:
        raise InputError("file not found", path=str(file)) from None
    except Exception as exc:  # SafetensorError and friends: truncated or corrupt header
        raise InputError(f"not a valid safetensors file (truncated or corrupt?): {exc}",
                         path=str(file)) from None


def _weight_files(folder: Path) -> dict[str, Path]:
    """HF tensor name -> file holding it (single file or a sharded index)."""
    index = folder / INDEX
    if index.exists():
        try:
            wmap = json.loads(index.read_text())["weight_map"]
            assert isinstance(wmap, dict)
        except Exception:
            raise InputError("not a valid safetensors index (expected a weight_map object)",
                             path=str(index)) from None
        return {k: folder / v for k, v in wmap.items()}
    file = folder / WEIGHTS
    return {k: file for k in _open(file).keys()}


def load_pretrained(path: str | Path, strict: bool = True,
                    dtype: torch.dtype | None = None) -> CausalLM:
    """Load a checkpoint folder written by :func:`save_pretrained` (or an HF checkpoint of
    a supported type): ``config.json`` plus ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``. Never unpickles.

    Raises :class:`InputError` naming the tensor for a missing, misshaped, unexpected
    (unless ``strict=False``) or modified tensor, and naming the file for a truncated or
    corrupt one. ``dtype`` casts the weights (default: as stored).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise InputError("not a checkpoint folder", path=str(folder))
    arch = load_config(folder)
    mt = arch.model_type
    with torch.device("meta"):
        model = CausalLM(arch)
    layout = hf_layout(model, mt)
    files = _weight_files(folder)
    expected = {name for _, name, _ in layout}
    missing = [name for _, name, _ in layout if name not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"missing tensor {missing[0]}{more}: config.json ({mt}) expects it",
                         path=str(folder))
    extra = sorted(set(files) - expected)
    if extra and strict:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise InputError(f"unexpected tensor {extra[0]}{more}: config.json ({mt}) has no "
                         "such parameter", path=str(folder))
    handles: dict[Path, Any] = {}
    digests: dict[Path, dict[str, str]] = {}
    meta_sd = model.state_dict(keep_vars=True)
    parts: dict[str, list[torch.Tensor | None]] = {}
    sd: dict[str, torch.Tensor] = {}
    for key, name, j in layout:
        file = files[name]
        if file not in handles:
            handles[file] = _open(file)
            raw = (handles[file].metadata() or {}).get(DIGESTS_KEY)
            digests[file] = json.loads(raw) if raw else {}
        want = tuple(meta_sd[key].shape[1:] if j is not None else meta_sd[key].shape)
        try:
            t = handles[file].get_tensor(name)
        except Exception as exc:
            raise InputError(f"cannot read tensor {name}: {exc}", path=str(file)) from None
        if tuple(t.shape) != want:
            raise InputError(f"tensor {name} has shape {list(t.shape)} but config.json "
                             f"implies {list(want)}", path=str(file))
        if name in digests[file] and _digest(t) != digests[file][name]:
            raise InputError(f"tensor {name} does not match its recorded SHA-256 (the file "
                             "was modified or is corrupt)", path=str(file))
        if dtype is not None:
            t = t.to(dtype)
        if j is None:
            sd[key] = t
        else:
            parts.setdefault(key, [None] * meta_sd[key].shape[0])[j] = t
    for key, ts in parts.items():
        sd[key] = torch.stack(ts)  # type: ignore[arg-type]
    model.load_state_dict(sd, strict=True, assign=True)
    return model


def arch_of(path: str | Path) -> ModelArch:
    """The architecture of a checkpoint folder (its ``config.json``)."""
    return load_config(path)
