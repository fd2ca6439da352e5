"""Whole-or-absent outputs.

* :func:`atomic_write`: one file, written to a temp file in the same folder, then renamed.
* :func:`staged_dir`: a multi-file output (a search run, a checkpoint) written into a fresh
  temporary sibling folder and swapped in when complete. On Linux the swap is one
  ``renameat2(RENAME_EXCHANGE)``, so a reader sees the old set or the new set, never a mix
  (elsewhere: two renames, with the folder absent for an instant, never mixed). The old set
  is deleted only after the new one is in place, and the swap drops an earlier run's stale
  files. SIGINT and SIGTERM are held back during the swap.
* :func:`check_output_dir` / :func:`check_output_file`: the output location checked (created,
  writable, not holding foreign files) before any work starts.
* :func:`output_lock`: one run at a time per output location; a second is refused at once
  (the last to finish would otherwise replace the other's results without a word).
* :func:`remove_dir`: a folder deleted whole (renamed aside first, so a cut-short deletion
  never leaves a half-deleted folder under its name).
* Temp entries are named ``.NAME.<pid>-<random>.tmp`` (or ``.old``) after their writer
  (:func:`temp_prefix`): a killed run's (SIGKILL, a crash: no clean-up ran) are removed by
  the next run that checks the location (:func:`remove_stale_temps`), once their writer's
  process is gone.

Files and folders get the usual umask permissions. Problems with the output location are
one-line :class:`~hwprofiles.errors.InputError` s naming it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hwprofiles.errors import InputError

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _why(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


def _mkdirs(folder: Path, what: str, target: Path | None = None) -> None:
    """Create ``folder`` (the one ``target`` goes into); errors name ``target``."""
    named = str(target if target is not None else folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{folder} exists and is not a folder", path=named,
                         field=what) from None
    except OSError as exc:
        raise InputError(f"cannot create folder {folder} ({_why(exc)})", path=named,
                         field=what) from None


def _probe_writable(target: Path, what: str) -> None:
    """Create and remove a temp folder beside ``target`` (the real test: permissions,
    read-only mounts, /proc and /sys all fail here). A Ctrl-C waits until the probe is gone,
    so none is left behind."""
    try:
        with _signals_held():
            probe = tempfile.mkdtemp(prefix=".puzzle-nas-write-test.", dir=target.parent)
            os.rmdir(probe)
    except OSError as exc:
        raise InputError(f"cannot write in {target.parent} ({_why(exc)})", path=str(target),
                         field=what) from None


_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO)
#: what libraries that do not raise OSError say about a failed write (safetensors quotes
#: the OS error; sqlite, torch.save and tempfile have their own words)
_WRITE_WORDS = tuple(os.strerror(e) for e in _WRITE_ERRNOS) + (
    "database or disk is full", "disk I/O error", "file write failed",
    "No usable temporary directory")


def write_failure(exc: BaseException) -> str | None:
    """The one-line reason when ``exc`` (or an exception it came from) is a failed write: a
    full disk, a file-size limit, a quota, a read-only or failing disk; None otherwise (a
    bug keeps its traceback). The CLI prints it as one line (exit 1): every output is a
    temp file or a staged folder until it is complete, so nothing half-written is left."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
            return os.strerror(e.errno)  # not the file: a temp name means nothing to a user
        text = " ".join(str(e).split())
        if any(w in text for w in _WRITE_WORDS):
            return text[:300]
        e = e.__cause__ or e.__context__
    return None


def temp_prefix(path: str | Path) -> str:
    """Name prefix of a temp entry beside ``path`` (``.NAME.<pid>-``): the writer's pid,
    so that :func:`remove_stale_temps` knows a killed writer's leftovers."""
    return f".{Path(path).name}.{os.getpid()}-"


