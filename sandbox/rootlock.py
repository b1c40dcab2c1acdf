"""One service per sandbox root: an exclusive ``flock`` on ``<root>/.lock``, held for the
service's lifetime.

A service starting on a root first removes the workspaces a previous one left there
(``workspace.sweep``); a second service on the same root would remove the live
workspaces of the first (and the first would later remove the second's). So the lock is
taken before anything under the root is touched, and a service that cannot take it
refuses to start, naming the root and the pid that holds it.

``flock`` belongs to the open file, not the process: a second lock taken in the same
process (a second ``Sandbox`` on the root) is refused too, and the kernel drops the lock
when its holder exits, however it exits: a killed service leaves no stale lock behind.
The pid in the file is only for the message; the lock itself is the kernel's.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
from pathlib import Path

from sandbox.errors import RuntimeUnavailable

LOCK_NAME = ".lock"  # not a workspace name: sweep never touches it


class RootLock:
    """The exclusive lock on ``root`` (created, mode 0711, when missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o711)
        path = root / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RuntimeUnavailable(
                f"sandbox root {root} is in use by another sandbox service (pid {holder}); "
                "two services on one root would remove each other's workspaces: stop it, "
                "or give this one another sandbox.root"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # A file object: the lock goes with it when the holder is collected unclosed.
        self._file: io.FileIO | None = io.FileIO(fd, "r")

    def release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()
