#!/usr/bin/env bash
# A held lab-made pair (held-pair.sh) as the stand-in for a user's cluster,
# then sync-modes --cluster run from the primary's namespace, reaching both
# servers only by TCP DSN.  Arguments go to `pgwal-lab run`.
set -euo pipefail
# shellcheck source=docs/results/existing-cluster/held-pair.sh
source "$(dirname "$0")/held-pair.sh"
conf=$(mktemp --suffix=.toml)
cat >"$conf" <<TOML
# the namespaced stand-in for a user's cluster (docs/results/existing-cluster)
[primary]
dsn = "host=127.0.0.1 port=$pport user=postgres dbname=postgres"

[[standbys]]
name = "s1"
dsn = "host=10.213.1.2 port=$sport user=postgres dbname=postgres"

[client]
bin_dir = "$bin"

[settings]
may_change = ["synchronous_commit", "wal_receiver_flush_worker", "wal_receiver_reply_events"]
TOML
cat "$conf"
ip netns exec "$ns" lab/pgwal-lab run sync-modes --cluster "$conf" "$@"
