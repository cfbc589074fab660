#!/usr/bin/env bash
# End-to-end backlog drain: the same slot backlog consumed by pgwal (the
# `drain` example, proto 1 and proto 4 parallel), `pgwal stream` (JSON to
# /dev/null) and pg_recvlogical (pgoutput proto 1 to /dev/null), each on its
# own slot created before the load. Reports wall time, inserts/s, client
# CPU per insert (user+sys), client max RSS, walsender CPU per insert and
# how often the walsender blocked (voluntary context switches).
#
# pgwal_* consumers use the default StreamConfig::read_coalesce (1 ms: over
# TCP the socket's receive low-water mark is raised during a burst);
# *_eager turns it off, pgwal_v1_coalesce sets it to COALESCE_US. *_mt runs
# the drain on a 2-worker multi-thread runtime.
# Each consumer runs ROUNDS times (default 3), interleaved; medians are printed
# with the spread (min-max) of inserts/s and client CPU per insert, then the
# first consumer's ratio to each other one (median ratio, bootstrap 95% CI,
# Mann-Whitney p) for inserts/s, client CPU and walsender CPU per insert.
#
# Peer comparison: walstream_v1 / walstream_v4 are pg_walstream 0.10 with
# its libpq backend, walstream_rustls_v1 / walstream_rustls_v4 with its
# pure-Rust (rustls) backend (crates/peer-bench, its own workspace, built
# only when selected):
#   CONSUMERS="pgwal_v1 walstream_v1 walstream_rustls_v1 pg_recvlogical" ROUNDS=5 LAT_COUNT=0 \
#   BENCH_TMP=/dev/shm crates/pgwal/benches/e2e.sh 100 8000
#
# usage: crates/pgwal/benches/e2e.sh [TXNS] [ROWS_PER_TXN]   (default 50 x 8000)
#        ROUNDS=0 crates/pgwal/benches/e2e.sh 1 1              (latency only)
# env:   PGWAL_BENCH_BIN (server bin dir; default PGWAL_PG18_BIN or .build/install/check/bin)
#        CONSUMERS (space-separated subset/order of the consumers below)
#        BENCH_TMP (parent of the cluster's data directory; default /tmp)
#        LAT_COUNT (latency transactions, default 2000; 0 skips the latency run)
#        RESULTS_OUT (file to receive the raw per-run lines)
#        PERF_DIR (record a perf profile of the walsender of each run there,
#        DIR/CONSUMER.ROUND.data; it costs CPU, so not in measured runs)
#        LDWM (logical_decoding_work_mem, e.g. 64kB: proto 4 then streams)
#        PAD (bytes of the text column per row, default 100), STORAGE (that
#        column's storage, e.g. external: out of line, uncompressed, so
#        PAD=4000 makes a TOAST-heavy table)
#
# A consumer named NAME@N runs NAME against walsenders with
# wal_sender_batch_size = N kB (patch 0013; 0 = one send per change, as
# stock); plain NAME leaves the server's default. Set with ALTER SYSTEM and
# checked in a new session before each run, so the variants share one
# server and interleave. LAT_BATCH (space-separated sizes, default: the
# server's default only) repeats the latency run per size.
#
# A consumer named NAME@stock runs NAME against the unpatched build of the
# same source (STOCK_BIN, default .build/install/stock-bench/bin: built by
# `server/pg build --flavour stock-bench`), at its defaults. Then the stock
# initdb makes the data directory, and the server is restarted before every
# run with the build that run names, so neither build reads the WAL warmed
# by the other's walsender; each run first checks which build answers (only
# the patched one has wal_sender_batch_size) and stops otherwise.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
txns=${1:-50}
rows=${2:-8000}
bin=${PGWAL_BENCH_BIN:-${PGWAL_PG18_BIN:-$repo/.build/install/check/bin}}
cd "$repo/crates"
cargo build -q --release -p pgwal --example drain --example latency
cargo build -q --release -p pgwal-cli
drain=$repo/crates/target/release/examples/drain
cli=$repo/crates/target/release/pgwal
if [ -n "${CONSUMERS:-}" ]; then
	read -r -a consumers <<<"$CONSUMERS"
else
	consumers=(pgwal_v1 pgwal_v1_eager pgwal_v4 pgwal_cli pg_recvlogical)
fi
walstream=$repo/crates/peer-bench/target/release/walstream-drain
walstream_rustls=$repo/crates/peer-bench/target/rustls/release/walstream-drain
case " ${consumers[*]} " in
*" walstream_v"*) (cd "$repo/crates/peer-bench" && cargo build -q --release) ;;
esac
case " ${consumers[*]} " in
*" walstream_rustls_"*) (cd "$repo/crates/peer-bench" &&
	cargo build -q --release --no-default-features --features rustls --target-dir target/rustls) ;;
