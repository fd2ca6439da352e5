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
* ``jamba``: as the Llama family, but the even block's tensors are
  ``model.layers.{L}.mamba.<Mamba-1 names>`` (``in_proj``, ``conv1d``, ``x_proj``,
  ``dt_proj``, ``A_log``, ``D``, ``out_proj``, ``dt_layernorm`` / ``b_layernorm`` /
  ``c_layernorm``) or ``self_attn.*``, the odd block's norm is ``pre_ff_layernorm`` and its
  tensors ``feed_forward.*`` (MoE router ``feed_forward.router.weight``), and the final
  norm is ``model.final_layernorm.weight``.
* ``falcon_h1``: as the Llama family, but the even (parallel) block's tensors are
  ``model.layers.{L}.self_attn.<attention names>`` and ``model.layers.{L}.mamba.<Mamba
  names>`` side by side, the odd block's norm is ``pre_ff_layernorm`` and its tensors
  ``feed_forward.*``, and the final norm is ``model.final_layernorm.weight``.
* ``granitemoehybrid``: as the Llama family, but a Mamba block's tensors are
  ``model.layers.{L}.mamba.<Mamba names>`` and the odd block's are
  ``model.layers.{L}.block_sparse_moe.router.layer.weight``,
  ``block_sparse_moe.input_linear.weight`` (E, 2W, h: gate rows then up rows),
  ``block_sparse_moe.output_linear.weight`` (E, h, W), ``shared_mlp.input_linear.weight``
  (2S, h) and ``shared_mlp.output_linear.weight`` (:mod:`nas.modules.granite`).
* ``qwen3_5_moe`` (the image-text wrapper ``Qwen3_5MoeForConditionalGeneration``, read as a
  parent; a model saved from it is the text-only ``qwen3_5_moe_text``): the language model's
  tensors under ``model.language_model.`` instead of ``model.``; the vision tower
  (``model.visual.*``) and the MTP head (``mtp.*``) are left out (:data:`LEFT_OUT`,
  :attr:`CheckpointReader.left_out`).

Each saved file carries per-tensor SHA-256 digests in its safetensors metadata
(``puzzle_nas_sha256``) so that a modified tensor is caught on load; files from other
tools (no digests) load without that check. Loading never unpickles.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.child.formats.fp8 import block_size as fp8_block_size
from nas.child.formats.fp8 import scale_name as fp8_scale_name
from nas.child.formats.fp8 import unscale_fp8
from nas.child.formats.modelopt import dequantize as modelopt_dequantize
from nas.child.formats.modelopt import layout as modelopt_layout
from nas.child.formats.modelopt import quant_config as modelopt_config
from nas.child.formats.mxfp4 import packed_names, unpack_mxfp4
from nas.hf import NEMOTRON_H, ExportError, load_config, to_hf
from nas.hf.deepseek import is_mtp_tensor
from nas.hf.remote import AUTO_MAP, REMOTE_FILES, needs_remote_code, remote_config, remote_files
from nas.hf.remote import CONFIG_KEY as REMOTE_KEY
from nas.io import check_output_dir, swap_in_dir, temp_prefix
from nas.kinds import hf_module
from nas.modules.granite import GRANITE
from nas.modules.model import CausalLM
from nas.tokens import TOKENIZER_FILES

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
    if mt == "jamba" and sub == "gate.weight":  # Jamba's MoE router
        return "router.weight"
    if mt in ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe") \
            and sub.startswith("shared_experts."):
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
            own = hf_module(model.arch.blocks[i], model_type)  # a registered kind's own name
            if own is not None:
                mixer = prefix + own
            if model_type == "jamba":  # Jamba: mamba / self_attn, then feed_forward
                norm_name = prefix + ("input_layernorm.weight" if attn_slot
                                      else "pre_ff_layernorm.weight")
                mixer = prefix + ("feed_forward." if not attn_slot else
                                  hf_module(model.arch.blocks[i], "jamba") or "self_attn.")
            if model_type == GRANITE:  # the MLP slot's mixer names its own block_sparse_moe /
                # shared_mlp submodules (nas.modules.granite)
                mixer = prefix + ("mamba." if model.arch.blocks[i].kind == "mamba" else
                                  "self_attn." if attn_slot else "")
            if model_type == "falcon_h1":  # Falcon-H1: self_attn. + mamba. side by side,
                # then feed_forward (nas.modules.parallel names the branches as HF does)
                norm_name = prefix + ("input_layernorm.weight" if attn_slot
                                      else "pre_ff_layernorm.weight")
                mixer = prefix + ("" if attn_slot else "feed_forward.")
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
        rows.append(("norm.weight", "backbone.norm_f.weight" if nemo else
                     "model.final_layernorm.weight" if model_type in ("jamba", "falcon_h1")
                     else "model.norm.weight", None))
    if model.lm_head is not None:
        rows.append(("lm_head.weight", "lm_head.weight", None))
    lm = LANGUAGE_MODEL_PREFIX.get(model_type)
    if lm is not None:  # an image-text wrapper: its language model's tensors
        rows = [(k, lm + n[len("model."):] if n.startswith("model.") else n, j)
                for k, n, j in rows]
    return rows


