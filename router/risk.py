"""The risk class of the tool call a step may make: read-only, egress, mutating, destructive.

A fast tier that picks the wrong arguments for ``read_file`` costs a retry; for
``delete_branch`` or ``run_shell`` it costs data. The rules policy sends a step whose
pending tool call is mutating or destructive to the full tier.

The class of a tool comes from, in order: the ``risk`` map in the policy's configuration
(``{tool name: class}``); the gateway's hosted tools (the same classes as the sandbox's
policy); the verb its name starts with (``delete_*``, ``deleteUser``, ``send_*``,
``update_*``...). A name with no known verb is read-only: annotate such tools in ``risk``.
The pending call is the named ``tool_choice`` when there is one, no call for ``"none"``,
and otherwise the riskiest tool offered: with ``"required"`` a call is certain (one of the
offered tools); without a ``tool_choice`` (or ``"auto"``) the step may as well answer in
text, so that case counts only when ``offered`` is true (the rules policy's opt-in
``risky_offered``: a tool list says what an agent may do, not what this step does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

from router.tokens import MAPS

Risk: TypeAlias = Literal["read-only", "egress", "mutating", "destructive"]
RISKS: tuple[Risk, ...] = ("read-only", "egress", "mutating", "destructive")  # in increasing order
HOSTED: dict[str, Risk] = {
    "read_file": "read-only", "list_dir": "read-only", "sql_query": "read-only",
    "http_fetch": "egress", "write_file": "mutating",
    "run_python": "destructive", "run_shell": "destructive",
}  # fmt: skip
DESTRUCTIVE_VERBS = frozenset(("delete", "remove", "drop", "destroy", "purge", "wipe",
    "erase", "truncate", "kill", "terminate", "shutdown", "rm", "rmdir", "uninstall", "revoke",
    "reset", "overwrite", "exec", "execute", "shell"))  # fmt: skip
MUTATING_VERBS = frozenset(("write", "update", "create", "insert", "set", "put", "patch",
    "post", "send", "email", "transfer", "pay", "book", "cancel", "move", "rename", "edit",
    "modify", "replace", "upload", "deploy", "commit", "push", "merge", "publish", "approve",
    "schedule", "assign", "grant", "install", "save", "submit", "buy", "sell", "refund"))  # fmt: skip
WORD = re.compile(r"[a-z]+")
MAX_TOOLS = 128


def classify(name: str, overrides: Mapping[str, Risk] | None = None) -> Risk:
    if overrides and name in overrides:
        return overrides[name]
    if name in HOSTED:
        return HOSTED[name]
    words = WORD.findall(re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower())
    if not words:
        return "read-only"
    if words[0] in DESTRUCTIVE_VERBS:
        return "destructive"
    if words[0] in MUTATING_VERBS:
        return "mutating"
    return "read-only"


def _name(tool: object) -> str | None:
    if isinstance(tool, MAPS):
        fn = tool.get("function")
        if isinstance(fn, MAPS) and isinstance(fn.get("name"), str):
            return str(fn["name"])
    return None


def pending(
    body: Mapping[str, Any], overrides: Mapping[str, Risk] | None = None, offered: bool = True
) -> tuple[Risk, str] | None:
    """(risk class, tool name) of the riskiest call this step may make, or None. With
    ``offered`` false, only a call the request forces counts (a named or ``"required"``
    ``tool_choice``)."""
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    named = _name(choice) if isinstance(choice, MAPS) else None
    if named is not None:
        return classify(named, overrides), named
    if not offered and choice != "required":
        return None
    tools = body.get("tools")
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        return None
    worst: tuple[Risk, str] | None = None
    for tool in tools[:MAX_TOOLS]:
        name = _name(tool)
        if name is None:
            continue
        risk = classify(name, overrides)
        if worst is None or RISKS.index(risk) > RISKS.index(worst[0]):
            worst = (risk, name)
    return worst
