"""Routing decision time on one core, for sessions of 1 to 100 messages and up to 32k tokens.

    python -m bench.router_latency [--repeats 300] [--passes 3] [--policy session] [--quick]
    python -m bench.router_latency --sessions 20

Each shape is an agent session (a system prompt, user turns, assistant tool calls and tool
results, text spread evenly) of N messages and about T prompt tokens (4 characters a
token). For each shape the decision is timed ``repeats`` times, on one core (the process
is pinned to one CPU), after a warm-up, in each of ``passes`` passes over all shapes; a
shape's p99 is the median of its passes' p99s, so that a burst of load from a neighbour on
a shared machine, which lands in one pass, does not become the figure. What is timed is
what the gateway does per routed request: find the session's history as it does (by hash
chain, ``RouteSessions.keys``: a SHA-256 over the history up to the last answer), then
decide with its default policy (session -> rules -> the shipped classifier), sizing the
step from the previous step's exact prompt count (``router.tokens.anchored``). The
length-threshold baseline is timed the same way, session lookup included. Last line: one
JSON object with ``p99_ms`` (the worst shape's p99), ``p50_ms``, the ratio to the
baseline, and ``decision_digest``: a SHA-256 over every decision of the timed shapes and of
four agent sessions (``bench.agent_body``) routed step by step as the gateway routes them
(each step extends the last one's tally and is sized from its anchor), with their sizing:
two trees that route alike print the same digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from typing import Any

from bench.agent_body import session_bodies
from gateway.config import Settings
from gateway.routing.sessions import CHAIN, RouteSessions, opening_key
from gateway.store.chain import prefix_hash
from router import RouteRequest, build_policy
from router.tokens import DEFAULT, Anchor, counts, position
from router.types import SessionState, Tier

MESSAGES = (1, 10, 30, 100)
TOKENS = (100, 2_000, 8_000, 32_000)
FILLER = "the agent reads the file and checks 42 values against the schema before it answers; "


def session(messages: int, tokens: int) -> dict[str, Any]:
    chars = tokens * 4
    per = max(1, chars // messages)
    text = (FILLER * (per // len(FILLER) + 1))[:per]
    body: list[dict[str, Any]] = [{"role": "system", "content": text}] if messages > 1 else []
    i = 0
    while len(body) < messages:
        phase = i % 3
        if phase == 0:
            body.append({"role": "user", "content": text})
        elif phase == 1:
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}  # fmt: skip
            body.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            body.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": text})
        i += 1
    if body[-1]["role"] == "assistant":
        body[-1] = {"role": "user", "content": text}
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}  # fmt: skip
    return {"model": "auto", "messages": body, "tools": [tool], "max_tokens": 512}


def previous_step(body: dict[str, Any]) -> Anchor | None:
    """The session's step before this one, as the tier would have counted it: the router
    then sizes this step from that count (``router.tokens.anchored``), as in production."""
    before = {**body, "messages": body["messages"][:-1]}
    where = position(before)
    if where is None:
        return None
    return Anchor(*where, counts(before), DEFAULT.estimate(before))


def time_policy(policy: Any, body: dict[str, Any], repeats: int) -> list[float]:
    sessions = RouteSessions()  # the session's history, found as the gateway finds it
    state = SessionState(steps=3, last_tier=Tier.FULL, anchor=previous_step(body))
    prefix = prefix_hash(body["messages"])
    sessions.put("t", CHAIN + prefix if prefix else str(opening_key(body)), state)

    def decide() -> None:
        keys = sessions.keys("t", None, body)
        policy.decide(RouteRequest("chat", body, keys.key, sessions.get("t", keys.key)))

    for _ in range(20):  # warm-up
        decide()
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        decide()
        times.append((time.perf_counter_ns() - started) / 1e6)
    return times


def _digested(digest: Any, request: RouteRequest, decision: Any) -> None:
    analysis = decision.analysis or request.analysis
    features = sorted(decision.features.items())
    digest.update(repr((
        str(decision.tier), decision.reason, decision.policy, decision.propensity, features,
        decision.score, decision.threshold, analysis.counts, analysis.prompt_tokens,
        analysis.position[0] if analysis.position else None,
    )).encode())  # fmt: skip


def agent_steps(seeds: int) -> list[list[bytes]]:
    """``seeds`` agent sessions (``bench.agent_body``), each step as the client sends it."""
    return [[json.dumps({"model": "auto", **b}).encode() for b in session_bodies(seed)]
            for seed in range(seeds)]  # fmt: skip


def route_sessions(policy: Any, sessions: list[list[bytes]], digest: Any = None) -> float:
    """Route the sessions' steps, interleaved as concurrent agents send them, as the gateway
    does: each body parsed afresh, each step extending its session's last tally and sized
    from its anchor (the tier's count: the estimate, off by a little). Returns the CPU
    seconds the decisions took (the parse not counted); ``digest`` gets each decision."""
    states: list[SessionState] = [SessionState() for _ in sessions]
    tallies: list[Any] = [None for _ in sessions]
    cpu = 0.0
    for step in range(max(map(len, sessions))):
        for i, steps in enumerate(sessions):
            if step >= len(steps):
                continue
            body, state = json.loads(steps[step]), states[i]
            started = time.thread_time()
            request = RouteRequest("chat", body, f"s{i}", state, prior=tallies[i])
            decision = policy.decide(request)
            analysis = decision.analysis or request.analysis
            counted, tally, where = analysis.counts, analysis.tally, analysis.position
            estimate = analysis.prompt_tokens
            cpu += time.thread_time() - started
            if digest is not None:
                _digested(digest, request, decision)
            anchor = Anchor(*where, counted, estimate[0] + step % 5 - 2) if where else None
            failed = step % 6 == 5 and decision.tier is Tier.FAST
            tallies[i], states[i] = tally, SessionState(
                state.steps + 1, decision.tier, state.fast_failures + failed, 0,
                state.steps if failed else state.last_failure_step, anchor,
            )  # fmt: skip
    return cpu


def decision_digest(policy: Any, bodies: list[dict[str, Any]]) -> str:
    """A digest of ``policy``'s decisions on ``bodies`` and on agent sessions' steps."""
    digest = hashlib.sha256()
    for body in bodies:
        request = RouteRequest("chat", body, "s")
        _digested(digest, request, policy.decide(request))
    route_sessions(policy, agent_steps(4), digest)
    return digest.hexdigest()[:16]


def time_sessions(policy: Any, passes: int) -> None:
    """CPU a step of 16 agent sessions of 15 steps (``route_sessions``), per pass; the last
    line a JSON object with each pass's figure, their minimum and median."""
    sessions = agent_steps(16)
    steps = sum(map(len, sessions))
    route_sessions(policy, sessions)  # warm-up
    per_step = [route_sessions(policy, sessions) / steps * 1e6 for _ in range(passes)]
    print(json.dumps({
        "us_per_step_min": round(min(per_step), 1),
        "us_per_step_median": round(statistics.median(per_step), 1),
        "us_per_step_passes": [round(v, 1) for v in per_step], "steps": steps,
        "decision_digest": decision_digest(policy, []),
    }))  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=300, help="decisions per shape and pass")
    parser.add_argument("--passes", type=int, default=3, help="passes over all shapes")
    parser.add_argument(
        "--policy", default="default",
        help="policy to time; 'default': the gateway's default (session -> rules -> classifier)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="20 decisions per shape, one pass: a smoke run"
    )
    parser.add_argument(
        "--sessions", type=int, metavar="PASSES", default=0,
        help="instead: CPU a step of agent sessions routed as the gateway routes them "
        "(each step extends the last one's tally), over PASSES passes",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.passes = 20, 1
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if args.policy == "default":
        router = Settings().router
        policy = build_policy(router.policy, router.params)
    else:
        policy = build_policy(args.policy)
    if args.sessions:
        time_sessions(policy, args.sessions)
        return
    baseline = build_policy("length_threshold")
    shapes = [(n, tokens) for n in MESSAGES for tokens in TOKENS]
    bodies = {shape: session(*shape) for shape in shapes}
    times: dict[tuple[int, int], list[list[float]]] = {shape: [] for shape in shapes}
    base: dict[tuple[int, int], list[list[float]]] = {shape: [] for shape in shapes}
    for _ in range(args.passes):
        for shape in shapes:
            times[shape].append(time_policy(policy, bodies[shape], args.repeats))
            base[shape].append(time_policy(baseline, bodies[shape], args.repeats))
    rows = []
    for n, tokens in shapes:
        t, b = times[n, tokens], base[n, tokens]
        p99s = [round(pct(p, 0.99), 4) for p in t]
        row = {"messages": n, "tokens": tokens,
               "p50_ms": round(statistics.median(x for p in t for x in p), 4),
               "p99_ms": round(statistics.median(p99s), 4), "p99_ms_passes": p99s,
               "baseline_p99_ms": round(statistics.median(pct(p, 0.99) for p in b), 4)}  # fmt: skip
        rows.append(row)
        print(f"{n:4d} messages {tokens:6d} tokens: p50 {row['p50_ms']:.3f} ms  "
              f"p99 {row['p99_ms']:.3f} ms (passes {', '.join(f'{v:.3f}' for v in p99s)})  "
              f"(length threshold p99 {row['baseline_p99_ms']:.3f})", flush=True)  # fmt: skip
    worst = max(r["p99_ms"] for r in rows)
    worst_base = max(r["baseline_p99_ms"] for r in rows)
    print(json.dumps({
        "p99_ms": worst, "p50_ms": round(statistics.median(r["p50_ms"] for r in rows), 4),
        "baseline_p99_ms": worst_base, "ratio_p99_vs_length_threshold": round(worst / worst_base, 2),
        "worst_pass_p99_ms": max(max(r["p99_ms_passes"]) for r in rows),
        "policy": args.policy, "passes": args.passes,
        "decision_digest": decision_digest(policy, list(bodies.values())), "shapes": rows,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
