//! Command line flags, each with an environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use protocol::dimensions::Dimension;

/// Answers GET /{code} with a redirect from an in-memory link table and hands each click to the
/// collector over a Unix datagram socket, without making the request wait for it.
#[derive(Debug, Clone, Parser)]
#[command(version)]
pub struct Config {
    /// Address the redirects are served on.
    #[arg(
        long,
        value_name = "ADDR",
        env = "REDIRECTOR_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    /// Address of the admin listener (GET /metrics, GET /healthz).
    #[arg(
        long,
        value_name = "ADDR",
        env = "REDIRECTOR_ADMIN_LISTEN",
        default_value = "127.0.0.1:9180"
    )]
    pub admin_listen: SocketAddr,

    /// The PostgreSQL database holding `links` (a URL or a key=value string).
    #[arg(long, value_name = "URL", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Where the link loader reads `links` and its change log, if not from --database-url:
    /// a hot standby (a replica) takes those reads off the primary. A standby cannot LISTEN,
    /// so on one (`pg_is_in_recovery()` at connect) the loader reads the change log every
    /// --reload-interval instead: a change is served within that plus the replication lag.
    /// `--clicks direct` still inserts through --database-url.
    #[arg(
        long,
        value_name = "URL",
        env = "REDIRECTOR_LINKS_DATABASE_URL",
        hide_env_values = true
    )]
    pub links_database_url: Option<String>,

    /// The collector's datagram socket.
    #[arg(
        long,
        value_name = "PATH",
        env = "CLICKS_SOCKET",
        default_value = "/run/clicks/collector.sock"
    )]
    pub socket: PathBuf,

    /// Our own socket, which datagrams are sent from and acknowledgements arrive at: the
    /// collector acknowledges what it committed, and whatever is not acknowledged in time is
    /// sent again. A leftover socket file nobody is bound to is replaced. One per redirector:
    /// give each redirector of a host its own.
    #[arg(
        long,
        value_name = "PATH",
        env = "REDIRECTOR_ACK_SOCKET",
        default_value = "/run/clicks-redirector/ack.sock"
    )]
    pub ack_socket: PathBuf,

    /// File mode of --ack-socket (octal). The collector needs write access to it.
    #[arg(long, value_name = "OCTAL", env = "REDIRECTOR_ACK_SOCKET_MODE", default_value = "0660",
          value_parser = shared::flags::mode)]
    pub ack_socket_mode: u32,

    /// Without an acknowledgement for this long, everything unacknowledged is sent again.
    /// The collector acknowledges each batch as it commits, every --flush-interval (250ms) of
    /// its own while it keeps up.
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_ACK_TIMEOUT", default_value = "2s",
          value_parser = shared::flags::duration)]
    pub ack_timeout: Duration,

    /// Datagrams kept until acknowledged (each up to --datagram-size bytes, allocated at start;
    /// 8 MiB by default). A full window stops sending more: the ring holds the clicks.
    #[arg(long, value_name = "N", env = "REDIRECTOR_RESEND_WINDOW", default_value_t = 512,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub resend_window: u64,

    /// What to do with clicks: `pipeline` sends them to the collector through the ring,
    /// `off` records nothing (a baseline), `direct` does one INSERT per request inside the
    /// request (the slow baseline).
    #[arg(long, value_name = "MODE", env = "CLICKS", value_enum, default_value_t = ClickMode::Pipeline)]
    pub clicks: ClickMode,

    /// Clicks the ring holds while the collector is slow or away (152 bytes each, in the state
    /// region: 38 MiB by default; BENCHMARKS.md has how long that lasts at full load).
    #[arg(long, value_name = "N", env = "REDIRECTOR_RING_CAPACITY", default_value_t = 262_144,
          value_parser = clap::value_parser!(u64).range(1..=(1 << 28)))]
    pub ring_capacity: u64,

    /// A file holding the ring and the resend window (the state region), so that clicks
    /// survive a crash of the process (SIGKILL, the OOM killer) and a restart: the next
    /// process sends what it holds. Memory, not disk: put it on a tmpfs (/run); a reboot
    /// empties it. Without it, under systemd, the region is kept in the service's file
    /// descriptor store (FileDescriptorStoreMax=); elsewhere it lives as long as the process.
    #[arg(long, value_name = "PATH", env = "REDIRECTOR_STATE_FILE")]
    pub state_file: Option<std::path::PathBuf>,

    /// How often the drain task sends what the ring holds, full datagrams or not: the longest a
    /// click waits in the ring while the collector keeps up. Each send wakes the collector, and
    /// each tick the drain task: a shorter interval costs the host more CPU a click
    /// (BENCHMARKS.md, "The redirector's flush interval").
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_FLUSH_INTERVAL", default_value = "50ms", value_parser = shared::flags::duration)]
    pub flush_interval: Duration,

    /// How long shutdown keeps sending what the ring holds and waiting for the collector to
    /// acknowledge it. What is left then is kept for the next start where the state region
    /// outlives the process (a --state-file); otherwise what was not sent is counted as
    /// dropped (`shutdown`), and so is what was sent and not acknowledged (`unacknowledged`).
    /// (Requests in flight get as long to finish before that.)
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_DRAIN_TIMEOUT", default_value = "5s", value_parser = shared::flags::duration)]
    pub drain_timeout: Duration,

    /// Read the change log of `links` this often even without a links_changed notification
    /// (changes are applied incrementally; this bounds how long a lost notification or a
    /// session that stopped answering goes unnoticed).
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_RELOAD_INTERVAL", default_value = "1s", value_parser = shared::flags::duration)]
    pub reload_interval: Duration,

    /// The link loader's database connect timeout, statement timeout, and the longest it waits
    /// for any answer; a session that stays silent longer is dropped and replaced. Under
    /// `--clicks direct`, the same for its sessions, whose INSERTs wait at most twice this.
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_LINK_TIMEOUT", default_value = "5s", value_parser = shared::flags::duration)]
    pub link_timeout: Duration,

    /// Size limit of one datagram to the collector, in bytes (at most 61440, at least what one
    /// click of the longest code and referrer takes). Checked here, before the state region is
    /// laid out with it: refused later, it would leave a region no later start could adopt.
    #[arg(long, value_name = "BYTES", env = "REDIRECTOR_DATAGRAM_SIZE", default_value_t = protocol::wire::DEFAULT_DATAGRAM,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(protocol::wire::MIN_DATAGRAM as u64..=protocol::wire::MAX_DATAGRAM as u64))]
    pub datagram_size: usize,

    /// A client that has not sent its request head within this time is disconnected: the whole
    /// head, however slowly its bytes trickle in, counted from when the server began waiting
    /// for it.
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = shared::flags::duration)]
    pub header_read_timeout: Duration,

    /// Client connections open at once. At the limit a new client takes the place of the
    /// connection idle the longest, or when none is idle, of the one whose unfinished request
    /// head began first, in that order as a look at all of them found it (a look every
    /// sixty-fourth of the limit); it is refused only when every connection is answering a
    /// request or writing its response. Fitted at start under the descriptor limit (RLIMIT_NOFILE, less
    /// 64, less a fifth: 768 at 1024).
    #[arg(long, value_name = "N", env = "REDIRECTOR_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,

    /// A keep-alive connection idle between requests this long is closed. At most
    /// --header-read-timeout, whose timer runs while a connection waits for its next request.
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_IDLE_TIMEOUT", default_value = "5s", value_parser = shared::flags::duration)]
    pub idle_timeout: Duration,

    /// A client that does not take its response within this time is disconnected (a client
    /// that stops reading cannot hold a connection longer).
    #[arg(long, value_name = "DURATION", env = "REDIRECTOR_WRITE_TIMEOUT", default_value = "10s", value_parser = shared::flags::duration)]
    pub write_timeout: Duration,

    /// Which of a click's optional dimensions to record, comma-separated: `referrer` (the
    /// host of the Referer), `device` (desktop, mobile, tablet or other, from the User-Agent),
    /// `country` (from --country-header). Who clicked (human, bot or preview) is always
    /// recorded. They are counted per code and day in `click_breakdown`; no address and no
    /// user agent is kept anywhere. Default: none.
    #[arg(long, value_name = "LIST", env = "REDIRECTOR_DIMENSIONS", default_value = "",
          value_parser = recorded)]
    pub dimensions: Recorded,

    /// The request header in which the fronting proxy or CDN puts the client's country as an
    /// ISO 3166-1 alpha-2 code (e.g. CF-IPCountry, CloudFront-Viewer-Country): the `country`
    /// dimension needs it. A value that is no assigned code is left out and counted
    /// (`redirector_country_invalid_total`).
    #[arg(long, value_name = "NAME", env = "REDIRECTOR_COUNTRY_HEADER",
          value_parser = header_name)]
    pub country_header: Option<hyper::header::HeaderName>,

    /// `--clicks direct` only: database connections the INSERTs are spread over.
    #[arg(long, value_name = "N", env = "REDIRECTOR_DIRECT_CONNECTIONS", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub direct_connections: u64,
}

