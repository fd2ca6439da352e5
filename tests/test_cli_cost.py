"""`puzzle-nas hw` and `puzzle-nas cost`: output, JSON keys, and one-line errors with exit 2."""

from __future__ import annotations

import json

import pytest
from conftest import LLAMA, SUPER

from nas.cli import main


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_hw_list_and_show(capsys):
    rc, out, _ = _run(capsys, "hw", "list")
    assert rc == 0
    for name in ("h100-sxm", "b200", "mi355x", "l40s"):
        assert name in out
    assert "85.5 GB (79.6 GiB)" in out  # H100 81,559 MiB, decimal and binary spelled out
    rc, out, _ = _run(capsys, "hw", "show", "H100")
    assert rc == 0 and "h100-sxm" in out and "nvidia.com" in out and "989 TFLOP/s" in out
    # 24 figures: the refit profile carries no engine overheads (they are the engines')
    assert ("assumed figures: 1 of 24 (efficiency.matmul.int8)"
            in out)
    rc, out, _ = _run(capsys, "hw", "show", "b200", "--json")
    assert rc == 0 and json.loads(out)["name"] == "b200"


def test_hw_unknown_device_exit_2(capsys):
    rc, out, err = _run(capsys, "hw", "show", "h900")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "unknown device 'h900'" in err


def test_malformed_profile_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "memory_bytes": 5}))
    rc, _, err = _run(capsys, "cost", str(LLAMA), "--hw", str(bad), "--workload",
                      "isl=128,osl=128,batch=1")
    assert rc == 2 and err.count("\n") == 1 and "bad.json" in err


def test_cost_json_llama(capsys):
    rc, out, _ = _run(capsys, "cost", str(LLAMA), "--hw", "h100-sxm", "--workload",
                      "isl=8192,osl=1024,batch=64", "--workload", "isl=128,osl=128,concurrency=8",
                      "--context", "131072", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["weight_bytes"] == 2 * 8_030_261_248
    assert len(d["workloads"]) == 2
    for w in d["workloads"]:
        for key in ("ttft_s", "tpot_s", "throughput_tok_s", "memory_bytes"):
            assert w[key] > 0
    w0 = d["workloads"][0]
    assert w0["throughput_tok_s"] == pytest.approx(
        64 * 1024 / (w0["ttft_s"] + 1023 * w0["tpot_s"]))
    assert d["max_concurrency"] == 3  # 16 GiB of BF16 KV per 128K-token sequence


def test_cost_super_nvfp4_1m_context(capsys):
    argv = ["cost", str(SUPER), "--hw", "h100-sxm", "--precision", "nvfp4-super", "--kv-dtype", "fp8",
            "--context", "1048576"]
    rc, out, _ = _run(capsys, *argv)
    assert rc == 0
    assert "max concurrency at context 1,048,576 tokens:" in out
    for line in ("usable memory", "- weights", "- activation workspace", "- runtime reserve",
                 "per sequence: KV cache"):
        assert line in out
    assert "GB (" in out and "GiB)" in out
    d = json.loads(_run(capsys, *argv, "--json")[1])
    c = d["concurrency"]
    assert d["max_concurrency"] == int(c["free_bytes"] // c["per_sequence_bytes"]) >= 1
    # KV: 8 attention blocks x 2 (K,V) x 2 KV heads x 128 x 1 byte (FP8) per token
    assert c["kv_bytes_per_sequence"] == 8 * 2 * 2 * 128 * 1 * 1048576
    with_mtp = json.loads(_run(capsys, *argv, "--json", "--mtp")[1])
    assert with_mtp["weight_bytes"] > d["weight_bytes"]
    assert with_mtp["max_concurrency"] <= d["max_concurrency"]


@pytest.mark.parametrize("argv,needle", [
    (["--workload", "isl=128,osl=128"], "batch or concurrency"),
    (["--workload", "isl=128,osl=128,batch=1", "--tp", "2", "--ep", "4"], "ep must be"),
    (["--workload", "isl=128,osl=128,batch=1", "--precision", "fp3"], "unknown precision"),
    ([], "--workload"),
    (["--context", "0"], "--context"),
    (["--workload", "isl=128,osl=128,concurrency=1", "--slo", "speed>=3"], "per_user_tps"),
    (["--slo", "per_user_tps>=10"], "--workload"),
    (["--workload", "isl=128,osl=128,concurrency=1", "--acceptance", "2"], "--mtp"),
    (["--workload", "isl=128,osl=128,concurrency=1", "--mtp", "--acceptance", "2"],
     "no MTP head"),
])
def test_cost_bad_input_exit_2(capsys, argv, needle):
    rc, out, err = _run(capsys, "cost", str(LLAMA), "--hw", "h100", *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err


def test_cost_slo_prints_chosen_concurrency(capsys):
    argv = ["cost", str(LLAMA), "--hw", "h100-sxm", "--precision", "fp8",
            "--workload", "isl=1000,osl=1000,concurrency=8", "--slo", "per_user_tps>=50"]
    rc, out, _ = _run(capsys, *argv)
    assert rc == 0
    line = next(x for x in out.splitlines() if "SLO per_user_tps>=50" in x)
    assert "best concurrency" in line and "tok/s/GPU" in line
    rc, out, _ = _run(capsys, *argv, "--json")
    slo = json.loads(out)["slo"][0]
    assert slo["per_user_tok_s"] >= 50 and slo["concurrency"] >= 1
    assert slo["concurrency"] in slo["swept"]


def test_cost_is_a_library_call(capsys):
    # what `cost` prints is nas.cost.cost_report on a costmodels.target.Target: the same
    # figures from Python, the engine's own defaults filled in by the target
    import hwprofiles
    from costmodels.dtypes import get_recipe
    from costmodels.serving import parse_slo
    from costmodels.target import Target
    from hwprofiles.errors import InputError
    from nas.cost import cost_report
    from nas.hf import load_config

    argv = ["cost", str(LLAMA), "--hw", "b200", "--precision", "fp8", "--engine", "sglang",
            "--workload", "isl=20000,osl=256,concurrency=8", "--slo", "ttft<=5s",
            "--context", "32768", "--arrival", "poisson", "--rate", "0.5", "--json"]
    rc, out, _ = _run(capsys, *argv)
    assert rc == 0
    cli = json.loads(out)
    target = Target(hwprofiles.get("b200"), engine="sglang")
    wls = target.workloads(["isl=20000,osl=256,concurrency=8,arrival=poisson,rate=0.5"])
    # SGLang's own token budget on B200, not the 8,192 default
    assert wls[0].max_num_batched_tokens == 16384
    rep = cost_report(load_config(LLAMA), target, get_recipe("fp8"), wls, context=32768,
                      slo=parse_slo("ttft<=5s"))
    lib = json.loads(json.dumps(rep.figures))
    assert {k: v for k, v in cli.items() if k not in ("config", "acceptance")} == lib
    assert rep.concurrency is not None and rep.concurrency.max_concurrency == \
        cli["max_concurrency"] > 0
    with pytest.raises(InputError, match="ep must be 1 or equal to tp"):
        Target(hwprofiles.get("b200"), tp=2, ep=4)
    with pytest.raises(InputError, match="static batch"):
        cost_report(load_config(LLAMA), target, get_recipe("fp8"),
                    target.workloads(["isl=128,osl=16,batch=4"]), replay=10)
