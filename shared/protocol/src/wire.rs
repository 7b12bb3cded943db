//! The messages of the click socket, postcard-encoded, one per datagram:
//!
//! - a click datagram ([`Datagram`]), from a sender (a redirector) to the collector: version 2
//!   (each click with its [`Dimensions`]), or version 1 (code and time only), which senders of
//!   earlier releases write and every collector still reads, so that hosts upgrade one by one;
//! - an acknowledgement, version 1 ([`Ack`]), from the collector back to a sender that sent
//!   from an address of its own;
//! - a resync, version 1 ([`Resync`]), from such a sender to the collector, when the collector
//!   asks for a seq the sender no longer holds.
//!
//! The first byte tells them apart: a click datagram's is its version (1 or 2), an
//! acknowledgement's has the high bit set (`0x81`: acknowledgement, version 1), a resync's bit
//! 6 (`0x41`), so each side rejects another's message as a wrong version rather than
//! misreading it.
//!
//! Decoding borrows every code from the receive buffer and rejects a datagram whole, by a
//! named [`Reject`] reason, if anything in it is wrong. Encoding goes through [`Encoder`],
//! which writes postcard's bytes directly (no intermediate `Datagram`) and never passes its
//! size limit; the property tests hold it byte-identical to the serde derivation of each
//! version's types.

use serde::{Deserialize, Serialize};

use crate::dimensions::{self, Agent, Country, Device, Dimensions, MAX_REFERRER_LEN};
use crate::RejectReason;

/// The click datagram version this crate writes.
pub const VERSION: u8 = 2;
/// The click datagram versions this crate reads.
pub const VERSIONS: std::ops::RangeInclusive<u8> = 1..=VERSION;
/// The fewest bytes a click takes, in any version: a code's length and one byte of it, and its
/// offset.
pub const MIN_CLICK_LEN: usize = 3;
/// Longest click code, in bytes.
pub const MAX_CODE_LEN: usize = 64;
/// No datagram is ever larger than this.
pub const MAX_DATAGRAM: usize = 60 * 1024;
/// Smallest size limit an [`Encoder`] accepts: one header plus one longest click.
pub const MIN_DATAGRAM: usize = HEADER_MAX + MAX_CLICK_LEN;
/// Default datagram size limit. Chosen by `cargo bench -p shared --bench datagram_size`:
/// throughput in clicks/s is flat from 8 KiB up, while ten queued datagrams of this size
/// (the receiver's default `max_dgram_qlen`) still fit the sender's default 208 KiB SO_SNDBUF.
pub const DEFAULT_DATAGRAM: usize = 16 * 1024;
/// First timestamp a click may carry: 0001-01-01T00:00:00Z, in microseconds since the Unix epoch.
pub const MIN_CLICKED_AT_US: i64 = -62_135_596_800_000_000;
/// Timestamps must be before 10000-01-01T00:00:00Z, well inside PostgreSQL's range.
pub const END_CLICKED_AT_US: i64 = 253_402_300_800_000_000;

/// How far before its first click an encoder puts a datagram's `base_us`, so that clicks
/// pushed slightly out of order by concurrent request threads still get a non-negative
/// offset. Offsets between 2^14 and 2^21 us take three varint bytes either way.
const BASE_SLACK_US: i64 = 1_000_000;
const VARINT_MAX: usize = 10;
/// version + sender + seq + base_us + click count.
const HEADER_MAX: usize = 1 + 3 * VARINT_MAX + 5;
/// code length byte + code + offset varint, then version 2's dimensions: agent, referrer
/// (tag, length byte, host), device (tag, class), country (tag, two letters).
const MAX_CLICK_LEN: usize = 1 + MAX_CODE_LEN + 5 + 1 + (2 + MAX_REFERRER_LEN) + 2 + 3;

