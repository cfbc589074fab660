# server/debian/package.sh — Debian packages of the patched server.
# Sourced by server/pg (it uses its say/die, paths, fetch and user handling).
#
#   server/pg package [--stock]   build the postgresql-18 binary packages
#   server/pg package-test        install them in a fresh Debian chroot, over
#                                 and back to stock (server/debian/package-test)
#
# The packages are Debian's own postgresql-18 source package, the one the
# build tree is imported from (.build/cache), with server/patches/ appended
# to debian/patches/series and a changelog entry whose version carries the
# epoch 1 (18.6-3 -> 1:18.6-3+pgwalN, N counting the commits that changed
# server/patches): it sorts above every stock version, so a routine apt
# upgrade never replaces the pgwal server by a newer stock one, which
# would ignore the crash marker and the read horizon and refuse the pgwal
# settings.  Going back is an explicit downgrade, which
# pgwal-stock-guard, an apt hook the package ships, refuses while a cluster
# depends on the pgwal server.  --stock builds the same source without the
# series, as the stock packages to install over and go back to: Debian has
# no postgresql-18 for its stable release, so they are built here too.
#
# postgresql-18's packaging needs postgresql-common >= 275 (its build rules,
# postgresql.mk, and its maintainer scripts); Debian stable has 248.  The
# newest postgresql-common source in the deb-src entry server/pg already
# uses is built first (it is architecture-independent Perl, a few seconds)
# and installed on the build machine; its packages are kept next to ours,
# because a machine that installs ours needs them too.
#
# Build profile: "nocheck nodoc".  nocheck skips the regression suites the
# package build runs (server/pg test runs them, and more, on the same
# source); nodoc skips the SGML -> HTML/man build and the postgresql-doc-18
# package.  Everything else stock builds is built: the libraries, the
# client, the server, the JIT (LLVM), the PLs and the server headers.
#
# Output, under .build/packages/:
#   pgwal/   the patched packages (*.deb, .buildinfo, .changes, build.log)
#   stock/   the same source without the series (--stock)
#   deps/    postgresql-common, postgresql-client-common, postgresql-common-dev

pkg_dir="$build/packages"
pkg_build_deps=(dpkg-dev debhelper dh-exec fakeroot ccache xz-utils)

# Version of an installed package, or empty.
installed_version() {
	{ dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null || true; } | awk '/install ok installed/ { print $4 }'
}

