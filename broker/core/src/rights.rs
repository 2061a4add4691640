//! What a tenant may do in its own cluster (docs/security.md, "A tenant's rights"): a list of
//! rights, granted, not cluster-admin less a list of exceptions. The owners' group is bound
//! to the ClusterRole [`ROLE`], whose rules [`tenant_rules`] makes from what the cluster's
//! apiserver serves (its discovery) and which API groups are the tenant's own:
//!
//! - every namespaced resource of Kubernetes' own groups, with every subresource, by the verbs
//!   of [`WRITE`] (not `bind`, `escalate`: RBAC's escalation check then keeps a tenant from
//!   granting anyone more than it holds) and `impersonate` of ServiceAccounts;
//! - the cluster-scoped kinds of [`CLUSTER_GRANTS`], each with its verbs and why; every other
//!   cluster-scoped kind of Kubernetes' own groups read-only ([`READ`]), subresources not at
//!   all (a `nodes/proxy` read is the kubelet's whole API);
//! - every resource of the groups the tenant brought (its CRDs and aggregated APIs): groups
//!   no APIService the apiserver made at start (`onstart`) serves ([`tenant_groups`]), at
//!   most [`MAX_TENANT_GROUPS`] of them;
//! - impersonation of users, groups, uids and extras (the guard allows only the tenant's own
//!   names: `socialweb_broker_core::guard`), and the apiserver's public non-resource paths.
//!
//! What RBAC cannot say stays with the guard (the control plane's namespaces, names) and
//! admission (a label's value, a field).

use std::collections::{BTreeMap, BTreeSet};

/// The ClusterRole the owners' group is bound to (`broker/deploy/access.yaml`).
pub const ROLE: &str = "socialweb:tenant";

/// The verbs a tenant has on what it may write.
pub const WRITE: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The verbs a tenant has on what it may only read.
pub const READ: [&str; 3] = ["get", "list", "watch"];

/// The most API groups of its own a tenant's role lists: a tenant that registers more (by
/// CRDs or APIServices) gets no rights in the rest (said in `socialweb-broker`'s log). A budget: every group is a line of the role, read on every request.
pub const MAX_TENANT_GROUPS: usize = 256;

/// A cluster-scoped kind (or subresource) a tenant may write, and why it needs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterGrant {
    pub group: &'static str,
    /// The plural, or `plural/subresource`.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub why: &'static str,
}

