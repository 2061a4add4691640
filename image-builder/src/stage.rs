//! The staged tree: the base unpacked, the node's parts installed, the image's own settings
//! written, what differs between two builds of the same inputs removed, and every timestamp
//! set to `source_date_epoch`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::base::Ready;
use crate::config::Config;

/// The label of the identity disk the broker writes; the image mounts it at /etc/socialweb.
pub const IDENTITY_LABEL: &str = "socialweb-id";

/// What the staged tree holds, for sizing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Bytes of data in 4 KiB blocks (files, directories, long symlinks).
    pub block_bytes: u64,
    pub inodes: u64,
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `dest` (absolute, in the image) below `root`.
pub fn at(root: &Path, dest: &str) -> PathBuf {
    root.join(dest.trim_start_matches('/'))
}

pub fn unpack(base: &Ready, root: &Path) -> Result<()> {
    std::fs::create_dir_all(root)?;
    match base {
        Ready::Tarball(t) => run(
            Command::new("tar")
                .args(["--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf"])
                .arg(t)
                .arg("-C")
                .arg(root),
            "base.tarball",
        ),
        Ready::Dir(d) => run(
            Command::new("cp").arg("-a").arg(d.join(".")).arg(root),
            "base.dir",
        ),
    }
}

fn put(root: &Path, dest: &str, contents: &[u8], mode: u32) -> Result<()> {
    let p = at(root, dest);
    std::fs::create_dir_all(p.parent().expect("below root"))?;
    let _ = std::fs::remove_file(&p);
    std::fs::write(&p, contents).with_context(|| format!("writing {dest} into the image"))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    std::os::unix::fs::lchown(&p, Some(0), Some(0))?;
    Ok(())
}

fn copy(root: &Path, src: &Path, dest: &str, mode: u32) -> Result<()> {
    let bytes = std::fs::read(src).with_context(|| format!("reading {}", src.display()))?;
    put(root, dest, &bytes, mode)
}

fn link(root: &Path, dest: &str, target: &str) -> Result<()> {
    let p = at(root, dest);
    std::fs::create_dir_all(p.parent().expect("below root"))?;
    let _ = std::fs::remove_file(&p);
    std::os::unix::fs::symlink(target, &p).with_context(|| format!("linking {dest}"))
}

/// The programs the node runs that come from the base (Debian's packages): missing ones are
/// named, with the package that has them.
const FROM_THE_BASE: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/lib/systemd/systemd", "systemd"),
    ("/sbin/init", "systemd-sysv"),
    ("/usr/sbin/nft", "nftables"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/lib/cni/loopback", "containernetworking-plugins"),
];

/// Installs the node's parts and the image's settings.
pub fn install(cfg: &Config, root: &Path, image_json: &[u8]) -> Result<()> {
    for (path, package) in FROM_THE_BASE {
        if std::fs::symlink_metadata(at(root, path)).is_err() {
            bail!(
                "base: the base root filesystem has no {path} (Debian package {package}; \
                 base.debootstrap installs it when listed in packages)"
            );
        }
    }
    copy(root, &cfg.kube, "/usr/local/bin/kube", 0o755)?;
    link(root, "/usr/local/bin/kubelet", "kube")?;
    link(root, "/usr/local/bin/kube-proxy", "kube")?;
    copy(root, &cfg.agent, "/usr/local/bin/socialweb-agent", 0o755)?;
    copy(root, &cfg.cni, "/usr/lib/cni/socialweb-cni", 0o755)?;
    copy(
        root,
        &cfg.agent_unit,
        "/etc/systemd/system/socialweb-agent.service",
        0o644,
    )?;
    let wants = "/etc/systemd/system/multi-user.target.wants";
    link(
        root,
        &format!("{wants}/socialweb-agent.service"),
        "/etc/systemd/system/socialweb-agent.service",
    )?;
    // The agent runs its own containerd; Debian's package enables one of its own.
    let _ = std::fs::remove_file(at(root, &format!("{wants}/containerd.service")));
    // The network: DHCP on the first NIC, by systemd-networkd (part of systemd).
    put(
        root,
        "/etc/systemd/network/80-socialweb.network",
        b"[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n",
        0o644,
    )?;
    link(
        root,
        &format!("{wants}/systemd-networkd.service"),
        "/lib/systemd/system/systemd-networkd.service",
    )?;
    link(
        root,
        "/etc/systemd/system/sockets.target.wants/systemd-networkd.socket",
        "/lib/systemd/system/systemd-networkd.socket",
    )?;
    // The identity disk, read-only at /etc/socialweb; a node without one boots and says so
    // (the agent's unit has a condition on the document). The root grows to its disk at
    // boot (systemd-growfs): a provider gives each VM the root disk its RFP asks for, larger
    // than the image's file, and containerd's content store needs the room.
    put(
        root,
        "/etc/fstab",
        format!(
            "# socialweb node image\nLABEL=socialweb-root / ext4 defaults,noatime,x-systemd.growfs 0 1\n\
             LABEL={IDENTITY_LABEL} /etc/socialweb auto ro,nofail,x-systemd.device-timeout=90s 0 0\n"
        )
        .as_bytes(),
        0o644,
    )?;
    std::fs::create_dir_all(at(root, "/etc/socialweb"))?;
    std::fs::create_dir_all(at(root, "/var/lib/socialweb/images"))?;
    put(root, "/etc/hostname", b"socialweb-node\n", 0o644)?;
    put(
        root,
        "/etc/modules-load.d/socialweb.conf",
        b"# What a node needs: pod traffic through iptables, overlay snapshots, the mesh.\nbr_netfilter\noverlay\ntun\n",
        0o644,
    )?;
    // Empty: systemd makes one at boot, so no two nodes share it.
    put(root, "/etc/machine-id", b"", 0o444)?;
    put(root, "/usr/lib/socialweb/image.json", image_json, 0o644)?;
    for f in &cfg.files {
        copy(root, &f.src, &f.dest, f.mode)?;
    }
    Ok(())
}

/// Files that differ between two builds or two machines and that no node needs.
const VOLATILE: &[&str] = &[
    "/var/lib/dbus/machine-id",
    "/var/lib/systemd/random-seed",
    "/var/cache/ldconfig/aux-cache",
    "/var/cache/debconf/config.dat-old",
    "/var/cache/debconf/templates.dat-old",
    "/var/lib/dpkg/status-old",
    "/var/lib/dpkg/diversions-old",
    "/etc/resolv.conf",
];

/// Removes what differs between builds, then sets every timestamp to `epoch`, and returns
/// what the tree holds.
pub fn normalise(root: &Path, epoch: u64) -> Result<Usage> {
    for v in VOLATILE {
        let _ = std::fs::remove_file(at(root, v));
    }
    for dir in [
        "/var/log",
        "/var/cache/apt",
        "/var/lib/apt/lists",
        "/tmp",
        "/var/tmp",
    ] {
        for e in std::fs::read_dir(at(root, dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if dir == "/var/log" || dir == "/var/lib/apt/lists" {
                    // Keep the directories packages expect (apt, journal); empty them.
                    empty_dir(&p)?;
                    continue;
                }
                std::fs::remove_dir_all(&p)?;
            } else {
                std::fs::remove_file(&p)?;
            }
        }
    }
    let ts = nix::sys::time::TimeSpec::new(epoch as i64, 0);
    let mut usage = Usage::default();
    let mut paths = crate::digest::walk(root)?;
    paths.push(root.to_path_buf());
    for p in paths {
        let m = std::fs::symlink_metadata(&p)?;
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &p,
            &ts,
            &ts,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .with_context(|| format!("setting the time of {}", p.display()))?;
        usage.inodes += 1;
        // Hard links share their blocks.
        if m.nlink() > 1 && m.is_file() {
            usage.block_bytes += m.len().div_ceil(4096) * 4096 / m.nlink();
            continue;
        }
        if m.is_dir() || m.is_file() || (m.file_type().is_symlink() && m.len() > 59) {
            usage.block_bytes += m.len().max(1).div_ceil(4096) * 4096;
        }
    }
    Ok(usage)
}

fn empty_dir(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_type()?.is_dir() {
            empty_dir(&e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// The kernel and initrd the base installed (Debian's linux-image package), if any: a VMM
/// that boots a kernel directly takes them beside the root filesystem.
pub fn kernel(root: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir(at(root, "/boot"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .collect();
    kernels.sort();
    let k = kernels.pop()?;
    let version = k.file_name()?.to_string_lossy()["vmlinuz-".len()..].to_string();
    let initrd = at(root, &format!("/boot/initrd.img-{version}"));
    initrd.exists().then_some((k, initrd))
}
