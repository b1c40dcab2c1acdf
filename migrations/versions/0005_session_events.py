"""session events: each condensation of a session's context (masked, summarized,
dropped), with the tokens before and after and the summarizer that wrote its summary

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "context_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=32), nullable=False),
        sa.Column("step_id", sa.String(length=32), nullable=False,
                  comment="the step whose prompt was condensed"),
        sa.Column("api", sa.String(length=16), nullable=False,
                  comment="chat | responses | compact"),
        sa.Column("masked", sa.Integer(), nullable=False, comment="tool outputs masked"),
        sa.Column("clipped", sa.Integer(), nullable=False, comment="tool outputs clipped"),
        sa.Column("summarized", sa.Integer(), nullable=False,
                  comment="messages one summary stands for"),
        sa.Column("dropped", sa.Integer(), nullable=False,
                  comment="messages removed without a summary"),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("exact", sa.Boolean(), nullable=False,
                  comment="tokens_after is the tier's own count"),
        sa.Column("summarizer", sa.String(length=16), nullable=True,
                  comment="fast | full | extractive | reused"),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("summary_step_id", sa.String(length=32), nullable=True,
                  comment="the step that wrote the summary (no key: recorded on its own)"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"],
                                name=op.f("fk_context_events_session_id_sessions")),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"],
                                name=op.f("fk_context_events_step_id_steps")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=op.f("fk_context_events_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_context_events")),
    )  # fmt: skip
    op.create_index(
        "ix_context_events_session", "context_events", ["session_id", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_context_events_session", table_name="context_events")
    op.drop_table("context_events")
