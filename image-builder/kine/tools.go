//go:build tools

// The kine binary the broker can keep a tenant cluster's objects in (SQLite through the etcd
// API, as k3s does), pinned by this module's go.mod and go.sum; build.sh builds it.
package tools

import _ "github.com/k3s-io/kine"
