//! The architecture the build enforces (`docs/architecture.md`), checked on every run as
//! rust-analyzer's `tidy` tests do: the crate map names every crate and nothing else, the
//! pure crates stay pure (in their dependency tree and in their sources), netlink has one
//! home, crates depend only on what the crate map allows, the documentation names only
//! paths and programs that exist, no crate carries a dependency it does not use, and
//! docs/config.md is what `socialweb-broker config reference` generates. Each
//! failure says what to change. Needs `cargo` (the one running the tests) and nothing else;
//! no root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use syn::visit::Visit;

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

/// What a pure crate's sources may not name outside `#[cfg(test)]`: the file system, sockets,
/// processes, the environment, sleeping and the clock (paths, or what they end with), and
/// the macros that print. Times are arguments; a `std::net` address type is a value.
const IO_IN_SOURCE: &[&str] = &[
    "std::fs",
    "std::net::TcpStream",
    "std::net::TcpListener",
    "std::net::UdpSocket",
    "std::net::ToSocketAddrs",
    "std::process",
    "std::env",
    "std::io::stdin",
    "std::io::stdout",
    "std::io::stderr",
    "thread::sleep",
    "SystemTime::now",
    "Instant::now",
    "println!",
    "eprintln!",
    "print!",
    "eprint!",
    ".elapsed()",
];

/// Places a pure crate's source names one of [`IO_IN_SOURCE`] on purpose: (file under the
/// repository, what, why). (None today.)
const IO_IN_SOURCE_EXCUSED: &[(&str, &str, &str)] = &[];

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
    // The OCI writer is a leaf: the agent, the provider, the image builder and the tests
    // use it.
    (
        "socialweb-oci",
        &[
            "socialweb-agent",
            "socialweb-broker",
            "socialweb-provider",
            "socialweb-image-builder",
            "socialweb-wire",
        ],
    ),
];

/// Dependencies that no source file names, kept on purpose, and why.
const USED_WITHOUT_A_NAME: &[(&str, &str, &str)] = &[
    (
        "socialweb-tests",
        "fastrand",
        "one feature set for every build: proptest's tempfile turns on its `default` in test \
         builds, so every build turns it on (tests/Cargo.toml)",
    ),
    (
        "socialweb-tests",
        "chacha20",
        "one feature set for every build: proptest's rand turns on its `rng` in test builds, \
         so every build turns it on (tests/Cargo.toml)",
    ),
];

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

/// The admission policies every cluster gets take no parameter resource: every aggregated
/// apiserver a tenant runs loads them, and a `paramKind` makes it list and watch that kind
/// across the cluster, which its ServiceAccount may not do, so it never becomes ready (the
/// datastore quota's did this to the Aggregator conformance test; docs/security.md).
#[test]
fn the_clusters_admission_policies_take_no_parameters() {
    let deploy = root().join("broker/deploy");
    let mut bad = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&deploy).expect("broker/deploy") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        seen += text.matches("kind: ValidatingAdmissionPolicy\n").count();
        for (i, line) in text.lines().enumerate() {
            let code = line.split('#').next().unwrap_or_default();
            if code.contains("paramKind") || code.contains("paramRef") {
                bad.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        seen >= 3,
        "only {seen} admission policies found under {}",
        deploy.display()
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
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
            // entries, and it is not a pattern. `target/` is what builds write (`./x package`'s
            // `target/package/`), not the repository's.
            let path = word.strip_prefix("./").unwrap_or(word);
            let first = path.split('/').next().unwrap_or("");
            if word.contains('/')
                && top.contains(first)
                && first != "target"
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

/// The files of a crate's library: its root and every module declared from it, leaving out
/// `#[cfg(test)]` modules (whose files are tests, not the library).
fn library_files(root_file: &Path) -> Vec<PathBuf> {
    /// `file`, then the modules its items declare; `base` is where their files are.
    fn walk(file: &Path, items: &[syn::Item], base: &Path, out: &mut Vec<PathBuf>) {
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            if is_test_only(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            match &m.content {
                Some((_, inner)) => walk(file, inner, &base.join(&name), out),
                None => {
                    assert!(
                        !m.attrs.iter().any(|a| a.path().is_ident("path")),
                        "{}: a #[path] module; teach tidy.rs where it is",
                        file.display()
                    );
                    let flat = base.join(format!("{name}.rs"));
                    let child = if flat.exists() {
                        flat
                    } else {
                        base.join(&name).join("mod.rs")
                    };
                    let ast = parse_rust(&child);
                    out.push(child.clone());
                    walk(&child, &ast.items, &base.join(&name), out);
                }
            }
        }
    }
    let ast = parse_rust(root_file);
    let mut out = vec![root_file.to_path_buf()];
    walk(
        root_file,
        &ast.items,
        root_file.parent().expect("src/"),
        &mut out,
    );
    out
}

fn parse_rust(file: &Path) -> syn::File {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Whether these attributes make an item exist only in tests (`#[cfg(test)]`, `#[test]`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && a.meta
                    .require_list()
                    .is_ok_and(|l| l.tokens.to_string() == "test"))
    })
}