# Build postgresql-common from the newest source the deb-src entry offers
# and install it (root).  The source's .dsc is not always served, so the
# tarball (a native package: it is the whole source) is checked against the
# SHA-256 from the signed Sources index instead.
build_postgresql_common() {
	ensure_deb_src
	local src="$pkg_dir/common-src" out="$pkg_dir/deps"
	rm -rf "$src" && mkdir -p "$src" "$out"
	# apt-get picks the candidate version; it fails on the missing .dsc
	(cd "$src" && apt-get source --download-only -qq postgresql-common >/dev/null 2>&1) || true
	local tarball version sum
	tarball=$(cd "$src" && ls -1 postgresql-common_*.tar.xz 2>/dev/null | sort -V | tail -n1)
	[ -n "$tarball" ] || die "could not download the postgresql-common source"
	version=${tarball#postgresql-common_}
	version=${version%.tar.xz}
	# Checksums-Sha256 lines: "<64 hex> <size> <file>"
	sum=$(apt-cache showsrc postgresql-common | awk -v f="$tarball" '$3 == f && length($1) == 64 { print $1; exit }')
	[ -n "$sum" ] || die "the Sources index has no SHA-256 for $tarball"
	echo "$sum  $src/$tarball" | sha256sum -c --quiet - || die "$tarball does not match the Sources index"
	say "building postgresql-common $version (needed by postgresql-18's packaging)"
	tar -xf "$src/$tarball" -C "$src"
	local dir
	dir=$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -n1)
	(cd "$dir" && DEB_BUILD_OPTIONS=nocheck dpkg-buildpackage -b -uc -us -Pnocheck) \
		>"$src/build.log" 2>&1 || { tail -n 20 "$src/build.log" >&2; die "postgresql-common build failed"; }
	rm -f "$out"/*.deb
	local p
	for p in postgresql-common postgresql-client-common postgresql-common-dev; do
		cp "$src/${p}_${version}_all.deb" "$out/"
	done
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		"$out"/*.deb >/dev/null || die "could not install postgresql-common $version"
	say "installed postgresql-common $version; its packages are in ${out#$top/}"
}

# Unpack the cached postgresql-18 source package into $1 (Debian's patches
# applied by dpkg-source).
unpack_source() {
	local dst=$1 dsc
	dsc=$({ ls -1 "$cache"/postgresql-18_*.dsc 2>/dev/null || true; } | sort -V | tail -n1)
	[ -n "$dsc" ] || die "no postgresql-18 .dsc in .build/cache; run server/pg fetch"
	rm -rf "$dst"
	mkdir -p "$(dirname "$dst")"
	dpkg-source --no-check -q -x "$dsc" "$dst" >/dev/null
}

# Root: packaging tools, postgresql-common >= 275, the build dependencies.
package_prepare() {
	is_root || die "package preparation needs root"
	local missing=() p
	for p in "${pkg_build_deps[@]}"; do
		[ -n "$(installed_version "$p")" ] || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		say "installing packaging tools: ${missing[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	mkdir -p "$pkg_dir"
	local have
	have=$(installed_version postgresql-common-dev)
	# (also when it is installed but its packages are not in deps/, as in a
	# fresh clone: package-test installs them into its chroot)
	if [ -z "$have" ] || dpkg --compare-versions "$have" lt 275~ ||
		[ -z "$(ls "$pkg_dir"/deps/postgresql-common_*.deb 2>/dev/null)" ]; then
		build_postgresql_common
	fi
	# apt resolves the build dependencies (with the profiles) from the
	# unpacked source; the unpacking is repeated as the user for the build
	local probe="$pkg_dir/build-deps-probe"
	unpack_source "$probe"
	say "installing the build dependencies of postgresql-18 (profiles nocheck, nodoc)"
	DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq -P nocheck,nodoc "$probe" >/dev/null ||
		die "apt-get build-dep failed for postgresql-18"
	rm -rf "$probe"
	# the user builds the packages here
	chown -R "$("$top/tools/as-user" --ensure):" "$pkg_dir"
}

# The version of the patched packages: epoch 1, the Debian version, +pgwalN.
pgwal_package_version() {
	local n
	n=$(git -C "$top" -c safe.directory='*' rev-list --count HEAD -- server/patches 2>/dev/null || echo 1)
	echo "1:$(debian_version)+pgwal${n}"
}

# Add the series to an unpacked source tree: debian/patches/pgwal/, the
# series file and a changelog entry.
add_series() {
	local src=$1 version=$2
	mkdir -p "$src/debian/patches/pgwal"
	local f n=0 items=""
	for f in $(series_files); do
		cp "$patches/$f" "$src/debian/patches/pgwal/$f"
		echo "pgwal/$f" >>"$src/debian/patches/series"
		items+="    - $(sed -n 's/^Subject: \(\[PATCH[^]]*\] \)\{0,1\}//p' "$patches/$f" | head -n1)"$'\n'
		n=$((n + 1))
	done
	# the guard against an apt downgrade to stock, and its apt hook
	mkdir -p "$src/debian/pgwal"
	cp "$top/server/debian/pgwal-stock-guard" "$top/server/debian/50pgwal-stock-guard" "$src/debian/pgwal/"
	chmod 755 "$src/debian/pgwal/pgwal-stock-guard"
	{
		echo "debian/pgwal/pgwal-stock-guard => /usr/lib/postgresql/18/bin/pgwal-stock-guard"
		echo "debian/pgwal/50pgwal-stock-guard => /etc/apt/apt.conf.d/50pgwal-stock-guard"
	} >>"$src/debian/postgresql-18.install"
	local commit dist
	commit=$(git -C "$top" -c safe.directory='*' rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
	dist=$(. /etc/os-release && echo "${VERSION_CODENAME:-unstable}")
	{
		echo "postgresql-18 ($version) $dist; urgency=medium"
		echo
		echo "  * pgwal: the $n patches of pgwal's server/patches (pgwal commit $commit),"
		echo "    appended to debian/patches/series as debian/patches/pgwal/*:"
		printf '%s' "$items"
		echo "  * pgwal: /usr/lib/postgresql/18/bin/pgwal-stock-guard, run by apt"
		echo "    (/etc/apt/apt.conf.d/50pgwal-stock-guard) before it replaces this"
		echo "    server by a stock one, refuses while a cluster depends on it."
		echo
		echo " -- pgwal build <build@pgwal.invalid>  $(date -R)"
		echo
		cat "$src/debian/changelog"
	} >"$src/debian/changelog.new"
	mv "$src/debian/changelog.new" "$src/debian/changelog"
}

# User: build one package set (pgwal or stock) into .build/packages/<set>.
cmd_package() {
	local set=pgwal
	[ "${1:-}" = --stock ] && set=stock
	command -v dpkg-buildpackage >/dev/null || die "no dpkg-buildpackage; run server/pg package as root once"
	local have
	have=$(installed_version postgresql-common-dev)
	if [ -z "$have" ] || dpkg --compare-versions "$have" lt 275~; then
		die "postgresql-common-dev >= 275 is not installed; run server/pg package as root once"
	fi
	# Both sets build in the same directory, so ccache reuses the objects of
	# the files the series does not touch (the paths are in the flags); so
	# one build at a time (a second one would unpack over the first's tree).
	mkdir -p "$pkg_dir"
	exec 8>"$pkg_dir/.build-lock"
	flock -n 8 || die "another package build is running (lock: ${pkg_dir#$top/}/.build-lock)"
	local src="$pkg_dir/build/postgresql-18-$(tarball_version)" out="$pkg_dir/$set"
	unpack_source "$src"
	local version
	version=$(debian_version)
	if [ "$set" = pgwal ]; then
		version=$(pgwal_package_version)
		add_series "$src" "$version"
	fi
	mkdir -p "$out"
	rm -f "$out"/*.deb "$out"/*.buildinfo "$out"/*.changes
	rm -f "$pkg_dir"/build/*.deb "$pkg_dir"/build/*.ddeb "$pkg_dir"/build/*.buildinfo "$pkg_dir"/build/*.changes
	local log="$out/build.log" jobs=${PGWAL_JOBS:-$(nproc)} t0=$SECONDS
	say "building the $set packages $version (profiles nocheck nodoc, $jobs jobs; log: ${log#$top/})"
	(
		cd "$src"
		export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1
		export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
		export DEB_BUILD_OPTIONS="nocheck nodoc parallel=$jobs" DEB_BUILD_PROFILES="nocheck nodoc"
		# postgresql.mk builds in dh override targets, which dh runs without
		# the jobserver; a plain -jN in MAKEFLAGS survives that (dh strips
		# only the jobserver options and a bare -j)
		export MAKEFLAGS="-j$jobs"
		dpkg-buildpackage -b -uc -us
	) >"$log" 2>&1 || { grep -nE 'error|Error|FAILED|does not apply' "$log" | tail -n 20 >&2; die "package build failed (full log: $log)"; }
	mv "$pkg_dir"/build/*.deb "$pkg_dir"/build/*.buildinfo "$pkg_dir"/build/*.changes "$out/"
	rm -f "$pkg_dir"/build/*.ddeb
	rm -rf "$src"
	say "built the $set packages $version in $((SECONDS - t0))s:"
	(cd "$out" && ls -s --block-size=K -1 ./*.deb | sed 's|\./||' | sort -k2) | sed 's/^/  /' >&2
	local f
	for f in "$out"/postgresql-18_*.deb; do
		dpkg-deb -f "$f" Version | grep -qx "$version" || die "$f does not carry version $version"
	done
	if [ "$set" = pgwal ]; then
		# proof that the series is in: the patched GUC in the server binary
		# (grep -c reads to the end: grep -q would stop early and fail the pipe)
		local hits
		hits=$(dpkg-deb --fsys-tarfile "$out"/postgresql-18_*.deb | tar -xOf - ./usr/lib/postgresql/18/bin/postgres |
			grep -ac 'stream_unflushed_wal' || true)
		[ "${hits:-0}" -gt 0 ] || die "the built postgres binary lacks the series"
	fi
}
