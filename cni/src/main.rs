//! `socialweb-cni`: run by the container runtime per the CNI spec (verb in `CNI_COMMAND`,
//! configuration on stdin, result or error as JSON on stdout). Run by a person, it explains
//! itself.

use std::io::{IsTerminal, Read, Write};

use clap::Parser;
use socialweb_cni::spec::{CURRENT_VERSION, CniError, Code, Env};
use socialweb_cni::{config, plugin};

/// The socialweb CNI plugin (CNI spec 1.1.0; also reads 1.0.0 and 0.4.0 configurations).
///
/// containerd runs this for every Pod: ADD puts the Pod on the node's bridge (cni0 by default)
/// with an address from the node's pod CIDR, DEL takes it off, CHECK verifies, STATUS says
/// whether ADDs can succeed, GC frees what the runtime no longer knows, VERSION lists the
/// versions spoken. The verb comes in CNI_COMMAND, the container in CNI_CONTAINERID,
/// CNI_NETNS and CNI_IFNAME, the network configuration on stdin, for example:
///
///   {"cniVersion":"1.1.0","name":"socialweb","type":"socialweb-cni","subnet":"10.42.1.0/24"}
///
/// Addresses are recorded in <dataDir>/<name>/allocations.json (dataDir defaults to
/// /var/lib/cni/socialweb). The node agent writes the configuration to
/// /etc/cni/net.d/10-socialweb.conflist. Reference: docs/cni.md.
#[derive(Debug, Parser)]
#[command(
    name = "socialweb-cni",
    version,
    about,
    long_about,
    verbatim_doc_comment
)]
struct Cli {}

fn main() {
    let Ok(verb) = std::env::var("CNI_COMMAND") else {
        // Not run by a runtime: a person, or a runtime bug. A person gets the help text.
        if std::env::args().len() > 1 || std::io::stdin().is_terminal() {
            Cli::parse();
            let _ = <Cli as clap::CommandFactory>::command().print_long_help();
            std::process::exit(2);
        }
        fail(
            CURRENT_VERSION,
            &CniError::new(Code::InvalidEnvironment, "CNI_COMMAND is not set"),
        );
    };
    let mut stdin = Vec::new();
    if (verb != "VERSION" || !std::io::stdin().is_terminal())
        && let Err(e) = std::io::stdin().read_to_end(&mut stdin)
    {
        fail(
            CURRENT_VERSION,
            &CniError::new(Code::Io, format!("reading stdin: {e}")),
        );
    }
    let version = config::peek_version(&stdin).unwrap_or_else(|| CURRENT_VERSION.to_string());
    let env = match Env::from_lookup(|k| std::env::var(k).ok()) {
        Ok(env) => env,
        Err(e) => fail(&version, &e),
    };
    match plugin::run(&env, &stdin) {
        Ok(Some(out)) => {
            let mut stdout = std::io::stdout().lock();
            let _ = serde_json::to_writer(&mut stdout, &out);
            let _ = stdout.write_all(b"\n");
        }
        Ok(None) => {}
        Err(e) => fail(&version, &e),
    }
}

fn fail(version: &str, e: &CniError) -> ! {
    eprintln!("socialweb-cni: {e}");
    let mut stdout = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut stdout, &e.to_json(version));
    let _ = stdout.write_all(b"\n");
    std::process::exit(1);
}
