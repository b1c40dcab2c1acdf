"""unique step numbers: a session's steps are numbered 0, 1, ... once each

The writer now gives a step its number at the commit, after the session's last committed
step (``gateway.recording.batch.Pending.number``), so that several gateway replicas may
write one session. The store enforces it: (session, seq, choice) is unique.

Before, each writer process counted a session's steps itself, and a session that moved
between replicas could get one number twice. The upgrade renumbers those sessions first
(their steps in the order of their numbers, then of their creation), so that the unique
index can be made; sessions without a repeated number keep theirs. The downgrade only
makes the index plain again.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ["session_id", "seq", "choice_index"]


def upgrade() -> None:
    _renumber_clashes(op.get_bind())
    op.drop_index("ix_steps_session_seq", table_name="steps")
    op.create_index("ix_steps_session_seq", "steps", COLUMNS, unique=True)


def downgrade() -> None:
    op.drop_index("ix_steps_session_seq", table_name="steps")
    op.create_index("ix_steps_session_seq", "steps", COLUMNS, unique=False)


def _renumber_clashes(conn: sa.Connection) -> None:
    """Number again the steps of each session in which two requests share a number:
    one number per request, in the order (old number, creation time, request id).
    Self-contained: a migration must not change meaning when the application code does."""
    steps = sa.table(
        "steps", sa.column("id"), sa.column("session_id"), sa.column("seq"),
        sa.column("choice_index"), sa.column("request_id"), sa.column("created_at"),
    )  # fmt: skip
    clashing = (
        sa.select(steps.c.session_id)
        .group_by(steps.c.session_id, steps.c.seq, steps.c.choice_index)
        .having(sa.func.count() > 1)
        .distinct()
    )
    for sid in list(conn.execute(clashing).scalars()):
        rows = conn.execute(
            sa.select(steps.c.id, steps.c.seq, steps.c.request_id, steps.c.created_at)
            .where(steps.c.session_id == sid)
        ).all()  # fmt: skip
        first: dict[str, tuple[int, object, str]] = {}  # request -> its place
        for r in rows:
            place = (r.seq, r.created_at, r.request_id)
            first[r.request_id] = min(first.get(r.request_id, place), place)
        number = {req: n for n, (*_, req) in enumerate(sorted(first.values()))}
        for r in rows:
            if r.seq != number[r.request_id]:
                conn.execute(
                    sa.update(steps).where(steps.c.id == r.id).values(seq=number[r.request_id])
                )
