# Every target works on a fresh Debian 12 machine with Rust; `deps` installs the rest.
.PHONY: all build deps deps-rehearsal test lint docs bench soak demo deb image clean

all: build

build:
	cargo build

deps:
	scripts/install-deps.sh

# install-deps as on a new machine (root): in a private mount and PID namespace with empty tmpfs over
# the extracted runtimes and containerd's default state and socket; fails if it does not finish
# within REHEARSAL_SECONDS (900) or leaves a process behind. CI runs it each time (about 20 s once
# the machine's packages are in: it fetches the three .debs again).
deps-rehearsal:
	scripts/rehearse-new-machine.sh

# Every test: unit, fake-runtime integration, the real binary, and real containerd end to end
# (those need root; outside CI they skip, saying so, when root or a tool is missing).
# The bench runs last with tiny sizes (a debug build), so that `make bench` keeps working; its
# figures mean nothing, so it prints one line with where its report is (in cargo's target dir).
# Then the runtime sets, on the containerds install-deps puts beside Debian's 1.6: every integration
# test again on 2.x but those that never start a containerd (NO_RUNTIME_TESTS: the package, abuse
# on a fake runtime, the docs, the layering, flags, config files, hostile files), and a smoke set
# on 1.7 (pull, presence by events, progress, GC, conformance, pinned images, image refs, newer
# kubelets' calls).
test: deps
	@status=0; \
	if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --no-fail-fast || status=1; \
		CONTAINERD_BIN=$(CONTAINERD_2) cargo nextest run --no-fail-fast -E 'kind(test) $(NO_RUNTIME_FILTER)' || status=1; \
		CONTAINERD_BIN=$(CONTAINERD_1_7) cargo nextest run --no-fail-fast $(SMOKE_TESTS) || status=1; \
	else \
		cargo test --no-fail-fast || status=1; \
		CONTAINERD_BIN=$(CONTAINERD_2) cargo test --no-fail-fast --tests || status=1; \
		CONTAINERD_BIN=$(CONTAINERD_1_7) cargo test --no-fail-fast $(SMOKE_TESTS) || status=1; \
	fi; \
	exit $$status
	cargo test --bench daemon_vs_runtime

# Integration tests that start no containerd (a fake runtime or none): run once, not per runtime.
NO_RUNTIME_TESTS := deb_package abuse docs_reference layering starter_policies flags hostile_files config_file cli_escapes root_lock
NO_RUNTIME_FILTER := $(foreach test,$(NO_RUNTIME_TESTS),- binary($(test)))

# containerd 1.7 (Debian trixie) and 2.x (sid), extracted by scripts/install-deps.sh.
CONTAINERD_1_7 := /opt/cri-imaged-test/containerd-trixie/usr/bin/containerd
CONTAINERD_2 := /opt/cri-imaged-test/containerd-sid/usr/bin/containerd
SMOKE_TESTS := --test e2e_containerd --test presence_cache --test pull_progress --test cri_conformance \
	--test gc_stack --test image_gc --test pinned_images --test image_ref --test cri_newer_calls

# cri-imaged against containerd directly, on a release build, a real containerd and a loopback
# registry (root). Prints the tables and writes bench/daemon_vs_runtime.md in cargo's target dir
# (target/ unless CARGO_TARGET_DIR says otherwise); BENCH_ARGS passes flags, e.g.
# BENCH_ARGS="--only presence". The crio section measures cri-imaged in front of a CRI-O that is
# already running (none is installable here), named with --crio-endpoint, e.g.
# BENCH_ARGS="--only crio --crio-endpoint unix:///run/crio/crio.sock"; without one it says it is
# skipped (see BENCHMARKS.md, CRI-O).
bench: deps
	cargo bench --bench daemon_vs_runtime -- $(BENCH_ARGS)

# Half an hour of mixed load on a release build, a real containerd and a loopback registry
# (root; not in CI): RSS and open files sampled every 10 s must stay flat after the warm-up.
# SOAK_SECS=N runs it for N seconds instead. The run of record is in BENCHMARKS.md.
soak: deps
	cargo test --release --test soak -- --nocapture

# The docs book (book.toml, docs/SUMMARY.md) built with mdBook into target/book/ (open index.html),
# then every relative link and #anchor in its HTML, and in README.md, checked (a broken one fails).
docs: deps
	mdbook build
	scripts/check-book-links.py target/book README.md

# The book and its links (make docs), formatting, clippy (clippy.toml), rustdoc, and cargo-deny's
# licenses, duplicate versions, sources and advisories (deny.toml; the RustSec database vendored
# in deny/advisory-db, offline).
# cargo-deny runs cargo metadata, which resolves every platform's crates of the lock file; a
# Linux build never downloads the others, so they are fetched first (a fresh cargo cache has none).
lint: deps docs
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps
	scripts/advisory-db.sh
	cargo fetch --locked
	cargo deny --offline check

# A pull and then an "already present" answer, on a real local containerd and registry (root), then
# the command line. It runs the binary cargo reports building, so CARGO_TARGET_DIR is honoured.
# KEEP=1 leaves it all running and prints the `export` to try the command line by hand.
demo:
	KEEP=$(KEEP) scripts/demo.sh

# The Debian package from a release build: cri-imaged_VERSION_ARCH.deb under debian/ in cargo's
# target dir (target/debian/ unless CARGO_TARGET_DIR says otherwise). Needs dpkg-dev (`make deps`).
deb:
	scripts/build-deb.sh

# The container image (Dockerfile, FROM scratch) from a release build, with buildah, offline (root).
image:
	scripts/build-image.sh

# Coverage-guided fuzzing (cargo-fuzz, libFuzzer, AddressSanitizer; see FUZZING.md): every target
# to FUZZ_RUNS executions (10,000,000 unless set), one after another; fuzz-smoke runs each for
# FUZZ_SMOKE_SECONDS (15) instead, as CI does. Both build under fuzz/target, apart from the main
# build, and fail on any crash, panic, timeout or leak (the input is kept in fuzz/artifacts/).
.PHONY: fuzz fuzz-smoke
fuzz: deps
	scripts/fuzz.sh

fuzz-smoke: deps
	scripts/fuzz.sh --smoke

clean:
	cargo clean
