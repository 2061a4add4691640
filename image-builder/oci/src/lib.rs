//! OCI image-layout archives (the image-spec's `oci-layout`, `index.json` and `blobs/`, in
//! one tar) that `ctr images import` takes, so that nothing a node runs is ever pulled. One
//! layer per archive, shared by every image the archive names: the sandbox image from our
//! `pause` binary, the tests' busybox, the conformance suite's images from one root
//! filesystem. Every tar header is fixed (mode, owner 0, time 0) and the JSON documents are
//! written with sorted keys, so the same inputs give the same bytes (the node image's seed
//! disk depends on it).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The sandbox image every node's containerd is configured with (the agent's default
/// `--sandbox-image`).
pub const PAUSE_IMAGE: &str = "socialweb.local/pause:3.10";

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Lowercase hex SHA-256 of a file, and its size, read in 1 MiB pieces (a layer or a disk
/// image may be GiBs).
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((h.finalize().iter().map(|b| format!("{b:02x}")).collect(), n))
}

fn header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

fn dir_header() -> tar::Header {
    let mut h = header(0, 0o755);
    h.set_entry_type(tar::EntryType::Directory);
    h
}

/// One layer: files (path in the image, mode, content) and symlinks (path, target), with
/// their parent directories and an empty `/tmp`, which programs expect.
pub fn layer(files: &[(&str, u32, Vec<u8>)], links: &[(String, &str)]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs: Vec<String> = Vec::new();
    let mut add_dirs = |b: &mut tar::Builder<Vec<u8>>, path: &str| -> Result<()> {
        let mut acc = String::new();
        for part in Path::new(path).parent().into_iter().flat_map(|p| p.iter()) {
            acc.push_str(&part.to_string_lossy());
            acc.push('/');
            if !dirs.contains(&acc) {
                b.append_data(&mut dir_header(), &acc, std::io::empty())?;
                dirs.push(acc.clone());
            }
        }
        Ok(())
    };
    for (path, mode, data) in files {
        add_dirs(&mut b, path)?;
        b.append_data(&mut header(data.len() as u64, *mode), path, data.as_slice())?;
    }
    for (path, target) in links {
        add_dirs(&mut b, path)?;
        let mut h = header(0, 0o777);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, path, target)?;
    }
    let mut h = dir_header();
    h.set_mode(0o1777);
    b.append_data(&mut h, "tmp/", std::io::empty())?;
    Ok(b.into_inner()?)
}

/// Where an archive's one layer comes from: bytes, or a tar file (streamed: it may be large).
#[derive(Debug)]
pub enum Layer {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl Layer {
    fn digest_and_size(&self) -> Result<(String, u64)> {
        match self {
            Layer::Bytes(b) => Ok((sha256_hex(b), b.len() as u64)),
            Layer::File(p) => sha256_file(p),
        }
    }
}

/// One image an archive names, on the archive's layer.
#[derive(Debug, Clone)]
pub struct Image<'a> {
    /// Its full reference (`registry/name:tag`), as containerd will list it.
    pub reference: &'a str,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
    pub env: &'a [&'a str],
    /// The user it runs as (`1234`, `nobody:nogroup`); none for root.
    pub user: Option<&'a str>,
}

impl<'a> Image<'a> {
    /// An image that runs `entrypoint`, with `PATH=/bin`.
    pub fn new(reference: &'a str, entrypoint: &'a [&'a str]) -> Image<'a> {
        Image {
            reference,
            entrypoint,
            cmd: &[],
            env: &["PATH=/bin"],
            user: None,
        }
    }
}

fn or_null(v: &[&str]) -> Value {
    if v.is_empty() { Value::Null } else { json!(v) }
}

/// Writes one archive holding `images`, all on `layer`, to `w`.
pub fn write_layout<W: Write>(w: W, layer: &Layer, images: &[Image<'_>]) -> Result<W> {
    let (layer_digest, layer_size) = layer.digest_and_size()?;
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifests = Vec::new();
    for image in images {
        let mut run = json!({
            "Entrypoint": or_null(image.entrypoint),
            "Cmd": or_null(image.cmd),
            "Env": image.env,
            "WorkingDir": "/",
        });
        // Only when set: the configs (and digests) of images without a user stay as they were.
        if let Some(user) = image.user {
            run["User"] = json!(user);
        }
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": run,
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        }))?;
        let config_digest = sha256_hex(&config);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE,
                       "digest": format!("sha256:{config_digest}"), "size": config.len()},
            "layers": [{"mediaType": LAYER_TYPE,
                        "digest": format!("sha256:{layer_digest}"), "size": layer_size}],
        }))?;
        manifests.push(json!({
            "mediaType": MANIFEST_TYPE,
            "digest": format!("sha256:{}", sha256_hex(&manifest)),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": image.reference,
                "org.opencontainers.image.ref.name":
                    image.reference.rsplit(':').next().unwrap_or("latest"),
            },
        }));
        blobs.push((config_digest, config));
        blobs.push((sha256_hex(&manifest), manifest));
    }
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests}))?;
    let mut b = tar::Builder::new(w);
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    b.append_data(
        &mut header(layout.len() as u64, 0o644),
        "oci-layout",
        &layout[..],
    )?;
    b.append_data(
        &mut header(index.len() as u64, 0o644),
        "index.json",
        index.as_slice(),
    )?;
    let name = format!("blobs/sha256/{layer_digest}");
    let mut h = header(layer_size, 0o644);
    match layer {
        Layer::Bytes(bytes) => b.append_data(&mut h, &name, bytes.as_slice())?,
        Layer::File(p) => b.append_data(&mut h, &name, std::fs::File::open(p)?)?,
    }
    let mut seen = std::collections::BTreeSet::new();
    for (digest, data) in &blobs {
        if seen.insert(digest.clone()) {
            b.append_data(
                &mut header(data.len() as u64, 0o644),
                format!("blobs/sha256/{digest}"),
                data.as_slice(),
            )?;
        }
    }
    Ok(b.into_inner()?)
}

