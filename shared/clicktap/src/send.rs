//! `clicktap send`: act as a redirector, or send arbitrary bytes to see how a receiver treats them.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::{hex, read_all, say, signals, PeerProblem, TapError};
use protocol::dimensions::{self, Agent, Country, Device, Dimensions};
use protocol::wire::{self, EncodeError, Encoder, DEFAULT_DATAGRAM};
use shared::socket::SendErrorKind;

/// Pause before resending when the receiver's queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(1);
/// Longest single sleep while pacing, so a signal is noticed promptly.
const PACING_SLICE: Duration = Duration::from_millis(50);
/// Under --rate, the longest a datagram waits for more clicks after its first one.
const FLUSH_AFTER: Duration = Duration::from_millis(100);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Socket path to send to: the collector's socket, or a `clicktap listen`.
    #[arg(long, env = "CLICKS_SOCKET")]
    socket: PathBuf,
    /// Click codes, cycled through in order: --code a b c, --code a,b,c or --code a --code b.
    /// Each is 1 to 64 bytes of [A-Za-z0-9_-].
    #[arg(
        long = "code",
        value_name = "CODE",
        num_args = 1..,
        value_delimiter = ',',
        value_parser = parse_code,
        required_unless_present_any = ["raw", "code_file"]
    )]
    codes: Vec<String>,
    /// Click codes read from a file, one per line (at most 16,777,216), cycled through in order
    /// after any --code: a recorded or generated traffic mix (scripts/bench sends
    /// Zipf-distributed codes so).
    #[arg(long, value_name = "PATH")]
    code_file: Option<PathBuf>,
    /// Clicks to send in all (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Clicks per second (fractions allowed); without it, as fast as the receiver takes them.
    /// Each click is stamped with its scheduled time; a datagram leaves when its last click is
    /// due, holding --batch clicks or those due within 100 ms of its first, whichever is fewer.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<f64>,
    /// Clicks per datagram (fewer when a datagram reaches the 16 KiB default size first).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Sender id written into every datagram (seq starts at 0); random by default, like a
    /// redirector's start.
    #[arg(long)]
    sender: Option<u64>,
    /// The wire version of the datagrams: 2 (each click with its dimensions), or 1 (code and
    /// time only), as a redirector of an earlier release sends them.
    #[arg(
        long,
        value_name = "1|2",
        default_value_t = wire::VERSION,
        value_parser = parse_wire_version
    )]
    wire_version: u8,
    /// The agent of every click sent: human, bot or preview (version 2).
    #[arg(long, value_name = "human|bot|preview", value_parser = parse_agent)]
    agent: Option<Agent>,
    /// The referrer host of every click sent, as a redirector writes it: lower case
    /// [a-z0-9.-_], at most 64 bytes; "" for a request without a usable Referer (version 2).
    #[arg(long, value_name = "HOST", value_parser = parse_referrer)]
    referrer: Option<String>,
    /// The device class of every click sent: desktop, mobile, tablet or other (version 2).
    #[arg(long, value_name = "desktop|mobile|tablet|other", value_parser = parse_device)]
    device: Option<Device>,
    /// The country of every click sent: an assigned ISO 3166-1 alpha-2 code (version 2).
    #[arg(long, value_name = "CC", value_parser = parse_country)]
    country: Option<Country>,
    /// Instead of clicks, send these bytes as one datagram: hex digits, or `-` to read raw
    /// bytes from stdin.
    #[arg(
        long,
        value_name = "HEX|-",
        conflicts_with_all = [
            "codes", "code_file", "count", "rate", "batch", "sender", "wire_version", "agent",
            "referrer", "device", "country",
        ]
    )]
    raw: Option<String>,
}

fn parse_wire_version(text: &str) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(v) if wire::VERSIONS.contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?} is not a wire version this build writes ({}..={})",
            wire::VERSIONS.start(),
            wire::VERSIONS.end()
        )),
    }
}

/// Classes a sender writes: `unknown` is what a collector reads a version-1 click as.
fn parse_agent(text: &str) -> Result<Agent, String> {
    Agent::ALL
        .into_iter()
        .filter(|&a| a != Agent::Unknown)
        .find(|a| a.as_str() == text)
        .ok_or_else(|| format!("{text:?} is not an agent: human, bot or preview"))
}

fn parse_referrer(text: &str) -> Result<String, String> {
    if dimensions::valid_referrer(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a referrer host: lower case [a-z0-9.-_], at most {} bytes",
            dimensions::MAX_REFERRER_LEN
        ))
    }
}

