//! Machines that are VMs: each lease's node boots the node image (`docs/image.md`) as a qemu
//! guest on this provider's machine, its own kernel the isolation boundary. What a guest is
//! given: a copy-on-write root disk on the image's `rootfs.ext4` (qcow2, the image its
//! backing file, sized from the RFP), the identity disk read-only, the image's seed disk
//! read-only, the RFP's vCPUs and memory, one NIC behind qemu's user-mode NAT (it reaches
//! out through this machine; nothing reaches in), the serial console in a file, and the
//! status port (`socialweb_wire::guest`) the agent says `started` and `ready` on.
//!
//! - [`NodeImage`]: the image this provider holds, read and checked from `nodeimage.json`.
//! - [`probe_kvm`]: whether KVM runs a guest here (nested guests can hang: a timeout says).
//! - [`qemu_args`]: the command line, pure, from the image, the size and the accelerator.
//! - [`Guest`]: one running guest, its record surviving a provider restart.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use socialweb_market::NodeSpec;
use socialweb_proc::cgroup::Cgroup;
use socialweb_proc::same;
use socialweb_wire::guest::{self, Event};

use crate::jail::Jail;

/// How a provider's VMs run their vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accel {
    /// The kernel's hypervisor (`/dev/kvm`).
    Kvm,
    /// qemu's translator: slow (a node boots in minutes), but it runs anywhere.
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// What the operator asks for (`local_provider.vm.accel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccelChoice {
    /// KVM if a probe guest runs under it within [`PROBE_TIMEOUT`], TCG otherwise.
    #[default]
    Auto,
    Kvm,
    Tcg,
}

/// How the provider runs its VMs.
#[derive(Debug, Clone)]
pub struct VmSettings {
    pub accel: AccelChoice,
    /// A lease whose guest has not said `ready` by then fails, with the console's last
    /// lines as its reason.
    pub boot_timeout: Duration,
    /// `qemu-system-x86_64` and `qemu-img`.
    pub qemu: PathBuf,
    pub qemu_img: PathBuf,
    /// Whether a TCG guest bids as `vm` isolation (the operator's choice: QEMU does not count
    /// TCG as a security boundary).
    pub tcg_as_vm: bool,
    /// Private addresses guests may reach besides the internet ([`crate::jail`]).
    pub egress_allow: Vec<ipnet::Ipv4Net>,
    /// Whether each guest is jailed ([`crate::jail`]). Off only to measure what the jail
    /// costs (`bench/vm`): an unjailed guest never bids as `vm` isolation.
    pub jail: bool,
}

/// How long KVM gets to show that it runs a guest: a working one prints the kernel's banner
/// in well under a second; a nested guest that hangs prints nothing, ever.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The node image this provider boots, as `nodeimage.json` describes it.
#[derive(Debug, Clone)]
pub struct NodeImage {
    pub dir: PathBuf,
    /// `socialweb-node-<16 hex>`.
    pub name: String,
    /// `sha256:<64 hex>`: what RFPs name the image by.
    pub fingerprint: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
    pub seeds: PathBuf,
    /// The image's boot command line (root by label, the serial console).
    pub cmdline: String,
}

fn str_field<'a>(v: &'a serde_json::Value, path: &[&str], file: &Path) -> Result<&'a str> {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().with_context(|| {
        format!(
            "{}: no string at {} (not a node image's description?)",
            file.display(),
            path.join(".")
        )
    })
}

