//! Migration 4: the change log of `links` the redirectors follow (pruned by id since 15).

use testkit::pgtest;

async fn logged(client: &tokio_postgres::Client) -> Vec<String> {
    let rows = client
        .query("SELECT code FROM link_changes ORDER BY id, code", &[])
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

async fn state(client: &tokio_postgres::Client) -> (i64, i64, i64) {
    let row = client
        .query_one(
            "SELECT pruned_id, pruned_xid::text::bigint, epoch FROM link_changes_state",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Calls prune_link_changes(keep) on `client`: how many rows it deleted.
async fn prune(client: &impl tokio_postgres::GenericClient, keep: &str) -> i64 {
    client
        .query_one("SELECT prune_link_changes($1::text::interval)", &[&keep])
        .await
        .unwrap()
        .get(0)
}

/// What `calls` runs of the prune `sql` deleted, each, and the rows of the change log they
/// fetched; failing if any read the whole log. In one transaction of a session of its own:
/// `pg_stat_xact_user_tables` counts what it has done and not flushed.
async fn prunes_read(db: &pgtest::TestDb, sql: &str, calls: usize) -> (Vec<i64>, i64) {
    let mut fresh = pgtest::connect(&db.url).await;
    let tx = fresh.transaction().await.unwrap();
    let mut pruned = Vec::new();
    for _ in 0..calls {
        pruned.push(tx.query_one(sql, &[]).await.unwrap().get(0));
    }
    let read = tx
        .query_one(
            "SELECT seq_scan, idx_tup_fetch FROM pg_stat_xact_user_tables
             WHERE relname = 'link_changes'",
            &[],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (scans, fetched): (i64, i64) = (read.get(0), read.get(1));
    assert_eq!(scans, 0, "a prune read the whole change log");
    (pruned, fetched)
}

/// Four statements after `setup` (three links inserted, one's URL changed, one renamed, one
/// deleted): what the log then holds.
async fn four_changes_logged(client: &tokio_postgres::Client, setup: &str) -> Vec<String> {
    let changes = "INSERT INTO links (code, url) SELECT 'c' || n, 'https://x/' || n FROM generate_series(1, 3) AS n;
                   UPDATE links SET url = 'https://y/' WHERE code = 'c1';
                   UPDATE links SET code = 'renamed' WHERE code = 'c2';
                   DELETE FROM links WHERE code = 'c3';";
    client
        .batch_execute(&format!("{setup}{changes}"))
        .await
        .unwrap();
    logged(client).await
}

/// What the log holds after `four_changes_logged`'s statements: each code each changed.
const FOUR_CHANGES: [&str; 7] = ["c1", "c2", "c3", "c1", "c2", "renamed", "c3"];

#[tokio::test]
async fn every_changed_code_is_logged_once_per_statement_and_a_rename_logs_both() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    assert_eq!(four_changes_logged(&client, "").await, FOUR_CHANGES);
}

/// Neither prune takes `max()` of an `xid8`, an aggregate PostgreSQL has only from 15 on
/// (migration 22): on 13 and 14 every prune failed. Read from the functions as installed, as
/// this machine has no older server to run them on; the test below checks what they record.
#[tokio::test]
async fn the_prunes_take_no_aggregate_that_postgresql_14_lacks() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let sql = "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname = 'prune_link_changes'";
    let definitions = pgtest::strings(&client, sql).await;
    assert_eq!(definitions.len(), 2, "both versions");
    for definition in definitions {
        let lower = definition.to_lowercase();
        for aggregate in ["max(", "min("] {
            for call in lower.split(aggregate).skip(1) {
                let argument = call.split(')').next().unwrap_or_default();
                assert!(!argument.contains("xid"), "{aggregate}: {definition}");
            }
        }
    }
}

#[tokio::test]
async fn truncate_bumps_the_epoch_and_pruning_records_how_far_it_went() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO links (code, url) VALUES ('a', 'https://x/'), ('b', 'https://x/')",
        )
        .await
        .unwrap();
    assert_eq!(state(&client).await, (0, 0, 0));
    client.batch_execute("TRUNCATE links").await.unwrap();
    assert_eq!(state(&client).await.2, 1);

    let kept = prune(&client, "1 hour").await;
    assert_eq!(kept, 0, "nothing is an hour old");
    let top: (i64, i64) = client
        .query_one(
            "SELECT max(id), max(xid::text::bigint) FROM link_changes",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    pgtest::await_link_changes_prunable(&client).await;
    let pruned = prune(&client, "0 s").await;
    assert_eq!(pruned, 2);
    assert!(logged(&client).await.is_empty());
    assert_eq!(state(&client).await, (top.0, top.1, 1));
}

#[tokio::test]
async fn a_role_that_may_only_change_links_still_logs_its_changes() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let role = format!("linker_{}", db.name);
    client
        .batch_execute(&format!(
            "CREATE ROLE {role};
             GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON links TO {role};
             SET ROLE {role};
             INSERT INTO links (code, url) VALUES ('mine', 'https://x/');
             TRUNCATE links;
             RESET ROLE;"
        ))
        .await
        .unwrap_or_else(|e| panic!("{}", shared::db::describe(&e)));
    assert_eq!(logged(&client).await, ["mine"]);
    assert_eq!(state(&client).await.2, 1);
}

