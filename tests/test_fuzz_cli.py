"""Fuzz the command line with broken inputs: every run ends with exit 0, 2 or 3, with no
traceback, within a time and a memory bound.

Hypothesis mutates the shipped configs, a search spec, a hardware profile and a block library
(NaN, +-inf, huge, negative, zero, wrong types, missing keys, extra keys, at any place in the
document) and runs ``inspect``, ``cost``, ``search``, ``hw show`` and ``solve`` on them in
process (``nas.cli.main``). An exception escaping ``main`` is a failure with the example that
caused it.

Bounds: the fuzzing runs in a child pytest process whose address space is capped at
:data:`MEMORY_BOUND` (a run that tries to allocate more fails with ``MemoryError``, which
escapes ``main`` and fails the test); each command run has a :data:`RUN_TIMEOUT_S` hang
guard. Examples are derandomized so CI runs the same cases every time.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
INNER = os.environ.get("PUZZLE_NAS_FUZZ_INNER") == "1"
MEMORY_BOUND = 3 * 2**30
"""Address space of the fuzzing process: 3 GiB, 40x what a run on these small inputs needs
(numpy, scipy, HiGHS and matplotlib loaded come to ~75 MB resident); the sweep that once ran
to 24 GB is far past it."""
RUN_TIMEOUT_S = 60
"""Hang guard per command run (each takes ~0.05-1 s here); generous for a loaded CI machine."""
EXAMPLES = int(os.environ.get("PUZZLE_NAS_FUZZ_EXAMPLES", "40"))
"""Mutated documents per input kind: ~200 runs, ~20 s on 2 cores (set
``PUZZLE_NAS_FUZZ_EXAMPLES`` for a longer, randomized local fuzz)."""
DERANDOMIZE = "PUZZLE_NAS_FUZZ_EXAMPLES" not in os.environ

CONFIGS = [REPO / "examples" / "configs" / n for n in
           ("llama-3.1-8b.json", "nemotron-3-nano-30b-a3b.json",
            "nemotron-3-super-120b-a12b.json")]
PROFILE = REPO / "hwprofiles" / "data" / "h100-sxm.json"
TINY_PARENT = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 768,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
    "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False}
TINY_SPEC = {
    "name": "tiny", "parent": TINY_PARENT, "hardware": {"profile": "h100-sxm", "tp": 1},
    "precision": "bf16", "workloads": {"chat": {"isl": 512, "osl": 128, "concurrency": 8}},
    "search_space": {"attention": {"kv_heads": [2, 1], "noop": True},
                     "ffn": {"fractions": [0.5], "round_to": 64, "noop": True}},
    "objective": {"minimize": "quality"},
    "budgets": [{"metric": "memory", "workload": "chat", "max": "device"},
                {"metric": "throughput", "workload": "chat", "min": "105%"}],
    "solver": {"time_limit": 10, "gap": 1e-4}}

BAD_VALUES: list[Any] = [math.nan, math.inf, -math.inf, 1e300, -1e300, 10**400, -1, 0, 2.5,
                         10**12, "x", "", None, True, [], {}, [1], {"a": 1}]


# ---------------------------------------------------------------------------------------
# the outer test: the fuzzing in a child process under the memory bound
# ---------------------------------------------------------------------------------------
def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


@pytest.mark.skipif(INNER, reason="the outer driver")
def test_fuzz_cli_bounded(tmp_path):
    env = {**os.environ, "PUZZLE_NAS_FUZZ_INNER": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "base"), str(Path(__file__)), "-k", "inner"],
        cwd=REPO, env=env, preexec_fn=_limit_memory, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S * EXAMPLES)
    tail = p.stdout[-6000:] + p.stderr[-2000:]
    assert p.returncode == 0, tail
    assert "5 passed" in p.stdout, tail


# ---------------------------------------------------------------------------------------
# the inner tests (run only in the child)
# ---------------------------------------------------------------------------------------
inner = pytest.mark.skipif(not INNER, reason="run by test_fuzz_cli_bounded in a bounded child")


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"a command ran past the {RUN_TIMEOUT_S} s hang guard")


def run_cli(args: list[str]) -> tuple[int, str]:
    """Run ``main(args)`` in process; any exception escaping it fails the example."""
    from nas.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, RUN_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            # numpy overflow / invalid-value warnings mean a number got through unchecked
            warnings.simplefilter("error", RuntimeWarning)
            try:
                rc = main(args)
            except SystemExit as exc:  # argparse: usage errors are exit 2
                rc = int(exc.code or 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    assert rc in (0, 2, 3), f"exit {rc} for {args}: {text[-2000:]}"
    assert "Traceback" not in text, text
    if rc in (2, 3):
        lines = [ln for ln in text.splitlines() if ln.strip() and "error" in ln]
        assert lines, f"exit {rc} without an error line: {text!r}"
    return rc, text


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, data: Any, values: list[Any] = BAD_VALUES) -> Any:
    """One mutation at a place hypothesis picks."""
    from hypothesis import strategies as st

    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths), label="path")
    op = data.draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra"]),
                   label="op")
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
    elif op == "extra" and isinstance(parent, dict):
        parent["zz_unknown_key"] = data.draw(st.sampled_from(values), label="extra")
    else:
        parent[key] = data.draw(st.sampled_from(values), label="value")
    return doc


def _write(folder: Path, name: str, doc: Any) -> Path:
    f = folder / name
    f.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes and reads them
    return f


def _settings() -> Any:
    from hypothesis import HealthCheck, settings

    return settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
                    suppress_health_check=list(HealthCheck))


if INNER:
    from hypothesis import given
    from hypothesis import strategies as st

    @inner
    @_settings()
    @given(data=st.data())
    def test_inner_configs(data):
        src = data.draw(st.sampled_from(CONFIGS), label="config")
        doc = _mutate(json.loads(src.read_text()), data)
        with tempfile.TemporaryDirectory() as d:
            f = _write(Path(d), "config.json", doc)
            run_cli(["inspect", str(f)])
            run_cli(["cost", str(f), "--hw", "h100-sxm", "--workload", "isl=64,osl=16,batch=1",
                     "--context", "4096"])

    @inner
    @_settings()
    @given(data=st.data())
    def test_inner_specs(data):
        doc = _mutate(TINY_SPEC, data)
        with tempfile.TemporaryDirectory() as d:
            f = _write(Path(d), "spec.json", doc)
            out = Path(d) / "run"
            rc, _ = run_cli(["search", str(f), "-o", str(out), "--quiet"])
            # whole or absent: a failed run leaves no folder, a good one a complete set
            if rc == 0:
                assert {"blueprint.json", "report.md", "library.json"} <= set(os.listdir(out))
            else:
                assert not out.exists()
            assert sorted(os.listdir(d)) == (["run", "spec.json"] if rc == 0 else ["spec.json"])

    @inner
    @_settings()
    @given(data=st.data())
    def test_inner_profiles(data):
        doc = _mutate(json.loads(PROFILE.read_text()), data)
        with tempfile.TemporaryDirectory() as d:
            f = _write(Path(d), "profile.json", doc)
            run_cli(["hw", "show", str(f)])
            run_cli(["cost", str(CONFIGS[0]), "--hw", str(f), "--workload",
                     "isl=64,osl=16,concurrency=4", "--context", "4096"])

    _LIBRARY: dict[str, Any] = {}

    def _library() -> Any:
        if "doc" not in _LIBRARY:
            with tempfile.TemporaryDirectory() as d:
                spec = _write(Path(d), "spec.json", TINY_SPEC)
                rc, err = run_cli(["search", str(spec), "-o", str(Path(d) / "run"), "--quiet"])
                assert rc == 0, err
                _LIBRARY["doc"] = json.loads((Path(d) / "run" / "library.json").read_text())
        return _LIBRARY["doc"]

    @inner
    @_settings()
    @given(data=st.data())
    def test_inner_libraries(data):
        doc = _mutate(_library(), data, BAD_VALUES)
        with tempfile.TemporaryDirectory() as d:
            f = _write(Path(d), "library.json", doc)
            run_cli(["solve", str(f), "--objective", "quality",
                     "--budget", "runtime_s@chat<=1", "--budget", "memory_bytes@chat<=80 GiB"])

    @inner
    @_settings()
    @given(flag=st.sampled_from(["--reserve-gib", "--step-overhead-us", "--request-overhead-ms",
                                 "--tp", "--context", "--acceptance", "--workload"]),
           value=st.sampled_from(["nan", "inf", "-inf", "1e300", "-1", "0", "3", "x",
                                  "isl=1e300,osl=1,batch=1", "isl=nan,osl=1,batch=1"]))
    def test_inner_cost_flags(flag, value):
        extra = ["--mtp"] if flag == "--acceptance" else []
        wl = [] if flag == "--workload" else ["--workload", "isl=64,osl=16,batch=1"]
        run_cli(["cost", str(CONFIGS[2]), "--hw", "h100-sxm", flag, value, *wl, *extra])
