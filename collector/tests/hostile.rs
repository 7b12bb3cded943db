//! Hostile input on the real collector: a forged sender id, a uid not allowed (also seen from
//! a user namespace, as systemd's PrivateUsers= makes one), a flood of fresh sender ids, a
//! flood of garbage while valid clicks flow, a row PostgreSQL refuses, and a role of the
//! database that shadows the functions the collector calls.

use std::collections::BTreeMap;

use protocol::wire::{Click, Datagram, Encoder, DEFAULT_DATAGRAM, VERSION};
use testkit::collector::*;
use testkit::XorShift;

/// Clicks set aside because the table refused them.
const SET_ASIDE_REFUSED: &str = "collector_clicks_set_aside_total{reason=\"refused\"}";

/// A datagram of `sender` at `seq` with `clicks` clicks of `code`, stamped now.
fn datagram(sender: u64, seq: u64, code: &str, clicks: usize) -> Vec<u8> {
    let click = Click::new(code, 0);
    let batch = Datagram {
        version: VERSION,
        sender,
        seq,
        base_us: protocol::now_us(),
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
        testkit::send_as_user(uid, &p.path, &datagram(77, seq, "forged", 5)).unwrap();
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
    testkit::send_as_user(65534, &p.path, &datagram(5, 0, "other", 3)).unwrap();
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

/// `cmd` run in a user namespace of its own, as systemd's PrivateUsers=yes runs
/// collector.service: `unshare --user --map-root-user` maps root inside to root outside and
/// nothing else (PrivateUsers= maps root and the service's own user), so any other uid
/// outside arrives as the overflow uid, 65534.
fn in_user_namespace(cmd: &std::process::Command) -> std::process::Command {
    testkit::wrapped("unshare", &["--user", "--map-root-user", "--"], cmd)
}

/// A migrated database on the harness's TCP cluster: a process in a user namespace of its own
/// cannot enter the Unix cluster's directory (its owner, `postgres` as root runs it, is not
/// mapped there, so root inside has no power over it), but reaches 127.0.0.1 as usual.
async fn tcp_place() -> Place {
    place_on(testkit::pgtest::tcp_cluster()).await
}

/// Lets any user reach the socket (the directories and the socket itself), so that a process
/// of another uid can send.
fn open_to_everyone(p: &Place) {
    for dir in [p.dir.path(), p.path.parent().unwrap()] {
        let open = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(dir, open).unwrap();
    }
}

/// The uid of the stand-in for a redirector outside the collector's user namespace: `daemon`,
/// which every Debian system has and no test runs as.
const OUTSIDE_UID: u32 = 1;

/// Under PrivateUsers=yes, `--allow-uid <the redirector's uid>` would refuse every datagram
/// (they all arrive as uid 65534): the collector says so and does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_uid_its_user_namespace_does_not_map_stops_the_collector_at_start() {
    let p = tcp_place().await;
    let uid = OUTSIDE_UID.to_string();
    let cmd = in_user_namespace(&command(&p.db, &p.path, &["--allow-uid", &uid]));
    let mut run = testkit::Service::spawn("collector", cmd);
    let status = run.wait_exit(LIMIT).await;
    assert!(
        !status.success(),
        "the collector ran with --allow-uid {uid}, which it can never see"
    );
    let log = run.log().join("\n");
    for needle in [
        &format!("--allow-uid {uid}: uid {uid} is not mapped"),
        "/proc/self/uid_map: \"0 0 1\"",
        "PrivateUsers=",
        "65534",
    ] {
        assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
    }
    assert!(!p.path.exists(), "it bound its socket before refusing");
}

/// With a uid its namespace maps, the collector starts; a sender outside the map arrives as
/// uid 65534 and is refused, which is why an unmapped uid cannot be allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_user_namespace_an_allowed_mapped_uid_starts_and_others_arrive_as_65534() {
    let p = tcp_place().await;
    let flags = ["--allow-uid", "0", "--socket-mode", "0666"];
    let c = Collector::spawn(in_user_namespace(&command(&p.db, &p.path, &flags))).await;
    c.ready().await;
    open_to_everyone(&p);
    testkit::send_as_user(OUTSIDE_UID, &p.path, &datagram(5, 0, "outside", 3)).unwrap();
    c.await_metric(
        "collector_datagrams_rejected_total{reason=\"unauthorized\"}",
        1.0,
    )
    .await;
    c.service
        .wait_for_log("from uid Some(65534), not one --allow-uid names", LIMIT)
        .await;
    // Root outside is root inside: mapped, so taken.
    send_all(&p.path, vec![datagram(6, 0, "root", 4)]).await;
    await_rows(&p.client, None, 4).await;
    assert_eq!(
        count(
            &p.client,
            "SELECT count(*) FROM clicks WHERE code = 'outside'"
        )
        .await,
        0
    );
}

