# Every target works on a fresh Debian 12 machine with Rust; `deps` installs the rest.
.PHONY: all build deps test lint demo clean

all: build

build:
	cargo build

deps:
	scripts/install-deps.sh

# Every test: unit, fake-runtime integration, the real binary, and real containerd end to end
# (those need root; outside CI they skip, saying so, when root or a tool is missing).
test: deps
	@if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --no-fail-fast; \
	else \
		cargo test --no-fail-fast; \
	fi

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

# A pull and then an "already present" answer, on a real local containerd and registry.
demo:
	scripts/demo.sh

clean:
	cargo clean