/// One datagram: clicks from one sender, numbered by `seq` (0, 1, 2, ... per sender).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// 1 or 2: a version-1 datagram's clicks carry no dimensions (their agent is
    /// [`Agent::Unknown`]).
    pub version: u8,
    pub sender: u64,
    pub seq: u64,
    pub base_us: i64,
    pub clicks: Vec<Click<'a>>,
}

/// One followed link: its code, when (as an offset from the batch's `base_us`), and what the
/// redirector recorded of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Click<'a> {
    pub code: &'a str,
    pub offset_us: u32,
    pub dimensions: Dimensions<'a>,
}

impl<'a> Click<'a> {
    /// A click with no dimension recorded (a human's, as a version-1 sender saw every click).
    pub fn new(code: &'a str, offset_us: u32) -> Click<'a> {
        Click {
            code,
            offset_us,
            dimensions: Dimensions::default(),
        }
    }
}

/// The version-1 datagram, as postcard lays it out.
#[derive(Serialize, Deserialize)]
struct V1<'a> {
    version: u8,
    sender: u64,
    seq: u64,
    base_us: i64,
    #[serde(borrow)]
    clicks: Vec<ClickV1<'a>>,
}

/// A code is read as bytes and checked by [`code_str`]: its characters are ASCII, so UTF-8
/// need not be checked a second time. The bytes are the same on the wire: postcard reads bytes
/// as it reads a str (a varint length, then the bytes), and serde writes `&[u8]` as a sequence
/// of `u8`, which postcard lays out the same way (a varint length, then a byte each). The
/// golden vectors (`wire/tests.rs`) hold both versions to it.
#[derive(Serialize, Deserialize)]
struct ClickV1<'a> {
    code: &'a [u8],
    offset_us: u32,
}

impl<'a> ClickV1<'a> {
    /// The click (the `index`th, of a datagram based at `base_us`), if its code and time are
    /// valid; its agent is [`Agent::Unknown`].
    fn click(&self, index: usize, base_us: i64) -> Result<Click<'a>, Reject> {
        let click = Click {
            code: code_str(index, self.code)?,
            offset_us: self.offset_us,
            dimensions: Dimensions {
                agent: Agent::Unknown,
                ..Dimensions::default()
            },
        };
        check_time(index, base_us, self.offset_us)?;
        Ok(click)
    }
}

/// The version-2 datagram, as postcard lays it out.
#[derive(Serialize, Deserialize)]
struct V2<'a> {
    version: u8,
    sender: u64,
    seq: u64,
    base_us: i64,
    #[serde(borrow)]
    clicks: Vec<ClickV2<'a>>,
}

#[derive(Serialize, Deserialize)]
struct ClickV2<'a> {
    code: &'a [u8],
    offset_us: u32,
    agent: u8,
    referrer: Option<&'a str>,
    device: Option<u8>,
    country: Option<[u8; 2]>,
}

impl<'a> ClickV2<'a> {
    fn new(c: &Click<'a>) -> ClickV2<'a> {
        let d = &c.dimensions;
        ClickV2 {
            code: c.code.as_bytes(),
            offset_us: c.offset_us,
            agent: d.agent as u8,
            referrer: d.referrer,
            device: d.device.map(|d| d as u8),
            country: d.country.map(|c| c.bytes()),
        }
    }

    /// The click (the `index`th, of a datagram based at `base_us`), if its code is valid, its
    /// dimensions are ones a sender could have written, and its time is valid.
    fn click(&self, index: usize, base_us: i64) -> Result<Click<'a>, Reject> {
        let code = code_str(index, self.code)?;
        let dimensions = self.dimensions().ok_or(Reject::BadDimension { index })?;
        check_time(index, base_us, self.offset_us)?;
        Ok(Click {
            code,
            offset_us: self.offset_us,
            dimensions,
        })
    }

