//! The images the upstream conformance suite runs, built on this machine under the names its
//! `test/utils/image/manifest.go` gives them, so nothing is remapped and nothing is pulled (the
//! tags are not `latest`: the pull policy is `IfNotPresent`, and the image is present).
//!
//! Three archives, each a seed every node imports at boot:
//! - the Debian images ([`DEBIAN_IMAGES`]), sharing one layer: image-builder/conformance/
//!   rootfs.sh's root filesystem with agnhost and the other upstream binaries
//!   (image-builder/conformance/build.sh and images.sh) added where the upstream images have
//!   them;
//! - busybox, on a layer of its own: BusyBox 1.37.0 built by images.sh from upstream's source
//!   with every applet linked in `/bin`, as the upstream image (busybox's `sh` is the shell
//!   the tests' commands and expected messages are written for: `[[`, `hexdump`, `wget`,
//!   `sysctl`, its error messages, and environment variables whose names are not identifiers,
//!   which dash and Debian's busybox drop);
//! - pause, our own, under the suite's name.

use std::path::Path;

use anyhow::{Context, Result};

/// One image of the Debian layer: its reference, entrypoint, command and user.
pub struct DebianImage {
    pub reference: &'static str,
    pub entrypoint: &'static [&'static str],
    pub cmd: &'static [&'static str],
    pub user: Option<&'static str>,
}

const fn image(
    reference: &'static str,
    entrypoint: &'static [&'static str],
    cmd: &'static [&'static str],
) -> DebianImage {
    DebianImage {
        reference,
        entrypoint,
        cmd,
        user: None,
    }
}

const HTTPD: &[&str] = &[
    "/usr/sbin/apache2",
    "-DFOREGROUND",
    "-f",
    "/usr/local/apache2/conf/httpd.conf",
];
const NGINX: &[&str] = &["nginx", "-g", "daemon off;"];

/// The images on the Debian layer, with what the upstream image runs.
pub const DEBIAN_IMAGES: &[DebianImage] = &[
    image(
        "registry.k8s.io/e2e-test-images/agnhost:2.56",
        &["/agnhost"],
        &["pause"],
    ),
    image(
        "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7",
        &[],
        &["/bin/sh"],
    ),
    // Debian's nginx and Apache httpd, configured as the upstream images (rootfs.sh).
    image("registry.k8s.io/e2e-test-images/nginx:1.14-4", &[], NGINX),
    image("registry.k8s.io/e2e-test-images/nginx:1.15-4", &[], NGINX),
    image("registry.k8s.io/e2e-test-images/httpd:2.4.38-4", &[], HTTPD),
    image("registry.k8s.io/e2e-test-images/httpd:2.4.39-4", &[], HTTPD),
    DebianImage {
        user: Some("1234"),
        ..image(
            "registry.k8s.io/e2e-test-images/nonroot:1.4",
            &[],
            &["/bin/sh"],
        )
    },
    image(
        "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
        &[],
        &["nnp"],
    ),
    image(
        "registry.k8s.io/e2e-test-images/nautilus:1.7",
        &["/agnhost"],
        &["test-webserver"],
    ),
    image(
        "registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2",
        &["/sample-apiserver"],
        &[],
    ),
    image(
        "registry.k8s.io/etcd:3.6.4-0",
        &[],
        &["/usr/local/bin/etcd"],
    ),
];

/// The upstream images' PATH.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The busybox image's reference.
pub const BUSYBOX_IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1";

/// The pause image under the name the suite gives it (`imageutils.GetPauseImageName`).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";

/// Where the binaries and files the Debian layer gets come from.
pub struct Inputs<'a> {
    /// image-builder/conformance/rootfs.sh's tarball.
    pub rootfs: &'a Path,
    /// build.sh's directory: agnhost, localhost.crt, localhost.key.
    pub suite: &'a Path,
    /// images.sh's directory: busybox, nnp, sample-apiserver, etcd, nautilus/, httpd/.
    pub images: &'a Path,
}

/// What the Debian layer gets on top of the root filesystem: (source, path in the image,
/// mode).
fn additions(i: &Inputs) -> Vec<(std::path::PathBuf, &'static str, u32)> {
    vec![
        (i.suite.join("agnhost"), "agnhost", 0o755),
        // agnhost porter's TLS ports read these from the working directory, /, as upstream.
        (i.suite.join("localhost.crt"), "localhost.crt", 0o644),
        (i.suite.join("localhost.key"), "localhost.key", 0o644),
        // The nonewprivs image's program, setuid root as upstream's.
        (i.images.join("nnp"), "usr/local/bin/nnp", 0o4755),
        (i.images.join("sample-apiserver"), "sample-apiserver", 0o755),
        (i.images.join("etcd"), "usr/local/bin/etcd", 0o755),
        // The nautilus image serves these from /.
        (i.images.join("nautilus/data.json"), "data.json", 0o644),
        (
            i.images.join("nautilus/nautilus.jpg"),
            "nautilus.jpg",
            0o644,
        ),
        (
            i.images.join("httpd/index.html"),
            "usr/local/apache2/htdocs/index.html",
            0o644,
        ),
    ]
}

