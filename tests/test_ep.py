"""Expert parallelism (``nas.train.ep``): on 2 and 4 gloo ranks (spawned processes), each
rank holding only its ``ceil(E / N)`` experts or fewer, the MoE's outputs, its input gradients and every
parameter gradient (FSDP2's convention: the mean over the ranks' losses) equal one
process's ``MoEMixer`` on the whole batch; a rank whose experts receive no token, and a
rank with no token, take part as well."""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from nas.arch import MoE  # noqa: E402

HIDDEN = 48
CASES = {
    "gated": MoE(num_experts=8, top_k=2, expert_width=32, shared_width=32),
    "latent": MoE(num_experts=8, top_k=4, expert_width=32, shared_width=32, latent_size=16,
                  gated=False, activation="relu2", router="sigmoid", router_bias=True,
                  norm_topk=True, routed_scaling=2.5, n_group=4, topk_group=2),
    # experts that do not divide over the ranks: 3 per rank, then 1 (2 ranks: 3 + 2;
    # 4 ranks of 2, 2, 2, 0: the last rank owns none)
    "uneven": MoE(num_experts=5, top_k=2, expert_width=32, shared_width=32),
    "six": MoE(num_experts=6, top_k=2, expert_width=32, shared_width=32, gated=False,
               activation="relu2"),
}
RTOL, ATOL = 1e-5, 1e-6
"""Outputs and input gradients, float32 (each expert sees its rows in the global token
order one process does: in practice the outputs are equal bit for bit)."""
GRAD_TOL = 1e-5
"""Parameter gradients: the largest difference over the largest entry (float32 sums over
the ranks' tokens in another order)."""


def _reference(cfg: MoE, world: int, rows: list[int], mask: torch.Tensor | None):
    from nas.modules.moe import MoEMixer

    torch.manual_seed(0)
    ref = MoEMixer(cfg, HIDDEN)
    ref.reset_parameters(std=0.2, out_std=0.2)
    if cfg.router_bias:
        with torch.no_grad():
            ref.gate.e_score_correction_bias.normal_(std=0.1)
    xs = [torch.randn(n, 5, HIDDEN) for n in rows]
    gs = [torch.randn(n, 5, HIDDEN) for n in rows]
    return ref, xs, gs


