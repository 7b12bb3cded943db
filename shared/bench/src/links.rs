//! The link table: `links` (time to ready, memory, and req/s, p99 and CPU a request with no
//! link changes vs CHANGE_RATE changes a second), `links-follow` (what following the changes
//! costs, without requests) and `links-soak` (memory through a long run of changes). The
//! changes come from pgbench, to `links` or to `links_control`, a copy nobody follows: each its
//! own transaction at a fixed rate, or CHANGE_RATE of them in one transaction a second.

use std::fmt::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::redirector::load::{Client, Load, Paths};

use crate::cluster::execute;
use crate::pgbench::{finish_pgbench, pgbench_bin, pgbench_rate};
use crate::procfs::{clk_tck, memory_kib, pg_switches, pg_ticks, switches, ticks, Cpu};
use crate::redirect::stats;
use crate::services::{metric, Proc};
use crate::table::{append, column, g10, median, num, ratio, rotated, rows};
use crate::{addr, log, Bench, Res, Variant, HTTP, REDIRECTOR_ADMIN};

/// Links l0 ... l(N-1) to 45-byte URLs, loaded with one statement (the change log's triggers
/// on, as in production), then the log pruned so that runs start from an empty log; and
/// links_control, the same rows without triggers or followers: the control mode changes it
/// instead, to show what the changes themselves cost. A checkpoint last, so that writing the
/// load out does not land in a timed run.
async fn load_links(bench: &Bench, n: u64) -> Res<()> {
    let db = bench.client(Variant::Current).await?;
    let t0 = Instant::now();
    execute(&db, "TRUNCATE links").await?;
    let insert = format!(
        "INSERT INTO links (code, url) SELECT 'l' || n, \
         'https://example.com/articles/2026/' || lpad(n::text, 11, '0') \
         FROM generate_series(0, {n} - 1) AS n"
    );
    execute(&db, &insert).await?;
    // A prune keeps the rows of transactions newer than the oldest one running (migration
    // 17): one of anything else on the cluster may hold them back a moment.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        execute(&db, "SELECT prune_link_changes('0 s')").await?;
        let left = "SELECT count(*) FROM (SELECT FROM link_changes LIMIT 1) AS l";
        if crate::cluster::number(&db, left).await? == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err("the change log did not empty in 60 s: a transaction stays open".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    log(&format!(
        "loaded {n} links in {:.2} s",
        t0.elapsed().as_secs_f64()
    ));
    execute(&db, "DROP TABLE IF EXISTS links_control").await?;
    execute(
        &db,
        "CREATE TABLE links_control AS SELECT code, url FROM links",
    )
    .await?;
    execute(&db, "ALTER TABLE links_control ADD PRIMARY KEY (code)").await?;
    execute(&db, "VACUUM ANALYZE links, link_changes, links_control").await?;
    execute(&db, "CHECKPOINT").await
}

/// pgbench's script of random updates, deletes and inserts, to `table`: one (its own
/// transaction, throttled by `-R`), or (`one_txn`) `per_txn` of them in one transaction and a
/// second's pause.
fn change_script(table: &str, one_txn: bool, per_txn: u64) -> String {
    let change = format!(
        "\\set n random(0, :links - 1)\n\\set op random(0, 2)\n\\if :op = 0\n\
         UPDATE {table} SET url = 'https://example.com/updated/2026/' || lpad(:n::text, 11, '0') WHERE code = 'l' || :n;\n\
         \\elif :op = 1\nDELETE FROM {table} WHERE code = 'l' || :n;\n\\else\n\
         INSERT INTO {table} (code, url) VALUES ('l' || :n, 'https://example.com/articles/2026/' || lpad(:n::text, 11, '0'))\n\
         ON CONFLICT (code) DO UPDATE SET url = EXCLUDED.url;\n\\endif\n"
    );
    match one_txn {
        false => change,
        // A second's pause, not `-R 1`: pgbench spaces throttled transactions at random
        // (Poisson), so one a second came 56 to 150 times in 10-s runs.
        true => format!(
            "BEGIN;\n{}COMMIT;\n\\sleep 1 s\n",
            change.repeat(per_txn as usize)
        ),
    }
}

/// How a run changes links: to links or (control) to links_control, each change its own
/// transaction (at a rate, `-R`) or `rate` of them in one transaction, then a second's pause
/// (`one_txn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Changes {
    control: bool,
    one_txn: bool,
}

