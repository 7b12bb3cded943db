//! Test support, a dev-dependency only: the PostgreSQL harness (`pgtest`, with certificates
//! from `testcerts`), the workspace's real binaries, and bounded waits on conditions instead of
//! sleeps. What the tests of several crates use lives here once: starting the collector
//! (`services`), the HTTP client (`http`), reading the clicks back (`db`), the redirector's
//! fixtures, load generator and chaos scenarios (`redirector`), a test sender and the tables
//! read back (`collector`), floods of distinct codes (`flood`).

pub mod collector;
pub mod db;
pub mod flood;
pub mod http;
pub mod pgtest;
pub mod redirector;
pub mod services;
pub mod testcerts;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The repository's root (this crate lives in `shared/testkit`).
pub fn repo() -> PathBuf {
    let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .join("../..")
        .canonicalize()
        .expect("the repository's root")
}

/// A database URL that reaches no server (its socket directory does not exist): for a start
/// that must fail, or wait, before the database.
pub const UNREACHABLE_DB: &str = "host=/nowhere dbname=clicks";

/// Upper bound for anything the tests await.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The path of workspace binary `name` in the same profile as the running test, built (or
/// brought up to date) by cargo once per test process: a test of one crate may spawn another
/// crate's binary, which `cargo test -p` of the first crate does not rebuild, and a stale one
/// would test old code.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|b| b == name) {
        let mut cmd = cargo();
        cmd.args(["build", "--quiet", "--workspace", "--bin", name]);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running cargo build: {e}"));
        assert!(status.success(), "cargo build --bin {name} failed");
        built.push(name.to_owned());
    }
    path
}

/// The cargo running the tests, for a test to run, without the test's environment.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    without_test_env(&mut cmd);
    cmd
}

/// Takes out of `cmd`'s environment the variables cargo sets for a test (CARGO_MANIFEST_DIR,
/// CARGO_PKG_NAME, ...), for a cargo the test runs itself or through a script. ring's build
/// script reruns when one of them changes: a build under one crate's tests, then one under
/// another's or under none, each rebuilt ring and all above it, every test binary and the
/// release binaries' fat LTO, again and again through CI.
pub fn without_test_env(cmd: &mut Command) -> &mut Command {
    const SET_FOR_A_TEST: [&str; 8] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    for (name, _) in std::env::vars_os() {
        let set_for_a_test = name.to_str().is_some_and(|name| {
            SET_FOR_A_TEST.contains(&name)
                || name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_BIN_EXE_")
        });
        if set_for_a_test {
            cmd.env_remove(name);
        }
    }
    cmd
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

/// A real binary run by a test: its stderr is collected line by line (and echoed, so a failing
/// test shows it), and it is killed if the test ends without waiting for it.
pub struct Service {
    name: String,
    child: std::process::Child,
    lines: std::sync::Arc<Mutex<Vec<String>>>,
    /// Set once stderr is read to its end.
    read_all: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How long [`Service::wait_exit`] waits, after the exit, for the last stderr lines: a process
/// the service started may still hold the pipe open, so its end is not always seen.
const LAST_LINES: Duration = Duration::from_secs(5);

impl Service {
    /// Starts `cmd` with stderr captured.
    pub fn spawn(name: &str, mut cmd: Command) -> Service {
        use std::io::BufRead;
        let mut child = cmd
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stderr = child.stderr.take().expect("piped");
        let lines = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let read_all = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let at_end = read_all.clone();
        let tag = name.to_owned();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("[{tag}] {line}");
                sink.lock().unwrap().push(line);
            }
            at_end.store(true, std::sync::atomic::Ordering::Release);
        });
        Service {
            name: name.to_owned(),
            child,
            lines,
            read_all,
        }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// Every stderr line so far.
    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until a stderr line contains `needle`; returns that line. Fails at once when its
    /// stderr has ended without one (the process exited): no line can come any more.
    pub async fn wait_for_log(&self, needle: &str, limit: Duration) -> String {
        let what = format!("{} to log {needle:?}", self.name);
        eventually(&what, limit, || async {
            // Read before the lines: the reader sets it after pushing its last one.
            let ended = self.read_all.load(std::sync::atomic::Ordering::Acquire);
            let lines = self.lines.lock().unwrap();
            let found = lines.iter().find(|l| l.contains(needle)).cloned();
            assert!(
                found.is_some() || !ended,
                "{}: its stderr ended without a line containing {needle:?}",
                self.name
            );
            found
        })
        .await
    }

    /// Waits for a line containing `marker` and parses the socket address right after it, as
    /// in `admin listening on 127.0.0.1:40123`.
    pub async fn addr_after(&self, marker: &str, limit: Duration) -> std::net::SocketAddr {
        let line = self.wait_for_log(marker, limit).await;
        let rest = &line[line.find(marker).expect("found") + marker.len()..];
        let token = rest.split_whitespace().next().unwrap_or_default();
        token
            .trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != ']')
            .parse()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: no address after {marker:?} in {line:?}: {e}",
                    self.name
                )
            })
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), signal)
            .unwrap_or_else(|e| panic!("signalling {}: {e}", self.name));
    }

    /// Waits for the process to exit, for at most `limit`, and then for its last stderr lines
    /// to be in [`Service::log`] (the reader may be behind the exit).
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let what = format!("{} to exit", self.name);
        let child = Mutex::new(&mut self.child);
        let status = eventually(&what, limit, || {
            let status = child.lock().unwrap().try_wait().ok().flatten();
            async move { status }
        })
        .await;
        let read = Instant::now();
        while !self.read_all.load(std::sync::atomic::Ordering::Acquire)
            && read.elapsed() < LAST_LINES
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        status
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A process's resident memory, in KiB.
pub fn rss_kib(pid: nix::unistd::Pid) -> u64 {
    status_kib(pid.as_raw(), "VmRSS").expect("VmRSS in /proc/PID/status")
}

