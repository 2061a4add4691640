//! The configuration's reference, from one source: the types of [`super`] (their keys, types
//! and doc comments, as the JSON Schema `schemars` derives from them, serde's names
//! included), the defaults as `Config::default()` writes them (what `check-config` prints
//! for an empty file), and the variables of [`super::ENV`]. `socialweb-broker config
//! reference` prints it; docs/config.md is its output, and tests/tests/tidy.rs fails when
//! the two differ.

use serde::Serialize;
use serde_json::Value;

use super::{Config, ENV, ProviderFile};

/// The header docs/config.md starts with (the command prints it too).
const HEADER: &str = "# Configuration reference

Every key of the broker's configuration file and of a provider machine's, with its type, its
default and what it means. This page is the output of `socialweb-broker config reference`
(`--json` for scripts): do not edit it, change the doc comments and defaults in
`broker/src/config/` (one file per section) and run `socialweb-broker config reference > docs/config.md`
(`tests/tests/tidy.rs` fails when the two differ). It is derived from the configuration's
own types with `schemars` (JSON Schema from Rust types, reading their doc comments and
serde's names, the crate `schemars` maintains for `serde` types) rather than kept by hand,
so a key cannot be added, renamed or given another default without the reference
following; `socialweb-broker config schema` prints that JSON Schema, for editors that check
TOML against one. Defaults are what `socialweb-broker check-config` prints for an empty
file.

The file is TOML and every key is optional; a variable named beside a key overrides the
file; a key the schema does not have, or a bad value, stops the daemon with an error naming
it. `docs/operations.md` shows a whole file.
";

/// One key of a configuration file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Key {
    /// Its dotted path: `scale.hold`; `market.providers.pin` for a key of each
    /// `[[market.providers]]` table.
    pub key: String,
    /// Its TOML type: `string`, `integer`, `duration`, `array of string`...
    #[serde(rename = "type")]
    pub ty: String,
    /// The values an enumeration takes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Its default, as JSON (`null`: unset).
    pub default: Value,
    /// Its default as TOML writes it; `None`: unset, or required.
    pub default_toml: Option<String>,
    /// Whether a table that has this key must give it.
    pub required: bool,
    /// The environment variable that overrides it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variable: Option<String>,
    pub meaning: String,
}

/// A table of a configuration file and its keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// Its dotted name: `""` for the top level, `scale`, `market.providers`.
    pub name: String,
    /// An array of tables (`[[market.providers]]`).
    pub array: bool,
    pub meaning: String,
    pub keys: Vec<Key>,
}

/// The broker's configuration, and what a provider machine reads of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reference {
    pub broker: Vec<Table>,
    pub provider: Vec<Table>,
}

impl Reference {
    pub fn new() -> Reference {
        Reference {
            broker: tables(&schema(false), &broker_defaults()),
            provider: tables(&schema(true), &defaults(&ProviderFile::default())),
        }
    }

    /// The reference as docs/config.md has it.
    pub fn markdown(&self) -> String {
        let mut out = String::from(HEADER);
        out.push_str("\n## The broker: `socialweb-broker run`\n");
        for t in &self.broker {
            table_markdown(t, &mut out);
        }
        out.push_str(
            "\n## A provider machine: `socialweb-broker provider`\n\n\
             `socialweb-broker provider` (and `provider-pin`) read a file of the broker's \
             format and use these keys of it; `local_provider.brokers` must list at least \
             one broker. The file is still checked whole, so another key must be one of the \
             broker's, and `socialweb-broker check-config --provider` names those a provider \
             does not read.\n",
        );
        for t in &self.provider {
            table_markdown(t, &mut out);
        }
        out
    }

    /// Every key of the broker's configuration, dotted (`scale.hold`, `market.providers.pin`).
    pub fn broker_keys(&self) -> Vec<String> {
        self.broker
            .iter()
            .flat_map(|t| t.keys.iter().map(|k| k.key.clone()))
            .collect()
    }
}

impl Default for Reference {
    fn default() -> Reference {
        Reference::new()
    }
}

/// The JSON Schema of the broker's configuration, or of a provider machine's.
pub fn schema(provider: bool) -> Value {
    if provider {
        schemars::schema_for!(ProviderFile).to_value()
    } else {
        schemars::schema_for!(Config).to_value()
    }
}

