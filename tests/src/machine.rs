//! Fresh machines for install tests (docs/quickstart.md): a network namespace of the real
//! topology plus a root filesystem of its own and a PID namespace, so that installing
//! packages, writing `/etc`, and starting daemons touch the machine and not this host.
//!
//! The root is an overlay: this host's `/` (its Debian, with the packages `./x` installs:
//! what a fresh server with those packages has) under a tmpfs that takes every write, with
//! fresh `/run`, `/tmp` and `/root`, and this checkout, the caches and the host's socialweb
//! files out of sight. `/dev`, `/sys` (and its cgroup hierarchies) are the host's: one
//! kernel. Dropping the machine kills its PID namespace's init, which takes every process
//! of the machine with it (daemons, qemu guests), and with the last of them its mounts.
//!
//! systemd is not PID 1 here, so each machine has a stand-in `systemctl`
//! (`/usr/local/sbin/systemctl`, [`SYSTEMCTL`]): `enable --now`, `start`, `stop`,
//! `restart` and `is-active` of a unit run its `ExecStart` with its `Environment` and make
//! its `StateDirectory`/`RuntimeDirectory`, the parts of the packaged units a daemon relies
//! on, and apply the sandboxing the units set (`CapabilityBoundingSet=~...`, with the kernel's
//! bounding set as systemd does); a unit that sets an option it cannot apply is refused, so
//! no option reaches a package untested. The output goes to `/var/log/<unit>.log`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;

/// What a fresh machine must not have before anything is installed: the packages' files
/// and the daemons' state.
pub const NOT_YET: &[&str] = &[
    "/etc/socialweb",
    "/usr/bin/socialweb-broker",
    "/usr/lib/socialweb",
    "/var/lib/socialweb-broker",
    "/var/lib/socialweb-provider",
    "/lib/systemd/system/socialweb-broker.service",
];

/// A machine: `ns`'s network, its own root and processes.
#[derive(Debug)]
pub struct Machine {
    pub name: String,
    /// The PID namespace's init (its host pid; `perl`, see [`BOOT`]), whose root and
    /// namespaces commands enter.
    init: u32,
    _holder: Spawned,
    /// The tmpfs the machine's root is on (`<dir>/root`, in the machine's mount namespace).
    dir: TempDir,
}

/// The machine's mounts, then its init, chrooted into the new root: it reaps the orphans
/// reparented to it (a daemonizing qemu's first process), as an init does; perl because
/// Debian always has it (`perl-base` is essential).
const BOOT: &str = r#"set -eu
d="$1"; shift
mount -t tmpfs -o size=16g,mode=0755 machine "$d"
mkdir -p "$d/upper" "$d/work" "$d/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$d/upper,workdir=$d/work" "$d/root"
r="$d/root"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
for fresh in run tmp root var/tmp; do mount -t tmpfs -o mode=0755 "$fresh" "$r/$fresh"; done
chmod 1777 "$r/tmp" "$r/var/tmp"
mkdir -p "$r/run/lock"
# Out of sight: what this host has that a fresh server does not.
for hide in "$@"; do
  if [ -d "$r$hide" ]; then mount -t tmpfs -o mode=0755 hidden "$r$hide"; fi
done
exec chroot "$r" /usr/bin/perl -e 'while (1) { sleep 1 if wait() == -1 }'

"#;

/// The stand-in for systemd's `systemctl` (see the module's doc).
pub const SYSTEMCTL: &str = r#"#!/bin/bash
# The test machines' stand-in for systemctl: systemd is not PID 1 on the machine the tests
# run on (tests/src/machine.rs). It runs a unit's ExecStart with its Environment, makes its
# StateDirectory and RuntimeDirectory, and with Delegate=yes starts it in a cgroup of its own
# (as systemd's system.slice/<unit>.service, under /sys/fs/cgroup/.../systemctl-standin-*);
# output to /var/log/<unit>.log.
set -euo pipefail
unit() { local u="${1%.service}"; for d in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
  [ -f "$d/$u.service" ] && { echo "$d/$u.service"; return; }; done
  echo "Unit $u.service not found." >&2; exit 5; }
pidfile() { echo "/run/systemctl-standin/${1%.service}.pid"; }
cgroups() { if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo /sys/fs/cgroup; else
  echo /sys/fs/cgroup/memory /sys/fs/cgroup/pids /sys/fs/cgroup/cpu; fi; }
