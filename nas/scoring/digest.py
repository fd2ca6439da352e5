"""Hashes that key every scoring result: the parent's weights and the scoring code."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

import nas.child.inherit
import nas.kinds
import nas.modules


def tensor_line(name: str, t: torch.Tensor) -> str:
    """One tensor's line of :func:`weights_digest`: name, dtype, shape and the SHA-256 of
    its bytes."""
    t = t.detach().cpu().contiguous()
    d = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().data).hexdigest()
    return f"{name}|{t.dtype}|{tuple(t.shape)}|{d}"


def combine_lines(lines: list[str]) -> str:
    """:func:`weights_digest` from its tensor lines, in ``state_dict`` order."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor of ``model``: of one line per tensor (name, dtype, shape,
    SHA-256 of its bytes; :func:`tensor_line`) in ``state_dict`` order. Tensor by tensor,
    so the ranks of a sharded parent (:mod:`nas.scoring.pipeline`) hash their own tensors
    and the lines gathered give the same digest as the whole model in one process."""
    return combine_lines([tensor_line(n, t) for n, t in model.state_dict().items()])


def code_digest() -> str:
    """SHA-256 of the torch version and the source of everything that computes a score (the
    modules, the kinds, the init rules, fake quantization, the scoring core and BLD): part
    of every key, so that rows computed by other code are never reused."""
    h = hashlib.sha256(torch.__version__.encode())
    here = Path(__file__).parent
    files = sorted(Path(nas.modules.__file__).parent.glob("*.py")) + [
        *sorted(Path(nas.child.inherit.__file__).parent.glob("*.py")),
        *sorted(Path(nas.kinds.__file__).parent.glob("*.py")),  # configs, quantized linears
        here / "core.py", here / "bld.py", here / "pipeline.py", here / "fakequant.py"]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


METRICS = ("kl_div", "lm_loss_delta", "top1_agreement")


PARENT_RECORD = "parent-digest.json"
"""Beside a scoring run: the parent's :func:`weights_digest` per compute dtype, with the
size and modification time of every file of the parent folder it was computed from."""


def _signature(parent_dir: str | Path) -> dict[str, list[int]]:
    out = {}
    for f in sorted(Path(parent_dir).iterdir()):
        if f.is_file() and (f.suffix in (".safetensors", ".json")):
            st = f.stat()
            out[f.name] = [st.st_size, st.st_mtime_ns]
    return out


def _machine_key(dtype: str) -> str:
    """The dtype part of a record's key (``"teacher:torch.bfloat16"`` -> ``"bfloat16"``):
    scoring's ``"bfloat16"`` and a distillation's ``"teacher:torch.bfloat16"`` hash the same
    tensors, so this machine's record serves both."""
    return dtype.rpartition(":")[2].removeprefix("torch.")


def _machine_record(parent_dir: str | Path) -> Path:
    """This machine's record of the parent folder ``parent_dir`` (:func:`nas.cache.cache_dir`,
    ``digests/``; named by the SHA-256 of its resolved path)."""
    from nas.cache import cache_dir

    key = hashlib.sha256(str(Path(parent_dir).resolve()).encode()).hexdigest()[:32]
    return cache_dir("digests") / f"{key}.json"


def _read(path: Path, parent_dir: str | Path, dtype: str) -> str | None:
    import json

    try:
        data = json.loads(path.read_text())
        if data.get("parent") == str(Path(parent_dir).resolve()) and \
                data.get("files") == _signature(parent_dir):
            d = data.get("digests", {}).get(dtype)
            return d if isinstance(d, str) else None
    except (OSError, ValueError, AttributeError):
        return None
    return None


def recorded_digest(out_dir: str | Path, parent_dir: str | Path, dtype: str,
                    record: str = PARENT_RECORD) -> str | None:
    """The digest recorded for this parent in compute dtype ``dtype``, if no file of the
    parent folder changed since (size and modification time): by a run in ``out_dir``, or
    by any command on this machine (:func:`nas.cache.cache_dir`, ``digests/``). A resume,
    another output folder, a later stage or another command (score, then distill with
    that parent as teacher) then neither reads nor hashes the parent to know its digest:
    a parent is hashed once per machine."""
    found = _read(Path(out_dir) / record, parent_dir, dtype)
    if found is None:
        found = _read(_machine_record(parent_dir), parent_dir, _machine_key(dtype))
    return found


def _write(path: Path, parent_dir: str | Path, dtype: str, digest: str) -> None:
    import json

    from nas.io import atomic_write_json

    sig = _signature(parent_dir)
    digests: dict[str, str] = {}
    try:
        old = json.loads(path.read_text())
        if old.get("files") == sig:
            digests = dict(old.get("digests", {}))
    except (OSError, ValueError, AttributeError):
        pass
    digests[dtype] = digest
    atomic_write_json(path, {"parent": str(Path(parent_dir).resolve()), "files": sig,
                             "digests": digests})


def record_digest(out_dir: str | Path, parent_dir: str | Path, dtype: str, digest: str,
                  record: str = PARENT_RECORD) -> None:
    """Record ``digest`` beside the run and in this machine's cache (see
    :func:`recorded_digest`; ``record``: the file beside the run, one per checkpoint a run
    reads, e.g. a distillation's teacher and student). A cache that cannot be written
    (read-only home, full disk) is skipped: it only saves time."""
    _write(Path(out_dir) / record, parent_dir, dtype, digest)
    path = _machine_record(parent_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, parent_dir, _machine_key(dtype), digest)
    except OSError:
        pass
