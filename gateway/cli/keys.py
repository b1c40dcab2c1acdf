"""``gearshift keys``: API keys, limits and budgets in the store (docs/operations.md).

These commands write to the store directly (``store.url``, or ``--store``), so they work
before any admin key exists and while no gateway runs; running gateways see each change
within ``auth.refresh_s``. Each prints JSON, one object per line; ``create`` and
``rotate`` print the new key, which is not stored and cannot be shown again.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection

from gateway.cli.common import in_store, parse_when

T = TypeVar("T")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(value: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d``: seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 90s, 15m, 12h, 30d")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _expiry(args: argparse.Namespace) -> datetime | None:
    if getattr(args, "expires_in", None) is not None:
        return datetime.fromtimestamp(time.time() + args.expires_in, UTC)
    return parse_when(getattr(args, "expires_at", None), "--expires-at")


def _in_store(args: argparse.Namespace, fn: Callable[[Connection], T]) -> T:
    from gateway.store.keys import BadName, KeyExists
    from gateway.store.queries import NotFound

    return in_store(args, fn, (NotFound, KeyExists, BadName))


def _print(*objects: Any) -> int:
    for obj in objects:
        print(json.dumps(obj, sort_keys=True))
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from gateway.auth import new_key

    key, digest = new_key()
    print(f"key (give it to the client, it is not stored): {key}")
    print("config entry:")
    print(f"  - {{name: {args.name}, tenant: {args.tenant}, sha256: '{digest}'}}")
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    from gateway.store import keys

    view, key = _in_store(
        args,
        lambda c: keys.create(
            c, args.tenant, args.name, admin=args.admin, models=_names(args.models),
            tools=_names(args.tools), expires_at=_expiry(args),
        ),
    )  # fmt: skip
    return _print(view | {"key": key})


def cmd_list(args: argparse.Namespace) -> int:
    from gateway.store import keys

    return _print(*_in_store(args, lambda c: keys.list_keys(c, args.tenant, all_=args.all)))


def cmd_revoke(args: argparse.Namespace) -> int:
    from gateway.store import keys

    return _print(_in_store(args, lambda c: keys.revoke(c, args.id)))


def cmd_rotate(args: argparse.Namespace) -> int:
    from gateway.store import keys

    view, key = _in_store(args, lambda c: keys.rotate(c, args.id, args.grace))
    return _print(view | {"key": key})


def cmd_expire(args: argparse.Namespace) -> int:
    from gateway.store import keys

    when = None if args.never else _expiry(args)
    if when is None and not args.never:
        raise SystemExit("gearshift: give --in, --at or --never")
    return _print(_in_store(args, lambda c: keys.expire(c, args.id, when)))


def cmd_limits(args: argparse.Namespace) -> int:
    from gateway.store import keys

    if args.action == "show":
        rows = _in_store(args, lambda c: keys.list_limits(c, args.tenant))
        return _print(*[keys.limit_view(r) for r in rows])
    if args.tenant is None:
        raise SystemExit(f"gearshift: keys limits {args.action} needs a tenant")
    name = args.key_name or ""
    if args.action == "clear":
        return _print(_in_store(args, lambda c: keys.delete_limits(c, args.tenant, name)))
    values = {
        "requests_per_minute": args.rpm, "tokens_per_minute": args.tpm,
        "tokens_per_day": args.per_day, "tokens_per_month": args.per_month,
    }  # fmt: skip
    return _print(
        _in_store(args, lambda c: keys.set_limits(c, args.tenant, name, values, args.soft))
    )


def cmd_usage(args: argparse.Namespace) -> int:
    from gateway.access.windows import current
    from gateway.store import keys

    return _print(*_in_store(args, lambda c: keys.usage(c, args.tenant, current(time.time()))))


def _store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path)
    p.add_argument("--store", help="store URL (default: store.url of the configuration)")


def _expiry_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expires-in", type=duration, help="e.g. 30d, 12h, 15m")
    p.add_argument("--expires-at", help="ISO date or date-time (UTC unless it names a zone)")


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("a limit is a count of zero or more")
    return number


def add_parser(sub: Any) -> None:
    keys = sub.add_parser("keys", help="API keys, limits and budgets")
    ks = keys.add_subparsers(dest="keys_command", required=True)
    new = ks.add_parser("new", help="print a new key and its config-file entry (no store)")
    new.add_argument("--tenant", default="default")
    new.add_argument("--name", default="key-1")
    new.set_defaults(func=cmd_new)

    create = ks.add_parser("create", help="create a key in the store; prints it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", required=True, help="recorded with every step it makes")
    create.add_argument("--admin", action="store_true", help="may use the admin API")
    create.add_argument("--models", help="comma-separated models it may request (default all)")
    create.add_argument("--tools", help="comma-separated hosted tools it may run (default all)")
    _expiry_options(create)
    _store_options(create)
    create.set_defaults(func=cmd_create)

    lst = ks.add_parser("list", help="the store's live keys")
    lst.add_argument("--tenant")
    lst.add_argument("--all", action="store_true", help="revoked and expired keys too")
    _store_options(lst)
    lst.set_defaults(func=cmd_list)

    for name, func, text in (
        ("revoke", cmd_revoke, "revoke a key (every gateway refuses it within a second)"),
        ("rotate", cmd_rotate, "a new key with the same name, scopes, limits and budgets"),
        ("expire", cmd_expire, "set or clear when a key stops working"),
    ):
        p = ks.add_parser(name, help=text)
        p.add_argument("id", help="the key's id (key_...)")
        _store_options(p)
        p.set_defaults(func=func)
        if name == "rotate":
            p.add_argument("--grace", type=duration, default=0.0, help="old key works this long")
        if name == "expire":
            p.add_argument("--in", dest="expires_in", type=duration)
            p.add_argument("--at", dest="expires_at")
            p.add_argument("--never", action="store_true")

    lim = ks.add_parser("limits", help="rate limits and token budgets: show, set, clear")
    lim.add_argument("action", choices=["show", "set", "clear"])
    lim.add_argument("tenant", nargs="?")
    lim.add_argument("key_name", nargs="?", help="a key's name; without it, the whole tenant")
    lim.add_argument("--rpm", type=_count, help="requests per minute")
    lim.add_argument("--tpm", type=_count, help="tokens per minute")
    lim.add_argument("--per-day", type=_count, help="token budget per UTC day")
    lim.add_argument("--per-month", type=_count, help="token budget per UTC month")
    lim.add_argument("--soft", type=int, default=80, choices=range(1, 101), metavar="PERCENT",
                     help="warn (header, metric) from this share of a budget (default 80)")  # fmt: skip
    _store_options(lim)
    lim.set_defaults(func=cmd_limits)

    use = ks.add_parser("usage", help="a tenant's counters in the current minute, day, month")
    use.add_argument("tenant")
    _store_options(use)
    use.set_defaults(func=cmd_usage)
