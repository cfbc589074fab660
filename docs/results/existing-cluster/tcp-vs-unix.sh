#!/usr/bin/env bash
# pgbench TPC-B (scale 10, 4 clients, 10 s) on a held pair (held-pair.sh) like
# the existing-cluster run's, from the primary's namespace, alternating the client
# connection: TCP 127.0.0.1 vs the Unix socket; levels off and on.
set -euo pipefail
# shellcheck source=docs/results/existing-cluster/held-pair.sh
source "$(dirname "$0")/held-pair.sh"
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
