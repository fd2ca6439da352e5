"""The prefix cache: the parent's residual stream at block boundaries, computed once.

For every batch of rows the parent runs once; the cache keeps its residual stream at the
block boundaries asked for (``h[i]`` is block ``i``'s input, ``h[L]`` the last block's
output, default: every boundary ``0..L``). Scoring block ``i`` then starts from ``h[i]``
and runs only blocks ``i..L-1``: no position is recomputed through the unchanged prefix.

The parent's next-token distribution is not kept: ``h[L]`` is the teacher target, and
its log-probabilities are recomputed from it chunk by chunk over positions when a score
is summed (:func:`nas.scoring.core.kl_sums`), so the cache holds ``hidden_size`` values
per token and boundary instead of a float64 probability per vocabulary entry (1 MiB per
token at a 128k vocabulary).

Memory is bounded: batches are kept in RAM until ``max_bytes`` is reached, and later ones
are written to ``spill_dir`` as safetensors files and read back tensor by tensor.
:attr:`PrefixCache.stats` says how much went where. A pipeline stage of a sharded parent
(:mod:`nas.scoring.pipeline`) fills one with :meth:`PrefixCache.add`, boundary by
boundary of its own blocks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nas.modules.model import CausalLM


def _nbytes(ts: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


class PrefixCache:
    """Parent activations for a list of token batches (see the module docstring).

    With ``parent`` the cache runs it on every batch and keeps the boundaries ``keep``
    (default all); with ``parent=None`` it starts empty and :meth:`add` fills it."""

    def __init__(self, parent: CausalLM | None, batches: list[torch.Tensor], *,
                 max_bytes: float, spill_dir: Path | None, name: str = "cache",
                 keep: set[int] | None = None, device: torch.device | None = None):
        self.batches = batches
        self.mem: dict[int, dict[str, torch.Tensor]] = {}
        self.files: dict[int, Path] = {}
        self.spill_dir = spill_dir
        self.max_bytes = max_bytes
        self.name = name
        self.mem_bytes = 0
        self.disk_bytes = 0
        self.device = device if parent is None else parent.embed.weight.device
        if parent is None:
            return
        self.num_blocks = len(parent.blocks)
        with torch.no_grad():
            for b, tokens in enumerate(batches):
                x = parent.embed_tokens(tokens.to(self.device))
                out = {"h0": x} if keep is None or 0 in keep else {}
                for i, blk in enumerate(parent.blocks):
                    x = blk(x)
                    if keep is None or i + 1 in keep:
                        out[f"h{i + 1}"] = x
                self.add(b, out)

    def add(self, b: int, ts: dict[str, torch.Tensor]) -> None:
        """Keep tensors ``ts`` of batch ``b`` (in memory while ``max_bytes`` allows, else on
        disk). Adding to a batch that is on disk rewrites its file with both."""
        if b in self.files:
            with safe_open(str(self.files[b]), framework="pt") as f:
                old = {k: f.get_tensor(k) for k in f.keys()}
            self.disk_bytes -= _nbytes(old)
            ts = {**old, **ts}
            del self.files[b]
        elif b in self.mem:
            self.mem_bytes -= _nbytes(self.mem[b])
            ts = {**self.mem.pop(b), **ts}
        size = _nbytes(ts)
        if self.mem_bytes + size <= self.max_bytes or self.spill_dir is None:
            self.mem[b] = ts
            self.mem_bytes += size
            return
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        f = self.spill_dir / f"{self.name}-{b}.safetensors"
        save_file({k: v.cpu().contiguous() for k, v in ts.items()}, str(f))
        self.files[b] = f
        self.disk_bytes += size

    def get(self, b: int, name: str) -> torch.Tensor:
        """Tensor ``name`` (``h<i>``) of batch ``b``."""
        if b in self.mem:
            return self.mem[b][name]
        with safe_open(str(self.files[b]), framework="pt") as f:
            # a fresh (aligned) copy: vectorized sums then add in the same order as in memory
            return f.get_tensor(name).to(self.device).clone()

    def hidden(self, b: int, i: int) -> torch.Tensor:
        """The parent's residual stream entering block ``i`` (``i = L``: after the last)."""
        return self.get(b, f"h{i}")

    def all_hidden(self, i: int) -> torch.Tensor:
        """Boundary ``i`` of every batch, concatenated along the batch dimension."""
        return torch.cat([self.hidden(b, i) for b in range(len(self.batches))])

    def tensor_bytes(self, name: str) -> int:
        """Bytes kept of tensor ``name`` (``h<i>``) over every batch, in memory and spilled
        (a spilled tensor's size is read from its file's header, the tensor is not loaded)."""
        n = sum(_nbytes({name: ts[name]}) for ts in self.mem.values() if name in ts)
        for f in self.files.values():
            with open(f, "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
            if name in header:
                a, b = header[name]["data_offsets"]
                n += b - a
        return n

    @property
    def stats(self) -> dict[str, float]:
        return {"memory_bytes": float(self.mem_bytes), "disk_bytes": float(self.disk_bytes),
                "batches_in_memory": len(self.mem), "batches_on_disk": len(self.files)}

    def close(self) -> None:
        """Drop the spilled files."""
        for f in self.files.values():
            f.unlink(missing_ok=True)
        if self.spill_dir is not None and self.spill_dir.exists() and \
                not any(self.spill_dir.iterdir()):
            shutil.rmtree(self.spill_dir, ignore_errors=True)
