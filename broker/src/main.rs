//! `socialweb-broker`: the small daemon on the operator's host, and its operator commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use socialweb_broker::VERSION;
use socialweb_broker::command::{
    ClusterDetail, ClusterInfo, ClusterState, Command as Request, Reply,
};
use socialweb_broker::config::Config;
use socialweb_broker::ctl;
use tokio_util::sync::CancellationToken;

/// The socialweb broker.
///
/// One daemon on the operator's host. It runs a control plane per tenant cluster, decides
/// from each cluster's Pods how many nodes it needs, rents them from the compute market (RFP,
/// bids, lease; the embedded local provider boots them on this machine), releases them when
/// the work stops and the hold passes, and hosts the relay the node mesh falls back to.
///
/// Start here:  socialweb-broker run --config /etc/socialweb/broker.toml
///              socialweb-broker cluster create demo
///              socialweb-broker cluster show demo
#[derive(Debug, Parser)]
#[command(
    name = "socialweb-broker",
    version = VERSION,
    about,
    long_about,
    verbatim_doc_comment
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct ConfigArgs {
    /// The configuration file (TOML; docs/operations.md). Environment variables override
    /// it (SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES and the others listed there).
    #[arg(long, env = "SOCIALWEB_BROKER_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: store, market, relay, metrics, every cluster.
    Run(ConfigArgs),
    /// Create, list, show or delete tenant clusters (through the running daemon).
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Make, list or revoke invites: with `access.registration = "invite"`, a DID that
    /// redeems one (createCluster's `invite`) may have clusters (docs/operations.md).
    ///
    /// Start here:  socialweb-broker invite create --expires 7d --note "alice, CI"
    #[command(verbatim_doc_comment)]
    Invite {
        #[command(subcommand)]
        command: InviteCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Drain this broker host of a fleet (`fleet.enabled`): each cluster it runs has its
    /// control plane stopped and its lease released, for another host to start at once, and
    /// this host claims none until `drain --undo`. Kept across restarts (`<state_dir>/drained`).
    Drain {
        /// Undrain it: it claims clusters again.
        #[arg(long)]
        undo: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// What the provider itself says this broker leases (the market's view, not the store's).
    Leases {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Run a provider machine: the market protocol on `local_provider.listen`, mutual TLS,
    /// serving only the brokers `local_provider.brokers` lists; nodes are machines here.
    Provider(ConfigArgs),
    /// Print this provider machine's key (make it on first use): what brokers put in
    /// `[[market.providers]] pin`.
    ProviderPin(ConfigArgs),
    /// Drain this provider machine: RFPs get no bid and acceptances are refused from now on
    /// (its offer shows no free slot), while the leases it runs go on until their brokers
    /// release them. `--undo` takes new leases again. Works on a running provider (it looks
    /// at a marker file in its state directory, `<state_dir>/local-provider/draining`).
    ProviderDrain {
        #[command(flatten)]
        config: ConfigArgs,
        /// Take new leases again.
        #[arg(long)]
        undo: bool,
    },
    /// Print this broker's key towards providers (make it on first use): what provider
    /// machines put in `local_provider.brokers`.
    MarketPin(ConfigArgs),
    /// Run a mesh relay on its own (the daemon hosts one; this is for tests and experiments).
    Relay(RelayArgs),
    /// Check a configuration file and the environment, and print the result; then check
    /// that the files and programs it names are there, and say (on stderr, naming each key)
    /// what would fail. Exits 1 when something would.
    CheckConfig {
        #[command(flatten)]
        config: ConfigArgs,
        /// Check it as a provider machine's (`socialweb-broker provider`): the brokers it
        /// serves, the files its nodes need, and keys a provider machine does not read.
        #[arg(long)]
        provider: bool,
    },
    /// The configuration's reference: every key, its type, default and meaning
    /// (docs/config.md is `config reference`'s output).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print where a broker (or provider machine) run with this configuration keeps its
    /// files: the control socket, the store, the clusters' directories, the front's CA, the
    /// market keys, the embedded provider's socket, records and machines.
    Paths {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a key for `store.key_file`: 32 random bytes as 64 hexadecimal characters,
    /// written owner-only to FILE (which must not exist yet), and print its id, the name the
    /// store records beside what it sealed. Every broker host sharing the store needs the
    /// same file; keep a copy apart from the store's backups (either alone is not enough).
    StoreKey {
        file: PathBuf,
        /// Print JSON ({"file": ..., "key_id": ...}).
        #[arg(long)]
        json: bool,
    },
    /// Seal every CA key the store keeps under store.key_file's key, opening what was sealed
    /// under one of store.previous_key_files: the last step of rotating the key. Safe while
    /// brokers run, once every host has both files (docs/operations.md, "Rotating
    /// store.key_file"); a row under a key not given fails it before anything is written.
    StoreRekey {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print JSON ({"key_id": ..., "resealed": {old key id: rows}, "current": rows}).
        #[arg(long)]
        json: bool,
    },
    /// Copy what this broker needs from its state directory into --to (empty or absent),
    /// while it serves: the store (an SQLite snapshot), every kine cluster's datastore (a
    /// snapshot), every cluster's PKI and kubeconfigs, the front's CA, the tunnel key, the
    /// market keys, the embedded provider's records; `manifest.json` names each file with its
    /// sha256. Not: a PostgreSQL store (pg_dump's), an etcd datastore (skipped, named),
    /// sockets, pidfiles, logs (docs/operations.md, "Backup and restore").
    Backup {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long)]
        to: PathBuf,
        /// Print the manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put a backup back into this configuration's state directory, which must be empty or
    /// absent; every file's sha256 is checked against the manifest first. Start the broker
    /// afterwards.
    Restore {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long)]
        from: PathBuf,
        /// Print the manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The lease watchdog a fleet host's daemon starts beside itself (not run by hand): kills
    /// a cluster's control plane when the daemon's lease deadline for it has passed, as when
    /// the daemon is frozen (docs/operations.md, "A fleet's failure modes").
    #[command(hide = true)]
    LeaseWatchdog {
        /// The state directory's `clusters/`.
        #[arg(long)]
        clusters: PathBuf,
    },
    /// The user side of the gateway API: call it with a DID key (docs/api.md).
    ///
    /// Start here:  socialweb-broker api keygen --out ~/.config/socialweb/key
    ///              export SOCIALWEB_GATEWAY=https://gateway:8443 SOCIALWEB_KEY=~/.config/socialweb/key
    ///              socialweb-broker api create-cluster ci --wait 2m
    ///              socialweb-broker api kubeconfig ci --lifetime 24h --out ci.kubeconfig
    #[command(verbatim_doc_comment)]
    Api {
        #[command(subcommand)]
        command: ApiCommand,
        #[command(flatten)]
        caller: CallerArgs,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print every key of the broker's configuration and of a provider machine's, with its
    /// type, default and meaning, as Markdown (docs/config.md).
    Reference {
        /// Print JSON: the tables and their keys.
        #[arg(long)]
        json: bool,
    },
    /// Print the configuration's JSON Schema (for editors that check TOML against one).
    Schema {
        /// A provider machine's (`socialweb-broker provider`).
        #[arg(long)]
        provider: bool,
    },
}

#[derive(Debug, Args)]
struct CallerArgs {
    /// The gateway's URL (the broker's front).
    #[arg(long, global = true, env = "SOCIALWEB_GATEWAY")]
    gateway: Option<String>,
    /// The DID's private key (a file `api keygen` wrote).
    #[arg(long, global = true, env = "SOCIALWEB_KEY")]
    key: Option<PathBuf>,
    /// The DID to call as, when the key is the #atproto key of a did:web or did:plc
    /// (default: the key's own did:key).
    #[arg(long, global = true, env = "SOCIALWEB_DID")]
    did: Option<String>,
    /// The gateway's CA certificate (PEM), when it is not one this system trusts (a broker's
    /// self-made front CA: <state_dir>/front/ca.crt).
    #[arg(long, global = true, env = "SOCIALWEB_GATEWAY_CA")]
    ca: Option<PathBuf>,
    /// The broker's DID, the tokens' audience (default: what describeServer says).
    #[arg(long, global = true, env = "SOCIALWEB_GATEWAY_DID")]
    aud: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ApiCommand {
    /// Make a new DID key (did:key) and write it, owner-only, to --out.
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// The curve: p256 (ES256) or k256 (secp256k1, ES256K).
        #[arg(long, default_value = "p256", value_parser = ["p256", "k256"])]
        curve: String,
    },
    /// Print the did:key of a key file.
    Whoami,
    /// Create a cluster (at zero nodes).
    CreateCluster {
        name: String,
        /// Wait this long for its control plane (at most 5m).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// The invite code the broker's operator sent you (when registration is by invite).
        #[arg(long, env = "SOCIALWEB_INVITE")]
        invite: Option<String>,
    },
    /// Your clusters.
    ListClusters,
    /// Delete a cluster: every node released, its data gone.
    DeleteCluster { name: String },
    /// Get a kubeconfig (a new client certificate) and write it, mode 0600, to --out.
    Kubeconfig {
        name: String,
        /// How long the certificate is good for: 60s to 24h (default 1h).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_expiry")]
        lifetime: Option<Duration>,
        /// A certificate that never expires (revoke it when it is no longer needed).
        #[arg(long)]
        no_expiry: bool,
        #[arg(long)]
        out: PathBuf,
    },
    /// Your certificates (of one cluster with --cluster).
    Certificates {
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Revoke a certificate: the front refuses it within a second, open connections too.
    Revoke { serial: String },
}

#[derive(Debug, Args)]
struct ClientArgs {
    /// The daemon's control socket.
    #[arg(
        long,
        global = true,
        default_value = "/run/socialweb-broker/broker.sock",
        env = "SOCIALWEB_BROKER_CTL_SOCKET"
    )]
    ctl_socket: PathBuf,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum InviteCommand {
    /// A new invite; its code is printed this once (the broker keeps only its hash).
    Create {
        /// How long it may be redeemed: up to 90 days.
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        expires: Duration,
        /// Whom it is for, for `invite list`.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Every invite: unused, used (and by whom), revoked or expired.
    List,
    /// Revoke an unused invite.
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Create a cluster (at zero nodes) and wait for its control plane.
    Create {
        name: String,
        /// How long to wait for the control plane to be ready.
        #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// The DID the cluster is for: its owner reaches it through the gateway API
        /// (getKubeconfig). Without it the cluster is the operator's alone.
        #[arg(long)]
        owner: Option<String>,
        /// Its own idle time before its control plane hibernates (`0`: never); without
        /// it, the broker's `clusters.hibernate_after` (docs/hibernation.md).
        #[arg(long, value_parser = parse_idle_time)]
        hibernate_after: Option<Duration>,
        /// What keeps its objects: `etcd`, `kine` (SQLite through the etcd API, in its
        /// directory) or `postgres` (kine over a database of its own on
        /// `clusters.postgres_url`'s server); without it, the broker's `clusters.datastore`.
        #[arg(long, value_parser = ["etcd", "kine", "postgres"])]
        datastore: Option<String>,
    },
    /// Every cluster, its state and node count.
    List,
    /// Change a cluster's settings.
    Set {
        name: String,
        /// Its idle time before hibernating: a duration (`30m`), `0` for never, or
        /// `default` for the broker's `clusters.hibernate_after`.
        #[arg(long, value_parser = parse_hibernate_after)]
        hibernate_after: HibernateAfter,
    },
    /// Wake a hibernating cluster and wait for its apiserver (a request at the front wakes
    /// it too; the admin kubeconfig reaches the apiserver directly and does not).
    Wake {
        name: String,
        /// How long to wait for it to be ready.
        #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// New CAs for a cluster, for a key that leaked or a CA to retire. Its users CA is
    /// replaced at once: kubeconfigs issued from now on come from the new one, and those of
    /// the old one are admitted for --overlap more, then refused with why. Its own CAs (the
    /// apiserver's, front-proxy's, etcd's) and everything they signed are made again at its
    /// control plane's next start: now if it is awake (the command waits for it), else at
    /// its next wake; the admin kubeconfig is written again then. A cluster with nodes keeps
    /// the old cluster CA trusted beside the new one until each node has adopted the new one
    /// and had its certificates issued again (seconds; its Pods run on); then the old one is
    /// retired. Refused while an earlier rotation's nodes are still moving, and with
    /// store.key_file set (docs/operations.md, "Rotating a cluster's CAs").
    RotateCa {
        name: String,
        /// How long the old users CA's kubeconfigs keep working (at most 30d; 0: not at all).
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: Duration,
        /// How long to wait for an awake cluster's control plane to be ready again.
        #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// A cluster's scale decisions and provisions.
    Show { name: String },
    /// Delete a cluster: release every node, stop its control plane, remove its data.
    Delete { name: String },
}

/// Who the relay admits: exactly one of an allow list or --open, so that a relay open to
/// anyone is never started by forgetting the list.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("admit").required(true).args(["allow", "open"])))]
struct RelayArgs {
    /// Address to serve on: plain HTTP (nodes use http://<this>), or HTTPS with --tls-dir
    /// (https://<this>).
    #[arg(long, default_value = "0.0.0.0:3340")]
    listen: SocketAddr,
    /// Serve HTTPS as the broker's own relay does, with a certificate for --tls-name issued
    /// by a CA kept in this directory (made on first use; nodes trust its `ca.crt` as their
    /// identity's `relay_ca_cert`), and QUIC address discovery beside it (--quic-port).
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Names (DNS names or IP addresses) the certificate is for; default: the listen address.
    #[arg(long = "tls-name", requires = "tls_dir")]
    tls_names: Vec<String>,
    /// UDP port of QUIC address discovery on the listen address (with --tls-dir; 0: none). A
    /// node behind NAT learns its public address there, which NAT traversal needs.
    #[arg(long, default_value_t = 7842, requires = "tls_dir")]
    quic_port: u16,
    /// Admit only these endpoint ids (repeatable). Required unless --open.
    #[arg(long = "allow")]
    allow: Vec<String>,
    /// Admit anyone (a relay open to the internet relays anyone's traffic; for experiments).
    #[arg(long)]
    open: bool,
}

/// `cluster set --hibernate-after`: a duration, or the broker's.
#[derive(Debug, Clone, Copy)]
enum HibernateAfter {
    Default,
    Own(Duration),
}

fn parse_hibernate_after(s: &str) -> Result<HibernateAfter, String> {
    if s == "default" {
        return Ok(HibernateAfter::Default);
    }
    parse_idle_time(s).map(HibernateAfter::Own)
}

/// A cluster's own idle time: 0, or whole seconds from one to a year (what the broker keeps).
fn parse_idle_time(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as 30m, or 0 for never: {e}"))?;
    socialweb_broker::config::hibernate_after_ok(d).map_err(|e| format!("hibernate_after: {e}"))?;
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "hibernate_after: {s} is not a whole number of seconds"
        ));
    }
    Ok(d)
}

fn load(a: &ConfigArgs) -> Result<Config> {
    Config::load(a.config.as_deref(), |k| std::env::var(k).ok())
        .map_err(|e| anyhow::anyhow!("configuration: {e}"))
}

fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SOCIALWEB_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,iroh=warn,iroh_relay=warn,sqlx=warn,kube=warn")
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() {
    let cli = Cli::parse();
    init_logging();
    let rt = tokio::runtime::Runtime::new().expect("starting the async runtime");
    if let Err(e) = rt.block_on(dispatch(cli.command)) {
        eprintln!("socialweb-broker: {e:#}");
        std::process::exit(1);
    }
}

async fn until_signal(stop: CancellationToken) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    stop.cancel();
    Ok(())
}

/// `FAILPOINTS` in a build without failpoints would be silently ignored, and a crash test
/// would pass without crashing anything: refuse it.
fn check_failpoints() -> Result<()> {
    if std::env::var_os("FAILPOINTS").is_some() && !cfg!(feature = "failpoints") {
        anyhow::bail!(
            "FAILPOINTS is set, but this socialweb-broker was built without the `failpoints` \
             feature (build it with `cargo build --workspace` or `--features failpoints`)"
        );
    }
    Ok(())
}

async fn dispatch(command: Command) -> Result<()> {
    check_failpoints()?;
    match command {
        Command::Run(a) => {
            let cfg = load(&a)?;
            let _scenario = fail::FailScenario::setup();
            let socket = cfg.ctl_socket.clone();
            let d = socialweb_broker::daemon::Daemon::start(cfg).await?;
            let _ctl = ctl::serve(&socket, d.services())?;
            tracing::info!(socket = %socket.display(), "broker running");
            socialweb_broker::notify::ready();
            let stop = CancellationToken::new();
            until_signal(stop.clone()).await?;
            socialweb_broker::notify::stopping();
            d.shutdown().await;
            Ok(())
        }
        Command::Provider(a) => {
            let cfg = load(&a)?;
            let _scenario = fail::FailScenario::setup();
            let stop = CancellationToken::new();
            let s = stop.clone();
            tokio::spawn(async move { until_signal(s).await });
            socialweb_broker::daemon::run_provider(cfg, stop).await
        }
        Command::ProviderPin(a) => {
            println!(
                "{}",
                socialweb_broker::daemon::provider_identity(&load(&a)?)?.pin_text()
            );
            Ok(())
        }
        Command::ProviderDrain { config, undo } => provider_drain(&load(&config)?, undo),
        Command::MarketPin(a) => {
            println!(
                "{}",
                socialweb_broker::daemon::market_identity(&load(&a)?)?.pin_text()
            );
            Ok(())
        }
        Command::CheckConfig {
            config: a,
            provider,
        } => {
            let cfg = load(&a)?;
            println!(
                "{}",
                toml::to_string_pretty(&cfg).context("printing the configuration")?
            );
            check_config(&cfg, &a, provider)
        }
        Command::Config { command } => config_command(command),
        Command::Paths { config, json } => print_paths(&load(&config)?, json),
        Command::StoreKey { file, json } => store_key(&file, json),
        Command::StoreRekey { config, json } => store_rekey(&load(&config)?, json).await,
        Command::Backup { config, to, json } => backup(&load(&config)?, &to, json).await,
        Command::Restore { config, from, json } => restore(&load(&config)?, &from, json),
        Command::Relay(a) => relay(a).await,
        Command::LeaseWatchdog { clusters } => socialweb_broker::watchdog::run(&clusters),
        Command::Leases { client } => leases(client).await,
        Command::Drain { undo, client } => drain(undo, client).await,
        Command::Invite { command, client } => invite(command, client).await,
        Command::Cluster { command, client } => cluster(command, client).await,
        Command::Api { command, caller } => api(command, caller).await,
    }
}

/// `check-config`'s checks of the files and programs `cfg` names, on stderr.
fn check_config(cfg: &Config, a: &ConfigArgs, provider: bool) -> Result<()> {
    use socialweb_broker::config::check::{self, Level, Role};
    let role = if provider {
        Role::Provider
    } else {
        Role::Broker
    };
    let found = check::run(cfg, a.config.as_deref(), role);
    for f in &found {
        eprintln!("{f}");
    }
    let errors = found.iter().filter(|f| f.level == Level::Error).count();
    if errors > 0 {
        anyhow::bail!("check-config: {errors} error(s) above, each naming what would fail");
    }
    Ok(())
}

/// `store-rekey`: everything in the store sealed under the current key.
async fn store_rekey(cfg: &socialweb_broker::config::Config, json: bool) -> Result<()> {
    let key = cfg
        .store
        .seal_key()?
        .context("store.key_file is not set: nothing is sealed")?;
    let store = socialweb_broker::store::Store::open(&cfg.store_url()).await?;
    let done = socialweb_broker::vault::rekey::rekey(&store, &key).await?;
    if json {
        println!("{}", serde_json::to_string(&done)?);
    } else {
        let n: usize = done.resealed.values().sum();
        println!(
            "{n} row(s) sealed again under key {} ({} already were); store.previous_key_files \
             can go once every host has key {}",
            done.key_id, done.current, done.key_id
        );
    }
    Ok(())
}

/// `store-key`: a new key, written owner-only where nothing is.
fn store_key(file: &std::path::Path, json: bool) -> Result<()> {
    use socialweb_broker::vault::SealKey;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let hex = SealKey::generate();
    let id = SealKey::from_hex(&hex, "a new key")?.id().to_string();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .with_context(|| {
            format!(
                "creating {} (an existing key is never replaced)",
                file.display()
            )
        })?;
    f.write_all(format!("{hex}\n").as_bytes())?;
    f.sync_all()?;
    if json {
        println!("{}", serde_json::json!({"file": file, "key_id": id}));
    } else {
        println!(
            "wrote key {id} to {}; set store.key_file = {:?}",
            file.display(),
            file
        );
    }
    Ok(())
}

fn config_command(command: ConfigCommand) -> Result<()> {
    use socialweb_broker::config::reference::{Reference, schema};
    match command {
        ConfigCommand::Reference { json: false } => print!("{}", Reference::new().markdown()),
        ConfigCommand::Reference { json: true } => {
            println!("{}", serde_json::to_string_pretty(&Reference::new())?)
        }
        ConfigCommand::Schema { provider } => {
            println!("{}", serde_json::to_string_pretty(&schema(provider))?)
        }
    }
    Ok(())
}

fn print_paths(cfg: &Config, json: bool) -> Result<()> {
    let paths = socialweb_broker::daemon::paths(cfg);
    let v = serde_json::to_value(&paths)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for (k, v) in v.as_object().into_iter().flatten() {
        println!("{k:<18} {}", v.as_str().unwrap_or("-"));
    }
    Ok(())
}

fn print_manifest(m: &socialweb_broker::backup::Manifest, verb: &str, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(m)?);
        for s in &m.skipped {
            eprintln!("warning: not in the backup: {}: {}", s.what, s.why);
        }
        return Ok(());
    }
    println!(
        "{verb} {} files, {} bytes, of {} (broker {}, {})",
        m.files.len(),
        m.bytes,
        m.state_dir.display(),
        m.broker_version,
        m.created_at
    );
    for e in &m.files {
        println!("  {:>12}  {}  {}", e.size, e.how, e.path.display());
    }
    for s in &m.skipped {
        println!("warning: not in the backup: {}: {}", s.what, s.why);
    }
    Ok(())
}

