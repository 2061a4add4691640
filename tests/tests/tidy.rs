//! The architecture the build enforces (`docs/architecture.md`), checked on every run as
//! rust-analyzer's `tidy` tests do: the pure crates stay pure, netlink has one home, crates
//! depend only on what the crate map allows, the documentation names only paths and
//! programs that exist, and no crate carries a dependency it does not use. Each failure says
//! what to change. Needs `cargo` (the one running the tests) and nothing else; no root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Crates that are values in, values out: no runtime, sockets, netlink, Kubernetes or
/// processes, and no `anyhow` (libraries return typed errors).
const PURE: &[&str] = &[
    "socialweb-wire",
    "socialweb-dns-core",
    "socialweb-mesh-core",
    "socialweb-broker-core",
    "socialweb-market",
];

/// What a pure crate may not have anywhere in its dependency tree.
const IO: &[&str] = &[
    "tokio",
    "mio",
    "socket2",
    "async-std",
    "smol",
    "rtnetlink",
    "netlink-sys",
    "netlink-proto",
    "netlink-packet-core",
    "netlink-packet-route",
    "kube",
    "kube-client",
    "kube-runtime",
    "k8s-openapi",
    "iroh",
    "iroh-relay",
    "quinn",
    "tun-rs",
    "nix",
    "hyper",
    "reqwest",
    "anyhow",
];

/// Libraries others build on, which return typed errors rather than `anyhow`'s.
const TYPED_ERRORS: &[&str] = &["socialweb-netlink", "socialweb-cni"];

/// The one crate that talks netlink.
const NETLINK_HOME: &str = "socialweb-netlink";

/// Workspace crates a crate may not depend on (any kind of dependency), from the crate map.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("socialweb-agent", &["socialweb-broker", "socialweb-cni"]),
    (
        "socialweb-cni",
        &[
            "socialweb-agent",
            "socialweb-dns-core",
            "socialweb-mesh-core",
        ],
    ),
    (
        "socialweb-broker",
        &[
            "socialweb-agent",
            "socialweb-dns-core",
            "socialweb-mesh-core",
            "socialweb-netlink",
        ],
    ),
    (
        "socialweb-image-builder",
        &["socialweb-broker", "socialweb-agent"],
    ),
    // The provider shares only the market protocol's types with the broker.
    (
        "socialweb-provider",
        &[
            "socialweb-broker",
            "socialweb-broker-core",
            "socialweb-agent",
            "socialweb-dns-core",
            "socialweb-mesh-core",
        ],
    ),
    (
        "socialweb-broker-core",
        &["socialweb-broker", "socialweb-provider", "socialweb-proc"],
    ),
    (
        "socialweb-market",
        &[
            "socialweb-broker",
            "socialweb-broker-core",
            "socialweb-provider",
            "socialweb-wire",
        ],
    ),
];

/// Dependencies that no source file names, kept on purpose. (None today.)
const USED_WITHOUT_A_NAME: &[(&str, &str, &str)] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "cargo {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

/// `cargo metadata` for the workspace's own packages.
fn packages() -> Vec<Value> {
    let meta: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))
    .expect("cargo metadata prints JSON");
    meta["packages"].as_array().expect("packages").clone()
}

fn name(p: &Value) -> &str {
    p["name"].as_str().expect("a package has a name")
}

fn dir(p: &Value) -> PathBuf {
    Path::new(p["manifest_path"].as_str().expect("manifest path"))
        .parent()
        .expect("a manifest is in a directory")
        .to_path_buf()
}

/// The crates in `package`'s normal and build dependency tree, as it is built on its own
/// (`cargo build -p`: features of other workspace members do not leak in).
fn tree(package: &str) -> BTreeSet<String> {
    cargo(&[
        "tree",
        "--offline",
        "--locked",
        "-p",
        package,
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ])
    .lines()
    .filter_map(|l| l.split_whitespace().next().map(str::to_string))
    .collect()
}

