#!/usr/bin/env bash
# End-to-end backlog drain: the same slot backlog consumed by pgwal (the
# `drain` example, proto 1 and proto 4 parallel), `pgwal stream` (JSON to
# /dev/null) and pg_recvlogical (pgoutput proto 1 to /dev/null), each on its
# own slot created before the load. Reports wall time, inserts/s, client
# CPU per insert (user+sys), client max RSS and walsender CPU per insert.
#
# pgwal_v1_coalesce turns on StreamConfig::read_coalesce (1 ms).
# Each consumer runs ROUNDS times (default 3), interleaved; medians are printed.
#
# usage: crates/pgwal/benches/e2e.sh [TXNS] [ROWS_PER_TXN]   (default 50 x 8000)
#        ROUNDS=0 crates/pgwal/benches/e2e.sh 1 1              (latency only)
# env:   PGWAL_BENCH_BIN (server bin dir; default PGWAL_PG18_BIN or .build/install/check/bin)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
txns=${1:-50}
rows=${2:-8000}
bin=${PGWAL_BENCH_BIN:-${PGWAL_PG18_BIN:-$repo/.build/install/check/bin}}
asuser="$repo/tools/as-user"
cd "$repo/crates"
cargo build -q --release -p pgwal --example drain --example latency
cargo build -q --release -p pgwal-cli
drain=$repo/crates/target/release/examples/drain
cli=$repo/crates/target/release/pgwal

dir=$(mktemp -d /tmp/pgwal-bench-XXXXXX)
chmod 755 "$dir"
[ "$(id -u)" = 0 ] && chown "$("$asuser" --ensure)" "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$asuser" "$bin/initdb" -U postgres --auth=trust --no-sync -D "$dir/data" >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
wal_level = logical
max_replication_slots = 40
max_wal_senders = 10
fsync = off
synchronous_commit = off
shared_buffers = 256MB
max_wal_size = 4GB
CONF
"$asuser" "$bin/pg_ctl" -w -D "$dir/data" -l "$dir/log" start >/dev/null
trap '"$asuser" "$bin/pg_ctl" -m immediate -D "$dir/data" stop >/dev/null 2>&1; rm -rf "$dir"' EXIT
psql() { "$bin/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"; }
conn="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable"

psql -c "CREATE TABLE bench (id bigint, pad text)" -c "CREATE PUBLICATION p FOR TABLE bench"
consumers=(pgwal_v1 pgwal_v1_coalesce pgwal_v4 pgwal_cli pg_recvlogical)
rounds=${ROUNDS:-3}
for r in $(seq 1 "$rounds"); do
	for c in "${consumers[@]}"; do psql -c "SELECT pg_create_logical_replication_slot('s_${c}_$r', 'pgoutput')" >/dev/null; done
done
echo "loading $txns transactions x $rows rows ..." >&2
for t in $(seq 1 "$txns"); do
	echo "INSERT INTO bench SELECT g, repeat('x', 100) FROM generate_series(1, $rows) g;"
done | psql
stop=$(psql -c "SELECT pg_current_wal_insert_lsn()")
total=$((txns * rows))
echo "WAL: $(psql -c "SELECT pg_size_pretty(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)"), $total inserts, server $("$bin/postgres" --version)" >&2

: >"$dir/results"
for r in $(seq 1 "$rounds"); do
for c in "${consumers[@]}"; do
	slot=s_${c}_$r
	case $c in
	pgwal_v1) cmd=("$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v1_coalesce) cmd=(env COALESCE_US=1000 "$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v4) cmd=("$drain" "$conn" "$slot" p "$stop" 4 parallel) ;;
	pgwal_cli) cmd=("$cli" -d "$conn" stream -S "$slot" -P p --proto-version 1 --stop-lsn "$stop") ;;
	pg_recvlogical) cmd=("$bin/pg_recvlogical" -d "$conn" -S "$slot" --start -P pgoutput -o proto_version=1 -o publication_names=p -E "$stop" -f /dev/null) ;;
	esac
	start=$(date +%s.%N)
	/usr/bin/time -f '%U %S %M %w' -o "$dir/time" "${cmd[@]}" >/dev/null 2>"$dir/err" &
	pid=$!
	ws=0
	while kill -0 $pid 2>/dev/null; do
		wp=$(psql -c "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '$slot'" 2>/dev/null || true)
		if [ -n "$wp" ] && [ -r /proc/$wp/stat ]; then
			ws=$(awk '{print $14 + $15}' /proc/$wp/stat 2>/dev/null || echo "$ws")
		fi
		sleep 0.1
	done
	wait $pid || { cat "$dir/err" >&2; exit 1; }
	end=$(date +%s.%N)
	read -r u s m w <"$dir/time"
	echo "$c $start $end $u $s $m $ws $w" >>"$dir/results"
done
done
python3 - "$dir/results" "$total" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
total = int(sys.argv[2])
print(f"{'consumer':<16} {'wall_s':>8} {'inserts/s':>10} {'client_us/ins':>14} {'max_rss_MB':>10} {'walsender_us/ins':>16} {'client_wakeups/1k':>17}   (medians of {len(rows) // max(1, len(set(r[0] for r in rows)))})")
for c in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == c]
    med = lambda f: statistics.median(f(r) for r in rs)
    wall = med(lambda r: float(r[2]) - float(r[1]))
    cpu = med(lambda r: (float(r[3]) + float(r[4])) * 1e6 / total)
    rss = med(lambda r: int(r[5]) / 1024)
    ws = med(lambda r: int(r[6]) * 1e4 / total)
    wk = med(lambda r: int(r[7]) * 1e3 / total)
    print(f"{c:<16} {wall:8.2f} {total / wall:10.0f} {cpu:14.2f} {rss:10.1f} {ws:16.2f} {wk:17.1f}")
PY

# Commit-to-receive latency with a live single-row workload (200 tx/s).
psql -c "CREATE TABLE lat (id int, v text)" -c "CREATE PUBLICATION pl FOR TABLE lat" \
	-c "SELECT pg_create_logical_replication_slot('s_lat', 'pgoutput')" >/dev/null
"$repo/crates/target/release/examples/latency" "$conn" s_lat pl lat "${LAT_COUNT:-2000}" 5
