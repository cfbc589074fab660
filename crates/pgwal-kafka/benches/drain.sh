#!/usr/bin/env bash
# Backlog drain into Kafka: `pgwal stream --sink kafka` against the same
# drain as JSON lines to /dev/null, on the same machine as the broker.
#
# A backlog of TXNS transactions of ROWS_PER_TXN rows each (default 10,000
# x 100 = 1,000,000 rows: bigint key, int, md5 text) is written after one
# slot per run was created, so every run drains the same WAL. Variants,
# interleaved over ROUNDS rounds (default 3):
#   null       pgwal stream ... > /dev/null (JSON lines, acked after output)
#   kafka-dbz  --sink kafka, Debezium envelope (the default format)
#   kafka-pg   --sink kafka --kafka-format pgwal
#   kafka-dbz-32m  as kafka-dbz with --kafka-batch-bytes 32 MiB (fewer,
#              larger Kafka transactions; during a drain the 4 MiB default,
#              not the 100 ms, ends each)
#   kafka-dbz-base as kafka-dbz, run by the pgwal binary $PGWAL_BASE_CLI (one
#              built from another commit: a regression check in one run)
#   kafka-dbz-tls  as kafka-dbz over the broker's SASL_SSL listener (TLS,
#              SCRAM-SHA-512; the broker runs with --secure for every
#              variant, so plaintext and TLS runs share one broker)
#   kafka-dbz-schemas  as kafka-dbz with --kafka-json-schemas (each key and
#              value with its Kafka Connect schema)
#   kafka-dbz-schemas-32m  the same with --kafka-batch-bytes 32 MiB (a
#              Kafka transaction holds at most that many bytes of records,
#              counted before compression; schemas make records ~6x larger)
#   kafka-dbz-zstd, kafka-dbz-schemas-zstd  the same with zstd compression
#              (librdkafka's compression.type; the schema text repeats in
#              every record of a batch)
# With kafka-dbz and kafka-dbz-tls (or kafka-dbz-schemas) both run, each
# round's ratio of rows/s to kafka-dbz is printed, with its median and range.
# Each run ends at the backlog's end (--stop-lsn). Per run: wall time,
# rows/s, client CPU (user+sys, /usr/bin/time), the broker's CPU (from
# /proc), the time pgwal spent waiting for Kafka commits (its debug log)
# and peak client RSS. Medians, min and max per variant; raw lines in
# RESULTS_OUT.
#
# The cluster and the broker's log directory live under /dev/shm (tmpfs),
# not on the root disk. The machine's load is printed: on a busy machine
# the numbers are indicative only.
#
# usage: crates/pgwal-kafka/benches/drain.sh
# env:   PGWAL_BENCH_BIN (server bin dir; default .build/install/bench/bin),
#        TXNS, ROWS_PER_TXN, ROUNDS, VARIANTS (default: all four),
#        KAFKA_ARGS (more pgwal options for the kafka variants), RESULTS_OUT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=${PGWAL_BENCH_BIN:-$repo/.build/install/bench/bin}
txns=${TXNS:-10000}
per=${ROWS_PER_TXN:-100}
rounds=${ROUNDS:-3}
read -r -a variants <<<"${VARIANTS:-null kafka-dbz kafka-pg kafka-dbz-32m kafka-dbz-tls}"
[ -x "$bin/postgres" ] || { echo "no server in $bin (server/pg build --flavour bench)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is required (apt install time)" >&2; exit 2; }
command -v java >/dev/null || { echo "java is required for the broker" >&2; exit 2; }
# shellcheck source=crates/pgwal/benches/cluster.sh
. "$repo/crates/pgwal/benches/cluster.sh"
(cd "$repo/crates" && cargo build -q --release -p pgwal-cli)
pgwal=$repo/crates/target/release/pgwal
broker_dir=$(mktemp -d /dev/shm/pgwal-kafka-bench-XXXXXX)
cleanup() {
	"$repo/tools/kafka-broker" kill "$broker_dir" >/dev/null 2>&1 || true
	rm -rf "$broker_dir"
	bench_cluster_stop
}
trap cleanup EXIT
bench_cluster_start /dev/shm "$bin" "wal_level = logical" "max_replication_slots = 40" \
	"max_wal_senders = 20" "shared_buffers = 512MB" "max_wal_size = 4GB"