#[test]
fn pure_crates_have_no_io_in_their_dependency_tree() {
    let mut bad = Vec::new();
    for pure in PURE {
        let deps = tree(pure);
        for io in IO {
            if deps.contains(*io) {
                bad.push(format!(
                    "{pure} depends on {io} (see `cargo tree -p {pure} -i {io}`)"
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "pure crates must stay pure (docs/architecture.md): move the I/O to the agent's edge \
         modules, or the code to a crate that may do I/O:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn libraries_return_typed_errors() {
    let mut bad = Vec::new();
    for p in packages() {
        if !(PURE.contains(&name(&p)) || TYPED_ERRORS.contains(&name(&p))) {
            continue;
        }
        for d in p["dependencies"].as_array().unwrap() {
            if d["name"] == "anyhow" {
                bad.push(name(&p).to_string());
            }
        }
    }
    assert!(
        bad.is_empty(),
        "these libraries depend on anyhow; return a thiserror enum (or CniError) that names \
         the field instead: {bad:?}"
    );
}

#[test]
fn netlink_has_one_home_and_crates_depend_only_as_the_map_allows() {
    let mut bad = Vec::new();
    for p in packages() {
        let me = name(&p);
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            if me != NETLINK_HOME && (dep == "rtnetlink" || dep.starts_with("netlink-")) {
                bad.push(format!(
                    "{me} depends on {dep}: netlink goes through {NETLINK_HOME} (cni/netlink)"
                ));
            }
            if dep == "socialweb-tests" {
                bad.push(format!("{me} depends on the test harness"));
            }
            if let Some((_, forbidden)) = FORBIDDEN.iter().find(|(c, _)| *c == me)
                && forbidden.contains(&dep)
            {
                bad.push(format!(
                    "{me} may not depend on {dep} (docs/architecture.md)"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_shipped_plugin_has_no_fault_injection() {
    let cni = packages()
        .into_iter()
        .find(|p| name(p) == "socialweb-cni")
        .expect("socialweb-cni");
    let default = &cni["features"]["default"];
    assert!(
        !default
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "fault-injection")),
        "fault-injection is for the test harness only: {default}"
    );
}

/// Every `.rs` file of a package, leaving out packages nested inside it (agent/dns-core in
/// agent/, the fuzz crates) and build output.
fn sources(dir: &Path, top: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if !top && dir.join("Cargo.toml").exists() {
        return out;
    }
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            out.extend(sources(&path, false));
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn no_crate_carries_a_dependency_it_does_not_use() {
    let mut unused = Vec::new();
    for p in packages() {
        let text: String = sources(&dir(&p), true)
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["rename"].as_str().or(d["name"].as_str()).unwrap();
            let ident = dep.replace('-', "_");
            let named = [
                format!("{ident}::"),
                format!("use {ident};"),
                format!("extern crate {ident}"),
            ]
            .iter()
            .any(|n| text.contains(n.as_str()));
            let excused = USED_WITHOUT_A_NAME
                .iter()
                .any(|(c, x, _)| *c == name(&p) && *x == dep);
            if !named && !excused {
                unused.push(format!(
                    "{}: {dep} ({})",
                    name(&p),
                    d["kind"].as_str().unwrap_or("normal")
                ));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "dependencies no source names; remove them from Cargo.toml (or list them in \
         USED_WITHOUT_A_NAME with the reason):\n  {}",
        unused.join("\n  ")
    );
}

/// Inline code spans and link targets of a Markdown text.
fn mentions(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let Some(code) = parts.next() {
            out.push(code.to_string());
            parts.next();
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(format!("link:{}", &after[..end]));
            rest = &after[end..];
        }
    }
    out
}

/// The Markdown files that document the repository.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs = vec![root.join("README.md"), root.join("bench/README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            docs.push(e.path());
        }
    }
    docs
}

/// Strings the code itself defines (`"socialweb-dns"`, the dummy interface's name): a name
/// the docs mention may be one of these rather than a program.
fn defined_in_code(word: &str) -> bool {
    let quoted = format!("\"{word}\"");
    packages().iter().any(|p| {
        sources(&dir(p), true)
            .iter()
            .any(|f| std::fs::read_to_string(f).unwrap().contains(&quoted))
    })
}

#[test]
fn paths_and_programs_the_docs_name_exist() {
    let root = root();
    let top: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut programs: BTreeSet<String> = BTreeSet::new();
    for p in packages() {
        programs.insert(name(&p).to_string());
        for t in p["targets"].as_array().unwrap() {
            if t["kind"].as_array().unwrap().iter().any(|k| k == "bin") {
                programs.insert(t["name"].as_str().unwrap().to_string());
            }
        }
    }
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let rel = doc.strip_prefix(&root).unwrap().display().to_string();
        for m in mentions(&text) {
            if let Some(target) = m.strip_prefix("link:") {
                let target = target.split('#').next().unwrap_or("");
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                if !doc.parent().unwrap().join(target).exists() {
                    missing.entry(rel.clone()).or_default().push(target.into());
                }
                continue;
            }
            let Some(word) = m.split_whitespace().next() else {
                continue;
            };
            // A path in this repository: its first component is one of the top-level
            // entries, and it is not a pattern.
            let path = word.strip_prefix("./").unwrap_or(word);
            let first = path.split('/').next().unwrap_or("");
            if word.contains('/')
                && top.contains(first)
                && !path.contains(['<', '*', '{', '$', '#', ':'])
            {
                if !root.join(path).exists() {
                    missing.entry(rel.clone()).or_default().push(word.into());
                }
                continue;
            }
            // A program or crate of this repository.
            let program = word.starts_with("socialweb-") || word.starts_with("bench-");
            if program
                && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !programs.contains(word)
                && !defined_in_code(word)
            {
                missing.entry(rel.clone()).or_default().push(word.into());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name paths or programs that do not exist (fix the doc, or say in words \
         what is not there yet):\n{}",
        missing
            .iter()
            .map(|(doc, v)| format!("  {doc}: {}", v.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
