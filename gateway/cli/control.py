"""``gearshift routing`` and ``gearshift switch``: routing versions and kill switches in
the store (docs/operations.md).

Like ``gearshift keys``, these write to the store directly (``store.url`` or ``--store``),
so they work with no gateway running and before any admin key exists; running gateways
apply each change within ``auth.refresh_s``. The actor recorded is ``--as`` (default: the
local user, ``cli:<user>``). Each command prints JSON.

    gearshift routing create FILE.yaml [--note …]   store {policy, params} as a version
    gearshift routing list | history | diff A B
    gearshift routing publish ID | rollback | canary ID WEIGHT | canary-off
    gearshift switch list | on KIND [TARGET] | off KIND [TARGET]  [--reason …]
"""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from sqlalchemy import Connection

from gateway.cli.common import in_store

T = TypeVar("T")


def _in_store(args: argparse.Namespace, fn: Callable[[Connection], T]) -> T:
    from gateway.store.control import ControlError

    return in_store(args, fn, (ControlError,))


def _print(obj: Any) -> int:
    print(json.dumps(obj, sort_keys=True, default=str))
    return 0


def _actor(args: argparse.Namespace) -> str:
    return str(args.actor or f"cli:{getpass.getuser()}")


def _state(s: Any) -> dict[str, Any]:
    return {"published": s.published, "canary": s.canary, "canary_weight": s.canary_weight}


def cmd_create(args: argparse.Namespace) -> int:
    from gateway.store import control
    from router import PolicyError, build_policy

    try:
        data = yaml.safe_load(Path(args.file).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"gearshift: {args.file}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("policy"), str):
        raise SystemExit(f"gearshift: {args.file} must hold a mapping with 'policy' (and 'params')")
    config = {"policy": data["policy"], "params": data.get("params") or {}}
    try:
        build_policy(config["policy"], config["params"])
    except PolicyError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    vid, created = _in_store(
        args, lambda c: control.create_version(c, config, _actor(args), args.note)
    )
    return _print({"id": vid, "created": created, "config": config})


def cmd_list(args: argparse.Namespace) -> int:
    from gateway.store import control

    def read(c: Connection) -> dict[str, Any]:
        return {"serving": _state(control.state(c)), "versions": control.versions(c)}

    return _print(_in_store(args, read))


def cmd_history(args: argparse.Namespace) -> int:
    from gateway.store import control

    return _print(_in_store(args, lambda c: control.events(c, args.limit)))


def cmd_diff(args: argparse.Namespace) -> int:
    from gateway.store import control

    configs = _in_store(args, lambda c: control.version_configs(c, [args.a, args.b]))
    for vid in (args.a, args.b):
        if vid not in configs:
            raise SystemExit(f"gearshift: no routing version {vid!r}")
    return _print(control.config_diff(configs[args.a], configs[args.b]))


def cmd_publish(args: argparse.Namespace) -> int:
    from gateway.store import control

    return _print(
        _state(_in_store(args, lambda c: control.publish(c, args.id, _actor(args), args.note)))
    )


def cmd_rollback(args: argparse.Namespace) -> int:
    from gateway.store import control

    return _print(_state(_in_store(args, lambda c: control.rollback(c, _actor(args), args.note))))


def cmd_canary(args: argparse.Namespace) -> int:
    from gateway.store import control

    return _print(
        _state(
            _in_store(
                args, lambda c: control.set_canary(c, args.id, args.weight, _actor(args), args.note)
            )
        )
    )


def cmd_canary_off(args: argparse.Namespace) -> int:
    from gateway.store import control

    return _print(_state(_in_store(args, lambda c: control.end_canary(c, _actor(args), args.note))))


def cmd_switch_list(args: argparse.Namespace) -> int:
    from gateway.store import control

    def read(c: Connection) -> dict[str, Any]:
        return {"switches": control.switches(c), "events": control.switch_events(c, args.limit)}

    return _print(_in_store(args, read))


def cmd_switch(args: argparse.Namespace) -> int:
    from gateway.store import control

    active = args.switch_command == "on"
    return _print(
        _in_store(
            args,
            lambda c: control.set_switch(
                c, args.kind, args.target, active, _actor(args), args.reason
            ),
        )
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path)
    p.add_argument("--store", help="store URL (default: store.url of the configuration)")
    p.add_argument("--as", dest="actor", help="who is acting, for the history")


def add_parser(sub: Any) -> None:
    from gateway.store.control import SWITCH_KINDS

    routing = sub.add_parser("routing", help="routing versions: publish, canary, rollback")
    rs = routing.add_subparsers(dest="routing_command", required=True)
    p = rs.add_parser("create", help="store a YAML {policy, params} as a version")
    p.add_argument("file")
    p.add_argument("--note")
    p.set_defaults(func=cmd_create)
    rs.add_parser("list", help="what serves, and the versions").set_defaults(func=cmd_list)
    p = rs.add_parser("history", help="publish, rollback and canary events, newest first")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_history)
    p = rs.add_parser("diff", help="what differs between two versions")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(func=cmd_diff)
    for name, fn, text in (
        ("publish", cmd_publish, "serve a version to every session"),
        ("canary", cmd_canary, "serve a version to a share of sessions"),
    ):
        p = rs.add_parser(name, help=text)
        p.add_argument("id")
        if name == "canary":
            p.add_argument("weight", type=float, help="share of sessions, between 0 and 1")
        p.add_argument("--note")
        p.set_defaults(func=fn)
    for name, fn, text in (
        ("rollback", cmd_rollback, "back to the version published before"),
        ("canary-off", cmd_canary_off, "end the canary"),
    ):
        p = rs.add_parser(name, help=text)
        p.add_argument("--note")
        p.set_defaults(func=fn)
    for p in rs.choices.values():
        _common(p)

    switch = sub.add_parser("switch", help="kill switches")
    ss = switch.add_subparsers(dest="switch_command", required=True)
    p = ss.add_parser("list", help="every switch and the latest changes")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_switch_list)
    for name in ("on", "off"):
        p = ss.add_parser(name, help=f"turn a switch {name}")
        p.add_argument("kind", choices=SWITCH_KINDS)
        p.add_argument("target", nargs="?", default="", help="tier, tool or tenant")
        p.add_argument("--reason")
        p.set_defaults(func=cmd_switch)
    for p in ss.choices.values():
        _common(p)
