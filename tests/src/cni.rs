//! Calling CNI plugins exactly as a container runtime does: verb and container in `CNI_*`
//! environment variables, the network configuration on stdin, the result or error as JSON on
//! stdout, run inside the node's network namespace.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::netns::Netns;
use crate::process::Spawned;

/// Path of a binary built from this workspace (`target/<profile>/<name>`). `./x test` builds
/// every binary before the tests run; running a test alone needs
/// `cargo build --workspace --bins` first, and the message says so -- also when a source the
/// binary was built from changed since: `cargo test` builds only the test crates, and a test
/// of a stale binary checks the old code. Checked at a process's first call for each binary
/// only: a long run (`./x conformance`, a benchmark) started on a fresh binary is not
/// stopped near its end because a source was edited meanwhile.
pub fn workspace_bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let path = target.join(profile).join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace's binaries first (`cargo build --workspace --bins`, \
         which `./x test` does)",
        path.display()
    );
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if checked.iter().any(|n| n == name) {
        return path;
    }
    if let Some(source) = newer_source(&path) {
        drop(checked);
        panic!(
            "{} is older than {}, which it is built from: build the workspace's binaries \
             first (`cargo build --workspace --bins`, which `./x test` does)",
            path.display(),
            source.display()
        );
    }
    checked.push(name.to_string());
    path
}

/// A source file that binary `bin` was built from and that changed after it was built, by
/// cargo's dep-info beside it (`<bin>.d`: the binary, a colon, every file it was built from);
/// `None` without one. A listed file that is missing is no sign (a build script may watch a
/// file that a fresh clone does not have, such as a loose git ref).
fn newer_source(bin: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok()?;
    let info = std::fs::read_to_string(bin.with_extension("d")).ok()?;
    dep_info_sources(&info).into_iter().find(|src| {
        std::fs::metadata(src)
            .and_then(|m| m.modified())
            .is_ok_and(|changed| changed > built)
    })
}

/// The files of a dep-info file's first rule (`target: a.rs b\ c.rs`; a space in a name is
/// escaped with a backslash).
fn dep_info_sources(info: &str) -> Vec<PathBuf> {
    let Some((_, deps)) = info.lines().next().and_then(|l| l.split_once(": ")) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut name = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => name.extend(chars.next()),
            ' ' => {
                files.extend((!name.is_empty()).then(|| PathBuf::from(std::mem::take(&mut name))))
            }
            c => name.push(c),
        }
    }
    files.extend((!name.is_empty()).then(|| PathBuf::from(name)));
    files
}

/// What one plugin invocation returned.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    /// stdout parsed as JSON, `Null` when empty.
    pub json: Value,
}

impl Outcome {
    /// The error code of an error result.
    pub fn code(&self) -> Option<u64> {
        self.json.get("code").and_then(Value::as_u64)
    }

    pub fn msg(&self) -> String {
        self.json
            .get("msg")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    }

    /// Fails with the plugin's own words unless it succeeded.
    pub fn expect_ok(self, what: &str) -> Result<Outcome> {
        if !self.ok {
            bail!(
                "{what} failed: {} {}",
                self.stdout.trim(),
                self.stderr.trim()
            );
        }
        Ok(self)
    }
}

/// One invocation.
#[derive(Debug, Clone, Default)]
pub struct Call<'a> {
    pub verb: &'a str,
    pub container_id: Option<&'a str>,
    pub netns: Option<String>,
    pub ifname: Option<&'a str>,
    /// Extra environment (CNI_PATH, fault injection).
    pub env: Vec<(&'a str, String)>,
}

