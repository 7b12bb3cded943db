//! Drives the real `clicktap` binary against real Unix sockets in temp dirs.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use protocol::wire::{self, Encoder, DEFAULT_DATAGRAM};
use serde_json::Value;
use shared::socket::{bind_datagram, SendErrorKind};
use testkit::{eventually, Service};

const LIMIT: Duration = Duration::from_secs(20);
/// The design's golden vector: sender 12345, seq 7, base_us -5, clicks ("seed1", 0), ("x", 300).
const GOLDEN: &str = "01b960070902057365656431000178ac02";

/// The binary, with the log level the tests wait on ("listening on" is logged at info).
fn clicktap() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_clicktap"));
    cmd.env("RUST_LOG", "info").env_remove("CLICKS_SOCKET");
    testkit::signals_as_from_a_terminal(&mut cmd);
    cmd
}

/// Runs a clicktap command that ends by itself, feeding it `stdin`.
fn run(mut cmd: Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting clicktap");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin)
        .expect("writing clicktap's stdin");
    child.wait_with_output().expect("waiting for clicktap")
}

fn run_args(args: &[&str]) -> Output {
    let mut cmd = clicktap();
    cmd.args(args);
    run(cmd, b"")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a clean failure: exit status 1, `needle` in the one-line error, no panic.
fn assert_fails_with(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in stderr: {err}");
    assert!(!err.contains("panicked"), "clicktap panicked: {err}");
}

/// Runs the command as `nobody` when the tests run as root, whom permissions do not stop.
fn unprivileged(mut cmd: Command) -> Command {
    if nix::unistd::geteuid().is_root() {
        cmd.uid(65534).gid(65534);
    }
    cmd
}

fn world_readable_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    set_mode(dir.path(), 0o755);
    dir
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The complete lines written to `path` so far.
fn complete_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
    lines.pop(); // after the last newline: empty, or a line still being written
    lines
}

/// A running `clicktap listen` whose stdout goes to a file next to its socket.
struct Listen {
    service: Service,
    out: PathBuf,
}

impl Listen {
    async fn start(socket: &Path, flags: &[&str]) -> Listen {
        Listen::start_as(clicktap(), socket, flags).await
    }

    async fn start_as(mut cmd: Command, socket: &Path, flags: &[&str]) -> Listen {
        let out = socket.with_extension("out");
        let file = std::fs::File::create(&out).expect("creating listen's output file");
        cmd.arg("listen")
            .arg("--socket")
            .arg(socket)
            .args(flags)
            .stdout(file);
        let service = Service::spawn("listen", cmd);
        service.wait_for_log("listening on", LIMIT).await;
        Listen { service, out }
    }

    fn lines(&self) -> Vec<String> {
        complete_lines(&self.out)
    }

