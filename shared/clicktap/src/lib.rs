//! `clicktap`: looks at the click socket from outside. `listen` binds a path (as a stand-in
//! collector or as the collector's `--mirror` target) and prints what arrives, `send` acts as a
//! redirector, `decode` explains one datagram's bytes.
//!
//! Everything here is synchronous on std sockets: one socket, one loop, nothing to schedule.

mod decode;
pub mod hex;
mod listen;
mod send;
mod show;
mod signals;

pub use send::MAX_FILE_CODES;

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use protocol::wire::{self, EncodeError};
use shared::socket::{BindError, SendErrorKind};

/// Socket-level inspection of the click pipeline's datagram socket.
#[derive(Debug, Parser)]
#[command(
    name = "clicktap",
    version,
    after_help = "Examples:\n  \
        clicktap listen --socket /tmp/tap.sock --stats\n  \
        clicktap send --socket /tmp/tap.sock --code abc --code xyz --count 10000 --rate 2000\n  \
        echo 01b960070902057365656431000178ac02 | clicktap decode --hex"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bind a socket path and print every datagram that arrives, decoded (or why it was
    /// rejected), or per-second totals with --stats. Removes the socket file on exit.
    Listen(listen::Args),
    /// Act as a redirector: send clicks as well-formed datagrams (or --raw bytes) to a
    /// listening socket, then print what was sent and the send errors by kind.
    Send(send::Args),
    /// Decode one datagram's bytes and print its fields, or say exactly why it is invalid
    /// (exit status 1).
    Decode(decode::Args),
}

/// Why a subcommand failed; printed as one line, exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("{path}: {problem}", path = .path.display())]
    Peer { path: PathBuf, problem: PeerProblem },
    #[error("invalid datagram of {len} bytes: {error} (reason: {reason}); first bytes: {head}")]
    Invalid {
        len: usize,
        reason: &'static str,
        error: String,
        head: String,
    },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error(transparent)]
    Hex(#[from] hex::HexError),
    #[error("cannot encode click {index}: {error}")]
    Encode { index: u64, error: EncodeError },
    #[error("--code-file line {line}: {why}")]
    CodeFile { line: usize, why: String },
    #[error("interrupted by a signal")]
    Interrupted,
    #[error("{0}")]
    Usage(String),
}

impl TapError {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> TapError {
        let what = what.into();
        move |source| TapError::Io { what, source }
    }
}

/// What is wrong with the socket `send` talks to.
#[derive(Debug, thiserror::Error)]
pub enum PeerProblem {
    #[error("exists but is not a socket")]
    NotASocket,
    #[error("is a socket of another type (not a datagram socket)")]
    WrongType,
    #[error("nobody is listening: {0}")]
    NobodyListening(&'static str),
    #[error("permission denied: this user may not write to the socket (check its mode and group)")]
    PermissionDenied,
    #[error("the receiver refused a datagram of {0} bytes as too large")]
    TooLarge(usize),
    #[error("{0}")]
    Other(io::Error),
}

impl PeerProblem {
    /// Names a failed connect or send by what the user should check. Once `connected`, a
    /// refusal (ECONNREFUSED, then ENOTCONN) is the listener's death: its file may be gone.
    fn of(err: io::Error, len: usize, connected: bool) -> PeerProblem {
        if err.raw_os_error() == Some(nix::libc::EPROTOTYPE) {
            return PeerProblem::WrongType;
        }
        match SendErrorKind::of(&err) {
            SendErrorKind::NotFound => PeerProblem::NobodyListening("no socket at this path"),
            SendErrorKind::Refused if !connected => {
                PeerProblem::NobodyListening("the socket file is there but nobody is bound to it")
            }
            SendErrorKind::Refused | SendErrorKind::NotConnected => {
                PeerProblem::NobodyListening("the listener went away")
            }
            SendErrorKind::PermissionDenied => PeerProblem::PermissionDenied,
            SendErrorKind::TooLarge => PeerProblem::TooLarge(len),
            SendErrorKind::QueueFull | SendErrorKind::Other => PeerProblem::Other(err),
        }
    }
}

/// Runs one `clicktap` command.
pub fn run(cli: Cli) -> Result<(), TapError> {
    match cli.command {
        Command::Listen(args) => listen::run(&args),
        Command::Send(args) => send::run(&args),
        Command::Decode(args) => decode::run(&args),
    }
}

/// The most bytes a datagram's input may have: its hex with up to two separators after every
/// byte (`od -An -tx1` writes 49 bytes a 16), and a line's end. More is no datagram
/// (`/dev/zero`, `yes |`), and is not read into memory.
const MAX_INPUT: u64 = 4 * wire::MAX_DATAGRAM as u64 + 2;

/// All bytes of a file, or of stdin for `-`; refused past [`MAX_INPUT`].
fn read_all(source: &Path) -> Result<Vec<u8>, TapError> {
    let what = match source.to_str() {
        Some("-") => "stdin".to_owned(),
        _ => source.display().to_string(),
    };
    let input: Box<dyn Read> = match source.to_str() {
        Some("-") => Box::new(io::stdin()),
        _ => {
            Box::new(std::fs::File::open(source).map_err(TapError::io(format!("reading {what}")))?)
        }
    };
    let mut bytes = Vec::new();
    input
        .take(MAX_INPUT + 1)
        .read_to_end(&mut bytes)
        .map_err(TapError::io(format!("reading {what}")))?;
    if bytes.len() as u64 > MAX_INPUT {
        return Err(TapError::Usage(format!(
            "{what} holds more than {MAX_INPUT} bytes: no datagram is that long, even as hex"
        )));
    }
    Ok(bytes)
}

/// Prints a line to stdout and flushes it. A closed pipe (`| head`) is not an error.
fn say(text: &str) -> Result<(), TapError> {
    match signals::Stdout.line(text) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(TapError::io("writing to stdout")(e))
        }
        _ => Ok(()),
    }
}
