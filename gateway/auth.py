"""API keys and tenants.

Keys live in the configuration only as SHA-256 digests. A presented key is
hashed and its digest compared with every stored digest by
``hmac.compare_digest``, without an early exit, so the time taken says nothing
about which key, or how much of one, matched.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from gateway.config import AuthSettings
from gateway.errors import AuthenticationFailed

KEY_PREFIX = "gs-"


@dataclass(frozen=True, slots=True)
class Principal:
    key_name: str
    tenant: str


ANONYMOUS = Principal(key_name="anonymous", tenant="default")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh random key and its digest (for ``gearshift keys new``)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self._enabled = settings.mode == "keys"
        self._keys = [(k.sha256.encode(), Principal(k.name, k.tenant)) for k in settings.keys]

    @property
    def enabled(self) -> bool:
        return self._enabled

    def authenticate(self, authorization: str | None) -> Principal:
        if not self._enabled:
            return ANONYMOUS
        if not authorization:
            raise AuthenticationFailed("missing API key; send it as 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("malformed Authorization header; expected 'Bearer <key>'")
        digest = hash_key(key.strip()).encode()
        found: Principal | None = None
        for stored, principal in self._keys:
            if hmac.compare_digest(stored, digest):
                found = principal
        if found is None:
            raise AuthenticationFailed("invalid API key")
        return found