/// Without --allow-uid the same namespace changes nothing: whoever may write to the socket
/// sends, as under the shipped unit, where the socket's group decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_user_namespace_without_allow_uid_the_socket_mode_decides() {
    let p = tcp_place().await;
    let flags = ["--socket-mode", "0666"];
    let c = Collector::spawn(in_user_namespace(&command(&p.db, &p.path, &flags))).await;
    c.ready().await;
    open_to_everyone(&p);
    testkit::send_as_user(OUTSIDE_UID, &p.path, &datagram(7, 0, "outside", 3)).unwrap();
    await_rows(&p.client, None, 3).await;
    assert_eq!(
        c.metric("collector_datagrams_rejected_total{reason=\"unauthorized\"}")
            .await,
        0.0
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
    let before = testkit::rss_kib(c.service.pid());
    send_all(&p.path, flood(100_001..1_000_001)).await;
    c.await_metric("collector_datagrams_received_total", 1_000_000.0)
        .await;
    let after = testkit::rss_kib(c.service.pid());
    // A marker sent last: once its row is in, every batch before it is committed.
    send_all(&p.path, vec![datagram(2_000_000, 0, "marker", 1)]).await;
    await_rows(&p.client, None, 1).await;
    assert!(
        after <= before + 8 * 1024,
        "RSS grew from {before} KiB to {after} KiB over 900,000 fresh sender ids"
    );
    // What bounds a batch here, in any build: its senders, not the time it fills for (which
    // holds more of these empty datagrams the faster the receiver reads them).
    let batches = c.metric("collector_batches_total").await;
    let fewest = (1_000_000 / collector::ingest::SENDERS_PER_BATCH) as f64;
    assert!(
        batches >= fewest,
        "{batches} batches, not at most {} senders each",
        collector::ingest::SENDERS_PER_BATCH
    );
    let senders = count(&p.client, "SELECT count(*) FROM click_senders").await;
    assert!(senders <= 2 * 4 + 1, "{senders} rows in click_senders");
    assert!(c.metric("collector_senders").await <= 9.0);
    assert!(c.metric("collector_senders_evicted_total").await >= 999_990.0);
}