    fn json(&self) -> Vec<Value> {
        self.lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// Waits until the JSON lines satisfy `done`; returns them.
    async fn json_until(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        eventually(what, LIMIT, || {
            let lines = self.json();
            let ready = done(&lines);
            async move { ready.then_some(lines) }
        })
        .await
    }

    async fn stop(mut self, signal: Signal) -> ExitStatus {
        self.service.signal(signal);
        self.service.wait_exit(LIMIT).await
    }
}

/// Runs `clicktap send` to its end (bounded, as it may wait on a full queue); returns its
/// exit status and stdout.
async fn send(socket: &Path, flags: &[&str]) -> (ExitStatus, String) {
    let out = socket.with_extension("send");
    let mut cmd = clicktap();
    cmd.arg("send")
        .arg("--socket")
        .arg(socket)
        .args(flags)
        .stdout(std::fs::File::create(&out).expect("creating send's output file"));
    let mut service = Service::spawn("send", cmd);
    let status = service.wait_exit(LIMIT).await;
    (status, complete_lines(&out).join("\n"))
}

fn sum(values: &[Value], field: &str) -> u64 {
    values.iter().filter_map(|v| v[field].as_u64()).sum()
}

/// Started with SIGINT ignored, as a shell without job control starts a command in the
/// background of a script, listen leaves it so (the script's Ctrl-C is not for it), and stops
/// at SIGTERM.
#[tokio::test]
async fn listen_started_with_sigint_ignored_runs_on_past_one() {
    use nix::sys::signal::{signal, SigHandler};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let mut cmd = clicktap();
    // SAFETY: signal(2) only, between fork and exec; after clicktap()'s own, so it is the last.
    unsafe {
        cmd.pre_exec(|| {
            signal(Signal::SIGINT, SigHandler::SigIgn)
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let listen = Listen::start_as(cmd, &socket, &["--json"]).await;
    listen.service.signal(Signal::SIGINT);
    // Two datagrams, one after the other is shown: a listen that took the SIGINT as a stop
    // shows the first at most, and the second is refused or never shown.
    for seq in [0, 1] {
        send_seq(&socket, 9, seq);
        listen
            .json_until(&format!("datagram {seq} shown after a SIGINT"), |lines| {
                lines.len() > seq as usize
            })
            .await;
    }
    let status = listen.stop(Signal::SIGTERM).await;
    assert!(status.success(), "listen exited with {status}");
}

#[tokio::test]
async fn send_into_listen_shows_every_click() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let listen = Listen::start(&socket, &["--json"]).await;

    let (status, summary) = send(
        &socket,
        &[
            "--code", "a", "b", "c", "--count", "1000", "--batch", "64", "--sender", "42",
        ],
    )
    .await;
    assert!(status.success(), "send failed: {summary}");
    assert!(
        summary.contains("sent 16 datagrams, 1000 clicks (seq 0..=15) as sender 42"),
        "{summary}"
    );
    let errors = summary.split("send errors: ").nth(1).unwrap_or_default();
    assert!(
        errors == "none" || (errors.starts_with("queue_full=") && !errors.contains(',')),
        "only a full queue (waited out) may delay a send: {summary}"
    );

    let lines = listen
        .json_until("listen to show 1000 clicks", |l| sum(l, "clicks") >= 1000)
        .await;
    assert_eq!(sum(&lines, "clicks"), 1000, "{lines:?}");
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..16).collect::<Vec<_>>());
    assert!(lines
        .iter()
        .all(|l| l["sender"] == 42 && l["missing_before"] == 0));
    let mut per_code: BTreeMap<String, u64> = BTreeMap::new();
    for line in &lines {
        for (code, n) in line["codes"].as_object().unwrap() {
            *per_code.entry(code.clone()).or_default() += n.as_u64().unwrap();
        }
    }
    let expected = BTreeMap::from([("a".into(), 334), ("b".into(), 333), ("c".into(), 333)]);
    assert_eq!(per_code, expected);
    assert!(lines
        .iter()
        .all(|l| l["oldest_age_us"].as_i64().unwrap() >= 0));

    let (status, summary) = send(&socket, &["--raw", "03b960"]).await;
    assert!(status.success(), "{summary}");
    let lines = listen
        .json_until("listen to show the rejected datagram", |l| l.len() > 16)
        .await;
    let rejected = &lines[16];
    assert_eq!(rejected["reason"], "wrong_version", "{rejected}");
    assert_eq!(
        rejected["error"],
        "wrong version 3, this build reads version 2"
    );
    assert_eq!(
        (rejected["bytes"].as_u64(), rejected["head"].as_str()),
        (Some(3), Some("03b960"))
    );

    let status = listen.stop(Signal::SIGTERM).await;
    assert!(status.success(), "listen exited with {status}");
    assert!(!socket.exists(), "listen left its socket file behind");
}

/// As the collector's socket, the tap's refuses datagrams that carry descriptors at their
/// sender, on a kernel that can (Linux 6.16 on): closing one as it is read could block it.
#[tokio::test]
async fn listen_refuses_datagrams_carrying_descriptors() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let listen = Listen::start(&socket, &["--json"]).await;
    let sender = UnixDatagram::unbound().unwrap();
    let (_read, write) = nix::unistd::pipe().unwrap();
    let sent = testkit::send_with_fds(&sender, &socket, b"fds", &[write.as_raw_fd()]);
    // Whether this kernel knows the option, asked of a socket of the test's own.
    let can = shared::socket::refuse_descriptors(&UnixDatagram::unbound().unwrap()).unwrap();
    assert_eq!(
        sent.err(),
        can.then_some(nix::errno::Errno::EPERM),
        "sent at a kernel that can refuse: {can}"
    );
    let status = listen.stop(Signal::SIGTERM).await;
    assert!(status.success(), "listen exited with {status}");
}

#[tokio::test]
async fn send_cycles_through_the_codes_of_a_code_file() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let file = dir.path().join("codes.txt");
    std::fs::write(&file, "z\ny\ny\n").unwrap();
    let listen = Listen::start(&socket, &["--json"]).await;
    let file_arg = file.to_str().unwrap();
    let (status, summary) = send(
        &socket,
        &["--code", "x", "--code-file", file_arg, "--count", "8"],
    )
    .await;
    assert!(status.success(), "send failed: {summary}");
    let lines = listen
        .json_until("listen to show 8 clicks", |l| sum(l, "clicks") >= 8)
        .await;
    let codes = &lines[0]["codes"];
    assert_eq!(
        (
            codes["x"].as_u64(),
            codes["z"].as_u64(),
            codes["y"].as_u64()
        ),
        (Some(2), Some(2), Some(4)),
        "{lines:?}"
    );

    let send_file = |path: &str| {
        let socket = socket.to_str().unwrap();
        run_args(&["send", "--socket", socket, "--code-file", path])
    };
    std::fs::write(&file, "ok\nnot ok\n").unwrap();
    assert_fails_with(&send_file(file_arg), "--code-file line 2");
    // A file with no end to its first line is refused at that line, not read whole.
    assert_fails_with(
        &send_file("/dev/zero"),
        "--code-file line 1: longer than any code",
    );
}

#[tokio::test]
async fn listen_text_lines_abbreviate_codes_and_show_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let listen = Listen::start(&socket, &[]).await;

    let codes = "c1,c2,c3,c4,c5,c6,c7";
    let (status, summary) = send(
        &socket,
        &[
            "--code", codes, "--count", "8", "--batch", "8", "--sender", "9",
        ],
    )
    .await;
    assert!(status.success(), "{summary}");
    let with_trailing_byte = format!("{GOLDEN}00");
    let (status, summary) = send(&socket, &["--raw", &with_trailing_byte]).await;
    assert!(status.success(), "{summary}");
    assert!(
        summary.contains("sent 1 raw datagram of 18 bytes"),
        "{summary}"
    );

    let lines = eventually("listen to print two lines", LIMIT, || {
        let lines = listen.lines();
        async move { (lines.len() >= 2).then_some(lines) }
    })
    .await;
    assert!(
        lines[0].starts_with("sender=9 seq=0 version=2 clicks=8 bytes="),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].ends_with(" codes=c1:2,c2,c3,c4,c5 +2 more agent=human:8"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains(" oldest_age="), "{}", lines[0]);
    assert!(
        lines[1].starts_with("REJECTED bytes=18 reason=trailing_bytes "),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].ends_with(&format!("head={with_trailing_byte}")),
        "{}",
        lines[1]
    );

    let status = listen.stop(Signal::SIGINT).await;
    assert!(status.success(), "listen exited with {status}");
    assert!(!socket.exists(), "listen left its socket file behind");
}

/// Sends a well-formed datagram from `sender` with sequence number `seq`.
fn send_seq(to: &Path, sender: u64, seq: u64) {
    let mut encoder = Encoder::new(sender, DEFAULT_DATAGRAM).unwrap();
    for _ in 0..seq {
        encoder.next();
    }
    encoder.push("gap", protocol::now_us()).unwrap();
    UnixDatagram::unbound()
        .unwrap()
        .send_to(encoder.datagram(), to)
        .expect("sending to listen");
}

