//! The seed disk (`socialweb_wire::seeds`): a tar stream of image archives behind a manifest,
//! written straight onto the disk. Archives are streamed in, so their size does not matter;
//! every header is fixed (mode, owner, time 0), so the same archives give the same bytes.
//! The sandbox image on it is made from our `pause` binary by `socialweb_oci`.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use socialweb_wire::seeds::{MANIFEST, SeedImage, SeedManifest};

use crate::digest::hex;
use crate::progress::Task;

fn header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// One archive for the disk: its name on the disk and where its bytes come from.
#[derive(Debug)]
pub struct Archive<'a> {
    pub name: String,
    pub source: Source<'a>,
    pub sha256: String,
    pub bytes: u64,
}

#[derive(Debug)]
pub enum Source<'a> {
    Memory(Vec<u8>),
    File(&'a Path),
}

/// The manifest's id: what the disk holds, by name and digest.
pub fn seed_id(archives: &[Archive]) -> String {
    let mut h = Sha256::new();
    for a in archives {
        h.update(format!("{} {} {}\n", a.name, a.bytes, a.sha256));
    }
    format!("sha256:{}", hex(&h.finalize()))
}

/// Writes the disk to `out`; its size is rounded up to whole MiB (what block devices take).
pub fn write_disk(out: &Path, archives: &[Archive], task: &Task) -> Result<u64> {
    let manifest = SeedManifest {
        id: seed_id(archives),
        images: archives
            .iter()
            .map(|a| SeedImage {
                name: a.name.clone(),
                bytes: a.bytes,
                sha256: a.sha256.clone(),
            })
            .collect(),
    };
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut b = tar::Builder::new(std::io::BufWriter::with_capacity(1 << 20, file));
    let text = manifest.to_json();
    b.append_data(&mut header(text.len() as u64), MANIFEST, text.as_slice())
        .with_context(|| format!("writing {}", out.display()))?;
    for a in archives {
        let reader: Box<dyn Read> = match &a.source {
            Source::Memory(v) => Box::new(std::io::Cursor::new(v.clone())),
            Source::File(p) => Box::new(
                std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?,
            ),
        };
        let counted = Counted {
            inner: reader,
            task,
        };
        b.append_data(&mut header(a.bytes), &a.name, counted)
            .with_context(|| format!("writing {} into {}", a.name, out.display()))?;
    }
    let mut w = b
        .into_inner()
        .with_context(|| format!("writing {}", out.display()))?;
    w.flush()
        .with_context(|| format!("writing {}", out.display()))?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    let len = file.metadata()?.len();
    let padded = len.div_ceil(1 << 20) << 20;
    file.set_len(padded)?;
    file.sync_all()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(padded)
}

struct Counted<'a> {
    inner: Box<dyn Read>,
    task: &'a Task,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.task.inc(n as u64);
        Ok(n)
    }
}