/// A sender pushed out by fresh ids of its own process and then seen again, all while one
/// batch fills, keeps its row: the batch deletes only the ids still forgotten when it is handed
/// over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_pushed_out_and_seen_again_within_a_batch_keeps_its_row() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--flush-interval", "2s"]).await;
    let per_process = protocol::senders::PER_PROCESS as u64;
    let mut grams = vec![datagram(70, 0, "first", 1)];
    grams.extend((71..71 + per_process).map(|id| datagram(id, 0, "fresh", 1)));
    grams.push(datagram(70, 1, "again", 1));
    send_all(&p.path, grams).await;
    await_rows(&p.client, None, 2 + per_process).await;
    // Counted once its commit has returned, a moment after the rows are seen.
    c.await_metric("collector_batches_total", 1.0).await;
    assert_eq!(c.metric("collector_batches_total").await, 1.0, "one batch");
    let rows = "SELECT string_agg(sender::text, ' ' ORDER BY sender) FROM click_senders";
    let rows: String = p.client.query_one(rows, &[]).await.unwrap().get(0);
    assert_eq!(rows, "70 72 73 74", "71 pushed out in turn");
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
            if protocol::wire::decode(&bytes).is_err() {
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
    for reason in garbage.iter().filter_map(|g| rejected_as(g)) {
        *expected.entry(reason).or_default() += 1.0;
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
    let before = testkit::rss_kib(c.service.pid());
    send_all(&p.path, rest.to_vec()).await;
    await_rows(&p.client, None, seq * 50).await;
    let total = all.len() as f64;
    c.await_metric("collector_datagrams_received_total", total)
        .await;
    let after = testkit::rss_kib(c.service.pid());
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

/// Why the collector rejects `garbage` from a sender without an address, if it does: as a
/// resync when its first byte says so (one that decodes is refused, `bad_resync`, unless it
/// skips nothing), else as a click datagram.
fn rejected_as(garbage: &[u8]) -> Option<&'static str> {
    if garbage.first() != Some(&protocol::wire::RESYNC_VERSION) {
        return Some(
            protocol::wire::decode(garbage)
                .unwrap_err()
                .reason()
                .as_str(),
        );
    }
    match protocol::wire::decode_resync(garbage) {
        Err(reject) => Some(reject.reason().as_str()),
        Ok(resync) => (resync.first > 0).then_some("bad_resync"),
    }
}

/// Makes `clicks` refuse, by the constraint `name`, the clicks for which `refused` (SQL of
/// `code`) holds, slowly: 2 ms each, so that finding many of them outlives a 1-s attempt on
/// any machine, however fast.
async fn refuse_slowly(client: &tokio_postgres::Client, name: &str, refused: &str) {
    let sql = format!(
        "CREATE FUNCTION {name}(code text) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
             IF {refused} THEN PERFORM pg_sleep(0.002); RETURN false; END IF;
             RETURN true;
         END $$;
         ALTER TABLE clicks ADD CONSTRAINT {name} CHECK ({name}(code)) NOT VALID;"
    );
    client.batch_execute(&sql).await.unwrap();
}

/// A place whose `clicks` refuses the code `poison` (a constraint), and its collector, given
/// `flags`.
async fn poisoned(flags: &[&str]) -> (Place, Collector) {
    let p = place().await;
    p.client
        .batch_execute("ALTER TABLE clicks ADD CONSTRAINT no_poison CHECK (code <> 'poison')")
        .await
        .unwrap();
    let c = start_collector(&p.db, &p.path, flags).await;
    (p, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_refused_for_good_is_set_aside_while_its_neighbours_land() {
    let (p, c) = poisoned(&[]).await;
    let mut enc = Encoder::new(9, DEFAULT_DATAGRAM).unwrap();
    let now = protocol::now_us();
    // Each with its dimensions: the refused click is left out of the breakdowns too.
    let dimensions = protocol::dimensions::Dimensions {
        referrer: Some("r.example"),
        country: protocol::dimensions::Country::parse(b"DE"),
        ..Default::default()
    };
    for (i, code) in ["a", "b", "poison", "c", "d"].into_iter().enumerate() {
        enc.push_with(code, now + i as i64, &dimensions).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    await_rows(&p.client, None, 4).await;
    c.await_metric(SET_ASIDE_REFUSED, 1.0).await;
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
    let breakdown =
        "SELECT string_agg(dimension || ':' || value || '=' || n, ' ' ORDER BY dimension)
                     FROM (SELECT dimension, value, sum(clicks) FROM click_breakdown
                           GROUP BY 1, 2) AS b(dimension, value, n)";
    let breakdown: String = p.client.query_one(breakdown, &[]).await.unwrap().get(0);
    assert_eq!(
        breakdown, "agent:human=4 country:DE=4 referrer:r.example=4",
        "nor in the breakdowns"
    );
    let poison = "SELECT count(*) FROM click_breakdown WHERE code = 'poison'";
    assert_eq!(count(&p.client, poison).await, 0);
    // The ranges taken while sifting are rolled back and COPYed again at once: no
    // subtransaction of theirs outlives the sift (each row's xmin is its subtransaction's).
    let xmins = "SELECT count(DISTINCT xmin::text) FROM clicks";
    assert_eq!(count(&p.client, xmins).await, 1, "written in one statement");
    // The pipeline keeps going.
    send_all(&p.path, vec![datagram(10, 0, "later", 100)]).await;
    await_rows(&p.client, None, 104).await;
    c.await_metric("collector_clicks_written_total", 104.0)
        .await;
    assert_eq!(c.health().await, 200);
}

/// A constraint checked at commit (deferred: a foreign key to `links`, say) refuses the batch
/// at COMMIT, where the sift, which splits the COPY of the clicks, could not find the row: the
/// batch was retried for good. The sift makes every constraint immediate, so the refusal comes
/// from the COPY, and the row is set aside while its neighbours land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_a_deferred_constraint_refuses_is_set_aside_too() {
    let p = place().await;
    p.client
        .batch_execute(
            "INSERT INTO links (code, url)
             SELECT code, 'https://example.com/' || code FROM unnest('{a,b,c}'::text[]) AS code;
             ALTER TABLE clicks ADD CONSTRAINT known_code FOREIGN KEY (code) REFERENCES links
                 DEFERRABLE INITIALLY DEFERRED",
        )
        .await
        .unwrap();
    let c = start_collector(&p.db, &p.path, &[]).await;
    let mut enc = Encoder::new(9, DEFAULT_DATAGRAM).unwrap();
    let now = protocol::now_us();
    for (i, code) in ["a", "b", "gone", "c"].into_iter().enumerate() {
        enc.push(code, now + i as i64).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    await_rows(&p.client, None, 3).await;
    c.await_metric(SET_ASIDE_REFUSED, 1.0).await;
    let aside = "SELECT code || ' ' || (error LIKE '%known_code%')::text FROM clicks_set_aside";
    let aside: String = p.client.query_one(aside, &[]).await.unwrap().get(0);
    assert_eq!(aside, "gone true");
    assert_eq!(c.health().await, 200);
}

/// A trigger's refusal raised as a check violation names no constraint, as PostgreSQL's own
/// "no partition of relation clicks found for row" does; unlike that one, it is not raised
/// by `ExecFindPartition`. The click is a row refused (set aside), not one of a day whose
/// partition is still to be made, which would hold the batch for as long as the trigger
/// refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_violation_a_trigger_raises_is_a_refused_row_not_a_missing_partition() {
    let p = place().await;
    p.client
        .batch_execute(
            "CREATE FUNCTION no_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.code = 'poison' THEN
                     RAISE EXCEPTION 'no poison' USING ERRCODE = 'check_violation';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER no_poison BEFORE INSERT ON clicks
                 FOR EACH ROW EXECUTE FUNCTION no_poison();",
        )
        .await
        .unwrap();
    let c = start_collector(&p.db, &p.path, &[]).await;
    let mut enc = Encoder::new(9, DEFAULT_DATAGRAM).unwrap();
    let now = protocol::now_us();
    for (i, code) in ["a", "poison", "b"].into_iter().enumerate() {
        enc.push(code, now + i as i64).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    await_rows(&p.client, None, 2).await;
    c.await_metric(SET_ASIDE_REFUSED, 1.0).await;
}

/// Refused clicks scattered through a batch: the sift takes far more ranges than
/// PostgreSQL's 64 subtransactions, which it rolls back and COPYs again as one every 32
/// (past 64 live at once, every snapshot in the cluster is taken the slow way until the
/// transaction ends); each click taken lands once, in at most two subtransactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_refused_clicks_are_sifted_out_in_few_subtransactions() {
    let (p, c) = poisoned(&[]).await;
    let mut enc = Encoder::new(22, DEFAULT_DATAGRAM).unwrap();
    let now = protocol::now_us();
    for i in 0..400 {
        let code = if i % 5 == 2 { "poison" } else { "fine" };
        enc.push(code, now + i).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    c.await_metric(SET_ASIDE_REFUSED, 80.0).await;
    await_rows(&p.client, None, 320).await;
    let fine = "SELECT count(*) FROM clicks WHERE code = 'fine'";
    assert_eq!(count(&p.client, fine).await, 320);
    let xmins = count(&p.client, "SELECT count(DISTINCT xmin::text) FROM clicks").await;
    assert!(xmins <= 2, "written in {xmins} subtransactions");
}

/// A batch with thousands of clicks refused among thousands taken: finding them, a range
/// halved at a time down to each refused one, outlives an attempt's deadline. Each attempt
/// leaves what it found to the next, which sets those aside untried, so the batch lands; before,
/// every attempt started over and was cut off at the same place, for good. The batch begins
/// with a run of refused clicks, longer than an attempt gets through: they are remembered as
/// bad, not as a table's refusing everything, because the probe's click is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_many_refused_clicks_lands_though_sifting_it_outlives_an_attempt() {
    let p = place().await;
    refuse_slowly(&p.client, "no_poison", "code = 'poison'").await;
    let c = start_collector(&p.db, &p.path, &["--write-timeout", "1s"]).await;
    send_all(&p.path, vec![datagram(14, 0, "other", 1)]).await;
    await_rows(&p.client, None, 1).await;
    // One datagram, so one batch: 300 refused, then 150 refused among 150 taken.
    let mut enc = Encoder::new(15, DEFAULT_DATAGRAM).unwrap();
    for i in 0..600 {
        let code = if i < 300 || i % 2 == 0 {
            "poison"
        } else {
            "fine"
        };
        enc.push(code, protocol::now_us()).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    await_rows(&p.client, None, 151).await;
    c.await_metric(SET_ASIDE_REFUSED, 450.0).await;
    // An attempt was cut off (else the batch is too small to show anything here).
    c.service
        .wait_for_log("clicks: took over 1s; retrying", LIMIT)
        .await;
    assert_eq!(c.health().await, 200);
}

/// A sift that outlasts an attempt, whose probe's code is refused too (a constraint an operator
/// added that refuses it and the batch's codes): the next probe, of another code, says the
/// table takes rows, so the rows found are remembered and each attempt gets further. With one
/// probe a day, every row found stayed unsure, forgotten at the deadline, and the batch was
/// sifted again from the start at every attempt, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sift_whose_probe_is_refused_too_tries_another_code() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--write-timeout", "1s"]).await;
    // The probe's code (the first of the last batch written whole), then another.
    let mut enc = Encoder::new(18, DEFAULT_DATAGRAM).unwrap();
    for code in ["gone", "kept"] {
        enc.push(code, protocol::now_us()).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    await_rows(&p.client, None, 2).await;
    refuse_slowly(&p.client, "links_gone", "code IN ('gone', 'poison')").await;
    let mut enc = Encoder::new(19, DEFAULT_DATAGRAM).unwrap();
    for _ in 0..600 {
        enc.push("poison", protocol::now_us()).unwrap();
    }
    send_all(&p.path, vec![enc.datagram().to_vec()]).await;
    c.await_metric(SET_ASIDE_REFUSED, 600.0).await;
    c.service
        .wait_for_log("clicks: took over 1s; retrying", LIMIT)
        .await;
    assert_eq!(c.health().await, 200);
}

/// A batch whose every click is refused, and the codes an attempt probes refused too (a
/// constraint refusing the codes of links gone, many of them clicked before): each attempt
/// probes the folded codes after those the attempt before did, until one is taken and the
/// batch's clicks are set aside as bad. When each attempt began its looks afresh, every
/// attempt tried the same four and held the batch as one a table refusing everything
/// refuses, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_at_a_batch_every_click_of_which_is_refused_probe_new_codes() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1s"]).await;
    // The probe's code (the first of the last batch written whole), more the table holds
    // before the one it still takes.
    write_gone_then_kept(&p, 6).await;
    testkit::eventually("the codes folded", LIMIT, || async {
        let folded = "SELECT count(*) FROM click_counts WHERE code = 'kept'";
        (count(&p.client, folded).await == 1).then_some(())
    })
    .await;
    // Held once at least: the first attempt's probes were all refused.
    poison_held_then_set_aside(&p, &c).await;
    assert_eq!(c.health().await, 200);
    // The probe taken is the next batch's, which need not look for one again.
    let held = |c: &Collector| {
        let log = c.service.log();
        log.iter()
            .filter(|l| l.contains("every click of a batch of 20 refused"))
            .count()
    };
    let held_before = held(&c);
    send_all(&p.path, vec![datagram(25, 0, "poison", 20)]).await;
    c.await_metric(SET_ASIDE_REFUSED, 40.0).await;
    assert_eq!(
        held(&c),
        held_before,
        "the next batch held, though a probe was taken"
    );
}

/// With nothing folded, the probe's codes come from a scan of `clicks`, which meets its rows
/// in the same order at every attempt: the attempts at a batch go on past the codes tried
/// before, and a batch whose every click was refused, as were the table's first codes, is
/// set aside once a later attempt finds one the table takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_at_a_batch_with_nothing_folded_probe_new_codes_of_clicks() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1h"]).await;
    write_gone_then_kept(&p, 9).await;
    let folded = "SELECT count(*) FROM click_counts";
    assert_eq!(count(&p.client, folded).await, 0, "nothing folded");
    // Held at least twice: an attempt tries three codes, and nine were refused.
    poison_held_then_set_aside(&p, &c).await;
    assert_eq!(count(&p.client, "SELECT count(*) FROM clicks").await, 10);
}

/// A click each of `gone` codes `gone1`..., then one of `kept`, written as sender 23's batch:
/// the probe's code is the first (of the last batch written whole).
async fn write_gone_then_kept(p: &Place, gone: u64) {
    let codes = (1..=gone).map(|i| format!("gone{i}"));
    let clicks: Vec<_> = codes
        .chain(["kept".to_owned()])
        .map(|code| (code, protocol::now_us()))
        .collect();
    send_all(&p.path, datagrams(23, &clicks)).await;
    await_rows(&p.client, None, gone + 1).await;
}

/// The `gone` codes and `poison` refused from now on (the links gone), and a batch of 20
/// clicks of `poison` (sender 24's) held at least once, then set aside.
async fn poison_held_then_set_aside(p: &Place, c: &Collector) {
    let gone = "ALTER TABLE clicks ADD CONSTRAINT links_gone \
                CHECK (code NOT LIKE 'gone%' AND code <> 'poison') NOT VALID";
    p.client.batch_execute(gone).await.unwrap();
    send_all(&p.path, vec![datagram(24, 0, "poison", 20)]).await;
    c.service
        .wait_for_log("every click of a batch of 20 refused", LIMIT)
        .await;
    c.await_metric(SET_ASIDE_REFUSED, 20.0).await;
}

/// A table that refuses every row, and a batch too large for an attempt to find that out
/// before its deadline: no attempt sees the table take a range, so none remembers a row as
/// refused for the next, and once the table is fixed the batch lands whole, none set aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_table_refusing_everything_refused_are_not_remembered_as_bad() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--write-timeout", "1s"]).await;
    // A click taken before: the probe, refused too from now on.
    send_all(&p.path, vec![datagram(17, 0, "taken", 1)]).await;
    await_rows(&p.client, None, 1).await;
    refuse_slowly(&p.client, "nothing", "true").await;
    let mut enc = Encoder::new(16, DEFAULT_DATAGRAM).unwrap();
    let mut datagrams = Vec::new();
    for _ in 0..2 {
        for _ in 0..500 {
            enc.push("held", protocol::now_us()).unwrap();
        }
        datagrams.push(enc.datagram().to_vec());
        enc.next();
    }
    send_all(&p.path, datagrams).await;
    for _ in 0..2 {
        let seen = c.service.log().len();
        testkit::eventually("an attempt cut off while sifting", LIMIT, || async {
            let log = c.service.log();
            log[seen..]
                .iter()
                .any(|l| l.contains("clicks: took over 1s; retrying"))
                .then_some(())
        })
        .await;
    }
    p.client
        .batch_execute("ALTER TABLE clicks DROP CONSTRAINT nothing")
        .await
        .unwrap();
    await_rows(&p.client, None, 1_001).await;
    c.ready().await;
    assert_eq!(c.metric(SET_ASIDE_REFUSED).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_refuses_every_row_holds_the_batch_instead_of_setting_it_aside() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    // A click taken before the table changed: the one tried again when it refuses a batch's
    // every click (see the test above), refused too.
    send_all(&p.path, vec![datagram(12, 0, "taken", 1)]).await;
    await_rows(&p.client, None, 1).await;
    let nothing = "ALTER TABLE clicks ADD CONSTRAINT nothing CHECK (code = 'nothing') NOT VALID";
    p.client.batch_execute(nothing).await.unwrap();
    // Yesterday's: refused by the constraint, not for want of a partition, they are held too.
    send_all(&p.path, vec![late_clicks(11, "held", 20)]).await;
    c.service
        .wait_for_log("every click of a batch of 20 refused", LIMIT)
        .await;
    testkit::eventually("/healthz to say 503", LIMIT, || async {
        (testkit::http::get(c.admin, "/healthz").await.ok()?.0 == 503).then_some(())
    })
    .await;
    // And to go on saying it while the writer keeps failing, through the rounds of the
    // maintenance task, which reach the database every second between its attempts: five
    // more attempts wait out a backoff (doubling from 100 ms) of 1.6 s at least.
    let failed = c.metric("collector_db_errors_total").await;
    testkit::eventually("five more failed attempts", LIMIT, || async {
        let (status, body) = testkit::http::get(c.admin, "/healthz").await.ok()?;
        assert_eq!(status, 503, "/healthz while every write fails: {body}");
        (c.metric("collector_db_errors_total").await >= failed + 5.0).then_some(())
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
    await_rows(&p.client, None, 21).await;
    c.ready().await;
    assert_eq!(c.metric(SET_ASIDE_REFUSED).await, 0.0);
}

/// On a quiet host a batch may hold one click: PostgreSQL refusing it is refusing every click
/// of the batch, which alone would read as a table that takes none, and hold the stream for
/// good. A click of a code the table took before, tried in the same transaction, tells the
/// two apart: taken, the batch's click is set aside and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_one_refused_click_is_set_aside_when_the_table_takes_others() {
    let (p, mut c) = poisoned(&[]).await;
    send_all(&p.path, vec![datagram(12, 0, "fine", 1)]).await;
    await_rows(&p.client, None, 1).await;
    send_all(&p.path, vec![datagram(12, 1, "poison", 1)]).await;
    c.await_metric(SET_ASIDE_REFUSED, 1.0).await;
    send_all(&p.path, vec![datagram(12, 2, "after", 1)]).await;
    await_rows(&p.client, None, 2).await;
    // A collector that has written nothing yet tries a code `clicks` holds: the first a scan
    // meets is `fine`, refused from now on, so the next look tries another.
    c.service.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(c.service.wait_exit(LIMIT).await.success());
    let c = start_collector(&p.db, &p.path, &[]).await;
    let fine = "ALTER TABLE clicks ADD CONSTRAINT no_fine CHECK (code <> 'fine') NOT VALID";
    p.client.batch_execute(fine).await.unwrap();
    send_all(&p.path, vec![datagram(13, 0, "poison", 1)]).await;
    c.await_metric(SET_ASIDE_REFUSED, 1.0).await;
    // Nor one of the batch's codes.
    send_all(&p.path, vec![datagram(13, 1, "fine", 1)]).await;
    c.await_metric(SET_ASIDE_REFUSED, 2.0).await;
    send_all(&p.path, vec![datagram(13, 2, "later", 1)]).await;
    await_rows(&p.client, None, 3).await;
    // The probe's own code refused since: a batch of it alone tries another code.
    let later = "ALTER TABLE clicks ADD CONSTRAINT no_later CHECK (code <> 'later') NOT VALID";
    p.client.batch_execute(later).await.unwrap();
    send_all(&p.path, vec![datagram(13, 3, "later", 1)]).await;
    c.await_metric(SET_ASIDE_REFUSED, 3.0).await;
    let held = c
        .service
        .log()
        .into_iter()
        .find(|l| l.contains("every click"));
    assert_eq!(held, None, "no batch was held, not even for an attempt");
    let codes = "SELECT string_agg(code, ' ' ORDER BY code) FROM clicks";
    let codes: String = p.client.query_one(codes, &[]).await.unwrap().get(0);
    assert_eq!(codes, "after fine later", "the probes left no row");
    assert_eq!(c.health().await, 200);
}

/// A late click of yesterday whose partition is gone (dropped by hand here; retention drops
/// it only once its day is a day past the window, a click that waited that long for its
/// write) is refused as a row, set aside, and does not hold the stream: the
/// batch holds nothing else, and a batch refused whole is otherwise held as a broken table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_click_whose_day_was_dropped_is_set_aside_not_held() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let late = late_clicks(12, "late", 1);
    let yesterday = partition_of(&p.client, yesterday_late()).await;
    after_first_round(&c, &yesterday).await;
    p.client
        .batch_execute(&format!("DROP TABLE {yesterday}"))
        .await
        .unwrap();
    send_all(&p.path, vec![late]).await;
    c.await_metric(SET_ASIDE_REFUSED, 1.0).await;
    let aside = "SELECT code || ' ' || (error LIKE '%no partition%')::text FROM clicks_set_aside";
    let aside: String = p.client.query_one(aside, &[]).await.unwrap().get(0);
    assert_eq!(aside, "late true");
    send_all(&p.path, vec![datagram(13, 0, "after", 5)]).await;
    await_rows(&p.client, None, 5).await;
    assert_eq!(c.health().await, 200);
    let gone = format!("SELECT count(*) FROM pg_class WHERE relname = '{yesterday}'");
    assert_eq!(count(&p.client, &gone).await, 0, "still no partition");
}

/// Many late clicks of a day whose partition is gone, more than an attempt could take one by
/// one within `--write-timeout`: refused as one range (no row of a day without a partition
/// has one), set aside in one attempt. Before, the sift halved them down to each row, two
/// savepoints and COPYs a row, and every attempt timed out: the stream was held for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_late_clicks_whose_day_was_dropped_are_set_aside_in_one_attempt() {
    const N: i64 = 20_000;
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--write-timeout", "2s"]).await;
    let late = yesterday_late();
    let yesterday = partition_of(&p.client, late).await;
    after_first_round(&c, &yesterday).await;
    p.client
        .batch_execute(&format!("DROP TABLE {yesterday}"))
        .await
        .unwrap();
    let clicks: Vec<_> = (0..N).map(|i| ("late".to_owned(), late - i)).collect();
    send_all(&p.path, datagrams(31, &clicks)).await;
    c.await_metric(SET_ASIDE_REFUSED, N as f64).await;
    assert_eq!(c.metric("collector_clicks_written_total").await, 0.0);
}

/// Clicks of today whose partition is missing (its creation deferred, its name taken) in a
/// batch beside clicks that have one: the batch waits for the partition, rather than setting
/// today's clicks aside for good, as a batch of them alone waited. Here the partition is made
/// by hand, as the partitions task would a minute on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicks_of_today_without_a_partition_wait_for_it_in_a_mixed_batch() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let now = protocol::now_us();
    let today = partition_of(&p.client, now).await;
    after_first_round(&c, &partition_of(&p.client, yesterday_late()).await).await;
    p.client
        .batch_execute(&format!("DROP TABLE {today}"))
        .await
        .unwrap();
    // One datagram, so one batch: yesterday's five, which have a partition, and today's five.
    let late = (0..5).map(|i| ("mixed".to_owned(), yesterday_late() - i));
    let clicks: Vec<_> = late
        .chain((0..5).map(|i| ("mixed".to_owned(), now - i)))
        .collect();
    send_all(&p.path, datagrams(32, &clicks)).await;
    c.service
        .wait_for_log("5 clicks of a day not over yet have no partition", LIMIT)
        .await;
    p.client
        .batch_execute("SELECT ensure_click_partition(current_date)")
        .await
        .unwrap();
    await_rows(&p.client, Some("mixed"), 10).await;
    let aside = "SELECT count(*) FROM clicks_set_aside WHERE code = 'mixed'";
    assert_eq!(count(&p.client, aside).await, 0, "none set aside");
}

