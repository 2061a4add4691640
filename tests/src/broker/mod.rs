//! The broker as the operator runs it, on the real topology ([`crate::world`]):
//! `socialweb-broker run` on the operator's host with a configuration file, renting from its
//! embedded local provider (nodes behind NAT on the operator's host) or from
//! `socialweb-broker provider` processes, one per provider machine, across the internet. The
//! harness only writes the configurations (the broker's own [`Config`](socialweb_broker::config::Config),
//! [`config`]), runs the commands an operator (and a provider) would, asks the broker where
//! its files are (`paths --json`, `cluster list --json`), and asks the providers -- not the
//! broker -- what is really leased ([`queries`]).

mod config;
mod queries;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use socialweb_broker::command::ClusterInfo;
use socialweb_broker::config::ProviderRef;
use socialweb_broker::daemon::Paths;

pub use config::{
    BrokerOptions, FRONT_PORT, PROVIDER_ADDR, PROVIDER_PORT, read_config, write_config,
};

use crate::cni::workspace_bin;
use crate::k8s::wait_for;
use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;
use crate::world::World;
use config::NodeSoftware;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A provider machine's `socialweb-broker provider`.
#[derive(Debug)]
pub struct ProviderProc {
    proc: Spawned,
    /// 1-based, as the world numbers provider machines.
    pub index: u8,
    pub config: PathBuf,
    pub state: PathBuf,
    /// Where it keeps its files, as `socialweb-broker paths` says.
    pub paths: Paths,
    /// Prefix of its namespaces and cgroups.
    pub prefix: String,
    /// Its market URL, as the broker reaches it (mutual TLS).
    pub url: String,
    /// Its key, as `socialweb-broker provider-pin` prints it.
    pub pin: String,
}

/// The market section's entries for `providers`.
fn refs(providers: &[ProviderProc]) -> Vec<ProviderRef> {
    providers
        .iter()
        .map(|p| ProviderRef {
            name: format!("p{}", p.index),
            url: p.url.clone(),
            pin: Some(p.pin.clone()),
            region: None,
            zone: None,
        })
        .collect()
}

/// A broker (and its providers) on `world`. Dropping it kills them all and destroys every
/// machine the providers made. Starting and stopping its processes is here; what the harness
/// asks of it (kubectl, the providers' leases, nodes, logs) is in [`queries`].
#[derive(Debug)]
pub struct Broker<'w> {
    broker: Spawned,
    pub providers: Vec<ProviderProc>,
    pub world: &'w World,
    /// The operator's host, where the broker runs (or a fleet's other host: `on_host`).
    pub host: &'w Netns,
    /// Its address users and nodes reach: [`crate::world::OPERATOR_ADDR`], or the host's.
    pub public_addr: std::net::Ipv4Addr,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    /// Where it keeps its files, as `socialweb-broker paths` says.
    pub paths: Paths,
    /// Prefix of the embedded provider's namespaces and cgroups.
    pub prefix: String,
    pub opts: BrokerOptions,
    /// The clusters the broker last described, for when it does not answer (killed).
    known: Mutex<HashMap<String, ClusterInfo>>,
    /// The state directory's own filesystem (`state_fs_mib`), unmounted before `dir` goes.
    _state_fs: Option<StateFs>,
    _cni: TempDir,
    dir: TempDir,
}