const CRUD: &[&str] = &WRITE;
/// Every write verb but `deletecollection` (namespaces have none).
const CRUD_ONE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The cluster-scoped kinds a tenant may write. Everything cluster-scoped that is not here is
/// read-only to a tenant (nodes' subresources, but for metrics, not even that). The table in
/// docs/security.md lists each of Kubernetes' cluster-scoped kinds with who writes it, and a
/// test keeps the two and the live role in step.
pub const CLUSTER_GRANTS: &[ClusterGrant] = &[
    ClusterGrant {
        group: "",
        resource: "namespaces",
        verbs: CRUD_ONE,
        why: "a tenant's own namespaces; not their status or finalize subresources, and the \
              control plane's namespaces are the guard's",
    },
    ClusterGrant {
        group: "",
        resource: "nodes",
        verbs: &["get", "list", "watch", "update", "patch"],
        why: "labels, taints and cordons on its nodes; not their status, and no node is made \
              or deleted but by the broker and the node itself",
    },
    ClusterGrant {
        group: "",
        resource: "nodes/metrics",
        verbs: &["get"],
        why: "metrics-server and Prometheus read kubelets' metrics",
    },
    ClusterGrant {
        group: "",
        resource: "nodes/stats",
        verbs: &["get"],
        why: "metrics-server reads kubelets' summaries",
    },
    ClusterGrant {
        group: "",
        resource: "persistentvolumes",
        verbs: CRUD,
        why: "static and CSI-provisioned volumes (on namespace nodes only csi, by admission)",
    },
    ClusterGrant {
        group: "apiextensions.k8s.io",
        resource: "customresourcedefinitions",
        verbs: CRUD,
        why: "its own kinds (operators, CI tools); their groups become its own",
    },
    ClusterGrant {
        group: "apiregistration.k8s.io",
        resource: "apiservices",
        verbs: CRUD,
        why: "aggregated APIs of its own groups and the metrics groups only (the guard and \
              the socialweb-apiservices policy)",
    },
    ClusterGrant {
        group: "rbac.authorization.k8s.io",
        resource: "clusterroles",
        verbs: CRUD,
        why: "roles for its controllers, within its own rights (RBAC's escalation check)",
    },
    ClusterGrant {
        group: "rbac.authorization.k8s.io",
        resource: "clusterrolebindings",
        verbs: CRUD,
        why: "bindings of roles it holds (RBAC's escalation check)",
    },
    ClusterGrant {
        group: "admissionregistration.k8s.io",
        resource: "validatingwebhookconfigurations",
        verbs: CRUD,
        why: "its admission webhooks (called through the cluster's egress only)",
    },
    ClusterGrant {
        group: "admissionregistration.k8s.io",
        resource: "mutatingwebhookconfigurations",
        verbs: CRUD,
        why: "its admission webhooks (called through the cluster's egress only)",
    },
    ClusterGrant {
        group: "admissionregistration.k8s.io",
        resource: "validatingadmissionpolicies",
        verbs: CRUD,
        why: "policies of its own; the broker's socialweb-* ones are the guard's",
    },
    ClusterGrant {
        group: "admissionregistration.k8s.io",
        resource: "validatingadmissionpolicybindings",
        verbs: CRUD,
        why: "bindings of its own; the broker's socialweb-* ones are the guard's",
    },
    ClusterGrant {
        group: "certificates.k8s.io",
        resource: "certificatesigningrequests",
        verbs: CRUD,
        why: "requests for its own signers; approval is the broker's (for nodes) alone",
    },
    ClusterGrant {
        group: "scheduling.k8s.io",
        resource: "priorityclasses",
        verbs: CRUD,
        why: "priorities of its workloads (GitLab's pause Pods at -10)",
    },
    ClusterGrant {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: CRUD,
        why: "its provisioners' classes",
    },
    ClusterGrant {
        group: "storage.k8s.io",
        resource: "csidrivers",
        verbs: CRUD,
        why: "its CSI drivers (on namespace nodes their node plugins are refused by admission)",
    },
    ClusterGrant {
        group: "storage.k8s.io",
        resource: "volumeattachments",
        verbs: CRUD,
        why: "its CSI attachers",
    },
    ClusterGrant {
        group: "networking.k8s.io",
        resource: "ingressclasses",
        verbs: CRUD,
        why: "its ingress controllers' classes",
    },
    ClusterGrant {
        group: "node.k8s.io",
        resource: "runtimeclasses",
        verbs: CRUD,
        why: "runtime handlers of its nodes (only runc is installed)",
    },
    ClusterGrant {
        group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
        why: "delegated authentication of its aggregated APIs and webhooks",
    },
    ClusterGrant {
        group: "authentication.k8s.io",
        resource: "selfsubjectreviews",
        verbs: &["create"],
        why: "kubectl auth whoami",
    },
    ClusterGrant {
        group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        verbs: &["create"],
        why: "delegated authorization of its aggregated APIs and webhooks",
    },
    ClusterGrant {
        group: "authorization.k8s.io",
        resource: "selfsubjectaccessreviews",
        verbs: &["create"],
        why: "kubectl auth can-i",
    },
    ClusterGrant {
        group: "authorization.k8s.io",
        resource: "selfsubjectrulesreviews",
        verbs: &["create"],
        why: "kubectl auth can-i --list",
    },
];

/// Impersonation's pseudo-resources: granted by RBAC, narrowed by the guard to the tenant's
/// own names (`socialweb_broker_core::guard`).
pub const IMPERSONATION: &[(&str, &str)] = &[
    ("", "users"),
    ("", "groups"),
    ("authentication.k8s.io", "uids"),
    ("authentication.k8s.io", "userextras/*"),
];

