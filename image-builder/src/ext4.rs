//! `rootfs.ext4` from the staged tree, the same bytes every time: mke2fs 1.47 populates from
//! the tree in name order; we fix everything else that would differ — the UUID and the
//! directory hash seed (from the image's fingerprint), the filesystem's own times
//! (`E2FSPROGS_FAKE_TIME`), the feature set (our own mke2fs.conf, not the host's), and the
//! inodes' change times, which mke2fs copies from the staged files (where no one can set
//! them) and which debugfs then sets to `source_date_epoch`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::stage::Usage;

/// The root filesystem's label (the image's fstab mounts `/` by it).
pub const LABEL: &str = "socialweb-root";
const BLOCK: u64 = 4096;
const INODE_SIZE: u64 = 256;
const JOURNAL_MIB: u64 = 16;

/// The features, written out so that the host's /etc/mke2fs.conf does not matter.
const MKE2FS_CONF: &str = "[defaults]\n\tblocksize = 4096\n\tinode_size = 256\n\n[fs_types]\n\t\
    ext4 = {\n\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize\n\t}\n";

/// The filesystem's size and inode count for a tree, with `headroom_mib` free.
pub fn plan(usage: Usage, headroom_mib: u64) -> (u64, u64) {
    // Room for the files a running node adds (one inode per 16 KiB of headroom).
    let inodes = (usage.inodes + usage.inodes / 4 + 4096 + (headroom_mib << 6)).next_multiple_of(8);
    let metadata = inodes * INODE_SIZE + (JOURNAL_MIB << 20);
    let data = usage.block_bytes + usage.block_bytes / 50; // extent blocks, directories' growth
    let bytes = data + metadata + (metadata + data) / 32 + (headroom_mib << 20); // bitmaps, descriptors
    (bytes.div_ceil(1 << 20), inodes)
}

fn mke2fs_version() -> Result<String> {
    let out = Command::new("mke2fs")
        .arg("-V")
        .output()
        .context("running mke2fs (install Debian's e2fsprogs)")?;
    let text = String::from_utf8_lossy(&out.stderr);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// What of the tools decides the bytes (part of the fingerprint).
pub fn tools() -> Result<String> {
    mke2fs_version()
}

/// A UUID-shaped text from 16 bytes.
pub fn uuid(b: &[u8]) -> String {
    let h = crate::digest::hex(&b[..16]);
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// Makes the filesystem at `out` (`size_mib`, `inodes`) from `root`.
pub fn make(
    root: &Path,
    out: &Path,
    size_mib: u64,
    inodes: u64,
    seed: &[u8; 32],
    epoch: u64,
    workdir: &Path,
) -> Result<()> {
    let conf = workdir.join("mke2fs.conf");
    std::fs::write(&conf, MKE2FS_CONF)?;
    let _ = std::fs::remove_file(out);
    let f = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    f.set_len(size_mib << 20)
        .with_context(|| format!("sizing {}", out.display()))?;
    drop(f);
    let blocks = (size_mib << 20) / BLOCK;
    let journal = if size_mib > 4 * JOURNAL_MIB {
        JOURNAL_MIB
    } else {
        1
    };
    let output = Command::new("mke2fs")
        .env("MKE2FS_CONFIG", &conf)
        .env("E2FSPROGS_FAKE_TIME", epoch.to_string())
        .args([
            "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-m", "0",
        ])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-J")
        .arg(format!("size={journal}"))
        .arg("-L")
        .arg(LABEL)
        .arg("-U")
        .arg(uuid(&seed[..16]))
        .arg("-E")
        .arg(format!(
            "hash_seed={},root_owner=0:0,nodiscard,lazy_itable_init=1,lazy_journal_init=1",
            uuid(&seed[16..])
        ))
        .arg("-d")
        .arg(root)
        .arg(out)
        .arg(blocks.to_string())
        .output()
        .context("running mke2fs (install Debian's e2fsprogs)")?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let err = err.trim();
        if err.contains("Could not allocate")
            || err.contains("No space left")
            || err.contains("Could not find free")
            || err.contains("inodes")
        {
            bail!(
                "rootfs_size_mib: {size_mib} MiB ({inodes} inodes) is too small for the staged \
                 tree: mke2fs: {err}"
            );
        }
        bail!("mke2fs failed ({}): {err}", output.status);
    }
    set_ctimes(out, epoch, workdir)?;
    let fsck = Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(out)
        .output()
        .context("running e2fsck")?;
    if !fsck.status.success() {
        bail!(
            "e2fsck found errors in the new filesystem {}: {}",
            out.display(),
            String::from_utf8_lossy(&fsck.stdout).trim()
        );
    }
    Ok(())
}

/// The inodes in use, from dumpe2fs's free ranges per group.
fn used_inodes(image: &Path) -> Result<Vec<u64>> {
    let out = Command::new("dumpe2fs")
        .arg(image)
        .output()
        .context("running dumpe2fs")?;
    if !out.status.success() {
        bail!(
            "dumpe2fs {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let per_group: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Inodes per group:"))
        .and_then(|v| v.trim().parse().ok())
        .context("dumpe2fs printed no inodes per group")?;
    let mut used = Vec::new();
    let mut group: Option<u64> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Group ") {
            group = rest.split(':').next().and_then(|g| g.trim().parse().ok());
            continue;
        }
        let Some(ranges) = line.trim().strip_prefix("Free inodes:") else {
            continue;
        };
        // The superblock's own "Free inodes:" count comes before the groups.
        let Some(g) = group else {
            continue;
        };
        let (first, last) = (g * per_group + 1, (g + 1) * per_group);
        let mut free = vec![false; per_group as usize];
        for r in ranges.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let (a, b): (u64, u64) = (a.trim().parse()?, b.trim().parse()?);
            for i in a..=b {
                free[(i - first) as usize] = true;
            }
        }
        used.extend((first..=last).filter(|i| !free[(i - first) as usize]));
    }
    Ok(used)
}

fn set_ctimes(image: &Path, epoch: u64, workdir: &Path) -> Result<()> {
    let script: String = used_inodes(image)?
        .iter()
        .map(|i| format!("sif <{i}> ctime {epoch}\n"))
        .collect();
    let path = workdir.join("ctimes.debugfs");
    std::fs::write(&path, script)?;
    let out = Command::new("debugfs")
        .env("E2FSPROGS_FAKE_TIME", epoch.to_string())
        .arg("-w")
        .arg("-f")
        .arg(&path)
        .arg(image)
        .output()
        .context("running debugfs")?;
    if !out.status.success() {
        bail!(
            "debugfs setting the inodes' times: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
