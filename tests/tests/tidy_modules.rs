//! The code's house rules (docs/architecture.md), read from the sources on every run beside
//! `tidy.rs`: no import cycle between a crate's top-level modules (every crate in [`ACYCLIC`]),
//! no function longer than [`MAX_LINES`] unless a `// tidy: long (at most N lines)` comment
//! above it says why and how long it may get (every directory in [`SHORT`]; the crates not
//! there yet may not let their long functions grow, [`NOT_GROWN`]), and the broker's own layering: nothing imports its
//! `daemon`, and it uses the provider crate only through its entry points. Each failure says
//! what to change. Needs `cargo` (the one running the tests, for the workspace's members)
//! and the sources; no root, no network.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use syn::visit::Visit;

/// Crates (their directories) whose top-level modules import one another in no cycle.
const ACYCLIC: &[&str] = &[
    "agent",
    "agent/dns-core",
    "agent/mesh-core",
    "broker",
    "broker/core",
    "broker/proc",
    "broker/provider",
    "cni",
    "cni/netlink",
    "image-builder",
    "tests",
    "wire",
];

/// Crates with more than one module that are not in [`ACYCLIC`] yet, and why.
const NOT_YET_ACYCLIC: &[(&str, &str)] = &[];

/// The longest a function may be, in lines from its signature to its closing brace.
const MAX_LINES: usize = 80;

/// Directories (each a crate, without the crates nested in it) whose functions are at most
/// [`MAX_LINES`] long. The fuzz crates are outside the workspace but ours.
const SHORT: &[&str] = &[
    "agent",
    "agent/dns-core",
    "agent/fuzz",
    "agent/mesh-core",
    "broker",
    "broker/core",
    "broker/fuzz",
    "broker/market",
    "broker/market-tls",
    "broker/proc",
    "broker/provider",
    "cni/fuzz",
    "cni/netlink",
    "image-builder/oci",
];

/// Workspace crates not in [`SHORT`] yet, and why. Each joins it once its long functions are
/// split (or say why they must be long).
const NOT_YET_SHORT: &[(&str, &str)] = &[
    (
        "cni",
        "config::parse (117 lines) and plugin::check (85) are not split yet",
    ),
    (
        "image-builder",
        "build::build (213 lines) and base::debootstrap (86) are not split yet",
    ),
    (
        "tests",
        "issue 38: the harness, the bench drivers' mains and the scenario tests (which read \
         as one story each) are not split yet",
    ),
    (
        "wire",
        "identity's from_json (one check per field) is not split yet; NOT_GROWN holds it at its length",
    ),
];

