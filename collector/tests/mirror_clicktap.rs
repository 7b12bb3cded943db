//! `clicktap listen` on the collector's `--mirror` target shows the live traffic while the
//! collector keeps writing every click, and the collector carries on when the tap goes away.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::Signal;
use testkit::db::await_rows;
use testkit::services::Collector;
use testkit::{binary, eventually, Service, LIMIT};

fn clicktap(args: &[&str], socket: &Path) -> Command {
    let mut cmd = Command::new(binary("clicktap"));
    cmd.args(args)
        .arg("--socket")
        .arg(socket)
        .env("RUST_LOG", "info");
    cmd
}

/// Runs `clicktap send` to its end and checks it sent `count` clicks.
async fn send(socket: &Path, sender: &str, count: usize) {
    let count = count.to_string();
    let flags = [
        "send", "--code", "m1,m2,m3", "--count", &count, "--batch", "50", "--sender", sender,
    ];
    let mut service = Service::spawn("clicktap send", clicktap(&flags, socket));
    let status = service.wait_exit(LIMIT).await;
    assert!(
        status.success(),
        "clicktap send failed: {:?}",
        service.log()
    );
}

/// The clicks listen has shown so far: the sum of `clicks=N` over its complete lines.
fn tapped_clicks(out: &Path) -> usize {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete
        .lines()
        .map(|line| {
            assert!(line.starts_with("sender="), "not a datagram line: {line}");
            line.split_whitespace()
                .find_map(|field| field.strip_prefix("clicks="))
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no clicks=N in {line}"))
        })
        .sum()
}

async fn await_tapped(out: &Path, n: usize) {
    let what = format!("clicktap listen to show {n} clicks");
    eventually(&what, LIMIT, || async {
        (tapped_clicks(out) >= n).then_some(())
    })
    .await;
    assert_eq!(
        tapped_clicks(out),
        n,
        "the tap showed more clicks than were sent"
    );
}

#[tokio::test]
async fn listen_on_the_mirror_shows_live_traffic_while_the_collector_writes() {
    let db = testkit::pgtest::test_db().await;
    let client = testkit::pgtest::connect(&db.url).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("collector.sock");
    let tap = dir.path().join("tap.sock");
    let tap_out: PathBuf = dir.path().join("tap.out");

    let mut listen_cmd = clicktap(&["listen"], &tap);
    listen_cmd.stdout(std::fs::File::create(&tap_out).unwrap());
    let mut listen = Service::spawn("clicktap listen", listen_cmd);
    listen.wait_for_log("listening on", LIMIT).await;

    let mirror = ["--mirror", tap.to_str().unwrap()];
    let mut collector = Collector::start(&db.url, &socket, &mirror).await;

    // Two rounds, each seen by the tap and written by the collector before the next starts.
    send(&socket, "11", 500).await;
    await_tapped(&tap_out, 500).await;
    await_rows(&client, None, 500).await;
    send(&socket, "12", 300).await;
    await_tapped(&tap_out, 800).await;
    await_rows(&client, None, 800).await;

    listen.signal(Signal::SIGTERM);
    assert!(listen.wait_exit(LIMIT).await.success());
    assert!(!tap.exists(), "clicktap listen left its socket behind");

    // With nobody on the mirror, the collector still writes everything.
    send(&socket, "13", 200).await;
    await_rows(&client, None, 1000).await;

    collector.service.signal(Signal::SIGTERM);
    assert!(collector.service.wait_exit(LIMIT).await.success());
}

/// A `--mirror` that names the collector's own socket is refused at start: every datagram
/// forwarded would come back to be forwarded again, for ever, filling the queue. Also where
/// the socket is the one systemd passed, bound at a path other than `--socket`'s, and where
/// the mirror names it through a symbolic link. Refused
/// before the database steps: the database here is unreachable, which they would wait on
/// (and a collector that failed after them restarted into them again, for ever).
#[tokio::test]
async fn a_mirror_on_the_collectors_own_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("collector.sock");
    let own = socket.to_str().unwrap();
    let refused = |cmd| async {
        let mut collector = Service::spawn("collector", cmd);
        let status = collector.wait_exit(LIMIT).await;
        assert!(!status.success(), "{status}");
        let log = collector.log().join("\n");
        assert!(log.contains("is the collector's own socket"), "{log}");
    };
    refused(testkit::services::collector_command(
        testkit::UNREACHABLE_DB,
        &socket,
        &["--mirror", own],
    ))
    .await;
    // Spelt through a symbolic link to its directory, before it is bound: no file to compare.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    let through_link = link.join("collector.sock");
    let mirror = ["--mirror", through_link.to_str().unwrap()];
    refused(testkit::services::collector_command(
        testkit::UNREACHABLE_DB,
        &socket,
        &mirror,
    ))
    .await;
    let passed = shared::socket::bind_datagram(&socket, 0o600).unwrap();
    let elsewhere = dir.path().join("not-bound.sock");
    let cmd = testkit::services::collector_command(
        testkit::UNREACHABLE_DB,
        &elsewhere,
        &["--mirror", own],
    );
    let fd = std::os::fd::AsRawFd::as_raw_fd(&passed);
    refused(testkit::socket_activated(&cmd, fd)).await;
}
