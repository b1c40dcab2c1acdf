"""An agent-sized chat request: a coding agent 14 tool calls into its task, about 39 KB.

30 messages (a system prompt, the user's task, then 14 assistant tool calls each followed
by its result), 8 tools with JSON schemas, tool results of 1.4-2 KB each (source files,
search hits as JSON, test and shell output). Generated from a seed, so every proxy in a
benchmark run gets the same bytes:

    python -m bench.agent_body [--seed 0] > agent.json

``session_bodies`` gives the whole session the body ends: the 15 requests the agent sent,
from the first (system prompt and task) to this one, each the previous one's messages
plus a tool call and its result (``bench.loadgen --sessions`` sends them so).
``session_answers`` gives what the model answered at each step: the tool call the next
request carries (the last step: a closing text), which ``bench.mock_upstream`` answers
with, so that the agent echoes the answers it got, as agents do. The task names the
session's seed (``TICKET``): every session's first request is its own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
from typing import Any

RESULTS = 14
RESULT_BYTES = (1400, 2000)
WORDS = ["order", "invoice", "customer", "archive", "migration", "schedule", "report", "retry",
         "timeout", "cache", "index", "session", "token", "request", "response", "payload",
         "record", "writer", "reader", "buffer", "stream", "batch"]  # fmt: skip


USAGE = (
    " Paths are relative to the repository root and may not leave it. The result is plain "
    "text, truncated to 64 KB with a note saying so; errors come back as text starting with "
    "'error:' and never raise. Calls are logged with their arguments for the session's review."
)


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description + USAGE,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": [next(iter(properties))],
                "additionalProperties": False,
            },
        },
    }


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _i(description: str, low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": low, "maximum": high}


TOOLS = [
    _tool("read_file", "Read a text file of the repository, optionally a range of lines.",
          {"path": _s("Path relative to the repository root"),
           "start_line": _i("First line to return, 1-based", 1, 100000),
           "end_line": _i("Last line to return, inclusive", 1, 100000)}),
    _tool("write_file", "Replace the contents of a file, creating it and its folders if needed.",
          {"path": _s("Path relative to the repository root"),
           "content": _s("The whole new content of the file"),
           "mode": _s("How to write", enum=["overwrite", "append"])}),
    _tool("search_code", "Search the repository with a regular expression; returns at most 50 hits.",
          {"pattern": _s("A Python regular expression"),
           "glob": _s("Only files matching this glob, e.g. '**/*.py'"),
           "context_lines": _i("Lines of context around each hit", 0, 10)}),
    _tool("list_directory", "List a folder's entries with their sizes and kinds.",
          {"path": _s("Folder relative to the repository root"),
           "depth": _i("How many levels to descend", 1, 5)}),
    _tool("run_command", "Run a shell command in the sandbox and return its exit status and output.",
          {"command": _s("The command line, run by /bin/sh -c"),
           "timeout_s": _i("Kill it after this many seconds", 1, 600),
           "env": {"type": "object", "description": "Extra environment variables",
                   "additionalProperties": {"type": "string"}}}),
    _tool("run_tests", "Run the test suite or a part of it with pytest and summarize the result.",
          {"selector": _s("A pytest node id, file or folder"),
           "markers": _s("A pytest -m expression"),
           "fail_fast": {"type": "boolean", "description": "Stop at the first failure"}}),
    _tool("git_diff", "Show the working tree's changes against a revision.",
          {"revision": _s("A commit, branch or tag; HEAD by default"),
           "paths": {"type": "array", "items": {"type": "string"},
                     "description": "Limit the diff to these paths"}}),
    _tool("http_get", "Fetch a URL from the allow-listed documentation hosts.",
          {"url": _s("An https URL", format="uri"),
           "max_bytes": _i("Truncate the body after this many bytes", 256, 65536)}),
]  # fmt: skip

RULES = [
    "Read the code before you change it; never guess a file's contents or a function's signature.",
    "Make the smallest change that fixes the problem; leave unrelated code, comments and formatting alone.",
    "Run the tests that cover a change before you report it done, and say which ones you ran.",
    "Prefer search_code to reading whole folders, and read_file with a line range for long files.",
    "Keep shell commands non-interactive and bounded in time; never start servers that outlive the command.",
    "Do not touch files outside the task, the lock files, or anything under .git.",
    "When a test fails, read its output to the end before changing code; the first error is often not the cause.",
    "Never weaken or delete a test to make it pass; if a test is wrong, say why and fix it separately.",
    "Secrets never appear in output: redact tokens, keys and passwords if a tool returns them.",
    "Use the project's own helpers and conventions (logging, errors, configuration) rather than new ones.",
    "If the task is ambiguous, make the most reasonable assumption, state it, and continue.",
    "Write commit-ready code: typed, formatted like its neighbours, with a test for the fixed behaviour.",
    "Stop after 40 tool calls without progress and summarize what you learned and what blocks you.",
    "At the end, explain what was wrong, what you changed and how you checked it, in a few sentences.",
]
LAYOUT = "\n".join(
    f"  src/{a}/{b}.py  {len(a) * 731 + len(b) * 97} bytes" for a in WORDS[:10] for b in WORDS[10:]
)
SYSTEM = (
    "You are a software engineering agent working in a Python repository through tools. "
    "Follow these rules:\n"
    + "\n".join(f"{i}. {rule}" for i, rule in enumerate(RULES, 1))
    + "\n\nThe repository (main modules):\n"
    + LAYOUT
)


def _code(rng: random.Random) -> str:
    a, b, c = rng.sample(WORDS, 3)
    n = rng.randint(2, 90)
    return (
        f"def {a}_{b}(items, limit={n}):\n"
        f"    '''Return the {c} of every {a} in items, at most {n} of them.'''\n"
        f"    found = [x.{c} for x in items if x.{b} is not None]\n"
        f"    if len(found) > limit:\n"
        f"        raise ValueError(f'too many {a}s: {{len(found)}} > {{limit}}')\n"
        f"    return sorted(found, key=lambda v: (v.{b}, v.{c}))\n\n"
    )


def _hits(rng: random.Random) -> str:
    a, b = rng.sample(WORDS, 2)
    line = rng.randint(1, 900)
    hit = {
        "path": f"src/{a}/{b}.py",
        "line": line,
        "text": f"    {a}_{b} = load_{b}({a}, retries=3)",
    }
    return json.dumps(hit) + "\n"


def _test_log(rng: random.Random) -> str:
    a, b = rng.sample(WORDS, 2)
    status = rng.choice(["PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED"])
    return f"tests/test_{a}.py::test_{b}_{rng.randint(1, 40)} {status} [{rng.randint(1, 99):3d}%]\n"


def _listing(rng: random.Random) -> str:
    a, b = rng.sample(WORDS, 2)
    return f"-rw-r--r--  {rng.randint(200, 90000):6d}  2026-11-{rng.randint(1, 30):02d}  src/{a}/{b}.py\n"


KINDS = {"read_file": _code, "search_code": _hits, "run_tests": _test_log,
         "list_directory": _listing, "run_command": _test_log, "git_diff": _code}  # fmt: skip


def _arguments(name: str, rng: random.Random) -> dict[str, Any]:
    a, b = rng.sample(WORDS, 2)
    return {
        "read_file": {"path": f"src/{a}/{b}.py", "start_line": 1, "end_line": 120},
        "search_code": {"pattern": rf"def {a}_\w+\(", "glob": "**/*.py", "context_lines": 2},
        "run_tests": {"selector": f"tests/test_{a}.py", "fail_fast": True},
        "list_directory": {"path": f"src/{a}", "depth": 2},
        "run_command": {"command": f"python -m pytest -q tests/test_{a}.py -k {b}", "timeout_s": 120},
        "git_diff": {"revision": "HEAD", "paths": [f"src/{a}/{b}.py"]},
    }[name]  # fmt: skip


def _result(name: str, rng: random.Random) -> str:
    size = rng.randint(*RESULT_BYTES)
    parts: list[str] = []
    while sum(map(len, parts)) < size:
        parts.append(KINDS[name](rng))
    return "".join(parts)[:size]


TICKET = re.compile(rb"\(ticket OPS-(\d+)\)")  # the seed, in the task
CLOSING = "The limit was applied before the filter; moved it after, and the tests pass."


def agent_body(seed: int = 0) -> dict[str, Any]:
    """The request (without ``model`` and ``stream``): deterministic for a seed."""
    return session_bodies(seed)[-1]


def session_bodies(seed: int = 0, results: int = RESULTS) -> list[dict[str, Any]]:
    """A whole agent session as the agent sends it, step by step: the first request holds
    the system prompt and the task, each next one the previous messages plus one assistant
    tool call and its result (``results + 1`` requests, the last one ``agent_body``)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "The nightly archive job fails with 'too many orders' "
         f"since the last release (ticket OPS-{seed}). Find the cause, fix it, and make sure "
         "the tests pass."},
    ]  # fmt: skip
    bodies = [_request(messages)]
    for i in range(results):
        name = rng.choice(sorted(KINDS))
        call = {
            "id": f"call_{seed}_{i:02d}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(_arguments(name, rng))},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": _result(name, rng)})
        bodies.append(_request(messages))
    return bodies


def session_answers(seed: int = 0, results: int = RESULTS) -> list[dict[str, Any]]:
    """The model's answer to each request of ``session_bodies(seed, results)``: the
    assistant message the next request carries, and ``CLOSING`` for the last."""
    bodies = session_bodies(seed, results)
    answers = [
        after["messages"][len(before["messages"])] for before, after in itertools.pairwise(bodies)
    ]
    return [*answers, {"role": "assistant", "content": CLOSING}]


def _request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"messages": list(messages), "tools": TOOLS, "max_tokens": 32, "temperature": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    print(json.dumps(agent_body(parser.parse_args().seed)))


if __name__ == "__main__":
    main()
