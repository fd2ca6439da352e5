"""``deploy.candidates``: the deployments a search may choose among, searched together with
the child (``nas.search.deploy``).

A candidate deployment is one device profile, one parallel layout (``tp`` GPUs per replica,
``ep`` expert-parallel degree), attention data parallelism on or off, one serving engine
profile and one speculative-decoding setting (MTP drafts with their acceptance, or none).
The lists given here are crossed: every device x layout x attention DP x engine x MTP
setting is one candidate. An axis left out takes the spec's own value (``hardware`` and the
workloads' drafts), so a ``candidates`` section that lists only devices searches the spec's
layout on each of them.

Each device may carry a price per GPU-hour given by the user; then cost is money per
million generated tokens. Without prices (the default) cost is GPU-hours per million
generated tokens. Prices are all or none: a mix would compare money with GPU-hours.

These models only check what a field can say alone; the combinations (TP against heads,
EP against experts, a device name, an MTP head in the parent) are checked against the
parent and its alternatives by :func:`nas.search.deploy.expand`, one line naming the
combination.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CANDIDATES = 4096
"""Deployments one search may cross (devices x layouts x attention DP x engines x MTP
settings): each is one MIP (or one per concurrency of an SLO workload); 4,096 is two orders
of magnitude past the issue's 3 x 4 x 2 Super example."""

MAX_DRAFT = 64
"""As :data:`nas.spec.MAX_DRAFT_TOKENS` (kept here so this module imports no ``nas.spec``)."""

MAX_FRONT_POINTS = 4096
"""Most quality bounds the Pareto front steps through (one exact joint search each)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _unique(v: list[Any], what: str) -> list[Any]:
    seen: list[Any] = []
    for x in v:
        if x in seen:
            raise ValueError(f"{what} lists {x!r} twice")
        seen.append(x)
    return v


class DeviceCandidate(_Model):
    """One device profile, with the user's price per GPU-hour (any currency) or none."""

    profile: str = Field(min_length=1, description="a shipped profile name (puzzle-nas hw "
                         "list) or a profile JSON file (relative to the spec)")
    price_per_gpu_hour: float | None = Field(
        default=None, gt=0, le=1e6, allow_inf_nan=False,
        description="price of one GPU for one hour (the user's, any currency); give it for "
        "every device or for none (then cost is GPU-hours per million tokens)")


class LayoutCandidate(_Model):
    """One parallel layout: ``tp`` GPUs serve one replica, experts over ``ep`` of them."""

    tp: int = Field(default=1, ge=1, le=1024, description="tensor-parallel degree (GPUs per "
                    "replica)")
    ep: int = Field(default=1, ge=1, le=1024, description="expert-parallel degree (1 or tp)")
    gpus: int | None = Field(default=None, ge=1, le=1024, description="GPUs per replica "
                             "(default tp; must equal tp: pipeline parallelism is not modeled)")

    @model_validator(mode="after")
    def _gpus(self) -> LayoutCandidate:
        if self.gpus is not None and self.gpus != self.tp:
            raise ValueError(f"gpus ({self.gpus}) must equal tp ({self.tp}): a replica is its "
                             "tensor-parallel group (pipeline parallelism is not modeled)")
        if self.ep not in (1, self.tp):
            raise ValueError(f"ep must be 1 or tp ({self.tp}), got {self.ep}")
        return self


class MTPCandidate(_Model):
    """Speculative decoding with the parent's MTP head (the child keeps it as it is)."""

    draft_tokens: int = Field(ge=1, le=MAX_DRAFT, description="tokens drafted per step")
    acceptance: float = Field(ge=1.0, le=MAX_DRAFT + 1, allow_inf_nan=False,
                              description="mean tokens accepted per verification step "
                              "(bonus token included), stated by the user")

    @model_validator(mode="after")
    def _accept(self) -> MTPCandidate:
        if self.acceptance > self.draft_tokens + 1:
            raise ValueError(f"acceptance {self.acceptance:g} exceeds draft_tokens + 1 = "
                             f"{self.draft_tokens + 1} (tokens a verification step can accept)")
        return self


class FrontSpec(_Model):
    """The Pareto front of quality against cost per million tokens, over every candidate
    deployment (:func:`nas.search.deploy.pareto_front`): the least cost under a bound on
    the quality, the bound stepped down from the cheapest child's quality by at least
    ``step`` each time. Every (deployment, child) pair that no other beats on both is
    matched by a front point as cheap (within ``solver.gap``) and at most ``step`` worse in
    quality; ``step`` 0 asks for every such pair (up to the solver's feasibility
    tolerance on the quality row)."""

    points: int = Field(default=64, ge=1, le=MAX_FRONT_POINTS,
                        description="the quality step is the span from the cheapest child's "
                        "quality to the best reachable one over this many (at most this many "
                        "+ 1 front points)")
    step: float | None = Field(default=None, ge=0, le=1e12, allow_inf_nan=False,
                               description="the quality step itself (overrides points); 0: "
                               "every non-dominated (deployment, child) pair (the exact front)")


