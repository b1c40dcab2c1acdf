"""The HTTP transport to vLLM replicas, and the one place aiohttp's exceptions are translated.

aiohttp rather than httpx: its C HTTP parser and lighter connection pool keep
the gateway's CPU per request low (see docs/decisions/http-client.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import aiohttp

from gateway.config import TimeoutSettings
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable

JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Translate aiohttp/OS failures talking to ``url`` into the gateway's exception tree."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:  # never reached the replica: try another
        raise UpstreamUnreachable(f"replica {url} did not accept a connection in time") from exc
    except TimeoutError as exc:
        raise UpstreamTimeout(f"replica {url} did not answer in time") from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
        raise UpstreamUnreachable(
            f"replica {url} unreachable or dropped the connection: {exc!r}"
        ) from exc
    except aiohttp.ClientError as exc:
        raise UpstreamError(
            f"replica {url} answered with an invalid HTTP response: {exc!r}"
        ) from exc


def new_session(timeouts: TimeoutSettings, limit: int = 0) -> aiohttp.ClientSession:
    """One pooled session per gateway; timeouts beyond connect are applied per phase by callers."""
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=30, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(
        total=None, connect=timeouts.connect_s, sock_connect=timeouts.connect_s
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )
