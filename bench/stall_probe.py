"""Where a gateway's slow requests go: runs ``gearshift`` with probes that log what stalls.

    python -m bench.stall_probe LOG -- serve --config FILE ...

runs ``gearshift serve --config FILE ...`` in this process and appends one JSON line to
LOG for each event over its threshold, stamped with the wall clock (``t``, the start) so
that it can be set beside a load generator's slowest requests (``bench.loadgen``'s
``slowest``):

* ``gc``: a collection of the garbage collector (generation, ms, objects collected);
* ``lag``: the event loop late to run a task that slept 2 ms (how late: a stretch of
  work that held the loop, whatever it was);
* ``call``: one of the request path's stages (parse, route, upstream body, finish, the
  recorder's hand-off) that took long itself;
* ``writer``: the recorder's writer process (a child of the gateway) busy on the CPU for
  most of a 20 ms window: with the gateway on the same core it takes the core from it;
* ``request``: every completion request, with where its time went (``bench.stall_tail``
  sets the slowest 1% at concurrency 1 beside the rest).

The probes cost CPU (the loop probe wakes 500 times a second): use the figures of a probed
run for where time goes, not for CPU per request. ``bench.gateway_overhead --probe`` uses it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

GC_MS = 2.0
LAG_MS = 3.0
CALL_MS = 3.0
TOTALS_S = 5.0
WRITER_BUSY = 0.6  # of a window's CPU
LAG_PERIOD_S = 0.002
WRITER_PERIOD_S = 0.02
# (module, attribute path) of the request path's stages; a name imported elsewhere with
# ``from m import f`` is patched where the caller looks it up
STAGES = [
    ("gateway.http.completions", "Completions.parse"),
    ("gateway.access.admission", "Admission.admit"),
    ("gateway.pipeline.route", "RouteStage.__call__"),
    ("gateway.pipeline.handler", "build_upstream_request"),
    ("gateway.pipeline.handler", "answer"),
    ("gateway.pipeline.finish", "Finish.__call__"),
    ("gateway.recording.recorder", "Recorder.record"),
    # the upstream call, and the whole pipeline: a stall in neither named stage above is
    # placed in one of these (the agent body's 40-50 ms at c=1, docs/benchmarks.md)
    ("gateway.upstream.dispatch", "Dispatcher.dispatch"),
    ("gateway.pipeline.handler", "CompletionPipeline._serve"),
    # off the loop, in threads: they hold the GIL while they compute
    ("gateway.routing.calibration", "refit_from_traffic"),
    ("gateway.routing.control", "ControlSync._refresh"),
]
# logged whatever their length: a short GIL hold still delays the loop (the switch interval)
THREAD_STAGES = {"refit_from_traffic", "ControlSync._refresh"}
# the garbage collector's wall time so far, for a request's share of it
GC_SPENT_MS = [0.0]


class Log:
    def __init__(self, out: TextIO) -> None:
        self.out, self.lock = out, threading.Lock()

    def event(self, kind: str, started: float, ms: float, **extra: Any) -> None:
        line = json.dumps({"kind": kind, "t": round(started, 4), "ms": round(ms, 2), **extra})
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()


def watch_gc(log: Log) -> None:
    """Each collection over GC_MS; and every TOTALS_S, a ``gc_totals`` line: collections,
    their CPU and the objects they freed so far, by generation (what is freed only by the
    collector is what the request path leaves in reference cycles)."""
    started: dict[str, float] = {}
    totals = {gen: [0, 0.0, 0] for gen in range(3)}  # collections, CPU-ms, collected
    last = [time.monotonic()]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["perf"], started["wall"] = time.perf_counter(), time.time()
            started["cpu"] = time.thread_time()
            return
        ms = (time.perf_counter() - started.get("perf", time.perf_counter())) * 1000
        cpu = _cpu_ms(started.get("cpu", time.thread_time()))
        gen = info["generation"]
        GC_SPENT_MS[0] += ms
        totals[gen][0] += 1
        totals[gen][1] += cpu
        totals[gen][2] += info["collected"]
        if ms >= GC_MS:
            log.event("gc", started["wall"], ms, gen=gen, collected=info["collected"], cpu_ms=cpu)
        if time.monotonic() - last[0] >= TOTALS_S:
            last[0] = time.monotonic()
            log.event("gc_totals", time.time(), 0.0, totals={g: t[:] for g, t in totals.items()})

    gc.callbacks.append(callback)


def census(log: Log) -> None:
    """On SIGUSR1: the types of the objects the collector tracks outside the frozen start-up
    heap, by generation (what requests left alive since start-up)."""
    import collections
    import signal

    def dump(signum: int, frame: Any) -> None:
        for gen in range(3):
            kinds = collections.Counter(type(o).__qualname__ for o in gc.get_objects(gen))
            log.event("census", time.time(), 0.0, gen=gen, objects=sum(kinds.values()),
                      top=kinds.most_common(25))  # fmt: skip

    signal.signal(signal.SIGUSR1, dump)


def _cpu_ms(since: float) -> float:
    """The thread's CPU since ``since`` (for an awaited call: with what ran meanwhile)."""
    return round((time.thread_time() - since) * 1000, 2)