impl Changes {
    /// The changes of a `links` mode; `None` for mode none.
    fn of_mode(mode: &str) -> Option<Changes> {
        let (table, txn) = mode.split_once('-').unwrap_or((mode, ""));
        (table != "none").then_some(Changes {
            control: table == "control",
            one_txn: txn == "tx",
        })
    }
}

/// pgbench making `rate` changes a second for `secs` seconds as `changes` says, over `n` links.
fn pgbench(bench: &Bench, rate: u64, secs: u64, changes: Changes, n: u64, log: &str) -> Res<Proc> {
    let (table, file) = match changes.control {
        true => ("links_control", "link-changes-control.sql"),
        false => ("links", "link-changes.sql"),
    };
    let script = bench.path(file);
    std::fs::write(&script, change_script(table, changes.one_txn, rate))?;
    let mut cmd = Command::new(pgbench_bin()?);
    cmd.arg("-n");
    if !changes.one_txn {
        cmd.args(["-R", &rate.to_string()]);
    }
    cmd.args(["-T", &secs.to_string(), "-c", "1", "-f"])
        .arg(&script)
        .args(["-D", &format!("links={n}")])
        .arg(bench.url(Variant::Current));
    let log = bench.path(log);
    let _ = std::fs::remove_file(&log);
    Proc::spawn("pgbench", cmd, &log)
}

/// The redirector of `variant` serving the current database's links, clicks off (only the
/// link table is measured); ready once /healthz answers. It and the seconds it took.
async fn start(bench: &Bench, variant: Variant) -> Res<(Proc, f64)> {
    let mut cmd = Command::new(bench.bin(variant, "redirector"));
    cmd.args([
        "--clicks",
        "off",
        "--database-url",
        &bench.url(Variant::Current),
    ])
    .arg("--socket")
    .arg(bench.path("collector.sock"))
    .args(["--listen", HTTP, "--admin-listen", REDIRECTOR_ADMIN]);
    let log = bench.path("redirector-links.log");
    let _ = std::fs::remove_file(&log);
    let t0 = Instant::now();
    let proc = Proc::spawn("redirector", cmd, &log)?;
    let admin = addr(REDIRECTOR_ADMIN);
    // A table of millions of links takes a while to load: longer than other waits.
    crate::services::until(
        Duration::from_secs(300),
        "a ready redirector",
        &log,
        || async { matches!(testkit::http::get(admin, "/healthz").await, Ok((200, _))) },
    )
    .await?;
    Ok((proc, t0.elapsed().as_secs_f64()))
}

/// Uniformly random codes of `n` links.
fn paths(n: u64) -> Paths {
    Arc::new(move |random, path| {
        let _ = write!(path, "/l{}", random.next_u64() % n);
    })
}

