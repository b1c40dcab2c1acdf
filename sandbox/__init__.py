"""Sandbox service: deny-by-default tool execution. Not built yet (issue #7)."""
