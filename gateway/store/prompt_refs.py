"""A step's prompt token ids, stored as a reference to an earlier step plus new tokens.

An agent resends its whole history at every step, so step *k*'s prompt is step *k-1*'s
prompt, its answer, and a few hundred new tokens (the tool's result, the chat template's
markers). Stored whole, a session's ids grow with the square of its length. So the writer
(``gateway.recording.prompt_ref``) stores a step's prompt as three columns of ``steps``:

- ``prompt_ref_step``: an earlier step of the same session, or null (the ids are whole);
- ``prompt_ref_len``: how many ids the prompt shares with that step's prompt followed by
  its completion;
- ``prompt_token_ids``: the ids after those (all of them when there is no reference).

So ``prompt = (ref.prompt + ref.completion)[:prompt_ref_len] + prompt_token_ids``, with
``ref.prompt`` itself rebuilt the same way. Everything that reads prompt ids (the
``/v1/trajectories`` API, exports, the dashboard) goes through ``prompt_ids`` here and
sees whole prompts, as the engine returned them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, select

from gateway.store import codec
from gateway.store.schema import steps

_COLUMNS = (
    steps.c.id,
    steps.c.prompt_ref_step,
    steps.c.prompt_ref_len,
    steps.c.prompt_token_ids,
    steps.c.completion_token_ids,
)


def prompt_ids(conn: Connection, rows: Sequence[Mapping[Any, Any]]) -> dict[str, list[int] | None]:
    """Each row's whole prompt ids, by step id. ``rows`` are ``steps`` rows (with at least
    the columns above and ``session_id``); referenced steps missing from them (a filter
    left them out) are read from the store, a session at a time."""
    known: dict[str, Mapping[Any, Any]] = {r["id"]: r for r in rows}
    missing = {r["prompt_ref_step"] for r in rows if r["prompt_ref_step"]} - known.keys()
    if missing:
        sessions = {r["session_id"] for r in rows if r["prompt_ref_step"] in missing}
        for extra in conn.execute(select(*_COLUMNS).where(steps.c.session_id.in_(sessions))):
            known.setdefault(extra.id, extra._mapping)
    packed = rebuild(known.values())
    return {r["id"]: codec.unpack_ids(packed[r["id"]]) for r in rows}


def rebuild(rows: Iterable[Mapping[Any, Any]]) -> dict[str, bytes | None]:
    """Each row's whole prompt as packed ids (``codec``), by step id. A reference to a
    step that is not among ``rows`` (or is part of a cycle, which the writer never makes)
    raises ``KeyError``: a prompt is never given back with ids missing."""
    by_id = {r["id"]: r for r in rows}
    done: dict[str, bytes | None] = {}
    for start in by_id:
        # walk back to a step already rebuilt (or a whole one), then rebuild forwards
        path, seen, at = [], set(), start
        while at not in done:
            if at in seen:
                raise KeyError(f"prompt reference cycle at step {at!r}")
            path.append(at)
            seen.add(at)
            ref = by_id[at]["prompt_ref_step"]
            if ref is None:
                break
            if ref not in by_id:
                raise KeyError(f"step {at!r} refers to step {ref!r}, which is not in the store")
            at = ref
        for sid in reversed(path):
            if sid in done:
                continue
            row = by_id[sid]
            own = row["prompt_token_ids"]
            ref = row["prompt_ref_step"]
            if ref is None:
                done[sid] = own
                continue
            base = (done[ref] or b"") + (by_id[ref]["completion_token_ids"] or b"")
            shared = 4 * int(row["prompt_ref_len"] or 0)
            if shared > len(base):
                raise KeyError(f"step {sid!r} shares {shared // 4} ids with a shorter step")
            done[sid] = base[:shared] + (own or b"")
    return done
