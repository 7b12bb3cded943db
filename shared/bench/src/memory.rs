//! `memory`: the collector's peak memory under DISTINCT distinct 64-byte codes, each clicked
//! once and sent as fast as the collector takes them (what millions of links under even
//! traffic do within minutes), beside the bound its sums are held to; the totals checked exact.

use std::time::{Duration, Instant};

use crate::cluster::number;
use crate::ingest::reset_tables;
use crate::procfs::{memory_kib, Cpu};
use crate::redirect::{start_collector, Written};
use crate::services::metric;
use crate::table::{append, column, median, num, rotated, rows};
use crate::{addr, log, Bench, Res, Variant, COLLECTOR_ADMIN};

/// The flag that bounds the sums' memory; a collector without it (a BASELINE from before) has
/// no bound.
const FLAG: &str = "--compact-memory";
/// How long a run waits, once its clicks are written, for them to be folded.
const FOLD_WAIT: Duration = Duration::from_secs(300);

pub(crate) async fn bench_memory(bench: &mut Bench) -> Res<()> {
    std::fs::write(bench.path("memory.tsv"), "")?;
    let mut variants = vec![Variant::Current];
    if bench.knobs.baseline.is_some() {
        variants.push(Variant::Baseline);
    }
    for round in 1..=bench.knobs.rounds {
        for variant in rotated(round as usize, &variants) {
            reset_tables(bench, variant).await?;
            log(&format!(
                "memory round {round}: {} distinct codes into the collector ({})",
                bench.knobs.distinct,
                variant.name()
            ));
            once(bench, variant, round).await?;
            // The next run starts from empty tables; what this one wrote is only in the way.
            reset_tables(bench, variant).await?;
        }
    }
    print(bench, &variants);
    Ok(())
}

