# syntax=docker/dockerfile:1
# One Dockerfile, two architectures: `docker buildx build --platform linux/amd64,linux/arm64 .`
# The build stage runs on the builder's own platform (BUILDPLATFORM, no emulation) and
# cross-compiles for each TARGETARCH with cargo-zigbuild: zig is the C compiler and linker for
# any target, which ring's C and assembly and the static musl link need. The result is a static
# binary on distroless, non-root, without the default `dev` feature: the image carries no
# in-memory test API server (.ci/run checks it).
FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl && apt-get update \
    && apt-get install -y --no-install-recommends python3-pip && rm -rf /var/lib/apt/lists/* \
    && pip3 install --no-cache-dir --break-system-packages ziglang==0.15.2 cargo-zigbuild==0.24.1
WORKDIR /src
# BuildKit's TARGETARCH as the Rust target the cargo steps build for.
ARG TARGETARCH
RUN case "$TARGETARCH" in amd64) echo x86_64-unknown-linux-musl ;; arm64) echo aarch64-unknown-linux-musl ;; *) echo "no Rust target for TARGETARCH=$TARGETARCH: build for linux/amd64 or linux/arm64" >&2; exit 1 ;; esac > rust-target
# Dependency layer: the manifests, the lock file and every file a manifest names by path
# (cargo refuses a manifest whose [[bench]] files are missing), with empty library and binary
# targets, so source edits do not rebuild every crate. tests/it/manifests.rs replays this stage.
COPY Cargo.toml Cargo.lock ./
COPY webhook/Cargo.toml webhook/Cargo.toml
COPY sandbox/Cargo.toml sandbox/Cargo.toml
COPY benches benches
RUN mkdir -p src webhook/src sandbox/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs webhook/src/lib.rs sandbox/src/lib.rs \
    && cargo zigbuild --release --locked --no-default-features --target "$(cat rust-target)"
COPY . .
# The build context has no .git: `--build-arg MYAPP_GIT_COMMIT=$(git rev-parse HEAD)` names the
# commit that `--version` and myapp_build_info report (build.rs), else they say `unknown`.
ARG MYAPP_GIT_COMMIT
# The real sources are newer than the placeholders, so only workspace crates rebuild here.
RUN touch src/main.rs src/lib.rs webhook/src/lib.rs sandbox/src/lib.rs \
    && cargo zigbuild --release --locked --no-default-features --target "$(cat rust-target)" \
    && cp "target/$(cat rust-target)/release/myapp-operator" /myapp-operator

# Run: distroless static, non-root, no shell, only the binary.
FROM gcr.io/distroless/static-debian12:nonroot
ARG MYAPP_VERSION=0.1.0
ARG MYAPP_GIT_COMMIT
LABEL org.opencontainers.image.title="myapp-operator" \
      org.opencontainers.image.version="$MYAPP_VERSION" \
      org.opencontainers.image.revision="$MYAPP_GIT_COMMIT" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /myapp-operator /myapp-operator
USER 65532:65532
# Admission webhook (HTTPS), called by the API server through the webhook Service.
EXPOSE 8443
# Admin server (plain HTTP): /livez, /readyz, /metrics.
EXPOSE 8080
ENTRYPOINT ["/myapp-operator"]
CMD ["run"]
