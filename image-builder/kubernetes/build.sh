#!/usr/bin/env bash
# Builds the Kubernetes socialweb ships (control plane for the broker, kubelet and kube-proxy
# for the node image, kubectl), from Go modules, and caches it outside the repo.
#
# k3s itself cannot be built here: the Go module proxy this project can reach refuses every
# github.com/k3s-io/k3s version (403, "not available"). So this builds the upstream components
# k3s is made of -- kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
# kubectl and an embedded etcd -- into one multicall binary (main.go, the way k3s packs them), from
# k8s.io/kubernetes at the version pinned in go.mod. docs/kubernetes.md has the details.
#
# Prints the directory holding `kube` (the multicall binary) and `pause` (the pod sandbox's
# process, compiled from the pause.c shipped in the same kubernetes module).
# Cache: ${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}/kube-<version>-<hash of the inputs>/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local
version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' go.mod)"
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
inputs_hash="$(cat go.mod go.sum main.go build.sh | sha256sum | cut -c1-12)"
cache="${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}"
out="$cache/kube-$version-$inputs_hash"
if [ -x "$out/kube" ] && [ -x "$out/pause" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: the Go toolchain is not installed" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "build.sh: building Kubernetes $version from Go modules into $out (cold: about 6 minutes on 2 cores)" >&2
major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
go mod download
go build -trimpath -ldflags "$ldflags" -o "$tmp/kube" .
moddir="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
gcc -Os -static -DVERSION="$version" -o "$tmp/pause" "$moddir/build/pause/linux/pause.c"
mv "$tmp" "$out"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s: $(du -h "$out/kube" | cut -f1) kube, $(du -h "$out/pause" | cut -f1) pause" >&2
echo "$out"
