#!/usr/bin/env bash
# Installs the pinned Helm into the repository's tool cache (.cache/bin,
# gitignored) when it is missing, with `go install` from the Go module proxy
# (the only place this project's machines can fetch it from). Idempotent: an
# installed helm of the pinned version is left alone.
#
#   scripts/install-helm.sh            # installs .cache/bin/helm
#   HOPPER_TOOLS_BIN=/dir scripts/...  # installs elsewhere
#
# A cold install compiles Helm and its dependencies: 2 to 4 minutes.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN_DIR="${HOPPER_TOOLS_BIN:-$ROOT/.cache/bin}"
HELM="$BIN_DIR/helm"

log() { printf 'install-helm: %s\n' "$*" >&2; }

installed_version() {
	# A go-installed helm lacks the release's version stamp (`helm version`
	# says v3.19), so read the module version recorded in the binary.
	go version -m "$HELM" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" {print $3}'
}

if [[ -x "$HELM" ]]; then
	have="$(installed_version)"
	if [[ "$have" == "$HELM_VERSION" ]]; then
		log "helm $have is installed ($HELM)"
		exit 0
	fi
	log "found helm ${have:-(unknown version)} at $HELM, want $HELM_VERSION: reinstalling"
fi

command -v go >/dev/null 2>&1 || {
	log "ERROR: go is needed to install helm"
	exit 1
}

mkdir -p "$BIN_DIR"
log "installing helm $HELM_VERSION into $BIN_DIR (go install; 2 to 4 minutes on a cold cache)"
start=$SECONDS
# CGO off: a static helm, like the one Helm releases. GOFLAGS from the caller
# (e.g. -mod=vendor) must not leak into a module-mode install.
GOBIN="$BIN_DIR" CGO_ENABLED=0 GOFLAGS= go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
log "helm $(installed_version) installed in $((SECONDS - start))s ($HELM)"
