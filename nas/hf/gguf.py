"""GGUF files as parents: read through transformers' GGUF support, once, into a cached folder.

A ``.gguf`` file (llama.cpp's format, often quantized: Q4_1, Q8_0, ...) is read by the
ecosystem, never parsed here: transformers' ``from_pretrained(folder, gguf_file=name)``
(which needs the ``gguf`` package and ``accelerate``) maps its metadata to an HF config and
dequantizes its tensors to float32; the ``gguf`` package's reader gives the cheap metadata
(the architecture string, the quantization type). :func:`convert` writes that model once as an
ordinary HF checkpoint folder (``config.json`` + safetensors, float32) in a per-machine cache,
keyed by the file's absolute path, size and modification time, so that every command then
reads it as it reads a Hub checkpoint folder. :func:`gguf_config` reads the config alone
(no tensor is dequantized): what ``puzzle-nas inspect`` and a spec's parent need.

torch, transformers and gguf are imported inside the functions: ``nas`` imports without
them (``pip install 'puzzle-nas[gguf]'`` brings them).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwprofiles.errors import InputError
from nas.cache import cache_dir

if TYPE_CHECKING:
    from nas.arch import ModelArch

SUFFIX = ".gguf"
MAGIC = b"GGUF"
# bumped when the folder written changes, so that an older cache entry is not reused
FORMAT_VERSION = 1
DTYPE = "float32"  # what transformers dequantizes to, and the converted folder holds
INSTALL = "pip install 'puzzle-nas[gguf]'"
# config keys that describe the GGUF file, not the model: dropped from the written config
_FILE_KEYS = ("quantization_config", "_name_or_path", "name_or_path")


def is_gguf(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` names a GGUF file (by its ``.gguf`` suffix, any case)."""
    return path is not None and str(path).lower().endswith(SUFFIX)


def cache_root() -> Path:
    """The folder converted GGUF parents are cached in (:func:`nas.cache.cache_dir`):
    ``$PUZZLE_NAS_CACHE/gguf`` when the variable is set, else
    ``$XDG_CACHE_HOME/puzzle-nas/gguf``, else ``~/.cache/puzzle-nas/gguf``."""
    return cache_dir("gguf")


def _check_file(path: Path) -> None:
    """A missing file, a folder, or a file that does not start with the GGUF magic is a
    one-line :class:`InputError`."""
    if path.is_dir():
        raise InputError("is a folder, expected a .gguf file", path=str(path))
    try:
        with path.open("rb") as f:
            head = f.read(len(MAGIC))
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read ({exc.__class__.__name__})", path=str(path)) from None
    if head != MAGIC:
        raise InputError(f"not a GGUF file (it starts with {head!r}, a GGUF file with "
                         f"{MAGIC!r})", path=str(path))


def _require_stack(weights: bool) -> None:
    """The packages transformers' GGUF loader needs, or a one-line :class:`InputError`
    naming the extra that installs them (``accelerate`` only to load weights)."""
    from importlib.util import find_spec

    names = ("torch", "transformers", "gguf") + (("accelerate",) if weights else ())
    missing = [n for n in names if find_spec(n) is None]
    if missing:
        raise InputError(f"reading a .gguf file needs {', '.join(missing)}: {INSTALL}")


