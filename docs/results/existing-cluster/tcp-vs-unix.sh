#!/usr/bin/env bash
# pgbench TPC-B (scale 10, 4 clients, 10 s) on the same namespaced pair as the
# existing-cluster run, from the primary's namespace, alternating the client
# connection: TCP 127.0.0.1 vs the Unix socket; levels off and on.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=$PWD/.build/install/bench/bin
lab/pgwal-lab up --bin "$bin" --standbys 1 --sync 1 --net lan --primary-disk nvme --standby-disk nvme --hold 1800 > /tmp/pgwal-up2.log 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 120); do grep -q holding /tmp/pgwal-up2.log && break; sleep 1; done
ns=$(sed -nE 's/^primary: .*netns ([^,]+),.*/\1/p' /tmp/pgwal-up2.log)
pport=$(sed -nE "s/^primary: psql '.* port=([0-9]+) .*/\1/p" /tmp/pgwal-up2.log)
sock=$(sed -nE "s/^primary: psql 'host=([^ ]+) .*/\1/p" /tmp/pgwal-up2.log)
x() { ip netns exec "$ns" "$@"; }
x "$bin/pgbench" -i -q -s 10 -h "$sock" -p "$pport" -U postgres postgres >/dev/null 2>&1
for round in 1 2 3 4; do
	for level in off on; do
		x "$bin/psql" -qAt -h "$sock" -p "$pport" -U postgres -c "ALTER SYSTEM SET synchronous_commit = $level" -c "SELECT pg_reload_conf()" postgres >/dev/null
		for conn in tcp unix; do
			host=$sock; [ $conn = tcp ] && host=127.0.0.1
			x "$bin/psql" -qAt -h "$sock" -p "$pport" -U postgres -c "VACUUM pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history" -c CHECKPOINT postgres >/dev/null
			sleep 2
			tps=$(x "$bin/pgbench" -n -c 4 -j 2 -T 10 -M prepared -h "$host" -p "$pport" -U postgres postgres 2>/dev/null | sed -nE 's/^tps = ([0-9.]+).*/\1/p')
			echo "$round $level $conn $tps"
		done
	done
done