esac

stock_bin=""
case " ${consumers[*]} " in
*"@stock "*)
	stock_bin=${STOCK_BIN:-$repo/.build/install/stock-bench/bin}
	[ -x "$stock_bin/postgres" ] || { echo "no unpatched build in $stock_bin (server/pg build --flavour stock-bench)" >&2; exit 1; }
	;;
esac

# shellcheck source=cluster.sh
. "$repo/crates/pgwal/benches/cluster.sh"
trap bench_cluster_stop EXIT
# with a stock consumer the stock initdb makes the cluster: the patched
# initdb's catalog views are not the stock server's
bench_cluster_start "${BENCH_TMP:-/tmp}" "${stock_bin:-$bin}" \
	"wal_level = logical" "max_replication_slots = 100" "max_wal_senders = 10" "fsync = off" \
	"synchronous_commit = off" "shared_buffers = 256MB" "max_wal_size = 4GB"

# use_build stock|pgwal: restart the server with that build (only when a
# stock consumer is in the run) and check that build is the one answering
use_build() {
	[ -n "$stock_bin" ] || return 0
	local want=$1 has
	if [ "$want" = stock ]; then
		# the stock server refuses a setting it does not know
		[ "$bench_bin" = "$stock_bin" ] || psql -c "ALTER SYSTEM RESET wal_sender_batch_size" >/dev/null
		bench_cluster_restart "$stock_bin"
	else
		bench_cluster_restart "$bin"
	fi
	has=$(psql -c "SELECT count(*) FROM pg_settings WHERE name = 'wal_sender_batch_size'")
	if { [ "$want" = stock ] && [ "$has" != 0 ]; } || { [ "$want" = pgwal ] && [ "$has" != 1 ]; }; then
		echo "expected the $want build to answer, but wal_sender_batch_size is $([ "$has" = 0 ] && echo absent || echo present)" >&2
		exit 1
	fi
}
use_build pgwal
psql -c "CREATE TABLE bench (id bigint, pad text)" -c "CREATE PUBLICATION p FOR TABLE bench"
[ -z "${STORAGE:-}" ] || psql -c "ALTER TABLE bench ALTER pad SET STORAGE ${STORAGE}"
# LDWM: logical_decoding_work_mem, e.g. 64kB so that proto 4 streams the
# transactions in progress
[ -z "${LDWM:-}" ] || psql -c "ALTER SYSTEM SET logical_decoding_work_mem = '${LDWM}'" -c "SELECT pg_reload_conf()" >/dev/null
rounds=${ROUNDS:-3}
# slot names cannot hold '@'
slot_of() { echo "s_${1//@/_b}_$2"; }
# wal_sender_batch_size for the walsenders started from now on: a size in
# kB, or "" for the server's default; waits until new sessions see it
set_batch() {
	local want=$1 got=""
	if [ -n "$want" ]; then
		psql -c "ALTER SYSTEM SET wal_sender_batch_size = '${want}kB'" -c "SELECT pg_reload_conf()" >/dev/null
	else
		psql -c "ALTER SYSTEM RESET wal_sender_batch_size" -c "SELECT pg_reload_conf()" >/dev/null
	fi
	for _ in $(seq 1 100); do
		got=$(psql -c "SELECT setting, source FROM pg_settings WHERE name = 'wal_sender_batch_size'")
		if { [ -n "$want" ] && [ "$got" = "$want|configuration file" ]; } ||
			{ [ -z "$want" ] && [ "${got#*|}" = default ]; }; then
			return 0
		fi
		sleep 0.05
	done
	echo "wal_sender_batch_size did not become '${want:-default}' (got $got)" >&2
	exit 1
}
has_batch=$(psql -c "SELECT count(*) FROM pg_settings WHERE name = 'wal_sender_batch_size'")
if [ "$has_batch" = 0 ]; then
	case " ${consumers[*]} ${LAT_BATCH:-} " in
	*"@"* | *[0-9]" "*) echo "this server has no wal_sender_batch_size (patch 0013)" >&2; exit 1 ;;
	esac
	set_batch() { :; }
fi
for r in $(seq 1 "$rounds"); do
	for c in "${consumers[@]}"; do psql -c "SELECT pg_create_logical_replication_slot('$(slot_of "$c" "$r")', 'pgoutput')" >/dev/null; done
done
echo "loading $txns transactions x $rows rows ..." >&2
for t in $(seq 1 "$txns"); do
	echo "INSERT INTO bench SELECT g, repeat('x', ${PAD:-100}) FROM generate_series(1, $rows) g;"
