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
# and test one after the other in the background while the Python suites run, which mostly wait
# on their servers and child processes; their output follows the suites' below.
crates() {
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
mkdir -p build
crates > build/crates.log 2>&1 &
crates_pid=$!
# A failed Python suite does not stop the script before the crates' stages end and report.
failed=()
suite() { "$@" || failed+=("$*"); }
# The suite runs on the default transport, the native one, which must have been built (the
# install skips an extension that fails to build); then the server suites again on grpcio.
stage "the test suite"
suite env CRONOQ_REQUIRE_NATIVE=1 .venv/bin/pytest -q --durations=15
stage "the server suites on grpcio"
suite env CRONOQ_TRANSPORT=grpcio .venv/bin/pytest -q tests/integration/test_server_e2e.py \
	tests/integration/test_server_process.py tests/integration/test_server_auth.py \
	tests/integration/test_server_published.py tests/integration/test_worker.py
# The Python Worker's suites again on its grpcio transport (the default above is its native one).
stage "the worker suites on grpcio"
suite env CRONOQ_WORKER_TRANSPORT=grpcio .venv/bin/pytest -q tests/integration/test_worker.py \
	tests/integration/test_worker_shards.py tests/integration/test_app_worker.py
stage "the crates (built and tested in the background since the test suite began)"
wait "$crates_pid" || failed+=("the crates' stages (exit $?), in the output above")
cat build/crates.log
if [ "${#failed[@]}" -ne 0 ]; then
	printf 'FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
stage done
