"""Token-data files: the one reader behind ``score --data``, ``distill --data`` /
``--eval-data``, ``iterate --data`` and ``build --calib`` (numpy only; torch not needed).

Formats, by extension:

* ``.npy``: an integer array, 1-D (a token stream) or 2-D ``(rows, length)``; read with
  ``allow_pickle=False``.
* ``.bin``: raw little-endian ids; ``--bin-dtype uint16`` or ``uint32`` is required, because
  the file does not record its width.
* ``.safetensors``: one integer tensor (the one named ``tokens`` or ``input_ids`` when the
  file holds several), 1-D or 2-D.
* ``.json``: a list of ids, a list of equal-length lists, or ``{"tokens": ...}`` of either.
* anything else: UTF-8 text, tokenized with ``--tokenizer``: an HF ``tokenizer.json`` (read
  with the ``tokenizers`` package; nothing comes from a hub), or the word ``bytes`` for
  byte-level ids (each UTF-8 byte is one id in ``[0, 256)``; only meaningful for a
  byte-vocabulary model).

A file is never read as another format than its extension says, and text is never
tokenized without ``--tokenizer``: a ``.npy`` read as bytes would turn its header into ids.

A checkpoint folder's tokenizer (:data:`TOKENIZER_FILES`) travels with the models made
from it: ``build`` copies the parent's into the child, ``distill`` the student's (else the
teacher's) into ``model/`` (:func:`copy_tokenizer`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hwprofiles.errors import InputError, require_file

BIN_DTYPES = ("uint16", "uint32")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
"""``--dtype`` of the commands that load a parent (default: the checkpoint's non-quantized
dtype, quantized weights dequantized into it)."""
BYTES = "bytes"
"""``--tokenizer bytes``: each UTF-8 byte of a text file is one token id."""
_NAMES = ("tokens", "input_ids")


def add_token_flags(p: argparse.ArgumentParser) -> None:
    """The reader's two flags, spelled and explained the same in every command."""
    p.add_argument("--tokenizer", metavar="TOKENIZER_JSON|bytes",
                   help="how to tokenize a text data file: an HF tokenizer.json, or 'bytes' "
                   "(each UTF-8 byte one id); not needed for .npy/.bin/.safetensors/.json ids")
    p.add_argument("--bin-dtype", choices=BIN_DTYPES, help="width of .bin token ids")


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the one compute dtype of every model a command loads."""
    p.add_argument("--dtype", choices=COMPUTE_DTYPES, default=None,
                   help="compute dtype of the parent and every model loaded (default: the "
                   "checkpoint's non-quantized dtype; quantized weights are dequantized "
                   "into it)")


def lr_list(text: str) -> tuple[float, ...]:
    """``--lr-sweep 1e-4,3e-4,1e-3``: an argparse type (comma-separated positive numbers)."""
    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated learning rates, got "
                                         f"{text!r}") from None
    if not out or any(not (x > 0 and x < float("inf")) for x in out):
        raise argparse.ArgumentTypeError(f"expected positive learning rates, got {text!r}")
    return out


def _ints(arr: np.ndarray, path: Path, what: str) -> np.ndarray:
    if arr.dtype.kind not in "iu":
        raise InputError(f"expected integer token ids, found dtype {arr.dtype}", path=str(path))
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise InputError(f"expected {what} as a non-empty 1-D stream or 2-D (rows, length) "
                         f"array, found shape {list(arr.shape)}", path=str(path))
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InputError("token id above 2**63 - 1", path=str(path))
    return arr.astype(np.int64)


def _json(path: Path) -> np.ndarray:
    from hwprofiles.errors import read_json

    data = read_json(path)
    if isinstance(data, dict):
        data = data.get("tokens")

    def is_id(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(data, list) and data and all(is_id(v) for v in data):
        return np.asarray(data, dtype=np.int64)
    if isinstance(data, list) and data and all(
            isinstance(r, list) and r and all(is_id(v) for v in r) for r in data) \
            and len({len(r) for r in data}) == 1:
        return np.asarray(data, dtype=np.int64)
    raise InputError("expected a list of token ids, a list of equal-length lists of ids, or "
                     "{\"tokens\": ...} of either", path=str(path))


def _safetensors(path: Path, what: str) -> np.ndarray:
    try:
        from safetensors import safe_open
    except ImportError:
        raise InputError("reading .safetensors token ids needs the 'safetensors' package; or "
                         "give them as .npy", path=str(path)) from None
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = list(f.keys())
            name = next((k for k in _NAMES if k in keys), keys[0] if len(keys) == 1 else None)
            if name is None:
                raise InputError(f"expected one tensor, or one named tokens / input_ids; found "
                                 f"{keys}", path=str(path))
            arr = f.get_tensor(name)
    except InputError:
        raise
    except Exception as exc:  # SafetensorError, or a dtype numpy has no type for (bf16)
        raise InputError(f"not a readable safetensors file of token ids: {exc}",
                         path=str(path)) from None
    return _ints(arr, path, what)


def _text(path: Path, tokenizer: str | Path | None) -> np.ndarray:
    if tokenizer is None:
        raise InputError("a text data file needs --tokenizer (a tokenizer.json, or 'bytes' "
                         "for byte-level ids), or give token ids as .npy / .bin / "
                         ".safetensors / .json", path=str(path))
    raw = path.read_bytes()
    if not raw:
        raise InputError("empty text file", path=str(path))
    if str(tokenizer) == BYTES:
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    tok_path = require_file(tokenizer)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("reading text needs the 'tokenizers' package (pip install "
                         "'puzzle-nas[text]'), or give token ids as .npy / .bin") from None
    try:
        tok = Tokenizer.from_file(str(tok_path))
    except Exception as exc:
        raise InputError(f"not a valid tokenizer.json ({exc})", path=str(tok_path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text (token ids go in .npy, .bin, .safetensors or .json)",
                         path=str(path)) from None
    return np.asarray(tok.encode(text).ids, dtype=np.int64)


def read_tokens(path: str | Path, tokenizer: str | Path | None = None,
                bin_dtype: str | None = None, what: str = "token ids") -> np.ndarray:
    """The token ids of a data file (formats in the module docstring) as int64: 1-D for a
    stream, 2-D ``(rows, length)`` for a file that holds rows. Raises :class:`InputError`
    naming the file (or the flag it needs) for anything else."""
    path = require_file(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # ValueError for object arrays, OSError for junk
            raise InputError(f"not a readable .npy array ({exc})", path=str(path)) from None
        return _ints(arr, path, what)
    if suffix == ".bin":
        if bin_dtype not in BIN_DTYPES:
            raise InputError("a .bin token file needs --bin-dtype uint16 or uint32 (the file "
                             "does not record its width)", path=str(path))
        size = path.stat().st_size
        width = np.dtype(bin_dtype).itemsize
        if size % width or size == 0:
            raise InputError(f"size {size} bytes is not a positive multiple of {width} "
                             f"({bin_dtype})", path=str(path))
        return np.fromfile(path, dtype=np.dtype(bin_dtype).newbyteorder("<")).astype(np.int64)
    if suffix == ".safetensors":
        return _safetensors(path, what)
    if suffix == ".json":
        return _json(path)
    return _text(path, tokenizer)


def token_stream(path: str | Path, tokenizer: str | Path | None = None,
                 bin_dtype: str | None = None) -> np.ndarray:
    """:func:`read_tokens` as one flat stream (rows joined in order)."""
    return read_tokens(path, tokenizer, bin_dtype).reshape(-1)


def token_rows(path: str | Path, length: int, tokenizer: str | Path | None = None,
               bin_dtype: str | None = None) -> np.ndarray:
    """:func:`read_tokens` as rows: a 2-D file as it is; a stream cut into rows of
    ``length`` ids (the remainder dropped; a stream shorter than ``length`` is one row)."""
    if length < 1:
        raise InputError(f"row length must be >= 1 (got {length})")
    arr = read_tokens(path, tokenizer, bin_dtype)
    if arr.ndim == 2:
        return arr
    if len(arr) <= length:
        return arr[None, :]
    n = len(arr) // length
    return arr[: n * length].reshape(n, length)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "generation_config.json", "chat_template.jinja")
"""The files of an HF tokenizer (and the generation defaults) a checkpoint folder may hold
beside its weights; a child or a distilled model gets a copy of those its source has."""


def tokenizer_files(folder: str | Path) -> list[Path]:
    """The :data:`TOKENIZER_FILES` that checkpoint folder ``folder`` holds (regular files;
    none when ``folder`` is not a folder)."""
    folder = Path(folder)
    return [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]


def copy_tokenizer(sources: Iterable[str | Path], dest: str | Path) -> list[str]:
    """Copy the tokenizer files of the first folder of ``sources`` that holds any
    (:func:`tokenizer_files`) into folder ``dest`` (a staged checkpoint, before its swap);
    the names copied (none when no source has a tokenizer)."""
    import shutil

    for src in sources:
        files = tokenizer_files(src)
        if files:
            for f in files:
                shutil.copyfile(f, Path(dest) / f.name)
            return [f.name for f in files]
    return []


__all__ = ["BIN_DTYPES", "BYTES", "COMPUTE_DTYPES", "TOKENIZER_FILES", "add_dtype_flag",
           "add_token_flags", "copy_tokenizer", "read_tokens", "token_rows", "token_stream",
           "tokenizer_files"]
