"""Bad numbers at the edges: one line naming the field, exit 2, no traceback (issue 13's
cases: configs, flags, spec budgets and search-space values)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import LLAMA

from nas.cli import main

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "examples" / "llama3.1-8b-h100.json"


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _config(tmp_path: Path, **changes: object) -> Path:
    cfg = json.loads(LLAMA.read_text())
    cfg.update(changes)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))  # NaN / Infinity written as JSON5-style tokens Python reads
    return f


BAD_CONFIGS = [
    ({"hidden_size": math.nan}, "hidden_size: expected an integer, got nan"),
    ({"hidden_size": math.inf}, "hidden_size: expected an integer, got inf"),
    ({"hidden_size": -math.inf}, "hidden_size: expected an integer"),
    ({"hidden_size": 1e300}, "hidden_size: expected at most 262,144 (MAX_DIM"),
    ({"hidden_size": 4096.5}, "hidden_size: expected an integer, got 4096.5"),
    ({"vocab_size": 1e300}, "vocab_size: expected at most 16,777,216 (MAX_VOCAB"),
    ({"num_hidden_layers": 100_000_000}, "num_hidden_layers: expected at most 4,096"),
    ({"num_attention_heads": 24}, "num_attention_heads: 24 does not divide hidden_size 4096"),
    ({"intermediate_size": 10**7}, "width = 10,000,000 exceeds the cap 262,144"),
    ({"rms_norm_eps": math.nan}, "rms_norm_eps: expected a finite number, got nan"),
]


@pytest.mark.parametrize("changes,needle", BAD_CONFIGS)
@pytest.mark.parametrize("command", ["inspect", "cost"])
def test_bad_config_numbers(tmp_path, capsys, command, changes, needle):
    f = _config(tmp_path, **changes)
    extra = ["--hw", "h100-sxm", "--workload", "isl=8,osl=8,batch=1"] if command == "cost" else []
    assert main([command, str(f), *extra]) == 2
    line = _one_line(capsys.readouterr().err)
    assert needle in line and str(f) in line, line


@pytest.mark.parametrize("changes,needle", BAD_CONFIGS[:4] + BAD_CONFIGS[6:8])
def test_bad_config_numbers_build_and_search(tmp_path, capsys, changes, needle):
    f = _config(tmp_path, **changes)
    pytest.importorskip("torch")
    assert main(["build", str(f), "-o", str(tmp_path / "out")]) == 2
    assert needle in _one_line(capsys.readouterr().err)
    spec = json.loads(SPEC.read_text())
    spec["parent"] = str(f)
    s = tmp_path / "spec.json"
    s.write_text(json.dumps(spec))
    assert main(["search", str(s), "-o", str(tmp_path / "run"), "--quiet"]) == 2
    assert needle in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags,needle", [
    (["--reserve-gib", "nan"], "--reserve-gib: expected a finite number >= 0, got nan"),
    (["--reserve-gib", "inf"], "--reserve-gib: expected a finite number >= 0, got inf"),
    (["--step-overhead-us", "-100000"], "--step-overhead-us: expected a finite number >= 0"),
    (["--step-overhead-us", "nan"], "--step-overhead-us: expected a finite number >= 0"),
    (["--request-overhead-ms", "inf"], "--request-overhead-ms: expected a finite number"),
    (["--workload", "isl=1e300,osl=8,batch=1"], "isl + osl = 1e+300 tokens exceeds the cap"),
    (["--workload", "isl=8,osl=8,batch=1e12"], "batch = 1,000,000,000,000 exceeds the cap"),
    (["--tp", "3"], "--tp: 3 does not divide block 0's 32 query heads"),
    (["--tp", "200"], "--tp: 200 exceeds the cap 72"),
    (["--context", "4294967296"], "--context: 4,294,967,296 exceeds the cap"),
])
def test_bad_cost_flags(capsys, flags, needle):
    args = ["cost", str(LLAMA), "--hw", "h100-sxm"]
    if not any(f == "--workload" for f in flags):
        args += ["--workload", "isl=8,osl=8,batch=1"]
    assert main(args + flags) == 2
    assert needle in _one_line(capsys.readouterr().err)


def test_tp_kv_heads_split_or_replicated(tmp_path, capsys):
    f = _config(tmp_path, num_attention_heads=24, num_key_value_heads=8, head_dim=128)
    assert main(["cost", str(f), "--hw", "h100-sxm", "--tp", "3", "--workload",
                 "isl=8,osl=8,batch=1"]) == 2
    assert "cannot split or replicate block 0's 8 KV heads" in _one_line(capsys.readouterr().err)
    # 16 GPUs replicate 8 KV heads (twice each), as engines do
    assert main(["cost", str(LLAMA), "--hw", "h100-sxm", "--tp", "16", "--workload",
                 "isl=8,osl=8,batch=1"]) == 0


def _spec(tmp_path: Path, **changes: object) -> Path:
    spec = json.loads(SPEC.read_text())
    spec["parent"] = str(LLAMA)
    for k, v in changes.items():
        spec[k] = v
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    return f


@pytest.mark.parametrize("changes,needle", [
    ({"budgets": [{"metric": "memory", "workload": "chat", "max": math.nan}]},
     "budgets[0].max"),
    ({"budgets": [{"metric": "memory", "workload": "chat", "max": "nan%"}]},
     "expected a finite percentage"),
    ({"search_space": {"attention": {"kv_heads": [3]}}},
     "search_space.attention.kv_heads: 3 is not usable (must divide an attention block's "
     "num_heads (32))"),
    ({"search_space": {"ffn": {"widths": [20000]}}},
     "search_space.ffn.widths: 20000 is not usable (must be <= an FFN block's width (14336))"),
    ({"search_space": {"moe": {"top_k": [2]}}},
     "search_space.moe.top_k: 2 has no moe block to apply to"),
    ({"search_space": {"attention": {"kv_heads": [10**9]}}}, "kv_heads"),
    ({"workloads": {"chat": {"isl": 1e300, "osl": 8, "batch": 1}}}, "workloads.chat.isl"),
    ({"budgets": [{"metric": "throughput", "workload": "chat", "min": 0}]},
     "a throughput bound must be > 0"),
    ({"budgets": [{"metric": "memory", "workload": "chat", "max": math.inf}]},
     "expected a finite number, got inf (leave a budget out to not bound it)"),
    ({"runtime_reserve": "-2 GiB"}, "runtime_reserve"),
    ({"budgets": [{"metric": "memory", "workload": "chat", "max": -1e300}]},
     "-1e+300 is out of range (at most 1e+18 in base units"),
    ({"parent": {**json.loads(LLAMA.read_text()), "rope_scaling": {"rope_type": []}}},
     "rope_scaling.rope_type: expected a string, got []"),
])
def test_bad_spec_values(tmp_path, capsys, changes, needle):
    s = _spec(tmp_path, **changes)
    assert main(["search", str(s), "-o", str(tmp_path / "run"), "--quiet"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert needle in line, line
    assert not (tmp_path / "run").exists()


def test_version(capsys):
    from nas import __version__

    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0 and capsys.readouterr().out.strip() == f"puzzle-nas {__version__}"


def test_spec_tp_must_split_the_heads(tmp_path, capsys):
    spec = json.loads(SPEC.read_text())
    spec["parent"] = str(LLAMA)
    spec["hardware"] = {"profile": "h100-sxm", "tp": 3}
    s = tmp_path / "spec.json"
    s.write_text(json.dumps(spec))
    assert main(["search", str(s), "-o", str(tmp_path / "run"), "--quiet"]) == 2
    assert "hardware.tp: 3 does not divide block 0's 32 query heads" in _one_line(
        capsys.readouterr().err)