def _worker(rank: int, world: int, store: str, case: str, rows: list[int], masked: bool,
            errors: str, bf16: bool) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from nas.train.ep import expert_ranges, shard_experts

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        cfg = CASES[case]
        E = cfg.num_experts
        # masked: the last rank's experts are never chosen (it receives no row)
        mask = torch.zeros(E, dtype=torch.bool)
        lo, hi = expert_ranges(E, world)[rank]
        if masked:  # the last rank's
            mask[expert_ranges(E, world)[-1][0]:] = True
        ref, xs, gs = _reference(cfg, world, rows, mask)
        mixer = copy.deepcopy(ref)
        masters = {n: p.detach().clone() for n, p in ref.named_parameters()}
        if bf16:  # FSDP2's mixed precision: float32 masters (here the EP experts), the
            # computation (the reference's whole model) in bfloat16
            ref = ref.to(torch.bfloat16)
            mixer.gate.to(torch.bfloat16)
            for name in ("shared_experts", "shared_expert_gate", "fc1_latent_proj",
                         "fc2_latent_proj"):
                if hasattr(mixer, name):
                    getattr(mixer, name).to(torch.bfloat16)
            xs = [x.bfloat16() for x in xs]
        x_all = torch.cat(xs).requires_grad_(True)
        y_all = ref(x_all, expert_mask=mask if masked else None)
        # FSDP2's convention: the mean over the ranks of each rank's loss
        (sum((y * g).sum() for y, g in zip(y_all.split(rows), gs)) / world).backward()

        mesh = init_device_mesh("cpu", (world,))
        experts = shard_experts(mixer, mesh)
        for p in experts:
            assert isinstance(p, DTensor) and p.to_local().shape[0] == hi - lo
        x = xs[rank].clone().requires_grad_(True)
        y = mixer(x, expert_mask=mask if masked else None)
        (y * gs[rank]).sum().backward()
        a, b = sum(rows[:rank]), sum(rows[:rank + 1])
        rtol, atol, gtol = (RTOL, ATOL, GRAD_TOL) if not bf16 else (0.02, 0.02, 0.02)
        torch.testing.assert_close(y, y_all[a:b].detach(), rtol=rtol, atol=atol)
        if not masked and not bf16:
            print(f"rank {rank}: outputs bitwise equal: "
                  f"{torch.equal(y, y_all[a:b].detach())}", flush=True)
        torch.testing.assert_close(x.grad, world * x_all.grad[a:b], rtol=rtol, atol=atol)
        refs = dict(ref.named_parameters())
        for name, p in mixer.named_parameters():
            want = refs[name].grad
            if isinstance(p, DTensor):  # this rank's experts: their whole gradient
                assert isinstance(p.grad, DTensor)
                got = p.grad.to_local()
                want = want[lo:hi]
                assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
                torch.testing.assert_close(p.to_local(), masters[name][lo:hi], rtol=0, atol=0)
                if hi == lo:  # no expert here: an empty gradient, as every rank has one
                    assert got.shape[0] == 0
                    continue
            else:  # replicated here: FSDP2 averages these over the ranks
                got = p.grad.clone()
                dist.all_reduce(got)
                got /= world
            got, want = got.float(), want.float()
            err = float((got - want).abs().max()) / max(float(want.abs().max()), 1e-30)
            assert err <= gtol, (name, err)
        dist.barrier()  # every rank's collectives done before any rank tears gloo down
        Path(errors, f"passed-{rank}").write_text("")
    except BaseException as exc:  # noqa: BLE001  # reported to the parent process
        Path(errors, str(rank)).write_text(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path: Path, world: int, case: str, rows: list[int], masked: bool = False,
           bf16: bool = False) -> None:
    import torch.multiprocessing as mp

    errors = tmp_path / "errors"
    errors.mkdir()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        mp.spawn(_worker, args=(world, str(tmp_path / "store"), case, rows, masked,
                                str(errors), bf16), nprocs=world, join=True)
    except Exception as exc:
        msgs = {p.name: p.read_text() for p in errors.iterdir()
                if not p.name.startswith("passed-")}
        passed = {p.name for p in errors.iterdir() if p.name.startswith("passed-")}
        if not msgs and len(passed) == world:
            # every rank passed every check and met the others at the final barrier; one
            # then aborted in gloo's teardown ("terminate called without an active
            # exception", seen once in 3 full runs): not the behaviour under test
            warnings.warn(f"a rank aborted after its checks passed: {exc}", stacklevel=1)
            return
        pytest.fail(f"ranks failed: {msgs}")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", ["gated", "latent", "uneven"])
def test_expert_parallel_equals_one_process(tmp_path, world, case):
    _spawn(tmp_path, world, case, [3] * world)


def test_bf16_compute_from_float32_master_experts(tmp_path):
    """Under mixed precision the experts stay float32 masters (and their gradients float32)
    and compute in the rows' bfloat16, as FSDP2's parameters do."""
    _spawn(tmp_path, 2, "gated", [3, 3], bf16=True)


def test_a_rank_without_tokens_or_without_rows_for_its_experts(tmp_path):
    _spawn(tmp_path, 2, "gated", [4, 0])
    (tmp_path / "again").mkdir()
    _spawn(tmp_path / "again", 2, "latent", [2, 3], masked=True)


def test_experts_that_do_not_divide_split_as_dtensor_does(tmp_path):
    """Experts that do not divide over the ranks: ``ceil(E / N)`` per rank, the last
    fewer or none, as DTensor's ``Shard(0)`` splits them; a rank with no expert takes part
    in every exchange (6 experts on 4 ranks: 2, 2, 2, 0)."""
    from nas.train.ep import expert_ranges

    assert expert_ranges(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert expert_ranges(5, 2) == [(0, 3), (3, 5)]
    assert expert_ranges(6, 4) == [(0, 2), (2, 4), (4, 6), (6, 6)]
    for E in range(1, 13):
        for n in range(1, 6):
            chunks = [len(c) for c in torch.arange(E).chunk(n)]
            got = [hi - lo for lo, hi in expert_ranges(E, n)]
            assert got == chunks + [0] * (n - len(chunks))
    _spawn(tmp_path, 4, "six", [2, 3, 1, 2])
