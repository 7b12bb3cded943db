//! The binaries' contract with operators, scripts, units and dashboards: every flag,
//! environment variable, possible value, argument and subcommand that `--help` lists (for
//! `redirector`, `collector` and `clicktap`, each subcommand's `--help` too), and every metric
//! family and series, labels included, that `/metrics` serves (redirector and collector).
//! Each list is compared with its snapshot in `tests/contract/`, taken from the binaries
//! before: nothing in a snapshot may disappear or change, and a new flag, environment variable
//! or metric family fails until it is added to the snapshot (by hand, or with `CONTRACT_ADD=1`,
//! which adds and never removes), so the snapshot lists the whole contract. A new series of a
//! listed family is only printed: which label values a fresh process has served depends on
//! timing. A line removed on purpose is removed from the snapshot by hand, in the change that
//! removes it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use testkit::redirector::{collector_with, fixture, redirector, LIMIT};
use testkit::{binary, eventually, http};

fn snapshot_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/contract")
        .join(format!("{name}.txt"))
}

/// Compares `now` with the snapshot `name`: the lines of the snapshot missing from `now`, and
/// the new lines that `must_list` says the snapshot must have, as a diff (empty when there are
/// none). Prints the new lines; with `CONTRACT_ADD=1` adds them to the snapshot instead of
/// failing on them.
fn compare(name: &str, now: &BTreeSet<String>, must_list: fn(&str) -> bool) -> String {
    let path = snapshot_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let before: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    let gone: Vec<&String> = before.difference(now).collect();
    let new: Vec<&String> = now.difference(&before).collect();
    let add = std::env::var_os("CONTRACT_ADD").is_some();
    if !new.is_empty() {
        eprintln!(
            "{name}: {} new, not in {} yet; add them to it (or run with CONTRACT_ADD=1):\n{}",
            new.len(),
            path.display(),
            new.iter().map(|l| format!("+ {l}\n")).collect::<String>()
        );
        if add {
            let all: BTreeSet<&String> = before.iter().chain(now).collect();
            let text: String = all.iter().map(|l| format!("{l}\n")).collect();
            std::fs::create_dir_all(path.parent().expect("a file path")).expect("mkdir");
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            eprintln!("{name}: added to {}", path.display());
        }
    }
    if before.is_empty() && !add {
        return format!(
            "{}: no snapshot; create it with CONTRACT_ADD=1\n",
            path.display()
        );
    }
    if gone.is_empty() {
        let unlisted: Vec<&String> = new.iter().copied().filter(|l| must_list(l)).collect();
        if !unlisted.is_empty() && !add {
            return format!(
                "{}: {} new line(s) not in the snapshot yet; add them (or run with CONTRACT_ADD=1):\n{}",
                path.display(),
                unlisted.len(),
                unlisted.iter().map(|l| format!("+ {l}\n")).collect::<String>()
            );
        }
        return String::new();
    }
    let mut diff = format!(
        "{}: {} line(s) of the snapshot gone or changed (-); what the binary has now that the \
         snapshot lacks (+), a changed line among them:\n",
        path.display(),
        gone.len()
    );
    for line in gone {
        diff += &format!("- {line}\n");
    }
    for line in new {
        diff += &format!("+ {line}\n");
    }
    diff
}

/// Panics with every diff, if any.
fn assert_no_diffs(diffs: &[String]) {
    let diffs: String = diffs.concat();
    assert!(
        diffs.is_empty(),
        "the binaries no longer offer what the snapshot in tests/contract/ lists:\n{diffs}"
    );
}

/// `path --help` (`path` being the binary and its subcommands), with an empty environment:
/// no `[env: X=value]` shows a value of this machine's.
fn help(path: &[&str]) -> String {
    let out = Command::new(binary(path[0]))
        .args(&path[1..])
        .arg("--help")
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path[0]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} --help failed ({}):\n{text}{}",
        path.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The contract items of one `--help` text, each a line prefixed with `prefix` (the command
/// path): an option's head as shown (`--listen <ADDR>`, `-h, --help`), its environment
/// variable (`--listen [env: REDIRECTOR_LISTEN]`) and each possible value
/// (`--clicks [possible value: off]`), an argument (`arg [FILE|-]`) and a subcommand
/// (`command migrate`). Returns the subcommands.
fn help_items(prefix: &str, text: &str, items: &mut BTreeSet<String>) -> Vec<String> {
    let mut commands = Vec::new();
    let mut section = "";
    // Each entry: its first line, then its continuation lines (indented deeper).
    let mut entries: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            section = if line.ends_with(':') { line } else { "" };
            continue;
        }
        if !matches!(section, "Options:" | "Arguments:" | "Commands:") {
            continue;
        }
        // Entries start at most six columns in (`  -h, --help`, `      --listen`); wrapped
        // descriptions are indented past the heads, even one that starts with a flag.
        if indent <= 6 {
            entries.push((section, vec![line.trim()]));
        } else if let Some((_, lines)) = entries.last_mut() {
            lines.push(line.trim());
        }
    }
    for (section, lines) in entries {
        let head = lines[0].split("  ").next().unwrap_or_default().trim();
        match section {
            "Commands:" => {
                let name = head.split_whitespace().next().unwrap_or_default();
                items.insert(format!("{prefix} command {name}"));
                commands.push(name.to_owned());
            }
            "Arguments:" => {
                items.insert(format!("{prefix} arg {head}"));
            }
            _ => {
                items.insert(format!("{prefix} {head}"));
                let long = head
                    .split([' ', ','])
                    .find(|t| t.starts_with("--"))
                    .unwrap_or(head);
                let all = lines.join(" ");
                let all = all.split_whitespace().collect::<Vec<_>>().join(" ");
                if let Some(env) = bracketed(&all, "[env: ") {
                    let name = env.split('=').next().unwrap_or_default();
                    items.insert(format!("{prefix} {long} [env: {name}]"));
                }
                if let Some(values) = bracketed(&all, "[possible values: ") {
                    for value in values.split(", ") {
                        items.insert(format!("{prefix} {long} [possible value: {value}]"));
                    }
                }
            }
        }
    }
    commands
}

