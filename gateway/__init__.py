"""Gearshift gateway: the OpenAI-compatible HTTP front of the two tiers."""
