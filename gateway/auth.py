"""API keys and tenants: who a request is, and what its key may do.

Keys are known only as SHA-256 digests, from two sources: the configuration file
(``auth.keys``) and the store (``gearshift keys create``, ``/admin/v1/keys``), whose keys
``gateway.access.keys`` loads and hands over with ``replace_stored`` whenever they change.
A presented key is hashed and its digest looked up in a dict: the lookup's timing depends
on the digest, never on the key's characters, so it tells an attacker nothing about a
key they do not hold. A config-file key wins over a store key with the same digest.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.config import ApiKey, AuthSettings
from gateway.errors import AuthenticationFailed, PermissionDenied

KEY_PREFIX = "gs-"


@dataclass(frozen=True, slots=True)
class Principal:
    """A key's identity and scopes. ``models``/``tools`` None: every one."""

    key_name: str
    tenant: str
    admin: bool = False
    models: frozenset[str] | None = None
    tools: frozenset[str] | None = None
    expires_at: float | None = None  # Unix time; the key is refused from then on
    key_id: str | None = None  # store keys: the id admins name it by

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_run_tool(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


# Without keys (loopback only, see config) whoever connects is trusted, admin included.
ANONYMOUS = Principal(key_name="anonymous", tenant="default", admin=True)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh random key and its digest."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


def configured(key: ApiKey) -> Principal:
    models = frozenset(key.models) if key.models is not None else None
    tools = frozenset(key.tools) if key.tools is not None else None
    return Principal(key.name, key.tenant, key.admin, models, tools)


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self._enabled = settings.mode == "keys"
        # set by the control plane (gateway.routing.control): the tenant_off kill switch
        self.suspended: Callable[[str], bool] = lambda tenant: False
        self._config = {k.sha256: configured(k) for k in settings.keys}
        self._keys = dict(self._config)
        self._by_name = _by_name(self._keys.values())

    @property
    def enabled(self) -> bool:
        return self._enabled

    def replace_stored(self, stored: dict[str, Principal]) -> None:
        """The store's keys (digest -> principal), replacing the ones loaded before."""
        keys = {**stored, **self._config}
        self._keys, self._by_name = keys, _by_name(keys.values())

    def authenticate(self, authorization: str | None) -> Principal:
        if not self._enabled:
            return ANONYMOUS
        if not authorization:
            raise AuthenticationFailed("missing API key; send it as 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("malformed Authorization header; expected 'Bearer <key>'")
        found = self._keys.get(hash_key(key.strip()))
        if found is None:
            raise AuthenticationFailed("invalid API key")
        if found.expires_at is not None and found.expires_at <= time.time():
            raise AuthenticationFailed("this API key has expired")
        if not found.admin and self.suspended(found.tenant):
            raise PermissionDenied(
                f"tenant {found.tenant!r} is suspended by an operator (kill switch tenant_off)"
            )
        return found

    def named(self, tenant: str, key_name: str) -> Principal | None:
        """The key a request was authenticated with, by the names a ``RequestIdentity``
        carries; None for an unknown one (the anonymous caller included)."""
        if not self._enabled:
            return ANONYMOUS
        return self._by_name.get((tenant, key_name))


def _by_name(principals: Iterable[Principal]) -> dict[tuple[str, str], Principal]:
    """Rotated keys share a name and scopes; the one that expires last represents them."""
    out: dict[tuple[str, str], Principal] = {}
    for p in principals:
        held = out.get((p.tenant, p.key_name))
        if held is None or _end(held) < _end(p):
            out[(p.tenant, p.key_name)] = p
    return out


def _end(p: Principal) -> float:
    return p.expires_at if p.expires_at is not None else float("inf")
