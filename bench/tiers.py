"""The fast tier against the full tier, as a user gets them: time per answer and requests/s,
and quality on the locked test split, paired per task.

    python -m bench.tiers [--url URL] [--quick]
    python -m bench.tiers --levers pruned-ngram,full-suffix,int4-ngram [--side dev]
    python -m bench.tiers --quality-from bench/data/router_outcomes.jsonl

**Speed** (``bench.tier_speed``): the same greedy chat requests go to every arm in turns
(request by request at concurrency 1, four at a time at concurrency 4, the order rotating),
after one unmeasured warm-up request each. Two workloads: ``tasks`` — the first
``--speed-per-family`` tasks of every family of the locked test split — and ``repetitive`` —
``--repetitive`` agent-like prompts whose answers repeat the prompt (``bench.tier_prompts``).
A third, ``agentic``, replays the steps of stored multi-step tool-loop sessions
(``--agentic``, ``bench/data/agentic_sessions.jsonl`` from ``bench.agentic_sessions``; the
first ``--agentic-sessions``, all by default) and scores each forced tool step by whether the
arm's call (name and parsed arguments) is the full tier's (``bench.tier_agentic``).
Per arm: seconds per answer, requests/s, mean answer length, tokens/s; against the full
tier: ``answer_speedup_c1`` (full's seconds per answer over the arm's), ``rps_speedup_c4``,
``length_ratio`` (the arm's answer length over full's) and, last and least,
``tok_s_speedup``.

**Quality** (``bench.tier_quality``): tasks of one side of the locked split (``--side``,
``test`` by default; ``dev`` is what a setting is chosen on) — every task, or the first
``--quality-per-family`` of each family — answered by each arm and scored by the task's own
checker (exact answers normalised, never substring containment); ``quality_retention`` =
the arm's summed score over the full tier's on the same tasks, with a paired bootstrap 95%
interval, overall and per source. Greedy; ``--sampled`` adds four answers per task at
temperature 0.7 (scored by their mean). ``--quality-from FILE`` reads stored outcomes of the
gateway's two tiers (``bench.router_outcomes``) instead of asking.

**Arms.** Without ``--url`` or ``--levers`` the run starts the embedded stack
(``gearshift serve``; ``--embedded prune_remove=6`` and the like set its ``embedded``
settings) and measures its ``full`` and ``fast`` models through the gateway; ``--url``
measures a running gateway the same way. ``--levers`` starts one vLLM server per candidate fast tier (``bench.tier_levers``: ``pruned-ngram`` is today's fast tier,
``full-suffix`` the full model with suffix decoding, ``int4-ngram`` int4 weights, ...) plus
the plain full model, all pinned to one core, and measures them side by side.

``--quick``: 4 task prompts and 4 repetitive prompts at most 16 tokens, 3 quality tasks (no
sandbox) at most 48: a smoke run with no thresholds, whose scores only prove the plumbing. The last line is one
JSON object: the headline arm's (``--headline``; the fast tier, or the first lever)
``answer_speedup_c1``, ``rps_speedup_c4``, ``length_ratio_c1``, ``quality_retention``,
``quality_retention_ci_low``, ``agentic_step_speedup_c1``, ``agentic_rps_speedup_c4``,
``agentic_length_ratio_c1``, ``agentic_toolcall_agreement`` (and its ``_ci_low``), and
everything measured under ``arms``. ``--quick`` replays the first step (a forced tool call)
of two agentic sessions, at most 16 tokens each, at concurrency 1 only and without a warm-up
(so ``agentic_rps_speedup_c4`` is null).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.router_outcomes import header
from bench.router_tasks import Task
from bench.stack import embedded_stack
from bench.tier_agentic import DATA as AGENTIC_DATA
from bench.tier_agentic import Step, load, replay
from bench.tier_prompts import NO_SANDBOX_SOURCES, per_family, repetitive_bodies, split_tasks
from bench.tier_quality import Pairs, from_outcomes, paired, report, scores
from bench.tier_speed import Arm, compare, measure

FULL, FAST = "full", "fast"
# short exact-answer questions: the ``trivia`` tasks of bench.router_tasks
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What gas do plants absorb from the air for photosynthesis?", "carbon dioxide"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the chemical symbol for water?", "H2O"),
    ("How many days are there in a week?", "seven"),
    ("What is the freezing point of water in degrees Celsius?", "0"),
    ("What is 2 + 2?", "4"),
    ("What colour is the sky on a clear day?", "blue"),
    ("What is the opposite of hot?", "cold"),
    ("Which animal is known as the king of the jungle?", "lion"),
    ("What is the tallest mountain in the world?", "Everest"),
    ("In which country are the pyramids of Giza?", "Egypt"),
]


def served_build(url: str) -> dict[str, Any]:
    """Which weights a vLLM server at ``url`` serves: its model folder (the ``root`` of its
    ``/v1/models``), the first 12 hex digits of the SHA-256 of its safetensors, and the
    perplexities of its pruning report: two builds of the same settings differ
    (docs/fast-tier.md), so a figure names the build it was measured on."""
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
        root = Path(json.load(resp)["data"][0]["root"])
    digest = hashlib.sha256()
    for weights in sorted(root.glob("*.safetensors")):
        with weights.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    report_file = root / "gearshift-prune.json"
    perplexity = json.loads(report_file.read_text()).get("perplexity") if report_file.exists() else None  # fmt: skip
    return {"model_dir": str(root), "weights_sha256": digest.hexdigest()[:12], "perplexity": perplexity}  # fmt: skip


def _capped(task: Task, max_tokens: int | None) -> dict[str, Any]:
    body = dict(task.body)
    if max_tokens is not None:
        body["max_tokens"] = min(int(body.get("max_tokens", max_tokens)), max_tokens)
    return body


def speed_workloads(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    sources = NO_SANDBOX_SOURCES if args.quick else None
    tasks = per_family(split_tasks("test", sources), args.speed_per_family)
    limit = 4 if args.quick else args.speed_max
    if limit and len(tasks) > limit:  # evenly spaced, so the families stay mixed
        tasks = [tasks[i * len(tasks) // limit] for i in range(limit)]
    cap = 16 if args.quick else None
    return {
        "tasks": [_capped(t, cap) for t in tasks],
        "repetitive": repetitive_bodies(
            args.repetitive, max_tokens=16 if args.quick else args.repetitive_tokens
        ),
    }


def agentic_steps(args: argparse.Namespace) -> list[Step]:
    if args.agentic_sessions == 0 or not args.agentic.exists():
        return []
    steps = load(args.agentic, args.agentic_sessions, 16 if args.quick else None)
    if args.quick:  # a smoke run: each session's first step, a forced call on the shortest prompt
        return [s for s in steps if s.step == 0]
    return steps


def agentic(args: argparse.Namespace, arms: Sequence[Arm], result: dict[str, Any]) -> None:
    """The agentic workload's speed and tool-call agreement, into ``result["arms"]``."""
    steps = agentic_steps(args)
    if not steps:
        return
    began = time.perf_counter()
    # --quick: concurrency 1 only, no warm-up (the servers answered the other workloads)
    conc = [1] if args.quick else [int(c) for c in args.concurrency.split(",")]
    warmup = not (args.no_warmup or args.quick)
    got = asyncio.run(replay(arms, steps, conc, warmup, args.progress, args.boot))
    print(f"  speed agentic: {len(steps)} steps in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
    for arm in arms:
        entry = result["arms"].setdefault(arm.name, {})
        entry.setdefault("speed", {})["agentic"] = got[arm.name]["speed"]
        if "agreement" in got[arm.name]:
            entry["agentic_toolcall"] = got[arm.name]["agreement"]
    print(json.dumps({"workload": "agentic", **got}), flush=True)


def quality_tasks(args: argparse.Namespace, side: str) -> list[Task]:
    sources = NO_SANDBOX_SOURCES if args.quick else None
    tasks = split_tasks(side, sources)
    if args.quick:  # a smoke run: answers capped, so the scores only prove the plumbing
        return [dataclasses.replace(t, body=_capped(t, 48)) for t in per_family(tasks, 1)[:3]]
    return per_family(tasks, args.quality_per_family) if args.quality_per_family else tasks


async def quality(
    arms: Sequence[Arm], tasks: Sequence[Task], sampled: bool, boot: int
) -> dict[str, dict[str, Any]]:
    """Per arm (the first is the full tier) and regime: ``report`` of the paired scores."""
    out: dict[str, dict[str, Any]] = {a.name: {} for a in arms[1:]}
    for regime, samples in (("greedy", 1), *((("sampled", 4),) if sampled else ())):
        got = {}
        for arm in arms:
            began = time.perf_counter()
            got[arm.name] = await scores(arm, tasks, samples=samples)
            print(f"  quality {regime} {arm.name}: {len(tasks)} tasks in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
        for arm in arms[1:]:
            out[arm.name][regime] = report(paired(tasks, got[arms[0].name], got[arm.name]), boot)
    return out


@contextlib.contextmanager
def arms_for(args: argparse.Namespace) -> Iterator[list[Arm]]:
    """The full tier first, then the candidates."""
    if args.levers:
        from bench.tier_levers import serving

        levers = [lv for lv in args.levers.split(",") if lv != FULL]
        with serving([FULL, *levers], core=args.core, log_dir=args.log_dir) as arms:
            yield arms
    elif args.arm:
        named = [item.partition("=") for item in args.arm]
        if any(not url for _, _, url in named) or named[0][0] != FULL:
            raise SystemExit("--arm NAME=URL, the first one named full")
        yield [Arm(name, url.rstrip("/"), name) for name, _, url in named]
    elif args.url:
        url = args.url.rstrip("/")
        yield [Arm(FULL, url, FULL), Arm(FAST, url, FAST)]
    else:
        env = {}
        for item in args.embedded:
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--embedded {item!r}: KEY=VALUE")
            env[f"GEARSHIFT_EMBEDDED__{key.upper()}"] = value
        with embedded_stack(env, label="[embedded] ") as url:
            yield [Arm(FULL, url, FULL), Arm(FAST, url, FAST)]


def headline(result: dict[str, Any], name: str) -> dict[str, Any]:
    arm = result["arms"].get(name, {})
    speed = arm.get("speed", {}).get("tasks", {})
    quality = arm.get("quality", {})
    greedy = quality.get("greedy") or quality.get("sampled") or {}
    ci = greedy.get("ci") or [None, None]
    steps = arm.get("speed", {}).get("agentic", {})
    calls = arm.get("agentic_toolcall", {})
    return {
        "headline": name,
        "answer_speedup_c1": speed.get("answer_speedup_c1"),
        "rps_speedup_c4": speed.get("rps_speedup_c4"),
        "length_ratio_c1": speed.get("length_ratio_c1"),
        "quality_retention": greedy.get("quality_retention"),
        "quality_retention_ci_low": ci[0],
        "quality_side": result["quality_side"],
        "quality_tasks": greedy.get("tasks"),
        "agentic_step_speedup_c1": steps.get("answer_speedup_c1"),
        "agentic_rps_speedup_c4": steps.get("rps_speedup_c4"),
        "agentic_length_ratio_c1": steps.get("length_ratio_c1"),
        "agentic_toolcall_agreement": calls.get("toolcall_agreement"),
        "agentic_toolcall_agreement_ci_low": (calls.get("ci") or [None])[0],
    }


def stored_quality(args: argparse.Namespace) -> dict[str, Any]:
    """Quality only, from stored outcomes of the gateway's two tiers (no speed, no servers)."""
    result: dict[str, Any] = {"arms": {FAST: {}}, "quality_side": args.side.split(",")[-1]}
    for side in args.side.split(","):
        pairs: Pairs = from_outcomes(args.quality_from, quality_tasks(args, side))
        key = "quality" if side == result["quality_side"] else f"quality_{side}"
        regime = "sampled" if header(args.quality_from).get("samples", 1) > 1 else "greedy"
        result["arms"][FAST][key] = {regime: report(pairs, args.boot), "from": str(args.quality_from)}  # fmt: skip
    return {**result, **headline(result, FAST)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quality_from:
        return stored_quality(args)
    workloads = speed_workloads(args)
    sides = args.side.split(",")
    result: dict[str, Any] = {"arms": {}, "quality_side": sides[-1]}
    with arms_for(args) as arms:
        ref = arms[0].name
        for name, bodies in workloads.items():
            if not bodies:
                continue
            began = time.perf_counter()
            conc = [int(c) for c in args.concurrency.split(",")]
            figures = asyncio.run(
                measure(arms, bodies, conc, warmup=not args.no_warmup, progress=args.progress)
            )
            ratios = compare(figures, ref)
            print(f"  speed {name}: {len(bodies)} prompts in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
            for arm in arms:
                entry = result["arms"].setdefault(arm.name, {"speed": {}})
                entry["speed"][name] = {**figures[arm.name], **ratios[arm.name]}
            print(json.dumps({"workload": name, **{a.name: result["arms"][a.name]["speed"][name] for a in arms}}), flush=True)  # fmt: skip
        agentic(args, arms, result)
        for side in [] if args.no_quality else sides:  # the last is the headline's
            q_tasks = quality_tasks(args, side)
            key = "quality" if side == sides[-1] else f"quality_{side}"
            if q_tasks:
                got = asyncio.run(quality(arms, q_tasks, args.sampled, args.boot))
                for name, q in got.items():
                    result["arms"].setdefault(name, {})[key] = q
        if not (args.levers or args.arm):
            with contextlib.suppress(Exception):  # a gateway does not answer vLLM's root
                result["fast_build"] = served_build(arms[1].url)
    result.update(headline(result, args.headline or arms[1].name))
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--url", help="a running gateway: measure its full and fast models")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=URL",
                   help="a running vLLM server serving model NAME; the first is full")  # fmt: skip
    p.add_argument("--levers", help="comma-separated candidate fast tiers (bench.tier_levers)")
    p.add_argument("--embedded", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the started stack, e.g. prune_remove=6 (GEARSHIFT_EMBEDDED__*)")  # fmt: skip
    p.add_argument("--headline", help="the arm the last line's figures are of")
    p.add_argument("--core", default="1", help="--levers: the core every server is pinned to")
    p.add_argument("--log-dir", type=Path, help="--levers: keep the servers' logs here")
    p.add_argument("--side", choices=["test", "dev", "dev,test"], default="test",
                   help="quality on this side of the locked split (dev,test: both, test last)")  # fmt: skip
    p.add_argument("--quality-per-family", type=int, default=0,
                   help="quality on the first N tasks of each family (0: all of the side)")  # fmt: skip
    p.add_argument("--quality-from", type=Path,
                   help="quality only, from stored outcomes of the two tiers (bench.router_outcomes)")  # fmt: skip
    p.add_argument("--sampled", action="store_true", help="also 4 samples at temperature 0.7")
    p.add_argument("--speed-per-family", type=int, default=1)
    p.add_argument("--speed-max", type=int, default=0, help="at most N task prompts (0: all)")
    p.add_argument("--repetitive", type=int, default=6, help="agent-like repetitive prompts")
    p.add_argument("--repetitive-tokens", type=int, default=384, help="their max_tokens")
    p.add_argument("--agentic", type=Path, default=AGENTIC_DATA,
                   help="stored tool-loop sessions (bench.agentic_sessions)")  # fmt: skip
    p.add_argument("--agentic-sessions", type=int,
                   help="replay the first N sessions (0: none; default: all)")  # fmt: skip
    p.add_argument("--concurrency", default="1,4", help="speed at these concurrencies")
    p.add_argument("--no-warmup", action="store_true", help="servers already warm")
    p.add_argument("--no-quality", action="store_true", help="speed only")
    p.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--quick", action="store_true", help="a smoke run of seconds")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.repetitive, args.boot = min(args.repetitive, 4), min(args.boot, 200)
        args.agentic_sessions = (
            2 if args.agentic_sessions is None else min(args.agentic_sessions, 2)
        )
    result = run(args)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
