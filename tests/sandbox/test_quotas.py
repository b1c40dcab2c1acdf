"""Workspace quotas (bytes and inodes, per workspace and per tenant) and workspace garbage
collection, on real tmpfs mounts, through the sandbox's core in every runtime."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandbox.config import SandboxConfig, WorkspaceQuota
from sandbox.core import Sandbox
from sandbox.protocol import SessionCreate
from sandbox.workspace import Quota, Workspaces, sweep, usage
from tests.sandbox.conftest import WHO, Harness

MIB = 1 << 20
SMALL = WorkspaceQuota(mb=4, inodes=200, tenant_mb=6, tenant_inodes=300)


@pytest.fixture
def config(config: SandboxConfig) -> SandboxConfig:
    """The shared sandbox config with small quotas (the ``sbx`` fixture builds on it)."""
    return config.model_copy(update={"workspace": SMALL})


def mounted(path: Path) -> bool:
    return any(
        line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines()
    )


def test_a_workspace_is_a_limited_tmpfs_owned_by_the_sandbox_user(sandbox_root: Path):
    ws = Workspaces(sandbox_root, 65534, 65534, Quota(4 * MIB, 100), Quota(6 * MIB, 150))
    path = ws.create("0" * 32)
    try:
        st, fs = path.stat(), os.statvfs(path)
        assert mounted(path) and (st.st_uid, st.st_mode & 0o777) == (65534, 0o700)
        assert fs.f_blocks * fs.f_frsize == 4 * MIB and fs.f_files == 100
    finally:
        ws.remove(path)
    assert not mounted(path) and not path.exists()


def test_the_tenant_total_shrinks_a_workspace_to_the_headroom(sandbox_root: Path):
    ws = Workspaces(sandbox_root, 0, 0, Quota(4 * MIB, 100), Quota(6 * MIB, 150))
    a, b = ws.create("a" * 32), ws.create("b" * 32)
    try:
        (a / "big").write_bytes(b"x" * (3 * MIB))
        for i in range(60):
            (a / f"f{i}").touch()
        ws.share(b, [a])
        room = usage(b)
        assert 2 * MIB <= room.free_bytes <= 3 * MIB  # 6 MiB total, 3 MiB (+ pages) in a
        assert room.free_inodes <= 150 - 60
        with pytest.raises(OSError, match="No space left"):
            (b / "too-big").write_bytes(b"y" * (3 * MIB + 4096))
        (a / "big").unlink()  # as a call in a would
        ws.changed(a)  # ... which the service reports as it ends
        (b / "too-big").unlink()  # what fitted of it
        ws.share(b, [a])
        assert usage(b).free_bytes == 4 * MIB  # room again, up to b's own quota
    finally:
        ws.remove(a)
        ws.remove(b)


def test_sharing_measures_only_the_workspaces_used_since(
    sandbox_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """A call's cost does not grow with the tenant's idle sessions: each other workspace
    is measured once, then again only after a call in it ended."""
    ws = Workspaces(sandbox_root, 0, 0, Quota(MIB, 50), Quota(8 * MIB, 400))
    paths = [ws.create(f"{i:032x}") for i in range(20)]
    measured: list[Path] = []
    real = usage

    def counted(path: Path) -> object:
        measured.append(path)
        return real(path)

    monkeypatch.setattr("sandbox.workspace.usage", counted)
    try:
        mine, others = paths[0], paths[1:]
        ws.share(mine, others)
        assert len(measured) == 20  # every workspace once
        measured.clear()
        ws.share(mine, others)
        assert measured == [mine]
        measured.clear()
        ws.changed(others[3])
        ws.share(mine, others)
        assert measured == [mine, others[3]]
    finally:
        for p in paths:
            ws.remove(p)


def test_sweep_removes_only_what_looks_like_a_workspace(sandbox_root: Path):
    ws = Workspaces(sandbox_root, 0, 0, Quota(MIB, 50), Quota(MIB, 50))
    stale = ws.create("c" * 32)
    (stale / "left").write_text("by a crashed service")
    keep = sandbox_root / "not-a-workspace"
    keep.mkdir()
    assert sweep(sandbox_root) == 1
    assert not mounted(stale) and not stale.exists() and keep.is_dir()


async def test_too_many_files_is_an_inode_limit_not_a_host_problem(sbx: Harness):
    r = await sbx.sh("i=0; while [ $i -lt 1000 ]; do : > f$i || exit 1; i=$((i+1)); done")
    assert r.allowed and r.exit_status != 0 and r.limit == "inodes", r
    count = await sbx.sh("ls | wc -l")
    assert 150 <= int(count.stdout) <= 200
    again = await sbx.sh("rm f1* && echo recovered > note && cat note")
    assert again.exit_status == 0 and again.stdout == "recovered\n"


async def test_too_many_bytes_is_a_disk_limit(sbx: Harness):
    # 512 KiB files stay under the grant's 1 MiB file size limit: the workspace fills first.
    r = await sbx.py(
        "for i in range(16):\n    open(f'part{i}', 'wb').write(b'x' * (512 << 10))\nprint('all')"
    )
    assert r.exit_status != 0 and "all" not in r.stdout and r.limit == "disk", r
    assert "No space left" in r.stderr
    held = await sbx.sh("du -sk . | cut -f1")
    assert int(held.stdout) <= 4 * 1024 + 64


async def test_write_file_past_the_quota_is_a_clean_tool_error(sbx: Harness):
    for i in range(4):
        await sbx("write_file", path=f"w{i}", content="z" * (900 << 10))
    r = await sbx("write_file", path="w4", content="z" * (900 << 10))
    assert r.allowed and r.exit_status == 1 and r.limit == "disk"
    assert "No space left" in r.stderr


async def test_a_tenants_sessions_share_its_total(sbx: Harness):
    other = Harness(sbx.sandbox, sbx.kind)
    fill = "open('f', 'wb').write(b'x' * (900 << 10))\nopen('g', 'wb').write(b'x' * (900 << 10))"
    fill += "\nopen('h', 'wb').write(b'x' * (900 << 10))\nprint('ok')"
    first = await sbx.py(fill)  # 2.7 MiB of the tenant's 6
    assert first.stdout.strip() == "ok", first
    second = await other.py(fill)
    assert second.stdout.strip() == "ok", second  # 5.4 MiB
    third = await other.py("open('i', 'wb').write(b'x' * (900 << 10))\nprint('ok')")
    assert third.limit == "disk" and "ok" not in third.stdout
    total = sum(usage(s.workspace.root).bytes for s in sbx.sandbox.sessions.values())
    assert total <= 6 * MIB


async def test_idle_sessions_are_collected_with_their_workspaces(config: SandboxConfig):
    sandbox = Sandbox(config.model_copy(update={"session_ttl_s": 0.05}))
    idle = sandbox.create(SessionCreate(principal=WHO))
    busy = sandbox.create(SessionCreate(principal=WHO))
    busy.busy = 1  # a call in flight
    paths = [idle.workspace.root, busy.workspace.root]
    assert all(mounted(p) for p in paths)
    time.sleep(0.1)
    assert await sandbox.expire() == 1
    assert not mounted(paths[0]) and not paths[0].exists()
    assert list(sandbox.sessions) == [busy.id] and mounted(paths[1])
    busy.busy = 0
    await sandbox.remove(busy.id)
    assert not mounted(paths[1])


def test_a_new_service_removes_the_workspaces_an_old_one_left(config: SandboxConfig):
    old = Sandbox(config)
    left = old.create(SessionCreate(principal=WHO)).workspace.root
    old.lock.release()  # the old service died without removing its sessions (its lock too)
    new = Sandbox(config)
    assert not mounted(left) and not left.exists()
    new.lock.release()
