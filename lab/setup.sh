# Shared setup for lab/test.sh and lab/demo.sh (source it, don't run it):
# installs missing system packages, creates lab/.venv with the pinned
# requirements, builds the pgwal-netdelay proxy and the fsync shim.
# Sets: here (lab dir), repo, venv, and PGWAL_NETDELAY when the proxy had to
# be built outside the workspace.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"

log() { printf 'lab: %s\n' "$*" >&2; }

# --- system packages ------------------------------------------------------
apt_updated=0
apt_install() {
	if [ "$(id -u)" -ne 0 ]; then
		log "missing $*; not root, cannot install"
		return 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; then
		if [ "$apt_updated" -eq 0 ]; then
			apt-get update -q >/dev/null
			apt_updated=1
		fi
		apt-get install -y -q --no-install-recommends "$@" >/dev/null
	fi
}

need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v losetup >/dev/null || need+=(mount)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v runuser >/dev/null || need+=(util-linux)
# Debian's stock 15: the default server without a check build, and the
# stock server the compatibility tests run the scenarios against
if [ ! -x /usr/lib/postgresql/15/bin/postgres ] &&
	{ [ "$(id -u)" -eq 0 ] ||
		{ [ -z "${PGWAL_LAB_PG_BIN:-}" ] && [ ! -x "$repo/.build/install/check/bin/postgres" ]; }; }; then
	need+=(postgresql-15)
fi
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt_install "${need[@]}"
fi
# --- Python environment -----------------------------------------------------
py=""
for cand in python3.11 python3; do
	if command -v "$cand" >/dev/null; then py=$cand; break; fi
done
[ -n "$py" ] || { log "no python3"; exit 1; }
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
	log "creating $venv"
	"$py" -m venv "$venv" 2>/dev/null || { apt_install python3-venv && "$py" -m venv "$venv"; }
fi
stamp="$venv/.requirements.sha"
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
	log "installing pinned requirements"
	"$venv/bin/python" -m pip install -q -r "$here/requirements.txt"
	echo "$want" >"$stamp"
fi

# --- delay proxy and shim -----------------------------------------------------
build_netdelay() {
	if ! command -v cargo >/dev/null; then
		[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
	fi
	command -v cargo >/dev/null || { log "installing cargo"; apt_install cargo; }
	log "building pgwal-netdelay"
	if ! (cd crates && cargo build --release -q -p pgwal-netdelay); then
		# the workspace may be broken by a sibling member; the crate has no
		# dependencies, so build a standalone copy instead
		log "workspace build failed; building a standalone copy"
		rm -rf "$here/.build/netdelay"
		mkdir -p "$here/.build/netdelay"
		cp -r crates/pgwal-netdelay/. "$here/.build/netdelay/"
		printf '\n[workspace]\n' >>"$here/.build/netdelay/Cargo.toml"
		(cd "$here/.build/netdelay" && cargo build --release -q)
		export PGWAL_NETDELAY="$here/.build/netdelay/target/release/pgwal-netdelay"
	fi
}
if [ -n "${PGWAL_NETDELAY:-}" ] && [ -x "$PGWAL_NETDELAY" ]; then
	# built or installed elsewhere: e.g. a user without a Rust toolchain
	log "using pgwal-netdelay $PGWAL_NETDELAY"
else
	build_netdelay
fi
# the consumer audit (audit-consumer) runs the pgwal CLI: the crates' test
# build serves, else build it here
if [ -z "${PGWAL_BIN:-}" ] && [ ! -x crates/target/release/pgwal ] && [ ! -x crates/target/debug/pgwal ] &&
	! command -v pgwal >/dev/null; then
	log "building the pgwal CLI"
	(cd crates && cargo build --release -q -p pgwal-cli) ||
		log "WARNING: pgwal CLI not built: pgwal-lab run audit-consumer needs it (or PGWAL_BIN)"
fi
log "building the fsync shim"
PYTHONPATH="$here" "$venv/bin/python" -m pgwal_lab build-shim >/dev/null

