"""Upstream HTTP client choice: CPU per request of aiohttp vs httpx against the mock upstream.

    python -m bench.http_clients [--requests N] [--quick]

Both clients send the same chat request over a pooled keep-alive connection
(concurrency 8) and read the whole answer; CPU time is the process's own
(the mock runs in another process on the other core). Backs
docs/decisions/http-client.md. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from bench.loadgen import body
from bench.procs import pinned, start, stop, wait_http


async def _aiohttp(url: str, payload: bytes, n: int, c: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as s:

        async def worker(k: int) -> None:
            for _ in range(k):
                async with s.post(
                    url, data=payload, headers={"content-type": "application/json"}
                ) as r:
                    await r.read()

        await asyncio.gather(*(worker(n // c) for _ in range(c)))


async def _httpx(url: str, payload: bytes, n: int, c: int) -> None:
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(limits=limits) as s:

        async def worker(k: int) -> None:
            for _ in range(k):
                r = await s.post(url, content=payload, headers={"content-type": "application/json"})
                r.read()

        await asyncio.gather(*(worker(n // c) for _ in range(c)))


def measure(fn, url: str, payload: bytes, n: int) -> float:
    asyncio.run(fn(url, payload, 200, 8))  # warm-up
    cpu = time.process_time()
    asyncio.run(fn(url, payload, n, 8))
    return (time.process_time() - cpu) * 1000 / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--quick", action="store_true", help="400 requests: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.requests = 400
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "mock.log"
        mock = start(
            pinned([sys.executable, "-m", "bench.mock_upstream", "--port", str(port)], 1), log
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/health", mock, log)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            payload = body("mock", False)
            a = measure(_aiohttp, url, payload, args.requests)
            h = measure(_httpx, url, payload, args.requests)
        finally:
            stop(mock)
    print(f"aiohttp {a:.3f} CPU-ms/request, httpx {h:.3f} CPU-ms/request")
    print(
        json.dumps(
            {
                "aiohttp_cpu_ms_per_req": round(a, 3),
                "httpx_cpu_ms_per_req": round(h, 3),
                "httpx_over_aiohttp": round(h / a, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
