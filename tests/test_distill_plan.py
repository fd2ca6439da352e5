"""``puzzle-nas distill --plan`` (``nas.train.plan``): the activation rule per block kind
against what autograd really keeps, the plan's CLI (printed, refused in one line, nothing
written), and a real run refused before anything loads when its plan does not fit."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nas.arch import FFN, Attention, Mamba, ModelArch, MoE

REPO = Path(__file__).resolve().parents[1]
ARCH = ModelArch(hidden_size=128, vocab_size=512, blocks=(
    Attention(num_heads=4, num_kv_heads=2, head_dim=32),
    FFN(width=512),
    FFN(width=384, gated=False, activation="relu2"),
    MoE(num_experts=8, top_k=2, expert_width=128, shared_width=128),
    MoE(num_experts=4, top_k=1, expert_width=192, gated=True, activation="silu"),
    Mamba(num_heads=8, head_dim=16, state_size=16, n_groups=2),
    Mamba(num_heads=4, head_dim=32, state_size=32, n_groups=1),
))


def test_the_plan_imports_no_torch():
    code = ("import sys, nas.train.plan, nas.cli.distill; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_the_plans_chunk_is_the_losss():
    pytest.importorskip("torch")
    import nas.train.distill
    import nas.train.plan

    assert nas.train.plan.CHUNK_BYTES == nas.train.distill.CHUNK_BYTES


def test_saved_values_per_token_match_autograd_per_block_kind():
    """The rule's values per token are what autograd saves for each block's backward pass
    (parameters excluded), within 10 %, on every kind it names."""
    torch = pytest.importorskip("torch")
    from nas.modules.model import CausalLM
    from nas.train.plan import MAMBA_CHUNK, saved_values_per_token

    torch.manual_seed(0)
    model = CausalLM(ARCH)
    assert all(getattr(b.mixer, "chunk_size", MAMBA_CHUNK) == MAMBA_CHUNK
               for b in model.blocks)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    rule = saved_values_per_token(ARCH)
    b, s = 2, 256
    x = torch.randn(b, s, ARCH.hidden_size, requires_grad=True)
    for i, blk in enumerate(model.blocks):
        seen, total = set(params), [0]

        def pack(t, seen=seen, total=total):  # type: ignore[no-untyped-def]
            k = t.untyped_storage().data_ptr()
            if k not in seen:
                seen.add(k)
                total[0] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            blk(x)
        measured = total[0] / (b * s * 4)
        assert rule[i] == pytest.approx(measured, rel=0.10), (ARCH.blocks[i], rule[i],
                                                              measured)


def _cli(argv: list[str]) -> tuple[int, str, str]:
    from nas.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture()
def configs(tmp_path: Path) -> tuple[Path, Path]:
    from nas.hf import to_hf

    parent = tmp_path / "parent.json"
    parent.write_text(json.dumps(to_hf(ARCH)))
    child = ARCH.replace_blocks([*ARCH.blocks[:1], *ARCH.blocks[2:]])
    blueprint = tmp_path / "blueprint.json"
    blueprint.write_text(json.dumps({"child": to_hf(child)}))
    return blueprint, parent


def test_plan_prints_and_refuses_in_one_line(configs, tmp_path):
    child, parent = configs
    base = ["distill", str(child), "--teacher", str(parent), "--plan", "--tokens", "65536",
            "--seq-len", "256", "--batch", "8"]
    rc, out, err = _cli([*base, "--nproc", "4", "--hardware", "h100-sxm"])
    assert rc == 0, err
    assert "4 rank(s), sharded" in out and "fits" in out and "time on h100-sxm" in out
    rc, out, err = _cli([*base, "--nproc", "2", "--device-memory", "0.001"])
    assert rc == 2 and err.count("\n") == 1 and "the plan does not fit" in err, err
    assert "gradients" in err and "0.00 GiB per rank" in err
    rc, _, err = _cli([*base, "--nproc", "3"])
    assert rc == 2 and "multiple of the 3 ranks" in err
    rc, _, err = _cli(["distill", str(tmp_path / "nope.json"), "--teacher", str(parent),
                       "--plan", "--tokens", "10"])
    assert rc == 2 and "nope.json" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blueprint.json", "parent.json"]


def test_micro_batch_auto_takes_the_largest_that_fits(configs):
    """``--micro-batch auto``: the largest divisor of a rank's share whose plan fits the
    memory per rank, said in one line; the whole share with no memory known; a bad value is
    refused by the parser."""
    from nas.train.plan import distill_plan

    child, parent = configs  # the fixture's: ARCH less its second block, and ARCH
    base = ["distill", str(child), "--teacher", str(parent), "--plan", "--tokens", "65536",
            "--seq-len", "256", "--batch", "16", "--nproc", "2"]
    kw = dict(world=2, replicas=False, batch=16, seq_len=256, tokens=65536, eval_every=50,
              eval_tokens=16384, teacher_dtype="float32", student_dtype="float32",
              mixed_precision=None, keep_best=True, lr_sweep=0, sweep_steps=None,
              checkpointing=False, backend="gloo")
    c, t = ARCH.replace_blocks([*ARCH.blocks[:1], *ARCH.blocks[2:]]), ARCH
    totals = {m: distill_plan(c, t, micro_batch=m, **kw).total for m in (8, 4, 2, 1)}
    assert totals[8] > totals[4] > totals[2] > totals[1]
    cap = (totals[4] + totals[2]) / 2 / 2**30  # fits 2 rows per pass, not 4
    rc, out, err = _cli([*base, "--micro-batch", "auto", "--device-memory", f"{cap:.9f}"])
    assert rc == 0, err
    assert err.strip() == "puzzle-nas distill: --micro-batch auto: 2 of the 8 rows per rank " \
        "per pass"
    rc, out, err = _cli([*base, "--micro-batch", "auto", "--hardware", "h100-sxm"])
    assert rc == 0 and "auto: 8 of the 8 rows" in err, err
    from nas.cli import main as cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        cli([*base, "--micro-batch", "none"])  # argparse: usage and one line, exit 2
    assert exc.value.code == 2 and "expected a positive number of rows or auto" in err.getvalue()


def test_more_ranks_hold_less_and_checkpointing_keeps_less():
    from nas.train.plan import distill_plan

    kw = dict(batch=8, seq_len=256, tokens=65536, eval_every=50, eval_tokens=4096,
              teacher_dtype="bfloat16", student_dtype="bfloat16", mixed_precision=None,
              keep_best=True, lr_sweep=0, sweep_steps=None, replicas=False)
    one, two, four = (distill_plan(ARCH, ARCH, world=n, checkpointing=False, **kw)
                      for n in (1, 2, 4))
    assert one.total > two.total > four.total
    assert four.student_weights == pytest.approx(one.student_weights / 4)
    ck = distill_plan(ARCH, ARCH, world=2, checkpointing=True, **kw)
    assert ck.activations < two.activations
    mp = distill_plan(ARCH, ARCH, world=2, checkpointing=False,
                      **{**kw, "mixed_precision": "bfloat16"})
    assert mp.student_weights == 2 * two.student_weights  # float32 master weights


def test_micro_batches_hold_one_micro_batchs_activations_and_move_the_student_each_time():
    """Gradient accumulation (``micro_batch``): activations and logits are one pass's rows,
    weights, gradients and optimizer state are unchanged, the sharded student is gathered
    and reduce-scattered once per pass (its bytes times the passes), the rows sent to and
    from the pipelined teacher are the same in all; a plan with more than one row per pass
    suggests one."""
    from nas.train.plan import distill_plan

    kw = dict(world=2, batch=8, seq_len=256, tokens=65536, eval_every=50, eval_tokens=4096,
              teacher_dtype="bfloat16", student_dtype="bfloat16", mixed_precision="bfloat16",
              keep_best=False, lr_sweep=0, sweep_steps=None, replicas=False,
              checkpointing=True, backend="nccl", expert_parallel="off")
    whole = distill_plan(ARCH, ARCH, **kw)
    one = distill_plan(ARCH, ARCH, micro_batch=1, **kw)  # 4 passes of 1 row per rank
    two = distill_plan(ARCH, ARCH, micro_batch=2, **kw)
    assert distill_plan(ARCH, ARCH, micro_batch=4, **kw) == whole
    assert one.activations == pytest.approx(whole.activations / 4)
    assert two.activations == pytest.approx(whole.activations / 2)
    assert one.logits < whole.logits
    for f in ("teacher_weights", "student_weights", "gradients", "optimizer", "gathered"):
        assert getattr(one, f) == getattr(whole, f), f
    p_s = float(ARCH.block_params().sum() + sum(ARCH.nonblock_role_params().values()))
    student = (2 * p_s * 2 + p_s * 4) / 2  # bf16 gathers twice, float32 reduce-scatter
    assert one.sent_per_step - whole.sent_per_step == pytest.approx(3 * student)
    assert any("--micro-batch 1" in h for h in whole.hints)
    assert not any("--micro-batch" in h for h in one.hints)


def test_a_run_whose_plan_does_not_fit_is_refused_before_anything_loads(tmp_path):
    pytest.importorskip("torch")
    from nas.child import save_pretrained
    from nas.modules.model import CausalLM

    d = tmp_path / "m"
    save_pretrained(CausalLM(ARCH), d)
    import numpy as np

    np.save(tmp_path / "t.npy", np.zeros(8192, dtype=np.uint16))
    out = tmp_path / "out"
    rc, _, err = _cli(["distill", str(d), "--teacher", str(d), "--data",
                       str(tmp_path / "t.npy"), "-o", str(out), "--tokens", "4096",
                       "--seq-len", "64", "--batch", "8", "--device-memory", "0.001"])
    assert rc == 2 and "the plan does not fit" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_precision_resolves_to_mixed_for_16_bit_checkpoints():
    """``auto``: a 16-bit checkpoint trains from float32 master weights in its dtype, a
    float32 one in float32, none when a dtype is given; replicas with 16 bits refused."""
    from nas.train.plan import resolve_mixed_precision as r

    assert r("auto", None, "bfloat16", "bfloat16") == "bfloat16"
    assert r("auto", None, "float32", "float16") == "float16"
    assert r("auto", None, "float32", "float32") is None
    assert r("auto", "bfloat16", "bfloat16", "bfloat16") is None  # pure bf16
    assert r(None, None, "bfloat16", "bfloat16") is None
    assert r("float16", None, "float32", "float32") == "float16"
    assert r("auto", None, "float32", "float32", replicas=True) is None
    with pytest.raises(ValueError, match="--replicas"):
        r("auto", None, "bfloat16", "bfloat16", replicas=True)


def _bf16_configs(tmp_path: Path) -> tuple[Path, Path]:
    from nas.hf import to_hf

    parent = tmp_path / "parent.json"
    parent.write_text(json.dumps({**to_hf(ARCH), "torch_dtype": "bfloat16"}))
    child = ARCH.replace_blocks([*ARCH.blocks[:1], *ARCH.blocks[2:]])
    blueprint = tmp_path / "blueprint.json"
    blueprint.write_text(json.dumps({"child": {**to_hf(child), "torch_dtype": "bfloat16"}}))
    return blueprint, parent


def test_a_bf16_plan_states_float32_masters_by_default_and_pure_bf16_on_request(tmp_path):
    """The plan of a bf16 parent holds float32 master weights and AdamW state unless
    ``--pure-bf16``: the student's weights, gradients and optimizer state halve, and the
    first line says which precision the plan assumes."""
    child, parent = _bf16_configs(tmp_path)
    base = ["distill", str(child), "--teacher", str(parent), "--plan", "--tokens", "65536",
            "--seq-len", "256", "--batch", "8", "--nproc", "2"]
    rc, mixed, err = _cli(base)
    assert rc == 0, err
    assert "teacher in bfloat16 (pipelined), student master weights float32, compute bfloat16" in mixed
    rc, pure, err = _cli([*base, "--pure-bf16"])
    assert rc == 0, err
    assert "teacher in bfloat16 (pipelined), student master weights bfloat16, compute bfloat16" in pure

    from nas.cli import build_parser
    from nas.cli.distill import plan_of

    mp, pb = (plan_of(build_parser().parse_args(argv), 2) for argv in (base, [*base, "--pure-bf16"]))
    assert mp.dtypes == ("bfloat16", "float32", "bfloat16")
    assert pb.dtypes == ("bfloat16", "bfloat16", "bfloat16")
    assert mp.student_weights > 0 and mp.teacher_weights == pb.teacher_weights
    for key in ("student", "gradients", "optimizer"):
        assert mp.figures()[key] == 2 * pb.figures()[key]
    rc, none, err = _cli([*base, "--mixed-precision", "none"])
    assert rc == 0 and none == pure, err
    rc, _, err = _cli([*base, "--pure-bf16", "--mixed-precision", "float16"])
    assert rc == 2 and err.count("\n") == 1 and "--pure-bf16" in err, err
    rc, _, err = _cli([*base, "--replicas"])
    assert rc == 2 and err.count("\n") == 1 and "--replicas" in err and \
        "mixed precision" in err, err
    rc, out, err = _cli([*base, "--replicas", "--pure-bf16"])
    assert rc == 0 and "replicas" in out, err
    # a float32 child config (a blueprint's) is trained in bf16 with --pure-bf16 too
    f32 = tmp_path / "f32.json"
    f32.write_text(json.dumps({"child": {k: v for k, v in json.loads(child.read_text())[
        "child"].items() if k != "torch_dtype"}}))
    rc, out, err = _cli([*base[:1], str(f32), *base[2:], "--pure-bf16"])
    assert rc == 0 and "student master weights bfloat16, compute bfloat16" in out, err


def test_expert_parallel_gathers_no_experts_and_sends_tokens_instead():
    """With the student's experts sharded whole over the ranks (``nas.train.ep``) the plan
    gathers each MoE block without its routed experts, holds the same 1/N shares, and sends
    the tokens' all_to_all instead of the experts' gathers and reduce-scatters; ``auto`` is
    on on sharded ranks (experts that do not divide: rank 0 holds ``ceil(E / N)``), ``on``
    where it cannot run is refused in one line."""
    from nas.train.plan import distill_plan, resolve_expert_parallel, routed_expert_params

    kw = dict(batch=8, seq_len=256, tokens=65536, eval_every=50, eval_tokens=4096,
              teacher_dtype="bfloat16", student_dtype="bfloat16", mixed_precision="bfloat16",
              keep_best=True, lr_sweep=0, sweep_steps=None, replicas=False,
              checkpointing=False, backend="nccl")
    rp = routed_expert_params(ARCH)
    assert rp[3] == 3 * 8 * 128 * 128 and rp[4] == 3 * 4 * 192 * 128 and rp.sum() == rp[3:5].sum()
    for n in (2, 4):
        off = distill_plan(ARCH, ARCH, world=n, expert_parallel="off", **kw)
        on = distill_plan(ARCH, ARCH, world=n, expert_parallel="auto", **kw)
        assert on.expert_parallel and not off.expert_parallel
        assert "expert parallel" in on.lines()[0] and "expert parallel" not in off.lines()[0]
        for f in ("student_weights", "gradients", "optimizer", "copies", "activations"):
            assert getattr(on, f) == getattr(off, f), f
        assert on.gathered < off.gathered
        # the bytes: the experts' gathers (bf16, twice) and reduce-scatters (float32) go,
        # the tokens' all_to_all comes (4 per MoE block: 2 forward, 2 backward)
        ring = (n - 1) / n
        tokens = 8 * 256 / n
        a2a = sum((4 * tokens * b.top_k * 128 * 2 + b.num_experts * 8) * ring
                  for b in ARCH.blocks if isinstance(b, MoE))
        assert on.sent_per_step == pytest.approx(
            off.sent_per_step - (2 * 2 + 4) * rp.sum() * ring + a2a)
    ck = distill_plan(ARCH, ARCH, world=2, **{**kw, "checkpointing": True})
    ck_off = distill_plan(ARCH, ARCH, world=2, **{**kw, "checkpointing": True},
                          expert_parallel="off")
    assert ck.sent_per_step - ck_off.sent_per_step > \
        distill_plan(ARCH, ARCH, world=2, **kw).sent_per_step \
        - distill_plan(ARCH, ARCH, world=2, **kw, expert_parallel="off").sent_per_step
    # a sharded teacher's experts are sharded whole too: it gathers and sends less
    t_off, t_on = (distill_plan(ARCH, ARCH, world=2, teacher_layout="sharded",
                                expert_parallel=m, **kw) for m in ("off", "auto"))
    off_2 = distill_plan(ARCH, ARCH, world=2, expert_parallel="off", **kw)
    assert t_on.teacher_expert_parallel and not t_off.teacher_expert_parallel
    assert not distill_plan(ARCH, ARCH, world=2, **kw).teacher_expert_parallel  # pipelined
    assert "(sharded, expert parallel)" in t_on.lines()[0]
    a2a_t = sum((2 * 8 * 256 / 2 * b.top_k * 128 * 2 + b.num_experts * 8) / 2
                for b in ARCH.blocks if isinstance(b, MoE))
    student_only = distill_plan(ARCH, ARCH, world=2, **kw).sent_per_step \
        - distill_plan(ARCH, ARCH, world=2, expert_parallel="off", **kw).sent_per_step
    assert t_on.sent_per_step == pytest.approx(
        t_off.sent_per_step + student_only - rp.sum() * 2 / 2 + a2a_t)
    on_2 = distill_plan(ARCH, ARCH, world=2, **kw)  # pipelined: no teacher gathered
    # the teacher's share of what is gathered (its root and two largest blocks) shrinks
    assert 0 < t_on.gathered - on_2.gathered < t_off.gathered - off_2.gathered
    # 8 and 4 experts over 8 ranks: the 4-expert block on ranks 0-3 only (1 each, ranks
    # 4-7 none), so rank 0 holds 1/4 of its experts' weights, gradients and AdamW state,
    # not 1/8 (float32 masters: 4 bytes); and what one block casts at a time is that
    on8 = distill_plan(ARCH, ARCH, world=8, expert_parallel="auto", **kw)
    off8 = distill_plan(ARCH, ARCH, world=8, expert_parallel="off", **kw)
    assert on8.expert_parallel
    more = rp[4] * (1 / 4 - 1 / 8) * 4
    assert on8.student_weights - off8.student_weights == pytest.approx(more)
    assert on8.gradients - off8.gradients == pytest.approx(more)
    assert on8.optimizer - off8.optimizer == pytest.approx(2 * more)
    on8_ck = distill_plan(ARCH, ARCH, world=8, expert_parallel="on", **kw)
    assert on8_ck.student_weights == on8.student_weights
    # not on one rank or on replicas
    assert not resolve_expert_parallel("auto", ARCH, 1, "whole")
    assert not resolve_expert_parallel("auto", ARCH, 2, "replicas")
    with pytest.raises(ValueError, match="sharded ranks") as e:
        resolve_expert_parallel("on", ARCH, 2, "replicas")
    assert "--expert-parallel off" in str(e.value) and "\n" not in str(e.value)
    dense = ARCH.replace_blocks(ARCH.blocks[:3])
    assert not resolve_expert_parallel("auto", dense, 2, "sharded")
    with pytest.raises(ValueError, match="no MoE block"):
        resolve_expert_parallel("on", dense, 2, "sharded")


def test_expert_parallel_on_that_cannot_run_is_refused_before_any_rank(configs):
    child, parent = configs
    rc, _, err = _cli(["distill", str(child), "--teacher", str(parent), "--plan", "--tokens",
                       "65536", "--seq-len", "256", "--batch", "8", "--nproc", "1",
                       "--expert-parallel", "on"])
    assert rc == 2 and err.count("\n") == 1 and "--expert-parallel on" in err, err
