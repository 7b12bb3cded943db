//! `hosts`: aggregate ingest into one database from 1, 2 and 4 collectors, each fed its share
//! of CLICKS by its own clicktap sender, all at once.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cluster::{column, settle, with_room_for_wal};
use crate::ingest::reset_tables;
use crate::procfs::{clk_tck, pg_ticks, ticks};
use crate::redirect::MIXES;
use crate::services::{await_healthy, has_flag, metric, until, Proc};
use crate::table::{append, median, num, ratio, rotated, rows};
use crate::{log, Bench, Res, Variant};

/// Collectors per run.
const COUNTS: [usize; 3] = [1, 2, 4];

fn admin(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 19200 + i as u16))
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Starts collector `i` of `k` (instance bench`i`, its own socket, admin port and log).
async fn start_host(bench: &Bench, variant: Variant, i: usize) -> Res<Proc> {
    let mut cmd = Command::new(bench.bin(variant, "collector"));
    cmd.args(["--database-url", &bench.url(variant)])
        .arg("--socket")
        .arg(bench.path(&format!("host{i}.sock")))
        .args([
            "--admin-listen",
            &admin(i).to_string(),
            "--instance",
            &format!("bench{i}"),
        ])
        .args(&bench.knobs.collector_flags);
    let log = bench.path(&format!("host{i}.log"));
    let proc = Proc::spawn(&format!("host{i}"), cmd, &log)?;
    await_healthy(admin(i), &format!("host{i}"), &log).await?;
    Ok(proc)
}

/// k collectors of `variant` at once, each fed CLICKS/k clicks at full speed. Appends to
/// $OUT/hosts.tsv: variant, mix, k, round, aggregate rows/s, slowest and fastest collector's
/// rows/s, CPU us per click of the collectors (summed) and of PostgreSQL.
async fn once(bench: &Bench, variant: Variant, mix: &str, k: usize, round: u32) -> Res<()> {
    if !has_flag(&bench.bin(variant, "collector"), "--instance") {
        return Err(format!("hosts: {}'s collector has no --instance", variant.name()).into());
    }
    let share = bench.knobs.clicks / k as u64;
    let mut collectors = Vec::new();
    for i in 1..=k {
        collectors.push(start_host(bench, variant, i).await?);
    }
    let pids: Vec<i32> = collectors.iter().map(Proc::pid).collect();
    let rows0 = crate::redirect::rows_now(bench, variant).await?;
    let cpu0: u64 = pids.iter().map(|&p| ticks(p)).sum();
    let pg0 = pg_ticks(bench.postmaster);
    let t0 = epoch_now();
    let mut senders = Vec::new();
    for i in 1..=k {
        let mut cmd = Command::new(bench.bin(variant, "clicktap"));
        cmd.arg("send")
            .arg("--socket")
            .arg(bench.path(&format!("host{i}.sock")))
            .arg("--code-file")
            .arg(bench.path(&format!("codes-{mix}.txt")))
            .args(["--count", &share.to_string(), "--batch", "1250"]);
        senders.push(Proc::spawn(
            "clicktap send",
            cmd,
            &bench.path("clicktap.log"),
        )?);
    }
    // Nothing is asked of the collectors while the senders run: polling their metrics takes
    // CPU from the run. The times come from the commits, read below.
    for sender in senders {
        tokio::time::timeout(Duration::from_secs(300), sender.finish())
            .await
            .map_err(|_| "a clicktap sender did not end within 300 s")??;
    }
    for i in 1..=k {
        let what = format!("{share} clicks written by host{i}");
        let log = bench.path(&format!("host{i}.log"));
        until(Duration::from_secs(60), &what, &log, || async {
            metric(admin(i), "collector_clicks_written_total")
                .await
                .is_ok_and(|w| w >= share as f64)
        })
        .await?;
    }
    let cpu_collectors = pids
        .iter()
        .map(|&p| ticks(p))
        .sum::<u64>()
        .saturating_sub(cpu0);
    let cpu_pg = pg_ticks(bench.postmaster).saturating_sub(pg0);
    for c in collectors {
        c.stop().await;
    }
    // When each collector committed its last batch (the commit timestamp of its
    // click_writers row's last version), rather than when polling saw it done.
    let sql = format!(
        "SELECT extract(epoch FROM max(pg_xact_commit_timestamp(xmin)))::text FROM click_writers \
         WHERE instance LIKE 'bench%' AND updated_at >= to_timestamp({t0}) GROUP BY instance"
    );
    let done: Vec<f64> = column(&bench.client(variant).await?, &sql)
        .await?
        .iter()
        .filter_map(|t| t.parse().ok())
        .collect();
    if done.len() != k {
        return Err(format!(
            "hosts: {} of {k} collectors recorded their last batch",
            done.len()
        )
        .into());
    }
    let mode = format!("hosts ({}, {k} hosts, {mix})", variant.name());
    crate::redirect::check_recorded(bench, variant, &mode, share * k as u64, 0, rows0).await?;
    let times: Vec<f64> = done.iter().map(|d| d - t0).collect();
    let last = times.iter().copied().fold(0.0, f64::max);
    let rates: Vec<f64> = times.iter().map(|t| share as f64 / t).collect();
    let slow = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let fast = rates.iter().copied().fold(0.0, f64::max);
    let us = 1e6 / clk_tck() / (share * k as u64) as f64;
    let row = [
        variant.name().to_owned(),
        mix.to_owned(),
        k.to_string(),
        round.to_string(),
        format!("{:.0}", (share * k as u64) as f64 / last),
        format!("{slow:.0}"),
        format!("{fast:.0}"),
        format!("{:.3}", cpu_collectors as f64 * us),
        format!("{:.3}", cpu_pg as f64 * us),
    ];
    append(&bench.path("hosts.tsv"), &row)
}

