# Sourced by the benchmark scripts: a throwaway PostgreSQL cluster on
# loopback, run as the unprivileged user of tools/as-user.
#
#   bench_cluster_start PARENT_DIR BIN_DIR [postgresql.conf lines...]
#
# creates a directory under PARENT_DIR, runs initdb, appends the lines to
# postgresql.conf (after listen_addresses, port and the socket directory)
# and starts the server. It sets `dir` (the cluster's directory, which holds
# `data/` and the server `log`), `port`, `conn` (a conninfo for user
# postgres) and defines `psql`. bench_cluster_stop stops the server and
# removes `dir`; the caller calls it from its EXIT trap.

bench_cluster_start() {
	local parent=$1 as_user
	bench_bin=$2
	shift 2
	as_user="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/tools/as-user"
	dir=$(mktemp -d "$parent/pgwal-bench-XXXXXX")
	chmod 755 "$dir"
	[ "$(id -u)" = 0 ] && chown "$("$as_user" --ensure)" "$dir"
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	"$as_user" "$bench_bin/initdb" -U postgres --auth=trust --no-sync -D "$dir/data" >/dev/null
	{
		echo "listen_addresses = '127.0.0.1'"
		echo "port = $port"
		echo "unix_socket_directories = '$dir'"
		printf '%s\n' "$@"
	} >>"$dir/data/postgresql.conf"
	"$as_user" "$bench_bin/pg_ctl" -w -D "$dir/data" -l "$dir/log" start >/dev/null
	conn="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable"
}

# bench_cluster_restart BIN_DIR: a clean stop, then the same data directory
# started by BIN_DIR's server (e2e.sh's comparison with the unpatched build).
bench_cluster_restart() {
	local as_user
	as_user="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/tools/as-user"
	"$as_user" "$bench_bin/pg_ctl" -w -m fast -D "$dir/data" stop >/dev/null
	bench_bin=$1
	"$as_user" "$bench_bin/pg_ctl" -w -D "$dir/data" -l "$dir/log" start >/dev/null
}

bench_cluster_stop() {
	[ -n "${dir:-}" ] || return 0
	"$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/tools/as-user" \
		"$bench_bin/pg_ctl" -m immediate -D "$dir/data" stop >/dev/null 2>&1 || true
	rm -rf "$dir"
}

psql() { "$bench_bin/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"; }
