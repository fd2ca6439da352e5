"""The device check: one prepared script for a machine with a GPU (issue 28), at most ~8 min.

    python benchmarks/device_check.py -o OUT [--device cuda] [--nproc N]

Steps, each timed, every figure written to ``OUT/device_check.json`` as it is measured (a
step that fails is recorded with its error and the script goes on):

1. **probe**: ``puzzle-nas profile --quick`` (GEMM peaks per dtype, memory bandwidth,
   kernel overhead) -> ``OUT/probe.json``;
2. **blocks**: ``puzzle-nas profile --blocks`` of a small Llama-style spec (hidden 1024, 4
   layers, its KV-head and FFN alternatives) -> ``OUT/blocks.json``;
3. **score**: a random-init 8-block parent (hidden 512, vocab 8192) scored on the device
   (``--device``; ``--nproc N`` > 1 runs it sharded over N GPUs on nccl), 16 alternatives,
   8,192 held-out tokens;
4. **distill**: a child built from that parent (KV heads 8 -> 2, FFN halved) distilled 20
   steps on the device on FSDP2 with mixed precision (``--mixed-precision bfloat16``: bf16
   compute, float32 master weights; on one GPU a one-rank nccl group, on ``--nproc N`` GPUs
   sharded over them).

With one GPU the score step runs in one process (a pipeline of one stage has nothing to
send; ``--nproc 2`` or more exercises nccl there).

On a CPU (``--device cpu``) the same steps run smaller, as a check of the script itself;
CI never runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "nas", *args], capture_output=True, text=True,
                       env=env, cwd=REPO)
    if p.returncode != 0:
        raise RuntimeError(f"puzzle-nas {args[0]} exit {p.returncode}: {p.stderr[-1500:]}")
    return time.perf_counter() - t, p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True, help="folder for the figures")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--nproc", type=int, default=1, help="GPUs (ranks) for the score and distill steps")
    args = ap.parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    small = args.device == "cpu"
    fig: dict[str, object] = {"device": args.device, "nproc": args.nproc,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save() -> None:
        (out / "device_check.json").write_text(json.dumps(fig, indent=2) + "\n")

    def step(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            fig[name] = {"seconds": None, **fn()}
        except Exception as exc:  # recorded, and the next step runs
            fig[name] = {"error": str(exc)[-2000:]}
        fig[name]["seconds"] = round(time.perf_counter() - t, 2)  # type: ignore[index]
        print(f"{name}: {fig[name]}", flush=True)
        save()

    def probe() -> dict:
        # --accept-noisy: the check records the figures whatever their spread (each carries
        # its standard error in its source)
        _cli("profile", "--quick", "--device", args.device, "-o", str(out / "probe.json"),
             "--accept-noisy", env=env)
        p = json.loads((out / "probe.json").read_text())
        return {"peak_flops": {k: v["value"] for k, v in p.get("peak_flops", {}).items()},
                "memory_bandwidth": p.get("memory_bandwidth", {}).get("value"),
                "kernel_overhead_s": p.get("kernel_overhead_s", {}).get("value")}

    hidden, layers = (256, 2) if small else (1024, 4)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
           "hidden_size": hidden, "intermediate_size": 4 * hidden,
           "num_attention_heads": hidden // 64, "num_key_value_heads": hidden // 64,
           "num_hidden_layers": layers, "vocab_size": 8192, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 4096, "tie_word_embeddings": False}
    (out / "small-config.json").write_text(json.dumps(cfg))
    spec = {"name": "device-check", "parent": "small-config.json", "hardware": "h100-sxm",
            "workloads": {"chat": {"isl": 512, "osl": 128, "batch": 8}},
            "search_space": {"attention": {"kv_heads": [2], "noop": True},
                             "ffn": {"fractions": [0.5], "noop": True}}}
    (out / "small-spec.json").write_text(json.dumps(spec))

    def blocks() -> dict:
        s, _ = _cli("profile", "--blocks", str(out / "small-spec.json"), "--device",
                    args.device, "--batches", "1,8", "-o", str(out / "blocks.json"), env=env)
        return {"file": str(out / "blocks.json")}

    def make_parent() -> None:
        import numpy as np
        import torch

        from nas.arch import FFN, Attention, ModelArch
        from nas.child import build_model, init_from_parent, save_pretrained

        h = 256 if small else 512
        arch = ModelArch(hidden_size=h, vocab_size=8192, model_type="llama",
                         blocks=(Attention(num_heads=h // 64, num_kv_heads=h // 64,
                                           head_dim=64), FFN(width=4 * h)) * 4)
        save_pretrained(build_model(arch, seed=0, dtype=torch.bfloat16), out / "parent")
        rng = np.random.default_rng(0)
        np.save(out / "tokens.npy", rng.integers(0, 8192, 1 << 16, dtype=np.int64))
        child = arch.replace_blocks((Attention(num_heads=h // 64, num_kv_heads=2,
                                               head_dim=64), FFN(width=2 * h)) * 4)
        m = init_from_parent(child, out / "parent", torch.randint(0, 8192, (2, 256)),
                             dtype=torch.bfloat16, progress=False)
        save_pretrained(m, out / "child")
        sp = {"name": "device-check-score", "parent": str(out / "parent" / "config.json"),
              "hardware": "h100-sxm", "workloads": {"chat": {"isl": 512, "osl": 128,
                                                              "batch": 8}},
              "search_space": spec["search_space"]}
        (out / "score-spec.json").write_text(json.dumps(sp))

    def score() -> dict:
        make_parent()
        held = "2048" if small else "8192"
        s, stdout = _cli("score", str(out / "score-spec.json"), "--parent",
                         str(out / "parent"), "--data", str(out / "tokens.npy"), "-o",
                         str(out / "scores"), "--device", args.device, "--nproc",
                         str(args.nproc), "--max-tokens", held, "--calib-tokens", "2048",
                         "--json", env=env)
        rec = json.loads(stdout[stdout.index("{"):])
        return {"alternatives": rec["alternatives"], "scoring_seconds":
                rec.get("scoring_seconds"), "world_size": rec["world_size"],
                "held_tokens": rec["held_tokens_scored"], "stages": rec.get("stages")}

    def distill() -> dict:
        s, stdout = _cli("distill", str(out / "child"), "--teacher", str(out / "parent"),
                         "--data", str(out / "tokens.npy"), "-o", str(out / "distill"),
                         "--tokens", str(20 * 8 * 256), "--batch", "8", "--seq-len", "256",
                         "--device", args.device, "--nproc", str(args.nproc),
                         "--mixed-precision", "bfloat16", env=env)
        rec = json.loads((out / "distill" / "distill.json").read_text())
        return {"steps": rec.get("steps"), "wall_seconds": s, "layout": rec.get("layout"),
                "world_size": rec.get("world_size"), "initial": rec.get("initial"),
                "final": rec.get("final"), "peak_rss_mib": rec.get("peak_rss_mib")}

    step("probe", probe)
    step("blocks", blocks)
    step("score", score)
    step("distill", distill)
    fig["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    return 0 if all("error" not in v for v in fig.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
