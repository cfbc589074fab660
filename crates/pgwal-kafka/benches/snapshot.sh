#!/usr/bin/env bash
# Snapshots into Kafka: `pgwal stream --sink kafka --snapshot` of a table of
# ROWS rows (default 10,000,000: bigint key, int, md5 text), Debezium JSON,
# on the same machine as the broker, while a paced writer commits LOAD_TPS
# single-row transactions a second (default 200) into a second published
# table. Variants, interleaved over ROUNDS rounds (default 2):
#   snap       --snapshot, 4096-row chunks (the default)
#   snap-16k   --snapshot --kafka-snapshot-chunk-rows 16384
#   snap-ro    --snapshot --kafka-snapshot-read-only (no watermark written;
#              each chunk's window ends at a WAL position)
#   snap-32m   --snapshot --kafka-batch-bytes 33554432
#   snap-schemas --snapshot --kafka-json-schemas (Debezium JSON, each key and
#              value with its Kafka Connect schema inline)
#   snap-avro  --snapshot --kafka-avro: keys and values in Avro, their schemas
#              in a schema registry (tools/schema-registry-server, started
#              for the run; the form snap-schemas' records are converted from)
#   stream     no snapshot: the writer's transactions only, for STREAM_SECS
#              (default 60), the lag without a snapshot beside it
#   copy-null  pgwal stream --snapshot > /dev/null: the exported snapshot
#              copied with COPY, as JSON lines (not Kafka; the fastest
#              consistent read pgwal has)
# Each Kafka run makes its own slot and topics. A snapshot run ends when the
# sink logs "snapshot finished" (then SIGTERM). Per run: seconds, snapshot
# rows/s, client CPU and peak RSS (/usr/bin/time), and the stream's lag
# while it ran: pgwal_lag_seconds from --metrics (commit time of the last
# transaction in Kafka's last commit, to that commit), sampled every
# second, median and max. Medians, min and max per variant; raw lines in
# RESULTS_OUT.
#
# The cluster and the broker's log directory live under /dev/shm.
#
# usage: crates/pgwal-kafka/benches/snapshot.sh
# env:   PGWAL_BENCH_BIN (server bin dir; default .build/install/bench/bin),
#        ROWS, ROUNDS, VARIANTS, LOAD_TPS, STREAM_SECS, RESULTS_OUT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=${PGWAL_BENCH_BIN:-$repo/.build/install/bench/bin}
rows=${ROWS:-10000000}
rounds=${ROUNDS:-2}
tps=${LOAD_TPS:-200}
stream_secs=${STREAM_SECS:-60}
read -r -a variants <<<"${VARIANTS:-snap snap-16k stream copy-null}"
[ -x "$bin/postgres" ] || { echo "no server in $bin (server/pg build --flavour bench)" >&2; exit 2; }
[ -x "$bin/pgbench" ] || { echo "no pgbench in $bin" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is required (apt install time)" >&2; exit 2; }
command -v java >/dev/null || { echo "java is required for the broker" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl is required (metrics)" >&2; exit 2; }
# shellcheck source=crates/pgwal/benches/cluster.sh
. "$repo/crates/pgwal/benches/cluster.sh"
(cd "$repo/crates" && cargo build -q --release -p pgwal-cli)
pgwal=$repo/crates/target/release/pgwal
broker_dir=$(mktemp -d /dev/shm/pgwal-kafka-snap-XXXXXX)
load_pid=
registry=
cleanup() {
	[ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null || true
	pkill -f "$broker_dir" 2>/dev/null || true
	"$repo/tools/kafka-broker" kill "$broker_dir" >/dev/null 2>&1 || true
	[ -z "$registry" ] || "$repo/tools/schema-registry-server" stop "$broker_dir/registry" >/dev/null 2>&1 || true
	rm -rf "$broker_dir"
	bench_cluster_stop
}
trap cleanup EXIT
bench_cluster_start /dev/shm "$bin" "wal_level = logical" "max_replication_slots = 40" \
	"max_wal_senders = 20" "shared_buffers = 1GB" "max_wal_size = 8GB"
kport=$(python3 -c 'import socket
for p in range(19100, 19900, 4):
    try:
        socks = [socket.socket() for _ in range(4)]
        for i, s in enumerate(socks): s.bind(("127.0.0.1", p + i))
        print(p); break
    except OSError: pass')
brokers=$("$repo/tools/kafka-broker" start "$broker_dir/b" "$kport")
if [[ " ${variants[*]} " == *" snap-avro "* ]]; then
	rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	registry=$("$repo/tools/schema-registry-server" start "$broker_dir/registry" "$rport")
	echo "schema registry at $registry" >&2
fi
echo "server: $("$bin/postgres" --version); Kafka at $brokers; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
raw=${RESULTS_OUT:-$dir/raw}
: >"$raw"

psql -c "CREATE TABLE big (id bigint PRIMARY KEY, qty int, note text)"
psql -c "INSERT INTO big SELECT g, g % 1000, md5(g::text) FROM generate_series(1, $rows) g"
psql -c "VACUUM ANALYZE big"
psql -c "CREATE TABLE events (id bigserial PRIMARY KEY, at timestamptz DEFAULT now())"
psql -c "CREATE PUBLICATION p FOR TABLE big, events"
echo "table big: $rows rows, $(psql -c "SELECT pg_size_pretty(pg_total_relation_size('big'))")" >&2

# the paced writer, for the whole benchmark
echo "INSERT INTO events DEFAULT VALUES;" >"$dir/load.sql"
chmod 644 "$dir/load.sql"
"$repo/tools/as-user" "$bin/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c 1 -R "$tps" -T 86400 \
	-f "$dir/load.sql" postgres >"$dir/pgbench.log" 2>&1 &
load_pid=$!

mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
lag() { curl -s "http://127.0.0.1:$mport/metrics" | awk '$1 == "pgwal_lag_seconds" { print $2 }'; }

n=0
for round in $(seq 1 "$rounds"); do
	for v in "${variants[@]}"; do
		n=$((n + 1))
		log=$dir/run$n.log
		args=(-d "$conn" stream -S "s$n" -P p --slot-check-interval 0)
		kafka=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --metrics "127.0.0.1:$mport")
		case $v in
		snap) args+=("${kafka[@]}" --snapshot) ;;
		snap-16k) args+=("${kafka[@]}" --snapshot --kafka-snapshot-chunk-rows 16384) ;;
		snap-ro) args+=("${kafka[@]}" --snapshot --kafka-snapshot-read-only) ;;
		snap-32m) args+=("${kafka[@]}" --snapshot --kafka-batch-bytes 33554432) ;;
		snap-schemas) args+=("${kafka[@]}" --snapshot --kafka-json-schemas) ;;
		snap-avro) args+=("${kafka[@]}" --snapshot --kafka-avro --kafka-schema-registry "$registry") ;;
		stream) args+=("${kafka[@]}" --create-slot) ;;
		copy-null)
			stop=$(psql -c "SELECT pg_current_wal_insert_lsn()")
			/usr/bin/time -f "TIME %e %U %S %M" -o "$log.time" \
				"$pgwal" "${args[@]}" --snapshot --stop-lsn "$stop" >/dev/null 2>"$log"
			read -r _ t u s kb <"$log.time"
			line="$v round=$round secs=$t rows_per_s=$(awk -v r="$rows" -v t="$t" 'BEGIN{printf "%.0f", r / t}') client_cpu=$(awk -v u="$u" -v s="$s" 'BEGIN{printf "%.2f", u + s}') rss_mb=$((kb / 1024)) lag_median=0 lag_max=0 record_bytes=0"
			echo "$line" >>"$raw"
			echo "$line" >&2
			psql -c "SELECT pg_drop_replication_slot('s$n')" >/dev/null
			continue
			;;
		*) echo "unknown variant $v" >&2; exit 2 ;;
		esac
		t0=$(date +%s.%N)
		PGWAL_LOG=pgwal_kafka=info /usr/bin/time -f "TIME %e %U %S %M" -o "$log.time" \
			"$pgwal" "${args[@]}" >/dev/null 2>"$log" &
		time_pid=$!
		: >"$log.lag"
		while :; do
			sleep 1
			kill -0 "$time_pid" 2>/dev/null || { echo "pgwal exited early:" >&2; cat "$log" >&2; exit 1; }
			l=$(lag || true)
			[ -n "$l" ] && echo "$l" >>"$log.lag"
			if [ "$v" = stream ]; then
				awk -v t0="$t0" -v s="$stream_secs" -v now="$(date +%s.%N)" 'BEGIN{exit !(now - t0 >= s)}' && break
			else
				grep -q "snapshot finished" "$log" && break
			fi
		done
		t1=$(date +%s.%N)
		pkill -TERM -P "$time_pid" || true
		wait "$time_pid" || { echo "pgwal failed:" >&2; tail -5 "$log" >&2; exit 1; }
		read -r _ _ u s kb <"$log.time"
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
		snap_rows=$(sed -n 's/.* \([0-9]*\) snapshot rows in .*/\1/p' "$log" | tail -1)
		read -r recs rbytes < <(sed -n 's/.* \([0-9]*\) records (\([0-9]*\) bytes) in .*/\1 \2/p' "$log" | tail -1)
		read -r lmed lmax < <(python3 -c 'import statistics, sys
xs = [float(x) for x in open(sys.argv[1]) if x.strip()]
print(f"{statistics.median(xs):.3f} {max(xs):.3f}" if xs else "0 0")' "$log.lag")
		line="$v round=$round secs=$secs rows_per_s=$(awk -v r="${snap_rows:-0}" -v t="$secs" 'BEGIN{printf "%.0f", r / t}') client_cpu=$(awk -v u="$u" -v s="$s" 'BEGIN{printf "%.2f", u + s}') rss_mb=$((kb / 1024)) lag_median=$lmed lag_max=$lmax record_bytes=$(awk -v n="${recs:-0}" -v b="${rbytes:-0}" 'BEGIN{printf "%.0f", n ? b / n : 0}')"
		echo "$line" >>"$raw"
		echo "$line" >&2
		psql -c "SELECT pg_drop_replication_slot('s$n')" >/dev/null
	done
done
kill "$load_pid" 2>/dev/null || true
wait "$load_pid" 2>/dev/null || true
load_pid=
echo "writer: $(psql -c "SELECT count(*) || ' transactions, ' || round(count(*) / extract(epoch FROM max(at) - min(at))) || ' a second' FROM events")" >&2

python3 - "$raw" "$rows" "$tps" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, *kv = line.split()
    d = dict(x.split("=") for x in kv)
    rows.setdefault(v, []).append({k: float(x) for k, x in d.items()})
cols = ["secs", "rows_per_s", "client_cpu", "rss_mb", "lag_median", "lag_max", "record_bytes"]
print("| variant | runs | " + " | ".join(cols) + " |")
print("|---|---:|" + "---:|" * len(cols))
for v, rs in rows.items():
    cells = []
    for c in cols:
        xs = [r.get(c, 0) for r in rs]
        cells.append(f"{statistics.median(xs):g} ({min(xs):g}–{max(xs):g})")
    print(f"| {v} | {len(rs)} | " + " | ".join(cells) + " |")
print(f"\n{int(sys.argv[2]):,} rows in the table; a writer at {sys.argv[3]} transactions/s "
      "throughout; median (min–max). rows_per_s: snapshot rows written to Kafka per second "
      "of the run; lag: pgwal_lag_seconds sampled each second (0 for copy-null); record_bytes: "
      "key and value bytes per record the sink wrote (0 for copy-null).")
EOF