impl NodeImage {
    /// Reads `dir/nodeimage.json` and checks every file it lists (size and SHA-256), so that
    /// a guest boots exactly the bytes the fingerprint names.
    pub fn load(dir: &Path) -> Result<NodeImage> {
        let file = dir.join("nodeimage.json");
        let text = std::fs::read(&file).with_context(|| {
            format!(
                "reading {} (a node image directory: socialweb-image-builder build --out)",
                file.display()
            )
        })?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", file.display()))?;
        let files = v["files"]
            .as_object()
            .with_context(|| format!("{}: no files", file.display()))?;
        for (name, meta) in files {
            let path = dir.join(name);
            let want = meta["sha256"].as_str().unwrap_or_default();
            let (got, bytes) = socialweb_oci::sha256_file(&path)?;
            if Some(bytes) != meta["bytes"].as_u64() || got != want.trim_start_matches("sha256:") {
                bail!(
                    "{}: {} is not the file the image lists ({} bytes, sha256 {got}; listed: {} bytes, {want})",
                    file.display(),
                    path.display(),
                    bytes,
                    meta["bytes"]
                );
            }
        }
        let at = |p: &[&str]| -> Result<PathBuf> { Ok(dir.join(str_field(&v, p, &file)?)) };
        let image = NodeImage {
            dir: dir.to_path_buf(),
            name: str_field(&v, &["name"], &file)?.to_string(),
            fingerprint: str_field(&v, &["fingerprint"], &file)?.to_string(),
            kernel: at(&["boot", "kernel"])?,
            initrd: at(&["boot", "initrd"])?,
            rootfs: at(&["rootfs", "file"])?,
            seeds: dir.join("seeds.img"),
            cmdline: str_field(&v, &["boot", "cmdline"], &file)?.to_string(),
        };
        for f in [&image.kernel, &image.initrd, &image.rootfs, &image.seeds] {
            if !f.is_file() {
                bail!("the node image {} has no {}", dir.display(), f.display());
            }
        }
        Ok(image)
    }

    /// Whether an RFP's `image` names this one (by fingerprint, or by name).
    pub fn is(&self, wanted: &str) -> bool {
        wanted == self.fingerprint || wanted == self.name
    }
}

