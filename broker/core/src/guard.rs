//! What RBAC cannot say, for a tenant's cluster (docs/security.md, "A tenant's rights"). A
//! tenant's rights are the ClusterRole of [`crate::rights`]; this is the authorization
//! webhook (the guard) the apiserver asks before RBAC, for requests its match conditions
//! select -- [`match_conditions`], the same rules in CEL -- and it answers with [`refuse`]:
//!
//! - the control plane's namespaces ([`CONTROL_NAMESPACES`]) are read-only to everyone but
//!   the control plane ([`control_plane`]): their ServiceAccounts are the controllers' (a
//!   token for one is the controller's rights), their Secrets the nodes' bootstrap tokens,
//!   their ConfigMaps the broker's (nodes' addresses, the datastore quota's state);
//! - impersonation only of the tenant's own names: no `system:` user, no `system:` group but
//!   `system:authenticated` and a tenant namespace's ServiceAccounts', no extra of the
//!   `kubernetes.io` domains (the apiserver's own);
//! - the broker's admission policies (`socialweb-*`) are read, never written;
//! - certificate signing requests are approved by the broker alone (for a node, its own
//!   name); an approved `kube-apiserver-client` CSR for `system:masters` would pass every
//!   authorizer;
//! - APIServices of Kubernetes' own groups and the broker's ([`aggregatable`]) are the
//!   apiserver's: repointed at a tenant's Service, its own policy informers and signers would
//!   read the tenant's answers.
//!
//! RBAC grants none of these to a tenant except what the guard narrows (namespaced rights in
//! every namespace, impersonation, policies and APIServices); the guard never allows.
//! `system:masters` (the broker's own admin) is allowed before any webhook.

/// The resource attributes of an authorization request (SubjectAccessReview), empty strings
/// for what is absent, and who asks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub user: &'a str,
    pub groups: &'a [String],
}

/// The prefix of the broker's own objects in a tenant cluster.
pub const PROTECTED_PREFIX: &str = "socialweb-";

/// The control plane's namespaces: read-only to tenants.
pub const CONTROL_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// The verbs a tenant has in the control plane's namespaces.
pub const READS: [&str; 3] = ["get", "list", "watch"];

/// Users of the control plane itself.
pub const CONTROL_USERS: [&str; 3] = [
    "system:kube-controller-manager",
    "system:kube-scheduler",
    "system:apiserver",
];
/// Prefixes of the control plane's other users: nodes, the controllers' ServiceAccounts
/// (`--use-service-account-credentials`), bootstrap tokens (which only the broker makes).
pub const CONTROL_USER_PREFIXES: [&str; 3] = [
    "system:node:",
    "system:serviceaccount:kube-system:",
    "system:bootstrap:",
];
/// Nodes' group (the Node authorizer's; nodes' own names come from the broker's approver).
pub const NODES_GROUP: &str = "system:nodes";

/// The `system:` groups a tenant may impersonate (besides a tenant namespace's
/// ServiceAccounts' `system:serviceaccounts:<namespace>`).
pub const IMPERSONABLE_SYSTEM_GROUPS: [&str; 2] =
    ["system:authenticated", "system:serviceaccounts"];
const SA_GROUP_PREFIX: &str = "system:serviceaccounts:";

/// Whether `user` (in `groups`) is the control plane's: its components, nodes, the
/// controllers' ServiceAccounts, bootstrap tokens. Everyone else is the tenant's (its users,
/// its ServiceAccounts, whoever it impersonates).
pub fn control_plane(user: &str, groups: &[String]) -> bool {
    groups.iter().any(|g| g == NODES_GROUP)
        || CONTROL_USERS.contains(&user)
        || CONTROL_USER_PREFIXES.iter().any(|p| user.starts_with(p))
}

/// Whether a tenant may impersonate `name` as a `resource` (`users`, `groups`,
/// `userextras` with the extra's key as `subresource`).
fn impersonable(resource: &str, subresource: &str, name: &str) -> bool {
    match resource {
        "users" => !name.starts_with("system:"),
        "groups" => {
            !name.starts_with("system:")
                || IMPERSONABLE_SYSTEM_GROUPS.contains(&name)
                || name
                    .strip_prefix(SA_GROUP_PREFIX)
                    .is_some_and(|ns| !ns.is_empty() && !CONTROL_NAMESPACES.contains(&ns))
        }
        "userextras" => !kubernetes_domain(subresource),
        _ => true,
    }
}

