"""Time real torch blocks on a device: what ``puzzle-nas profile --blocks`` runs.

Each distinct block shape (``costmodels.measured.row_key``: blocks of the same shape are
timed once) is built as the real :class:`nas.modules.Block` (pre-norm, mixer, residual)
with random weights in the run's dtype, and timed at every point of the plan
(``costmodels.measured.Point``):

* **prefill**: one pass of ``batch`` prompts of ``tokens`` tokens from an empty cache;
* **decode**: one step of ``batch`` sequences, one token each, after the KV cache or
  recurrent state was filled by a real prefill of ``context`` tokens. Before every timed
  step the cache's entries are put back as the fill left them (an attention cache's length
  returns to ``context``: the step writes the same slot and reads ``context + 1`` keys each
  time; an MLA cache its latent of ``context`` tokens); a Mamba or DeltaNet state has a
  fixed size.

Timing follows ``hwprofiles.probe``: warm-up calls, then ``repeats`` timed samples and
their median, fastest and slowest kept. On CUDA each sample is one call between CUDA events,
the L2 cache flushed (a buffer of twice its size zeroed) before it, as the probe does: in a
model the previous blocks have evicted this block's weights. On CPU a sample is a block of
calls timed with ``time.perf_counter`` (sized to at least ``min_time_s``), divided by the
calls; torch's dispatch overhead is part of the time, as it is part of an eager model's.
The CPU default is one torch thread, timed by that thread's CPU time (``time.thread_time``):
on a shared machine wall-clock time also counts the time other processes hold the core,
which is not the block's; with several threads the clock is ``time.perf_counter``.

``cold`` (``profile --blocks --cold``, CPU): each call of a point runs on the next of several
copies of the block (distinct tensors, at least twice the core's L2 in all), so that its
weights come from beyond the core's caches as in a model, where the other blocks ran since
its last call; by default the calls run on one copy, its tensors warm in the L2.

The model around the blocks (embedding, final norm, head, the greedy argmax) is timed too,
at every point (:meth:`BlockTimer.time_nonblock`, ``BlockMeasurements.nonblock``).

Peak memory per point: on CUDA ``torch.cuda.max_memory_allocated`` during the call, less
what was allocated before the block was built (so it counts the block's weights, its cache,
the input and every intermediate). On CPU the same quantity is counted by a dispatch mode
that adds the bytes of every storage an op creates during the call and subtracts them when
the storage is freed, on top of the weights, cache and input alive at the call's start
(scratch buffers inside a kernel are not tensors and are not counted).

Op trace per point (:class:`costmodels.eager.OpTrace`): one more call under a dispatch mode
records what the block ran as eager torch runs it: each GEMM's and attention kernel's shape,
the other ops that run a kernel and the bytes they read and write, and the metadata ops
(views, slices, empty allocations); calibration prices the point from it
(:func:`costmodels.eager.price_trace`).

The output file is rewritten (atomically) after every timed point (on a CPU, after every
group of blocks of up to :data:`GROUP_BYTES` of weights: their points are timed
interleaved, :meth:`BlockTimer.time_group`); a run started again
with the same output keeps every point already timed and times only the rest (a resumed
run writes the same file an uninterrupted run would, save for timing noise).
"""

from __future__ import annotations

import copy
import datetime as _dt
import itertools
import math
import platform
import random
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from costmodels.eager import AttentionOp, GemmOp, OpTrace
from costmodels.measured import (
    NONBLOCK,
    AttentionTiming,
    BlockEntry,
    BlockMeasurements,
    GemmTiming,
    Point,
    Timing,
    describe_nonblock,
    describe_row,
    load_blocks,
    nonblock_row,
    row_key,
)
from hwprofiles.errors import InputError
from nas.arch import BlockConfig, ModelArch, NoOp, block_row
from nas.kinds import kinds
from nas.modules.model import Block, CausalLM

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

ProgressFn = Callable[[int, int, str], None]
"""``progress(done, total, note)``: called after each timed point (and once at the start)."""