/// Writes a one-layer, one-image archive to the file `out`.
pub fn write_image(
    out: &Path,
    reference: &str,
    layer_tar: Vec<u8>,
    entrypoint: &[&str],
) -> Result<()> {
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let w = write_layout(
        std::io::BufWriter::new(file),
        &Layer::Bytes(layer_tar),
        &[Image::new(reference, entrypoint)],
    )?;
    w.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("writing {}", out.display()))
}

/// The sandbox image's archive (`/pause`, as `reference`) from a `pause` binary's bytes.
pub fn pause_image(reference: &str, pause: &[u8]) -> Result<Vec<u8>> {
    write_layout(
        Vec::new(),
        &Layer::Bytes(layer(&[("pause", 0o755, pause.to_vec())], &[])?),
        &[Image::new(reference, &["/pause"])],
    )
}

/// Writes the sandbox image [`PAUSE_IMAGE`] from the `pause` binary at `pause_binary`.
pub fn write_pause(out: &Path, pause_binary: &Path) -> Result<()> {
    write_pause_as(out, pause_binary, PAUSE_IMAGE)
}

/// Writes the sandbox image under another name (the conformance suite's).
pub fn write_pause_as(out: &Path, pause_binary: &Path, reference: &str) -> Result<()> {
    let bin = std::fs::read(pause_binary)
        .with_context(|| format!("reading {}", pause_binary.display()))?;
    std::fs::write(out, pause_image(reference, &bin)?)
        .with_context(|| format!("writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut a = tar::Archive::new(archive);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (e.path().unwrap().to_string_lossy().into_owned(), data)
            })
            .collect()
    }

    #[test]
    fn an_archive_is_a_layout_whose_digests_hold_and_the_same_input_gives_the_same_bytes() {
        let a = pause_image(PAUSE_IMAGE, b"\x7fELF pause").unwrap();
        assert_eq!(a, pause_image(PAUSE_IMAGE, b"\x7fELF pause").unwrap());
        let files = entries(&a);
        assert_eq!(files[0].0, "oci-layout");
        assert_eq!(files[1].0, "index.json");
        for (name, data) in &files[2..] {
            let digest = name.strip_prefix("blobs/sha256/").unwrap();
            assert_eq!(digest, sha256_hex(data), "{name}");
        }
        let index: Value = serde_json::from_slice(&files[1].1).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], PAUSE_IMAGE);
        assert_eq!(
            m["annotations"]["org.opencontainers.image.ref.name"],
            "3.10"
        );
        let manifest_digest = m["digest"].as_str().unwrap().trim_start_matches("sha256:");
        let manifest = &files
            .iter()
            .find(|(n, _)| n.ends_with(manifest_digest))
            .unwrap()
            .1;
        let manifest: Value = serde_json::from_slice(manifest).unwrap();
        assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn several_images_share_one_layer_and_a_file_layer_is_streamed() {
        let dir = std::env::temp_dir().join(format!("sw-oci-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let layer_file = dir.join("layer.tar");
        std::fs::write(
            &layer_file,
            layer(&[("bin/x", 0o755, b"x".to_vec())], &[]).unwrap(),
        )
        .unwrap();
        let images = [
            Image {
                reference: "r/a:1",
                entrypoint: &["/bin/x"],
                cmd: &[],
                env: &[],
                user: None,
            },
            Image {
                reference: "r/b:2",
                entrypoint: &[],
                cmd: &["run"],
                env: &[],
                user: Some("1234"),
            },
        ];
        let a = write_layout(Vec::new(), &Layer::File(layer_file.clone()), &images).unwrap();
        let files = entries(&a);
        // oci-layout, index, the layer once, two configs and two manifests.
        assert_eq!(
            files.len(),
            7,
            "{:?}",
            files.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        let index: Value = serde_json::from_slice(&files[1].1).unwrap();
        assert_eq!(index["manifests"].as_array().unwrap().len(), 2);
        // The configs: a user only where one was given.
        let users: Vec<Option<String>> = files
            .iter()
            .filter_map(|(_, data)| serde_json::from_slice::<Value>(data).ok())
            .filter(|v| v["rootfs"]["type"] == "layers")
            .map(|v| {
                v["config"]
                    .get("User")
                    .map(|u| u.as_str().unwrap().to_string())
            })
            .collect();
        assert_eq!(users.len(), 2);
        assert!(
            users.contains(&None) && users.contains(&Some("1234".into())),
            "{users:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