    fn dimensions(&self) -> Option<Dimensions<'a>> {
        let referrer = match self.referrer {
            Some(r) if !dimensions::valid_referrer(r) => return None,
            r => r,
        };
        let device = match self.device {
            Some(d) => Some(Device::from_u8(d)?),
            None => None,
        };
        let country = match self.country {
            Some(c) => Some(Country::parse(&c).filter(|p| p.bytes() == c)?),
            None => None,
        };
        Some(Dimensions {
            agent: Agent::from_u8(self.agent)?,
            referrer,
            device,
            country,
        })
    }
}

impl Datagram<'_> {
    /// Each click's code with its absolute time in microseconds since the Unix epoch.
    /// Only meaningful on a batch that [`decode`] accepted (which checked the sums).
    pub fn clicks_at(&self) -> impl Iterator<Item = (&str, i64)> + '_ {
        self.clicks
            .iter()
            .map(|c| (c.code, self.base_us + i64::from(c.offset_us)))
    }

    /// Its bytes, as an [`Encoder`] of its version would write them: for tools and tests that
    /// set the header fields themselves (a forged seq, say) rather than count up to them. A
    /// version-1 datagram drops the clicks' dimensions; another is laid out as version 2,
    /// its version byte as given (a wrong version, for a test).
    pub fn encode(&self) -> Vec<u8> {
        let (version, sender, seq, base_us) = (self.version, self.sender, self.seq, self.base_us);
        let written = if version == 1 {
            let clicks = self.clicks.iter();
            let clicks = clicks.map(|c| ClickV1 {
                code: c.code.as_bytes(),
                offset_us: c.offset_us,
            });
            let v1 = V1 {
                version,
                sender,
                seq,
                base_us,
                clicks: clicks.collect(),
            };
            postcard::to_allocvec(&v1)
        } else {
            let v2 = V2 {
                version,
                sender,
                seq,
                base_us,
                clicks: self.clicks.iter().map(ClickV2::new).collect(),
            };
            postcard::to_allocvec(&v2)
        };
        written.expect("a Datagram always serializes into a Vec")
    }
}

/// Why a code is not a valid click code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    #[error("empty code")]
    Empty,
    #[error("code is {0} bytes, over the {MAX_CODE_LEN}-byte limit")]
    TooLong(usize),
    #[error("byte {byte:#04x} at position {at} is outside [A-Za-z0-9_-]")]
    BadByte { at: usize, byte: u8 },
}

/// The bytes a code may hold, `[A-Za-z0-9_-]`, as one lookup a byte rather than four ranges
/// compared: every code of every datagram is checked.
const CODE_BYTES: [bool; 256] = {
    let mut allowed = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        allowed[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        b += 1;
    }
    allowed
};

/// Checks that `code` is 1 to 64 bytes of `[A-Za-z0-9_-]`.
pub fn validate_code(code: &[u8]) -> Result<(), CodeError> {
    if code.is_empty() {
        return Err(CodeError::Empty);
    }
    if code.len() > MAX_CODE_LEN {
        return Err(CodeError::TooLong(code.len()));
    }
    match code.iter().position(|&b| !CODE_BYTES[usize::from(b)]) {
        Some(at) => Err(CodeError::BadByte { at, byte: code[at] }),
        None => Ok(()),
    }
}

/// `code`, that of click `index`, as a str, if [`validate_code`] accepts it.
fn code_str(index: usize, code: &[u8]) -> Result<&str, Reject> {
    validate_code(code).map_err(|error| Reject::BadCode { index, error })?;
    debug_assert!(code.is_ascii());
    // SAFETY: validate_code accepted only bytes of [A-Za-z0-9_-] (CODE_BYTES, whose every byte
    // a test checks), all ASCII, and ASCII is UTF-8.
    Ok(unsafe { std::str::from_utf8_unchecked(code) })
}

