from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import ConfigError, load_settings
from router import Tier


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gearshift.yaml"
    path.write_text(text)
    return path


def test_file_then_environment(tmp_path, monkeypatch):
    path = write(tmp_path, "port: 9000\ntiers:\n  full: {model: m, replicas: ['http://h:1/']}\n")
    monkeypatch.setenv("GEARSHIFT_PORT", "9100")
    monkeypatch.setenv("GEARSHIFT_RETRIES__ATTEMPTS", "5")
    s = load_settings(path)
    assert s.port == 9100 and s.retries.attempts == 5
    assert s.tiers[Tier.FULL].replicas == ["http://h:1"]


def test_typo_fails_naming_the_field(tmp_path):
    with pytest.raises(ValidationError, match=r"retries.attemps"):
        load_settings(write(tmp_path, "retries: {attemps: 3}\n"))


def test_unknown_tier_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="medium"):
        load_settings(write(tmp_path, "tiers:\n  medium: {model: m}\n"))


def test_keyless_only_on_loopback():
    with pytest.raises(ValidationError, match="only allowed on a loopback host"):
        load_settings(host="0.0.0.0")
    assert load_settings(host="::1").auth.mode == "none"


def test_keys_mode_needs_keys_in_the_config_or_the_store():
    with pytest.raises(ValidationError, match=r"auth.keys is empty"):
        load_settings(auth={"mode": "keys"}, store={"enabled": False})
    assert load_settings(auth={"mode": "keys"}).auth.keys == []  # `gearshift keys create`


def test_key_digest_must_be_sha256():
    with pytest.raises(ValidationError, match=r"sha256"):
        load_settings(
            auth={"mode": "keys", "keys": [{"name": "k", "tenant": "t", "sha256": "plain-text"}]}
        )


def test_tier_models_must_differ_and_not_be_auto():
    with pytest.raises(ValidationError, match="must differ"):
        load_settings(tiers={"full": {"model": "m"}, "fast": {"model": "m"}})
    with pytest.raises(ValidationError, match="reserved"):
        load_settings(tiers={"full": {"model": "auto"}})


def test_replica_urls_need_a_scheme():
    with pytest.raises(ValidationError, match="http://"):
        load_settings(tiers={"full": {"model": "m", "replicas": ["localhost:8000"]}})


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "port: [1,\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(write(tmp_path, "- 1\n"))


def test_the_shipped_example_is_valid():
    example = Path(__file__).parents[2] / "deploy" / "gearshift.example.yaml"
    s = load_settings(example)
    assert set(s.tiers) == {Tier.FULL, Tier.FAST} and s.auth.mode == "none"
    assert s.store.enabled and s.store.url.startswith("sqlite:///~")


def test_store_urls_are_normalized():
    from gateway.store.database import normalize_url

    assert normalize_url("postgresql://u:p@db/g") == "postgresql+psycopg://u:p@db/g"
    assert normalize_url("sqlite:///~/x.db") == f"sqlite:///{Path.home()}/x.db"


def test_default_route_chain_and_other_policies_own_defaults(tmp_path):
    default = load_settings(None).router
    assert default.policy == "session"
    assert default.params == {"base": "rules", "base_params": {"base": "classifier", "code": False, "math": False}}  # fmt: skip
    path = tmp_path / "g.yaml"
    path.write_text("router: {policy: length_threshold}\n")
    assert load_settings(path).router.params == {}  # not the session chain's params
    path.write_text("router: {params: {base: classifier}}\n")
    assert load_settings(path).router.params == {"base": "classifier"}  # replaced as a whole


def test_budget_lease_and_flush_are_settings(tmp_path):
    s = load_settings(write(tmp_path, "limits: {lease_s: 10, flush_s: 1.0}\n"))
    assert (s.limits.lease_s, s.limits.flush_s) == (10.0, 1.0)
    assert (load_settings(None).limits.lease_s, load_settings(None).limits.flush_s) == (30.0, 0.5)
    with pytest.raises(ValidationError, match=r"an eighth of limits\.lease_s"):
        load_settings(write(tmp_path, "limits: {lease_s: 4, flush_s: 1.0}\n"))