/// A process's peak resident memory so far (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: nix::unistd::Pid) -> u64 {
    status_kib(pid.as_raw(), "VmHWM").expect("VmHWM in /proc/PID/status")
}

/// A process's line `key:` of /proc/PID/status, in KiB; none if it is gone.
pub fn status_kib(pid: i32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The descriptors a process has open (the entries of `/proc/PID/fd`).
pub fn open_descriptors(pid: nix::unistd::Pid) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count()
}

/// Raises this process's soft descriptor limit to its hard one, for a test that holds
/// thousands of sockets; panics unless that allows `needed`.
pub fn raise_own_descriptor_limit(needed: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("raising RLIMIT_NOFILE");
    }
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    assert!(
        soft >= needed,
        "the test needs {needed} descriptors; the hard limit allows {soft}"
    );
}

/// Gives `cmd` SIGINT's and SIGQUIT's default actions, as a command started from a terminal
/// has them. The tests' own may be "ignored": a shell without job control starts a command
/// run in the background (`cargo test &`, a CI runner's script) so, and its children inherit
/// that, which a test of what Ctrl-C does must not.
pub fn signals_as_from_a_terminal(cmd: &mut Command) {
    use nix::sys::signal::{signal, SigHandler, Signal};
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [Signal::SIGINT, Signal::SIGQUIT] {
                signal(sig, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
}

/// Sets `cmd`'s descriptor limit (soft and hard) to `nofile` when it starts, as
/// `LimitNOFILE=` does for a service.
pub fn limit_descriptors(cmd: &mut Command, nofile: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                nofile,
                nofile,
            )
            .map_err(std::io::Error::from)
        });
    }
}

