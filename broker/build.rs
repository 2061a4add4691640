//! Puts the commit the broker is built from into `--version` (`SOCIALWEB_COMMIT`), so an
//! operator can say which broker runs beside which agent and image (docs/operations.md,
//! versions). Outside a git checkout (a source tarball) it is `unknown`.

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SOCIALWEB_COMMIT={commit}");
    // Again when HEAD moves (a commit, a checkout): HEAD itself and the branch it names.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{branch}");
        }
    }
}
