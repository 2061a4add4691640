//! Contract 6, the market (docs/market.md): the protocol's types, the broker's client, and
//! the local provider that boots nodes on this machine.

pub mod client;
pub mod local;
pub mod protocol;