/// A seeded xorshift stream: random enough for tests, and the same again from the same seed,
/// so a failure can be replayed.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// Seeded from the clock; the seed is printed under `what`, to replay a failure with.
    pub fn from_clock(what: &str) -> XorShift {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_nanos() as u64
            | 1;
        eprintln!("{what}: seed {seed}");
        XorShift(seed)
    }

    /// A pause from `min` up to (not including) `min + spread`.
    pub fn pause(&mut self, min: Duration, spread: Duration) -> Duration {
        min + Duration::from_nanos(self.next_u64() % spread.as_nanos().max(1) as u64)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `cmd` started the way systemd starts a socket-activated service: `fd` as descriptor 3,
/// LISTEN_FDS=1 and LISTEN_PID set to the service's own pid (by a shell that then execs it).
/// `fd` must stay open in the caller until the command has started.
pub fn socket_activated(cmd: &Command, fd: std::os::fd::RawFd) -> Command {
    activated(cmd, &[fd], None)
}

/// [`socket_activated`] with several sockets, each under a name (LISTEN_FDNAMES), passed as
/// descriptors 3, 4, ... in the order given.
pub fn socket_activated_named(cmd: &Command, named: &[(&str, std::os::fd::RawFd)]) -> Command {
    let fds: Vec<_> = named.iter().map(|(_, fd)| *fd).collect();
    let names: Vec<_> = named.iter().map(|(name, _)| *name).collect();
    activated(cmd, &fds, Some(names.join(":")))
}

/// `cmd` run by `program` with `args` before it (`sh -c ...`, `unshare ...`, `setpriv ...`):
/// the same program, arguments, environment and directory.
pub fn wrapped<S: AsRef<std::ffi::OsStr>>(program: &str, args: &[S], cmd: &Command) -> Command {
    let mut wrapped = Command::new(program);
    wrapped
        .args(args)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

fn activated(cmd: &Command, fds: &[std::os::fd::RawFd], names: Option<String>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut activated = wrapped("sh", &["-c", r#"LISTEN_PID=$$ exec "$0" "$@""#], cmd);
    activated.env("LISTEN_FDS", fds.len().to_string());
    match names {
        Some(names) => activated.env("LISTEN_FDNAMES", names),
        None => activated.env_remove("LISTEN_FDNAMES"),
    };
    let fds = fds.to_vec();
    let first_free = 3 + fds.len() as i32;
    // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec; `fds` was
    // allocated before the fork.
    unsafe {
        activated.pre_exec(move || {
            // First out of the way of descriptors 3, 4, ..., then into place (dup2 clears
            // close-on-exec on its target).
            let mut moved = [0; 16];
            for (i, fd) in fds.iter().enumerate().take(moved.len()) {
                moved[i] = nix::fcntl::fcntl(*fd, nix::fcntl::FcntlArg::F_DUPFD(first_free))?;
            }
            for (i, fd) in moved.iter().take(fds.len()).enumerate() {
                nix::unistd::dup2(*fd, 3 + i as i32)?;
            }
            Ok(())
        });
    }
    activated
}

/// Sends `bytes` to the datagram socket at `path` from a child process running as `uid` (and
/// that gid): a peer of another user, for tests of who may send what. The child does nothing
/// but async-signal-safe calls between fork and exit. Returns the errno of a failed send.
pub fn send_as_user(
    uid: u32,
    path: &std::path::Path,
    bytes: &[u8],
) -> Result<(), nix::errno::Errno> {
    use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, setgid, setuid, ForkResult, Gid, Uid};
    let addr = UnixAddr::new(path).expect("a socket path");
    // SAFETY: the child only makes syscalls (setgid, setuid, socket, sendto, _exit): no
    // allocation, no locks, so the other threads of the parent do not matter to it.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let sent = setgid(Gid::from_raw(uid))
                .and_then(|()| setuid(Uid::from_raw(uid)))
                .and_then(|()| {
                    socket::socket(
                        AddressFamily::Unix,
                        SockType::Datagram,
                        SockFlag::empty(),
                        None,
                    )
                })
                .and_then(|fd| {
                    socket::sendto(
                        std::os::fd::AsRawFd::as_raw_fd(&fd),
                        bytes,
                        &addr,
                        MsgFlags::empty(),
                    )
                });
            let code = match sent {
                Ok(_) => 0,
                Err(errno) => errno as i32,
            };
            // SAFETY: ends the child without running the parent's atexit handlers or destructors.
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
            WaitStatus::Exited(_, 0) => Ok(()),
            WaitStatus::Exited(_, code) => Err(nix::errno::Errno::from_raw(code)),
            other => panic!("the sending child ended as {other:?}"),
        },
    }
}

/// Sends `bytes` to the datagram socket at `to` from `sender` with the descriptors `fds`
/// attached (SCM_RIGHTS): a peer passing descriptors, which a receiver must close or refuse.
pub fn send_with_fds(
    sender: &std::os::unix::net::UnixDatagram,
    to: &std::path::Path,
    bytes: &[u8],
    fds: &[std::os::fd::RawFd],
) -> nix::Result<usize> {
    use nix::sys::socket::{self, ControlMessage, MsgFlags, UnixAddr};
    socket::sendmsg(
        std::os::fd::AsRawFd::as_raw_fd(sender),
        &[std::io::IoSlice::new(bytes)],
        &[ControlMessage::ScmRights(fds)],
        MsgFlags::empty(),
        Some(&UnixAddr::new(to)?),
    )
}

/// Checks that every flag of `command` whose value is a `DURATION` refuses zero and absurd
/// values with the reason, as [`shared::flags::duration`] does: a flag parsed another way
/// could take `0s` and panic a timer later. `required` are the arguments the command needs
/// besides the flag tried.
pub fn assert_duration_flags_refuse_zero_and_absurd(command: clap::Command, required: &[&str]) {
    let flags: Vec<String> = command
        .get_arguments()
        .filter(|a| {
            a.get_value_names()
                .is_some_and(|v| v.iter().any(|n| n == "DURATION"))
        })
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    assert!(
        !flags.is_empty(),
        "no DURATION flags in {}",
        command.get_name()
    );
    for flag in &flags {
        for (value, why) in [("0s", "more than zero"), ("400days", "365 days")] {
            let args = [command.get_name(), flag, value];
            let err = command
                .clone()
                .try_get_matches_from(args.iter().copied().chain(required.iter().copied()))
                .err()
                .unwrap_or_else(|| panic!("{flag} {value} was taken"))
                .to_string();
            assert!(err.contains(why), "{flag} {value}: {err}");
        }
    }
}

/// Checks that the binary `name` refuses a runtime worker count tokio would panic on, at
/// start, with an error naming the value.
pub fn assert_bad_worker_threads_refused(name: &str) {
    for bad in ["0", "two"] {
        let out = std::process::Command::new(binary(name))
            .env(shared::runtime::WORKER_THREADS, bad)
            .args(["--database-url", UNREACHABLE_DB])
            .output()
            .unwrap_or_else(|e| panic!("running {name}: {e}"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {said}");
        let reason = format!(
            "{}=\"{bad}\" is not a number",
            shared::runtime::WORKER_THREADS
        );
        assert!(said.contains(&reason), "{name}: {said}");
    }
}