LANGUAGE_MODEL_PREFIX: dict[str, str] = {"qwen3_5_moe": "model.language_model."}
"""Image-text wrapper types read as a parent (``Qwen3_5MoeForConditionalGeneration``): the
prefix of their language model's tensors, in place of ``model.``."""

LEFT_OUT: dict[str, tuple[str, str]] = {
    "qwen3_5_moe": (r"^(model\.visual\.|mtp\.)",
                    "the vision tower (model.visual.*) and the MTP head (mtp.*) are not "
                    "modeled: only the language model is read"),
    "qwen3_5_moe_text": (r"^mtp\.", "the MTP head (mtp.*) is not modeled"),
    "qwen3_next": (r"^mtp\.", "the MTP head (mtp.*) is not modeled"),
}
"""Checkpoint tensors a type's reader leaves out (a regex on the name) and why; transformers
skips the same ones (``_keys_to_ignore_on_load_unexpected``)."""


def hf_state_dict(model: CausalLM, model_type: str) -> dict[str, torch.Tensor]:
    """The model's tensors under their HF names for ``model_type`` (contiguous copies)."""
    sd = model.state_dict()
    out = {}
    for key, name, j in hf_layout(model, model_type):
        t = sd[key] if j is None else sd[key][j]
        out[name] = t.detach().contiguous().clone()
    return out


def remote_layout(model: CausalLM, model_type: str
                  ) -> tuple[list[tuple[str, str]], list[tuple[str, str, str, int]]]:
    """How the checkpoint's modeling code (:mod:`nas.hf.remote`) places ``model``'s modules
    under the HF tensor names of ``model_type``: ``(internal module path, HF module path)``
    pairs, merged upward wherever a whole submodule maps under one HF path, and the stacked
    expert parameters as ``(owner module, parameter, HF template relative to the owner's HF
    path with {j}, expert count)``."""
    leaf: dict[str, str] = {}
    stacked: dict[tuple[str, str], list[str]] = {}

    def put(mod: str, hf: str) -> None:
        if leaf.setdefault(mod, hf) != hf:
            raise InputError(f"cannot write modeling code for {model_type}: module {mod} maps "
                             f"to both {leaf[mod]} and {hf}")

    for key, name, j in hf_layout(model, model_type):
        mod, _, attr = key.rpartition(".")
        if j is not None:
            marker = f".experts.{j}."
            owner_hf = name[:name.rindex(marker)]
            put(mod, owner_hf)
            stacked.setdefault((mod, attr), []).append(name[len(owner_hf) + 1:])
            continue
        hf_mod, _, hf_attr = name.rpartition(".")
        if hf_attr != attr:
            raise InputError(f"cannot write modeling code for {model_type}: tensor {key} is "
                             f"saved as {name} (another parameter name)")
        put(mod, hf_mod)
    stacked_rows = []
    for (mod, attr), names in stacked.items():
        template = names[0].replace("experts.0.", "experts.{j}.", 1)
        if any(n != template.format(j=j) for j, n in enumerate(names)):  # pragma: no cover
            raise InputError(f"cannot write modeling code for {model_type}: experts of "
                             f"{mod}.{attr} are not numbered 0..{len(names) - 1}")
        stacked_rows.append((mod, attr, template, len(names)))
    # merge upward: a module whose mapped descendants all keep their relative paths under
    # one HF path is placed whole (a Nemotron-H block, the block list)
    mapping = dict(leaf)
    while True:
        for par in sorted({m.rpartition(".")[0] for m in mapping if "." in m},
                          key=lambda m: -m.count(".")):
            under = {m: h for m, h in mapping.items() if m == par or m.startswith(par + ".")}
            roots = {h[:len(h) - len(m) + len(par)] for m, h in under.items()
                     if h.endswith(m[len(par):])}
            if len(roots) == 1 and all(h.endswith(m[len(par):]) for m, h in under.items()):
                for m in under:
                    del mapping[m]
                mapping[par] = roots.pop()
                break
        else:
            break
    return sorted(mapping.items()), stacked_rows


