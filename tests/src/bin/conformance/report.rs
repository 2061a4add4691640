//! What a conformance run found: the JUnit reports ginkgo writes, read into verdicts, the
//! known failures docs/conformance.md lists, totals per SIG and the Markdown table the doc
//! carries.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};

/// One test case of a JUnit report.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub status: String,
    /// The skip message (`skipped` alone when the focus filtered the test out).
    pub skipped: Option<String>,
    pub failure: Option<String>,
    pub seconds: f64,
}

/// The test cases of a Ginkgo JUnit report: `testcase` elements with `name`, `status` and
/// `time`, and a `skipped` or `failure` child.
pub fn parse_junit(xml: &str) -> Result<Vec<Case>> {
    let doc = roxmltree::Document::parse(xml).context("the JUnit report is not XML")?;
    let child_text = |case: roxmltree::Node, tag: &str| -> Option<String> {
        let c = case.children().find(|c| c.has_tag_name(tag))?;
        // Ginkgo puts the failure's text in the body and leaves the message empty.
        let message = c.attribute("message").unwrap_or("");
        Some(if message.is_empty() {
            c.text().unwrap_or("").trim().to_string()
        } else {
            message.to_string()
        })
    };
    Ok(doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|n| Case {
            name: n.attribute("name").unwrap_or("").to_string(),
            status: n.attribute("status").unwrap_or("").to_string(),
            skipped: child_text(n, "skipped"),
            failure: child_text(n, "failure").or_else(|| child_text(n, "error")),
            seconds: n
                .attribute("time")
                .and_then(|t| t.parse().ok())
                .unwrap_or(0.0),
        })
        .collect())
}

/// The tests a run selected. Ginkgo lists every spec of the suite; those the focus filtered
/// out are "skipped" with no other reason. Suite-level nodes (`[SynchronizedBeforeSuite]`,
/// `[ReportBeforeSuite]`, ...) are not tests.
pub fn selected(cases: Vec<Case>) -> Vec<Case> {
    cases
        .into_iter()
        .filter(|c| c.status != "skipped" || c.skipped.as_deref().is_some_and(|m| m != "skipped"))
        .filter(|c| !c.name.starts_with('[') || c.name.starts_with("[It] "))
        .map(|mut c| {
            c.name = c.name.trim_start_matches("[It] ").to_string();
            c
        })
        .collect()
}

/// The tests the document lists as known failures: the `- <test name>` lines of its
/// `## Known failures` section (text after the name, from ` -- `, is the reason).
pub fn known_failures(doc: &str) -> Vec<String> {
    doc.split_once("\n## Known failures")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or(""))
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| l.split(" -- ").next().unwrap_or(l).trim().to_string())
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

impl Verdict {
    fn of(status: &str) -> Self {
        match status {
            "passed" => Verdict::Pass,
            "skipped" => Verdict::Skip,
            _ => Verdict::Fail,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        }
    }
}

/// A selected test's result in one part of the run.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub part: String,
    pub case: Case,
    pub verdict: Verdict,
    /// A failure docs/conformance.md lists.
    pub known: bool,
}

impl Outcome {
    /// Its line in a part's results.txt and in the runner's output.
    pub fn line(&self) -> String {
        format!(
            "{} {:>7.1}s {}",
            self.verdict.word(),
            self.case.seconds,
            self.case.name
        )
    }
}

pub fn outcomes(part: &str, cases: Vec<Case>, known: &[String]) -> Vec<Outcome> {
    cases
        .into_iter()
        .map(|case| {
            let verdict = Verdict::of(&case.status);
            Outcome {
                part: part.to_string(),
                known: verdict == Verdict::Fail && known.contains(&case.name),
                case,
                verdict,
            }
        })
        .collect()
}

