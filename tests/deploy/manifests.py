"""What the static deployment tests read: the compose file, rendered Kustomize overlays, the
Containerfiles, and the gateway's own routes and configuration loader."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("cpu", "gpu", "inference-extension")
VERSION = importlib.metadata.version("gearshift")
# what scripts/build-images.sh tags (IMAGE_PREFIX=localhost, the package's version)
BUILT_IMAGES = {f"localhost/gearshift-{name}:{VERSION}" for name in ("gateway", "vllm-cpu")}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def default_image(ref: str) -> str:
    """``${VAR:-default}`` -> default; a plain reference stays as it is."""
    match = re.fullmatch(r"\$\{\w+:-(.+)\}", ref)
    return match.group(1) if match else ref


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments as a dict."""
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "kubernetes" / "overlays" / overlay)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return found


def gateway_answers(paths: tuple[str, ...] = ("/health", "/ready", "/metrics")) -> dict[str, int]:
    """The gateway app's status for a GET of each path (its tiers unreachable: /ready 503)."""
    from starlette.testclient import TestClient

    from gateway.config import Settings
    from gateway.http.app import create_app

    tier = {"replicas": ["http://127.0.0.1:9"]}
    settings = Settings.model_validate(
        {
            "tiers": {"full": {"model": "m", **tier}, "fast": {"model": "m-fast", **tier}},
            "store": {"enabled": False},
            "sandbox": {"enabled": False},
        }
    )
    with TestClient(create_app(settings)) as client:
        return {path: client.get(path).status_code for path in paths}


def crd_schema(name: str) -> dict[str, Any]:
    """A vendored CRD schema (tests/deploy/crds/README.md), unknown fields refused, as
    ``kubectl apply --validate=strict`` would (a CRD's own schema prunes them silently)."""

    def strict(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: strict(v) for k, v in node.items()}
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            return node
        return [strict(v) for v in node] if isinstance(node, list) else node

    schema: dict[str, Any] = json.loads((Path(__file__).parent / "crds" / name).read_text())
    schema["properties"]["metadata"] = {"type": "object"}
    return dict(strict(schema))


def containerfile_directives(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of each directive, continuation lines joined, comments dropped."""
    text = (DEPLOY / "images" / f"{name}.Containerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out
