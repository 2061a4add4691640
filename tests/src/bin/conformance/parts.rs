//! Which ginkgo runs make up a conformance run: a pure plan that `main` carries out on one
//! cluster, part after part.
//!
//! The whole suite runs the way the upstream conformance image runs it (`run_e2e.sh` with
//! `E2E_PARALLEL`): the tests that may share a cluster with others in parallel first, then the
//! `[Serial]` ones (the `[Disruptive]` conformance tests among them) one at a time.

/// The regex that selects every conformance test.
pub const CONFORMANCE: &str = r"\[Conformance\]";
/// What the parallel part leaves to the serial one.
pub const SERIAL: &str = r"\[Serial\]";
/// sig-network's conformance tests (the DNS ones among them): `./x conformance`'s default.
pub const NETWORK: &str = r"\[sig-network\].*\[Conformance\]";

/// One ginkgo run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its name: the directory of its report and the prefix of its figures.
    pub name: String,
    pub focus: String,
    pub skip: Option<String>,
    /// ginkgo's `--nodes`: how many test processes at once.
    pub procs: u32,
}

/// What the command line asked for.
#[derive(Debug, Clone, Default)]
pub struct Selection<'a> {
    /// Every conformance test.
    pub all: bool,
    /// One SIG's conformance tests (`apps`, `sig-apps`).
    pub sig: Option<&'a str>,
    /// Otherwise one run with this focus and skip.
    pub focus: &'a str,
    pub skip: Option<&'a str>,
    /// Which passes of `--all`/`--sig`: `None` for both.
    pub pass: Option<Pass>,
    /// The parallel part's process count.
    pub procs: u32,
}

/// One pass of a whole-suite run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pass {
    /// The tests not marked `[Serial]`, `--parallel` at once.
    Parallel,
    /// The `[Serial]` tests, one at a time.
    Serial,
}

/// The SIG a name like `apps` or `sig-apps` means, checked against the SIGs that have
/// conformance tests.
pub fn sig_name(s: &str) -> Result<String, String> {
    let name = s.strip_prefix("sig-").unwrap_or(s);
    if SIGS.contains(&name) {
        Ok(format!("sig-{name}"))
    } else {
        Err(format!(
            "no SIG {s:?} has conformance tests; one of: {}",
            SIGS.join(", ")
        ))
    }
}

/// The SIGs with `[Conformance]` tests in the suite, in the order docs/conformance.md runs
/// them when the suite is split: the ones the rest depends on first.
pub const SIGS: &[&str] = &[
    "network",
    "api-machinery",
    "node",
    "apps",
    "storage",
    "scheduling",
    "auth",
    "cli",
    "instrumentation",
    "architecture",
];

/// The runs that make up a selection.
pub fn plan(sel: &Selection) -> Vec<Part> {
    if !sel.all && sel.sig.is_none() {
        return vec![Part {
            name: "selected".into(),
            focus: sel.focus.into(),
            skip: sel.skip.map(str::to_string),
            procs: sel.procs,
        }];
    }
    // The SIG is the bracket a test's name starts with: `[sig-apps] Deployment ...`.
    let (prefix, name) = match sel.sig {
        Some(sig) => (format!(r"\[{sig}\].*"), format!("{sig}-")),
        None => (String::new(), String::new()),
    };
    let mut parts = Vec::new();
    if sel.pass != Some(Pass::Serial) {
        parts.push(Part {
            name: format!("{name}parallel"),
            focus: format!("{prefix}{CONFORMANCE}"),
            skip: Some(SERIAL.into()),
            procs: sel.procs,
        });
    }
    if sel.pass != Some(Pass::Parallel) {
        parts.push(Part {
            name: format!("{name}serial"),
            // Either order: `[Serial] ... [Conformance]` and `[Conformance] ... [Serial]`.
            focus: format!("{prefix}(?:{SERIAL}.*{CONFORMANCE}|{CONFORMANCE}.*{SERIAL})"),
            skip: None,
            procs: 1,
        });
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ginkgo's regexes are Go's RE2; the plan's use only what RE2 and `regex` share.
    fn matches(re: &str, name: &str) -> bool {
        regex::Regex::new(re).unwrap().is_match(name)
    }

    const PARALLEL_TEST: &str =
        "[sig-apps] Deployment deployment should support rollover [Conformance]";
    const SERIAL_TEST: &str = "[sig-scheduling] SchedulerPredicates [Serial] validates resource limits of pods that are allowed to run [Conformance]";
    const DISRUPTIVE_TEST: &str = "[sig-node] NoExecuteTaintManager Single Pod [Serial] removing taint cancels eviction [Disruptive] [Conformance]";
    const NOT_CONFORMANCE: &str = "[sig-apps] Deployment should not disrupt a cloud load-balancer's connectivity during rollout";

    fn selects(part: &Part, name: &str) -> bool {
        matches(&part.focus, name) && !part.skip.as_ref().is_some_and(|s| matches(s, name))
    }

    #[test]
    fn the_whole_suite_is_a_parallel_pass_then_a_serial_one_that_shares_no_test() {
        let parts = plan(&Selection {
            all: true,
            procs: 4,
            ..Default::default()
        });
        assert_eq!(
            parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["parallel", "serial"]
        );
        assert_eq!((parts[0].procs, parts[1].procs), (4, 1));
        for (name, want) in [
            (PARALLEL_TEST, [true, false]),
            (SERIAL_TEST, [false, true]),
            (DISRUPTIVE_TEST, [false, true]),
            (NOT_CONFORMANCE, [false, false]),
        ] {
            let got = [selects(&parts[0], name), selects(&parts[1], name)];
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_sig_selects_its_own_tests_only_in_both_passes() {
        let sig = sig_name("scheduling").unwrap();
        let parts = plan(&Selection {
            sig: Some(&sig),
            procs: 4,
            ..Default::default()
        });
        assert_eq!(parts[0].name, "sig-scheduling-parallel");
        assert_eq!(parts[1].name, "sig-scheduling-serial");
        assert!(selects(&parts[1], SERIAL_TEST));
        assert!(!selects(&parts[0], PARALLEL_TEST) && !selects(&parts[1], PARALLEL_TEST));
    }

    #[test]
    fn one_pass_can_be_asked_for() {
        let parts = plan(&Selection {
            all: true,
            pass: Some(Pass::Serial),
            procs: 4,
            ..Default::default()
        });
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].name, "serial");
    }

    #[test]
    fn without_all_or_sig_the_focus_runs_as_given() {
        let parts = plan(&Selection {
            focus: NETWORK,
            skip: Some("Proxy"),
            procs: 3,
            ..Default::default()
        });
        assert_eq!(
            parts,
            [Part {
                name: "selected".into(),
                focus: NETWORK.into(),
                skip: Some("Proxy".into()),
                procs: 3
            }]
        );
    }

    #[test]
    fn sig_names_are_checked_and_take_either_form() {
        assert_eq!(sig_name("apps").unwrap(), "sig-apps");
        assert_eq!(sig_name("sig-apps").unwrap(), "sig-apps");
        let err = sig_name("sig-nope").unwrap_err();
        assert!(
            err.contains("\"sig-nope\"") && err.contains("api-machinery"),
            "{err}"
        );
    }
}