kport=$(python3 -c 'import socket
for p in range(19100, 19900, 4):
    try:
        socks = [socket.socket() for _ in range(4)]
        for i, s in enumerate(socks): s.bind(("127.0.0.1", p + i))
        print(p); break
    except OSError: pass')
brokers=$("$repo/tools/kafka-broker" start "$broker_dir/b" "$kport" --secure)
# the SASL_SSL listener and its test CA and user (tools/kafka-broker)
secure() { sed -n "s/^$1=//p" "$broker_dir/b/secure.env"; }
tls_args=(--kafka-brokers "$(secure sasl_ssl)" --kafka-option security.protocol=SASL_SSL
	--kafka-option "ssl.ca.location=$(secure ca)" --kafka-option sasl.mechanism=SCRAM-SHA-512
	--kafka-option "sasl.username=$(secure user)" --kafka-option "sasl.password=$(secure password)")
broker_pid=$(cat "$broker_dir/b/broker.pid")
echo "server: $("$bin/postgres" --version); Kafka at $brokers; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
raw=${RESULTS_OUT:-$dir/raw}
: >"$raw"

psql -c "CREATE TABLE orders (id bigint PRIMARY KEY, qty int, note text)"
psql -c "CREATE PUBLICATION p FOR TABLE orders"
n=0
for round in $(seq 1 "$rounds"); do
	for v in "${variants[@]}"; do
		n=$((n + 1))
		psql -c "SELECT pg_create_logical_replication_slot('s$n', 'pgoutput')" >/dev/null
	done
done
psql -c "CREATE PROCEDURE fill(txns int, per int) LANGUAGE plpgsql AS \$\$
BEGIN
  FOR t IN 0..txns - 1 LOOP
    INSERT INTO orders SELECT t::bigint * per + g, g, md5(g::text) FROM generate_series(1, per) g;
    COMMIT;
  END LOOP;
END \$\$"
psql -c "CALL fill($txns, $per)"
stop=$(psql -c "SELECT pg_current_wal_insert_lsn()")
rows=$((txns * per))
echo "backlog: $txns transactions, $rows rows, WAL to $stop" >&2

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
n=0
for round in $(seq 1 "$rounds"); do
	for v in "${variants[@]}"; do
		n=$((n + 1))
		args=(-d "$conn" stream -S "s$n" -P p --stop-lsn "$stop" --slot-check-interval 0)
		exe=$pgwal
		case $v in
		null) ;;
		kafka-dbz-base)
			[ -x "${PGWAL_BASE_CLI:-}" ] || { echo "kafka-dbz-base needs PGWAL_BASE_CLI (a pgwal binary)" >&2; exit 2; }
			exe=$PGWAL_BASE_CLI
			args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" ${KAFKA_ARGS:-})
			;;
		kafka-dbz) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" ${KAFKA_ARGS:-}) ;;
		kafka-dbz-32m) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --kafka-batch-bytes 33554432 ${KAFKA_ARGS:-}) ;;
		kafka-pg) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --kafka-format pgwal ${KAFKA_ARGS:-}) ;;
		kafka-dbz-tls) args+=(--sink kafka "${tls_args[@]}" --kafka-topic-prefix "r$n" ${KAFKA_ARGS:-}) ;;
		kafka-dbz-schemas) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --kafka-json-schemas ${KAFKA_ARGS:-}) ;;
		kafka-dbz-schemas-32m) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --kafka-json-schemas --kafka-batch-bytes 33554432 ${KAFKA_ARGS:-}) ;;
		kafka-dbz-zstd) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --kafka-option compression.type=zstd ${KAFKA_ARGS:-}) ;;
		kafka-dbz-schemas-zstd) args+=(--sink kafka --kafka-brokers "$brokers" --kafka-topic-prefix "r$n" --kafka-json-schemas --kafka-option compression.type=zstd ${KAFKA_ARGS:-}) ;;
		*) echo "unknown variant $v" >&2; exit 2 ;;
		esac
		b0=$(cpu_ticks "$broker_pid")
		log=$dir/run$n.log
		PGWAL_LOG=pgwal_kafka::producer=debug /usr/bin/time -f "TIME %e %U %S %M" -o "$log.time" \
			"$exe" "${args[@]}" >/dev/null 2>"$log"
		b1=$(cpu_ticks "$broker_pid")
		read -r _ t u s kb <"$log.time"
		# Kafka commits' durations, summed, in seconds
		wait=$(sed -n 's/.*Kafka commit .*took=\([0-9.]*\)\(m\{0,1\}s\).*/\1 \2/p' "$log" |
			awk '{ s += ($2 == "ms" ? $1 / 1000 : $1) } END { printf "%.2f", s }')
		commits=$(grep -c "Kafka commit" "$log" || true)
		# the records' bytes, from the sink's summary (0 for null)
		bytes=$(sed -n 's/.* records (\([0-9]*\) bytes).*/\1/p' "$log" | tail -1)
		line="$v round=$round secs=$t rows_per_s=$(awk -v r=$rows -v t="$t" 'BEGIN{printf "%.0f", r / t}') client_cpu=$(awk -v u="$u" -v s="$s" 'BEGIN{printf "%.2f", u + s}') broker_cpu=$(awk -v d=$((b1 - b0)) -v hz="$hz" 'BEGIN{printf "%.2f", d / hz}') commit_wait=$wait commits=$commits record_mb=$(( ${bytes:-0} >> 20 )) rss_mb=$((kb / 1024))"
		echo "$line" >>"$raw"
		echo "$line" >&2
		psql -c "SELECT pg_drop_replication_slot('s$n')" >/dev/null
	done
