"""A serving workload: input length, output length, and a batch size or a concurrency.

Two serving modes (``costmodels.serving`` derives the figures; this module holds the data):

* ``batch=B`` (static batching, offline benchmarks): B requests arrive together; one
  prefill pass processes all B prompts (``B * isl`` tokens), then ``osl - 1`` decode steps
  of batch B. TTFT is that whole pass.
* ``concurrency=B`` (the default of serving engines: continuous batching with chunked
  prefill, as vLLM, TensorRT-LLM and SGLang run): B requests in flight, of which
  ``running = min(B, max_num_seqs)`` are scheduled. Each engine step processes at most
  ``max_num_batched_tokens`` tokens, so the ``running * isl`` prompt tokens are prefilled
  over ``n_c = max(1, running * isl / max_num_batched_tokens)`` steps, each mixed with the
  decodes of the other requests (``costmodels.model`` derives the figures). With an
  unlimited token budget (and ``max_num_seqs >= B``) this is exactly batch mode.

Engine defaults (sourced): ``max_num_batched_tokens`` 8,192 and ``max_num_seqs`` 2,048 are
TensorRT-LLM's LLM-API defaults (``max_num_tokens`` = 8192, ``max_batch_size`` = 2048,
tensorrt_llm/llmapi/llm_args.py); vLLM V1's online-serving default token budget is also
8,192.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hwprofiles.errors import InputError, first_error

DEFAULT_TOKEN_BUDGET = 8192
"""Tokens per engine step (``max_num_batched_tokens``); TensorRT-LLM's ``max_num_tokens``
default (llm_args.py), vLLM V1's online-serving default."""

DEFAULT_MAX_NUM_SEQS = 2048
"""Requests scheduled at once (``max_num_seqs``); TensorRT-LLM's ``max_batch_size``
default (llm_args.py)."""

UNLIMITED = 2**62
"""A token budget or sequence cap that never binds."""


