"""``puzzle-nas profile --blocks``: real torch blocks timed on the CPU into a block table,
resumable (a resumed run writes what an uninterrupted one writes, save for timing noise).

The timed blocks are tiny (hidden 64) and timed with few repeats: these tests check what is
written, never how fast anything ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from costmodels.measured import BlockMeasurements, load_blocks, plan_points  # noqa: E402
from hwprofiles.errors import InputError  # noqa: E402
from nas.search import alternatives, resolve  # noqa: E402
from nas.spec import parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

TINY_PARENT = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 256, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
}


def tiny_spec(**over) -> dict:
    spec = {
        "name": "tiny-measured",
        "parent": TINY_PARENT,
        "hardware": "h100-sxm",
        "precision": "bf16",
        "workloads": {"w": {"isl": 8, "osl": 8, "batch": 2}},
        "search_space": {"attention": {"kv_heads": [2, 1], "noop": True},
                         "ffn": {"fractions": [1.0, 0.5], "round_to": 32, "noop": True,
                                 "linear": True}},
        "budgets": [{"metric": "throughput", "workload": "w", "min": "110%"}],
        "solver": {"time_limit": 10},
    }
    spec.update(over)
    return spec


def tiny_blocks(spec: dict | None = None):
    """(blocks, parent arch, plan) of the tiny spec's space."""
    problem = resolve(parse_spec(spec or tiny_spec()), ".")
    blocks = [a.child for blk in alternatives(problem) for a in blk]
    return blocks, problem.parent, plan_points(list(problem.workloads.values()))


def run_profile(out: Path, progress=None) -> BlockMeasurements:
    from nas.profile.blocks import BlockTimer, profile_blocks

    blocks, arch, plan = tiny_blocks()
    timer = BlockTimer("cpu", "bf16", warmup=0, repeats=2, min_time_s=0.0)
    return profile_blocks(blocks, arch, plan, out, timer, spec="tiny", progress=progress)


def _without_times(t: BlockMeasurements) -> dict:
    """The table with the timing numbers (and only them) taken out."""
    d = t.model_dump(mode="json")
    for b in d["blocks"]:
        b["timings"] = sorted(({k: v for k, v in x.items()
                                if k not in ("median_s", "min_s", "max_s")}
                               for x in b["timings"]), key=json.dumps)
    d["blocks"].sort(key=lambda b: b["key"])
    if d.get("nonblock"):
        d["nonblock"]["timings"] = sorted(({k: v for k, v in x.items()
                                            if k not in ("median_s", "min_s", "max_s")}
                                           for x in d["nonblock"]["timings"]), key=json.dumps)
    d["gemm"] = [{k: v for k, v in g.items() if k not in ("median_s", "min_s", "flop_per_s")}
                 for g in d["gemm"]]
    d["attention"] = [{k: v for k, v in a.items() if k not in ("median_s", "min_s")}
                      for a in d["attention"]]
    return d


def test_block_table_times_each_distinct_shape_once(tmp_path):
    out = tmp_path / "BLOCKS.json"
    table = run_profile(out)
    assert load_blocks(out) == table  # what was returned is what was written
    blocks, arch, plan = tiny_blocks()
    kinds = sorted(b.kind for b in table.blocks)
    # attention kv2, kv1; ffn 128, 64; the linear replacement of attention and of FFN is one
    # shape (timed once); no-ops are not timed
    assert kinds == ["attention", "attention", "ffn", "ffn", "linear"]
    assert len({b.key for b in table.blocks}) == len(table.blocks)
    assert table.device_kind == "cpu" and table.dtype == "bf16" and table.hidden == 64
    assert table.software["torch"] == torch.__version__
    for b in table.blocks:
        assert table.complete(b)
        assert {t.point for t in b.timings} == set(plan)
        for t in b.timings:
            assert 0 < t.min_s <= t.median_s <= t.max_s
            # the peak holds at least the weights and the input (bf16 = 2 bytes)
            assert t.peak_bytes >= b.weight_bytes + 2 * t.batch * t.tokens * 64
    # decode points hold a cache of the context: attention's peak grows with it
    att = next(b for b in table.blocks if b.kind == "attention")
    dec = {t.batch: t.peak_bytes for t in att.timings if t.mode == "decode"}
    assert dec[2] > dec[1]
    assert table.gemm and all(g.flop_per_s > 0 for g in table.gemm)
    # the model around the blocks: embedding, final norm and the untied head, every point
    nb = table.nonblock
    assert nb is not None and nb.kind == "nonblock"
    assert nb.row == {"hidden": 64, "vocab": 256, "final_norm": 1}
    assert nb.weight_bytes == 2 * (2 * 256 * 64 + 64)
    assert {t.point for t in nb.timings} == set(plan)
    assert all(t.peak_bytes >= nb.weight_bytes for t in nb.timings)


