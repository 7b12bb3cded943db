//! Test support beside the PostgreSQL harness: the workspace's real binaries, and bounded
//! waits on conditions instead of sleeps.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The path of workspace binary `name` in the same profile as the running test, built first
/// if it is missing (a test of one crate may spawn another crate's binary).
pub fn binary(name: &str) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if !path.is_file() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--bin", name]);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running cargo build: {e}"));
        assert!(status.success(), "cargo build --bin {name} failed");
    }
    path
}

/// Polls `check` every 20 ms until it returns `Some`, for at most `limit`; panics saying what
/// was awaited if it never does.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
