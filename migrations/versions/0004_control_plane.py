"""control plane: routing versions with publish/rollback/canary events, kill switches,
and the routing version stamped on each step

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 00:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "routing_versions",
        sa.Column("id", sa.String(length=32), nullable=False,
                  comment="sha256 of the canonical config, 16 hex"),
        sa.Column("config", sa.JSON(), nullable=False, comment="{policy, params}"),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routing_versions")),
    )  # fmt: skip
    op.create_table(
        "routing_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False,
                  comment="publish | rollback | canary | canary_off"),
        sa.Column("published", sa.String(length=32), nullable=False,
                  comment="the published version after this event"),
        sa.Column("canary", sa.String(length=32), nullable=True,
                  comment="the canary version after this event"),
        sa.Column("canary_weight", sa.Float(), nullable=False,
                  comment="share of sessions on the canary"),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["canary"], ["routing_versions.id"],
                                name=op.f("fk_routing_events_canary_routing_versions")),
        sa.ForeignKeyConstraint(["published"], ["routing_versions.id"],
                                name=op.f("fk_routing_events_published_routing_versions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routing_events")),
    )  # fmt: skip
    op.create_table(
        "kill_switches",
        sa.Column("kind", sa.String(length=16), nullable=False,
                  comment="all_to_full | tier_off | tool_off | sandbox_off | tenant_off"),
        sa.Column("target", sa.String(length=256), nullable=False,
                  comment="tier, tool or tenant; '' for none"),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("changed_by", sa.String(length=128), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kind", "target", name=op.f("pk_kill_switches")),
    )  # fmt: skip
    op.create_table(
        "kill_switch_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=256), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kill_switch_events")),
    )
    with op.batch_alter_table("steps") as batch:
        batch.add_column(
            sa.Column("routing_version", sa.String(length=32), nullable=True,
                      comment="the routing version that decided the tier")
        )  # fmt: skip


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("routing_version")
    op.drop_table("kill_switch_events")
    op.drop_table("kill_switches")
    op.drop_table("routing_events")
    op.drop_table("routing_versions")
