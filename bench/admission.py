"""Admission's cost: auth from the store's keys + rate limits + budget reservation, per
request, against the same gateway with them off, in one run; then a burst against a
budget shared by two gateway processes.

One ``gearshift serve`` (pinned to core 0, recording to the store, sandbox off) in front of
bench.mock_upstream (core 1, with this client) serves two tenants at once: ``plain``, whose
key is in the config file and which has no limits (admission is one dict lookup), and
``limited``, whose key is in the store (``gearshift keys create``) and whose key and tenant
each have requests and tokens per minute and token budgets per day and month (eight
counters reserved in the ledger and settled per request; none ever refused). Short rounds
(``ROUNDS``: 24 at concurrency 1, where the target is, 8 at 16) each run the two back to
back, in alternating order, so drift in the machine's load hits both alike. For each store (SQLite, then
PostgreSQL) it reports, at concurrency 1 and 16: CPU-ms per request of the gateway and its
store, and p50 latency; added = limited minus plain, as the median of the rounds' paired
differences with the middle half of them (``_q1``, ``_q3``) and the median's 95% confidence
interval (``_lo``, ``_hi``: order statistics, no assumption about the noise's shape).

The store's work is counted alike on both stores: SQLite runs in the gateway's process,
so the gateway's process tree (its recorder and ledger threads) holds it all; the throwaway
PostgreSQL server is pinned to the gateway's core and its processes' CPU (the postmaster's
tree, backends and background writers) is added to the gateway's (``store_cpu_ms`` alone).
A ``--postgres`` server of your own is neither pinned nor counted. CPU is read at the
scheduler's resolution (``bench.procs.tree_run_seconds``: a 300-request cell in clock ticks
moves in steps of 0.03 ms), and each cell's reading ends ``TAIL_S`` after its last answer,
so the work a cell leaves behind (the ledger's flush and the return of its idle shares, the
recorder's writes) is counted in that cell and not in the next one, of the other tenant.

Then the budget burst: a second gateway on the same store, a tenant whose daily budget
admits ten requests' reservations, 50 concurrent requests split across the two processes.
``budget_overshoot`` is the tokens charged past the budget (must be 0).

    python -m bench.admission [--quick] [--postgres URL] [--ledger]

``--ledger`` measures admission alone, in this process, without a gateway or an HTTP
request: CPU-ms (this process, the ledger's thread included), wall ms and store
transactions per admit + settle of the ``limited`` tenant's request, one at a time.

Without ``--postgres`` a throwaway PostgreSQL server is started (``bench.pgserver``, on
Debian's postgresql package); without one the PostgreSQL figures are skipped. The
last line printed is one JSON object: ``added_cpu_ms_per_req`` and ``added_p50_ms`` are the
worst over the stores at concurrency 1 (no batching to share a transaction).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.loadgen import body as request_body
from bench.loadgen import run as loadgen
from bench.pgserver import postgres_cluster
from bench.procs import pinned, start, stop, tree_run_seconds, wait_http
from bench.proxies import CLIENT_CORE, GEARSHIFT_CORE, free_port
from gateway.access import windows
from gateway.access.ledger import FLUSH_S
from gateway.access.shares import IDLE_S
from gateway.auth import new_key
from gateway.store import keys as store_keys
from gateway.store.database import make_engine, prepare_schema

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 16)
# per concurrency: rounds and requests per cell. The target is at c=1, so most rounds go
# there: each cell ends with a TAIL_S wait, so rounds (which narrow the median's interval)
# are bought with shorter cells; c=16's cells are longer (its p50 is a queue's)
ROUNDS = {1: (24, 150), 16: (8, 300)}
QUICK = {1: (2, 100), 16: (2, 100)}
BIG = 10**12  # limits that admit everything: the cost of checking them, not of refusing
LIMITS: dict[str, int | None] = {"requests_per_minute": 10**9, "tokens_per_minute": 10**9,
          "tokens_per_day": BIG, "tokens_per_month": BIG}  # fmt: skip
MAX_TOKENS = 32  # bench.loadgen's request
TAIL_S = IDLE_S + FLUSH_S  # the ledger has flushed and returned the idle shares by then


def setup_store(url: str) -> tuple[str, str]:
    """The ``limited`` tenant's key and limits; the ``burst`` tenant's key and budget."""
    prepare_schema(url, migrate=True)
    engine = make_engine(url)
    burst_reserves = math.ceil(len(request_body("auto", False)) / 4) + MAX_TOKENS
    with engine.begin() as conn:
        _, limited = store_keys.create(conn, "limited", "bench")
        store_keys.set_limits(conn, "limited", "", LIMITS, 80)
        store_keys.set_limits(conn, "limited", "bench", LIMITS, 80)
        _, burst = store_keys.create(conn, "burst", "bench")
        budget: dict[str, int | None] = {
            "tokens_per_day": 10 * burst_reserves + burst_reserves // 2
        }
        store_keys.set_limits(conn, "burst", "", budget, 80)
    engine.dispose()
    return limited, burst


def burst_usage(url: str) -> tuple[int, int, int]:
    """The burst tenant's day counter: used, reserved, cap."""
    engine = make_engine(url)
    with engine.begin() as conn:
        cap = store_keys.list_limits(conn, "burst")[0].tokens_per_day
        rows = store_keys.usage(conn, "burst", windows.current(time.time()))
    engine.dispose()
    day = [r for r in rows if len(r["window"]) == 10]
    return (day[0]["used"], day[0]["reserved"], cap) if day else (0, 0, cap)


