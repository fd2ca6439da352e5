"""Eager torch as a backend: what a block ran, op by op, and what that costs on a device.

The block model (:mod:`costmodels.blocks`) prices a block as a fused serving engine runs
it: one GEMM for the fused QKV projection, a norm as one kernel, RoPE folded into the
KV-cache append. ``puzzle-nas profile --blocks`` times the real ``nas.modules`` blocks in
eager torch, which runs something else: every aten op apart (an RMSNorm is a cast, a
``pow``, a ``mean``, an add, an ``rsqrt``, two multiplies and a cast back), the Q, K and V
projections as three GEMMs at their own shapes, and metadata ops (views, transposes,
slices) that each cost a dispatch. Pricing those timings with the fused model conflates
the two, and a fit then bends the device's figures to hide the difference (the fused
model's kernel overhead came out at 10-30x the probed dispatch cost).

So each timed point records an :class:`OpTrace`: the ops one call dispatched (counted by a
torch dispatch mode, ``nas.profile.blocks``), and :func:`price_trace` prices exactly those:

* every GEMM (``mm``, ``addmm``, ``bmm``) at its own ``m x n x k``: the roofline of
  :class:`costmodels.roofline.Roof` with the profile's GEMM curve of the run's dtype, plus
  the GEMM library's cost per call (``HardwareProfile.eager.gemm_overhead_s`` of the dtype;
  one ``kernel_overhead_s`` where the profile has none: on this project's CPU a bf16 GEMM
  call costs ~20 us of oneDNN setup against ~1.5 us for a small elementwise op, so one
  figure for both over-priced the blocks with few GEMMs per op);
* every attention kernel (``scaled_dot_product_attention``'s backends) from its shape: a
  prompt (``q_len > 1``) at the profile's attention curve, a decode step (``q_len = 1``)
  as a read of its keys and values at the KV-read curve, plus one ``kernel_overhead_s``;
* every other op that runs a kernel: ``kernel_overhead_s`` (the probe's back-to-back
  1-element add: one dispatch and launch) plus the bytes it reads and writes over the eager
  elementwise rate of the run's dtype (``HardwareProfile.eager.elementwise_bandwidth``);
* every op that runs none (a view, transpose, slice or empty allocation):
  ``HardwareProfile.eager.view_overhead_s``.

The terms add: one CPU thread runs dispatch and kernels in turn, and on a GPU the small
eager ops of a block are launch-bound. A profile without ``eager`` figures (the shipped GPU
profiles) is priced with the fused model's assumptions, said in :func:`eager_figures`: a
metadata op costs one ``kernel_overhead_s`` and elementwise ops stream at the memory
bandwidth under the memory curve.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from costmodels import ops
from costmodels.dtypes import bytes_per_element
from hwprofiles.errors import InputError
from hwprofiles.schema import EagerFigures, Figure, HardwareProfile

ELEMENTWISE_DTYPES = ("bf16", "fp16", "fp32")
"""The dtypes the torch blocks run in (``nas.profile.blocks``), the ones an assumed
elementwise rate is given for."""


class GemmOp(BaseModel):
    """``count`` GEMMs of ``x[m, k] @ w[k, n]`` (a ``bmm`` counted with ``m`` times its
    batch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    count: int = Field(default=1, ge=1)


class AttentionOp(BaseModel):
    """``count`` attention kernels over ``batch`` sequences: ``heads`` query heads of
    ``q_len`` tokens against ``kv_heads`` key/value heads of ``kv_len`` tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    q_len: int = Field(ge=1)
    kv_len: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    causal: bool
    count: int = Field(default=1, ge=1)

    @property
    def flops(self) -> float:
        """``4 * head_dim * heads * pairs * batch``; a causal prompt attends ``q(q+1)/2``
        pairs (the FLOP count of ``costmodels.ops.attention_prefill``)."""
        if self.causal and self.q_len == self.kv_len:
            pairs = float(ops.causal_pairs(self.q_len, 0))
        else:
            pairs = float(self.q_len * self.kv_len)
        return 4.0 * self.head_dim * self.heads * pairs * self.batch


class OpTrace(BaseModel):
    """The aten ops one call of a block dispatched (``nas.profile.blocks``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemms: list[GemmOp] = Field(default_factory=list)
    attention: list[AttentionOp] = Field(default_factory=list)
    ops: int = Field(ge=0, description="other ops that run a kernel (elementwise, "
                     "reductions, casts, copies)")
    op_bytes: int = Field(ge=0, description="bytes those ops read and write (inputs + "
                          "outputs)")
    metadata_ops: int = Field(ge=0, description="ops that run no kernel: views, "
                              "transposes, slices, empty allocations")

    @property
    def dispatched(self) -> int:
        """Every op the call dispatched."""
        return (sum(g.count for g in self.gemms) + sum(a.count for a in self.attention)
                + self.ops + self.metadata_ops)


def eager_figures(hw: HardwareProfile) -> tuple[EagerFigures, bool]:
    """``hw.eager``, or (when the profile has none) the fused model's assumptions as eager
    figures: a metadata op costs ``kernel_overhead_s``, an elementwise op streams at the
    memory bandwidth times the memory curve's peak. The flag says whether they were
    assumed."""
    if hw.eager is not None:
        return hw.eager, False
    bw = hw.memory_bandwidth.value * hw.efficiency.memory.peak_fraction
    why = ("assumed (the profile has no eager figures): the memory bandwidth times the "
           "memory curve's peak")
    return EagerFigures(
        view_overhead_s=Figure(value=hw.kernel_overhead_s.value,
                               source="assumed (the profile has no eager figures): the "
                               "kernel overhead"),
        elementwise_bandwidth={d: Figure(value=bw, source=why)
                               for d in ELEMENTWISE_DTYPES}), True


def gemm_call_s(hw: HardwareProfile, dtype: str) -> float:
    """Seconds one eager GEMM in ``dtype`` costs beyond its roofline time: the profile's
    GEMM call overhead of the dtype, else one ``kernel_overhead_s`` (as any other op)."""
    call = hw.eager.gemm_overhead_s.get(dtype) if hw.eager is not None else None
    return hw.kernel_overhead_s.value if call is None else call.value


def price_trace(trace: OpTrace, hw: HardwareProfile, dtype: str) -> float:
    """Seconds of one call of a traced eager block on ``hw``, its tensors in ``dtype``
    (the module docstring's terms)."""
    from costmodels.roofline import Roof

    roof = Roof(hw)
    eager, _ = eager_figures(hw)
    a = bytes_per_element(dtype)
    mm_dtype = dtype if dtype in hw.efficiency.matmul else "bf16"
    t = 0.0
    per_gemm = gemm_call_s(hw, dtype)  # the GEMM library's cost per call
    for g in trace.gemms:
        f, b = ops.gemm(g.m, g.k, g.n, a, a)
        t += g.count * (float(roof.time(f, b, roof.matmul(mm_dtype, f), roof.memory(b), 0))
                        + per_gemm)
    eff = hw.efficiency
    for at in trace.attention:
        f = at.flops
        b = (at.batch * at.head_dim * a
             * (2 * at.heads * at.q_len + 2 * at.kv_heads * at.kv_len))
        inv_m = roof.memory(b) if at.q_len > 1 else roof.memory(b, eff.kv_read())
        t += at.count * float(roof.time(f, b, roof.compute(mm_dtype, eff.attention, f),
                                        inv_m, 1))
    rate = eager.elementwise_bandwidth.get(dtype)
    if rate is None:
        raise InputError(f"the profile has no eager elementwise bandwidth for {dtype} (it has "
                         f"{sorted(eager.elementwise_bandwidth)})",
                         field="eager.elementwise_bandwidth")
    t += trace.ops * roof.overhead + trace.op_bytes / rate.value
    t += trace.metadata_ops * eager.view_overhead_s.value
    return t
