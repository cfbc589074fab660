# Sourced by run-existing.sh and tcp-vs-unix.sh: a lab-made primary + sync
# standby (patched bench build, lan link, nvme disks) in network namespaces,
# held until the sourcing script exits.  Sets bin, ns (the primary's
# namespace), pport, sport (TCP ports of primary and standby) and sock (the
# primary's Unix socket directory).
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
bin=$PWD/.build/install/bench/bin
up_log=$(mktemp)
lab/pgwal-lab up --bin "$bin" --standbys 1 --sync 1 --net lan --primary-disk nvme --standby-disk nvme \
	--hold 3600 >"$up_log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null || true; rm -f "$up_log"' EXIT
for _ in $(seq 120); do grep -q holding "$up_log" && break; sleep 1; done
cat "$up_log"
ns=$(sed -nE 's/^primary: .*netns ([^,]+),.*/\1/p' "$up_log")
pport=$(sed -nE "s/^primary: psql '.* port=([0-9]+) .*/\1/p" "$up_log")
sport=$(sed -nE "s/^s1: psql '.* port=([0-9]+) .*/\1/p" "$up_log")
sock=$(sed -nE "s/^primary: psql 'host=([^ ]+) .*/\1/p" "$up_log")
[ -n "$ns" ] && [ -n "$pport" ] && [ -n "$sport" ] || { echo "the pair did not come up" >&2; exit 1; }
