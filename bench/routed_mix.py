"""The routed mix end to end: the default router in front of both tiers, against always-full
and always-fast, in tasks per CPU-second, time per task and quality.

    python -m bench.routed_mix [--per-family 2] [--concurrency 4]          # locked test split
    python -m bench.routed_mix --side dev --thresholds 0.3,0.4,0.476,0.55,0.65
    python -m bench.routed_mix --side dev --thresholds 0.3,0.4,0.476,0.55,0.65 \
        --outcomes-from bench/data/router_outcomes.jsonl                  # the sweep, no servers
    python -m bench.routed_mix --outcomes-from bench/data/router_outcomes.jsonl \
        --outcomes-from bench/data/router_outcomes_sampled.jsonl          # test replay, no servers
    python -m bench.routed_mix --threshold 0.4                             # at an operating point
    python -m bench.routed_mix --url http://127.0.0.1:8000 --quick         # a running stack
    python -m bench.routed_mix --agentic-sessions 12                       # the agent sessions

The run starts the embedded stack the README starts (``gearshift serve``: gateway, the two
tiers' vLLM servers, the store's writer on a temporary SQLite file; ``bench.stack``), or
uses a running one (``--url``). The same tasks — the first ``--per-family`` of every family
of one side of the locked split (``bench/data/router_split.json``; ``0``: all of them) — go
through the gateway three ways: **routed** (``model: auto``, the router decides; each task a
fresh session), **always-full** (``model: full``) and **always-fast** (``model: fast``),
greedy, ``--concurrency`` at a time. The arms take turns chunk by chunk (``--chunk`` tasks,
the order rotating), so the machine's noise hits all three, and each arm is charged the CPU
time the stack's whole process tree spent during its own chunks (``bench.mix_cpu``: the
gateway, both vLLM servers and their engine processes, the writer) and their wall time.

**full-x2** (on by default; ``--no-full-x2`` skips it, ``--quick`` and ``--url`` leave it
out): the stack binds the full tier's server to one core and the fast tier's to the other,
so always-full runs on one core while the routed arm uses two. The fourth arm is what an
operator would weigh against a fast tier: always-full (``model: full``) over two full
replicas, one per core (``bench.mix_replicas``: an extra full server on the fast tier's
core and a second gateway over both), taking its turns with the others and charged the CPU
of its own trees (that gateway and both full servers). Starting them adds a minute or two.

Per arm: ``tasks_per_cpu_s`` (completed tasks over those CPU seconds), ``tasks_per_s``,
``s_per_task`` mean and p50 (request to whole answer), mean ``quality`` (each task's own
checker, ``bench.router_scoring`` for exact answers), quality against always-full paired per
task with a 95% bootstrap interval (``bench.tier_quality``), and for the routed arm the share
of steps the router sent to each tier and how many fast answers the gateway escalated.

**Operating point.** The default router's knob is the classifier's threshold
(``bench.mix_replay``). ``--side dev --thresholds ...`` replays the default chain's
decisions on the dev tasks at each threshold against the two always-arms' measured scores and
names ``operating_point``: the threshold that sends the most steps to the fast tier while
keeping ≥ 0.95 of always-full's quality on dev. ``--outcomes-from FILE`` replays the same
sweep on the stored greedy outcomes of both tiers (``bench.router_outcomes``: every task of
the side, no servers). ``--threshold T`` then starts the stack with
that threshold (``GEARSHIFT_ROUTER__PARAMS``) for the test run; without it the model's own
threshold is used.

**Replay** (``--outcomes-from FILE`` without ``--thresholds``, on either side; repeat it for
the greedy and the sampled file): the default chain at its models' own thresholds over every
task of the side with stored outcomes, no servers (``bench.mix_stored``): quality against
always-full with its interval, fast share, and the **completion-token ratios** (the mix's and
the fast tier's over always-full's), per family and overall, beside always-fast, a random mix
at the same fast share and the group lookup. ``"mode": "replay"``; the CPU and time ratios
are None (stored seconds are no per-answer speed).

The last line is one JSON object: ``tasks_per_cpu_s_ratio`` and ``time_per_task_ratio``
(routed over always-full: above 1 is more tasks per CPU-second, resp. slower per task),
``quality_vs_full`` and ``quality_vs_full_ci_low``, ``fast_share``,
``time_per_task_ratio_vs_full_x2`` and ``tasks_per_cpu_s_ratio_vs_full_x2`` (routed over
full-x2; None without it), the same of always-fast under ``baseline_fast`` and of full-x2
under ``baseline_full_x2``, and every arm's figures under ``arms``. Progress goes to stderr.
``--quick``: three test tasks that need no sandbox, at most 24 tokens each, one chunk — a
smoke run of seconds with no thresholds.

``--agentic-sessions N``: instead of the split's tasks, the first N stored agent sessions
(``bench.mix_agentic``: each session's steps in order under one session id per arm; quality
is tool-call agreement with always-full).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench import mix_agentic
from bench.mix_arms import (
    ARMS,
    FULL_X2,
    Outcome,
    against_full,
    arm_figures,
    ask,
    ratio,
    scored,
    served_split,
)
from bench.mix_cpu import Cpu, StackCpu
from bench.mix_replay import agreement, decisions, operating_point, router_params, sweep
from bench.mix_replicas import full_x2
from bench.mix_stored import replay, threshold_sweep
from bench.router_split import load as load_split
from bench.router_tasks import Task
from bench.stack import serve
from bench.tier_agentic import DATA as AGENTIC_DATA
from bench.tier_prompts import NO_SANDBOX_SOURCES, per_family, split_tasks
from bench.tier_quality import paired, report


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pick_tasks(args: argparse.Namespace) -> list[Task]:
    sources = NO_SANDBOX_SOURCES if args.quick else None
    tasks = split_tasks(args.side, sources)
    if args.quick:
        return per_family(tasks, 1)[:3]
    return per_family(tasks, args.per_family) if args.per_family else tasks


def capped(task: Task, max_tokens: int | None) -> Task:
    if max_tokens is None:
        return task
    body = {**task.body, "max_tokens": min(int(task.body.get("max_tokens", max_tokens)), max_tokens)}  # fmt: skip
    return Task(task.id, task.source, task.category, task.difficulty, body, task.check)


def gateway_env(args: argparse.Namespace, folder: Path) -> dict[str, str]:
    """A gateway's store (recording on, a SQLite file in ``folder``) and router settings."""
    env = {
        "GEARSHIFT_STORE__URL": f"sqlite:///{folder}/trajectories.db",
        "GEARSHIFT_STORE__DEAD_LETTER_PATH": f"{folder}/dead-letter.jsonl",
    }
    if args.threshold is not None:
        policy, params = router_params(args.threshold)
        env |= {"GEARSHIFT_ROUTER__POLICY": policy, "GEARSHIFT_ROUTER__PARAMS": json.dumps(params)}  # fmt: skip
    return env