def test_resumed_profile_equals_uninterrupted(tmp_path, monkeypatch):
    import nas.profile.blocks

    full = run_profile(tmp_path / "full.json")
    monkeypatch.setattr(nas.profile.blocks, "GROUP_BYTES", 1)  # a group per block

    class Stop(Exception):
        pass

    def stop_after(k: int):
        def progress(done: int, total: int, note: str) -> None:
            if note and done >= k:
                raise Stop

        return progress

    part = tmp_path / "part.json"
    with pytest.raises(Stop):  # the non-block parts first (4 points), then 2 groups of 4
        run_profile(part, progress=stop_after(11))
    kept = load_blocks(part)  # the file holds every block timed before the interruption
    n_kept = sum(len(b.timings) for b in kept.blocks)
    # on a CPU a group's points are timed interleaved and written together: whole groups
    assert n_kept == 8 and all(kept.complete(b) for b in kept.blocks)
    assert not (kept.blocks and all(kept.complete(b) for b in kept.blocks)
                and len(kept.blocks) == len(full.blocks))
    seen: list[int] = []
    resumed = run_profile(part, progress=lambda d, t, n: seen.append(d))
    assert seen[0] == n_kept + 4  # the resumed run starts from the points already timed
    assert _without_times(resumed) == _without_times(full)
    assert load_blocks(part) == resumed
    # the points timed before the interruption are kept as they were, not timed again
    again = {b.key: b.timings for b in resumed.blocks}
    for b in kept.blocks:
        assert again[b.key][:len(b.timings)] == b.timings
    # a finished table resumes to itself without timing anything
    assert run_profile(part) == resumed


def test_the_non_block_step_is_timed_and_prices_the_models_step(tmp_path):
    """The model around the blocks is timed at the plan's points, and where a spec prices
    its blocks from the table the non-block step is the timed one too: a decode step
    (TPOT of the batch-mode workload) is the parent's blocks' timed decode plus the
    non-block parts' timed decode plus the engine's step overhead, exactly. A table
    written before the non-block parts were timed resumes by timing only them, and
    still prices (the roofline then prices them)."""
    from costmodels.measured import nonblock_row
    from nas.search.blueprint import predict

    out = tmp_path / "BLOCKS.json"
    table = run_profile(out)
    spec = tiny_spec(costs={"measured": str(out)})
    problem = resolve(parse_spec(spec), ".")
    parent = problem.parent
    got = predict(parent, problem)["w"]["tpot_s"]
    ctx = next(t.context for t in table.nonblock.timings if t.mode == "decode")
    blocks = sum(table.seconds(r, "decode", 2.0, 1, ctx) for r in
                 (dict(zip(parent.table.columns(), map(int, row)))
                  for row in zip(*(getattr(parent.table, c) for c in parent.table.columns()))))
    from costmodels.measured import nonblock_steps
    from costmodels.model import price_nonblock
    from nas.search.blueprint import nonblock_shape

    row = nonblock_row(64, 256, False, True)
    wls = list(problem.workloads.values())

    def nonblock(t):
        return price_nonblock(nonblock_shape(parent), problem.hw, problem.recipe, wls,
                              measured=nonblock_steps(t, row)).decode_s[0]

    assert got == pytest.approx(blocks + nonblock(table), rel=1e-12)
    # one more millisecond timed per decode step is one more millisecond of TPOT
    later = [t.model_copy(update={k: getattr(t, k) + 1e-3 for k in ("min_s", "median_s",
                                                                     "max_s")})
             if t.mode == "decode" else t for t in table.nonblock.timings]
    slower = table.model_copy(update={"nonblock": table.nonblock.model_copy(
        update={"timings": later})})
    assert nonblock(slower) - nonblock(table) == pytest.approx(1e-3, rel=1e-9)
    assert table.nonblock.row == row
    # an older table (no non-block timings) prices by the roofline, and resumes
    old = table.model_copy(update={"nonblock": None})
    out.write_text(old.model_dump_json())
    roofline = predict(parent, resolve(parse_spec(spec), "."))["w"]["tpot_s"]
    assert roofline != got
    resumed = run_profile(out)
    assert [b.timings for b in resumed.blocks] == [b.timings for b in table.blocks]
    assert {t.point for t in resumed.nonblock.timings} == {t.point for t in table.nonblock.timings}


