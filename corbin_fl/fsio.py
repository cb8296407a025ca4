"""The one durable atomic file write of the project.

A reader sees the old file or the complete new one, never a torn write, and a completed write
survives a power loss: the bytes go to a temporary file in the destination's folder, which is
flushed and ``fsync``-ed, renamed over the destination with ``os.replace`` (atomic on POSIX), and
the folder is ``fsync``-ed so that the rename itself is durable. On any error the temporary file is
removed and the destination is untouched. The server's checkpoints and metrics, the experiment
runs and reports, and the caches under :func:`cache_root` all write through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "CACHE_ENV",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "cache_root",
    "fsync_dir",
]

CACHE_ENV = "CORBIN_FL_CACHE"
"""Environment variable naming the root of this project's caches (:func:`cache_root`)."""


def cache_root() -> Path:
    """``$CORBIN_FL_CACHE``, else ``$XDG_CACHE_HOME/corbin-fl``, else ``~/.cache/corbin-fl``.

    Holds what can be recomputed: solved I-MVU tables (``imvu/``), clients' partitions
    (``partitions/``).
    """
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "corbin-fl",
    )
    return Path(root)


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _file_mode()
"""Mode of a new file under the process umask (``mkstemp`` alone would create it ``0600``)."""


def fsync_dir(path: str | Path) -> None:
    """``fsync`` the folder ``path`` so that a rename inside it survives a power loss.

    A no-op where folders cannot be opened (Windows).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes | bytearray | memoryview) -> None:
    """Replace ``path`` by ``data`` atomically and durably (module docstring).

    The destination's folder is created if missing.

    Raises
    ------
    TypeError
        If ``data`` is not bytes-like.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(
    path: str | Path, obj: Any, *, sort_keys: bool = True, allow_nan: bool = True
) -> None:
    """``obj`` as indented JSON plus a newline, atomically (``allow_nan=False`` refuses NaN and
    infinity, which strict JSON readers reject)."""
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, allow_nan=allow_nan)
    atomic_write_text(path, text + "\n")