#: block kinds that keep a cache / state between decode steps (filled before a decode)
STATEFUL = ("attention", "mamba", "parallel",
            *(name for name, k in kinds().items() if k.stateful))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of storages created under it while they live; keeps the peak."""

    def __init__(self, start: int):
        super().__init__()
        self.live = start
        self.peak = start
        self.seen: set[int] = set()

    def _free(self, ptr: int, n: int) -> None:
        self.live -= n
        self.seen.discard(ptr)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                ptr, n = st.data_ptr(), st.nbytes()
                if n and ptr not in self.seen:
                    self.seen.add(ptr)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._free, ptr, n)
        return out


_GEMMS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "_int_mm": (0, 1),
          "_scaled_mm": (0, 1)}
"""aten matrix products and the positions of their two operands."""
_METADATA = {"_unsafe_view", "_reshape_alias", "empty", "empty_like", "new_empty",
             "empty_strided", "new_empty_strided"}
"""aten ops that run no kernel but are not views by their schema (``OpOverload.is_view``)."""


def _tensor_bytes(tree: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree)
               if isinstance(t, torch.Tensor))


class _OpTrace(TorchDispatchMode):
    """Records what a call dispatches (:class:`costmodels.eager.OpTrace`): each GEMM's and
    attention kernel's shape, the other ops that run a kernel and the bytes they read and
    write, and the ops that run none."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms: dict[tuple[int, int, int], int] = {}
        self.attention: dict[tuple, int] = {}
        self.ops = 0
        self.op_bytes = 0
        self.metadata = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in _GEMMS:
            i, j = _GEMMS[name]
            a, b = args[i], args[j]
            m = math.prod(a.shape[:-1])
            key = (int(m), int(b.shape[-1]), int(a.shape[-1]))
            self.gemms[key] = self.gemms.get(key, 0) + 1
        elif name.startswith("_scaled_dot_product") and name.endswith(
                ("attention", "attention_for_cpu")):
            names = [x.name for x in func._schema.arguments]
            bound = {**dict(zip(names, args)), **kwargs}
            q, k = bound["query"], bound["key"]
            key2 = (int(q.shape[0]), int(q.shape[1]), int(k.shape[1]), int(q.shape[2]),
                    int(k.shape[2]), int(q.shape[3]), bool(bound.get("is_causal", False)))
            self.attention[key2] = self.attention.get(key2, 0) + 1
        elif func.is_view or name in _METADATA:
            self.metadata += 1
        else:
            self.ops += 1
            self.op_bytes += _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        return out

    def result(self) -> OpTrace:
        return OpTrace(
            gemms=[GemmOp(m=m, n=n, k=k, count=c) for (m, n, k), c in self.gemms.items()],
            attention=[AttentionOp(batch=b, heads=h, kv_heads=kv, q_len=q, kv_len=s,
                                   head_dim=d, causal=cz, count=c)
                       for (b, h, kv, q, s, d, cz), c in self.attention.items()],
            ops=self.ops, op_bytes=self.op_bytes, metadata_ops=self.metadata)


def _storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _cache_tensors(cache: dict[str, Any]) -> list[torch.Tensor]:
    return [v for v in cache.values() if isinstance(v, torch.Tensor)]


CPU_REPEATS = 14
"""Samples per point on a CPU (rounds of :meth:`BlockTimer.time_group`). Measured on 2 shared
cores (AMD EPYC, the 120 points of examples/measured-cpu, 28 rounds each, two runs): the
fastest of 7 disjoint rounds differed from the fastest of 7 others by 2.6-4.6 % on average
and up to 17-46 %; of 14 against 14 others by 2.1-2.2 %, up to 11-12 %."""


