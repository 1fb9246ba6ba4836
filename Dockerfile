# syntax=docker/dockerfile:1
# Build: a static musl binary, with dependencies compiled in their own cached layer, without the
# default `dev` feature: the image carries no in-memory test API server (.ci/run checks it).
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl && apt-get update \
    && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependency layer: the manifests, the lock file and every file a manifest names by path
# (cargo refuses a manifest whose [[bench]] files are missing), with empty library and binary
# targets, so source edits do not rebuild every crate. tests/it/manifests.rs replays this stage.
COPY Cargo.toml Cargo.lock ./
COPY webhook/Cargo.toml webhook/Cargo.toml
COPY sandbox/Cargo.toml sandbox/Cargo.toml
COPY benches benches
RUN mkdir -p src webhook/src sandbox/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs webhook/src/lib.rs sandbox/src/lib.rs \
    && cargo build --release --locked --no-default-features --target x86_64-unknown-linux-musl
COPY . .
# The build context has no .git: `--build-arg MYAPP_GIT_COMMIT=$(git rev-parse HEAD)` names the
# commit that `--version` and myapp_build_info report (build.rs), else they say `unknown`.
ARG MYAPP_GIT_COMMIT
# The real sources are newer than the placeholders, so only workspace crates rebuild here.
RUN touch src/main.rs src/lib.rs webhook/src/lib.rs sandbox/src/lib.rs \
    && cargo build --release --locked --no-default-features --target x86_64-unknown-linux-musl \
    && cp target/x86_64-unknown-linux-musl/release/myapp-operator /myapp-operator

# Run: distroless static, non-root, no shell, only the binary.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /myapp-operator /myapp-operator
USER 65532:65532
# Admission webhook (HTTPS), called by the API server through the webhook Service.
EXPOSE 8443
# Admin server (plain HTTP): /livez, /readyz, /metrics.
EXPOSE 8080
ENTRYPOINT ["/myapp-operator"]
CMD ["run"]