/// Which optional dimensions a redirector records (`--dimensions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    pub referrer: bool,
    pub device: bool,
    pub country: bool,
}

fn recorded(list: &str) -> Result<Recorded, String> {
    let mut recorded = Recorded::default();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match protocol::dimensions::Dimension::parse(name) {
            Some(Dimension::Referrer) => recorded.referrer = true,
            Some(Dimension::Device) => recorded.device = true,
            Some(Dimension::Country) => recorded.country = true,
            Some(Dimension::Agent) => {
                return Err("`agent` is always recorded: leave it out of the list".into())
            }
            None => {
                return Err(format!(
                    "unknown dimension {name:?}: the choices are referrer, device, country"
                ))
            }
        }
    }
    Ok(recorded)
}

fn header_name(name: &str) -> Result<hyper::header::HeaderName, String> {
    hyper::header::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{name:?} is not an HTTP header name"))
}

impl Config {
    /// What the flags cannot say alone: a country needs the header it comes from.
    pub fn check_dimensions(&self) -> Result<(), &'static str> {
        match (self.dimensions.country, &self.country_header) {
            (true, None) => Err("the country dimension needs --country-header NAME"),
            (false, Some(_)) => {
                Err("--country-header is set, but `country` is not in --dimensions")
            }
            _ => Ok(()),
        }
    }

    /// What the flags say that the server will not do, to be logged: an `--idle-timeout` over
    /// `--header-read-timeout`, whose timer ends an idle keep-alive connection first.
    pub fn shortened(&self) -> Option<String> {
        (self.idle_timeout > self.header_read_timeout).then(|| {
            format!(
                "--idle-timeout {:?} is over --header-read-timeout {:?}: idle keep-alive \
                 connections are closed at the latter",
                self.idle_timeout, self.header_read_timeout
            )
        })
    }

    /// The drain's own socket is not the collector's: it would replace a leftover collector
    /// socket, and send every datagram to itself.
    pub fn check_sockets(&self) -> Result<(), &'static str> {
        let same = shared::socket::same_path(&self.ack_socket, &self.socket);
        if self.clicks == ClickMode::Pipeline && same {
            return Err(
                "--ack-socket is the collector's --socket: give the redirector a socket \
                        of its own",
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClickMode {
    Pipeline,
    Off,
    Direct,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_durations() {
        let c = Config::try_parse_from([
            "redirector",
            "--database-url",
            "x",
            "--flush-interval",
            "250ms",
        ])
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.admin_listen, "127.0.0.1:9180".parse().unwrap());
        assert_eq!(c.socket, PathBuf::from("/run/clicks/collector.sock"));
        assert_eq!(c.clicks, ClickMode::Pipeline);
        assert_eq!(c.drain_timeout, Duration::from_secs(5));
        assert_eq!(c.flush_interval, Duration::from_millis(250));
        assert_eq!(c.reload_interval, Duration::from_secs(1));
        assert_eq!(c.link_timeout, Duration::from_secs(5));
        assert_eq!(c.max_connections, 10_000);
        assert_eq!(c.idle_timeout, Duration::from_secs(5));
        assert_eq!(c.write_timeout, Duration::from_secs(10));
        assert_eq!(c.links_database_url, None);
        assert_eq!(c.dimensions, Recorded::default());
        assert_eq!(c.country_header, None);
        assert_eq!(c.check_dimensions(), Ok(()));
        assert_eq!(c.shortened(), None);
        let unflagged = Config::try_parse_from(["redirector", "--database-url", "x"]).unwrap();
        assert_eq!(unflagged.flush_interval, Duration::from_millis(50));
    }

    #[test]
    fn an_idle_timeout_over_the_header_read_timeout_is_said_to_be_shortened() {
        let parse = |idle: &str| {
            let args = ["redirector", "--database-url", "x", "--idle-timeout", idle];
            Config::try_parse_from(args).unwrap().shortened()
        };
        assert_eq!(parse("10s"), None, "at the header read timeout");
        let said = parse("30s").expect("over it");
        assert!(said.contains("30s") && said.contains("10s"), "{said}");
    }

    #[test]
    fn an_ack_socket_at_the_collectors_is_refused() {
        let check = |extra: &[&str]| {
            let args = ["redirector", "--database-url", "x"].iter().chain(extra);
            Config::try_parse_from(args).unwrap().check_sockets()
        };
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("collector.sock");
        let linked = dir.path().join("linked.sock");
        std::fs::write(&socket, "").unwrap();
        std::os::unix::fs::symlink(&socket, &linked).unwrap();
        let own = dir.path().join("own.sock");
        let pair = |ack: &std::path::Path, mode| {
            let (socket, ack) = (socket.to_str().unwrap(), ack.to_str().unwrap());
            check(&["--socket", socket, "--ack-socket", ack, "--clicks", mode])
        };
        assert_eq!(pair(&own, "pipeline"), Ok(()));
        for ack in [
            &socket,
            &linked,
            &dir.path().join(".").join("collector.sock"),
        ] {
            let err = pair(ack, "pipeline").unwrap_err();
            assert!(err.starts_with("--ack-socket"), "{}: {err}", ack.display());
        }
        assert_eq!(pair(&socket, "off"), Ok(()), "no drain, no ack socket");
    }

    #[test]
    fn dimensions_and_the_country_header() {
        let parse = |extra: &[&str]| {
            let args = ["redirector", "--database-url", "x"].iter().chain(extra);
            Config::try_parse_from(args)
        };
        let c = parse(&[
            "--dimensions",
            "referrer, device,country",
            "--country-header",
            "CF-IPCountry",
        ])
        .unwrap();
        let all = Recorded {
            referrer: true,
            device: true,
            country: true,
        };
        assert_eq!((c.dimensions, c.check_dimensions()), (all, Ok(())));
        assert_eq!(c.country_header.unwrap(), "cf-ipcountry");
        for bad in [
            &["--dimensions", "agent"][..],
            &["--dimensions", "ip"],
            &["--country-header", "bad header"],
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("dimension") || err.contains("header name"),
                "{err}"
            );
        }
        let c = parse(&["--dimensions", "country"]).unwrap();
        assert!(c
            .check_dimensions()
            .unwrap_err()
            .contains("--country-header"));
        let c = parse(&["--country-header", "X-Country"]).unwrap();
        assert!(c
            .check_dimensions()
            .unwrap_err()
            .contains("not in --dimensions"));
    }

    #[test]
    fn links_may_come_from_another_database() {
        let c = Config::try_parse_from([
            "redirector",
            "--database-url",
            "host=primary",
            "--links-database-url",
            "host=replica",
        ])
        .unwrap();
        assert_eq!(c.database_url, "host=primary");
        assert_eq!(c.links_database_url.as_deref(), Some("host=replica"));
    }

    #[test]
    fn refuses_zero_and_absurd_connection_limits_and_timeouts() {
        let parse = |flag: &str, value: &str| {
            Config::try_parse_from(["redirector", "--database-url", "x", flag, value])
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(parse("--max-connections", "0").unwrap_err().contains("0"));
        assert!(parse("--max-connections", "1000001").is_err());
        assert!(parse("--max-connections", "-1").is_err());
        assert!(parse("--max-connections", "many").is_err());
        assert!(parse("--max-connections", "1000000").is_ok());
        use protocol::wire::{MAX_DATAGRAM, MIN_DATAGRAM};
        for size in [0, MIN_DATAGRAM - 1, MAX_DATAGRAM + 1] {
            let err = parse("--datagram-size", &size.to_string()).unwrap_err();
            assert!(
                err.contains(&format!("{MIN_DATAGRAM}..={MAX_DATAGRAM}")),
                "{err}"
            );
        }
        for size in [MIN_DATAGRAM, MAX_DATAGRAM] {
            assert!(parse("--datagram-size", &size.to_string()).is_ok());
        }
        for flag in ["--idle-timeout", "--write-timeout"] {
            assert!(parse(flag, "0s").unwrap_err().contains("more than zero"));
            assert!(parse(flag, "400days").is_err());
            assert!(parse(flag, "250ms").is_ok());
        }
    }

    #[test]
    fn rejects_bad_values_clearly() {
        let err =
            Config::try_parse_from(["redirector", "--database-url", "x", "--clicks", "maybe"])
                .unwrap_err()
                .to_string();
        assert!(err.contains("pipeline"), "{err}");
        assert!(Config::try_parse_from([
            "redirector",
            "--database-url",
            "x",
            "--ring-capacity",
            "0"
        ])
        .is_err());
        assert!(Config::try_parse_from([
            "redirector",
            "--database-url",
            "x",
            "--drain-timeout",
            "soon"
        ])
        .is_err());
        // Zero once panicked the loader's timer; now every duration flag refuses it.
        let err = Config::try_parse_from([
            "redirector",
            "--database-url",
            "x",
            "--reload-interval",
            "0s",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("more than zero"), "{err}");
    }
}