/// Where a source text names one of [`IO_IN_SOURCE`], outside items only tests have: each
/// as (line, what).
fn io_in_source(text: &str) -> Vec<(usize, String)> {
    struct Io(Vec<(usize, String)>);
    impl Io {
        fn saw(&mut self, segs: &[String], line: usize) {
            let path = segs.join("::");
            for io in IO_IN_SOURCE {
                let hit = if io.starts_with("std::") {
                    path == *io || path.starts_with(&format!("{io}::"))
                } else {
                    path == *io || path.ends_with(&format!("::{io}"))
                };
                if hit {
                    self.0.push((line, path.clone()));
                }
            }
        }
    }
    impl<'ast> Visit<'ast> for Io {
        fn visit_item(&mut self, i: &'ast syn::Item) {
            let attrs = match i {
                syn::Item::Mod(x) => &x.attrs,
                syn::Item::Fn(x) => &x.attrs,
                syn::Item::Use(x) => &x.attrs,
                syn::Item::Impl(x) => &x.attrs,
                syn::Item::Const(x) => &x.attrs,
                syn::Item::Static(x) => &x.attrs,
                syn::Item::Struct(x) => &x.attrs,
                syn::Item::Enum(x) => &x.attrs,
                syn::Item::Macro(x) => &x.attrs,
                _ => return syn::visit::visit_item(self, i),
            };
            if !is_test_only(attrs) {
                syn::visit::visit_item(self, i);
            }
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            if !is_test_only(&f.attrs) {
                syn::visit::visit_impl_item_fn(self, f);
            }
        }
        fn visit_path(&mut self, p: &'ast syn::Path) {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = p
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.saw(&segs, line);
            syn::visit::visit_path(self, p);
        }
        fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
            fn flat(t: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
                match t {
                    syn::UseTree::Path(p) => {
                        prefix.push(p.ident.to_string());
                        flat(&p.tree, prefix, out);
                        prefix.pop();
                    }
                    syn::UseTree::Name(n) => {
                        out.push([&prefix[..], &[n.ident.to_string()]].concat())
                    }
                    syn::UseTree::Rename(r) => {
                        out.push([&prefix[..], &[r.ident.to_string()]].concat())
                    }
                    syn::UseTree::Glob(_) => out.push(prefix.clone()),
                    syn::UseTree::Group(g) => g.items.iter().for_each(|t| flat(t, prefix, out)),
                }
            }
            let mut paths = Vec::new();
            flat(&u.tree, &mut Vec::new(), &mut paths);
            let line = u.use_token.span.start().line;
            for p in paths {
                self.saw(&p, line);
            }
        }
        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            if let Some(last) = m.path.segments.last() {
                let name = format!("{}!", last.ident);
                if IO_IN_SOURCE.contains(&name.as_str()) {
                    self.0.push((last.ident.span().start().line, name));
                }
            }
            syn::visit::visit_macro(self, m);
        }
        fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
            let name = format!(".{}()", c.method);
            if IO_IN_SOURCE.contains(&name.as_str()) {
                self.0.push((c.method.span().start().line, name));
            }
            syn::visit::visit_expr_method_call(self, c);
        }
    }
    let ast = syn::parse_file(text).expect("the pure crates' sources parse");
    let mut v = Io(Vec::new());
    v.visit_file(&ast);
    v.0
}