/// The long functions of the crates in [`NOT_YET_SHORT`] (`file::name`, the most lines it
/// may have): a ratchet, so an exempt function cannot grow unseen.
const NOT_GROWN: &[(&str, usize)] = &[
    ("cni/src/config.rs::parse", 117),
    ("cni/src/plugin.rs::check", 85),
    ("image-builder/src/base.rs::debootstrap", 86),
    ("image-builder/src/build.rs::build", 213),
    ("tests/src/bin/bench-dns.rs::main", 194),
    ("tests/src/bin/bench-fleet-front.rs::main", 90),
    ("tests/src/bin/bench-front.rs::main", 176),
    ("tests/src/bin/bench-front.rs::run", 117),
    ("tests/src/bin/bench-image.rs::main", 128),
    ("tests/src/bin/bench-mesh.rs::main", 219),
    ("tests/src/bin/bench-mesh/peers.rs::quincy", 91),
    ("tests/src/bin/bench-mesh/variant.rs::print", 103),
    ("tests/src/bin/bench-mesh/variant.rs::round", 105),
    ("tests/src/bin/bench-scale.rs::main", 90),
    ("tests/src/bin/bench-tunnel.rs::direct_peer", 92),
    ("tests/src/bin/conformance/main.rs::main", 238),
    ("tests/src/bin/demo.rs::main", 235),
    ("tests/src/k8s/control_plane.rs::start", 128),
    ("tests/src/k8s/node.rs::start", 137),
    ("tests/src/world.rs::build", 84),
    (
        "tests/tests/access.rs::a_did_reaches_its_cluster_only_through_the_front_and_loses_it_on_revocation",
        422,
    ),
    (
        "tests/tests/access.rs::service_auth_tokens_are_checked_against_the_did_and_bad_requests_change_nothing",
        157,
    ),
    (
        "tests/tests/anywhere.rs::a_node_names_no_address_but_its_own",
        112,
    ),
    (
        "tests/tests/anywhere.rs::a_node_that_claims_another_nodes_endpoint_cuts_no_one_off",
        197,
    ),
    (
        "tests/tests/anywhere.rs::nodes_come_back_after_the_broker_restarts_and_after_a_minute_cut_off",
        94,
    ),
    (
        "tests/tests/anywhere.rs::nodes_of_two_providers_behind_nat_join_and_serve_through_the_brokers_endpoints_alone",
        163,
    ),
    ("tests/tests/anywhere.rs::webhook", 101),
    (
        "tests/tests/backup.rs::a_backup_taken_while_serving_brings_the_cluster_back_into_an_empty_state_directory",
        121,
    ),
    (
        "tests/tests/broker.rs::a_job_larger_than_the_default_node_gets_the_shape_that_holds_it",
        82,
    ),
    (
        "tests/tests/broker.rs::a_mixed_batch_runs_on_the_nodes_the_plan_rented_with_none_left_pending",
        89,
    ),
    ("tests/tests/broker.rs::one_node_loop", 95),
    (
        "tests/tests/dns.rs::node_local_dns_answers_the_cluster_zone_and_forwards_the_rest",
        219,
    ),
    (
        "tests/tests/fleet.rs::a_hibernating_cluster_is_woken_by_the_host_a_request_reaches",
        86,
    ),
    (
        "tests/tests/fleet.rs::a_host_cut_off_drained_or_killed_gives_its_clusters_to_another_and_never_runs_them_beside_it",
        162,
    ),
    (
        "tests/tests/fleet.rs::three_hosts_six_clusters_one_host_killed_and_one_drained",
        266,
    ),
    (
        "tests/tests/hibernation.rs::a_broker_killed_during_a_wake_is_followed_by_one_that_finishes_it",
        91,
    ),
    (
        "tests/tests/hibernation.rs::an_idle_cluster_hibernates_and_its_first_request_wakes_it",
        164,
    ),
    (
        "tests/tests/hostile.rs::a_broker_sees_and_touches_only_its_own_leases_and_no_id_is_a_path",
        139,
    ),
    (
        "tests/tests/hostile.rs::a_providers_market_port_serves_only_the_brokers_it_lists",
        90,
    ),
    (
        "tests/tests/hostile.rs::a_tenant_filling_its_datastore_is_stopped_at_the_quota_and_no_one_else_is",
        221,
    ),
    (
        "tests/tests/hostile.rs::an_escape_pod_is_refused_and_its_owner_cannot_lift_the_policy",
        326,
    ),
    (
        "tests/tests/hostile.rs::did_documents_come_only_from_the_internet_and_only_so_big",
        109,
    ),
    (
        "tests/tests/hostile.rs::secrets_at_rest_are_owner_only_and_the_datastore_wants_its_own_certificate",
        151,
    ),
    (
        "tests/tests/hostile.rs::who_may_have_a_cluster_is_the_operators_choice",
        126,
    ),
    (
        "tests/tests/hostile/budgets.rs::a_tenants_pods_and_streams_cost_the_broker_a_bounded_amount",
        91,
    ),
    (
        "tests/tests/hostile/relay.rs::the_relay_bounds_connections_per_source_and_in_all",
        111,
    ),
    (
        "tests/tests/hostile/rights.rs::a_tenant_holds_a_list_of_rights_and_every_cluster_scoped_write_is_named",
        361,
    ),
    (
        "tests/tests/image.rs::the_image_boots_under_qemu_into_an_agent_that_reports_its_status",
        132,
    ),
    (
        "tests/tests/join.rs::children_are_kept_running_and_a_killed_agent_converges_without_duplicates",
        102,
    ),
    (
        "tests/tests/join.rs::two_nodes_join_from_identity_documents_alone_and_serve_pods_services_and_names",
        123,
    ),
    (
        "tests/tests/k8s.rs::four_step_proof_zero_nodes_then_a_node_then_a_pod",
        89,
    ),
    (
        "tests/tests/mesh.rs::spoofed_packets_are_dropped_and_counted_and_strangers_are_refused",
        129,
    ),
    (
        "tests/tests/quickstart.rs::the_quickstart_installs_a_broker_and_two_providers_and_a_users_job_runs_on_a_vm_node",
        152,
    ),
    (
        "tests/tests/store.rs::a_cluster_on_postgresql_keeps_its_objects_in_a_database_of_its_own",
        87,
    ),
    (
        "tests/tests/store.rs::a_host_that_lost_its_disk_serves_its_clusters_from_postgresql_with_the_same_cas",
        109,
    ),
    ("tests/tests/store.rs::concurrent_creates", 86),
    ("tests/tests/store.rs::exercise", 186),
    ("tests/tests/tidy.rs::io_in_source", 96),
    (
        "tests/tests/upgrade.rs::this_broker_takes_over_the_previous_releases_state_with_clusters_awake_hibernated_and_with_nodes",
        106,
    ),
    (
        "tests/tests/vm.rs::a_pod_runs_on_a_vm_node_that_a_panicking_guest_did_not_stop_and_sees_only_the_guest",
        311,
    ),
    ("wire/src/identity.rs::from_json", 201),
];

