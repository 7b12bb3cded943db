//! The pipeline's processes as the bench runs them: the binaries of a variant (the current
//! code, or BASELINE's built once into $OUT), started with their logs in $OUT, awaited through
//! their admin listeners, stopped as systemd stops them.

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::Res;

/// A child process; killed if dropped still running (a run that failed half-way).
pub(crate) struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub(crate) fn spawn(name: &str, mut cmd: Command, log: &Path) -> Res<Proc> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("starting {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub(crate) fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, up to 60 s for a graceful exit, then SIGKILL.
    pub(crate) async fn stop(mut self) {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Drop kills it if it is still running.
    }

    /// Waits for the end; an error if it failed.
    pub(crate) async fn finish(mut self) -> Res<()> {
        loop {
            match self.child.try_wait()? {
                Some(status) if status.success() => return Ok(()),
                Some(status) => return Err(format!("{} failed: {status}", self.name).into()),
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last `n` lines of a log, for an error that says why something was not ready.
pub(crate) fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `check` every 50 ms until it holds, for at most `limit`; an error saying `what` was
/// not reached, with the tail of `log`.
pub(crate) async fn until<F, Fut>(limit: Duration, what: &str, log: &Path, check: F) -> Res<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until_every(Duration::from_millis(50), limit, what, log, check).await
}

/// [`until`], polling once every `every`.
pub(crate) async fn until_every<F, Fut>(
    every: Duration,
    limit: Duration,
    what: &str,
    log: &Path,
    mut check: F,
) -> Res<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        if Instant::now() >= deadline {
            let tail = tail(log, 5);
            return Err(format!(
                "no {what} within {limit:?}; tail of {}:\n{tail}",
                log.display()
            )
            .into());
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// Waits until the admin listener at `admin` answers 200 on /healthz.
pub(crate) async fn await_healthy(admin: SocketAddr, name: &str, log: &Path) -> Res<()> {
    let what = format!("healthy {name}");
    until(Duration::from_secs(30), &what, log, || async {
        matches!(testkit::http::get(admin, "/healthz").await, Ok((200, _)))
    })
    .await
}

/// One sample of the /metrics at `admin`.
pub(crate) async fn metric(admin: SocketAddr, series: &str) -> Res<f64> {
    let (_, body) = testkit::http::get(admin, "/metrics")
        .await
        .map_err(|e| format!("GET http://{admin}/metrics: {e}"))?;
    shared::metrics::sample(&body, series)
        .ok_or_else(|| format!("no {series} at {admin}/metrics").into())
}

/// The whole /metrics text at `admin`.
pub(crate) async fn metrics(admin: SocketAddr) -> Res<String> {
    let (_, body) = testkit::http::get(admin, "/metrics")
        .await
        .map_err(|e| format!("GET http://{admin}/metrics: {e}"))?;
    Ok(body)
}

/// Whether `binary --help` mentions `flag`: a BASELINE build may predate it.
pub(crate) fn has_flag(binary: &Path, flag: &str) -> bool {
    Command::new(binary)
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

/// Builds a revision's collector, redirector and clicktap once (cached by commit in $OUT)
/// from an exported tree of it, as `scripts/bench` builds the current ones: the services in
/// one cargo run, clicktap in another (built together, clicktap's dependencies turn on more
/// features of the services', and a baseline would not be built like for like); the
/// directory they are in.
pub(crate) fn build_rev(rev: &str, out: &Path) -> Res<PathBuf> {
    let commit = git(&["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .map_err(|_| format!("{rev} is not a revision"))?;
    // "services-apart": not the directories of builds of the services with clicktap. A build
    // under other settings of the release profile (`.ci/run`'s) is cached apart too.
    let overrides = profile_overrides();
    let settings = if overrides.is_empty() {
        String::new()
    } else {
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&overrides, &mut hash);
        format!("-{:016x}", std::hash::Hasher::finish(&hash))
    };
    let dir = out.join(format!("rev-{commit}-services-apart{settings}"));
    let bin = dir.join("bin");
    if ["redirector", "collector", "clicktap"]
        .iter()
        .all(|b| bin.join(b).is_file())
    {
        return Ok(bin);
    }
    crate::log(&format!("building the binaries of {commit}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::create_dir_all(&bin)?;
    let tar = dir.join("src.tar");
    git(&["archive", "-o", &tar.to_string_lossy(), &commit])?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dir.join("src")))?;
    for bins in [&["collector", "redirector"][..], &["clicktap"]] {
        let mut cargo = Command::new("cargo");
        cargo.args(["build", "--release", "-q"]);
        cargo.args(bins.iter().flat_map(|b| ["--bin", b]));
        cargo
            .current_dir(dir.join("src"))
            .env("CARGO_TARGET_DIR", dir.join("target"));
        run(&mut cargo).map_err(|e| format!("building {rev} failed: {e}"))?;
    }
    for b in ["collector", "redirector", "clicktap"] {
        std::fs::copy(dir.join("target/release").join(b), bin.join(b))?;
    }
    Ok(bin)
}

/// The settings of the release profile changed through the environment
/// (`CARGO_PROFILE_RELEASE_*`, as `.ci/run` sets them), as `NAME=value`, sorted: the binaries
/// they build are not the ones a figure of BENCHMARKS.md was measured with.
pub(crate) fn profile_overrides() -> Vec<String> {
    let mut set: Vec<String> = std::env::vars_os()
        .filter_map(|(name, value)| {
            let name = name.into_string().ok()?;
            let value = value.to_string_lossy();
            name.starts_with("CARGO_PROFILE_RELEASE_")
                .then(|| format!("{name}={value}"))
        })
        .collect();
    set.sort();
    set
}

fn git(args: &[&str]) -> Res<String> {
    let out = Command::new("git").args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Runs `cmd` to its end, its output on our stderr (stdout is the tables'); an error if it
/// failed.
pub(crate) fn run(cmd: &mut Command) -> Res<()> {
    let status = cmd
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| format!("running {:?}: {e}", cmd.get_program()))?;
    if !status.success() {
        return Err(format!(
            "{:?} {:?}: {status}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>()
        )
        .into());
    }
    Ok(())
}

/// The short hash of a revision, for the tables' notes.
pub(crate) fn short(rev: &str) -> String {
    git(&["rev-parse", "--short", rev]).unwrap_or_else(|_| rev.to_owned())
}