done | psql
stop=$(psql -c "SELECT pg_current_wal_insert_lsn()")
total=$((txns * rows))
echo "WAL: $(psql -c "SELECT pg_size_pretty(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)"), $total inserts, server $("$bin/postgres" --version)" >&2

: >"$dir/results"
for r in $(seq 1 "$rounds"); do
for c in "${consumers[@]}"; do
	slot=$(slot_of "$c" "$r")
	batch=""
	[ "$c" = "${c%@*}" ] || batch=${c##*@}
	if [ "$batch" = stock ]; then
		use_build stock
		echo "$c round $r: $("$bench_bin/postgres" --version), stock defaults" >&2
	else
		use_build pgwal
		set_batch "$batch"
	fi
	case ${c%@*} in
	pgwal_v1) cmd=("$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v1_eager) cmd=(env COALESCE_US=0 "$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v1_coalesce) cmd=(env COALESCE_US="${COALESCE_US:-1000}" "$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v1_mt) cmd=(env WORKER_THREADS=2 "$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v1_mt_eager) cmd=(env WORKER_THREADS=2 COALESCE_US=0 "$drain" "$conn" "$slot" p "$stop" 1) ;;
	pgwal_v4) cmd=("$drain" "$conn" "$slot" p "$stop" 4 parallel) ;;
	walstream_v1) cmd=("$walstream" "$conn" "$slot" p "$stop" 1) ;;
	walstream_v4) cmd=("$walstream" "$conn" "$slot" p "$stop" 4 parallel) ;;
	walstream_rustls_v1) cmd=("$walstream_rustls" "$conn" "$slot" p "$stop" 1) ;;
	walstream_rustls_v4) cmd=("$walstream_rustls" "$conn" "$slot" p "$stop" 4 parallel) ;;
	pgwal_cli) cmd=("$cli" -d "$conn" stream -S "$slot" -P p --proto-version 1 --stop-lsn "$stop") ;;
	pgwal_cli_mt) cmd=("$cli" -d "$conn" stream -S "$slot" -P p --proto-version 1 --stop-lsn "$stop" --threads 2) ;;
	pg_recvlogical) cmd=("$bin/pg_recvlogical" -d "$conn" -S "$slot" --start -P pgoutput -o proto_version=1 -o publication_names=p -E "$stop" -f /dev/null) ;;
	esac
	start=$(date +%s.%N)
	/usr/bin/time -f '%U %S %M %w %e' -o "$dir/time" "${cmd[@]}" >/dev/null 2>"$dir/err" &
	pid=$!
	# Walsender CPU: find its pid once (psql costs CPU on this box), then
	# sample /proc/PID/stat without forking until the client exits.
	ws=0
	wu=0
	wsy=0
	wv=0
	wp=
	perfpid=
	while kill -0 $pid 2>/dev/null; do
		[ -n "$wp" ] || wp=$(psql -c "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '$slot'" 2>/dev/null || true)
		if [ -n "${PERF_DIR:-}" ] && [ -n "$wp" ] && [ -z "$perfpid" ]; then
			perf record -q -g -p "$wp" -o "$PERF_DIR/$c.$r.data" >/dev/null 2>&1 &
			perfpid=$!
		fi
		if [ -n "$wp" ] && read -r -a st 2>/dev/null </proc/"$wp"/stat; then
			ws=$((st[13] + st[14]))
			wu=${st[13]}
			wsy=${st[14]}
			# voluntary context switches: how often the walsender blocked
			# (socket full, or waiting for WAL)
			while read -r k v; do
				[ "$k" = voluntary_ctxt_switches: ] && wv=$v
			done </proc/"$wp"/status 2>/dev/null || true
		fi
		sleep 0.02
	done
	wait $pid || { cat "$dir/err" >&2; exit 1; }
	if [ -n "$perfpid" ]; then kill -INT "$perfpid" 2>/dev/null; wait "$perfpid" || true; fi
	# The drain consumers report their counts: all inserts must have arrived.
	if grep -q '^events=' "$dir/err" && ! grep -q "inserts=$total\$" "$dir/err"; then
		echo "$c round $r: expected $total inserts, got: $(cat "$dir/err")" >&2
		exit 1
	fi
	end=$(date +%s.%N)
	read -r u s m w e <"$dir/time"
	echo "$c $start $end $u $s $m $ws $w $e $wv $wu $wsy" >>"$dir/results"
done
done
# how the slots' transactions were decoded: streamed (proto 4 with a small
# logical_decoding_work_mem), spilled to disk, or neither
echo "decoding, summed over the slots: $(psql -c "SELECT format('stream_txns=%s spill_txns=%s total_txns=%s',
	sum(stream_txns), sum(spill_txns), sum(total_txns)) FROM pg_stat_replication_slots")"
