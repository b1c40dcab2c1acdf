"""Gateway overhead: Gearshift vs LiteLLM vs the bare upstream, in one run.

A fast mock upstream (bench.mock_upstream) answers every proxy. Each proxy runs
alone on core 0; the mock and the load generator share core 1. For non-stream
requests and 20-chunk streams, at concurrency 1, 16 and 64, it measures:
CPU-ms per request of the proxy's process tree, p50/p99 latency, and
requests/s. Added latency is the proxy's p50 minus the bare upstream's p50 at
the same concurrency; saturated throughput is the concurrency-64 figure.

    python -m bench.gateway_overhead [--quick] [--no-litellm]

LiteLLM (litellm[proxy], pinned below) is installed on first use into its own
virtualenv under $GEARSHIFT_HOME. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.procs import pinned, start, stop, tree_cpu_seconds, wait_http

LITELLM_VERSION = "1.108.7"
GEARSHIFT_CORE, CLIENT_CORE = 0, 1
CONCURRENCY = (1, 16, 64)
MODES = ("plain", "stream")
KEY = "sk-bench-" + secrets.token_hex(16)
HOME = Path(os.environ.get("GEARSHIFT_HOME", Path.home() / ".cache" / "gearshift"))


@dataclass
class Target:
    name: str
    url: str  # chat completions URL
    model: str
    proc: subprocess.Popen[bytes] | None  # None: the bare upstream (no proxy process)
    key: str = "unused"
    log: Path | None = None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_litellm() -> Path:
    venv = HOME / "bench-litellm"
    exe = venv / "bin" / "litellm"
    stamp = venv / ".gearshift-stamp"
    if exe.exists() and stamp.exists() and stamp.read_text() == LITELLM_VERSION:
        return exe
    print(
        f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once, a few minutes)",
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--progress-bar",
            "on",
            f"litellm[proxy]=={LITELLM_VERSION}",
        ],
        check=True,
    )
    stamp.write_text(LITELLM_VERSION)
    return exe


def loadgen(
    target: Target, mode: str, concurrency: int, requests: int, max_s: float
) -> dict[str, float]:
    argv = pinned(
        [
            sys.executable,
            "-m",
            "bench.loadgen",
            target.url,
            "--model",
            target.model,
            "--mode",
            mode,
            "--concurrency",
            str(concurrency),
            "--requests",
            str(requests),
            "--max-seconds",
            str(max_s),
            "--key",
            target.key,
        ],
        CLIENT_CORE,
    )
    cpu0 = tree_cpu_seconds(target.proc.pid) if target.proc else 0.0
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    cpu1 = tree_cpu_seconds(target.proc.pid) if target.proc else 0.0
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if result["errors"] and not result["completed"]:
        tail = target.log.read_text()[-3000:] if target.log else ""
        raise RuntimeError(f"{target.name}: every request failed; its log ends:\n{tail}")
    done = max(1.0, result["completed"])
    result["cpu_ms_per_req"] = (cpu1 - cpu0) * 1000 / done if target.proc else float("nan")
    return result


def start_targets(tmp: Path, mock_url: str, with_litellm: bool) -> list[Target]:
    targets = [Target("upstream", mock_url + "/v1/chat/completions", "mock", None)]
    port = free_port()
    config = tmp / "gearshift.yaml"
    # Both proxies authenticate every request with an API key, as in production.
    config.write_text(
        f"port: {port}\n"
        f"auth: {{mode: keys, keys: [{{name: bench, tenant: bench, sha256: '{hashlib.sha256(KEY.encode()).hexdigest()}'}}]}}\n"
        f"tiers:\n  full: {{model: mock-full, replicas: ['{mock_url}']}}\n"
        f"  fast: {{model: mock-fast, replicas: ['{mock_url}']}}\n"
        # Like for like with LiteLLM, which records nothing here; recording's own cost is
        # measured by bench.recorder.
        "store: {enabled: false}\n"
        "sandbox: {enabled: false}\n"
    )
    gearshift = Path(sys.executable).with_name("gearshift")
    log = tmp / "gearshift.log"
    proc = start(
        pinned(
            [str(gearshift), "--log-level", "warning", "serve", "--config", str(config)],
            GEARSHIFT_CORE,
        ),
        log,
    )
    wait_http(f"http://127.0.0.1:{port}/ready", proc, log)
    targets.append(
        Target("gearshift", f"http://127.0.0.1:{port}/v1/chat/completions", "auto", proc, KEY, log)
    )
    if with_litellm:
        exe = ensure_litellm()
        port = free_port()
        cfg = tmp / "litellm.yaml"
        cfg.write_text(
            "model_list:\n  - model_name: auto\n    litellm_params:\n"
            f"      model: openai/mock\n      api_base: {mock_url}/v1\n      api_key: sk-mock\n"
            "litellm_settings:\n  telemetry: false\n"
            f"general_settings:\n  master_key: {KEY}\n"
        )
        env = {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
        }
        log = tmp / "litellm.log"
        proc = start(
            pinned(
                [
                    str(exe),
                    "--config",
                    str(cfg),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--num_workers",
                    "1",
                ],
                GEARSHIFT_CORE,
            ),
            log,
            env,
        )
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, log, timeout_s=300)
        targets.append(
            Target(
                "litellm", f"http://127.0.0.1:{port}/v1/chat/completions", "auto", proc, KEY, log
            )
        )
    return targets


def measure(
    targets: list[Target], quick: bool
) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
    results: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    for target in targets:
        loadgen(target, "plain", 8, 100, 30)  # warm-up: connections, caches, lazy imports
        loadgen(target, "stream", 8, 50, 30)
        for mode in MODES:
            for c in CONCURRENCY:
                n = (100 if c == 1 else 400) if quick else (300 if c == 1 else 2000)
                r = loadgen(target, mode, c, n, 15 if quick else 40)
                results.setdefault(target.name, {}).setdefault(mode, {})[c] = r
                print(
                    f"{target.name:9s} {mode:6s} c={c:<3d} {r['completed']:5.0f} req {r['rps']:8.1f} req/s "
                    f"p50 {r['p50_ms']:7.2f} ms p99 {r['p99_ms']:7.2f} ms cpu {r['cpu_ms_per_req']:6.3f} ms/req "
                    f"errors {r['errors']:.0f}",
                    flush=True,
                )
    return results


def summarize(results: dict[str, dict[str, dict[int, dict[str, float]]]]) -> dict[str, object]:
    up, gs, ll = results["upstream"], results["gearshift"], results.get("litellm")
    summary: dict[str, object] = {}
    for mode in MODES:
        prefix = "" if mode == "plain" else "stream_"
        sat = max(CONCURRENCY)
        summary[f"{prefix}cpu_ms_per_req"] = round(gs[mode][sat]["cpu_ms_per_req"], 3)
        summary[f"{prefix}added_p50_ms"] = round(gs[mode][1]["p50_ms"] - up[mode][1]["p50_ms"], 3)
        summary[f"{prefix}added_p99_ms"] = round(gs[mode][1]["p99_ms"] - up[mode][1]["p99_ms"], 3)
        summary[f"{prefix}rps"] = round(gs[mode][sat]["rps"], 1)
        if ll is not None:
            summary[f"{prefix}litellm_cpu_ms_per_req"] = round(ll[mode][sat]["cpu_ms_per_req"], 3)
            summary[f"{prefix}litellm_added_p50_ms"] = round(
                ll[mode][1]["p50_ms"] - up[mode][1]["p50_ms"], 3
            )
            summary[f"{prefix}litellm_rps"] = round(ll[mode][sat]["rps"], 1)
            summary[f"{prefix}cpu_ratio_vs_litellm"] = round(
                gs[mode][sat]["cpu_ms_per_req"] / ll[mode][sat]["cpu_ms_per_req"], 4
            )
            summary[f"{prefix}rps_ratio_vs_litellm"] = round(
                gs[mode][sat]["rps"] / ll[mode][sat]["rps"], 2
            )
    summary["cpu_ms_per_req_by_concurrency"] = {
        name: {
            mode: {c: round(r["cpu_ms_per_req"], 3) for c, r in by_c.items()}
            for mode, by_c in modes.items()
        }
        for name, modes in results.items()
        if name != "upstream"
    }
    summary["note"] = "CPU-only machine; absolute times are indicative, ratios are the result"
    return summary


def plot(results: dict[str, dict[str, dict[int, dict[str, float]]]], path: Path) -> None:
    """CPU per request and throughput by concurrency, one panel pair per mode (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    for col, mode in enumerate(MODES):
        for name, style in (("gearshift", "o-"), ("litellm", "s--"), ("upstream", "^:")):
            if name not in results:
                continue
            by_c = results[name][mode]
            xs = list(by_c)
            if name != "upstream":
                axes[0][col].plot(xs, [by_c[c]["cpu_ms_per_req"] for c in xs], style, label=name)
            axes[1][col].plot(xs, [by_c[c]["rps"] for c in xs], style, label=name)
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
            ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests per cell")
    parser.add_argument(
        "--no-litellm", action="store_true", help="skip LiteLLM (no comparison ratios)"
    )
    parser.add_argument(
        "--plot", type=Path, help="also draw the results into this PNG (needs matplotlib)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-") as tmpdir:
        tmp = Path(tmpdir)
        mock_port = free_port()
        mock_log = tmp / "mock.log"
        mock = start(
            pinned(
                [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)], CLIENT_CORE
            ),
            mock_log,
        )
        targets: list[Target] = []
        try:
            wait_http(f"http://127.0.0.1:{mock_port}/health", mock, mock_log)
            targets = start_targets(tmp, f"http://127.0.0.1:{mock_port}", not args.no_litellm)
            results = measure(targets, args.quick)
        finally:
            for t in targets:
                if t.proc is not None:
                    stop(t.proc)
            stop(mock)
    if args.plot:
        plot(results, args.plot)
    print(json.dumps(summarize(results)))


if __name__ == "__main__":
    main()
