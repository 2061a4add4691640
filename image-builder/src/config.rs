//! The one input file (`docs/image.md` is its reference): TOML, every path relative to the
//! file's directory, `${VAR}` expanded from the environment. Errors name the key.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    vcpu: u32,
    #[serde(rename = "memMiB")]
    mem_mib: u64,
    rootfs_headroom_mib: u64,
    rootfs_size_mib: Option<u64>,
    #[serde(default = "epoch")]
    source_date_epoch: u64,
    base: RawBase,
    kube: String,
    pause: String,
    agent: String,
    cni: String,
    agent_unit: String,
    #[serde(default)]
    files: Vec<RawFile>,
    #[serde(default)]
    images: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum RawBase {
    Dir(String),
    Tarball(String),
    Debootstrap(Debootstrap),
}

/// A minimal Debian made with `debootstrap`, cached by these fields.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Debootstrap {
    pub suite: String,
    pub mirror: String,
    #[serde(default = "minbase")]
    pub variant: String,
    pub packages: Vec<String>,
}

/// 2024-01-01T00:00:00Z. Not 0: e2fsprogs reads a fake time of 0 as none.
fn epoch() -> u64 {
    1_704_067_200
}

fn minbase() -> String {
    "minbase".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    src: String,
    dest: String,
    #[serde(default = "file_mode")]
    mode: u32,
}

fn file_mode() -> u32 {
    0o644
}

/// Where the root filesystem starts from.
#[derive(Debug, Clone)]
pub enum Base {
    Dir(PathBuf),
    Tarball(PathBuf),
    Debootstrap(Debootstrap),
}

/// An extra file put into the image.
#[derive(Debug, Clone)]
pub struct ExtraFile {
    pub src: PathBuf,
    /// Absolute path in the image.
    pub dest: String,
    pub mode: u32,
}

/// The checked configuration: every path absolute and present.
#[derive(Debug, Clone)]
pub struct Config {
    pub vcpu: u32,
    pub mem_mib: u64,
    pub rootfs_headroom_mib: u64,
    /// A fixed size instead of the computed one (refused if the tree does not fit).
    pub rootfs_size_mib: Option<u64>,
    /// Every timestamp in the image (`SOURCE_DATE_EPOCH`'s meaning).
    pub source_date_epoch: u64,
    pub base: Base,
    /// Our Kubernetes build's multicall binary: the kubelet and kube-proxy.
    pub kube: PathBuf,
    /// The pod sandbox's process; the builder makes the sandbox image from it.
    pub pause: PathBuf,
    pub agent: PathBuf,
    pub cni: PathBuf,
    pub agent_unit: PathBuf,
    pub files: Vec<ExtraFile>,
    /// OCI or Docker image archives for the seed disk.
    pub images: Vec<PathBuf>,
}

