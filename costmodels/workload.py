"""A serving workload: input length, output length, and a batch size or a concurrency.

Two serving modes, which change only how prefill is counted:

* ``batch=B``: B requests arrive together; one prefill pass processes all B prompts
  (``B * isl`` tokens), then ``osl - 1`` decode steps of batch B. TTFT is that whole pass.
* ``concurrency=B``: continuous batching with B requests in flight; each request's prompt
  is prefilled alone (``isl`` tokens, TTFT = that pass), and decode steps run at batch B.
  Serving B requests costs B prefills plus ``osl - 1`` shared decode steps.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hwprofiles.errors import InputError


class Workload(BaseModel):
    """Input length ``isl`` and output length ``osl`` in tokens; ``batch`` or ``concurrency``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    batch: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_of(self) -> Workload:
        if (self.batch is None) == (self.concurrency is None):
            raise ValueError("give exactly one of batch or concurrency")
        if not self.name:
            object.__setattr__(self, "name", self.label())
        return self

    def label(self) -> str:
        mode = f"batch={self.batch}" if self.batch is not None else f"concurrency={self.concurrency}"
        return f"isl={self.isl},osl={self.osl},{mode}"

    @property
    def sequences(self) -> int:
        """Sequences in flight during decode (B)."""
        return int(self.batch if self.batch is not None else self.concurrency)  # type: ignore[arg-type]

    @property
    def prefill_sequences(self) -> int:
        """Prompts processed by one prefill pass: B in batch mode, 1 in concurrency mode."""
        return self.sequences if self.batch is not None else 1

    @property
    def prefill_passes(self) -> int:
        """Prefill passes per B served requests: 1 in batch mode, B in concurrency mode."""
        return 1 if self.batch is not None else self.sequences

    @property
    def mean_decode_context(self) -> float:
        """Mean context (tokens) seen by the ``osl - 1`` decode steps: ``isl + osl / 2``."""
        return self.isl + self.osl / 2.0

    @property
    def max_context(self) -> int:
        """Tokens held per sequence at the end of the request: ``isl + osl``."""
        return self.isl + self.osl


_KEYS = {"isl": "isl", "input": "isl", "osl": "osl", "output": "osl", "batch": "batch",
         "bs": "batch", "concurrency": "concurrency", "conc": "concurrency", "name": "name"}


def parse_workload(text: str | Workload | dict) -> Workload:
    """Parse ``"isl=8192,osl=1024,batch=64"`` (or ``concurrency=N``, optional ``name=...``)."""
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
                raise InputError(f"unknown key {k!r}; expected isl, osl, batch or concurrency",
                                 field="workload")
            if key == "name":
                data[key] = v
                continue
            try:
                data[key] = int(float(v)) if float(v).is_integer() else v
            except ValueError:
                raise InputError(f"{k}={v!r} is not an integer", field="workload") from None
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        where = f"workload {text!r}" + (f" field {loc}" if loc else "")
        raise InputError(str(err["msg"]).splitlines()[0], field=where) from None
