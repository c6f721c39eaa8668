#!/usr/bin/env bash
# Installs RabbitMQ for hopper's integration tests: RabbitMQ 4 (what users
# run, the tests' default) and the 3.x of the host's own Debian release
# (still supported, run by `make check`).
#
#   scripts/install-rabbitmq.sh        both
#   scripts/install-rabbitmq.sh 4      RabbitMQ 4 only
#   scripts/install-rabbitmq.sh 3      RabbitMQ 3.x only
#
# The tests (internal/testbroker) never use a system broker: they start a
# private node from the scripts in /usr/lib/rabbitmq/bin (or
# $HOPPER_RABBITMQ_BIN) with their own ports and data directory. So all this
# script needs is the package's files; it deliberately does NOT start (or
# enable) the system rabbitmq-server service.
#
# RabbitMQ 4: Debian packages it in its next release (suite "forky", with
# Erlang 29), whose libraries need a newer C library than a stable host
# has. It is installed into a root of its own ($HOPPER_RABBITMQ4_ROOT,
# default /opt/hopper/rabbitmq-4) with mmdebstrap, from the mirror the
# host's apt already uses, and run there under chroot: the script mounts
# /proc, /sys and /dev into it and copies /etc/hosts (Erlang resolves
# localhost through it). About 15 s and 240 MB on a first run.
#
# Idempotent: what is installed already is only checked (and the chroot's
# mounts restored after a reboot).
set -euo pipefail

WANT="${1:-all}"
case "$WANT" in
all | 3 | 4) ;;
*)
	echo "usage: $0 [3|4]" >&2
	exit 64
	;;
esac
ROOT4="${HOPPER_RABBITMQ4_ROOT:-/opt/hopper/rabbitmq-4}"
SUITE4="${HOPPER_RABBITMQ4_SUITE:-forky}"

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

SUDO=()
as_root() { "${SUDO[@]}" "$@"; }
need_root() {
	[[ "$(id -u)" -eq 0 || ${#SUDO[@]} -gt 0 ]] && return 0
	if command -v sudo >/dev/null 2>&1; then
		SUDO=(sudo)
		log "not root, using sudo"
	else
		die "$1 needs root and sudo is not available; run this script as root"
	fi
}

# apt_install installs packages with apt-get. The package lists an image
# comes with go stale: apt can know a package at a version the mirror no
# longer has ("Can't find a source to download version ..."). The lists are
# refreshed first when apt does not know a package, and once more, with a
# second try, when the install fails.
apt_install() {
	local p
	for p in "$@"; do
		if ! apt-cache show "$p" >/dev/null 2>&1; then
			log "running apt-get update"
			as_root apt-get update
			break
		fi
	done
	if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; then
		log "installing $* failed, running apt-get update and retrying"
		as_root apt-get update
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
	fi
}

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

install3() {
	if [[ -x "$SERVER" ]]; then
		print_version
		return 0
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		die "RabbitMQ not found at $SERVER and apt-get is not available.
  Install RabbitMQ with your package manager (e.g. 'brew install rabbitmq')
  and point HOPPER_RABBITMQ_BIN at the directory holding rabbitmq-server
  and rabbitmqctl."
	fi
	need_root "installing rabbitmq-server"
	if [[ ! -e "$POLICY" ]]; then
		printf '#!/bin/sh\n# temporary, from hopper scripts/install-rabbitmq.sh\nexit 101\n' |
			as_root tee "$POLICY" >/dev/null
		as_root chmod 0755 "$POLICY"
		created_policy=1
	fi
	apt_install rabbitmq-server
	[[ -x "$SERVER" ]] || die "rabbitmq-server was installed but $SERVER does not exist"
	print_version
}

# debian_mirror prints the Debian archive the host's apt uses (the first
# deb822 URIs: or one-line "deb" entry whose suite is not a security one).
debian_mirror() {
	local f line uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -e "$f" ]] || continue
		# deb822 stanzas: a URIs line followed by its Suites line.
		uri="$(awk '/^URIs:/ {u=$2} /^Suites:/ { if ($0 !~ /-security/ && u != "") { print u; exit } }' "$f")"
		if [[ -n "$uri" ]]; then
			echo "$uri"
			return 0
		fi
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -e "$f" ]] || continue
		while read -r line; do
			case "$line" in
			deb\ *debian*)
				uri="$(awk '{for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' <<<"$line")"
				if [[ -n "$uri" && "$line" != *-security* ]]; then
					echo "$uri"
					return 0
				fi
				;;
			esac
		done <"$f"
	done
	return 1
}

version4() {
	chroot "$ROOT4" dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || true
}

install4() {
	local server4="$ROOT4/usr/lib/rabbitmq/bin/rabbitmq-server"
	if [[ ! -x "$server4" ]]; then
		need_root "installing RabbitMQ 4 into $ROOT4"
		if ! command -v mmdebstrap >/dev/null 2>&1; then
			apt_install mmdebstrap
		fi
		local mirror
		mirror="$(debian_mirror)" || die "cannot tell which Debian mirror apt uses (no deb entry in /etc/apt/sources.list*)"
		log "installing RabbitMQ 4 (Debian $SUITE4) into $ROOT4"
		local tmp="$ROOT4.partial"
		# --one-file-system: a root left over from an earlier run may
		# still have the host's /dev, /proc and /sys mounted in it, and
		# those must never be removed with it.
		as_root rm -rf --one-file-system "$tmp"
		as_root mkdir -p "$(dirname "$ROOT4")"
		# The suite's Release file may be past its Valid-Until on a
		# snapshot mirror; the packages are still signed and checked.
		as_root mmdebstrap --quiet --variant=apt \
			--aptopt='Acquire::Check-Valid-Until "false"' \
			--include=rabbitmq-server,procps "$SUITE4" "$tmp" "$mirror"
		if [[ -e "$ROOT4" ]]; then
			local m
			for m in dev sys proc; do
				if mountpoint -q "$ROOT4/$m"; then
					as_root umount -l "$ROOT4/$m" || die "cannot unmount $ROOT4/$m; remove $ROOT4 by hand"
				fi
			done
			as_root rm -rf --one-file-system "$ROOT4"
		fi
		as_root mv "$tmp" "$ROOT4"
	fi
	local v
	v="$(version4)"
	case "$v" in
	4.*) ;;
	*) die "$ROOT4 holds rabbitmq-server '${v:-?}', not a 4.x release; remove it and run again" ;;
	esac
	# What a node in the root needs of the host, also after a reboot.
	if ! cmp -s /etc/hosts "$ROOT4/etc/hosts"; then
		need_root "copying /etc/hosts into $ROOT4"
		as_root cp /etc/hosts "$ROOT4/etc/hosts"
	fi
	local m
	for m in proc sys dev; do
		if ! mountpoint -q "$ROOT4/$m"; then
			need_root "mounting /$m into $ROOT4"
			as_root mount --bind "/$m" "$ROOT4/$m"
		fi
	done
	echo "RabbitMQ $v is installed in $ROOT4 (run under chroot)"
}

# Sourced (by the tests), it only defines its functions.
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
	return 0
fi

case "$WANT" in
3) install3 ;;
4) install4 ;;
all)
	install4
	install3
	;;
esac