fn parse_device(text: &str) -> Result<Device, String> {
    Device::ALL
        .into_iter()
        .find(|d| d.as_str() == text)
        .ok_or_else(|| format!("{text:?} is not a device: desktop, mobile, tablet or other"))
}

fn parse_country(text: &str) -> Result<Country, String> {
    Country::parse(text.as_bytes())
        .ok_or_else(|| format!("{text:?} is not an assigned ISO 3166-1 alpha-2 country code"))
}

impl Args {
    /// The dimensions every click carries; refused with version 1, which would drop them.
    fn dimensions(&self) -> Result<Dimensions<'_>, TapError> {
        let given = self.agent.is_some()
            || self.referrer.is_some()
            || self.device.is_some()
            || self.country.is_some();
        if given && self.wire_version == 1 {
            return Err(TapError::Usage(
                "--agent, --referrer, --device and --country need --wire-version 2: a version-1 \
                 datagram carries no dimension"
                    .into(),
            ));
        }
        Ok(Dimensions {
            agent: self.agent.unwrap_or_default(),
            referrer: self.referrer.as_deref(),
            device: self.device,
            country: self.country,
        })
    }
}

fn parse_code(text: &str) -> Result<String, String> {
    wire::validate_code(text.as_bytes())
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

/// Codes a --code-file may hold (its lines): held in memory, about 100 bytes each at 64 bytes
/// a code. `scripts/bench` writes one line a click of an ingest run (CLICKS), and refuses more
/// where clicktap sends them.
pub const MAX_FILE_CODES: usize = 16 << 20;

/// Appends the codes of `path`, one a line, each checked as it is read, up to `max` of them: a
/// line is read only as far as a code can be long, so that a file with no newline
/// (`/dev/zero`) is refused rather than read into memory whole, and so is one that never ends
/// (`yes a`) once past `max` lines.
fn read_code_file(path: &Path, codes: &mut Vec<String>, max: usize) -> Result<(), TapError> {
    use std::io::{BufRead, Read};
    // A code, then `\r\n` at most; one byte more tells a longer line.
    const LONGEST: u64 = wire::MAX_CODE_LEN as u64 + 3;
    let file = std::fs::File::open(path).map_err(TapError::io("reading --code-file"))?;
    let mut reader = std::io::BufReader::new(file);
    let mut bytes = Vec::new();
    for line in 1.. {
        bytes.clear();
        let read = (&mut reader)
            .take(LONGEST)
            .read_until(b'\n', &mut bytes)
            .map_err(TapError::io("reading --code-file"))?;
        if read == 0 {
            return Ok(());
        }
        let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let why = if line > max {
            Some(format!("more than {max} codes"))
        } else if bytes.len() as u64 == LONGEST && !bytes.ends_with(b"\n") {
            Some(format!(
                "longer than any code ({} bytes at most)",
                wire::MAX_CODE_LEN
            ))
        } else {
            std::str::from_utf8(text)
                .map_err(|_| "not UTF-8".to_owned())
                .and_then(parse_code)
                .map(|code| codes.push(code))
                .err()
        };
        if let Some(why) = why {
            return Err(TapError::CodeFile { line, why });
        }
    }
    Ok(())
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.001 => Ok(rate),
        _ => Err(format!("{text:?} is not a rate of at least 0.001 clicks/s")),
    }
}

pub fn run(args: &Args) -> Result<(), TapError> {
    // What to send is read first, under the default handlers: the stop flag's (no SA_RESTART)
    // would have a read of a terminal or a pipe retry its EINTR, and swallow Ctrl-C.
    if let Some(raw) = &args.raw {
        let bytes = match raw.as_str() {
            "-" => read_all(Path::new("-"))?,
            hex_text => hex::parse(hex_text)?,
        };
        return send_raw(args, &bytes, stop_flag()?);
    }
    let dimensions = args.dimensions()?;
    let codes = all_codes(args)?;
    let mut link = Link::connect(&args.socket, stop_flag()?)?;
    let sender = args.sender.unwrap_or_else(wire::random_sender);
    let mut sent = Sent::new(sender, args.wire_version);
    let result = send_clicks(args, &codes, &dimensions, &mut link, &mut sent);
    say(&format!(
        "{} to {}; send errors: {}",
        sent.summary(),
        args.socket.display(),
        link.errors()
    ))?;
    result
}

/// The --code values, then the --code-file lines, each checked.
fn all_codes(args: &Args) -> Result<Vec<String>, TapError> {
    let mut codes = args.codes.clone();
    if let Some(path) = &args.code_file {
        read_code_file(path, &mut codes, MAX_FILE_CODES)?;
    }
    if codes.is_empty() {
        return Err(TapError::CodeFile {
            line: 0,
            why: "no codes to send".into(),
        });
    }
    Ok(codes)
}

