"""The prefix cache: the parent's activations at every block boundary, computed once.

For every batch of rows the parent runs once; the cache keeps its residual stream at each
block boundary ``0..L`` (``h[i]`` is block ``i``'s input, ``h[L]`` the last block's output)
and, for held-out batches, the parent's next-token distribution at every position that has
a next token: probabilities ``p`` (float64 softmax of its logits), their row sums, the
batch's ``sum p log p``, the parent's summed NLL of the actual next tokens and its top-1
tokens. Scoring block ``i`` then starts from ``h[i]`` and runs only blocks ``i..L-1``: no
position is recomputed through the unchanged prefix.

Memory is bounded: batches are kept in RAM until ``max_bytes`` is reached, and later ones
are written to ``spill_dir`` as safetensors files and read back tensor by tensor (memory
mapped). :attr:`PrefixCache.stats` says how much went where.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nas.modules.model import CausalLM


def _nbytes(ts: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts.values())


class PrefixCache:
    """Parent activations for a list of token batches (see the module docstring)."""

    def __init__(self, parent: CausalLM, batches: list[torch.Tensor], *, logits: bool,
                 max_bytes: float, spill_dir: Path | None, name: str = "cache"):
        self.num_blocks = len(parent.blocks)
        self.batches = batches
        self.mem: dict[int, dict[str, torch.Tensor]] = {}
        self.files: dict[int, Path] = {}
        self.spill_dir = spill_dir
        self.mem_bytes = 0
        self.disk_bytes = 0
        self.device = parent.embed.weight.device
        with torch.no_grad():
            for b, tokens in enumerate(batches):
                ts = self._run(parent, tokens.to(self.device), logits)
                size = _nbytes(ts)
                if self.mem_bytes + size <= max_bytes or spill_dir is None:
                    self.mem[b] = ts
                    self.mem_bytes += size
                else:
                    spill_dir.mkdir(parents=True, exist_ok=True)
                    f = spill_dir / f"{name}-{b}.safetensors"
                    save_file({k: v.cpu().contiguous() for k, v in ts.items()}, str(f))
                    self.files[b] = f
                    self.disk_bytes += size

    def _run(self, parent: CausalLM, tokens: torch.Tensor, logits: bool
             ) -> dict[str, torch.Tensor]:
        x = parent.embed_tokens(tokens)
        out = {"h0": x}
        for i, blk in enumerate(parent.blocks):
            x = blk(x)
            out[f"h{i + 1}"] = x
        if logits:
            h = parent.norm(x) if parent.norm is not None else x
            z = parent.logits(h)[:, :-1].double()
            lp = z.log_softmax(-1)
            p = lp.exp()
            out["p"] = p
            out["psum"] = p.sum(-1)
            out["neg_entropy"] = (p * lp).sum().reshape(1)
            out["nll"] = -lp.gather(-1, tokens[:, 1:, None]).sum().reshape(1)
            out["top1"] = z.argmax(-1)
        return out

    def get(self, b: int, name: str) -> torch.Tensor:
        """Tensor ``name`` (``h<i>``, ``p``, ``psum``, ``neg_entropy``, ``nll``, ``top1``) of
        batch ``b``."""
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