/// `${VAR}` from the environment; an unset variable is an error naming it and the key.
fn expand(key: &str, s: &str) -> Result<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .with_context(|| format!("{key}: {s:?} has an unclosed ${{"))?;
        let var = &after[..end];
        let val = std::env::var(var)
            .with_context(|| format!("{key}: {s:?} names ${{{var}}}, which is not set"))?;
        out.push_str(&val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `s` (expanded) relative to `dir`, and it must exist.
fn input(dir: &Path, key: &str, s: &str) -> Result<PathBuf> {
    let p = dir.join(expand(key, s)?);
    if !p.exists() {
        bail!("{key}: {} does not exist", p.display());
    }
    Ok(p)
}

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the config {}", path.display()))?;
        let raw: Raw =
            toml::from_str(&text).with_context(|| format!("the config {}", path.display()))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        Config::from_raw(raw, &dir).with_context(|| format!("the config {}", path.display()))
    }

    fn from_raw(raw: Raw, dir: &Path) -> Result<Config> {
        if raw.vcpu == 0 || raw.vcpu > 1024 {
            bail!("vcpu: {} is not 1..=1024", raw.vcpu);
        }
        if raw.mem_mib < 256 {
            bail!(
                "memMiB: {} is below 256 (a node runs containerd and the kubelet)",
                raw.mem_mib
            );
        }
        if raw.source_date_epoch == 0 {
            bail!("source_date_epoch: must be at least 1 (e2fsprogs reads 0 as the clock's time)");
        }
        let base = match raw.base {
            RawBase::Dir(d) => Base::Dir(input(dir, "base.dir", &d)?),
            RawBase::Tarball(t) => Base::Tarball(input(dir, "base.tarball", &t)?),
            RawBase::Debootstrap(d) => {
                if d.suite.is_empty() || d.mirror.is_empty() {
                    bail!("base.debootstrap: suite and mirror must not be empty");
                }
                Base::Debootstrap(d)
            }
        };
        let mut files = Vec::new();
        for (i, f) in raw.files.iter().enumerate() {
            let key = format!("files[{i}]");
            if !f.dest.starts_with('/') || f.dest.split('/').any(|c| c == "..") {
                bail!(
                    "{key}.dest: {:?} is not an absolute path inside the image",
                    f.dest
                );
            }
            if f.mode > 0o7777 {
                bail!("{key}.mode: {:o} is not a file mode", f.mode);
            }
            let src = input(dir, &format!("{key}.src"), &f.src)?;
            if !src.is_file() {
                bail!("{key}.src: {} is not a file", src.display());
            }
            files.push(ExtraFile {
                src,
                dest: f.dest.clone(),
                mode: f.mode,
            });
        }
        let mut images = Vec::new();
        for (i, img) in raw.images.iter().enumerate() {
            images.push(input(dir, &format!("images[{i}]"), img)?);
        }
        Ok(Config {
            vcpu: raw.vcpu,
            mem_mib: raw.mem_mib,
            rootfs_headroom_mib: raw.rootfs_headroom_mib,
            rootfs_size_mib: raw.rootfs_size_mib,
            source_date_epoch: raw.source_date_epoch,
            base,
            kube: input(dir, "kube", &raw.kube)?,
            pause: input(dir, "pause", &raw.pause)?,
            agent: input(dir, "agent", &raw.agent)?,
            cni: input(dir, "cni", &raw.cni)?,
            agent_unit: input(dir, "agent_unit", &raw.agent_unit)?,
            files,
            images,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config> {
        // A directory per call: tests run in parallel threads of one process, and a shared
        // image.toml was read empty while another test rewrote it.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ib-config-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["kube", "pause", "agent", "cni", "unit", "extra"] {
            std::fs::write(dir.join(f), f).unwrap();
        }
        let p = dir.join("image.toml");
        std::fs::write(&p, text).unwrap();
        Config::load(&p)
    }

    const GOOD: &str = r#"
vcpu = 2
memMiB = 2048
rootfs_headroom_mib = 256
kube = "kube"
pause = "pause"
agent = "agent"
cni = "cni"
agent_unit = "unit"
[base.debootstrap]
suite = "bookworm"
mirror = "http://deb.debian.org/debian"
packages = ["systemd"]
"#;

    #[test]
    fn a_good_config_loads() {
        let c = load(GOOD).unwrap();
        assert_eq!(c.vcpu, 2);
        assert!(matches!(c.base, Base::Debootstrap(ref d) if d.variant == "minbase"));
    }

    #[test]
    fn errors_name_the_key() {
        let e = format!(
            "{:#}",
            load(&GOOD.replace("\"agent\"", "\"nope\"")).unwrap_err()
        );
        assert!(
            e.contains("agent: ") && e.contains("nope does not exist"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            load(&GOOD.replace("vcpu = 2", "vcpu = 0")).unwrap_err()
        );
        assert!(e.contains("vcpu: 0"), "{e}");
        let e = format!("{:#}", load(&GOOD.replace("vcpu = 2", "")).unwrap_err());
        assert!(e.contains("vcpu"), "{e}");
        let e = format!(
            "{:#}",
            load(&format!(
                "{GOOD}\n[[files]]\nsrc = \"extra\"\ndest = \"etc/x\"\n"
            ))
            .unwrap_err()
        );
        assert!(e.contains("files[0].dest"), "{e}");
        let e = format!(
            "{:#}",
            load(&GOOD.replace("\"kube\"", "\"${SOCIALWEB_SURELY_UNSET}/kube\"")).unwrap_err()
        );
        assert!(
            e.contains("kube: ") && e.contains("SOCIALWEB_SURELY_UNSET"),
            "{e}"
        );
    }
}
