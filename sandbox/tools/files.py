"""File tools, run host-side, confined to the workspace by the kernel.

Every path is opened with ``openat2(workspace_fd, path, RESOLVE_BENEATH |
RESOLVE_NO_MAGICLINKS)``: ``..``, absolute paths, symlinks that leave the
workspace and ``/proc/self/root``-style magic links are refused by the kernel
itself, whatever the string looks like, and whatever a sandboxed process has
since turned into a symlink (no check-then-use race). A naive
``open(os.path.join(workspace, path))`` allows all of them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

from sandbox.errors import Escape

SYS_OPENAT2 = 437  # x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
_libc = ctypes.CDLL(None, use_errno=True)


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    how = OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EXDEV or err == errno.ELOOP:
            raise Escape(f"{path!r} leaves the workspace")
        raise OSError(err, os.strerror(err), path)
    return int(fd)


class Workspace:
    """A directory that file tools may touch, and nothing outside it."""

    def __init__(self, root: Path, uid: int, gid: int) -> None:
        self.root, self.uid, self.gid = root, uid, gid

    def _dirfd(self) -> int:
        return os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def read(self, path: str, limit: int) -> tuple[bytes, bool]:
        d = self._dirfd()
        try:
            fd = openat2(d, path, os.O_RDONLY | os.O_NOFOLLOW)
        finally:
            os.close(d)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
            data = f.read(limit + 1)
        return data[:limit], len(data) > limit

    def write(self, path: str, data: bytes, append: bool = False) -> int:
        d = self._dirfd()
        try:
            flags = (
                os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
            )
            fd = openat2(d, path, flags, 0o644)
        finally:
            os.close(d)
        with os.fdopen(fd, "wb") as f:
            os.fchown(f.fileno(), self.uid, self.gid)  # the sandboxed code may edit it too
            return f.write(data)

    def list(self, path: str) -> list[dict[str, object]]:
        d = self._dirfd()
        try:
            fd = openat2(d, path or ".", os.O_RDONLY | os.O_DIRECTORY)
        finally:
            os.close(d)
        try:
            out = []
            for name in sorted(os.listdir(fd)):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                kind = (
                    "dir"
                    if stat.S_ISDIR(st.st_mode)
                    else "link"
                    if stat.S_ISLNK(st.st_mode)
                    else "file"
                )
                out.append({"name": name, "type": kind, "size": st.st_size})
            return out
        finally:
            os.close(fd)
