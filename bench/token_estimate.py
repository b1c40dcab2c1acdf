"""How closely the router's prompt-token estimate counts what the tier reads.

    python -m bench.token_estimate [--sessions 300] [--growing 200] [--multilingual 300] [--seed 0]
        [--tier-url URL] [--quick]

Requests: the router's evaluation tasks (``bench.router_tasks``: BFCL with its tools,
HumanEval, reasoning-gym, MT-Bench, trivia) and synthetic agent sessions (the standard
library's sources as tool results, calls with JSON arguments, up to 12 BFCL tools, system
prompts or none). The embedded stack starts and its full tier's ``/tokenize`` (vLLM: the
tier's own tokenizer and chat template) counts each request exactly. Compared, by relative
error per request:

* ``chars_div_4``: characters / 4 of the message text, the router's estimate until
  2026-12-01 (the baseline);
* ``default``: ``router.tokens.DEFAULT``, the shipped weights;
* ``startup_fit``: what the gateway fits at start-up (``gateway.routing.calibration``: 23
  probe conversations), on these requests it never saw; the gateway routes with it only
  when it counts its probes better than ``default`` does;
* ``refit``: least squares on half of the requests, checked on the other half — where
  ``DEFAULT``'s weights come from (they are printed, fitted on all of them; all but the
  weight of wide bytes, which these nearly all-ASCII requests cannot fit).

Two more sets, counted by the same ``/tokenize``:

* ``multilingual``: requests in eleven languages (``bench.multilingual``), where the weight
  of UTF-8 bytes beyond one a character (``DEFAULT.per_wide_byte``) is fitted with every
  other weight fixed (``wide_bytes``), against the estimate by characters alone;
* ``session_steps``: agent sessions replayed step by step (``growing_sessions``), every
  step after the first estimated alone and sized from the step before's exact count
  (``router.tokens.anchored``, what the gateway does within a session).

It also times ``DEFAULT.estimate`` on each request (one core, best of 5), the cost the
estimate adds to a routing decision. Last line: one JSON object with the median and
90th-percentile error of each, the ratio of the baseline's median error to the default's,
and the estimate's time (median, 99th percentile and worst, µs).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from bench import multilingual
from bench.router_tasks import all_tasks
from bench.stack import embedded_stack, free_port
from gateway.cli.embedded import FULL_MODEL_NAME
from gateway.routing.calibration import Calibration, calibrate, replica_tokenizer
from gateway.routing.refit import fit_weights
from router.tokens import DEFAULT, Anchor, Counts, TokenModel, anchored, counts, position


def _message_chars(body: Mapping[str, Any]) -> int:
    total = 0
    for m in body.get("messages") or ():
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
    return total


def agent_sessions(
    n: int, seed: int, tool_lists: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Synthetic agent sessions over the standard library's sources, code and docstrings
    (on the machine, and the same from one commit of this repository to the next)."""
    rng = random.Random(seed)
    stdlib = Path(json.__file__).resolve().parent.parent
    files = [p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:150]]
    bodies = []
    for _ in range(n):
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.7:
            msgs.append({"role": "system", "content": rng.choice(files)[: rng.randint(50, 3000)]})
        msgs.append({"role": "user", "content": rng.choice(files)[: rng.randint(20, 2000)]})
        for step in range(rng.randint(0, 8)):
            args = {"path": f"src/m{step}.py", "start": rng.randint(1, 900), "pattern": "def .*"}
            call = {"id": f"c{step}", "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps(args)}}  # fmt: skip
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            text = rng.choice(files)
            start = rng.randint(0, max(0, len(text) - 10))
            msgs.append({"role": "tool", "tool_call_id": f"c{step}",
                         "content": text[start : start + rng.randint(10, 6000)]})  # fmt: skip
            if rng.random() < 0.3:
                msgs.append(
                    {"role": "assistant", "content": rng.choice(files)[: rng.randint(10, 500)]}
                )
                msgs.append({"role": "user", "content": "ok, continue " * rng.randint(1, 5)})
        body: dict[str, Any] = {"messages": msgs}
        if rng.random() < 0.8:
            body["tools"] = rng.choice(tool_lists) * rng.randint(1, 4)
        bodies.append(body)
    return bodies


def _odd_text(rng: random.Random, size: int) -> str:
    """What tools return that the estimate reads badly: base64, a hex dump, CJK text."""
    kind = rng.randrange(3)
    if kind == 0:
        return base64.b64encode(rng.randbytes(size * 3 // 4)).decode()
    if kind == 1:
        rows = (
            f"{16 * i:08x}: " + " ".join(f"{b:02x}" for b in rng.randbytes(16))
            for i in range(max(1, size // 58))
        )
        return "\n".join(rows)
    return "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(max(1, size // 3)))


def growing_sessions(
    n: int, seed: int, tool_lists: list[list[dict[str, Any]]]
) -> list[tuple[bool, list[dict[str, Any]]]]:
    """Agent sessions step by step, as the tier receives them: every step resends the
    conversation so far plus the last tool call and its result (now and then an answer and
    a new user turn). Half the sessions read the standard library's sources, which the
    estimate reads well; half also read base64, hex dumps or CJK text (``_odd_text``).
    Returns (odd, [the body of each step])."""
    rng = random.Random(seed + 1)
    stdlib = Path(json.__file__).resolve().parent.parent
    files = [p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:150]]
    sessions = []
    for i in range(n):
        odd = i % 2 == 1
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.7:
            msgs.append({"role": "system", "content": rng.choice(files)[: rng.randint(50, 2000)]})
        msgs.append({"role": "user", "content": rng.choice(files)[: rng.randint(20, 1000)]})
        tools = rng.choice(tool_lists)
        steps = [{"messages": list(msgs), "tools": tools}]
        for step in range(rng.randint(2, 8)):
            args = {"path": f"data/f{step}.bin", "offset": rng.randint(0, 9999)}
            call = {"id": f"c{step}", "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps(args)}}  # fmt: skip
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            size = rng.randint(200, 4000)
            if odd and rng.random() < 0.6:
                result = _odd_text(rng, size)
            else:
                text = rng.choice(files)
                start = rng.randint(0, max(0, len(text) - 10))
                result = text[start : start + size]
            msgs.append({"role": "tool", "tool_call_id": f"c{step}", "content": result})
            if rng.random() < 0.3:
                msgs.append({"role": "assistant", "content": rng.choice(files)[:300]})
                msgs.append({"role": "user", "content": "ok, continue"})
            steps.append({"messages": list(msgs), "tools": tools})
        sessions.append((odd, steps))
    return sessions


def anchoring(
    sessions: list[tuple[bool, list[dict[str, Any]]]], truth: list[int]
) -> dict[str, dict[str, float]]:
    """Relative error of every step after a session's first, estimated alone and sized
    from the step before (``router.tokens.anchored``, with that step's exact count), for
    all sessions, the plain and the odd ones, and at each session's last step."""
    found: dict[str, tuple[list[float], list[float], list[int]]] = {}
    counted = iter(truth)
    for odd, steps in sessions:
        exact = [next(counted) for _ in steps]
        anchor = None
        for k, body in enumerate(steps):
            sizes = counts(body)
            used, was_anchored = anchored(DEFAULT, sizes, body, anchor)
            if k:
                assert was_anchored, "a growing session's step must be sized from its last"
                groups = ["all", "odd" if odd else "plain"]
                groups += ["last_step"] if k == len(steps) - 1 else []
                for group in groups:
                    raw, anch, true = found.setdefault(group, ([], [], []))
                    raw.append(DEFAULT.estimate_counts(sizes))
                    anch.append(used)
                    true.append(exact[k])
            where = position(body)
            assert where is not None
            anchor = Anchor(*where, sizes, exact[k])
    return {
        f"{group}_{name}": errors(values, true)
        for group, (raw, anch, true) in found.items()
        for name, values in (("estimate", raw), ("anchored", anch))
    }


WIDE = len(Counts().vector()) - 1  # the design row's wide-bytes column (the last)


def ascii_only(row: list[float]) -> list[float]:
    return [*row[:WIDE], 0.0]


def wide_bytes(bodies: list[dict[str, Any]], truth: list[int]) -> dict[str, Any]:
    """The weight of a wide byte, with every other weight ``DEFAULT``'s: least squares on
    relative error of what those leave over, fitted on half of ``bodies`` and checked on
    the other half, and fitted on all of them (what ``DEFAULT.per_wide_byte`` holds)."""

    def fit(idx: list[int]) -> float:
        num = den = 0.0
        for i in idx:
            c, w = counts(bodies[i]), 1.0 / truth[i]
            left = truth[i] - without.estimate_counts(c)
            num += w * w * c.wide * left
            den += w * w * c.wide * c.wide
        return max(0.0, num / den) if den else 0.0

    without = replace(DEFAULT, per_wide_byte=0.0)
    half = list(range(0, len(bodies), 2)), list(range(1, len(bodies), 2))
    held = replace(DEFAULT, per_wide_byte=fit(half[0]))
    rest = [truth[i] for i in half[1]]
    return {
        "without_wide_bytes": errors([without.estimate(b) for b in bodies], truth),
        "default": errors([DEFAULT.estimate(b) for b in bodies], truth),
        "fit_on_half_held_out": errors([held.estimate(bodies[i]) for i in half[1]], rest),
        "per_wide_byte": round(fit(list(range(len(bodies)))), 4),
    }


def estimate_cost(bodies: list[dict[str, Any]]) -> dict[str, float]:
    """Microseconds ``DEFAULT.estimate`` takes per request, best of 5 (median, p99, worst)."""
    if hasattr(os, "sched_setaffinity"):  # one core, as the router runs per request
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    times = []
    for body in bodies:
        best = min(_timed(body) for _ in range(5))
        times.append(best * 1e6)
    times.sort()
    return {"median_us": round(statistics.median(times), 1),
            "p99_us": round(times[int(0.99 * (len(times) - 1))], 1), "max_us": round(times[-1], 1)}  # fmt: skip


def _timed(body: dict[str, Any]) -> float:
    started = time.perf_counter()
    DEFAULT.estimate(body)
    return time.perf_counter() - started


def errors(estimates: list[float], truth: list[int]) -> dict[str, float]:
    rel = sorted(abs(e - t) / t for e, t in zip(estimates, truth, strict=True))
    return {
        "median": round(statistics.median(rel), 4),
        "p90": round(rel[int(0.9 * (len(rel) - 1))], 4),
        "max": round(rel[-1], 4),
    }


async def count_all(
    url: str, model: str, bodies: list[dict[str, Any]]
) -> tuple[list[int], Calibration]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tokenize = replica_tokenizer(session, url, model)
        calibration = await calibrate(tokenize, "full tier")
        truth = [await tokenize(b) for b in tqdm(bodies, desc="tokenize", unit="request")]
    return truth, calibration


def count(tier_url: str | None, bodies: list[dict[str, Any]]) -> tuple[list[int], Calibration]:
    """Exact counts from ``tier_url``'s ``/tokenize``, or from the full tier of an embedded
    stack started for them."""
    if tier_url:
        return asyncio.run(count_all(tier_url.rstrip("/"), FULL_MODEL_NAME, bodies))
    full_port = free_port()
    with embedded_stack(full_port=full_port):
        return asyncio.run(count_all(f"http://127.0.0.1:{full_port}", FULL_MODEL_NAME, bodies))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300, help="synthetic agent sessions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--growing", type=int, default=200, help="agent sessions measured step by step"
    )
    parser.add_argument(
        "--multilingual", type=int, default=300, help="requests in scripts beyond ASCII"
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="1%% of the evaluation tasks, 10 sessions, 4 step by step, 30 in other scripts: "
        "a smoke run",
    )  # fmt: skip
    parser.add_argument(
        "--tier-url", help="count with this running vLLM server's /tokenize instead of "
        "starting the embedded stack and counting with its full tier",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.growing, args.multilingual = 10, 4, 30
    return args


def main() -> None:
    args = parse_args()
    tasks = all_tasks(0.01 if args.quick else 1.0)
    bodies = [t.body for t in tasks]
    tool_lists = [b["tools"] for b in bodies if b.get("tools")]
    bodies += agent_sessions(args.sessions, args.seed, tool_lists)
    sessions = growing_sessions(args.growing, args.seed, tool_lists)
    session_steps = [body for _, steps in sessions for body in steps]
    foreign = multilingual.requests(args.multilingual, args.seed)
    print(
        f"{len(tasks)} evaluation requests and {args.sessions} agent sessions; "
        f"{args.growing} more sessions step by step ({len(session_steps)} steps); "
        f"{len(foreign)} requests in eleven languages",
        flush=True,
    )

    truth, calibration = count(args.tier_url, bodies + session_steps + foreign)
    truth, step_truth = truth[: len(bodies)], truth[len(bodies) :]
    step_truth, foreign_truth = step_truth[: len(session_steps)], step_truth[len(session_steps) :]
    scripts = wide_bytes(foreign, foreign_truth)
    in_sessions = anchoring(sessions, step_truth)

    cost = estimate_cost(bodies)
    # the other weights come from these requests, nearly all ASCII; the weight of wide
    # bytes from the multilingual ones (``wide_bytes``)
    rows = [ascii_only(counts(b).vector()) for b in bodies]
    half = list(range(0, len(bodies), 2)), list(range(1, len(bodies), 2))
    refit = TokenModel.from_weights(
        fit_weights([rows[i] for i in half[0]], [truth[i] for i in half[0]]), "refit"
    )
    everything = TokenModel.from_weights(fit_weights(rows, truth), "all")
    results = {
        "chars_div_4": errors([_message_chars(b) / 4 for b in bodies], truth),
        "default": errors([DEFAULT.estimate(b) for b in bodies], truth),
        "startup_fit": errors([calibration.fitted.estimate(b) for b in bodies], truth),
        "refit_held_out": errors(
            [refit.estimate(bodies[i]) for i in half[1]], [truth[i] for i in half[1]]
        ),
    }
    print(
        f"\n{'estimate':16s} {'median':>8s} {'p90':>8s} {'max':>8s}   (relative error, {len(bodies)} requests)"
    )
    for name, e in results.items():
        print(f"{name:16s} {e['median']:8.3f} {e['p90']:8.3f} {e['max']:8.3f}")
    weights = {k: round(v, 4) for k, v in everything.as_dict().items() if k != "source"}
    print(f"weights fitted on all of them (router.tokens.DEFAULT): {weights}")
    fitted = {k: round(v, 4) for k, v in calibration.fitted.as_dict().items() if k != "source"}
    print(
        f"start-up fit's weights: {fitted}; on its probes it was off by "
        f"{calibration.fitted_error:.1%} (left out in turn), the default by "
        f"{calibration.default_error:.1%}: the gateway routes with the "
        f"{'fitted' if calibration.uses_fit else 'default'} weights"
    )
    print(
        f"the probes' counts (gateway.routing.calibration.DEFAULT_FAMILY_COUNTS): "
        f"{calibration.probe_counts}"
    )
    print(
        f"\nsession steps after the first ({len(session_steps) - len(sessions)}): the "
        f"estimate alone against sized from the step before's exact count "
        f"(router.tokens.anchored)\n{'steps':24s} {'median':>8s} {'p90':>8s} {'max':>8s}"
    )
    for name, e in in_sessions.items():
        print(f"{name:24s} {e['median']:8.3f} {e['p90']:8.3f} {e['max']:8.3f}")
    print(f"\n{len(foreign)} requests in eleven languages (bench.multilingual):")
    for name in ("without_wide_bytes", "default", "fit_on_half_held_out"):
        e = scripts[name]
        print(f"{name:24s} {e['median']:8.3f} {e['p90']:8.3f} {e['max']:8.3f}")
    print(f"weight of a wide byte fitted on all of them: {scripts['per_wide_byte']} "
          f"(router.tokens.DEFAULT.per_wide_byte: {DEFAULT.per_wide_byte})")  # fmt: skip
    print(f"DEFAULT.estimate per request, one core: median {cost['median_us']} µs, "
          f"p99 {cost['p99_us']} µs, worst {cost['max_us']} µs")  # fmt: skip
    ratio = results["chars_div_4"]["median"] / max(results["default"]["median"], 1e-9)
    print(json.dumps({"requests": len(bodies), **results, "estimate_cost": cost,
                      "fitted_weights": weights,
                      "session_steps": in_sessions, "multilingual": scripts,
                      "startup_uses_fit": calibration.uses_fit,
                      "startup_default_family": calibration.default_family,
                      "ratio_median_error_chars_div_4_vs_default": round(ratio, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