def _digest(t: torch.Tensor) -> str:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data.data).hexdigest()  # ndarray.data: its memoryview


def export_config(model: CausalLM, model_type: str | None,
                  remote_code: bool | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``model`` saved as ``model_type`` (None: the type
    :func:`nas.hf.to_hf` picks). ``remote_code`` None adds ``auto_map`` and the
    ``puzzle_nas`` key (:mod:`nas.hf.remote`) when no stock transformers class holds the
    child (:func:`nas.hf.remote.needs_remote_code`); True adds them always, False never."""
    try:
        cfg = to_hf(model.arch, model_type)
    except ExportError as exc:
        raise InputError(f"cannot export as {model_type or 'any HF type'}: {exc}") from None
    cfg["torch_dtype"] = str(model.embed.weight.dtype).removeprefix("torch.")
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method") in PACKED_QUANT_METHODS:
        del cfg["quantization_config"]  # the parent's packing: the tensors written are plain
    if remote_code or (remote_code is None and needs_remote_code(cfg)):
        modules, stacked = remote_layout(model, cfg["model_type"])
        cfg["auto_map"] = dict(AUTO_MAP)
        cfg[REMOTE_KEY] = remote_config(model.arch, modules, stacked)
    return cfg


PACKED_QUANT_METHODS = ("fp8", "mxfp4")
"""``quantization_config.quant_method`` of checkpoints whose packed weights
:class:`CheckpointReader` unpacks on load (:mod:`nas.child.formats.fp8`, :mod:`nas.child.formats.mxfp4`); a
saved model writes plain tensors, so that config is not carried into its ``config.json``."""


MAX_SHARD_BYTES = 5_000_000_000  # 5 GB (decimal), transformers' customary shard size


def _shard_plan(model: CausalLM, model_type: str, max_shard_bytes: int
                ) -> list[list[tuple[str, str, int | None]]]:
    """The layout rows split into consecutive shards of at most ``max_shard_bytes`` each (a
    tensor larger than that gets a shard of its own)."""
    sd = model.state_dict()
    shards: list[list[tuple[str, str, int | None]]] = [[]]
    size = 0
    for row in hf_layout(model, model_type):
        t = sd[row[0]]
        n = (t[0] if row[2] is not None else t).numel() * t.element_size()
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(row)
        size += n
    return shards


BUILD_RECORD = "build.json"
"""What ``puzzle-nas build`` records beside the child it wrote
(:class:`nas.cli.build.BuildRecord`)."""
CHECKPOINT_FILES = (CONFIG, WEIGHTS, INDEX, "model-*-of-*.safetensors", *REMOTE_FILES,
                    *TOKENIZER_FILES, BUILD_RECORD)
"""What :func:`save_pretrained` writes (with the tokenizer files and the build record its
callers add, ``extra``); an existing output folder may hold only these (the save replaces
the folder whole)."""


def is_checkpoint_file(name: str) -> bool:
    """``name`` is a file :func:`save_pretrained` writes (or a killed save's temp entry)."""
    import fnmatch

    return name.startswith(".") and name.endswith((".tmp", ".old")) or any(
        fnmatch.fnmatchcase(name, p) for p in CHECKPOINT_FILES)


def save_pretrained(model: CausalLM, path: str | Path, model_type: str | None = None,
                    max_shard_bytes: int = MAX_SHARD_BYTES,
                    remote_code: bool | None = None,
                    extra: Callable[[Path], object] | None = None) -> Path:
    """Write ``config.json`` and the weights into folder ``path``: ``model.safetensors``, or
    ``model-0000k-of-0000n.safetensors`` shards of at most ``max_shard_bytes`` (default 5 GB)
    plus ``model.safetensors.index.json`` when larger, as transformers writes them.

    The type is ``model_type`` or the one :func:`nas.hf.to_hf` picks. Tensors are written
    one shard at a time without copying the model (peak: the model plus one shard). Files
    are written in a temporary folder beside ``path`` and moved into place only when all
    are complete, then swapped in whole (:func:`nas.io.swap_in_dir`), so a failed or
    interrupted save leaves nothing behind and an existing checkpoint untouched, and an older
    checkpoint's stale weight files go with it. An existing ``path`` may hold only checkpoint
    files (:data:`CHECKPOINT_FILES`); anything else is refused before any work.

    A child that no stock transformers class holds (``remote_code`` None, the default;
    True: always, False: never) also gets ``auto_map`` and its modeling code
    (:mod:`nas.hf.remote`), so ``AutoModelForCausalLM.from_pretrained(path,
    trust_remote_code=True)`` builds the same model.

    ``extra(folder)``, when given, writes more files into the staged folder once the
    checkpoint's are complete, before the swap (a tokenizer, :func:`nas.tokens.copy_tokenizer`;
    the build record), so they arrive with it or not at all.
    """
    from safetensors.torch import save_file

    path = Path(path)
    cfg = export_config(model, model_type, remote_code)
    mt = cfg["model_type"]
    check_output_dir(path, is_checkpoint_file, "output folder")
    shards = _shard_plan(model, mt, max_shard_bytes)
    names = [WEIGHTS] if len(shards) == 1 else \
        [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    sd = model.state_dict()
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        wmap: dict[str, str] = {}
        total = 0
        from nas.progress import progress

        for fname, rows in progress(zip(names, shards), len(shards), "save",
                                    None if len(shards) > 1 else False):
            tensors = {}
            for key, name, j in rows:
                t = sd[key].detach()
                tensors[name] = t.contiguous() if j is None else t[j].clone()
                wmap[name] = fname
                total += tensors[name].numel() * tensors[name].element_size()
            meta = {"format": "pt",
                    DIGESTS_KEY: json.dumps({k: _digest(v) for k, v in tensors.items()})}
            save_file(tensors, str(tmp / fname), metadata=meta)
            del tensors
        finish_checkpoint(tmp, path, cfg, wmap if len(shards) > 1 else None, total, extra)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def finish_checkpoint(tmp: Path, path: Path, cfg: dict[str, Any],
                      weight_map: dict[str, str] | None, total: int,
                      extra: Callable[[Path], object] | None = None) -> None:
    """Complete a checkpoint written into the temp folder ``tmp`` (its safetensors files
    already there) and swap it in as ``path``: the shard index (``weight_map`` None: one
    file, no index), ``config.json``, the files ``extra(tmp)`` writes (a tokenizer, a
    record), permissions as ``open()`` would give (``mkdtemp`` made the folder private),
    then one swap, so a reader sees the old checkpoint or the new one, never new weights
    beside an old config (an older checkpoint's stale shards and index go with the old
    folder)."""
    if weight_map is not None:
        (tmp / INDEX).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (tmp / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
    if REMOTE_KEY in cfg:  # the modeling code its auto_map names (nas.hf.remote)
        for fname, text in remote_files(cfg["model_type"]).items():
            (tmp / fname).write_text(text)
    if extra is not None:
        extra(tmp)
    umask = os.umask(0)
    os.umask(umask)
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~umask)
    os.chmod(tmp, 0o777 & ~umask)
    swap_in_dir(tmp, path)


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


class CheckpointReader:
    """A checkpoint folder opened for reading, tensor by tensor (never unpickles).

    ``arch`` is its architecture and ``model`` a :class:`CausalLM` of it on the meta device;
    :meth:`materialize` loads one submodule's tensors (``"embed"``, ``"blocks.3"``, ...) into
    it in a chosen dtype and :meth:`release` sends them back to the meta device, so a parent
    can be streamed one block at a time. Errors name the tensor (missing, misshaped,
    unexpected unless ``strict=False``, not matching its recorded SHA-256, stored as
    integers, or holding NaN / infinite values) or the file (truncated or corrupt). MTP
    tensors (``mtp.*``) are skipped: MTP blocks are not built.
    """

    def __init__(self, path: str | Path, strict: bool = True, arch: ModelArch | None = None):
        """``arch``: the folder's ``config.json`` as the caller already read it
        (:class:`nas.hf.Parent`), so it is not read again; None reads it."""
        folder = Path(path)
        if not folder.is_dir():
            raise InputError("not a checkpoint folder", path=str(folder))
        self.folder = folder
        self.arch = load_config(folder) if arch is None else arch
        mt = self.arch.model_type
        with torch.device("meta"):
            self.model = CausalLM(self.arch)
        self.layout = hf_layout(self.model, mt)
        self.files = _weight_files(folder)
        expected = {name for _, name, _ in self.layout}
        # MXFP4-packed tensors (gpt-oss on the Hub): name_blocks + name_scales stand for name
        self.packed = {name: packed_names(name) for name in expected if name not in self.files
                       and all(p in self.files for p in packed_names(name))}
        for name, (blk, _) in self.packed.items():
            self.files[name] = self.files[blk]
        expected |= {p for pair in self.packed.values() for p in pair}
        # block-scaled FP8 weights (DeepSeek-V3 on the Hub): name + name_scale_inv
        self.fp8_scales = {name: sc for name in expected
                           if (sc := fp8_scale_name(name)) is not None and sc in self.files}
        self.fp8_block = fp8_block_size(self.arch.hf_extra.get("quantization_config"))
        expected |= set(self.fp8_scales.values())
        # ModelOpt FP8 / NVFP4 exports (NVIDIA's Nemotron checkpoints): weight + its scales
        qc = modelopt_config(folder, self.arch.hf_extra)
        self.modelopt = None if qc is None else modelopt_layout(
            qc, set(self.files), expected, str(folder))
        """The :class:`nas.child.formats.modelopt.ModelOptLayout` of a ModelOpt checkpoint, else None."""
        if self.modelopt is not None:
            expected |= self.modelopt.names
        missing = [name for _, name, _ in self.layout if name not in self.files]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise InputError(f"missing tensor {missing[0]}{more}: config.json ({mt}) expects "
                             "it", path=str(folder))
        skip = LEFT_OUT.get(mt)
        self.left_out = sorted(k for k in set(self.files) - expected
                               if skip is not None and re.match(skip[0], k))
        """Tensors of the checkpoint not read (:data:`LEFT_OUT`: e.g. a wrapper's vision
        tower); :attr:`left_out_note` says why (``None`` when there are none)."""
        self.left_out_note = f"{len(self.left_out)} tensors left out: {skip[1]}" \
            if self.left_out and skip is not None else None
        if self.modelopt is not None:
            self.left_out_note = "; ".join(n for n in (self.left_out_note, self.modelopt.note())
                                           if n)
        extra = sorted(k for k in set(self.files) - expected - set(self.left_out)
                       if not (self.arch.mtp_blocks and k.startswith("mtp."))
                       and not is_mtp_tensor(self.arch, k))
        if extra and strict:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise InputError(f"unexpected tensor {extra[0]}{more}: config.json ({mt}) has no "
                             "such parameter", path=str(folder))
        self._handles: dict[Path, Any] = {}
        self._digests: dict[Path, dict[str, str]] = {}
        self._shapes = {k: tuple(v.shape) for k, v in
                        self.model.state_dict(keep_vars=True).items()}
        self._buffers = {k for k, _ in self.model.named_buffers()}
        self._stored_dtype: torch.dtype | None = None

    def stored_dtype(self) -> torch.dtype:
        """The dtype the embedding table is stored in: the checkpoint's non-quantized dtype
        (no published layout quantizes the embedding), which is the compute dtype a model
        read with ``dtype=None`` takes."""
        if self._stored_dtype is None:  # read once: tensors() asks for every block
            name = next(n for k, n, _ in self.layout if k == "embed.weight")
            code = self._handle(self.files[name]).get_slice(name).get_dtype()
            self._stored_dtype = _DTYPES.get(code, torch.float32)
        return self._stored_dtype

    def _handle(self, file: Path) -> Any:
        if file not in self._handles:
            self._handles[file] = _open(file)
            raw = (self._handles[file].metadata() or {}).get(DIGESTS_KEY)
            self._digests[file] = json.loads(raw) if raw else {}
        return self._handles[file]

    def keys(self, prefix: str = "") -> list[str]:
        """The internal names of the model's tensors (``state_dict`` keys, buffers included)
        that start with ``prefix`` (``"blocks.3."``: block 3's), in ``state_dict`` order."""
        return [k for k in self._shapes if k.startswith(prefix)]

    def sliceable(self, key: str) -> bool:
        """Whether this rank's rows of internal tensor ``key`` can be read alone: plain stored
        tensors (stacked experts included); a packed or scaled (FP8, MXFP4, ModelOpt) one is
        dequantized from the whole tensor."""
        names = [n for k, n, _ in self.layout if k == key]
        scaled = set(self.packed) | set(self.fp8_scales)
        if self.modelopt is not None:
            scaled |= set(self.modelopt.scales)
        return bool(names) and not any(n in scaled for n in names)

    def read_rows(self, key: str, dtype: torch.dtype, rank: int, world: int) -> torch.Tensor:
        """Rows ``[a, b)`` of internal tensor ``key`` (its dim-0 chunk for ``rank``, as
        ``torch.chunk`` and FSDP2 cut it), read from the safetensors file alone, checked
        (shape, floating point, finite) and cast to ``dtype``. Stacked experts: experts
        ``a..b-1``, each stored tensor read whole."""
        shape = self._shapes[key]
        c = -(-shape[0] // world)
        a, b = min(rank * c, shape[0]), min((rank + 1) * c, shape[0])
        rows = [(n, j) for k, n, j in self.layout if k == key]
        parts = []
        for name, j in rows:
            if j is not None and not a <= j < b:
                continue
            file = self.files[name]
            try:
                sl = self._handle(file).get_slice(name)
                want = tuple(shape[1:]) if j is not None else tuple(shape)
                got = tuple(sl.get_shape())
                if got != want:
                    raise InputError(f"tensor {name} has shape {list(got)} but config.json "
                                     f"implies {list(want)}", path=str(file))
                t = sl[:] if j is not None else sl[a:b]
            except InputError:
                raise
            except Exception as exc:
                raise InputError(f"cannot read tensor {name}: {exc}", path=str(file)) from None
            if not t.is_floating_point():
                raise InputError(f"tensor {name} is stored as {str(t.dtype)[6:]}, expected "
                                 "floating-point weights (bf16, fp16, fp32, fp8)", path=str(file))
            bad = count_non_finite(t)
            if bad:
                raise InputError(f"tensor {name} holds {bad:,} NaN or infinite values in rows "
                                 f"{a}-{b}; a child would inherit them: repair or re-export the "
                                 "checkpoint", path=str(file))
            parts.append(t.to(dtype))
        if rows[0][1] is not None:
            return torch.stack(parts) if parts else torch.empty((0, *shape[1:]), dtype=dtype)
        return parts[0]

    def tensors(self, keys: set[str] | None = None, dtype: torch.dtype | None = None
                ) -> dict[str, torch.Tensor]:
        """Internal state_dict entries ``keys`` (default all), read, checked and cast to
        ``dtype``; stacked experts are re-stacked. ``dtype`` None is the checkpoint's
        non-quantized dtype (:meth:`stored_dtype`), so dequantized weights (MXFP4, FP8,
        NVFP4, computed in float32) join the rest in one compute dtype: a bf16 checkpoint
        with fp8 linears is a bf16 model. Buffers (the MoE router's correction bias) stay
        in float32, as transformers keeps them (``_keep_in_fp32_modules_strict``)."""
        if dtype is None:
            dtype = self.stored_dtype()
        sd: dict[str, torch.Tensor] = {}
        parts: dict[str, list[torch.Tensor | None]] = {}
        rows = [r for r in self.layout if keys is None or r[0] in keys]
        rows.sort(key=lambda r: str(self.files[r[1]]))  # file by file (stable within one)
        for n, (key, name, j) in enumerate(rows):
            file = self.files[name]
            if n and self.files[rows[n - 1][1]] != file:
                self.close()  # unmap the finished file: its pages would stay resident
            h = self._handle(file)
            full = self._shapes[key]
            want = tuple(full[1:] if j is not None else full)
            try:
                if name in self.packed:  # MXFP4 blocks + scales (nas.child.formats.mxfp4)
                    blk, sc = self.packed[name]
                    t = unpack_mxfp4(h.get_tensor(blk),
                                     self._handle(self.files[sc]).get_tensor(sc))
                else:
                    t = h.get_tensor(name)
                if self.modelopt is not None and name in self.modelopt.scales:
                    sc, sc2 = self.modelopt.scales[name]  # nas.child.formats.modelopt
                    t = modelopt_dequantize(
                        t, self._handle(self.files[sc]).get_tensor(sc),
                        None if sc2 is None else self._handle(self.files[sc2]).get_tensor(sc2),
                        name)
                if name in self.fp8_scales:  # FP8 + per-block scales (nas.child.formats.fp8)
                    sc = self.fp8_scales[name]
                    t = unscale_fp8(t, self._handle(self.files[sc]).get_tensor(sc),
                                    self.fp8_block)
            except Exception as exc:
                raise InputError(f"cannot read tensor {name}: {exc}", path=str(file)) from None
            if tuple(t.shape) != want:
                raise InputError(f"tensor {name} has shape {list(t.shape)} but config.json "
                                 f"implies {list(want)}", path=str(file))
            if name in self._digests[file] and _digest(t) != self._digests[file][name]:
                raise InputError(f"tensor {name} does not match its recorded SHA-256 (the "
                                 "file was modified or is corrupt)", path=str(file))
            if not t.is_floating_point():
                raise InputError(f"tensor {name} is stored as {str(t.dtype)[6:]}, expected "
                                 "floating-point weights (bf16, fp16, fp32, fp8)",
                                 path=str(file))
            bad = count_non_finite(t)
            if bad:
                raise InputError(f"tensor {name} holds {bad:,} NaN or infinite values (of "
                                 f"{t.numel():,}); a child would inherit them: repair or "
                                 "re-export the checkpoint", path=str(file))
            t = t.to(torch.float32 if key in self._buffers else dtype)
            if j is None:
                sd[key] = t
            else:
                parts.setdefault(key, [None] * full[0])[j] = t
        for key, ts in parts.items():
            sd[key] = torch.stack(ts)  # type: ignore[arg-type]  # every slot of a stacked tensor is filled by its shards
            ts.clear()
        return sd

    def materialize(self, name: str, dtype: torch.dtype | None = None) -> torch.nn.Module:
        """Load submodule ``name`` of :attr:`model` (e.g. ``"blocks.3"``) and return it."""
        sub = self.model.get_submodule(name)
        prefix = name + "."
        keys = {k for k in self._shapes if k.startswith(prefix)}
        sd = self.tensors(keys, dtype)
        self.close()  # unmap the files: pages read so far would otherwise stay resident
        sub.load_state_dict({k[len(prefix):]: v for k, v in sd.items()}, strict=True,
                            assign=True)
        return sub

    def close(self) -> None:
        """Close the open safetensors files (they are reopened on the next read)."""
        self._handles.clear()

    def release(self, name: str) -> None:
        """Drop submodule ``name``'s tensors (back to the meta device)."""
        self.model.get_submodule(name).to("meta")


def count_non_finite(t: torch.Tensor, chunk: int = 1 << 20) -> int:
    """How many NaN / infinite values ``t`` holds, in chunks of 1 Mi elements: a mask of a
    whole tensor (6 MiB for one FFN matrix of the peak-memory test) is more than the
    builder's promise of the child plus about one block leaves room for."""
    flat = t.reshape(-1)
    exact = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    bad = 0
    for i in range(0, flat.numel(), chunk):
        c = flat[i:i + chunk]
        c = c if c.dtype in exact else c.float()  # fp8: isfinite needs a wider type
        bad += int(c.numel() - torch.isfinite(c).sum())
    return bad


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
           "F64": torch.float64}


def load_pretrained(path: str | Path | CheckpointReader, strict: bool = True,
                    dtype: torch.dtype | None = None) -> CausalLM:
    """Load a checkpoint folder written by :func:`save_pretrained` (or an HF checkpoint of
    a supported type, e.g. as transformers 4.x or 5.x writes it, bf16 / fp16 / fp32):
    ``config.json`` plus ``model.safetensors`` or a sharded ``model.safetensors.index.json``.
    Never unpickles; the model is built on the meta device and takes the loaded tensors, so
    the peak memory is the model plus one tensor.

    Raises :class:`InputError` naming the tensor for a missing, misshaped, unexpected
    (unless ``strict=False``), modified, integer or non-finite (NaN / inf) tensor, and
    naming the file for a truncated or corrupt one. ``dtype`` is the compute dtype of
    every weight; the default is the checkpoint's non-quantized dtype (quantized weights
    are dequantized into it). ``path`` may be a reader already open on the folder (its
    model is the one loaded: a reader loads once).
    """
    reader = path if isinstance(path, CheckpointReader) else CheckpointReader(path, strict)
    model = reader.model
    model.load_state_dict(reader.tensors(None, dtype), strict=True, assign=True)
    return model


def arch_of(path: str | Path) -> ModelArch:
    """The architecture of a checkpoint folder (its ``config.json``)."""
    return load_config(path)


# ---- sharded export (torch.distributed) ---------------------------------------------------
ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
             torch.float64: "F64"}
"""safetensors' dtype names of the dtypes a model is exported in."""


def safetensors_header(header: dict[str, Any], digests: dict[str, str]) -> bytes:
    """A safetensors header (length, JSON padded to 8 bytes) with this project's per-tensor
    digests in its metadata (:data:`DIGESTS_KEY`): ``header`` maps each tensor's name to
    its ``dtype`` (:data:`ST_DTYPES`), ``shape`` and ``data_offsets``. The same header with
    other digests has the same length (a digest is 64 hex characters), so a file can be
    written with placeholders first and its header rewritten in place
    (:func:`export_sharded`)."""
    meta = {"format": "pt", DIGESTS_KEY: json.dumps(digests)}
    raw = json.dumps({"__metadata__": meta, **header}, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def export_sharded(model: CausalLM, path: Path, dtype: torch.dtype,
                   max_shard_bytes: int | None = None,
                   extra: Callable[[Path], object] | None = None) -> None:
    """Write a sharded model as a checkpoint folder (``config.json`` + safetensors, as
    :func:`nas.child.save_pretrained` writes it, digests included), gathering one tensor
    at a time (a collective: every rank calls it; rank 0 writes). The safetensors files
    are streamed: the header (offsets from the shapes, digests as placeholders of their
    fixed length) first, then each tensor's bytes as it is gathered, then the header again
    with the digests. Parameters are written in ``dtype``, buffers as they are (float32).
    ``extra(folder)`` writes more files (a tokenizer) into the staged folder on rank 0
    before the swap."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    rank = dist.get_rank()
    limit = max_shard_bytes or MAX_SHARD_BYTES
    sd = model.state_dict(keep_vars=True)
    buffers = {k for k, _ in model.named_buffers()}
    cfg = export_config(model, None)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    rows = hf_layout(model, cfg["model_type"])

    def out_dtype(key: str) -> torch.dtype:
        return sd[key].dtype if key in buffers else dtype

    def shape(key: str, j: int | None) -> list[int]:
        s = list(sd[key].shape)
        return s[1:] if j is not None else s

    def nbytes(key: str, j: int | None) -> int:
        return math.prod(shape(key, j)) * out_dtype(key).itemsize

    files: list[list[tuple[str, str, int | None]]] = [[]]
    size = 0
    for row in rows:
        n = nbytes(row[0], row[2])
        if files[-1] and size + n > limit:
            files.append([])
            size = 0
        files[-1].append(row)
        size += n
    names = [WEIGHTS] if len(files) == 1 else \
        [f"model-{k + 1:05d}-of-{len(files):05d}.safetensors" for k in range(len(files))]
    tmp: Path | None = None
    if rank == 0:
        check_output_dir(path, is_checkpoint_file, "output folder")
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        wmap: dict[str, str] = {}
        total = 0
        last: tuple[str, torch.Tensor] | None = None
        for fname, frows in zip(names, files):
            header: dict[str, Any] = {}
            off = 0
            for key, name, j in frows:
                n = nbytes(key, j)
                header[name] = {"dtype": ST_DTYPES[out_dtype(key)], "shape": shape(key, j),
                                "data_offsets": [off, off + n]}
                off += n
                wmap[name] = fname
            total += off

            digests = {name: "0" * 64 for _, name, _ in frows}
            fh = open(tmp / fname, "wb") if tmp is not None else None  # noqa: SIM115
            try:
                if fh is not None:
                    fh.write(safetensors_header(header, digests))
                for key, name, j in frows:
                    if last is None or last[0] != key:  # stacked experts: gathered once
                        t = sd[key].detach()
                        full = t.full_tensor() if isinstance(t, DTensor) else t
                        last = (key, full.to(out_dtype(key)).cpu().contiguous())
                    if fh is not None:
                        v = last[1] if j is None else last[1][j].contiguous()
                        data = v.reshape(-1).view(torch.uint8).numpy()
                        digests[name] = hashlib.sha256(data.data).hexdigest()
                        fh.write(data.data)
                if fh is not None:
                    fh.seek(0)
                    fh.write(safetensors_header(header, digests))  # same length: the digests' hex is fixed-size
            finally:
                if fh is not None:
                    fh.close()
        last = None
        if tmp is not None:
            finish_checkpoint(tmp, path, cfg, wmap if len(files) > 1 else None, total, extra)
            tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
