//! The collector on a replicated database: it says whether its commits wait for a standby,
//! and names a commit stuck waiting for one (SyncRep) instead of blaming a lock. A primary
//! and a streaming standby of its own (`testkit::pgtest::Pair`), killed and promoted.

use std::time::{Duration, Instant};

use testkit::collector::*;
use testkit::pgtest::{self, Pair, Replication, TestDb};

/// The metric `series` of `c` once it reads `value`.
async fn await_value(c: &Collector, series: &str, value: f64, limit: Duration) {
    let what = format!("{series} to read {value}");
    testkit::eventually(&what, limit, || async {
        (c.metric(series).await == value).then_some(())
    })
    .await;
}

/// A collector whose commit waits in SyncRep on a promoted standby that kept its primary's
/// synchronous_standby_names, named: the pair, the place, the collector, the clicks sent,
/// and how long the naming took from the promotion.
struct Stuck {
    pair: Pair,
    p: Place,
    c: Collector,
    sent: Vec<(String, i64)>,
    named: Duration,
}

async fn stuck_in_syncrep() -> Stuck {
    let pair = Pair::start(Replication::Synchronous).await;
    let p = place_on(&pair.primary).await;
    // Both servers, whichever takes writes: how the collector follows a failover.
    let db = TestDb {
        name: p.db.name.clone(),
        url: pair.url(&p.db.name),
    };
    let c = start_collector(&db, &p.path, &["--flush-interval", "20ms"]).await;
    await_value(&c, "collector_database_synchronous", 1.0, LIMIT).await;
    c.service
        .wait_for_log("commits are replicated synchronously", LIMIT)
        .await;
    assert_eq!(c.metric("collector_replication_waiting").await, 0.0);

    let sent = clicks(3_000, 30, start_us(), 1_001);
    let grams = datagrams(21, &sent);
    let (before, after) = grams.split_at(grams.len() / 2);
    send_all(&p.path, before.to_vec()).await;
    await_rows(&p.client, None, clicks_in(before)).await;

    // The primary dies; its standby is promoted, and nobody clears the setting it copied.
    pair.primary.kill_hard();
    let standby = &pair.standby;
    tokio::task::block_in_place(|| standby.promote());
    let stuck = Instant::now();
    send_all(&p.path, after.to_vec()).await;
    c.service.wait_for_log("wait_event SyncRep", LIMIT).await;
    await_value(&c, "collector_replication_waiting", 1.0, LIMIT).await;
    let named = stuck.elapsed();
    assert!(
        named < Duration::from_secs(15),
        "the SyncRep wait named only after {named:?}"
    );
    assert_eq!(c.metric("collector_replication_waits_total").await, 1.0);
    let line = c.service.wait_for_log("wait_event SyncRep", LIMIT).await;
    assert!(line.contains("synchronous_standby_names"), "{line}");
    assert!(
        !c.service
            .log()
            .iter()
            .any(|l| l.contains("waiting for the lock of instance")),
        "the wait was blamed on a lock"
    );
    Stuck {
        pair,
        p,
        c,
        sent,
        named,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_that_kept_synchronous_standby_names_is_named_and_then_written() {
    let Stuck {
        pair,
        p,
        c,
        sent,
        named,
    } = stuck_in_syncrep().await;
    let standby = &pair.standby;

    // What a failover manager does on promotion: then every click lands.
    standby.set_synchronous_standby_names("").await;
    let client = pgtest::connect(&standby.url(&p.db.name)).await;
    await_rows(&client, None, sent.len() as u64).await;
    await_value(&c, "collector_replication_waiting", 0.0, LIMIT).await;
    eprintln!("a commit stuck in SyncRep named after {named:?}");
}

/// Restarted meanwhile, the collector waits for its instance's lock, which the stuck commit's
/// session holds: it still names the SyncRep wait, and keeps the gauge (and the alert on it)
/// up until the commit goes through and it takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_restarted_during_a_syncrep_wait_names_it_while_it_waits_for_the_lock() {
    let Stuck { pair, p, mut c, .. } = stuck_in_syncrep().await;
    c.service.signal(nix::sys::signal::Signal::SIGKILL);
    c.service.wait_exit(LIMIT).await;
    let db = TestDb {
        name: p.db.name.clone(),
        url: pair.url(&p.db.name),
    };
    let next = Collector::spawn(command(&db, &p.path, &["--flush-interval", "20ms"])).await;
    next.service
        .wait_for_log("the session that holds the lock of instance", LIMIT)
        .await;
    await_value(&next, "collector_replication_waiting", 1.0, LIMIT).await;
    assert_eq!(next.health().await, 503, "not ready while it waits");

    pair.standby.set_synchronous_standby_names("").await;
    next.ready().await;
    await_value(&next, "collector_replication_waiting", 0.0, LIMIT).await;
}

/// A reload changes synchronous_standby_names under the writer's session, which stays: a
/// commit it makes wait is named with the setting as it is now (an operator's typo), and the
/// gauge follows; cleared again (as a failover manager does when its standby goes), the gauge
/// follows that too, after the next writes, on the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_synchronous_standby_names_is_seen_without_a_new_session() {
    let pair = Pair::start(Replication::Asynchronous).await;
    let server = &pair.primary;
    let p = place_on(server).await;
    let c = start_collector(&p.db, &p.path, &["--flush-interval", "20ms"]).await;
    c.service
        .wait_for_log("commits are not replicated synchronously", LIMIT)
        .await;
    assert_eq!(c.metric("collector_database_synchronous").await, 0.0);

    // A standby's name that no standby has: every commit waits.
    server.set_synchronous_standby_names("nobody").await;
    let sent = clicks(200, 10, start_us(), 1_001);
    send_all(&p.path, datagrams(31, &sent)).await;
    let line = c.service.wait_for_log("wait_event SyncRep", LIMIT).await;
    assert!(
        line.contains(r#"synchronous_standby_names is now "nobody""#),
        "{line}"
    );
    await_value(&c, "collector_database_synchronous", 1.0, LIMIT).await;

    server.set_synchronous_standby_names("").await;
    await_rows(&p.client, None, sent.len() as u64).await;
    // Clicks from a new sender at each look, until a write after the settings were last
    // read reads them again.
    let mut sender = 32;
    testkit::eventually("collector_database_synchronous to read 0", LIMIT, || {
        sender += 1;
        let grams = datagrams(sender, &clicks(5, 5, start_us(), 1_001));
        async {
            send_all(&p.path, grams).await;
            (c.metric("collector_database_synchronous").await == 0.0).then_some(())
        }
    })
    .await;
    let log = c.service.log();
    assert!(
        !log.iter().any(|l| l.contains("on a new connection")),
        "the writer took a new session, which reads the settings anyway: {log:#?}"
    );
}

/// Start-up's own commits (the migrations, here) waiting for a standby are named as the
/// writer's are: before, the collector sat at "starting" with its socket unbound and nothing
/// said, while the redirectors' rings filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_migrations_wait_for_a_standby_names_the_wait() {
    let pair = Pair::start(Replication::Asynchronous).await;
    pair.primary.set_synchronous_standby_names("nobody").await;
    let db = pair.primary.fresh_database().await;
    let (_dir, path) = socket_path();
    let c = Collector::spawn(command(&db, &path, &[])).await;
    let line = c.service.wait_for_log("wait_event SyncRep", LIMIT).await;
    assert!(
        line.contains(r#"synchronous_standby_names is now "nobody""#),
        "{line}"
    );
    await_value(&c, "collector_replication_waiting", 1.0, LIMIT).await;
    assert_eq!(c.health().await, 503, "not ready while it waits");

    pair.primary.set_synchronous_standby_names("").await;
    c.ready().await;
    await_value(&c, "collector_replication_waiting", 0.0, LIMIT).await;
}

/// The clicks `grams` hold.
fn clicks_in(grams: &[Vec<u8>]) -> u64 {
    grams
        .iter()
        .map(|g| {
            protocol::wire::decode(g)
                .expect("a valid datagram")
                .clicks
                .len() as u64
        })
        .sum()
}