# the lab's statistics need numpy/scipy: its virtualenv (lab/setup.sh) if present
labpy=$repo/lab/.venv/bin/python3
[ -x "$labpy" ] || labpy=python3
"$labpy" - "$dir/results" "$total" "$repo/lab" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
total = int(sys.argv[2])
print(f"{'consumer':<20} {'wall_s':>8} {'inserts/s':>10} {'(min-max)':>15} {'client_us/ins':>14} {'(min-max)':>11} {'max_rss_MB':>10} {'walsender_us/ins':>16} {'client_wakeups/1k':>17} {'walsender_waits/1k':>18} {'walsender_sys%':>14}   (medians of {len(rows) // max(1, len(set(r[0] for r in rows)))})")
for c in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == c]
    med = lambda f: statistics.median(f(r) for r in rs)
    span = lambda f: (min(f(r) for r in rs), max(f(r) for r in rs))
    # elapsed as measured by time(1); the polling loop's end is up to 0.1 s late
    wall_of = lambda r: float(r[8])
    wall = med(wall_of)
    rate = lambda r: total / wall_of(r)
    cpu_of = lambda r: (float(r[3]) + float(r[4])) * 1e6 / total
    cpu = med(cpu_of)
    rss = med(lambda r: int(r[5]) / 1024)
    ws = med(lambda r: int(r[6]) * 1e4 / total)
    wk = med(lambda r: int(r[7]) * 1e3 / total)
    wv = med(lambda r: int(r[9]) * 1e3 / total if len(r) > 9 else float("nan"))
    wsys = med(lambda r: 100 * int(r[11]) / max(1, int(r[10]) + int(r[11])) if len(r) > 11 else float("nan"))
    (r0, r1), (c0, c1) = span(rate), span(cpu_of)
    print(f"{c:<20} {wall:8.2f} {total / wall:10.0f} {f'{r0 / 1e3:.0f}k-{r1 / 1e3:.0f}k':>15} {cpu:14.2f} {f'{c0:.2f}-{c1:.2f}':>11} {rss:10.1f} {ws:16.2f} {wk:17.1f} {wv:18.1f} {wsys:14.0f}")
# Ratios against the first consumer: bootstrap 95% CI of the ratio of
# medians and Mann-Whitney p (the lab's statistics).
sys.path.insert(0, sys.argv[3])
from pgwal_lab.stats import compare
names = list(dict.fromkeys(r[0] for r in rows))
metrics = {
    "inserts/s": lambda r: total / float(r[8]),
    "client CPU/insert": lambda r: (float(r[3]) + float(r[4])) / total,
    "walsender CPU/insert": lambda r: int(r[6]) / total,
}
def show(num, den):
    """num's median over den's for each metric, with CI, p and verdict."""
    for m, f in metrics.items():
        c = compare([f(r) for r in rows if r[0] == den], [f(r) for r in rows if r[0] == num], name_a=den, name_b=num)
        if c["ratio"] is not None:
            print(f"  {num} / {den}, {m}: {c['ratio']:.3f} (95% CI {c['ci_low']:.3f}-{c['ci_high']:.3f}, p {c['p']:.3g}) {c['verdict']}")
for other in names[1:]:
    show(names[0], other)
# each consumer against its own run on the unpatched build (NAME@stock)
for stock in [n for n in names if n.endswith("@stock")]:
    for other in [n for n in names if n.split("@")[0] == stock.split("@")[0] and n != stock]:
        show(other, stock)
PY
cp "$dir/results" "${RESULTS_OUT:-/dev/null}"
[ "${LAT_COUNT:-2000}" = 0 ] && exit 0
use_build pgwal

# Commit-to-receive latency with a live single-row workload (200 tx/s).
psql -c "CREATE TABLE lat (id int, v text)" -c "CREATE PUBLICATION pl FOR TABLE lat" >/dev/null
for b in ${LAT_BATCH:-default}; do
	[ "$b" = default ] && set_batch "" || set_batch "$b"
	psql -c "SELECT pg_create_logical_replication_slot('s_lat_$b', 'pgoutput')" >/dev/null
	echo "wal_sender_batch_size: $b"
	"$repo/crates/target/release/examples/latency" "$conn" "s_lat_$b" pl lat "${LAT_COUNT:-2000}" 5
done
set_batch ""
[ -n "${LAT_BATCH:-}" ] && exit 0
# The same with read_coalesce off: one commit every 5 ms is not a burst, so
# the default's low-water mark should stay down and the latency not differ.
psql -c "SELECT pg_create_logical_replication_slot('s_lat_e', 'pgoutput')" >/dev/null
echo "with read_coalesce off:"
COALESCE_US=0 "$repo/crates/target/release/examples/latency" "$conn" s_lat_e pl lat "${LAT_COUNT:-2000}" 5
