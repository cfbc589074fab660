#!/usr/bin/env bash
# Physical streaming benchmark: `pgwal receive` against pg_receivewal.
#
# 1. WAL throughput: a backlog of bulk-load WAL (MB, default 1024) retained
#    on the primary; each receiver starts with a directory holding only the
#    segment before the backlog (so it resumes at the backlog's start), runs
#    with --endpos and exits. MB/s = backlog / wall time; client CPU from
#    /usr/bin/time. Interleaved: pgwal --ack write, pgwal --ack flush,
#    pg_receivewal, pg_receivewal --synchronous; one warm-up round, then
#    ROUNDS recorded rounds (default 5).
# 2. Commit TPS with the receiver as the only synchronous standby: pgbench
#    (CLIENTS clients, default 4, -N, SECS seconds, default 10) for
#      local            (no standby wait, baseline)
#      pgwal --ack receive, synchronous_commit = remote_write
#      pgwal --ack write,   synchronous_commit = remote_write
#      pgwal --ack flush,   synchronous_commit = on
#      pg_receivewal --synchronous, synchronous_commit = on
#    interleaved, ROUNDS rounds. Medians, min and max are printed.
#
# The primary lives under /dev/shm (tmpfs). The receivers' directories are
# on a disk chosen with DISK:
#   tmpfs      (default) /dev/shm: fsync is almost free, so this measures the
#              protocol and CPU cost, not a disk's flush latency;
#   slow-write ext4 on a loop device backed by /dev/shm (root only), with the
#              lab's LD_PRELOAD latency shim in the receivers adding
#              FSYNC_US (default 2000) after every fsync/fdatasync and WRITE_US
#              (default 300) after every write/pwrite to a file under that
#              mount -- the lab's `slow-write` standby disk. pg_receivewal
#              writes with write(2), pgwal with pwrite(2); the shim delays both.
# pgwal runs with its default --file-io auto (inline file I/O for --ack
# receive/write, tokio's blocking pool for --ack flush); a variant name
# ending in _pool or _inline forces --file-io pool or inline. Choose
# variants with THROUGHPUT_VARIANTS / TPS_VARIANTS, e.g.
#   TPS_VARIANTS="pgwal_flush pgwal_flush_pool pg_receivewal_sync".
# Every pair is compared with the lab's statistics (ratio of medians with a
# bootstrap 95% CI, Mann-Whitney p); RESULTS_OUT receives the raw values.
#
# usage: crates/pgwal/benches/physical.sh [WAL_MB]
# env:   PGWAL_BENCH_BIN (server bin dir; default /usr/lib/postgresql/15/bin),
#        ROUNDS, CLIENTS, SECS, SKIP_THROUGHPUT=1, SKIP_TPS=1, DISK, FSYNC_US,
#        WRITE_US, RESULTS_OUT, THROUGHPUT_VARIANTS, TPS_VARIANTS
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
wal_mb=${1:-1024}
bin=${PGWAL_BENCH_BIN:-/usr/lib/postgresql/15/bin}
rounds=${ROUNDS:-5}
clients=${CLIENTS:-4}
secs=${SECS:-10}
cd "$repo/crates"
nice -n 19 cargo build -q --release -p pgwal-cli
cli=$repo/crates/target/release/pgwal
# the lab's modules (shim, statistics) need its virtualenv (lab/setup.sh) if present
labpy=$repo/lab/.venv/bin/python3
[ -x "$labpy" ] || labpy=python3

# shellcheck source=cluster.sh
. "$repo/crates/pgwal/benches/cluster.sh"
pids=()
loopdev=
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	if [ -n "$loopdev" ]; then
		umount -l "$dir/disk" 2>/dev/null || true
		losetup -d "$loopdev" 2>/dev/null || true
		rm -f "$dir.img"
	fi
	bench_cluster_stop
}
trap cleanup EXIT
bench_cluster_start /dev/shm "$bin" \
	"wal_level = replica" "max_replication_slots = 10" "max_wal_senders = 10" "shared_buffers = 256MB" \
	"max_wal_size = 8GB" "checkpoint_timeout = 1h" "synchronous_commit = on"
disk=${DISK:-tmpfs}
recv_root=$dir
recv_env=()
case $disk in
tmpfs) ;;
slow-write)
	[ "$(id -u)" = 0 ] || { echo "DISK=slow-write needs root (loop device)" >&2; exit 2; }
	truncate -s 6G "$dir.img"
	loopdev=$(losetup -f --show "$dir.img")
	mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loopdev"
	mkdir -p "$dir/disk"
	mount -o noatime "$loopdev" "$dir/disk"
	recv_root=$dir/disk
	shim=$(PYTHONPATH="$repo/lab" "$labpy" -c 'from pgwal_lab.shim import build; print(build())')
	recv_env=(env LD_PRELOAD="$shim" PGWAL_SHIM_FSYNC_US="${FSYNC_US:-2000}"
		PGWAL_SHIM_PWRITE_US="${WRITE_US:-300}" PGWAL_SHIM_WRITE=1 PGWAL_SHIM_MATCH="$recv_root/")
	;;
