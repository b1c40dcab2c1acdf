"""tenants keys: api keys, limits, usage windows, access changes

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 00:26:15.497121

Keys and limits live in the store so that every replica sees the same ones; the single
row of ``access_changes`` is the counter replicas poll to know when to reload them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    changes = op.create_table(
        "access_changes",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column(
            "version",
            sa.BigInteger(),
            nullable=False,
            comment="bumped by every key or limit change",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_changes")),
    )
    op.bulk_insert(changes, [{"id": 1, "version": 0}])
    op.create_table(
        "usage_windows",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column(
            "key_name", sa.String(length=128), nullable=False, comment="'': the whole tenant"
        ),
        sa.Column(
            "window", sa.String(length=16), nullable=False, comment="UTC minute, day or month"
        ),
        sa.Column("unit", sa.String(length=8), nullable=False, comment="requests | tokens"),
        sa.Column("used", sa.BigInteger(), nullable=False, comment="settled"),
        sa.Column("reserved", sa.BigInteger(), nullable=False, comment="admitted, not yet settled"),
        sa.PrimaryKeyConstraint(
            "tenant_id", "key_name", "window", "unit", name=op.f("pk_usage_windows")
        ),
    )
    op.create_table(
        "api_keys",
        sa.Column(
            "id", sa.String(length=32), nullable=False, comment="key_...: how admins name a key"
        ),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column(
            "name", sa.String(length=128), nullable=False, comment="recorded as the steps' api_key"
        ),
        sa.Column("sha256", sa.String(length=64), nullable=False, comment="hex SHA-256 of the key"),
        sa.Column(
            "prefix",
            sa.String(length=16),
            nullable=False,
            comment="the key's first characters, to tell",
        ),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column(
            "models", sa.JSON(), nullable=True, comment="model names it may request; null: all"
        ),
        sa.Column("tools", sa.JSON(), nullable=True, comment="hosted tools it may run; null: all"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "rotated_to",
            sa.String(length=32),
            nullable=True,
            comment="the key that replaced this one",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("sha256", name=op.f("uq_api_keys_sha256")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index("ix_api_keys_tenant_name", ["tenant_id", "name"], unique=False)

    op.create_table(
        "limits",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column(
            "key_name", sa.String(length=128), nullable=False, comment="'': the whole tenant"
        ),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_month", sa.BigInteger(), nullable=True),
        sa.Column(
            "soft_percent", sa.Integer(), nullable=False, comment="warn from this share of a budget"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_limits_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "key_name", name=op.f("pk_limits")),
    )


def downgrade() -> None:
    op.drop_table("limits")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_api_keys_tenant_name")

    op.drop_table("api_keys")
    op.drop_table("usage_windows")
    op.drop_table("access_changes")
