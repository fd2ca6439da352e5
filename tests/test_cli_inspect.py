from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import LLAMA, SUPER


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nas", *args], capture_output=True, text=True)


def test_inspect_json_super_nvfp4():
    p = run("inspect", str(SUPER), "--precision", "nvfp4", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["total_params"] == 120_668_707_840
    assert d["active_params"] == 12_770_237_440
    assert d["kv_bytes_per_token"] == 4096
    assert d["state_bytes_per_sequence"] > 0 and d["weight_bytes"] > 0


def test_inspect_text_llama():
    p = run("inspect", str(LLAMA))
    assert p.returncode == 0
    assert "8,030,261,248" in p.stdout and "GiB" in p.stdout and "GB" in p.stdout


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"model_type": "gpt2"}', "model_type"),
    (json.dumps({**json.loads(SUPER.read_text()), "hybrid_override_pattern": "MEM"}),
     "num_hidden_layers"),
])
def test_inspect_bad_input(tmp_path, content, needle):
    f = tmp_path / "config.json"
    f.write_text(content)
    p = run("inspect", str(f))
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert needle in p.stderr and str(f) in p.stderr


def test_inspect_missing_file_and_bad_recipe(tmp_path):
    p = run("inspect", str(tmp_path / "nope.json"))
    assert p.returncode == 2 and "not found" in p.stderr
    p = run("inspect", str(LLAMA), "--precision", "fp3")
    assert p.returncode == 2 and "precision recipe" in p.stderr
