"""``gearshift router``: train and evaluate the routing classifier, from labelled examples
or from the routed steps the store recorded (docs/router.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli.common import load_config, parse_when, reward_weights
from router.classifier import write_model

if TYPE_CHECKING:
    from router.offpolicy import Logged


def cmd_router_train(args: argparse.Namespace) -> int:
    if args.from_store == (args.examples is not None):
        raise SystemExit("gearshift router train: give an examples file or --from-store (one)")
    if args.from_store:
        if args.out is None:
            raise SystemExit(
                "gearshift router train: name the model file to write with --out (then point "
                "the classifier's `model` param at it; the shipped models stay as they are)"
            )
        return _train_from_store(args)
    from router.classifier import DEFAULT_MODEL
    from router.dataset import ExamplesError, read_examples
    from router.training import fit

    args.out = args.out or DEFAULT_MODEL

    try:
        examples = read_examples(args.examples)
        spec = fit(
            examples, bits=args.bits, margin=args.margin, quality_target=args.quality_target,
            meta={"examples_file": str(args.examples)},
        )  # fmt: skip
    except (ExamplesError, ValueError, OSError) as exc:
        raise SystemExit(f"gearshift router train: {exc}") from None
    write_model(spec, args.out)
    t = spec["training"]
    print(
        f"trained on {t['examples']} examples ({t['positives']} need the full tier); "
        f"cross-validated AUC {max(t['cv_auc'].values()):.3f} at l2={t['l2']}; "
        f"threshold {spec['threshold']:.3f}; wrote {args.out}"
    )
    return 0


def _read_log(args: argparse.Namespace) -> tuple[list[Logged], str]:
    """The routed steps the options select, oldest first, and the store URL (redacted)."""
    from tqdm import tqdm

    from gateway.export.load import Filter, count
    from gateway.export.routing import Counts, Options, logged_steps
    from gateway.store.database import StoreError, make_engine, prepare_schema

    settings = load_config(args.config)
    url = args.store or settings.store.url
    try:
        prepare_schema(url, migrate=False)
    except StoreError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    engine = make_engine(url)
    counts = Counts()
    flt = Filter(
        tenant=args.tenant, since=parse_when(args.since), until=parse_when(args.until, "--until")
    )
    options = Options(args.escalation_reward, not args.no_session_rewards)
    weights = reward_weights(settings, args.weights)
    with (
        engine.connect() as conn,
        tqdm(total=count(conn, flt), unit="session", desc="reading the store") as bar,
    ):
        logged = list(logged_steps(conn, flt, weights, options, counts, bar.update))
    engine.dispose()
    print(
        f"{counts.steps} steps in {counts.sessions} sessions: {len(logged)} routed "
        f"({counts.escalated} escalated, counted as the fast tier's), {counts.pinned} pinned "
        f"or unrouted, {counts.fallback} served by a fallback tier (left out)"
    )
    if len(logged) > args.max_steps:
        print(f"using the latest {args.max_steps} of them (--max-steps)")
        logged = logged[-args.max_steps :]
    if logged and all(s.propensity >= 1.0 for s in logged):
        print(
            "warning: no step was explored (every propensity is 1): the log only shows the "
            "tier the policy picked; set explore (e.g. 0.1) in the classifier's params"
        )
    return logged, _redact(url)


def _train_from_store(args: argparse.Namespace) -> int:
    from router.offpolicy import fit_logged
    from router.training import DEFAULT_L2_GRID, FOLDS

    logged, url = _read_log(args)
    meta = {"store": url, "tenant": args.tenant, "since": args.since, "until": args.until}
    grid = DEFAULT_L2_GRID if args.l2 is None else (args.l2,)
    fits = 1 + (len(grid) * FOLDS if len(grid) > 1 else 0)
    print(f"fitting on {len(logged)} steps ({fits} fits)", file=sys.stderr, flush=True)
    try:
        spec = fit_logged(
            logged, cost=args.cost, quality_target=args.quality_target, bits=args.bits,
            l2_grid=grid, meta=meta,
        )  # fmt: skip
    except ValueError as exc:
        raise SystemExit(f"gearshift router train: {exc}") from None
    write_model(spec, args.out)
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


def _eval_from_store(args: argparse.Namespace) -> int:
    import json

    from router.classifier import Classifier
    from router.offpolicy import check, evaluate

    logged, _ = _read_log(args)
    try:
        check(logged)
        model = Classifier.load(args.model)
        report = evaluate(model, logged, args.threshold)
    except ValueError as exc:
        raise SystemExit(f"gearshift router eval: {exc}") from None
    print(f"estimated mean reward per step ({report['steps']} logged steps, effective sample "
          f"size {report['effective_steps']}):")  # fmt: skip
    for name, label in (("logged", "the policy that logged them"), ("model", f"{args.model.name} at "
                        f"{report['threshold']:.3f} ({report['full_share']:.0%} full)"),
                        ("always_full", "always full"), ("always_fast", "always fast")):  # fmt: skip
        print(f"  {report[name]:8.4f}  {label}")
    print("share of steps on full -> estimated mean reward (threshold), for the budget policy:")
    for row in report["tradeoff"]:
        print(f"  {row['full_share']:5.0%}  {row['reward']:8.4f}  ({row['threshold']:.3f})")
    print(json.dumps(report))
    return 0


def cmd_router_eval(args: argparse.Namespace) -> int:
    import json

    if args.from_store == (args.examples is not None):
        raise SystemExit("gearshift router eval: give an examples file or --from-store (one)")
    if args.from_store:
        return _eval_from_store(args)

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


def _store_options(parser: argparse.ArgumentParser, what: str) -> None:
    store = parser.add_argument_group(
        "from the trajectory store",
        "routed steps and their rewards: one tier's outcome per step, weighted by its "
        "propensity (docs/router.md)",
    )
    store.add_argument("--from-store", action="store_true", help=what)
    store.add_argument("--config", type=Path)
    store.add_argument("--store", help="store URL (default: store.url of the configuration)")
    store.add_argument("--tenant", help="only this tenant's sessions (default: all)")
    store.add_argument("--since", help="only sessions started at or after this ISO date/time")
    store.add_argument("--until", help="only sessions started before this ISO date/time")
    store.add_argument("--weights", help="override reward weights: name=w[,name=w]")
    store.add_argument(
        "--escalation-reward", type=float, default=-1.0,
        help="reward of a fast-tier answer that was escalated",
    )  # fmt: skip
    store.add_argument(
        "--max-steps", type=int, default=20_000,
        help="the latest N routed steps (their request bodies are held in memory)",
    )  # fmt: skip
    store.add_argument(
        "--no-session-rewards", action="store_true",
        help="leave session-scope rewards (outcome, api_correctness) out of the steps' rewards",
    )  # fmt: skip


def add_parser(sub: Any) -> None:
    from router.classifier import DEFAULT_MODEL

    rt = sub.add_parser("router", help="train and evaluate the routing classifier")
    rt_sub = rt.add_subparsers(dest="router_command", required=True)
    train = rt_sub.add_parser(
        "train", help="fit the classifier on labelled examples (JSON lines; docs/router.md)"
    )
    train.add_argument(
        "examples", type=Path, nargs="?", help="JSONL: {id, group, body, full, fast}"
    )
    _store_options(train, "train on logged steps")
    train.add_argument(
        "--cost", type=float, default=0.0,
        help="--from-store: reward a full-tier step must earn over a fast one to be worth it",
    )  # fmt: skip
    train.add_argument(
        "--l2", type=float,
        help="--from-store: L2 strength; default: chosen from five by 5-fold cross-validation "
        "(26 fits)",
    )  # fmt: skip
    train.add_argument(
        "--out", type=Path,
        help="model file to write (examples: default router/assets/classifier.json; "
        "--from-store: required)",
    )  # fmt: skip
    train.add_argument("--bits", type=int, default=12, help="hashed n-gram buckets = 2**bits")
    train.add_argument(
        "--margin", type=float, default=0.25, help="label 1 when full - fast score > margin"
    )
    train.add_argument(
        "--quality-target", type=float, default=0.9,
        help="default threshold: recover this share of the full tier's quality gap",
    )  # fmt: skip
    train.set_defaults(func=cmd_router_train)
    ev = rt_sub.add_parser(
        "eval",
        help="AUC, APGR, CPT of a model and the baselines; --from-store: the reward it would "
        "have earned on logged steps",
    )
    ev.add_argument("examples", type=Path, nargs="?", help="JSONL: {id, group, body, full, fast}")
    _store_options(ev, "estimate the model's reward on logged steps")
    ev.add_argument(
        "--threshold",
        type=float,
        help="--from-store: route at this threshold (default: the model's)",
    )
    ev.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ev.add_argument("--margin", type=float, default=0.25)
    ev.set_defaults(func=cmd_router_eval)