/// Writes the Debian images' archive to `out`; `work` is scratch space.
pub fn write_debian_images(out: &Path, inputs: &Inputs, work: &Path) -> Result<()> {
    let layer_path = work.join("layer.tar");
    std::fs::copy(inputs.rootfs, &layer_path)
        .with_context(|| format!("copying {}", inputs.rootfs.display()))?;
    let add = work.join("add");
    let _ = std::fs::remove_dir_all(&add);
    let mut paths = Vec::new();
    for (from, to, mode) in additions(inputs) {
        let dest = add.join(to);
        std::fs::create_dir_all(dest.parent().expect("has a parent"))?;
        std::fs::copy(&from, &dest).with_context(|| {
            format!(
                "copying {} (image-builder/conformance/build.sh and images.sh make it)",
                from.display()
            )
        })?;
        std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        paths.push(to);
    }
    std::os::unix::fs::symlink("agnhost", add.join("agnhost-2"))?;
    std::fs::create_dir_all(add.join("uploads"))?;
    paths.extend(["agnhost-2", "uploads"]);
    // Appended after the root filesystem: what the upstream images add to their base. Their
    // parent directories are the root filesystem's (rootfs.sh makes the Apache ones).
    let status = std::process::Command::new("tar")
        .args([
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--mtime=@0",
            "--no-recursion",
            "-rf",
        ])
        .arg(&layer_path)
        .arg("-C")
        .arg(&add)
        .args(&paths)
        .status()?;
    anyhow::ensure!(status.success(), "tar -r onto the layer failed ({status})");
    let images: Vec<socialweb_oci::Image<'_>> = DEBIAN_IMAGES
        .iter()
        .map(|i| socialweb_oci::Image {
            reference: i.reference,
            entrypoint: i.entrypoint,
            cmd: i.cmd,
            env: &[PATH],
            user: i.user,
        })
        .collect();
    write(
        out,
        &socialweb_oci::Layer::File(layer_path.clone()),
        &images,
    )?;
    std::fs::remove_file(&layer_path)?;
    Ok(())
}

/// The busybox image's archive: `busybox` (images.sh's) with a link in /bin for every applet
/// it has, and the upstream image's /etc/passwd and /etc/group.
pub fn write_busybox(out: &Path, busybox: &Path) -> Result<()> {
    let bin = std::fs::read(busybox).with_context(|| {
        format!(
            "reading {} (image-builder/conformance/images.sh builds it)",
            busybox.display()
        )
    })?;
    let list = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .with_context(|| format!("running {} --list", busybox.display()))?;
    anyhow::ensure!(list.status.success(), "{} --list failed", busybox.display());
    let links: Vec<(String, &str)> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|a| !a.is_empty() && *a != "busybox")
        .map(|a| (format!("bin/{a}"), "busybox"))
        .collect();
    let passwd = b"root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\nbin:x:2:2:bin:/bin:/bin/false\nsys:x:3:3:sys:/dev:/bin/false\nsync:x:4:100:sync:/bin:/bin/sync\nmail:x:8:8:mail:/var/spool/mail:/bin/false\nwww-data:x:33:33:www-data:/var/www:/bin/false\noperator:x:37:37:Operator:/var:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n";
    let group = b"root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\ndisk:x:6:\nwheel:x:10:root\nmail:x:8:\nwww-data:x:33:\noperator:x:37:\nstaff:x:50:\nusers:x:100:\nnogroup:x:65534:\n";
    let layer = socialweb_oci::layer(
        &[
            ("bin/busybox", 0o755, bin),
            ("etc/passwd", 0o644, passwd.to_vec()),
            ("etc/group", 0o644, group.to_vec()),
            ("root/.keep", 0o644, Vec::new()),
        ],
        &links,
    )?;
    let image = socialweb_oci::Image {
        cmd: &["sh"],
        env: &[PATH],
        ..socialweb_oci::Image::new(BUSYBOX_IMAGE, &[])
    };
    write(out, &socialweb_oci::Layer::Bytes(layer), &[image])
}

/// The pause image under the suite's name ([`PAUSE_IMAGE`]).
pub fn write_pause(out: &Path, pause_binary: &Path) -> Result<()> {
    socialweb_oci::write_pause_as(out, pause_binary, PAUSE_IMAGE)
}

fn write(out: &Path, layer: &socialweb_oci::Layer, images: &[socialweb_oci::Image]) -> Result<()> {
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    socialweb_oci::write_layout(std::io::BufWriter::new(file), layer, images)?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
        .with_context(|| format!("writing {}", out.display()))
}