@contextlib.contextmanager
def stack_url(args: argparse.Namespace) -> Iterator[tuple[dict[str, str], dict[str, Cpu]]]:
    """The gateway's URL per arm and the CPU each arm is charged: a running gateway's
    (``--url``), or the embedded stack's started for this run, and with ``--full-x2`` the
    second gateway over two full replicas (``bench.mix_replicas``) for that arm."""
    if args.url:
        yield {arm: args.url.rstrip("/") for arm in ARMS}, {}
        return
    with tempfile.TemporaryDirectory(prefix="gearshift-mix-") as tmp:
        log("starting the stack (provisioning the fast tier if needed)")
        env = gateway_env(args, Path(tmp))
        with serve(Path(tmp) / "serve.log", env, timeout_s=args.startup_timeout) as stack:
            log(f"stack ready at {stack.url}")
            urls = dict.fromkeys(ARMS, stack.url)
            if not args.full_x2:
                yield urls, {}
                return
            (Path(tmp) / "x2").mkdir()
            log("starting a second full replica on the fast tier's core and its gateway")
            with full_x2(stack, gateway_env(args, Path(tmp) / "x2"), args.startup_timeout) as x2:
                log(f"full-x2 gateway ready at {x2.url}")
                yield urls | {FULL_X2: x2.url}, {FULL_X2: x2.cpu}