*) echo "unknown DISK=$disk (tmpfs, slow-write)" >&2; exit 2 ;;
esac
echo "server: $("$bin/postgres" --version); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg); receivers' disk: $disk" >&2
raw=${RESULTS_OUT:-$dir/raw}
: >"$raw"

stats() { # name values... -> "name median min max"; the values also go to $raw
	echo "$*" >>"$raw"
	python3 - "$@" <<'PY'
import statistics, sys
name, vals = sys.argv[1], [float(v) for v in sys.argv[2:]]
print(f"{name:<44} {statistics.median(vals):>10.1f} {min(vals):>10.1f} {max(vals):>10.1f}   n={len(vals)}")
PY
}

compare() { # metric baseline other: ratio other/baseline of the last values recorded in $raw
	PYTHONPATH="$repo/lab" "$labpy" - "$raw" "$@" <<'PY'
import sys
from pgwal_lab.stats import compare
raw, metric, a, b = sys.argv[1:5]
vals = {}
for line in open(raw):
    name, *xs = line.split()
    vals[name] = [float(x) for x in xs]
c = compare(vals[f"{metric}:{a}"], vals[f"{metric}:{b}"], name_a=a, name_b=b)
print(f"  {b} / {a}: {c['ratio']:.3f} (95% CI {c['ci_low']:.3f}-{c['ci_high']:.3f}, p {c['p']:.3g}) -> {c['verdict']}")
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
	# VACUUM now, so that autovacuum of the new table does not compete with the first round
	psql -c "VACUUM ANALYZE filler" >/dev/null
	read -r -a variants <<<"${THROUGHPUT_VARIANTS:-pgwal_write pgwal_flush pg_receivewal pg_receivewal_sync}"
	declare -A rate cpu
	for r in $(seq 0 "$rounds"); do # round 0 warms up and is not recorded
		for v in "${variants[@]}"; do
			io=()
			[ "$v" = "${v%_pool}" ] || io=(--file-io pool)
			[ "$v" = "${v%_inline}" ] || io=(--file-io inline)
			d=$recv_root/recv-$v
			rm -rf "$d"
			mkdir -p "$d"
			cp "$dir/data/pg_wal/$prev" "$d/"
			sync -f "$d"
			base=${v%_pool}
			case ${base%_inline} in
			pgwal_write) cmd=("$cli" -d "$conn application_name=$v" receive -D "$d" -n "${io[@]}" --ack write -E "$end") ;;
			pgwal_flush) cmd=("$cli" -d "$conn application_name=$v" receive -D "$d" -n "${io[@]}" --ack flush -E "$end") ;;
			pg_receivewal) cmd=("$bin/pg_receivewal" -d "$conn application_name=$v" -D "$d" -n -E "$end") ;;
			pg_receivewal_sync) cmd=("$bin/pg_receivewal" -d "$conn application_name=$v" -D "$d" -n --synchronous -E "$end") ;;
			esac
			t0=$(date +%s.%N)
			/usr/bin/time -f '%U %S' -o "$dir/time" "${recv_env[@]}" "${cmd[@]}" 2>"$dir/err" >/dev/null || { cat "$dir/err" >&2; exit 1; }
			t1=$(date +%s.%N)
			[ -f "$d/$seg" ] || { echo "$v: segment $seg missing" >&2; ls "$d" >&2; exit 1; }
			cmp -s "$d/$seg" "$dir/data/pg_wal/$seg" || { echo "$v: segment $seg differs" >&2; exit 1; }
			[ "$r" -gt 0 ] || { rm -rf "$d"; continue; }
			rate[$v]+=" $(python3 -c "print($mb / ($t1 - $t0))")"
			cpu[$v]+=" $(awk -v mb="$mb" '{print ($1 + $2) / mb * 1000}' "$dir/time")"
			rm -rf "$d"
		done
	done
	echo
	echo "WAL throughput, $mb MB backlog, $rounds interleaved rounds"
	printf '%-44s %10s %10s %10s\n' "receiver: MB/s" median min max
	for v in "${variants[@]}"; do stats "mbps:$v" ${rate[$v]}; done
	for v in "${variants[@]}"; do
		[ "$v" = pg_receivewal ] || [ -z "${rate[pg_receivewal]:-}" ] || compare mbps pg_receivewal "$v"
	done
	[ -z "${rate[pg_receivewal_sync]:-}" ] || [ -z "${rate[pgwal_flush]:-}" ] || compare mbps pg_receivewal_sync pgwal_flush
	printf '%-44s %10s %10s %10s\n' "receiver: client CPU ms per MB" median min max
	for v in "${variants[@]}"; do stats "cpu:$v" ${cpu[$v]}; done
	psql -c "SELECT pg_drop_replication_slot('keep')" >/dev/null
	psql -c "DROP TABLE filler; CHECKPOINT" >/dev/null
fi

