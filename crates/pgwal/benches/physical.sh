#!/usr/bin/env bash
# Physical streaming benchmark: `pgwal receive` against pg_receivewal.
#
# 1. WAL throughput: a backlog of bulk-load WAL (MB, default 1024) retained
#    on the primary; each receiver starts with a directory holding only the
#    segment before the backlog (so it resumes at the backlog's start), runs
#    with --endpos and exits. MB/s = backlog / wall time; client CPU from
#    /usr/bin/time. Interleaved: pgwal --ack write, pgwal --ack flush,
#    pg_receivewal, pg_receivewal --synchronous; ROUNDS rounds (default 5).
# 2. Commit TPS with the receiver as the only synchronous standby: pgbench
#    (CLIENTS clients, default 4, -N, SECS seconds, default 10) for
#      local            (no standby wait, baseline)
#      pgwal --ack receive, synchronous_commit = remote_write
#      pgwal --ack write,   synchronous_commit = remote_write
#      pgwal --ack flush,   synchronous_commit = on
#      pg_receivewal --synchronous, synchronous_commit = on
#    interleaved, ROUNDS rounds. Medians, min and max are printed.
#
# Everything (primary, receivers' directories) lives under /dev/shm (tmpfs):
# fsync there is almost free, so this measures the protocol and CPU cost,
# not a disk's flush latency.
#
# usage: crates/pgwal/benches/physical.sh [WAL_MB]
# env:   PGWAL_BENCH_BIN (server bin dir; default /usr/lib/postgresql/15/bin),
#        ROUNDS, CLIENTS, SECS, SKIP_THROUGHPUT=1, SKIP_TPS=1
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
wal_mb=${1:-1024}
bin=${PGWAL_BENCH_BIN:-/usr/lib/postgresql/15/bin}
rounds=${ROUNDS:-5}
clients=${CLIENTS:-4}
secs=${SECS:-10}
asuser="$repo/tools/as-user"
cd "$repo/crates"
nice -n 19 cargo build -q --release -p pgwal-cli
cli=$repo/crates/target/release/pgwal

dir=$(mktemp -d /dev/shm/pgwal-physbench-XXXXXX)
chmod 755 "$dir"
[ "$(id -u)" = 0 ] && chown "$("$asuser" --ensure)" "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$asuser" "$bin/initdb" -U postgres --auth=trust --no-sync -D "$dir/data" >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
wal_level = replica
max_replication_slots = 10
max_wal_senders = 10
shared_buffers = 256MB
max_wal_size = 8GB
checkpoint_timeout = 1h
synchronous_commit = on
CONF
"$asuser" "$bin/pg_ctl" -w -D "$dir/data" -l "$dir/log" start >/dev/null
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	"$asuser" "$bin/pg_ctl" -m immediate -D "$dir/data" stop >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT
psql() { "$bin/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"; }
conn="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable"
echo "server: $("$bin/postgres" --version); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

stats() { # name values... -> "name median min max"
	python3 - "$@" <<'PY'
import statistics, sys
name, vals = sys.argv[1], [float(v) for v in sys.argv[2:]]
print(f"{name:<44} {statistics.median(vals):>10.1f} {min(vals):>10.1f} {max(vals):>10.1f}   n={len(vals)}")
PY
}

# ---------------------------------------------------------------- throughput
if [ -z "${SKIP_THROUGHPUT:-}" ]; then
	psql -c "SELECT pg_create_physical_replication_slot('keep', true)" >/dev/null
	psql -c "SELECT pg_switch_wal()" >/dev/null
	psql -c "CREATE TABLE filler (id bigint, pad text)"
	seg=$(psql -c "SELECT pg_walfile_name(pg_current_wal_lsn())")
	prev=$(psql -c "SELECT pg_walfile_name(pg_current_wal_lsn() - 1)")
	# The backlog starts at the start of segment $seg; the receivers resume
	# there because their directory holds the (complete) segment before it.
	start=$(psql -c "SELECT pg_current_wal_lsn() - (pg_current_wal_lsn() - '0/0'::pg_lsn)::numeric % (SELECT setting::numeric FROM pg_settings WHERE name = 'wal_segment_size')")
	rows=$((wal_mb * 1024 * 1024 / 280))
	echo "loading ~$wal_mb MB of WAL ($rows rows) ..." >&2
	psql -c "INSERT INTO filler SELECT g, repeat('x', 200) FROM generate_series(1, $rows) g"
	psql -c "SELECT pg_switch_wal()" >/dev/null
	end=$(psql -c "SELECT pg_current_wal_flush_lsn()")
	bytes=$(psql -c "SELECT '$end'::pg_lsn - '$start'::pg_lsn")
	mb=$(python3 -c "print($bytes / 1048576)")
	echo "backlog $start .. $end = $mb MB (prev segment $prev)" >&2
	variants=(pgwal_write pgwal_flush pg_receivewal pg_receivewal_sync)
	declare -A rate cpu
	for r in $(seq 1 "$rounds"); do
		for v in "${variants[@]}"; do
			d=$dir/recv-$v
			rm -rf "$d"
			mkdir -p "$d"
			cp "$dir/data/pg_wal/$prev" "$d/"
			case $v in
			pgwal_write) cmd=("$cli" -d "$conn application_name=$v" receive -D "$d" --ack write -E "$end") ;;
			pgwal_flush) cmd=("$cli" -d "$conn application_name=$v" receive -D "$d" --ack flush -E "$end") ;;
			pg_receivewal) cmd=("$bin/pg_receivewal" -d "$conn application_name=$v" -D "$d" -n -E "$end") ;;
			pg_receivewal_sync) cmd=("$bin/pg_receivewal" -d "$conn application_name=$v" -D "$d" -n --synchronous -E "$end") ;;
			esac
			t0=$(date +%s.%N)
			/usr/bin/time -f '%U %S' -o "$dir/time" "${cmd[@]}" 2>"$dir/err" >/dev/null || { cat "$dir/err" >&2; exit 1; }
			t1=$(date +%s.%N)
			[ -f "$d/$seg" ] || { echo "$v: segment $seg missing" >&2; ls "$d" >&2; exit 1; }
			cmp -s "$d/$seg" "$dir/data/pg_wal/$seg" || { echo "$v: segment $seg differs" >&2; exit 1; }
			rate[$v]+=" $(python3 -c "print($mb / ($t1 - $t0))")"
			cpu[$v]+=" $(awk -v mb="$mb" '{print ($1 + $2) / mb * 1000}' "$dir/time")"
			rm -rf "$d"
		done
	done
	echo
	echo "WAL throughput, $mb MB backlog, $rounds interleaved rounds"
	printf '%-44s %10s %10s %10s\n' "receiver: MB/s" median min max
	for v in "${variants[@]}"; do stats "$v" ${rate[$v]}; done
	printf '%-44s %10s %10s %10s\n' "receiver: client CPU ms per MB" median min max
	for v in "${variants[@]}"; do stats "$v" ${cpu[$v]}; done
	psql -c "SELECT pg_drop_replication_slot('keep')" >/dev/null
	psql -c "DROP TABLE filler; CHECKPOINT" >/dev/null