/// Why a datagram was rejected. Every variant rejects the whole datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("undecodable: {0}")]
    Undecodable(String),
    #[error("wrong version {got}, this build reads version {want}")]
    WrongVersion { got: u8, want: u8 },
    #[error("click {index}: {error}")]
    BadCode { index: usize, error: CodeError },
    #[error("click {index}: timestamp {at_us} us is outside years 1 to 9999")]
    BadTimestamp { index: usize, at_us: i128 },
    #[error("{0} trailing bytes after the batch")]
    TrailingBytes(usize),
    #[error("click {index}: a dimension no sender writes")]
    BadDimension { index: usize },
}

impl Reject {
    /// Its reason, for metrics labels and logs.
    pub fn reason(&self) -> RejectReason {
        match self {
            Reject::Undecodable(_) => RejectReason::Undecodable,
            Reject::WrongVersion { .. } => RejectReason::WrongVersion,
            Reject::BadCode { .. } => RejectReason::BadCode,
            Reject::BadTimestamp { .. } => RejectReason::BadTimestamp,
            Reject::TrailingBytes(_) => RejectReason::TrailingBytes,
            Reject::BadDimension { .. } => RejectReason::BadDimension,
        }
    }
}

/// Decodes and validates one datagram of either version, borrowing the codes from `buf`.
/// Never panics.
pub fn decode(buf: &[u8]) -> Result<Datagram<'_>, Reject> {
    let datagram = match buf.first() {
        None => return Err(Reject::Undecodable("empty datagram".into())),
        Some(1) => {
            let v1: V1<'_> = take_whole(buf)?;
            let mut clicks = Vec::with_capacity(v1.clicks.len());
            for (index, c) in v1.clicks.iter().enumerate() {
                clicks.push(c.click(index, v1.base_us)?);
            }
            Datagram {
                version: v1.version,
                sender: v1.sender,
                seq: v1.seq,
                base_us: v1.base_us,
                clicks,
            }
        }
        Some(&VERSION) => {
            let v2: V2<'_> = take_whole(buf)?;
            let mut clicks = Vec::with_capacity(v2.clicks.len());
            for (index, c) in v2.clicks.iter().enumerate() {
                clicks.push(c.click(index, v2.base_us)?);
            }
            Datagram {
                version: v2.version,
                sender: v2.sender,
                seq: v2.seq,
                base_us: v2.base_us,
                clicks,
            }
        }
        Some(&got) => return Err(Reject::WrongVersion { got, want: VERSION }),
    };
    Ok(datagram)
}

/// What every version of datagram begins with (see [`Encoder::datagram`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct DatagramHeader {
    pub version: u8,
    pub sender: u64,
    pub seq: u64,
    base_us: i64,
    /// How many clicks follow.
    pub clicks: u64,
}

/// The header of a datagram of a version this build reads, its clicks left unread: what a
/// sender checks of a datagram it holds, without judging the clicks by this build's rules (a
/// build before or after it may have written them, and the collector judges them); what the
/// collector judges a datagram it rejects by. Undecodable if it counts more clicks than the
/// bytes after it could hold.
pub fn decode_header(buf: &[u8]) -> Result<DatagramHeader, Reject> {
    let (header, clicks): (DatagramHeader, &[u8]) =
        postcard::take_from_bytes(buf).map_err(|e| Reject::Undecodable(e.to_string()))?;
    if !VERSIONS.contains(&header.version) {
        let (got, want) = (header.version, VERSION);
        return Err(Reject::WrongVersion { got, want });
    }
    if header.clicks > (clicks.len() / MIN_CLICK_LEN) as u64 {
        let counted = header.clicks;
        return Err(Reject::Undecodable(format!(
            "{counted} clicks counted in {} bytes",
            clicks.len()
        )));
    }
    Ok(header)
}

/// Whether click `index`, at `offset_us` from `base_us`, lies within years 1 to 9999. Checked
/// with each click's code and dimensions, so that the first bad click names the reject.
fn check_time(index: usize, base_us: i64, offset_us: u32) -> Result<(), Reject> {
    let at_us = i128::from(base_us) + i128::from(offset_us);
    if !(i128::from(MIN_CLICKED_AT_US)..i128::from(END_CLICKED_AT_US)).contains(&at_us) {
        return Err(Reject::BadTimestamp { index, at_us });
    }
    Ok(())
}