/// What the broker may name of the provider crate: how to configure (the config and the kinds
/// of machine it names), start and serve it.
const PROVIDER_ENTRY: &[&str] = &[
    "Provider",
    "ProviderConfig",
    "MachineKind",
    "VmSettings",
    "AccelChoice",
    "Listen",
    "serve",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// The workspace's members, as directories relative to the repository.
fn members() -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let root = root();
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let manifest = Path::new(p["manifest_path"].as_str().expect("manifest path"));
            let dir = manifest.parent().expect("a manifest is in a directory");
            dir.strip_prefix(&root)
                .expect("members are inside the repository")
                .display()
                .to_string()
        })
        .collect()
}

/// Every `.rs` file under `dir` (recursively), leaving out build output and the crates
/// nested inside it (`agent/mesh-core` is not part of `agent`).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, top: bool, out: &mut Vec<PathBuf>) {
        if !top && dir.join("Cargo.toml").exists() {
            return;
        }
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                if !path.ends_with("target") {
                    walk(&path, false, out);
                }
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, true, &mut out);
    out.sort();
    out
}

fn parse(file: &Path) -> (String, syn::File) {
    let text = std::fs::read_to_string(file).unwrap();
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    (text, ast)
}

fn is_test_module(m: &syn::ItemMod) -> bool {
    m.attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().contains("test"))
    })
}

/// Every path a `use` tree brings in, as segments (`use a::{b, c::d as e}` is `a::b` and
/// `a::c::d`; a glob ends in `*`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push([prefix.clone(), vec!["*".into()]].concat()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

/// A crate as its root sees it: its top-level modules (the `mod`s of `src/lib.rs`, or of
/// `src/main.rs` when it has no library), each with its files, and the names the root brings
/// into scope from them (`pub use records::Step` makes `crate::Step` a use of `records`).
#[derive(Debug, Default)]
struct Crate {
    modules: BTreeMap<String, Vec<PathBuf>>,
    reexports: BTreeMap<String, String>,
}

impl Crate {
    fn read(dir: &Path) -> Crate {
        let src = dir.join("src");
        let lib = src.join("lib.rs");
        let root = if lib.exists() {
            lib
        } else {
            src.join("main.rs")
        };
        let (_, ast) = parse(&root);
        let mut c = Crate::default();
        for item in &ast.items {
            match item {
                syn::Item::Mod(m) if m.content.is_none() && !is_test_module(m) => {
                    assert!(
                        !m.attrs.iter().any(|a| a.path().is_ident("path")),
                        "{}: a #[path] module; teach tidy_modules.rs where it is",
                        root.display()
                    );
                    let name = m.ident.to_string();
                    let mut files = Vec::new();
                    if src.join(format!("{name}.rs")).exists() {
                        files.push(src.join(format!("{name}.rs")));
                    }
                    if src.join(&name).is_dir() {
                        files.extend(rust_files(&src.join(&name)));
                    }
                    assert!(
                        !files.is_empty(),
                        "{}: no file for mod {name}",
                        root.display()
                    );
                    c.modules.insert(name, files);
                }
                _ => {}
            }
        }
        for item in &ast.items {
            if let syn::Item::Use(u) = item {
                let mut paths = Vec::new();
                use_paths(&u.tree, &mut Vec::new(), &mut paths);
                for p in paths {
                    let first = if p[0] == "crate" || p[0] == "self" {
                        p.get(1)
                    } else {
                        p.first()
                    };
                    if let (Some(m), Some(last)) = (first, p.last())
                        && c.modules.contains_key(m)
                        && last != "*"
                    {
                        c.reexports.insert(last.clone(), m.clone());
                    }
                }
            }
        }
        c
    }

