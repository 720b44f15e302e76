"""The files that runs write and read back (config.json, metrics.jsonl, summaries), shared by sim, gpu and harness:
atomic writes, and reads whose failures are a ``ValueError`` naming the file. A writer killed mid-line leaves a
half-written last line in a JSONL file; readers drop it with a warning instead of failing."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import warnings
from pathlib import Path


@contextlib.contextmanager
def naming(path):
    """An OSError raised in the block without a file name (a write, flush or fsync past a full disk, ENOSPC, or a
    quota, EDQUOT) is raised again naming ``path``, so that its one-line error says where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def write_text(path, text: str) -> None:
    """Write ``text`` atomically: a temp file in the same folder, flushed to disk, then os.replace. A write that
    fails (a full disk, a read-only file system) is an OSError naming ``path``, and leaves no temp file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with naming(path), open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path, obj) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically."""
    write_text(path, json.dumps(obj, indent=1, sort_keys=True))


def read_text(path, errors: str = "strict") -> str:
    """The UTF-8 text of the regular file ``path``; a ValueError naming the file when it cannot be read, is not a
    regular file (a FIFO would block the reader) or holds a byte that is not UTF-8 (named by line and column; with
    ``errors="replace"`` such bytes become U+FFFD instead)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is refused below
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file; expected a file to read")
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        line, column = data.count(b"\n", 0, exc.start) + 1, exc.start - data.rfind(b"\n", 0, exc.start)
        raise ValueError(f"{path}: line {line}, column {column}: byte 0x{data[exc.start]:02x} is not UTF-8") from None


def read_json(path) -> dict:
    """A JSON object from ``path``; a ValueError naming the file if it is unreadable, truncated or not an object."""
    path = Path(path)
    try:
        obj = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); truncated?") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_jsonl(path) -> list[dict]:
    """One JSON object per line of ``path``. A last line that does not parse (a writer killed mid-line) is dropped
    with a warning naming the file; a bad line elsewhere is a ValueError naming the file and the line."""
    path = Path(path)
    lines = read_text(path).splitlines()
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    records = []
    for k, (lineno, line) in enumerate(numbered):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if k == len(numbered) - 1:
                warnings.warn(f"{path}: dropped a half-written last line (line {lineno}: {exc.msg})", stacklevel=2)
                break
            raise ValueError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: line {lineno}: expected a JSON object, got {type(rec).__name__}")
        records.append(rec)
    return records


def safe_name(text) -> str:
    """``text`` as a file-name part: letters, digits and ``._-=`` kept, anything else ``_``."""
    return "".join(c if c.isalnum() or c in "._-=" else "_" for c in str(text))


def writable_folder(path, name: str) -> Path:
    """Create the folder ``path`` (the setting ``name``) if needed and check that it can be written; a ValueError
    naming ``name`` otherwise (a file in the way, no permission)."""
    path = Path(path)
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "" if blocker == path else f" (on the way to {path})"
        raise ValueError(f"{name}: {blocker} is a file; expected a folder{where}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{name}: cannot create the folder {path} ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: the folder {path} is not writable")
    return path


#: The lock file each kind of output folder's writer takes in it, and what it marks the folder as. The lock stays
#: after its writer ends, so it names the kind of the folder: one kind a folder (a sweep's report would lose a
#: training run's metrics written into the sweep's folder, and the other way round).
FOLDER_KINDS = {"sweep.lock": "a simulator sweep", "train.lock": "a training run", "report.lock": "a report",
                "bench.lock": "throughput benchmarks"}


def folder_kind(folder) -> str | None:
    """The lock name (a key of FOLDER_KINDS) of the kind of output ``folder`` holds, or None."""
    return next((name for name in FOLDER_KINDS if os.path.lexists(Path(folder) / name)), None)


def _refuse_other_kind(path: Path, arg: str) -> None:
    other = next((name for name in FOLDER_KINDS if name != path.name and os.path.lexists(path.parent / name)), None)
    if other is not None:
        raise ValueError(f"{arg}: {path.parent} already holds {FOLDER_KINDS[other]} ({other}); one kind of output a "
                         f"folder: use another {arg}")


def open_lock(path, arg: str, what: str) -> int:
    """``path`` opened as a lock file (created if missing, never through a symbolic link): its descriptor. Taking the
    lock rewrites the file, so a link, a hard link to another name or anything but a regular file (a FIFO, a folder)
    is a ValueError naming ``arg`` and ``what`` the lock is. A lock of FOLDER_KINDS in a folder that holds another
    kind is a ValueError naming the folder and that kind; looked for again once the lock file exists, so that of two
    writers of different kinds starting together one at least is refused."""
    path = Path(path)
    if path.name in FOLDER_KINDS:
        _refuse_other_kind(path, arg)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ValueError(f"{arg}: cannot use {path} as {what} ({why}); remove it") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise ValueError(f"{arg}: cannot use {path} as {what} (it is not a regular file of its own); remove it")
    if path.name in FOLDER_KINDS:
        try:
            _refuse_other_kind(path, arg)
        except ValueError:
            os.close(fd)
            raise
    return fd


def take_lock(fd: int) -> str | None:
    """An exclusive ``flock`` on the lock file ``fd`` without waiting: None once taken (this process's pid is then
    the file's text), else the pid text of the process that holds it. The kernel drops the lock when the last
    process holding the descriptor ends, so a killed owner leaves no stale lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return None


def remove_folder(path, arg: str) -> None:
    """Delete the folder ``path`` (inside the output folder given as ``arg``) and what it holds. A symbolic link
    there is refused, naming it and where it points, and nothing is deleted: the link may lead outside ``arg``."""
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{arg}: {path} is a symbolic link to {os.readlink(path)}; expected a folder of its own "
                         "(nothing was deleted): remove the link")
    shutil.rmtree(path)
