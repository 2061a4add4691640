//! The previous release, which the upgrade test upgrades from (`tests/tests/upgrade.rs`,
//! docs/operations.md "Upgrades and skew"): its version and commit, pinned here, and its
//! broker, agent and CNI plugin built
//! from that commit's sources (`git archive`, then `cargo build` in a scratch target
//! directory), cached in `~/.cache/socialweb/broker-<version>-<commit>` so that it is built
//! once per machine. Making a release moves these two constants to it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

use crate::nodeimage::cache_dir;

/// The previous release's version.
pub const PREVIOUS_VERSION: &str = "0.1.0";
/// Its commit (the first whose suite passed in CI with the packages' predecessor: stop 48).
pub const PREVIOUS_COMMIT: &str = "7b4da07c75c86cd030033c65c7b55ac342ea5446";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The previous release's binaries.
#[derive(Debug, Clone)]
pub struct Previous {
    pub broker: PathBuf,
    pub agent: PathBuf,
    pub cni: PathBuf,
}

const BINS: [&str; 3] = ["socialweb-broker", "socialweb-agent", "socialweb-cni"];

/// The previous release's `socialweb-broker`, `socialweb-agent` and `socialweb-cni`, built on
/// first use.
pub fn previous() -> Result<Previous> {
    built_at(&format!("v{PREVIOUS_VERSION}"), PREVIOUS_COMMIT)
}

/// The `socialweb-broker`, `socialweb-agent` and `socialweb-cni` of commit `commit` (full
/// hash), called `label` in the cache and messages, built on first use: the previous release
/// for the upgrade test, a baseline for a benchmark (`bench/fleet --only load`).
pub fn built_at(label: &str, commit: &str) -> Result<Previous> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = cache_dir().join(format!("broker-{label}-{}", &commit[..12]));
    let previous = Previous {
        broker: dir.join(BINS[0]),
        agent: dir.join(BINS[1]),
        cni: dir.join(BINS[2]),
    };
    if [&previous.broker, &previous.agent, &previous.cni]
        .iter()
        .all(|b| b.is_file())
    {
        // The newest of its kind is the one in use (./x prune).
        let _ =
            std::fs::File::open(&dir).and_then(|d| d.set_modified(std::time::SystemTime::now()));
        return Ok(previous);
    }
    // A dot-directory: `./x prune` sweeps one an interrupted build left, a day on.
    let scratch = cache_dir().join(format!(".broker-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let src = scratch.join("src");
    std::fs::create_dir_all(&src)?;
    eprintln!(
        "testbed: building the broker, agent and CNI plugin of {label} ({}) once, into {}",
        &commit[..12],
        dir.display()
    );
    ensure_commit(commit)?;
    let mut git = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["archive", "--format=tar", commit])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(&src)
        .stdin(git.stdout.take().context("git's stdout")?)
        .status()
        .context("running tar")?;
    let git = git.wait_with_output()?;
    if !git.status.success() || !tar.success() {
        bail!(
            "git archive {commit} ({label}) failed: {}",
            String::from_utf8_lossy(&git.stderr).trim()
        );
    }
    let target = scratch.join("target");
    let built = Command::new("cargo")
        .current_dir(&src)
        .args(["build", "--locked"])
        .args(BINS.iter().flat_map(|b| ["--bin", b]))
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_INCREMENTAL", "0")
        .status()
        .with_context(|| format!("running cargo build for {label}"))?;
    if !built.success() {
        bail!("building {label}'s broker ({commit}) failed: {built}");
    }
    std::fs::create_dir_all(&dir)?;
    for b in BINS {
        std::fs::copy(target.join("debug").join(b), dir.join(b))
            .with_context(|| format!("keeping {label}'s {b}"))?;
    }
    std::fs::remove_dir_all(&scratch)?;
    Ok(previous)
}

/// Makes sure `commit` is in this clone: a shallow one (CI's, often) fetches just that
/// commit from `origin`.
fn ensure_commit(commit: &str) -> Result<()> {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
    };
    let object = format!("{commit}^{{commit}}");
    if git(&["cat-file", "-e", &object])?.status.success() {
        return Ok(());
    }
    eprintln!("testbed: {commit} is not in this clone; fetching it from origin");
    let fetched = git(&["fetch", "--no-tags", "--depth=1", "origin", commit])?;
    if !fetched.status.success() {
        bail!(
            "commit {commit} is not in this clone and could not be fetched from origin ({}): \
             the upgrade test and `bench/fleet --only load` build from it; fetch the whole \
             history (git fetch --unshallow)",
            String::from_utf8_lossy(&fetched.stderr).trim()
        );
    }
    Ok(())
}