    /// Each module, the modules it imports and the first file that imports each.
    fn graph(&self, src: &Path) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
        let mut graph = BTreeMap::new();
        for (m, files) in &self.modules {
            let mut deps: BTreeMap<String, PathBuf> = BTreeMap::new();
            for f in files {
                let (_, ast) = parse(f);
                let mut v = Imports {
                    krate: self,
                    here: module_path(src, f),
                    found: BTreeSet::new(),
                };
                v.visit_file(&ast);
                for d in v.found.into_iter().map(|p| p[0].clone()) {
                    if d != *m {
                        deps.entry(d).or_insert_with(|| f.clone());
                    }
                }
            }
            graph.insert(m.clone(), deps);
        }
        graph
    }
}

/// The module a file is (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    path
}

/// The crate's top-level modules a file names: `crate::m`, `super::m` from one level down,
/// `crate::X` where the root brings `X` in from `m`; in paths, `use` trees and macro input.
/// Doc links and comments are not imports.
struct Imports<'a> {
    krate: &'a Crate,
    /// The module being read (the file's, then inline `mod`s inside it).
    here: Vec<String>,
    /// What it names, as paths from the crate's root (`crate::Step` as `records::Step`).
    found: BTreeSet<Vec<String>>,
}

impl Imports<'_> {
    fn saw(&mut self, segs: &[String]) {
        let (base, rest): (&[String], &[String]) = match segs.first().map(String::as_str) {
            Some("crate") => (&[], &segs[1..]),
            Some("self") => (&self.here, &segs[1..]),
            Some("super") => {
                let up = segs.iter().take_while(|s| *s == "super").count();
                if up > self.here.len() {
                    return;
                }
                (&self.here[..self.here.len() - up], &segs[up..])
            }
            // An extern crate, or a name a `use` (seen on its own) brought in.
            _ => return,
        };
        let mut abs: Vec<String> = [base, rest].concat();
        match abs.first() {
            Some(m) if self.krate.modules.contains_key(m) => {}
            Some(name) => match self.krate.reexports.get(name) {
                Some(m) => abs.insert(0, m.clone()),
                None => return,
            },
            None => return,
        }
        self.found.insert(abs);
    }
}

impl<'ast> Visit<'ast> for Imports<'_> {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.saw(&segs);
        syn::visit::visit_path(self, p);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            self.saw(&p);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.here.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.here.pop();
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // `crate::a::b` inside `format!(..)`, `tokio::select! {..}` and the like.
        fn flat(ts: proc_macro2::TokenStream, out: &mut Vec<String>) {
            for t in ts {
                match t {
                    proc_macro2::TokenTree::Group(g) => {
                        out.push(String::new());
                        flat(g.stream(), out);
                        out.push(String::new());
                    }
                    t => out.push(t.to_string()),
                }
            }
        }
        let mut toks = Vec::new();
        flat(m.tokens.clone(), &mut toks);
        for (i, t) in toks.iter().enumerate() {
            if (t == "crate" || t == "super")
                && (i == 0 || (toks[i - 1] != ":" && toks[i - 1] != "$"))
            {
                let mut segs = vec![t.clone()];
                let mut j = i + 1;
                while toks.get(j).is_some_and(|x| x == ":")
                    && toks.get(j + 1).is_some_and(|x| x == ":")
                    && let Some(next) = toks.get(j + 2)
                {
                    segs.push(next.clone());
                    j += 3;
                }
                if segs.len() > 1 {
                    self.saw(&segs);
                }
            }
        }
        syn::visit::visit_macro(self, m);
    }
}

/// A cycle in `graph`, if there is one, as the modules on it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|x| x == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

/// The modules of `graph` that sit on some cycle, as groups that all reach one another
/// (strongly connected components of more than one module).
fn tangles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in graph.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (m, r) in &reaches {
        if out.iter().any(|t| t.contains(*m)) {
            continue;
        }
        let group: BTreeSet<String> = r
            .iter()
            .filter(|n| reaches.get(n).is_some_and(|back| back.contains(*m)))
            .cloned()
            .collect();
        if group.len() > 1 {
            out.push(group);
        }
    }
    out
}

