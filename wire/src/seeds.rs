//! The seed disk: container images that come with a node image, of any size, on a disk of
//! their own (`docs/image.md`). `socialweb-image-builder` writes it, the agent imports it into
//! containerd at boot (`docs/join.md`, step `images`).
//!
//! Why a disk and not files in the root filesystem: `mkfs.ext4 -d` refuses some multi-GiB
//! image archives (seed plan 0004, section 7), and a root filesystem grown by the images'
//! size is copied for every node. The disk is a tar stream written straight onto the block
//! device, no filesystem: its first member is [`MANIFEST`] (this module's [`SeedManifest`]),
//! then one OCI or Docker image archive per image, in the manifest's order. The agent reads it
//! front to back and pipes each archive into `ctr images import -`, so no size limit applies
//! anywhere on the way.

use serde_json::{Value, json};

/// The first member of the tar stream.
pub const MANIFEST: &str = "socialweb-seeds.json";
/// The manifest's version; another version is refused with this one named.
pub const VERSION: u64 = 1;
/// The serial a VMM gives the seed disk (`-drive ...,serial=socialweb-seeds` in qemu); the
/// guest's udev links it as `/dev/disk/by-id/virtio-socialweb-seeds`.
pub const DISK_SERIAL: &str = "socialweb-seeds";
/// Where the agent looks for the seed disk by default.
pub const DEFAULT_DISK: &str = "/dev/disk/by-id/virtio-socialweb-seeds";

/// One image archive on the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedImage {
    /// The member's name in the tar stream (`<something>.tar`).
    pub name: String,
    pub bytes: u64,
    /// `sha256:<hex>` of the archive.
    pub sha256: String,
}

/// What the disk holds; `id` names the disk's content (the node image's seed fingerprint),
/// so an agent remembers what it imported across restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedManifest {
    pub id: String,
    pub images: Vec<SeedImage>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SeedError {
    #[error("seed disk manifest: not JSON: {0}")]
    Json(String),
    #[error("seed disk manifest: {0}: {1}")]
    Field(&'static str, String),
}

fn text(v: &Value, field: &'static str) -> Result<String, SeedError> {
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| SeedError::Field(field, "missing or not a string".into()))
}

impl SeedManifest {
    pub fn to_json(&self) -> Vec<u8> {
        let images: Vec<Value> = self
            .images
            .iter()
            .map(|i| json!({"name": i.name, "bytes": i.bytes, "sha256": i.sha256}))
            .collect();
        let mut out = serde_json::to_vec_pretty(
            &json!({"version": VERSION, "id": self.id, "images": images}),
        )
        .expect("a JSON value serialises");
        out.push(b'\n');
        out
    }

    pub fn from_json(bytes: &[u8]) -> Result<SeedManifest, SeedError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| SeedError::Json(e.to_string()))?;
        match v.get("version").and_then(Value::as_u64) {
            Some(VERSION) => {}
            other => {
                return Err(SeedError::Field(
                    "version",
                    format!("{other:?} is not supported: this agent reads version {VERSION}"),
                ));
            }
        }
        let id = text(&v, "id")?;
        let mut images = Vec::new();
        for i in v
            .get("images")
            .and_then(Value::as_array)
            .ok_or_else(|| SeedError::Field("images", "missing or not a list".into()))?
        {
            let name = text(i, "name")?;
            if !name.ends_with(".tar") || name.contains('/') {
                return Err(SeedError::Field(
                    "images[].name",
                    format!("{name:?} is not a plain <name>.tar"),
                ));
            }
            images.push(SeedImage {
                name,
                bytes: i.get("bytes").and_then(Value::as_u64).ok_or_else(|| {
                    SeedError::Field("images[].bytes", "missing or not a number".into())
                })?,
                sha256: text(i, "sha256")?,
            });
        }
        Ok(SeedManifest { id, images })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_and_a_bad_one_names_the_field() {
        let m = SeedManifest {
            id: "sha256:ab".into(),
            images: vec![SeedImage {
                name: "pause.tar".into(),
                bytes: 3,
                sha256: "sha256:cd".into(),
            }],
        };
        assert_eq!(SeedManifest::from_json(&m.to_json()).unwrap(), m);
        let e = SeedManifest::from_json(br#"{"version":2,"id":"x","images":[]}"#).unwrap_err();
        assert!(e.to_string().contains("version"), "{e}");
        let e = SeedManifest::from_json(
            br#"{"version":1,"id":"x","images":[{"name":"../x.tar","bytes":1,"sha256":"s"}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("images[].name"), "{e}");
    }
}
