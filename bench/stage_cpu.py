"""Where the gateway process's request CPU goes, by stage of the request path.

    python -m bench.stage_cpu [--quick] [--rounds N] [--concurrency 16,64] [--body session|agent]

Runs the gateway as bench.gateway_overhead's ``gearshift_op`` (keys, routing, recording to
SQLite, sandbox on; the mock upstream; agents' session bodies, or with ``--body agent``
bench.agent_body's 39 KB tool loop as every request, non-streamed) under
bench.stage_sampler: a sampler on the process's CPU clock (``ITIMER_PROF`` every 5 ms, each
sample charged the main thread's CPU since the previous one). After a warm-up (start-up
excluded: the counts start there) each round runs one bench.gateway_overhead cell per
concurrency, waits for the recorder's writer (as a cell does), then takes the sampler's
stacks and sorts each into a stage by STAGES below: the innermost frame that matches a
row wins, except the event loop's rows, which count only where no other stage's frame is
outside them (a future's callbacks, a task's wake-up inside a stage stay the stage's).
A C call is charged to the Python frame that made it (``orjson.loads`` to parse/validate,
a socket write to whoever writes); the loop's own C time to the coroutine it resumes next.

Prints each round's shares of the main thread's CPU by stage, and the other threads' CPU
beside it; the last line is one JSON object: ``stages`` ({stage: [share per round, %]}),
``samples``, ``cpu_s`` (the main thread's CPU sampled) and ``other_threads_cpu_s``, one
value per round. ``--top N`` also prints each round's N functions by inclusive share (a
function's samples wherever it stands in the stack; ``functions`` in the JSON), for a
change inside one stage. ``GEARSHIFT_BENCH_CORES`` places the processes as for
bench.gateway_overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench import stage_sampler
from bench.agent_body import agent_body
from bench.gateway_overhead import cell_size, loadgen
from bench.procs import pinned, start, stop, wait_http
from bench.proxies import CLIENT_CORE, Target, free_port, sandbox_state, start_gearshift

ROUTE, AIOHTTP, PARSE = "route stage", "aiohttp + yarl + multidict", "parse/validate"
SERVER, RECORDER, DISPATCH = "HTTP server", "recorder hand-off", "dispatch, the gateway's own"
ENTRY, LOOP, FINISH, REST = "app entry", "event loop", "finish", "the rest"
# (stage, frame qualname regex or None, file substring or None): a frame matches a row when
# both match; the first matching row is the frame's. The rest's rows keep their frames out
# of the stages that call them (``answer`` inside ``_dispatch``).
STAGES: list[tuple[str, str | None, str | None]] = [
    (LOOP, None, "asyncio/"),
    (LOOP, None, "uvloop/"),
    (SERVER, None, "uvicorn/"),
    (ENTRY, None, "starlette/"),
    (ENTRY, None, "fastapi/"),
    (ENTRY, None, "gateway/cli/serve.py"),
    (ENTRY, None, "gateway/http/entry.py"),
    (REST, None, "gateway/auth.py"),
    (REST, r"^(Completions|CompletionPipeline)\.__call__$|^CompletionPipeline\._serve$", None),
    (PARSE, r"^Completions\.parse$", None),
    (PARSE, None, "gateway/http/body.py"),
    (PARSE, None, "gateway/http/session_validation.py"),
    (REST, r"admit", "gateway/access/"),
    (REST, r"\.known$", "gateway/routing/sessions.py"),  # the session's keys
    (ROUTE, r"^RouteStage\.__call__$", None),
    (REST, r"^ContextStage", None),
    (REST, r"^build_upstream_request$|^plan_step$|^start_span$", None),
    (DISPATCH, r"^CompletionPipeline\._dispatch$", None),
    (DISPATCH, None, "gateway/upstream/"),
    (AIOHTTP, None, "aiohttp/"),
    (AIOHTTP, None, "yarl/"),
    (AIOHTTP, None, "multidict/"),
    (REST, r"^(answer|_answered|headers|parsed_body)$", "gateway/pipeline/"),
    (REST, r"^CompletionPipeline\._escalate$", None),  # the fast tier's answer vs the tools
    (FINISH, r"^Finish\.__call__$", None),  # session state, metrics, calibration
    (RECORDER, r"^(Recorder\.record|step_record)$", None),
    (RECORDER, None, "gateway/recording/"),
]
ORDER = [ROUTE, AIOHTTP, PARSE, SERVER, RECORDER, DISPATCH, ENTRY, LOOP, FINISH, REST]
_RULES = [(stage, re.compile(q) if q else None, f) for stage, q, f in STAGES]
_FRAME = re.compile(r"^(.*) \(([^()]*)\)$")


def stage_of(stack: str) -> str:
    """The stage of one collapsed stack (``frame;frame;...``, outermost first)."""
    out = REST
    matched = False
    for frame in stack.split(";"):
        m = _FRAME.match(frame)
        if not m:
            continue
        qualname, path = m.groups()
        for stage, rx, part in _RULES:
            if (rx is None or rx.search(qualname)) and (part is None or part in path):
                if not (stage == LOOP and matched):  # the loop inside a stage is the stage's
                    out, matched = stage, True
                break
    return out


def read_dump(text: str) -> tuple[dict[str, Any], Counter[str]]:
    """A sampler dump's header and its microseconds by stage."""
    head, *lines = text.splitlines()
    by_stage: Counter[str] = Counter()
    for line in lines:
        if line:
            stack, us = line.rsplit(" ", 1)
            by_stage[stage_of(stack)] += int(us)
    return json.loads(head), by_stage


