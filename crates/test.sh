#!/usr/bin/env bash
# Tests of the pgwal crates: rustfmt and clippy, then unit, doc and integration tests.
# Integration tests start their own PostgreSQL clusters: stock 15 from
# $PGWAL_PG15_BIN (default /usr/lib/postgresql/15/bin), stock 17 from
# $PGWAL_PG17_BIN (default <repo>/.build/install/pg17/bin, installed by
# tools/postgres-major when the 18 build is there) and 18 from
# $PGWAL_PG18_BIN (default <repo>/.build/install/check/bin); 17 and 18 are
# skipped with a notice when absent. Run from anywhere; installs PostgreSQL
# 15 and openssl with apt if missing.
#
#   crates/test.sh          everything below, in order
#   crates/test.sh build    only what needs no server: rustfmt, clippy, rustdoc
#                           with missing_docs denied, the
#                           test build (cargo test --no-run), cargo install
#                           and the Windows build check (tools/test-all runs
#                           it beside the server suites; the MinGW compiler it
#                           may install waits for dpkg's lock)
#   crates/test.sh run      the rest: packages and older servers, the tests
#                           (built first if the build step did not run)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
mode=${1:-all}
case "$mode" in
all | build | run) ;;
*) echo "usage: crates/test.sh [build|run]" >&2; exit 2 ;;
esac
want() { [ "$mode" = all ] || [ "$mode" = "$1" ]; }

pg15=${PGWAL_PG15_BIN:-/usr/lib/postgresql/15/bin}
# another part may hold dpkg's lock meanwhile: wait for it
apt_wait=(-o DPkg::Lock::Timeout=600)
need=()
[ -x "$pg15/postgres" ] || need+=(postgresql-15 postgresql-client-15)
command -v openssl >/dev/null || need+=(openssl)   # the TLS test generates a CA
# the silent-peer test (as root) puts pgwal in a network namespace
[ "$(id -u)" != 0 ] || command -v ip >/dev/null || need+=(iproute2)
if want run && [ ${#need[@]} -gt 0 ]; then
	echo "test.sh: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get "${apt_wait[@]}" update -q
	apt-get "${apt_wait[@]}" install -y -q "${need[@]}"
fi
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
	PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
	echo "test.sh: cargo is required" >&2
	exit 1
fi

# each phase's wall time, for keeping CI within its budget
t_phase=0
phase_done() {
	echo "test.sh: $1 took $((SECONDS - t_phase)) s"
	t_phase=$SECONDS
}
packages=(-p pgwal-protocol -p pgwal -p pgwal-cli -p pgwal-kafka)

if want build; then
	if cargo fmt --version >/dev/null 2>&1; then
		cargo fmt --all -- --check
	fi
	if cargo clippy --version >/dev/null 2>&1; then
		cargo clippy "${packages[@]}" --all-targets -q -- -D warnings
	fi
	phase_done "rustfmt and clippy"
	# The library docs: every public item documented, no broken links.
	RUSTDOCFLAGS="-D warnings -D missing_docs" cargo doc -q --no-deps -p pgwal-protocol -p pgwal -p pgwal-kafka
	phase_done "cargo doc (missing_docs denied)"
	cargo test "${packages[@]}" --no-run 2>&1
	phase_done "the test build"

	# The installed command (crates/README.md: cargo install --path crates/pgwal-cli).
	# --debug with the workspace's target directory reuses what the tests built;
	# a user's install builds the release profile the same way.
	install_root=$(mktemp -d)
	trap 'rm -rf "$install_root"' EXIT
	CARGO_TARGET_DIR="$here/target" cargo install -q --locked --debug --path pgwal-cli --root "$install_root"
	"$install_root/bin/pgwal" --version
	help=$("$install_root/bin/pgwal" --help)
	case "$help" in
	*stream*) ;;
	*) echo "test.sh: the installed pgwal lacks its stream command" >&2; exit 1 ;;
	esac
	echo "test.sh: cargo install --path pgwal-cli works ($("$install_root/bin/pgwal" --version))"
	phase_done "cargo install"

	# The library builds on a non-Unix target (Unix-domain sockets and the
	# receive low-water mark are Unix-only): cargo check for Windows, with the
	# MinGW C compiler that ring's build script needs.
	if rustup target list --installed 2>/dev/null | grep -qx x86_64-pc-windows-gnu ||
		rustup target add x86_64-pc-windows-gnu >/dev/null 2>&1; then
		if ! command -v x86_64-w64-mingw32-gcc >/dev/null; then
			echo "test.sh: installing gcc-mingw-w64-x86-64 for the Windows check"
			DEBIAN_FRONTEND=noninteractive apt-get "${apt_wait[@]}" install -y -q gcc-mingw-w64-x86-64 >/dev/null || true
		fi
		if command -v x86_64-w64-mingw32-gcc >/dev/null; then
			cargo check -q -p pgwal-protocol -p pgwal --target x86_64-pc-windows-gnu
			echo "test.sh: the library builds for x86_64-pc-windows-gnu"
		else
			echo "test.sh: NOTICE: no MinGW compiler; the non-Unix build check is skipped"
		fi
	else
		echo "test.sh: NOTICE: no x86_64-pc-windows-gnu target; the non-Unix build check is skipped"
	fi

	phase_done "the Windows build check"
