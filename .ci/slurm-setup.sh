#!/usr/bin/env bash
# slurm-setup.sh - install the Debian packages that the Slurm test cluster
# (testkit/slurm_testbed.py) needs, before the tests start.
# Idempotent: does nothing (but say so) when everything is installed.
# Keep PKGS in step with NEEDED in testkit/slurm_testbed.py.
set -euo pipefail

PKGS="munge slurmd slurmctld slurm-client iproute2 util-linux procps iputils-ping nftables iptables"
T0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[slurm-setup %d.%03ds] %s\n' $((ms/1000)) $((ms%1000)) "$*"; }

[ "$(id -u)" = 0 ] || { echo "slurm-setup: must run as root (apt-get install)" >&2; exit 1; }

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  log "all packages present:$(printf ' %s' $PKGS)"
  exit 0
fi

log "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
log "apt-get update done"
# shellcheck disable=SC2086  # word splitting of the package list is intended
apt-get install -y -qq --no-install-recommends $missing >/dev/null
log "installed; $(slurmd -V 2>/dev/null || echo 'slurmd version unknown')"
# A systemd host would start its own packaged daemons, which compete with the test cluster.
if [ -d /run/systemd/system ]; then
  systemctl disable --now slurmd slurmctld >/dev/null 2>&1 || true
fi
log "done"