/// `buf` as one `T`, with nothing after it.
fn take_whole<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> Result<T, Reject> {
    let (message, rest): (T, &[u8]) =
        postcard::take_from_bytes(buf).map_err(|e| Reject::Undecodable(e.to_string()))?;
    if !rest.is_empty() {
        return Err(Reject::TrailingBytes(rest.len()));
    }
    Ok(message)
}

/// The first byte of an acknowledgement: the high bit marks a message from the collector to a
/// sender, the low bits its version.
pub const ACK_VERSION: u8 = 0x81;
/// No acknowledgement is longer: version, sender, two optional seqs.
pub const MAX_ACK: usize = 1 + VARINT_MAX + 2 * (1 + VARINT_MAX);

/// The collector to one sender: what it committed, and what it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub version: u8,
    /// Whose datagrams this is about.
    pub sender: u64,
    /// Every datagram of the sender up to this seq is committed (`None`: none is known to be).
    /// Cumulative, so a lost acknowledgement is covered by the next one.
    pub committed: Option<u64>,
    /// The collector received a later datagram than it can accept and waits for this seq: the
    /// sender should resend from it now rather than at its timeout.
    pub resend_from: Option<u64>,
}

impl Ack {
    /// An acknowledgement of version [`ACK_VERSION`].
    pub fn new(sender: u64, committed: Option<u64>, resend_from: Option<u64>) -> Ack {
        Ack {
            version: ACK_VERSION,
            sender,
            committed,
            resend_from,
        }
    }

    /// Its bytes, at most [`MAX_ACK`].
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("an Ack always serializes")
    }
}

/// Decodes one acknowledgement. Never panics; rejects by the same reasons as [`decode`].
pub fn decode_ack(buf: &[u8]) -> Result<Ack, Reject> {
    decode_control(buf, ACK_VERSION)
}

/// The first byte of a resync: bit 6 marks a control message from a sender to the collector,
/// the low bits its version. A collector that predates it rejects it as a wrong version.
pub const RESYNC_VERSION: u8 = 0x41;
/// No resync is longer: version, sender, first seq held, clicks before it.
pub const MAX_RESYNC: usize = 1 + 3 * VARINT_MAX;

/// A sender to the collector, in answer to a resend request for a seq it no longer holds:
/// every datagram of this sender below `first` was acknowledged (by this collector before it
/// lost its record, or by one whose commits it lost), `clicks_before` clicks in all since the
/// sender's seq 0. The collector goes on from `first` and counts what it has no record of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resync {
    pub version: u8,
    pub sender: u64,
    pub first: u64,
    pub clicks_before: u64,
}

impl Resync {
    /// A resync of version [`RESYNC_VERSION`].
    pub fn new(sender: u64, first: u64, clicks_before: u64) -> Resync {
        Resync {
            version: RESYNC_VERSION,
            sender,
            first,
            clicks_before,
        }
    }

    /// Its bytes, at most [`MAX_RESYNC`].
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a Resync always serializes")
    }
}

/// Decodes one resync. Never panics; rejects by the same reasons as [`decode`].
pub fn decode_resync(buf: &[u8]) -> Result<Resync, Reject> {
    decode_control(buf, RESYNC_VERSION)
}

/// Decodes a fixed-size control message whose first byte must be `version`.
fn decode_control<'a, T: Deserialize<'a>>(buf: &'a [u8], version: u8) -> Result<T, Reject> {
    match buf.first() {
        None => return Err(Reject::Undecodable("empty datagram".into())),
        Some(&got) if got != version => return Err(Reject::WrongVersion { got, want: version }),
        Some(_) => {}
    }
    take_whole(buf)
}