#[tokio::test]
async fn listen_stats_totals_clicks_rejects_and_gaps_per_sender() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let listen = Listen::start(&socket, &["--stats", "--json"]).await;

    let (status, summary) = send(
        &socket,
        &[
            "--code", "x", "--count", "200", "--rate", "400", "--batch", "10", "--sender", "5",
        ],
    )
    .await;
    assert!(status.success(), "{summary}");
    send_seq(&socket, 77, 0);
    send_seq(&socket, 77, 3);
    let (status, summary) = send(&socket, &["--raw", "01ff"]).await;
    assert!(status.success(), "{summary}");

    let lines = listen
        .json_until("stats lines to total 202 clicks and 1 reject", |l| {
            sum(l, "clicks") >= 202 && sum(l, "rejects") >= 1
        })
        .await;
    assert_eq!(sum(&lines, "clicks"), 202, "{lines:?}");
    assert_eq!(sum(&lines, "datagrams"), 20 + 2 + 1, "{lines:?}");
    assert_eq!(sum(&lines, "rejects"), 1, "{lines:?}");
    let gaps: Vec<&Value> = lines
        .iter()
        .map(|l| &l["gaps"])
        .filter(|g| g.as_object().is_some_and(|g| !g.is_empty()))
        .collect();
    assert_eq!(
        gaps,
        [&serde_json::json!({"77": 2})],
        "only sender 77 skipped seqs 1 and 2"
    );
    for line in &lines {
        for field in ["datagrams_per_s", "clicks_per_s", "bytes_per_s"] {
            assert!(line[field].is_u64(), "{field} missing in {line}");
        }
    }
    assert!(listen.stop(Signal::SIGTERM).await.success());
}

#[tokio::test]
async fn send_waits_out_a_full_queue_and_drops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("slow.sock");
    let receiver = bind_datagram(&socket, 0o600).unwrap();
    let out = dir.path().join("send.out");
    let mut cmd = clicktap();
    cmd.arg("send")
        .arg("--socket")
        .arg(&socket)
        .args([
            "--code", "q", "--count", "200", "--batch", "1", "--sender", "3",
        ])
        .stdout(std::fs::File::create(&out).unwrap());
    let mut sender = Service::spawn("send", cmd);

    // The receive queue holds a few datagrams (net.unix.max_dgram_qlen); once a probe finds it
    // full, the sender, with 200 datagrams to send, must have found it full too.
    let probe = UnixDatagram::unbound().unwrap();
    probe.set_nonblocking(true).unwrap();
    eventually("the receive queue to fill up", LIMIT, || {
        let full = probe
            .send_to(b"", &socket)
            .is_err_and(|e| SendErrorKind::of(&e) == SendErrorKind::QueueFull);
        async move { full.then_some(()) }
    })
    .await;

    receiver.set_read_timeout(Some(LIMIT)).unwrap();
    let mut buf = vec![0u8; wire::MAX_DATAGRAM];
    let mut seqs = Vec::new();
    while seqs.len() < 200 {
        let len = receiver
            .recv(&mut buf)
            .expect("a datagram within the limit");
        if len > 0 {
            seqs.push(wire::decode(&buf[..len]).expect("well-formed").seq);
        }
    }
    assert_eq!(
        seqs,
        (0..200).collect::<Vec<_>>(),
        "every datagram, in order"
    );
    assert!(sender.wait_exit(LIMIT).await.success());
    let summary = complete_lines(&out).join("\n");
    assert!(
        summary.contains("sent 200 datagrams, 200 clicks"),
        "{summary}"
    );
    assert!(summary.contains("queue_full="), "{summary}");
}

#[test]
fn decode_prints_the_golden_vector_fields() {
    let mut hex = clicktap();
    hex.args(["decode", "--hex"]);
    let from_hex = run(hex, format!("{GOLDEN}\n").as_bytes());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("golden.bin");
    std::fs::write(&file, clicktap::hex::parse(GOLDEN).unwrap()).unwrap();
    let from_file = run_args(&["decode", file.to_str().unwrap()]);

    for out in [from_hex, from_file] {
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let fields: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        for expected in [
            vec!["version:", "1"],
            vec!["sender:", "12345"],
            vec!["seq:", "7"],
            vec!["clicks:", "2"],
        ] {
            assert!(fields.contains(&expected), "no {expected:?} in:\n{text}");
        }
        assert!(text.contains("(base_us -5)"), "{text}");
        let clicks: Vec<(&str, &str)> = fields
            .iter()
            .filter(|f| f.len() == 5 && f[4] == "us)")
            .map(|f| (f[1], f[0]))
            .collect();
        assert_eq!(clicks, [("seed1", "0"), ("x", "1")], "{text}");
        assert!(
            text.contains("1970-01-01T00:00:00.000295Z (+300 us)"),
            "{text}"
        );
    }
}