impl<'a> Call<'a> {
    /// ADD, DEL or CHECK of `eth0` in `pod` for `container_id`.
    pub fn for_pod(verb: &'a str, container_id: &'a str, pod: &'a Netns) -> Call<'a> {
        Call {
            verb,
            container_id: Some(container_id),
            netns: Some(pod.path().to_string_lossy().into_owned()),
            ifname: Some("eth0"),
            env: Vec::new(),
        }
    }

    pub fn verb(verb: &'a str) -> Call<'a> {
        Call {
            verb,
            ..Default::default()
        }
    }

    fn command(&self, node: &Netns, plugin: &Path) -> Command {
        let mut cmd = node.command(&plugin.to_string_lossy());
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CNI_COMMAND", self.verb)
            .env("CNI_PATH", "/usr/lib/cni");
        for (k, v) in [
            ("CNI_CONTAINERID", self.container_id),
            ("CNI_NETNS", self.netns.as_deref()),
            ("CNI_IFNAME", self.ifname),
        ] {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the plugin inside `node` with `config` on stdin and waits for it.
    pub fn run(&self, node: &Netns, plugin: &Path, config: &Value) -> Result<Outcome> {
        self.run_raw(node, plugin, config.to_string().as_bytes())
    }

    /// Runs the plugin with `stdin` as given (for input that is not JSON at all).
    pub fn run_raw(&self, node: &Netns, plugin: &Path, stdin: &[u8]) -> Result<Outcome> {
        let mut child = self
            .command(node, plugin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", plugin.display()))?;
        child.stdin.take().expect("stdin piped").write_all(stdin)?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let json = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)
                .with_context(|| format!("plugin wrote non-JSON to stdout: {stdout}"))?
        };
        Ok(Outcome {
            ok: out.status.success(),
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            json,
        })
    }

    /// Starts the plugin without waiting (for crash injection); stdin is written and closed.
    pub fn start(&self, node: &Netns, plugin: &Path, config: &Value) -> Result<Spawned> {
        let mut cmd = self.command(node, plugin);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        child
            .stdin
            .take()
            .expect("stdin piped")
            .write_all(config.to_string().as_bytes())?;
        Ok(Spawned::from_child(
            child,
            &format!("{} {}", plugin.display(), self.verb),
        ))
    }
}

/// The address (without prefix) the result gives the interface named `ifname`.
pub fn result_ip(result: &Value, ifname: &str) -> Option<String> {
    let ifaces = result.get("interfaces")?.as_array()?;
    let index = ifaces
        .iter()
        .position(|i| i.get("name").and_then(Value::as_str) == Some(ifname))?;
    result.get("ips")?.as_array()?.iter().find_map(|ip| {
        (ip.get("interface").and_then(Value::as_u64) == Some(index as u64))
            .then(|| {
                ip.get("address")?
                    .as_str()?
                    .split('/')
                    .next()
                    .map(str::to_string)
            })
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn dep_info_lists_the_first_rules_files_with_escaped_spaces() {
        let info = "/t/bin: /a/x.rs /b/with\\ space.rs /c/y.rs\n\n/a/x.rs:\n";
        assert_eq!(
            dep_info_sources(info),
            ["/a/x.rs", "/b/with space.rs", "/c/y.rs"]
                .map(PathBuf::from)
                .to_vec()
        );
        assert!(dep_info_sources("").is_empty());
    }

    #[test]
    fn a_source_changed_after_the_build_makes_the_binary_stale() {
        let tmp = crate::tmp::TempDir::new("depinfo").unwrap();
        let dir = tmp.path();
        let (bin, src, gone) = (dir.join("bin"), dir.join("a.rs"), dir.join("gone.rs"));
        let at = |path: &Path, secs: u64| {
            std::fs::write(path, "x").unwrap();
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        std::fs::write(
            bin.with_extension("d"),
            format!("{}: {} {}\n", bin.display(), src.display(), gone.display()),
        )
        .unwrap();
        at(&src, 1_000);
        at(&bin, 2_000);
        assert_eq!(
            newer_source(&bin),
            None,
            "built after its source, and gone.rs is missing"
        );
        at(&src, 3_000);
        assert_eq!(newer_source(&bin), Some(src.clone()));
    }
}
