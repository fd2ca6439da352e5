"""Build memory: peak RSS of building a child against its size, new way vs the old way.

Run: ``pytest benchmarks/bench_build.py --benchmark-only -s``. Each variant runs in its own
subprocess (its peak resident set, ``VmHWM``, reset just before the build, so imports do
not count) on a Llama-shaped model of ~0.5 B parameters (hidden 1024, 16 layers, vocab
32,000):

* ``random``: :func:`nas.child.build_model` in bfloat16 (meta device, block by block)
  vs the baseline ``CausalLM(arch)`` in float32 + ``reset_parameters`` + ``.to(bfloat16)``
  (what the builder did before);
* ``from-parent``: :func:`nas.child.init_from_parent` streaming a float32 parent checkpoint
  into a bfloat16 child vs the baseline ``load_pretrained`` + ``init_from_parent`` in
  memory + ``.to(bfloat16)``.

Both variants also save the child (sharded at 200 MB). Printed: peak RSS in MiB, the
child's size in bfloat16 and the ratio baseline / new; the benchmark timer measures the new
way's wall time (median over rounds) for the record.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from nas.arch import FFN, Attention, ModelArch  # noqa: E402
from nas.child import build_model, save_pretrained  # noqa: E402
from nas.hf import to_hf  # noqa: E402

PARENT = ModelArch(hidden_size=1024, vocab_size=32000, model_type="llama", blocks=(
    Attention(num_heads=16, num_kv_heads=8, head_dim=64), FFN(width=4096)) * 16)
CHILD = ModelArch.model_validate({**{k: getattr(PARENT, k) for k in ModelArch.model_fields},
                                  "blocks": (Attention(num_heads=16, num_kv_heads=2,
                                                       head_dim=64), FFN(width=2048)) * 16})

SCRIPT = r"""
import json, re, sys, torch
torch.set_num_threads(1)
from nas.child import build_model, init_from_parent, load_pretrained, save_pretrained
from nas.hf import from_hf
from nas.modules.model import CausalLM

def rss(f):
    return int(re.search(f + r":\s+(\d+) kB", open("/proc/self/status").read())[1]) * 1024

child, how, parent, out = from_hf(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
tokens = torch.randint(0, 32000, (4, 128), generator=torch.Generator().manual_seed(0))
build_model(child.replace_blocks(child.blocks[:2]))  # warm up torch's lazy imports
open("/proc/self/clear_refs", "w").write("5")
base = rss("VmRSS")
if how == "random-new":
    m = build_model(child, dtype=torch.bfloat16)
elif how == "random-old":
    m = CausalLM(child); m.reset_parameters(); m = m.to(torch.bfloat16)
elif how == "parent-new":
    m = init_from_parent(child, parent, tokens, dtype=torch.bfloat16)
else:
    m = init_from_parent(child, load_pretrained(parent), tokens).to(torch.bfloat16)
save_pretrained(m, out, max_shard_bytes=200_000_000)
print(rss("VmHWM") - base)
"""


def _peak(how: str, parent: str, out: str) -> int:
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(to_hf(CHILD)), how, parent,
                        out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.split()[-1])


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory):
    return str(save_pretrained(build_model(PARENT), tmp_path_factory.mktemp("p") / "parent"))


@pytest.mark.benchmark(timer=time.perf_counter, min_rounds=1, max_time=1)
@pytest.mark.parametrize("case", ["random", "parent"])
def test_build_peak_rss_vs_child_size(benchmark, case, parent_dir, tmp_path):
    mib = 2**20
    child = CHILD.param_counts().total * 2
    old = _peak(f"{case}-old", parent_dir, str(tmp_path / "old"))
    new = benchmark.pedantic(_peak, args=(f"{case}-new", parent_dir, str(tmp_path / "new")),
                             rounds=1, iterations=1)
    print(f"\n{case}: child {child / mib:.0f} MiB (bf16); peak RSS new {new / mib:.0f} MiB "
          f"({new / child:.2f}x child), old {old / mib:.0f} MiB ({old / child:.2f}x child); "
          f"old/new {old / new:.2f}x")
    assert new < old