def test_resume_refuses_another_runs_file(tmp_path):
    from nas.profile.blocks import BlockTimer, profile_blocks

    out = tmp_path / "b.json"
    run_profile(out)
    blocks, arch, plan = tiny_blocks()
    other = BlockTimer("cpu", "bf16", warmup=0, repeats=3, min_time_s=0.0)
    with pytest.raises(InputError, match=r"written by another run \(repeats: 2 here, 3 now\)"):
        profile_blocks(blocks, arch, plan, out, other)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nas", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_cli_profile_blocks_then_calibrate_and_search(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tiny_spec()))
    p = _cli("profile", "--blocks", str(spec), "-o", str(tmp_path / "BLOCKS.json"),
             "--warmup", "0", "--repeats", "2", "--threads", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "wrote" in p.stdout and "decode b2@12" in p.stdout
    table = load_blocks(tmp_path / "BLOCKS.json")
    assert table.threads == 1
    # CPU timings are not an H100's: refused in one line, nothing written, unless --force
    p = _cli("calibrate", "--blocks", "BLOCKS.json", "--hw", "h100-sxm", "-o", "cal.json",
             "--max-evals", "5", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"was timed on {table.device} (cpu), not on NVIDIA H100" in p.stderr
    assert "--force" in p.stderr and not (tmp_path / "cal.json").exists()
    # calibrate to the blocks: the per-kind table before and after, and a valid profile
    p = _cli("calibrate", "--blocks", "BLOCKS.json", "--hw", "h100-sxm", "-o", "cal.json",
             "--max-evals", "5", "--force", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "MAPE after" in p.stdout and "attention" in p.stdout and "ffn" in p.stdout
    import hwprofiles

    cal = hwprofiles.load(tmp_path / "cal.json")
    assert "block timings" in json.dumps(cal.model_dump(mode="json"))
    # a search priced by the measurements says so in its report
    mspec = tmp_path / "measured.json"
    mspec.write_text(json.dumps(tiny_spec(costs={"measured": "BLOCKS.json"})))
    p = _cli("search", str(mspec), "-o", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"block runtimes measured on {table.device}" in p.stdout
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"measured on {table.device}" in report
    bp = json.loads((tmp_path / "out" / "blueprint.json").read_text())
    assert bp["provenance"]["block_costs"].startswith(f"measured on {table.device}")


def test_one_command_probes_times_calibrates_and_keeps_the_better_profile(tmp_path):
    """``profile --blocks SPEC --calibrate -o P.json``: the probe, the block table, the kept
    profile and the plot, the MAPE per kind and phase before and after; the profile written
    prices the timed blocks no worse than the probed one."""
    import hwprofiles
    from costmodels.measured import predict_points, recipe_for, rms_log_error

    # the spec names the profile this command writes (not there yet): its blocks resolve
    # against the probed profile
    (tmp_path / "spec.json").write_text(json.dumps(tiny_spec(hardware="P.json")))
    p = _cli("profile", "--blocks", "spec.json", "--calibrate", "--quick", "--device", "cpu",
             "-o", "P.json", "--warmup", "0", "--repeats", "2", "--max-evals", "5",
             "--accept-noisy", cwd=tmp_path)  # a shared CI core may time a noisy probe
    assert p.returncode == 0, p.stderr
    assert "is this command's output" in p.stdout
    for name in ("P.json", "P.probed.json", "P.blocks.json", "P.calibration.png"):
        assert (tmp_path / name).is_file(), name
    assert "[3/3]" in p.stdout and "MAPE after" in p.stdout
    for kind in ("attention", "ffn", "linear"):
        for mode in ("prefill", "decode"):
            assert any(line.split()[:2] == [kind, mode] for line in p.stdout.splitlines())
    table = load_blocks(tmp_path / "P.blocks.json")
    assert table.threads == 1  # probe and blocks on the same single thread
    assert all(t.trace is not None for e in table.blocks for t in e.timings)
    assert hwprofiles.load(tmp_path / "P.probed.json").eager is not None
    recipe = recipe_for(table)
    kept, probed = (hwprofiles.load(tmp_path / n) for n in ("P.json", "P.probed.json"))
    assert rms_log_error(predict_points(table, kept, recipe)) <= \
        rms_log_error(predict_points(table, probed, recipe))
    p = _cli("profile", "--calibrate", "-o", "Q.json", cwd=tmp_path)
    assert p.returncode == 2 and "--calibrate needs --blocks" in p.stderr
    assert not (tmp_path / "Q.json").exists()
    # a spec naming a profile file that is neither there nor this command's output: one
    # line, before anything is probed
    (tmp_path / "typo.json").write_text(json.dumps(tiny_spec(hardware="nothere.json")))
    p = _cli("profile", "--blocks", "typo.json", "--calibrate", "--quick", "--device", "cpu",
             "-o", "Q.json", cwd=tmp_path)
    assert p.returncode == 2 and "nothere.json" in p.stderr and "file not found" in p.stderr
    assert "Traceback" not in p.stderr and "[1/3]" not in p.stdout
    assert not (tmp_path / "Q.probed.json").exists()


def test_attention_is_timed_at_the_blocks_shapes_and_becomes_the_curve(tmp_path):
    """``profile --blocks`` times causal SDPA at every attention shape of the space and
    prefill point (the cost model's FLOP count beside it); calibration starts from the
    attention curve measured there instead of the probe's one head size."""
    import hwprofiles
    from costmodels.measured import with_attention_curve

    table = run_profile(tmp_path / "b.json")
    blocks, _, plan = tiny_blocks()
    shapes = {(b.num_heads, b.num_kv_heads, b.head_dim) for b in blocks if b.kind == "attention"}
    prefill = [p for p in plan if p.mode == "prefill"]
    assert {(a.heads, a.kv_heads, a.head_dim) for a in table.attention} == shapes
    assert len(table.attention) == len(shapes) * len(prefill)
    for a in table.attention:
        assert a.flops == 4.0 * a.head_dim * a.heads * a.tokens * (a.tokens + 1) / 2 * a.batch
    hw = hwprofiles.get("h100-sxm")
    got, note = with_attention_curve(hw, table)
    assert "attention at the blocks' shapes" in note
    assert "at the blocks' shapes" in got.efficiency.attention.source
    assert {f for f, _ in got.efficiency.attention.points} == {a.flops for a in table.attention}
    assert got.efficiency.matmul == hw.efficiency.matmul  # only the attention curve moves
    assert with_attention_curve(hw, table.model_copy(update={"attention": []})) == (hw, "")


def test_timings_match_the_profile_of_their_device(tmp_path):
    import hwprofiles
    from costmodels.measured import timed_on

    table = run_profile(tmp_path / "b.json")
    cpu = hwprofiles.get("h100-sxm").model_copy(update={
        "name": "this-cpu", "display_name": table.device, "vendor": "amd", "aliases": []})
    assert timed_on(table, cpu)
    for name in ("h100-sxm", "mi300x", "b200"):
        assert not timed_on(table, hwprofiles.get(name))
    gpu = table.model_copy(update={"device": "NVIDIA H100 80GB HBM3", "device_kind": "cuda"})
    assert timed_on(gpu, hwprofiles.get("h100-sxm"))
    assert not timed_on(gpu, hwprofiles.get("h200-sxm"))
    assert not timed_on(gpu, hwprofiles.get("h100-pcie"))  # 'h100pcie' is not in the name


def test_calibrate_never_writes_a_fit_that_raised_the_error(tmp_path, monkeypatch, capsys):
    """A fit that prices the blocks worse than the profile it started from is not written:
    the best of the given profile, the given profile with the timed GEMM curve and the fit
    is, and the output says so (the fit is made worse here on purpose: a kernel overhead of
    one second)."""
    import costmodels.measured as measured
    import hwprofiles
    from hwprofiles.schema import Figure
    from nas.cli import main

    table = run_profile(tmp_path / "B.json")
    real = measured.fit_blocks

    def worse(*args, **kw):
        res = real(*args, **kw)
        res.profile = res.profile.model_copy(update={
            "kernel_overhead_s": Figure(value=1.0, source="made worse by the test")})
        return res

    monkeypatch.setattr(measured, "fit_blocks", worse)
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--blocks", str(tmp_path / "B.json"), "--hw", "h100-sxm",
                 "-o", str(out), "--max-evals", "3", "--force"]) == 0
    said = capsys.readouterr().out
    assert "the fit did not lower the error" in said and "not the fit" in said
    written = hwprofiles.load(out)
    assert written.kernel_overhead_s.value != 1.0
    recipe = measured.recipe_for(table)
    given = measured.rms_log_error(measured.predict_points(table, hwprofiles.get("h100-sxm"),
                                                           recipe))
    assert measured.rms_log_error(measured.predict_points(table, written, recipe)) <= given


def test_cli_refuses_bad_block_inputs(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tiny_spec(hardware={"profile": "h100-sxm", "tp": 2})))
    p = _cli("profile", "--blocks", str(spec), "-o", str(tmp_path / "B.json"), cwd=tmp_path)
    assert p.returncode == 2 and "tp = ep = 1" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "B.json").exists()
    p = _cli("calibrate", "--blocks", "missing.json", "--hw", "h100-sxm", "-o", "x.json",
             cwd=tmp_path)
    assert p.returncode == 2 and "missing.json: file not found" in p.stderr
    (tmp_path / "notblocks.json").write_text("{}")
    p = _cli("calibrate", "--blocks", "notblocks.json", "--hw", "h100-sxm", "--report",
             cwd=tmp_path)
    assert p.returncode == 2 and "format" in p.stderr and "Traceback" not in p.stderr