fi
want run || exit 0

pg18=${PGWAL_PG18_BIN:-$(cd .. && pwd)/.build/install/check/bin}
if [ ! -x "$pg18/postgres" ]; then
	echo "test.sh: NOTICE: no PostgreSQL 18 in $pg18; its integration tests are skipped"
fi

pg17=${PGWAL_PG17_BIN:-$(cd .. && pwd)/.build/install/pg17/bin}
if [ ! -x "$pg17/postgres" ] && [ -z "${PGWAL_PG17_BIN:-}" ] && [ -x "$pg18/psql" ]; then
	../tools/postgres-major 17.6.0 "$pg18" >/dev/null
fi
# 14 only for the test of the older slot grammar (pgwal/tests/older_servers.rs)
if [ ! -x ../.build/install/pg14/bin/postgres ] && [ -x "$pg18/psql" ]; then
	../tools/postgres-major 14.19.0 "$pg18" >/dev/null
fi
if [ ! -x "$pg17/postgres" ]; then
	echo "test.sh: NOTICE: no PostgreSQL 17 in $pg17; its integration tests are skipped"
fi

phase_done "setup (packages, older servers)"
# cargo runs test binaries one after another.  The Kafka sink's tests (the
# longest binary: a broker's JVM, paced loads and faults, mostly waiting)
# run beside all the others instead, from their built binary, in the
# package's directory as cargo would.
kafka_exe=$(cargo test "${packages[@]}" --no-run 2>&1 |
	sed -n 's/.*Executable tests\/kafka.rs (\(.*\))$/\1/p')
[ -n "$kafka_exe" ] || { echo "test.sh: the Kafka test binary was not built" >&2; exit 1; }
kafka_log=$(mktemp)
# one at a time (they take turns with one broker anyway), each with its time
# and its phases (--nocapture: where CI's time goes, also when they pass)
run_kafka_tests() {
	local t rc=0 t0 tests
	tests=$("$here/$kafka_exe" --list 2>/dev/null | sed -n 's/: test$//p')
	[ -n "$tests" ] || { echo "test.sh: the Kafka test binary lists no tests"; return 1; }
	for t in $tests; do
		t0=$SECONDS
		"$here/$kafka_exe" --exact "$t" --nocapture || rc=1
		echo "test.sh: $t took $((SECONDS - t0)) s"
	done
	return $rc
}
(cd pgwal-cli && run_kafka_tests) >"$kafka_log" 2>&1 &
kafka_pid=$!
rc=0
# (one cargo test over all the packages, as built: a subset would unify
# features differently and rebuild; the Kafka tests, all named
# kafka_sink_*, are skipped here)
cargo test "${packages[@]}" -- --skip kafka_sink_ 2>&1 || rc=$?
kafka_rc=0
wait "$kafka_pid" || kafka_rc=$?
echo "test.sh: the Kafka tests (pgwal-cli/tests/kafka.rs, beside the others):"
cat "$kafka_log"
rm -f "$kafka_log"
[ $kafka_rc -eq 0 ] || { echo "test.sh: the Kafka tests failed"; rc=1; }
[ $rc -eq 0 ] || exit $rc
phase_done "cargo test"


