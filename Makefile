# Every target works on a fresh Debian 12 machine with Rust; `deps` installs the rest.
.PHONY: all build deps test lint bench demo clean

all: build

build:
	cargo build

deps:
	scripts/install-deps.sh

# Every test: unit, fake-runtime integration, the real binary, and real containerd end to end
# (those need root; outside CI they skip, saying so, when root or a tool is missing).
# The bench runs last with tiny sizes (a debug build), so that `make bench` keeps working.
test: deps
	@if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --no-fail-fast; \
	else \
		cargo test --no-fail-fast; \
	fi
	cargo test --bench daemon_vs_runtime

# cri-imaged against containerd directly, on a release build, a real containerd and a loopback
# registry (root). Prints the tables and writes target/bench/daemon_vs_runtime.md; BENCH_ARGS
# passes flags, e.g. BENCH_ARGS="--only presence".
bench: deps
	cargo bench --bench daemon_vs_runtime -- $(BENCH_ARGS)

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

# A pull and then an "already present" answer, on a real local containerd and registry.
demo:
	scripts/demo.sh

clean:
	cargo clean
