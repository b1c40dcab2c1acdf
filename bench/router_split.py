"""The locked test split of the checkable router tasks, and the dev split everything is tuned on.

    python -m bench.router_split            # check the committed split against the tasks
    python -m bench.router_split --write    # (re)write it: only when the task set changes

A task's **family** is its source and category (``bfcl/multiple``, ``reasoning_gym/gcd``,
``trivia/exact_answer``: one generator or template). Tasks are first grouped by the SHA-256
of their request body (canonical JSON): exact duplicates — the same prompt under two ids,
33 of them among the reasoning-gym tasks — form one cluster and always land on the same side.
Within each family the clusters are ordered by that hash and the first ``TEST_FRACTION`` of
them are the **test** split, the rest the **dev** split: every family has test tasks (so
each can be held out and judged), the assignment needs no random generator, and it depends
on the requests only.

The split is committed as ``bench/data/router_split.json`` with its own SHA-256 (over the
two id → body-hash maps), and locked: ``bench.router_eval`` trains, picks margins, L2
strengths and thresholds on dev tasks only and reports on test tasks; a task whose body
changed, or a new task, fails the check until the split is written again, deliberately.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.router_tasks import Task, all_tasks

SPLIT_PATH = Path(__file__).parent / "data" / "router_split.json"
TEST_FRACTION = 0.4
SIDES = ("dev", "test")


def body_hash(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def family(task: Task) -> str:
    return f"{task.source}/{task.category}"


def _digest(sides: Mapping[str, Mapping[str, str]]) -> str:
    return hashlib.sha256(json.dumps({k: sides[k] for k in SIDES}, sort_keys=True).encode()).hexdigest()  # fmt: skip


@dataclass(frozen=True)
class Split:
    """Task id -> body hash, per side; ``sha256`` names this exact split."""

    dev: Mapping[str, str]
    test: Mapping[str, str]
    families: Mapping[str, Mapping[str, int]]
    sha256: str

    def side(self, task_id: str) -> str | None:
        return "test" if task_id in self.test else "dev" if task_id in self.dev else None

    @property
    def test_bodies(self) -> frozenset[str]:
        return frozenset(self.test.values())


def build(tasks: Iterable[Task], fraction: float = TEST_FRACTION) -> Split:
    checkable = sorted((t for t in tasks if t.check is not None), key=lambda t: t.id)
    clusters: dict[str, list[Task]] = defaultdict(list)
    for t in checkable:
        clusters[body_hash(t.body)].append(t)
    by_family: dict[str, list[str]] = defaultdict(list)
    for digest, members in clusters.items():
        by_family[family(members[0])].append(digest)  # members are in id order
    sides: dict[str, dict[str, str]] = {side: {} for side in SIDES}
    counts: dict[str, dict[str, int]] = {}
    for fam, digests in sorted(by_family.items()):
        digests.sort()
        cut = round(len(digests) * fraction)
        counts[fam] = {"dev": 0, "test": 0}
        for i, digest in enumerate(digests):
            side = "test" if i < cut else "dev"
            for t in clusters[digest]:
                sides[side][t.id] = digest
                counts[fam][side] += 1
    return Split(sides["dev"], sides["test"], counts, _digest(sides))


def write(split: Split, path: Path = SPLIT_PATH) -> None:
    doc = {
        "about": "locked test split of the checkable router tasks (python -m bench.router_split)",
        "test_fraction": TEST_FRACTION,
        "sha256": split.sha256,
        "families": split.families,
        "dev": dict(sorted(split.dev.items())),
        "test": dict(sorted(split.test.items())),
    }
    path.write_text(json.dumps(doc, indent=0) + "\n")


class SplitError(ValueError):
    """The split file does not match its hash, or not the tasks."""


def load(path: Path = SPLIT_PATH) -> Split:
    doc = json.loads(path.read_text())
    sides = {side: dict(doc[side]) for side in SIDES}
    if _digest(sides) != doc["sha256"]:
        raise SplitError(f"{path}: its ids do not hash to its sha256: the file was edited")
    if set(sides["dev"]) & set(sides["test"]):
        raise SplitError(f"{path}: a task is on both sides")
    return Split(sides["dev"], sides["test"], doc["families"], doc["sha256"])


def problems(split: Split, tasks: Sequence[Task]) -> list[str]:
    """Why ``split`` is not the split of ``tasks`` (empty: it is)."""
    out = []
    hashes = {t.id: body_hash(t.body) for t in tasks if t.check is not None}
    known = {**split.dev, **split.test}
    for task_id, digest in sorted(hashes.items()):
        if task_id not in known:
            out.append(f"{task_id}: not in the split (a new task?)")
        elif known[task_id] != digest:
            out.append(f"{task_id}: its request changed since the split was written")
    out.extend(f"{i}: in the split, not among the tasks" for i in sorted(set(known) - set(hashes)))
    straddle = set(split.dev.values()) & split.test_bodies
    out.extend(f"body {d[:12]}: on both sides" for d in sorted(straddle))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--write", action="store_true", help=f"write the split to {SPLIT_PATH}")
    args = parser.parse_args()
    tasks = all_tasks()
    if args.write:
        write(build(tasks))
    split = load()
    found = problems(split, tasks)
    for line in found[:20]:
        print(line, file=sys.stderr)
    summary = {"sha256": split.sha256, "dev": len(split.dev), "test": len(split.test),
               "families": len(split.families), "problems": len(found)}  # fmt: skip
    print(json.dumps(summary))
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