/// Migration 21: a session as a replica (what a logical replication subscription's apply
/// worker is, and the only sessions whose row triggers it fires) logs each changed row, renames
/// under both codes, and its TRUNCATE bumps the epoch; an ordinary session logs once a
/// statement, as before (the first test), not a row more.
#[tokio::test]
async fn a_replica_sessions_changes_are_logged_row_by_row_and_its_truncate_bumps_the_epoch() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let replica = "SET session_replication_role = replica;";
    assert_eq!(four_changes_logged(&client, replica).await, FOUR_CHANGES);
    client.batch_execute("TRUNCATE links").await.unwrap();
    assert_eq!(state(&client).await.2, 1);
}

/// Migration 21's modes as `ALTER TABLE links ENABLE TRIGGER ALL` leaves them (a data-only
/// pg_restore --disable-triggers ends with it): an ordinary session still logs once a
/// statement, not twice, and a replica session's changes go unlogged, until the collector's
/// start sets the modes back, and any other wrong one. A trigger disabled is named, and left
/// so.
#[tokio::test]
async fn modes_reset_by_enable_trigger_all_are_set_back_and_a_disabled_trigger_is_named() {
    let db = pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    client
        .batch_execute("ALTER TABLE links ENABLE TRIGGER ALL")
        .await
        .unwrap();
    assert_eq!(four_changes_logged(&client, "").await, FOUR_CHANGES);
    client
        .batch_execute(
            "TRUNCATE links, link_changes;
             ALTER TABLE links ENABLE REPLICA TRIGGER links_truncated;
             ALTER TABLE links DISABLE TRIGGER links_changed",
        )
        .await
        .unwrap();
    let epoch = state(&client).await.2;
    let wait = std::time::Duration::from_secs(1);
    let found = schema::restore_link_trigger_modes(&mut client, wait)
        .await
        .unwrap();
    let wrong = [
        ("links_log_replicated", "O".into()),
        ("links_truncated", "R".into()),
    ];
    assert_eq!(found.wrong, wrong);
    assert_eq!(found.disabled, ["links_changed"]);
    assert!(found.missing.is_empty());
    assert_eq!(
        pgtest::link_trigger_modes(&client).await,
        [
            "links_changed D",
            "links_log_replicated R",
            "links_truncated A"
        ]
    );
    let replica = "SET session_replication_role = replica;";
    assert_eq!(four_changes_logged(&client, replica).await, FOUR_CHANGES);
    assert_eq!(
        state(&client).await.2,
        epoch + 1,
        "every redirector reloaded"
    );
    let again = schema::restore_link_trigger_modes(&mut client, wait)
        .await
        .unwrap();
    assert_eq!(again.set_back, None, "nothing more to set back: {again:?}");
    assert_eq!(again.disabled, ["links_changed"]);
    assert_eq!(
        state(&client).await.2,
        epoch + 1,
        "no reload for right modes"
    );
}

/// Two collectors that find the modes wrong at once (both read them before either sets them
/// back: a writer holds links meanwhile) set them back, and reload every redirector, once:
/// the second reads them again under the lock and finds them right.
#[tokio::test]
async fn modes_two_collectors_find_wrong_at_once_are_set_back_once() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let reset = "ALTER TABLE links ENABLE TRIGGER ALL";
    client.batch_execute(reset).await.unwrap();
    let mut writer = pgtest::connect(&db.url).await;
    let tx = writer.transaction().await.unwrap();
    let lock = "LOCK TABLE links IN ROW EXCLUSIVE MODE";
    tx.batch_execute(lock).await.unwrap();
    let wait = std::time::Duration::from_secs(60);
    let mut looks = Vec::new();
    for _ in 0..2 {
        let mut collector = pgtest::connect(&db.url).await;
        looks.push(tokio::spawn(async move {
            schema::restore_link_trigger_modes(&mut collector, wait).await
        }));
    }
    let waiting = "SELECT count(*) FROM pg_locks
                   WHERE relation = 'links'::regclass AND mode = 'ShareRowExclusiveLock'
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND NOT granted";
    testkit::eventually(
        "both looks waiting for the lock",
        testkit::LIMIT,
        || async {
            let n: i64 = client.query_one(waiting, &[]).await.unwrap().get(0);
            (n == 2).then_some(())
        },
    )
    .await;
    tx.rollback().await.unwrap();
    let mut set_back = 0;
    for look in looks {
        let found = look.await.unwrap().unwrap();
        set_back += usize::from(found.set_back.is_some());
    }
    assert_eq!(set_back, 1, "one of the two set the modes back");
    assert_eq!(state(&client).await.2, 1, "every redirector reloaded once");
    let theirs = pgtest::LINK_TRIGGER_MODES;
    assert_eq!(pgtest::link_trigger_modes(&client).await, theirs);
}