def functions(text: str, top: int) -> list[tuple[str, float]]:
    """A sampler dump's ``top`` functions by inclusive share of the CPU (every sample whose
    stack holds the function, once per sample), largest first: ``(qualname (file), %)``."""
    held: Counter[str] = Counter()
    total = 0
    for line in text.splitlines()[1:]:
        if line:
            stack, us = line.rsplit(" ", 1)
            total += int(us)
            for frame in set(stack.split(";")):
                held[frame] += int(us)
    return [(f, round(100 * us / max(total, 1), 1)) for f, us in held.most_common(top)]


def shares(by_stage: Counter[str]) -> dict[str, float]:
    """Each stage's percentage of the total, in ORDER."""
    total = sum(by_stage.values()) or 1
    return {stage: round(100 * by_stage[stage] / total, 1) for stage in ORDER}


def take(target: Target, out: Path, seq: int, timeout_s: float = 60) -> str:
    """Ask the sampler for what it counted since the last dump; waits for dump ``seq``.
    A request to /metrics wakes an idle loop, where the handler runs."""
    assert target.proc is not None and target.metrics is not None
    os.kill(target.proc.pid, stage_sampler.DUMP_SIGNAL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists():
            text = out.read_text()
            if text and json.loads(text.split("\n", 1)[0])["seq"] >= seq:
                return text
        with urllib.request.urlopen(target.metrics, timeout=30) as resp:
            resp.read()
        time.sleep(0.1)
    raise RuntimeError(f"the sampler wrote no dump {seq} in {timeout_s}s")


def run(
    tmp: Path, quick: bool, rounds: int, concurrency: tuple[int, ...], body: str = "session",
    top: int = 0,
) -> dict[str, Any]:  # fmt: skip
    mock_port, mock_log = free_port(), tmp / "mock.log"
    argv = [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)]
    mock = start(pinned(argv, CLIENT_CORE), mock_log)
    target: Target | None = None
    out = tmp / "stacks.txt"
    result: dict[str, Any] = {"stages": {s: [] for s in ORDER}, "samples": [], "cpu_s": [],
                              "other_threads_cpu_s": []}  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health", mock, mock_log)
        mock_url = f"http://127.0.0.1:{mock_port}"
        target = start_gearshift(tmp, mock_url, "gearshift_op", operator=True,
                                 wrap=("bench.stage_sampler", out))  # fmt: skip
        print(f"gearshift_op: sandbox {sandbox_state(target)}", flush=True)
        load = ["--sessions"]
        if body == "agent":
            agent = tmp / "agent.json"
            agent.write_bytes(orjson.dumps(agent_body()))
            load = ["--body", str(agent)]
        loadgen(target, "plain", 8, 24 if quick else 100, 30, load)  # warm-up
        take(target, out, 1)  # start-up and warm-up: not counted
        for r in range(1, rounds + 1):
            for c in concurrency:
                cell = loadgen(target, "plain", c, *cell_size("plain", c, quick), load)
                print(f"round {r} c={c}: {cell['completed']:.0f} req {cell['rps']:.1f} req/s",
                      flush=True)  # fmt: skip
            dump = take(target, out, r + 1)
            head, by_stage = read_dump(dump)
            got = shares(by_stage)
            for stage, share in got.items():
                result["stages"][stage].append(share)
            result["samples"].append(head["samples"])
            result["cpu_s"].append(round(head["main_cpu_s"], 3))
            result["other_threads_cpu_s"].append(round(head["other_cpu_s"], 3))
            other = 100 * head["other_cpu_s"] / max(head["main_cpu_s"], 1e-9)
            print(f"round {r}: {head['samples']} samples, main thread {head['main_cpu_s']:.2f} "
                  f"CPU-s, other threads {head['other_cpu_s']:.2f} CPU-s ({other:.1f} % of "
                  "the main thread's)", flush=True)  # fmt: skip
            for stage, share in got.items():
                print(f"  {stage:30s} {share:5.1f} %", flush=True)
            if top:
                held = functions(dump, top)
                result.setdefault("functions", []).append(held)
                print(f"round {r}: the {top} functions holding the most CPU (inclusive):")
                for frame, share in held:
                    print(f"  {share:5.1f} % {frame}", flush=True)
    finally:
        if target is not None and target.proc is not None:
            stop(target.proc)
        stop(mock)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seconds: one small round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument(
        "--concurrency", default="16,64", help="a round's cells, by concurrency (default 16,64)"
    )
    parser.add_argument(
        "--body", choices=("session", "agent"), default="session",
        help="what each request sends: growing agent sessions (default) or the agent body",
    )  # fmt: skip
    parser.add_argument(
        "--top", type=int, default=0,
        help="also print each round's N functions by inclusive share (JSON: functions)",
    )  # fmt: skip
    args = parser.parse_args()
    try:
        concurrency = tuple(int(c) for c in args.concurrency.split(","))
    except ValueError:
        parser.error(f"--concurrency: not a list of integers: {args.concurrency!r}")
    if args.rounds < 1 or not concurrency or min(concurrency) < 1:
        parser.error("--rounds and every --concurrency must be at least 1")
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-") as tmpdir:
        result = run(Path(tmpdir), args.quick, rounds, concurrency, args.body, max(args.top, 0))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
