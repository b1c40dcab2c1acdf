"""Real outcomes of both tiers on the checkable router tasks, cached as JSON lines.

    python -m bench.router_outcomes [--url URL] [--out bench/data/router_outcomes.jsonl] [--quick]

Sends every task of ``bench.router_tasks`` that has a checker to the full and to the fast
tier (pinned by model name, greedy decoding), scores both answers and appends one line per
task: ``{"key", "id", "full": {"score", "tokens", "seconds"}, "fast": {...}}``. Tasks already
in the file (same key: id + hash of the request) are skipped, so an interrupted run resumes.
Without ``--url`` it starts the embedded stack (``gearshift serve``, store and sandbox off).
The first line of the file names the models that produced it, how they sampled and, when
this run started the stack, the fast tier (``fast_tier``: model, mode, pruning; the router
models trained on the file record it, and ``gearshift serve`` warns when the embedded fast
tier differs).

``--samples 4 --out bench/data/router_outcomes_sampled.jsonl`` asks for four answers per
task and tier at temperature 0.7 instead: ``score`` is then their mean, an estimate of each
tier's chance on the task that is less noisy than one greedy answer; the router's model
for requests that sample is trained and scored on these (``bench.router_eval``). ``--temperature``
sets another temperature for the samples, and ``--scale 0.25`` takes the first quarter of
each source's tasks (``bench.router_eval --check`` scores the models on such a file).

``--full-from FILE`` takes the full tier's outcomes from an earlier file of the same regime
(same task keys, samples and temperature) and asks only the fast tier: after a change to
the fast tier alone, the full model's answers are the same and collecting takes half the
time. The header then names the file (``full_from``).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.router_tasks import Task, all_tasks

DEFAULT_OUT = Path(__file__).parent / "data" / "router_outcomes.jsonl"
SAMPLED_OUT = Path(__file__).parent / "data" / "router_outcomes_sampled.jsonl"
TIERS = ("full", "fast")
QUICK_SOURCES = ("bfcl", "reasoning_gym", "trivia")  # HumanEval's checker needs the sandbox


async def answer(
    session: aiohttp.ClientSession,
    url: str,
    tier: str,
    task: Task,
    samples: int = 1,
    temperature: float = 0.7,
) -> dict[str, Any]:
    """Greedy (one answer), or ``samples`` answers at ``temperature``: then ``score`` is
    their mean (an estimate of the tier's chance to get the task right) and ``scores``
    lists them."""
    body = {**task.body, "model": tier, "temperature": 0, "seed": 0}
    if samples > 1:
        body.update(temperature=temperature, n=samples)
    for attempt in range(3):  # a pooled connection can drop as it is reused: ask again
        started = time.perf_counter()
        try:
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                text = await resp.text()
                try:
                    data = json.loads(text)
                except ValueError:  # a bare error page
                    data = text
                # the tier failed the task (the gateway's 502 after its retries); a 503 or 504
                # says the stack is down or stopping, which is no outcome of the task
                if resp.status in (500, 502):
                    return failed(task, tier, resp.status, data, time.perf_counter() - started)
                if resp.status != 200:
                    raise RuntimeError(f"{task.id} on {tier}: HTTP {resp.status} {data}")
            break
        except aiohttp.ClientConnectionError:
            if attempt == 2:
                raise
    seconds = time.perf_counter() - started
    assert task.check is not None
    scores = []
    for choice in data["choices"]:
        score = task.check(choice["message"])
        if inspect.isawaitable(score):
            score = await score
        scores.append(round(float(score), 4))
    out = {
        "score": round(sum(scores) / len(scores), 4),
        "tokens": data["usage"]["completion_tokens"],
        "seconds": round(seconds, 3),
    }
    if samples > 1:
        out["scores"] = scores
    return out


def failed(task: Task, tier: str, status: int, data: Any, seconds: float) -> dict[str, Any]:
    """A tier that answers a task with a server error has failed it: score 0, and the error
    kept (vLLM 0.32 ends some requests with structured output under speculative decoding
    with a 500, "grammar rejected tokens"; docs/fast-tier.md)."""
    error = data.get("error", {}) if isinstance(data, dict) else {}
    message = error.get("message") if isinstance(error, dict) else None
    print(f"  {task.id} on {tier}: HTTP {status}, scored 0", file=sys.stderr, flush=True)
    return {"score": 0.0, "tokens": 0, "seconds": round(seconds, 3),
            "error": f"HTTP {status}: {message or data}"}  # fmt: skip


async def collect(
    url: str,
    out: Path,
    tasks: list[Task],
    concurrency: int,
    samples: int = 1,
    temperature: float = 0.7,
    fast_tier: dict[str, Any] | None = None,
    full_from: Path | None = None,
) -> int:
    done = load(out)
    reused = load(full_from) if full_from is not None else {}
    todo = [t for t in tasks if t.check is not None and t.key not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        if not out.exists() or out.stat().st_size == 0:
            async with session.get(f"{url}/v1/models") as resp:
                models = [m["id"] for m in (await resp.json())["data"]]
            header = {"models": models, "created": time.time(), "samples": samples,
                      "temperature": temperature if samples > 1 else 0.0}  # fmt: skip
            if fast_tier is not None:  # known when this run started the embedded stack
                header["fast_tier"] = fast_tier
            if full_from is not None:
                header["full_from"] = full_from.name
            out.write_text(json.dumps(header) + "\n")
        gate = asyncio.Semaphore(concurrency)
        lock = asyncio.Lock()
        finished = 0

        async def one(task: Task) -> None:
            nonlocal finished
            async with gate:
                if task.key in reused:
                    full = reused[task.key]["full"]
                    fast = await answer(session, url, "fast", task, samples, temperature)
                else:
                    full, fast = await asyncio.gather(
                        answer(session, url, "full", task, samples, temperature),
                        answer(session, url, "fast", task, samples, temperature),
                    )
            async with lock:
                with out.open("a") as f:
                    f.write(json.dumps({"key": task.key, "id": task.id, "full": full, "fast": fast}) + "\n")  # fmt: skip
                finished += 1
                if finished % 10 == 0 or finished == len(todo):
                    print(f"  outcomes: {finished}/{len(todo)}", file=sys.stderr, flush=True)

        await asyncio.gather(*(one(t) for t in todo))
    return len(todo)


def header(path: Path) -> dict[str, Any]:
    """The file's first line: the models, how they sampled, and the fast tier when known."""
    with path.open() as f:
        first = json.loads(f.readline() or "{}")
    return first if isinstance(first, dict) and "key" not in first else {}


def load(path: Path) -> dict[str, dict[str, Any]]:
    """Outcomes by task key (the header line is skipped)."""
    if not path.exists():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {r["key"]: r for r in rows if "key" in r}


def check_same_regime(path: Path, samples: int, temperature: float) -> None:
    """Reused outcomes must come from the regime being collected (samples, temperature)."""
    if not path.is_file():
        raise SystemExit(f"--full-from {path}: no such file")
    first = header(path)
    wanted = temperature if samples > 1 else 0.0
    if first.get("samples") != samples or first.get("temperature") != wanted:
        raise SystemExit(
            f"--full-from {path}: its outcomes are {first.get('samples')} answer(s) at "
            f"temperature {first.get('temperature')}, not {samples} at {wanted}; "
            "reuse a file of the same regime"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running gateway (default: start the embedded stack)")
    parser.add_argument("--out", type=Path, help=f"default: {DEFAULT_OUT}")
    parser.add_argument("--scale", type=float, default=1.0, help="task count multiplier")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--samples", type=int, default=1,
        help="answers per task and tier at --temperature (default 1: greedy); use another --out",
    )  # fmt: skip
    parser.add_argument("--temperature", type=float, default=0.7, help="with --samples > 1")
    parser.add_argument(
        "--full-from", type=Path, metavar="FILE",
        help="reuse the full tier's outcomes from FILE (same regime); ask only the fast tier",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help="one task of each source that needs no sandbox, into a temporary file unless "
        "--out: a smoke run",
    )  # fmt: skip
    args = parser.parse_args()
    if args.out is None and args.quick:  # never into the shipped outcomes
        args.out = Path(tempfile.mkdtemp(prefix="gearshift-outcomes-")) / "outcomes.jsonl"
    args.out = args.out or DEFAULT_OUT
    if args.full_from is not None:
        check_same_regime(args.full_from, args.samples, args.temperature)
    tasks = all_tasks(args.scale)
    if args.quick:
        tasks = [next(t for t in tasks if t.source == s) for s in QUICK_SOURCES]
    how = (args.concurrency, args.samples, args.temperature)
    if args.url:
        n = asyncio.run(
            collect(args.url.rstrip("/"), args.out, tasks, *how, full_from=args.full_from)
        )
    else:
        from bench.stack import embedded_stack
        from gateway.cli.embedded import fast_tier_identity
        from gateway.config import load_settings

        fast_tier = fast_tier_identity(load_settings().embedded)  # the stack reads the same env
        with embedded_stack() as url:
            n = asyncio.run(collect(url, args.out, tasks, *how, fast_tier, args.full_from))
    print(json.dumps({"collected": n, "total": len(load(args.out)), "out": str(args.out)}))


if __name__ == "__main__":
    main()
