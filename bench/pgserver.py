"""A throwaway PostgreSQL server for a benchmark run: a fresh data directory on a free
port, the server binaries of Debian's ``postgresql`` package (``scripts/install.sh``),
stopped and deleted when the run ends. As root (PostgreSQL will not run as root) the
cluster belongs to the ``postgres`` system user."""

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

from bench.proxies import free_port


def server_binaries() -> Path | None:
    """The newest installed server's bin directory (with ``initdb``), or None."""
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3])
    )
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Yields the URL of an empty database on a server started for this block.
    RuntimeError when no server binaries are installed."""
    bindir = server_binaries()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries (apt-get install postgresql)")
    user = "postgres" if os.geteuid() == 0 else None

    def run(*argv: str) -> None:
        cmd = [str(bindir / argv[0]), *argv[1:]]
        subprocess.run(["runuser", "-u", user, "--", *cmd] if user else cmd,
                       check=True, capture_output=True)  # fmt: skip

    root = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if user:
        owner = pwd.getpwnam(user)
        for path in (root, sock):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        run("initdb", "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        options = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=50"
        run("pg_ctl", "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start")
        _wait_for(url)
        yield url
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(url: str, timeout_s: float = 30.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
