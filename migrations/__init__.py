"""Alembic environment and revisions for the trajectory store (see gateway/store)."""
