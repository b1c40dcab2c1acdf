"""usage leases: what each gateway replica holds of a usage counter, and until when

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 04:00:00

A replica takes budget from a counter in blocks and admits from them without a store
round trip (``gateway.access.shares``); its lease says how much of the counter's
``reserved`` is its own, so that when it dies another replica can take it back once the
lease has ended.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_leases",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("key_name", sa.String(length=128), nullable=False),
        sa.Column("window", sa.String(length=16), nullable=False),
        sa.Column("unit", sa.String(length=8), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False,
                  comment="the replica: host:pid:random"),
        sa.Column("amount", sa.BigInteger(), nullable=False,
                  comment="part of the counter's reserved that is this replica's"),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False,
                  comment="Unix ms; renewed while the replica lives"),
        sa.PrimaryKeyConstraint(
            "tenant_id", "key_name", "window", "unit", "holder", name=op.f("pk_usage_leases")
        ),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_table("usage_leases")
