# cri-imaged as a container image (for the DaemonSet in deploy/kubernetes).
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
RUN cargo build --release --locked --bin cri-imaged

FROM debian:bookworm-slim
COPY --from=build /src/target/release/cri-imaged /usr/local/bin/cri-imaged
ENTRYPOINT ["/usr/local/bin/cri-imaged"]
CMD ["serve"]