@dataclass(frozen=True)
class GGUFInfo:
    """The metadata of a GGUF file that the messages name, read by the gguf package's reader.

    ``architecture``: the ``general.architecture`` string (``llama``, ``qwen2``, ...);
    ``quant``: the file's quantization type (``Q4_1``, ``Q8_0``, ``F16``, ...), from
    ``general.file_type`` or else the type holding most weight elements; ``size_bytes``:
    the file's size in bytes; ``has_tokenizer``: whether it holds a tokenizer
    (``tokenizer.ggml.model``)."""

    architecture: str
    quant: str
    size_bytes: int
    has_tokenizer: bool = False


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def read_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """The architecture and quantization type of the GGUF file ``path`` (its metadata only,
    memory-mapped: no tensor is read; remembered for the process by path, size and
    modification time, as the reader parses every field, a 49k-token vocabulary included:
    about 3 s for SmolLM2-135M). A missing or non-GGUF file is a one-line
    :class:`InputError`."""
    p = Path(path)
    _check_file(p)
    st = p.stat()
    return _read_info(p.resolve(), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _read_info(p: Path, size: int, mtime_ns: int) -> GGUFInfo:
    _require_stack(weights=False)
    import gguf

    try:
        reader = gguf.GGUFReader(p)
    except Exception as exc:  # a truncated or corrupt file: the reader's own words
        why = (str(exc).splitlines() or [exc.__class__.__name__])[0]
        raise InputError(f"not a readable GGUF file ({why})", path=str(p)) from None
    arch = str(_field(reader, "general.architecture") or "?")
    quant = None
    ft = _field(reader, "general.file_type")
    if isinstance(ft, int):
        try:
            quant = gguf.LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            quant = None
    if quant is None:  # the type that holds most of the weights' elements
        counts: Counter[str] = Counter()
        for t in reader.tensors:
            counts[t.tensor_type.name] += int(t.n_elements)
        quant = counts.most_common(1)[0][0] if counts else "?"
    return GGUFInfo(architecture=arch, quant=quant, size_bytes=size,
                    has_tokenizer="tokenizer.ggml.model" in reader.fields)


def _clean(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config dict from a GGUF without the keys that describe the file (its leftover
    ``quantization_config``, its name) rather than the model."""
    return {k: v for k, v in cfg.items() if k not in _FILE_KEYS}


def _refuse(path: Path, info: GGUFInfo, exc: BaseException) -> InputError:
    import transformers

    why = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
    return InputError(f"GGUF architecture {info.architecture!r} cannot be read by transformers "
                      f"{transformers.__version__} ({why})", path=str(path))


def _transformers_config(path: Path, info: GGUFInfo) -> Any:
    """transformers' config of the GGUF file (from its metadata; no tensor read)."""
    _require_stack(weights=False)
    from transformers import AutoConfig

    try:
        with _quiet_transformers():
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, NotImplementedError, KeyError, OSError) as exc:
        raise _refuse(path, info, exc) from None


def _arch(cfg: dict[str, Any], path: str | os.PathLike[str], info: GGUFInfo) -> ModelArch:
    """The :class:`ModelArch` of a GGUF file's config; one whose model type this package does
    not build is refused, naming the file and its GGUF architecture."""
    from nas.hf import from_hf

    return from_hf(cfg, source=f"{path} (GGUF architecture {info.architecture!r})")


def load_gguf_arch(path: str | os.PathLike[str]) -> ModelArch:
    """The :class:`ModelArch` of the GGUF file ``path`` from its config alone
    (:func:`gguf_config`: no tensor is dequantized)."""
    return gguf_arch_and_config(path)[0]


def gguf_arch_and_config(path: str | os.PathLike[str]) -> tuple[ModelArch, dict[str, Any]]:
    """The :class:`ModelArch` of the GGUF file ``path`` and the HF config it was read from
    (:func:`gguf_config`, read once)."""
    cfg = gguf_config(path)
    return _arch(cfg, path, read_info(path)), cfg


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings (a vocabulary size taken from the class default, keys of the
    file left unread, ...) held back while it reads a GGUF: the commands say in one line
    what they did; errors still show."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def cached_folder(path: str | os.PathLike[str]) -> Path:
    """The cache folder :func:`convert` writes the GGUF file ``path`` to: named by its stem
    and a hash of its absolute path, size (bytes) and modification time (ns), so that a file
    that changes gets a new entry."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{FORMAT_VERSION}\0{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return cache_root() / f"{p.stem}-{hashlib.sha256(key).hexdigest()[:16]}"


def gguf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The HF config (a dict, as ``config.json`` holds it) of the GGUF file ``path``: the
    converted folder's when :func:`convert` already wrote it, else transformers' reading of
    the metadata (no tensor is dequantized; its ``torch_dtype`` is float32, the dtype the
    weights are dequantized to). An unreadable file or an architecture transformers cannot
    map is a one-line :class:`InputError`."""
    p = Path(path)
    read_info(p)  # a missing or non-GGUF file: refused here
    done = cached_folder(p) / "config.json"
    if done.is_file():
        return dict(json.loads(done.read_text()))
    st = p.stat()
    return copy.deepcopy(_metadata_config(p.resolve(), st.st_size, st.st_mtime_ns))


@lru_cache(maxsize=4)
def _metadata_config(p: Path, size: int, mtime_ns: int) -> dict[str, Any]:
    """transformers' config of a GGUF file as a dict (remembered for the process: transformers
    parses every field again, about 10 s for SmolLM2-135M on a busy 2-core machine)."""
    cfg = _transformers_config(p, _read_info(p, size, mtime_ns))
    out = _clean(cfg.to_dict())
    out["torch_dtype"] = DTYPE
    out.pop("dtype", None)
    return out


def _write(path: Path, info: GGUFInfo, tmp: Path) -> None:
    """Load the GGUF ``path`` through transformers (dequantized to float32) and save it to
    the folder ``tmp`` as a plain checkpoint: its weights copied into a fresh model of the
    same class (transformers refuses to save a GGUF-loaded model), config without the
    ``quantization_config``, embeddings tied as the file has them."""
    _require_stack(weights=True)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {}
    gguf_config_cls = getattr(transformers, "GgufConfig", None)
    if gguf_config_cls is not None:  # transformers that can keep GGUF blocks packed: unpack
        kw["quantization_config"] = gguf_config_cls(dequantize=True)
    try:
        with _quiet_transformers():
            loaded = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32, **kw)
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise _refuse(path, info, exc) from None
    cfg_dict = _clean(loaded.config.to_dict())
    cfg = type(loaded.config).from_dict(cfg_dict)
    with torch.device("meta"):
        fresh = type(loaded)(cfg)
    state = loaded.state_dict()
    if cfg.tie_word_embeddings:
        # one tensor in the file (token_embd): the LM head is the embedding, as tie_weights
        # makes it again
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    fresh.load_state_dict(state, strict=False, assign=True)
    fresh.tie_weights()
    missing = [n for n, t in list(fresh.named_parameters()) + list(fresh.named_buffers())
               if t.is_meta and n in fresh.state_dict()]
    if missing:
        raise InputError(f"transformers left {len(missing)} tensors of its "
                         f"{type(loaded).__name__} unset (first: {missing[0]}); GGUF "
                         f"architecture {info.architecture!r} is not read whole",
                         path=str(path))
    fresh.save_pretrained(tmp, max_shard_size="5GB")
    # the folder as this package reads it: float32 (the dequantized weights), no file keys
    cfg_path = tmp / "config.json"
    written = _clean(json.loads(cfg_path.read_text()))
    written["torch_dtype"] = DTYPE
    written.pop("dtype", None)
    cfg_path.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    (tmp / "gguf-source.json").write_text(json.dumps({
        "gguf_file": str(path.resolve()), "size_bytes": info.size_bytes,
        "architecture": info.architecture, "quant": info.quant, "dtype": DTYPE,
        "tokenizer": _write_tokenizer(path, info, tmp),
        "transformers_version": transformers.__version__}, indent=2) + "\n")