/// The apiserver's non-resource paths a tenant may read: discovery, health, version, OpenAPI,
/// service-account issuer discovery, and metrics. Not `/logs` (the operator host's log
/// directory) nor `/debug`.
pub const NON_RESOURCE_READS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/healthz/*",
    "/livez",
    "/livez/*",
    "/readyz",
    "/readyz/*",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
    "/.well-known/openid-configuration",
    "/openid/v1/jwks",
    "/metrics",
    "/metrics/slis",
];

/// What Kubernetes' own `admin`, `edit` and `view` roles name beyond what the apiserver
/// serves as namespaced (the `extensions` group and `deployments/rollback`, served no more)
/// and a read of `namespaces/status`: granted so that a tenant may bind those roles in its
/// namespaces, since it grants only what it holds. Nothing is served under the old names.
pub const BINDABLE_EXTRAS: &[(&str, &[&str], &[&str])] = &[
    (
        "extensions",
        &[
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/rollback",
            "deployments/scale",
            "deployments/status",
            "ingresses",
            "ingresses/status",
            "networkpolicies",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "replicationcontrollers/scale",
        ],
        &WRITE,
    ),
    ("apps", &["deployments/rollback"], &WRITE),
    ("", &["namespaces/status"], &READ),
];

/// A resource the apiserver serves, as its discovery says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub group: String,
    /// The plural.
    pub resource: String,
    pub namespaced: bool,
    pub subresources: Vec<String>,
}

/// An APIService, as [`tenant_groups`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServiceView {
    /// `<version>.<group>` (`v1.` for the core group).
    pub name: String,
    /// Its `kube-aggregator.kubernetes.io/automanaged` label: `onstart` for the groups the
    /// apiserver serves itself, `true` for CRDs'; none for an aggregated API.
    pub automanaged: Option<String>,
}

impl ApiServiceView {
    fn group(&self) -> &str {
        self.name.split_once('.').map(|(_, g)| g).unwrap_or("")
    }
}

/// An RBAC PolicyRule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

impl Rule {
    fn on(groups: &[&str], resources: &[String], verbs: &[&str]) -> Rule {
        Rule {
            api_groups: groups.iter().map(|g| g.to_string()).collect(),
            resources: resources.to_vec(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            non_resource_urls: Vec::new(),
        }
    }
}

/// The groups Kubernetes serves itself: those of an APIService the apiserver made at start.
pub fn builtin_groups(apiservices: &[ApiServiceView]) -> BTreeSet<String> {
    apiservices
        .iter()
        .filter(|a| a.automanaged.as_deref() == Some("onstart"))
        .map(|a| a.group().to_string())
        .collect()
}

/// The groups a tenant brought: every group of an APIService (a CRD's, or an aggregated
/// API's) that the apiserver does not serve itself, the first [`MAX_TENANT_GROUPS`] in name
/// order; and how many were left out. The metrics groups are the tenant's before it serves
/// them: metrics-server's manifest grants readers of `metrics.k8s.io` before it registers the
/// APIService, and a tenant may grant only what it holds.
pub fn tenant_groups(apiservices: &[ApiServiceView]) -> (BTreeSet<String>, usize) {
    let builtin = builtin_groups(apiservices);
    let mut all: BTreeSet<String> = apiservices
        .iter()
        .map(|a| a.group().to_string())
        .filter(|g| !g.is_empty() && !builtin.contains(g))
        .collect();
    let metrics = crate::guard::AGGREGATED_K8S_GROUPS.map(str::to_string);
    all.retain(|g| !metrics.contains(g));
    let left_out = all.len().saturating_sub(MAX_TENANT_GROUPS - metrics.len());
    let mut groups: BTreeSet<String> = all
        .into_iter()
        .take(MAX_TENANT_GROUPS - metrics.len())
        .collect();
    groups.extend(metrics.into_iter().filter(|g| !builtin.contains(g)));
    (groups, left_out)
}

/// The tenant's role: its rules, in a stable order (so that the broker writes it only when
/// it changed), given what the apiserver serves and the tenant's own groups.
pub fn tenant_rules(served: &[Served], tenant: &BTreeSet<String>) -> Vec<Rule> {
    let strings = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // By group: namespaced resources with their subresources, and cluster-scoped ones.
    let mut namespaced: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut cluster: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for s in served.iter().filter(|s| !tenant.contains(&s.group)) {
        if s.namespaced {
            let set = namespaced.entry(&s.group).or_default();
            set.insert(s.resource.clone());
            set.extend(
                s.subresources
                    .iter()
                    .map(|sub| format!("{}/{sub}", s.resource)),
            );
        } else {
            cluster
                .entry(&s.group)
                .or_default()
                .insert(s.resource.clone());
        }
    }
    let mut rules = Vec::new();
    for (group, resources) in &namespaced {
        let resources: Vec<String> = resources.iter().cloned().collect();
        rules.push(Rule::on(&[group], &resources, &WRITE));
    }
    for (group, resources, verbs) in BINDABLE_EXTRAS {
        rules.push(Rule::on(&[group], &strings(resources), verbs));
    }
    // A tenant's own ServiceAccounts, as `kubectl --as=system:serviceaccount:...` does.
    rules.push(Rule::on(
        &[""],
        &strings(&["serviceaccounts"]),
        &["impersonate"],
    ));
    for (group, resources) in &cluster {
        let resources: Vec<String> = resources.iter().cloned().collect();
        rules.push(Rule::on(&[group], &resources, &READ));
    }
    // The grants, one rule per group and verb list.
    let mut grants: BTreeMap<(&str, Vec<String>), BTreeSet<String>> = BTreeMap::new();
    for g in CLUSTER_GRANTS {
        grants
            .entry((g.group, strings(g.verbs)))
            .or_default()
            .insert(g.resource.to_string());
    }
    for ((group, verbs), resources) in grants {
        let resources: Vec<String> = resources.into_iter().collect();
        let verbs: Vec<&str> = verbs.iter().map(String::as_str).collect();
        rules.push(Rule::on(&[group], &resources, &verbs));
    }
    let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (group, resource) in IMPERSONATION {
        by_group
            .entry(group)
            .or_default()
            .push(resource.to_string());
    }
    for (group, resources) in by_group {
        rules.push(Rule::on(&[group], &resources, &["impersonate"]));
    }
    if !tenant.is_empty() {
        let groups: Vec<&str> = tenant.iter().map(String::as_str).collect();
        rules.push(Rule::on(&groups, &strings(&["*"]), &WRITE));
    }
    rules.push(Rule {
        api_groups: Vec::new(),
        resources: Vec::new(),
        verbs: strings(&["get"]),
        non_resource_urls: strings(NON_RESOURCE_READS),
    });
    rules
}

/// Whether `rules` let a tenant `verb` the cluster-scoped `resource` (`plural` or
/// `plural/subresource`) of `group`, as RBAC matches them (wildcards included).
pub fn allows(rules: &[Rule], group: &str, resource: &str, verb: &str) -> bool {
    let one = |xs: &[String], x: &str| xs.iter().any(|y| y == "*" || y == x);
    let resource_matches = |rs: &[String]| {
        rs.iter().any(|r| {
            r == "*"
                || r == resource
                || r.strip_suffix("/*")
                    .is_some_and(|p| resource.split_once('/').is_some_and(|(q, _)| q == p))
                || r.strip_prefix("*/")
                    .is_some_and(|s| resource.split_once('/').is_some_and(|(_, sub)| sub == s))
        })
    };
    rules.iter().any(|r| {
        r.non_resource_urls.is_empty()
            && one(&r.api_groups, group)
            && resource_matches(&r.resources)
            && one(&r.verbs, verb)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(group: &str, resource: &str, namespaced: bool, subs: &[&str]) -> Served {
        Served {
            group: group.into(),
            resource: resource.into(),
            namespaced,
            subresources: subs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn apiservice(name: &str, automanaged: Option<&str>) -> ApiServiceView {
        ApiServiceView {
            name: name.into(),
            automanaged: automanaged.map(str::to_string),
        }
    }

    fn world() -> (Vec<Served>, BTreeSet<String>) {
        let served = vec![
            served("", "pods", true, &["exec", "log", "status", "eviction"]),
            served("", "secrets", true, &[]),
            served("", "namespaces", false, &["status", "finalize"]),
            served("", "nodes", false, &["status", "proxy"]),
            served("", "persistentvolumes", false, &["status"]),
            served("apps", "deployments", true, &["scale", "status"]),
            served("rbac.authorization.k8s.io", "clusterroles", false, &[]),
            served("rbac.authorization.k8s.io", "roles", true, &[]),
            served("flowcontrol.apiserver.k8s.io", "flowschemas", false, &[]),
            served(
                "certificates.k8s.io",
                "certificatesigningrequests",
                false,
                &["approval"],
            ),
            served("example.com", "widgets", false, &["status"]),
        ];
        let (tenant, left_out) = tenant_groups(&[
            apiservice("v1.", Some("onstart")),
            apiservice("v1.apps", Some("onstart")),
            apiservice("v1.rbac.authorization.k8s.io", Some("onstart")),
            apiservice("v1.flowcontrol.apiserver.k8s.io", Some("onstart")),
            apiservice("v1.certificates.k8s.io", Some("onstart")),
            apiservice("v1.example.com", Some("true")),
            apiservice("v1beta1.metrics.k8s.io", None),
        ]);
        assert_eq!(left_out, 0);
        (served, tenant)
    }

    #[test]
    fn the_tenants_groups_are_those_the_apiserver_does_not_serve_itself() {
        let (_, tenant) = world();
        assert_eq!(
            tenant.into_iter().collect::<Vec<_>>(),
            [
                "custom.metrics.k8s.io",
                "example.com",
                "external.metrics.k8s.io",
                "metrics.k8s.io"
            ]
        );
        // A CRD in a group Kubernetes serves does not make the group the tenant's.
        let (tenant, _) = tenant_groups(&[
            apiservice("v1.storage.k8s.io", Some("onstart")),
            apiservice("v9.storage.k8s.io", Some("true")),
        ]);
        assert!(!tenant.contains("storage.k8s.io"));
    }

    #[test]
    fn a_tenant_gets_at_most_so_many_groups_of_its_own() {
        let many: Vec<ApiServiceView> = (0..MAX_TENANT_GROUPS + 5)
            .map(|i| apiservice(&format!("v1.g{i:04}.example.com"), Some("true")))
            .collect();
        let (tenant, left_out) = tenant_groups(&many);
        assert_eq!((tenant.len(), left_out), (MAX_TENANT_GROUPS, 8));
        assert!(tenant.contains("metrics.k8s.io"));
    }

    #[test]
    fn everything_namespaced_and_the_listed_cluster_kinds_are_writable_nothing_else() {
        let (served, tenant) = world();
        let rules = tenant_rules(&served, &tenant);
        for (group, resource, verb) in [
            ("", "pods", "create"),
            ("", "pods/exec", "create"),
            ("", "pods/eviction", "create"),
            ("", "secrets", "deletecollection"),
            ("apps", "deployments/scale", "update"),
            ("rbac.authorization.k8s.io", "roles", "create"),
            ("", "namespaces", "create"),
            ("", "nodes", "patch"),
            ("rbac.authorization.k8s.io", "clusterroles", "create"),
            (
                "certificates.k8s.io",
                "certificatesigningrequests",
                "create",
            ),
            ("example.com", "widgets", "create"),
            ("example.com", "widgets/status", "update"),
            ("metrics.k8s.io", "nodes", "get"),
            ("", "users", "impersonate"),
            ("", "serviceaccounts", "impersonate"),
        ] {
            assert!(
                allows(&rules, group, resource, verb),
                "{verb} {group}/{resource}"
            );
        }
        for (group, resource, verb) in [
            ("", "namespaces/status", "update"),
            ("", "namespaces/finalize", "update"),
            ("", "nodes/status", "patch"),
            ("", "nodes/proxy", "get"),
            ("", "nodes", "create"),
            ("", "nodes", "delete"),
            ("", "persistentvolumes/status", "update"),
            ("flowcontrol.apiserver.k8s.io", "flowschemas", "create"),
            ("rbac.authorization.k8s.io", "clusterroles", "escalate"),
            ("rbac.authorization.k8s.io", "clusterroles", "bind"),
            ("rbac.authorization.k8s.io", "roles", "bind"),
            (
                "certificates.k8s.io",
                "certificatesigningrequests/approval",
                "update",
            ),
            ("certificates.k8s.io", "signers", "approve"),
            ("", "pods", "escalate"),
        ] {
            assert!(
                !allows(&rules, group, resource, verb),
                "{verb} {group}/{resource} allowed"
            );
        }
        // Reads of cluster-scoped kinds it may not write.
        assert!(allows(
            &rules,
            "flowcontrol.apiserver.k8s.io",
            "flowschemas",
            "list"
        ));
    }

    #[test]
    fn no_rule_is_a_wildcard_over_kubernetes_own_groups() {
        let (served, tenant) = world();
        for r in tenant_rules(&served, &tenant) {
            assert!(!r.api_groups.iter().any(|g| g == "*"), "{r:?}");
            assert!(!r.verbs.iter().any(|v| v == "*"), "{r:?}");
            if r.resources.iter().any(|x| x == "*") {
                assert!(r.api_groups.iter().all(|g| tenant.contains(g)), "{r:?}");
            }
        }
    }

    #[test]
    fn the_role_is_the_same_whatever_order_discovery_gives() {
        let (mut served, tenant) = world();
        let a = tenant_rules(&served, &tenant);
        served.reverse();
        assert_eq!(a, tenant_rules(&served, &tenant));
    }

    #[test]
    fn every_grant_names_a_cluster_kind_once() {
        let mut seen = BTreeSet::new();
        for g in CLUSTER_GRANTS {
            assert!(seen.insert((g.group, g.resource)), "{g:?} twice");
            assert!(!g.verbs.is_empty() && !g.why.is_empty(), "{g:?}");
            for v in g.verbs {
                assert!(
                    WRITE.contains(v),
                    "{g:?}: {v} is not a verb a tenant is given"
                );
            }
        }
    }
}
