#!/usr/bin/env bash
# Builds kine (github.com/k3s-io/kine, the version go.mod pins): the etcd API over SQLite that
# a tenant cluster's apiserver can use instead of etcd (`clusters.datastore = "kine"`,
# docs/hibernation.md), and caches it outside the repo. CGO is on: kine's SQLite driver is the
# C library (mattn/go-sqlite3), as in k3s.
#
# Prints the directory holding `kine`.
# Cache: ${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}/kine-<version>-<hash of go.mod, go.sum,
# tools.go and this script>/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local
version="$(awk '$1=="github.com/k3s-io/kine" {print $2; exit}' go.mod)"
[ -n "$version" ] || { echo "kine/build.sh: go.mod does not pin github.com/k3s-io/kine" >&2; exit 1; }
inputs_hash="$(cat go.mod go.sum tools.go build.sh | sha256sum | cut -c1-12)"
cache="${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}"
out="$cache/kine-$version-$inputs_hash"
if [ -x "$out/kine" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "kine/build.sh: the Go toolchain is not installed" >&2; exit 1; }
command -v gcc >/dev/null || { echo "kine/build.sh: gcc is not installed (kine's SQLite is C)" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.kine-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "kine/build.sh: building kine $version into $out (cold: about 4 minutes)" >&2
CGO_ENABLED=1 go build -trimpath -ldflags='-s -w' -o "$tmp/kine" github.com/k3s-io/kine
"$tmp/kine" --version >/dev/null
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "kine/build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$out"
