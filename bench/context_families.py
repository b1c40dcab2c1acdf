"""The session templates of ``bench.context_sessions``: what a long tool-loop session does,
drawn from a seeded RNG, before any tool runs.

A plan is the workspace's files (written before the session, not part of its history), the
task, and the agent's tool calls in order. Early in the session three calls print a fact,
each on one line after the name a question asks it by (the mock upstream's reader and a
human checker find it the same way):

    number  ``orders_3: rows=41 total=53120 mean=1295.6`` (a CSV summed by run_python)
    code    ``RuntimeError: job_7 failed with E4821 ...`` (a traceback from run_shell)
    file    ``packed bundle_2 into dist/bundle_2-3fa9c1.tar (512 bytes)`` (a file run_python
            wrote; a later list_dir shows it too)

Then come calls whose output is what agents read all day (log tails, greps, word counts,
source files, listings, processing logs), and last the end task: ``python3 check.py``,
whose ``check_result = <number>`` is computed by the workspace's own code. The families
differ in task, files and the mix and order of the calls; every value is in the plan, so
the generator can check that the real tools printed it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.context_data import KINDS

LEVELS = ["INFO"] * 6 + ["DEBUG"] * 2 + ["WARN"]
PARTS = ("db", "cache", "api", "auth", "queue", "scheduler")


@dataclass(frozen=True)
class Fact:
    key: str  # the name the question asks it by
    kind: str  # one of KINDS
    value: str
    step: int  # the tool call (0-based) whose output prints it; -1: the end task


@dataclass
class Plan:
    family: str
    task: str
    files: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)

    def call(self, tool: str, **arguments: Any) -> int:
        self.calls.append((tool, arguments))
        return len(self.calls) - 1


# -- the fact steps ---------------------------------------------------------------


def number_fact(rng: random.Random, p: Plan, n: int) -> None:
    while True:  # a five-digit total: the reader's shape of a number
        rows = [rng.randint(250, 2400) for _ in range(rng.randint(30, 60))]
        if 10_000 <= sum(rows) <= 99_999:
            break
    name = f"{rng.choice(['orders', 'sales', 'events', 'refunds'])}_{n}"
    p.files[f"data/{name}.csv"] = "id,amount\n" + "".join(f"{i},{v}\n" for i, v in enumerate(rows))
    code = (
        "import csv\n"
        f"rows = list(csv.DictReader(open('data/{name}.csv')))\n"
        "amounts = [int(r['amount']) for r in rows]\n"
        "print('read', len(rows), 'rows; columns', list(rows[0]))\n"
        f"print(f'{name}: rows={{len(amounts)}} total={{sum(amounts)}} "
        f"mean={{sum(amounts) / len(amounts):.1f}}')\n"
        "print('largest', sorted(amounts)[-3:], 'smallest', sorted(amounts)[:3])\n"
    )
    step = p.call("run_python", code=code)
    p.facts.append(Fact(name, "number", str(sum(rows)), step))


def code_fact(rng: random.Random, p: Plan, n: int) -> None:
    key, code = f"job_{n}", f"E{rng.randint(1000, 9999)}"
    part = rng.choice(PARTS)
    p.files[f"jobs/{key}.py"] = (
        "import sys\n\n\n"
        f"def connect(name):\n    raise RuntimeError(\n"
        f"        '{key} failed with {code}: ' + name + ' refused the connection'\n    )\n\n\n"
        f"def main():\n    print('starting {key} against {part}', flush=True)\n"
        f"    connect('{part}')\n\n\nmain()\n"
    )
    step = p.call("run_shell", command=f"python3 jobs/{key}.py")
    p.facts.append(Fact(key, "code", code, step))


def file_fact(rng: random.Random, p: Plan, n: int) -> None:
    """The path is derived inside the script: the call that writes it does not name it."""
    key, salt, size = f"bundle_{n}", rng.getrandbits(32), rng.randint(200, 900)
    digest = hashlib.sha256(f"{key}:{salt}".encode()).hexdigest()[:6]
    code = (
        "import hashlib, os\n"
        f"name = hashlib.sha256(b'{key}:{salt}').hexdigest()[:6]\n"
        f"path = 'dist/{key}-' + name + '.tar'\n"
        "os.makedirs('dist', exist_ok=True)\n"
        f"open(path, 'wb').write(bytes({size}))\n"
        f"print('collected', {rng.randint(3, 40)}, 'files for {key}')\n"
        f"print('packed {key} into', path, '(' + str(os.path.getsize(path)) + ' bytes)')\n"
    )
    step = p.call("run_python", code=code)
    p.facts.append(Fact(key, "file", f"dist/{key}-{digest}.tar", step))


FACT_STEPS: dict[str, Callable[[random.Random, Plan, int], None]] = {
    "number": number_fact,
    "code": code_fact,
    "file": file_fact,
}

# -- the steps between ------------------------------------------------------------


def log_text(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        level, part = rng.choice(LEVELS), rng.choice(PARTS)
        out.append(f"12-01T{10 + i // 60:02d}:{i % 60:02d} {level} [{part}] handled "
                   f"{rng.randint(1, 400)} requests in {rng.randint(5, 900)} ms")  # fmt: skip
    return "\n".join(out) + "\n"


def source_text(rng: random.Random, name: str) -> str:
    funcs = []
    for f in range(rng.randint(3, 5)):
        arg = rng.choice(["items", "rows", "batch", "records"])
        funcs.append(
            f"def {name}_step_{f}({arg}, limit={rng.randint(2, 64)}):\n"
            f'    """Process {arg} in chunks of at most limit."""\n'
            f"    out = []\n    for i in range(0, len({arg}), limit):\n"
            f"        out.append(sum({arg}[i:i + limit]) % {rng.randint(97, 997)})\n"
            "    return out\n"
        )
    return f'"""The {name} module."""\n\n\n' + "\n\n".join(funcs)


NOISE = ("tail", "grep", "wc", "read", "list", "process", "head")
NOISE_WEIGHTS = {  # what a family's agent mostly does between the facts (NOISE's order)
    "service": (4, 4, 1, 1, 1, 1, 2),  # reads its logs
    "data": (1, 1, 2, 1, 1, 5, 3),  # runs processing scripts, looks at data
    "build": (1, 2, 2, 4, 3, 1, 1),  # reads sources, lists the tree
    "migration": (1, 1, 1, 1, 1, 1, 1),
}


def noise_step(rng: random.Random, p: Plan) -> None:
    """One call of the kind agents make between the interesting ones."""
    logs = sorted(f for f in p.files if f.endswith(".log"))
    kind = rng.choices(NOISE, NOISE_WEIGHTS[p.family])[0]
    if kind == "tail":
        p.call("run_shell", command=f"tail -n {rng.randint(12, 24)} {rng.choice(logs)}")
    elif kind == "grep":
        p.call(
            "run_shell", command=f"grep -n '{rng.choice(PARTS)}' {rng.choice(logs)} | head -n 16"
        )
    elif kind == "wc":
        p.call("run_shell", command="wc -l logs/*.log src/*.py")
    elif kind == "read":
        p.call("read_file", path=rng.choice(sorted(f for f in p.files if f.startswith("src/"))))
    elif kind == "list":
        p.call("list_dir", path=rng.choice(["src", "logs", "."]))
    elif kind == "head":
        p.call("run_shell", command=f"head -n {rng.randint(12, 24)} {rng.choice(logs)}")
    else:
        seed, batches = rng.randint(0, 10**6), rng.randint(10, 20)
        p.call("run_python", code=(
            f"import random\nr = random.Random({seed})\n"
            f"for b in range({batches}):\n"
            "    print(f'batch {b}: {r.randint(50, 400)} items, {r.randint(0, 9)} retries, '\n"
            "          f'{r.randint(20, 3000)} ms')\n"
        ))  # fmt: skip


# -- the families -----------------------------------------------------------------

FAMILIES = {
    "service": "The service on the staging host stops after a few minutes. Find out why from "
    "its logs, jobs and data, fix it, and run check.py.",
    "data": "The nightly report's totals look wrong. Go through the data files and the jobs "
    "that build them, find the bad step, and run check.py.",
    "build": "The release build fails on CI. Reproduce it, find which job and bundle are "
    "involved, and run check.py when it passes.",
    "migration": "We are migrating the workers to the new queue. Inventory the jobs, data and "
    "bundles, note what fails, and run check.py at the end.",
}


def plan_session(rng: random.Random, family: str, steps: int) -> Plan:
    """A session of ``steps`` tool calls: the facts in its first third, the check last."""
    p = Plan(family, FAMILIES[family])
    for name in rng.sample(["app", "worker", "gateway", "cron"], 2):
        p.files[f"logs/{name}.log"] = log_text(rng, rng.randint(60, 120))
    for name in rng.sample(["loader", "merge", "report", "queue", "retry"], 3):
        p.files[f"src/{name}.py"] = source_text(rng, name)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    fact_at = sorted(rng.sample(range(1, max(4, steps // 3)), len(kinds)))
    p.call("list_dir", path=".")
    for i in range(1, steps - 1):
        if i in fact_at:
            FACT_STEPS[kinds[fact_at.index(i)]](rng, p, rng.randint(1, 99))
        else:
            noise_step(rng, p)
    end_task(rng, p)
    return p


def end_task(rng: random.Random, p: Plan) -> None:
    """``check.py`` sums the workspace's data: the answer comes from the files as written."""
    weights = [rng.randint(3, 97) for _ in range(3)]
    p.files["check.py"] = (
        "import glob\n\n"
        "total = 0\n"
        "for path in sorted(glob.glob('src/*.py')) + sorted(glob.glob('logs/*.log')):\n"
        "    total += len(open(path).read().splitlines())\n"
        f"result = 10000 + (total * {weights[0]} + {weights[1]}) * {weights[2]} % 89999\n"
        "print('checked', len(glob.glob('src/*.py')), 'modules and',\n"
        "      len(glob.glob('logs/*.log')), 'logs')\n"
        "print(f'check_result = {result}')\n"
    )
    total = sum(
        len(text.splitlines())
        for path, text in p.files.items()
        if path.startswith(("src/", "logs/")) and path.endswith((".py", ".log"))
    )
    value = 10000 + (total * weights[0] + weights[1]) * weights[2] % 89999
    p.call("run_shell", command="python3 check.py")
    p.facts.append(Fact("check_result", "number", str(value), -1))
