//! Wire contracts between the socialweb agent (on nodes) and the broker (on the operator's
//! host). Types and pure parsing only: no I/O, no async, so both sides and their fuzzers can
//! use them. Each contract is versioned and documented in `docs/`.

pub mod ca;
pub mod guest;
pub mod identity;
pub mod mesh;
pub mod seeds;
pub mod tunnel;

pub use identity::{
    BootstrapToken, BrokerEndpoint, CaTrust, IdentityError, MeshSecretKey, NodeIdentity,
};