/// A collector's own role, a member of `clicks_collector` (which owns links) and no
/// superuser, as `systemd/database.sql` makes it, sets the modes back.
#[tokio::test]
async fn modes_are_set_back_by_a_member_of_the_owner() {
    let db = pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    let role = format!("collector_{}", db.name);
    let setup = format!(
        "ALTER TABLE links ENABLE TRIGGER ALL;
         CREATE ROLE {role} IN ROLE clicks_collector;
         SET ROLE {role}"
    );
    client.batch_execute(&setup).await.unwrap();
    let epoch = state(&client).await.2;
    let wait = std::time::Duration::from_secs(5);
    let found = schema::restore_link_trigger_modes(&mut client, wait).await;
    assert!(found.unwrap().set_back.is_some());
    assert_eq!(state(&client).await.2, epoch + 1);
    assert_eq!(
        pgtest::link_trigger_modes(&client).await,
        pgtest::LINK_TRIGGER_MODES
    );
}

/// A role that may write links but does not own it cannot set the modes back: it is refused
/// at once, rather than after holding up every writer of links behind its wait for the lock.
#[tokio::test]
async fn modes_are_not_set_back_by_a_role_that_does_not_own_links() {
    let db = pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    let role = format!("writer_{}", db.name);
    let setup = format!(
        "ALTER TABLE links ENABLE TRIGGER ALL;
         CREATE ROLE {role}; GRANT UPDATE ON links TO {role}"
    );
    client.batch_execute(&setup).await.unwrap();
    let writer = pgtest::connect(&db.url).await;
    writer
        .batch_execute("BEGIN; LOCK TABLE links IN ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    let set_role = format!("SET ROLE {role}");
    client.batch_execute(&set_role).await.unwrap();
    let wait = std::time::Duration::from_secs(60);
    let refused = schema::restore_link_trigger_modes(&mut client, wait).await;
    let error = refused.expect_err("not the owner");
    let code = error.code();
    assert_eq!(
        code,
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{error}"
    );
    client.batch_execute("RESET ROLE").await.unwrap();
    let found = schema::link_trigger_modes(&client).await.unwrap();
    assert_eq!((found.wrong.len(), found.not_firing()), (3, 3));
}

/// Migration 16: the log's trigger functions run as their owner, and PostgreSQL checks who may
/// execute a trigger's function only when the trigger is made. Any role (the link reader here)
/// could once attach them to a temporary table of its own and, as their owner, log made-up
/// codes or bump the epoch (every redirector then loads its whole table); nor does either run
/// for another table, whoever attached it.
#[tokio::test]
async fn nobody_else_may_attach_the_logs_trigger_functions_to_a_table_of_its_own() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let role = format!("reader_{}", db.name);
    let grant = format!("CREATE ROLE {role}; GRANT clicks_link_reader TO {role}");
    client.batch_execute(&grant).await.unwrap();
    for function in [
        "log_link_changes",
        "bump_links_epoch",
        "log_replicated_link_change",
    ] {
        let attach = format!(
            "SET ROLE {role};
             CREATE TEMP TABLE mine (code text);
             CREATE TRIGGER t AFTER TRUNCATE ON mine
             FOR EACH STATEMENT EXECUTE FUNCTION public.{function}()"
        );
        let refused = client.batch_execute(&attach).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{function}: {}",
            shared::db::describe(&refused)
        );
    }
    client
        .batch_execute(
            "RESET ROLE;
             CREATE TABLE other (code text);
             CREATE TRIGGER t AFTER TRUNCATE ON other
             FOR EACH STATEMENT EXECUTE FUNCTION bump_links_epoch();
             CREATE TRIGGER r AFTER INSERT ON other
             FOR EACH ROW EXECUTE FUNCTION log_replicated_link_change()",
        )
        .await
        .unwrap();
    let refused = client.batch_execute("TRUNCATE other").await.unwrap_err();
    let message = shared::db::describe(&refused);
    assert!(message.contains("truncations of links only"), "{message}");
    let insert = "INSERT INTO other VALUES ('made-up')";
    let refused = client.batch_execute(insert).await.unwrap_err();
    let message = shared::db::describe(&refused);
    assert!(message.contains("changes of links only"), "{message}");
    assert_eq!(state(&client).await.2, 0, "the epoch untouched");
}

