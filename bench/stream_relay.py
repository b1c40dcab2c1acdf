"""CPU of the streamed path's own work on each event, in process: what a recorded stream's
events go through between the upstream's reads and the client's writes (``split_events``,
the relay's ``EventFilter``, recording's ``StreamCapture``, then the assembled choices).

The stream is bench.mock_upstream's answer to a recorded request of an agent session's
last step: 20 content chunks with token ids and log-probabilities, a first chunk carrying
9,000 prompt token ids (about 44 KB, arriving in three reads), the usage chunk, ``[DONE]``.
The baseline measured in the same run is the obvious relay that reads every event: one
``orjson`` parse and one serialization of each (the prompt's ids included). ``--baseline DIR`` also runs the same
modules from another checkout (``git worktree add DIR <commit>``), alternating with this
tree, and checks that the client's bytes are the same.

    python -m bench.stream_relay [--quick] [--baseline DIR]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import orjson

from bench.mock_upstream import _event

PROMPT_IDS = 9000
CHUNKS = 20
Impl = tuple[ModuleType, ModuleType, ModuleType]  # capture, relay_filter, sse


def stream_reads() -> list[bytes]:
    model, capture = b"mock-full", (True, True)
    evs = [_event(model, {"role": "assistant", "content": ""}, capture=capture, prompt=PROMPT_IDS)]
    evs += [
        _event(model, {"content": f" tok{i}"}, "stop" if i == CHUNKS - 1 else None, capture, i)
        for i in range(CHUNKS)
    ]
    counts = {"prompt_tokens": PROMPT_IDS, "completion_tokens": CHUNKS,
              "total_tokens": PROMPT_IDS + CHUNKS}  # fmt: skip
    usage = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1,
             "model": "mock-full", "choices": [], "usage": counts}  # fmt: skip
    evs += [b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]
    first, third = evs[0], len(evs[0]) // 3
    return [first[:third], first[third : 2 * third], first[2 * third :], *evs[1:]]


def load(root: Path | None) -> Impl:
    """The three modules, from ``root`` (another checkout) or this tree."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("gateway", "kvplugin")]:
        del sys.modules[name]
    if root is not None:
        sys.path.insert(0, str(root))
    try:
        return (
            importlib.import_module("gateway.recording.capture"),
            importlib.import_module("gateway.upstream.relay_filter"),
            importlib.import_module("gateway.upstream.sse"),
        )
    finally:
        if root is not None:
            sys.path.remove(str(root))


def relay(impl: Impl, reads: list[bytes]) -> bytes:
    capture, relay_filter, sse = impl
    cap = capture.StreamCapture("chat", capture.prepare("chat", {"stream": True}))
    events = relay_filter.EventFilter(strip_usage=True, rewrite=cap.on_event)
    buf, out = b"", []
    for read in reads:
        found, buf = sse.split_events(buf + read)
        if found:
            out.append(events(found))
    cap.choices()
    return b"".join(out)


def parse_each(reads: list[bytes]) -> None:
    for ev in b"".join(reads).split(b"\n\n")[:-2]:
        orjson.dumps(orjson.loads(ev[5:]))


def cpu_us(work: Callable[[], object], n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        work()
    return (time.process_time() - started) * 1e6 / n


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests per round")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with")
    args = parser.parse_args()
    n, rounds = (50, 2) if args.quick else (1000, 6)
    reads = stream_reads()
    impls = {"this": load(None)}
    if args.baseline is not None:
        impls["baseline"] = load(args.baseline)
        if relay(impls["baseline"], reads) != relay(impls["this"], reads):
            sys.exit("the client's bytes differ between the two trees")
    runs: dict[str, list[float]] = {name: [] for name in [*impls, "parse_each"]}
    for r in range(rounds):
        for name in impls if r % 2 == 0 else reversed(impls):
            runs[name].append(cpu_us(functools.partial(relay, impls[name], reads), n))
        runs["parse_each"].append(cpu_us(lambda: parse_each(reads), n))
    for name, values in runs.items():
        print(f"{name:10s} CPU-us per request: " + " / ".join(f"{v:.0f}" for v in values))
    best = {name: min(values) for name, values in runs.items()}
    summary: dict[str, object] = {
        "cpu_us_per_request": round(best["this"], 1),
        "parse_each_cpu_us_per_request": round(best["parse_each"], 1),
        "ratio_vs_parse_each": round(best["this"] / best["parse_each"], 2),
        "events": CHUNKS + 3,
    }
    if "baseline" in best:
        summary["baseline_cpu_us_per_request"] = round(best["baseline"], 1)
        summary["ratio_vs_baseline"] = round(best["this"] / best["baseline"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
