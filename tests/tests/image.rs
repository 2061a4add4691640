//! The node image (`docs/image.md`), built by the real `socialweb-image-builder` from the
//! reference config's Debian base: the same inputs give the same bytes; a changed input
//! changes the name; bad inputs, a size too small and a full disk are refused by name with
//! nothing left behind; and the image boots under qemu with Debian's kernel, an identity disk
//! and the seed disk attached, into a node whose agent runs under systemd, read its identity,
//! imported the seeds, and says in its status that it waits for a control plane it cannot
//! reach. Needs root (the builder stages a root filesystem), qemu-system-x86_64 and mke2fs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use testbed::nodeimage::{self, Spec, builder, same_bytes, test_image, test_spec};
use testbed::tmp::TempDir;

fn root_or_fail() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the node image tests build root filesystems and must run as root (./x test)"
    );
}

#[test]
fn the_same_inputs_give_the_same_bytes_and_any_changed_input_a_new_name() {
    root_or_fail();
    let t = Instant::now();
    // One build is the suite's cached image (built now, or by an earlier run from the same
    // inputs); the other is built here from scratch.
    let cached = test_image().unwrap();
    let first = Instant::now();
    let dir = TempDir::new("image-again").unwrap();
    let inputs = nodeimage::cache_dir().join("nodeimage-test-inputs");
    let again = dir.path().join("out");
    let d = nodeimage::build(&test_spec(&inputs), dir.path(), &again, true).unwrap();
    eprintln!(
        "second build {:.1}s: {} rootfs {} MiB",
        first.elapsed().as_secs_f64(),
        d["name"],
        d["files"]["rootfs.ext4"]["bytes"].as_u64().unwrap() >> 20
    );
    for f in [
        "nodeimage.json",
        "rootfs.ext4",
        "seeds.img",
        "vmlinuz",
        "initrd.img",
    ] {
        if let Err(e) = same_bytes(&cached.join(f), &again.join(f)).unwrap() {
            panic!("{f} differs between two builds of the same inputs: {e}");
        }
    }
    assert_eq!(d["vcpu"], 2);
    assert_eq!(d["memMiB"], 2048);
    assert!(d["name"].as_str().unwrap().starts_with("socialweb-node-"));

    // Changing vcpu, memMiB or any file changes the name.
    let name = |spec: &Spec| -> String {
        let cfg = dir.path().join("fp.toml");
        std::fs::write(&cfg, nodeimage::config_text(spec).unwrap()).unwrap();
        builder(&["fingerprint", "--config", cfg.to_str().unwrap()])
            .unwrap()
            .unwrap()
    };
    let spec = test_spec(&inputs);
    let same = name(&spec);
    assert_eq!(same.split_whitespace().next().unwrap(), d["name"]);
    let more_cpu = name(&Spec {
        vcpu: 3,
        ..spec.clone()
    });
    let more_mem = name(&Spec {
        mem_mib: 4096,
        ..spec.clone()
    });
    let extra = dir.path().join("extra");
    std::fs::write(&extra, "x").unwrap();
    let mut with_file = spec.clone();
    with_file.files.push((extra, "/etc/extra".into(), 0o644));
    let with_file = name(&with_file);
    for other in [&more_cpu, &more_mem, &with_file] {
        assert_ne!(&same, other);
    }
    eprintln!("total {:.1}s", t.elapsed().as_secs_f64());
}

#[test]
fn bad_inputs_a_small_size_and_a_full_disk_are_named_and_leave_nothing() {
    root_or_fail();
    let dir = TempDir::new("image-errors").unwrap();
    let inputs = nodeimage::cache_dir().join("nodeimage-test-inputs");
    // The suite image's inputs exist once it is built.
    test_image().unwrap();
    let out = dir.path().join("out");
    let try_build = |spec: &Spec, out: &Path| -> String {
        let cfg = dir.path().join("image.toml");
        std::fs::write(&cfg, nodeimage::config_text(spec).unwrap()).unwrap();
        builder(&[
            "build",
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .unwrap()
        .expect_err("the build should have been refused")
    };
    let leftovers = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "image.toml")
            .collect()
    };

    let mut missing = test_spec(&inputs);
    missing.images.push(dir.path().join("no-such-image.tar"));
    let e = try_build(&missing, &out);
    assert!(
        e.contains("images[1]: ") && e.contains("no-such-image.tar does not exist"),
        "{e}"
    );

    let small = Spec {
        size_mib: Some(64),
        ..test_spec(&inputs)
    };
    let e = try_build(&small, &out);
    assert!(e.contains("rootfs_size_mib: 64 MiB is too small"), "{e}");
    assert!(
        leftovers(dir.path()).is_empty(),
        "{:?}",
        leftovers(dir.path())
    );

    // A full disk: the output on a tmpfs too small for the image.
    let full = dir.path().join("full");
    std::fs::create_dir_all(&full).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=300m", "tmpfs"])
        .arg(&full)
        .status()
        .unwrap();
    assert!(st.success());
    let e = try_build(&test_spec(&inputs), &full.join("out"));
    let left = leftovers(&full);
    let _ = Command::new("umount").arg(&full).status();
    assert!(
        e.contains("disk is full") || e.contains("disk is too full"),
        "{e}"
    );
    assert!(e.contains(full.to_str().unwrap()), "{e}");
    assert!(left.is_empty(), "a failed build left {left:?}");
}

