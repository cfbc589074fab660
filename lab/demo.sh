#!/usr/bin/env bash
# `make demo`: a short (~4 minute) sync-modes + hot-counter run of the lab on
# the patched server, printing the tables and writing the plots under
# lab/results/demo-<time>/.  Uses the optimised (bench) build; builds it
# first when missing (server/pg build --flavour bench), else falls back to
# the check build, else to stock PostgreSQL with a warning.
# Short runs on a shared machine: the numbers are indicative, not results.
set -euo pipefail
# shellcheck source=lab/setup.sh
source "$(cd "$(dirname "$0")" && pwd)/setup.sh"

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
	bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
	log "WARNING: no patched build found; running on stock PostgreSQL ($bin)"
fi
case "$bin" in */check/bin) log "note: the check build has assertions on; numbers are slower than bench" ;; esac
trap 'PYTHONPATH="$here" "$venv/bin/python" -m pgwal_lab clean >/dev/null 2>&1 || true' EXIT
PYTHONPATH="$here" "$venv/bin/python" -m pgwal_lab demo --bin "$bin"