done

python3 - "$raw" "$rows" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, *kv = line.split()
    d = dict(x.split("=") for x in kv)
    rows.setdefault(v, []).append({k: float(x) for k, x in d.items()})
cols = ["secs", "rows_per_s", "client_cpu", "broker_cpu", "commit_wait", "commits", "record_mb", "rss_mb"]
print("| variant | runs | " + " | ".join(cols) + " |")
print("|---|---:|" + "---:|" * len(cols))
for v, rs in rows.items():
    cells = []
    for c in cols:
        xs = [r[c] for r in rs]
        cells.append(f"{statistics.median(xs):g} ({min(xs):g}–{max(xs):g})")
    print(f"| {v} | {len(rs)} | " + " | ".join(cells) + " |")
print(f"\n{int(sys.argv[2]):,} rows per run; median (min–max). commit_wait: seconds pgwal "
      "waited for Kafka commits; broker_cpu: the broker's CPU seconds during the run.")
plain = rows.get("kafka-dbz", [])
for v, what in [("kafka-dbz-tls", "TLS (SASL_SSL, SCRAM-SHA-512) / plaintext"),
                ("kafka-dbz-schemas", "with inline schemas / without"),
                ("kafka-dbz-zstd", "zstd / uncompressed"),
                ("kafka-dbz-schemas-32m", "inline schemas with 32 MiB batches / neither"),
                ("kafka-dbz-schemas-zstd", "inline schemas with zstd / neither")]:
    other = rows.get(v, [])
    if plain and other and len(plain) == len(other):
        # the same round's runs, next to each other in time
        ratios = [t["rows_per_s"] / p["rows_per_s"] for p, t in zip(plain, other)]
        cpu = [t["client_cpu"] / p["client_cpu"] for p, t in zip(plain, other)]
        print(f"\n{what}, per round: rows/s "
              f"{' '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}–{max(ratios):.3f}); client CPU median {statistics.median(cpu):.3f}")
EOF
