from __future__ import annotations

import pytest

from gateway.auth import ANONYMOUS, Authenticator, hash_key, new_key
from gateway.config import AuthSettings
from gateway.errors import AuthenticationFailed


def test_new_keys_are_random_and_hash_to_their_digest():
    (k1, d1), (k2, _) = new_key(), new_key()
    assert k1 != k2 and k1.startswith("gs-") and hash_key(k1) == d1


def test_authenticates_by_digest():
    key, digest = new_key()
    auth = Authenticator(
        AuthSettings(mode="keys", keys=[{"name": "a", "tenant": "t1", "sha256": digest}])
    )
    principal = auth.authenticate(f"Bearer {key}")
    assert (principal.key_name, principal.tenant) == ("a", "t1")
    assert auth.authenticate(f"bearer  {key}").tenant == "t1"
    for header in (None, "", "Bearer ", "Token abc", f"Bearer {key}x"):
        with pytest.raises(AuthenticationFailed):
            auth.authenticate(header)


def test_keyless_mode_is_anonymous():
    assert Authenticator(AuthSettings(mode="none")).authenticate(None) is ANONYMOUS