@contextlib.contextmanager
def gateway(tmp: Path, name: str, store: str, mock: str, digest: str) -> Iterator[Any]:
    port = free_port()
    config = tmp / f"{name}.yaml"
    config.write_text(
        f"port: {port}\n"
        f"auth: {{mode: keys, keys: [{{name: bench, tenant: plain, sha256: '{digest}'}}]}}\n"
        f"tiers:\n  full: {{model: mock-full, replicas: ['{mock}']}}\n"
        f"  fast: {{model: mock-fast, replicas: ['{mock}']}}\n"
        f"store: {{url: '{store}', dead_letter_path: '{tmp}/{name}-dead.jsonl'}}\n"
        "sandbox: {enabled: false}\n"
    )
    log = tmp / f"{name}.log"
    # `gearshift serve`, run from this checkout (whatever the installed entry point knows)
    argv = [sys.executable, "-m", "gateway.cli.main", "--log-level", "warning", "serve",
            "--config", str(config)]  # fmt: skip
    proc = start(pinned(argv, GEARSHIFT_CORE), log, cwd=ROOT)
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", proc, log, timeout_s=600)
        yield proc, f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        stop(proc)


def cell(
    proc: Any, url: str, key: str, concurrency: int, requests: int, store_pid: int | None
) -> dict[str, float]:
    """One tenant's requests: the CPU of the gateway's tree and of the store's server (if
    counted) from the first request until ``TAIL_S`` after the last answer, and p50."""
    gateway0 = tree_run_seconds(proc.pid)
    store0 = tree_run_seconds(store_pid) if store_pid else 0.0
    result = asyncio.run(loadgen(url, "auto", False, concurrency, requests, 600, key))
    time.sleep(TAIL_S)
    gateway_cpu = tree_run_seconds(proc.pid) - gateway0
    store_cpu = tree_run_seconds(store_pid) - store0 if store_pid else 0.0
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} failed requests at {url}")
    n = result["completed"]
    return {"n": n, "cpu_ms": 1000 * (gateway_cpu + store_cpu) / n,
            "store_cpu_ms": 1000 * store_cpu / n, "p50_ms": result["p50_ms"]}  # fmt: skip


