"""``python -m sandbox --config FILE``: run the tool sandbox service (as root: it sets up
cgroups and drops to the sandbox uid for the code it runs).

``FILE`` is YAML with a ``sandbox:`` section (``sandbox.config.SandboxConfig``), which is
how ``gearshift serve`` and ``gearshift sandbox`` hand it over. Exit status 3 means it
refused to run code because it cannot isolate it (no bubblewrap, not root, ...): it fails
closed, saying why on standard error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn
import yaml
from pydantic import ValidationError

from sandbox.config import SandboxConfig
from sandbox.errors import RuntimeUnavailable
from sandbox.service import create_app

CANNOT_ISOLATE = 3


def load(path: Path) -> SandboxConfig:
    data = yaml.safe_load(path.read_text()) or {}
    return SandboxConfig.model_validate(data.get("sandbox") or {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        print(f"sandbox: cannot read {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        app = create_app(config)
    except RuntimeUnavailable as exc:
        print(f"sandbox: refusing to run code: {exc}", file=sys.stderr)
        return CANNOT_ISOLATE
    if config.token is None:
        print(f"sandbox token (set sandbox.token to keep it): {app.state.sandbox.token.decode()}")
    where = (
        {"uds": str(config.socket)} if config.socket else {"host": config.host, "port": config.port}
    )
    uvicorn.run(app, log_level=args.log_level, **where)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
