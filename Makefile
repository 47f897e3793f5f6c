# The two commands a new user runs (see README): `make run` and `make test`.
SHELL := /bin/bash
GO ?= go
# How long each fuzz target runs inside `make test` (longer when you change a parser:
# `make fuzz FUZZTIME=2m`).
FUZZTIME ?= 3s
# Packages holding Fuzz targets.
FUZZ_PKGS ?= $(shell grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u)

.PHONY: all build run test lint unit fuzz chaos-short chaos soak bench e2e docs-check rules image release go-install-check clean

all: build

# Where `make build` puts the binary, stamped with the version (scripts/ldflags.sh: git
# describe, commit, commit date) so `pgsse version` names its commit even with -buildvcs=false.
BIN ?= bin/pgsse

build:
	@$(GO) build -ldflags "$$(scripts/ldflags.sh)" -o $(BIN) ./cmd/pgsse

# Runs pgsse for real on this machine: a throwaway PostgreSQL unless DATABASE_URL is set.
run: build
	@scripts/run.sh

# The whole suite: formatting, vet, every test with -race against a throwaway PostgreSQL
# (or the one PGSSE_TEST_DATABASE_URL names), each fuzz target briefly, then two short fault
# runs with the exactly-once checker (chaos-short).
test: lint unit fuzz chaos-short

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

unit:
	scripts/pg.sh with $(GO) test -race -count=1 -timeout 20m ./...

fuzz:
	@set -e; for pkg in $(FUZZ_PKGS); do \
	  for fn in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
	    log=$$(mktemp); \
	    if ! $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg >$$log 2>&1; then \
	      if grep -q 'context deadline exceeded' $$log && ! grep -q 'Failing input' $$log; then \
	        echo "  (the fuzzer's shutdown timed out on a busy machine, not a finding: running $$fn again)"; \
	        $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg >$$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; \
	      else cat $$log; rm -f $$log; exit 1; fi; \
	    fi; rm -f $$log; \
	  done; \
	done; echo "fuzz: all targets passed"

# Fault runs (bench/chaos; docs/operations.md, Fault runs and the soak): `pgsse serve --procs 2`
# on a PostgreSQL of the run's own, a workload of every kind of client, faults at moments drawn
# from the seed, then the exactly-once checker. Each run prints the fault counts per kind and,
# on failure, the seed and a one-line reproduction. chaos-short (part of make test) runs
# CHAOS_SHORT with seed 1 and with a random seed (printed); chaos runs CHAOS_DURATION once per
# seed of CHAOS_SEEDS; soak runs SOAK_DURATION of steady load with churn and fails on growth.
CHAOS_SHORT ?= 60s
CHAOS_DURATION ?= 30m
CHAOS_SEEDS ?= 1 2 3
SOAK_DURATION ?= 30m
CHAOS_ARGS ?=

chaos-short:
	$(GO) run ./bench/cmd/chaos --duration $(CHAOS_SHORT) --seed 1 $(CHAOS_ARGS)
	$(GO) run ./bench/cmd/chaos --duration $(CHAOS_SHORT) --seed 0 $(CHAOS_ARGS)

chaos:
	@set -e; for seed in $(CHAOS_SEEDS); do \
	  $(GO) run ./bench/cmd/chaos --duration $(CHAOS_DURATION) --seed $$seed $(CHAOS_ARGS); \
	done

soak:
	$(GO) run ./bench/cmd/chaos --soak --duration $(SOAK_DURATION) $(CHAOS_ARGS)

# Only the real-client suite (Chromium, npm eventsource, curl, nginx); part of `make test`.
e2e:
	scripts/pg.sh with $(GO) test -race -count=1 -v -timeout 10m ./e2e/

# Runs every shell command in README.md and docs/ against `make run` in a fresh copy of the
# repository, the browser example in Chromium, and checks that no link leaves the repository
# (e2e/docs_test.go, which says how blocks are marked). Part of `make test`.
docs-check:
	scripts/pg.sh with $(GO) test -count=1 -v -timeout 15m -run '^TestDocs_|^TestCurl_README' ./e2e/

# The Prometheus rules of deploy/prometheus/: promtool's syntax check and their unit tests
# (Debian's prometheus package has promtool; scripts/e2e-deps.sh installs it). `make test` runs
# both too (e2e/prometheus_test.go), and evaluates the rules and the Grafana dashboard of
# deploy/grafana/ against a real Prometheus scraping pgsse.
rules:
	@command -v promtool >/dev/null 2>&1 || scripts/e2e-deps.sh
	promtool check rules deploy/prometheus/pgsse.rules.yml
	cd deploy/prometheus && promtool test rules pgsse.rules.test.yml

bench:
	scripts/pg.sh with $(GO) test -run '^$$' -bench . -benchmem ./framing/... ./sse/... ./ring/... ./pglisten/... ./engine/... ./bench/...

# The container image localhost/pgsse:latest (Dockerfile: FROM scratch, a static binary, user
# 65532), with podman or buildah (installed with apt-get if missing).
image:
	scripts/image.sh

# Static binaries for the platforms below in dist/, with SHA256SUMS; then checks that
# `go install github.com/pgsse/pgsse/cmd/pgsse@latest` works from the committed tree.
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/arm64 darwin/amd64
release:
	scripts/release.sh $(RELEASE_PLATFORMS)
	scripts/go-install-check.sh

go-install-check:
	scripts/go-install-check.sh

clean:
	rm -rf bin dist
