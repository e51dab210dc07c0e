#!/usr/bin/env bash
# Installs polltuned and everything it needs on a Debian machine, as root.
#   bash config/install.sh               -> system install: venv in /opt/polltuned (the system python3),
#                                           then the system set-up below
#   bash config/install.sh --setup [VENV] -> the system set-up only, for an existing venv (default
#                                           /opt/polltuned): group polltuned, /usr/local/bin/polltuned,
#                                           policies in /usr/share/polltuned, config, unit, tmpfiles.d and
#                                           sysusers.d entries. No packages, no pip; safe to run again.
#   bash config/install.sh --dev DIR     -> a development venv in DIR with the test extras, editable
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=system; venv=/opt/polltuned
case "${1:-}" in
  --dev) mode=dev; venv="${2:-$here/.venv}" ;;
  --setup) mode=setup; venv="${2:-$venv}" ;;
  "") ;;
  *) echo "usage: install.sh [--dev DIR | --setup [VENV]]" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then echo "install.sh: run as root (it installs Debian packages)" >&2; exit 5; fi

# The group named by the unit (Group=) and tmpfiles.d: members may read the status. Idempotent.
setup_group() {
  install -D -m 0644 "$here/config/sysusers.d/polltuned.conf" /usr/lib/sysusers.d/polltuned.conf
  if ! getent group polltuned >/dev/null && command -v systemd-sysusers >/dev/null; then
    systemd-sysusers /usr/lib/sysusers.d/polltuned.conf || true
  fi
  getent group polltuned >/dev/null || groupadd --system polltuned
}

# Everything but packages and the venv itself. Idempotent.
setup_system() {
  local venv=$1
  if [ ! -x "$venv/bin/polltuned" ]; then echo "install.sh: no polltuned in $venv" >&2; exit 2; fi
  setup_group
  ln -sfn "$venv/bin/polltuned" /usr/local/bin/polltuned
  install -d -m 0755 /usr/share/polltuned/policies /etc/polltuned
  install -m 0644 "$here"/policies/*.toml /usr/share/polltuned/policies/
  install -m 0644 "$here/README.md" /usr/share/polltuned/README.md
  [ -e /etc/polltuned/polltuned.toml ] || install -m 0644 "$here/config/polltuned.toml" /etc/polltuned/polltuned.toml
  install -d -m 0750 -o root -g polltuned /var/lib/polltuned
  # the manual page, generated from the installed command's own parser (polltuned man)
  local mandir=/usr/local/share/man/man8
  install -d "$mandir"
  "$venv/bin/polltuned" man --output "$mandir/polltuned.8.tmp"
  chmod 0644 "$mandir/polltuned.8.tmp" && mv -f "$mandir/polltuned.8.tmp" "$mandir/polltuned.8"
  if command -v mandb >/dev/null 2>&1; then mandb -q "${mandir%/man8}" >/dev/null 2>&1 || true; fi
  if [ -d /etc/systemd/system ]; then
    install -m 0644 "$here/polltuned.service" /etc/systemd/system/polltuned.service
    install -D -m 0644 "$here/config/tmpfiles.d/polltuned.conf" /usr/lib/tmpfiles.d/polltuned.conf
  fi
  if [ -d /run/systemd/system ]; then  # booted with systemd: apply now, not at the next boot
    systemd-tmpfiles --create /usr/lib/tmpfiles.d/polltuned.conf || true
    systemctl daemon-reload
  fi
}

if [ "$mode" = setup ]; then
  setup_system "$venv"
  echo "polltuned set up for $venv"
  exit 0
fi

apt_pkgs=(python3 python3-venv python3-dev gcc libsystemd-dev pkg-config iproute2 ethtool sockperf stress-ng procps
          nginx wrk memcached)
# the dev extras: systemd-nspawn boots a real systemd for tests/test_systemd_container.py
# and the study-store tests and benchmarks/fleet.py start a private PostgreSQL cluster in a temp dir
# (initdb/pg_ctl from /usr/lib/postgresql/*/bin; never the system cluster)
if [ "$mode" = dev ]; then apt_pkgs+=(systemd-container postgresql); fi
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The service venv uses Debian's python3: one under /root or /home (pyenv) would be hidden from the
# service by ProtectHome=yes and unreadable for the members of group polltuned.
py=python3
if [ "$mode" = system ] && [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; fi
if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; fi
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
if [ "$mode" = dev ]; then
  "$venv/bin/python" -m pip install -q -e "$here[dev]"
else
  "$venv/bin/python" -m pip install -q "$here"
  setup_system "$venv"
fi
echo "polltuned installed ($mode) in $venv"