def _writer_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        return True
    return True


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Remove the temp entries beside ``path`` (``.NAME.<pid>-*.tmp`` / ``.old``, see
    :func:`temp_prefix`) and, when ``path`` is a folder, inside it (a staged checkpoint or a
    temp file of any name) whose writer process is gone: what a SIGKILLed or crashed run
    left (a checkpoint's can be GBs). Entries of a live process, and names without a pid,
    are left alone. Returns what was removed."""
    import re

    path = Path(os.path.abspath(path))
    tail = r"\.(\d+)-[A-Za-z0-9_]+\.(?:tmp|old)$"
    places = [(path.parent, re.compile(re.escape(f".{path.name}") + tail))]
    if path.is_dir() and not path.is_symlink():
        places.append((path, re.compile(r"\..+" + tail)))
    gone = []
    for folder, pat in places:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            m = pat.match(name)
            if m is None or _writer_alive(int(m.group(1))):
                continue
            entry = folder / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
            if not os.path.lexists(entry):
                gone.append(entry)
    return gone


def _not_empty(path: str | Path, what: str, expected: str) -> None:
    """An empty (or blank) path is refused: ``Path("")`` would quietly mean the current
    folder."""
    if isinstance(path, str) and not path.strip():
        raise InputError(f"is empty, expected {expected}", field=what)


def check_output_file(path: str | Path, what: str = "output") -> Path:
    """Check that file ``path`` can be written (its folder created and writable; ``path``
    not a folder) before any work starts."""
    _not_empty(path, what, "a file path")
    path = Path(path)
    if path.is_dir():
        raise InputError("is a folder, expected a file path", path=str(path), field=what)
    _mkdirs(path.parent, what, path)
    _probe_writable(path, what)
    remove_stale_temps(path)
    return path


def check_output_dir(path: str | Path, ours: Callable[[str], bool] | None = None,
                     what: str = "output") -> Path:
    """Check output folder ``path`` before any work starts: not a file, its parent created and
    writable, and, when it exists, holding only entries ``ours(name)`` accepts (the files an
    earlier run wrote; anything else would be deleted by the swap, so it is refused)."""
    _not_empty(path, what, "a folder path")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a folder", path=str(path), field=what)
    if path.is_dir() and ours is not None:
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            raise InputError(f"cannot read the folder ({_why(exc)})", path=str(path),
                             field=what) from None
        foreign = [n for n in names if not ours(n)]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more"
                                              if len(foreign) > 5 else "")
            raise InputError(f"holds files this command does not write ({shown}); writing "
                             "there replaces the whole folder, so choose a new or empty "
                             "folder", path=str(path), field=what)
    _mkdirs(path.parent, what, path)
    _probe_writable(path, what)
    remove_stale_temps(path)
    return path


def lock_path(path: str | Path) -> Path:
    """The lock file of output location ``path`` (:func:`output_lock`): ``.NAME.lock``
    beside it."""
    path = Path(os.path.abspath(path))
    return path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def output_lock(path: str | Path, what: str = "output") -> Iterator[None]:
    """Hold output location ``path`` for the block, so that two runs never write the same
    place: a second run is refused at once with a one-line :class:`InputError` naming
    ``path`` and the run that holds it (exit 2). The lock is an ``flock`` on
    :func:`lock_path` (a killed run's is released by the kernel; the file is removed when
    the block ends). Without ``fcntl`` (not POSIX) nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock = lock_path(path)
    _mkdirs(lock.parent, what, Path(path))
    fd = None
    try:
        # a Ctrl-C never leaves the lock file behind: one held while the lock is taken is
        # delivered as the block below is left, inside this try
        with _signals_held():
            fd = _take_lock(fcntl, lock, path, what)
        yield
    finally:
        if fd is not None:
            with _signals_held():
                with contextlib.suppress(OSError):
                    os.unlink(lock)  # while still locked: a waiter re-checks the inode
                os.close(fd)


def _take_lock(fcntl: Any, lock: Path, path: str | Path, what: str) -> int:
    """The descriptor of ``lock``, flocked and holding this pid (see :func:`output_lock`)."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise InputError(f"cannot write in {lock.parent} ({_why(exc)})", path=str(path),
                             field=what) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip()
            except OSError:
                holder = ""
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise InputError(f"another puzzle-nas run ({who}) is writing this output now; "
                             "wait for it to finish or choose another folder",
                             path=str(path), field=what) from None
        try:  # the holder may have removed the file just before this lock: lock the new one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if same:
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError as exc:  # a full disk: nothing can be written, fail before work
                with contextlib.suppress(OSError):
                    os.unlink(lock)
                os.close(fd)
                raise InputError(f"cannot write in {lock.parent} ({_why(exc)})",
                                 path=str(path), field=what) from None
            return fd
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False when unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: the filesystem cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT / SIGTERM delivered only after the block (main thread only).

    The Python-level handlers are swapped for ones that only record the signal, and the
    recorded signals are handed to the original handlers after the block. (Blocking with
    ``pthread_sigmask`` is not enough: it blocks the calling thread only, and the kernel
    may deliver a process-directed signal to another thread, e.g. one of torch's, whose
    C handler then makes the main thread raise at its next bytecode, inside the block.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    saved: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        saved[sig] = signal.signal(sig, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for num, handler in saved.items():
            signal.signal(num, handler)
        deliver_signals(got, saved)


def deliver_signals(sigs: list[int], saved: dict[int, Any]) -> None:
    """Hand each recorded signal (once each, in arrival order) to the handler saved for it:
    a callable is called, the default action happens (SIGINT as KeyboardInterrupt), an
    ignored signal stays ignored."""
    for sig in dict.fromkeys(sigs):
        handler = saved.get(sig, signal.SIG_DFL)
        if callable(handler):
            handler(sig, None)
        elif handler == signal.SIG_DFL:
            if sig == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(sig)


def swap_in_dir(staged: Path, path: Path) -> None:
    """Move complete folder ``staged`` to ``path``, replacing an existing ``path`` whole."""
    with _signals_held():
        if not path.exists():
            os.rename(staged, path)
            return
        if _exchange(staged, path):
            shutil.rmtree(staged, ignore_errors=True)  # ``staged`` now holds the old set
            return
        old = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".old", dir=path.parent))
        os.rmdir(old)
        os.rename(path, old)
        os.rename(staged, path)
        shutil.rmtree(old, ignore_errors=True)


def remove_dir(path: str | Path) -> bool:
    """Delete folder ``path`` whole or not at all: it is first renamed to a temp entry
    beside it (``.NAME.<pid>-*.old``, one rename, signals held), then deleted; a deletion
    cut short leaves only that entry, which the next run that checks the place removes
    (:func:`remove_stale_temps`). False when there was no such folder."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return False
    with _signals_held():
        old = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".old", dir=path.parent))
        os.rmdir(old)
        os.rename(path, old)
    shutil.rmtree(old, ignore_errors=True)
    return True


