"""Evaluation tokens for scoring: ``.npy``, ``.bin`` (raw uint16 / uint32), or text plus an HF
``tokenizer.json`` (read with the ``tokenizers`` package; nothing comes from a hub).

The flat token stream is cut into non-overlapping rows of ``seq_len`` tokens (the
remainder is dropped). The first rows are the *calibration / training* split (parent
activations there initialize each alternative and train it by BLD); the last rows are the
*held-out* split every score is measured on. The two never overlap.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hwprofiles.errors import InputError, require_file

BIN_DTYPES = ("uint16", "uint32")


def load_tokens(path: str | Path, tokenizer: str | Path | None = None,
                bin_dtype: str | None = None) -> np.ndarray:
    """The token ids of a data file as a flat int64 array.

    * ``.npy``: an integer array (any shape; flattened). Loaded with ``allow_pickle=False``.
    * ``.bin``: raw little-endian ids; ``bin_dtype`` (``uint16`` or ``uint32``) is required
      because the file does not say which it holds.
    * anything else: UTF-8 text, tokenized with ``tokenizer`` (an HF ``tokenizer.json``).
    """
    path = require_file(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # ValueError for object arrays, OSError for junk
            raise InputError(f"not a readable .npy array ({exc})", path=str(path)) from None
        if arr.dtype.kind not in "iu":
            raise InputError(f"expected integer token ids, found dtype {arr.dtype}",
                             path=str(path))
        return arr.reshape(-1).astype(np.int64)
    if suffix == ".bin":
        if bin_dtype not in BIN_DTYPES:
            raise InputError("a .bin token file needs --bin-dtype uint16 or uint32 (the file "
                             "does not record its width)", path=str(path))
        size = path.stat().st_size
        width = np.dtype(bin_dtype).itemsize
        if size % width:
            raise InputError(f"size {size} bytes is not a multiple of {width} ({bin_dtype})",
                             path=str(path))
        return np.fromfile(path, dtype=np.dtype(bin_dtype).newbyteorder("<")).astype(np.int64)
    if tokenizer is None:
        raise InputError("text data needs --tokenizer tokenizer.json (or give token ids as "
                         ".npy / .bin)", path=str(path))
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
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text (token ids go in .npy or .bin)",
                         path=str(path)) from None
    return np.asarray(tok.encode(text).ids, dtype=np.int64)


@dataclass(frozen=True)
class Split:
    """Token rows ``(n, seq_len)``: ``calib`` initializes and trains, ``held`` is scored."""

    calib: np.ndarray
    held: np.ndarray
    source: str

    @property
    def digest(self) -> str:
        """SHA-256 of both splits (shape and ids): part of every result's key."""
        h = hashlib.sha256()
        for a in (self.calib, self.held):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return h.hexdigest()


def split_tokens(tokens: np.ndarray, vocab_size: int, seq_len: int, max_tokens: int,
                 calib_tokens: int, source: str = "data") -> Split:
    """Cut ``tokens`` into rows and split them (see the module docstring).

    The held-out split takes the last ``ceil(max_tokens / seq_len)`` rows (at most what is
    left after one calibration row); the calibration split the first
    ``ceil(calib_tokens / seq_len)`` rows (at most the rows not held out).
    """
    if seq_len < 2:
        raise InputError(f"--seq-len must be >= 2 (got {seq_len})")
    if max_tokens < 1 or calib_tokens < 1:
        raise InputError("--max-tokens and --calib-tokens must be >= 1")
    n = len(tokens) // seq_len
    if n < 1:
        raise InputError(f"holds {len(tokens)} tokens, shorter than one sequence of --seq-len "
                         f"{seq_len}", path=source)
    if n < 2:
        raise InputError(f"holds {len(tokens)} tokens = 1 sequence of {seq_len}; scoring needs "
                         "2 (one to initialize the alternatives from, one held out)",
                         path=source)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        bad = int(np.flatnonzero((tokens < 0) | (tokens >= vocab_size))[0])
        raise InputError(f"token id {int(tokens[bad])} at position {bad} is outside the "
                         f"parent's vocabulary [0, {vocab_size})", path=source)
    rows = tokens[: n * seq_len].reshape(n, seq_len)
    n_held = min(math.ceil(max_tokens / seq_len), n - 1)
    n_calib = min(math.ceil(calib_tokens / seq_len), n - n_held)
    return Split(rows[:n_calib].copy(), rows[n - n_held:].copy(), source)
