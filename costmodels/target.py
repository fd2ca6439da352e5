"""A deployment target: the device and how a model instance is laid out and served on it.

One :class:`Target` carries what used to travel as four loose keywords beside the hardware
profile (``tp``, ``ep``, ``attention_dp``, ``engine``) and the keyword arguments every
pricing function derives from them (:meth:`Target.block_kwargs`,
:meth:`Target.nonblock_kwargs`), and fills a workload's scheduling fields from the engine's
own defaults where the workload leaves them open (:meth:`Target.workloads`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodels.parallel import check_parallel
from costmodels.workload import Workload, parse_workload
from hwprofiles.schema import EngineProfile, HardwareProfile


@dataclass(frozen=True)
class Target:
    """Where and how a model instance serves.

    ``hw``: the device profile; ``tp``: GPUs per model instance (tensor parallel); ``ep``:
    expert parallelism of routed experts (1 or ``tp``); ``attention_dp``: attention data
    parallelism over the ``tp`` GPUs (TensorRT-LLM's ``enable_attention_dp``); ``engine``:
    the serving engine's name (``NAME`` or ``NAME@VERSION``; None: the default engine
    profile's overheads); ``engines``: engine profiles to look names up in besides the
    packaged ones."""

    hw: HardwareProfile
    tp: int = 1
    ep: int = 1
    attention_dp: bool = False
    engine: str | None = None
    engines: Mapping[str, EngineProfile] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_parallel(self.tp, self.ep)

    def block_kwargs(self, draft: np.ndarray | Sequence[bool] | None = None) -> dict[str, Any]:
        """Keyword arguments of :func:`costmodels.blocks.price_blocks` (``draft``: the rows
        of a speculative-decoding draft head)."""
        return dict(tp=self.tp, ep=self.ep, attention_dp=self.attention_dp, draft=draft,
                    engine=self.engine)

    def nonblock_kwargs(self, draft: np.ndarray | Sequence[bool] | None = None
                        ) -> dict[str, Any]:
        """Keyword arguments of :func:`costmodels.model.price_nonblock`."""
        return dict(tp=self.tp, attention_dp=self.attention_dp,
                    draft=draft is not None and bool(np.any(draft)), engine=self.engine,
                    engines=self.engines)

    def serving_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the serving figures
        (:func:`costmodels.serving.arrival_figures`, :func:`costmodels.replay.replay`,
        :func:`costmodels.serving.slo_throughput`) but the draft."""
        return dict(tp=self.tp, ep=self.ep, attention_dp=self.attention_dp,
                    engine=self.engine, engines=self.engines)

    def workloads(self, workloads: Sequence[Workload | str]) -> list[Workload]:
        """``workloads`` with the engine's own scheduling defaults (token budget,
        running-request cap, whether prefill steps carry decodes:
        :func:`costmodels.model.engine_limits`) wherever a workload does not set them."""
        from costmodels.model import engine_limits

        lim = engine_limits(self.hw, self.engine, self.engines) \
            if self.engine is not None else {}
        out = []
        for w in (parse_workload(x) for x in workloads):
            data = w.model_dump()
            data.update({k: v for k, v in lim.items() if k not in w.model_fields_set})
            data["name"] = "" if w.name == w.label() else w.name
            out.append(parse_workload(data))
        return out

    def label(self) -> str:
        """One line: ``h100-sxm tp=8 ep=8 attention-dp engine=sglang``."""
        parts = [self.hw.name, f"tp={self.tp}"]
        if self.ep != 1:
            parts.append(f"ep={self.ep}")
        if self.attention_dp:
            parts.append("attention-dp")
        if self.engine:
            parts.append(f"engine={self.engine}")
        return " ".join(parts)
