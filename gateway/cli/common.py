"""Helpers the ``gearshift`` subcommands share: configuration, reward weights, dates."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from sqlalchemy import Connection

from gateway.config import ConfigError, Settings, load_settings


def load_config(path: Path | None) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise SystemExit("gearshift: invalid configuration\n" + "\n".join(lines)) from None


def reward_weights(settings: Settings, spec: str | None) -> dict[str, float]:
    from gateway.store.rewards import DEFAULT_WEIGHTS

    weights = dict(settings.rewards.weights or DEFAULT_WEIGHTS)
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise SystemExit(f"gearshift: --weights wants name=number[,name=number], not {item!r}")
    return weights


def parse_when(value: str | None, flag: str = "--since") -> datetime | None:
    """An ISO date or date-time from the command line, UTC unless it names a zone."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise SystemExit(f"gearshift: {flag} wants an ISO date, not {value!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


T = TypeVar("T")


def in_store(
    args: argparse.Namespace,
    fn: Callable[[Connection], T],
    refused: tuple[type[Exception], ...] = (),
) -> T:
    """Run ``fn`` in one transaction on the store (``--store``, else ``store.url`` of
    ``--config``), migrating its schema first as ``serve`` does; an exception of ``refused``
    (the operator's mistake, not a bug) exits with its message."""
    from gateway.store.database import StoreError, make_engine, prepare_schema

    settings = load_config(args.config)
    url = args.store or settings.store.url
    try:
        prepare_schema(url, migrate=settings.store.migrate)
    except StoreError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            return fn(conn)
    except refused as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    finally:
        engine.dispose()