async fn backup(cfg: &Config, to: &std::path::Path, json: bool) -> Result<()> {
    let t = std::time::Instant::now();
    let m = socialweb_broker::backup::backup(
        &socialweb_broker::daemon::backup_layout(cfg),
        to,
        VERSION,
    )
    .await?;
    print_manifest(&m, "backed up", json)?;
    if !json {
        println!("in {:.1?} to {}", t.elapsed(), to.display());
    }
    Ok(())
}

fn restore(cfg: &Config, from: &std::path::Path, json: bool) -> Result<()> {
    let m = socialweb_broker::backup::restore(&socialweb_broker::daemon::backup_layout(cfg), from)?;
    print_manifest(&m, "restored", json)?;
    if !json {
        println!(
            "into {}; start the broker (`socialweb-broker run`): its clusters come back from here",
            cfg.state_dir.display()
        );
    }
    Ok(())
}

async fn relay(a: RelayArgs) -> Result<()> {
    use socialweb_broker::relay::gate::Gate;
    use socialweb_broker::relay::{Allow, serve};
    // The broker's bounds for its relay, reported nowhere (no metrics here).
    let gate = Gate::new(
        socialweb_broker::daemon::relay_limits(&Config::default().relay),
        std::sync::Arc::new(()),
    );
    let allow = if a.open {
        eprintln!("relay: --open: admitting any endpoint");
        Allow::everyone()
    } else {
        Allow::only(
            a.allow
                .iter()
                .map(|s| {
                    s.parse::<iroh::EndpointId>()
                        .with_context(|| format!("{s:?} is not an endpoint id"))
                })
                .collect::<Result<Vec<_>>>()?,
        )
    };
    let server = match &a.tls_dir {
        None => {
            let server = serve(a.listen, allow, gate).await?;
            eprintln!("relay serving on http://{}", server.addr());
            server
        }
        Some(dir) => {
            let names = if a.tls_names.is_empty() {
                vec![a.listen.ip().to_string()]
            } else {
                a.tls_names.clone()
            };
            let (serving, _) = socialweb_broker::front::tls::serving(
                None,
                None,
                dir,
                &names,
                socialweb_broker::pki::Lifetimes::default(),
            )?;
            let config = socialweb_broker::front::tls::relay_config(serving)?;
            let quic = (a.quic_port != 0).then(|| SocketAddr::new(a.listen.ip(), a.quic_port));
            let server =
                socialweb_broker::relay::serve_tls(a.listen, config, quic, allow, gate).await?;
            eprintln!(
                "relay serving on https://{} (CA {}), address discovery on {}",
                a.listen,
                dir.join("ca.crt").display(),
                quic.map(|q| format!("udp {q}"))
                    .unwrap_or_else(|| "no port".into())
            );
            server
        }
    };
    until_signal(CancellationToken::new()).await?;
    server.shutdown().await
}