/// The broker's defaults, with the sections a written configuration leaves out while they
/// are at their defaults (so that an older broker reads it) put back: their keys have
/// defaults all the same.
fn broker_defaults() -> Value {
    let mut all = defaults(&Config::default());
    let left_out = [
        ("fleet", defaults(&super::Fleet::default())),
        ("disk", defaults(&super::Disk::default())),
        ("backup", defaults(&super::Backup::default())),
        ("certificates", defaults(&super::Certificates::default())),
    ];
    if let Value::Object(m) = &mut all {
        for (name, section) in left_out {
            m.entry(name).or_insert(section);
        }
    }
    // And the keys left out while at their defaults.
    let keys = [
        ("clusters", "cgroup_parent", Value::from("root")),
        ("store", "previous_key_files", Value::Array(Vec::new())),
    ];
    for (section, key, default) in keys {
        if let Some(Value::Object(s)) = all.get_mut(section) {
            s.entry(key).or_insert(default);
        }
    }
    all
}

/// A configuration's values as TOML writes them (what `check-config` prints), as JSON.
fn defaults<T: Serialize>(c: &T) -> Value {
    toml::Value::try_from(c)
        .ok()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(Value::Null)
}

fn table_markdown(t: &Table, out: &mut String) {
    let title = match (t.name.as_str(), t.array) {
        ("", _) => "The top level".to_string(),
        (n, true) => format!("`[[{n}]]`"),
        (n, false) => format!("`[{n}]`"),
    };
    out.push_str(&format!("\n### {title}\n\n"));
    if !t.meaning.is_empty() {
        out.push_str(&format!("{}\n\n", t.meaning));
    }
    out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
    for k in &t.keys {
        let name = k.key.rsplit('.').next().unwrap_or(&k.key);
        let ty = if k.values.is_empty() {
            k.ty.clone()
        } else {
            k.values
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let default = match (&k.default_toml, k.required) {
            (_, true) => "required".to_string(),
            (Some(d), _) => format!("`{d}`"),
            (None, _) => "unset".to_string(),
        };
        let mut meaning = k.meaning.clone();
        if let Some(v) = &k.variable {
            meaning.push_str(&format!(" Variable: `{v}`."));
        }
        out.push_str(&format!(
            "| `{name}` | {} | {} | {} |\n",
            cell(&ty),
            cell(&default),
            cell(meaning.trim())
        ));
    }
}

/// A table cell: its pipes escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The schema's `$ref` followed, if it is one (or wraps one in `allOf`).
fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    if let Some([one]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
        return resolve(root, one);
    }
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/$defs/")
            .and_then(|name| root["$defs"].get(name))
            .unwrap_or(s),
        None => s,
    }
}