def paired(
    plain: list[dict[str, float]], limited: list[dict[str, float]], key: str
) -> dict[str, float]:
    """Added ``key`` from rounds run back to back: the median of the per-round differences
    (a spike in one round moves one difference, not the figure), the range of the middle
    half of them, and the median's 95% confidence interval (``_lo``, ``_hi``), which, unlike
    the middle half, narrows as rounds are added."""
    diffs = sorted(b[key] - a[key] for a, b in zip(plain, limited, strict=True))
    n = len(diffs)
    lo, hi = median_interval(n)
    return {
        "added": statistics.median(diffs),
        "added_q1": diffs[n // 4],
        "added_q3": diffs[min(n - 1, (3 * n) // 4)],
        "added_lo": diffs[lo],
        "added_hi": diffs[hi],
    }


def median_interval(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """Indexes (0-based, into ``n`` sorted values) of a distribution-free confidence interval
    for the median: the order statistics ``k`` and ``n - 1 - k`` with the largest ``k`` whose
    binomial(n, 1/2) coverage is at least ``confidence`` (with few values: the extremes)."""
    k = 0
    while k + 1 < n - 1 - (k + 1):
        inside = sum(math.comb(n, i) for i in range(k + 2, n - k - 1)) / 2**n
        if inside < confidence:
            break
        k += 1
    return k, n - 1 - k


def measure(
    tmp: Path, store: str, mock: str, quick: bool, store_pid: int | None
) -> tuple[dict[str, Any], dict[str, int]]:
    plain_key, plain_digest = new_key()
    limited_key, burst_key = setup_store(store)
    # many short rounds rather than a few long ones: each round pairs the two tenants back to
    # back, in alternating order, so a loaded machine's drift cancels in the differences
    plan = QUICK if quick else ROUNDS
    cells: dict[str, dict[int, list[dict[str, float]]]] = {"plain": {}, "limited": {}}
    with gateway(tmp, "a", store, mock, plain_digest) as (proc, url):
        for key in (plain_key, limited_key):  # warm both paths
            cell(proc, url, key, 4, 100, store_pid)
        most = max(rounds for rounds, _ in plan.values())
        for i in range(most):
            for c, (rounds, requests) in plan.items():
                stride = most // rounds  # fewer rounds: spread over the run, not bunched
                if i % stride or i // stride >= rounds:
                    continue
                order = [("plain", plain_key), ("limited", limited_key)]
                for who, key in order if (i // stride) % 2 == 0 else order[::-1]:
                    taken = cell(proc, url, key, c, requests, store_pid)
                    cells[who].setdefault(c, []).append(taken)
        with gateway(tmp, "b", store, mock, plain_digest) as (_, other):
            burst = asyncio.run(_burst([url, other], burst_key))
    used, reserved, cap = burst_usage(store)
    figures: dict[str, Any] = {}
    for c in CONCURRENCY:
        row = {}
        for who in cells:
            runs = cells[who][c]
            n = sum(r["n"] for r in runs)
            for cpu in ("cpu_ms", "store_cpu_ms"):  # pooled
                row[f"{who}_{cpu}"] = sum(r[cpu] * r["n"] for r in runs) / n
            row[f"{who}_p50_ms"] = statistics.median(r["p50_ms"] for r in runs)
        for key in ("cpu_ms", "store_cpu_ms", "p50_ms"):
            for name, value in paired(cells["plain"][c], cells["limited"][c], key).items():
                row[name.replace("added", f"added_{key}")] = value
        figures[f"c{c}"] = {k: round(v, 4) for k, v in row.items()}
    return figures, burst | {"used": used, "reserved": reserved, "cap": cap}


async def _burst(urls: list[str], key: str) -> dict[str, int]:
    import aiohttp

    payload = request_body("auto", False)
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:

        async def one(url: str) -> int:
            async with session.post(url, data=payload, headers=headers) as resp:
                await resp.read()
                return resp.status

        codes = await asyncio.gather(*[one(urls[i % 2]) for i in range(50)])
    return {"admitted": codes.count(200), "refused": codes.count(403), "other": 50 - codes.count(200) - codes.count(403)}  # fmt: skip


@contextlib.contextmanager
def postgres(url: str | None) -> Iterator[tuple[str, int | None] | None]:
    """The server's URL and postmaster pid (None for ``--postgres``'s: not counted), or
    None without server binaries. A throwaway server runs on the gateway's core."""
    if url:
        yield url, None
        return
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(postgres_cluster(GEARSHIFT_CORE))
        except RuntimeError as exc:  # no server binaries here
            print(f"PostgreSQL skipped: {exc}", flush=True)
            yield None
            return
        yield cluster.url, cluster.pid


def admission_alone(url: str, requests: int) -> dict[str, float]:
    """Admission without the gateway: CPU-ms, wall ms and store transactions per admit +
    settle of the ``limited`` tenant's request (its key's and tenant's eight counters), one
    request at a time (as at concurrency 1), in this process."""
    from gateway.access.admission import Admission, Limits
    from gateway.access.ledger import Ledger
    from gateway.auth import Authenticator
    from gateway.config import AuthSettings
    from gateway.metrics import Metrics

    prepare_schema(url, migrate=True)
    raw = request_body("auto", False)
    payload = orjson.loads(raw)
    limits = Limits(**LIMITS)  # type: ignore[arg-type]
    admission = Admission(Authenticator(AuthSettings()), Metrics(), 4096)
    admission.limits = {("ledger", ""): limits, ("ledger", "bench"): limits}

    each: list[float] = []  # wall seconds of each admit + settle after the warm-up

    async def run() -> tuple[float, float, int]:
        ledger = admission.ledger = Ledger(url)
        try:
            for i in range(50 + requests):
                if i == 50:  # warmed up
                    done = getattr(ledger, "transactions", 0)
                    cpu, wall = time.process_time(), time.perf_counter()
                t0 = time.perf_counter()
                ticket = await admission.admit("ledger", "bench", payload, raw)
                assert ticket is not None
                ticket.settle(MAX_TOKENS + 20)
                if i >= 50:
                    each.append(time.perf_counter() - t0)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            return cpu, wall, getattr(ledger, "transactions", 0) - done
        finally:
            ledger.close()

    cpu, wall, transactions = asyncio.run(run())
    return {"cpu_ms_per_req": round(1000 * cpu / requests, 4),
            "wall_ms_per_req": round(1000 * wall / requests, 4),
            "p50_ms": round(1000 * statistics.median(each), 4),
            "p99_ms": round(1000 * sorted(each)[int(0.99 * (len(each) - 1))], 4),
            "transactions_per_req": round(transactions / requests, 4)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--postgres", help="an empty PostgreSQL database's URL")
    p.add_argument("--ledger", action="store_true", help="admission alone, in this process")
    args = p.parse_args()
    if args.ledger:
        with tempfile.TemporaryDirectory(prefix="bench-ledger-") as name:
            urls = {"sqlite": f"sqlite:///{name}/store.db"}
            with postgres(args.postgres) as pg:
                if pg is not None:
                    urls["postgresql"] = pg[0]
                out = {
                    kind: admission_alone(url, 500 if args.quick else 5000)
                    for kind, url in urls.items()
                }
        print(orjson.dumps(out).decode())
        return
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {CLIENT_CORE % (os.cpu_count() or 1)})
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as name:
        tmp = Path(name)
        port = free_port()
        mock_log = tmp / "mock.log"
        mock = start(pinned([sys.executable, "-m", "bench.mock_upstream", "--port", str(port)], CLIENT_CORE), mock_log)  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/health", mock, mock_log)
            mock_url = f"http://127.0.0.1:{port}"
            stores: dict[str, tuple[str, int | None]] = {"sqlite": (f"sqlite:///{tmp}/store.db", None)}  # fmt: skip
            with postgres(args.postgres) as pg:
                if pg is not None:
                    stores["postgresql"] = pg
                for kind, (url, pid) in stores.items():
                    (tmp / kind).mkdir()
                    figures, burst = measure(tmp / kind, url, mock_url, args.quick, pid)
                    results[kind] = figures | {"burst": burst}
                    print(kind, orjson.dumps(results[kind]).decode(), flush=True)
        finally:
            stop(mock)
    worst = max(results.values(), key=lambda r: r["c1"]["added_cpu_ms"])
    summary = {
        "added_cpu_ms_per_req": max(r["c1"]["added_cpu_ms"] for r in results.values()),
        "added_p50_ms": max(r["c1"]["added_p50_ms"] for r in results.values()),
        "added_cpu_ms_per_req_iqr": [worst["c1"]["added_cpu_ms_q1"], worst["c1"]["added_cpu_ms_q3"]],
        "added_cpu_ms_per_req_ci95": [worst["c1"]["added_cpu_ms_lo"], worst["c1"]["added_cpu_ms_hi"]],
        "added_cpu_ms_per_req_c16": max(r["c16"]["added_cpu_ms"] for r in results.values()),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "postgres_server_cpu_counted": "postgresql" in results and args.postgres is None,
        "budget_overshoot": max(max(0, r["burst"]["used"] - r["burst"]["cap"]) for r in results.values()),
        "burst_admitted": {k: r["burst"]["admitted"] for k, r in results.items()},
        "stores": sorted(results),
        "quick": args.quick,
    }  # fmt: skip
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
