#!/usr/bin/env bash
# Builds kine (github.com/k3s-io/kine, the version go.mod pins): the etcd API over SQLite that
# a tenant cluster's apiserver can use instead of etcd (`clusters.datastore = "kine"`,
# docs/hibernation.md), and caches it outside the repo. CGO is on: kine's SQLite driver is the
# C library (mattn/go-sqlite3), as in k3s.
#
# patches/*.patch, in name order, are applied to kine's source first (each says why; none
# changes kine's storage format or flags): the module is copied out of Go's module cache,
# patched, and built through a `replace` in a temporary copy of go.mod.
#
# Prints the directory holding `kine`.
# Cache: ${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}/kine-<version>-<hash of go.mod, go.sum,
# tools.go, the patches and this script>/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local
version="$(awk '$1=="github.com/k3s-io/kine" {print $2; exit}' go.mod)"
[ -n "$version" ] || { echo "kine/build.sh: go.mod does not pin github.com/k3s-io/kine" >&2; exit 1; }
patches=(patches/*.patch)
inputs_hash="$(cat go.mod go.sum tools.go build.sh "${patches[@]}" | sha256sum | cut -c1-12)"
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
src="$(go mod download -json "github.com/k3s-io/kine@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[ -d "$src" ] || { echo "kine/build.sh: go mod download gave no source directory for kine $version" >&2; exit 1; }
cp -r "$src" "$tmp/src"
chmod -R u+w "$tmp/src"
for p in "${patches[@]}"; do
  echo "kine/build.sh: applying $p" >&2
  patch -d "$tmp/src" -p1 --forward --quiet < "$p" \
    || { echo "kine/build.sh: $p does not apply to kine $version" >&2; exit 1; }
done
mkdir "$tmp/mod"
cp go.mod go.sum "$tmp/mod/"
go mod edit -modfile="$tmp/mod/go.mod" -replace "github.com/k3s-io/kine=$tmp/src"
CGO_ENABLED=1 go build -modfile="$tmp/mod/go.mod" -trimpath -ldflags='-s -w' -o "$tmp/kine" github.com/k3s-io/kine
rm -rf "$tmp/src" "$tmp/mod"
"$tmp/kine" --version >/dev/null
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "kine/build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$out"
