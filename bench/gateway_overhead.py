"""Gateway overhead: Gearshift vs LiteLLM vs the bare upstream, in one run.

A fast mock upstream (bench.mock_upstream) answers every proxy. Each proxy runs
alone on core 0; the mock and the load generator share core 1. Three kinds of request:
``chat`` (two short messages), ``agent`` (bench.agent_body: 30 messages of a tool loop,
8 tools, about 39 KB, every request its own one-step session) and ``session`` (agents'
sessions as agents send them: each request the session's previous messages plus a tool
call and its 1.4-2 KB result, 2 to 30 messages, under the session's X-Session-Id; see
bench.loadgen --sessions). Proxies (bench.proxies): Gearshift in its light
configuration (``gearshift``: keys and router, recording and sandbox off; the chat and
agent bodies),
Gearshift as an operator runs it (``gearshift_op``: keys, router, recording to SQLite,
sandbox enabled; every kind) and LiteLLM (every kind). For non-stream requests and
20-chunk streams, at concurrency 1, 16 and 64, it measures: CPU-ms per request of the
proxy's process tree, p50/p99/max latency, and requests/s. Added latency is the proxy's
figure minus the bare upstream's for the same body at concurrency 1; saturated
throughput and CPU are the concurrency-64 figures; a stall is the slowest single request
at concurrency 1 minus the bare upstream's p50 for that body. After each of its cells the
recording gateway is given the time its writer needs to commit every step (its recorder's
counts on /metrics): that CPU counts for the cell, and the requests/s it sustains include
that time (``sustained_rps``).

    python -m bench.gateway_overhead [--quick] [--no-litellm] [--bodies chat,agent,session]
        [--probe FILE] [--writer-nice N] [--plot FILE] [--mock-answers session|canned]
        [--modes plain,stream]

The mock answers a session's step with the tool call its next request carries, so the
agents echo the answers they got, as agents do (``bench.mock_upstream``);
``--mock-answers canned`` answers every step with the same sentence, which no next request
carries: the worst case for the recorder's chain (and, for sessions without an id, for
routing's).

``--probe FILE`` runs ``gearshift_op`` under bench.stall_probe (its events into FILE) and
prints, for each of its concurrency-1 cells, the slowest requests with what the probe saw
during each; the probe's own CPU makes that run's CPU figures unfit for comparison.
``--writer-nice N`` lowers the priority of ``gearshift_op``'s child processes (the
recorder's writer, which shares the gateway's core here) once it has started.
``--modes plain`` (or ``stream``) runs only those cells.

Each of ``gearshift_op``'s cells also splits its CPU-ms a request by process
(``cpu_ms_per_req_by_process``: the gateway, the recorder's writer, the tool sandbox with
whatever it started, other), read from the same ``/proc`` snapshot as the tree's figure,
so the parts add up to ``cpu_ms_per_req``; the summary's ``cpu_ms_per_req_by_process``
has them by body, mode and concurrency. Each cell also counts the gateway process's minor
page faults a request (``gateway_minflt_per_req``).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench import stall_probe
from bench.agent_body import agent_body
from bench.mock_upstream import ANSWERS
from bench.procs import CLK_TCK, pinned, proc_stats, process_tree, start, stop, wait_http
from bench.proxies import (
    CLIENT_CORE,
    GEARSHIFT_CORE,
    Target,
    drain,
    free_port,
    recorder_done,
    sandbox_state,
    start_gearshift,
    start_litellm,
)

__all__ = ["CLIENT_CORE", "GEARSHIFT_CORE", "Target", "free_port", "loadgen"]

CONCURRENCY = (1, 16, 64)
MODES = ("plain", "stream")
BODIES = ("chat", "agent", "session")
SUFFIX = {"chat": "recording", "agent": "agent_body", "session": "agent_session"}
PLAN = {
    "upstream": BODIES, "gearshift": ("chat", "agent"), "gearshift_op": BODIES, "litellm": BODIES
}  # fmt: skip
TARGETS = {"cpu_ratio_vs_litellm": 0.1, "added_p99_ms": 2.0, "max_stall_ms": 20.0}
Cells = dict[str, dict[str, dict[str, dict[int, dict[str, Any]]]]]  # name, body, mode, c
# A proxy's child process by what its command line holds (the first match; the rest of a
# role's subtree is the role's: the sandbox's bwrap and resident interpreters are "sandbox")
ROLES = (("gateway.recording.writer_process", "writer"), ("-m\0sandbox", "sandbox"))


def _role(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:  # gone since the snapshot
        return "other"
    return next((role for marker, role in ROLES if marker in cmdline), "other")


def cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of ``pid``'s process tree by role: ``gateway`` (``pid``
    itself), ``writer``, ``sandbox`` (each with its descendants), ``other``; one snapshot,
    so the parts sum to the tree's figure (``bench.procs.tree_cpu_seconds``)."""
    stats = proc_stats()
    out = {"gateway": 0.0, "writer": 0.0, "sandbox": 0.0, "other": 0.0}
    roles = {pid: "gateway"}
    for p in process_tree(pid, stats):  # parents before their children
        if p not in stats:
            continue
        parent = int(stats[p][1])
        role = roles.get(p) or (_role(p) if roles.get(parent) == "gateway" else None)
        roles[p] = role = role or roles.get(parent, "other")
        out[role] += (int(stats[p][11]) + int(stats[p][12])) / CLK_TCK
    return out


