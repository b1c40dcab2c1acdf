"""The sessions ``bench.context`` replays when they are stored (``bench.context_sessions``
wrote them): loaded, checked against their manifest, and each question made a request.

``load`` refuses a file that does not match its manifest (count, the uncompressed text's
sha256, the generator version), a record without its fields, a question of an unknown kind,
and a question whose answer is not in the tool output of the step it names: a replay then
measures the sessions every machine has, and every question has its answer in the history.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

KINDS = ("number", "code", "file")
DATA = Path(__file__).resolve().parent / "data" / "context_sessions.jsonl.gz"
SYSTEM = "You are a coding agent. Use the tools. Answer questions with the value only."
# what each kind of question asks for, as the question names it (bench.context_upstream's
# oracle reads the kind back from it)
NOUNS = {"number": "number", "code": "error code", "file": "file path"}
FORMS = {
    "number": " (five digits)",
    "code": " (the letter E and four digits)",
    "file": " (a folder, a slash and a file name)",
}


class BadSessions(ValueError):
    """The stored sessions do not match their manifest, or a record is malformed."""


@dataclass(frozen=True)
class Question:
    key: str  # the name the fact is printed after
    kind: str  # number | code | file (bench.context_measure scores each)
    value: str
    end: bool = False  # the end task's check, not a fact from an early step

    def text(self) -> str:
        """The question as a recall task: where the fact is and what form it has, and no
        tool to call (#24: a reader answered ``what file goes with X?`` with a tool call)."""
        noun = NOUNS[self.kind]
        return (f"QUESTION: earlier in this conversation, a tool's output printed a line with "
                f"{self.key} and its {noun}. Without calling any tool, reply with that {noun} "
                f"only{FORMS[self.kind]}, copied exactly from that line.")  # fmt: skip


@dataclass(frozen=True)
class StoredSession:
    id: str
    family: str
    messages: list[dict[str, Any]]
    questions: list[Question]


def manifest_path(data: Path) -> Path:
    return data.with_name(data.name.removesuffix(".jsonl.gz") + ".manifest.json")


def load(path: Path, version: int | None = None) -> list[StoredSession]:
    """Every session of ``path``, checked against its manifest (and, given, the version)."""
    try:
        manifest = orjson.loads(manifest_path(path).read_bytes())
        text = gzip.decompress(path.read_bytes())
    except (OSError, orjson.JSONDecodeError, gzip.BadGzipFile) as exc:
        raise BadSessions(f"cannot read {path} and its manifest: {exc}") from None
    if hashlib.sha256(text).hexdigest() != manifest.get("sha256"):
        raise BadSessions(f"{path}: its text's sha256 is not the manifest's")
    if version is not None and manifest.get("generator_version") != version:
        raise BadSessions(f"{path}: generator version {manifest.get('generator_version')}, "
                          f"the generator is at {version}: regenerate")  # fmt: skip
    sessions = [parse(line, n) for n, line in enumerate(text.splitlines(), 1)]
    if len(sessions) != manifest.get("count"):
        raise BadSessions(
            f"{path}: {len(sessions)} sessions, the manifest says {manifest.get('count')}"
        )
    return sessions


def parse(line: bytes, n: int) -> StoredSession:
    """One record; its questions' answers checked against the history."""
    try:
        r = orjson.loads(line)
        messages, questions = r["messages"], r["questions"]
        session = StoredSession(
            str(r["id"]), str(r["family"]), list(messages),
            [Question(str(q["key"]), str(q["kind"]), str(q["value"]), bool(q["end"]))
             for q in questions],
        )  # fmt: skip
        tools = [m["content"] for m in messages if m["role"] == "tool"]
        steps = [int(q["step"]) for q in questions]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BadSessions(f"line {n}: not a session record ({exc!r})") from None
    if not session.questions:
        raise BadSessions(f"line {n}: no questions")
    for q, step in zip(session.questions, steps, strict=True):
        if q.kind not in KINDS:
            raise BadSessions(f"line {n}: a question of kind {q.kind!r} (kinds: {KINDS})")
        if not 0 <= step < len(tools) or q.value not in tools[step] or q.key not in tools[step]:
            raise BadSessions(f"line {n}: {q.key}'s answer is not in tool output {step}")
    return session
