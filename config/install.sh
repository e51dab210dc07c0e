#!/usr/bin/env bash
# Installs polltuned and everything it needs on a Debian machine, as root.
#   bash config/install.sh            -> system install: venv in /opt/polltuned, /usr/local/bin/polltuned,
#                                        policies in /usr/share/polltuned, unit + tmpfiles.d entry
#   bash config/install.sh --dev DIR  -> a development venv in DIR with the test extras, editable
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=system; venv=/opt/polltuned
if [ "${1:-}" = "--dev" ]; then mode=dev; venv="${2:-$here/.venv}"; fi

if [ "$(id -u)" != 0 ]; then echo "install.sh: run as root (it installs Debian packages)" >&2; exit 5; fi

apt_pkgs=(python3 python3-venv python3-dev gcc libsystemd-dev pkg-config iproute2 ethtool sockperf stress-ng procps)
# the study-store tests and benchmarks/fleet.py start a private PostgreSQL cluster in a temp dir
# (initdb/pg_ctl from /usr/lib/postgresql/*/bin; never the system cluster)
if [ "$mode" = dev ]; then apt_pkgs+=(postgresql); fi
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

py=python3
if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; fi
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
if [ "$mode" = dev ]; then
  "$venv/bin/python" -m pip install -q -e "$here[dev]"
else
  "$venv/bin/python" -m pip install -q "$here"
  ln -sf "$venv/bin/polltuned" /usr/local/bin/polltuned
  install -d /usr/share/polltuned/policies /etc/polltuned /var/lib/polltuned
  install -m 0644 "$here"/policies/*.toml /usr/share/polltuned/policies/
  install -m 0644 "$here/README.md" /usr/share/polltuned/README.md
  [ -e /etc/polltuned/polltuned.toml ] || install -m 0644 "$here/config/polltuned.toml" /etc/polltuned/polltuned.toml
  if [ -d /etc/systemd/system ]; then
    install -m 0644 "$here/polltuned.service" /etc/systemd/system/polltuned.service
    install -D -m 0644 "$here/config/tmpfiles.d/polltuned.conf" /usr/lib/tmpfiles.d/polltuned.conf
  fi
fi
echo "polltuned installed ($mode) in $venv"