/// One load run over random codes, with CHANGE_RATE changes a second meanwhile to links
/// (modes changes, changes-tx) or to links_control (control, control-tx), or none. Appends to links.tsv: links,
/// mode, round, req/s, p50, p99, RSS KiB after, changes/s, lag s, and the redirector's and
/// PostgreSQL's CPU ticks over the load run alone.
async fn once(bench: &Bench, n: u64, mode: &str, round: u32, redirector: i32) -> Res<()> {
    let k = &bench.knobs;
    let log = format!("pgbench-{n}-{round}.log");
    let changes = Changes::of_mode(mode);
    let changer = match changes {
        None => None,
        Some(changes) => Some(pgbench(
            bench,
            k.change_rate,
            k.duration + 1,
            changes,
            n,
            &log,
        )?),
    };
    if changer.is_some() {
        // The changes are under way before the load starts.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = Cpu::now(Some(redirector), None, bench.postmaster);
    let load = Load {
        connections: k.connections,
        paths: Some(paths(n)),
        client: Client::Plain,
        ..Load::get(addr(HTTP), "/")
    };
    let (report, elapsed) = load.run_for(Duration::from_secs(k.duration)).await;
    let after = Cpu::now(Some(redirector), None, bench.postmaster);
    let mut rate = 0.0;
    if let Some(changer) = changer {
        finish_pgbench(bench, changer, &log).await?;
        rate = pgbench_rate(bench, &log);
        if changes.is_some_and(|c| c.one_txn) {
            rate *= k.change_rate as f64;
        }
    }
    let (rps, p50, p99) = stats(&report, elapsed);
    let lag = metric(addr(REDIRECTOR_ADMIN), "redirector_links_lag_seconds").await?;
    let row = [
        n.to_string(),
        mode.to_owned(),
        round.to_string(),
        rps,
        p50,
        p99,
        memory_kib(redirector, "VmRSS").to_string(),
        format!("{rate:.1}"),
        g10(lag),
        (after.redirector - before.redirector).to_string(),
        (after.postgres.saturating_sub(before.postgres)).to_string(),
    ];
    append(&bench.path("links.tsv"), &row)
}

/// No changes; changes to links and to links_control, each its own transaction; and the same
/// as one transaction a second (`-tx`).
const MODES: [&str; 5] = ["none", "changes", "control", "changes-tx", "control-tx"];

pub(crate) async fn bench_links(bench: &mut Bench) -> Res<()> {
    std::fs::write(bench.path("links.tsv"), "")?;
    std::fs::write(bench.path("links-ready.tsv"), "")?;
    for &n in &bench.knobs.link_counts.clone() {
        load_links(bench, n).await?;
        let (redirector, ready) = start(bench, Variant::Current).await?;
        let pid = redirector.pid();
        let ready_row = [
            n.to_string(),
            format!("{ready:.2}"),
            memory_kib(pid, "VmRSS").to_string(),
            memory_kib(pid, "VmHWM").to_string(),
        ];
        append(&bench.path("links-ready.tsv"), &ready_row)?;
        log(&format!("{n} links: ready in {ready:.2} s"));
        for round in 1..=bench.knobs.rounds {
            for mode in rotated(round as usize, &MODES) {
                log(&format!("links round {round}, {n} links: {mode}"));
                once(bench, n, mode, round, pid).await?;
            }
        }
        redirector.stop().await;
    }
    print_links(bench);
    Ok(())
}

fn print_links(bench: &Bench) {
    let k = &bench.knobs;
    println!("load: 2 threads, {} keep-alive connections, {}s over random codes, redirector --clicks off; with {}", k.connections, k.duration, k.change_rate);
    println!(
        "changes a second (random UPDATE, DELETE or INSERT) to links, or the same to links_control"
    );
    println!(
        "(a copy no redirector follows: what the changes cost by themselves), or none; each change"
    );
    println!("its own transaction (pgbench -R), or all in one transaction a second (-tx); 'vs none' is a");
    println!("ratio of medians, 'vs control' the median of the rounds' ratios.");
    println!("medians of {} interleaved rounds.", k.rounds);
    println!();
    println!("| links | ready s | RSS after ready MiB | bytes/link | peak RSS (VmHWM) MiB | mode | changes | req/s | vs none | p99 ms | vs none | RSS after the runs MiB | lag s | redirector CPU us/request | vs control | p99 vs control | PostgreSQL CPU s/run |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let runs = rows(&bench.path("links.tsv"));
    let ready = rows(&bench.path("links-ready.tsv"));
    let hz = clk_tck();
    for n in &k.link_counts {
        let n_text = n.to_string();
        let Some(r) = ready.iter().find(|r| r.len() >= 4 && r[0] == n_text) else {
            continue;
        };
        let (rss, hwm) = (num(&r[2]), num(&r[3]));
        let col = |mode: &str, f| median(&column(&runs, &[&n_text, mode], f));
        let (base, base99) = (num(&col("none", 4)), num(&col("none", 6)));
        for mode in MODES {
            let (rps, p99) = (num(&col(mode, 4)), col(mode, 6));
            let mine: Vec<&Vec<String>> = runs
                .iter()
                .filter(|r| r.len() >= 11 && r[0] == n_text && r[1] == mode)
                .collect();
            let us: Vec<String> = mine
                .iter()
                .map(|r| g10(cpu_per_request(r, hz, k)))
                .collect();
            let control = mode.replacen("changes", "control", 1);
            let (cpu_vs, p99_vs) = match mode.starts_with("changes") {
                true => vs_control(&runs, &n_text, mode, &control, hz, k),
                false => ("-".to_owned(), "-".to_owned()),
            };
            let pg_s: Vec<String> = mine.iter().map(|r| g10(num(&r[10]) / hz)).collect();
            let last_rss = mine.last().map_or(0.0, |r| num(&r[6]));
            let changes = if mode == "none" {
                "0".to_owned()
            } else {
                col(mode, 8)
            };
            println!(
                "| {n} | {} | {:.0} | {:.0} | {:.0} | {mode} | {changes}/s | {rps:.0} | {} | {p99} | {} | {:.0} | {} | {:.2} | {cpu_vs} | {p99_vs} | {:.2} |",
                r[1],
                rss / 1024.0,
                rss * 1024.0 / *n as f64,
                hwm / 1024.0,
                ratio(rps, base, 3),
                ratio(num(&p99), base99, 2),
                last_rss / 1024.0,
                col(mode, 9),
                num(&median(&us)),
                num(&median(&pg_s)),
            );
        }
    }
    println!();
    println!("Every run: {} (links, mode, round, req/s, p50 ms, p99 ms, RSS KiB after the run, changes/s, lag s,", bench.path("links.tsv").display());
    println!("redirector and PostgreSQL CPU ticks over the run);");
    println!(
        "ready times and RSS: {}. 'RSS after the runs' is the last run's.",
        bench.path("links-ready.tsv").display()
    );
}

/// The redirector's CPU per request in a `links.tsv` run, in microseconds.
fn cpu_per_request(run: &[String], hz: f64, k: &crate::knobs::Knobs) -> f64 {
    num(&run[9]) * 1e6 / hz / (num(&run[3]) * k.duration as f64)
}

/// Mode `mode` against `control` at `n` links: the redirector's CPU per request and the p99,
/// each the median of the rounds' ratios.
fn vs_control(
    runs: &[Vec<String>],
    n: &str,
    mode: &str,
    control: &str,
    hz: f64,
    k: &crate::knobs::Knobs,
) -> (String, String) {
    let run = |mode: &str, round: &str| {
        runs.iter()
            .find(|r| r.len() >= 11 && r[0] == n && r[1] == mode && r[2] == round)
    };
    let (mut cpu, mut p99) = (Vec::new(), Vec::new());
    for round in 1..=k.rounds {
        let round = round.to_string();
        if let (Some(a), Some(b)) = (run(mode, &round), run(control, &round)) {
            cpu.push(ratio(
                cpu_per_request(a, hz, k),
                cpu_per_request(b, hz, k),
                3,
            ));
            p99.push(ratio(num(&a[5]), num(&b[5]), 3));
        }
    }
    (median(&cpu), median(&p99))
}

/// CPU ticks and context switches of the redirector and of the cluster's live processes.
fn follow_now(bench: &Bench, redirector: i32) -> [u64; 4] {
    let pm = bench.postmaster;
    [
        ticks(redirector),
        switches(redirector),
        pg_ticks(pm),
        pg_switches(pm),
    ]
}

/// At the last of LINK_COUNTS, no HTTP load: DURATION seconds of CHANGE_RATE changes a second
/// to links (changes) or to links_control (control), for the current redirector and, with
/// BASELINE, the baseline's on the same database, interleaved; what following costs is the
/// changes' figures minus the control's.
pub(crate) async fn bench_links_follow(bench: &mut Bench) -> Res<()> {
    let k = bench.knobs.clone();
    let n = *k.link_counts.last().ok_or("LINK_COUNTS is empty")?;
    let variants = match k.baseline {
        Some(_) => vec![Variant::Baseline, Variant::Current],
        None => vec![Variant::Current],
    };
    load_links(bench, n).await?;
    std::fs::write(bench.path("links-follow.tsv"), "")?;
    for round in 1..=k.rounds {
        for variant in rotated(round as usize, &variants) {
            let (redirector, _) = start(bench, variant).await?;
            for mode in rotated(round as usize, &["control", "changes"]) {
                log(&format!("follow round {round}, {}: {mode}", variant.name()));
                let changer = pgbench(
                    bench,
                    k.change_rate,
                    k.duration + 2,
                    Changes {
                        control: mode == "control",
                        one_txn: false,
                    },
                    n,
                    "pgbench-follow.log",
                )?;
                // pgbench's session is up.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let before = follow_now(bench, redirector.pid());
                tokio::time::sleep(Duration::from_secs(k.duration)).await;
                let after = follow_now(bench, redirector.pid());
                let mut row = vec![
                    variant.name().to_owned(),
                    mode.to_owned(),
                    round.to_string(),
                ];
                row.extend((0..4).map(|i| after[i].saturating_sub(before[i]).to_string()));
                append(&bench.path("links-follow.tsv"), &row)?;
                finish_pgbench(bench, changer, "pgbench-follow.log").await?;
            }
            redirector.stop().await;
        }
    }
    println!(
        "{n} links, no HTTP load: {} s of {} changes a second to links (changes) or to",
        k.duration, k.change_rate
    );
    println!(
        "links_control (control, which no redirector follows); CPU seconds and context switches"
    );
    println!("per run, medians of {} interleaved rounds.", k.rounds);
    println!();
    println!("| redirector | changes | redirector CPU s | redirector switches | PostgreSQL CPU s | PostgreSQL switches |");
    println!("|---|---|---|---|---|---|");
    let runs = rows(&bench.path("links-follow.tsv"));
    let hz = clk_tck();
    for variant in &variants {
        for mode in ["control", "changes"] {
            let cells: Vec<String> = (4..=7)
                .map(|f| {
                    let values = column(&runs, &[variant.name(), mode], f);
                    let scaled: Vec<String> = match f {
                        4 | 6 => values.iter().map(|v| g10(num(v) / hz)).collect(),
                        _ => values,
                    };
                    median(&scaled)
                })
                .collect();
            println!("| {} | {mode} | {} |", variant.name(), cells.join(" | "));
        }
    }
    println!();
    println!("Every run: {} (variant, mode, round, redirector ticks, switches, PostgreSQL ticks, switches).", bench.path("links-follow.tsv").display());
    Ok(())
}

/// SOAK seconds of SOAK_RATE changes a second at the first of LINK_COUNTS, the redirector's
/// RSS sampled every 10 s into links-soak.tsv.
pub(crate) async fn bench_links_soak(bench: &mut Bench) -> Res<()> {
    let k = bench.knobs.clone();
    let n = *k.link_counts.first().ok_or("LINK_COUNTS is empty")?;
    load_links(bench, n).await?;
    let (redirector, _) = start(bench, Variant::Current).await?;
    let tsv = bench.path("links-soak.tsv");
    std::fs::write(&tsv, "")?;
    let t0 = Instant::now();
    let changes = Changes {
        control: false,
        one_txn: false,
    };
    let mut changer = pgbench(bench, k.soak_rate, k.soak, changes, n, "pgbench-soak.log")?;
    let admin = addr(REDIRECTOR_ADMIN);
    let mut samples: Vec<[f64; 4]> = Vec::new();
    while !changer.exited() {
        let sample = [
            t0.elapsed().as_secs() as f64,
            memory_kib(redirector.pid(), "VmRSS") as f64,
            metric(admin, "redirector_link_changes_applied_total").await?,
            metric(admin, "redirector_links").await?,
        ];
        append(&tsv, &sample.map(g10))?;
        if samples.len() % 6 == 0 {
            log(&format!("soak: {}", sample.map(g10).join(" ")));
        }
        samples.push(sample);
        for _ in 0..100 {
            if changer.exited() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    finish_pgbench(bench, changer, "pgbench-soak.log").await?;
    redirector.stop().await;
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Err("links-soak: no sample taken".into());
    };
    let rss = samples.iter().map(|s| s[1]);
    let (min, max) = (
        rss.clone().fold(f64::INFINITY, f64::min),
        rss.fold(0.0, f64::max),
    );
    let line = format!(
        "| {n} | {:.0}/s | {:.0} s | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
        pgbench_rate(bench, "pgbench-soak.log"),
        last[0],
        last[2],
        first[1] / 1024.0,
        min / 1024.0,
        max / 1024.0,
        last[1] / 1024.0,
        ratio(max, first[1], 2)
    );
    std::fs::write(bench.path("links-soak.md"), format!("{line}\n"))?;
    println!("| links | changes | run | changes applied | RSS first MiB | min | max | last | max / first |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!("{line}");
    println!();
    println!(
        "Every sample (seconds, RSS KiB, changes applied, links): {}.",
        tsv.display()
    );
    Ok(())
}
