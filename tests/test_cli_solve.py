"""``puzzle-nas solve``: exit codes, JSON keys, nothing of HiGHS on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nas.cli import main
from nas.library import BlockLibrary, synthetic_library

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def lib_path(tmp_path) -> Path:
    return synthetic_library(10, seed=1).save(tmp_path / "lib.json")


def parent_totals(lib: BlockLibrary) -> dict[str, float]:
    return lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "nas", "solve", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT)


def test_json_output_keys_and_no_banner(lib_path):
    lib = BlockLibrary.load(lib_path)
    mem = 0.7 * parent_totals(lib)["memory_bytes@chat-4k"]
    p = run_cli(str(lib_path), "--objective", "kl_div", "--budget",
                f"memory_bytes@chat-4k<={mem}", "--json")
    assert p.returncode == 0, p.stderr
    assert "HiGHS" not in p.stdout and "Running" not in p.stdout
    out = json.loads(p.stdout)  # stdout is exactly one JSON document
    for k in ("status", "objective", "gap", "seconds", "choices", "totals"):
        assert k in out
    assert out["status"] == "optimal"
    assert len(out["choices"]) == lib.num_blocks
    assert out["totals"]["memory_bytes@chat-4k"] <= mem * (1 + 1e-9)
    assert out["choices"][0]["label"] == lib.labels[out["choices"][0]["replacement"]]


def test_text_output(lib_path, capsys):
    assert main(["solve", str(lib_path), "--objective", "kl_div", "--budget", "params<=1e11"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("status optimal")
    assert "totals:" in out and "kl_div" in out


def test_infeasible_exit_3_with_explanation(lib_path):
    p = run_cli(str(lib_path), "--objective", "kl_div", "--budget", "memory_bytes@chat-4k<=1")
    assert p.returncode == 3
    assert "memory_bytes@chat-4k can go no lower than" in p.stderr
    assert p.stderr.count("\n") == 1


@pytest.mark.parametrize("argv, match", [
    (["--budget", "memory<=3"], "unknown key 'memory'"),
    (["--budget", "params<3"], "cannot parse budget"),
    (["--count", "nosuchtag>=1"], "unknown tag"),
    (["--sweep", "params=1:2"], "expected KEY=A:B:N"),
])
def test_bad_input_exit_2(lib_path, capsys, argv, match):
    assert main(["solve", str(lib_path), "--objective", "kl_div", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_malformed_library_exit_2(tmp_path, capsys):
    d = synthetic_library(4, seed=0).to_dict()
    d["replacements"][3]["costs"]["params"] = float("nan")
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    assert main(["solve", str(p), "--objective", "kl_div"]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "replacement 3" in err and "nan" in err
    d = synthetic_library(4, seed=0).to_dict()
    d["replacements"][0]["end"] = 9
    p.write_text(json.dumps(d))
    assert main(["solve", str(p), "--objective", "kl_div"]) == 2
    assert "span [0, 9) is outside" in capsys.readouterr().err


def test_diverse_and_sweep(lib_path, capsys):
    lib = BlockLibrary.load(lib_path)
    tot = parent_totals(lib)
    assert main(["solve", str(lib_path), "--objective", "kl_div", "--budget",
                 f"params<={0.8 * tot['params']}", "--diverse", "3", "--min-distance", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["pool"]) == 3 and out["status"] == "optimal"
    picks = [[c["replacement"] for c in s["choices"]] for s in out["pool"]]
    for i in range(3):
        for j in range(i):
            assert sum(a != b for a, b in zip(picks[i], picks[j])) >= 2
    key = "memory_bytes@rag-32k"
    assert main(["solve", str(lib_path), "--objective", "kl_div", "--sweep",
                 f"{key}={0.4 * tot[key]}:{tot[key]}:5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["sweep"]["results"]) == 5 and out["sweep"]["frontier"]
    assert main(["solve", str(lib_path), "--objective", "kl_div", "--sweep",
                 f"{key}={0.4 * tot[key]}:{tot[key]}:5"]) == 0
    assert "Pareto frontier" in capsys.readouterr().out
