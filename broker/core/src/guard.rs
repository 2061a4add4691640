//! What a tenant's own admins may never do in a cluster on namespace nodes (docs/security.md):
//! edit or delete the broker's admission policies, approve certificate signing requests (the
//! broker approves nodes'; an approved `kube-apiserver-client` CSR for `system:masters`
//! would pass every authorizer), impersonate `system:masters`, or write an APIService of a
//! group outside those [`aggregatable`] allows (Kubernetes' own groups are served by the
//! apiserver itself; repointed at a tenant's Service, its own policy informers and signers
//! would read the tenant's answers), write the broker's ConfigMaps in `kube-system`, or
//! impersonate a node or the control plane (the datastore quota exempts them). The apiserver
//! asks the
//! broker's authorization webhook (the guard) only for requests its match conditions
//! select -- [`match_conditions`], the same rules in CEL -- and the guard answers with
//! [`refuse`]. `system:masters` (the broker's own admin) is allowed before any webhook.

/// The resource attributes of an authorization request (SubjectAccessReview), empty strings
/// for what is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
}

/// The prefix of the broker's own objects in a tenant cluster.
pub const PROTECTED_PREFIX: &str = "socialweb-";

/// Where the broker's own ConfigMaps are (the nodes' addresses, the datastore quota's state),
/// named with [`PROTECTED_PREFIX`].
pub const PROTECTED_NAMESPACE: &str = "kube-system";

/// Groups no tenant may impersonate: the broker's admin, and nodes (what the broker exempts
/// from the datastore quota, and what the Node authorizer trusts).
pub const CONTROL_GROUPS: [&str; 2] = ["system:masters", "system:nodes"];

/// Users no tenant may impersonate besides nodes' (`system:node:<name>`): the control plane's
/// own components.
pub const CONTROL_USERS: [&str; 3] = [
    "system:kube-controller-manager",
    "system:kube-scheduler",
    "system:apiserver",
];
const NODE_USER_PREFIX: &str = "system:node:";

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

/// Whether a tenant may register (or repoint) the APIService `name` (`<version>.<group>`): an
/// allow-list. Its group must have a dot (the core group and `apps`, `batch`, `policy`,
/// `autoscaling` have none) and be outside the names Kubernetes reserves for itself
/// (`*.k8s.io`, `*.kubernetes.io`), except the metrics groups.
pub fn aggregatable(name: &str) -> bool {
    let Some((_version, group)) = name.split_once('.') else {
        return false;
    };
    let reserved = |g: &str| {
        g == "k8s.io"
            || g.ends_with(".k8s.io")
            || g == "kubernetes.io"
            || g.ends_with(".kubernetes.io")
    };
    group.contains('.') && (AGGREGATED_K8S_GROUPS.contains(&group) || !reserved(group))
}

/// Why the request is refused, or `None`: no opinion (the next authorizer decides).
pub fn refuse(r: &Request<'_>) -> Option<&'static str> {
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
            "APIServices of Kubernetes' own groups (and every deletecollection) are the \
             apiserver's: a tenant may register only its own groups and the metrics groups \
             (docs/security.md)",
        );
    }
    if r.group.is_empty()
        && r.resource == "configmaps"
        && r.namespace == PROTECTED_NAMESPACE
        && WRITES.contains(&r.verb)
        && (r.verb == "deletecollection" || r.name.starts_with(PROTECTED_PREFIX))
    {
        return Some(
            "the broker's ConfigMaps in kube-system (nodes' addresses, the datastore quota) are \
             the broker's to write (docs/security.md)",
        );
    }
    if r.verb == "impersonate" && r.group.is_empty() {
        let control = match r.resource {
            "groups" => CONTROL_GROUPS.contains(&r.name),
            "users" => CONTROL_USERS.contains(&r.name) || r.name.starts_with(NODE_USER_PREFIX),
            _ => false,
        };
        if control {
            return Some(
                "no one may impersonate the broker's admin, a node or the control plane \
                 (system:masters, system:nodes, system:node:*, the control-plane components)",
            );
        }
    }
    None
}

