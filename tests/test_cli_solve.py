"""``puzzle-nas solve``: exit codes, JSON keys, nothing of HiGHS on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from library_generators import synthetic_library

from nas.cli import main
from nas.library import BlockLibrary

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
    # 2 worker threads: the same statuses and objectives within the gap, and a JSON
    # document on stdout that nothing the threads did cut short
    assert main(["solve", str(lib_path), "--objective", "kl_div", "--sweep",
                 f"{key}={0.4 * tot[key]}:{tot[key]}:5", "--workers", "2", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    for a, b in zip(out["sweep"]["results"], two["sweep"]["results"]):
        assert a["status"] == b["status"]
        if a["objective"] is not None:
            assert b["objective"] == pytest.approx(a["objective"], rel=2e-4)
    assert main(["solve", str(lib_path), "--objective", "kl_div", "--sweep",
                 f"{key}={0.4 * tot[key]}:{tot[key]}:5"]) == 0
    assert "Pareto frontier" in capsys.readouterr().out


# --------------------------------------------------------------------------- real libraries


@pytest.fixture()
def nv_path(tmp_path) -> Path:
    from library_generators import nvlabs_shaped_library

    return nvlabs_shaped_library(6, seed=2).save(tmp_path / "nv.json")


def test_budget_values_inf_underscores_and_units(lib_path, capsys):
    lib = BlockLibrary.load(lib_path)
    mem = 0.8 * parent_totals(lib)["memory_bytes@chat-4k"]
    gib = mem / 2**30
    argv = ["solve", str(lib_path), "--objective", "kl_div", "--json"]
    assert main([*argv, "--budget", f"memory_bytes@chat-4k<={gib:.6f} GiB",
                 "--budget", "runtime_s@chat-4k<=inf", "--budget", "params<=1_000_000_000_000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal"
    assert out["totals"]["memory_bytes@chat-4k"] <= gib * 2**30 * (1 + 1e-9)
    assert out["seconds"] <= out["wall_seconds"]
    # the same budget in bytes gives the same child
    assert main([*argv, "--budget", f"memory_bytes@chat-4k<={gib:.6f}GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["objective"] == out["objective"]
    assert main([*argv, "--budget", "kl_div<=1 GiB"]) == 2
    assert "says no unit" in capsys.readouterr().err


def test_json_when_infeasible(lib_path):
    p = run_cli(str(lib_path), "--objective", "kl_div", "--budget", "memory_bytes@chat-4k<=1",
                "--json")
    assert p.returncode == 3
    out = json.loads(p.stdout)
    assert out["status"] == "infeasible" and "can go no lower than" in out["message"]
    assert out["seconds"] >= 0 and out["wall_seconds"] >= out["seconds"]
    p = run_cli(str(lib_path), "--objective", "kl_div", "--sweep", "params=1:2:2", "--json")
    assert p.returncode == 3 and json.loads(p.stdout)["status"] == "infeasible"
    assert "infeasible: infeasible" not in p.stdout


def test_nvlabs_labels_pins_and_totals(nv_path, capsys):
    lib = BlockLibrary.load(nv_path)
    label = next(lab for lab in lib.labels if lab.endswith("ffn = no_op (parent * 0%)")
                 and lab.startswith("attention = no_op"))
    escaped = label.replace("\t", "\\t")
    argv = ["solve", str(nv_path), "--objective", "metrics.kl_div"]
    assert main([*argv, "--pin", f"layer_2:{escaped}"]) == 0
    out = capsys.readouterr().out
    assert "\t" not in out and escaped in out  # labels printed with their tabs escaped
    assert "stats.memory_mib" in out and "metrics.kl_div" in out  # additive totals only
    assert "stats.num_kv_heads" not in out and "metrics.lm_loss" not in out
    # the same pin by index, and with whitespace instead of the tab
    r = next(i for i in range(lib.num_replacements)
             if lib.start[i] == 2 and lib.labels[i] == label)
    assert main([*argv, "--pin", str(r), "--json"]) == 0
    by_index = json.loads(capsys.readouterr().out)
    assert by_index["choices"][2]["replacement"] == r
    assert main([*argv, "--forbid", f"2:{label.replace(chr(9), ' ')}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choices"][2]["replacement"] != r
    assert main([*argv, "--pin", "layer_9:anything"]) == 2
    assert "unknown block 'layer_9'" in capsys.readouterr().err
    assert main([*argv, "--pin", "layer_2:no such variant"]) == 2
    assert "no replacement at layer_2" in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["--time-limit", "-1"], "time_limit"),
    (["--gap", "nan"], "mip_rel_gap"),
    (["--threads", "0"], "threads"),
    (["--budget", "params<=nan"], "cannot read 'nan'"),
    (["--sweep", "params=1e9:8e9:1000000000"], "N must be <= 1,000"),
    (["--sweep", "params=1e9:inf:3"], "must be finite"),
])
def test_bad_solver_options_exit_2(lib_path, capsys, argv, match):
    assert main(["solve", str(lib_path), "--objective", "kl_div", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_solver_error_is_one_line_exit_1(lib_path, capsys, monkeypatch):
    # HiGHS returning a child that breaks a row is a bug, not bad input: no traceback
    from nas.mip import MipModel, SolverError

    def broken(self, x):
        raise SolverError("solution breaks budget params<=1")

    monkeypatch.setattr(MipModel, "verify", broken)
    assert main(["solve", str(lib_path), "--objective", "kl_div"]) == 1
    err = capsys.readouterr().err
    assert "internal solver error" in err and err.count("\n") == 1
