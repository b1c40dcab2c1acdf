"""Multi-step tool-loop sessions, generated on the real stack with the real sandbox, for the
agentic workload of ``bench.tiers`` (``bench.tier_agentic``).

    python -m bench.agentic_sessions --out bench/data/agentic_sessions.jsonl [--sessions 24]

Starts ``gearshift serve`` (``bench.stack.serve``: both tiers, the sandbox service on, the
store off) with a grant of the file and process tools to the anonymous caller's tenant,
then plays each session as a client agent would: its files are written into a fresh sandbox
workspace (``POST /v1/tools/write_file``), and the full tier is asked, greedy, with the
sandbox's tool schemas (``GET /v1/tools``) offered on every step. The default model calls
tools only when forced, so each tool step names its tool (``tool_choice``: the session's
plan) and the last step is left to answer freely. Each call the model makes is run for real
(``POST /v1/tools/{name}``); its output (or the sandbox's refusal) goes back as the ``tool``
message, as an agent's loop would feed it. Sessions are played ``--parallel`` at a time (their
steps batch in the full tier's vLLM server, as concurrent agents' would); ``--url`` plays
them against a running gateway that has the sandbox and the grant (``stack_env``).

Six kinds of task (inspect a CSV, fix a failing function and rerun its test, grep a log,
compute from a data file, edit a JSON config, query a JSON list), each over files drawn from
a seeded RNG: the structure (files, prompts, plans) depends on the seed only; the model's
outputs and tool results are what the stack answered. One JSON line per step::

    {"session": "fix-0", "kind": "fix", "step": 2, "of": 5, "forced": "write_file",
     "request": {...chat body as sent, model "full"...},
     "output": {"content": ..., "tool_calls": [...], "finish_reason": ..., "completion_tokens": n},
     "tool": {"name": ..., "arguments": ..., "status": 200, "text": "..."} | null}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.stack import serve

TOOLS = ("run_python", "run_shell", "read_file", "write_file", "list_dir")
SYSTEM = (
    "You are a coding agent working in a sandbox. The task's files are in the current "
    "directory. Use the tools to inspect and change them; keep tool arguments short."
)
TOOL_TOKENS, ANSWER_TOKENS = 128, 160  # max_tokens of a tool step and of the last step
RETRIED = (429, 502, 503, 504)
TOOL_TEXT_MAX = 3000  # characters of a tool's output fed back (agents truncate too)


@dataclass(frozen=True)
class Task:
    kind: str
    files: dict[str, str]
    prompt: str
    plan: tuple[str, ...]  # the forced tool of each tool step; then one free step


def _csv(rng: random.Random) -> Task:
    regions = rng.sample(["north", "south", "east", "west", "central"], 3)
    rows = [f"{d},{rng.choice(regions)},{rng.randint(1, 9)},{rng.randint(5, 60)}.00"
            for d in range(1, 21)]  # fmt: skip
    text = "day,region,units,price\n" + "\n".join(rows) + "\n"
    return Task("csv", {"sales.csv": text},
                "sales.csv has one row per sale. Compute the total revenue (units * price) "
                "per region and say which region earned most.",
                ("list_dir", "read_file", "run_python", "run_python"))  # fmt: skip


def _fix(rng: random.Random) -> Task:
    fn = rng.choice(["mean", "average", "midpoint"])
    values = [rng.randint(1, 20) for _ in range(4)]
    src = (f"def {fn}(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
           f"    return total / (len(xs) + 1)\n")  # fmt: skip
    test = (
        f"from stats import {fn}\n\nvalues = {values}\n"
        f"assert {fn}(values) == {sum(values) / len(values)!r}, {fn}(values)\nprint('ok')\n"
    )
    return Task("fix", {"stats.py": src, "test_stats.py": test},
                f"python3 test_stats.py fails. Find the bug in {fn}() in stats.py, fix the "
                "file and run the test again until it prints ok.",
                ("run_shell", "read_file", "write_file", "run_shell", "run_shell"))  # fmt: skip


def _log(rng: random.Random) -> Task:
    parts = ["db", "cache", "api", "auth"]
    lines = []
    for i in range(40):
        level = rng.choice(["INFO"] * 4 + ["WARN", "ERROR"])
        lines.append(f"2026-12-01T10:{i:02d}:00 {level} [{rng.choice(parts)}] event {i}")
    return Task("log", {"app.log": "\n".join(lines) + "\n"},
                "app.log is a service log. Find every ERROR line and count the errors per "
                "component (the name in brackets).",
                ("run_shell", "run_shell", "run_python"))  # fmt: skip


def _compute(rng: random.Random) -> Task:
    numbers = [rng.randint(2, 500) for _ in range(25)]
    return Task("compute", {"numbers.txt": "\n".join(map(str, numbers)) + "\n"},
                "numbers.txt holds one integer per line. How many of them are prime, and "
                "what is the sum of the primes?",
                ("read_file", "run_python", "run_python"))  # fmt: skip


def _config(rng: random.Random) -> Task:
    port = rng.randint(8000, 8999)
    config = {"name": f"svc-{rng.randint(10, 99)}", "debug": True, "port": port,
              "workers": rng.randint(1, 8), "log_level": "debug"}  # fmt: skip
    new_port = port + rng.randint(1, 50)
    return Task("config", {"config.json": json.dumps(config, indent=2) + "\n"},
                f"In config.json set debug to false, port to {new_port} and log_level to "
                "info; keep everything else. Then show the file to check it.",
                ("read_file", "write_file", "read_file", "run_shell"))  # fmt: skip


def _orders(rng: random.Random) -> Task:
    orders = [{"id": 100 + i, "customer": rng.choice(["ana", "bo", "cy", "dee"]),
               "total": round(rng.uniform(5, 300), 2)} for i in range(12)]  # fmt: skip
    return Task("orders", {"orders.json": json.dumps(orders, indent=1) + "\n"},
                "orders.json lists orders. Which customer spent most in total, and what is "
                "the id of the largest single order?",
                ("list_dir", "read_file", "run_python"))  # fmt: skip


KINDS: dict[str, Callable[[random.Random], Task]] = {
    "csv": _csv, "fix": _fix, "log": _log, "compute": _compute, "config": _config,
    "orders": _orders,
}  # fmt: skip


def tasks(n: int, seed: int = 22) -> list[tuple[str, Task]]:
    """``n`` sessions, the kinds in turn, each drawn from its own seeded RNG."""
    kinds = list(KINDS)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        rng = random.Random(f"{seed}-{kind}-{i // len(kinds)}")
        out.append((f"{kind}-{i // len(kinds)}", KINDS[kind](rng)))
    return out


def tool_text(status: int, data: dict[str, Any]) -> str:
    """What the agent feeds back: stdout and stderr, a file tool's output as JSON, or the
    sandbox's refusal; cut to ``TOOL_TEXT_MAX`` characters."""
    if status != 200:
        text = f"error: {(data.get('error') or {}).get('message', data)}"
    elif data.get("output") is not None:
        text = json.dumps(data["output"])
    else:
        text = (data.get("stdout") or "") + (data.get("stderr") or "")
        if data.get("exit_status") not in (0, None):
            text += f"\n[exit status {data['exit_status']}]"
    return text[:TOOL_TEXT_MAX]