/// An extra's key of the `kubernetes.io` domains (`authentication.kubernetes.io/pod-name`).
fn kubernetes_domain(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(domain, _)| domain == "kubernetes.io" || domain.ends_with(".kubernetes.io"))
}

const POLICIES: [&str; 2] = [
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
];
const WRITES: [&str; 4] = ["update", "patch", "delete", "deletecollection"];
/// Not `create`: an authorization request to create carries no name (the object's is in the
/// body). The broker's `socialweb-apiservices` admission policy checks a created APIService's
/// name with the same rule; an APIService of a group the apiserver serves exists already.
const APISERVICE_WRITES: [&str; 4] = ["update", "patch", "delete", "deletecollection"];

/// The groups outside Kubernetes' own that are Kubernetes-named but made to be served by an
/// aggregated API (metrics-server, Prometheus adapters, KEDA).
pub const AGGREGATED_K8S_GROUPS: [&str; 3] = [
    "metrics.k8s.io",
    "custom.metrics.k8s.io",
    "external.metrics.k8s.io",
];

/// The broker's own API group (the tenant's NodePool, which the broker reads): a CRD's, never
/// an aggregated API a tenant's Pod would answer.
pub const BROKER_GROUP: &str = "socialweb.computer";

/// Whether a tenant may register (or repoint) the APIService `name` (`<version>.<group>`): an
/// allow-list. Its group must have a dot (the core group and `apps`, `batch`, `policy`,
/// `autoscaling` have none) and be outside the names Kubernetes reserves for itself
/// (`*.k8s.io`, `*.kubernetes.io`), except the metrics groups, and not the broker's.
pub fn aggregatable(name: &str) -> bool {
    let Some((_version, group)) = name.split_once('.') else {
        return false;
    };
    let reserved = |g: &str| {
        g == "k8s.io"
            || g.ends_with(".k8s.io")
            || g == "kubernetes.io"
            || g.ends_with(".kubernetes.io")
            || g == BROKER_GROUP
    };
    group.contains('.') && (AGGREGATED_K8S_GROUPS.contains(&group) || !reserved(group))
}

