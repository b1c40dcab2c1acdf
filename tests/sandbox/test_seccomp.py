"""The deny-by-default seccomp profile: what it allows, what it refuses, and the tools'
normal workloads under it in every runtime (bubblewrap warm and cold, gVisor)."""

from __future__ import annotations

import errno

import pyseccomp
import pytest

from sandbox.runtime import seccomp
from tests.sandbox.conftest import Harness

# What an escape reaches for (issue #28): each must fail with EPERM in every runtime.
ESCAPES = (
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "unshare", "setns", "ptrace",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig",
)  # fmt: skip
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17


def test_nothing_an_escape_needs_is_allowed():
    allowed = set(seccomp.ALLOWED) | {r.name for r in seccomp.CONDITIONAL}
    assert set(ESCAPES) <= set(seccomp.DENIED)
    assert not allowed & set(seccomp.DENIED)
    assert "clone3" not in allowed  # its flags cannot be filtered: ENOSYS instead


def test_the_bpf_program_compiles_once_and_each_run_gets_its_own_file():
    with seccomp.filter_file() as a, seccomp.filter_file() as b:
        assert a.fileno() != b.fileno()
        program = a.read()
        assert program == b.read() and len(program) % 8 == 0 and len(program) > 8 * 100


def test_the_oci_rendering_is_the_same_profile():
    spec = seccomp.oci()
    assert spec["defaultAction"] == "SCMP_ACT_ERRNO" and spec["defaultErrnoRet"] == errno.EPERM
    plain = [r for r in spec["syscalls"] if "args" not in r]
    assert len(plain) == 1 and plain[0]["action"] == "SCMP_ACT_ALLOW"
    assert set(plain[0]["names"]) == set(seccomp.ALLOWED) | set(seccomp.ENOSYS)
    assert not set(plain[0]["names"]) & set(seccomp.DENIED)
    clone = [r for r in spec["syscalls"] if r["names"] == ["clone"]]
    assert clone == [
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 0, "value": seccomp.CLONE_NAMESPACES, "valueTwo": 0,
                   "op": "SCMP_CMP_MASKED_EQ"}]},
    ]  # fmt: skip
    sockets = sorted(r["args"][0]["value"] for r in spec["syscalls"] if r["names"] == ["socket"])
    assert sockets == [1, 2, 10, 16] and 40 not in sockets  # never AF_VSOCK


def _numbers(names: tuple[str, ...]) -> dict[str, int]:
    arch = pyseccomp.system_arch()
    found = {n: int(pyseccomp.resolve_syscall(arch, n)) for n in names}
    return {n: nr for n, nr in found.items() if nr >= 0}


async def test_escape_syscalls_fail_with_eperm(sbx: Harness):
    numbers = _numbers(ESCAPES)
    assert {"io_uring_setup", "userfaultfd", "bpf", "unshare", "mount", "ptrace"} <= set(numbers)
    clone = _numbers(("clone", "clone3"))
    # Arguments that would succeed were the call allowed (io_uring_setup(8, params) gives a
    # descriptor on this kernel; unshare(CLONE_NEWUSER) too for an unprivileged user).
    code = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
def call(nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return rc, ctypes.get_errno()
special = {{"io_uring_setup": (8, ctypes.addressof(params)), "unshare": ({CLONE_NEWUSER},),
           "ptrace": (16, 1, 0, 0), "userfaultfd": (0,)}}
for name, nr in {numbers!r}.items():
    print(name, *call(nr, *special.get(name, (0, 0, 0, 0, 0))))
for label, flags in (("clone_newuser", {CLONE_NEWUSER | SIGCHLD}), ("clone_newns", {CLONE_NEWNS | SIGCHLD})):
    rc, err = call({clone["clone"]}, flags, 0, 0, 0, 0)
    if rc == 0:
        os._exit(0)
    print(label, rc, err)
print("clone3", *call({clone["clone3"]}, 0, 0))
"""
    r = await sbx.py(code)
    got = {name: (int(rc), int(err)) for name, rc, err in map(str.split, r.stdout.splitlines())}
    assert set(got) == set(numbers) | {"clone_newuser", "clone_newns", "clone3"}, r.stderr
    refused = {name: v for name, v in got.items() if name != "clone3"}
    assert all(v == (-1, errno.EPERM) for v in refused.values()), refused
    assert got["clone3"] == (-1, errno.ENOSYS)  # so libc falls back to the filtered clone


async def test_python_workloads_run(sbx: Harness):
    code = """
import asyncio, collections, concurrent.futures, csv, dataclasses, datetime, decimal, fractions
import functools, hashlib, io, itertools, json, logging, math, os, pathlib, random, re, shutil
import socket, sqlite3, statistics, string, subprocess, sys, tarfile, tempfile, textwrap
import threading, time, typing, unittest, urllib.parse, uuid, zipfile, zlib
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    squares = sum(pool.map(lambda i: i * i, range(100)))
db = sqlite3.connect("w.db"); db.execute("create table t(x)"); db.execute("insert into t values (7)")
a, b = socket.socketpair(); a.sendall(b"ping"); got = b.recv(4)
async def main():
    p = await asyncio.create_subprocess_exec("echo", "async", stdout=asyncio.subprocess.PIPE)
    return (await p.communicate())[0].decode().strip()
sub = subprocess.run(["sh", "-c", "echo sub | tr a-z A-Z"], capture_output=True, text=True)
with tempfile.TemporaryDirectory() as d:
    pathlib.Path(d, "f").write_text("x")
    with tarfile.open("t.tar.gz", "w:gz") as t:
        t.add(d, arcname="d")
print(squares, db.execute("select x from t").fetchone()[0], got.decode(), asyncio.run(main()),
      sub.stdout.strip(), hashlib.sha256(b"").hexdigest()[:8], uuid.uuid4().version,
      os.cpu_count() is not None, len(zlib.compress(b"a" * 1000)) < 100)
"""
    r = await sbx.py(code)
    assert r.exit_status == 0, r.stderr
    expected = ["328350", "7", "ping", "async", "SUB", "e3b0c442", "4", "True", "True"]
    assert r.stdout.split() == expected


async def test_shell_workloads_run(sbx: Harness):
    script = r"""
set -e
seq 1 1000 | sort -rn | head -3 | tr '\n' ' '; echo
printf 'alpha 1\nbeta 2\ngamma 3\n' > data.txt
grep -c a data.txt
sed -n 's/^beta /B=/p' data.txt
mawk '{ s += $2 } END { print s }' data.txt
mkdir -p tree/sub && echo hi > tree/sub/f && ln -s f tree/sub/link && cp -a tree copy
tar czf tree.tgz tree && rm -r tree && tar xzf tree.tgz && cat tree/sub/link
find . -name f | sort | xargs -n1 dirname | tr '\n' ' '; echo
test -x /usr/bin/env && echo exec-ok
mkfifo pipe && (echo through-fifo > pipe &) && cat pipe
sha256sum data.txt | cut -c1-8
date +%Y > /dev/null && wc -c < data.txt && wc -l < data.txt
"""
    r = await sbx.sh(script)
    assert r.exit_status == 0, r.stderr
    assert r.stdout.splitlines() == [
        "1000 999 998 ", "3", "B=2", "6", "hi", "./copy/sub ./tree/sub ", "exec-ok",
        "through-fifo", "af41cf11", "23", "3",
    ]  # fmt: skip


async def test_unknown_socket_families_are_refused(sbx: Harness):
    r = await sbx.py(
        "import socket\ntry:\n    socket.socket(40, socket.SOCK_STREAM)\n    print('vsock')\n"
        "except OSError as e:\n    print('refused', e.errno)"
    )
    assert r.stdout.strip() == f"refused {errno.EPERM}"


@pytest.mark.parametrize("family", ["AF_UNIX", "AF_INET", "AF_INET6"])
async def test_ordinary_sockets_can_be_created(sbx: Harness, family: str):
    r = await sbx.py(f"import socket\nsocket.socket(socket.{family}).close()\nprint('ok')")
    assert r.stdout.strip() == "ok", r.stderr