class Player:
    """Plays sessions against one gateway."""

    def __init__(self, http: aiohttp.ClientSession, url: str, schemas: list[dict[str, Any]]):
        self.http, self.url, self.schemas = http, url, schemas

    async def tool(self, session: str, name: str, arguments: Any) -> tuple[int, str]:
        body = {"arguments": arguments if isinstance(arguments, dict) else {}}
        headers = {"x-session-id": session}
        async with self.http.post(f"{self.url}/v1/tools/{name}", json=body, headers=headers) as r:
            data = await r.json(content_type=None)
        return r.status, tool_text(r.status, data)

    async def chat(self, body: dict[str, Any], tries: int = 3) -> dict[str, Any]:
        """The full tier's answer; a timeout or overload (a loaded machine) is asked again."""
        for attempt in range(tries):
            async with self.http.post(f"{self.url}/v1/chat/completions", json=body) as r:
                data = await r.json(content_type=None)
            if r.status == 200 or r.status not in RETRIED or attempt == tries - 1:
                break
            print(f"  chat: HTTP {r.status}, asking again", flush=True)
        if r.status != 200:
            raise RuntimeError(f"chat: HTTP {r.status}: {str(data)[:300]}")
        choice = data["choices"][0]
        return {
            "content": choice["message"].get("content"),
            "tool_calls": choice["message"].get("tool_calls") or [],
            "finish_reason": choice.get("finish_reason"),
            "completion_tokens": data["usage"]["completion_tokens"],
        }

    async def play(self, name: str, task: Task, run_id: str) -> list[dict[str, Any]]:
        session = f"{name}-{run_id}"
        for path, text in task.files.items():
            status, out = await self.tool(session, "write_file", {"path": path, "content": text})
            if status != 200:
                raise RuntimeError(f"{name}: writing {path}: {out}")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task.prompt},
        ]
        steps = []
        for k, forced in enumerate([*task.plan, None]):
            body: dict[str, Any] = {
                "model": "full", "messages": [dict(m) for m in messages], "tools": self.schemas,
                "max_tokens": ANSWER_TOKENS if forced is None else TOOL_TOKENS,
                "temperature": 0, "seed": 0,
            }  # fmt: skip
            if forced is not None:
                body["tool_choice"] = {"type": "function", "function": {"name": forced}}
            output = await self.chat(body)
            step = {"session": name, "kind": task.kind, "step": k, "of": len(task.plan) + 1,
                    "forced": forced, "request": body, "output": output, "tool": None}  # fmt: skip
            steps.append(step)
            if forced is None or not output["tool_calls"]:
                break
            call = output["tool_calls"][0]  # one call per step: the forced one
            fn = call["function"]
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = None
            status, text = (
                await self.tool(session, fn["name"], args) if args is not None
                else (400, "error: the arguments are not valid JSON")
            )  # fmt: skip
            step["tool"] = {"name": fn["name"], "arguments": fn.get("arguments"),
                            "status": status, "text": text}  # fmt: skip
            messages.append({"role": "assistant", "content": output["content"],
                             "tool_calls": [call]})  # fmt: skip
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        return steps


