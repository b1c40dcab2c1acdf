"""The tools: their JSON schemas (offered to models) and implementations."""