/// Today's partition detached by hand (and kept under its name) after the writer's connection
/// learnt to COPY straight into it: the next batch is not written into the detached table, out
/// of `clicks` while counted in `click_totals`; it waits until the day has a partition again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_not_written_into_todays_partition_detached_by_hand() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &[]).await;
    let today = partition_of(&p.client, protocol::now_us()).await;
    send_all(&p.path, vec![datagram(41, 0, "before", 5)]).await;
    await_rows(&p.client, Some("before"), 5).await;
    let detach = format!("ALTER TABLE clicks DETACH PARTITION {today}");
    p.client.batch_execute(&detach).await.unwrap();
    send_all(&p.path, vec![datagram(41, 1, "after", 5)]).await;
    c.service
        .wait_for_log(
            &format!("{today} is no longer a partition of clicks"),
            LIMIT,
        )
        .await;
    let renamed = format!(
        "ALTER TABLE {today} RENAME TO {today}_archived;
         SELECT ensure_click_partition(current_date)"
    );
    p.client.batch_execute(&renamed).await.unwrap();
    await_rows(&p.client, Some("after"), 5).await;
    let archived = format!("SELECT count(*) FROM {today}_archived WHERE code = 'after'");
    assert_eq!(
        count(&p.client, &archived).await,
        0,
        "none in the detached table"
    );
}