/// Whether KVM runs a guest here: boots the image's kernel with no root under `-accel kvm`
/// and waits up to `timeout` for its banner on the console. `Err` only when qemu itself
/// cannot be run.
pub fn probe_kvm(s: &VmSettings, image: &NodeImage, timeout: Duration) -> Result<(bool, String)> {
    if !Path::new("/dev/kvm").exists() {
        return Ok((false, "no /dev/kvm".into()));
    }
    let dir = std::env::temp_dir().join(format!("socialweb-kvm-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let console = dir.join("console.log");
    let mut child = Command::new(&s.qemu)
        .args([
            "-machine", "q35", "-accel", "kvm", "-cpu", "host", "-m", "128",
        ])
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(&image.kernel)
        .args(["-append", "console=ttyS0 panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", s.qemu.display()))?;
    let t = Instant::now();
    let verdict = loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if text.contains("Linux version") {
            break (
                true,
                format!("a guest kernel ran in {} ms", t.elapsed().as_millis()),
            );
        }
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            break (
                false,
                format!("qemu -accel kvm exited ({st}): {}", err.trim()),
            );
        }
        if t.elapsed() > timeout {
            break (
                false,
                format!(
                    "a guest under KVM printed nothing in {} s (nested virtualization hangs here)",
                    timeout.as_secs()
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(verdict)
}

/// The accelerator to use and why.
pub fn choose_accel(s: &VmSettings, image: &NodeImage) -> Result<(Accel, String)> {
    match s.accel {
        AccelChoice::Kvm => Ok((Accel::Kvm, "local_provider.vm.accel = \"kvm\"".into())),
        AccelChoice::Tcg => Ok((Accel::Tcg, "local_provider.vm.accel = \"tcg\"".into())),
        AccelChoice::Auto => {
            let (ok, why) = probe_kvm(s, image, PROBE_TIMEOUT)?;
            Ok((if ok { Accel::Kvm } else { Accel::Tcg }, why))
        }
    }
}

/// A guest's files, in its directory on the provider's machine.
#[derive(Debug, Clone)]
pub struct GuestFiles {
    pub dir: PathBuf,
}

impl GuestFiles {
    pub fn root_disk(&self) -> PathBuf {
        self.dir.join("root.qcow2")
    }
    pub fn identity_disk(&self) -> PathBuf {
        self.dir.join("identity.img")
    }
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }
    pub fn status(&self) -> PathBuf {
        self.dir.join("status.log")
    }
    pub fn pidfile(&self) -> PathBuf {
        self.dir.join("qemu.pid")
    }
}

/// The guest's disks: the root overlay, the identity disk and the seed disk (read-only).
fn disk_args(image: &NodeImage, files: &GuestFiles) -> Vec<String> {
    let root = format!(
        "file={},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
        files.root_disk().display()
    );
    let id = format!(
        "file={},if=virtio,format=raw,readonly=on",
        files.identity_disk().display()
    );
    let seeds = format!(
        "file={},if=none,id=seeds,format=raw,readonly=on",
        image.seeds.display()
    );
    let device = "virtio-blk-pci,drive=seeds,serial=socialweb-seeds".to_string();
    vec![
        "-drive".into(),
        root,
        "-drive".into(),
        id,
        "-drive".into(),
        seeds,
        "-device".into(),
        device,
    ]
}

/// The guest's network and its status port.
fn io_args(files: &GuestFiles) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    // User-mode NAT: the guest's connections leave from this machine's own sockets; no
    // port is forwarded in.
    push(&[
        "-netdev",
        "user,id=n0",
        "-device",
        "virtio-net-pci,netdev=n0",
    ]);
    let status = format!("file,id=status,append=on,path={}", files.status().display());
    let port = format!(
        "virtserialport,bus=vs.0,chardev=status,name={}",
        guest::PORT_NAME
    );
    push(&[
        "-device",
        "virtio-serial-pci,id=vs",
        "-chardev",
        &status,
        "-device",
        &port,
    ]);
    a
}

/// qemu's command line for one guest (after the program's name).
pub fn qemu_args(
    image: &NodeImage,
    spec: &NodeSpec,
    accel: Accel,
    files: &GuestFiles,
    jail: Option<&Jail>,
    extra_append: &str,
) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    // A jailed TCG guest's translated code is bounded, so its cgroup's budget holds it.
    let accel_opt = match (accel, jail) {
        (Accel::Tcg, Some(_)) => format!("tcg,tb-size={}", crate::jail::TCG_TB_MIB),
        _ => accel.as_str().to_string(),
    };
    push(&["-machine", "q35", "-accel", &accel_opt]);
    if accel == Accel::Kvm {
        push(&["-cpu", "host"]);
    }
    let smp = spec.vcpu.to_string();
    let mem = spec.mem_mib.to_string();
    push(&["-smp", &smp, "-m", &mem]);
    // qemu's own seccomp filter (docs/security.md): obsolete syscalls and changing its
    // scheduling or limits refused. Not `spawn=deny`: -daemonize forks after the filter is
    // on; not `elevateprivileges=deny`: qemu 7.2 then exits at -daemonize without a word.
    push(&["-sandbox", "on,resourcecontrol=deny"]);
    // Root only while it opens its disks and devices; then chrooted, as the guest's own uid
    // (crate::jail).
    if let Some(j) = jail {
        push(&j.qemu_args().iter().map(String::as_str).collect::<Vec<_>>());
    }
    // No display, no monitor, no default devices; a guest that powers off or panics ends
    // its qemu (panic=-1 reboots at once, -no-reboot turns that into an exit).
    push(&[
        "-nodefaults",
        "-display",
        "none",
        "-monitor",
        "none",
        "-no-reboot",
    ]);
    // Appended, so the provider may cut it short under a guest that floods it (trim_logs).
    let console = format!(
        "file,id=console,append=on,path={}",
        files.console().display()
    );
    push(&["-chardev", &console, "-serial", "chardev:console"]);
    let kernel = image.kernel.display().to_string();
    let initrd = image.initrd.display().to_string();
    let append = format!("{} panic=-1 {extra_append}", image.cmdline);
    push(&[
        "-kernel",
        &kernel,
        "-initrd",
        &initrd,
        "-append",
        append.trim_end(),
    ]);
    push(
        &disk_args(image, files)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    push(
        &io_args(files)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    push(&["-device", "virtio-rng-pci"]);
    let pidfile = files.pidfile().display().to_string();
    push(&["-pidfile", &pidfile, "-daemonize"]);
    a
}

/// Kills a qemu left running in `files.dir` by a provider that crashed between starting it
/// and writing its record (its pidfile names it; its command line names the directory, so a
/// reused pid is left alone).
pub fn kill_leftover(files: &GuestFiles) {
    let Some(pid) = std::fs::read_to_string(files.pidfile())
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return;
    };
    let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*files.dir.to_string_lossy()));
    if ours {
        stop_qemu(pid, socialweb_proc::start_time(pid).unwrap_or(0));
    }
}

/// What survives a provider restart: enough to find the guest, follow it and remove it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRecord {
    pub dir: PathBuf,
    /// qemu's pid and kernel start time.
    pub pid: u32,
    pub started: u64,
    pub accel: Accel,
    /// Milliseconds since 1970: qemu started; the agent said `started`; it said `ready`.
    pub vmm_started_ms: u64,
    #[serde(default)]
    pub agent_started_ms: Option<u64>,
    #[serde(default)]
    pub ready_ms: Option<u64>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("failed")
        );
    }
    Ok(())
}