def test_decode_steps_keep_the_filled_cache():
    """Every timed decode step starts from the cache as the prefill of ``context`` tokens
    left it: the memory alive during a step does not grow with the number of steps timed
    before it (it would, by one token per step, if a KV cache were left to grow)."""
    from costmodels.measured import Point
    from nas.arch import MLA, Attention, DeltaNet, Mamba, ModelArch
    from nas.profile.blocks import BlockTimer

    blocks = [Attention(num_heads=4, num_kv_heads=2, head_dim=16),
              MLA(num_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                  v_head_dim=16),
              Mamba(num_heads=4, head_dim=16, state_size=16, n_groups=1),
              DeltaNet(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)]
    arch = ModelArch(hidden_size=64, vocab_size=256, blocks=tuple(blocks))
    p = Point(mode="decode", batch=2, tokens=1, context=24)
    for cfg in blocks:
        peaks = []
        for repeats in (1, 9):
            timer = BlockTimer("cpu", "fp32", warmup=3, repeats=repeats, min_time_s=0.0)
            blk = timer.build(cfg, arch)
            peaks.append(timer.time_point(blk, cfg, 64, p, 0).peak_bytes)
        assert peaks[0] == peaks[1], cfg.kind


def test_cold_timing_rotates_copies_of_each_block_beyond_the_cores_l2(tmp_path):
    """``--cold`` (CPU): each call of a point runs on the next of several copies of the block,
    distinct tensors of at least twice the core's L2 in all, so that its weights come from
    beyond the core's caches as in a model; the table says so, and a warm table is not
    resumed as a cold one."""
    from nas.profile.blocks import BlockTimer, l2_bytes, profile_blocks

    blocks, arch, plan = tiny_blocks()
    timer = BlockTimer("cpu", "bf16", warmup=0, repeats=2, min_time_s=0.0, cold=True)
    assert timer.cold_bytes == 2 * l2_bytes() > 0
    seen: list[int] = []
    real = timer.prepare

    def prepare(blk, cfg, hidden, p):  # type: ignore[no-untyped-def]
        seen.append(id(next(blk.parameters())))
        return real(blk, cfg, hidden, p)

    timer.prepare = prepare  # type: ignore[method-assign]
    blk = timer.build(blocks[1], arch)
    fn, resident = timer._rotated(blk, blocks[1], arch.hidden_size, plan[-1])
    from nas.profile.blocks import _storage_bytes

    assert len(seen) == len(set(seen)) >= 2  # distinct copies
    assert len(seen) * _storage_bytes(resident) >= timer.cold_bytes or len(seen) == 64
    fn()
    out = tmp_path / "COLD.json"
    timer.prepare = real  # type: ignore[method-assign]
    table = profile_blocks(blocks, arch, plan, out, timer, spec="tiny")
    assert "another copy of the block" in table.timing
    assert all(table.complete(b) for b in table.blocks)
    with pytest.raises(InputError, match="another run"):
        run_profile(out)  # the default (warm) timing of the same spec