/// The last millisecond of yesterday (UTC): within the collector's default window, on a day
/// before today.
fn yesterday_late() -> i64 {
    let now = protocol::now_us();
    now - now.rem_euclid(86_400_000_000) - 1_000
}

/// The name of the partition of the day of `at_us`.
async fn partition_of(client: &tokio_postgres::Client, at_us: i64) -> String {
    let sql = format!(
        "SELECT 'clicks_p' || to_char(to_timestamp({at_us} / 1e6) AT TIME ZONE 'UTC', 'YYYYMMDD')"
    );
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// Once the collector's first round of partitions is done (it indexes yesterday's, `name`,
/// last): the next is a minute away.
async fn after_first_round(c: &Collector, name: &str) {
    c.service
        .wait_for_log(&format!("indexed partition {name}"), LIMIT)
        .await;
}

/// A datagram of `sender` (seq 0) of `n` clicks of `code` dated in the last millisecond of
/// yesterday (UTC).
fn late_clicks(sender: u64, code: &str, n: usize) -> Vec<u8> {
    let late = yesterday_late();
    let mut enc = Encoder::new(sender, DEFAULT_DATAGRAM).unwrap();
    for i in 0..n {
        enc.push_with(code, late + i as i64, &Default::default())
            .unwrap();
    }
    enc.datagram().to_vec()
}

/// Functions in `schema` that shadow two the collector calls by name, each recording its call
/// in `audit.shadow_calls` and then doing what the real one does: `to_char(date, text)`, a
/// better match than the catalog's `to_char(timestamp, text)` for the partitions' names
/// (ensure_click_partition, the COPY's partition lookup), and `hashtextextended(text,
/// integer)`, a better one than `(text, bigint)` for the instance lock's literal 0.
fn shadows(schema: &str) -> String {
    format!(
        "CREATE FUNCTION {schema}.to_char(date, text) RETURNS text LANGUAGE sql AS $$
             INSERT INTO audit.shadow_calls (called) VALUES ('{schema}.to_char');
             SELECT pg_catalog.to_char($1::timestamp, $2) $$;
         CREATE FUNCTION {schema}.hashtextextended(text, integer) RETURNS bigint LANGUAGE sql AS $$
             INSERT INTO audit.shadow_calls (called) VALUES ('{schema}.hashtextextended');
             SELECT pg_catalog.hashtextextended($1, $2) $$;"
    )
}

/// Nothing in `audit.shadow_calls`: no shadow ran.
async fn assert_no_shadow_called(client: &tokio_postgres::Client, when: &str) {
    let sql = "SELECT called || ' as ' || by_role FROM audit.shadow_calls";
    let calls = testkit::pgtest::strings(client, sql).await;
    assert!(
        calls.is_empty(),
        "the collector called the shadows {when}: {calls:?}"
    );
}

/// PostgreSQL 14 and older let every role create objects in schema public, and the collector
/// calls functions unqualified: a role that may connect could put one there that the
/// collector would run with its own privileges. Here on PostgreSQL 15 with 14's default put
/// back before the migrations run, another login role tries that in public, and in a schema
/// of its own named like the collector's login role (the default search path's "$user"; it is
/// let create schemas for that). The collector's whole round (start: lock, migrations,
/// partitions; a batch; a fold and the pruning) never calls either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_connect_cannot_shadow_the_functions_the_collector_calls() {
    let db = testkit::pgtest::cluster().fresh_database().await;
    let mut client = testkit::pgtest::connect(&db.url).await;
    // Roles are the cluster's: one of its own for each test database.
    let mallory = format!("mallory_{}", db.name);
    client
        .batch_execute(&format!(
            "ALTER SCHEMA public OWNER TO postgres;
             GRANT CREATE ON SCHEMA public TO PUBLIC;
             CREATE ROLE {mallory} LOGIN;
             GRANT CREATE ON DATABASE {name} TO {mallory};
             CREATE SCHEMA audit;
             CREATE TABLE audit.shadow_calls (called text NOT NULL, by_role name NOT NULL
                                              DEFAULT current_user);
             GRANT USAGE ON SCHEMA audit TO PUBLIC;
             GRANT INSERT ON audit.shadow_calls TO PUBLIC;",
            name = db.name
        ))
        .await
        .unwrap();
    schema::apply(&mut client).await.unwrap();

    let intruder = testkit::pgtest::connect(&format!("{} user={mallory}", db.url)).await;
    // The collector connects as the harness's superuser, `postgres`.
    let in_own_schema = format!(
        "CREATE SCHEMA postgres; GRANT USAGE ON SCHEMA postgres TO PUBLIC; {}",
        shadows("postgres")
    );
    intruder.batch_execute(&in_own_schema).await.unwrap();
    let in_public = intruder.batch_execute(&shadows("public")).await;

    let (_dir, path) = socket_path();
    let flags = ["--compact-interval", "100ms"];
    let c = start_collector(&db, &path, &flags).await;
    assert_no_shadow_called(&client, "at start").await;
    send_all(&path, vec![datagram(12, 0, "shadowed", 5)]).await;
    await_rows(&client, None, 5).await;
    c.await_metric("collector_clicks_written_total", 5.0).await;
    testkit::eventually("a fold", LIMIT, || async {
        (c.metric("collector_compactions_total").await >= 1.0).then_some(())
    })
    .await;
    assert_no_shadow_called(&client, "writing a batch and folding").await;
    let refused = in_public.as_ref().err().and_then(|e| e.code());
    assert_eq!(
        refused,
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "another role created functions in schema public: {in_public:?}"
    );
}
