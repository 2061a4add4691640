#!/usr/bin/env bash
# Builds what the conformance suite's test images hold beyond agnhost, from Go modules, for
# `./x conformance`, and caches it outside the repo. Each binary is the upstream image's, built
# from the module the upstream image is built from (socialweb-conformance packs them onto the
# Debian root of rootfs.sh; nothing is pulled):
#   nnp               test/images/nonewprivs (the nonewprivs image: prints its effective uid;
#                     setuid root in the image)
#   sample-apiserver  k8s.io/sample-apiserver at the staging version of the suite's module (the
#                     sample-apiserver image, which the Aggregator test registers)
#   etcd              go.etcd.io/etcd/server/v3 at the version image-builder/kubernetes embeds
#                     (the etcd image the sample-apiserver stores its objects in)
#   nautilus/         test/images/nautilus/html (the nautilus image: agnhost test-webserver
#                     serving data.json and nautilus.jpg, for kubectl's Update Demo)
#   httpd/index.html  test/images/httpd/index.html (the httpd images' page)
#   busybox           BusyBox 1.37.0 (the version of the upstream busybox image), built static
#                     from the upstream source with its default configuration, as the image
#                     Docker's busybox:1.37.0 is. Debian's own busybox will not do: Debian
#                     reverts upstream's ash keeping environment variables whose names are not
#                     shell identifiers (its installer needs that), and the ConfigMap and Secret
#                     tests pass such names (`data-1`) to `sh -c env`. The source is the
#                     pristine tarball Debian's mirror serves, checked against its SHA-256.
# Only `./x conformance` calls this.
#
# Prints the directory holding them.
# Cache: ${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}/conformance-images-<version>-<hash of the
# module, go.sum, tools.go, this script (busybox's version), module.sh and the etcd version>/
set -euo pipefail
busybox_version=1.37.0
busybox_sha256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
mirror="${SOCIALWEB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local
. "$here/module.sh"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3" {print $2; exit}' ../kubernetes/go.mod)"
[ -n "$etcd_version" ] || { echo "images.sh: no go.etcd.io/etcd/server/v3 in image-builder/kubernetes/go.mod" >&2; exit 1; }
inputs_hash="$( { effective_mod; cat go.sum tools.go images.sh module.sh; echo "$etcd_version"; } | sha256sum | cut -c1-12)"
cache="${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}"
out="$cache/conformance-images-$version-$inputs_hash"
if [ -x "$out/busybox" ] && [ -x "$out/nnp" ] && [ -x "$out/sample-apiserver" ] && [ -x "$out/etcd" ] && [ -f "$out/httpd/index.html" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "images.sh: the Go toolchain is not installed" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.images-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "images.sh: building the test images' binaries (busybox $busybox_version, nnp, sample-apiserver, etcd $etcd_version) into $out (cold: about 6 minutes)" >&2
for tool in gcc make bzip2 curl; do
  command -v "$tool" >/dev/null || { echo "images.sh: $tool is not installed (busybox is built from source)" >&2; exit 1; }
done
src="$tmp/busybox_$busybox_version.orig.tar.bz2"
curl -fsS --retry 3 -o "$src" "$mirror/pool/main/b/busybox/busybox_$busybox_version.orig.tar.bz2"
echo "$busybox_sha256  $src" | sha256sum -c --quiet - \
  || { echo "images.sh: busybox_$busybox_version.orig.tar.bz2 does not have the SHA-256 it should" >&2; exit 1; }
tar -xjf "$src" -C "$tmp"
(
  cd "$tmp/busybox-$busybox_version"
  make defconfig >"$tmp/busybox.log" 2>&1
  # Static, as the image has no libc; tc does not build against kernel headers without CBQ
  # (Linux 6.8 and later) and no test runs it.
  sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config
  make -j"$(nproc)" busybox >>"$tmp/busybox.log" 2>&1 || { tail -20 "$tmp/busybox.log" >&2; exit 1; }
  cp busybox "$tmp/busybox.bin"
)
rm -rf "$tmp/busybox-$busybox_version" "$src" "$tmp/busybox.log"
mv "$tmp/busybox.bin" "$tmp/busybox"
echo "images.sh: busybox after $(( $(date +%s) - start ))s" >&2
# The images have no libc to link against: static binaries.
export CGO_ENABLED=0
make_module "$tmp/mod"
cd "$tmp/mod"
go mod download
go build -trimpath -ldflags "-s -w" -o "$tmp/nnp" k8s.io/kubernetes/test/images/nonewprivs
go build -trimpath -ldflags "-s -w" -o "$tmp/sample-apiserver" k8s.io/sample-apiserver
moddir="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
mkdir -p "$tmp/nautilus" "$tmp/httpd"
cp "$moddir/test/images/nautilus/html/"* "$tmp/nautilus/"
cp "$moddir/test/images/httpd/index.html" "$tmp/httpd/"
chmod 644 "$tmp/nautilus/"* "$tmp/httpd/"*
# etcd's server is no dependency of the suite: its own module beside the suite's, at the
# version the Kubernetes build embeds; go.sum entries it adds are checked against the
# checksum database as usual.
mkdir "$tmp/etcd-mod"
cp go.mod go.sum "$tmp/etcd-mod/"
cd "$tmp/etcd-mod"
go mod edit -require="go.etcd.io/etcd/server/v3@$etcd_version"
go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
cd "$here"
rm -rf "$tmp/mod" "$tmp/etcd-mod"
mv "$tmp" "$out"
trap - EXIT
echo "images.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