async def measure(
    urls: dict[str, str], tasks: list[Task], args: argparse.Namespace, cpus: dict[str, Cpu]
) -> dict[str, dict[str, Any]]:
    """Per arm (of ``urls``): its outcomes, CPU seconds and wall seconds, chunk by chunk in
    turns; each arm's requests go to its own URL and it is charged its own CPU."""
    run = uuid.uuid4().hex[:8]  # sessions of this run never continue an earlier run's
    arms = tuple(urls)
    tally: dict[str, dict[str, Any]] = {a: {"out": [], "cpu_s": 0.0, "wall_s": 0.0} for a in arms}  # fmt: skip
    gate = asyncio.Semaphore(args.concurrency)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(arm: str, task: Task) -> Outcome:
            async with gate:
                return await ask(session, urls[arm], arm, task, f"routed-mix-{run}-{arm}-{task.id}")

        warm = Task("warmup", "warmup", "warmup", None, {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})  # fmt: skip
        for arm in ("full", "fast", *arms[len(ARMS) :]):  # a first request's one-off costs
            await ask(session, urls[arm], arm, warm, f"routed-mix-{run}-warmup")
        chunk = args.chunk or 2 * args.concurrency
        for k, start in enumerate(range(0, len(tasks), chunk)):
            batch = tasks[start : start + chunk]
            order = [*arms[k % len(arms) :], *arms[: k % len(arms)]]
            for arm in order:
                c0, t0 = cpus[arm].seconds(), time.perf_counter()
                outs = await asyncio.gather(*(one(arm, t) for t in batch))
                wall, c1 = time.perf_counter() - t0, cpus[arm].seconds()
                t = tally[arm]
                t["out"] += outs
                t["wall_s"] += wall
                t["cpu_s"] = None if c0 is None or c1 is None or t["cpu_s"] is None else t["cpu_s"] + c1 - c0  # fmt: skip
            log(f"  {start + len(batch)}/{len(tasks)} tasks, each arm")
    for arm in arms:  # scored after the timed windows: HumanEval's checker runs a sandbox
        tally[arm]["scores"] = await scored(tasks, tally[arm]["out"])
    return tally