/// Migration 17: a prune deletes no row of a transaction newer than the oldest one running, so
/// that a reader of a hot standby (which takes every transaction from that one on as perhaps
/// unread) never finds the log pruned past it at every poll while a transaction stays open
/// longer than the prune's age.
#[tokio::test]
async fn pruning_keeps_the_rows_of_transactions_newer_than_one_still_running() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let open = pgtest::connect(&db.url).await;
    open.batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO links (code, url) VALUES ('after', 'https://x/');
             UPDATE link_changes SET changed_at = now() - interval '2 hours'",
        )
        .await
        .unwrap();
    assert_eq!(prune(&client, "1 hour").await, 0, "newer than the open one");
    open.batch_execute("COMMIT").await.unwrap();
    // Transactions are the cluster's: another test's, in its own database, can hold the
    // oldest running one back a moment longer.
    testkit::eventually(
        "the row pruned once the open one ended",
        testkit::LIMIT,
        || async { (prune(&client, "1 hour").await == 1).then_some(()) },
    )
    .await;
    assert!(logged(&client).await.is_empty());
}

/// Migration 15: a prune reads the rows it deletes through the primary key, not the whole log
/// (which at 100 changes a second holds millions of rows a day), and an old row logged after
/// one it keeps waits for a later prune rather than going early.
#[tokio::test]
async fn pruning_reads_the_rows_it_deletes_not_the_whole_log() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO links (code, url)
                 SELECT 'c' || n, 'https://x/' || n FROM generate_series(1, 10000) AS n;
             UPDATE link_changes SET changed_at = now() - interval '2 hours'
              WHERE id < (SELECT min(id) + 100 FROM link_changes)
                 OR id = (SELECT max(id) FROM link_changes);
             ANALYZE link_changes;",
        )
        .await
        .unwrap();
    let last: i64 = client
        .query_one("SELECT max(id) FROM link_changes", &[])
        .await
        .unwrap()
        .get(0);

    pgtest::await_link_changes_prunable(&client).await;
    // Six calls: PL/pgSQL plans a statement anew for its first five, then may keep a generic
    // plan, which must not read the log either. Only the first finds anything due.
    let (pruned, fetched) =
        prunes_read(&db, "SELECT prune_link_changes(interval '1 hour')", 6).await;
    assert_eq!(
        pruned,
        [100, 0, 0, 0, 0, 0],
        "the hundred oldest rows, not the old one logged last"
    );
    // The first call fetches the 100 rows twice (the search passes them, the DELETE takes
    // them) and the row kept once; each call after it, the row kept.
    assert!(
        fetched <= 2 * 100 + 1 + 5,
        "six prunes fetched {fetched} rows to delete 100"
    );
    assert_eq!(
        state(&client).await.0,
        last - 9900,
        "pruned_id is the last one deleted"
    );

    client
        .batch_execute("UPDATE link_changes SET changed_at = now() - interval '2 hours'")
        .await
        .unwrap();
    let pruned = prune(&client, "1 hour").await;
    assert_eq!(
        pruned, 9900,
        "once every row is old, the one that waited goes too"
    );
    assert_eq!(state(&client).await.0, last);
}

/// Migration 20: a prune in slices deletes at most a slice a call, the oldest first, and reads
/// about as many rows as it deletes: a day after a bulk change of millions of links, each call
/// is short. Like the whole prune, it stops at the first row it keeps.
#[tokio::test]
async fn pruning_in_slices_deletes_a_slice_a_call_and_stops_at_a_row_it_keeps() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO links (code, url)
                 SELECT 'c' || n, 'https://x/' || n FROM generate_series(1, 20000) AS n;
             UPDATE link_changes SET changed_at = now() - interval '2 hours'
              WHERE id <> (SELECT min(id) + 599 FROM link_changes);
             ANALYZE link_changes;",
        )
        .await
        .unwrap();
    let first: i64 = client
        .query_one("SELECT min(id) FROM link_changes", &[])
        .await
        .unwrap()
        .get(0);
    pgtest::await_link_changes_prunable(&client).await;
    let (pruned, fetched) =
        prunes_read(&db, "SELECT prune_link_changes(interval '1 hour', 400)", 3).await;
    assert_eq!(
        pruned,
        [400, 199, 0],
        "a slice, then up to the row kept (the 600th), then nothing"
    );
    // The first call reads its 401 rows twice (no young one among them, then the 401st) and
    // deletes 400; the second reads up to the row kept and deletes the 199 before it.
    assert!(
        fetched <= 3 * 401 + 2 * 200 + 5,
        "three slices fetched {fetched} rows to delete 599"
    );
    assert_eq!(
        state(&client).await.0,
        first + 598,
        "pruned_id: the last deleted"
    );
}
