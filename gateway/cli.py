"""The ``gearshift`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.config import ConfigError, Settings, load_settings
from gateway.serve import run

log = logging.getLogger("gearshift")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _load(path: Path | None) -> Settings:
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


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    if args.port is not None:
        settings = settings.model_copy(update={"port": args.port})
    try:
        import uvloop

        return uvloop.run(run(settings))
    except ImportError:
        return asyncio.run(run(settings))


def cmd_provision(args: argparse.Namespace) -> int:
    from backends.provision import ProvisionError, PruneOptions, provision, provision_pruned

    settings = _load(args.config)
    e = settings.embedded
    try:
        path = provision(e.home, e.python)
        print(path)
        if e.fast_mode != "ngram":
            options = PruneOptions(e.prune_remove, e.prune_method, e.heal_steps)
            print(provision_pruned(e.home, e.python, path, options))
    except ProvisionError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from backends.provision import ProvisionError, run_pruning

    settings = _load(None)
    try:
        return run_pruning(settings.embedded.python, args.prune_args)
    except ProvisionError as exc:
        raise SystemExit(f"gearshift: {exc}") from None


def cmd_keys_new(args: argparse.Namespace) -> int:
    from gateway.auth import new_key

    key, digest = new_key()
    print(f"key (give it to the client, it is not stored): {key}")
    print("config entry:")
    print(f"  - {{name: {args.name}, tenant: {args.tenant}, sha256: '{digest}'}}")
    return 0


def _weights(settings: Settings, spec: str | None) -> dict[str, float]:
    from gateway.recording.rewards import DEFAULT_WEIGHTS

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


def cmd_export(args: argparse.Namespace) -> int:
    from gateway.export.formats import export
    from gateway.export.load import Filter
    from gateway.store.database import StoreError, make_engine, prepare_schema

    settings = _load(args.config)
    url = args.store or settings.store.url
    since = _since(args.since)
    try:
        prepare_schema(url, migrate=False)
    except StoreError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    engine = make_engine(url)
    flt = Filter(tenant=args.tenant, since=since, min_reward=args.min_reward)
    summary = export(engine, args.format, args.out, flt, _weights(settings, args.weights))
    engine.dispose()
    print(f"wrote {summary.rows} rows from {summary.sessions} sessions to {args.out}")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from gateway.store import database

    settings = _load(args.config)
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
    import uvicorn

    from sandbox.runtime.base import RuntimeUnavailable
    from sandbox.service import create_app

    config = _load(args.config).sandbox
    try:
        app = create_app(config)
    except RuntimeUnavailable as exc:
        raise SystemExit(f"gearshift sandbox: refusing to run code: {exc}") from None
    if config.token is None:
        print(f"sandbox token (set sandbox.token to keep it): {app.state.sandbox.token.decode()}")
    where = (
        {"uds": str(config.socket)} if config.socket else {"host": config.host, "port": config.port}
    )
    uvicorn.run(app, log_level=args.log_level, **where)
    return 0


def _since(value: str | None) -> Any:
    from datetime import UTC, datetime

    if not value:
        return None
    try:
        since = datetime.fromisoformat(value)
    except ValueError:
        raise SystemExit(f"gearshift: --since wants an ISO date, not {value!r}") from None
    return since if since.tzinfo else since.replace(tzinfo=UTC)


def _write_model(spec: dict[str, Any], out: Path) -> None:
    import json
    import os

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out)


def cmd_router_train(args: argparse.Namespace) -> int:
    if args.from_store == (args.examples is not None):
        raise SystemExit("gearshift router train: give an examples file or --from-store (one)")
    if args.from_store:
        return _train_from_store(args)
    from router.dataset import ExamplesError, read_examples
    from router.training import fit

    try:
        examples = read_examples(args.examples)
        spec = fit(
            examples, bits=args.bits, margin=args.margin, quality_target=args.quality_target,
            meta={"examples_file": str(args.examples)},
        )  # fmt: skip
    except (ExamplesError, ValueError, OSError) as exc:
        raise SystemExit(f"gearshift router train: {exc}") from None
    _write_model(spec, args.out)
    t = spec["training"]
    print(
        f"trained on {t['examples']} examples ({t['positives']} need the full tier); "
        f"cross-validated AUC {max(t['cv_auc'].values()):.3f} at l2={t['l2']}; "
        f"threshold {spec['threshold']:.3f}; wrote {args.out}"
    )
    return 0


def _train_from_store(args: argparse.Namespace) -> int:
    from gateway.export.load import Filter
    from gateway.export.routing import Counts, Options, logged_steps
    from gateway.store.database import StoreError, make_engine, prepare_schema
    from router.offpolicy import fit_logged
    from router.training import DEFAULT_L2_GRID

    settings = _load(args.config)
    url = args.store or settings.store.url
    try:
        prepare_schema(url, migrate=False)
    except StoreError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    engine = make_engine(url)
    counts = Counts()
    flt = Filter(tenant=args.tenant, since=_since(args.since))
    options = Options(args.escalation_reward, not args.no_session_rewards)
    with engine.connect() as conn:
        logged = list(logged_steps(conn, flt, _weights(settings, args.weights), options, counts))
    engine.dispose()
    print(
        f"{counts.steps} steps in {counts.sessions} sessions: {len(logged)} routed "
        f"({counts.escalated} escalated, counted as the fast tier's), {counts.pinned} pinned "
        f"or unrouted, {counts.fallback} served by a fallback tier (left out)"
    )
    if len(logged) > args.max_steps:
        print(f"training on the latest {args.max_steps} of them (--max-steps)")
        logged = logged[-args.max_steps :]
    if logged and all(s.propensity >= 1.0 for s in logged):
        print(
            "warning: no step was explored (every propensity is 1): the log only shows the "
            "tier the policy picked; set explore (e.g. 0.1) in the classifier's params"
        )
    meta = {"store": _redact(url), "tenant": args.tenant, "since": args.since}
    try:
        grid = DEFAULT_L2_GRID if args.l2 is None else (args.l2,)
        spec = fit_logged(
            logged, cost=args.cost, quality_target=args.quality_target, bits=args.bits,
            l2_grid=grid, meta=meta,
        )  # fmt: skip
    except ValueError as exc:
        raise SystemExit(f"gearshift router train: {exc}") from None
    _write_model(spec, args.out)
    t = spec["training"]
    ips = t["ips"]
    print(
        f"trained on {t['steps']} logged steps ({t['full_steps']} on the full tier, effective "
        f"sample size {t['effective_steps']}); estimated mean reward: always full "
        f"{ips['always_full']:.3f}, always fast {ips['always_fast']:.3f}"
        + (f", this model {ips['routed']:.3f}" if "routed" in ips else "")
        + f"; threshold {spec['threshold']:.3f}; wrote {args.out}"
    )
    return 0


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def cmd_router_eval(args: argparse.Namespace) -> int:
    import json

    from router.classifier import Classifier
    from router.dataset import ExamplesError, read_examples
    from router.report import best_baseline, compare

    try:
        examples = read_examples(args.examples)
        model = Classifier.load(args.model)
        report = compare(model, examples, margin=args.margin)
    except (ExamplesError, ValueError, OSError) as exc:
        raise SystemExit(f"gearshift router eval: {exc}") from None
    print(f"{'router':18} {'AUC':>6} {'APGR':>6} {'CPT50':>6} {'CPT80':>6}")
    for name in ("classifier", "always_full", "always_fast", "random", "length_threshold", "rules"):
        r = report[name]
        print(f"{name:18} {r['auc']:6.3f} {r['apgr']:6.3f} {r['cpt50']:6.3f} {r['cpt80']:6.3f}")
    at = report["at_threshold"]
    print(
        f"at threshold {at['threshold']:.3f}: {at['full_share']:.0%} of steps on full, "
        f"{at['pgr']:.0%} of the full tier's quality gap recovered"
    )
    base, value = best_baseline(report)
    print(json.dumps({"auc": report["classifier"]["auc"], "apgr": report["classifier"]["apgr"],
                      "apgr_best_baseline": value, "best_baseline": base, "report": report}))  # fmt: skip
    return 0


def _router_parser(sub: Any) -> None:
    from router.classifier import DEFAULT_MODEL

    rt = sub.add_parser("router", help="train and evaluate the routing classifier")
    rt_sub = rt.add_subparsers(dest="router_command", required=True)
    train = rt_sub.add_parser(
        "train", help="fit the classifier on labelled examples (JSON lines; docs/router.md)"
    )
    train.add_argument(
        "examples", type=Path, nargs="?", help="JSONL: {id, group, body, full, fast}"
    )
    store = train.add_argument_group(
        "from the trajectory store",
        "learn from routed steps and their rewards (one tier's outcome per step, weighted by "
        "its propensity; docs/router.md)",
    )
    store.add_argument("--from-store", action="store_true", help="train on logged steps")
    store.add_argument("--config", type=Path)
    store.add_argument("--store", help="store URL (default: store.url of the configuration)")
    store.add_argument("--tenant", help="only this tenant's sessions (default: all)")
    store.add_argument("--since", help="only sessions started at or after this ISO date/time")
    store.add_argument("--weights", help="override reward weights: name=w[,name=w]")
    store.add_argument(
        "--cost", type=float, default=0.0,
        help="reward a full-tier step must earn over a fast one to be worth it",
    )  # fmt: skip
    store.add_argument(
        "--escalation-reward", type=float, default=-1.0,
        help="reward of a fast-tier answer that was escalated",
    )  # fmt: skip
    store.add_argument(
        "--l2", type=float,
        help="L2 strength; default: chosen from five by 5-fold cross-validation (26 fits)",
    )  # fmt: skip
    store.add_argument(
        "--max-steps", type=int, default=20_000,
        help="train on the latest N routed steps (memory grows with N: about 0.1 GB per 1,000 "
        "at --bits 12)",
    )  # fmt: skip
    store.add_argument(
        "--no-session-rewards", action="store_true",
        help="leave session-scope rewards (outcome, api_correctness) out of the steps' rewards",
    )  # fmt: skip
    train.add_argument("--out", type=Path, default=DEFAULT_MODEL, help="model file to write")
    train.add_argument("--bits", type=int, default=12, help="hashed n-gram buckets = 2**bits")
    train.add_argument(
        "--margin", type=float, default=0.25, help="label 1 when full - fast score > margin"
    )
    train.add_argument(
        "--quality-target", type=float, default=0.9,
        help="default threshold: recover this share of the full tier's quality gap",
    )  # fmt: skip
    train.set_defaults(func=cmd_router_train)
    ev = rt_sub.add_parser("eval", help="AUC, APGR, CPT of a model and the baselines")
    ev.add_argument("examples", type=Path)
    ev.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ev.add_argument("--margin", type=float, default=0.25)
    ev.set_defaults(func=cmd_router_eval)


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
        "provision", help="build the embedded stack's models (default model, fast tier)"
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

    exp = sub.add_parser(
        "export",
        help="write recorded trajectories for a trainer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="formats:\n" + "\n".join(f"  {k:13} {f.help}" for k, f in FORMATS.items()),
    )
    exp.add_argument("--format", required=True, choices=sorted(FORMATS))
    exp.add_argument("--tenant", help="only this tenant's sessions (default: all)")
    exp.add_argument("--since", help="only sessions started at or after this ISO date/time")
    exp.add_argument("--min-reward", type=float, help="only sessions whose combined reward >= X")
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

    _router_parser(sub)

    keys = sub.add_parser("keys", help="API key helpers")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser("new", help="print a new key and its config entry")
    new.add_argument("--tenant", default="default")
    new.add_argument("--name", default="key-1")
    new.set_defaults(func=cmd_keys_new)
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
