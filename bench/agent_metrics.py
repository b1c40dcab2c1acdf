"""What the agent metrics' refresh costs the gateway as the store grows (#29).

Every ``METRICS_EVERY_S`` the gateway recomputes the five agent metrics per tenant and
agent over the last hour, and over the last day every ``REFRESH_TICKS["24h"]`` ticks
(``gateway.http.routes.agents``), inside its own process. Here stores of ``n`` and
``4n`` sessions of two steps each (an agent's prompt ids, 4,000 tokens, so the steps' rows
are as wide as the gateway writes them; every third step with a tool call) are written by
the recorder's writer, then for each grouping the query's CPU (best of three) is measured
against the baseline in the same run: counting the same sessions' steps on the steps index
(the least any per-session figure can cost).

Figures: CPU-ms per 1,000 sessions for each grouping, ``ratio_vs_count`` (query over
count, at ``4n``), ``growth_4x`` (the cost at ``4n`` over the cost at ``n``: ~4 when the
work grows with the sessions, ~16 when it grows with their square, as the routing-version
join once did), and ``core_share_at_4n``: the share of a core the exporter takes at the
default cadence when the store's last day holds ``4n`` sessions, a twenty-fourth of them
in the last hour.

    python -m bench.agent_metrics [--quick] [--sessions N]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.recording.writer import StepWriter
from gateway.store import agent_metrics
from gateway.store.database import make_engine, upgrade
from gateway.store.schema import sessions, steps

# the exporter's default cadence, seconds between refreshes of each window
# (gateway/http/routes/agents.py: METRICS_EVERY_S x REFRESH_TICKS; bench may not import
# the web layer, tests/bench/test_agent_metrics_bench.py keeps the two equal)
EVERY_S = {"1h": 30.0, "24h": 300.0}
PROMPT = list(range(1000, 5000))  # an agent's prompt: 4,000 token ids, 16 KB packed


def records(n: int) -> list[StepRecord]:
    out = []
    for i in range(n):
        for k in range(2):
            call = i % 3 == 0 and k == 0
            message: dict[str, Any] = {"role": "assistant", "content": None if call else "done"}
            if call:
                message["tool_calls"] = [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "run_shell", "arguments": "{}"},
                    }
                ]
            out.append(
                StepRecord(
                    step_ids=[uuid.uuid4().hex],
                    request_id=uuid.uuid4().hex,
                    tenant="acme",
                    api_key=f"agent-{i % 4}",
                    endpoint="chat",
                    request={"messages": [{"role": "user", "content": f"task {i}"}]},
                    external_session=f"s{i}",
                    task_id=None,
                    group_id=None,
                    created_at=time.time(),
                    status=200,
                    tier="fast" if (i + k) % 2 else "full",
                    routing_version=f"v{i % 2}",
                    prompt_token_ids=PROMPT,
                    choices=[ChoiceCapture(0, message, [1, 2, 3], [-0.1] * 3, "stop")],
                )
            )
    return out


def store(tmp: Path, n: int) -> Engine:
    url = f"sqlite:///{tmp}/store-{n}.db"
    upgrade(url)
    engine = make_engine(url)
    writer, batch = StepWriter([]), records(n)
    for at in range(0, len(batch), 256):
        with engine.begin() as conn:
            writer.write(conn, batch[at : at + 256])
    return engine


def best_ms(engine: Engine, fn, rounds: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    with engine.connect() as conn:
        for _ in range(rounds):
            started = time.process_time()
            fn(conn)
            best = min(best, time.process_time() - started)
    return best * 1000


def measure(engine: Engine) -> dict[str, float]:
    since = datetime.now(UTC) - timedelta(days=1)
    out: dict[str, float] = {
        g: best_ms(engine, lambda c, g=g: agent_metrics.compute(c, group_by=g, since=since))
        for g in agent_metrics.GROUPS
    }
    in_window = select(sessions.c.id).where(sessions.c.created_at >= since)
    count = select(func.count()).select_from(steps).where(steps.c.session_id.in_(in_window))
    out["count"] = best_ms(engine, lambda c: c.execute(count).scalar())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="250 and 1,000 sessions")
    parser.add_argument("--sessions", type=int, help="n (default 2,500; the larger store: 4n)")
    args = parser.parse_args()
    n = args.sessions or (250 if args.quick else 2500)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-metrics-") as tmpdir:
        for size in (n, 4 * n):
            started = time.monotonic()
            engine = store(Path(tmpdir), size)
            print(
                f"store of {size} sessions written in {time.monotonic() - started:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            figures[size] = measure(engine)
            engine.dispose()
            print(
                f"{size} sessions: "
                + ", ".join(f"{k} {v:.1f} ms" for k, v in figures[size].items()),
                flush=True,
            )
    small, large = figures[n], figures[4 * n]
    # a second's share: the hour's query (a 24th of the day's sessions) and the day's
    per_s = large["agent"] / 24 / EVERY_S["1h"] + large["agent"] / EVERY_S["24h"]
    result = {
        "sessions": [n, 4 * n],
        **{
            f"cpu_ms_per_1000_sessions_{g}": round(large[g] * 1000 / (4 * n), 2)
            for g in agent_metrics.GROUPS
        },
        "cpu_ms_per_1000_sessions_count": round(large["count"] * 1000 / (4 * n), 2),
        **{
            f"ratio_vs_count_{g}": round(large[g] / max(large["count"], 1e-3), 1)
            for g in agent_metrics.GROUPS
        },
        **{
            f"growth_4x_{g}": round(large[g] / max(small[g], 1e-3), 2) for g in agent_metrics.GROUPS
        },
        "core_share_at_4n": round(per_s / 1000, 5),
        "note": "growth_4x ~4: linear in the window's sessions; ~16: quadratic",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