class BlockTimer:
    """Times blocks on one device in one dtype (see the module docstring)."""

    def __init__(self, device: str = "cpu", dtype: str = "bf16", warmup: int | None = None,
                 repeats: int | None = None, min_time_s: float = 0.01,
                 threads: int | None = None, seed: int = 0, cold: bool = False):
        """``cold`` (CPU): consecutive calls of a point run on different copies of the block
        (each with its own weights, cache and input; at least twice the core's L2 of them
        in all), so that each call finds its tensors beyond the core's caches, as a block
        does in a model where the other blocks ran since its last call, while the code that
        runs it stays warm; by default a point's calls run on one copy, its tensors warm."""
        if dtype not in DTYPES:
            raise InputError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}",
                             field="dtype")
        dev = torch.device(device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise InputError(f"device {device!r}: CUDA is not available to torch "
                                 f"{torch.__version__} on this machine; use --device cpu",
                                 field="device")
            torch.cuda.set_device(dev)
            props = torch.cuda.get_device_properties(dev)
            self.device_name = props.name
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            self.flush: torch.Tensor | None = torch.empty(max(2 * l2, 256 * 2**20),
                                                          dtype=torch.uint8, device=dev)
            self.threads = None
            self.cold_bytes = 0  # the L2 is flushed before every call already
            self.clock = time.perf_counter
            self.timing = ("CUDA events around each call after warm-up, L2 flushed before each "
                           "timed call; median over repeats; peak from "
                           "torch.cuda.max_memory_allocated")
        elif dev.type == "cpu":
            threads = 1 if threads is None else threads
            if threads < 1:
                raise InputError(f"must be >= 1, got {threads}", field="threads")
            torch.set_num_threads(threads)
            self.device_name = _cpu_name()
            self.flush = None
            self.threads = torch.get_num_threads()
            # one thread: its CPU time is the time a dedicated core would take, whatever else
            # runs on a shared machine; several threads: wall-clock time
            self.clock = time.thread_time if self.threads == 1 else time.perf_counter
            clock = ("time.thread_time (CPU time of the one torch thread: time other "
                     "processes hold the core is not counted)" if self.threads == 1 else
                     f"time.perf_counter (wall clock, {self.threads} torch threads)")
            self.timing = (f"{clock} around blocks of calls (>= {min_time_s:g} s); median over "
                           "repeats; peak from tensor storages alive during the call")
            self.cold_bytes = 2 * l2_bytes() if cold else 0
            if cold:
                self.timing = (f"{clock} around blocks of calls (>= {min_time_s:g} s), "
                               f"{COLD_MARK} (copies of "
                               f">= {self.cold_bytes / 2**20:g} MiB in all, twice the core's "
                               "L2: its tensors cold, as in a model); median over repeats; "
                               "peak from tensor storages alive during the call")
        else:
            raise InputError(f"expected cpu, cuda or cuda:N, got {device!r}", field="device")
        self.dev = dev
        self.kind = dev.type
        self.dtype = dtype
        self.tdtype = DTYPES[dtype]
        self.warmup = warmup if warmup is not None else (10 if self.kind == "cuda" else 2)
        self.repeats = repeats if repeats is not None else (30 if self.kind == "cuda"
                                                            else CPU_REPEATS)
        if self.warmup < 0 or self.repeats < 1:
            raise InputError(f"need warmup >= 0 and repeats >= 1, got {self.warmup}, "
                             f"{self.repeats}", field="repeats")
        self.min_time_s = min_time_s
        self.seed = seed

    def software(self) -> dict[str, str]:
        from nas import __version__

        sw = {"torch": torch.__version__, "python": platform.python_version(),
              "puzzle-nas": __version__}
        if self.kind == "cuda":
            sw["cuda"] = str(torch.version.cuda)
        return sw

    def header(self, spec: str, hidden: int, plan: Sequence[Point]) -> BlockMeasurements:
        """An empty table for this device, dtype and plan."""
        return BlockMeasurements(
            device=self.device_name, device_kind=self.kind,  # type: ignore[arg-type]  # kind is 'cpu' or 'cuda' (checked in __init__)
            date=_dt.datetime.now(_dt.timezone.utc).date().isoformat(),
            software=self.software(), dtype=self.dtype, threads=self.threads,
            timing=self.timing, warmup=self.warmup, repeats=self.repeats, spec=spec,
            hidden=hidden, plan=list(plan))

    # -- one call --------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.dev)

    def time_fn(self, fn: Callable[[], Any]) -> tuple[float, float, float, int]:
        """(median, min, max) seconds per call of ``fn`` over the repeats, and repeats."""
        self._sync()
        t0 = time.perf_counter()
        fn()
        self._sync()
        first = time.perf_counter() - t0
        for _ in range(self.warmup):
            fn()
        if self.kind == "cuda":
            ev = torch.cuda.Event
            pairs = [(ev(enable_timing=True), ev(enable_timing=True))
                     for _ in range(self.repeats)]
            for start, end in pairs:
                self.flush.zero_()  # type: ignore[union-attr]  # flush is allocated on CUDA, the only kind reaching here
                start.record()
                fn()
                end.record()
            self._sync()
            times = [s.elapsed_time(e) / 1e3 for s, e in pairs]
        else:
            inner = max(1, min(10_000, math.ceil(self.min_time_s / max(first, 1e-9))))
            times = [self._sample(fn, inner) for _ in range(self.repeats)]
        return float(statistics.median(times)), min(times), max(times), len(times)

    def _sample(self, fn: Callable[[], Any], inner: int) -> float:
        """CPU: seconds per call over ``inner`` calls back to back."""
        clock = self.clock
        t0 = clock()
        for _ in range(inner):
            fn()
        return (clock() - t0) / inner

    def _rotated(self, blk: Block, cfg: BlockConfig, hidden: int, p: Point
                 ) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        """One call of ``blk`` at ``p`` (:meth:`prepare`); when timing cold, each call on the
        next of as many copies of the block as hold at least ``cold_bytes`` together."""
        fn, resident = self.prepare(blk, cfg, hidden, p)
        if not self.cold_bytes:
            return fn, resident
        size = max(1, _storage_bytes(resident))
        n = max(2, min(COLD_COPIES, math.ceil(self.cold_bytes / size)))
        fns = [fn] + [self.prepare(copy.deepcopy(blk), cfg, hidden, p)[0] for _ in range(n - 1)]
        turn = itertools.cycle(fns)

        def rotated() -> Any:
            return next(turn)()

        return rotated, resident

    def peak_bytes(self, fn: Callable[[], Any], resident: Sequence[torch.Tensor],
                   base: int) -> int:
        """Peak bytes alive during one call of ``fn`` (see the module docstring)."""
        if self.kind == "cuda":
            self._sync()
            torch.cuda.reset_peak_memory_stats(self.dev)
            fn()
            self._sync()
            return int(torch.cuda.max_memory_allocated(self.dev) - base)
        mode = _LiveBytes(_storage_bytes(resident))
        with mode:
            out = fn()
        del out
        return int(mode.peak)

    @torch.no_grad()
    def time_gemm(self, m: int, n: int, k: int) -> GemmTiming:
        """One GEMM in the blocks' layout, ``x[m, k] @ W[n, k]^T``."""
        g = torch.Generator(device="cpu").manual_seed(self.seed + 2)
        a = torch.randn(m, k, generator=g).to(device=self.dev, dtype=self.tdtype)
        w = torch.randn(n, k, generator=g).to(device=self.dev, dtype=self.tdtype)
        med, fastest, _, _ = self.time_fn(lambda: torch.nn.functional.linear(a, w))
        return GemmTiming(m=m, n=n, k=k, median_s=med, flop_per_s=2.0 * m * n * k / med,
                          min_s=fastest)

    @torch.no_grad()
    def time_attention(self, batch: int, tokens: int, heads: int, kv_heads: int,
                       head_dim: int) -> AttentionTiming:
        """The attention kernel as an attention block runs it at a prefill point: causal
        SDPA, ``enable_gqa`` when the KV heads are fewer (:mod:`nas.modules.layers`)."""
        g = torch.Generator(device="cpu").manual_seed(self.seed + 3)
        q = torch.randn(batch, heads, tokens, head_dim, generator=g)
        k, v = (torch.randn(batch, kv_heads, tokens, head_dim, generator=g) for _ in range(2))
        q, k, v = (t.to(device=self.dev, dtype=self.tdtype) for t in (q, k, v))
        gqa = heads != kv_heads
        med, fastest, _, _ = self.time_fn(
            lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=tokens > 1, enable_gqa=gqa))
        flops = 4.0 * head_dim * heads * (tokens * (tokens + 1) / 2) * batch
        return AttentionTiming(batch=batch, tokens=tokens, heads=heads, kv_heads=kv_heads,
                               head_dim=head_dim, flops=flops, median_s=med, min_s=fastest)

    # -- the model around the blocks -----------------------------------------------------
    @torch.no_grad()
    def time_nonblock(self, arch: ModelArch, points: Sequence[Point], base: int
                      ) -> tuple[list[Timing], int]:
        """The non-block parts of ``arch`` (embedding, final norm, head) at each point, as
        the eager model runs them: a model of them whose one block is a no-op, called as
        greedy decoding calls it (prefill: the prompt's forward, then the argmax of the last
        position's logits; decode: one token's forward through the cache at ``context``
        tokens, then its argmax). Returns the timings (in ``points``' order) and the
        parameters' bytes."""
        torch.manual_seed(self.seed)
        model = CausalLM(arch.model_copy(update={"blocks": (NoOp(),), "mtp_blocks": ()}))
        model.reset_parameters()
        model = model.to(device=self.dev, dtype=self.tdtype).eval()
        g = torch.Generator(device="cpu").manual_seed(self.seed + 4)
        out = []
        for p in points:
            n = p.tokens if p.mode == "prefill" else 1
            toks = torch.randint(0, arch.vocab_size, (p.batch, n), generator=g).to(self.dev)
            cache = model.new_cache(p.context + 1) if p.mode == "decode" else None

            def fn(toks: torch.Tensor = toks, cache: Any = cache, ctx: int = p.context
                   ) -> torch.Tensor:
                if cache is not None:
                    cache.offset = ctx  # the step after a prompt of ctx tokens, every call
                return model(toks, cache)[:, -1].argmax(-1, keepdim=True)

            resident = [*model.parameters(), toks]
            out.append(self._timing(fn, resident, p, self.time_fn(fn), base))
        return out, _storage_bytes(list(model.parameters()))

    # -- one block ------------------------------------------------------------------------
    def build(self, cfg: BlockConfig, arch: ModelArch) -> Block:
        """The real block with random weights (seeded) in the run's dtype, on the device."""
        torch.manual_seed(self.seed)
        blk = Block(cfg, arch)
        blk.reset_parameters()
        return blk.to(device=self.dev, dtype=self.tdtype).eval()

    def prepare(self, blk: Block, cfg: BlockConfig, hidden: int, p: Point
                ) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        """One call of ``blk`` at point ``p`` (its input, and for a decode the cache filled
        by a real prefill, put back before every call) and the tensors it keeps alive."""
        g = torch.Generator(device="cpu").manual_seed(self.seed + 1)

        def rand(b: int, n: int) -> torch.Tensor:
            x = torch.randn(b, n, hidden, generator=g, dtype=torch.float32)
            return x.to(device=self.dev, dtype=self.tdtype)

        cache: dict[str, Any] = {}
        if p.mode == "prefill":
            x = rand(p.batch, p.tokens)

            def fn() -> torch.Tensor:
                return blk(x)
        else:
            if cfg.kind in STATEFUL and p.context > 0:
                cache["capacity"] = p.context + 1
                blk(rand(p.batch, p.context), cache, 0)
            x = rand(p.batch, 1)
            ctx = p.context
            filled = dict(cache)  # the cache as filled: put back before every step

            def fn() -> torch.Tensor:
                cache.update(filled)
                return blk(x, cache, ctx)
        return fn, [*blk.parameters(), *_cache_tensors(cache), x]

    def _timing(self, fn: Callable[[], Any], resident: Sequence[torch.Tensor], p: Point,
                times: tuple[float, float, float, int], base: int) -> Timing:
        med, lo, hi, n = times
        peak = self.peak_bytes(fn, resident, base)
        tracer = _OpTrace()
        with tracer:
            fn()
        return Timing(mode=p.mode, batch=p.batch, tokens=p.tokens, context=p.context,
                      median_s=med, min_s=lo, max_s=hi, repeats=n, peak_bytes=peak,
                      trace=tracer.result())

    @torch.no_grad()
    def time_point(self, blk: Block, cfg: BlockConfig, hidden: int, p: Point, base: int) -> Timing:
        """Time one point of one block."""
        fn, resident = self.prepare(blk, cfg, hidden, p)
        return self._timing(fn, resident, p, self.time_fn(fn), base)

    @torch.no_grad()
    def time_points(self, blk: Block, cfg: BlockConfig, hidden: int, points: Sequence[Point],
                    base: int) -> list[Timing]:
        """Time several points of one block (:meth:`time_group` of that one block)."""
        return self.time_group([(blk, cfg, list(points))], hidden, base)[0]

    @torch.no_grad()
    def time_group(self, group: Sequence[tuple[Block, BlockConfig, Sequence[Point]]],
                   hidden: int, base: int) -> list[list[Timing]]:
        """Time the points of several blocks; per block, its timings in its points' order.

        On a CPU the samples are interleaved: each of the ``repeats`` rounds takes one
        sample (a block of calls of at least ``min_time_s``) of every point of every block
        of the group, in a new (seeded) order each round, so that a slow spell of a shared
        core (other tenants on its cache, a clock change) falls on every point alike
        instead of on all samples of one point or one block; one untimed call before each
        sample brings the point's tensors back into the caches the previous point used.
        Every point gets the same rounds (extra rounds for the noisier points alone, as the
        device probe takes, put their samples in other spells than the rest's: that raised
        the calibrated MAPE here). On CUDA each point is timed in turn (:meth:`time_point`).
        """
        if self.kind == "cuda":
            return [[self.time_point(b, c, hidden, p, base) for p in pts]
                    for b, c, pts in group]
        calls = [(self._rotated(b, c, hidden, p), p) for b, c, pts in group for p in pts]
        inner = []
        for (fn, _), _ in calls:
            t0 = time.perf_counter()
            fn()
            first = time.perf_counter() - t0
            for _ in range(self.warmup):
                fn()
            inner.append(max(1, min(10_000, math.ceil(self.min_time_s / max(first, 1e-9)))))
        samples: list[list[float]] = [[] for _ in calls]
        order = random.Random(self.seed)
        idx = list(range(len(calls)))
        for _ in range(self.repeats):
            order.shuffle(idx)  # no point always follows the same one
            for i in idx:
                (fn, _), n, dst = calls[i][0], inner[i], samples[i]
                fn()  # untimed: the point's (last) tensors back in cache after the last point
                dst.append(self._sample(fn, n))
        flat = [self._timing(fn, resident, p, (float(statistics.median(ts)), min(ts),
                                               max(ts), len(ts)), base)
                for ((fn, resident), p), ts in zip(calls, samples)]
        per_block, k = [], 0
        for _, _, pts in group:
            per_block.append(flat[k:k + len(pts)])
            k += len(pts)
        return per_block