fn stop_flag() -> Result<&'static AtomicBool, TapError> {
    signals::stop_flag().map_err(TapError::io("installing signal handlers"))
}

fn send_raw(args: &Args, bytes: &[u8], stop: &'static AtomicBool) -> Result<(), TapError> {
    let mut link = Link::connect(&args.socket, stop)?;
    let result = link.send(bytes);
    let verb = if result.is_ok() {
        "sent"
    } else {
        "did not send"
    };
    say(&format!(
        "{verb} 1 raw datagram of {} bytes to {}; send errors: {}",
        bytes.len(),
        args.socket.display(),
        link.errors()
    ))?;
    result
}

fn send_clicks(
    args: &Args,
    codes: &[String],
    dimensions: &Dimensions<'_>,
    link: &mut Link,
    sent: &mut Sent,
) -> Result<(), TapError> {
    let mut encoder = Encoder::of_version(args.wire_version, sent.sender, DEFAULT_DATAGRAM)
        .expect("DEFAULT_DATAGRAM is a valid limit");
    let pace = args.rate.map(Pace::new);
    let mut pushed = 0;
    while pushed < args.count {
        // Also here, not only where it waits (on the pace, or on a full queue): a receiver
        // that keeps up never makes it wait.
        if signals::stopping(link.stop) {
            return Err(TapError::Interrupted);
        }
        let first = pushed;
        while encoder.len() < args.batch as usize && pushed < args.count {
            if pace.as_ref().is_some_and(|p| p.flush_before(first, pushed)) {
                break;
            }
            let code = &codes[(pushed % codes.len() as u64) as usize];
            let at_us = pace
                .as_ref()
                .map_or_else(protocol::now_us, |p| p.stamp_us(pushed));
            match encoder.push_with(code, at_us, dimensions) {
                Ok(()) => pushed += 1,
                Err(EncodeError::Full) if !encoder.is_empty() => break,
                Err(error) => {
                    return Err(TapError::Encode {
                        index: pushed,
                        error,
                    })
                }
            }
        }
        if let Some(pace) = &pace {
            pace.wait_for(pushed - 1, link.stop)?;
        }
        link.send(encoder.datagram())?;
        sent.record(encoder.seq(), encoder.len());
        encoder.next();
    }
    Ok(())
}

/// `--rate`: click `k` is due `k / rate` seconds after the start, and stamped with that time.
struct Pace {
    rate: f64,
    start: Instant,
    start_us: i64,
}

impl Pace {
    fn new(rate: f64) -> Self {
        Pace {
            rate,
            start: Instant::now(),
            start_us: protocol::now_us(),
        }
    }

    fn offset(&self, k: u64) -> Duration {
        Duration::try_from_secs_f64(k as f64 / self.rate).unwrap_or(Duration::MAX)
    }

    fn stamp_us(&self, k: u64) -> i64 {
        let offset = i64::try_from(self.offset(k).as_micros()).unwrap_or(i64::MAX);
        self.start_us.saturating_add(offset)
    }

    /// Whether click `k` is due too long after the datagram's first click `first`: as a
    /// redirector flushes on a timer, a slow rate must not hold clicks back for a whole batch.
    fn flush_before(&self, first: u64, k: u64) -> bool {
        self.offset(k).saturating_sub(self.offset(first)) > FLUSH_AFTER
    }

    /// Sleeps until click `k` is due, in slices so that a signal is noticed.
    fn wait_for(&self, k: u64, stop: &AtomicBool) -> Result<(), TapError> {
        loop {
            if signals::stopping(stop) {
                return Err(TapError::Interrupted);
            }
            let left = self.offset(k).saturating_sub(self.start.elapsed());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(PACING_SLICE));
        }
    }
}

/// A socket connected to the receiver, counting send errors by kind.
struct Link<'a> {
    socket: UnixDatagram,
    path: &'a Path,
    errors: [u64; SendErrorKind::ALL.len()],
    stop: &'static AtomicBool,
}

