//! The real collector binary against real sockets and the private PostgreSQL.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::time::Instant;

use nix::sys::signal::Signal;
use protocol::wire::{Encoder, DEFAULT_DATAGRAM};
use shared::socket::SendErrorKind;
use testkit::collector::*;
use testkit::eventually;
use testkit::pgtest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_clicks_land_exactly_with_totals() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "3s"]).await;
    // ~0.6 s apart: 100,000 clicks span 17 hours, across a UTC midnight.
    let sent = clicks(100_000, 997, start_us(), 600_011);
    let grams = datagrams(0xfeed, &sent);
    let started = Instant::now();
    send_all(&p.path, grams.clone()).await;
    await_rows(&p.client, None, 100_000).await;
    let took = started.elapsed();
    let expected = expected_totals(&sent);
    assert_eq!(totals(&p.client, "click_totals").await, expected);
    eprintln!(
        "100,000 clicks in {} datagrams written in {took:?} ({:.0} clicks/s, debug build)",
        grams.len(),
        100_000.0 / took.as_secs_f64()
    );
    let mut want = sent.clone();
    want.sort();
    assert_eq!(stored_clicks(&p.client).await, want);
    eventually_counts(&p.client, &expected).await;
    assert_eq!(
        count(
            &p.client,
            "SELECT last_seq FROM click_senders WHERE sender = 65261"
        )
        .await,
        grams.len() as i64 - 1
    );
    c.await_metric("collector_clicks_written_total", 100_000.0)
        .await;
    assert_eq!(c.metric("collector_pending_clicks").await, 0.0);
    assert_eq!(c.metric("collector_datagrams_lost_total").await, 0.0);
    // Each batch went in at its first attempt: a COPY whose stream came out wrong would be
    // refused and its rows sifted in (`store::sift_in`), which lands them all the same.
    assert_eq!(c.metric("collector_db_errors_total").await, 0.0);
    // Counted once the fold's commit returned, a moment after its counts could be read.
    testkit::eventually("the fold counted", LIMIT, || async {
        let folds = c.metric("collector_compaction_seconds_count").await;
        (c.metric("collector_compactions_total").await >= 1.0 && folds >= 1.0).then_some(())
    })
    .await;
    assert_eq!(
        c.metric("collector_batch_seconds_count").await,
        c.metric("collector_batches_total").await
    );
}

