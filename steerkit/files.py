"""File helpers: the cache directory, memoised SHA-256 of large files, and atomic writes.

* :func:`cache_dir`: ``$STEERKIT_CACHE``, else ``$XDG_CACHE_HOME/steerkit`` (``~/.cache/steerkit``).
* :func:`sha256_file`: a file's SHA-256, memoised under ``cache_dir()/hashes`` so multi-GB weights are hashed
  once; the memo key (:func:`_memo_key`) changes with any in-place edit.
* :func:`atomic_write_text`: a temporary file in the same directory, fsynced, then renamed over the target,
  so readers never see a half-written file.
* :func:`file_name`: a file name made from names a user chose (a scorer's reward path, a prompt set), within the
  file system's 255 bytes a name.
* :func:`_assemble_atomically`: a chunked packaged file (the Gemma 3 GGUF wheels) reassembled the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from .errors import ModelIntegrityError


def cache_dir() -> Path:
    """The steerkit cache directory (``$STEERKIT_CACHE``, else ``$XDG_CACHE_HOME/steerkit``)."""
    if os.environ.get("STEERKIT_CACHE"):
        return Path(os.environ["STEERKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "steerkit"


_EDGE = 1 << 20  # bytes at each end of a file hashed into the memo key


def _memo_key(path: Path, stat: os.stat_result) -> str:
    """What a file's SHA-256 memo is keyed on: things an in-place edit cannot keep.

    Besides path, size and mtime (which ``os.utime`` can restore), the key holds the inode, the device and
    the status-change time ``st_ctime_ns`` (set by the kernel on every write and on every ``utime``; no
    user call sets it back), plus a hash of the file's first and last MiB.
    """
    edges = hashlib.sha256()
    with path.open("rb") as fh:
        edges.update(fh.read(_EDGE))
        if stat.st_size > _EDGE:
            fh.seek(max(_EDGE, stat.st_size - _EDGE))
            edges.update(fh.read(_EDGE))
    fields = (path, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev, edges.hexdigest())
    return hashlib.sha256("|".join(map(str, fields)).encode()).hexdigest()[:32]


def file_identity(path: Path) -> str:
    """What a file is now, by :func:`_memo_key` (path, size, mtime, ctime, inode, first and last MiB): it changes
    whenever the file is written or replaced, without reading the whole file."""
    path = Path(path).resolve()
    return _memo_key(path, path.stat())


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, memoised in the cache so large files are hashed once.

    The memo is keyed by :func:`_memo_key` (path, size, mtime, ctime, inode, first and last MiB): editing the
    file in place, even restoring its size and mtime afterwards, changes the key and the file is hashed again.
    """
    path = Path(path).resolve()
    stat = path.stat()
    memo = cache_dir() / "hashes" / _memo_key(path, stat)
    with contextlib.suppress(OSError):
        value = memo.read_text().strip()
        if len(value) == 64:
            return value
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    after = path.stat()
    if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns):
        with contextlib.suppress(OSError):  # not memoised when the file changed while it was being read
            atomic_write_text(memo, value)
    return value


@contextlib.contextmanager
def atomic_path(target: Path):
    """A temporary path next to ``target`` (its directory made if missing) for a writer that takes a file name;
    renamed onto ``target`` when the block ends without an error, removed otherwise: readers see the whole file
    or none, and a concurrent writer's complete file wins."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file atomically (temporary file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


#: The longest file name :func:`file_name` returns, in UTF-8 bytes, before its suffix (file systems allow 255).
FILE_NAME_BYTES = 200


def file_name(stem: str, suffix: str = "") -> str:
    """``stem + suffix`` with ``/``, ``\\`` and ``:`` made ``_``; a stem over :data:`FILE_NAME_BYTES` bytes keeps its
    start and ends in 16 hex digits of its SHA-256, so that two long names stay apart and the name stays valid."""
    for char in "/\\:":
        stem = stem.replace(char, "_")
    if len(stem.encode()) > FILE_NAME_BYTES:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:16]
        keep = stem.encode()[:FILE_NAME_BYTES - len(digest) - 1].decode(errors="ignore")
        stem = f"{keep}-{digest}"
    return stem + suffix


def _assemble_atomically(module, target: Path) -> None:
    """``module.assemble`` (a chunked-GGUF wheel's reassembler, which checks the published SHA-256) into a
    temporary file next to ``target``, renamed into place only when complete and verified."""
    try:
        with atomic_path(target) as tmp:
            module.assemble(str(tmp), overwrite=True)  # verifies the published SHA-256
    except ValueError as exc:
        raise ModelIntegrityError(f"Reassembled {target.name} failed its SHA-256 check: {exc}") from None
