"""Closed-loop load generator: C workers send N chat requests, stream or not.

    python -m bench.loadgen URL --mode stream|plain --concurrency C --requests N
        [--max-seconds S] [--body FILE | --sessions]

Prints one JSON object: completed, errors, seconds, rps, p50_ms, p99_ms, max_ms (the
slowest single request) and ``slowest``: the five slowest requests as [ms, wall-clock
start, messages in the request]. Latency is to the last byte (for streams, through
[DONE]). The request is two short messages, or the JSON object in ``--body FILE``
(``model`` and ``stream`` are set on it). With ``--sessions`` each worker acts as an agent:
it sends one session's requests in order (``bench.agent_body.session_bodies``: 2 messages,
then each step the previous ones plus a tool call and its result, up to 30) under an
``X-Session-Id`` of its own, then starts the next session.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

SESSION_SEEDS = 16  # distinct histories; later sessions repeat them under new ids
Request = tuple[bytes, dict[str, str]]


def body(model: str, stream: bool, template: dict[str, Any] | None = None) -> bytes:
    if template is not None:
        return orjson.dumps({**template, "model": model, "stream": stream})
    return orjson.dumps(
        {
            "model": model,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {
                    "role": "user",
                    "content": "What is the capital of France? Answer in one sentence.",
                },
            ],
            "max_tokens": 32,
            "temperature": 0,
            "stream": stream,
        }
    )


def agent_sessions(model: str, stream: bool) -> Iterator[list[bytes]]:
    """Endless sessions, each its request bodies in order."""
    from bench.agent_body import session_bodies

    seeds = range(SESSION_SEEDS)
    bodies = [[body(model, stream, b) for b in session_bodies(seed)] for seed in seeds]
    for n in itertools.count():
        yield bodies[n % SESSION_SEEDS]


def requests(
    model: str,
    stream: bool,
    headers: dict[str, str],
    template: dict[str, Any] | None,
    sessions: bool,
) -> Iterator[Iterator[Request]]:
    """What each worker sends: an endless run of requests (sessions: one session's steps)."""
    if not sessions:
        payload = body(model, stream, template)
        while True:
            yield itertools.repeat((payload, headers))
    tag = secrets.token_hex(4)  # session ids unique to this run
    for n, steps in enumerate(agent_sessions(model, stream)):
        # zip binds this session's headers now: a generator expression would read ``named``
        # when a worker gets to it, by then another session's (concurrent workers interleave)
        named = headers | {"x-session-id": f"bench-{tag}-{n}"}
        yield zip(steps, itertools.repeat(named))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(
    url: str,
    model: str,
    stream: bool,
    concurrency: int,
    total: int,
    max_s: float,
    key: str,
    template: dict[str, Any] | None = None,
    sessions: bool = False,
) -> dict[str, Any]:
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    source = requests(model, stream, headers, template, sessions)
    latencies: list[float] = []
    slowest: list[tuple[float, float, int]] = []  # a min-heap of the five slowest
    errors = 0
    remaining = total
    deadline = time.monotonic() + max_s
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:

        async def send(data: bytes, sent_headers: dict[str, str]) -> None:
            nonlocal errors
            wall, started = time.time(), time.perf_counter()
            try:
                async with session.post(url, data=data, headers=sent_headers) as resp:
                    answer = await resp.read()
                    ok = resp.status == 200 and (not stream or answer.rstrip().endswith(b"[DONE]"))
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if not ok:
                errors += 1
                return
            latency = time.perf_counter() - started
            latencies.append(latency)
            entry = (latency, wall, data.count(b'"role"'))
            if len(slowest) < 5:
                heapq.heappush(slowest, entry)
            else:
                heapq.heappushpop(slowest, entry)

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and time.monotonic() < deadline:
                for data, sent_headers in next(source):
                    if remaining <= 0 or time.monotonic() >= deadline:
                        return
                    remaining -= 1
                    await send(data, sent_headers)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {
        "completed": len(latencies),
        "errors": errors,
        "seconds": seconds,
        "rps": len(latencies) / seconds if seconds else 0.0,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies, default=float("nan")) * 1000,
        "slowest": [[round(s * 1000, 2), round(w, 3), n] for s, w, n in sorted(slowest)[::-1]],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--model", default="auto")
    p.add_argument("--mode", choices=["plain", "stream"], default="plain")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=30)
    p.add_argument("--key", default="unused")
    p.add_argument("--body", type=Path, help="a JSON request to send instead of the default")
    p.add_argument("--sessions", action="store_true", help="send growing agent sessions")
    a = p.parse_args()
    template = orjson.loads(a.body.read_bytes()) if a.body else None
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(
        run(
            a.url,
            a.model,
            a.mode == "stream",
            a.concurrency,
            a.requests,
            a.max_seconds,
            a.key,
            template,
            a.sessions,
        )
    )
    print(orjson.dumps(result).decode())


if __name__ == "__main__":
    main()
