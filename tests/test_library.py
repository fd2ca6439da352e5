"""BlockLibrary: validation, JSON/npz round trips, the NVlabs/puzzle importer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from library_generators import synthetic_library

from hwprofiles.errors import InputError
from nas.library import BlockLibrary, from_puzzle


def small(**kw) -> BlockLibrary:
    args = dict(num_blocks=2, start=[0, 0, 1, 0], end=[1, 1, 2, 2],
                costs={"mem": [2.0, 1.0, 2.0, 0.5]}, scores={"kl": [0.0, 0.3, 0.0, 2.0]})
    args.update(kw)
    return BlockLibrary(**args, labels=["a", "b", "c", "pair"],
                        tags=[["attn"], ["attn"], ["ffn"], []],
                        children=[[{"kind": "attention"}], None, None, []],
                        constants={"mem": 1.5}, block_names=["L0", "L1"])


def test_basics_and_totals():
    lib = small()
    assert lib.num_replacements == 4
    assert lib.lengths.tolist() == [1, 1, 1, 2]
    assert lib.keys() == ["mem", "kl"]
    assert lib.totals([1, 2]) == {"mem": 1.0 + 2.0 + 1.5, "kl": 0.3}
    assert lib.tagged("attn").tolist() == [True, True, False, False]
    assert lib.kind("kl") == "score"
    with pytest.raises(InputError, match="unknown key 'x'"):
        lib.values("x")


@pytest.mark.parametrize("kw, match", [
    (dict(start=[0, 0, 1, 0], end=[1, 1, 3, 2]), r"replacement 2 \('c'\): span \[1, 3\) is outside"),
    (dict(start=[0, 0, 1, 1], end=[1, 1, 2, 1]), r"span \[1, 1\) is empty"),
    (dict(start=[0, 0, 0, 0], end=[1, 1, 1, 1]), "L1 is covered by no replacement"),
    (dict(costs={"mem": [2.0, np.nan, 2.0, 0.5]}), r"replacement 1 \('b'\): cost 'mem' is nan"),
    (dict(costs={"mem": [2.0, 1.0, np.inf, 0.5]}), "cost 'mem' is inf"),
    (dict(costs={"mem": [2.0, 1.0]}), "'mem' has 2 values, expected one per replacement"),
    (dict(scores={"mem": [0, 0, 0, 0]}), "both a cost and a score"),
])
def test_validation_errors_are_one_line(kw, match):
    with pytest.raises(InputError, match=match) as ei:
        small(**kw)
    assert "\n" not in str(ei.value)


def test_unreachable_block_is_reported():
    # block 1 only reachable through [1, 2) but block 0's only replacement is [0, 2)... and
    # block 2 only by [1, 3): no path 0 -> 3
    with pytest.raises(InputError, match="no sequence of replacements"):
        BlockLibrary(3, [0, 1], [2, 3], {"c": [1, 1]})


def test_json_round_trip(tmp_path):
    lib = small()
    p = lib.save(tmp_path / "lib.json")
    back = BlockLibrary.load(p)
    assert back.to_dict() == lib.to_dict()
    d = json.loads(p.read_text())
    assert d["format"] == "puzzle-nas/block-library" and d["num_blocks"] == 2
    assert d["replacements"][0]["children"] == [{"kind": "attention"}]
    assert d["constants"] == {"mem": 1.5}


def test_npz_round_trip_no_pickle(tmp_path):
    lib = synthetic_library(20, seed=2)
    p = lib.save(tmp_path / "lib.npz")
    back = BlockLibrary.load(p)
    assert back.num_replacements == lib.num_replacements
    for k in lib.costs:
        np.testing.assert_array_equal(back.costs[k], lib.costs[k])
    np.testing.assert_array_equal(back.scores["kl_div"], lib.scores["kl_div"])
    assert back.labels == lib.labels and back.tags == lib.tags
    assert back.constants == lib.constants
    with np.load(p, allow_pickle=False) as z:
        assert all(z[f].dtype != object for f in z.files)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["replacements"][1].update(end=5), r"span \[0, 5\) is outside"),
    (lambda d: d["replacements"][1]["costs"].update(mem=float("nan")), "cost 'mem' is nan"),
    (lambda d: d["replacements"][2]["costs"].pop("mem"), r"replacement 2 \('c'\) lacks cost 'mem'"),
    (lambda d: d["replacements"][0].update(start="x"), "replacements.0.start"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.pop("num_blocks"), "num_blocks"),
])
def test_malformed_files(tmp_path, mutate, match):
    d = small().to_dict()
    mutate(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InputError, match=match) as ei:
        BlockLibrary.load(p)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_not_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{nope")
    with pytest.raises(InputError, match="not valid JSON .*at line 1"):
        BlockLibrary.load(p)
    with pytest.raises(InputError, match="file not found"):
        BlockLibrary.load(tmp_path / "missing.json")


PUZZLE = {
    "layer_0": {
        "attention = 8 kv heads\t&&\tffn = intermediate size 100%": {
            "stats": {"memory_mib": 1437.1, "runtime_ms": 816.9, "num_params": 855654400},
            "metrics": {"kl_div": 0.0, "lm_loss": 1.64}},
        "attention = no_op\t&&\tffn = no_op": {
            "stats": {"memory_mib": 0, "runtime_ms": 0, "num_params": 0},
            "metrics": {"kl_div": 455.6, "lm_loss": 9.33}},
    },
    "layer_1": {
        "attention = 8 kv heads\t&&\tffn = intermediate size 100%": {
            "stats": {"memory_mib": 1437.1, "runtime_ms": 816.9, "num_params": 855654400,
                      "extra_only_here": 3},
            "metrics": {"kl_div": 0.0, "lm_loss": 1.64}},
    },
}


def test_puzzle_import(tmp_path):
    lib = from_puzzle(PUZZLE)
    assert lib.num_blocks == 2 and lib.num_replacements == 3
    assert sorted(lib.costs) == ["stats.memory_mib", "stats.num_params", "stats.runtime_ms"]
    assert sorted(lib.scores) == ["metrics.kl_div", "metrics.lm_loss"]
    assert lib.tags[1] == ["attention = no_op", "ffn = no_op"]
    assert lib.block_names == ["layer_0", "layer_1"]
    np.testing.assert_allclose(lib.costs["stats.memory_mib"], [1437.1, 0, 1437.1])
    # load() detects the format from the file
    p = tmp_path / "block_library.json"
    p.write_text(json.dumps(PUZZLE))
    assert BlockLibrary.load(p).to_dict() == lib.to_dict()


def test_puzzle_import_errors():
    with pytest.raises(InputError, match="layer_1 is missing"):
        from_puzzle({"layer_0": PUZZLE["layer_0"], "layer_2": PUZZLE["layer_1"]})
    with pytest.raises(InputError, match="unexpected key 'block_3'"):
        from_puzzle({"layer_0": PUZZLE["layer_0"], "block_3": {}})


def test_puzzle_import_solves():
    from nas.mip import solve

    res = solve(from_puzzle(PUZZLE), "metrics.kl_div", ["stats.memory_mib<=1500"])
    assert res.status == "optimal"
    assert res.totals["stats.memory_mib"] <= 1500
    assert res.objective == pytest.approx(455.6)


def test_synthetic_library_shape():
    lib = synthetic_library(88, seed=0)
    assert lib.num_blocks == 88 and lib.num_replacements >= 2000
    assert len([k for k in lib.costs if "@" in k]) == 6  # memory + runtime x 3 workloads
    assert (lib.lengths > 1).any()
    # quality improves with cost: within a block, kl falls as memory rises (rank correlation)
    assert lib.block_names is not None
    b = next(i for i, n in enumerate(lib.block_names) if n.startswith("E"))
    idx = np.flatnonzero((lib.start == b) & (lib.end == b + 1))
    mem = lib.costs["memory_bytes@chat-4k"][idx]
    kl = lib.scores["kl_div"][idx]
    rank_corr = np.corrcoef(np.argsort(np.argsort(mem)), np.argsort(np.argsort(kl)))[0, 1]
    assert rank_corr < -0.5
    assert synthetic_library(10, seed=1).to_dict() == synthetic_library(10, seed=1).to_dict()