#[test]
fn pure_crates_do_no_io_in_their_sources() {
    let root = root();
    let mut bad = Vec::new();
    for p in packages() {
        if !PURE.contains(&name(&p)) {
            continue;
        }
        for f in library_files(&dir(&p).join("src/lib.rs")) {
            let rel = f.strip_prefix(&root).unwrap().display().to_string();
            for (line, what) in io_in_source(&std::fs::read_to_string(&f).unwrap()) {
                if !IO_IN_SOURCE_EXCUSED
                    .iter()
                    .any(|(file, w, _)| *file == rel && *w == what)
                {
                    bad.push(format!("{rel}:{line}: {what}"));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "pure crates do no I/O and read no clock (docs/architecture.md): take the value as an \
         argument and do the I/O at the edge (or list it in IO_IN_SOURCE_EXCUSED with the \
         reason):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn the_source_check_sees_io_outside_tests_only() {
    let text = r#"
use std::fs;
use std::net::{IpAddr, TcpStream};
use std::time::{Instant, SystemTime};
fn values(a: IpAddr, t: Instant) -> (IpAddr, Instant) { (a, t) }
fn clock() -> SystemTime { SystemTime::now() }
fn nap() { std::thread::sleep(std::time::Duration::from_millis(1)); }
fn run() { let _ = std::process::Command::new("true"); println!("hi"); }
fn age(t: Instant) -> u128 { t.elapsed().as_millis() }
#[cfg(test)]
mod tests { fn t() { let _ = std::time::Instant::now(); let _ = std::env::var("X"); } }
#[cfg(test)]
fn helper() { let _ = std::fs::read("x"); }
"#;
    let found: Vec<String> = io_in_source(text)
        .into_iter()
        .map(|(line, what)| format!("{line}: {what}"))
        .collect();
    assert_eq!(
        found,
        [
            "2: std::fs",
            "3: std::net::TcpStream",
            "6: SystemTime::now",
            "7: std::thread::sleep",
            "8: std::process::Command::new",
            "8: println!",
            "9: .elapsed()",
        ]
    );
}

/// The Crates table of docs/architecture.md, row by row: the crate, its directory, its
/// binaries.
fn crate_rows(md: &str) -> Vec<(String, String, BTreeSet<String>)> {
    let code = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    md.lines()
        .skip_while(|l| !l.starts_with("| crate (dir) |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let first = code(cells[1]);
            let bins = code(cells[2]).into_iter().collect();
            (
                first.first().cloned().unwrap_or_default(),
                first
                    .get(1)
                    .map(|d| d.trim_end_matches('/').to_string())
                    .unwrap_or_default(),
                bins,
            )
        })
        .collect()
}

/// What differs between the Crates table's rows and the workspace's members (name,
/// directory, binaries), both ways.
fn crate_table_errors(
    rows: &[(String, String, BTreeSet<String>)],
    members: &[(String, String, BTreeSet<String>)],
) -> Vec<String> {
    let mut bad = Vec::new();
    for (name, dir, bins) in members {
        match rows.iter().find(|r| r.0 == *name) {
            None => bad.push(format!("{name} ({dir}/) has no row")),
            Some((_, d, b)) => {
                if d != dir {
                    bad.push(format!("{name}'s row says `{d}/`; it is in `{dir}/`"));
                }
                for missing in bins.difference(b) {
                    bad.push(format!("{name}'s row does not name its binary {missing}"));
                }
                for extra in b.difference(bins) {
                    bad.push(format!(
                        "{name}'s row names {extra}, which is not its binary"
                    ));
                }
            }
        }
    }
    for (name, _, _) in rows {
        if !members.iter().any(|m| m.0 == *name) {
            bad.push(format!("the row {name} is not a workspace member"));
        }
    }
    bad
}

#[test]
fn every_crate_has_a_row_in_the_crate_map_and_every_row_is_a_crate() {
    let root = root();
    let members: Vec<(String, String, BTreeSet<String>)> = packages()
        .iter()
        .map(|p| {
            let bins = p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
                .map(|t| t["name"].as_str().unwrap().to_string())
                .collect();
            let d = dir(p);
            let rel = d.strip_prefix(&root).unwrap().display().to_string();
            (name(p).to_string(), rel, bins)
        })
        .collect();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let rows = crate_rows(&doc);
    assert!(
        rows.len() > 3,
        "docs/architecture.md has no Crates table with a `| crate (dir) |` header"
    );
    let bad = crate_table_errors(&rows, &members);
    assert!(
        bad.is_empty(),
        "docs/architecture.md's Crates table and the workspace differ (add or fix the row: \
         crate, directory, binaries, what it owns, what it may not depend on):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn the_crate_map_check_sees_each_kind_of_drift() {
    let doc = "## Crates\n\n| crate (dir) | binary | owns | may not |\n|---|---|---|---|\n\
               | `a` (`x/a/`) | `a`, `a-bench` | things | - |\n\
               | `b` (`x/b/`) | - | things | - |\n\
               | `gone` (`x/gone/`) | - | things | - |\n\n\
               | module | owns |\n|---|---|\n| `m` | not a crate |\n";
    let rows = crate_rows(doc);
    assert_eq!(rows.len(), 3, "only the Crates table's rows: {rows:?}");
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let members = vec![
        ("a".to_string(), "x/a".to_string(), set(&["a", "a-cli"])),
        ("b".to_string(), "x/bb".to_string(), set(&[])),
        ("new".to_string(), "x/new".to_string(), set(&[])),
    ];
    assert_eq!(
        crate_table_errors(&rows, &members),
        [
            "a's row does not name its binary a-cli",
            "a's row names a-bench, which is not its binary",
            "b's row says `x/b/`; it is in `x/bb/`",
            "new (x/new/) has no row",
            "the row gone is not a workspace member",
        ]
    );
}

#[test]
fn the_library_is_its_root_and_the_modules_it_declares_outside_tests() {
    let dir = std::env::temp_dir().join(format!("tidy-library-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = [
        (
            "lib.rs",
            "pub mod a;\nmod b;\n#[cfg(test)]\nmod agreement;\n",
        ),
        ("a.rs", "mod inner;\n#[cfg(test)]\nmod tests;\n"),
        ("a/inner.rs", ""),
        ("a/tests.rs", "fn t() { let _ = std::fs::read(\"x\"); }"),
        ("b/mod.rs", ""),
        ("agreement.rs", "fn t() { let _ = std::env::var(\"X\"); }"),
    ];
    for (path, text) in files {
        let f = dir.join(path);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    }
    let got: Vec<String> = library_files(&dir.join("lib.rs"))
        .iter()
        .map(|f| f.strip_prefix(&dir).unwrap().display().to_string())
        .collect();
    assert_eq!(got, ["lib.rs", "a.rs", "a/inner.rs", "b/mod.rs"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// The first line where `have` and `want` differ: (its number, from 1; `have`'s line, `want`'s),
/// `<end of file>` past either's end.
fn first_difference(have: &str, want: &str) -> Option<(usize, String, String)> {
    let (mut h, mut w) = (have.lines(), want.lines());
    for n in 1.. {
        match (h.next(), w.next()) {
            (None, None) => return None,
            (a, b) if a == b => continue,
            (a, b) => {
                let end = |l: Option<&str>| l.unwrap_or("<end of file>").to_string();
                return Some((n, end(a), end(b)));
            }
        }
    }
    None
}

/// docs/config.md is what `socialweb-broker config reference` prints, made from the
/// configuration's types (their doc comments and defaults): the page cannot drift from them.
#[test]
fn the_config_reference_is_what_the_code_generates() {
    let want = socialweb_broker::config::reference::Reference::new().markdown();
    let have = std::fs::read_to_string(root().join("docs/config.md")).unwrap_or_default();
    let diff = first_difference(&have, &want).or_else(|| {
        (have != want).then(|| {
            (
                have.lines().count() + 1,
                "(line endings)".into(),
                String::new(),
            )
        })
    });
    if let Some((n, h, w)) = diff {
        panic!(
            "docs/config.md differs from what the configuration's types generate, first at \
             line {n}:\n  docs/config.md: {h}\n  generated:      {w}\nregenerate it: \
             cargo run -p socialweb-broker --offline -- config reference > docs/config.md"
        );
    }
}

#[test]
fn the_reference_check_names_the_first_differing_line() {
    assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
    assert_eq!(
        first_difference("a\nb\nc\n", "a\nB\nc\n"),
        Some((2, "b".into(), "B".into()))
    );
    assert_eq!(
        first_difference("a\n", "a\nmore\n"),
        Some((2, "<end of file>".into(), "more".into()))
    );
}

/// Keys the example file in docs/operations.md gives values other than the defaults: the
/// addresses, URLs, keys and lists an operator writes in.
const OPERATIONS_EXAMPLE_VALUES: &[&str] = &[
    "service_addr",
    "store.url",
    "market.url",
    "market.pin",
    "local_provider.seed_images",
    "clusters.upstream_resolvers",
];

/// `at`'s leaves in `example` whose values differ from `defaults`' (dotted keys).
fn differing(example: &toml::Value, defaults: &toml::Value, at: &str, out: &mut Vec<String>) {
    match example {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                let d = defaults
                    .get(k)
                    .cloned()
                    .unwrap_or(toml::Value::Boolean(false));
                differing(v, &d, &key, out);
            }
        }
        toml::Value::String(a) if same_duration(a, defaults.as_str().unwrap_or("")) => {}
        v if v != defaults => out.push(at.to_string()),
        _ => {}
    }
}

/// Whether two texts are the same duration (`90s` and `1m 30s`).
fn same_duration(a: &str, b: &str) -> bool {
    matches!(
        (humantime::parse_duration(a), humantime::parse_duration(b)),
        (Ok(x), Ok(y)) if x == y
    )
}

/// docs/operations.md's example file is a configuration the broker takes, and says the
/// defaults (issue 39: it said `datastore = "etcd"` and `gogc = 100`, the code kine and 50).
#[test]
fn the_operations_example_file_takes_and_says_the_defaults() {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let block: String = doc
        .split("\n## Configuration\n")
        .nth(1)
        .and_then(|s| s.split("```toml\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("docs/operations.md's Configuration section has a ```toml block")
        .into();
    let example: toml::Value =
        toml::from_str(&block).unwrap_or_else(|e| panic!("docs/operations.md's example file: {e}"));
    let _: socialweb_broker::config::Config = toml::from_str(&block)
        .unwrap_or_else(|e| panic!("docs/operations.md's example is not a broker's file: {e}"));
    let defaults = toml::Value::try_from(socialweb_broker::config::Config::default()).unwrap();
    let mut off = Vec::new();
    differing(&example, &defaults, "", &mut off);
    off.retain(|k| !OPERATIONS_EXAMPLE_VALUES.contains(&k.as_str()));
    assert!(
        off.is_empty(),
        "docs/operations.md's example file gives these keys values that are not their defaults \
         (docs/config.md has each; write the default, or list the key in \
         OPERATIONS_EXAMPLE_VALUES if it is an example value): {off:?}"
    );
}
