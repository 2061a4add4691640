# Sourced by build.sh and images.sh: the Go module the conformance suite and its test images'
# binaries are built from -- go.mod here (which pins the same k8s.io/kubernetes as
# image-builder/kubernetes, checked, and has no replace lines of its own, refused) with
# image-builder/kubernetes/go.mod's replace lines (the staging modules at the release's
# versions), so the two cannot drift.
# Needs $here (this directory). Sets $version; defines effective_mod (prints that go.mod) and
# make_module DIR (writes the module with go.sum and tools.go into DIR).
version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
[ -n "$version" ] || { echo "conformance: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
kube_version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/../kubernetes/go.mod")"
[ "$version" = "$kube_version" ] || {
  echo "conformance: go.mod pins k8s.io/kubernetes $version but image-builder/kubernetes pins $kube_version" >&2
  exit 1
}
if grep -q '^replace\|^replace (' "$here/go.mod"; then
  echo "conformance: go.mod has replace lines of its own; they come from image-builder/kubernetes/go.mod" >&2
  exit 1
fi
replaces() {
  awk '/^replace \(/ {block=1; next} block && /^\)/ {block=0; next}
       block && NF {print "replace " $0} /^replace [^(]/ {print}' "$here/../kubernetes/go.mod"
}
[ -n "$(replaces)" ] || { echo "conformance: no replace lines in image-builder/kubernetes/go.mod" >&2; exit 1; }
effective_mod() { cat "$here/go.mod"; echo; replaces; }
make_module() {
  mkdir -p "$1"
  effective_mod >"$1/go.mod"
  cp "$here/go.sum" "$here/tools.go" "$1/"
}
