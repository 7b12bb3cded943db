//! A server that accepts connections and never answers (its postmaster stopped with SIGSTOP,
//! as a host gone from the network looks to a connection in progress). Its own test binary,
//! so the silence hits only this test's private cluster.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use testkit::collector::*;
use testkit::pgtest;

/// Sends SIGCONT to the postmaster when dropped, so that a failing test leaves it running.
struct Stopped(Pid);

impl Stopped {
    fn postmaster() -> Stopped {
        let pid = Pid::from_raw(pgtest::cluster().postmaster_pid());
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP to the postmaster");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// Start-up's steps have no deadline of their own (a migration may take long): the
/// connection's settings are what keep it from waiting on a silent server for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_gives_up_on_a_silent_server_and_retries_until_it_answers() {
    let p = place().await;
    let silent = Stopped::postmaster();
    let c = Collector::spawn(command(&p.db, &p.path, &["--write-timeout", "1s"])).await;
    c.service.wait_for_log("database not ready", LIMIT).await;
    drop(silent);
    c.ready().await;
    send_all(&p.path, datagrams(1, &clicks(10, 2, start_us(), 1))).await;
    await_rows(&p.client, None, 10).await;
}