/// Makes the guest's disks in `files.dir`: the root overlay (`disk_mib` large; the guest
/// grows its filesystem to it) and the identity disk, an ext4 labelled as the image's fstab
/// expects, holding only `identity.json`.
pub fn make_disks(
    s: &VmSettings,
    image: &NodeImage,
    files: &GuestFiles,
    disk_mib: u64,
    identity: &[u8],
) -> Result<()> {
    let rootfs_mib = std::fs::metadata(&image.rootfs)?.len().div_ceil(1 << 20);
    let size_mib = disk_mib.max(rootfs_mib);
    run(
        Command::new(&s.qemu_img)
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&image.rootfs)
            .arg(files.root_disk())
            .arg(format!("{size_mib}M")),
        "qemu-img create (the root disk's overlay)",
    )?;
    let src = files.dir.join("identity-src");
    std::fs::create_dir_all(&src)?;
    crate::machine::write_secret(&src.join("identity.json"), identity)?;
    let made = run(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-L", "socialweb-id", "-d"])
            .arg(&src)
            .arg(files.identity_disk())
            .arg("4M"),
        "mke2fs (the identity disk)",
    );
    // The document lives on in the disk only (owner-only, in the provider's directory).
    let _ = std::fs::remove_dir_all(&src);
    made?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        files.identity_disk(),
        std::fs::Permissions::from_mode(0o600),
    )?;
    Ok(())
}

/// Starts qemu for a guest whose disks are made; returns once it runs (qemu daemonizes
/// after its devices are set up, so a bad disk or option is an error here).
pub fn start(
    s: &VmSettings,
    image: &NodeImage,
    spec: &NodeSpec,
    accel: Accel,
    files: &GuestFiles,
    jail: Option<(&Jail, &Cgroup)>,
    extra_append: &str,
) -> Result<GuestRecord> {
    let _ = std::fs::remove_file(files.pidfile());
    std::fs::write(files.status(), "")?;
    let vmm_started_ms = now_ms();
    let mut cmd = match jail {
        Some((j, cgroup)) => j.command(&s.qemu, cgroup),
        None => Command::new(&s.qemu),
    };
    run(
        cmd.args(qemu_args(
            image,
            spec,
            accel,
            files,
            jail.map(|(j, _)| j),
            extra_append,
        ))
        .stdin(Stdio::null()),
        "qemu-system-x86_64",
    )?;
    let pid: u32 = std::fs::read_to_string(files.pidfile())
        .context("qemu wrote no pidfile")?
        .trim()
        .parse()
        .context("qemu's pidfile")?;
    Ok(GuestRecord {
        dir: files.dir.clone(),
        pid,
        started: socialweb_proc::start_time(pid).unwrap_or(0),
        accel,
        vmm_started_ms,
        agent_started_ms: None,
        ready_ms: None,
    })
}

impl GuestRecord {
    pub fn files(&self) -> GuestFiles {
        GuestFiles {
            dir: self.dir.clone(),
        }
    }

    pub fn running(&self) -> bool {
        same(self.pid, self.started)
    }

    /// What the guest said on its status port so far.
    pub fn events(&self) -> Vec<Event> {
        // Read at most the port's first 64 KiB: a guest that floods it says nothing more.
        let mut text = String::new();
        if let Ok(f) = std::fs::File::open(self.files().status()) {
            let _ = f.take(READ_MAX).read_to_string(&mut text);
        }
        guest::events(&text)
    }

    /// Powers the guest off (qemu ends it: SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&self) {
        stop_qemu(self.pid, self.started);
    }
}

/// Ends qemu `pid` (started at `started`, so a reused pid is left alone): SIGTERM, which it
/// answers by shutting the guest down, then SIGKILL after 10 s.
fn stop_qemu(pid: u32, started: u64) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if !same(pid, started) {
        return;
    }
    let p = Pid::from_raw(pid as i32);
    let _ = kill(p, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while same(pid, started) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if same(pid, started) {
        let _ = kill(p, Signal::SIGKILL);
    }
}

/// The most of a guest's console or status port kept on disk: the guest writes them as fast
/// as it likes.
pub const LOG_MAX: u64 = 4 << 20;

