#!/usr/bin/env bash
# Regenerates the Go stubs in cronoqpb/ (or in the directory given as $1) from the shared
# cronoq.proto.
#
# The .proto carries no go_package option (it is shared with the Python stubs, which would have
# to be regenerated if it changed), so the Go import path is given with M mappings instead.
# Needs the repository's .venv (grpcio-tools provides protoc) and the two Go plugins, pinned so
# the committed files stay byte-stable:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
set -euo pipefail
cd "$(dirname "$0")"
root=../..
proto=cronoq/v1/cronoq.proto
pkg=github.com/synaptiai/cronoq/sdks/go/cronoqpb
out=${1:-cronoqpb}
gobin=$(go env GOPATH)/bin
PATH="$gobin:$PATH" "$root/.venv/bin/python" -m grpc_tools.protoc \
	-I "$root/src/cronoq/proto" \
	--go_out="$out" --go_opt=paths=source_relative --go_opt="M$proto=$pkg" \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative --go-grpc_opt="M$proto=$pkg" \
	"$proto"
# paths=source_relative mirrors the proto's directory; the package wants the files flat.
mv "$out"/cronoq/v1/*.go "$out"/
rm -r "$out/cronoq"
