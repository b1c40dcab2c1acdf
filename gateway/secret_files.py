"""Secret settings read from files: Docker, Podman and Kubernetes secrets are mounted as files.

Every secret setting can be given three ways, in the YAML file or the environment:

- as itself: ``store: {url: postgresql://u:pw@db/gs}``, ``GEARSHIFT_STORE__URL=...``;
- by ``<name>_file``: ``store: {url_file: /run/secrets/store-url}``,
  ``GEARSHIFT_STORE__URL_FILE=/run/secrets/store-url``;
- by a ``file:`` reference as the value: ``GEARSHIFT_SANDBOX__TOKEN=file:/run/secrets/t``
  (the only form for a map's values, such as an MCP server's ``env``).

A file's content is the value, less trailing line breaks (``echo`` and editors add one);
``auth.keys`` is a YAML list of key entries. An unreadable or empty file stops the start with
the setting's name and the path, never the content. ``SECRET_PATHS`` names the settings.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

PREFIX = "file:"
# Dotted paths into the configuration; ``*`` is any list item or map key.
SECRET_PATHS = (
    "store.url",
    "admin_token",
    "sandbox.token",
    "auth.keys",
    "responses.mcp.servers.*.url",
    "responses.mcp.servers.*.env.*",
)
PARSED = frozenset({"auth.keys"})  # the file holds YAML, not one string


class SecretFileError(ValueError):
    """A secret file is missing, unreadable, empty, or given together with the value."""


def read_secret(path: str, setting: str) -> str:
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise SecretFileError(f"{setting}: cannot read secret file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise SecretFileError(f"{setting}: secret file {path} is not UTF-8 text") from exc
    value = text.rstrip("\r\n")
    if not value.strip():
        raise SecretFileError(f"{setting}: secret file {path} is empty")
    return value


def _value(path: str, pattern: str, setting: str) -> Any:
    text = read_secret(path, setting)
    if pattern not in PARSED:
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SecretFileError(f"{setting}: secret file {path} is not valid YAML") from exc


def _leaf(node: dict[str, Any], name: str, pattern: str, trail: str) -> None:
    setting = f"{trail}{name}"
    ref = node.get(f"{name}_file")
    if ref is not None:
        if name in node:
            raise SecretFileError(f"give {setting} or {setting}_file, not both")
        if not isinstance(ref, str) or not ref:
            raise SecretFileError(f"{setting}_file must be a file path")
        node[name] = _value(node.pop(f"{name}_file"), pattern, setting)
    elif isinstance(node.get(name), str) and node[name].startswith(PREFIX):
        node[name] = _value(node[name][len(PREFIX) :], pattern, setting)


def _walk(node: Any, parts: list[str], pattern: str, trail: str) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node or []))
        for key, child in items:
            if not rest:
                if isinstance(child, str) and child.startswith(PREFIX):
                    node[key] = _value(child[len(PREFIX) :], pattern, f"{trail}{key}")
            elif isinstance(child, dict | list):
                _walk(child, rest, pattern, f"{trail}{key}.")
        return
    if not isinstance(node, dict):
        return
    if not rest:
        _leaf(node, head, pattern, trail)
    elif isinstance(node.get(head), dict | list):
        _walk(node[head], rest, pattern, f"{trail}{head}.")


def resolve(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a configuration as nested dicts and lists) with every secret file read."""
    out = copy.deepcopy(dict(data))
    for pattern in SECRET_PATHS:
        _walk(out, pattern.split("."), pattern, "")
    return out


def top_level_from_environment(prefix: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """``<PREFIX><NAME>_FILE`` for the top-level secrets (``GEARSHIFT_ADMIN_TOKEN_FILE``):
    the environment source only sees nested ones (``GEARSHIFT_STORE__URL_FILE``)."""
    found: dict[str, Any] = {}
    for pattern in SECRET_PATHS:
        if "." in pattern:
            continue
        name = f"{prefix}{pattern}_FILE".upper()
        if name in environ:
            if f"{prefix}{pattern}".upper() in environ:
                raise SecretFileError(f"give {prefix}{pattern.upper()} or {name}, not both")
            found[pattern] = _value(environ[name], pattern, pattern)
    return found