def timed(
    log: Log, name: str, fn: Callable[..., Any], threshold_ms: float = CALL_MS
) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            wall, t0, c0 = time.time(), time.perf_counter(), time.thread_time()
            try:
                return await fn(*args, **kwargs)
            finally:
                if (ms := (time.perf_counter() - t0) * 1000) >= threshold_ms:
                    log.event("call", wall, ms, name=name, cpu_ms=_cpu_ms(c0))

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, t0, c0 = time.time(), time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            if (ms := (time.perf_counter() - t0) * 1000) >= threshold_ms:
                log.event("call", wall, ms, name=name, cpu_ms=_cpu_ms(c0))

    return wrapper


def time_stages(log: Log) -> None:
    for module_name, path in STAGES:
        owner: Any = importlib.import_module(module_name)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        threshold = 0.0 if path in THREAD_STAGES else CALL_MS
        setattr(owner, attr, timed(log, path.rsplit(".", 1)[-1] if not outer else path,
                                   getattr(owner, attr), threshold))  # fmt: skip


def _run_queue_s() -> float:
    """The calling thread's time spent runnable but waiting for a core, so far."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def loop_lag(log: Log) -> None:
    """A lag's ``cpu_ms``: the loop's thread's CPU meanwhile (its own work);
    ``process_cpu_ms``: all of the process's threads' (the difference: another thread of it
    holding the GIL); ``queued_ms``: the loop's thread runnable but waiting for a core (other
    processes); the rest of the lag the thread slept or was blocked (the GIL, a system call)."""
    while True:
        wall, t0, c0, p0 = time.time(), time.perf_counter(), time.thread_time(), time.process_time()
        q0 = _run_queue_s()
        await asyncio.sleep(LAG_PERIOD_S)
        late_ms = (time.perf_counter() - t0 - LAG_PERIOD_S) * 1000
        if late_ms >= LAG_MS:
            process_ms = round((time.process_time() - p0) * 1000, 2)
            queued_ms = round((_run_queue_s() - q0) * 1000, 2)
            log.event("lag", wall, late_ms, cpu_ms=_cpu_ms(c0), process_cpu_ms=process_ms,
                      queued_ms=queued_ms)  # fmt: skip


def watch_loop(log: Log) -> None:
    import uvicorn

    serve = uvicorn.Server.serve

    async def probed(self: uvicorn.Server, sockets: Any = None) -> None:
        probe = asyncio.get_running_loop().create_task(loop_lag(log))
        try:
            await serve(self, sockets)
        finally:
            probe.cancel()

    uvicorn.Server.serve = probed  # type: ignore[method-assign]


def _children_on_cpu_s(pids: list[int]) -> float:
    """The CPU time so far of the processes ``pids`` (nanosecond clock, unlike ``/stat``)."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def time_requests(log: Log) -> None:
    """A ``request`` line for every completion request: its wall ms, the loop thread's CPU
    (``cpu_ms``), its time runnable but waiting for a core (``queued_ms``), the other threads'
    CPU meanwhile (``threads_ms``: they hold the GIL), the collector's wall ms (``gc_ms``),
    the child processes' CPU (``children_ms``: the recorder's writer, the sandbox), the body's
    bytes and whether the answer streamed. Whatever is left the loop thread spent blocked:
    on the upstream, the client, or the GIL."""
    from gateway.http.entry import COMPLETION_PATHS, GatewayEntry

    call = GatewayEntry.__call__
    kids: list[list[int]] = [children()]

    async def probed(self: GatewayEntry, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in COMPLETION_PATHS:
            await call(self, scope, receive, send)
            return
        streamed = [False]

        async def watched(message: Any) -> None:
            if message["type"] == "http.response.start":
                streamed[0] = any(v.startswith(b"text/event-stream") for _, v in
                                  message.get("headers", []))  # fmt: skip
            await send(message)

        size = next((int(v) for k, v in scope["headers"] if k == b"content-length"), 0)
        wall, t0, c0, p0 = time.time(), time.perf_counter(), time.thread_time(), time.process_time()
        q0, g0, k0 = _run_queue_s(), GC_SPENT_MS[0], _children_on_cpu_s(kids[0])
        try:
            await call(self, scope, receive, watched)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            cpu = (time.thread_time() - c0) * 1000
            log.event("request", wall, ms, bytes=size, stream=streamed[0], cpu_ms=round(cpu, 3),
                      queued_ms=round((_run_queue_s() - q0) * 1000, 3),
                      threads_ms=round((time.process_time() - p0) * 1000 - cpu, 3),
                      gc_ms=round(GC_SPENT_MS[0] - g0, 3),
                      children_ms=round((_children_on_cpu_s(kids[0]) - k0) * 1000, 3))  # fmt: skip
            kids[0] = children()

    GatewayEntry.__call__ = probed  # type: ignore[method-assign]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int | None = None) -> list[int]:
    """The child processes of ``pid`` (this process by default)."""
    pid = pid or os.getpid()
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def watch_writer(log: Log) -> None:
    """The CPU of the gateway's child processes (the writer, the sandbox), window by window."""

    def run() -> None:
        last: dict[int, float] = {}
        while True:
            wall = time.time()
            time.sleep(WRITER_PERIOD_S)
            for pid in children():
                try:
                    cpu = _cpu_s(pid)
                except (OSError, IndexError, ValueError):
                    continue
                used = cpu - last.get(pid, cpu)
                last[pid] = cpu
                if used >= WRITER_BUSY * WRITER_PERIOD_S:
                    log.event("writer", wall, used * 1000, pid=pid)

    threading.Thread(target=run, name="stall-probe-writer", daemon=True).start()


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def during(events: list[dict[str, Any]], start: float, ms: float) -> list[dict[str, Any]]:
    """The events whose span overlaps the request's [start, start + ms]."""
    end = start + ms / 1000
    return [e for e in events if e["t"] < end and e["t"] + e["ms"] / 1000 > start]


def _describe(e: dict[str, Any]) -> str:
    name = f"({e['name']})" if "name" in e else f"(gen {e['gen']})" if "gen" in e else ""
    cpu = f", {e['cpu_ms']:.1f} on CPU" if "cpu_ms" in e else ""
    if "process_cpu_ms" in e:
        cpu += f" ({e['process_cpu_ms']:.1f} all threads, {e.get('queued_ms', 0):.1f} queued)"
    return f"{e['kind']}{name} {e['ms']:.1f} ms{cpu}"


def report(path: Path, cells: dict[str, dict[str, dict[int, dict[str, Any]]]]) -> dict[str, Any]:
    """Print each concurrency-1 cell's slowest requests beside the events during them;
    returns, by kind, how many events and the longest, and how many of those slowest
    requests had one during them."""
    events = read(path)
    out: dict[str, Any] = {"events": {}, "slowest_with": {}}
    totals = [e for e in events if e["kind"] == "gc_totals"]
    from bench import stall_tail  # it reads this module's names

    out["tail"] = stall_tail.tail(events)
    stall_tail.show(out["tail"])
    events = [e for e in events if e["kind"] not in ("gc_totals", "census", "request")]
    if totals:
        out["gc_totals"] = totals[-1]["totals"]  # [collections, CPU-ms, freed] by generation
    for e in events:
        kind = e["kind"] if e["kind"] != "call" else f"call:{e['name']}"
        count, longest = out["events"].get(kind, (0, 0.0))
        out["events"][kind] = (count + 1, max(longest, e["ms"]))
    for body, modes in cells.items():
        for mode, by_c in modes.items():
            print(f"probe: gearshift_op {body} {mode} c=1, slowest requests:")
            for ms, start, messages in by_c[1].get("slowest", []):
                seen = during(events, start, ms)
                what = ", ".join(_describe(e) for e in seen)
                print(f"  {ms:7.2f} ms ({messages} messages): {what or 'nothing over thresholds'}")
                for kind in {e["kind"] for e in seen}:
                    out["slowest_with"][kind] = out["slowest_with"].get(kind, 0) + 1
    return out


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    log = Log(open(sys.argv[1], "a", buffering=1))  # noqa: SIM115 - open while the process lives
    log.event("probe", time.time(), 0.0, pid=os.getpid())  # it started
    watch_gc(log)
    time_stages(log)
    time_requests(log)
    watch_loop(log)
    watch_writer(log)
    census(log)
    from gateway.cli.main import main as gearshift

    sys.argv = ["gearshift", *sys.argv[3:]]
    gearshift()


if __name__ == "__main__":
    main()