fn prefix(tag: &str) -> String {
    format!(
        "swt-{}-{}{tag}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// `socialweb-broker <sub> --config <config> [args]`, as the operator runs it, its stdout.
fn operator_command(sub: &str, config: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(workspace_bin("socialweb-broker"))
        .arg(sub)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "socialweb-broker {sub} --config {}: {}",
            config.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Where a broker or provider machine configured by `config` keeps its files.
fn paths_of(config: &Path) -> Result<Paths> {
    serde_json::from_str(&operator_command("paths", config, &["--json"])?)
        .context("reading `socialweb-broker paths --json`")
}

impl<'w> Broker<'w> {
    pub fn start(world: &'w World, opts: BrokerOptions) -> Result<Broker<'w>> {
        let dir = TempDir::new("broker")?;
        let d = dir.path();
        let state_fs = StateFs::for_options(d, &opts)?;
        let cni = crate::k8s::cni_bin_dir()?;
        if let Some((_, plugin)) = &opts.node_bins {
            let link = cni.path().join("socialweb-cni");
            std::fs::remove_file(&link)?;
            std::os::unix::fs::symlink(plugin, &link)?;
        }
        let sw = NodeSoftware::new(&opts, d, cni.path())?;
        let prefix = prefix("");
        // The broker's key towards providers, as its operator gets it (`market-pin`, made on
        // first use) before any provider machine can list it.
        let config = d.join("broker.toml");
        let (host, bind, bind_v6, public_addr) = placed(world, &opts);
        write_config(
            &config,
            &sw.broker(&opts, d, &prefix, bind, bind_v6, Vec::new()),
        )?;
        let broker_pin = operator_command("market-pin", &config, &[])?;
        let mut providers = Vec::new();
        for m in world.providers.iter().take(usize::from(opts.providers)) {
            let p = prefix_for(&prefix, m.index);
            let state = d.join(format!("provider-{}", m.index));
            let path = d.join(format!("provider-{}.toml", m.index));
            let listen = SocketAddr::new(m.addr.into(), PROVIDER_PORT);
            let mut pc = sw.provider(&opts, &state, listen, &p, &broker_pin);
            config::set_zone(
                &mut pc.local_provider,
                opts.zones.get(usize::from(m.index) - 1),
            );
            write_config(&path, &pc)?;
            providers.push(ProviderProc {
                proc: Spawned::none("provider"),
                index: m.index,
                pin: operator_command("provider-pin", &path, &[])?,
                paths: paths_of(&path)?,
                config: path,
                state,
                prefix: p,
                url: format!("https://{listen}"),
            });
        }
        let market = if opts.rent_from.is_empty() {
            refs(&providers)
        } else {
            opts.rent_from.clone()
        };
        write_config(
            &config,
            &sw.broker(&opts, d, &prefix, bind, bind_v6, market),
        )?;
        let paths = paths_of(&config)?;
        let mut b = Broker {
            broker: Spawned::none("broker"),
            providers,
            world,
            host,
            public_addr,
            config,
            socket: paths.ctl_socket.clone(),
            state: paths.state_dir.clone(),
            paths,
            prefix,
            opts,
            known: Mutex::default(),
            _state_fs: state_fs,
            _cni: cni,
            dir,
        };
        for i in 0..b.providers.len() {
            b.start_provider(i)?;
        }
        b.start_broker()?;
        Ok(b)
    }

    /// Changes the broker's configuration file (it takes effect at the next
    /// [`Broker::start_broker`]).
    pub fn edit_config(
        &self,
        edit: impl FnOnce(&mut socialweb_broker::config::Config),
    ) -> Result<()> {
        let mut c = read_config(&self.config)?;
        edit(&mut c);
        write_config(&self.config, &c)
    }

    /// A log of the harness's: `broker`, or `provider-<i>`.
    pub fn log(&self, what: &str) -> PathBuf {
        self.dir.path().join(format!("{what}.log"))
    }

    fn command(
        &self,
        ns: &Netns,
        sub: &str,
        config: &std::path::Path,
        failpoints: Option<&str>,
    ) -> Command {
        let bin = match sub {
            "run" => self.broker_bin(),
            _ => workspace_bin("socialweb-broker"),
        };
        let mut cmd = ns.command_keeping_mounts(&bin.to_string_lossy());
        cmd.arg(sub).arg("--config").arg(config).env(
            "SOCIALWEB_LOG",
            "info,socialweb_broker=debug,iroh=warn,sqlx=warn,kube=warn",
        );
        if let Some(fp) = failpoints {
            cmd.env("FAILPOINTS", fp);
        }
        if sub == "run" {
            cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        }
        if let Some(ahead) = self.opts.clock_ahead.filter(|_| sub == "run") {
            // libfaketime shifts what libc's clock_gettime says of the wall clock; the
            // broker's Go children read the clock without libc and keep the machine's.
            cmd.env("LD_PRELOAD", FAKETIME_LIB)
                .env("FAKETIME", format!("+{}s", ahead.as_secs()))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_NO_CACHE", "1");
        }
        if let Some(n) = self.opts.nofile.filter(|_| sub == "run") {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, n, n)
                        .map_err(std::io::Error::from)
                });
            }
        }
        cmd
    }

    /// Starts (or starts again) the broker daemon and waits for its control socket.
    pub fn start_broker(&mut self) -> Result<()> {
        if self.opts.clock_ahead.is_some() && !Path::new(FAKETIME_LIB).exists() {
            bail!("{FAKETIME_LIB} is missing: install Debian's libfaketime (./x does)");
        }
        let cmd = self.command(
            self.host,
            "run",
            &self.config,
            self.opts.broker_failpoints.as_deref(),
        );
        self.broker = Spawned::start_logged(cmd, "broker", &self.log("broker"))?;
        let socket = self.socket.clone();
        let broker = &mut self.broker;
        let log = self.dir.path().join("broker.log");
        wait_for(
            "the broker's control socket",
            Duration::from_secs(60),
            || {
                if !broker.is_running() {
                    bail!("the broker exited: {}", crate::k8s::tail_of(&log, 20));
                }
                Ok(std::os::unix::net::UnixStream::connect(&socket)
                    .is_ok()
                    .then_some(()))
            },
        )
    }

    /// Starts (or starts again) provider `i` on its machine and waits until it answers.
    pub fn start_provider(&mut self, i: usize) -> Result<()> {
        let m = &self.world.providers[usize::from(self.providers[i].index) - 1];
        let cmd = self.command(
            &m.ns,
            "provider",
            &self.providers[i].config,
            self.opts.provider_failpoints.as_deref(),
        );
        let log = self.log(&format!("provider-{}", m.index));
        self.providers[i].proc = Spawned::start_logged(cmd, "provider", &log)?;
        let addr = std::net::SocketAddr::new(m.addr.into(), PROVIDER_PORT);
        wait_for("a provider to listen", Duration::from_secs(30), || {
            Ok(m.ns
                .run(|| std::net::TcpStream::connect(addr).is_ok())?
                .then_some(()))
        })
    }

    /// SIGKILLs provider `i` (its nodes keep running).
    pub fn kill_provider(&mut self, i: usize) {
        self.providers[i].proc.kill_now();
    }

    /// Stops the broker as systemd would (SIGTERM): its control planes stop with it, the
    /// provider and the nodes keep running.
    pub fn stop_broker(&mut self) -> Result<()> {
        self.broker.stop(Duration::from_secs(90))
    }

    /// `socialweb-broker <sub> --config <the broker's> [args]`, as the operator runs it
    /// on the broker's host (`backup`, `restore`): in its network namespace, whose loopback
    /// the control planes serve on. Its stdout.
    pub fn operator(&self, sub: &str, args: &[&str]) -> Result<String> {
        let out = self
            .host
            .command(&workspace_bin("socialweb-broker").to_string_lossy())
            .arg(sub)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "socialweb-broker {sub} --config {}: {}",
                self.config.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Runs the broker with other failpoints from now on (after a crash).
    pub fn set_failpoints(&mut self, fp: Option<&str>) {
        self.opts.broker_failpoints = fp.map(str::to_string);
    }

    /// Freezes the broker (SIGSTOP to its process alone, as a debugger, a host under swap or
    /// a paused VM's scheduler would): its children go on.
    pub fn freeze_broker(&self) -> Result<()> {
        signal(self.broker.id(), nix::sys::signal::Signal::SIGSTOP)
    }

    /// Lets a frozen broker go on (SIGCONT).
    pub fn thaw_broker(&self) -> Result<()> {
        signal(self.broker.id(), nix::sys::signal::Signal::SIGCONT)
    }

    /// SIGKILLs the broker (the provider and the nodes keep running).
    pub fn kill_broker(&mut self) {
        self.broker.kill_now();
    }

    /// What another host of a fleet names this one's provider machines by
    /// ([`BrokerOptions::rent_from`]).
    pub fn market_refs(&self) -> Vec<ProviderRef> {
        refs(&self.providers)
    }

    /// Kills the broker's host as a power loss does: the broker and every process in its
    /// namespace (its control planes) SIGKILLed, its link to the internet down.
    pub fn kill_host(&mut self) -> Result<()> {
        self.broker.kill_now();
        for pid in self.host.pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        self.host.ip(&["link", "set", "eth0", "down"]).map(|_| ())
    }

    /// Brings a host [`Broker::kill_host`] killed back: its link up, its default route
    /// again (a link going down takes it), its broker started.
    pub fn revive_host(&mut self) -> Result<()> {
        self.host.ip(&["link", "set", "eth0", "up"])?;
        let via = self
            .public_addr
            .octets()
            .iter()
            .take(3)
            .map(u8::to_string)
            .chain(["254".to_string()])
            .collect::<Vec<_>>()
            .join(".");
        self.host
            .ip(&["route", "replace", "default", "via", &via])?;
        self.start_broker()
    }

    /// Waits for the broker process to end by itself (a failpoint killed it).
    pub fn wait_broker_exit(&mut self, timeout: Duration) -> Result<()> {
        let broker = &mut self.broker;
        wait_for("the broker to exit", timeout, || {
            Ok((!broker.is_running()).then_some(()))
        })
    }

    pub fn broker_running(&mut self) -> bool {
        self.broker.is_running()
    }

    /// The `socialweb-broker` the daemon and the operator's commands run
    /// ([`BrokerOptions::broker_bin`]).
    pub fn broker_bin(&self) -> PathBuf {
        self.opts
            .broker_bin
            .clone()
            .unwrap_or_else(|| workspace_bin("socialweb-broker"))
    }

    /// `socialweb-broker <args> --ctl-socket ...` (an operator command), stdout.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(self.broker_bin())
            .args(args)
            .arg("--ctl-socket")
            .arg(&self.socket)
            .output()?;
        if !out.status.success() {
            bail!(
                "socialweb-broker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn cli_json(&self, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.push("--json");
        Ok(serde_json::from_str(&self.cli(&a)?)?)
    }

    /// The broker daemon's process id (nsenter execs it in place).
    pub fn broker_pid(&self) -> u32 {
        self.broker.id()
    }

    /// Destroys every machine the provider made (their network namespaces and cgroups).
    fn destroy_machines(&self) {
        for (_, pid) in self.guests() {
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let prefixes: Vec<&str> = std::iter::once(self.prefix.as_str())
            .chain(self.providers.iter().map(|p| p.prefix.as_str()))
            .collect();
        for prefix in prefixes {
            for cg in socialweb_provider::machine::cgroups_with_prefix(prefix) {
                socialweb_provider::machine::destroy_cgroup(&cg);
            }
            for ns in crate::netns::list() {
                if ns.starts_with(&format!("{prefix}n")) || ns.starts_with(&format!("{prefix}g")) {
                    let _ = crate::netns::remove(&ns);
                }
            }
        }
    }
}

impl Drop for Broker<'_> {
    fn drop(&mut self) {
        self.broker.kill_now();
        for p in &mut self.providers {
            p.proc.kill_now();
        }
        self.destroy_machines();
    }
}

/// Where a broker runs in `world`: its host's namespace, the addresses it binds (IPv4, and
/// IPv6 in a dual-stack world) and the one users and nodes reach it at.
fn placed<'w>(
    world: &'w World,
    opts: &BrokerOptions,
) -> (
    &'w Netns,
    std::net::Ipv4Addr,
    Option<std::net::Ipv6Addr>,
    std::net::Ipv4Addr,
) {
    match opts.on_host {
        None => (
            &world.operator,
            world.operator_addr,
            world.operator_addr_v6,
            crate::world::OPERATOR_ADDR,
        ),
        Some(i) => {
            let h = &world.hosts[usize::from(i) - 1];
            (&h.ns, h.addr, None, h.addr)
        }
    }
}

/// A tmpfs of a given size mounted over a broker's state directory; detached when dropped
/// (whatever still holds a file in it).
#[derive(Debug)]
struct StateFs(PathBuf);

impl StateFs {
    /// The state directory's own tmpfs under `d`, when `opts` asks for one.
    fn for_options(d: &Path, opts: &BrokerOptions) -> Result<Option<StateFs>> {
        opts.state_fs_mib
            .map(|mib| StateFs::mount(&d.join("state"), mib))
            .transpose()
    }

    fn mount(at: &Path, mib: u64) -> Result<StateFs> {
        std::fs::create_dir_all(at)?;
        nix::mount::mount(
            Some("tmpfs"),
            at,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={mib}m,mode=0700").as_str()),
        )
        .with_context(|| format!("mounting a tmpfs of {mib} MiB at {}", at.display()))?;
        Ok(StateFs(at.to_path_buf()))
    }
}

impl Drop for StateFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Provider `i`'s prefix beside the broker's own (`<prefix>p<i>`).
fn prefix_for(prefix: &str, i: u8) -> String {
    format!("{prefix}p{i}")
}

/// libfaketime's library for multithreaded programs (Debian's `libfaketime`).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Sends `sig` to process `pid`.
fn signal(pid: u32, sig: nix::sys::signal::Signal) -> Result<()> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
    nix::sys::signal::kill(pid, sig).with_context(|| format!("sending {sig} to {pid}"))
}