/// What is wrong with a crate's module graph, if anything: a cycle, each of its edges with
/// the file that makes it, and every tangle of modules.
fn cycle_report(
    crate_dir: &str,
    graph: &BTreeMap<String, BTreeMap<String, PathBuf>>,
) -> Option<String> {
    let plain: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .map(|(m, deps)| (m.clone(), deps.keys().cloned().collect()))
        .collect();
    let cycle = find_cycle(&plain)?;
    let root = root();
    let edges: Vec<String> = cycle
        .windows(2)
        .map(|w| {
            let file = &graph[&w[0]][&w[1]];
            let file = file.strip_prefix(&root).unwrap_or(file).display();
            format!("{} -> {} ({file})", w[0], w[1])
        })
        .collect();
    let tangles: Vec<String> = tangles(&plain)
        .iter()
        .map(|t| t.iter().cloned().collect::<Vec<_>>().join(", "))
        .collect();
    Some(format!(
        "{crate_dir}: {}; modules that reach one another: [{}]",
        edges.join(", "),
        tangles.join("], [")
    ))
}

fn crate_graph(crate_dir: &str) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let dir = root().join(crate_dir);
    Crate::read(&dir).graph(&dir.join("src"))
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let found: Vec<String> = ACYCLIC
        .iter()
        .filter_map(|c| cycle_report(c, &crate_graph(c)))
        .collect();
    assert!(
        found.is_empty(),
        "modules import one another in a cycle (docs/architecture.md: a crate's layers \
         import downwards only); move what both need to the lower one, or pass the value in:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn every_crate_with_modules_is_held_to_the_cycle_rule() {
    let mut bad = Vec::new();
    for m in members() {
        let modules = Crate::read(&root().join(&m)).modules.len();
        let listed = ACYCLIC.contains(&m.as_str());
        let excused = NOT_YET_ACYCLIC.iter().any(|(c, _)| *c == m);
        if modules > 1 && !listed && !excused {
            bad.push(format!(
                "{m} ({modules} modules) is in neither ACYCLIC nor NOT_YET_ACYCLIC"
            ));
        }
        if listed && excused {
            bad.push(format!("{m} is in both ACYCLIC and NOT_YET_ACYCLIC"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn a_cycle_is_found_when_there_is_one() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(
        tangles(&g),
        [["a", "b", "c"].map(String::from).into_iter().collect()]
    );
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&acyclic), None);
    assert!(tangles(&acyclic).is_empty());
}

/// A crate in a temporary directory, from `(path under src, text)` pairs.
fn scratch_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tidy-modules-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let f = dir.join("src").join(path);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    }
    dir
}