class DeployCandidates(_Model):
    """The deployment axis of a joint search (module docstring)."""

    devices: list[DeviceCandidate] = Field(
        min_length=1, max_length=64, description="device profiles, each a name or "
        "{profile, price_per_gpu_hour}")
    layouts: list[LayoutCandidate] | None = Field(
        default=None, min_length=1, max_length=64,
        description="parallel layouts {tp, ep} (default: the spec's hardware tp and ep)")
    attention_dp: list[bool] | None = Field(
        default=None, min_length=1, max_length=2,
        description="attention data parallelism on / off (default: the spec's)")
    engines: list[str | None] | None = Field(
        default=None, min_length=1, max_length=16,
        description="serving engine profiles (trtllm, trtllm-cpp, vllm, sglang; null: the "
        "default pricing) (default: the spec's hardware.engine)")
    mtp: list[MTPCandidate | None] | None = Field(
        default=None, min_length=1, max_length=16,
        description="speculative-decoding settings for every workload, each {draft_tokens, "
        "acceptance} or null (no drafting); needs a parent with an MTP head (default: the "
        "workloads' own drafts)")
    objective: Literal["cost", "quality"] = Field(
        default="cost", description="'cost': the least cost per million generated tokens "
        "under the spec's budgets (bound the quality with a quality budget); 'quality': the "
        "best quality under the budgets and max_cost")
    max_cost: Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)] | None = Field(
        default=None, description="with objective 'quality': the largest cost per million "
        "generated tokens (money with prices, else GPU-hours)")
    mix: dict[str, Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)]] | None = Field(
        default=None, description="share of the generated tokens per workload (normalized; "
        "default: equal shares): cost per million tokens is the shares' weighted sum")
    front: FrontSpec | None = Field(
        default_factory=FrontSpec, description="the Pareto front of quality against cost "
        "per million tokens over every deployment, each point naming its deployment "
        "({points} or {step}; null: none)")

    @field_validator("devices", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return [{"profile": d} if isinstance(d, str) else d for d in v] \
            if isinstance(v, list) else v

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[DeviceCandidate]) -> list[DeviceCandidate]:
        _unique([d.profile for d in v], "devices")
        priced = [d.price_per_gpu_hour is not None for d in v]
        if any(priced) and not all(priced):
            missing = [d.profile for d in v if d.price_per_gpu_hour is None]
            raise ValueError(f"give price_per_gpu_hour for every device or for none (missing "
                             f"for {', '.join(missing)}): cost would mix money and GPU-hours")
        return v

    @field_validator("layouts")
    @classmethod
    def _layouts(cls, v: list[LayoutCandidate] | None) -> list[LayoutCandidate] | None:
        if v is not None:
            _unique([(x.tp, x.ep) for x in v], "layouts (tp, ep)")
        return v

    @field_validator("attention_dp", "mtp")
    @classmethod
    def _once(cls, v: list[Any] | None) -> list[Any] | None:
        return None if v is None else _unique(v, "the list")

    @field_validator("engines")
    @classmethod
    def _engines(cls, v: list[str | None] | None) -> list[str | None] | None:
        if v is None:
            return v
        from hwprofiles.engines import available_engines, find_engine

        for e in v:
            if e is not None and find_engine(e) is None:
                raise ValueError(f"unknown serving engine {e!r}; expected one of "
                                 f"{', '.join(available_engines())} or null")
        return _unique(v, "engines")

    @model_validator(mode="after")
    def _objective(self) -> DeployCandidates:
        if self.objective == "quality" and self.max_cost is None:
            raise ValueError("objective 'quality' needs max_cost (the largest cost per "
                             "million tokens)")
        if self.objective == "cost" and self.max_cost is not None:
            raise ValueError("max_cost bounds objective 'quality'; with objective 'cost' "
                             "bound the quality with a quality budget instead")
        return self

    @property
    def priced(self) -> bool:
        """Whether cost is money (every device has a price) rather than GPU-hours."""
        return self.devices[0].price_per_gpu_hour is not None

    @property
    def unit(self) -> str:
        """The unit of cost per million generated tokens."""
        return "money/Mtok" if self.priced else "GPU-h/Mtok"