def minor_faults(pid: int) -> int:
    """The minor page faults of process ``pid`` so far (``/proc/<pid>/stat``'s ``minflt``):
    memory it touched for the first time, each a trap into the kernel and a zeroed page."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def loadgen(
    target: Target,
    mode: str,
    concurrency: int,
    requests: int,
    max_s: float,
    load: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """One cell; ``load``: bench.loadgen's arguments for what to send (``--body FILE``,
    ``--sessions``; none: the chat body)."""
    argv = [sys.executable, "-m", "bench.loadgen", target.url, "--model", target.model,
            "--mode", mode, "--concurrency", str(concurrency), "--requests", str(requests),
            "--max-seconds", str(max_s), "--key", target.key, *load]  # fmt: skip
    recorded = recorder_done(target.metrics) if target.metrics else 0.0
    faults0 = minor_faults(target.proc.pid) if target.proc else 0
    split0 = cpu_by_process(target.proc.pid) if target.proc else {}
    out = subprocess.run(pinned(argv, CLIENT_CORE), capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    drained = drain(target, recorded + result["completed"])  # a step per answer
    split1 = cpu_by_process(target.proc.pid) if target.proc else {}
    faults1 = minor_faults(target.proc.pid) if target.proc else 0
    result["drain_s"] = drained if target.metrics else 0.0
    result["sustained_rps"] = result["completed"] / (result["seconds"] + result["drain_s"])
    if result["errors"] and not result["completed"]:
        tail = target.log.read_text()[-3000:] if target.log else ""
        raise RuntimeError(f"{target.name}: every request failed; its log ends:\n{tail}")
    done = max(1.0, result["completed"])
    result["cpu_ms_per_req"] = (
        (sum(split1.values()) - sum(split0.values())) * 1000 / done if target.proc else float("nan")
    )
    if target.proc:
        result["gateway_minflt_per_req"] = (faults1 - faults0) / done
        result["cpu_ms_per_req_by_process"] = {
            role: (split1[role] - split0[role]) * 1000 / done for role in split1
        }
    return result


def cell_size(mode: str, concurrency: int, quick: bool) -> tuple[int, float]:
    """Requests and time limit of one cell. Concurrency 1 runs long enough to meet what
    recurs every few hundred requests (store commits, the token estimate's refit)."""
    if concurrency > 1:
        return (64, 10) if quick else (2000, 30)
    if quick:
        return (40, 10) if mode == "plain" else (20, 10)
    return (1000, 30) if mode == "plain" else (400, 30)


def measure(
    targets: list[Target], bodies: dict[str, list[str]], quick: bool, modes: tuple[str, ...] = MODES
) -> Cells:
    cells: Cells = {}
    for target in targets:
        for name in (b for b in PLAN[target.name] if b in bodies):
            body = bodies[name]
            # warm-up: connections, caches, lazy imports
            if "plain" in modes:
                loadgen(target, "plain", 8, 24 if quick else 100, 30, body)
            if "stream" in modes:
                loadgen(target, "stream", 8, 16 if quick else 50, 30, body)
            for mode in modes:
                for c in CONCURRENCY:
                    r = loadgen(target, mode, c, *cell_size(mode, c, quick), body)
                    cells.setdefault(target.name, {}).setdefault(name, {}).setdefault(mode, {})
                    cells[target.name][name][mode][c] = r
                    print(
                        f"{target.name:12s} {name:5s} {mode:6s} c={c:<3d} {r['completed']:5.0f} req "
                        f"{r['rps']:8.1f} req/s p50 {r['p50_ms']:7.2f} ms p99 {r['p99_ms']:7.2f} ms "
                        f"max {r['max_ms']:7.2f} ms cpu {r['cpu_ms_per_req']:6.3f} ms/req "
                        f"errors {r['errors']:.0f}" + _drained(r) + _split(r),
                        flush=True,
                    )
    return cells


def _drained(r: dict[str, float]) -> str:
    if not r["drain_s"]:
        return ""
    return f" recorder done {r['drain_s']:.1f} s later ({r['sustained_rps']:.1f} req/s sustained)"


def _split(r: dict[str, Any]) -> str:
    parts = r.get("cpu_ms_per_req_by_process")
    if not parts:
        return ""
    split = " ".join(f"{k} {v:.3f}" for k, v in parts.items())
    return f" [{split}; gateway faults {r['gateway_minflt_per_req']:.1f}/req]"


def _r(value: float, digits: int = 3) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def light_summary(cells: Cells, mode: str) -> dict[str, float | None]:
    """The light configuration against LiteLLM: the chat body under the keys of earlier
    runs, the agent body under ``_agent_body_light`` (what the agent body costs without
    recording: the floor that recording's share is measured from)."""
    p, sat = ("" if mode == "plain" else "stream_"), max(CONCURRENCY)
    out: dict[str, float | None] = {}
    for body, suffix in (("chat", ""), ("agent", "_agent_body_light")):
        if body not in cells["gearshift"]:
            continue
        up, gs = cells["upstream"][body][mode], cells["gearshift"][body][mode]
        out |= {
            f"{p}cpu_ms_per_req{suffix}": _r(gs[sat]["cpu_ms_per_req"]),
            f"{p}added_p50_ms{suffix}": _r(gs[1]["p50_ms"] - up[1]["p50_ms"]),
            f"{p}added_p99_ms{suffix}": _r(gs[1]["p99_ms"] - up[1]["p99_ms"]),
            f"{p}rps{suffix}": _r(gs[sat]["rps"], 1),
        }
        if "litellm" not in cells:
            continue
        ll = cells["litellm"][body][mode]
        ratio = gs[sat]["cpu_ms_per_req"] / ll[sat]["cpu_ms_per_req"]
        out[f"{p}cpu_ratio_vs_litellm{suffix}"] = _r(ratio, 4)
        if body == "chat":
            out |= {
                f"{p}litellm_cpu_ms_per_req": _r(ll[sat]["cpu_ms_per_req"]),
                f"{p}litellm_added_p50_ms": _r(ll[1]["p50_ms"] - up[1]["p50_ms"]),
                f"{p}litellm_rps": _r(ll[sat]["rps"], 1),
                f"{p}rps_ratio_vs_litellm": _r(gs[sat]["rps"] / ll[sat]["rps"], 2),
            }
    return out


def operator_summary(cells: Cells, mode: str) -> dict[str, float | None]:
    """Gearshift as operators run it (recording on): ``_recording`` is the chat body,
    ``_agent_body`` the agent body, ``_agent_session`` growing sessions; ratios against
    LiteLLM on the same requests."""
    p, sat = ("" if mode == "plain" else "stream_"), max(CONCURRENCY)
    out: dict[str, float | None] = {}
    stalls = []
    for body in (b for b in BODIES if b in cells.get("gearshift_op", {})):
        suffix = SUFFIX[body]
        up, op = cells["upstream"][body][mode], cells["gearshift_op"][body][mode]
        out |= {
            f"{p}cpu_ms_per_req_{suffix}": _r(op[sat]["cpu_ms_per_req"]),
            f"{p}added_p50_ms_{suffix}": _r(op[1]["p50_ms"] - up[1]["p50_ms"]),
            f"{p}added_p99_ms_{suffix}": _r(op[1]["p99_ms"] - up[1]["p99_ms"]),
            f"{p}rps_{suffix}": _r(op[sat]["rps"], 1),
            f"{p}sustained_rps_{suffix}": _r(op[sat]["sustained_rps"], 1),
            f"{p}recorder_drain_s_{suffix}": _r(op[sat]["drain_s"], 1),
        }
        stalls.append(op[1]["max_ms"] - up[1]["p50_ms"])
        if "litellm" in cells:
            ll = cells["litellm"][body][mode]
            out[f"{p}litellm_cpu_ms_per_req_{suffix}"] = _r(ll[sat]["cpu_ms_per_req"])
            out[f"{p}litellm_added_p50_ms_{suffix}"] = _r(ll[1]["p50_ms"] - up[1]["p50_ms"])
            ratio = op[sat]["cpu_ms_per_req"] / ll[sat]["cpu_ms_per_req"]
            out[f"{p}cpu_ratio_vs_litellm_{suffix}"] = _r(ratio, 4)
    if stalls:
        out[f"{p}max_stall_ms"] = _r(max(stalls))
    return out


def summarize(cells: Cells, sandbox: str, answers: str = "session") -> dict[str, object]:
    summary: dict[str, object] = {}
    for mode in (m for m in MODES if _has_mode(cells, m)):
        if "gearshift" in cells:
            summary |= light_summary(cells, mode)
        summary |= operator_summary(cells, mode)
    summary["cpu_ms_per_req_by_concurrency"] = {
        name if body == "chat" else f"{name}/{body}": {
            mode: {c: _r(r["cpu_ms_per_req"]) for c, r in by_c.items()}
            for mode, by_c in modes.items()
        }
        for name, by_body in cells.items()
        if name != "upstream"
        for body, modes in by_body.items()
    }
    summary["cpu_ms_per_req_by_process"] = {
        body: {
            mode: {c: {k: _r(v) for k, v in r["cpu_ms_per_req_by_process"].items()}
                   for c, r in by_c.items() if "cpu_ms_per_req_by_process" in r}
            for mode, by_c in modes.items()
        }
        for body, modes in cells.get("gearshift_op", {}).items()
    }  # fmt: skip
    summary["errors"] = {
        name: sum(r["errors"] for modes in by_body.values() for by_c in modes.values()
                  for r in by_c.values())
        for name, by_body in cells.items()
    }  # fmt: skip
    summary["sandbox"] = sandbox
    summary["mock_answers"] = answers
    summary["agent_body_bytes"] = len(orjson.dumps(agent_body()))
    summary["targets"] = TARGETS
    summary["note"] = "CPU-only machine; absolute times are indicative, ratios are the result"
    return summary


def _has_mode(cells: Cells, mode: str) -> bool:
    return any(mode in modes for by_body in cells.values() for modes in by_body.values())


def _lines(axes: Any, col: int, label: str, by_c: dict[int, dict[str, float]]) -> None:
    style = "--" if "agent" in label else "-"
    xs = list(by_c)
    if not label.startswith("upstream"):
        axes[0][col].plot(xs, [by_c[c]["cpu_ms_per_req"] for c in xs], "o" + style, label=label)
    axes[1][col].plot(xs, [by_c[c]["rps"] for c in xs], "^" + style, label=label)


def plot(cells: Cells, path: Path) -> None:
    """CPU per request and throughput by concurrency, one panel pair per mode (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for col, mode in enumerate(MODES):
        for name, by_body in cells.items():
            for body, modes in by_body.items():
                _lines(axes, col, f"{name} ({body})", modes[mode])
        title = "non-stream" if mode == "plain" else "stream (20 chunks)"
        axes[0][col].set(
            title=f"{title}: proxy CPU per request", ylabel="CPU-ms / request", yscale="log"
        )
        axes[1][col].set(
            title=f"{title}: throughput, proxy on one core", ylabel="requests / s", yscale="log"
        )
        for ax in (axes[0][col], axes[1][col]):
            ax.set(xscale="log", xlabel="concurrency", xticks=list(CONCURRENCY))
            ax.set_xticklabels([str(c) for c in CONCURRENCY])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def start_targets(
    tmp: Path, mock_url: str, with_litellm: bool, light: bool, probe: Path | None
) -> list[Target]:
    targets = [Target("upstream", mock_url + "/v1/chat/completions", "mock", None)]
    if light:
        targets.append(start_gearshift(tmp, mock_url, "gearshift", operator=False))
    targets.append(start_gearshift(tmp, mock_url, "gearshift_op", operator=True, probe=probe))
    if with_litellm:
        targets.append(start_litellm(tmp, mock_url))
    return targets


def run(
    tmp: Path, with_litellm: bool, quick: bool, bodies: tuple[str, ...] = BODIES,
    probe: Path | None = None, writer_nice: int = 0, answers: str = "session",
    modes: tuple[str, ...] = MODES,
) -> tuple[Cells, str]:  # fmt: skip
    agent = tmp / "agent.json"
    agent.write_bytes(orjson.dumps(agent_body()))
    load = {"chat": [], "agent": ["--body", str(agent)], "session": ["--sessions"]}
    mock_port, mock_log = free_port(), tmp / "mock.log"
    argv = [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port),
            "--answers", answers]  # fmt: skip
    mock = start(pinned(argv, CLIENT_CORE), mock_log)
    targets: list[Target] = []
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health", mock, mock_log)
        mock_url = f"http://127.0.0.1:{mock_port}"
        light = any(b in PLAN["gearshift"] for b in bodies)
        targets = start_targets(tmp, mock_url, with_litellm, light, probe)
        op = next(t for t in targets if t.name == "gearshift_op")
        sandbox = sandbox_state(op)
        print(f"gearshift_op: sandbox {sandbox}", flush=True)
        if writer_nice and op.proc is not None:
            for child in stall_probe.children(op.proc.pid):  # its writer and sandbox
                os.setpriority(os.PRIO_PROCESS, child, writer_nice)
            print(f"gearshift_op: its child processes at nice {writer_nice}", flush=True)
        return measure(targets, {b: load[b] for b in bodies}, quick, modes), sandbox
    finally:
        for t in targets:
            if t.proc is not None:
                stop(t.proc)
        stop(mock)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests per cell")
    parser.add_argument(
        "--no-litellm", action="store_true", help="skip LiteLLM (no comparison ratios)"
    )
    parser.add_argument(
        "--bodies", default=",".join(BODIES), help="which requests to send (default: all)"
    )
    parser.add_argument("--probe", type=Path, help="probe gearshift_op's stalls into this file")
    parser.add_argument(
        "--writer-nice", type=int, default=0,
        help="run gearshift_op's child processes (its recorder's writer) at this niceness",
    )  # fmt: skip
    parser.add_argument(
        "--plot", type=Path, help="also draw the results into this PNG (needs matplotlib)"
    )
    parser.add_argument(
        "--mock-answers", choices=ANSWERS, default="session",
        help="session: each step answered with what the next one carries; canned: one sentence",
    )  # fmt: skip
    parser.add_argument(
        "--modes", default=",".join(MODES), help="which cells: plain, stream (default: both)"
    )
    args = parser.parse_args()
    bodies = tuple(b for b in BODIES if b in args.bodies.split(","))
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    if not modes:
        parser.error(f"--modes: none of {args.modes!r} is one of {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-") as tmpdir:
        cells, sandbox = run(
            Path(tmpdir), not args.no_litellm, args.quick, bodies, args.probe, args.writer_nice,
            args.mock_answers, modes,
        )  # fmt: skip
    if args.plot:
        plot(cells, args.plot)
    summary = summarize(cells, sandbox, args.mock_answers)
    if args.probe:
        summary["probe"] = stall_probe.report(args.probe, cells["gearshift_op"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
