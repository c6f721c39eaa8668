#!/usr/bin/env bash
# Installs RabbitMQ for hopper's integration tests.
#
# The tests (internal/testbroker) never use a system broker: they start a
# private node from the scripts in /usr/lib/rabbitmq/bin (or
# $HOPPER_RABBITMQ_BIN) with their own ports and data directory. So all this
# script needs is the package's files; it deliberately does NOT start (or
# enable) the system rabbitmq-server service.
#
# Idempotent: if RabbitMQ is already installed it prints the version and
# exits 0 without touching apt.
set -euo pipefail

BIN_DIR="${HOPPER_RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}"
SERVER="$BIN_DIR/rabbitmq-server"
POLICY=/usr/sbin/policy-rc.d

log() { printf 'install-rabbitmq: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

print_version() {
	local v=""
	if command -v dpkg-query >/dev/null 2>&1; then
		v="$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || true)"
	fi
	if [[ -z "$v" ]]; then
		# /usr/lib/rabbitmq/bin/rabbitmq-server -> ../lib/rabbitmq_server-X.Y.Z/sbin/...
		v="$(readlink -f "$SERVER" | sed -n 's|.*/rabbitmq_server-\([^/]*\)/.*|\1|p')"
	fi
	echo "RabbitMQ ${v:-(unknown version)} is installed ($SERVER)"
}

if [[ -x "$SERVER" ]]; then
	print_version
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	die "RabbitMQ not found at $SERVER and apt-get is not available.
  Install RabbitMQ with your package manager (e.g. 'brew install rabbitmq')
  and point HOPPER_RABBITMQ_BIN at the directory holding rabbitmq-server
  and rabbitmqctl."
fi

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO=(sudo)
		log "not root, using sudo"
	else
		die "RabbitMQ not found at $SERVER; installing it needs root and sudo is not available.
  Run as root: apt-get install -y rabbitmq-server"
	fi
fi
as_root() { "${SUDO[@]}" "$@"; }

# Keep the package's maintainer scripts from starting the system broker: a
# policy-rc.d that exits 101 makes invoke-rc.d / deb-systemd-invoke skip the
# start. Respect an existing one (Docker images ship one); otherwise add a
# temporary one and remove it on exit.
created_policy=0
cleanup() {
	if [[ "$created_policy" -eq 1 ]]; then
		as_root rm -f "$POLICY" || log "WARNING: could not remove $POLICY"
	fi
}
trap cleanup EXIT
if [[ ! -e "$POLICY" ]]; then
	printf '#!/bin/sh\n# temporary, from hopper scripts/install-rabbitmq.sh\nexit 101\n' |
		as_root tee "$POLICY" >/dev/null
	as_root chmod 0755 "$POLICY"
	created_policy=1
fi

apt_install() {
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server
}

# Only refresh the package lists when apt does not know the package yet; if
# the install then fails (stale lists), refresh once and retry.
if ! apt-cache show rabbitmq-server >/dev/null 2>&1; then
	log "running apt-get update"
	as_root apt-get update
fi
if ! apt_install; then
	log "install failed, running apt-get update and retrying"
	as_root apt-get update
	apt_install
fi

[[ -x "$SERVER" ]] || die "rabbitmq-server was installed but $SERVER does not exist"
print_version
