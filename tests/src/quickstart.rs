//! docs/quickstart.md as a program: its `sh` blocks, each with the machine it runs on and
//! the value it prints for later blocks, in the page's order. `tests/tests/quickstart.rs`
//! runs them word for word; the page's rules are what this parser holds it to:
//!
//! - every `sh` block starts with `# on <machine>`: `the broker host`, `each provider
//!   machine`, `the broker host, for each provider machine` (once per provider, with that
//!   provider's values) or `your computer`; `, only if <condition>` after it makes the block
//!   conditional on what the reader's machines have (the only condition: `it has no KVM` /
//!   `the providers have no KVM`);
//! - a block whose command ends in `# → NAME` prints a value the reader notes as `$NAME`
//!   (such a block holds that one command).

use anyhow::{Result, bail};

/// Where a block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    BrokerHost,
    EachProvider,
    BrokerHostForEachProvider,
    User,
}

/// One `sh` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub place: Place,
    /// The block's text, its `# on` line included.
    pub script: String,
    /// The name of the value it prints, if it prints one.
    pub prints: Option<String>,
    /// Only for machines without KVM.
    pub without_kvm_only: bool,
    /// Its first line's number in the page (1-based), for messages.
    pub line: usize,
}

fn place(rest: &str, line: usize) -> Result<(Place, bool)> {
    let (what, condition) = match rest.split_once(", only if ") {
        Some((w, c)) => (w, Some(c)),
        None => (rest, None),
    };
    let place = match what {
        "the broker host" => Place::BrokerHost,
        "each provider machine" => Place::EachProvider,
        "the broker host, for each provider machine" => Place::BrokerHostForEachProvider,
        "your computer" => Place::User,
        other => bail!(
            "line {line}: '# on {other}' names no machine the quickstart has (the broker host; \
             each provider machine; the broker host, for each provider machine; your computer)"
        ),
    };
    let without_kvm_only = match condition {
        None => false,
        Some("it has no KVM" | "the providers have no KVM") => true,
        Some(c) => bail!("line {line}: 'only if {c}' is no condition the quickstart knows"),
    };
    Ok((place, without_kvm_only))
}

/// The value a block prints: `# → NAME` ending its one command.
fn prints(script: &str, line: usize) -> Result<Option<String>> {
    let marked: Vec<&str> = script.lines().filter(|l| l.contains("# →")).collect();
    let Some(marked) = marked.first() else {
        return Ok(None);
    };
    let name = marked.rsplit("# →").next().unwrap_or_default().trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        bail!("line {line}: '# → {name}' does not name a value (CAPITALS and _)");
    }
    let commands = script
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .count();
    if commands != 1 {
        bail!("line {line}: a block that prints {name} holds that one command, not {commands}");
    }
    Ok(Some(name.to_string()))
}

/// The page's `sh` blocks, in order.
pub fn blocks(markdown: &str) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((i, l)) = lines.next() {
        if l.trim_end() != "```sh" {
            continue;
        }
        let mut script = String::new();
        let mut closed = false;
        for (_, l) in lines.by_ref() {
            if l.trim_end() == "```" {
                closed = true;
                break;
            }
            script.push_str(l);
            script.push('\n');
        }
        let line = i + 2;
        if !closed {
            bail!("line {line}: a sh block is never closed");
        }
        let Some(rest) = script.lines().next().and_then(|f| f.strip_prefix("# on ")) else {
            bail!("line {line}: a sh block must start with '# on <machine>'");
        };
        let (place, without_kvm_only) = place(rest.trim(), line)?;
        out.push(Block {
            place,
            prints: prints(&script, line)?,
            script,
            without_kvm_only,
            line,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_say_where_they_run_and_what_they_print() {
        let page = "text\n```sh\n# on the broker host\nsocialweb-broker market-pin   # → BROKER_PIN\n```\n\
                    ```toml\nnot = 'run'\n```\n\
                    ```sh\n# on each provider machine, only if it has no KVM\necho a\necho b\n```\n\
                    ```sh\n# on the broker host, for each provider machine\necho $PROVIDER_PIN\n```\n";
        let b = blocks(page).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].place, Place::BrokerHost);
        assert_eq!(b[0].prints.as_deref(), Some("BROKER_PIN"));
        assert_eq!(b[0].line, 3);
        assert_eq!(b[1].place, Place::EachProvider);
        assert!(b[1].without_kvm_only);
        assert_eq!(b[1].prints, None);
        assert_eq!(b[2].place, Place::BrokerHostForEachProvider);
    }

    #[test]
    fn a_block_that_says_no_machine_or_prints_beside_other_commands_is_refused() {
        let no_machine = "```sh\necho hi\n```\n";
        assert!(
            blocks(no_machine)
                .unwrap_err()
                .to_string()
                .contains("# on <machine>")
        );
        let unknown = "```sh\n# on the moon\necho hi\n```\n";
        assert!(
            blocks(unknown)
                .unwrap_err()
                .to_string()
                .contains("the moon")
        );
        let two = "```sh\n# on your computer\necho a\necho b   # → X\n```\n";
        assert!(blocks(two).unwrap_err().to_string().contains("one command"));
        let condition = "```sh\n# on your computer, only if it rains\necho a\n```\n";
        assert!(blocks(condition).unwrap_err().to_string().contains("rains"));
        let open = "```sh\n# on your computer\necho a\n";
        assert!(
            blocks(open)
                .unwrap_err()
                .to_string()
                .contains("never closed")
        );
    }
}
