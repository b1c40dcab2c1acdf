"""Secret settings from files (Docker/Kubernetes secrets mounted as files): ``<name>_file``
and ``file:`` references, in the YAML file and the environment; clear errors that name the
setting and the path but never the content; `gearshift serve` never prints a secret."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config import ConfigError, load_settings

PASSWORD = "pw-9f1c0e5b7a"
TOKEN = "sandbox-token-2d8e41"


def secret(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def config(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "gearshift.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GEARSHIFT_") and name != "GEARSHIFT_HOME":
            monkeypatch.delenv(name)


def test_every_secret_setting_reads_a_file_from_yaml(tmp_path: Path) -> None:
    url = secret(tmp_path, "store-url", f"postgresql://gs:{PASSWORD}@db:5432/gs\n")
    token = secret(tmp_path, "sandbox-token", TOKEN + "\r\n")
    admin = secret(tmp_path, "admin-token", "admin-secret")
    mcp_url = secret(tmp_path, "mcp-url", "https://mcp.example.com/mcp?key=k1")
    mcp_key = secret(tmp_path, "mcp-key", "mcp-key-value\n")
    digest = hashlib.sha256(b"bootstrap").hexdigest()
    keys = secret(tmp_path, "keys.yaml", yaml.safe_dump(
        [{"name": "ops", "tenant": "default", "sha256": digest, "admin": True}]
    ))  # fmt: skip
    settings = load_settings(config(tmp_path, {
        "store": {"url_file": str(url)},
        "admin_token": f"file:{admin}",
        "sandbox": {"token_file": str(token)},
        "auth": {"mode": "keys", "keys_file": str(keys)},
        "responses": {"mcp": {"servers": [
            {"label": "web", "url_file": str(mcp_url), "tenants": ["*"]},
            {"label": "git", "command": ["mcp-git"], "tenants": ["*"],
             "env": {"GIT_TOKEN": f"file:{mcp_key}", "PLAIN": "file-less value"}},
        ]}},
    }))  # fmt: skip
    assert settings.store.url == f"postgresql://gs:{PASSWORD}@db:5432/gs"
    assert settings.sandbox.token is not None
    assert settings.sandbox.token.get_secret_value() == TOKEN
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "admin-secret"
    assert [(k.name, k.sha256, k.admin) for k in settings.auth.keys] == [("ops", digest, True)]
    web, git = settings.responses.mcp.servers
    assert web.url == "https://mcp.example.com/mcp?key=k1"
    assert git.env == {"GIT_TOKEN": "mcp-key-value", "PLAIN": "file-less value"}


def test_environment_names_files_and_wins_over_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = secret(tmp_path, "store-url", "sqlite:////tmp/from-env.db\n")
    admin = secret(tmp_path, "admin-token", "from-env-admin\n")
    token = secret(tmp_path, "sandbox-token", TOKEN)
    monkeypatch.setenv("GEARSHIFT_STORE__URL_FILE", str(url))
    monkeypatch.setenv("GEARSHIFT_ADMIN_TOKEN_FILE", str(admin))
    monkeypatch.setenv("GEARSHIFT_SANDBOX__TOKEN", f"file:{token}")
    settings = load_settings(config(tmp_path, {"store": {"url": "sqlite:////tmp/from-yaml.db"}}))
    assert settings.store.url == "sqlite:////tmp/from-env.db"
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "from-env-admin"
    assert settings.sandbox.token is not None
    assert settings.sandbox.token.get_secret_value() == TOKEN


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"store": {"url_file": "/nonexistent/store-url"}}, "store.url: cannot read secret file"),
        ({"sandbox": {"token": "file:/nonexistent/t"}}, "sandbox.token: cannot read secret file"),
        ({"store": {"url": "sqlite://", "url_file": "/x"}}, "give store.url or store.url_file"),
        ({"store": {"url_file": 5}}, "store.url_file must be a file path"),
    ],
)
def test_bad_references_fail_with_the_setting_and_path(
    tmp_path: Path, data: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_settings(config(tmp_path, data))


def test_empty_and_unparsable_files_fail_without_their_content(tmp_path: Path) -> None:
    empty = secret(tmp_path, "empty", "\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_settings(config(tmp_path, {"sandbox": {"token_file": str(empty)}}))
    broken = secret(tmp_path, "keys.yaml", f"[{{unclosed {PASSWORD}")
    with pytest.raises(ConfigError, match="not valid YAML") as err:
        load_settings(config(tmp_path, {"auth": {"keys_file": str(broken)}}))
    assert PASSWORD not in str(err.value)


def test_a_non_secret_setting_takes_no_file_reference(tmp_path: Path) -> None:
    path = secret(tmp_path, "port", "9000")
    with pytest.raises(Exception, match="port_file"):  # pydantic: extra field not permitted
        load_settings(config(tmp_path, {"port_file": str(path)}))


def test_serve_never_prints_secrets_from_files(tmp_path: Path) -> None:
    """A store that refuses (nothing listens on port 1): the refusal names the store with its
    password masked, and the sandbox token from its file appears nowhere."""
    url = secret(tmp_path, "store-url", f"postgresql://gs:{PASSWORD}@127.0.0.1:1/gs\n")
    token = secret(tmp_path, "sandbox-token", TOKEN)
    cfg = config(tmp_path, {
        "tiers": {"full": {"model": "m", "replicas": ["http://127.0.0.1:1"]}},
        "store": {"url_file": str(url)},
        "sandbox": {"token_file": str(token), "enabled": False},
    })  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEARSHIFT_")}
    env["GEARSHIFT_HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "--log-level", "debug",
         "serve", "--config", str(cfg)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-2000:]
    assert "127.0.0.1:1" in out, out[-2000:]  # it did say which store refused
    assert PASSWORD not in out
    assert TOKEN not in out
