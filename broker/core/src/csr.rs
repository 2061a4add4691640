//! Which certificate signing requests the broker approves in a tenant cluster (docs/security.md).
//! The controller-manager's own approver is off: a bootstrap token would get it to sign
//! `system:node:<any name>`. The broker knows which node each token was made for and which
//! address each node has, so it approves:
//!
//! - a kubelet's client certificate (`kube-apiserver-client-kubelet`) for node `n` when the
//!   request comes with the bootstrap token made for `n` -- once, and only while the token's
//!   Secret is the broker's, unchanged ([`Verdict::ApproveFirstUse`]) -- or from `n` itself
//!   (a renewal);
//! - a kubelet's serving certificate (`kubelet-serving`) for node `n` when it comes from `n`
//!   and names nothing but `n` and `n`'s address;
//!
//! and denies every other request to those signers. Requests to other signers are not its
//! business (and no tenant can approve them either: the guard refuses approvals).

use std::net::IpAddr;

/// The signers of node certificates.
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// What a CSR asks for and who asked (the request's subject and names, from its PEM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub signer: String,
    /// `spec.username`: who created the CSR.
    pub username: String,
    pub groups: Vec<String>,
    pub usages: Vec<String>,
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// Email addresses or URIs: never in a node certificate.
    pub other_names: bool,
}

/// A node the broker planned: its name, the bootstrap token made for it, its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned<'a> {
    pub node: &'a str,
    pub token_id: &'a str,
    pub node_ip: Option<IpAddr>,
}

/// The broker's answer to a CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approve(String),
    /// Approve if the bootstrap token it came with is the one the broker made (its Secret
    /// holds the broker's secret) and this is the token's first use; deny otherwise. Whoever
    /// read the token (a tenant may read kube-system) gets at most that node's one
    /// certificate, and the node then does not join.
    ApproveFirstUse(String),
    Deny(String),
    /// Not a node signer's: left alone.
    Ignore,
}

const NODES_GROUP: &str = "system:nodes";

fn subset(have: &[String], allowed: &[&str], needed: &str) -> bool {
    have.iter().all(|u| allowed.contains(&u.as_str())) && have.iter().any(|u| u == needed)
}

/// The verdict on `r`, given the live planned nodes.
pub fn judge(r: &Request, planned: &[Planned<'_>]) -> Verdict {
    match r.signer.as_str() {
        KUBELET_CLIENT => client(r, planned),
        KUBELET_SERVING => serving(r, planned),
        _ => Verdict::Ignore,
    }
}

fn node_of(r: &Request) -> Result<&str, Verdict> {
    let node = r
        .common_name
        .strip_prefix("system:node:")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Verdict::Deny(format!(
                "the subject is {:?}, not system:node:<node>",
                r.common_name
            ))
        })?;
    if r.organizations != [NODES_GROUP] {
        return Err(Verdict::Deny(format!(
            "the organization is {:?}, not [\"system:nodes\"]",
            r.organizations
        )));
    }
    Ok(node)
}

