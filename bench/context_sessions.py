"""The stored sessions of ``bench.context``: long tool loops whose tool outputs come from the
sandbox's real tools, generated once and replayed on every machine.

    python -m bench.context_sessions [--out bench/data/context_sessions.jsonl.gz]
                                     [--sessions 200] [--seed 24] [--steps 22,30]

Each session is planned from its own seeded RNG (``bench.context_families``: four families
of task, taken in turn), its files are written into a fresh workspace of an in-process
``sandbox.core.Sandbox`` (bubblewrap, seccomp, cgroups: needs root, as the service does)
with the ``write_file`` tool, and its agent's tool calls (scripted, not a model's) are run
there one by one: ``run_python``, ``run_shell``, ``read_file``, ``list_dir``. What a call
printed goes into the history as the ``tool`` message, as an agent's loop feeds it
(``bench.agentic_sessions.tool_text``). The generator checks that every planned fact is in
the output of its step; a session whose tools printed otherwise stops the run.

Deterministic: the same seed gives the same bytes (sorted keys; a gzip stream without name
or time; tool outputs hold no time, pid or host path: the workspace's path is replaced by
``.``, and nothing timed is printed). One JSON line per session::

    {"id": "service-000", "family": "service", "messages": [system, user, assistant, tool, ...],
     "questions": [{"key": "job_7", "kind": "code", "value": "E4821", "step": 3, "end": false},
                   ..., {"key": "check_result", "kind": "number", ..., "end": true}]}

``step`` is the tool call whose output holds the answer. The manifest beside the file
(``.manifest.json``) has the count, the uncompressed text's sha256 (what ``bench.context``
checks before replaying: zlib builds may compress the same text differently) and the
generator's version.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
from pydantic import SecretStr

from bench.agentic_sessions import tool_text
from bench.context_data import DATA, SYSTEM, manifest_path
from bench.context_families import FAMILIES, Plan, plan_session
from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.protocol import Principal, SessionCreate, ToolCall

VERSION = 1  # bump when a change to the families or to this file changes the sessions' bytes
WHO = Principal(tenant="bench", key="context")
GRANT = GrantConfig(
    tools=["run_python", "run_shell", "read_file", "write_file", "list_dir"],
    read=["*"],
    write=["*"],
    resources=Resources(cpu_s=5, memory_mb=256, pids=32, wall_s=20, output_bytes=16384),
)


class ToolsDisagree(RuntimeError):
    """A planned fact is not in the output of its step, or a call did not run to its end."""


async def play(sandbox: Sandbox, index: int, plan: Plan) -> dict[str, Any]:
    """Run ``plan``'s calls in a fresh workspace; the session's stored record."""
    session = sandbox.create(SessionCreate(principal=WHO))
    root = str(session.workspace.root)
    try:
        dirs = sorted({path.rpartition("/")[0] for path in plan.files} - {""})
        await setup(sandbox, session.id, "run_shell", {"command": "mkdir -p " + " ".join(dirs)})
        for path, text in sorted(plan.files.items()):
            await setup(sandbox, session.id, "write_file", {"path": path, "content": text})
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": plan.task},
        ]
        outputs = []
        for j, (tool, arguments) in enumerate(plan.calls):
            text = await run(sandbox, session.id, root, tool, arguments)
            call = {"id": f"call_{j}", "type": "function", "function": {
                "name": tool, "arguments": json.dumps(arguments, sort_keys=True)}}  # fmt: skip
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{j}", "content": text})
            outputs.append(text)
    finally:
        await sandbox.remove(session.id)
    questions = []
    for fact in plan.facts:
        step = fact.step if fact.step >= 0 else len(outputs) - 1
        if fact.key not in outputs[step] or fact.value not in outputs[step]:
            raise ToolsDisagree(f"session {index}: {fact} not in {outputs[step][:400]!r}")
        questions.append({"key": fact.key, "kind": fact.kind, "value": fact.value,
                          "step": step, "end": fact.step < 0})  # fmt: skip
    return {"id": f"{plan.family}-{index:03d}", "family": plan.family, "messages": messages,
            "questions": questions}  # fmt: skip


async def run(sandbox: Sandbox, sid: str, root: str, tool: str, arguments: dict[str, Any]) -> str:
    result = await sandbox.call(tool, ToolCall(principal=WHO, session_id=sid, arguments=arguments))
    if not result.allowed or result.limit or result.truncated:  # a loaded machine's timeout
        raise ToolsDisagree(f"{tool} refused or cut short: {result.reason} {result.limit}")
    return tool_text(200, result.model_dump()).replace(root, ".")


async def setup(sandbox: Sandbox, sid: str, tool: str, arguments: dict[str, Any]) -> None:
    """A call that prepares the workspace (not part of the history): it must succeed."""
    result = await sandbox.call(tool, ToolCall(principal=WHO, session_id=sid, arguments=arguments))
    if not result.allowed or result.exit_status != 0:
        raise ToolsDisagree(f"{tool} failed: {result.reason} {result.stderr}")


def plans(seed: int, count: int, steps: tuple[int, int]) -> list[Plan]:
    """Session ``i``'s plan, from its own RNG (``seed:i``): one session can be regenerated
    alone, and adding sessions leaves the earlier ones as they were."""
    families = sorted(FAMILIES)
    out = []
    for i in range(count):
        rng = random.Random(f"{seed}:{i}")
        out.append(plan_session(rng, families[i % len(families)], rng.randint(*steps)))
    return out


async def generate(seed: int, count: int, steps: tuple[int, int], parallel: int) -> list[bytes]:
    root = Path(tempfile.mkdtemp(prefix="gearshift-ctx-"))
    os.chmod(root, 0o711)  # the sandbox's uid reaches the workspaces under it
    sandbox = Sandbox(SandboxConfig(token=SecretStr("bench"), root=root, pool=0,
                                    grants_by_tenant={WHO.tenant: GRANT}))  # fmt: skip
    gate = asyncio.Semaphore(parallel)

    async def one(i: int, plan: Plan) -> bytes:
        async with gate:
            record = await play(sandbox, i, plan)
        return orjson.dumps(record, option=orjson.OPT_SORT_KEYS) + b"\n"

    try:
        return list(
            await asyncio.gather(*(one(i, p) for i, p in enumerate(plans(seed, count, steps))))
        )
    finally:
        await sandbox.close()
        shutil.rmtree(root, ignore_errors=True)


def store(lines: list[bytes], out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The gzip file (no name, time 0: the same text gives the same bytes with one zlib)
    and its manifest."""
    text = b"".join(lines)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buf.getvalue())
    families: dict[str, int] = {}
    for line in lines:
        family = str(orjson.loads(line).get("family"))
        families[family] = families.get(family, 0) + 1
    manifest = {"count": len(lines), "sha256": hashlib.sha256(text).hexdigest(),
                "gzip_sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
                "generator_version": VERSION, "families": families, **meta}  # fmt: skip
    manifest_path(out).write_bytes(
        orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    )
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DATA)
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--seed", type=int, default=24)
    p.add_argument("--steps", default="22,30", help="tool calls per session: least,most")
    p.add_argument("--parallel", type=int, default=4, help="sessions played at once")
    args = p.parse_args()
    least, most = (int(x) for x in args.steps.split(","))
    lines = asyncio.run(generate(args.seed, args.sessions, (least, most), args.parallel))
    meta = {"seed": args.seed, "steps": [least, most],
            "command": f"python -m bench.context_sessions --sessions {args.sessions} "
                       f"--seed {args.seed} --steps {least},{most}"}  # fmt: skip
    print(json.dumps(store(lines, args.out, meta), sort_keys=True))


if __name__ == "__main__":
    main()
