//! What the diagnostics subcommands print, from the control socket's typed answers: each
//! function takes an answer and returns the text a person reads (`--json` prints the answer
//! itself). Pure: the tables are tested without an agent.

pub mod dns;
pub mod mesh;
pub mod status;

/// A byte count for people: `1.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// A value's name as serde writes it (a `snake_case` enum variant).
pub fn serde_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