/// What of a guest's console and status port is read: its end and its start.
const READ_MAX: u64 = 64 << 10;

/// Cuts a guest's console or status port that grew past [`LOG_MAX`] (qemu appends, so it
/// writes on at the new end): the console to nothing, its last 64 KiB kept in `console.1`
/// first; the status port to its first 64 KiB, all the provider ever reads of it.
pub fn trim_logs(files: &GuestFiles) {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let cut = |p: &Path, to: u64| {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .and_then(|f| f.set_len(to));
    };
    if len(&files.console()) > LOG_MAX {
        if let Ok(end) = console_end(files) {
            let _ = std::fs::write(files.dir.join("console.1"), end);
        }
        cut(&files.console(), 0);
    }
    if len(&files.status()) > LOG_MAX {
        cut(&files.status(), READ_MAX);
    }
}

/// The console's last 64 KiB (with what was kept of it at its last cut), read from there:
/// only its end is ever read into memory.
fn console_end(files: &GuestFiles) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let tail = |p: &Path| -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::File::open(p)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(READ_MAX)))?;
        let mut bytes = Vec::new();
        f.take(READ_MAX).read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    let now = tail(&files.console())?;
    if now.len() as u64 >= READ_MAX {
        return Ok(now);
    }
    let mut bytes = tail(&files.dir.join("console.1")).unwrap_or_default();
    bytes.extend_from_slice(&now);
    let skip = bytes.len().saturating_sub(READ_MAX as usize);
    Ok(bytes.split_off(skip))
}

/// The console's `Kernel panic` line, if the guest's kernel panicked: the tail after it is
/// a stack trace that does not say why.
pub fn panic_line(files: &GuestFiles) -> Option<String> {
    let bytes = console_end(files).ok()?;
    String::from_utf8_lossy(&bytes)
        .lines()
        .find(|l| l.contains("Kernel panic"))
        .map(|l| {
            l.chars()
                .filter(|c| !c.is_control())
                .take(300)
                .collect::<String>()
        })
        .map(|l| l.trim().to_string())
}

