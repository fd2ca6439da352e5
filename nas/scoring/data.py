"""Evaluation tokens for scoring, read by :mod:`nas.tokens` (``.npy``, ``.bin``,
``.safetensors``, ``.json``, or text with ``--tokenizer``).

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

from hwprofiles.errors import InputError
from nas.tokens import BIN_DTYPES, token_stream

__all__ = ["BIN_DTYPES", "Split", "load_tokens", "split_tokens"]


def load_tokens(path: str | Path, tokenizer: str | Path | None = None,
                bin_dtype: str | None = None) -> np.ndarray:
    """The token ids of a data file as a flat int64 array: :func:`nas.tokens.token_stream`
    (the formats every command reads: ``.npy``, ``.bin``, ``.safetensors``, ``.json``, or
    text with a tokenizer)."""
    return token_stream(path, tokenizer, bin_dtype)


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

    The held-out split takes the last ``ceil(max_tokens / seq_len)`` rows, the calibration
    split the first ``ceil(calib_tokens / seq_len)`` rows; data with fewer rows than the two
    together is refused (:class:`InputError`), never silently scored on less.
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
    want_held, want_calib = math.ceil(max_tokens / seq_len), math.ceil(calib_tokens / seq_len)
    if n < want_held + want_calib:  # shrinking a split would score on less than asked
        raise InputError(
            f"holds {len(tokens):,} tokens = {n:,} rows of --seq-len {seq_len}; --max-tokens "
            f"{max_tokens:,} held out ({want_held:,} rows) and --calib-tokens {calib_tokens:,} "
            f"({want_calib:,} rows) need {want_held + want_calib:,} rows "
            f"({(want_held + want_calib) * seq_len:,} tokens): lower them or give more data",
            path=source)
    rows = tokens[: n * seq_len].reshape(n, seq_len)
    n_held, n_calib = want_held, want_calib
    return Split(rows[:n_calib].copy(), rows[n - n_held:].copy(), source)
