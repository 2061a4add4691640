//! Container images as OCI image-layout archives that `ctr images import` takes, built on
//! this machine so that nothing is ever pulled: the pod sandbox's `pause` image (from the
//! `pause` binary of the Kubernetes we ship), and one-layer images from files for whoever
//! needs them (the tests' busybox image).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Reference of the sandbox image every node's containerd is configured with (the agent's
/// default `--sandbox-image`).
pub const PAUSE_IMAGE: &str = "socialweb.local/pause:3.10";

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One layer: files (path in image, mode, content) and symlinks (path, target).
pub fn layer(files: &[(&str, u32, Vec<u8>)], links: &[(String, &str)]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs: Vec<String> = Vec::new();
    let mut add_dirs = |b: &mut tar::Builder<Vec<u8>>, path: &str| -> Result<()> {
        let mut acc = String::new();
        for part in Path::new(path).parent().into_iter().flat_map(|p| p.iter()) {
            acc.push_str(&part.to_string_lossy());
            acc.push('/');
            if !dirs.contains(&acc) {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                h.set_mtime(0);
                b.append_data(&mut h, &acc, std::io::empty())?;
                dirs.push(acc.clone());
            }
        }
        Ok(())
    };
    for (path, mode, data) in files {
        add_dirs(&mut b, path)?;
        let mut h = tar::Header::new_gnu();
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, path, data.as_slice())?;
    }
    for (path, target) in links {
        add_dirs(&mut b, path)?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        h.set_mtime(0);
        b.append_link(&mut h, path, target)?;
    }
    // An empty /tmp, which programs expect.
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o1777);
    h.set_size(0);
    h.set_mtime(0);
    b.append_data(&mut h, "tmp/", std::io::empty())?;
    Ok(b.into_inner()?)
}

/// Writes a one-layer OCI image-layout tarball for `reference`.
pub fn write_image(
    out: &Path,
    reference: &str,
    layer_tar: Vec<u8>,
    entrypoint: &[&str],
) -> Result<()> {
    let layer_digest = sha256_hex(&layer_tar);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    }))?;
    let config_digest = sha256_hex(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_digest}"), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{layer_digest}"), "size": layer_tar.len()}],
    }))?;
    let manifest_digest = sha256_hex(&manifest);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": reference,
                "org.opencontainers.image.ref.name": reference.rsplit(':').next().unwrap_or("latest"),
            },
        }],
    }))?;
    let mut b = tar::Builder::new(Vec::new());
    let mut put = |name: &str, data: &[u8]| -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, name, data)?;
        Ok(())
    };
    put("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    put("index.json", &index)?;
    put(&format!("blobs/sha256/{layer_digest}"), &layer_tar)?;
    put(&format!("blobs/sha256/{config_digest}"), &config)?;
    put(&format!("blobs/sha256/{manifest_digest}"), &manifest)?;
    let bytes = b.into_inner()?;
    std::fs::File::create(out)
        .and_then(|mut f| f.write_all(&bytes))
        .with_context(|| format!("writing {}", out.display()))
}

/// The pause image, from the `pause` binary built beside the kube binary.
pub fn write_pause(out: &Path, pause_binary: &Path) -> Result<()> {
    let bin = std::fs::read(pause_binary)
        .with_context(|| format!("reading {}", pause_binary.display()))?;
    write_image(
        out,
        PAUSE_IMAGE,
        layer(&[("pause", 0o755, bin)], &[])?,
        &["/pause"],
    )
}
