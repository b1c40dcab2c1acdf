"""Closed-loop load generator: C workers send N chat requests, stream or not.

    python -m bench.loadgen URL --mode stream|plain --concurrency C --requests N
        [--max-seconds S] [--body FILE]

Prints one JSON object: completed, errors, seconds, rps, p50_ms, p99_ms, max_ms (the
slowest single request). Latency is to the last byte (for streams, through [DONE]). The
request is two short messages, or the JSON object in ``--body FILE`` (``model`` and
``stream`` are set on it).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson


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
) -> dict[str, float]:
    payload = body(model, stream, template)
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    latencies: list[float] = []
    errors = 0
    remaining = total
    deadline = time.monotonic() + max_s
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0 and time.monotonic() < deadline:
                remaining -= 1
                started = time.perf_counter()
                try:
                    async with session.post(url, data=payload, headers=headers) as resp:
                        data = await resp.read()
                        ok = resp.status == 200 and (
                            not stream or data.rstrip().endswith(b"[DONE]")
                        )
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1

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
        )
    )
    print(orjson.dumps(result).decode())


if __name__ == "__main__":
    main()
