"""Atomic file writes, the one way the library replaces a file (private).

Layer: below everything; imports nothing from ``companion``.
"""

from __future__ import annotations

import os
import tempfile


def default_mode() -> int:
    """``0o666`` less the process's umask: the permissions ``open(path, "w")`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path, data, *, mode=None, fsync=True) -> None:
    """Write ``data`` (``str``, as UTF-8, or ``bytes``) to ``path`` atomically.

    The data go to a temporary file in the same folder (``.<name>.<random>.tmp``, the name cut to 32
    characters so that the temporary name is no longer than a legal file name allows), then the file
    is renamed over ``path``: a reader never sees half a file, and a failed or interrupted write
    leaves the earlier file whole and removes the temporary (a process killed outright leaves it).
    ``mode``: the file's permissions, default :func:`default_mode` (``mkstemp`` would give 0600).
    ``fsync``: flush the data to the disk before the rename. The folder must exist.

    Raises
    ------
    OSError
        As ``open`` and ``os.replace`` raise it; nothing is left behind.
    """
    folder = os.path.dirname(os.fspath(path)) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(os.fspath(path))[:32]}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, default_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
