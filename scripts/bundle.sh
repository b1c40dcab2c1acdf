#!/usr/bin/env bash
# Kept for older instructions: `gearshift bundle` writes the offline install bundle.
#
#   scripts/bundle.sh OUT.tar [--gateway-only] [--images]   ==   gearshift bundle OUT.tar ...
#
# See `gearshift bundle --help` and docs/deployment.md ("Air-gapped install").
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m gateway.cli.main bundle "$@"