/// A random sender id for one process start. Below 2^63, so it reads the same as a
/// PostgreSQL `bigint` in `click_senders`.
pub fn random_sender() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_i64(crate::now_us());
    hasher.finish() >> 1
}

/// Why [`Encoder::push`] did not take a click.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The click would pass the size limit or the `u32` offset: send this datagram, then push
    /// the click again. An empty encoder never answers this.
    #[error("datagram full")]
    Full,
    #[error("bad code: {0}")]
    BadCode(#[from] CodeError),
    #[error("timestamp {0} us is outside years 1 to 9999")]
    BadTimestamp(i64),
    #[error("referrer host is not [a-z0-9.-_] of at most {MAX_REFERRER_LEN} bytes")]
    BadReferrer,
}

/// A size limit outside [`MIN_DATAGRAM`]..=[`MAX_DATAGRAM`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("datagram size {0} is outside {MIN_DATAGRAM}..={MAX_DATAGRAM} bytes")]
pub struct BadLimit(pub usize);

/// Builds the datagrams of one sender: push clicks until [`EncodeError::Full`], send
/// [`Encoder::datagram`] (as often as it takes), then [`Encoder::next`].
///
/// The header is written last, right-aligned into space reserved at the front of the buffer,
/// so the datagram is one contiguous slice and the click bytes are never copied.
#[derive(Debug, Clone)]
pub struct Encoder {
    version: u8,
    limit: usize,
    sender: u64,
    seq: u64,
    base_us: i64,
    clicks: u32,
    /// `HEADER_MAX` reserved bytes, then the encoded clicks.
    buf: Vec<u8>,
}

impl Encoder {
    /// An encoder of version [`VERSION`] datagrams.
    pub fn new(sender: u64, limit: usize) -> Result<Self, BadLimit> {
        Self::of_version(VERSION, sender, limit)
    }

    /// An encoder of version-1 datagrams (code and time only), as senders of earlier releases
    /// write them: for tools and tests that play one. Any other version is [`VERSION`].
    pub fn of_version(version: u8, sender: u64, limit: usize) -> Result<Self, BadLimit> {
        if !(MIN_DATAGRAM..=MAX_DATAGRAM).contains(&limit) {
            return Err(BadLimit(limit));
        }
        let mut buf = Vec::with_capacity(limit + HEADER_MAX);
        buf.resize(HEADER_MAX, 0);
        Ok(Self {
            version: if version == 1 { 1 } else { VERSION },
            limit,
            sender,
            seq: 0,
            base_us: 0,
            clicks: 0,
            buf,
        })
    }

    /// The sequence number of the datagram being filled.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The sender id the datagrams carry.
    pub fn sender(&self) -> u64 {
        self.sender
    }

    /// Goes on as sender `sender` from seq 0, keeping the clicks pushed so far (the header is
    /// written only by [`Encoder::datagram`]).
    pub fn restart_as(&mut self, sender: u64) {
        self.resume_as(sender, 0);
    }

    /// Goes on as sender `sender` from `seq`: where an earlier process of that sender left off.
    pub fn resume_as(&mut self, sender: u64, seq: u64) {
        self.sender = sender;
        self.seq = seq;
    }

    /// Clicks in the datagram being filled.
    pub fn len(&self) -> usize {
        self.clicks as usize
    }

    pub fn is_empty(&self) -> bool {
        self.clicks == 0
    }

    /// Size of the datagram as it stands, header included.
    pub fn encoded_len(&self) -> usize {
        self.header_len(self.clicks) + self.body_len()
    }

    /// Adds a click at `at_us` (microseconds since the Unix epoch) with no dimension but its
    /// agent, a human.
    pub fn push(&mut self, code: &str, at_us: i64) -> Result<(), EncodeError> {
        self.push_with(code, at_us, &Dimensions::default())
    }

