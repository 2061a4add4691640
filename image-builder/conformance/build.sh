#!/usr/bin/env bash
# Builds the upstream Kubernetes conformance suite for `./x conformance`, from the same pinned
# k8s.io/kubernetes module as image-builder/kubernetes, and caches it outside the repo; the
# module (module.sh) is go.mod here with image-builder/kubernetes/go.mod's replace lines, so the
# staging modules' versions have one source; tools.go names the packages.
#   e2e.test  the suite (`go test -c k8s.io/kubernetes/test/e2e`)
#   ginkgo    its runner, at the github.com/onsi/ginkgo/v2 version the module pins
#   agnhost   test/images/agnhost, the binary of the suite's main test image (packed into an
#             image and imported into the nodes by socialweb-conformance; nothing is pulled),
#             with localhost.crt and localhost.key, which the upstream image carries at / for
#             `agnhost porter`'s TLS ports
# Only `./x conformance` calls this; `./x test` and `./x demo` never build the suite.
#
# Prints the directory holding them.
# Cache: ${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}/conformance-<version>-<hash of the inputs>/
# (the module, go.sum, tools.go, this script and module.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local
. "$here/module.sh"
inputs_hash="$( { effective_mod; cat go.sum tools.go build.sh module.sh; } | sha256sum | cut -c1-12)"
cache="${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}"
out="$cache/conformance-$version-$inputs_hash"
if [ -x "$out/e2e.test" ] && [ -x "$out/ginkgo" ] && [ -x "$out/agnhost" ] && [ -f "$out/localhost.crt" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: the Go toolchain is not installed" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "build.sh: building the Kubernetes $version conformance suite from Go modules into $out (cold: about 25 minutes on 2 cores)" >&2
major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
mod="$tmp/mod"
make_module "$mod"
cd "$mod"
go mod download
# agnhost runs in the test pods, whose image has no libc: a static binary.
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost
moddir="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
cp "$moddir/test/images/agnhost/porter/localhost.crt" "$moddir/test/images/agnhost/porter/localhost.key" "$tmp/"
chmod 644 "$tmp/localhost.crt" "$tmp/localhost.key"
echo "build.sh: agnhost after $(( $(date +%s) - start ))s" >&2
go build -trimpath -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
go test -c -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
cd "$here"
rm -rf "$mod"
mv "$tmp" "$out"
trap - EXIT
echo "build.sh: built in $(( $(date +%s) - start ))s: $(du -h "$out/e2e.test" | cut -f1) e2e.test, $(du -h "$out/agnhost" | cut -f1) agnhost" >&2
echo "$out"