class Workload(BaseModel):
    """Input length ``isl`` and output length ``osl`` in tokens; ``batch`` or ``concurrency``.

    ``max_num_batched_tokens`` / ``max_num_seqs`` are the engine's token budget per step and
    cap on scheduled requests (concurrency mode only; defaults above).

    Speculative decoding (MTP): ``draft_tokens = d > 0`` drafts d tokens per step with the
    model's MTP head (d sequential passes over B tokens), and one verification step of the
    main model processes ``B * (1 + d)`` tokens; ``acceptance = A`` tokens (mean accepted
    length, bonus token included, ``1 <= A <= d + 1``) come out of each such step, so the
    time per output token is ``(verify + d * draft) / A``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    batch: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int = Field(default=DEFAULT_TOKEN_BUDGET, ge=1)
    max_num_seqs: int = Field(default=DEFAULT_MAX_NUM_SEQS, ge=1)
    draft_tokens: int = Field(default=0, ge=0)
    acceptance: float = Field(default=1.0, ge=1.0)
    arrival: Literal["closed", "staggered", "poisson", "fixed"] = "closed"
    """How requests arrive (``costmodels.serving.arrival_figures`` prices the last three):
    ``closed``: B requests start together and, with fixed lengths, stay in lockstep (the
    cycle of ``costmodels.model``); ``staggered``: a closed loop of B whose requests end at
    spread-out times (random lengths), so each new prompt arrives alone as another request
    ends; ``poisson``: an open loop, requests at ``rate`` per second, independent;
    ``fixed``: an open loop, one request every ``1 / rate`` seconds. In an open loop
    ``concurrency`` is the number of slots (requests admitted at once; default
    ``max_num_seqs``); a request that finds them all busy waits in a queue."""
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                               description="requests/s (poisson, fixed)")
    requests: int | None = Field(default=None, ge=1, description="requests in the run "
                                 "(staggered): its first B arrive together, as a benchmark "
                                 "starts them; the rest one by one")
    mixed_prefill: bool = True
    """Whether a step that carries prompt chunks also carries the running requests' decodes
    (vLLM V1, TensorRT-LLM in-flight batching); ``False``: prefill steps run alone and the
    decodes wait (SGLang's default, ``enable_mixed_chunk`` off)."""

    @model_validator(mode="after")
    def _one_of(self) -> Workload:
        if self.open_loop and self.batch is None and self.concurrency is None:
            # an open loop's in-flight requests follow from its rate; the cap is the engine's
            object.__setattr__(self, "concurrency", self.max_num_seqs)
        if self.arrival != "closed" and self.batch is not None:
            raise ValueError(f"arrival={self.arrival} needs continuous batching (concurrency), "
                             "not a static batch")
        if (self.batch is None) == (self.concurrency is None):
            raise ValueError("give exactly one of batch or concurrency")
        if self.acceptance > self.draft_tokens + 1:
            raise ValueError(f"acceptance {self.acceptance} exceeds draft_tokens + 1 = "
                             f"{self.draft_tokens + 1} (tokens a verification step can accept)")
        if self.open_loop != (self.rate is not None):
            raise ValueError("a rate (requests/s) goes with arrival=poisson or fixed, and "
                             "only with them")
        if not self.name:
            object.__setattr__(self, "name", self.label())
        return self

    def label(self) -> str:
        mode = f"batch={self.batch}" if self.batch is not None else f"concurrency={self.concurrency}"
        out = f"isl={self.isl},osl={self.osl},{mode}"
        if self.arrival != "closed":
            out += f",arrival={self.arrival}"
        if self.rate is not None:
            out += f",rate={self.rate:g}"
        return out

    @property
    def open_loop(self) -> bool:
        """Requests arrive at ``rate`` regardless of completions (``poisson``, ``fixed``)."""
        return self.arrival in ("poisson", "fixed")

    @property
    def chunked(self) -> bool:
        """Continuous batching with chunked prefill (concurrency mode)."""
        return self.concurrency is not None

    @property
    def sequences(self) -> int:
        """Sequences in flight during decode: B in batch mode, ``min(B, max_num_seqs)``
        in concurrency mode."""
        if self.batch is not None:
            return int(self.batch)
        assert self.concurrency is not None  # _one_of: exactly one of batch and concurrency
        return int(min(self.concurrency, self.max_num_seqs))

    @property
    def prefill_sequences(self) -> int:
        """Prompts prefilled per cycle (all in one pass in batch mode, in chunks otherwise)."""
        return self.sequences

    @property
    def prefill_chunks(self) -> float:
        """Engine steps that carry the prompt chunks of one cycle: 1 in batch mode,
        ``max(1, sequences * isl / max_num_batched_tokens)`` in concurrency mode (in steady
        state the budget binds on average, so this is not rounded up)."""
        if not self.chunked:
            return 1.0
        return max(1.0, self.sequences * self.isl / self.max_num_batched_tokens)

    @property
    def chunk_tokens(self) -> float:
        """Prompt tokens per mixed step (the cycle's prompt tokens spread evenly)."""
        return self.sequences * self.isl / self.prefill_chunks

    @property
    def mean_decode_context(self) -> float:
        """Mean context (tokens) seen by the ``osl - 1`` decode steps: ``isl + osl / 2``."""
        return self.isl + self.osl / 2.0

    @property
    def max_context(self) -> int:
        """Tokens held per sequence at the end of the request: ``isl + osl``."""
        return self.isl + self.osl

    def with_sequences(self, n: int) -> Workload:
        """The same workload at batch/concurrency ``n``."""
        key = "batch" if self.batch is not None else "concurrency"
        name = "" if self.name == self.label() else self.name
        return Workload.model_validate({**self.model_dump(), key: int(n), "name": name})


_KEYS = {"isl": "isl", "input": "isl", "osl": "osl", "output": "osl", "batch": "batch",
         "bs": "batch", "concurrency": "concurrency", "conc": "concurrency", "name": "name",
         "max_num_batched_tokens": "max_num_batched_tokens", "tokens": "max_num_batched_tokens",
         "max_num_seqs": "max_num_seqs", "draft_tokens": "draft_tokens",
         "acceptance": "acceptance", "mixed_prefill": "mixed_prefill", "arrival": "arrival",
         "rate": "rate", "qps": "rate", "requests": "requests", "num_prompts": "requests"}


def parse_workload(text: str | Workload | dict) -> Workload:
    """Parse ``"isl=8192,osl=1024,batch=64"`` (or ``concurrency=N``; optional ``name=...``,
    ``max_num_batched_tokens=N``, ``max_num_seqs=N``, ``arrival=poisson|fixed|staggered``,
    ``rate=R`` (alias ``qps``), ...)."""
    if isinstance(text, Workload):
        return text
    if isinstance(text, dict):
        data: dict = dict(text)
    else:
        data = {}
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise InputError(f"expected key=value items like isl=8192,osl=1024,batch=64, got {part!r}",
                                 field="workload")
            k, v = (s.strip() for s in part.split("=", 1))
            key = _KEYS.get(k.lower())
            if key is None:
                raise InputError(f"unknown key {k!r}; expected one of "
                                 f"{', '.join(sorted(_KEYS))}", field="workload")
            if key in ("name", "arrival"):
                data[key] = v
                continue
            try:
                data[key] = int(float(v)) if float(v).is_integer() else float(v)
            except ValueError:
                raise InputError(f"{k}={v!r} is not an integer", field="workload") from None
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        where = f"workload {text!r}" + (f" field {loc}" if loc else "")
        raise InputError(msg, field=where) from None
