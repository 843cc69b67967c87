"""THE atomic write: a file is either its old self or wholly new, never half written.

``atomic_write(path, write)`` calls ``write(file)`` on a temporary file in the same folder
(``.NAME.<random>.tmp``, from ``tempfile.mkstemp``, so concurrent writers of one file never share
a temporary), fsyncs it, moves it into place with ``os.replace`` and fsyncs the folder, so the
rename itself survives a crash. If ``write`` (or anything before the move) raises, the temporary
is deleted and the exception propagates: ``path`` keeps its earlier content. A writer killed
outright leaves at most a ``.NAME.*.tmp`` file, never read as ``NAME``;
``remove_stale_temporaries`` deletes the ones clearly abandoned.

``exclusive=True`` creates ``path`` only if it does not exist (a hard link of the fully written
temporary, which fails with ``FileExistsError`` when ``path`` exists): a claim file is never seen
half written, and two processes never both create it.

A written file gets the permissions ``open()`` would give it (0666 less the umask), not
mkstemp's 0600: results and caches in a shared folder stay readable to whom the umask allows.

A failed write is an ``OSError`` naming ``path`` (not the temporary), even when the writer hid
it: ``torch.save`` catches its file's ``OSError`` (a full disk: ENOSPC) and raises
``RuntimeError: [enforce fail at inline_container.cc] unexpected pos ...`` instead, which says
neither why nor where; the file ``write`` gets remembers the ``OSError`` and it is raised.

Standard library only (the ground floor: imports nothing of pflbench).
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

TEMPORARY_SUFFIX = ".tmp"


def temporary_prefix(path: Path) -> str:
    """The name every temporary of ``path`` starts with (``.NAME.``)."""
    return f".{path.name}."


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object], *, exclusive: bool = False) -> None:
    """Call ``write(file)`` on a temporary file next to ``path`` (opened ``"wb"``), fsync it and
    move it into place (``exclusive``: create ``path``, ``FileExistsError`` if it exists)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=TEMPORARY_SUFFIX)
    except OSError as error:
        raise _naming(error, path) from error
    try:
        os.fchmod(handle, 0o666 & ~current_umask())  # as open() would: mkstemp's 0600 hides results from a group
        with os.fdopen(handle, "wb") as raw:
            file = _RememberedErrors(raw)
            try:
                write(file)  # type: ignore[arg-type]  # a file in all but name
            except Exception as error:
                if file.error is None or isinstance(error, OSError):
                    raise
                raise file.error from error  # the writer hid why its write failed (torch.save)
            raw.flush()
            os.fsync(raw.fileno())
        if exclusive:
            os.link(temporary, path)  # atomic; fails if path exists
            Path(temporary).unlink()
        else:
            os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, FileExistsError):
            raise _naming(error, path) from error
        raise
    fsync_folder(path.parent)


class _RememberedErrors:
    """The file a writer writes to, remembering the ``OSError`` of a failed write (a full disk)
    for when the writer catches it and raises an error of its own that does not say why."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._file.write(data)
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str) -> Any:  # flush, fileno, tell, ...: the file's own
        return getattr(self._file, name)


def _naming(error: OSError, path: Path) -> OSError:
    """``error`` naming ``path`` (the file being written), not a temporary or nothing."""
    if error.errno is None:
        return error
    return type(error)(error.errno, error.strerror or os.strerror(error.errno), str(path))


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes, *, exclusive: bool = False) -> None:
    """Atomically write ``data`` to ``path``."""
    atomic_write(path, lambda file: file.write(data), exclusive=exclusive)


def atomic_write_text(path: str | Path, text: str, *, exclusive: bool = False) -> None:
    """Atomically write ``text`` (UTF-8) to ``path``."""
    atomic_write_bytes(path, text.encode(), exclusive=exclusive)


def atomic_write_json(path: str | Path, data: Any, *, default: Callable[[Any], Any] | None = None) -> None:
    """Atomically write ``data`` as indented JSON (2 spaces, keys in their order) and a newline."""
    atomic_write_text(path, json.dumps(data, indent=2, default=default) + "\n")


def fsync_folder(folder: str | Path) -> None:
    """Make the renames in ``folder`` durable; not every platform lets a folder be opened."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def remove_stale_temporaries(path: str | Path, older_than_s: float = 3600.0) -> None:
    """Delete temporary files of ``path`` left by writers killed over ``older_than_s`` ago
    (younger ones may belong to a writer still at work)."""
    path = Path(path)
    now = time.time()
    pattern = glob.escape(temporary_prefix(path)) + "*" + TEMPORARY_SUFFIX
    for temporary in path.parent.glob(pattern):
        try:
            if now - temporary.stat().st_mtime > older_than_s:
                temporary.unlink()
        except OSError:
            pass
