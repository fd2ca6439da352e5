"""Mamba-1 (the selective SSM of arXiv 2312.00752, in Jamba's layout): the whole kind.

Its pricing is :mod:`costmodels.kinds.mamba1`, its torch module :mod:`nas.modules.mamba1`,
its inheritance rule :mod:`nas.child.inherit.mamba1` and the family that ships it
:mod:`nas.hf.jamba`; everything else the library asks of a kind is declared here.
"""

from __future__ import annotations

from itertools import product
from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from costmodels.dtypes import TensorRole
from costmodels.shapes import Kind
from nas.kinds.base import (
    MAX_DIM,
    AxisSpace,
    BlockConfig,
    KindSpec,
    NoOp,
    register,
    round_to_multiple,
)

_MAX_DIM_WHY = "MAX_DIM: 10x the widest published LLM"


class Mamba1(BlockConfig):
    """Mamba-1 selective SSM mixer (arXiv 2312.00752), HF Jamba layout (``JambaMambaMixer``).

    ``in_proj`` maps the hidden state to ``[x | z]`` (``inner_size`` channels each); a causal
    depthwise conv (+ SiLU) runs over ``x``; ``x_proj`` gives ``[dt (dt_rank) | B (N) | C
    (N)]`` per token, each through its own RMSNorm (Jamba's addition to Mamba-1);
    ``dt = softplus(dt_proj(dt))``. Per channel ``c`` and state dim ``n`` (``A = -exp(A_log)``
    is ``inner_size x state_size``, one decay per channel and state dim, unlike Mamba-2's one
    per head) ``S_t[c, n] = exp(dt_t[c] A[c, n]) S_{t-1}[c, n] + dt_t[c] B_t[n] x_t[c]``,
    ``y_t[c] = sum_n S_t[c, n] C_t[n] + D[c] x_t[c]``, gated by ``silu(z)``, then
    ``out_proj``. The state is fixed-size: ``inner_size x state_size`` per sequence, plus the
    conv's last ``conv_kernel - 1`` inputs; no KV cache.
    """

    kind: Literal["mamba1"] = "mamba1"
    inner_size: PositiveInt
    state_size: PositiveInt
    dt_rank: PositiveInt
    conv_kernel: PositiveInt = 4
    conv_bias: bool = True
    proj_bias: bool = False

    def describe(self) -> str:
        return f"mamba1 i{self.inner_size} state{self.state_size} dt{self.dt_rank}"


class Mamba1Space(AxisSpace):
    """Mamba-1 (Jamba) axes, each value at most the parent's: ``inner_sizes`` /
    ``inner_fractions`` (channels kept: in_proj, conv, x_proj, dt_proj, A, D and out_proj
    shrink with them, and the state, ``inner_size x state_size`` per sequence), fractions
    rounded to ``round_to`` channels; ``state_sizes`` (state dims kept: A's columns and
    x_proj's B / C rows); every combination; and no-op. The dt rank is kept."""

    inner_sizes: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    inner_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    round_to: int = Field(default=64, ge=1, le=MAX_DIM,
                          description="round fractional channel counts to this")
    state_sizes: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    noop: bool = False


def _row(b: Mamba1) -> dict[str, int]:
    return {"m1_inner": b.inner_size, "state": b.state_size, "dt_rank": b.dt_rank,
            "conv_kernel": b.conv_kernel, "conv_bias": int(b.conv_bias),
            "proj_bias": int(b.proj_bias)}


def _alternatives(b: Mamba1, m: Mamba1Space) -> list[BlockConfig]:
    """Channels x state sizes, each at most the parent's (``search_space.mamba1``)."""
    inner = b.inner_size
    sizes = {inner, *m.inner_sizes} | {round_to_multiple(inner * f, m.round_to)
                                       for f in m.inner_fractions}
    states = {b.state_size, *m.state_sizes}
    out: list[BlockConfig] = [b.model_copy(update={"inner_size": i, "state_size": n})
                              for i, n in product(sorted(sizes, reverse=True),
                                                  sorted(states, reverse=True))
                              if i <= inner and n <= b.state_size]
    if m.noop:
        out.append(NoOp())
    return out


def _damage(parent: Mamba1, child: Mamba1) -> float:
    """As Mamba-2's: channels kept, times the state kept to the power 0.3."""
    kept = (child.state_size / parent.state_size) ** 0.3 * child.inner_size / parent.inner_size
    return min(1.0 - kept, 0.95)


def _tp_check(b: Mamba1, tp: int) -> str | None:
    if b.inner_size % tp:
        return f"{b.inner_size} Mamba-1 channels"
    return None


SPEC = register(KindSpec(
    name="mamba1",
    config=Mamba1,
    code=Kind.MAMBA1,
    title="Mamba-1",
    row=_row,
    space=Mamba1Space,
    alternatives=_alternatives,
    value_axes=(("inner_sizes", "inner_size", "must be <= a Mamba-1 block's inner_size ({})"),
                ("state_sizes", "state_size", "must be <= a Mamba-1 block's state_size ({})")),
    damage=_damage,
    tp_check=_tp_check,
    engine_axes={"inner_size": lambda b: b.inner_size, "state_size": lambda b: b.state_size},
    stateful=True,  # conv + SSM state
    inherit="nas.child.inherit.mamba1:inherit_mamba1",
    linears=tuple((n, TensorRole.MAMBA) for n in ("in_proj", "x_proj", "dt_proj", "out_proj")),
    hf_dialects=frozenset({"jamba"}),
    hf_module={"jamba": "mamba."},
    caps={"inner_size": (MAX_DIM, _MAX_DIM_WHY), "dt_rank": (MAX_DIM, _MAX_DIM_WHY)},
    roles=(TensorRole.MAMBA, TensorRole.OTHER),
))
