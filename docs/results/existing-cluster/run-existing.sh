#!/usr/bin/env bash
# A lab-made primary + sync standby (lan link, nvme disks, bench build) held
# in network namespaces, then sync-modes --cluster run from the primary's
# namespace, reaching both servers only by DSN.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/.build/install/bench/bin
lab/pgwal-lab up --bin "$bin" --standbys 1 --sync 1 --net lan --primary-disk nvme --standby-disk nvme --hold 3600 > /tmp/pgwal-up.log 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 120); do grep -q holding /tmp/pgwal-up.log && break; sleep 1; done
cat /tmp/pgwal-up.log
ns=$(sed -nE 's/^primary: .*netns ([^,]+),.*/\1/p' /tmp/pgwal-up.log)
pport=$(sed -nE "s/^primary: psql '.* port=([0-9]+) .*/\1/p" /tmp/pgwal-up.log)
sport=$(sed -nE "s/^s1: psql '.* port=([0-9]+) .*/\1/p" /tmp/pgwal-up.log)
cat > /tmp/pgwal-cluster.toml <<TOML
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
cat /tmp/pgwal-cluster.toml
ip netns exec "$ns" lab/pgwal-lab run sync-modes --cluster /tmp/pgwal-cluster.toml "$@"
