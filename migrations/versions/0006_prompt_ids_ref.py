"""prompt ids by reference: a step's prompt token ids as an earlier step's prompt and
completion ids (a shared length of them) followed by its own new ids

Existing rows keep their whole ids (no reference). A downgrade first writes every
referring step's prompt whole again, so nothing is lost on the way back.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 04:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_COMMENT = "int32 LE, exactly as vLLM returned"
NEW_COMMENT = "int32 LE: the prompt's ids after the prompt_ref_len it shares (store.prompt_refs)"


def upgrade() -> None:
    # Plain ALTER TABLE on both dialects: SQLite (3.35 and later) adds and drops these
    # columns in place, where a batch copy of ``steps`` would trip its foreign keys.
    op.add_column(
        "steps",
        sa.Column("prompt_ref_step", sa.String(length=32), nullable=True,
                  comment="earlier step of the session whose prompt + completion this "
                          "prompt extends"),
    )  # fmt: skip
    op.add_column(
        "steps",
        sa.Column("prompt_ref_len", sa.Integer(), nullable=True,
                  comment="ids shared with prompt_ref_step's"),
    )  # fmt: skip
    _comment(OLD_COMMENT, NEW_COMMENT)


def downgrade() -> None:
    _write_prompts_whole(op.get_bind())
    _comment(NEW_COMMENT, OLD_COMMENT)
    op.drop_column("steps", "prompt_ref_len")
    op.drop_column("steps", "prompt_ref_step")


def _comment(old: str, new: str) -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite keeps no column comments
        op.alter_column(
            "steps", "prompt_token_ids", existing_type=sa.LargeBinary(), comment=new,
            existing_comment=old, existing_nullable=True,
        )  # fmt: skip


def _write_prompts_whole(conn: sa.Connection) -> None:
    """Rebuild each referring step's prompt (a session at a time, in step order: a step
    refers only to earlier ones) and store it whole. Self-contained: a migration must not
    change meaning when the application code does."""
    steps = sa.table(
        "steps", sa.column("id"), sa.column("session_id"), sa.column("seq"),
        sa.column("choice_index"), sa.column("prompt_token_ids"),
        sa.column("completion_token_ids"), sa.column("prompt_ref_step"),
        sa.column("prompt_ref_len"),
    )  # fmt: skip
    sessions = conn.execute(
        sa.select(steps.c.session_id).where(steps.c.prompt_ref_step.is_not(None)).distinct()
    ).scalars()
    for sid in list(sessions):
        rows = conn.execute(
            sa.select(steps)
            .where(steps.c.session_id == sid)
            .order_by(steps.c.seq, steps.c.choice_index)
        ).all()
        whole: dict[str, bytes] = {}
        completion = {r.id: r.completion_token_ids or b"" for r in rows}
        for r in rows:
            own = r.prompt_token_ids or b""
            if r.prompt_ref_step is None:
                whole[r.id] = own
                continue
            base = whole[r.prompt_ref_step] + completion[r.prompt_ref_step]
            whole[r.id] = base[: 4 * int(r.prompt_ref_len)] + own
            conn.execute(
                sa.update(steps)
                .where(steps.c.id == r.id)
                .values(prompt_token_ids=whole[r.id], prompt_ref_step=None, prompt_ref_len=None)
            )
