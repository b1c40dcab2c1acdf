#!/usr/bin/env bash
# Write deploy/compose/secrets/{postgres-password,store-url,sandbox-token} (mode 0600),
# random, unless they exist. Run once before `podman-compose up`.
set -euo pipefail
dir="$(dirname "$0")/secrets"
mkdir -p "$dir" && chmod 0700 "$dir"
umask 077
random() { head -c 32 /dev/urandom | base64 | tr -d '/+=\n'; }
[ -s "$dir/postgres-password" ] || random > "$dir/postgres-password"
[ -s "$dir/store-url" ] ||
  printf 'postgresql://gearshift:%s@127.0.0.1:5432/gearshift' "$(cat "$dir/postgres-password")" > "$dir/store-url"
[ -s "$dir/sandbox-token" ] || random > "$dir/sandbox-token"
echo "secrets in $dir"