def _write_tokenizer(path: Path, info: GGUFInfo, tmp: Path) -> str:
    """The GGUF's tokenizer saved beside the weights (``tokenizer.json`` ...), as a Hub folder
    has it (``build`` copies it into the child; ``score --tokenizer`` reads it), through
    transformers' GGUF tokenizer support; what was done, in words. A tokenizer transformers
    cannot rebuild is left out (the weights do not need it)."""
    if not info.has_tokenizer:
        return "none in the file"
    from importlib.util import find_spec

    if find_spec("tokenizers") is None:
        return "not written (the tokenizers package is not installed)"
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            tok.save_pretrained(tmp)
    except Exception as exc:  # any failure of the tokenizer leaves the weights usable
        return f"not written ({(str(exc).splitlines() or [exc.__class__.__name__])[0]})"
    return "written"


def convert(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """The GGUF file ``path`` as an HF checkpoint folder (``config.json`` + safetensors, float32),
    and whether it was converted now (False: an earlier conversion reused). The folder is
    :func:`cached_folder`; it is written to a temporary folder beside it and renamed into
    place, so an interrupted conversion leaves nothing that a later call would reuse, and two
    processes converting at once both end with the same complete folder.

    Memory: about twice the model in float32 (4 bytes per parameter): the loaded model and
    the file's tensors while they are dequantized (SmolLM2-135M, 0.54 GB in float32: a peak
    RSS of 1.2 GB, 35 s on a 2-core CPU). A missing or non-GGUF file, an architecture
    transformers cannot map, or one this package does not build is a one-line
    :class:`InputError`."""
    p = Path(path)
    info = read_info(p)
    final = cached_folder(p)
    if (final / "config.json").is_file():
        return final, False
    _arch(gguf_config(p), p, info)  # refused before any tensor is dequantized
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        _write(p, info, tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # as any folder the user makes (mkdtemp's is private)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not another process's conversion
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, True


def resolve_parent(path: str | None, role: str = "parent") -> str | None:
    """``path`` unchanged unless it names a ``.gguf`` file; then its converted folder
    (:func:`convert`), with one line on stderr that says what was done to the weights::

        parent m.gguf: GGUF (Q4_1) dequantized to float32 by transformers; converted once to DIR

    ``role`` names the argument in that line (``parent``, ``teacher``)."""
    if path is None or not is_gguf(path):
        return path
    info = read_info(path)
    folder, now = convert(path)
    how = "converted once to" if now else "converted once (reused) to"
    print(f"{role} {path}: GGUF ({info.quant}) dequantized to {DTYPE} by transformers; "
          f"{how} {folder}", file=sys.stderr)
    return str(folder)
