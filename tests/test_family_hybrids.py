"""Mamba hybrids under other config dialects (``nas.hf.hybrids``).

``granitemoehybrid`` (IBM Granite-4.0-H): imports, exports, counts, prices and searches; its
torch model is refused (Granite's embedding / residual / logits multipliers, attention scale
and fused expert tensors are not computed here). (``falcon_h1``,
parallel attention + Mamba within a layer: ``tests/test_family_falcon_h1.py``; ``jamba``:
``tests/test_family_jamba.py``).

Granite-4.0-H-Small (https://huggingface.co/ibm-granite/granite-4.0-h-small, model card and
IBM's Granite 4.0 announcement: "32B total parameters, 9B active"). The sizes in
``tests/data/configs/granite-4.0-h-small.json`` (hidden 4096, 40 layers: 36 Mamba-2 + 4
attention, 32 heads / 8 KV, 72 experts top-10 of width 768, shared MLP 1536, Mamba 128 heads
x 64, state 128, vocabulary 100,352, tied embeddings) are the Hub config's; the order of the
4 attention layers and the multipliers do not change any count. Computed: total
32,207,337,984 = 32B; active 8,803,121,664 = 9B (10 of 72 experts, the shared MLP and every
mixer, with the tied embedding / LM head counted once).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import search_example

from hwprofiles.errors import InputError
from nas.arch import Mamba, MoE, NoOp
from nas.hf import from_hf, load_config, to_hf

GRANITE = Path(__file__).parent / "data" / "configs" / "granite-4.0-h-small.json"


def test_granite_counts_memory_and_round_trip():
    arch = load_config(GRANITE)
    assert arch.kind_counts() == {"mamba": 36, "attention": 4, "moe": 40}
    pc = arch.param_counts()
    assert pc.total == 32_207_337_984 and round(pc.total / 1e9) == 32
    assert pc.active == 8_803_121_664 and round(pc.active / 1e9) == 9
    att = arch.blocks[10]
    assert not att.rope and att.num_kv_heads == 8  # position_embedding_type "nope"
    assert arch.kv_bytes_per_token("bf16") == 4 * 2 * 8 * 128 * 2  # 16,384
    mamba = arch.blocks[0]
    assert isinstance(mamba, Mamba) and (mamba.num_heads, mamba.head_dim) == (128, 64)
    moe = arch.blocks[1]
    assert isinstance(moe, MoE) and not moe.shared_gate and moe.shared_width == 1536
    cfg = to_hf(arch)
    assert cfg["model_type"] == "granitemoehybrid" and cfg["embedding_multiplier"] == 12
    assert from_hf(json.loads(json.dumps(cfg))) == arch


def test_granite_child_round_trip_and_pricing():
    import hwprofiles
    from costmodels.dtypes import get_recipe
    from costmodels.model import NonBlockShape, price_model

    arch = load_config(GRANITE)
    blocks = list(arch.blocks)
    blocks[0] = blocks[0].model_copy(update={"num_heads": 96})
    blocks[1] = blocks[1].model_copy(update={"num_experts": 48, "top_k": 6})
    blocks[2] = NoOp()
    child = arch.replace_blocks(blocks)
    cfg = to_hf(child)
    assert cfg["model_type"] == "granitemoehybrid" and len(cfg["puzzle_layers"]) == 40
    assert from_hf(json.loads(json.dumps(cfg))) == child
    hw = hwprofiles.get("h100-sxm")
    wl = ["isl=8192,osl=1024,concurrency=16"]
    p = price_model(arch.table, NonBlockShape(arch.hidden_size, arch.vocab_size), hw,
                    get_recipe("fp8"), wl)
    c = price_model(child.table, NonBlockShape(arch.hidden_size, arch.vocab_size), hw,
                    get_recipe("fp8"), wl)
    assert float(c.tpot_s[0]) < float(p.tpot_s[0])


def test_granite_torch_build_is_refused_with_the_reason():
    torch = pytest.importorskip("torch")  # noqa: F841
    from nas.build import build_model

    with pytest.raises(InputError, match="multipliers"):
        build_model(load_config(GRANITE))


def test_refused_families_say_why(monkeypatch):
    """A type in REFUSED_TYPES is refused at import with its reason (none is refused today:
    falcon_h1 imports, tests/test_family_falcon_h1.py; jamba too)."""
    from nas.hf import REFUSED_TYPES

    monkeypatch.setitem(REFUSED_TYPES, "some_hybrid", "some_hybrid runs its mixers in a way "
                        "this library does not compute")
    with pytest.raises(InputError, match="does not compute") as exc:
        from_hf({"model_type": "some_hybrid", "hidden_size": 64, "vocab_size": 128},
                source="cfg.json")
    assert "cfg.json" in str(exc.value)


@pytest.mark.parametrize("name,parent_total", [("granite-4.0-h-small-h100", 32_207_337_984),
                                               ("qwen3.5-35b-a3b-h100", 34_660_610_688)])
def test_shipped_example_searches_run(name, parent_total, tmp_path):
    """The shipped examples search (prior scores): every budget holds, the child's config
    reads back with the counts the blueprint states."""
    bp = search_example(name, tmp_path, sweep=True)
    assert bp["params"]["parent_total"] == parent_total
    assert from_hf(bp["child"]).param_counts().total == bp["params"]["child_total"] \
        < parent_total
