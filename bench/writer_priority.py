"""The recorder's writer at idle priority against niceness 10, on the gateway's core (#29).

Two operator gateways (``bench.proxies.start_gearshift``: API keys, router, sandbox,
recording to SQLite), both pinned to the proxy core with their writers: ``idle``, the
default (``store.writer_idle: true``: the writer at ``SCHED_IDLE`` while it is served),
and ``nice`` (``writer_idle: false``: the writer at niceness 10, as before). Each round
sends every kind of cell to both, in alternating order, so the machine's drift falls on
both alike: concurrency 1 (non-streamed; what the user of a quiet gateway waits for, and
the p99 the issue's target is about) for the chat body (2 messages) and the agent body
(30 messages, 39 KB), and concurrency 64 with the agent body (the writer's share of a
saturated core: CPU a request and requests/s until the recorder has written everything;
there the idle writer starves and is brought back to niceness 10 for a cool-down, counted
in ``idle_writer_rescues``).
The bare mock's p99 at concurrency 1 is measured first, in the same run, and subtracted
(``added_p99_ms``, as ``bench.gateway_overhead`` does).

    python -m bench.writer_priority [--quick] [--rounds N] [--requests N]

Last line: one JSON object with the medians over rounds and the ratios idle / nice.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import side_by_side
from bench.proxies import Target, metric_sum, start_gearshift

ARMS = {"idle": "", "nice": "writer_idle: false"}


def starved(target: Target) -> float:
    """How often the gateway's recorder brought its starved writer back from idle
    priority (``gearshift_recorder_writer_starved_total``)."""
    assert target.metrics is not None
    return metric_sum(target.metrics, ("gearshift_recorder_writer_starved_total",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _, rounds, cells = side_by_side.parse(parser)
    rescues: list[float] = []

    def starter(options: str) -> side_by_side.Starter:
        return lambda tmp, mock_url: start_gearshift(
            tmp, mock_url, f"gearshift_{tmp.name}", operator=True, store_options=options
        )

    with tempfile.TemporaryDirectory(prefix="gearshift-bench-writer-") as tmpdir:
        results, upstream = side_by_side.run(
            Path(tmpdir), {arm: starter(o) for arm, o in ARMS.items()}, rounds, cells,
            after=lambda gateways: rescues.append(starved(gateways["idle"])),
        )  # fmt: skip
    summary = side_by_side.summarize(results, upstream, "idle", "nice")
    summary.update(rounds=rounds, requests=cells["chat_c1"][1], idle_writer_rescues=rescues[0])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