def summarize(tasks: list[Task], tally: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    arms = {a: arm_figures(t) for a, t in tally.items()}
    full_scores = tally["full"]["scores"]
    for arm in arms.keys() - {"full"}:
        arms[arm]["vs_full"] = report(paired(tasks, full_scores, tally[arm]["scores"]), args.boot)

    def versus(arm: str) -> dict[str, Any]:
        q = arms[arm]["vs_full"]
        return against_full(arms, arm, q["quality_retention"], (q["ci"] or [None])[0])

    routed = arms["routed"]
    return {
        **versus("routed"),
        "fast_share": routed["tier_share"]["fast"],
        # routed over always-full on two replicas, one per core: None when not measured
        "time_per_task_ratio_vs_full_x2": ratio(arms, "routed", "s_per_task_mean", FULL_X2),
        "tasks_per_cpu_s_ratio_vs_full_x2": ratio(arms, "routed", "tasks_per_cpu_s", FULL_X2),
        "baseline_fast": versus("fast"),
        "baseline_full_x2": versus(FULL_X2) if FULL_X2 in arms else None,
        "side": args.side,
        "tasks": len(tasks),
        "per_family": 1 if args.quick else args.per_family,
        "concurrency": args.concurrency,
        "threshold": args.threshold,
        "split_sha256": load_split().sha256,
        "arms": arms,
    }


def run_agentic(args: argparse.Namespace) -> dict[str, Any]:
    with stack_url(args) as (urls, _):
        url = urls["full"]
        cpu = StackCpu(urlsplit(url).port or 80)
        if not cpu.found:
            log(f"no gearshift serve process listens on {url} here: no CPU figures")
        return mix_agentic.run(args, url, cpu, log)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.agentic_sessions:
        return run_agentic(args)
    tasks = [capped(t, 24 if args.quick else None) for t in pick_tasks(args)]
    if not tasks:
        raise SystemExit("no tasks: --per-family must be 0 or more and the split must hold tasks")
    if args.outcomes_from:
        return threshold_sweep(args, tasks, log) if args.thresholds else replay(args, tasks, log)
    bodies = {t.id: {**t.body, "model": "auto", "temperature": 0, "seed": 0} for t in tasks}
    with stack_url(args) as (urls, cpus):
        log(f"{len(tasks)} {args.side} tasks, {len(urls)} arms, concurrency {args.concurrency}")
        cpu = StackCpu(urlsplit(urls["full"]).port or 80)
        if cpu.found:
            log(f"charging CPU of pid {cpu.root} and its {cpu.processes() - 1} descendants")
        else:
            log(f"no gearshift serve process listens on {urls['full']} here: no CPU figures")
        cpus = {**dict.fromkeys(ARMS, cpu), **cpus}
        if FULL_X2 in cpus:
            x2 = cpus[FULL_X2]
            log(f"{FULL_X2}: charging CPU of {x2.processes()} processes" if x2.found else f"{FULL_X2}: no CPU figures")  # fmt: skip
        tally = asyncio.run(measure(urls, tasks, args, cpus))
    result = summarize(tasks, tally, args)
    replayed = decisions(bodies, args.threshold)
    result["replay_agreement"] = agreement(replayed, served_split(tally["routed"]["out"]))
    if args.thresholds:
        sources = {t.id: t.source for t in tasks}
        values = [float(v) for v in args.thresholds.split(",")]
        rows = sweep(replayed, tally["full"]["scores"], tally["fast"]["scores"], sources, values, args.boot)  # fmt: skip
        result["sweep"], result["operating_point"] = rows, operating_point(rows, args.keep)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--url", help="a running gateway (its stack's CPU is read when it runs here)")
    p.add_argument("--side", choices=["test", "dev"], default="test")
    p.add_argument("--per-family", type=int,
                   help="first N tasks per family (0: all; default 2, all with --outcomes-from)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--chunk", type=int, default=0, help="tasks per turn (0: 2 x concurrency)")
    p.add_argument("--threshold", type=float, help="start the stack with this classifier threshold")  # fmt: skip
    p.add_argument("--thresholds", help="--side dev: replay these thresholds, name the operating point")  # fmt: skip
    p.add_argument("--outcomes-from", type=Path, action="append",
                   help="replay on stored outcomes of both tiers (bench.router_outcomes), no servers: "
                   "the default chain at its own thresholds, once per file (greedy, sampled); "
                   "with --thresholds (dev, one file) the sweep (bench.mix_stored)")  # fmt: skip
    p.add_argument("--keep", type=float, default=0.95, help="quality vs always-full to keep")
    p.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--startup-timeout", type=float, default=3600)
    p.add_argument("--agentic-sessions", type=int, default=0,
                   help="the first N stored agent sessions instead of the split's tasks")  # fmt: skip
    p.add_argument("--agentic", type=Path, default=AGENTIC_DATA,
                   help="stored tool-loop sessions (bench.agentic_sessions)")  # fmt: skip
    p.add_argument("--full-x2", action=argparse.BooleanOptionalAction, default=None,
                   help="the full-x2 arm: always-full over two full replicas, one per core "
                   "(default: on, except with --quick or --url)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="3 short test tasks: a smoke run")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick and args.outcomes_from:
        raise SystemExit("--quick shortens the requests, so no stored outcome matches: not with --outcomes-from")  # fmt: skip
    if args.quick:
        args.side, args.boot, args.thresholds = "test", min(args.boot, 200), None
    if args.per_family is None:
        args.per_family = 0 if args.outcomes_from else 2
    if args.per_family < 0 or args.concurrency < 1 or args.chunk < 0 or args.agentic_sessions < 0:
        raise SystemExit("--per-family >= 0, --concurrency >= 1, --chunk >= 0, --agentic-sessions >= 0")  # fmt: skip
    if args.thresholds and args.side != "dev":
        raise SystemExit("--thresholds: only on --side dev (nothing is tuned on the test split)")
    if args.outcomes_from and (args.url or args.threshold is not None or args.agentic_sessions):
        raise SystemExit("--outcomes-from replays stored outcomes at the models' own thresholds: "
                         "not with --url, --threshold or --agentic-sessions")  # fmt: skip
    if args.thresholds and args.outcomes_from and len(args.outcomes_from) != 1:
        raise SystemExit("--thresholds with --outcomes-from: one file (the sweep of one regime)")
    if args.threshold is not None and args.url:
        raise SystemExit("--threshold starts a stack with it: not with --url")
    if args.full_x2 and args.url:
        raise SystemExit("--full-x2 starts a full replica beside the stack: not with --url")
    if args.full_x2 and (args.agentic_sessions or args.outcomes_from):
        raise SystemExit("--full-x2: with the split's tasks on a stack started here")
    if args.full_x2 is None:
        args.full_x2 = not (args.quick or args.url or args.agentic_sessions or args.outcomes_from)
    result = run(args)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
