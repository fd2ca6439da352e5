"""The processes that hold a model give large freed buffers back to the system
(nas.launch.unpool_large_allocations)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import sys, numpy as np
from nas.launch import unpool_large_allocations
ok = unpool_large_allocations() if sys.argv[1] == "on" else None
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status")
                if l.startswith("RssAnon")) // 1024
base = anon()
keep = []
for i in range(6):
    a = np.ones(3 << 20)  # 24 MiB, touched, then freed
    keep += [np.ones(100) for _ in range(200)]  # small blocks allocated after it
    del a
print(ok, anon() - base)
"""


def _retained(mode: str) -> tuple[str, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_freed_large_buffers_go_back_to_the_system():
    ok, kept = _retained("on")
    if ok != "True":
        pytest.skip("not glibc: mallopt is not there")
    # 6 x 24 MiB were allocated and freed; 1,200 small arrays (about 1 MiB) are still held;
    # left to its default, glibc keeps about 24 MiB of the freed ones here
    assert kept < 6, f"{kept} MiB kept after freeing 6 x 24 MiB"


def test_the_commands_that_hold_a_model_set_it():
    """score, distill and iterate (and every rank) set it; planning commands do not."""
    from nas.cli import COMMANDS
    from nas.launch import HOLDS_A_MODEL

    assert set(HOLDS_A_MODEL) <= set(COMMANDS)
    assert "search" not in HOLDS_A_MODEL and "cost" not in HOLDS_A_MODEL
