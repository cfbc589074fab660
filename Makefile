# Thin entry points; the real work is in server/pg, tools/, crates/ and lab/.

.PHONY: demo test test-fast server-apply server-export server-build server-build-bench server-build-stock server-test server-package package-test clean-build help

help:
	@echo "make demo               the durability-modes demo on a throwaway cluster"
	@echo "make test               every test suite (server, crates, lab)"
	@echo "make test-fast          the project's own tests only (the series' TAP tests, not upstream's suites)"
	@echo "make server-apply       import PostgreSQL 18 and apply server/patches into .build/pg"
	@echo "make server-export      regenerate server/patches from .build/pg"
	@echo "make server-build       build and install the assert-enabled (check) flavour"
	@echo "make server-build-bench build and install the optimised (bench) flavour"
	@echo "make server-build-stock build the same source without the series, like bench (the lab's baseline)"
	@echo "make server-test        only the server suites"
	@echo "make server-package     Debian packages of the patched server (.build/packages/pgwal)"
	@echo "make package-test       install them over stock packages in a fresh chroot and back (root)"

# DEMO_ARGS=--allow-stock runs the demo on stock PostgreSQL (refused otherwise)
demo:
	lab/demo.sh $(DEMO_ARGS)

test:
	tools/test-all

test-fast:
	tools/test-all --fast

server-apply:
	server/pg apply

server-export:
	server/pg export

server-build:
	server/pg build --flavour check

server-build-bench:
	server/pg build --flavour bench

server-build-stock:
	server/pg build --flavour stock-bench

server-test:
	server/pg test

server-package:
	server/pg package

package-test:
	server/pg package-test

clean-build:
	rm -rf .build
