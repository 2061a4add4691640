#!/usr/bin/env bash
# The root filesystem of the conformance suite's test images (agnhost, jessie-dnsutils, nginx,
# httpd, nonroot, nonewprivs, nautilus, sample-apiserver, etcd, as socialweb-conformance names
# them; busybox is an image of its own): a minimal Debian made by debootstrap with the tools the
# suite's pods run (dig for the DNS probes, getent, curl, nc, ip, iptables) -- what the upstream
# agnhost image (a Debian base with these packages) holds -- and Debian's Apache httpd and nginx
# for the httpd and nginx images, configured as the upstream images are (httpd.conf, nginx.conf).
# debootstrap installs what the mirror has that day, so the result is cached as a tarball keyed
# by the package list, this script and the two configuration files, and reused from then on.
#
# Prints the path of the tarball.
# Cache: ${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}/conformance-rootfs-<hash>.tar
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
suite=bookworm
mirror="${SOCIALWEB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
packages=apache2-bin,busybox,ca-certificates,curl,dnsutils,iproute2,iptables,iputils-ping,media-types,netcat-openbsd,nginx,procps
hash="$( (cat "$here/rootfs.sh" "$here/httpd.conf" "$here/nginx.conf"; echo "$suite $packages") | sha256sum | cut -c1-12)"
cache="${SOCIALWEB_CACHE:-$HOME/.cache/socialweb}"
out="$cache/conformance-rootfs-$hash.tar"
if [ -f "$out" ]; then
  echo "$out"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "rootfs.sh: debootstrap is not installed" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.rootfs-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "rootfs.sh: debootstrap $suite ($packages) for the test images into $out (about 3 minutes)" >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$tmp/root" "$mirror" >"$tmp/log" 2>&1 \
  || { tail -20 "$tmp/log" >&2; exit 1; }
# What a container does not need: package caches, docs, the apt lists.
rm -rf "$tmp/root/var/cache/apt/"* "$tmp/root/var/lib/apt/lists/"* \
  "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/locale" \
  "$tmp/root/var/log/"*
# httpd and nginx as the upstream images lay them out; their pages come with the images
# (socialweb-conformance adds httpd's from the module).
install -D -m 644 "$here/httpd.conf" "$tmp/root/usr/local/apache2/conf/httpd.conf"
mkdir -p "$tmp/root/usr/local/apache2/htdocs" "$tmp/root/usr/share/nginx/html"
install -m 644 "$here/nginx.conf" "$tmp/root/etc/nginx/nginx.conf"
rm -rf "$tmp/root/etc/nginx/sites-enabled" "$tmp/root/etc/nginx/conf.d"
printf '<html><body><h1>Welcome to nginx!</h1></body></html>\n' >"$tmp/root/usr/share/nginx/html/index.html"
# Containers get /etc/hosts, /etc/resolv.conf and /etc/hostname from the kubelet.
: >"$tmp/root/etc/hostname"
tar --numeric-owner --sort=name --mtime=@0 -C "$tmp/root" -cf "$tmp/rootfs.tar" .
mv "$tmp/rootfs.tar" "$out"
echo "rootfs.sh: built in $(( $(date +%s) - start ))s: $(du -h "$out" | cut -f1)" >&2
echo "$out"
