"""Exporters from the trajectory store to the formats RL and SFT trainers read.

``load`` reads sessions (tenant-scoped, filtered) into ``Trajectory`` objects;
one module per target family writes them; ``FORMATS`` is the registry the CLI
uses. Field mapping per trainer: shared/REFERENCES.md and docs/trajectories.md.
"""