#[test]
fn the_import_scanner_sees_every_way_a_module_is_named() {
    let dir = scratch_crate(
        "ways",
        &[
            (
                "lib.rs",
                "mod a; mod b; mod c; mod d; mod e; mod f; pub use f::Thing;",
            ),
            ("a.rs", "use crate::b::X;"),
            ("b.rs", "use crate::{c::{self, Y}, d};"),
            ("c/mod.rs", "mod inner;"),
            ("c/inner.rs", "fn f() { let _ = super::super::d::Z; }"),
            ("d.rs", "fn f() { let _ = format!(\"{}\", crate::e::W); }"),
            (
                "e.rs",
                "fn f(_: crate::Thing) {}\n#[cfg(test)] mod tests { use super::*; }",
            ),
            (
                "f.rs",
                "pub struct Thing; /// [crate::a] is a doc link, not an import\nfn g() {}",
            ),
        ],
    );
    let g = Crate::read(&dir).graph(&dir.join("src"));
    let deps = |m: &str| g[m].keys().cloned().collect::<Vec<_>>();
    assert_eq!(deps("a"), ["b"]);
    assert_eq!(deps("b"), ["c", "d"]);
    assert_eq!(
        deps("c"),
        ["d"],
        "super::super from c/inner.rs is the crate"
    );
    assert_eq!(deps("d"), ["e"], "paths inside macros count");
    assert_eq!(
        deps("e"),
        ["f"],
        "crate::Thing is f's, through the root's use"
    );
    assert!(deps("f").is_empty(), "doc links are not imports");
    assert_eq!(cycle_report("x", &g), None);

    let dir = scratch_crate(
        "cycle",
        &[
            ("lib.rs", "pub mod bids; pub mod provision;"),
            ("bids.rs", "use crate::provision::Limits;"),
            ("provision.rs", "use crate::bids;\npub struct Limits;"),
        ],
    );
    let g = Crate::read(&dir).graph(&dir.join("src"));
    let report = cycle_report("x", &g).expect("a cycle");
    assert!(
        report.contains("bids -> provision (") && report.contains("bids.rs)"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_broker_daemon_is_imported_by_no_one() {
    let graph = crate_graph("broker");
    assert!(
        graph.contains_key("daemon") && graph.contains_key("services"),
        "the module map of broker/src changed; update this test: {:?}",
        graph.keys()
    );
    // The scanner sees imports (a check that finds no edge would pass any code).
    assert!(
        graph["api"].contains_key("command") && graph["daemon"].contains_key("cluster"),
        "the import scanner found {graph:?}"
    );
    for (m, deps) in &graph {
        assert!(
            !deps.contains_key("daemon"),
            "{m} imports the daemon: the composition root is imported by no one"
        );
    }
}

#[test]
fn the_broker_uses_only_the_provider_crates_entry_points() {
    let mut bad = Vec::new();
    for f in rust_files(&root().join("broker/src")) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("socialweb_provider::") {
            let rest = &text[i + "socialweb_provider::".len()..];
            let items: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                group[..group.find('}').unwrap_or(group.len())]
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            } else {
                vec![
                    rest.chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect(),
                ]
            };
            for item in items {
                if !PROVIDER_ENTRY.contains(&item.as_str()) {
                    bad.push(format!("{}: socialweb_provider::{item}", f.display()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "the broker names the provider crate's internals; it may use only {PROVIDER_ENTRY:?} \
         (and talks to any provider through the market protocol):\n  {}",
        bad.join("\n  ")
    );
}

/// Functions (free, in impls, in traits) longer than [`MAX_LINES`], outside `#[cfg(test)]`
/// modules (a table of cases is data, not a function to read): in `found` those no comment
/// excuses, each as a message; in `long` those with no comment at all, as (`file::name`,
/// lines).
struct Long<'a> {
    lines: &'a [&'a str],
    file: String,
    found: Vec<String>,
    long: Vec<(String, usize)>,
}

/// The most lines a `// tidy: long (at most N lines) because ...` comment allows.
fn allowed_by(comment: &str) -> Option<usize> {
    let rest = comment.split_once("at most ")?.1;
    rest.split_whitespace().next()?.parse().ok()
}

impl Long<'_> {
    /// Checks the function whose signature starts at `fn_token` and whose body ends at
    /// `close` (its docs and attributes do not count).
    fn check(&mut self, sig: &syn::Signature, close: proc_macro2::Span) {
        let name = sig.ident.to_string();
        let (start, end) = (sig.fn_token.span.start().line, close.end().line);
        let len = end + 1 - start;
        if len <= MAX_LINES {
            return;
        }
        // A `// tidy: long (at most N lines)` comment among the lines just above (its docs
        // and attributes): the length it records is one the function may not grow past.
        let comment = self.lines[start.saturating_sub(12)..start.saturating_sub(1)]
            .iter()
            .map(|l| l.trim_start())
            .find(|l| l.starts_with("// tidy: long"));
        match comment.map(allowed_by) {
            None => {
                self.long.push((format!("{}::{name}", self.file), len));
                self.found
                    .push(format!("{}:{start}: {name} is {len} lines", self.file));
            }
            Some(None) => self.found.push(format!(
                "{}:{start}: {name}'s `// tidy: long` comment records no length: say \
                 `// tidy: long (at most {len} lines) because ...`",
                self.file
            )),
            Some(Some(most)) if len > most => self.found.push(format!(
                "{}:{start}: {name} is {len} lines, past the {most} its comment allows",
                self.file
            )),
            Some(Some(_)) => {}
        }
    }
}

impl<'ast> Visit<'ast> for Long<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.check(&f.sig, f.block.brace_token.span.close());
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.check(&f.sig, f.block.brace_token.span.close());
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(b) = &f.default {
            self.check(&f.sig, b.brace_token.span.close());
        }
        syn::visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_module(m) {
            syn::visit::visit_item_mod(self, m);
        }
    }
}

/// The functions over [`MAX_LINES`] in the crate at `dir` (relative to the repository):
/// those no comment excuses, as messages, and every one, as (`file::name`, lines).
fn long_functions_of(dir: &str) -> (Vec<String>, Vec<(String, usize)>) {
    let root = root();
    let (mut found, mut long) = (Vec::new(), Vec::new());
    for f in rust_files(&root.join(dir)) {
        let (text, ast) = parse(&f);
        let lines: Vec<&str> = text.lines().collect();
        let mut v = Long {
            lines: &lines,
            file: f.strip_prefix(&root).unwrap_or(&f).display().to_string(),
            found: Vec::new(),
            long: Vec::new(),
        };
        v.visit_file(&ast);
        found.extend(v.found);
        long.extend(v.long);
    }
    (found, long)
}

/// The functions over [`MAX_LINES`] in the crate at `dir` that no comment excuses.
fn long_functions(dir: &str) -> Vec<String> {
    long_functions_of(dir).0
}

/// The crates not yet held to the length rule may not get worse: every long function in them
/// is recorded in [`NOT_GROWN`] and may not grow past its record; one split or shortened
/// lowers it (the record follows the code down, never up).
#[test]
fn the_long_functions_not_yet_split_do_not_grow() {
    let mut bad = Vec::new();
    let mut seen = BTreeMap::new();
    for (dir, _) in NOT_YET_SHORT {
        for (f, len) in long_functions_of(dir).1 {
            let e = seen.entry(f).or_insert(0);
            *e = len.max(*e);
        }
    }
    let recorded: BTreeMap<&str, usize> = NOT_GROWN.iter().copied().collect();
    for (f, len) in &seen {
        match recorded.get(f.as_str()) {
            None => bad.push(format!(
                "{f} is {len} lines: a new long function; split it (or, if it must be long, \
                 put `// tidy: long (at most {len} lines) because ...` above it)"
            )),
            Some(most) if len > most => bad.push(format!(
                "{f} grew to {len} lines, past its recorded {most}: split it"
            )),
            Some(most) if len < most => bad.push(format!(
                "{f} is {len} lines now: lower its record in NOT_GROWN from {most} to {len}"
            )),
            Some(_) => {}
        }
    }
    for (f, most) in NOT_GROWN {
        if !seen.contains_key(*f) {
            bad.push(format!(
                "{f} ({most} lines) is no longer long, or gone: remove it from NOT_GROWN"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let found: Vec<String> = SHORT.iter().flat_map(|d| long_functions(d)).collect();
    assert!(
        found.is_empty(),
        "functions over {MAX_LINES} lines: split them into steps that each do one thing, or \
         put a `// tidy: long (at most N lines) because ...` comment above one that must be \
         long:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn every_crate_is_held_to_the_length_rule() {
    let mut bad = Vec::new();
    for m in members() {
        let listed = SHORT.contains(&m.as_str());
        let excused = NOT_YET_SHORT.iter().any(|(c, _)| *c == m);
        if listed == excused {
            bad.push(format!(
                "{m} must be in exactly one of SHORT and NOT_YET_SHORT"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body = "    let _x = 1;\n".repeat(MAX_LINES);
    let most = MAX_LINES + 2;
    let text = format!(
        "fn short() {{}}\nfn long() {{\n{body}}}\n// tidy: long (at most {most} lines) because it is a test\nfn excused() {{\n{body}}}\n// tidy: long because it says no length\nfn unmeasured() {{\n{body}}}\n// tidy: long (at most 81 lines) because it grew\nfn grown() {{\n{body}}}\n#[cfg(test)]\nmod tests {{ fn long_test() {{\n{body}}} }}\n"
    );
    let ast = syn::parse_file(&text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut v = Long {
        lines: &lines,
        file: "x.rs".into(),
        found: Vec::new(),
        long: Vec::new(),
    };
    v.visit_file(&ast);
    assert_eq!(v.found.len(), 3, "{:?}", v.found);
    assert_eq!(v.found[0], format!("x.rs:2: long is {most} lines"));
    assert!(v.found[1].contains("unmeasured's `// tidy: long` comment records no length"));
    assert!(v.found[2].contains(&format!("grown is {most} lines, past the 81")));
    assert_eq!(
        v.long,
        [("x.rs::long".to_string(), most)],
        "the long function no comment excuses is measured"
    );
}