/// Why the request is refused, or `None`: no opinion (the next authorizer decides).
pub fn refuse(r: &Request<'_>) -> Option<&'static str> {
    if CONTROL_NAMESPACES.contains(&r.namespace)
        && !READS.contains(&r.verb)
        && !control_plane(r.user, r.groups)
    {
        return Some(
            "the control plane's namespaces (kube-system, kube-public, kube-node-lease) are \
             read-only to tenants: their ServiceAccounts are the controllers', their Secrets \
             nodes' bootstrap tokens (docs/security.md)",
        );
    }
    // Their status is the controller-manager's to write (its policy status controller).
    let policy = r.group == "admissionregistration.k8s.io"
        && POLICIES.contains(&r.resource)
        && r.subresource.is_empty();
    if policy
        && WRITES.contains(&r.verb)
        && (r.verb == "deletecollection" || r.name.starts_with(PROTECTED_PREFIX))
    {
        return Some(
            "the broker's admission policies keep Pods off the provider host's kernel and root \
             (docs/security.md); no tenant may change or delete them",
        );
    }
    let certs = r.group == "certificates.k8s.io";
    if (certs && r.resource == "certificatesigningrequests" && r.subresource == "approval")
        || (certs && r.resource == "signers" && r.verb == "approve")
    {
        return Some(
            "only the broker approves certificate signing requests in this cluster (a node's, \
             for its own name); users get client certificates from getKubeconfig",
        );
    }
    if r.group == "apiregistration.k8s.io"
        && r.resource == "apiservices"
        && APISERVICE_WRITES.contains(&r.verb)
        && !aggregatable(r.name)
    {
        return Some(
            "APIServices of Kubernetes' own groups and the broker's (and every \
             deletecollection) are the apiserver's: a tenant may register only its own groups \
             and the metrics groups (docs/security.md)",
        );
    }
    let impersonation = r.verb == "impersonate"
        && ((r.group.is_empty() && matches!(r.resource, "users" | "groups"))
            || (r.group == "authentication.k8s.io" && r.resource == "userextras"));
    if impersonation && !impersonable(r.resource, r.subresource, r.name) {
        return Some(
            "a tenant impersonates only its own users, groups and ServiceAccounts: no system: \
             user (a node, a bootstrap token, the control plane), no system: group but \
             system:authenticated and its namespaces' ServiceAccounts, no kubernetes.io extra \
             (docs/security.md)",
        );
    }
    None
}

/// A CEL string field of `request.resourceAttributes`, '' when absent (an absent field is
/// an error in CEL, and an error under failurePolicy Deny denies everything).
fn field(f: &str) -> String {
    format!("(has(request.resourceAttributes.{f}) ? request.resourceAttributes.{f} : '')")
}

/// [`refuse`]'s rules as the webhook's match conditions (all must hold for the webhook to be
/// asked): a resource request, and one of the refused kinds. Impersonation is selected a
/// little wider (any `system:` name, any `kubernetes.io` extra) and decided by [`refuse`].
pub fn match_conditions() -> Vec<String> {
    let (verb, group, resource, sub, name) = (
        field("verb"),
        field("group"),
        field("resource"),
        field("subresource"),
        field("name"),
    );
    let list = |xs: &[&str]| {
        format!(
            "[{}]",
            xs.iter()
                .map(|x| format!("'{x}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let user = "(has(request.user) ? request.user : '')";
    let control = format!(
        "((has(request.groups) && request.groups.exists(g, g == '{NODES_GROUP}')) || {user} in {} \
         || {})",
        list(&CONTROL_USERS),
        CONTROL_USER_PREFIXES
            .iter()
            .map(|p| format!("{user}.startsWith('{p}')"))
            .collect::<Vec<_>>()
            .join(" || ")
    );
    let namespace = field("namespace");
    let namespaces = format!(
        "({namespace} in {} && !({verb} in {}) && !{control})",
        list(&CONTROL_NAMESPACES),
        list(&READS)
    );
    let policy = format!(
        "({group} == 'admissionregistration.k8s.io' && {resource} in {} && {sub} == '' && \
         {verb} in {} && ({verb} == 'deletecollection' || {name}.startsWith('{PROTECTED_PREFIX}')))",
        list(&POLICIES),
        list(&WRITES)
    );
    let approval = format!(
        "({group} == 'certificates.k8s.io' && (({resource} == 'certificatesigningrequests' && \
         {sub} == 'approval') || ({resource} == 'signers' && {verb} == 'approve')))"
    );
    let impersonation = format!(
        "({verb} == 'impersonate' && ((({group} == '' && {resource} in ['users', 'groups']) \
         && {name}.startsWith('system:')) || ({group} == 'authentication.k8s.io' && \
         {resource} == 'userextras' && {sub}.contains('kubernetes.io/'))))"
    );
    // Every write of an APIService goes to the guard, which applies [`aggregatable`].
    let apiservices = format!(
        "({group} == 'apiregistration.k8s.io' && {resource} == 'apiservices' && {verb} in {})",
        list(&APISERVICE_WRITES)
    );
    vec![
        "has(request.resourceAttributes)".to_string(),
        format!("{namespaces} || {policy} || {approval} || {impersonation} || {apiservices}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        verb: &'static str,
        group: &'static str,
        resource: &'static str,
        name: &'static str,
    ) -> Request<'static> {
        Request {
            verb,
            group,
            resource,
            name,
            user: "did:key:zMallory",
            ..Default::default()
        }
    }

    fn in_ns(namespace: &'static str, r: Request<'static>) -> Request<'static> {
        Request { namespace, ..r }
    }

    fn nodes() -> &'static [String] {
        static G: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        G.get_or_init(|| vec![NODES_GROUP.to_string(), "system:authenticated".into()])
    }

    #[test]
    fn the_guard_refuses_what_rbac_cannot_say() {
        let ar = "admissionregistration.k8s.io";
        let vap = "validatingadmissionpolicies";
        let vapb = "validatingadmissionpolicybindings";
        let (reg, api) = ("apiregistration.k8s.io", "apiservices");
        let auth = "authentication.k8s.io";
        for r in [
            req("delete", ar, vap, "socialweb-node-isolation"),
            req("patch", ar, vapb, "socialweb-node-isolation"),
            req("update", ar, vap, "socialweb-node-isolation"),
            req("deletecollection", ar, vap, ""),
            req("impersonate", "", "groups", "system:masters"),
            req("impersonate", "", "groups", "system:nodes"),
            req("impersonate", "", "groups", "system:bootstrappers"),
            req(
                "impersonate",
                "",
                "groups",
                "system:bootstrappers:socialweb:nodes",
            ),
            req(
                "impersonate",
                "",
                "groups",
                "system:serviceaccounts:kube-system",
            ),
            req("impersonate", "", "groups", "system:serviceaccounts:"),
            req("impersonate", "", "users", "system:node:ci-1"),
            req("impersonate", "", "users", "system:bootstrap:abcdef"),
            req("impersonate", "", "users", "system:kube-scheduler"),
            req("impersonate", "", "users", "system:anonymous"),
            Request {
                subresource: "authentication.kubernetes.io/node-name",
                ..req("impersonate", auth, "userextras", "ci-1")
            },
            // The control plane's namespaces, for anyone but the control plane.
            in_ns(
                "kube-system",
                req("patch", "", "configmaps", "socialweb-datastore-quota"),
            ),
            in_ns(
                "kube-system",
                req("delete", "", "configmaps", "socialweb-node-addresses"),
            ),
            in_ns("kube-system", req("create", "", "configmaps", "")),
            in_ns("kube-system", req("deletecollection", "", "configmaps", "")),
            in_ns("kube-system", req("create", "", "secrets", "")),
            in_ns(
                "kube-system",
                req("delete", "", "secrets", "bootstrap-token-abcdef"),
            ),
            in_ns(
                "kube-system",
                Request {
                    subresource: "token",
                    ..req(
                        "create",
                        "",
                        "serviceaccounts",
                        "clusterrole-aggregation-controller",
                    )
                },
            ),
            in_ns(
                "kube-system",
                req("impersonate", "", "serviceaccounts", "namespace-controller"),
            ),
            in_ns("kube-system", req("create", "apps", "deployments", "")),
            in_ns(
                "kube-node-lease",
                req("update", "coordination.k8s.io", "leases", "ci-1"),
            ),
            in_ns(
                "kube-public",
                req("patch", "", "configmaps", "cluster-info"),
            ),
            // The namespace object itself (its name is its namespace in a request).
            in_ns(
                "kube-system",
                Request {
                    subresource: "status",
                    ..req("update", "", "namespaces", "kube-system")
                },
            ),
            Request {
                user: "system:serviceaccount:ci:runner",
                ..in_ns("kube-system", req("create", "", "pods", ""))
            },
            req("patch", reg, api, "v1.admissionregistration.k8s.io"),
            req("update", reg, api, "v1."),
            req("delete", reg, api, "v1.apps"),
            req("patch", reg, api, "v1.certificates.k8s.io"),
            req("patch", reg, api, "v1beta1.storage.k8s.io"),
            req("patch", reg, api, "v1.socialweb.kubernetes.io"),
            req("patch", reg, api, "v1alpha1.socialweb.computer"),
            req("deletecollection", reg, api, ""),
            req(
                "approve",
                "certificates.k8s.io",
                "signers",
                "kubernetes.io/kube-apiserver-client",
            ),
            Request {
                subresource: "approval",
                ..req(
                    "update",
                    "certificates.k8s.io",
                    "certificatesigningrequests",
                    "csr-1",
                )
            },
        ] {
            assert!(refuse(&r).is_some(), "{r:?} allowed");
        }
        for r in [
            req("get", ar, vap, "socialweb-node-isolation"),
            req("list", ar, vap, ""),
            req("create", ar, vap, "mine"),
            req("delete", ar, vap, "mine"),
            req("delete", "", "pods", "socialweb-x"),
            Request {
                subresource: "status",
                ..req("patch", ar, vap, "socialweb-node-isolation")
            },
            req(
                "create",
                "certificates.k8s.io",
                "certificatesigningrequests",
                "",
            ),
            req("impersonate", "", "groups", "developers"),
            req("impersonate", "", "groups", "system:authenticated"),
            req("impersonate", "", "groups", "system:serviceaccounts:ci"),
            req("impersonate", "", "users", "did:key:zAlice"),
            in_ns("ci", req("impersonate", "", "serviceaccounts", "runner")),
            Request {
                subresource: "example.com/team",
                ..req("impersonate", auth, "userextras", "ci")
            },
            req("impersonate", auth, "uids", "1234"),
            req("patch", reg, api, "v1beta1.metrics.k8s.io"),
            req("delete", reg, api, "v1beta1.custom.metrics.k8s.io"),
            req("update", reg, api, "v1alpha1.wardle.example.com"),
            req("create", reg, api, ""),
            req("get", reg, api, "v1.apps"),
            // Reads of the control plane's namespaces, and the control plane's writes there.
            in_ns(
                "kube-system",
                req("get", "", "configmaps", "socialweb-node-addresses"),
            ),
            in_ns("kube-system", req("list", "", "pods", "")),
            in_ns("kube-system", req("watch", "", "secrets", "")),
            Request {
                user: "system:serviceaccount:kube-system:namespace-controller",
                ..in_ns("kube-system", req("delete", "", "configmaps", "x"))
            },
            Request {
                user: "system:kube-controller-manager",
                ..in_ns("kube-system", req("create", "", "events", ""))
            },
            Request {
                user: "system:node:ci-1",
                groups: nodes(),
                ..in_ns(
                    "kube-node-lease",
                    req("update", "coordination.k8s.io", "leases", "ci-1"),
                )
            },
            // Everything in a tenant's own namespaces is RBAC's.
            in_ns("ci", req("create", "", "secrets", "")),
            in_ns("ci", req("delete", "", "configmaps", "socialweb-x")),
            in_ns(
                "ci",
                Request {
                    subresource: "token",
                    ..req("create", "", "serviceaccounts", "runner")
                },
            ),
        ] {
            assert_eq!(refuse(&r), None, "{r:?} refused");
        }
    }

    #[test]
    fn the_control_plane_is_its_components_nodes_controllers_and_bootstrap_tokens() {
        let none: &[String] = &[];
        for u in [
            "system:kube-controller-manager",
            "system:kube-scheduler",
            "system:apiserver",
            "system:node:ci-1",
            "system:serviceaccount:kube-system:replicaset-controller",
            "system:bootstrap:abcdef",
        ] {
            assert!(control_plane(u, none), "{u}");
        }
        assert!(control_plane("anyone", nodes()));
        for u in [
            "did:key:zMallory",
            "system:serviceaccount:ci:runner",
            "system:serviceaccount:kube-systemx:runner",
            "system:anonymous",
            "",
        ] {
            assert!(!control_plane(u, none), "{u}");
        }
    }

    #[test]
    fn an_apiservice_is_aggregatable_only_outside_kubernetes_own_groups() {
        for name in [
            "v1beta1.metrics.k8s.io",
            "v1beta1.external.metrics.k8s.io",
            "v1alpha1.wardle.example.com",
            "v1.keda.sh",
            // A group of its own, whatever it starts with.
            "v1.metrics.k8s.io.example",
            "v1.socialweb.computer.example",
        ] {
            assert!(aggregatable(name), "{name}");
        }
        for name in [
            "",
            "v1",
            "v1.",
            "v1.apps",
            "v2.autoscaling",
            "v1.k8s.io",
            "v1.admissionregistration.k8s.io",
            "v1.node.k8s.io",
            "v1.x.kubernetes.io",
            "v1.evil-metrics.k8s.io",
            "v1alpha1.socialweb.computer",
        ] {
            assert!(!aggregatable(name), "{name}");
        }
    }

    #[test]
    fn every_field_the_conditions_read_is_guarded_by_has() {
        let all = match_conditions().join(" ");
        for f in [
            "verb",
            "group",
            "resource",
            "subresource",
            "name",
            "namespace",
        ] {
            let bare = format!("request.resourceAttributes.{f}");
            let guarded = format!("has({bare}) ? {bare} : ''");
            // Every read of the field ends there (`name` is also the start of `namespace`).
            let reads = [")", " "]
                .iter()
                .map(|end| all.matches(&format!("{bare}{end}")).count())
                .sum::<usize>();
            assert_eq!(
                all.matches(&bare).count() - all.matches(&format!("{bare}space")).count(),
                reads,
                "{f}"
            );
            assert_eq!(reads, 2 * all.matches(&guarded).count(), "{f}");
        }
        // Who asks: also optional in a SubjectAccessReview.
        assert_eq!(
            all.matches("request.user").count(),
            2 * all.matches("has(request.user) ? request.user : ''").count()
        );
        assert_eq!(
            all.matches("request.groups").count(),
            2 * all
                .matches("has(request.groups) && request.groups.")
                .count()
        );
    }
}
