//! The harness needs root (network namespaces, veth, routes). Without it a test fails, loudly,
//! with a message that says how to run it; it never skips.

/// Panics with an actionable message unless the process runs as root and `ip` is installed.
pub fn require_root() {
    if !nix::unistd::geteuid().is_root() {
        panic!(
            "this test builds network namespaces and needs root; run the suite as root with \
             `./x test` (it also installs iproute2 and the other tools the tests use)"
        );
    }
    for tool in ["ip", "ping"] {
        if which(tool).is_none() {
            panic!(
                "this test needs `{tool}` on PATH; `./x test` installs it (iproute2, iputils-ping)"
            );
        }
    }
}

/// Finds a program on PATH.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
