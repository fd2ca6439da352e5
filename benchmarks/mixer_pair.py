"""Side-by-side timing of one of our recurrent mixers against transformers' torch path.

Shared by ``bench_deltanet.py`` and ``bench_mamba1.py``: given a factory returning
``(hf_module, our_module, hf_config)`` with the same weights, :func:`run_case` times a
phase (``prefill-BxN``: one forward over ``B x N`` tokens; ``decode-B@N``: one token through
each side's cache after an ``N``-token prompt), running both sides back to back each round
and alternating which goes first, after asserting equal prefill outputs (max |difference|
<= 1e-4). Rows give medians (seconds) and ``speedup = HF / ours`` (> 1: ours faster).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
PHASES = {"prefill-1x1024": (1, 1024), "prefill-4x1024": (4, 1024), "decode-4@512": (4, 512)}


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@torch.no_grad()
@torch.no_grad()
def copy_random(hf: torch.nn.Module, ours: torch.nn.Module) -> None:
    """Give transformers' module random weights of a sane scale (matrices ~1/sqrt(fan-in),
    vectors 0.5) and load the same into ours."""
    for p in hf.parameters():
        p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.5))
    ours.load_state_dict(hf.state_dict())


def run_case(pair: Callable[[], tuple], hidden: int, phase: str) -> dict:
    """Time ``phase`` on the modules ``pair()`` returns; see the module docstring."""
    from transformers import DynamicCache

    hf, ours, cfg = pair()
    b, n = PHASES[phase]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, n, hidden, generator=g)
    if phase.startswith("prefill"):
        def run_hf():
            return hf(x)

        def run_ours():
            return ours(x)
    else:
        step = torch.randn(b, 1, hidden, generator=g)
        hf_cache = DynamicCache(config=cfg)
        hf(x, cache=hf_cache)
        our_cache: dict = {}
        ours(x, our_cache)
        saved = {k: v.clone() for k, v in our_cache.items()}

        def run_hf():
            return hf(step, cache=hf_cache)

        def run_ours():
            our_cache.update({k: v.clone() for k, v in saved.items()})
            return ours(step, our_cache)
    diff = float((run_hf() - run_ours()).abs().max()) if phase.startswith("prefill") else None
    if diff is not None:
        assert diff <= 1e-4, diff
    t_hf, t_ours = [], []
    for r in range(ROUNDS):
        first, second = (run_hf, run_ours) if r % 2 else (run_ours, run_hf)
        a, c = _timed(first), _timed(second)
        (t_hf if first is run_hf else t_ours).append(a)
        (t_ours if first is run_hf else t_hf).append(c)
    row = {"phase": phase, "hf_s": statistics.median(t_hf), "ours_s": statistics.median(t_ours),
           "max_abs_diff": diff}
    row["speedup"] = row["hf_s"] / row["ours_s"]
    return row


def threads_fixture(name: str, results: list[dict]):
    """A generator for a module-scoped autouse fixture: ``BENCH_THREADS`` [1] torch threads,
    then one printed line per row of ``results``."""
    old = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(old)
    for r in results:
        print(f"\n[{name}] {r['phase']}: ours {1e3 * r['ours_s']:.1f} ms, HF "
              f"{1e3 * r['hf_s']:.1f} ms, HF/ours {r['speedup']:.2f}x")