fn client(r: &Request, planned: &[Planned<'_>]) -> Verdict {
    let node = match node_of(r) {
        Ok(n) => n,
        Err(v) => return v,
    };
    let usages = ["digital signature", "key encipherment", "client auth"];
    if !subset(&r.usages, &usages, "client auth") {
        return Verdict::Deny(format!("usages {:?} are not a client's", r.usages));
    }
    if !r.dns_names.is_empty() || !r.ip_addresses.is_empty() || r.other_names {
        return Verdict::Deny("a client certificate names no hosts".into());
    }
    let Some(plan) = planned.iter().find(|p| p.node == node) else {
        return Verdict::Deny(format!("{node} is no node this broker planned"));
    };
    if let Some(token) = r.username.strip_prefix("system:bootstrap:") {
        return if token == plan.token_id {
            Verdict::ApproveFirstUse(format!("the bootstrap token made for {node}"))
        } else {
            Verdict::Deny(format!("bootstrap token {token} was not made for {node}"))
        };
    }
    if r.username == r.common_name && r.groups.iter().any(|g| g == NODES_GROUP) {
        return Verdict::Approve(format!("{node} renewing its own certificate"));
    }
    Verdict::Deny(format!(
        "{} may not ask for {node}'s client certificate",
        r.username
    ))
}

fn serving(r: &Request, planned: &[Planned<'_>]) -> Verdict {
    let node = match node_of(r) {
        Ok(n) => n,
        Err(v) => return v,
    };
    if r.username != r.common_name || !r.groups.iter().any(|g| g == NODES_GROUP) {
        return Verdict::Deny(format!(
            "{} may not ask for {node}'s serving certificate; only {node} may",
            r.username
        ));
    }
    let usages = ["digital signature", "key encipherment", "server auth"];
    if !subset(&r.usages, &usages, "server auth") {
        return Verdict::Deny(format!("usages {:?} are not a server's", r.usages));
    }
    let Some(plan) = planned.iter().find(|p| p.node == node) else {
        return Verdict::Deny(format!("{node} is no node this broker planned"));
    };
    if r.other_names || r.dns_names.iter().any(|d| d != node) {
        return Verdict::Deny(format!(
            "it names hosts other than {node}: {:?}",
            r.dns_names
        ));
    }
    if r.ip_addresses.iter().any(|ip| Some(*ip) != plan.node_ip) {
        return Verdict::Deny(format!(
            "it names addresses other than {node}'s ({:?}): {:?}",
            plan.node_ip, r.ip_addresses
        ));
    }
    // The apiserver reaches a kubelet by its address: a certificate without it would be
    // refused there (the kubelet asks again once its Node has its address).
    if let Some(ip) = plan.node_ip
        && !r.ip_addresses.contains(&ip)
    {
        return Verdict::Deny(format!("it does not name {node}'s address {ip}"));
    }
    if r.dns_names.is_empty() && r.ip_addresses.is_empty() {
        return Verdict::Deny("a serving certificate names its host".into());
    }
    Verdict::Approve(format!("{node}'s own name and address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned() -> Vec<Planned<'static>> {
        vec![
            Planned {
                node: "c-1",
                token_id: "aaaaaa",
                node_ip: Some("10.41.0.1".parse().unwrap()),
            },
            Planned {
                node: "c-2",
                token_id: "bbbbbb",
                node_ip: Some("10.41.0.2".parse().unwrap()),
            },
        ]
    }

    fn client_req(username: &str, node: &str) -> Request {
        Request {
            signer: KUBELET_CLIENT.into(),
            username: username.into(),
            groups: vec!["system:bootstrappers".into()],
            usages: vec!["digital signature".into(), "client auth".into()],
            common_name: format!("system:node:{node}"),
            organizations: vec!["system:nodes".into()],
            ..Default::default()
        }
    }

    fn serving_req(node: &str, ips: &[&str]) -> Request {
        Request {
            signer: KUBELET_SERVING.into(),
            username: format!("system:node:{node}"),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
            usages: vec!["digital signature".into(), "server auth".into()],
            common_name: format!("system:node:{node}"),
            organizations: vec!["system:nodes".into()],
            dns_names: vec![node.into()],
            ip_addresses: ips.iter().map(|i| i.parse().unwrap()).collect(),
            ..Default::default()
        }
    }

    fn approved(v: &Verdict) -> bool {
        matches!(v, Verdict::Approve(_))
    }

    #[test]
    fn a_token_gets_the_client_certificate_of_its_own_node_only() {
        let p = planned();
        assert!(matches!(
            judge(&client_req("system:bootstrap:aaaaaa", "c-1"), &p),
            Verdict::ApproveFirstUse(_)
        ));
        let v = judge(&client_req("system:bootstrap:aaaaaa", "c-2"), &p);
        assert!(
            matches!(&v, Verdict::Deny(m) if m.contains("not made for c-2")),
            "{v:?}"
        );
        let v = judge(&client_req("system:bootstrap:aaaaaa", "kube-apiserver"), &p);
        assert!(matches!(v, Verdict::Deny(_)), "{v:?}");
        let mut masters = client_req("system:bootstrap:aaaaaa", "c-1");
        masters.organizations = vec!["system:masters".into()];
        assert!(matches!(judge(&masters, &p), Verdict::Deny(_)));
        let mut renew = client_req("system:node:c-2", "c-2");
        renew.groups = vec!["system:nodes".into()];
        assert!(approved(&judge(&renew, &p)), "a node renews its own");
        let mut other = client_req("system:node:c-1", "c-2");
        other.groups = vec!["system:nodes".into()];
        assert!(
            matches!(judge(&other, &p), Verdict::Deny(_)),
            "not another node's"
        );
        let mut serving_usage = client_req("system:bootstrap:aaaaaa", "c-1");
        serving_usage.usages.push("server auth".into());
        assert!(matches!(judge(&serving_usage, &p), Verdict::Deny(_)));
        let gone = client_req("system:bootstrap:cccccc", "c-9");
        assert!(matches!(judge(&gone, &p), Verdict::Deny(_)));
    }

    #[test]
    fn a_serving_certificate_names_only_its_node_and_address() {
        let p = planned();
        assert!(approved(&judge(&serving_req("c-1", &["10.41.0.1"]), &p)));
        for bad in [
            serving_req("c-1", &["10.41.0.2"]),
            serving_req("c-1", &["10.41.0.1", "127.0.0.1"]),
            Request {
                dns_names: vec!["c-1".into(), "kubernetes.default".into()],
                ..serving_req("c-1", &["10.41.0.1"])
            },
            Request {
                username: "system:node:c-2".into(),
                ..serving_req("c-1", &["10.41.0.1"])
            },
            Request {
                usages: vec![
                    "digital signature".into(),
                    "server auth".into(),
                    "client auth".into(),
                ],
                ..serving_req("c-1", &["10.41.0.1"])
            },
            serving_req("c-9", &[]),
            serving_req("c-1", &[]),
        ] {
            assert!(matches!(judge(&bad, &p), Verdict::Deny(_)), "{bad:?}");
        }
        let other = Request {
            signer: "example.com/mine".into(),
            ..serving_req("c-1", &["10.41.0.1"])
        };
        assert_eq!(judge(&other, &p), Verdict::Ignore);
    }
}
