//! The private-PostgreSQL test harness itself: parallel tests get databases of their own.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use testkit::pgtest;

/// Both parallel tests meet here after creating their databases, so each one looks for the
/// other's row only once that row exists.
static MET: (Mutex<u32>, Condvar) = (Mutex::new(0), Condvar::new());

fn meet_the_other_test() {
    let (count, cv) = &MET;
    let mut n = count.lock().unwrap();
    *n += 1;
    cv.notify_all();
    let (n, timeout) = cv
        .wait_timeout_while(n, Duration::from_secs(60), |n| *n < 2)
        .unwrap();
    assert!(
        !timeout.timed_out(),
        "the other parallel test never arrived ({} of 2); run without --test-threads=1",
        *n
    );
}

async fn write_marker_and_check_isolation(marker: &str, other: &str) {
    let db = pgtest::cluster().fresh_database().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(&format!(
            "CREATE TABLE marker (who text); INSERT INTO marker VALUES ('{marker}')"
        ))
        .await
        .unwrap();
    tokio::task::block_in_place(meet_the_other_test);
    let seen: Vec<String> = client
        .query("SELECT who FROM marker", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seen, [marker], "database {} saw {other}'s row", db.name);
    let name: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, db.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn parallel_test_a_sees_only_its_database() {
    write_marker_and_check_isolation("a", "b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn parallel_test_b_sees_only_its_database() {
    write_marker_and_check_isolation("b", "a").await;
}

#[test]
fn cluster_listens_on_a_unix_socket_only() {
    let dir = pgtest::cluster().socket_dir();
    assert!(dir.join(".s.PGSQL.5432").exists());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = pgtest::cluster().connect("postgres").await;
        let listen: String = client
            .query_one("SHOW listen_addresses", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(listen, "");
    });
}

#[test]
fn finds_the_server_binaries() {
    let bin = pgtest::find_bindir().expect("initdb and pg_ctl");
    assert!(bin.join("initdb").is_file());
}
