"""Byte units for printing. Code works in bytes; GB (10^9 bytes) and GiB (2^30 bytes)
appear only in what is shown to a person, and both are spelled out (shared/DESIGN.md)."""

from __future__ import annotations

GB = 1e9  # decimal gigabyte, bytes
GIB = 2**30  # binary gibibyte, bytes

__all__ = ["GB", "GIB", "gb_gib"]


def gb_gib(n: float, digits: int = 1) -> str:
    """``n`` bytes in both units, e.g. ``"85.5 GB (79.6 GiB)"`` (``digits`` decimals,
    thousands grouped)."""
    return f"{n / GB:,.{digits}f} GB ({n / GIB:,.{digits}f} GiB)"
