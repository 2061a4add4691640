//! Names: what a cluster may be called, and the names the seeds' gateway gives a DID and its
//! clusters (internal/kcpclient/names.go): `accountHash` = the first 8 characters of
//! base36(sha256(did)), and a cluster's mount path `root:<accountHash>:<cluster>:clusters`,
//! which kubeconfigs carry as `https://<front>/clusters/<mount path>`.

use std::net::{IpAddr, Ipv4Addr};

use num_bigint::BigUint;
use sha2::{Digest, Sha256};

/// A cluster name: a DNS label short enough that `<name>-<n>` node names stay labels.
pub fn valid_cluster_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "cluster name {name:?}: 1-40 characters of a-z, 0-9 and '-', not starting or ending with '-'"
        ))
    }
}

/// Where nodes' cluster addresses come from (their InternalIP, reached over the mesh): beside
/// the cluster CIDR (10.42.0.0/16) and the service CIDR (10.43.0.0/16), one /16 per cluster.
pub const NODE_RANGE: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 41, 0, 0), 16);

/// The lowest address of [`NODE_RANGE`] (past its network address) that no live node of the
/// cluster has: unique in the cluster, reused only once its node is gone.
pub fn free_node_ip(used: &[IpAddr]) -> Option<Ipv4Addr> {
    let base = u32::from(NODE_RANGE.0);
    let size = 1u32 << (32 - NODE_RANGE.1);
    (1..size - 1)
        .map(|i| Ipv4Addr::from(base + i))
        .find(|ip| !used.contains(&IpAddr::V4(*ip)))
}

/// The account hash of `did`: sha256 read as a big-endian number, written in base 36
/// (0-9a-z), first 8 characters.
pub fn account_hash(did: &str) -> String {
    let n = BigUint::from_bytes_be(&Sha256::digest(did.as_bytes()));
    n.to_str_radix(36).chars().take(8).collect()
}

/// `root:<accountHash>:<cluster>:clusters`.
pub fn mount_path(did: &str, cluster: &str) -> String {
    format!("root:{}:{cluster}:clusters", account_hash(did))
}

/// The URL path prefix of a cluster at the front.
pub fn mount_prefix(did: &str, cluster: &str) -> String {
    format!("/clusters/{}", mount_path(did, cluster))
}

/// A request path at the front, split into the mount's account hash and cluster and the
/// path the apiserver sees; `None` when the path is not under `/clusters/root:...`.
pub fn split_mount(path: &str) -> Option<(&str, &str, &str)> {
    let rest = path.strip_prefix("/clusters/root:")?;
    let (mount, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mount = mount.strip_suffix(":clusters")?;
    let (hash, cluster) = mount.split_once(':')?;
    if hash.is_empty() || cluster.is_empty() || cluster.contains(':') {
        return None;
    }
    Some((hash, cluster, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_are_the_lowest_free_ones() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(free_node_ip(&[]), Some(Ipv4Addr::new(10, 41, 0, 1)));
        assert_eq!(
            free_node_ip(&[ip("10.41.0.1"), ip("10.41.0.3")]),
            Some(Ipv4Addr::new(10, 41, 0, 2))
        );
        let all: Vec<IpAddr> = (1..65535u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(u32::from(NODE_RANGE.0) + i)))
            .collect();
        assert_eq!(free_node_ip(&all), None);
    }

    #[test]
    fn cluster_names_are_short_dns_labels() {
        for ok in ["ci", "a", "team-7", &"x".repeat(40)] {
            assert!(valid_cluster_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-ci", "ci-", "CI", "c_i", "c.i", &"x".repeat(41)] {
            assert!(
                valid_cluster_name(bad)
                    .unwrap_err()
                    .contains("1-40 characters"),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_account_hash_is_eight_base36_characters_of_the_did_digest() {
        let h = account_hash("did:plc:ewvi7nxzyoun6zhxrhs64oiz");
        assert_eq!(h.len(), 8);
        assert!(
            h.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        );
        assert_ne!(h, account_hash("did:plc:other"));
        // Python: int.from_bytes(sha256(b"did:example:alice").digest(), "big") in base 36.
        assert_eq!(account_hash("did:example:alice"), "2kndywyu");
    }

    #[test]
    fn mount_paths_split_back_into_their_parts() {
        let p = mount_prefix("did:example:alice", "ci");
        let full = format!("{p}/api/v1/namespaces");
        let (hash, cluster, tail) = split_mount(&full).unwrap();
        assert_eq!(hash, account_hash("did:example:alice"));
        assert_eq!(cluster, "ci");
        assert_eq!(tail, "/api/v1/namespaces");
        assert_eq!(split_mount(&p).unwrap().2, "/");
        assert!(split_mount("/api/v1/namespaces").is_none());
        assert!(split_mount("/clusters/root:abc:ci/api").is_none());
        assert!(split_mount("/clusters/root::ci:clusters/api").is_none());
    }
}