/// What follows `open` in `text`, up to the next `]`.
fn bracketed<'t>(text: &'t str, open: &str) -> Option<&'t str> {
    let start = text.find(open)? + open.len();
    let len = text[start..].find(']')?;
    Some(&text[start..start + len])
}

/// The contract items of `binary --help` and of its subcommands' (but `help`), recursively.
fn flags(binary: &str) -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    let mut pending = vec![vec![binary.to_owned()]];
    while let Some(path) = pending.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let commands = help_items(&path.join(" "), &help(&args), &mut items);
        for command in commands.into_iter().filter(|c| c != "help") {
            let mut sub = path.clone();
            sub.push(command);
            pending.push(sub);
        }
    }
    items
}

/// The families (`# TYPE` lines) and series (a sample's name and labels, without its value)
/// of a `/metrics` text.
fn metric_items(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| {
            if line.starts_with("# TYPE ") {
                Some(line.to_owned())
            } else if line.starts_with('#') || line.trim().is_empty() {
                None
            } else {
                let (series, _value) = line
                    .rsplit_once(' ')
                    .unwrap_or_else(|| panic!("a sample without a value: {line:?}"));
                Some(series.to_owned())
            }
        })
        .collect()
}

/// Whether a metric item is a family (its `# TYPE` line), which a snapshot must list, rather
/// than a series.
fn is_family(item: &str) -> bool {
    item.starts_with("# TYPE ")
}

/// `GET /metrics` from the admin listener at `admin`, once it answers.
async fn metrics_text(admin: std::net::SocketAddr) -> String {
    eventually("GET /metrics to answer 200", LIMIT, || async {
        let (status, body) = http::get(admin, "/metrics").await.ok()?;
        (status == 200).then_some(body)
    })
    .await
}

#[test]
fn every_flag_and_environment_variable_of_the_snapshot_is_still_in_help() {
    let diffs: Vec<String> = ["redirector", "collector", "clicktap"]
        .iter()
        .map(|bin| compare(&format!("{bin}-flags"), &flags(bin), |_| true))
        .collect();
    assert_no_diffs(&diffs);
}

#[tokio::test]
async fn every_metric_of_the_snapshot_is_still_served() {
    let f = fixture(&[]).await;
    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    let diffs = [
        compare(
            "redirector-metrics",
            &metric_items(&metrics_text(r.admin).await),
            is_family,
        ),
        compare(
            "collector-metrics",
            &metric_items(&metrics_text(collector_admin).await),
            is_family,
        ),
    ];
    assert_no_diffs(&diffs);
}

#[test]
fn help_items_are_read_from_wrapped_entries_and_not_from_descriptions() {
    let text = "\
Does things

Usage: tool [OPTIONS] [FILE|-] [COMMAND]

Commands:
  run   Run it; wraps onto a
        second line
  help  Print this message

Arguments:
  [FILE|-]  Input [default: -]

Options:
      --mode <MODE>      What to do [env:
                         TOOL_MODE=] [default: a] [possible values: a,
                         b]
      --size <N>         Mentions, wrapped,
                         --other-flag <X> in its description
  -h, --help             Print help

Examples:
  tool run --not-an-option
";
    let mut items = BTreeSet::new();
    let commands = help_items("tool", text, &mut items);
    assert_eq!(commands, ["run", "help"]);
    let want = [
        "tool --mode <MODE>",
        "tool --mode [env: TOOL_MODE]",
        "tool --mode [possible value: a]",
        "tool --mode [possible value: b]",
        "tool --size <N>",
        "tool -h, --help",
        "tool arg [FILE|-]",
        "tool command help",
        "tool command run",
    ];
    assert_eq!(items, want.iter().map(|s| s.to_string()).collect());
}

#[test]
fn metric_items_are_families_and_series_without_values() {
    let text = "\
# HELP x_total Things.
# TYPE x counter
x_total 3
# TYPE y counter
y_total{reason=\"a b\"} 0
# EOF
";
    let want = [
        "# TYPE x counter",
        "# TYPE y counter",
        "x_total",
        "y_total{reason=\"a b\"}",
    ];
    assert_eq!(
        metric_items(text),
        want.iter().map(|s| s.to_string()).collect()
    );
}
