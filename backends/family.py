"""The same-family contract, checked on model folders: tokenizer, chat template, tool parser.

Two tiers may exchange a conversation mid tool loop only if they read and write it
identically: the same vocabulary and merges (so token ids mean the same), the same chat
template (so the same messages render to the same prompt) and the same tool-call parser.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


class FamilyMismatch(RuntimeError):
    """Two tiers are not the same model family; the message names what differs."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    tokenizer: str  # sha256 of the vocabulary and merges
    chat_template: str  # sha256 of the template text ("none" without one)
    tool_call_parser: str


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def fingerprint(model_dir: Path, tool_call_parser: str) -> Fingerprint:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    model = tokenizer.get("model", {})
    vocab = {
        "vocab": model.get("vocab"),
        "merges": model.get("merges"),
        "added": tokenizer.get("added_tokens"),
    }
    template_file = model_dir / "chat_template.jinja"
    if template_file.exists():
        template = template_file.read_text()
    else:
        template = (
            json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template") or ""
        )
    template_digest = hashlib.sha256(template.encode()).hexdigest() if template else "none"
    return Fingerprint(_digest(vocab), template_digest, tool_call_parser)


def check_same_family(fingerprints: dict[str, Fingerprint]) -> None:
    """Raise FamilyMismatch naming every field that differs between tiers."""
    items = list(fingerprints.items())
    (first_name, first), rest = items[0], items[1:]
    problems = []
    for name, fp in rest:
        for field in ("tokenizer", "chat_template", "tool_call_parser"):
            a, b = getattr(first, field), getattr(fp, field)
            if a != b:
                problems.append(
                    f"{field} differs between {first_name} ({a[:12]}) and {name} ({b[:12]})"
                )
    if problems:
        raise FamilyMismatch(
            "tiers are not the same model family, so switching tiers inside a conversation is unsafe: "
            + "; ".join(problems)
        )