/// A CEL string field of `request.resourceAttributes`, '' when absent (an absent field is
/// an error in CEL, and an error under failurePolicy Deny denies everything).
fn field(f: &str) -> String {
    format!("(has(request.resourceAttributes.{f}) ? request.resourceAttributes.{f} : '')")
}

/// [`refuse`]'s rules as the webhook's match conditions (all must hold for the webhook to be
/// asked): a resource request, and one of the refused kinds.
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
    let namespace = field("namespace");
    let masters = format!(
        "({verb} == 'impersonate' && {group} == '' && (({resource} == 'groups' && {name} in {}) \
         || ({resource} == 'users' && ({name} in {} || {name}.startsWith('{NODE_USER_PREFIX}')))))",
        list(&CONTROL_GROUPS),
        list(&CONTROL_USERS)
    );
    let configmaps = format!(
        "({group} == '' && {resource} == 'configmaps' && {namespace} == '{PROTECTED_NAMESPACE}' && \
         {verb} in {} && ({verb} == 'deletecollection' || {name}.startsWith('{PROTECTED_PREFIX}')))",
        list(&WRITES)
    );
    // Every write of an APIService goes to the guard, which applies [`aggregatable`].
    let apiservices = format!(
        "({group} == 'apiregistration.k8s.io' && {resource} == 'apiservices' && {verb} in {})",
        list(&APISERVICE_WRITES)
    );
    vec![
        "has(request.resourceAttributes)".to_string(),
        format!("{policy} || {approval} || {masters} || {apiservices} || {configmaps}"),
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
            ..Default::default()
        }
    }

    #[test]
    fn the_guard_refuses_only_what_would_undo_node_isolation() {
        let ar = "admissionregistration.k8s.io";
        let vap = "validatingadmissionpolicies";
        let vapb = "validatingadmissionpolicybindings";
        let (reg, api) = ("apiregistration.k8s.io", "apiservices");
        for r in [
            req("delete", ar, vap, "socialweb-node-isolation"),
            req("patch", ar, vapb, "socialweb-node-isolation"),
            req("update", ar, vap, "socialweb-node-isolation"),
            req("deletecollection", ar, vap, ""),
            req("impersonate", "", "groups", "system:masters"),
            req("impersonate", "", "groups", "system:nodes"),
            req("impersonate", "", "users", "system:node:ci-1"),
            req("impersonate", "", "users", "system:kube-scheduler"),
            Request {
                namespace: "kube-system",
                ..req("patch", "", "configmaps", "socialweb-datastore-quota")
            },
            Request {
                namespace: "kube-system",
                ..req("delete", "", "configmaps", "socialweb-node-addresses")
            },
            Request {
                namespace: "kube-system",
                ..req("deletecollection", "", "configmaps", "")
            },
            req("patch", reg, api, "v1.admissionregistration.k8s.io"),
            req("update", reg, api, "v1."),
            req("delete", reg, api, "v1.apps"),
            req("patch", reg, api, "v1.certificates.k8s.io"),
            req("patch", reg, api, "v1beta1.storage.k8s.io"),
            req("patch", reg, api, "v1.socialweb.kubernetes.io"),
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
            req("patch", reg, api, "v1beta1.metrics.k8s.io"),
            req("delete", reg, api, "v1beta1.custom.metrics.k8s.io"),
            req("update", reg, api, "v1alpha1.wardle.example.com"),
            req("create", reg, api, ""),
            req("get", reg, api, "v1.apps"),
            req("impersonate", "", "users", "system:masters"),
            req(
                "impersonate",
                "",
                "users",
                "system:serviceaccount:ci:runner",
            ),
            req("impersonate", "", "groups", "developers"),
            req("patch", "", "configmaps", "socialweb-datastore-quota"),
            Request {
                namespace: "kube-system",
                ..req("patch", "", "configmaps", "coredns")
            },
            Request {
                namespace: "kube-system",
                ..req("get", "", "configmaps", "socialweb-node-addresses")
            },
        ] {
            assert_eq!(refuse(&r), None, "{r:?} refused");
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
    }
}
