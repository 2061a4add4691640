//! The broker's house rules (docs/architecture.md, "Inside the broker"), checked on every run
//! beside `tidy.rs`: no import cycle between the broker's top-level modules, the broker uses
//! the provider crate only through its entry points (never its internals), and no function
//! in `broker/` is longer than [`MAX_LINES`] unless a `// tidy: long` comment above it says
//! why. Each failure says what to change. Reads sources only: no root, no network.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The longest a function may be, in lines from its signature to its closing brace.
const MAX_LINES: usize = 80;

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

fn broker_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .join("broker")
}

/// Every `.rs` file under `dir` (recursively), leaving out build output.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            if !path.ends_with("target") {
                out.extend(rust_files(&path));
            }
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The broker crate's top-level modules (`src/<m>.rs` or `src/<m>/`), each with its files.
fn modules() -> BTreeMap<String, Vec<PathBuf>> {
    let src = broker_dir().join("src");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let path = e.path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if stem == "lib" || stem == "main" {
            continue;
        }
        let files = if path.is_dir() {
            rust_files(&path)
        } else {
            vec![path.clone()]
        };
        out.entry(stem).or_insert_with(Vec::new).extend(files);
    }
    out
}

/// The modules a source file names as `crate::<module>` in its code (paths and `use`
/// trees; doc links and comments are not imports).
fn named_modules(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    struct Names<'a> {
        modules: &'a BTreeSet<String>,
        found: BTreeSet<String>,
    }
    impl Names<'_> {
        fn saw(&mut self, first: &syn::Ident, second: Option<&syn::Ident>) {
            if first == "crate"
                && let Some(m) = second.map(|s| s.to_string())
                && self.modules.contains(&m)
            {
                self.found.insert(m);
            }
        }
    }
    impl<'ast> Visit<'ast> for Names<'_> {
        fn visit_path(&mut self, p: &'ast syn::Path) {
            let mut segs = p.segments.iter().map(|s| &s.ident);
            if let Some(first) = segs.next() {
                self.saw(first, segs.next());
            }
            syn::visit::visit_path(self, p);
        }
        fn visit_use_path(&mut self, u: &'ast syn::UsePath) {
            let seconds: Vec<&syn::Ident> = match &*u.tree {
                syn::UseTree::Path(p) => vec![&p.ident],
                syn::UseTree::Name(n) => vec![&n.ident],
                syn::UseTree::Rename(r) => vec![&r.ident],
                syn::UseTree::Group(g) => g
                    .items
                    .iter()
                    .filter_map(|t| match t {
                        syn::UseTree::Path(p) => Some(&p.ident),
                        syn::UseTree::Name(n) => Some(&n.ident),
                        _ => None,
                    })
                    .collect(),
                syn::UseTree::Glob(_) => vec![],
            };
            for second in seconds {
                self.saw(&u.ident, Some(second));
            }
            syn::visit::visit_use_path(self, u);
        }
    }
    let ast = syn::parse_file(text).expect("the broker's sources parse");
    let mut n = Names {
        modules,
        found: BTreeSet::new(),
    };
    n.visit_file(&ast);
    n.found
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

#[test]
fn the_broker_modules_import_no_cycle() {
    let modules = modules();
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|(m, files)| {
            let mut deps: BTreeSet<String> = files
                .iter()
                .flat_map(|f| named_modules(&std::fs::read_to_string(f).unwrap(), &names))
                .collect();
            deps.remove(m);
            (m.clone(), deps)
        })
        .collect();
    assert!(
        graph.contains_key("daemon") && graph.contains_key("services"),
        "the module map of broker/src changed; update this test: {:?}",
        graph.keys()
    );
    // The scanner sees imports (a check that finds no edge would pass any code).
    assert!(
        graph["api"].contains("command") && graph["daemon"].contains("cluster"),
        "the import scanner found {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the broker's modules import one another in a cycle: {} (docs/architecture.md: \
             front doors -> services -> subsystems; only daemon, the composition root, sees \
             everything, and nothing imports it)",
            cycle.join(" -> ")
        );
    }
    for (m, deps) in &graph {
        assert!(
            !deps.contains("daemon"),
            "{m} imports the daemon: the composition root is imported by no one"
        );
    }
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
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn the_broker_uses_only_the_provider_crates_entry_points() {
    let mut bad = Vec::new();
    for f in rust_files(&broker_dir().join("src")) {
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
/// modules (a table of cases is data, not a function to read).
struct Long<'a> {
    lines: &'a [&'a str],
    file: String,
    found: Vec<String>,
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
        // A `// tidy: long` comment among the lines just above (its docs and attributes).
        let excused = self.lines[start.saturating_sub(12)..start.saturating_sub(1)]
            .iter()
            .any(|l| l.trim_start().starts_with("// tidy: long"));
        if !excused {
            self.found
                .push(format!("{}:{start}: {name} is {len} lines", self.file));
        }
    }
}

fn is_test_module(m: &syn::ItemMod) -> bool {
    m.attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().contains("test"))
    })
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

#[test]
fn no_broker_function_is_longer_than_80_lines() {
    let mut found = Vec::new();
    for f in rust_files(&broker_dir()) {
        let text = std::fs::read_to_string(&f).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let lines: Vec<&str> = text.lines().collect();
        let mut v = Long {
            lines: &lines,
            file: f.display().to_string(),
            found: Vec::new(),
        };
        v.visit_file(&ast);
        found.extend(v.found);
    }
    assert!(
        found.is_empty(),
        "functions over {MAX_LINES} lines in broker/: split them into steps that each do one \
         thing, or put a `// tidy: long because ...` comment above one that must be long:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body = "    let _x = 1;\n".repeat(MAX_LINES);
    let text = format!(
        "fn short() {{}}\nfn long() {{\n{body}}}\n#[cfg(test)]\nmod tests {{ fn long_test() {{\n{body}}} }}\n"
    );
    let ast = syn::parse_file(&text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut v = Long {
        lines: &lines,
        file: "x.rs".into(),
        found: Vec::new(),
    };
    v.visit_file(&ast);
    assert_eq!(
        v.found,
        [format!("x.rs:2: long is {} lines", MAX_LINES + 2)]
    );
}
