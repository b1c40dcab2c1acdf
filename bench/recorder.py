"""Recording cost: gateway throughput with recording on and off, and raw store write rates.

Part 1, in one run: two gateways (``store.enabled`` true, SQLite; and false)
take turns on core 0 in front of the mock upstream (bench.mock_upstream, which
returns token ids and logprobs like vLLM when asked); the load generator and
the mock share core 1. Measured twice:

- ``saturated``: the mock answers at once and the gateway's core is the
  bottleneck, so every CPU-microsecond of capture and writing shows;
- ``engine_bound``: the mock takes ``--latency-ms`` per answer, as a real engine
  does, with enough concurrency to keep the gateway busy.

Part 2: raw ``StepWriter`` commits (batches of 256 agent steps with token ids,
logprobs, a tool call and reward rows) into SQLite and into a throwaway
PostgreSQL server, when one can be started.

Part 3: the writer on agent sessions (14 growing steps of bench.agent_body each, many
sessions at once), with prompt ids stored by reference to the previous step
(``agent_writer_cpu_ms_per_step``, ``agent_prompt_kib_per_step``) and stored whole as
before (``..._whole``), alternated in one run.

Part 4 (``bench.writer_chain``): the writer on named agent sessions of 10, 30 and 60 steps,
hashing each step's whole history against hashing what the step adds
(``named_sessions``, ``writer_chain_ratio_60_steps``).

    python -m bench.recorder [--quick] [--sessions-only] [--chain-only] [--writer-ab] [--latency-ms 50]
                             [--plot FILE]

The last line printed is one JSON object. ``throughput_ratio_recording_on`` is the
engine-bound non-streamed ratio (32 clients, 50 ms per answer: at most 640
requests/s, which a gateway core serves with room to spare, as in production
where the engine is the bottleneck); the saturated ratios and the CPU-ms per
request with and without recording say what recording costs when the gateway's
own core is the limit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import func, select

from bench.gateway_overhead import CLIENT_CORE, GEARSHIFT_CORE, Target, free_port, loadgen
from bench.procs import pinned, process_cpu_seconds, start, stop, wait_http
from bench.writer_chain import chain_runs


def start_gateway(tmp: Path, name: str, mock_url: str, record: bool) -> Target:
    port = free_port()
    config = tmp / f"{name}.yaml"
    # The writer process gets the client's core: the gateway's own core is what is measured.
    store = (
        f"{{enabled: true, url: 'sqlite:///{tmp}/{name}.db', writer_cpus: [{CLIENT_CORE}]}}"
        if record
        else "{enabled: false}"
    )
    config.write_text(
        f"port: {port}\nstore: {store}\nsandbox: {{enabled: false}}\n"
        f"tiers:\n  full: {{model: mock-full, replicas: ['{mock_url}']}}\n"
    )
    gearshift = Path(sys.executable).with_name("gearshift")
    log = tmp / f"{name}.log"
    argv = [str(gearshift), "--log-level", "warning", "serve", "--config", str(config)]
    proc = start(pinned(argv, GEARSHIFT_CORE), log)
    wait_http(f"http://127.0.0.1:{port}/ready", proc, log)
    return Target(name, f"http://127.0.0.1:{port}/v1/chat/completions", "auto", proc, "unused", log)


def start_mock(tmp: Path, latency_ms: float) -> tuple[str, object]:
    port = free_port()
    log = tmp / f"mock-{latency_ms:g}.log"
    argv = [
        sys.executable,
        "-m",
        "bench.mock_upstream",
        "--port",
        str(port),
        "--latency-ms",
        str(latency_ms),
    ]
    proc = start(pinned(argv, CLIENT_CORE), log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc, log)
    return url, proc


def throughput(
    tmp: Path, latency_ms: float, concurrency: int, quick: bool
) -> dict[str, dict[str, float]]:
    mock_url, mock = start_mock(tmp, latency_ms)
    out: dict[str, dict[str, float]] = {}
    try:
        targets = [
            start_gateway(tmp, f"{n}-{latency_ms:g}", mock_url, n == "on") for n in ("off", "on")
        ]
        try:
            n = 600 if quick else 3000
            for t in targets:  # warm-up
                loadgen(t, "plain", 8, 100, 20)
            for mode in ("plain", "stream"):
                runs: dict[str, list[float]] = {"off": [], "on": []}
                cpu: dict[str, list[float]] = {"off": [], "on": []}
                gw: dict[str, list[float]] = {"off": [], "on": []}
                for _ in range(1 if quick else 3):  # alternate to spread the machine's noise
                    for t in targets:
                        assert t.proc is not None
                        own0 = process_cpu_seconds(t.proc.pid)
                        r = loadgen(t, mode, concurrency, n if mode == "plain" else n // 3, 40)
                        own = (
                            (process_cpu_seconds(t.proc.pid) - own0) * 1000 / max(1, r["completed"])
                        )
                        gw[t.name.split("-")[0]].append(own)
                        runs[t.name.split("-")[0]].append(r["rps"])
                        cpu[t.name.split("-")[0]].append(r["cpu_ms_per_req"])
                best = {k: max(v) for k, v in runs.items()}
                cpu_ms = {k: min(v) for k, v in cpu.items()}
                out[mode] = {
                    "rps_off": best["off"], "rps_on": best["on"], "ratio": best["on"] / best["off"],
                    "cpu_ms_off": cpu_ms["off"], "cpu_ms_on": cpu_ms["on"],
                    "gateway_cpu_ms_off": min(gw["off"]), "gateway_cpu_ms_on": min(gw["on"]),
                }  # fmt: skip
                print(
                    f"latency {latency_ms:5g} ms c={concurrency:<3d} {mode:6s} off {best['off']:8.1f} req/s "
                    f"on {best['on']:8.1f} req/s ratio {best['on'] / best['off']:.3f} "
                    f"cpu ms/req off {cpu_ms['off']:.3f} on {cpu_ms['on']:.3f} "
                    f"(gateway process alone: on {min(gw['on']):.3f})",
                    flush=True,
                )
        finally:
            for t in targets:
                if t.proc is not None:
                    stop(t.proc)
    finally:
        stop(mock)  # type: ignore[arg-type]
    return out


def store_rate(url: str, batches: int) -> float:
    from gateway.recording.records import ChoiceCapture, StepRecord
    from gateway.recording.writer import StepWriter
    from gateway.store.database import make_engine, upgrade

    upgrade(url)
    engine = make_engine(url)
    writer = StepWriter()
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "search", "arguments": '{"q": "x"}'},
    }
    messages = [
        {"role": "system", "content": "You are an agent. " * 20},
        {"role": "user", "content": "Find the answer. " * 10},
    ]

    def rec(i: int) -> StepRecord:
        return StepRecord(
            step_ids=[uuid.uuid4().hex], request_id=uuid.uuid4().hex, tenant="bench", api_key="k",
            endpoint="chat", request={"model": "auto", "messages": [*messages, {"role": "user", "content": str(i)}]},
            external_session=f"s{i % 64}", task_id=None, group_id=None, created_at=time.time(),
            status=200, tier="fast", prompt_token_ids=list(range(300)),
            choices=[ChoiceCapture(0, {"role": "assistant", "content": None, "tool_calls": [call]},
                                   list(range(60)), [-0.5] * 60, "tool_calls")],
            completion_tokens=60,
        )  # fmt: skip

    total = 0
    started = time.perf_counter()
    for b in range(batches):
        records = [rec(b * 256 + i) for i in range(256)]
        with engine.begin() as conn:
            writer.write(conn, records)
        total += len(records)
    rate = total / (time.perf_counter() - started)
    engine.dispose()
    return rate


def agent_sessions(url: str, sessions: int, prompt_cache_mb: float) -> dict[str, float]:
    """Part 3: the writer on agent sessions as they arrive. Each session is 14 steps of the
    agent body (bench.agent_body) growing by one tool call and its result a step, with the
    prompt ids a vLLM-like engine returns (bytes, as the request path hands them over) and
    the chain hashes the request path computes. ``prompt_cache_mb=0`` stores every prompt
    whole (the writer before prompt ids by reference). CPU-ms per step in the writer, and
    the stored size of the prompts per step."""
    from bench.agent_body import agent_body
    from bench.writer_first_steps import frame_records
    from gateway.recording.cut import as_written, cut_prompt_ids
    from gateway.recording.records import ChainHashes, ChoiceCapture, RawJson, StepRecord
    from gateway.recording.writer import StepWriter
    from gateway.recording.writer_process import encode_batch, encode_step
    from gateway.store import chain
    from gateway.store.database import make_engine, upgrade
    from gateway.store.schema import steps

    def prompt_ids(n: int) -> RawJson:
        # cut out of an answer as the request path does (bench.mock_upstream's ids)
        answer = b'{"prompt_token_ids":' + orjson.dumps(list(range(1, n + 1))) + b"}"
        ids = cut_prompt_ids(answer)[1]
        assert ids is not None
        return ids

    body = agent_body()
    messages = body["messages"]
    records = []
    for k in range(1, 15):  # step k: the system prompt, the task and k - 1 tool rounds
        request = dict(body, messages=messages[: 2 * k])
        raw = orjson.dumps(request)
        answer = (
            messages[2 * k] if 2 * k < len(messages) else {"role": "assistant", "content": "Done."}
        )
        history = chain.History(request["messages"])
        for s in range(sessions):
            records.append((s, k, raw, ChainHashes(history.prefix(), [history.continuation(answer)]),
                            answer, prompt_ids(len(raw) // 4)))  # fmt: skip
    records.sort(key=lambda r: (r[1], r[0]))  # concurrent sessions: step k of each, then k + 1

    def rec(
        s: int, raw: bytes, hashes: ChainHashes, answer: dict[str, Any], ids: RawJson
    ) -> StepRecord:
        return StepRecord(
            step_ids=[uuid.uuid4().hex], request_id=uuid.uuid4().hex, tenant="bench", api_key="k",
            endpoint="chat", request=RawJson(raw), external_session=f"agent-{s}", task_id=None,
            group_id=None, created_at=time.time(), status=200, tier="fast", prompt_token_ids=ids,
            choices=[ChoiceCapture(0, answer, list(range(1000, 1060)), [-0.5] * 60, "tool_calls")],
            completion_tokens=60, chain=hashes,
        )  # fmt: skip

    upgrade(url)
    engine = make_engine(url)
    writer = StepWriter(prompt_cache_mb=prompt_cache_mb)
    built = [rec(s, raw, h, a, ids) for s, _, raw, h, a, ids in records]
    # as the recorder hands them over: encoded when offered, 64 to a frame; the writer
    # before this change got the ids as an array of ints in the frame
    encode_one = encode_step if prompt_cache_mb else lambda r: orjson.dumps(r, default=as_written)
    frames = [
        encode_batch(i, False, [encode_one(r) for r in built[at : at + 64]])
        for i, at in enumerate(range(0, len(built), 64))
    ]
    started = time.process_time()
    for frame in frames:  # what the writer process does with each frame
        with engine.begin() as conn:
            writer.write(conn, frame_records(frame))
    cpu = time.process_time() - started
    with engine.connect() as conn:
        stored = conn.execute(select(func.sum(func.length(steps.c.prompt_token_ids)))).scalar()
    engine.dispose()
    return {
        "cpu_ms_per_step": round(cpu * 1000 / len(built), 3),
        "prompt_kib_per_step": round(int(stored or 0) / 1024 / len(built), 2),
    }


def session_runs(tmp: Path, quick: bool) -> dict[str, dict[str, float]]:
    """Part 3, both writers alternated in one window, best of three (one when quick)."""
    n = 4 if quick else 32
    runs: dict[str, list[dict[str, float]]] = {"ref": [], "whole": []}
    for i in range(1 if quick else 3):
        for name, mb in (("whole", 0.0), ("ref", 64.0)):
            runs[name].append(agent_sessions(f"sqlite:///{tmp}/agent-{name}-{i}.db", n, mb))
    agent = {k: min(v, key=lambda r: r["cpu_ms_per_step"]) for k, v in runs.items()}
    print(f"agent sessions: writer {agent['ref']} by reference, {agent['whole']} whole", flush=True)
    return agent


def agent_keys(agent: dict[str, dict[str, float]]) -> dict[str, float]:
    return {
        "agent_writer_cpu_ms_per_step": agent["ref"]["cpu_ms_per_step"],
        "agent_writer_cpu_ms_per_step_whole": agent["whole"]["cpu_ms_per_step"],
        "agent_prompt_kib_per_step": agent["ref"]["prompt_kib_per_step"],
        "agent_prompt_kib_per_step_whole": agent["whole"]["prompt_kib_per_step"],
    }


def chain_keys(named: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {"writer_chain_ratio_60_steps": named["60"]["ratio"], "named_sessions": named}


def store_rates(tmp: Path, quick: bool) -> dict[str, float]:
    batches = 4 if quick else 20
    rates = {"sqlite": store_rate(f"sqlite:///{tmp}/raw.db", batches)}
    print(f"store writes: sqlite {rates['sqlite']:8.0f} steps/s", flush=True)
    try:
        from bench.pgserver import postgres_server
    except ImportError:
        return rates
    try:
        with postgres_server() as url:
            rates["postgresql"] = store_rate(url, batches)
            print(f"store writes: postgresql {rates['postgresql']:8.0f} steps/s", flush=True)
    except (RuntimeError, OSError) as exc:
        print(f"store writes: postgresql skipped ({exc})", flush=True)
    return rates


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [
        ("saturated", "plain"),
        ("saturated", "stream"),
        ("engine_bound", "plain"),
        ("engine_bound", "stream"),
    ]
    labels = [f"{load.replace('_', '-')}\n{mode}" for load, mode in cases]
    off = [result[load][mode]["rps_off"] for load, mode in cases]
    on = [result[load][mode]["rps_on"] for load, mode in cases]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(cases))
    ax.bar([i - 0.2 for i in x], off, 0.4, label="recording off")
    ax.bar([i + 0.2 for i in x], on, 0.4, label="recording on")
    for i, (a, b) in enumerate(zip(off, on, strict=True)):
        ax.text(i + 0.2, b, f"{b / a:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("requests/s (gateway on one core)")
    ax.set_title(
        f"Recording on vs off (engine-bound: {result['engine_latency_ms']:g} ms per answer)"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--plot", type=Path, help="write a bar chart (PNG) of the throughput runs")
    p.add_argument("--latency-ms", type=float, default=50.0, help="engine time per answer")
    p.add_argument(
        "--concurrency", type=int, default=32,
        help="clients in the engine-bound run: at most concurrency/latency requests/s",
    )  # fmt: skip
    p.add_argument(
        "--sessions-only", action="store_true",
        help="only part 3 (the writer on agent sessions, by reference vs whole)",
    )  # fmt: skip
    p.add_argument(
        "--chain-only", action="store_true",
        help="only part 4 (the writer on named sessions: whole-history vs incremental hashing)",
    )  # fmt: skip
    p.add_argument(
        "--writer-ab", action="store_true",
        help="only the writer as it is against as it was (a lookup a step, SQLAlchemy's "
        "inserts), alternating on 64 named sessions of 30 steps (#29)",
    )  # fmt: skip
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-recorder-") as d:
        tmp = Path(d)
        if a.writer_ab:
            from bench.writer_chain import lookup_ab

            print(json.dumps(lookup_ab(tmp, a.quick)))
            return
        if a.chain_only:
            print(json.dumps(chain_keys(chain_runs(tmp, a.quick))))
            return
        agent = session_runs(tmp, a.quick)
        if a.sessions_only:
            print(json.dumps(agent_keys(agent)))
            return
        named = chain_runs(tmp, a.quick)
        saturated = throughput(tmp, 0.0, 16, a.quick)
        engine_bound = throughput(tmp, a.latency_ms, a.concurrency, a.quick)
        rates = store_rates(tmp, a.quick)
    result = {
        "throughput_ratio_recording_on": round(engine_bound["plain"]["ratio"], 3),
        "throughput_ratio_recording_on_stream": round(engine_bound["stream"]["ratio"], 3),
        "throughput_ratio_saturated": round(saturated["plain"]["ratio"], 3),
        "throughput_ratio_saturated_stream": round(saturated["stream"]["ratio"], 3),
        "recording_cpu_ms_per_step": round(
            saturated["plain"]["cpu_ms_on"] - saturated["plain"]["cpu_ms_off"], 3
        ),
        "recording_gateway_cpu_ms_per_step": round(
            saturated["plain"]["gateway_cpu_ms_on"] - saturated["plain"]["gateway_cpu_ms_off"], 3
        ),
        "engine_latency_ms": a.latency_ms,
        "engine_concurrency": a.concurrency,
        "saturated": saturated,
        "engine_bound": engine_bound,
        "steps_per_s": round(rates["sqlite"]),
        "steps_per_s_postgresql": round(rates["postgresql"]) if "postgresql" in rates else None,
        **agent_keys(agent),
        **chain_keys(named),
    }
    if a.plot:
        plot(result, a.plot)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
