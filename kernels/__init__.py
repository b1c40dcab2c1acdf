"""Triton kernels for KV-cache compaction. Not built yet (issue #6)."""