COLD_MARK = "each call on another copy of the block"
"""How a cold table's ``timing`` says it (:func:`timed_cold`)."""


def timed_cold(table: BlockMeasurements) -> bool:
    """Whether ``table``'s blocks were timed cold (``profile --blocks --cold``)."""
    return COLD_MARK in table.timing


COLD_COPIES = 64
"""Cold timing: the most copies of one block (a block of 64 KiB rotates 64 copies)."""


def l2_bytes() -> int:
    """The L2 cache of one core (``/sys/devices/system/cpu/cpu0/cache``), else 2 MiB."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for d in sorted(base.glob("index*")):
            if (d / "level").read_text().strip() == "2":
                size = (d / "size").read_text().strip().upper()
                mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
                return int(size.rstrip("KMG")) * mult
    except (OSError, ValueError):
        pass
    return 2 * 2**20


GROUP_BYTES = 1 << 30
"""CPU: the most weight bytes of blocks timed together, their points interleaved
(:meth:`BlockTimer.time_group`; the file is written after each group)."""


def distinct_blocks(blocks: Sequence[BlockConfig], hidden: int) -> list[tuple[str, BlockConfig]]:
    """``(row_key, block)`` of each distinct shape (first occurrence; no-ops left out:
    nothing runs)."""
    out: dict[str, BlockConfig] = {}
    for b in blocks:
        if b.kind == "noop":
            continue
        out.setdefault(row_key(block_row(b, hidden)), b)
    return list(out.items())


def gemm_shapes(blocks: Sequence[BlockConfig], hidden: int) -> list[tuple[int, int]]:
    """``(n, k)`` of the blocks' linear layers timed as plain GEMMs: ``(hidden, hidden)``
    and, with FFN blocks, ``(width, hidden)`` of the widest FFN."""
    out = [(hidden, hidden)]
    widths = [int(getattr(b, "width", 0)) for b in blocks if b.kind == "ffn"]
    if widths:
        out.append((max(widths), hidden))
    return out


def attention_shapes(blocks: Sequence[BlockConfig]) -> list[tuple[int, int, int]]:
    """``(heads, kv_heads, head_dim)`` of the plain (full-attention, no sinks, no output
    gate) attention blocks, each once."""
    from nas.arch import Attention

    return sorted({(b.num_heads, b.num_kv_heads, b.head_dim) for b in blocks
                   if isinstance(b, Attention) and not b.sliding_window and not b.sinks})


def gemm_tokens(plan: Sequence[Point], most: int = 5) -> list[int]:
    """Token counts (GEMM ``m``) the plan's passes run, at most ``most`` of them spread
    evenly in log scale from the smallest to the largest."""
    ms = sorted({p.batch * p.tokens for p in plan})
    if len(ms) <= most:
        return ms
    want = [math.exp(math.log(ms[0]) + i * (math.log(ms[-1]) - math.log(ms[0])) / (most - 1))
            for i in range(most)]
    return sorted({min(ms, key=lambda m: abs(math.log(m) - math.log(w))) for w in want})


_SAME = ("device", "device_kind", "software", "dtype", "threads", "timing", "warmup",
         "repeats", "hidden", "plan")


def _check_resume(old: BlockMeasurements, new: BlockMeasurements, path: Path) -> None:
    for f in _SAME:
        a, b = getattr(old, f), getattr(new, f)
        if f == "plan":
            a, b = sorted(a, key=repr), sorted(b, key=repr)
        if a != b:
            raise InputError(
                f"exists and was written by another run ({f}: {getattr(old, f)!r} here, "
                f"{getattr(new, f)!r} now); give a new -o to start afresh, or the same "
                "settings to resume", path=str(path), field=f)


def profile_blocks(blocks: Sequence[BlockConfig], arch: ModelArch, plan: Sequence[Point],
                   out: str | Path, timer: BlockTimer, spec: str = "",
                   progress: ProgressFn | None = None) -> BlockMeasurements:
    """Time every distinct block shape of ``blocks`` at every point of ``plan`` and write
    the table to ``out`` after each point (resuming from ``out`` when it exists)."""
    from nas.io import atomic_write_json

    out = Path(out)
    hidden = arch.hidden_size
    table = timer.header(spec, hidden, plan)
    if out.exists():
        old = load_blocks(out)
        _check_resume(old, table, out)
        table = old
    shapes = distinct_blocks(blocks, hidden)
    if not table.gemm:  # the device's GEMMs in the blocks' layout, once per file
        table.gemm = [timer.time_gemm(m, n, kk) for m in gemm_tokens(table.plan)
                      for n, kk in gemm_shapes(blocks, hidden)]
        atomic_write_json(out, table.model_dump(mode="json"))
    if not table.attention:  # the attention kernel at the blocks' shapes, once per file
        table.attention = [timer.time_attention(p.batch, p.tokens, h, kv, d)
                           for h, kv, d in attention_shapes(blocks) for p in table.plan
                           if p.mode == "prefill"]
        if table.attention:
            atomic_write_json(out, table.model_dump(mode="json"))
    def timed(k: str) -> Sequence[Any]:
        """The timings of shape ``k`` so far (none when it was not measured)."""
        e = table.entry(k)
        return e.timings if e else []

    todo = [(k, b, p) for k, b in shapes for p in table.plan
            if not any(t.point == p for t in timed(k))]
    nb_row = nonblock_row(hidden, arch.vocab_size, arch.tie_embeddings, arch.final_norm)
    if table.nonblock is not None and table.nonblock.row != nb_row:
        raise InputError(f"exists and timed the non-block parts of another model "
                         f"({describe_nonblock(table.nonblock.row)}; this spec's: "
                         f"{describe_nonblock(nb_row)}); give a new -o", path=str(out),
                         field="nonblock")
    nb_todo = [p for p in table.plan if table.nonblock is None
               or not any(t.point == p for t in table.nonblock.timings)]
    total = (len(shapes) + 1) * len(table.plan)
    done = total - len(todo) - len(nb_todo)
    if progress:
        progress(done, total, "")
    if not todo and not nb_todo:
        return table
    base = 0
    if timer.kind == "cuda":
        torch.cuda.synchronize(timer.dev)
        base = int(torch.cuda.memory_allocated(timer.dev))
    if nb_todo:  # the model around the blocks, first (one small model, every point)
        ts, wbytes = timer.time_nonblock(arch, nb_todo, base)
        if table.nonblock is None:
            table.nonblock = BlockEntry(key=row_key(nb_row), kind=NONBLOCK,
                                        describe=describe_nonblock(nb_row), row=nb_row,
                                        weight_bytes=wbytes)
        table.nonblock.timings.extend(ts)
        atomic_write_json(out, table.model_dump(mode="json"))
        done += len(nb_todo)
        if progress:
            progress(done, total, f"non-block parts, {len(nb_todo)} points")
        if not todo:
            return table
    groups: dict[str, tuple[BlockConfig, list[Point]]] = {}
    for k, cfg, p in todo:
        groups.setdefault(k, (cfg, []))[1].append(p)

    def entry_for(k: str, cfg: BlockConfig, blk: Block) -> BlockEntry:
        e = table.entry(k)
        if e is None:
            row = block_row(cfg, hidden)
            e = BlockEntry(key=k, kind=cfg.kind, describe=cfg.describe(), row={
                c: int(v) for c, v in row.items() if int(v) != 0},
                config=cfg.model_dump(mode="json"),
                weight_bytes=_storage_bytes(list(blk.parameters())))
            table.blocks.append(e)
        return e

    if timer.kind == "cuda":  # one block on the device, one point at a time, written after each
        for k, (cfg, pts) in groups.items():
            blk = timer.build(cfg, arch)
            e = entry_for(k, cfg, blk)
            for p in pts:
                e.timings.append(timer.time_point(blk, cfg, hidden, p, base))
                atomic_write_json(out, table.model_dump(mode="json"))
                done += 1
                if progress:
                    progress(done, total, f"{describe_row(e.row)[:28]} {p.label()}")
            del blk
        return table
    # CPU: blocks in groups of at most GROUP_BYTES of weights, each group's points
    # interleaved (BlockTimer.time_group) and written together
    pending = list(groups.items())
    ahead: Block | None = None  # built for a group it did not fit: the next group's first
    while pending:
        group: list[tuple[str, BlockConfig, Block, list[Point]]] = []
        held = 0
        while pending:
            k, (cfg, pts) = pending[0]
            blk, ahead = ahead or timer.build(cfg, arch), None
            size = _storage_bytes(list(blk.parameters()))
            if group and held + size > GROUP_BYTES:
                ahead = blk
                break
            pending.pop(0)
            group.append((k, cfg, blk, pts))
            held += size
        got = timer.time_group([(b, c, pts) for _, c, b, pts in group], hidden, base)
        for (k, cfg, blk, _), ts in zip(group, got):
            entry_for(k, cfg, blk).timings.extend(ts)
        atomic_write_json(out, table.model_dump(mode="json"))
        done += sum(len(pts) for *_, pts in group)
        if progress:
            progress(done, total, f"{len(group)} blocks, {sum(len(p) for *_, p in group)} "
                     "points")
        del group, got
    return table