/// A doc comment as one line: schemars splits a title from the description; both are kept.
fn meaning(s: &Value) -> String {
    let text = [s.get("title"), s.get("description")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `s` without `null` among its alternatives (an `Option`).
fn not_null<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    let s = resolve(root, s);
    if let Some(alts) = s.get("anyOf").and_then(Value::as_array) {
        let rest: Vec<&Value> = alts.iter().filter(|a| a["type"] != "null").collect();
        if let [one] = rest.as_slice() {
            return resolve(root, one);
        }
    }
    s
}

/// The schema of a table's keys, if `s` is a table.
fn properties<'a>(root: &'a Value, s: &'a Value) -> Option<&'a serde_json::Map<String, Value>> {
    not_null(root, s)
        .get("properties")
        .and_then(Value::as_object)
}

/// A key's TOML type and, for an enumeration, its values.
fn type_of(root: &Value, s: &Value) -> (String, Vec<String>) {
    let s = not_null(root, s);
    if s == &Value::Bool(true) || s.as_object().is_some_and(|o| o.is_empty()) {
        return ("any".into(), vec![]);
    }
    let consts = |alts: &Vec<Value>| -> Option<Vec<String>> {
        alts.iter()
            .map(|a| {
                a.get("const")
                    .or_else(|| a.get("enum").and_then(|e| e.get(0)))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    };
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        let v = values.iter().filter_map(|v| v.as_str().map(str::to_string));
        return ("string".into(), v.collect());
    }
    if let Some(v) = s.get("oneOf").and_then(Value::as_array).and_then(consts) {
        return ("string".into(), v);
    }
    let ty = match &s["type"] {
        Value::Array(ts) => ts
            .iter()
            .filter(|t| *t != "null")
            .filter_map(Value::as_str)
            .next()
            .unwrap_or("any"),
        Value::String(t) => t.as_str(),
        _ => "any",
    };
    let name = match (ty, s.get("format").and_then(Value::as_str)) {
        ("string", Some("humantime")) => "duration (`90s`, `2m`, `1h30m`)".to_string(),
        ("string", Some("ipv4")) => "IPv4 address".to_string(),
        ("integer", Some(f)) if f.starts_with("uint") => "integer (0 or more)".to_string(),
        ("array", _) => {
            let (inner, values) = type_of(root, &s["items"]);
            return (format!("array of {inner}"), values);
        }
        ("object", _) => "table".to_string(),
        (t, _) => t.to_string(),
    };
    (name, vec![])
}

/// The tables of the schema `root`, depth first, each with its keys; `defaults` is the
/// configuration's default value.
fn tables(root: &Value, defaults: &Value) -> Vec<Table> {
    let mut out = Vec::new();
    // The root's title is the type's name; its description is its doc comment.
    let about = meaning(&serde_json::json!({"description": root["description"]}));
    walk(root, root, "", false, &about, defaults, &mut out);
    out
}

/// Adds the table `s` (named `name`) and the tables under it to `out`.
fn walk(
    root: &Value,
    s: &Value,
    name: &str,
    array: bool,
    about: &str,
    defaults: &Value,
    out: &mut Vec<Table>,
) {
    let Some(props) = properties(root, s) else {
        return;
    };
    let required: Vec<&str> = not_null(root, s)["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let at = out.len();
    out.push(Table {
        name: name.to_string(),
        array,
        meaning: about.to_string(),
        keys: Vec::new(),
    });
    let mut below = Vec::new();
    for (k, p) in props {
        let key = if name.is_empty() {
            k.clone()
        } else {
            format!("{name}.{k}")
        };
        let doc = match meaning(p) {
            m if m.is_empty() => meaning(resolve(root, p)),
            m => m,
        };
        let item = not_null(root, p).get("items").map(|i| resolve(root, i));
        if properties(root, p).is_some() {
            below.push((key, p, false, doc, defaults.get(k).cloned()));
            continue;
        }
        // A key's default: the configuration's (a nested table's, for a table in an
        // array: the schema's, as serde's field default gives it).
        let default = if array {
            p.get("default").cloned().unwrap_or(Value::Null)
        } else {
            defaults.get(k).cloned().unwrap_or(Value::Null)
        };
        let (ty, values) = match item {
            Some(i) if i.get("properties").is_some() => {
                below.push((key.clone(), i, true, doc.clone(), None));
                (format!("array of `[[{key}]]` tables"), vec![])
            }
            _ => type_of(root, p),
        };
        let required = required.contains(&k.as_str());
        out[at].keys.push(Key {
            variable: variable(&key),
            default_toml: toml_literal(&default),
            default,
            required,
            ty,
            values,
            meaning: doc,
            key,
        });
    }
    for (key, p, array, doc, d) in below {
        walk(root, p, &key, array, &doc, &d.unwrap_or(Value::Null), out);
    }
}

/// The variable that overrides `key`, if one does.
fn variable(key: &str) -> Option<String> {
    ENV.iter()
        .find(|(_, k)| *k == key)
        .map(|(v, _)| v.to_string())
}

/// A default as a TOML file writes it (`"2m"`, `[]`, `16`); `None` for none.
fn toml_literal(v: &Value) -> Option<String> {
    if v.is_null() {
        return None;
    }
    let t: toml::Value = serde_json::from_value(v.clone()).ok()?;
    Some(t.to_string())
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, LocalShape, ProviderRef, reference};

    /// Every key a configuration writes, dotted (`market.providers.pin` for each
    /// `[[market.providers]]`), down to the keys of `reference` (whose values may be tables).
    fn written_keys(v: &toml::Value, at: &str, reference: &[String], out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t) if !reference.iter().any(|k| k == at) => {
                for (k, v) in t {
                    let key = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    written_keys(v, &key, reference, out);
                }
            }
            toml::Value::Array(a) if a.first().is_some_and(toml::Value::is_table) => {
                out.push(at.to_string());
                for (k, v) in a[0].as_table().into_iter().flatten() {
                    written_keys(v, &format!("{at}.{k}"), reference, out);
                }
            }
            _ => out.push(at.to_string()),
        }
    }

    /// A configuration with every optional key set and every array given an element.
    fn everything() -> Config {
        let mut c = Config::default();
        c.store.url = Some("sqlite://x".into());
        c.market.url = Some("https://m".into());
        c.market.pin = Some("sha256:00".into());
        c.market.image = Some("local".into());
        c.market.providers.push(ProviderRef {
            name: "east".into(),
            url: "https://198.51.100.11:7480".into(),
            pin: Some("sha256:00".into()),
            region: None,
            zone: None,
        });
        c.local_provider.shapes.push(LocalShape {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
            price_micros_per_hour: 1,
        });
        c.local_provider.kubelet_config_patch = Some(serde_json::json!({"maxPods": 30}));
        c.local_provider.image = Some("/srv/image".into());
        c.front.public_url = Some("https://b".into());
        c.front.service_did = Some("did:web:b".into());
        c.front.tls_cert = Some("/c".into());
        c.front.tls_key = Some("/k".into());
        c.store.previous_key_files = vec!["/old.key".into()];
        c.clusters.cgroup_parent = crate::config::CgroupParent::Own;
        // The sections written only when not at their defaults.
        c.fleet.enabled = true;
        c.disk.min_free_mib = 1;
        c.backup.keep = 1;
        c.certificates.renew_before = std::time::Duration::from_secs(60);
        c
    }

    /// The reference names every key the configuration has, and no other: a key added to a
    /// type, or to `NodeSize` and not to its schema's mirror, fails here.
    #[test]
    fn the_reference_has_every_key_and_no_other() {
        let r = reference::Reference::new();
        let keys = r.broker_keys();
        let mut written = Vec::new();
        let v = toml::Value::try_from(everything()).unwrap();
        written_keys(&v, "", &keys, &mut written);
        for k in &written {
            assert!(keys.contains(k), "{k} is not in the reference");
        }
        // What `everything` leaves unset is an optional key, unset by default.
        for t in &r.broker {
            for k in &t.keys {
                assert!(
                    written.contains(&k.key) || k.default.is_null(),
                    "{} is in the reference, not in the configuration",
                    k.key
                );
            }
        }
        let provider: Vec<String> = r
            .provider
            .iter()
            .flat_map(|t| t.keys.iter().map(|k| k.key.clone()))
            .collect();
        for k in &provider {
            assert!(
                keys.contains(k),
                "{k} is a provider's key, not the broker's"
            );
        }
        assert!(provider.contains(&"local_provider.brokers".to_string()));
        assert!(!provider.iter().any(|k| k.starts_with("front")));
    }

    /// The defaults are what `check-config` prints for an empty file (issue 39: the page
    /// said etcd and 100), with their variables, types and meanings.
    #[test]
    fn the_reference_says_the_defaults_check_config_prints() {
        let r = reference::Reference::new();
        let key = |name: &str| {
            r.broker
                .iter()
                .flat_map(|t| &t.keys)
                .find(|k| k.key == name)
                .unwrap_or_else(|| panic!("{name}"))
                .clone()
        };
        let printed = toml::to_string_pretty(&Config::default()).unwrap();
        assert!(printed.contains("datastore = \"kine\"") && printed.contains("gogc = 50"));
        assert_eq!(
            key("clusters.datastore").default_toml.as_deref(),
            Some("\"kine\"")
        );
        assert_eq!(
            key("clusters.datastore").values,
            ["etcd", "kine", "postgres"]
        );
        assert_eq!(key("clusters.gogc").default_toml.as_deref(), Some("50"));
        assert_eq!(key("scale.hold").default_toml.as_deref(), Some("\"2m\""));
        assert!(
            key("scale.hold").ty.starts_with("duration"),
            "{:?}",
            key("scale.hold")
        );
        assert_eq!(key("node.memMiB").default_toml.as_deref(), Some("4096"));
        assert_eq!(key("clusters.cpu_max").default_toml.as_deref(), Some("2.0"));
        assert_eq!(key("front.tls_cert").default_toml, None);
        assert!(key("market.providers.name").required);
        assert!(!key("market.providers.pin").required);
        assert_eq!(
            key("state_dir").variable.as_deref(),
            Some("SOCIALWEB_BROKER_STATE_DIR")
        );
        assert!(key("kube_dir").meaning.contains("`kube` and `pause`"));
        let md = r.markdown();
        assert!(
            md.contains("| `gogc` | integer (0 or more) | `50` |"),
            "{md}"
        );
        assert!(md.contains("### `[[market.providers]]`"), "{md}");
        for t in r.broker.iter().chain(&r.provider) {
            for k in &t.keys {
                assert!(!k.meaning.is_empty(), "{} has no doc comment", k.key);
            }
        }
    }
}
