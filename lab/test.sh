#!/usr/bin/env bash
# Lab test entry point (called from the repo root by `make test`; CI runs it
# as root on a possibly fresh machine).  Installs what is missing, builds the
# delay proxy and the fsync shim, runs the lab's pytest suite, and always
# removes lab leftovers (servers, proxies, namespaces, loop devices, mounts).
#
# Environment: PGWAL_LAB_PG_BIN  PostgreSQL bin dir under test (default: the
#              patched 18 check build if present, else Debian's 15)
#              PYTEST_ARGS       extra pytest arguments
#              PYTEST_MARKERS    a marker expression (-m), e.g. "not timing"
set -euo pipefail

# shellcheck source=lab/setup.sh
source "$(cd "$(dirname "$0")" && pwd)/setup.sh"

# --- tests --------------------------------------------------------------------
cleanup() { PYTHONPATH="$here" "$venv/bin/python" -m pgwal_lab clean >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup
set +e
markers=()
[ -z "${PYTEST_MARKERS:-}" ] || markers=(-m "$PYTEST_MARKERS")
# shellcheck disable=SC2086 # PYTEST_ARGS is a list of words
(cd "$here" && timeout 2700 "$venv/bin/python" -m pytest -v --durations=20 "${markers[@]}" ${PYTEST_ARGS:-} tests)
rc=$?
set -e
if [ $rc -eq 5 ]; then
	log "pytest collected no tests: treating as failure"
	exit 1
fi
exit $rc
