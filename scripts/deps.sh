#!/usr/bin/env bash
# Installs the Debian 12 packages tierkv builds with, when any is missing.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libspdlog-dev libmimalloc-dev libgtest-dev libgmock-dev
      libbenchmark-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libcpp-httplib-dev libhiredis-dev
      redis-server  # the remote tier's tests start their own (never the system's service)
      curl nodejs python3-requests dpkg-dev)  # the server's client tests; the .deb's dependencies
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi
