//! One build, from the config to the output directory. Everything is made in a sibling
//! directory `.<out>.partial-<pid>` and renamed into place at the end, so an error (a missing
//! input, a full disk, a size too small) or an interrupted build leaves no half-written image.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::base::{self, Ready, TempDir};
use crate::config::Config;
use crate::progress::Progress;
use crate::{digest, ext4, seeds, stage};

/// The image's description, written beside it.
pub const DESCRIPTION: &str = "nodeimage.json";
pub const ROOTFS: &str = "rootfs.ext4";
pub const SEEDS: &str = "seeds.img";

/// The inputs, each with its digest, and the fingerprint over all of them.
#[derive(Debug)]
pub struct Inputs {
    pub base: Ready,
    pub list: Vec<(String, String)>,
    pub fingerprint: String,
    pub name: String,
}

fn total_size(paths: &[&Path]) -> u64 {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Digests every input: the base, the node's parts, the extra files and seed images, the
/// numbers (vcpu and memMiB among them) and the tools that decide the bytes.
pub fn inputs(cfg: &Config, cache: &Path, progress: &Progress) -> Result<Inputs> {
    let base = base::prepare(&cfg.base, cache, progress)?;
    let mut files: Vec<(String, &Path)> = vec![
        ("kube".into(), &cfg.kube),
        ("pause".into(), &cfg.pause),
        ("agent".into(), &cfg.agent),
        ("cni".into(), &cfg.cni),
        ("agent_unit".into(), &cfg.agent_unit),
    ];
    if let Ready::Tarball(t) = &base {
        files.insert(0, ("base".into(), t));
    }
    for f in &cfg.files {
        files.push((format!("file {} {:04o}", f.dest, f.mode), &f.src));
    }
    for (i, img) in cfg.images.iter().enumerate() {
        files.push((format!("image {i}"), img));
    }
    let all: Vec<&Path> = files.iter().map(|(_, p)| *p).collect();
    let task = progress.task("digesting inputs", Some(total_size(&all)));
    let mut list = Vec::new();
    if let Ready::Dir(d) = &base {
        list.push(("base".to_string(), digest::tree(d)?));
    }
    for (name, path) in &files {
        task.message(name.clone());
        list.push((name.clone(), digest::file(path, Some(&task))?));
    }
    task.finish("");
    list.push(("vcpu".into(), cfg.vcpu.to_string()));
    list.push(("memMiB".into(), cfg.mem_mib.to_string()));
    list.push((
        "rootfs_headroom_mib".into(),
        cfg.rootfs_headroom_mib.to_string(),
    ));
    list.push((
        "rootfs_size_mib".into(),
        cfg.rootfs_size_mib
            .map(|s| s.to_string())
            .unwrap_or_else(|| "computed".into()),
    ));
    list.push((
        "source_date_epoch".into(),
        cfg.source_date_epoch.to_string(),
    ));
    list.push((
        "builder".into(),
        format!(
            "socialweb-image-builder {}; {}",
            env!("CARGO_PKG_VERSION"),
            ext4::tools()?
        ),
    ));
    let mut h = Sha256::new();
    h.update("socialweb node image, fingerprint version 1\n");
    for (k, v) in &list {
        h.update(format!("{k}\t{v}\n"));
    }
    let hex = digest::hex(&h.finalize());
    Ok(Inputs {
        base,
        list,
        name: format!("socialweb-node-{}", &hex[..16]),
        fingerprint: format!("sha256:{hex}"),
    })
}

/// The description of a finished output directory, if it is one.
pub fn read_description(out: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(out.join(DESCRIPTION)).ok()?).ok()
}

/// Verifies every file a description lists against its size and digest.
pub fn check(out: &Path, progress: &Progress) -> Result<Value> {
    let d = read_description(out).with_context(|| {
        format!(
            "{} has no readable {DESCRIPTION}: not a node image",
            out.display()
        )
    })?;
    let files = d["files"].as_object().context("nodeimage.json: files")?;
    let paths: Vec<PathBuf> = files.keys().map(|f| out.join(f)).collect();
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let task = progress.task("checking", Some(total_size(&refs)));
    for (name, want) in files {
        let p = out.join(name);
        let len = std::fs::metadata(&p)
            .with_context(|| format!("{name}: missing from {}", out.display()))?
            .len();
        if Some(len) != want["bytes"].as_u64() {
            bail!("{name}: {len} bytes, nodeimage.json says {}", want["bytes"]);
        }
        let got = digest::file(&p, Some(&task))?;
        if want["sha256"].as_str() != Some(got.as_str()) {
            bail!(
                "{name}: sha256 is {got}, nodeimage.json says {}",
                want["sha256"]
            );
        }
    }
    task.finish("");
    Ok(d)
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// Builds the image into `out`. Returns its description; an output already holding this
/// fingerprint (checked) is kept unless `force`.
pub fn build(
    cfg: &Config,
    out: &Path,
    cache: &Path,
    force: bool,
    progress: &Progress,
) -> Result<Value> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "building an image needs root: it stages a root filesystem with its owners and \
             device nodes (and debootstrap needs root too)"
        );
    }
    let inputs = inputs(cfg, cache, progress)?;
    if !force
        && read_description(out).is_some_and(|d| d["fingerprint"] == inputs.fingerprint.as_str())
        && let Ok(d) = check(out, progress)
    {
        eprintln!("{}: up to date ({})", out.display(), inputs.name);
        return Ok(d);
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("creating the output's directory {}", parent.display()))?;
    let leaf = out
        .file_name()
        .context("the output directory needs a name")?
        .to_string_lossy()
        .into_owned();
    let tmp = TempDir(parent.join(format!(".{leaf}.partial-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    std::fs::create_dir_all(&tmp.0).with_context(|| format!("creating {}", tmp.0.display()))?;
    let in_out = |e: anyhow::Error| -> anyhow::Error {
        let free = free_bytes(&parent).map(|b| format!("{} MiB free", b >> 20));
        if format!("{e:#}").contains("No space left on device") {
            e.context(format!(
                "the output's disk is full: {} ({})",
                parent.display(),
                free.unwrap_or_default()
            ))
        } else {
            e
        }
    };

    let root = tmp.0.join("stage");
    let task = progress.task("staging the tree", None);
    stage::unpack(&inputs.base, &root).map_err(in_out)?;
    let image_json = serde_json::to_vec_pretty(&json!({
        "name": inputs.name, "fingerprint": inputs.fingerprint,
        "vcpu": cfg.vcpu, "memMiB": cfg.mem_mib,
    }))?;
    stage::install(cfg, &root, &image_json).map_err(in_out)?;
    let usage = stage::normalise(&root, cfg.source_date_epoch).map_err(in_out)?;
    task.finish(&format!(
        ": {} MiB in {} inodes",
        usage.block_bytes >> 20,
        usage.inodes
    ));

    let (needed_mib, _) = ext4::plan(usage, 0);
    let (size_mib, inodes) = match cfg.rootfs_size_mib {
        Some(s) if s < needed_mib => bail!(
            "rootfs_size_mib: {s} MiB is too small: the staged tree needs at least {needed_mib} \
             MiB (or leave rootfs_size_mib out and set rootfs_headroom_mib)"
        ),
        Some(s) => (s, ext4::plan(usage, s - needed_mib).1),
        None => ext4::plan(usage, cfg.rootfs_headroom_mib),
    };
    let seed_bytes: u64 = cfg
        .images
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let needed = usage.block_bytes + seed_bytes + (64 << 20);
    if let Some(free) = free_bytes(&parent)
        && free < needed
    {
        bail!(
            "the output's disk is too full: {} has {} MiB free, the image needs about {} MiB",
            parent.display(),
            free >> 20,
            needed >> 20
        );
    }

    let task = progress.task("making rootfs.ext4", None);
    let seed: [u8; 32] = Sha256::digest(format!("uuid {}", inputs.fingerprint)).into();
    let rootfs = tmp.0.join(ROOTFS);
    let work = tmp.0.join("work");
    std::fs::create_dir_all(&work)?;
    ext4::make(
        &root,
        &rootfs,
        size_mib,
        inodes,
        &seed,
        cfg.source_date_epoch,
        &work,
    )
    .map_err(in_out)?;
    std::fs::remove_dir_all(&work)?;
    task.finish(&format!(": {size_mib} MiB, {inodes} inodes"));

    let mut files = serde_json::Map::new();
    let kernel = stage::kernel(&root);
    if let Some((k, i)) = &kernel {
        std::fs::copy(k, tmp.0.join("vmlinuz")).map_err(|e| in_out(e.into()))?;
        std::fs::copy(i, tmp.0.join("initrd.img")).map_err(|e| in_out(e.into()))?;
    }
    std::fs::remove_dir_all(&root)?;

    // The seed disk: the sandbox image first, then the config's images in its order.
    let pause = std::fs::read(&cfg.pause)?;
    let mut archives = vec![{
        let bytes = socialweb_oci::pause_image(socialweb_oci::PAUSE_IMAGE, &pause)?;
        seeds::Archive {
            name: "00-pause.tar".into(),
            sha256: format!("sha256:{}", digest::hex(&Sha256::digest(&bytes))),
            bytes: bytes.len() as u64,
            source: seeds::Source::Memory(bytes),
        }
    }];
    for (i, img) in cfg.images.iter().enumerate() {
        let digest = inputs
            .list
            .iter()
            .find(|(k, _)| *k == format!("image {i}"))
            .map(|(_, v)| v.clone())
            .expect("digested above");
        let stem = img
            .file_stem()
            .map(|s| {
                s.to_string_lossy().replace(
                    |c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '.',
                    "_",
                )
            })
            .unwrap_or_default();
        archives.push(seeds::Archive {
            name: format!("{:02}-{stem}.tar", i + 1),
            sha256: digest,
            bytes: std::fs::metadata(img)?.len(),
            source: seeds::Source::File(img),
        });
    }
    let total: u64 = archives.iter().map(|a| a.bytes).sum();
    let task = progress.task("writing seeds.img", Some(total));
    seeds::write_disk(&tmp.0.join(SEEDS), &archives, &task).map_err(in_out)?;
    task.finish("");

    let mut names = vec![ROOTFS, SEEDS];
    if kernel.is_some() {
        names.extend(["vmlinuz", "initrd.img"]);
    }
    let paths: Vec<PathBuf> = names.iter().map(|n| tmp.0.join(n)).collect();
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let task = progress.task("digesting the image", Some(total_size(&refs)));
    for n in &names {
        let p = tmp.0.join(n);
        files.insert(
            n.to_string(),
            json!({"bytes": std::fs::metadata(&p)?.len(), "sha256": digest::file(&p, Some(&task))?}),
        );
    }
    task.finish("");
    let description = json!({
        "version": 1,
        "name": inputs.name,
        "fingerprint": inputs.fingerprint,
        "vcpu": cfg.vcpu,
        "memMiB": cfg.mem_mib,
        "rootfs": {
            "file": ROOTFS,
            "label": ext4::LABEL,
            "size_mib": size_mib,
            "inodes": inodes,
            "staged_bytes": usage.block_bytes,
            "headroom_mib": size_mib - needed_mib,
        },
        "seeds": {
            "file": SEEDS,
            "serial": socialweb_wire::seeds::DISK_SERIAL,
            "id": seeds::seed_id(&archives),
            "images": archives.iter().map(|a| json!({"name": a.name, "bytes": a.bytes, "sha256": a.sha256})).collect::<Vec<_>>(),
        },
        "boot": kernel.as_ref().map(|_| json!({
            "kernel": "vmlinuz",
            "initrd": "initrd.img",
            "cmdline": format!("root=LABEL={} rw console=ttyS0", ext4::LABEL),
            "identity_disk_label": stage::IDENTITY_LABEL,
        })),
        "files": files,
        "inputs": inputs.list.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
    });
    let mut text = serde_json::to_vec_pretty(&description)?;
    text.push(b'\n');
    std::fs::write(tmp.0.join(DESCRIPTION), text).map_err(|e| in_out(e.into()))?;

    // Into place: the old output goes only once the new one is complete.
    if out.exists() {
        let old = parent.join(format!(".{leaf}.old-{}", std::process::id()));
        std::fs::rename(out, &old)
            .with_context(|| format!("moving the old {} aside", out.display()))?;
        let _ = std::fs::remove_dir_all(&old);
    }
    std::fs::rename(&tmp.0, out).with_context(|| format!("renaming into {}", out.display()))?;
    Ok(description)
}

/// The cache directory: `$SOCIALWEB_CACHE`, else `~/.cache/socialweb`.
pub fn default_cache() -> PathBuf {
    std::env::var_os("SOCIALWEB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/socialweb")
        })
}
