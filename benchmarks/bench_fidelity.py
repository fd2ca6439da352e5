"""Cost-model fidelity against published serving measurements.

Run: ``python benchmarks/bench_fidelity.py [-o DIR] [--profiles DIR]`` or
``pytest benchmarks/bench_fidelity.py --benchmark-only -s``. Prints, with the shipped
hardware profiles (or the profile JSON files of ``--profiles``):

* MAPE and mean signed error per split (fit / hold-out, fixed in the CSV before any fit),
  GPU and regime (TTFT, TPOT, throughput) over ``costmodels/data/serving_measurements.csv``;
* the seeds' headline: Nemotron-Labs-3-Puzzle-75B vs Nemotron-3-Super on one 8xB200 node
  at 8K in / 64K out and >= 100 tok/s per user (published 20,939 -> 42,601 tok/s, 2.03x),
  with attention data parallelism, **with MTP** speculative decoding (5 draft tokens, the
  published acceptances 3.45 -> 4.34), and for comparison without it.

Why the headline is the MTP case (the seed articles do not print the serving flags):
NVIDIA serves Nemotron-3-Super with its MTP head: the Nemotron-3-Super advanced deployment
guide's 8k/64k serve command adds ``num_speculative_tokens: 5``
(https://docs.nvidia.com/nemotron/latest/usage-cookbook/Nemotron-3-Super/
AdvancedDeploymentGuide/README.html) and every NVIDIA Dynamo recipe for Super runs MTP
(https://docs.nvidia.com/dynamo/recipes/nemotron-3-super); the seed articles quote the
child's MTP acceptance gain (3.45 -> 4.34) next to the throughput, which matters only with
MTP on. And the data agreed when rows 127-128 were still fit rows (before issue 30; those
figures are in-sample): refit from the same start to the B200 fit rows, reading them as MTP
runs gave rms log error 0.365 (hold-out MAPE 13.7 %, every regime's bias within +-10 %,
ratio 1.90x) against 0.378 reading them as plain decoding (hold-out 16.0 %, TPOT bias
-17.9 %, no-MTP ratio 1.64x, Super -24 % and the child -38 % off their figures). Since
issue 30 the two rows are held out of every fit and the ratio this prints is out of sample
(1.79x with MTP, 1.62x without, on the shipped profiles).

It also prints the 1M-token concurrency on one H100 for both (published 1 -> 8), and writes ``fidelity.png`` (log-log predicted vs measured, one panel per regime).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

import hwprofiles
from costmodels.blocks import price_blocks
from costmodels.calibrate import fidelity_plot, format_table, load_measurements, mape_table, score
from costmodels.dtypes import get_recipe
from costmodels.model import max_concurrency, price_nonblock
from costmodels.serving import slo_throughput
from nas.cli.calibrate import shape_resolver
from nas.hf import load_config
from nas.search import nonblock_shape

REPO = Path(__file__).resolve().parents[1]
CSV = REPO / "costmodels" / "data" / "serving_measurements.csv"
SUPER = REPO / "nas" / "examples" / "configs" / "nemotron-3-super-120b-a12b.json"
CHILD = REPO / "costmodels" / "data" / "configs" / "nemotron-labs-3-puzzle-75b-a9b.json"
ACCEPTANCE = {"parent": 3.45, "child": 4.34}  # FACTS.md s2 (SPEED-Bench, seed articles)
DRAFT_TOKENS = 5  # num_speculative_tokens of NVIDIA's Super deployment guide (8k/64k)
PUBLISHED = {"parent": 20_939, "child": 42_601}  # tok/s per 8xB200 node, FACTS.md s2
ENGINE = "trtllm"


def _profiles(folder: str | Path | None):
    if folder is None:
        return hwprofiles.get
    loaded = {p.stem: hwprofiles.load(p) for p in Path(folder).glob("*.json")}
    return lambda name: loaded.get(name) or hwprofiles.get(name)


def seeds_ratio(hw, mtp: bool, engines=None) -> dict:
    """SLO throughput per 8xB200 node of Super and the Puzzle-75B child (tp 8, ep 8,
    attention DP, nvfp4-super, the TensorRT-LLM engine's overheads) at 8K/64K, >= 100 tok/s
    per user; ``mtp``: with the MTP head drafting 5 tokens at the published acceptances.
    Priced as ``costmodels.calibrate.predict`` prices the CSV's seed rows."""
    recipe = get_recipe("nvfp4-super")
    shapes = shape_resolver(CSV, [str(SUPER.parent), str(CHILD.parent)])
    out = {}
    for who, path in (("parent", SUPER), ("child", CHILD)):
        shape = shapes(path.stem)
        table, draft, wl = shape.table, None, "isl=8192,osl=65536,concurrency=1"
        if mtp:  # the main rows, then the MTP head's as draft rows (as calibrate's rows)
            table, draft = shape.with_mtp_head()
            wl += f",draft_tokens={DRAFT_TOKENS},acceptance={ACCEPTANCE[who]}"
        out[who] = slo_throughput(table, shape.nonblock, hw, recipe, wl, "per_user_tps>=100",
                                  tp=8, ep=8, attention_dp=True, draft=draft,
                                  engine=ENGINE, engines=engines)
    out["ratio"] = out["child"].throughput_node_tok_s / out["parent"].throughput_node_tok_s
    return out


def long_context_concurrency(hw) -> dict:
    """Largest concurrency at 1,048,576 tokens on one GPU (nvfp4-super, FP8 KV)."""
    recipe = get_recipe("nvfp4-super")
    out = {}
    for who, path in (("parent", SUPER), ("child", CHILD)):
        arch = load_config(path)
        wl = ["isl=1044480,osl=4096,concurrency=1"]
        b = price_blocks(arch.block_table(), hw, recipe, wl)
        nb = price_nonblock(nonblock_shape(arch), hw, recipe, wl)
        out[who] = max_concurrency(b, nb, hw, 1_048_576).max_concurrency
    return out


def report(out_dir: str | Path = ".", profiles: str | Path | None = None,
           measurements: str | Path = CSV) -> dict:
    ms = load_measurements(measurements)
    shapes = shape_resolver(Path(measurements), [str(CHILD.parent), str(SUPER.parent)])
    prof = _profiles(profiles)
    t0 = time.perf_counter()
    scored = score(ms, shapes, prof)
    secs = time.perf_counter() - t0
    rows = mape_table(scored)
    print(f"{len(ms)} published measurements ({sum(m.split == 'holdout' for m in ms)} held "
          f"out before fitting), scored in {secs:.2f} s")
    print(format_table(rows))
    seeds = {k: seeds_ratio(prof("b200"), mtp) for k, mtp in (("mtp", True), ("no_mtp", False))}
    for k, s in seeds.items():
        p, c = s["parent"], s["child"]
        head = ("headline, with MTP: 5 draft tokens, acceptance 3.45 -> 4.34" if k == "mtp"
                else "for comparison, without MTP")
        print(f"8xB200, 8K/64K, >= 100 tok/s/user ({head}): Super "
              f"{p.throughput_node_tok_s:,.0f} tok/s/node at concurrency {p.concurrency} "
              f"({p.throughput_node_tok_s / PUBLISHED['parent'] - 1:+.1%} vs 20,939), "
              f"Puzzle-75B {c.throughput_node_tok_s:,.0f} at {c.concurrency} "
              f"({c.throughput_node_tok_s / PUBLISHED['child'] - 1:+.1%} vs 42,601): "
              f"{s['ratio']:.2f}x (published 2.03x)")
    conc = long_context_concurrency(prof("h100-sxm"))
    print(f"H100, 1M-token context: max concurrency parent {conc['parent']}, child "
          f"{conc['child']} (published 1 -> 8)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fidelity_plot(scored, out / "fidelity.png")
    print(f"wrote {out / 'fidelity.png'}")
    return {"table": rows, "seeds": {k: s["ratio"] for k, s in seeds.items()},
            "long_context": conc, "scored": scored}


@pytest.mark.benchmark(min_rounds=1)
def test_fidelity_report(benchmark, tmp_path):
    res = benchmark.pedantic(report, args=(tmp_path,), rounds=1, iterations=1)
    assert (tmp_path / "fidelity.png").read_bytes()[:4] == b"\x89PNG"
    hold = next(r for r in res["table"]
                if (r["split"], r["gpu"], r["regime"]) == ("holdout", "all", "all"))
    print(f"hold-out MAPE {hold['mape']:.1%}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default=".", help="folder for fidelity.png")
    ap.add_argument("--profiles", default=None, help="folder of profile JSON files to use "
                    "instead of the shipped ones (e.g. calibrate outputs)")
    ap.add_argument("--measurements", default=str(CSV), help="measurements CSV (default: "
                    "costmodels/data/serving_measurements.csv)")
    a = ap.parse_args()
    report(a.out, a.profiles, a.measurements)