/// One run: the flood, until written and folded; the collector's peak RSS (VmHWM) and its RSS
/// at the end, its bound, its folds and the sums it dropped, how long the last fold took to
/// come, CPU per click, and whether the totals came out exact. Appends its row to
/// $OUT/memory.tsv.
async fn once(bench: &mut Bench, variant: Variant, round: u32) -> Res<()> {
    let n = bench.knobs.distinct;
    let collector = start_collector(bench, variant, &[]).await?;
    let bound = bound(bench, variant);
    let written = Written::now(variant).await?;
    let admin = addr(COLLECTOR_ADMIN);
    let dropped0 = metric(admin, "collector_unfolded_dropped_total").await.ok();
    let cpu0 = Cpu::now(None, Some(collector.pid()), bench.postmaster);
    let t0 = Instant::now();
    let socket = bench.path("collector.sock");
    let sender = testkit::XorShift::from_clock("memory sender").next_u64() >> 1;
    let sent =
        tokio::task::spawn_blocking(move || testkit::flood::send_distinct(&socket, sender, 0..n))
            .await?;
    let send_s = t0.elapsed().as_secs_f64();
    let what = format!("{sent} clicks written");
    let log_path = bench.path("collector.log");
    crate::services::until(Duration::from_secs(900), &what, &log_path, || async {
        metric(admin, "collector_clicks_written_total")
            .await
            .is_ok_and(|w| w - written.clicks >= sent as f64)
    })
    .await?;
    // Folded, or not within FOLD_WAIT: a collector that cannot fold what it holds in one
    // maintenance round (its deadline is --write-timeout) retries it for ever, and that is a
    // finding, not a failed run; click_totals is exact either way.
    let f0 = Instant::now();
    let folded = loop {
        if written.folded(bench).await {
            break format!("{:.0}", f0.elapsed().as_secs_f64());
        }
        if f0.elapsed() > FOLD_WAIT {
            log(&format!(
                "{}: the run's counts not folded within {FOLD_WAIT:?}",
                variant.name()
            ));
            break format!("not within {}", FOLD_WAIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let [_, col_us, pg_us] =
        Cpu::now(None, Some(collector.pid()), bench.postmaster).per_click(&cpu0, sent);
    let hwm = memory_kib(collector.pid(), "VmHWM");
    let rss = memory_kib(collector.pid(), "VmRSS");
    let folds = metric(admin, "collector_compactions_total").await? - written.compactions;
    let dropped = match (
        dropped0,
        metric(admin, "collector_unfolded_dropped_total").await,
    ) {
        (Some(before), Ok(after)) => format!("{:.0}", after - before),
        _ => "-".to_owned(),
    };
    collector.stop().await;
    let exact = exact(bench, variant, sent).await?;
    if !exact {
        bench.mismatch(&format!(
            "mode memory: the totals of {sent} clicks are not exact"
        ));
    }
    let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
    let row = [
        variant.name().to_owned(),
        round.to_string(),
        sent.to_string(),
        format!("{:.0}", sent as f64 / send_s),
        mib(hwm),
        mib(rss),
        bound,
        format!("{folds:.0}"),
        dropped,
        col_us,
        pg_us,
        if exact { "yes" } else { "NO" }.to_owned(),
        folded,
    ];
    append(&bench.path("memory.tsv"), &row)
}

/// The variant's bound on its sums, as its `--help` or COLLECTOR_FLAGS give it: `none` for a
/// collector without the flag.
fn bound(bench: &Bench, variant: Variant) -> String {
    let flags = &bench.knobs.collector_flags;
    if let Some(i) = flags.iter().position(|f| f == FLAG) {
        return flags.get(i + 1).cloned().unwrap_or_default();
    }
    let help = std::process::Command::new(bench.bin(variant, "collector"))
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let Some(at) = help.find(FLAG) else {
        return "none".to_owned();
    };
    help[at..]
        .split("[default: ")
        .nth(1)
        .and_then(|d| d.split(']').next())
        .map_or_else(|| "?".to_owned(), str::to_owned)
}

/// Whether every click is a row and the totals count each code once: `sent` rows in clicks,
/// and as many keys in click_totals, each of one click.
async fn exact(bench: &Bench, variant: Variant, sent: u64) -> Res<bool> {
    let client = bench.client(variant).await?;
    let rows = number(&client, "SELECT count(*) FROM clicks").await?;
    let keys = number(&client, "SELECT count(*) FROM click_totals").await?;
    let clicks = number(
        &client,
        "SELECT coalesce(sum(clicks), 0)::int8 FROM click_totals",
    )
    .await?;
    let most = number(
        &client,
        "SELECT coalesce(max(clicks), 0)::int8 FROM click_totals",
    )
    .await?;
    let sent = sent as i64;
    let exact = rows == sent && keys == sent && clicks == sent && most == 1;
    if !exact {
        log(&format!(
            "NOT EXACT: {sent} clicks sent, {rows} rows in clicks, {keys} keys in click_totals \
             adding up to {clicks}, the most for one key {most}"
        ));
    }
    Ok(exact)
}

fn print(bench: &Bench, variants: &[Variant]) {
    println!("| collector | distinct codes | sent/s | peak RSS (VmHWM) MiB | RSS at the end MiB | bound on the sums | folds | sums dropped | all folded after s | CPU us per click: collector / PostgreSQL | totals exact |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let all = rows(&bench.path("memory.tsv"));
    for variant in variants {
        let c = |f| median(&column(&all, &[variant.name()], f));
        let exact = column(&all, &[variant.name()], 12);
        let exact = if exact.iter().all(|e| e == "yes") {
            "yes, every run".to_owned()
        } else {
            format!(
                "NO ({} of {})",
                exact.iter().filter(|e| *e != "yes").count(),
                exact.len()
            )
        };
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} / {} | {exact} |",
            variant.name(),
            c(3),
            num(&c(4)),
            c(5),
            c(6),
            c(7),
            c(8),
            c(9),
            c(13),
            c(10),
            c(11),
        );
    }
    println!();
    println!(
        "{} distinct 64-byte codes a run, each clicked once, sent as fast as the collector takes \
         them; medians of {} rounds, every run in {}. Peak RSS is the collector's VmHWM over the \
         run, until its counts are folded (or {} s after the last is written).",
        bench.knobs.distinct,
        bench.knobs.rounds,
        bench.path("memory.tsv").display(),
        FOLD_WAIT.as_secs()
    );
}
