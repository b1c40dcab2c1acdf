"""Session workspaces: one size- and inode-limited tmpfs per session, with a per-tenant total.

A session's workspace is a tmpfs the service mounts at ``<root>/<scoped id>`` when the
session is created (owned by the sandbox uid, mode 0700, ``nosuid,nodev``). Runtimes bind
it at ``/workspace``, file tools open paths beneath it, and it lives until the session is
removed (``DELETE``, idle for ``session_ttl_s``, service shutdown): files one call writes
are there for the next. Why tmpfs and not an image file or project quotas, with the
measurements: docs/decisions/sandbox-workspace-quotas.md.

Both limits are the kernel's, so exceeding one is the writer's ENOSPC, never the host's:

- per workspace: the tmpfs's ``size`` and ``nr_inodes``;
- per tenant: before each call, ``share`` remounts the workspace with what it holds plus
  what the tenant's other workspaces leave of the tenant's total (never more than its own
  quota). Calls of one tenant running at the same time in different sessions each see that
  same headroom, so the total can be passed by at most the headroom per concurrent call.
  A workspace changes only during a call in it (what a call starts is killed before it
  answers), so the other workspaces' usage is measured once after each of their calls
  (``changed``), not on every call of every session: a call costs one ``statvfs`` of its
  own workspace plus one per other workspace that was used since, however many the tenant
  has.

The data lives in memory: tmpfs pages count against the memory cgroup of the process that
wrote them (a run's, or a warm session's runner) and are freed when the workspace goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gearshift.sandbox")

MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x2, 0x4, 0x20
MNT_DETACH = 0x2
PAGE = os.sysconf("SC_PAGE_SIZE")
WORKSPACE_NAME = re.compile(r"^[0-9a-f]{32}$")  # protocol.scoped_id: only these are swept
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True)
class Quota:
    bytes: int
    inodes: int


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int
    inodes: int
    free_bytes: int
    free_inodes: int


def _check(rc: int, what: str, path: Path) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", str(path))


def mount(path: Path, quota: Quota, uid: int, gid: int) -> None:
    """Mount a fresh tmpfs limited to ``quota`` at ``path``, owned by ``uid:gid``."""
    data = f"size={quota.bytes},nr_inodes={quota.inodes},mode=0700,uid={uid},gid={gid}"
    rc = _libc.mount(b"tmpfs", bytes(path), b"tmpfs", MS_NOSUID | MS_NODEV, data.encode())
    _check(rc, "mount tmpfs", path)


def resize(path: Path, quota: Quota) -> None:
    """Change the limits of the tmpfs at ``path`` (EINVAL when below what it holds).
    Zero would mean *no limit* to tmpfs: the least is one page and one inode."""
    quota = Quota(max(PAGE, quota.bytes), max(1, quota.inodes))
    data = f"size={quota.bytes},nr_inodes={quota.inodes}".encode()
    rc = _libc.mount(b"tmpfs", bytes(path), b"tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, data)
    _check(rc, "remount tmpfs", path)


def usage(path: Path) -> Usage:
    st = os.statvfs(path)
    return Usage(
        (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree,
        st.f_bavail * st.f_frsize, st.f_favail,
    )  # fmt: skip


def destroy(path: Path) -> None:
    """Unmount the workspace (detached: a run still inside keeps it until it ends) and
    remove its mount point."""
    if _libc.umount2(bytes(path), MNT_DETACH) != 0 and ctypes.get_errno() not in (
        errno.EINVAL,  # not a mount point (a crash between mkdir and mount)
        errno.ENOENT,
    ):
        _check(-1, "umount", path)
    shutil.rmtree(path, ignore_errors=True)


def sweep(root: Path) -> int:
    """Remove the workspaces a previous service left under ``root`` (only entries named
    like a workspace: ``root`` may hold other things)."""
    if not root.is_dir():
        return 0
    stale = [p for p in root.iterdir() if WORKSPACE_NAME.match(p.name) and p.is_dir()]
    for path in stale:
        destroy(path)
    return len(stale)


class Workspaces:
    """Creates, limits and removes the workspaces under ``root``."""

    def __init__(self, root: Path, uid: int, gid: int, each: Quota, tenant: Quota) -> None:
        self.root, self.uid, self.gid = root, uid, gid
        self.each, self.tenant = each, tenant
        self._applied: dict[Path, Quota] = {}  # the limits each tmpfs has now
        self._used: dict[Path, Usage] = {}  # measured since the last call in it ended

    def create(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=False, mode=0o700)
        try:
            mount(path, self.each, self.uid, self.gid)
        except OSError:
            path.rmdir()
            raise
        self._applied[path] = self.each
        return path

    def remove(self, path: Path) -> None:
        self._applied.pop(path, None)
        self._used.pop(path, None)
        destroy(path)

    def changed(self, path: Path) -> None:
        """A call in ``path`` ended: measure it again when another workspace needs it."""
        self._used.pop(path, None)

    def _usage(self, path: Path) -> Usage:
        u = self._used.get(path)
        if u is None:
            u = self._used[path] = usage(path)
        return u

    def share(self, path: Path, others: list[Path]) -> None:
        """Limit ``path`` to what it holds plus the tenant's headroom (``others``: the
        tenant's other workspaces, as measured since a call in them last ended), at most
        its own quota."""
        for _ in range(2):  # a write between statvfs and remount: measure again, once
            mine = usage(path)
            held = [self._usage(p) for p in others if p in self._applied]
            room_b = self.tenant.bytes - mine.bytes - sum(u.bytes for u in held)
            room_i = self.tenant.inodes - mine.inodes - sum(u.inodes for u in held)
            want = Quota(
                min(self.each.bytes, mine.bytes + max(0, room_b)),
                min(self.each.inodes, mine.inodes + max(0, room_i)),
            )
            if self._applied.get(path) == want:
                return
            try:
                resize(path, want)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                continue
            self._applied[path] = want
            return
        log.warning("workspace %s: could not apply the tenant's quota; limits unchanged", path)

    def exhausted(self, path: Path) -> str | None:
        """``"disk"`` or ``"inodes"`` when the workspace has no room left, else None."""
        with contextlib.suppress(OSError):
            u = usage(path)
            if u.free_inodes <= 0:
                return "inodes"
            if u.free_bytes <= 0:
                return "disk"
        return None