/// The SIG a test belongs to: the bracket its name starts with.
pub fn sig_of(name: &str) -> &str {
    name.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .map(|(sig, _)| sig)
        .filter(|s| s.starts_with("sig-"))
        .unwrap_or("other")
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub selected: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Failures docs/conformance.md does not list.
    pub undocumented: usize,
}

impl Totals {
    pub fn add(&mut self, o: &Outcome) {
        self.selected += 1;
        match o.verdict {
            Verdict::Pass => self.passed += 1,
            Verdict::Skip => self.skipped += 1,
            Verdict::Fail => {
                self.failed += 1;
                if !o.known {
                    self.undocumented += 1;
                }
            }
        }
    }

    pub fn of<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Self {
        let mut t = Totals::default();
        for o in outcomes {
            t.add(o);
        }
        t
    }

    /// `name=value` lines, each name after `prefix`.
    pub fn figures(&self, prefix: &str) -> String {
        format!(
            "{prefix}selected={}\n{prefix}passed={}\n{prefix}failed={}\n{prefix}skipped={}\n{prefix}failed_undocumented={}\n",
            self.selected, self.passed, self.failed, self.skipped, self.undocumented
        )
    }
}

pub fn by_sig(outcomes: &[Outcome]) -> BTreeMap<String, Totals> {
    let mut m: BTreeMap<String, Totals> = BTreeMap::new();
    for o in outcomes {
        m.entry(sig_of(&o.case.name).to_string())
            .or_default()
            .add(o);
    }
    m
}

/// How long each part took, for the doc.
#[derive(Debug, Clone)]
pub struct PartTime {
    pub name: String,
    pub procs: u32,
    pub seconds: f64,
}

/// The Markdown results the doc carries: the parts and their times, totals per SIG, then
/// every test with its result, sorted by name.
pub fn markdown(header: &str, times: &[PartTime], outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{header}\n");
    let _ = writeln!(
        s,
        "| part | ginkgo processes | tests | passed | failed | time |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for p in times {
        let t = Totals::of(outcomes.iter().filter(|o| o.part == p.name));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} min {} s |",
            p.name,
            p.procs,
            t.selected,
            t.passed,
            t.failed,
            p.seconds as u64 / 60,
            p.seconds as u64 % 60
        );
    }
    let _ = writeln!(s, "\n| SIG | tests | passed | failed | skipped |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    let sigs = by_sig(outcomes);
    for (sig, t) in sigs
        .iter()
        .chain([(&"all".to_string(), &Totals::of(outcomes))])
    {
        let _ = writeln!(
            s,
            "| {sig} | {} | {} | {} | {} |",
            t.selected, t.passed, t.failed, t.skipped
        );
    }
    let _ = writeln!(s, "\n| result | part | time | test |");
    let _ = writeln!(s, "|---|---|---|---|");
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| a.case.name.cmp(&b.case.name));
    for o in sorted {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1}s | {} |",
            o.verdict.word(),
            o.part,
            o.case.seconds,
            o.case.name.replace('|', "\\|")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" disabled="0" errors="0" failures="1" time="1">
  <testsuite name="Kubernetes e2e suite" package="/x" tests="3">
    <testcase name="[ReportBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0.01"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services [Conformance]" classname="Kubernetes e2e suite" status="passed" time="4.8"></testcase>
    <testcase name="[It] [sig-network] Services should be able to create a functioning NodePort service [Conformance]" classname="Kubernetes e2e suite" status="failed" time="131.7">
      <failure message="" type="failed">[FAILED] service is not reachable within 2m0s timeout on endpoint 172.30.1.2:30546 over TCP protocol&#xA;In [It] at: service.go:1312</failure>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment should run [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-node] Sysctls should work [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0.2">
      <skipped message="skipped - the node lacks it"></skipped>
    </testcase>
  </testsuite>
