#!/usr/bin/env bash
# Installs the pinned Jaeger all-in-one into the repository's tool cache
# (.cache/bin, gitignored) when it is missing, with `go install`. v1.45.0 is
# the newest release `go install` accepts (later go.mod files carry replace
# directives). Idempotent. A cold install compiles Jaeger: several minutes.
set -euo pipefail

JAEGER_VERSION="${JAEGER_VERSION:-v1.45.0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN_DIR="${HOPPER_TOOLS_BIN:-$ROOT/.cache/bin}"
BIN="$BIN_DIR/all-in-one"

log() { printf 'install-jaeger: %s\n' "$*" >&2; }

if [[ -x "$BIN" ]]; then
	have="$(go version -m "$BIN" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/jaegertracing/jaeger" {print $3}')"
	if [[ "$have" == "$JAEGER_VERSION" ]]; then
		log "jaeger all-in-one $have is installed ($BIN)"
		exit 0
	fi
fi
mkdir -p "$BIN_DIR"
log "installing jaeger all-in-one $JAEGER_VERSION into $BIN_DIR"
start=$(date +%s)
GOBIN="$BIN_DIR" GOFLAGS=-mod=mod go install "github.com/jaegertracing/jaeger/cmd/all-in-one@$JAEGER_VERSION"
log "installed in $(($(date +%s) - start))s"