/// A version-2 datagram's clicks each with the dimensions it carries, as text and as JSON;
/// a version-1 datagram's with none.
#[test]
fn decode_shows_each_clicks_dimensions_and_the_version() {
    use protocol::dimensions::{Agent, Country, Device, Dimensions};
    let dir = tempfile::tempdir().unwrap();
    let carried = Dimensions {
        agent: Agent::Bot,
        referrer: Some("t.co"),
        device: Some(Device::Mobile),
        country: Country::parse(b"DE"),
    };
    let unreferred = Dimensions {
        agent: Agent::Preview,
        referrer: Some(""),
        ..Dimensions::default()
    };
    for version in [2, 1] {
        let mut enc = Encoder::of_version(version, 12345, DEFAULT_DATAGRAM).unwrap();
        enc.push_with("seed1", 1_000_000, &carried).unwrap();
        enc.push_with("x", 1_000_300, &unreferred).unwrap();
        let file = dir.path().join(format!("v{version}.bin"));
        std::fs::write(&file, enc.datagram()).unwrap();

        let out = run_args(&["decode", file.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(text.contains(&format!("\nversion: {version}\n")), "{text}");
        let clicks: Vec<&str> = text.lines().filter(|l| l.contains(" us)")).collect();
        if version == 2 {
            assert!(
                clicks[0]
                    .ends_with("(+1000000 us)  agent=bot referrer=t.co device=mobile country=DE"),
                "{text}"
            );
            assert!(
                clicks[1].ends_with("(+1000300 us)  agent=preview referrer=(none)"),
                "{text}"
            );
        } else {
            assert!(clicks.iter().all(|l| l.ends_with(" us)")), "{text}");
        }

        let out = run_args(&["decode", "--json", file.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let json: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(
            (json["version"].as_u64(), json["sender"].as_u64()),
            (Some(version.into()), Some(12345))
        );
        let fields = |i: usize| {
            let click = json["clicks"][i].as_object().unwrap();
            let mut keys: Vec<&str> = click.keys().map(String::as_str).collect();
            keys.sort();
            keys
        };
        if version == 2 {
            assert_eq!(json["clicks"][0]["agent"], "bot");
            assert_eq!(json["clicks"][0]["referrer"], "t.co");
            assert_eq!(json["clicks"][0]["device"], "mobile");
            assert_eq!(json["clicks"][0]["country"], "DE");
            assert_eq!(json["clicks"][1]["referrer"], "(none)");
            assert_eq!(
                fields(1),
                ["agent", "at", "at_us", "code", "offset_us", "referrer"]
            );
        } else {
            assert_eq!(fields(0), ["at", "at_us", "code", "offset_us"], "{json}");
        }
        assert_eq!(json["clicks"][1]["at_us"], 1_000_300);
    }
}

/// `send --wire-version 1` writes what a redirector of an earlier release writes; version 2,
/// the default, carries the dimensions given; invalid ones are refused before anything is sent.
#[tokio::test]
async fn send_writes_either_version_with_the_dimensions_given() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let listen = Listen::start(&socket, &["--json"]).await;

    let (status, summary) = send(
        &socket,
        &["--code", "a", "--count", "3", "--wire-version", "1"],
    )
    .await;
    assert!(status.success(), "{summary}");
    assert!(summary.contains("(wire version 1)"), "{summary}");
    let flags = [
        "--code",
        "a",
        "b",
        "--count",
        "4",
        "--agent",
        "bot",
        "--referrer",
        "t.co",
        "--device",
        "tablet",
        "--country",
        "de",
    ];
    let (status, summary) = send(&socket, &flags).await;
    assert!(status.success(), "{summary}");
    assert!(summary.contains("(wire version 2)"), "{summary}");
    let lines = listen
        .json_until("both datagrams", |l| sum(l, "clicks") >= 7)
        .await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        (lines[0]["version"].as_u64(), lines[0]["clicks"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(lines[0]["dimensions"], serde_json::json!({}));
    assert_eq!(
        (lines[1]["version"].as_u64(), lines[1]["clicks"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(
        lines[1]["dimensions"],
        serde_json::json!({
            "agent": {"bot": 4},
            "referrer": {"t.co": 4},
            "device": {"tablet": 4},
            "country": {"DE": 4},
        })
    );

    // Each refused with what is wrong, and nothing sent.
    let socket = socket.to_str().unwrap();
    for (flags, needle) in [
        (
            &["--wire-version", "3"][..],
            "\"3\" is not a wire version this build writes (1..=2)",
        ),
        (
            &["--agent", "unknown"],
            "\"unknown\" is not an agent: human, bot or preview",
        ),
        (&["--referrer", "T.co"], "\"T.co\" is not a referrer host"),
        (&["--device", "phone"], "\"phone\" is not a device"),
        (
            &["--country", "XX"],
            "\"XX\" is not an assigned ISO 3166-1 alpha-2 country code",
        ),
        (&["--count", "0"], "invalid value '0' for '--count <COUNT>'"),
        (&["--batch", "0"], "invalid value '0' for '--batch <BATCH>'"),
    ] {
        let mut args = vec!["send", "--socket", socket, "--code", "a"];
        args.extend(flags);
        let out = run_args(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(
            err.contains(needle),
            "{flags:?}: expected {needle:?} in {err}"
        );
    }
    let out = run_args(&[
        "send",
        "--socket",
        socket,
        "--code",
        "a",
        "--wire-version",
        "1",
        "--country",
        "DE",
    ]);
    assert_fails_with(
        &out,
        "need --wire-version 2: a version-1 datagram carries no dimension",
    );
    let lines = listen.json();
    assert_eq!(lines.len(), 2, "nothing more sent: {lines:?}");
    assert!(listen.stop(Signal::SIGTERM).await.success());
}

#[test]
fn decode_of_garbage_fails_with_the_reason() {
    let bad_code = GOLDEN.replace("0178ac02", "0121ac02"); // "x" -> "!"
    let trailing = format!("{GOLDEN}00");
    let cases = [
        ("01ff", "undecodable: "),
        ("", "undecodable: empty datagram"),
        ("03b960", "wrong version 3"),
        (
            trailing.as_str(),
            "1 trailing bytes after the batch (reason: trailing_bytes)",
        ),
        (
            bad_code.as_str(),
            "click 1: byte 0x21 at position 0 is outside [A-Za-z0-9_-] (reason: bad_code)",
        ),
        ("01zz", "not hex: 'z' at character 2"),
    ];
    for (input, reason) in cases {
        let mut cmd = clicktap();
        cmd.args(["decode", "--hex"]);
        let out = run(cmd, input.as_bytes());
        assert_fails_with(&out, reason);
        assert!(
            stdout(&out).is_empty(),
            "an invalid datagram printed fields"
        );
    }
    let out = run_args(&["decode", "/nonexistent/datagram.bin"]);
    assert_fails_with(&out, "reading /nonexistent/datagram.bin: No such file");
    // An endless input is refused once it is longer than any datagram, not read to its end.
    let out = run_args(&["decode", "/dev/zero"]);
    assert_fails_with(&out, "/dev/zero holds more than");
    let mut cmd = clicktap();
    cmd.args(["decode", "--hex"]);
    let out = run(cmd, "00  ".repeat(wire::MAX_DATAGRAM + 1).as_bytes());
    assert_fails_with(&out, "stdin holds more than");
}

/// The collector's mirror forwards a sender's resync as any datagram: shown as a resync.
#[test]
fn decode_shows_a_resync() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("resync.bin");
    std::fs::write(&file, wire::Resync::new(5, 9, 300).encode()).unwrap();
    let out = run_args(&["decode", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout(&out).contains("valid resync") && stdout(&out).contains("first:         9"),
        "{}",
        stdout(&out)
    );
}

/// A listener that goes away while a send runs (its socket file removed, as `listen` does at
/// its stop) is named so: the first send after it is refused (ECONNREFUSED) as if by a file
/// nobody is bound to, which is not what happened.
#[test]
fn send_says_so_when_its_listener_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tap.sock");
    let listener = bind_datagram(&path, 0o600).unwrap();
    listener.set_read_timeout(Some(LIMIT)).unwrap();
    let mut cmd = clicktap();
    cmd.args(["send", "--socket", path.to_str().unwrap(), "--code", "a"])
        .args(["--count", "1000", "--rate", "100", "--batch", "1"]);
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting clicktap");
    listener
        .recv(&mut [0; DEFAULT_DATAGRAM])
        .expect("a first datagram within the limit");
    drop(listener);
    std::fs::remove_file(&path).unwrap();
    let out = child.wait_with_output().expect("waiting for clicktap");
    assert_fails_with(&out, "nobody is listening: the listener went away");
}

#[test]
fn send_says_clearly_when_nobody_listens() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let out = run_args(&["send", "--socket", missing.to_str().unwrap(), "--code", "a"]);
    assert_fails_with(&out, "nobody is listening: no socket at this path");

    let stale = dir.path().join("stale.sock");
    drop(bind_datagram(&stale, 0o600).unwrap());
    let out = run_args(&["send", "--socket", stale.to_str().unwrap(), "--code", "a"]);
    assert_fails_with(
        &out,
        "nobody is listening: the socket file is there but nobody is bound to it",
    );

    let file = dir.path().join("file");
    std::fs::write(&file, b"not a socket").unwrap();
    let out = run_args(&["send", "--socket", file.to_str().unwrap(), "--raw", "00"]);
    assert_fails_with(&out, "exists but is not a socket");

    let stream = dir.path().join("stream.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&stream).unwrap();
    let out = run_args(&["send", "--socket", stream.to_str().unwrap(), "--code", "a"]);
    assert_fails_with(&out, "is a socket of another type (not a datagram socket)");

    let out = run_args(&[
        "send",
        "--socket",
        missing.to_str().unwrap(),
        "--code",
        "no/slash",
    ]);
    assert_eq!(out.status.code(), Some(2), "a bad code is a usage error");
    assert!(
        stderr(&out).contains("outside [A-Za-z0-9_-]"),
        "{}",
        stderr(&out)
    );
}

/// Ctrl-C while `send --raw -` waits for its stdin (a terminal, a pipe nobody closes) ends
/// it: the stop flag's handlers, installed before the read, had the read retry and swallow
/// SIGINT, so that only Ctrl-D or SIGKILL ended it.
#[test]
fn send_raw_from_a_stdin_that_never_ends_stops_at_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("c.sock");
    let mut child = clicktap()
        .args(["send", "--socket", socket.to_str().unwrap(), "--raw", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting clicktap");
    let _open = child.stdin.take();
    let pid = child.id();
    // Blocked in read(2) of its stdin (x86-64's syscall 0, descriptor 0): past any handler's
    // installation, so that the signal meets the read.
    let reading = || {
        let call = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        call.starts_with("0 0x0 ")
    };
    let deadline = std::time::Instant::now() + LIMIT;
    while !reading() {
        assert!(
            std::time::Instant::now() < deadline,
            "clicktap never read its stdin"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, Signal::SIGINT).unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "clicktap ignored Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success(), "{status}");
}

/// Whether process `pid` is blocked in write(2) to its stdout (x86-64's syscall 1, descriptor 1).
fn writing_stdout(pid: u32) -> bool {
    let call = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    call.starts_with("1 0x1 ")
}

/// A listen whose stdout nobody reads (a pipe that filled: `| less` stopped, a stalled FIFO)
/// stops at SIGTERM and removes its socket file: its blocked write, interrupted, is not
/// retried as std's writers retry it, which held it there until SIGKILL.
#[tokio::test]
async fn listen_blocked_on_a_full_stdout_stops_at_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tap.sock");
    let mut child = clicktap()
        .args(["listen", "--socket", socket.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting clicktap");
    let _unread = child.stdout.take();
    let pid = child.id();
    let sender = UnixDatagram::unbound().unwrap();
    sender.set_nonblocking(true).unwrap();
    let mut encoder = Encoder::new(1, DEFAULT_DATAGRAM).unwrap();
    encoder.push("blocked", protocol::now_us()).unwrap();
    // Lines until the pipe is full; the socket's queue full too is no error.
    eventually("listen to block on its stdout", LIMIT, || {
        let _ = sender.send_to(encoder.datagram(), &socket);
        let blocked = writing_stdout(pid);
        async move { blocked.then_some(()) }
    })
    .await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    let status = eventually("listen to stop at SIGTERM", LIMIT, || {
        let status = child.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert!(status.success(), "listen exited with {status}");
    assert!(!socket.exists(), "listen left its socket file behind");
}

#[tokio::test]
async fn listen_refuses_a_regular_file_and_a_path_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"keep me").unwrap();
    let out = run_args(&["listen", "--socket", file.to_str().unwrap()]);
    assert_fails_with(&out, "exists and is not a socket; refusing to remove it");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

    let stream = dir.path().join("stream.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&stream).unwrap();
    let out = run_args(&["listen", "--socket", stream.to_str().unwrap()]);
    assert_fails_with(
        &out,
        "is a socket of another type (not a datagram socket); refusing",
    );
    assert!(stream.exists(), "listen removed a stream socket");

    let socket = dir.path().join("tap.sock");
    let first = Listen::start(&socket, &[]).await;
    let out = run_args(&["listen", "--socket", socket.to_str().unwrap()]);
    assert_fails_with(&out, "is in use: another process is bound to it");
    assert!(
        socket.exists(),
        "the second listen removed the first one's socket"
    );
    assert!(first.stop(Signal::SIGTERM).await.success());
}

#[tokio::test]
async fn permission_denied_is_named() {
    let dir = world_readable_tempdir();
    let socket = dir.path().join("tap.sock");
    // Only its group may write: not its owner (owner bits alone apply to the owner), nor
    // `nobody`, who is not in the group. (A mode without any write bit is refused.)
    let listen = Listen::start(&socket, &["--mode", "020"]).await;
    let mut cmd = unprivileged(clicktap());
    cmd.args(["send", "--socket", socket.to_str().unwrap(), "--code", "a"]);
    let out = run(cmd, b"");
    assert_fails_with(
        &out,
        "permission denied: this user may not write to the socket",
    );
    assert!(listen.stop(Signal::SIGTERM).await.success());

    let read_only = dir.path().join("ro");
    std::fs::create_dir(&read_only).unwrap();
    set_mode(&read_only, 0o555);
    let mut cmd = unprivileged(clicktap());
    cmd.args([
        "listen",
        "--socket",
        read_only.join("tap.sock").to_str().unwrap(),
    ]);
    let out = run(cmd, b"");
    assert_fails_with(&out, "Permission denied");
}

/// `send --help` states the most codes `--code-file` holds, written out in its doc comment
/// (clap cannot put a constant in one): the same number as the limit the file is read with.
#[test]
fn send_help_states_the_code_files_limit() {
    let digits = clicktap::MAX_FILE_CODES.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).unwrap())
        .collect();
    let written = groups.join(",");
    // As one line: clap wraps the help at the terminal's width (COLUMNS).
    let help = stdout(&run_args(&["send", "--help"]));
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains(&format!("at most {written})")),
        "send --help does not say {written}:\n{help}"
    );
}

#[test]
fn help_explains_every_subcommand_and_flag() {
    let top = stdout(&run_args(&["--help"]));
    for word in ["listen", "send", "decode"] {
        assert!(top.contains(word), "--help does not mention {word}:\n{top}");
    }
    let flags: [(&str, &[&str]); 3] = [
        (
            "listen",
            &["--socket", "--json", "--stats", "--mode", "CLICKS_SOCKET"],
        ),
        (
            "send",
            &[
                "--socket",
                "--code",
                "--code-file",
                "--count",
                "--rate",
                "--batch",
                "--sender",
                "--wire-version",
                "--agent",
                "--referrer",
                "--device",
                "--country",
                "--raw",
            ],
        ),
        ("decode", &["FILE|-", "--hex", "--json"]),
    ];
    for (command, flags) in flags {
        let help = stdout(&run_args(&[command, "--help"]));
        for flag in flags {
            assert!(
                help.contains(flag),
                "{command} --help lacks {flag}:\n{help}"
            );
        }
    }
}
