//! Hostile input on the real collector: a forged sender id, a uid not allowed, a flood of
//! fresh sender ids, a flood of garbage while valid clicks flow, and a row PostgreSQL refuses.

use std::collections::BTreeMap;

use collector::testkit::*;
use shared::testkit::XorShift;
use shared::wire::{Click, Datagram, Encoder, DEFAULT_DATAGRAM, VERSION};

/// A datagram of `sender` at `seq` with `clicks` clicks of `code`, stamped now.
fn datagram(sender: u64, seq: u64, code: &str, clicks: usize) -> Vec<u8> {
    let click = Click { code, offset_us: 0 };
    let batch = Datagram {
        version: VERSION,
        sender,
        seq,
        base_us: shared::now_us(),
        clicks: vec![click; clicks],
    };
    batch.encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_sender_id_from_another_process_is_rejected_and_the_real_senders_clicks_land() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let real = connect(&p.path);
    real.send(&datagram(77, 0, "real", 10)).unwrap();
    await_rows(&p.client, None, 10).await;
    // Another process (the same uid) claims the id: a seq far ahead, and the very next one.
    let uid = nix::unistd::getuid().as_raw();
    for seq in [9_000_000_000_000_000_000, 1] {
        shared::testkit::send_as_user(uid, &p.path, &datagram(77, seq, "forged", 5)).unwrap();
    }
    c.await_metric(
        "collector_datagrams_rejected_total{reason=\"sender_mismatch\"}",
        2.0,
    )
    .await;
    for seq in 1..=3 {
        real.send(&datagram(77, seq, "real", 10)).unwrap();
    }
    await_rows(&p.client, None, 40).await;
    let forged = "SELECT count(*) FROM clicks WHERE code = 'forged'";
    assert_eq!(count(&p.client, forged).await, 0);
    assert_eq!(c.metric("collector_datagrams_lost_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_uids_allowed_are_taken() {
    let p = place().await;
    let uid = nix::unistd::getuid().as_raw().to_string();
    let flags = ["--allow-uid", &uid, "--socket-mode", "0666"];
    let c = start_collector(&p.db, &p.path, &flags).await;
    // The directories must let the other user reach the socket.
    for dir in [p.dir.path(), p.path.parent().unwrap()] {
        let open = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(dir, open).unwrap();
    }
    shared::testkit::send_as_user(65534, &p.path, &datagram(5, 0, "other", 3)).unwrap();
    c.await_metric(
        "collector_datagrams_rejected_total{reason=\"unauthorized\"}",
        1.0,
    )
    .await;
    send_all(&p.path, vec![datagram(6, 0, "mine", 4)]).await;
    await_rows(&p.client, None, 4).await;
    assert_eq!(
        count(
            &p.client,
            "SELECT count(*) FROM clicks WHERE code = 'other'"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_a_million_fresh_sender_ids_leaves_memory_and_click_senders_bounded() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let flood =
        |ids: std::ops::Range<u64>| ids.map(|id| datagram(id, 0, "x", 0)).collect::<Vec<_>>();
    // Warm up: the allocator and the batches reach their working size.
    send_all(&p.path, flood(1..100_001)).await;
    c.await_metric("collector_datagrams_received_total", 100_000.0)
        .await;
    let before = shared::testkit::rss_kib(c.service.pid());
    send_all(&p.path, flood(100_001..1_000_001)).await;
    c.await_metric("collector_datagrams_received_total", 1_000_000.0)
        .await;
    let after = shared::testkit::rss_kib(c.service.pid());
    // A marker sent last: once its row is in, every batch before it is committed.
    send_all(&p.path, vec![datagram(2_000_000, 0, "marker", 1)]).await;
    await_rows(&p.client, None, 1).await;
    assert!(
        after <= before + 8 * 1024,
        "RSS grew from {before} KiB to {after} KiB over 900,000 fresh sender ids"
    );
    let senders = count(&p.client, "SELECT count(*) FROM click_senders").await;
    assert!(senders <= 2 * 4 + 1, "{senders} rows in click_senders");
    assert!(c.metric("collector_senders").await <= 9.0);
    assert!(c.metric("collector_senders_evicted_total").await >= 999_990.0);
}

/// A fixed stream of garbage.
struct Noise(XorShift);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Random bytes, or a valid datagram with bytes changed, that the decoder rejects.
    fn garbage(&mut self, valid: &[u8]) -> Vec<u8> {
        loop {
            let bytes: Vec<u8> = if self.next() % 2 == 0 {
                let len = 1 + (self.next() % 200) as usize;
                (0..len).map(|_| self.next() as u8).collect()
            } else {
                let mut mutated = valid.to_vec();
                for _ in 0..1 + self.next() % 3 {
                    let at = (self.next() as usize) % mutated.len();
                    mutated[at] = self.next() as u8;
                }
                mutated
            };
            if shared::wire::decode(&bytes).is_err() {
                return bytes;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_flood_is_counted_by_reason_while_every_valid_click_lands() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let mut noise = Noise(XorShift(0x2545_f491_4f6c_dd1d));
    let template = datagram(3, 0, "template", 5);
    let garbage: Vec<Vec<u8>> = (0..1_000_000).map(|_| noise.garbage(&template)).collect();
    let mut expected = BTreeMap::<&str, f64>::new();
    for g in &garbage {
        *expected
            .entry(shared::wire::decode(g).unwrap_err().reason())
            .or_default() += 1.0;
    }
    // Valid clicks from a sender of their own, a datagram every 10,000 pieces of garbage.
    let mut all = Vec::with_capacity(garbage.len() + 100);
    let mut seq = 0;
    for (i, g) in garbage.into_iter().enumerate() {
        if i % 10_000 == 0 {
            all.push(datagram(42, seq, "valid", 50));
            seq += 1;
        }
        all.push(g);
    }
    let (warm, rest) = all.split_at(100_000);
    send_all(&p.path, warm.to_vec()).await;
    c.await_metric("collector_datagrams_received_total", 100_000.0)
        .await;
    let before = shared::testkit::rss_kib(c.service.pid());
    send_all(&p.path, rest.to_vec()).await;
    await_rows(&p.client, None, seq * 50).await;
    let total = all.len() as f64;
    c.await_metric("collector_datagrams_received_total", total)
        .await;
    let after = shared::testkit::rss_kib(c.service.pid());
    for (reason, n) in &expected {
        let series = format!("collector_datagrams_rejected_total{{reason=\"{reason}\"}}");
        assert_eq!(c.metric(&series).await, *n, "{series}");
    }
    assert!(
        after <= before + 8 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    eprintln!("garbage by reason: {expected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_refused_for_good_is_set_aside_while_its_neighbours_land() {
    let p = place().await;
    p.client
        .batch_execute("ALTER TABLE clicks ADD CONSTRAINT no_poison CHECK (code <> 'poison')")
        .await
        .unwrap();
    let c = start_collector(&p.db, &p.path, &[]).await;
    let mut enc = Encoder::new(9, DEFAULT_DATAGRAM).unwrap();
    let now = shared::now_us();
    for (i, code) in ["a", "b", "poison", "c", "d"].into_iter().enumerate() {
        enc.push(code, now + i as i64).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    await_rows(&p.client, None, 4).await;
    c.await_metric("collector_clicks_set_aside_total{reason=\"refused\"}", 1.0)
        .await;
    let aside = "SELECT code || ' ' || reason || ' ' || (error LIKE '%no_poison%')::text
                 FROM clicks_set_aside";
    let aside: String = p.client.query_one(aside, &[]).await.unwrap().get(0);
    assert_eq!(aside, "poison refused true");
    let totals = "SELECT sum(clicks)::int8 FROM click_totals";
    assert_eq!(
        count(&p.client, totals).await,
        4,
        "the refused click is not counted"
    );
    // The pipeline keeps going.
    send_all(&p.path, vec![datagram(10, 0, "later", 100)]).await;
    await_rows(&p.client, None, 104).await;
    assert_eq!(c.metric("collector_clicks_written_total").await, 104.0);
    assert_eq!(c.health().await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_refuses_every_row_holds_the_batch_instead_of_setting_it_aside() {
    let p = place().await;
    p.client
        .batch_execute("ALTER TABLE clicks ADD CONSTRAINT nothing CHECK (code = 'nothing')")
        .await
        .unwrap();
    let c = start_collector(&p.db, &p.path, &[]).await;
    send_all(&p.path, vec![datagram(11, 0, "held", 20)]).await;
    c.service
        .wait_for_log("every click of a batch of 20 refused", LIMIT)
        .await;
    shared::testkit::eventually("/healthz to say 503", LIMIT, || async {
        (shared::testkit::http::get(c.admin, "/healthz")
            .await
            .ok()?
            .0
            == 503)
            .then_some(())
    })
    .await;
    assert_eq!(
        count(&p.client, "SELECT count(*) FROM clicks_set_aside").await,
        0
    );
    // Once an operator fixes the table, the batch lands whole.
    p.client
        .batch_execute("ALTER TABLE clicks DROP CONSTRAINT nothing")
        .await
        .unwrap();
    await_rows(&p.client, None, 20).await;
    c.ready().await;
    assert_eq!(
        c.metric("collector_clicks_set_aside_total{reason=\"refused\"}")
            .await,
        0.0
    );
}
