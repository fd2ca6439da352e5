"""``puzzle-nas cost CONFIG --hw NAME --workload ...``: serving cost of a model on a device.

Prints per workload TTFT, decode ms/token, request latency, throughput per GPU and per
node, per-user tok/s and memory per GPU; with ``--context N`` the largest concurrency that
fits at N tokens and the memory breakdown behind it; with ``--replay N`` a replay of N
requests through the engine's scheduler (``costmodels.replay``) beside the analytic figures.
"""

from __future__ import annotations

import argparse
import json
import math

from hwprofiles.units import GIB, gb_gib


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost", help="price a model on a device for named workloads",
        description="Analytical serving cost of an HF config.json on a hardware profile: "
        "TTFT, decode time per token, throughput, per-user speed, memory, and the largest "
        "concurrency that fits at a context length.")
    p.add_argument("config", help="HF config.json (or a folder holding one)")
    p.add_argument("--hw", required=True, help="hardware profile name (see `puzzle-nas hw list`) "
                   "or a profile JSON file")
    p.add_argument("--precision", default="bf16",
                   help="precision recipe: bf16, fp8, nvfp4 (every linear NVFP4, KV FP8), "
                   "nvfp4-super (NVIDIA's Nemotron-3-Super recipe) or a recipe JSON file (default bf16)")
    p.add_argument("--kv-dtype", default=None, help="override the recipe's KV-cache dtype (e.g. fp8)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per model instance")
    p.add_argument("--ep", type=int, default=1, help="expert parallelism for MoE: 1 or equal to --tp")
    p.add_argument("--workload", action="append", default=[], metavar="SPEC",
                   help="isl=8192,osl=1024,batch=64 (or concurrency=N); repeatable")
    p.add_argument("--context", type=int, default=None,
                   help="context length (tokens) at which to report the largest concurrency that fits")
    p.add_argument("--reserve-gib", type=float, default=None,
                   help="runtime memory reserve per GPU in GiB (default 2)")
    p.add_argument("--step-overhead-us", type=float, default=None,
                   help="serving-engine overhead per engine step, microseconds (default: the "
                   "TensorRT-LLM engine profile's, hwprofiles/data/engines/trtllm.json, or a "
                   "device profile's own in the older per-device layout)")
    p.add_argument("--request-overhead-ms", type=float, default=None,
                   help="serving-engine overhead per request added to TTFT, milliseconds "
                   "(default: the TensorRT-LLM engine profile's)")
    p.add_argument("--slo", default=None, metavar="SLO",
                   help="'per_user_tps>=100' and/or 'ttft<=2s': for each workload, sweep the "
                   "concurrency and report the best throughput that meets the SLO and fits")
    p.add_argument("--mtp", action="store_true",
                   help="serve with the config's MTP (multi-token prediction) blocks loaded: their "
                   "weights, KV and state count; with --acceptance they draft tokens for "
                   "speculative decoding (approximation: the MTP's 2h->h projection is priced as "
                   "two hidden x hidden linear blocks)")
    p.add_argument("--acceptance", type=float, default=None, metavar="A",
                   help="with --mtp: mean tokens accepted per verification step (bonus token "
                   "included), e.g. 3.45; credits A tokens per step and prices the draft and "
                   "verify passes")
    p.add_argument("--draft-tokens", type=int, default=None, metavar="D",
                   help="with --acceptance: tokens drafted per step (default ceil(A), at least 3)")
    p.add_argument("--attention-dp", action="store_true",
                   help="attention data parallelism over the --tp GPUs (TensorRT-LLM's "
                   "enable_attention_dp): dense parts unsharded per GPU on its own sequences, "
                   "routed experts expert-parallel (--ep) behind an all-to-all")
    p.add_argument("--engine", default=None, metavar="NAME",
                   help="serving engine: trtllm, trtllm-cpp, vllm, sglang (optionally "
                   "NAME@VERSION, e.g. vllm@0.16.0): its host overheads, overlap / async "
                   "scheduling, token budget, whether prefill steps carry decodes, and its "
                   "compute dtypes (hwprofiles/data/engines/, hwprofiles/data/tables/); default: "
                   "the TensorRT-LLM profile's overheads")
    p.add_argument("--arrival", choices=("closed", "staggered", "poisson", "fixed"),
                   default=None,
                   help="how requests arrive (every --workload): closed (default; B requests in "
                   "lockstep), staggered (B in flight, ending at spread-out times: random "
                   "lengths), poisson or fixed (an open loop at --rate requests/s, independent "
                   "or evenly spaced, into the workload's concurrency slots; a request that "
                   "finds them all busy waits, and an overloaded system says so)")
    p.add_argument("--rate", type=float, default=None, metavar="R",
                   help="with --arrival poisson or fixed: requests per second (QPS)")
    p.add_argument("--replay", type=int, default=None, metavar="N",
                   help="also replay N requests of each concurrency workload through the "
                   "engine's scheduler (costmodels.replay: arrivals, slots, a queue, chunked "
                   "prefill mixed with decode; step times from the same block model) and print "
                   "its TTFT / TPOT / latency percentiles and served rate beside the analytic "
                   "figures; the first 20%% of the requests are a warm-up")
    p.add_argument("--replay-seed", type=int, default=None, metavar="S",
                   help="with --replay: the seed of the Poisson arrivals (default 0)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


MAX_TP = 72
"""Largest --tp: 72 GPUs, one GB200 NVL72 rack, the largest NVLink domain shipped."""


def _finite_nonneg(v: float | None, field: str) -> None:
    from hwprofiles.errors import InputError

    if v is not None and not (math.isfinite(v) and v >= 0):
        raise InputError(f"expected a finite number >= 0, got {v}", field=field)


def _bytes(n: float) -> str:
    return gb_gib(n, 2)


def _workloads(target: object, wls: list, args: argparse.Namespace) -> list:
    """The workloads with ``--arrival`` / ``--rate`` and, with ``--engine``, that engine's
    own scheduling defaults (``Target.workloads``) wherever a workload does not set them."""
    from costmodels.target import Target
    from costmodels.workload import parse_workload
    from hwprofiles.errors import InputError

    assert isinstance(target, Target)
    if args.rate is not None and args.arrival not in ("poisson", "fixed"):
        raise InputError("--rate needs --arrival poisson or fixed", field="--rate")
    if args.arrival in ("poisson", "fixed") and args.rate is None:
        raise InputError(f"--arrival {args.arrival} needs --rate R (requests/s)",
                         field="--arrival")
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise InputError(f"expected requests/s > 0, got {args.rate}", field="--rate")
    out = []
    for w in target.workloads(wls):
        if args.arrival is not None:
            data = w.model_dump()
            data.update(arrival=args.arrival, rate=args.rate)
            if args.arrival != "closed" and data.get("batch") is not None:
                data.update(concurrency=data.pop("batch"))
            data["name"] = "" if w.name == w.label() else w.name
            w = parse_workload(data)
        out.append(w)
    return out


def _check_replay(wls: list, args: argparse.Namespace) -> None:
    """A bad ``--replay`` / ``--replay-seed`` or a static-batch workload to replay is a
    one-line error naming the flag."""
    from hwprofiles.errors import InputError

    if args.replay is None:
        if args.replay_seed is not None:
            raise InputError("--replay-seed needs --replay N", field="--replay-seed")
        return
    if args.replay < 1:
        raise InputError(f"expected a positive number of requests, got {args.replay}",
                         field="--replay")
    if args.replay_seed is not None and args.replay_seed < 0:
        raise InputError(f"expected an integer >= 0, got {args.replay_seed}",
                         field="--replay-seed")
    for w in wls:
        if w.batch is not None:
            raise InputError(f"a replay runs continuous batching: workload {w.name} is a "
                             "static batch; give concurrency=N", field="--replay")


def _pcts(label: str, p: dict) -> str:
    """``label p50/p90/p99 a / b / c ms (mean m)`` of a replay's figure (seconds)."""
    return (f"{label} p50/p90/p99 {p['p50'] * 1e3:,.1f} / {p['p90'] * 1e3:,.1f} / "
            f"{p['p99'] * 1e3:,.1f} ms (mean {p['mean'] * 1e3:,.1f})")


def _ms(v: float | None, width: int, unit: str = "ms") -> str:
    """Seconds as milliseconds right-aligned in ``width``; ``unbounded`` for None."""
    if v is None:
        return f"{'unbounded':>{width + len(unit)}}"
    return f"{v * 1e3:>{width},.1f}{unit}"


def run(args: argparse.Namespace) -> int:
    import hwprofiles
    from costmodels.dtypes import get_recipe, parse_dtype
    from costmodels.memory import DEFAULT_RESERVE_BYTES
    from costmodels.parallel import check_parallel
    from costmodels.serving import parse_slo
    from costmodels.target import Target
    from costmodels.workload import parse_workload
    from hwprofiles.errors import InputError
    from nas.arch import MAX_CONTEXT
    from nas.cost import cost_report
    from nas.hf import load_config
    from nas.spec import MAX_DRAFT_TOKENS, check_workload

    if not args.workload and args.context is None:
        raise InputError("give at least one --workload isl=...,osl=...,batch=N or --context N")
    if args.context is not None and args.context < 1:
        raise InputError(f"must be a positive integer, got {args.context}", field="--context")
    _finite_nonneg(args.reserve_gib, "--reserve-gib")
    _finite_nonneg(args.step_overhead_us, "--step-overhead-us")
    _finite_nonneg(args.request_overhead_ms, "--request-overhead-ms")
    if args.context is not None and args.context > MAX_CONTEXT:
        raise InputError(f"{args.context:,} exceeds the cap {MAX_CONTEXT:,} (MAX_CONTEXT: the "
                         "largest int32 position)", field="--context")
    if args.acceptance is not None and not 1 <= args.acceptance <= MAX_DRAFT_TOKENS + 1:
        raise InputError(f"expected tokens per step from 1 to {MAX_DRAFT_TOKENS + 1} "
                         f"(MAX_DRAFT_TOKENS + the bonus token), got {args.acceptance}",
                         field="--acceptance")
    if args.draft_tokens is not None and not 0 <= args.draft_tokens <= MAX_DRAFT_TOKENS:
        raise InputError(f"expected 0 to {MAX_DRAFT_TOKENS} (MAX_DRAFT_TOKENS), got "
                         f"{args.draft_tokens}", field="--draft-tokens")
    if args.tp > MAX_TP:
        raise InputError(f"{args.tp} exceeds the cap {MAX_TP} (MAX_TP: no node holds more "
                         "GPUs in one tensor-parallel group)", field="--tp")
    check_parallel(args.tp, args.ep)
    hw = hwprofiles.get(args.hw)
    recipe = get_recipe(args.precision)
    if args.kv_dtype:
        recipe = recipe.model_copy(update={"kv_cache": parse_dtype(args.kv_dtype)})
    wls = [parse_workload(w) for w in args.workload]
    for text, w in zip(args.workload, wls):
        check_workload(w, f"--workload {text}")
    target = Target(hw, args.tp, args.ep, bool(args.attention_dp), args.engine)
    wls = _workloads(target, wls, args)
    if args.acceptance is not None:
        if not args.mtp:
            raise InputError("needs --mtp (the MTP head drafts the tokens)", field="--acceptance")
        d = args.draft_tokens if args.draft_tokens is not None else max(
            3, int(-(-args.acceptance // 1)))
        wls = [parse_workload({**w.model_dump(), "draft_tokens": d,
                               "acceptance": args.acceptance}) for w in wls]
    elif args.draft_tokens is not None:
        raise InputError("needs --mtp --acceptance A", field="--draft-tokens")
    reserve = DEFAULT_RESERVE_BYTES if args.reserve_gib is None else args.reserve_gib * GIB
    arch = load_config(args.config)
    arch.check_tp(args.tp, "--tp", attention=not args.attention_dp)
    if args.acceptance is not None and not arch.mtp_blocks:  # as the search refuses it
        raise InputError("the config has no MTP head to draft tokens with (no MTP layers); "
                         "drop --mtp --acceptance", field="--acceptance")
    overhead = None if args.step_overhead_us is None else args.step_overhead_us * 1e-6
    req = None if args.request_overhead_ms is None else args.request_overhead_ms * 1e-3
    slo = parse_slo(args.slo) if args.slo is not None else None
    if slo is not None and not wls:
        raise InputError("--slo needs a --workload (its isl and osl)", field="--slo")
    _check_replay(wls, args)
    rep = cost_report(arch, target, recipe, wls, mtp=bool(args.mtp), context=args.context,
                      reserve_bytes=reserve, step_overhead_s=overhead, request_overhead_s=req,
                      slo=slo, replay=args.replay,
                      replay_seed=0 if args.replay_seed is None else args.replay_seed)
    model, conc, slo_points = rep.model, rep.concurrency, rep.slo
    out: dict = {"config": str(args.config)}
    for k, v in rep.figures.items():  # the --acceptance given, after "mtp"
        out[k] = v
        if k == "mtp":
            out["acceptance"] = args.acceptance
    if args.json:
        print(json.dumps(out, indent=2))
        return 0

    print(f"{args.config}: {arch.model_type or 'model'}, {arch.num_blocks} blocks, on "
          f"{hw.display_name} ({hw.name}), tp={args.tp} ep={args.ep}")
    print(f"  precision {recipe.name}: KV cache {recipe.kv_cache.value}, SSM state "
          f"{recipe.ssm_state.value}; memory per GPU {_bytes(hw.memory_bytes.value)}")
    print(f"  weights per GPU: {_bytes(model.weight_bytes)}"
          + ("" if not arch.mtp_blocks else "  (MTP blocks included)" if args.mtp
             else "  (MTP blocks not priced; --mtp includes them)"))
    if wls:
        print(f"  {'workload':<36} {'TTFT':>10} {'decode':>12} {'latency':>10} "
              f"{'tok/s/GPU':>11} {'tok/s/node':>11} {'tok/s/user':>10}  memory/GPU")
        for w in out["workloads"]:
            mem = _bytes(w["memory_bytes"]) + ("" if w["fits"] else "  DOES NOT FIT")
            tpot = ("-" if w["tpot_s"] is None else f"{w['tpot_s'] * 1e3:.2f}") + "ms/tok"
            lat = "unbounded" if w["latency_s"] is None else f"{w['latency_s']:.2f}s"
            print(f"  {w['name']:<36} {_ms(w['ttft_s'], 8)} {tpot:>12} {lat:>10} "
                  f"{w['throughput_tok_s']:>11,.0f} {w['throughput_node_tok_s']:>11,.0f} "
                  f"{w['per_user_tok_s']:>10,.1f}  {mem}")
            if "arrival" in w and w["arrival"]["arrival"] != "staggered":
                print(f"    {w['arrival']['message']}")
            if "replay" in w:
                rp = w["replay"]
                print(f"    {rp['message']}")
                print(f"      {_pcts('TTFT', rp['ttft_s'])}; {_pcts('TPOT', rp['tpot_s'])}")
                lat = rp["latency_s"]
                print(f"      latency p50/p99 {lat['p50']:,.2f} / {lat['p99']:,.2f} s; "
                      f"{rp['throughput_tok_s']:,.0f} tok/s/GPU served; "
                      f"{rp['counted']:,} requests counted after {rp['warmup']:,} warm-up")
        print("  (throughput: output tokens/s; per node = per GPU x "
              f"{hw.gpus_per_node.value:.0f} GPUs; GB = 10^9 bytes, GiB = 2^30 bytes)")
    for w, pt in slo_points:
        if not pt.feasible:
            print(f"  SLO {pt.slo.label()} at isl={w.isl},osl={w.osl}: no concurrency meets it "
                  f"(max concurrency that fits: {pt.max_concurrency})")
            continue
        print(f"  SLO {pt.slo.label()} at isl={w.isl},osl={w.osl}: best concurrency "
              f"{pt.concurrency} (of {len(pt.met)} swept, up to {pt.max_concurrency} fit) -> "
              f"{pt.throughput_tok_s:,.0f} tok/s/GPU, {pt.throughput_node_tok_s:,.0f} tok/s/node, "
              f"{pt.per_user_tok_s:,.1f} tok/s/user, TTFT {pt.ttft_s * 1e3:,.0f} ms")
    if conc is not None:
        c = conc
        print(f"  max concurrency at context {c.context:,} tokens: {c.max_concurrency}")
        print(f"    usable memory          {_bytes(c.usable_bytes)}")
        print(f"    - weights              {_bytes(c.weight_bytes)}")
        print(f"    - activation workspace {_bytes(c.workspace_bytes)}")
        print(f"    - runtime reserve      {_bytes(c.reserve_bytes)}")
        print(f"    = free for sequences   {_bytes(c.free_bytes)}")
        print(f"    per sequence: KV cache {_bytes(c.kv_bytes_per_sequence)} + SSM/conv state "
              f"{_bytes(c.state_bytes_per_sequence)} = {_bytes(c.per_sequence_bytes)}")
    return 0