/// The console's last `lines` lines, without control characters (a guest's console is its
/// own to write: it goes into a lease's reason as plain text only), at most 2 KiB.
pub fn console_tail(files: &GuestFiles, lines: usize) -> String {
    let bytes = console_end(files).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let clean: Vec<String> = text
        .lines()
        .map(|l| l.chars().filter(|c| !c.is_control()).collect::<String>())
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let mut tail = clean[clean.len().saturating_sub(lines)..].join("\n");
    if tail.len() > 2048 {
        let cut = tail.len() - 2048;
        let at = (cut..tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(0);
        tail = tail[at..].to_string();
    }
    if tail.is_empty() {
        "(the console is empty)".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> NodeImage {
        NodeImage {
            dir: "/img".into(),
            name: "socialweb-node-0123456789abcdef".into(),
            fingerprint: format!("sha256:{}", "ab".repeat(32)),
            kernel: "/img/vmlinuz".into(),
            initrd: "/img/initrd.img".into(),
            rootfs: "/img/rootfs.ext4".into(),
            seeds: "/img/seeds.img".into(),
            cmdline: "root=LABEL=socialweb-root rw console=ttyS0".into(),
        }
    }

    #[test]
    fn the_command_line_carries_the_size_the_disks_and_no_way_in() {
        let files = GuestFiles { dir: "/g".into() };
        let spec = NodeSpec {
            vcpu: 3,
            mem_mib: 3072,
            disk_mib: 20480,
        };
        let jail = Jail::plan("swp-", "172.30.0.0".parse().unwrap(), 5, &files.dir);
        let a = qemu_args(&image(), &spec, Accel::Tcg, &files, Some(&jail), "");
        let j = a.join(" ");
        assert!(j.contains("-accel tcg,tb-size=256 -smp 3 -m 3072"), "{j}");
        assert!(!j.contains("-cpu host"), "{j}");
        assert!(j.contains("-sandbox on,resourcecontrol=deny"), "{j}");
        assert!(
            j.contains("-runas 2000000005:2000000005 -chroot /g/root"),
            "{j}"
        );
        assert!(
            j.contains(
                "-chardev file,id=console,append=on,path=/g/console.log -serial chardev:console"
            ),
            "{j}"
        );
        let bare = qemu_args(&image(), &spec, Accel::Tcg, &files, None, "").join(" ");
        assert!(bare.contains("-accel tcg -smp"), "{bare}");
        assert!(
            !bare.contains("-runas") && !bare.contains("-chroot"),
            "{bare}"
        );
        assert!(
            j.contains("file=/g/root.qcow2,if=virtio,format=qcow2"),
            "{j}"
        );
        assert!(
            j.contains("file=/g/identity.img,if=virtio,format=raw,readonly=on"),
            "{j}"
        );
        assert!(j.contains("file=/img/seeds.img,if=none,id=seeds,format=raw,readonly=on"));
        assert!(j.contains("serial=socialweb-seeds"));
        assert!(j.contains("name=org.socialweb.status"));
        assert!(
            a.iter().any(|x| x == "user,id=n0"),
            "user-mode NAT, no hostfwd: {j}"
        );
        assert!(!j.contains("hostfwd"));
        let i = a.iter().position(|x| x == "-append").unwrap();
        assert_eq!(
            a[i + 1],
            "root=LABEL=socialweb-root rw console=ttyS0 panic=-1"
        );
        let k = qemu_args(
            &image(),
            &spec,
            Accel::Kvm,
            &files,
            Some(&jail),
            "init=/bin/false",
        )
        .join(" ");
        assert!(k.contains("-accel kvm -cpu host"), "{k}");
        assert!(k.contains("panic=-1 init=/bin/false"), "{k}");
    }

    #[test]
    fn an_image_is_named_by_fingerprint_or_name() {
        let i = image();
        assert!(i.is(&i.fingerprint.clone()));
        assert!(i.is("socialweb-node-0123456789abcdef"));
        assert!(!i.is("local"));
        assert!(!i.is(&format!("sha256:{}", "cd".repeat(32))));
    }

    #[test]
    fn the_console_tail_is_plain_and_bounded() {
        let dir = std::env::temp_dir().join(format!("sw-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = GuestFiles { dir: dir.clone() };
        assert_eq!(console_tail(&files, 5), "(the console is empty)");
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!("line {i}\r\n"));
        }
        text.push_str("\u{1b}[2J[    2.6] Kernel panic - not syncing: Attempted to kill init!\n");
        std::fs::write(files.console(), text).unwrap();
        let t = console_tail(&files, 3);
        assert_eq!(
            t,
            "line 98\nline 99\n[2J[    2.6] Kernel panic - not syncing: Attempted to kill init!"
        );
        assert_eq!(
            panic_line(&files).as_deref(),
            Some("[2J[    2.6] Kernel panic - not syncing: Attempted to kill init!")
        );
        std::fs::write(files.console(), "x".repeat(10_000)).unwrap();
        assert_eq!(panic_line(&files), None);
        assert!(console_tail(&files, 3).len() <= 2048);
        // A console of 200 MiB (sparse: the guest's bytes cost it nothing to claim) is read
        // from its last 64 KiB.
        let f = std::fs::File::create(files.console()).unwrap();
        f.set_len(200 << 20).unwrap();
        drop(f);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(files.console())
            .unwrap();
        std::io::Write::write_all(&mut f, b"\nlast words\n").unwrap();
        assert_eq!(console_end(&files).unwrap().len(), 64 << 10);
        assert!(console_tail(&files, 1).ends_with("last words"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_flooded_console_is_cut_and_its_end_kept() {
        let dir = std::env::temp_dir().join(format!("sw-trim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = GuestFiles { dir: dir.clone() };
        let mut flood = "x".repeat(LOG_MAX as usize);
        flood.push_str("\nthe last words before the cut\n");
        std::fs::write(files.console(), &flood).unwrap();
        std::fs::write(files.status(), "s".repeat(LOG_MAX as usize + 1)).unwrap();
        trim_logs(&files);
        assert_eq!(std::fs::metadata(files.console()).unwrap().len(), 0);
        assert_eq!(std::fs::metadata(files.status()).unwrap().len(), READ_MAX);
        assert!(console_tail(&files, 1).contains("the last words before the cut"));
        std::fs::write(files.console(), "after the cut\n").unwrap();
        assert_eq!(
            console_tail(&files, 2),
            "the last words before the cut\nafter the cut"
        );
        // Under the bound, nothing is cut.
        trim_logs(&files);
        assert_eq!(std::fs::metadata(files.console()).unwrap().len(), 14);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
