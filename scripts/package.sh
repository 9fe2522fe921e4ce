#!/usr/bin/env bash
# scripts/package.sh: builds the Debian package from build/release (CPack, DEB), unpacks
# it into a scratch root as an install would place it, and runs `tierkv --version` and
# `tierkv probe` from there. Prints the package's path. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/release/runtime/tierkv ] || scripts/build.sh release tierkv tierkv_manpage >&2
cmake --build build/release --target tierkv tierkv_manpage >&2
(cd build/release && cpack -G DEB >&2)
deb=$(ls -t build/release/tierkv_*.deb | head -1)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb --info "$deb" | grep -E "Package|Version|Depends" >&2
dpkg-deb -x "$deb" "$root"
# What the package installs, and nothing else beside it.
for f in usr/bin/tierkv usr/share/man/man1/tierkv.1 usr/share/doc/tierkv/README.md; do
  [ -f "$root/$f" ] || { echo "error: the package lacks /$f" >&2; exit 1; }
done
"$root/usr/bin/tierkv" --version >&2
"$root/usr/bin/tierkv" probe --disk-dir "$root" --size 16MiB >/dev/null 2>"$root/probe.err" || {
  echo "error: tierkv probe from the package failed:" >&2; cat "$root/probe.err" >&2; exit 1; }
echo "$deb"
