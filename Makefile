# The two commands that work on a fresh machine: `make run` and `make test`.
# Both install what is missing first (scripts/install-deps.sh, Debian packages).

SHELL := /bin/bash
CARGO ?= cargo
PORTICO := target/release/portico

.PHONY: all deps build provider run run-loopback test lint bench bench-fwd hugepages clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release
	@mkdir -p target/release/fabric
	@cp target/release/libportico_fi.so target/release/fabric/libportico-fi.so

# The libfabric provider, where libfabric looks for it:
#   FI_PROVIDER_PATH=target/release/fabric FI_PORTICO_DEV=... FI_PORTICO_IP=... fi_info -p portico
provider: deps
	$(CARGO) build --release -p portico-fabric
	@mkdir -p target/release/fabric
	@cp target/release/libportico_fi.so target/release/fabric/libportico-fi.so
	@echo "provider: FI_PROVIDER_PATH=$(CURDIR)/target/release/fabric (docs/libfabric.md)"

hugepages:
	@scripts/hugepages.sh

# The default workload: two RoCEv2 engines joined by net_ring in one process, mixed
# SEND/WRITE/READ, live stats each second and a latency summary at the end.
run: build hugepages
	$(PORTICO) bench mixed --size 4096 --qd 32 --duration 5

# The verified UDP generator/checker over net_ring (configs/loopback.toml).
run-loopback: build hugepages
	$(PORTICO) run --config configs/loopback.toml

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

# Every test: formatting, lints and the API docs' links (cargo doc); source shapes the toolchain
# miscompiles (scripts/check-shapes.sh); the toolchain (scripts/toolchain-check.sh); unit tests
# and integration tests on real EAL with vdevs (debug profile); the release profile, which
# users run: every crate's unit tests but the benchmark harness's (every bench operation with
# --verify runs what of it they reach), the memif soak,
# the libfabric programs, the MPI job and the 100 000 operations under injected faults (10 000
# in the debug run) from the release binary (docs/toolchain.md); the node and transport tests
# under valgrind's memcheck (scripts/valgrind.sh); then each fuzz target for FUZZ_SECONDS (30 s)
# from its seed corpus (scripts/fuzz.sh, docs/fuzzing.md). Ends with the fuzz summary and one
# line that adds up every test binary's result.
FUZZ_SECONDS ?= 30
RELEASE_TESTS := --test bench_verify_every_op --test memif_soak --test programs --test mpi --test rdma_faults
# scripts/valgrind.sh runs memcheck on the test binaries this line builds, so it is given the
# same arguments (anything else builds the workspace a second time).
# portico-bench's unit tests (report arithmetic and plots; criterion is their dev-dependency)
# run in the debug step only: building them in release was 42 s of this step's 470 s.
RELEASE_TEST_ARGS := --workspace --exclude portico-bench --lib $(RELEASE_TESTS)
test: lint
	@scripts/check-layers.sh
	@scripts/check-shapes.sh
	@mkdir -p target
	@scripts/toolchain-check.sh | tee target/toolchain.log
	set -o pipefail; $(CARGO) test --workspace 2>&1 | tee target/test.log
	set -o pipefail; $(CARGO) test --release $(RELEASE_TEST_ARGS) 2>&1 | tee target/test-release.log
	set -o pipefail; CARGO="$(CARGO)" RELEASE_TEST_ARGS="$(RELEASE_TEST_ARGS)" scripts/valgrind.sh 2>&1 | tee target/valgrind-summary.log
	set -o pipefail; CARGO="$(CARGO)" scripts/fuzz.sh $(FUZZ_SECONDS) 2>&1 | tee target/fuzz.log
	@grep -E '^fuzz: [a-z_]+: [0-9]+s,|^fuzz: [0-9]+ targets' target/fuzz.log
	@grep -E '^valgrind: ' target/valgrind-summary.log
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "release: %d passed, %d failed\n", p, f}' target/test-release.log
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "tests: %d passed, %d failed\n", p, f}' target/test.log target/test-release.log

# portico fwd vs dpdk-testpmd io forwarding on the same net_null ports (prints the ratio).
bench-fwd: build
	bench/fwd_vs_testpmd.sh

bench: bench-fwd

clean:
	$(CARGO) clean