async fn drain(undo: bool, client: ClientArgs) -> Result<()> {
    let reply = ctl::call(
        &client.ctl_socket,
        &Request::DrainHost { undo },
        Duration::from_secs(30),
    )
    .await?;
    let Reply::Drain { drained, moving } = reply else {
        anyhow::bail!("the broker answered {reply:?} to `drain`");
    };
    if client.json {
        println!(
            "{}",
            serde_json::json!({"drained": drained, "moving": moving})
        );
    } else if drained {
        println!(
            "drained: {} cluster(s) move to other hosts: {}",
            moving.len(),
            moving.join(" ")
        );
    } else {
        println!("undrained: this host claims clusters again");
    }
    Ok(())
}

async fn leases(client: ClientArgs) -> Result<()> {
    let reply = ctl::call(
        &client.ctl_socket,
        &Request::Leases,
        Duration::from_secs(30),
    )
    .await?;
    let Reply::Leases(leases) = reply else {
        anyhow::bail!("the broker answered {reply:?} to `leases`");
    };
    if client.json {
        println!("{}", serde_json::to_string_pretty(&leases)?);
        return Ok(());
    }
    println!(
        "{:<38} {:<10} {:<16} {:<14} REASON",
        "LEASE", "STATE", "CLUSTER", "NODE"
    );
    for l in &leases {
        let tag = |k: &str| l.tags.get(k).map(String::as_str).unwrap_or("-");
        println!(
            "{:<38} {:<10} {:<16} {:<14} {}",
            l.id,
            l.state.as_str(),
            tag("cluster"),
            tag("node"),
            l.reason.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

async fn invite(command: InviteCommand, c: ClientArgs) -> Result<()> {
    let req = match &command {
        InviteCommand::Create { expires, note } => Request::CreateInvite {
            expires_secs: expires.as_secs(),
            note: note.clone(),
        },
        InviteCommand::List => Request::ListInvites,
        InviteCommand::Revoke { id } => Request::RevokeInvite { id: id.clone() },
    };
    let reply = ctl::call(&c.ctl_socket, &req, Duration::from_secs(30)).await?;
    let when = |ms: i64| {
        humantime::format_rfc3339_seconds(socialweb_broker_core::from_millis(ms)).to_string()
    };
    match reply {
        Reply::Invite(i) if c.json => println!("{}", serde_json::to_string_pretty(&i)?),
        Reply::Invite(i) => {
            println!(
                "invite {} (good until {})",
                i.invite.id,
                when(i.invite.expires_at)
            );
            println!("code   {}", i.code);
            println!(
                "Send the code to its user: `socialweb-broker api create-cluster NAME --invite CODE`."
            );
            println!("It is shown only now; it admits the first DID that redeems it.");
        }
        Reply::Invites(is) if c.json => println!("{}", serde_json::to_string_pretty(&is)?),
        Reply::Invites(is) => {
            println!(
                "{:<10} {:<8} {:<22} {:<30} NOTE",
                "ID", "STATE", "EXPIRES", "USED BY"
            );
            let now = socialweb_broker_core::millis(std::time::SystemTime::now());
            for i in &is {
                let state = if i.used_by.is_some() {
                    "used"
                } else if i.revoked_at.is_some() {
                    "revoked"
                } else if i.expires_at <= now {
                    "expired"
                } else {
                    "unused"
                };
                let by = i.used_by.as_deref().unwrap_or("-");
                println!(
                    "{:<10} {:<8} {:<22} {:<30} {}",
                    i.id,
                    state,
                    when(i.expires_at),
                    by,
                    i.note
                );
            }
        }
        Reply::InviteRevoked(i) if c.json => println!("{}", serde_json::to_string_pretty(&i)?),
        Reply::InviteRevoked(i) => println!("invite {} revoked", i.id),
        other => anyhow::bail!("the broker answered {other:?}"),
    }
    Ok(())
}

async fn api(command: ApiCommand, a: CallerArgs) -> Result<()> {
    use socialweb_broker::api::client;
    use socialweb_broker::auth::token::SigningKey;
    let key_path = || {
        a.key
            .clone()
            .context("--key (or SOCIALWEB_KEY) is required: the file `api keygen` wrote")
    };
    match &command {
        ApiCommand::Keygen { out, curve } => {
            let alg = if curve == "k256" {
                atrium_crypto::Algorithm::Secp256k1
            } else {
                atrium_crypto::Algorithm::P256
            };
            println!("{}", client::write_key(out, &SigningKey::generate(alg))?);
            return Ok(());
        }
        ApiCommand::Whoami => {
            println!("{}", client::read_key(&key_path()?)?.did());
            return Ok(());
        }
        _ => {}
    }
    let gateway = a
        .gateway
        .clone()
        .context("--gateway (or SOCIALWEB_GATEWAY) is required: the broker's front URL")?;
    let ca = match &a.ca {
        Some(p) => {
            Some(std::fs::read(p).with_context(|| format!("--ca: reading {}", p.display()))?)
        }
        None => None,
    };
    let c = client::Caller::new(
        &gateway,
        client::read_key(&key_path()?)?,
        a.did.clone(),
        a.aud.clone(),
        ca.as_deref(),
    )?;
    let v = api_call(&c, command).await?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// One gateway API call for `command`, its answer as JSON.
async fn api_call(
    c: &socialweb_broker::api::client::Caller,
    command: ApiCommand,
) -> Result<serde_json::Value> {
    use serde_json::json;
    use socialweb_broker::api::{self as gw, client};
    Ok(match command {
        ApiCommand::Keygen { .. } | ApiCommand::Whoami => unreachable!("answered before"),
        ApiCommand::CreateCluster { name, wait, invite } => {
            let mut input = json!({"name": name, "waitSeconds": wait.as_secs()});
            if let Some(code) = invite {
                input["invite"] = code.into();
            }
            c.procedure(gw::CREATE_CLUSTER, &input).await?
        }
        ApiCommand::ListClusters => c.query(gw::LIST_CLUSTERS, &[]).await?,
        ApiCommand::DeleteCluster { name } => {
            c.procedure(gw::DELETE_CLUSTER, &json!({"name": name}))
                .await?
        }
        ApiCommand::Kubeconfig {
            name,
            lifetime,
            no_expiry,
            out,
        } => {
            let mut input = json!({"name": name});
            if no_expiry {
                input["noExpiry"] = true.into();
            }
            if let Some(l) = lifetime {
                input["lifetimeSeconds"] = l.as_secs().into();
            }
            let mut v = c.procedure(gw::GET_KUBECONFIG, &input).await?;
            let kc = v["kubeconfig"]
                .as_str()
                .context("the answer has no kubeconfig")?
                .to_string();
            client::write_private(&out, &kc)?;
            v["kubeconfig"] = out.display().to_string().into();
            v
        }
        ApiCommand::Certificates { cluster } => {
            let params: Vec<(String, String)> = cluster
                .map(|c| ("cluster".to_string(), c))
                .into_iter()
                .collect();
            c.query(gw::LIST_CERTIFICATES, &params).await?
        }
        ApiCommand::Revoke { serial } => {
            c.procedure(gw::REVOKE_CERTIFICATE, &json!({"serial": serial}))
                .await?
        }
    })
}

/// The control-socket request a `cluster` subcommand makes, and how long to wait for it.
fn cluster_request(command: &ClusterCommand) -> (Request, Duration) {
    match command {
        ClusterCommand::Create {
            name,
            wait,
            owner,
            hibernate_after,
            datastore,
        } => (
            Request::CreateCluster {
                name: name.clone(),
                wait_secs: wait.as_secs(),
                owner: owner.clone(),
                invite: None,
                hibernate_after_secs: hibernate_after.map(|d| d.as_secs()),
                datastore: datastore.clone(),
            },
            *wait + Duration::from_secs(30),
        ),
        ClusterCommand::Set {
            name,
            hibernate_after,
        } => (
            Request::SetHibernateAfter {
                name: name.clone(),
                secs: match hibernate_after {
                    HibernateAfter::Default => None,
                    HibernateAfter::Own(d) => Some(d.as_secs()),
                },
            },
            Duration::from_secs(30),
        ),
        ClusterCommand::Wake { name, wait } => (
            Request::WakeCluster {
                name: name.clone(),
                wait_secs: wait.as_secs(),
            },
            *wait + Duration::from_secs(30),
        ),
        ClusterCommand::RotateCa {
            name,
            overlap,
            wait,
        } => (
            Request::RotateCa {
                name: name.clone(),
                overlap_secs: overlap.as_secs(),
                wait_secs: wait.as_secs(),
            },
            *wait + Duration::from_secs(30),
        ),
        ClusterCommand::List => (Request::ListClusters, Duration::from_secs(30)),
        ClusterCommand::Show { name } => (
            Request::ShowCluster { name: name.clone() },
            Duration::from_secs(30),
        ),
        ClusterCommand::Delete { name } => (
            Request::DeleteCluster { name: name.clone() },
            Duration::from_secs(300),
        ),
    }
}

async fn cluster(command: ClusterCommand, c: ClientArgs) -> Result<()> {
    let (req, timeout) = cluster_request(&command);
    let reply = ctl::call(&c.ctl_socket, &req, timeout).await?;
    if c.json {
        let v = match &reply {
            Reply::Cluster(x) => serde_json::to_value(x)?,
            Reply::Clusters(x) => serde_json::to_value(x)?,
            Reply::Detail(x) => serde_json::to_value(x)?,
            Reply::Rotated(x) => serde_json::to_value(x)?,
            other => serde_json::to_value(other)?,
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match reply {
        Reply::Cluster(x) => print_created(&x),
        Reply::Clusters(xs) => print_list(&xs),
        Reply::Detail(d) => print_detail(&d),
        Reply::Deleted { deleted } => println!("cluster {deleted} deleted"),
        Reply::Rotated(r) => print_rotated(&r),
        other => anyhow::bail!("the broker answered {other:?}"),
    }
    Ok(())
}

fn print_rotated(r: &socialweb_broker::command::RotatedCa) {
    let until = std::time::UNIX_EPOCH
        + Duration::from_millis(u64::try_from(r.previous_admitted_until).unwrap_or(0));
    println!("cluster {} {}", r.cluster, state_word(&r.info.state));
    println!(
        "users CA      sha256:{} (signs from now on)",
        r.users_ca_sha256
    );
    println!(
        "previous      sha256:{} (admitted until {})",
        r.previous_users_ca_sha256,
        humantime::format_rfc3339_seconds(until)
    );
    println!(
        "cluster CAs   {}",
        match r.cluster_cas.as_str() {
            "made" => "made again; its control plane runs with them (admin kubeconfig rewritten)"
                .to_string(),
            "overlap" => format!(
                "made again; the old cluster CA stays trusted until its nodes have moved ({})",
                r.nodes.join(", ")
            ),
            _ => "made again at its control plane's next start".to_string(),
        }
    );
}

fn state_word(s: &ClusterState) -> &'static str {
    match s {
        ClusterState::Starting { .. } => "starting",
        ClusterState::Ready => "ready",
        ClusterState::Hibernating { .. } => "hibernating",
        ClusterState::Deleting => "deleting",
        ClusterState::Failed { .. } => "failed",
        ClusterState::Elsewhere { .. } => "elsewhere",
    }
}

fn print_created(x: &ClusterInfo) {
    println!("cluster {} {}", x.name, state_word(&x.state));
    match &x.state {
        ClusterState::Starting { detail } => println!("detail     {detail}"),
        ClusterState::Failed { error } => println!("error      {error}"),
        ClusterState::Elsewhere { host } => println!("host       {host}"),
        ClusterState::Hibernating { since } => println!("since      {}", rfc3339(*since)),
        _ => {}
    }
    println!("hibernate  {}", hibernate_words(x.hibernate_after_secs));
    println!("server     {}", x.server);
    println!("kubeconfig {}", x.kubeconfig.display());
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_seconds(socialweb_broker_core::from_millis(ms)).to_string()
}

fn hibernate_words(secs: u64) -> String {
    match secs {
        0 => "never".into(),
        s => format!(
            "after {} idle",
            humantime::format_duration(Duration::from_secs(s))
        ),
    }
}

fn print_list(xs: &[ClusterInfo]) {
    println!(
        "{:<20} {:<12} {:>5}  {:<22} SERVER",
        "CLUSTER", "STATE", "NODES", "SINCE"
    );
    for x in xs {
        let since = match &x.state {
            ClusterState::Hibernating { since } => rfc3339(*since),
            _ => "-".into(),
        };
        println!(
            "{:<20} {:<12} {:>5}  {:<22} {}",
            x.name,
            state_word(&x.state),
            x.nodes,
            since,
            x.server
        );
    }
}

fn print_detail(v: &ClusterDetail) {
    let cl = &v.cluster;
    println!(
        "cluster {} {}  nodes {}  server {}",
        cl.name,
        state_word(&cl.state),
        cl.nodes,
        cl.server
    );
    println!("\nDECISIONS");
    for d in &v.decisions {
        println!(
            "{}  {} nodes={}  ({})",
            humantime::format_rfc3339_millis(socialweb_broker_core::from_millis(d.at)),
            d.action,
            d.target,
            d.reason
        );
    }
    println!("\n{:<20} {:<10} {:<38} REASON", "NODE", "STEP", "LEASE");
    for p in &v.provisions {
        println!(
            "{:<20} {:<10} {:<38} {}",
            p.node,
            p.state.as_str(),
            p.lease_id,
            p.reason.as_deref().unwrap_or("-")
        );
    }
}

/// `provider-drain`: puts the drain marker in place (or takes it away) and says what it means.
fn provider_drain(cfg: &Config, undo: bool) -> Result<()> {
    let file = socialweb_broker::daemon::provider_config(cfg).drain_file();
    if undo {
        match std::fs::remove_file(&file) {
            Ok(()) => println!("{}: removed; this provider bids again", file.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!(
                    "{}: not there; this provider was not draining",
                    file.display()
                )
            }
            Err(e) => return Err(e).with_context(|| format!("removing {}", file.display())),
        }
        return Ok(());
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&file, "drained by socialweb-broker provider-drain\n")
        .with_context(|| format!("writing {}", file.display()))?;
    println!(
        "{}: in place; this provider bids on nothing and takes no new lease, its running leases run on until released ('provider-drain --undo' to take new ones)",
        file.display()
    );
    Ok(())
}