fi

# ---------------------------------------------------------------------- TPS
if [ -z "${SKIP_TPS:-}" ]; then
	psql -c "ALTER SYSTEM SET synchronous_standby_names = 'bench_sync'" -c "SELECT pg_reload_conf()" >/dev/null
	PGOPTIONS="-c synchronous_commit=local" "$bin/pgbench" -i -q -s 10 -h 127.0.0.1 -p "$port" -U postgres postgres >/dev/null 2>&1
	variants=(local pgwal_receive pgwal_write pgwal_flush pg_receivewal_sync)
	declare -A tps
	for r in $(seq 1 "$rounds"); do
		for v in "${variants[@]}"; do
			d=$dir/sync-$v
			rm -rf "$d"
			mkdir -p "$d"
			level=on
			rpid=
			case $v in
			local) level=local ;;
			pgwal_receive) level=remote_write; "$cli" -d "$conn application_name=bench_sync" receive -D "$d" --ack receive 2>"$dir/rlog" & rpid=$! ;;
			pgwal_write) level=remote_write; "$cli" -d "$conn application_name=bench_sync" receive -D "$d" --ack write 2>"$dir/rlog" & rpid=$! ;;
			pgwal_flush) "$cli" -d "$conn application_name=bench_sync" receive -D "$d" --ack flush 2>"$dir/rlog" & rpid=$! ;;
			pg_receivewal_sync) "$bin/pg_receivewal" -d "$conn application_name=bench_sync" -D "$d" -n --synchronous 2>"$dir/rlog" & rpid=$! ;;
			esac
			if [ -n "$rpid" ]; then
				pids+=("$rpid")
				for _ in $(seq 1 200); do
					[ "$(psql -c "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'bench_sync' AND sync_state = 'sync' AND state = 'streaming'")" = 1 ] && break
					sleep 0.05
				done
			fi
			out=$(PGOPTIONS="-c synchronous_commit=$level" "$bin/pgbench" -n -N -c "$clients" -j "$clients" -T "$secs" -h 127.0.0.1 -p "$port" -U postgres postgres 2>&1)
			t=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
			[ -n "$t" ] || { echo "$out" >&2; exit 1; }
			tps[$v]+=" $t"
			if python3 -c "import sys; sys.exit(0 if $t < 100 else 1)"; then
				echo "WARNING: $v round $r: $t tps; receiver log:" >&2
				cat "$dir/rlog" >&2 || true
				psql -c "SELECT application_name, state, sync_state, sent_lsn, write_lsn, flush_lsn, pg_current_wal_lsn() FROM pg_stat_replication" >&2
				tail -5 "$dir/log" >&2
			fi
			if [ -n "$rpid" ]; then
				kill -TERM "$rpid"
				wait "$rpid" || true
			fi
			rm -rf "$d"
		done
	done
	echo
	echo "commit TPS, pgbench -N, $clients clients, ${secs}s, $rounds interleaved rounds"
	printf '%-44s %10s %10s %10s\n' "variant (synchronous_commit)" median min max
	for v in "${variants[@]}"; do
		case $v in
		local) label="no standby wait (local)" ;;
		pgwal_receive) label="pgwal --ack receive (remote_write)" ;;
		pgwal_write) label="pgwal --ack write (remote_write)" ;;
		pgwal_flush) label="pgwal --ack flush (on)" ;;
		pg_receivewal_sync) label="pg_receivewal --synchronous (on)" ;;
		esac
		stats "$label" ${tps[$v]}
	done
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
