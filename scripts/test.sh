#!/usr/bin/env bash
# Install cronoq with its test dependencies into .venv and run every check: lint, types, tests,
# and a quick smoke run of the benchmarks. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's start, with the seconds since this script began (CI's time budget is 30 min).
stage() { echo "--- $1 (${SECONDS} s in)"; }
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# The install builds the native transport (native/, Rust) in release mode: its time is printed.
started=$(date +%s)
.venv/bin/pip install -q -e '.[test,server,client]'
echo "install, with the native transport's build: $(($(date +%s) - started)) s"
stage lint
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The dashboard's browser tests drive Debian's Chromium; its TypeScript build must match the
# committed output in src/cronoq/server/ui.
command -v chromium >/dev/null || apt-get install -y -q chromium \
	|| { apt-get update -q && apt-get install -y -q chromium; }
(cd dashboard && npm ci --no-audit --no-fund --loglevel=error && npm run check)
# tests/deploy checks the systemd units and the compose file with Debian's tools (helm it builds
# itself, once, into build/tools).
{ command -v systemd-analyze && command -v docker-compose && command -v promtool; } >/dev/null \
	|| apt-get install -y -q systemd docker-compose prometheus \
	|| { apt-get update -q && apt-get install -y -q systemd docker-compose prometheus; }
# tests/deploy/test_image.py builds the root Dockerfile with buildah on a base image that
# mmdebstrap makes from Debian's packages and podman tags (no registry is reachable).
{ command -v buildah && command -v podman && command -v mmdebstrap; } >/dev/null \
	|| apt-get install -y -q buildah podman mmdebstrap \
	|| { apt-get update -q && apt-get install -y -q buildah podman mmdebstrap; }
# The crates' stages (native/, the parity crate's lints, the Go, Rust and TypeScript SDKs) build
# and test one after the other in the background while the test suite runs, which mostly waits
# on its servers and child processes; the suites on grpcio follow them there. Their output
# follows the test suite's below.
crates() {
	stage "builds the test suite needs later"
	# The differential suite's module (under the lock its conftest takes, which then finds it
	# built) and the Rust library bench's debug build (formatting checked), which
	# tests/test_bench_smoke.py runs.
	(
		cd tests/parity/rust
		mkdir -p target
		flock target/.parity-build.lock cargo build --release --locked --quiet
	)
	(cd bench/rust-library && cargo fmt --check && cargo build --locked --quiet)
	stage "native/"
	# The native transport's crate: formatting, lints and its own tests.
	(
		cd native
		cargo fmt --check
		cargo clippy --locked --all-targets -- -D warnings
		cargo test --locked
	)
	stage tests/parity/rust
	# The differential suite's test-only PyO3 module (the suite builds it): formatting and lints.
	(
		cd tests/parity/rust
		cargo fmt --check
		cargo clippy --locked --all-targets -- -D warnings
	)
	stage sdks/go
	# The Go SDK: vet, staticcheck, formatting and its tests, which start the server from this .venv.
	(
		export CRONOQ_PYTHON="$PWD/.venv/bin/python"
		cd sdks/go
		go vet ./...
		go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
		"$(go env GOPATH)/bin/staticcheck" ./...
		unformatted=$(gofmt -l .)
		if [ -n "$unformatted" ]; then
			echo "gofmt needed: $unformatted" >&2
			exit 1
		fi
		# The cross-language example's Go program (this SDK through a replace): vet and formatting;
		# tests/integration/test_app_crosslang.py builds and runs it.
		(
			cd ../../examples/crosslang
			go vet ./...
			unformatted=$(gofmt -l .)
			if [ -n "$unformatted" ]; then
				echo "gofmt needed in examples/crosslang: $unformatted" >&2
				exit 1
			fi
		)
		# The pinned protoc plugins, so that TestStubsUpToDate regenerates and compares the stubs.
		go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
		go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
		go test -count=1 .  # cronoqpb (generated) has no tests of its own
	)
	stage sdks/rust
	# The Rust crates (the sdks/rust workspace: cronoq, cronoq-core, cronoq-worker, cronoq-server):
	# formatting, lints and the tests of every crate; the worker crates' start the server from this
	# .venv. Their build output is kept in sdks/rust/target (git-ignored) between runs.
	(
		export CRONOQ_PYTHON="$PWD/.venv/bin/python"
		cd sdks/rust
		cargo fmt --check
		cargo clippy --locked --all-targets -- -D warnings
		cargo test --locked
		# The library without its default feature `otel`, whose hooks then do nothing
		# (tests/telemetry_off.rs checks that nothing is tagged or measured).
		cargo clippy --locked -p cronoq --all-targets --no-default-features -- -D warnings
		cargo test --locked -p cronoq --no-default-features
	)
	stage sdks/ts
	# The TypeScript SDK: build it and run its tests, which start the server from this .venv. Its
	# last lines are the Node test runner's summary.
	(
		export CRONOQ_PYTHON="$PWD/.venv/bin/python"
		cd sdks/ts
		npm ci --no-audit --no-fund --loglevel=error
		npm run build --silent
		npm test --silent
	)
}
# A failed suite does not stop the script before the others end and report.
failed=()
suite() { "$@" || failed+=("$*"); }
# The server suites again on grpcio, and the Python Worker's on its grpcio transport (the
# default of both is the native one), after the crates' stages. What failed goes to a file.
background() {
	crates &
	wait $! || failed+=("the crates' stages (exit $?)")
	stage "the server suites on grpcio"
	suite env CRONOQ_TRANSPORT=grpcio .venv/bin/pytest -q -p no:cacheprovider \
		tests/integration/test_server_e2e.py tests/integration/test_server_process.py \
		tests/integration/test_server_auth.py tests/integration/test_server_published.py \
		tests/integration/test_worker.py
	stage "the worker suites on grpcio"
	suite env CRONOQ_WORKER_TRANSPORT=grpcio .venv/bin/pytest -q -p no:cacheprovider \
		tests/integration/test_worker.py tests/integration/test_worker_shards.py \
		tests/integration/test_app_worker.py
	if [ "${#failed[@]}" -ne 0 ]; then printf '%s\n' "${failed[@]}"; fi > build/background.failed
}
mkdir -p build
rm -f build/background.failed
background > build/background.log 2>&1 &
background_pid=$!
# The suite runs on the default transport, the native one, which must have been built (the
# install skips an extension that fails to build).
stage "the test suite"
suite env CRONOQ_REQUIRE_NATIVE=1 .venv/bin/pytest -q --durations=15
stage "the background stages (since the test suite began)"
wait "$background_pid" || failed+=("the background stages (exit $?)")
cat build/background.log
mapfile -t background_failed < build/background.failed \
	|| background_failed=("the background stages (they recorded no result)")
failed+=("${background_failed[@]}")
if [ "${#failed[@]}" -ne 0 ]; then
	printf 'FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
stage done
