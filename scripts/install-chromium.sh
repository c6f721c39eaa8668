#!/usr/bin/env bash
# Installs Chromium for the DLQ console's browser tests (internal/consolecheck)
# and `make console-shots`, from the distribution's packages.
#
# Idempotent: when /usr/bin/chromium (or $HOPPER_CHROMIUM) exists it prints
# its version and exits 0 without touching apt.
set -euo pipefail

CHROMIUM="${HOPPER_CHROMIUM:-/usr/bin/chromium}"

log() { printf 'install-chromium: %s\n' "$*" >&2; }

if [[ -x "$CHROMIUM" ]]; then
	log "present: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "ERROR: $CHROMIUM is missing and there is no apt-get here: install Chromium yourself (the tests look for chromium, chromium-browser or google-chrome on PATH)"
	exit 1
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
	SUDO="sudo"
fi
log "installing chromium (apt-get)"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
log "installed: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
