//! Progress on long steps: a bar on a terminal, plain lines in logs (one when a step starts,
//! one every 10 s while it runs, one when it ends), nothing with `--quiet`. On stderr, so that
//! `--json` output on stdout stays clean.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A bar on a terminal, lines otherwise.
    Auto,
    Bar,
    Lines,
    Quiet,
}

#[derive(Debug)]
pub struct Progress {
    mode: Mode,
}

impl Progress {
    pub fn new(mode: Mode) -> Progress {
        let mode = match mode {
            Mode::Auto if std::io::stderr().is_terminal() => Mode::Bar,
            Mode::Auto => Mode::Lines,
            m => m,
        };
        Progress { mode }
    }

    /// A step; `total` bytes if its size is known.
    pub fn task(&self, label: &str, total: Option<u64>) -> Task {
        let bar = (self.mode == Mode::Bar).then(|| {
            let b = match total {
                Some(t) => ProgressBar::new(t).with_style(
                    ProgressStyle::with_template(
                        "{spinner} {prefix:24} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                ),
                None => ProgressBar::new_spinner().with_style(
                    ProgressStyle::with_template("{spinner} {prefix:24} {elapsed} {wide_msg}")
                        .expect("a valid template"),
                ),
            };
            b.set_prefix(label.to_string());
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        if self.mode == Mode::Lines {
            eprintln!(
                "{label}: started{}",
                total
                    .map(|t| format!(" ({} MiB)", t >> 20))
                    .unwrap_or_default()
            );
        }
        Task {
            label: label.to_string(),
            lines: self.mode == Mode::Lines,
            bar,
            total,
            state: Mutex::new((0, Instant::now(), Instant::now(), String::new())),
        }
    }
}

#[derive(Debug)]
pub struct Task {
    label: String,
    lines: bool,
    bar: Option<ProgressBar>,
    total: Option<u64>,
    /// Bytes done, the start, the last plain line, the last message.
    state: Mutex<(u64, Instant, Instant, String)>,
}

impl Task {
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
        let mut st = self.state.lock().expect("lock");
        st.0 += n;
        self.tick(&mut st);
    }

    pub fn message(&self, msg: impl Into<String>) {
        let msg = msg.into();
        if let Some(b) = &self.bar {
            b.set_message(msg.clone());
        }
        let mut st = self.state.lock().expect("lock");
        st.3 = msg;
        self.tick(&mut st);
    }

    fn tick(&self, st: &mut (u64, Instant, Instant, String)) {
        if self.lines && st.2.elapsed() >= Duration::from_secs(10) {
            st.2 = Instant::now();
            let done = match self.total {
                Some(t) if t > 0 => format!(" {}%", st.0 * 100 / t),
                _ => String::new(),
            };
            eprintln!(
                "{}: {:.0}s{done} {}",
                self.label,
                st.1.elapsed().as_secs_f64(),
                st.3
            );
        }
    }

    pub fn finish(self, summary: &str) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        let secs = self.state.lock().expect("lock").1.elapsed().as_secs_f64();
        if self.lines || self.bar.is_some() {
            eprintln!("{}: done in {secs:.1}s{summary}", self.label);
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