pub(crate) async fn bench_hosts(bench: &mut Bench) -> Res<()> {
    std::fs::write(bench.path("hosts.tsv"), "")?;
    let mut variants = vec![Variant::Current];
    if bench.knobs.baseline.is_some() {
        variants.push(Variant::Baseline);
    }
    let admin_db = bench.cluster.connect("postgres").await?;
    let runs = async {
        for round in 1..=bench.knobs.rounds {
            for mix in MIXES {
                for k in rotated(round as usize, &COUNTS) {
                    // The variants take turns going first, round by round, in every cell alike.
                    for variant in rotated(round as usize - 1, &variants) {
                        reset_tables(bench, variant).await?;
                        settle(&admin_db, &bench.path("postgres.log")).await?;
                        log(&format!(
                            "hosts round {round}, {mix} codes: {k} collectors of {}",
                            variant.name()
                        ));
                        once(bench, variant, mix, k, round).await?;
                    }
                }
            }
        }
        Ok(())
    };
    with_room_for_wal(&admin_db, runs).await?;
    print_table(bench, &variants);
    Ok(())
}

fn print_table(bench: &Bench, variants: &[Variant]) {
    println!("| variant | codes | collectors | aggregate rows/s | vs 1 collector | slowest collector rows/s | fastest collector rows/s | CPU us per click: collectors | PostgreSQL |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let rows = rows(&bench.path("hosts.tsv"));
    for variant in variants {
        for mix in MIXES {
            let col = |k: usize, f| {
                let key = [variant.name(), mix, &k.to_string()];
                num(&median(&crate::table::column(&rows, &key, f)))
            };
            let base = col(1, 5);
            for k in COUNTS {
                let agg = col(k, 5);
                println!(
                    "| {} | {mix} | {k} | {agg:.0} | {} | {:.0} | {:.0} | {:.3} | {:.3} |",
                    variant.name(),
                    ratio(agg, base, 2),
                    col(k, 6),
                    col(k, 7),
                    col(k, 8),
                    col(k, 9)
                );
            }
        }
    }
    let k = &bench.knobs;
    println!();
    println!(
        "{} clicks per run split evenly over the collectors, each fed by its own clicktap sender;",
        k.clicks
    );
    println!(
        "aggregate = all clicks / time until the last collector wrote its share; a collector's"
    );
    println!(
        "rate = its share / the time it took. Medians of {} interleaved rounds; every run: {}",
        k.rounds,
        bench.path("hosts.tsv").display()
    );
    println!("(variant, codes, collectors, round, aggregate, slowest, fastest, CPU us per click of the collectors, of PostgreSQL).");
}