def stack_env(root: Path) -> dict[str, str]:
    """The sandbox on, its workspaces under ``root``, the file and process tools granted to
    the anonymous caller's tenant; the store off (nothing here reads it)."""
    grant = {"tools": list(TOOLS), "read": ["*"], "write": ["*"]}
    return {
        "GEARSHIFT_STORE__ENABLED": "false",
        "GEARSHIFT_SANDBOX__ENABLED": "true",
        "GEARSHIFT_SANDBOX__ROOT": str(root),
        "GEARSHIFT_SANDBOX__GRANTS_BY_TENANT": json.dumps({"default": grant}),
    }


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, separators=(",", ":")) + "\n"


async def generate(url: str, n: int, seed: int, out: Path, parallel: int = 4) -> int:
    """Plays ``n`` sessions, ``parallel`` at a time (their steps batch in vLLM), appending
    each to ``out`` when it ends (a run cut short keeps whole sessions), and at the end
    rewrites ``out`` in session order."""
    timeout = aiohttp.ClientTimeout(total=3600)
    run_id = f"{os.getpid()}-{int(time.time())}"
    played: dict[str, list[dict[str, Any]]] = {}
    gate = asyncio.Semaphore(parallel)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.get(url + "/v1/tools") as r:
            listing = (await r.json())["data"]
        schemas = [t for t in listing if t["function"]["name"] in TOOLS]
        player = Player(http, url, schemas)

        async def one(name: str, task: Task) -> None:
            async with gate:
                began = time.perf_counter()
                played[name] = await player.play(name, task, run_id)
                with out.open("a") as f:
                    f.write("".join(_line(r) for r in played[name]))
                print(f"  {name}: {len(played[name])} steps in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip

        todo = tasks(n, seed)
        out.write_text("")
        await asyncio.gather(*(one(name, task) for name, task in todo))
    rows = [step for name, _ in todo for step in played[name]]
    out.write_text("".join(_line(r) for r in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("bench/data/agentic_sessions.jsonl"))
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--parallel", type=int, default=4, help="sessions played at a time")
    p.add_argument("--url", help="a running gateway with the sandbox and the grant (else started)")
    args = p.parse_args(argv)
    if args.url:
        url = args.url.rstrip("/")
        steps = asyncio.run(generate(url, args.sessions, args.seed, args.out, args.parallel))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "workspaces"
            root.mkdir()
            os.chmod(tmp, 0o711)  # the sandbox's uid must traverse to the workspaces
            print("starting the stack with the sandbox", flush=True)
            with serve(Path(tmp) / "serve.log", stack_env(root)) as stack:
                steps = asyncio.run(
                    generate(stack.url, args.sessions, args.seed, args.out, args.parallel)
                )
    print(json.dumps({"sessions": args.sessions, "steps": steps, "out": str(args.out)}))


if __name__ == "__main__":
    main()
