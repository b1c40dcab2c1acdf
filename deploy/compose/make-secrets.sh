#!/usr/bin/env bash
# Write deploy/compose/secrets/{postgres-password,store-url,sandbox-token} (mode 0600),
# random, unless they exist. Run once before `podman-compose up`.
#   --sqlite   the store URL names a SQLite file in the gateway's volume (compose without the
#              profile `full`, which runs PostgreSQL); replaces an existing store-url
set -euo pipefail
dir="$(dirname "$0")/secrets"
mkdir -p "$dir" && chmod 0700 "$dir"
umask 077
random() { head -c 32 /dev/urandom | base64 | tr -d '/+=\n'; }
[ -s "$dir/postgres-password" ] || random > "$dir/postgres-password"
if [ "${1:-}" = --sqlite ]; then
  printf 'sqlite:////var/lib/gearshift/trajectories.db' > "$dir/store-url"
fi
[ -s "$dir/store-url" ] ||
  printf 'postgresql://gearshift:%s@127.0.0.1:5432/gearshift' "$(cat "$dir/postgres-password")" > "$dir/store-url"
[ -s "$dir/sandbox-token" ] || random > "$dir/sandbox-token"
# compose mounts each file as it is: the gateway (uid 10001 in its image) must read the store
# URL and the token. As root: they become 10001's, mode 0400. Rootless podman maps uids, so
# there they are 0644 inside this 0700 folder (no other host user reaches them).
if [ "$(id -u)" = 0 ]; then
  chown 10001:10001 "$dir/store-url" "$dir/sandbox-token" && chmod 0400 "$dir/store-url" "$dir/sandbox-token"
else
  chmod 0644 "$dir/store-url" "$dir/sandbox-token"
fi
echo "secrets in $dir"
