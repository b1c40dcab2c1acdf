from __future__ import annotations

import time

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


def test_store_keys_join_config_keys_and_expire_on_time():
    from gateway.auth import Principal

    config_key, config_digest = new_key()
    stored_key, stored_digest = new_key()
    auth = Authenticator(
        AuthSettings(mode="keys", keys=[{"name": "a", "tenant": "t1", "sha256": config_digest}])
    )
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(f"Bearer {stored_key}")
    soon = Principal("bot", "t2", models=frozenset({"auto"}), expires_at=time.time() + 0.2)
    taken = Principal("impostor", "t9", admin=True)
    auth.replace_stored({stored_digest: soon, config_digest: taken})
    assert auth.authenticate(f"Bearer {stored_key}") is soon
    assert auth.authenticate(f"Bearer {config_key}").tenant == "t1"  # the config's key wins
    assert auth.named("t2", "bot") is soon and auth.named("t9", "impostor") is None
    assert soon.may_use_model("auto") and not soon.may_use_model("full")
    time.sleep(0.25)
    with pytest.raises(AuthenticationFailed, match="expired"):
        auth.authenticate(f"Bearer {stored_key}")
    auth.replace_stored({})  # revoked: gone at the next reload
    assert auth.named("t2", "bot") is None