/// Waits until click_counts alone (after a compaction) holds `expected`.
async fn eventually_counts(client: &tokio_postgres::Client, expected: &Totals) {
    testkit::eventually("click_counts to match after compaction", LIMIT, || async {
        (totals(client, "click_counts").await == *expected).then_some(())
    })
    .await;
    let pending = "SELECT (SELECT count(*) FROM click_count_deltas)
                        + (SELECT count(*) FROM click_count_batches)
                        + (SELECT count(*) FROM click_count_lists)";
    assert_eq!(count(client, pending).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_exposed_health_says_ready_and_the_mode_is_set() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--socket-mode", "0620"]).await;
    let mode = std::fs::metadata(&p.path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o620);
    let text = c.metrics().await;
    for name in [
        "collector_datagrams_received_total",
        "collector_datagrams_duplicate_total",
        "collector_datagrams_lost_total",
        "collector_clicks_received_total",
        "collector_clicks_written_total",
        "collector_batches_total",
        "collector_batch_seconds_count",
        "collector_commit_lag_seconds_count",
        "collector_db_errors_total",
        "collector_pending_clicks",
        "collector_compactions_total",
        "collector_compaction_seconds_count",
        "collector_deltas_pending",
        "collector_mirror_failed_total",
        "collector_receive_errors_total",
    ] {
        assert!(
            shared::metrics::sample(&text, name).is_some(),
            "{name} missing:\n{text}"
        );
    }
    for reason in protocol::RejectReason::ALL.map(protocol::RejectReason::as_str) {
        let series = format!("collector_datagrams_rejected_total{{reason=\"{reason}\"}}");
        assert_eq!(
            shared::metrics::sample(&text, &series),
            Some(0.0),
            "{series}"
        );
    }
    assert_eq!(c.health().await, 200);
}

/// Datagrams that are wrong in each way the wire format names, plus an empty one and one
/// larger than any valid datagram.
fn garbage() -> Vec<Vec<u8>> {
    let mut enc = Encoder::new(77, DEFAULT_DATAGRAM).unwrap();
    enc.push("abc", start_us()).unwrap();
    let good = enc.datagram().to_vec();
    let mut wrong_version = good.clone();
    wrong_version[0] = 3;
    let mut bad_code = good.clone();
    let at = bad_code.windows(3).position(|w| w == b"abc").unwrap();
    bad_code[at + 1] = b'/';
    let mut trailing = good.clone();
    trailing.push(0);
    // The click's dimensions end the datagram: agent, then no referrer, device nor country.
    assert_eq!(good[good.len() - 4..], [0, 0, 0, 0]);
    let mut bad_dimension = good.clone();
    let agent = bad_dimension.len() - 4;
    bad_dimension[agent] = 9;
    // A fixed xorshift stream, version byte 1 so it gets past the version check.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut random: Vec<u8> = (0..200)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    random[0] = 1;
    vec![
        random,
        wrong_version,
        bad_code,
        trailing,
        bad_dimension,
        Vec::new(),
        vec![1; 70 * 1024],
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_counted_by_reason_writes_nothing_and_later_clicks_land() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let bad = garbage();
    let mut want = std::collections::BTreeMap::<&str, f64>::new();
    for g in &bad[..bad.len() - 1] {
        *want
            .entry(protocol::wire::decode(g).unwrap_err().reason().as_str())
            .or_default() += 1.0;
    }
    // The oversized one is cut by the receive buffer and counted as undecodable.
    *want.entry("undecodable").or_default() += 1.0;
    for reason in [
        "undecodable",
        "wrong_version",
        "bad_code",
        "trailing_bytes",
        "bad_dimension",
    ] {
        assert!(want.contains_key(reason), "the garbage covers {reason}");
    }
    let good = clicks(10, 3, start_us(), 1_000);
    let mut all = bad;
    all.extend(datagrams(5, &good));
    let all_sent = all.len();
    send_all(&p.path, all).await;
    await_rows(&p.client, None, 10).await;
    let mut sorted = good.clone();
    sorted.sort();
    assert_eq!(stored_clicks(&p.client).await, sorted);
    for (reason, n) in &want {
        let series = format!("collector_datagrams_rejected_total{{reason=\"{reason}\"}}");
        assert_eq!(c.metric(&series).await, *n, "{series}");
    }
    assert_eq!(
        count(&p.client, "SELECT count(*) FROM click_senders").await,
        1
    );
    assert_eq!(
        c.metric("collector_datagrams_received_total").await,
        all_sent as f64
    );
    assert!(c
        .service
        .log()
        .iter()
        .any(|l| l.contains("rejected a datagram")));
    assert_eq!(c.health().await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datagram_sent_twice_is_written_once_even_across_a_restart() {
    let p = place().await;
    let sent = clicks(6_000, 50, start_us(), 10);
    let grams = datagrams(42, &sent);
    assert!(
        grams.len() >= 3,
        "need three datagrams, got {}",
        grams.len()
    );
    let per = |i: usize| protocol::wire::decode(&grams[i]).unwrap().clicks.len() as u64;

    let mut c = start_collector(&p.db, &p.path, &[]).await;
    send_all(
        &p.path,
        vec![grams[0].clone(), grams[0].clone(), grams[1].clone()],
    )
    .await;
    await_rows(&p.client, None, per(0) + per(1)).await;
    assert_eq!(c.metric("collector_datagrams_duplicate_total").await, 1.0);
    c.service.signal(Signal::SIGTERM);
    assert!(c.service.wait_exit(LIMIT).await.success());

    // A new process knows the committed seq from click_senders.
    let c = start_collector(&p.db, &p.path, &[]).await;
    send_all(&p.path, vec![grams[1].clone(), grams[2].clone()]).await;
    await_rows(&p.client, None, per(0) + per(1) + per(2)).await;
    assert_eq!(c.metric("collector_datagrams_duplicate_total").await, 1.0);
    assert_eq!(c.metric("collector_datagrams_lost_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_a_burst_writes_every_click_and_exits_0() {
    let p = place().await;
    // Long interval and big batches: the burst is still pending when the signal comes.
    let mut c = start_collector(
        &p.db,
        &p.path,
        &["--flush-interval", "1h", "--batch-rows", "1000000"],
    )
    .await;
    let sent = clicks(30_000, 100, start_us(), 7);
    let grams = datagrams(9, &sent);
    assert!(grams.len() >= 12, "{} datagrams", grams.len());
    let (taken, queued) = grams.split_at(grams.len() - 8);
    let sock = connect(&p.path);
    for d in taken {
        sock.send(d).unwrap();
    }
    c.await_metric("collector_datagrams_received_total", taken.len() as f64)
        .await;
    // Stopped, the collector reads nothing: the rest of the burst waits in the socket's queue
    // (8 datagrams fit) when SIGTERM is handled.
    c.service.signal(Signal::SIGSTOP);
    for d in queued {
        sock.send(d).unwrap();
    }
    c.service.signal(Signal::SIGTERM);
    c.service.signal(Signal::SIGCONT);
    let status = c.service.wait_exit(LIMIT).await;
    assert!(status.success(), "{status}");
    assert_eq!(
        count(&p.client, "SELECT count(*) FROM clicks").await,
        30_000
    );
    let log = c.service.log();
    assert!(
        log.iter()
            .any(|l| l.contains("collector: 30000 clicks written")),
        "{log:#?}"
    );
    assert!(log
        .iter()
        .any(|l| l.contains("datagrams still queued at stop")));
    // The fence: the p.path is gone and the connected sender is refused, keeping its datagram.
    assert!(!p.path.exists());
    let err = sock.send(&grams[0]).unwrap_err();
    assert!(SendErrorKind::of(&err).receiver_away(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_collector_of_the_instance_waits_until_the_first_has_written_and_exited() {
    let p = place().await;
    let a = ["--instance", "host-a"];
    let mut first = start_collector(&p.db, &p.path, &[a[0], a[1], "--flush-interval", "1h"]).await;
    let (_second_dir, second_path) = socket_path();
    let second = Collector::spawn(command(&p.db, &second_path, &a)).await;
    second
        .service
        .wait_for_log("waiting for the lock of instance \"host-a\"", LIMIT)
        .await;
    // Another instance on the same database does not wait for either.
    let (_other_dir, other_path) = socket_path();
    let other = start_collector(&p.db, &other_path, &["--instance", "host-b"]).await;
    send_all(&other_path, datagrams(62, &clicks(10, 5, start_us(), 1))).await;
    await_rows(&p.client, None, 10).await;

    // Pending in the first one (the batch is not due) when it is told to stop.
    let sent = clicks(5_000, 50, start_us(), 11);
    let grams = datagrams(61, &sent);
    send_all(&p.path, grams.clone()).await;
    first
        .await_metric("collector_datagrams_received_total", grams.len() as f64)
        .await;
    let (status, body) = testkit::http::get(second.admin, "/healthz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(!second_path.exists(), "no socket while it waits");
    let lock_waiting = "collector_instance_lock_waiting";
    assert_eq!(second.metric(lock_waiting).await, 1.0, "waiting shown");
    assert_eq!(other.metric(lock_waiting).await, 0.0);
    first.service.signal(Signal::SIGTERM);
    assert!(first.service.wait_exit(LIMIT).await.success());

    // Only now, and knowing the senders the others committed.
    second.ready().await;
    second
        .service
        .wait_for_log("ready: instance \"host-a\", 2 known senders", LIMIT)
        .await;
    assert_eq!(second.metric(lock_waiting).await, 0.0, "the wait is over");
    let mut want = sent.clone();
    want.extend(clicks(10, 5, start_us(), 1));
    want.sort();
    assert_eq!(stored_clicks(&p.client).await, want, "every click once");
    other
        .await_metric("collector_clicks_written_total", 10.0)
        .await;
    let writers = "SELECT string_agg(DISTINCT instance, ' ' ORDER BY instance) FROM click_writers";
    let writers: String = p.client.query_one(writers, &[]).await.unwrap().get(0);
    assert_eq!(
        writers, "host-a host-b",
        "click_writers names the instances"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_file_from_a_killed_collector_does_not_stop_the_next_start() {
    let p = place().await;
    let mut c = start_collector(&p.db, &p.path, &[]).await;
    c.service.signal(Signal::SIGKILL);
    c.service.wait_exit(LIMIT).await;
    assert!(p.path.exists(), "a killed collector leaves its socket file");
    let err = UnixDatagram::unbound()
        .unwrap()
        .send_to(b"x", &p.path)
        .unwrap_err();
    assert_eq!(SendErrorKind::of(&err), SendErrorKind::Refused);

    let _c = start_collector(&p.db, &p.path, &[]).await;
    send_all(&p.path, datagrams(1, &clicks(5, 5, start_us(), 1))).await;
    await_rows(&p.client, None, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_collector_is_not_replaced_and_a_plain_file_is_not_removed() {
    let p = place().await;
    let _live = start_collector(&p.db, &p.path, &[]).await;
    // Another instance: one of the same would wait for the live one's lock before binding.
    let other = ["--instance", "another-host"];
    let out = command(&p.db, &p.path, &other).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{out:?}"
    );

    let file = p.path.with_file_name("plain");
    std::fs::write(&file, "keep").unwrap();
    let out = command(&p.db, &file, &other).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a socket"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_forwards_every_datagram_unchanged_and_counts_what_it_cannot() {
    let p = place().await;
    let tap_path = p.dir.path().join("tap.sock");
    let tap = UnixDatagram::bind(&tap_path).unwrap();
    tap.set_read_timeout(Some(LIMIT)).unwrap();
    let c = start_collector(&p.db, &p.path, &["--mirror", tap_path.to_str().unwrap()]).await;
    let mut grams = datagrams(3, &clicks(2_000, 10, start_us(), 1));
    grams.insert(1, b"not a datagram".to_vec());
    send_all(&p.path, grams.clone()).await;
    let mut buf = vec![0; 65_536];
    for (i, want) in grams.iter().enumerate() {
        let n = tap.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &want[..], "datagram {i}");
    }
    await_rows(&p.client, None, 2_000).await;
    let forwarded = grams.len() as f64;
    assert_eq!(c.metric("collector_mirror_sent_total").await, forwarded);
    assert_eq!(c.metric("collector_mirror_failed_total").await, 0.0);

    // Nobody listening on the tap: counted as failed, not as sent, and the clicks still land.
    drop(tap);
    std::fs::remove_file(&tap_path).unwrap();
    send_all(&p.path, datagrams(4, &clicks(10, 2, start_us(), 1))).await;
    await_rows(&p.client, None, 2_010).await;
    assert_eq!(c.metric("collector_mirror_failed_total").await, 1.0);
    assert_eq!(c.metric("collector_mirror_sent_total").await, forwarded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_subcommand_applies_the_schema_and_exits() {
    let db = pgtest::cluster().fresh_database().await;
    let status = std::process::Command::new(testkit::binary("collector"))
        .args(["migrate", "--database-url", &db.url])
        .status()
        .unwrap();
    assert!(status.success());
    let client = pgtest::connect(&db.url).await;
    assert_eq!(
        count(&client, "SELECT max(version)::int8 FROM schema_migrations").await,
        schema::LATEST as i64
    );
}

/// On a server older than `schema::OLDEST_SERVER`, the service says so (and keeps trying, for
/// an upgrade) and `collector migrate` exits with it, before anything else a session sets up
/// can fail first; on a supported server both go on. `cargo test` has a supported server;
/// `scripts/test-server-versions` runs this on older ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_older_than_the_oldest_supported_is_refused_by_name_and_no_other() {
    let db = pgtest::cluster().fresh_database().await;
    let version = schema::server_version(&pgtest::connect(&db.url).await)
        .await
        .unwrap();
    let (_dir, path) = socket_path();
    let c = Collector::spawn(command(&db, &path, &[])).await;
    let migrate = std::process::Command::new(testkit::binary("collector"))
        .args(["migrate", "--database-url", &db.url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&migrate.stderr);
    if version < schema::OLDEST_SERVER {
        let line = c.service.wait_for_log("pg_upgrade", LIMIT).await;
        let oldest = format!("older than {}", schema::OLDEST_SERVER / 10_000);
        assert!(line.contains(&oldest), "{line}");
        assert!(!migrate.status.success(), "migrate refused: {said}");
        assert!(
            said.contains(&oldest) && said.contains("pg_upgrade"),
            "{said}"
        );
        assert_eq!(c.health().await, 503, "not ready on a server it refuses");
    } else {
        c.ready().await;
        assert!(migrate.status.success(), "{said}");
        assert!(!c.service.log().iter().any(|l| l.contains("pg_upgrade")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_url_is_a_usage_error() {
    let out = std::process::Command::new(testkit::binary("collector"))
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database-url"));
}

/// A runtime worker count tokio would panic on is refused with its reason, not a panic.
#[test]
fn a_worker_thread_count_that_is_no_count_is_refused_at_start() {
    testkit::assert_bad_worker_threads_refused("collector");
}

/// A connection string naming no host (libpq would take its default socket) is refused at
/// start rather than waited on as a database that is down, and the reason reaches stderr even
/// with `RUST_LOG=off`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_url_naming_no_host_is_refused_at_start_even_with_logging_off() {
    let mut cmd = std::process::Command::new(testkit::binary("collector"));
    cmd.env("RUST_LOG", "off")
        .args(["--database-url", "dbname=clicks user=clicks-collector"]);
    let mut collector = testkit::Service::spawn("collector", cmd);
    assert_eq!(collector.wait_exit(LIMIT).await.code(), Some(1));
    let log = collector.log();
    assert!(log.iter().any(|l| l.contains("names no host")), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_the_database_unhealthy_and_unbound_until_it_is_there() {
    let cluster = pgtest::cluster();
    let name = format!("later_{}", std::process::id());
    let db = pgtest::TestDb {
        url: cluster.url(&name),
        name: name.clone(),
    };
    let (_dir, path) = socket_path();
    let c = Collector::spawn(command(&db, &path, &[])).await;
    c.service.wait_for_log("database not ready", LIMIT).await;
    let (status, body) = testkit::http::get(c.admin, "/healthz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(!path.exists(), "no socket before the database is reached");

    let admin = cluster.connect("postgres").await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    c.ready().await;
    assert!(path.exists());
    send_all(&path, datagrams(2, &clicks(3, 3, start_us(), 1))).await;
    await_rows(&pgtest::connect(&db.url).await, None, 3).await;
    assert!(c.metric("collector_db_errors_total").await >= 1.0);
}

/// One datagram of `sender` at `seq` with a single click.
fn datagram_at(sender: u64, seq: u64, at_us: i64) -> Vec<u8> {
    let mut enc = Encoder::new(sender, DEFAULT_DATAGRAM).unwrap();
    for _ in 0..seq {
        enc.next();
    }
    enc.push("gap", at_us).unwrap();
    enc.datagram().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_in_a_senders_seq_are_counted_as_lost_and_logged() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    // Sender 1: 0 then 3 (1 and 2 lost). Sender 2 first seen at seq 4 (0 to 3 lost).
    let grams = vec![
        datagram_at(1, 0, start_us()),
        datagram_at(1, 3, start_us() + 1),
        datagram_at(2, 4, start_us() + 2),
    ];
    send_all(&p.path, grams).await;
    await_rows(&p.client, None, 3).await;
    assert_eq!(c.metric("collector_datagrams_lost_total").await, 6.0);
    c.service.wait_for_log("datagrams lost", LIMIT).await;
    assert_eq!(
        count(&p.client, "SELECT sum(last_seq)::int8 FROM click_senders").await,
        7
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_prunes_sender_and_writer_rows_idle_for_thirty_days() {
    let p = place().await;
    p.client
        .batch_execute(
            "INSERT INTO click_senders VALUES (1, 10, now() - interval '31 days'),
                                              (2, 20, now() - interval '29 days');
             INSERT INTO click_writers VALUES (3, 5, now() - interval '31 days'),
                                              (4, 6, now());",
        )
        .await
        .unwrap();
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "100ms"]).await;
    let remaining = "SELECT (SELECT count(*) FROM click_senders WHERE sender = 1)
                          + (SELECT count(*) FROM click_writers WHERE writer = 3)";
    testkit::eventually("the idle rows pruned", LIMIT, || async {
        (count(&p.client, remaining).await == 0).then_some(())
    })
    .await;
    let kept = "SELECT (SELECT count(*) FROM click_senders WHERE sender = 2)
                     + (SELECT count(*) FROM click_writers WHERE writer = 4)";
    assert_eq!(count(&p.client, kept).await, 2, "rows in use are kept");
    send_all(&p.path, datagrams(9, &clicks(10, 2, start_us(), 1_000))).await;
    await_rows(&p.client, None, 10).await;
    c.await_metric("collector_clicks_written_total", 10.0).await;
}

/// The commit lag is each click's commit time minus its click time: clicks stamped 1.5 s ago
/// land in the (1 s, 2.5 s] bucket, every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_lag_is_measured_per_click_from_its_click_time() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let stamped = protocol::now_us() - 1_500_000;
    send_all(&p.path, datagrams(8, &clicks(3_000, 10, stamped, 1))).await;
    await_rows(&p.client, None, 3_000).await;
    c.await_metric("collector_commit_lag_seconds_count", 3_000.0)
        .await;
    let bucket = |le: &str| format!("collector_commit_lag_seconds_bucket{{le=\"{le}\"}}");
    assert_eq!(c.metric(&bucket("1")).await, 0.0);
    assert_eq!(c.metric(&bucket("2.5")).await, 3_000.0);
    assert!(c.metric("collector_commit_lag_seconds_sum").await >= 4_500.0);
}

/// `ALTER TABLE links ENABLE TRIGGER ALL` reset the modes of migration 21's triggers (what
/// logs `links` kept by logical replication): the collector's start sets them back, and says
/// so in its log and its metrics, and reloads every redirector (the `TRUNCATE` epoch), and so
/// does each pruning of the change log while it runs; a trigger disabled is counted, and left
/// so. Not at any cost:
/// while a writer's transaction holds links, a start waits a second for its lock, says it
/// could not, and starts all the same.
#[tokio::test]
async fn the_link_trigger_modes_enable_trigger_all_reset_are_set_back() {
    let p = place().await;
    let reset = "ALTER TABLE links ENABLE TRIGGER ALL";
    p.client.batch_execute(reset).await.unwrap();
    let mut writer = pgtest::connect(&p.db.url).await;
    let tx = writer.transaction().await.unwrap();
    let lock = "LOCK TABLE links IN ROW EXCLUSIVE MODE";
    tx.batch_execute(lock).await.unwrap();
    let mut c = start_collector(&p.db, &p.path, &[]).await;
    let failed = "setting back the modes of the triggers on links";
    c.service.wait_for_log(failed, LIMIT).await;
    // At start, and maybe again by the first pruning.
    assert!(c.metric("collector_link_trigger_checks_failed_total").await >= 1.0);
    assert_eq!(
        c.metric("collector_link_triggers_off").await,
        3.0,
        "not set back"
    );
    // A pruning's look that fails is said too, once (a start's is an error).
    c.service
        .wait_for_log("said once until it works", LIMIT)
        .await;
    // Stopped first, and its sessions gone (one may still wait for the lock, and would set
    // the modes back once the writer is done).
    c.service.signal(Signal::SIGTERM);
    assert!(c.service.wait_exit(LIMIT).await.success());
    await_collector_sessions_gone(&p.client).await;
    tx.rollback().await.unwrap();

    let epoch = "SELECT epoch FROM link_changes_state";
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1s"]).await;
    let set = "set back by `ALTER TABLE public.links ENABLE REPLICA TRIGGER links_log_replicated";
    c.service.wait_for_log(set, LIMIT).await;
    let theirs = pgtest::LINK_TRIGGER_MODES;
    assert_eq!(pgtest::link_trigger_modes(&p.client).await, theirs);
    assert_eq!(
        c.metric("collector_link_trigger_modes_set_back_total")
            .await,
        3.0
    );
    assert_eq!(
        count(&p.client, epoch).await,
        1,
        "every redirector reloaded"
    );
    p.client.batch_execute(reset).await.unwrap();
    eventually("the modes set back by a pruning", LIMIT, || async {
        (pgtest::link_trigger_modes(&p.client).await == theirs).then_some(())
    })
    .await;
    c.await_metric("collector_link_trigger_modes_set_back_total", 6.0)
        .await;
    assert_eq!(count(&p.client, epoch).await, 2);
    assert_eq!(c.metric("collector_link_triggers_off").await, 0.0);
    let disable = "ALTER TABLE links DISABLE TRIGGER links_changed";
    p.client.batch_execute(disable).await.unwrap();
    c.await_metric("collector_link_triggers_off", 1.0).await;
    assert_eq!(
        count(&p.client, epoch).await,
        2,
        "a disabled trigger left so"
    );
}