delegate() {
  local u="$1" tag="systemctl-standin-$RANDOM$RANDOM" h
  : > "/run/systemctl-standin/$u.cgroups"
  for h in $(cgroups); do
    mkdir -p "$h/$tag/$u.service"; echo "$BASHPID" > "$h/$tag/$u.service/cgroup.procs"
    echo "$h/$tag" >> "/run/systemctl-standin/$u.cgroups"
  done
}
undelegate() {
  local f="/run/systemctl-standin/$1.cgroups" d
  [ -f "$f" ] || return 0
  while read -r d; do find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; done < "$f"
  rm -f "$f"
}
running() { local p; p="$(pidfile "$1")"; [ -f "$p" ] && kill -0 "$(cat "$p")" 2>/dev/null; }
value() { sed -n "s/^$2=//p" "$1" | tail -1; }
# The unit's sandboxing (systemd.exec(5)) as the setpriv arguments that apply it; refuses an
# option it cannot apply, so none reaches a package untested.
sandbox() {
  local f="$1" o caps=""
  for o in $(grep -oE '^(Protect|Private|Restrict|Lock|MemoryDeny|SystemCall|Capability|AmbientCap|NoNewPriv|ReadWrite|ReadOnly|Inaccessible|UMask|DevicePolicy|DeviceAllow|IPAddress)[A-Za-z]*=' "$f" | sort -u); do
    case "$o" in
      CapabilityBoundingSet=) ;;
      *) echo "systemctl (the test machines' stand-in): $f sets ${o%=}, which it cannot apply" >&2; exit 1 ;;
    esac
  done
  o="$(value "$f" CapabilityBoundingSet)"
  [ -z "$o" ] && return 0
  case "$o" in
    "~"*) for c in ${o#\~}; do c="${c#CAP_}"; caps="$caps,-${c,,}"; done ;;
    *) echo "systemctl (stand-in): only CapabilityBoundingSet=~... (what to drop) is applied here" >&2; exit 1 ;;
  esac
  echo "setpriv --bounding-set ${caps#,}"
}
start() {
  local f u; f="$(unit "$1")"; u="${1%.service}"
  running "$u" && return 0
  mkdir -p /run/systemctl-standin
  local exec_start; exec_start="$(sed -n 's/^ExecStart=//p' "$f" | tail -1)"
  ( while IFS= read -r e; do export "$e"; done < <(sed -n 's/^Environment=//p' "$f")
    for s in $(sed -n 's/^StateDirectory=//p' "$f"); do mkdir -p -m 0700 "/var/lib/$s"; done
    for s in $(sed -n 's/^RuntimeDirectory=//p' "$f"); do mkdir -p -m 0700 "/run/$s"; done
    local sandboxed; sandboxed="$(sandbox "$f")" || exit 1
    if grep -qx 'Delegate=yes' "$f"; then delegate "$u"; fi
    cd /
    setsid bash -c "exec $sandboxed $exec_start" >>"/var/log/$u.log" 2>&1 </dev/null &
    echo $! > "$(pidfile "$u")" )
}
stop() {
  local u="${1%.service}" p; p="$(pidfile "$u")"
  running "$u" || return 0
  local pid; pid="$(cat "$p")"; kill -TERM "$pid"
  for _ in $(seq 900); do kill -0 "$pid" 2>/dev/null || { rm -f "$p"; undelegate "$u"; return 0; }; sleep 0.1; done
  kill -KILL "$pid"; rm -f "$p"; undelegate "$u"
}
cmd="${1:-}"; shift || true
case "$cmd" in
  enable) now=""; units=(); for a; do [ "$a" = --now ] && now=1 || units+=("$a"); done
          for u in "${units[@]}"; do unit "$u" >/dev/null; [ -z "$now" ] || start "$u"; done ;;
  start) for u; do start "$u"; done ;;
  stop|disable) for u; do [ "$u" = --now ] || stop "$u"; done ;;
  restart) for u; do stop "$u"; start "$u"; done ;;
  is-active) for u; do running "$u" && echo active || { echo inactive; exit 3; }; done ;;
  daemon-reload) ;;
  *) echo "systemctl (the test machines' stand-in): '$cmd' is not one it knows" >&2; exit 1 ;;
esac
"#;

