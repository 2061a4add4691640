//! Contract 7, the scale decision: a pure [`decision`] and the [`driver`] that feeds it from
//! the cluster's watches and acts on it (docs/scale.md).

pub mod decision;
pub mod driver;
