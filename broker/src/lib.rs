//! `socialweb-broker`: the operator's daemon. This library holds what the daemon and the test
//! fixture share, so that the clusters tests run are configured exactly as tenant clusters are.
//!
//! - [`control_plane`]: how a tenant control plane is configured (component flags, the
//!   manifests nodes need to join, bootstrap tokens).

pub mod control_plane;
