#!/usr/bin/env bash
# `make demo`: a short (~4 minute) sync-modes + hot-counter run of the lab on
# the patched server, printing the tables and writing the plots under
# lab/results/demo-<time>/.  Uses the optimised (bench) build and builds it
# first when missing (server/pg build --flavour bench); if that fails, the
# check build when present.  It does not fall back to stock PostgreSQL: that
# needs --allow-stock (PGWAL_LAB_PG_BIN picks any bin dir).  Before measuring,
# the lab proves that the build, the fsync shim and the delay proxy are in
# effect (pgwal_lab/proof.py) and stops if one is not.
# Short runs on a shared machine: the numbers are indicative, not results.
#
# usage: lab/demo.sh [--allow-stock]
set -euo pipefail
# shellcheck source=lab/setup.sh
source "$(cd "$(dirname "$0")" && pwd)/setup.sh"

allow_stock=0
for a in "$@"; do
	case "$a" in
	--allow-stock) allow_stock=1 ;;
	*) log "unknown option $a (usage: lab/demo.sh [--allow-stock])"; exit 2 ;;
	esac
done

bin=${PGWAL_LAB_PG_BIN:-}
if [ -z "$bin" ]; then
	if [ ! -x "$repo/.build/install/bench/bin/postgres" ] && [ -x "$repo/server/pg" ]; then
		log "building the patched server (bench flavour) first"
		"$repo/server/pg" build --flavour bench || log "bench build failed"
	fi
	for cand in "$repo/.build/install/bench/bin" "$repo/.build/install/check/bin"; do
		if [ -x "$cand/postgres" ]; then bin=$cand; break; fi
	done
fi
if [ -z "$bin" ]; then
	if [ $allow_stock -eq 0 ]; then
		log "error: no patched build (server/pg build --flavour bench failed or is missing);"
		log "the demo does not run on stock PostgreSQL unless asked: lab/demo.sh --allow-stock"
		exit 1
	fi
	bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
	log "running on stock PostgreSQL ($bin), as asked (--allow-stock)"
fi
case "$bin" in */check/bin) log "note: the check build has assertions on; numbers are slower than bench" ;; esac
trap 'PYTHONPATH="$here" "$venv/bin/python" -m pgwal_lab clean >/dev/null 2>&1 || true' EXIT
args=(demo --bin "$bin")
[ $allow_stock -eq 1 ] && args+=(--allow-stock)
PYTHONPATH="$here" "$venv/bin/python" -m pgwal_lab "${args[@]}"