</testsuites>"#;

    #[test]
    fn junit_cases_are_read_with_their_status_and_failure_text() {
        let cases = parse_junit(XML).unwrap();
        assert_eq!(cases.len(), 5);
        assert_eq!(cases[1].status, "passed");
        assert!((cases[1].seconds - 4.8).abs() < 1e-9);
        assert_eq!(cases[2].status, "failed");
        assert_eq!(
            cases[2].failure.as_deref().unwrap().lines().next(),
            Some(
                "[FAILED] service is not reachable within 2m0s timeout on endpoint 172.30.1.2:30546 over TCP protocol"
            )
        );
        assert_eq!(cases[3].skipped.as_deref(), Some("skipped"));
        assert!(cases[1].failure.is_none());
    }

    #[test]
    fn a_report_that_is_not_xml_is_an_error() {
        assert!(parse_junit("<testsuites><testcase").is_err());
    }

    #[test]
    fn the_selection_is_what_ran_or_skipped_itself_named_without_its_node_type() {
        let sel = selected(parse_junit(XML).unwrap());
        let names: Vec<&str> = sel.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "[sig-network] DNS should provide DNS for services [Conformance]",
                "[sig-network] Services should be able to create a functioning NodePort service [Conformance]",
                "[sig-node] Sysctls should work [Conformance]",
            ]
        );
    }

    #[test]
    fn totals_count_known_and_undocumented_failures_per_sig() {
        let known = vec![
            "[sig-network] Services should be able to create a functioning NodePort service [Conformance]".to_string(),
        ];
        let o = outcomes("parallel", selected(parse_junit(XML).unwrap()), &known);
        let all = Totals::of(&o);
        assert_eq!(
            (
                all.selected,
                all.passed,
                all.failed,
                all.skipped,
                all.undocumented
            ),
            (3, 1, 1, 1, 0)
        );
        let sigs = by_sig(&o);
        assert_eq!(sigs["sig-network"].selected, 2);
        assert_eq!(sigs["sig-node"].skipped, 1);
        assert_eq!(
            all.figures("serial_"),
            "serial_selected=3\nserial_passed=1\nserial_failed=1\nserial_skipped=1\nserial_failed_undocumented=0\n"
        );
        let o = outcomes("parallel", selected(parse_junit(XML).unwrap()), &[]);
        assert_eq!(Totals::of(&o).undocumented, 1);
    }

    #[test]
    fn the_markdown_has_parts_sigs_and_every_test() {
        let o = outcomes("parallel", selected(parse_junit(XML).unwrap()), &[]);
        let md = markdown(
            "Run on a day.",
            &[PartTime {
                name: "parallel".into(),
                procs: 4,
                seconds: 125.0,
            }],
            &o,
        );
        assert!(
            md.contains("| parallel | 4 | 3 | 1 | 1 | 2 min 5 s |"),
            "{md}"
        );
        assert!(md.contains("| sig-network | 2 | 1 | 1 | 0 |"), "{md}");
        assert!(md.contains("| all | 3 | 1 | 1 | 1 |"), "{md}");
        assert!(
            md.contains("| FAIL | parallel | 131.7s | [sig-network] Services should"),
            "{md}"
        );
    }

    #[test]
    fn known_failures_are_the_list_items_of_their_section_only_without_their_reason() {
        let doc = "# T\n\n## Results\n\n- [sig-network] A passes [Conformance]\n\n## Known failures\n\nWhy.\n\n- [sig-network] B fails [Conformance]\n- [sig-network] C fails [Conformance] -- the kernel lacks it\n\n## Later\n\n- D\n";
        assert_eq!(
            known_failures(doc),
            [
                "[sig-network] B fails [Conformance]",
                "[sig-network] C fails [Conformance]"
            ]
        );
    }

    #[test]
    fn a_test_is_in_the_sig_its_name_starts_with() {
        assert_eq!(
            sig_of("[sig-apps] Job should run [Conformance]"),
            "sig-apps"
        );
        assert_eq!(sig_of("Something [Conformance]"), "other");
    }
}