impl Machine {
    /// A fresh machine on `ns`'s network. `hide` are host directories it must not see (the
    /// checkout, the caches); `/root` is always fresh.
    pub fn fresh(ns: &Netns, name: &str, hide: &[&Path]) -> Result<Machine> {
        let dir = TempDir::new(&format!("machine-{name}"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", ns.path().display()))
            .args(["--", "unshare", "--mount", "--pid", "--fork"])
            .args(["--propagation", "private", "--", "sh", "-c", BOOT, "boot"])
            .arg(dir.path())
            .args(hide);
        let mut holder = Spawned::start(cmd, &format!("machine {name}"))?;
        // The init is unshare's child; it is ready once it runs in the new root.
        let unshare = holder.id();
        let t = Instant::now();
        let init = loop {
            let children =
                std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                    .unwrap_or_default();
            if let Some(pid) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
            {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "perl" {
                    break pid;
                }
            }
            if let Some(status) = holder.try_status()? {
                let out = holder.finish(Duration::from_secs(1)).ok();
                let err = out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
                bail!(
                    "machine {name} did not boot ({status}): {}",
                    err.unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(20) {
                bail!("machine {name}: no init after 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let m = Machine {
            name: name.to_string(),
            init,
            _holder: holder,
            dir,
        };
        m.write("/usr/local/sbin/systemctl", SYSTEMCTL.as_bytes(), 0o755)?;
        Ok(m)
    }

    /// A path of the machine as this host reaches it (through its init's root).
    pub fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{inside}", self.init))
    }

    /// Writes a file into the machine.
    pub fn write(&self, inside: &str, bytes: &[u8], mode: u32) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(inside);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("{}: writing {inside}", self.name))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    }

    /// Reads a file of the machine (empty if it has none).
    pub fn read(&self, inside: &str) -> String {
        std::fs::read_to_string(self.path(inside)).unwrap_or_default()
    }

    /// A command that runs `program` in the machine: its network, mounts, root, processes.
    pub fn command(&self, program: &str) -> Command {
        self.command_with(program, &[])
    }

    /// [`Machine::command`] with `env` set besides a login's basics (nothing of this host's
    /// environment is passed on).
    pub fn command_with(&self, program: &str, env: &[(String, String)]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--target={}", self.init))
            .args(["--mount", "--net", "--pid", "--root", "--wd"])
            .args(["--", "env", "-i"])
            .arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["HOME=/root", "LANG=C.UTF-8", "TERM=dumb", "USER=root"])
            .args(env.iter().map(|(k, v)| format!("{k}={v}")))
            .arg(program);
        c
    }

    /// Runs `script` with bash (`-euo pipefail`) in the machine, in `/root`, with `env` set;
    /// past `limit` it is killed (exit status 124).
    pub fn bash(&self, script: &str, env: &[(String, String)], limit: Duration) -> Result<Output> {
        self.command_with("timeout", env)
            .args(["--kill-after=10", &format!("{}", limit.as_secs()), "bash"])
            .args(["-euo", "pipefail", "-c"])
            .arg(format!("cd /root\n{script}"))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running a script in machine {}", self.name))
    }

    /// Bind-mounts this host's `host` directory at `inside`, read-only (files handed to the
    /// machine, as an operator copies them).
    pub fn bind_read_only(&self, host: &Path, inside: &str) -> Result<()> {
        let at = self
            .dir
            .path()
            .join("root")
            .join(inside.trim_start_matches('/'));
        let script =
            "set -e; mkdir -p \"$2\"; mount --bind \"$1\" \"$2\"; mount -o remount,bind,ro \"$2\"";
        let mut c = Command::new("nsenter");
        c.arg(format!("--target={}", self.init))
            .args(["--mount", "--", "sh", "-c", script, "bind"])
            .arg(host)
            .arg(&at);
        crate::process::run_checked(&mut c)
            .with_context(|| format!("{}: binding {} at {inside}", self.name, host.display()))?;
        Ok(())
    }

    /// Which of [`NOT_YET`] the machine has (none, when it is fresh).
    pub fn socialweb_files(&self) -> Vec<&'static str> {
        NOT_YET
            .iter()
            .copied()
            .filter(|p| self.path(p).exists())
            .collect()
    }
}

impl Drop for Machine {
    /// Powers the machine off: its PID namespace's init killed, the kernel kills every other
    /// process in it (and in the namespaces below it), and its mounts go with the last.
    fn drop(&mut self) {
        // The cgroups its units were delegated (read before its root goes).
        let delegated: Vec<PathBuf> = std::fs::read_dir(self.path("/run/systemctl-standin"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "cgroups"))
            .flat_map(|e| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                text.lines().map(PathBuf::from).collect::<Vec<_>>()
            })
            .collect();
        let pid = nix::unistd::Pid::from_raw(self.init as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        // Until the kernel has taken them all (the tmpfs of its root is freed with them).
        let t = Instant::now();
        while std::path::Path::new(&format!("/proc/{}", self.init)).exists()
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for d in delegated {
            remove_cgroup_tree(&d);
        }
    }
}

/// Removes an empty cgroup and the empty cgroups below it, deepest first (a cgroup's
/// directory holds only the kernel's files, which go with it).
fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
