"""``http_fetch``, run host-side through the egress allowlist.

The policy has already matched the URL's host and port against the grant. Here the
name is resolved, and every address it resolves to must be public (``is_global``:
not private, loopback, link-local, the 169.254.169.254 metadata address, CGNAT or
reserved) unless the grant allows private addresses or names the address's CIDR.
The connection then goes to the checked address itself (no second lookup that a
rebinding DNS server could answer differently), redirects are not followed, and
the body is capped.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from sandbox.errors import EgressDenied
from sandbox.policy import Egress, ResourceClass

Resolver = Callable[[str, int], Awaitable[list[str]]]


def target(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EgressDenied(f"only http(s) URLs with a host are fetched, not {url[:100]!r}")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def address_allowed(ip: str, egress: Egress) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if any(addr in ipaddress.ip_network(c, strict=False) for c in egress.cidrs):
        return True
    return addr.is_global or egress.private


async def system_resolver(host: str, port: int) -> list[str]:
    import asyncio

    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class _Pinned(AbstractResolver):
    """Answers the one address that was checked."""

    def __init__(self, ip: str) -> None:
        self.ip = ip

    async def resolve(
        self, host: str, port: int = 0, family: int = socket.AF_INET
    ) -> list[ResolveResult]:
        fam = socket.AF_INET6 if ":" in self.ip else socket.AF_INET
        return [
            {"hostname": host, "host": self.ip, "port": port, "family": fam, "proto": 0, "flags": 0}
        ]

    async def close(self) -> None:
        return None


async def fetch(
    url: str, egress: Egress, limits: ResourceClass, resolve: Resolver
) -> dict[str, Any]:
    host, port = target(url)
    addresses = await resolve(host, port)
    if not addresses:
        raise EgressDenied(f"{host!r} does not resolve")
    refused = [a for a in addresses if not address_allowed(a, egress)]
    if refused:
        raise EgressDenied(f"{host!r} resolves to {refused[0]}, a non-public address")
    connector = aiohttp.TCPConnector(resolver=_Pinned(addresses[0]), use_dns_cache=False)
    timeout = aiohttp.ClientTimeout(total=limits.wall_s)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.get(url, allow_redirects=False) as resp,
    ):
        body = await resp.content.read(limits.output_bytes + 1)
        keep = ("content-type", "location")
        return {
            "status": resp.status,
            "headers": {str(k): str(v) for k, v in resp.headers.items() if k.lower() in keep},
            "body": body[: limits.output_bytes].decode("utf-8", errors="replace"),
            "truncated": len(body) > limits.output_bytes,
            "address": addresses[0],
        }
