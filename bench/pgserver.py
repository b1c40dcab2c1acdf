"""A throwaway PostgreSQL server: its own data directory and free port, stopped and
deleted after. Used by the benchmarks and, through ``tests/support/postgres.py``, by the
tests.

Uses the server binaries that ``scripts/install.sh`` installs (Debian's ``postgresql``
package). PostgreSQL refuses to run as root, so as root the cluster is created and started
as the ``postgres`` system user. With a ``core`` the server is started pinned to it (its
backends inherit the postmaster's affinity), the way a benchmark pins the gateway.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.procs import pinned
from bench.proxies import free_port


def _bindir() -> Path | None:
    for pattern in ("/usr/lib/postgresql/*/bin",):
        found = sorted(glob.glob(pattern), key=lambda p: int(Path(p).parent.name), reverse=True)
        for d in found:
            if (Path(d) / "initdb").exists():
                return Path(d)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


class Cluster:
    """A running server: its URL, its postmaster's pid, and ``stop()`` / ``start()`` for
    outage tests."""

    def __init__(
        self,
        bindir: Path,
        data: Path,
        log: Path,
        opts: str,
        user: str | None,
        url: str,
        core: int | None = None,
    ):
        self.bindir, self.data, self.log, self.opts, self.user, self.url, self.core = (
            bindir, data, log, opts, user, url, core)  # fmt: skip

    def _ctl(self, *args: str, check: bool = True, core: int | None = None) -> None:
        cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.data), *args]
        subprocess.run(pinned(_as_user(cmd, self.user), core), check=check, capture_output=True)

    def start(self) -> None:
        self._ctl("-o", self.opts, "-l", str(self.log), "-w", "start", core=self.core)
        _wait(self.url)

    @property
    def pid(self) -> int:
        """The postmaster's: every backend is its child (``bench.procs.tree_cpu_seconds``)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends every session (clients see 'terminating connection'); ``immediate``
        is a crash."""
        self._ctl("-m", mode, "-w", "stop", check=False)


@contextlib.contextmanager
def postgres_cluster(core: int | None = None) -> Iterator[Cluster]:
    """A fresh server with an empty database, pinned to ``core`` if given; stopped and
    deleted after."""
    bindir = _bindir()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL server binaries (initdb) not found; ./scripts/install.sh installs them "
            "(apt-get install postgresql)"
        )
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="gearshift-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if user:
        pw = pwd.getpwnam(user)
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    port = free_port()
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=50"
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    cluster = Cluster(bindir, data, root / "log", opts, user, url, core)
    try:
        cmd = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8"]  # fmt: skip
        subprocess.run(_as_user(cmd, user), check=True, capture_output=True)
        cluster.start()
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a SQLAlchemy URL to an empty database on a fresh server."""
    with postgres_cluster() as cluster:
        yield cluster.url


def _wait(url: str, timeout: float = 30.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
