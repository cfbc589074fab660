#!/usr/bin/env bash
# Initial-copy benchmark: `pgwal stream --snapshot` of one large table with
# 1, 2 and 4 copy connections (--snapshot-jobs), JSON lines to /dev/null.
#
# For each run a new slot is made with an exported snapshot, the table
# (ROWS rows, default 3,000,000, about 350 MB: bigint key, md5 text,
# numeric, timestamptz) is copied, and pgwal exits at the consistent point
# (--stop-lsn taken before the run, with nothing written since). Wall time,
# rows/s and the client's peak RSS (/usr/bin/time) per run; the job counts
# interleave, ROUNDS rounds (default 3), medians, min and max. Peak RSS is
# the point: the copy hands rows over in batches of about 1 MiB through a
# channel of 2 x jobs batches, so memory must not grow with the table.
#
# The cluster lives under /dev/shm (tmpfs). The machine's other load is
# printed; rows/s on a busy machine is indicative only.
#
# usage: crates/pgwal/benches/snapshot.sh
# env:   PGWAL_BENCH_BIN (server bin dir; default .build/install/bench/bin),
#        ROWS, ROUNDS, JOBS (default "1 2 4"), RESULTS_OUT (raw values)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=${PGWAL_BENCH_BIN:-$repo/.build/install/bench/bin}
rows=${ROWS:-3000000}
rounds=${ROUNDS:-3}
read -r -a jobs_list <<<"${JOBS:-1 2 4}"
[ -x "$bin/postgres" ] || { echo "no server in $bin (server/pg build --flavour bench)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is required (apt install time)" >&2; exit 2; }
# shellcheck source=crates/pgwal/benches/cluster.sh
. "$here/cluster.sh"
(cd "$repo/crates" && cargo build -q --release -p pgwal-cli)
pgwal=$repo/crates/target/release/pgwal
trap bench_cluster_stop EXIT
bench_cluster_start /dev/shm "$bin" "wal_level = logical" "max_replication_slots = 20" \
	"max_wal_senders = 20" "shared_buffers = 512MB" "max_wal_size = 4GB"
echo "server: $("$bin/postgres" --version); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
raw=${RESULTS_OUT:-$dir/raw}
: >"$raw"

psql -c "CREATE TABLE big (id bigint PRIMARY KEY, t text, n numeric, ts timestamptz)"
psql -c "INSERT INTO big SELECT g, md5(g::text) || md5((g * 7)::text), g * 1.25, '2026-01-01'::timestamptz + g * interval '1 s' FROM generate_series(1, $rows) g"
psql -c "CREATE PUBLICATION p FOR TABLE big"
psql -c "VACUUM ANALYZE big"
psql -c "CHECKPOINT"
size=$(psql -c "SELECT pg_size_pretty(pg_relation_size('big'))")
echo "table big: $rows rows, $size" >&2

declare -A secs rss
n=0
for round in $(seq 1 "$rounds"); do
	for j in "${jobs_list[@]}"; do
		n=$((n + 1))
		stop=$(psql -c "SELECT pg_current_wal_insert_lsn()")
		out=$(/usr/bin/time -f "%e %M" "$pgwal" -d "$conn" stream -S "s$n" -P p --snapshot \
			--snapshot-jobs "$j" --stop-lsn "$stop" --slot-check-interval 0 2>&1 >/dev/null | tail -n1)
		read -r t kb <<<"$out"
		psql -c "SELECT pg_drop_replication_slot('s$n')" >/dev/null
		secs[$j]+=" $t"
		rss[$j]+=" $((kb / 1024))"
		echo "round $round, jobs $j: $t s, peak RSS $((kb / 1024)) MB" >&2
	done
done

stats() { # name values... -> "name median min max"; the values also go to $raw
	echo "$*" >>"$raw"
	python3 - "$@" <<'PY'
import statistics, sys
name, vals = sys.argv[1], [float(v) for v in sys.argv[2:]]
print(f"{name:<28} {statistics.median(vals):>12.1f} {min(vals):>12.1f} {max(vals):>12.1f}   n={len(vals)}")
PY
}
printf '%-28s %12s %12s %12s\n' metric median min max
for j in "${jobs_list[@]}"; do
	rate=""
	for t in ${secs[$j]}; do rate+=" $(python3 -c "print($rows / $t / 1000)")"; done
	stats "krows/s:jobs=$j" $rate
	stats "peak_rss_MB:jobs=$j" ${rss[$j]}
done