@contextlib.contextmanager
def staged_dir(path: str | Path, what: str = "output") -> Iterator[Path]:
    """``with staged_dir(out) as tmp: write files into tmp``; on success ``tmp`` replaces
    ``out`` whole (see the module docstring); on any error or interrupt ``tmp`` is removed
    and ``out`` is untouched."""
    path = Path(path)
    _mkdirs(path.parent, what)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent))
    except OSError as exc:
        raise InputError(f"cannot write there ({_why(exc)})", path=str(path.parent),
                         field=what) from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private
        yield tmp
        swap_in_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_temp_name(name: str, base: str) -> bool:
    """A leftover temp entry of ours beside/inside ``base`` (a killed run's)."""
    return name.startswith(f".{base}.") and name.endswith((".tmp", ".old"))


def names_matching(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A predicate for :func:`check_output_dir`: ``fnmatch`` against any pattern."""
    import fnmatch

    pats = list(patterns)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in pats)


def atomic_write(path: str | Path, writer: Callable[[Path], object]) -> Path:
    """Call ``writer(tmp_path)`` and rename the result onto ``path``; on any error no file is left.

    ``path``'s parent folder is created if missing.
    """
    path = Path(path)
    _mkdirs(path.parent, "output")
    try:
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot write there ({_why(exc)})", path=str(path.parent),
                         field="output") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        writer(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_umask())
        with _signals_held():
            os.replace(tmp_path, path)
    except IsADirectoryError:
        tmp_path.unlink(missing_ok=True)
        raise InputError("is a folder, expected a file path", path=str(path),
                         field="output") from None
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda p: p.write_text(text))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