/// An ext4 disk labelled as the image's fstab expects, holding `identity.json`.
fn identity_disk(dir: &Path, identity: &serde_json::Value) -> std::path::PathBuf {
    let src = dir.join("identity-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        src.join("identity.json"),
        serde_json::to_vec_pretty(identity).unwrap(),
    )
    .unwrap();
    let img = dir.join("identity.img");
    let st = Command::new("mke2fs")
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-O",
            "^has_journal",
            "-L",
            "socialweb-id",
            "-d",
        ])
        .arg(&src)
        .arg(&img)
        .arg("8M")
        .status()
        .unwrap();
    assert!(st.success());
    img
}

#[test]
fn the_image_boots_under_qemu_into_an_agent_that_reports_its_status() {
    root_or_fail();
    let image = test_image().unwrap();
    let dir = TempDir::new("image-boot").unwrap();
    let (secret, _endpoint) = testbed::k8s::mesh_keygen().unwrap();
    // 10.0.2.2 is qemu's user-mode gateway: nothing listens on 6443 there.
    let identity = serde_json::json!({
        "version": 3, "cluster": "boot", "node": "boot-1",
        "server_url": "https://10.0.2.2:6443",
        "ca_cert_sha256": format!("sha256:{}", "ab".repeat(32)),
        "join_token": "abcdef.0123456789abcdef",
        "relay_url": "http://10.0.2.2:3340", "mesh_secret_key": secret,
        "cluster_cidr": "10.42.0.0/16", "service_cidr": "10.43.0.0/16",
        "cluster_domain": "cluster.local", "upstream_resolvers": ["10.0.2.3"],
    });
    let id_disk = identity_disk(dir.path(), &identity);
    let console = dir.path().join("console.log");
    // TCG unless asked for KVM: /dev/kvm exists here but nested KVM hangs the guest.
    let kvm = std::env::var("SOCIALWEB_QEMU_ACCEL").as_deref() == Ok("kvm");
    let t = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-machine", "q35", "-m", "1536", "-smp", "2", "-display", "none",
    ])
    .args(["-monitor", "none", "-no-reboot"])
    .args(["-accel", if kvm { "kvm" } else { "tcg" }])
    .arg("-serial")
    .arg(format!("file:{}", console.display()))
    .arg("-kernel")
    .arg(image.join("vmlinuz"))
    .arg("-initrd")
    .arg(image.join("initrd.img"))
    .args([
        "-append",
        "root=LABEL=socialweb-root rw console=ttyS0 panic=-1 quiet socialweb.boot_report",
    ])
    .arg("-drive")
    .arg(format!(
        "file={},if=virtio,format=raw,snapshot=on",
        image.join("rootfs.ext4").display()
    ))
    .arg("-drive")
    .arg(format!(
        "file={},if=virtio,format=raw,readonly=on",
        id_disk.display()
    ))
    .arg("-drive")
    .arg(format!(
        "file={},if=none,id=seeds,format=raw,readonly=on",
        image.join("seeds.img").display()
    ))
    .args([
        "-device",
        "virtio-blk-pci,drive=seeds,serial=socialweb-seeds",
    ])
    .args([
        "-netdev",
        "user,id=n0",
        "-device",
        "virtio-net-pci,netdev=n0",
    ]);
    let qemu_log = dir.path().join("qemu.log");
    let mut child = testbed::process::Spawned::start_logged(qemu, "qemu", &qemu_log).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let report = loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if let (Some(a), Some(b)) = (
            text.find("=== socialweb-boot-report begin"),
            text.find("=== socialweb-boot-report end"),
        ) {
            break text[a..b].to_string();
        }
        assert!(
            Instant::now() < deadline && child.is_running(),
            "no boot report on the console after {:.0}s:\n{}\nqemu: {}",
            t.elapsed().as_secs_f64(),
            text,
            std::fs::read_to_string(&qemu_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "boot report after {secs:.1}s ({}):\n{report}",
        if kvm { "kvm" } else { "tcg" }
    );
    assert!(report.contains("ActiveState=active"), "{report}");
    assert!(report.contains("SubState=running"), "{report}");
    assert!(report.contains("node boot-1 of cluster boot"), "{report}");
    let json = report
        .split("=== json")
        .nth(1)
        .and_then(|s| s.lines().nth(1))
        .unwrap_or_default();
    let status: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("status --json: {e}: {json}\n{report}"));
    let step = |name: &str| {
        status["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(step("containerd")["state"], "done", "{report}");
    let images = step("images");
    assert_eq!(images["state"], "done", "{report}");
    assert!(
        images["detail"]
            .as_str()
            .unwrap()
            .contains("2 on the seed disk"),
        "{images}"
    );
    // Waiting for a control plane it cannot reach, and saying so (between two tries the
    // step is `running` with the last try's error).
    let trust = step("trust");
    assert!(
        trust["state"] == "retrying" || trust["state"] == "running",
        "{report}"
    );
    assert!(
        trust["last_error"]
            .as_str()
            .unwrap()
            .contains("control plane https://10.0.2.2:6443/ unreachable"),
        "{trust}"
    );
    // The report powers the VM off.
    let _ = child.finish(Duration::from_secs(60));
}
