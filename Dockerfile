# cronoq's container image: cronoq-server (and the cronoq command, for workers) with the server
# and client extras, on Debian bookworm's Python 3.11 (deploy/README.md, "The container image").
#
#   docker build -t cronoq:local .
#   docker run -d --name cronoq -p 7070:7070 -p 7071:7071 -v cronoq-data:/var/lib/cronoq \
#     -e CRONOQ_CLIENT_TOKEN -e CRONOQ_WORKER_TOKEN -e CRONOQ_ADMIN_TOKEN \
#     --stop-timeout 45 cronoq:local
#
# Stages: `build` compiles the wheel, native transport (native/, Rust) included, with a pinned
# Rust toolchain (rustup-init checked against its digest) and Cargo.lock; `wheels` holds only
# that wheel; `install` installs it with the server and client extras into a venv; the last
# stage is the runtime with that venv. To skip the Rust build, give `wheels` as a named build
# context: a directory with one cronoq wheel built on a glibc <= 2.36 (bookworm) machine,
#
#   pip wheel . --no-deps -w dist/
#   docker buildx build --build-context wheels=dist -t cronoq:local .
#
# and with the wheels of its dependencies beside it (pip download --only-binary=:all: -d dist
# "$(ls dist/cronoq-*.whl)[server,client]") nothing is fetched from the package index.
#
# Only the files .dockerignore lets in are in the context: the package's sources and metadata
# and the image's configuration (deploy/image/server.toml).

FROM debian:bookworm-slim AS build
ARG RUST_VERSION=1.95.0
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates curl gcc libc6-dev python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/opt/rustup CARGO_HOME=/opt/cargo PATH=/opt/cargo/bin:$PATH
# rustup-init 1.28.2, checked against the digests static.rust-lang.org publishes for it.
RUN set -eu; \
    case "$(dpkg --print-architecture)" in \
        amd64) triple=x86_64-unknown-linux-gnu; \
            sum=20a06e644b0d9bd2fbdbfd52d42540bdde820ea7df86e92e533c073da0cdd43c ;; \
        arm64) triple=aarch64-unknown-linux-gnu; \
            sum=e3853c5a252fca15252d07cb23a1bdd9377a8c6f3efa01531109281ae47f841c ;; \
        *) echo "no rustup-init digest for $(dpkg --print-architecture)" >&2; exit 1 ;; \
    esac; \
    curl --proto '=https' --tlsv1.2 -sSfo /tmp/rustup-init \
        "https://static.rust-lang.org/rustup/archive/1.28.2/$triple/rustup-init"; \
    echo "$sum  /tmp/rustup-init" | sha256sum -c -; \
    chmod +x /tmp/rustup-init; \
    /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain "$RUST_VERSION"; \
    rm /tmp/rustup-init; \
    rustc --version
WORKDIR /src
COPY pyproject.toml MANIFEST.in README.md LICENSE ./
COPY native/ native/
COPY src/ src/
# The extension is optional in pyproject.toml (an install without cargo still succeeds): here a
# wheel without it is an error.
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-cache-dir --no-deps -w /wheels . \
    && /opt/build/bin/python -c "import glob, sys, zipfile; \
w = glob.glob('/wheels/cronoq-*-abi3-*.whl'); \
sys.exit(len(w) != 1 or 'cronoq/_native.abi3.so' not in zipfile.ZipFile(w[0]).namelist())"

# The wheel, alone at the root: what `--build-context wheels=DIR` replaces.
FROM scratch AS wheels
COPY --from=build /wheels/ /

# The runtime's system: Debian's Python 3.11 and a system account without a login, which owns
# the volume where the SQLite file lives.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 cronoq \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/cronoq --no-create-home \
        --shell /usr/sbin/nologin cronoq \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/cronoq

# Exactly one cronoq wheel, installed into the venv /opt/cronoq with its dependencies: from the
# index, or, when the wheels stage holds other wheels too (a wheelhouse), from those alone. The
# wheels are copied (so that a changed wheel is a changed layer for every builder's cache) into
# this stage only: the image takes the venv, not them.
FROM runtime AS install
COPY --from=wheels / /tmp/wheels/
RUN set -eu; \
    set -- /tmp/wheels/cronoq-*.whl; \
    if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then \
        echo "expected exactly one cronoq wheel in the wheels stage, got: $*" >&2; exit 1; \
    fi; \
    offline=""; \
    if [ "$(find /tmp/wheels -maxdepth 1 -name '*.whl' | wc -l)" -gt 1 ]; then \
        offline="--no-index --find-links /tmp/wheels"; \
    fi; \
    python3 -m venv /opt/cronoq; \
    /opt/cronoq/bin/pip install --no-cache-dir --disable-pip-version-check $offline \
        "$1[server,client]"; \
    /opt/cronoq/bin/python -c "import cronoq._native"

FROM runtime
ARG VERSION=0.2.0
ARG REVISION=""
LABEL org.opencontainers.image.title="cronoq" \
      org.opencontainers.image.description="cronoq-server, an elastic, priority-aware task scheduler (gRPC 7070, HTTP 7071, metrics 7072), and the cronoq command" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
COPY --from=install /opt/cronoq /opt/cronoq
COPY deploy/image/server.toml /etc/cronoq/server.toml
# `python` (the healthchecks) and the commands are the venv's.
ENV PATH=/opt/cronoq/bin:$PATH \
    CRONOQ_CONFIG=/etc/cronoq/server.toml \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/cronoq
VOLUME ["/var/lib/cronoq"]
# gRPC, HTTP (JSON API, dashboard, probes), metrics (/metrics, /healthz, /readyz, no credentials).
EXPOSE 7070 7071 7072
# 200 only while this server leads; CRONOQ_HEALTHCHECK_URL points it elsewhere (another config).
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('CRONOQ_HEALTHCHECK_URL', 'http://127.0.0.1:7072/readyz'), timeout=3)"]
# SIGTERM drains (server.shutdown_grace_s, then 5 s for open calls) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cronoq-server"]
