"""The ``gearshift`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
from pathlib import Path

from gateway.cli.bundle import add_parser as add_bundle_parser
from gateway.cli.common import load_config, parse_when, reward_weights
from gateway.cli.control import add_parser as add_control_parser
from gateway.cli.keys import add_parser as add_keys_parser
from gateway.cli.router import add_parser as add_router_parser
from gateway.cli.serve import run

log = logging.getLogger("gearshift")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_config(args.config)
    if args.port is not None:
        settings = settings.model_copy(update={"port": args.port})
    try:
        import uvloop

        return uvloop.run(run(settings))
    except ImportError:
        return asyncio.run(run(settings))


def cmd_provision(args: argparse.Namespace) -> int:
    from backends.provision import ProvisionError, provision, provision_pruned
    from gateway.cli.embedded import prune_options, pruned_model_needed

    settings = load_config(args.config)
    e = settings.embedded
    try:
        path = provision(e.home, e.python)
        print(path)
        if pruned_model_needed(e):
            print(provision_pruned(e.home, e.python, path, prune_options(e)))
    except ProvisionError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from backends.provision import ProvisionError, run_pruning

    settings = load_config(None)
    try:
        return run_pruning(settings.embedded.python, args.prune_args)
    except ProvisionError as exc:
        raise SystemExit(f"gearshift: {exc}") from None


def cmd_export(args: argparse.Namespace) -> int:
    from gateway.export.formats import export
    from gateway.export.load import Filter
    from gateway.store.database import StoreError, make_engine, prepare_schema

    settings = load_config(args.config)
    url = args.store or settings.store.url
    since = parse_when(args.since)
    try:
        prepare_schema(url, migrate=False)
    except StoreError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    engine = make_engine(url)
    until = parse_when(args.until, "--until")
    flt = Filter(
        tenant=args.tenant, since=since, until=until, min_reward=args.min_reward,
        summaries=args.summaries,
    )  # fmt: skip
    summary = export(engine, args.format, args.out, flt, reward_weights(settings, args.weights))
    engine.dispose()
    print(f"wrote {summary.rows} rows from {summary.sessions} sessions to {args.out}")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from gateway.store import database

    settings = load_config(args.config)
    url = args.store or settings.store.url
    if args.action == "upgrade":
        database.upgrade(url, args.revision or "head")
    elif args.action == "downgrade":
        database.downgrade(url, args.revision or "-1")
    elif args.action == "current":
        print(database.current_revision(url) or "(empty)", "head:", database.head_revision())
    elif args.action == "replay":
        from gateway.recording.replay import replay

        path = Path(args.file or settings.store.dead_letter_path).expanduser()
        result = replay(url, path, settings.rewards.hooks)
        print(
            f"{path}: {result.written} steps written, {result.already} already in the store, "
            f"{result.failed} refused again, {result.unreadable} unreadable "
            f"(those stay in {path})"
        )
        return 1 if result.failed or result.unreadable else 0
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Run the sandbox service alone (its own process, as root: it sets up cgroups)."""
    from gateway.cli.sandbox_process import command, environment, write_section

    config_file = write_section(load_config(args.config).sandbox)
    try:
        run = subprocess.run(
            command(config_file, args.log_level), env=environment(), close_fds=True, check=False
        )
        return run.returncode
    finally:
        config_file.unlink(missing_ok=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gearshift", description=__doc__)
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run the gateway (and the embedded default stack without tiers)"
    )
    serve.add_argument("--config", type=Path, help="YAML configuration file")
    serve.add_argument("--port", type=int, help="override the listening port")
    serve.set_defaults(func=cmd_serve)

    prov = sub.add_parser(
        "provision",
        help="build the embedded stack's models (the default model; the fast tier's, where served)",
    )
    prov.add_argument("--config", type=Path)
    prov.set_defaults(func=cmd_provision)

    prune = sub.add_parser(
        "prune",
        help="remove layers from a checkpoint (runs in the engine environment; --help for options)",
        add_help=False,
    )
    prune.set_defaults(func=cmd_prune)

    from gateway.export.formats import FORMATS
    from gateway.export.load import SUMMARIES

    exp = sub.add_parser(
        "export",
        help="write recorded trajectories for a trainer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="formats:\n" + "\n".join(f"  {k:13} {f.help}" for k, f in FORMATS.items()),
    )
    exp.add_argument("--format", required=True, choices=sorted(FORMATS))
    exp.add_argument("--tenant", help="only this tenant's sessions (default: all)")
    exp.add_argument("--since", help="only sessions started at or after this ISO date/time")
    exp.add_argument("--until", help="only sessions started before this ISO date/time")
    exp.add_argument("--min-reward", type=float, help="only sessions whose combined reward >= X")
    exp.add_argument(
        "--summaries", choices=SUMMARIES, default="exclude",
        help="a context summary's model calls (policy context-summary): left out of the "
        "agent's steps (default), included as steps of their own, or exported alone",
    )  # fmt: skip
    exp.add_argument("--weights", help="override reward weights: name=w[,name=w]")
    exp.add_argument("--config", type=Path)
    exp.add_argument("--store", help="store URL (default: store.url of the configuration)")
    exp.add_argument("out", type=Path)
    exp.set_defaults(func=cmd_export)

    db = sub.add_parser(
        "db", help="trajectory store: schema upgrade, downgrade, current; replay dead letters"
    )
    db.add_argument("action", choices=["upgrade", "downgrade", "current", "replay"])
    db.add_argument("revision", nargs="?")
    db.add_argument("--config", type=Path)
    db.add_argument("--store", help="store URL (default: store.url of the configuration)")
    db.add_argument("--file", help="replay: dead-letter file (default: store.dead_letter_path)")
    db.set_defaults(func=cmd_db)

    sbx = sub.add_parser("sandbox", help="run the tool sandbox service (as root)")
    sbx.add_argument("--config", type=Path)
    sbx.set_defaults(func=cmd_sandbox)

    add_router_parser(sub)

    add_keys_parser(sub)
    add_control_parser(sub)
    add_bundle_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "prune" in argv:  # everything after it belongs to the pruning tool, --help included
        at = argv.index("prune")
        args = build_parser().parse_args([*argv[:at], "prune"])
        args.prune_args = argv[at + 1 :]
    else:
        args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