impl<'a> Link<'a> {
    fn connect(path: &'a Path, stop: &'static AtomicBool) -> Result<Self, TapError> {
        let peer = |problem| TapError::Peer {
            path: path.to_owned(),
            problem,
        };
        // connect(2) to a regular file says ECONNREFUSED, as if a socket nobody is bound to.
        if std::fs::metadata(path).is_ok_and(|m| !m.file_type().is_socket()) {
            return Err(peer(PeerProblem::NotASocket));
        }
        let socket = UnixDatagram::unbound().map_err(TapError::io("creating a socket"))?;
        socket
            .connect(path)
            .map_err(|e| peer(PeerProblem::of(e, 0, false)))?;
        socket
            .set_nonblocking(true)
            .map_err(TapError::io("making the socket non-blocking"))?;
        Ok(Link {
            socket,
            path,
            errors: [0; SendErrorKind::ALL.len()],
            stop,
        })
    }

    /// Sends one datagram. A full receiver queue is waited out and the datagram resent, never
    /// dropped; any other error ends the run.
    fn send(&mut self, bytes: &[u8]) -> Result<(), TapError> {
        loop {
            let Err(err) = self.socket.send(bytes) else {
                return Ok(());
            };
            let kind = SendErrorKind::of(&err);
            if let Some(i) = SendErrorKind::ALL.iter().position(|&k| k == kind) {
                self.errors[i] += 1;
            }
            if kind != SendErrorKind::QueueFull {
                return Err(TapError::Peer {
                    path: self.path.to_owned(),
                    problem: PeerProblem::of(err, bytes.len(), true),
                });
            }
            if signals::stopping(self.stop) {
                return Err(TapError::Interrupted);
            }
            std::thread::sleep(QUEUE_FULL_WAIT);
        }
    }

    /// The send errors by kind, e.g. `queue_full=12 (waited and resent)`, or `none`.
    fn errors(&self) -> String {
        let named: Vec<String> = SendErrorKind::ALL
            .iter()
            .zip(self.errors)
            .filter(|&(_, n)| n > 0)
            .map(|(kind, n)| match kind {
                SendErrorKind::QueueFull => format!("{}={n} (waited and resent)", kind.as_str()),
                _ => format!("{}={n}", kind.as_str()),
            })
            .collect();
        if named.is_empty() {
            "none".to_owned()
        } else {
            named.join(", ")
        }
    }
}

/// What has been sent so far.
struct Sent {
    sender: u64,
    version: u8,
    started: Instant,
    datagrams: u64,
    clicks: u64,
    seqs: Option<(u64, u64)>,
}

impl Sent {
    fn new(sender: u64, version: u8) -> Self {
        Sent {
            sender,
            version,
            started: Instant::now(),
            datagrams: 0,
            clicks: 0,
            seqs: None,
        }
    }

    fn record(&mut self, seq: u64, clicks: usize) {
        self.datagrams += 1;
        self.clicks += clicks as u64;
        let first = self.seqs.map_or(seq, |(first, _)| first);
        self.seqs = Some((first, seq));
    }

    fn summary(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        let seqs = match self.seqs {
            Some((first, last)) => format!("seq {first}..={last}"),
            None => "no seq".to_owned(),
        };
        format!(
            "sent {} datagrams, {} clicks ({seqs}) as sender {} (wire version {}) in \
             {secs:.2}s ({:.0} clicks/s)",
            self.datagrams,
            self.clicks,
            self.sender,
            self.version,
            self.clicks as f64 / secs.max(1e-9)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_rate_sends_what_is_due_within_the_flush_window() {
        let pace = Pace::new(20.0); // a click every 50 ms
        assert!(
            !pace.flush_before(4, 6),
            "100 ms after the first: same datagram"
        );
        assert!(
            pace.flush_before(4, 7),
            "150 ms after the first: next datagram"
        );
        assert_eq!(pace.stamp_us(3) - pace.stamp_us(0), 150_000);
    }

    #[test]
    fn a_code_file_past_its_most_codes_is_refused_at_the_first_line_too_many() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("codes.txt");
        // With the last newline and without.
        for (text, more) in [("a\nb\nc\n", "a\nb\nc\nd\n"), ("a\nb\nc", "a\nb\nc\nd")] {
            std::fs::write(&path, text).unwrap();
            let mut codes = Vec::new();
            read_code_file(&path, &mut codes, 3).unwrap();
            assert_eq!(codes, ["a", "b", "c"]);
            std::fs::write(&path, more).unwrap();
            let err = read_code_file(&path, &mut Vec::new(), 3).unwrap_err();
            assert_eq!(err.to_string(), "--code-file line 4: more than 3 codes");
        }
    }

    #[test]
    fn absurd_rates_and_counts_saturate_instead_of_overflowing() {
        let pace = Pace::new(0.001);
        assert_eq!(pace.stamp_us(u64::MAX), i64::MAX);
        assert!(pace.flush_before(0, u64::MAX));
    }
}