# ---------------------------------------------------------------------- TPS
if [ -z "${SKIP_TPS:-}" ]; then
	psql -c "ALTER SYSTEM SET synchronous_standby_names = 'bench_sync'" -c "SELECT pg_reload_conf()" >/dev/null
	PGOPTIONS="-c synchronous_commit=local" "$bin/pgbench" -i -q -s 10 -h 127.0.0.1 -p "$port" -U postgres postgres >/dev/null 2>&1
	read -r -a variants <<<"${TPS_VARIANTS:-local pgwal_receive pgwal_write pgwal_flush pg_receivewal_sync}"
	declare -A tps rcpu wcpu
	cpu_ticks() { # utime + stime of a process, 0 without one
		if [ -n "$1" ] && [ -r "/proc/$1/stat" ]; then
			sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
		else
			echo 0
		fi
	}
	for r in $(seq 1 "$rounds"); do
		for v in "${variants[@]}"; do
			io=()
			[ "$v" = "${v%_pool}" ] || io=(--file-io pool)
			[ "$v" = "${v%_inline}" ] || io=(--file-io inline)
			d=$recv_root/sync-$v
			rm -rf "$d"
			mkdir -p "$d"
			level=on
			rpid=
			base=${v%_pool}
			case ${base%_inline} in
			local) level=local ;;
			pgwal_receive) level=remote_write; "${recv_env[@]}" "$cli" -d "$conn application_name=bench_sync" receive -D "$d" -n "${io[@]}" --ack receive 2>"$dir/rlog" & rpid=$! ;;
			pgwal_write) level=remote_write; "${recv_env[@]}" "$cli" -d "$conn application_name=bench_sync" receive -D "$d" -n "${io[@]}" --ack write 2>"$dir/rlog" & rpid=$! ;;
			pgwal_flush) "${recv_env[@]}" "$cli" -d "$conn application_name=bench_sync" receive -D "$d" -n "${io[@]}" --ack flush 2>"$dir/rlog" & rpid=$! ;;
			pg_receivewal_sync) "${recv_env[@]}" "$bin/pg_receivewal" -d "$conn application_name=bench_sync" -D "$d" -n --synchronous 2>"$dir/rlog" & rpid=$! ;;
			esac
			if [ -n "$rpid" ]; then
				pids+=("$rpid")
				for _ in $(seq 1 200); do
					[ "$(psql -c "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'bench_sync' AND sync_state = 'sync' AND state = 'streaming'")" = 1 ] && break
					sleep 0.05
				done
			fi
			wpid=
			[ -z "$rpid" ] || wpid=$(psql -c "SELECT pid FROM pg_stat_replication WHERE application_name = 'bench_sync'")
			r0=$(cpu_ticks "$rpid")
			w0=$(cpu_ticks "$wpid")
			out=$(PGOPTIONS="-c synchronous_commit=$level" "$bin/pgbench" -n -N -c "$clients" -j "$clients" -T "$secs" -h 127.0.0.1 -p "$port" -U postgres postgres 2>&1)
			t=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
			[ -n "$t" ] || { echo "$out" >&2; exit 1; }
			tps[$v]+=" $t"
			if [ -n "$rpid" ]; then # CPU µs per commit: the receiver and its walsender
				rcpu[$v]+=" $(python3 -c "print(($(cpu_ticks "$rpid") - $r0) * 1e6 / $(getconf CLK_TCK) / ($t * $secs))")"
				wcpu[$v]+=" $(python3 -c "print(($(cpu_ticks "$wpid") - $w0) * 1e6 / $(getconf CLK_TCK) / ($t * $secs))")"
			fi
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
		base=${v%_pool}
		case ${base%_inline} in
		local) label="no standby wait (local)" ;;
		pgwal_receive) label="pgwal --ack receive (remote_write)" ;;
		pgwal_write) label="pgwal --ack write (remote_write)" ;;
		pgwal_flush) label="pgwal --ack flush (on)" ;;
		pg_receivewal_sync) label="pg_receivewal --synchronous (on)" ;;
		esac
		[ "$v" = "${v%_pool}" ] || label="$label, --file-io pool"
		[ "$v" = "${v%_inline}" ] || label="$label, --file-io inline"
		stats "tps:$v" ${tps[$v]}
		echo "  = $label"
	done
	printf '%-44s %10s %10s %10s\n' "receiver CPU µs per commit" median min max
	for v in "${variants[@]}"; do [ -z "${rcpu[$v]:-}" ] || stats "rcpu:$v" ${rcpu[$v]}; done
	printf '%-44s %10s %10s %10s\n' "walsender CPU µs per commit" median min max
	for v in "${variants[@]}"; do [ -z "${wcpu[$v]:-}" ] || stats "wcpu:$v" ${wcpu[$v]}; done
	pair() { [ -n "${tps[$1]:-}" ] && [ -n "${tps[$2]:-}" ] && compare tps "$1" "$2" || true; }
	pair pgwal_write pgwal_receive
	pair pgwal_flush pgwal_write
	pair pg_receivewal_sync pgwal_flush
	for v in "${variants[@]}"; do
		[ "$v" = "${v%_pool}" ] || pair "$v" "${v%_pool}"
		[ "$v" = "${v%_inline}" ] || pair "$v" "${v%_inline}"
	done
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