    /// Adds a click at `at_us` (microseconds since the Unix epoch) with its dimensions (which a
    /// version-1 encoder leaves out).
    pub fn push_with(
        &mut self,
        code: &str,
        at_us: i64,
        dimensions: &Dimensions<'_>,
    ) -> Result<(), EncodeError> {
        validate_code(code.as_bytes())?;
        if let Some(r) = dimensions.referrer {
            if !dimensions::valid_referrer(r) {
                return Err(EncodeError::BadReferrer);
            }
        }
        if !(MIN_CLICKED_AT_US..END_CLICKED_AT_US).contains(&at_us) {
            return Err(EncodeError::BadTimestamp(at_us));
        }
        if self.clicks == 0 {
            self.base_us = at_us.saturating_sub(BASE_SLACK_US).max(MIN_CLICKED_AT_US);
        }
        let offset = u32::try_from(at_us - self.base_us).map_err(|_| EncodeError::Full)?;
        let mut click_len = 1 + code.len() + varint_len(u64::from(offset));
        if self.version == VERSION {
            click_len += dimensions_len(dimensions);
        }
        if self.header_len(self.clicks + 1) + self.body_len() + click_len > self.limit {
            return Err(EncodeError::Full);
        }
        self.buf.push(code.len() as u8);
        self.buf.extend_from_slice(code.as_bytes());
        put_varint(&mut self.buf, u64::from(offset));
        if self.version == VERSION {
            put_dimensions(&mut self.buf, dimensions);
        }
        self.clicks += 1;
        Ok(())
    }

    /// The finished datagram for the clicks pushed so far. Calling it again returns the same
    /// bytes, so a datagram that could not be sent is resent unchanged.
    pub fn datagram(&mut self) -> &[u8] {
        let mut header = [0u8; HEADER_MAX];
        let mut len = 0;
        let mut put = |v: u64| len += write_varint(&mut header[len..], v);
        put(u64::from(self.version));
        put(self.sender);
        put(self.seq);
        put(zigzag(self.base_us));
        put(u64::from(self.clicks));
        let start = HEADER_MAX - len;
        self.buf[start..HEADER_MAX].copy_from_slice(&header[..len]);
        &self.buf[start..]
    }

    /// Forgets the current clicks and moves on to the next sequence number.
    pub fn next(&mut self) {
        self.buf.truncate(HEADER_MAX);
        self.clicks = 0;
        self.seq += 1;
    }

    fn body_len(&self) -> usize {
        self.buf.len() - HEADER_MAX
    }

    fn header_len(&self, clicks: u32) -> usize {
        1 + varint_len(self.sender)
            + varint_len(self.seq)
            + varint_len(zigzag(self.base_us))
            + varint_len(u64::from(clicks))
    }
}

/// A version-2 click's dimensions as postcard writes them: the agent's byte, then each
/// `Option` as a tag byte and its value (a referrer is at most 64 bytes: one length byte).
fn put_dimensions(out: &mut Vec<u8>, d: &Dimensions<'_>) {
    out.push(d.agent as u8);
    match d.referrer {
        Some(r) => {
            out.extend_from_slice(&[1, r.len() as u8]);
            out.extend_from_slice(r.as_bytes());
        }
        None => out.push(0),
    }
    match d.device {
        Some(device) => out.extend_from_slice(&[1, device as u8]),
        None => out.push(0),
    }
    match d.country {
        Some(c) => {
            out.push(1);
            out.extend_from_slice(&c.bytes());
        }
        None => out.push(0),
    }
}

fn dimensions_len(d: &Dimensions<'_>) -> usize {
    1 + d.referrer.map_or(1, |r| 2 + r.len())
        + d.device.map_or(1, |_| 2)
        + d.country.map_or(1, |_| 3)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn write_varint(out: &mut [u8], mut v: u64) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    let mut tmp = [0u8; VARINT_MAX];
    let n = write_varint(&mut tmp, v);
    out.extend_from_slice(&tmp[..n]);
}

#[cfg(test)]
mod tests;
