//! Who followed a link and from where: the dimensions a click carries
//! (`protocol::dimensions`), read from the request's headers alone. It runs on every redirect,
//! so it stays cheap: no lock and no I/O; the lists are compiled once, in [`Classifier::new`],
//! and a user agent this thread has judged lately is judged again from a small cache, without
//! the bot list and without allocating (only a new one pays `isbot`'s `String`).

use std::cell::Cell;
use std::hash::BuildHasher;

use aho_corasick::{AhoCorasick, MatchKind};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, REFERER, USER_AGENT};
use protocol::dimensions::{referrer_host, Agent, Country, Device, Dimensions, MAX_REFERRER_LEN};
use regex::bytes::Regex;

pub(crate) use crate::config::Recorded;

/// A request's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Classified<'b> {
    pub(crate) dimensions: Dimensions<'b>,
    /// The country header was there but held no assigned ISO 3166 alpha-2 code (the proxy or
    /// CDN sent `XX`, `T1` or garbage): the caller counts it, the click carries no country.
    pub(crate) country_rejected: bool,
    /// The country is recorded and the request had no country header (it did not come
    /// through the proxy or CDN that sets it, or that one does not): the caller counts it, the
    /// click carries no country.
    pub(crate) country_missing: bool,
}

/// The headers a classification reads (`Classifier::relevant`).
#[derive(Default)]
struct Relevant<'h> {
    user_agent: Option<&'h HeaderValue>,
    referer: Option<&'h HeaderValue>,
    /// The country header, when the country is recorded.
    country: Option<&'h HeaderValue>,
    /// A purpose header says the request is made ahead of any click.
    ahead_of_a_click: bool,
}

/// Link unfurlers of chat and social apps, as regex fragments matched against the user agent
/// as the apps spell it (case-sensitive). Each fetches a link to show its card when someone
/// posts it, not when someone follows it. Tokens that an app's in-app browser also carries
/// (`Snapchat/`, `Line/`, `Pinterest/`, `Instagram`) are left out: those are people.
const UNFURLERS: &[&str] = &[
    "Slackbot-LinkExpanding", // Slack
    "Slack-ImgProxy",         // Slack, fetching a card's image
    "Twitterbot",             // X
    "facebookexternalhit",    // Facebook, Messenger, Instagram; iMessage and LINE send it too
    "Facebot",                // Facebook
    "Discordbot",             // Discord
    "TelegramBot",            // Telegram
    "WhatsApp/",              // WhatsApp; Signal's previews send it too
    "LinkedInBot",            // LinkedIn
    "SkypeUriPreview",        // Skype and Microsoft Teams
    "Iframely",               // embedding service behind many apps
    "Embedly",                // embedding service behind many apps
    "redditbot",              // Reddit
    "Mastodon/",              // each Mastodon server a link is posted to
    "Pleroma",                // Pleroma and its forks, as Mastodon
    "Akkoma",                 // as Mastodon
    "Cardyb",                 // Bluesky's card service
    "vkShare",                // VK
    "Pinterestbot",           // Pinterest
    "Snap URL Preview",       // Snapchat
    "^Viber$",                // Viber (its in-app browser sends a full browser user agent)
    "Google-PageRenderer",    // Google Chat and Google's other link cards
];

/// Headers with which a browser marks a request it makes ahead of any click, whose page the
/// user may never see: `Sec-Purpose` (Chrome's prefetch and prerender), `Purpose` (older
/// Chrome), `X-Purpose` (Safari's previews) and `X-Moz` (Firefox's prefetch).
static PURPOSE_HEADERS: [HeaderName; 4] = [
    HeaderName::from_static("sec-purpose"),
    HeaderName::from_static("purpose"),
    HeaderName::from_static("x-purpose"),
    HeaderName::from_static("x-moz"),
];

/// What a purpose header says when the request is ahead of a click (`prefetch;prerender` too).
const PURPOSES: [&[u8]; 2] = [b"prefetch", b"preview"];

/// User agent tokens that tell the device class, each setting the bit of its index.
const DEVICE_TOKENS: [&str; 14] = [
    "iPad",
    "Tablet",
    "Kindle",
    "Silk",
    "Android",
    "Mobi",
    "iPhone",
    "iPod",
    "Windows Phone",
    "Windows NT",
    "Macintosh",
    "X11",
    "CrOS",
    "Linux",
];
const TABLET: u32 = 0b1111;
const ANDROID: u32 = 1 << 4;
const MOBI: u32 = 1 << 5;
const MOBILE: u32 = 0b1_1111 << 4;
const DESKTOP: u32 = 0b1_1111 << 9;

/// Sets of the per-thread verdict cache (a power of two), each of [`WAYS`] slots of 8 bytes.
const VERDICT_SETS: usize = 128;
/// Slots a set holds: user agents whose hashes pick the same set are all kept, up to this
/// many. With one (a direct-mapped cache of 512 slots), two of the commonest that happened to
/// pick the same slot, as two of twenty-one do in about one process in three, took it from
/// each other on every alternation, each time paying a miss.
const WAYS: usize = 4;

/// One set of the verdict cache, in half a cache line.
#[repr(align(32))]
struct VerdictSet([Cell<u64>; WAYS]);

thread_local! {
    /// This thread's latest verdicts on user agents, in sets picked by the user agent's
    /// hash: a slot holds the hash less its low byte, and in that byte the encoded
    /// [`Verdict`] (0: empty). Matching the bot list costs several times the rest of a
    /// redirect's classification, and a few hundred user agents make most of the clicks. No
    /// lock (each thread has its own), no allocation (a fixed array), no destructor to
    /// register.
    static VERDICTS: [VerdictSet; VERDICT_SETS] =
        const { [const { VerdictSet([const { Cell::new(0) }; WAYS]) }; VERDICT_SETS] };
}

/// What the user agent alone says: who sent it and, for a human, from which device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    agent: Agent,
    device: Device,
}

impl Verdict {
    /// A bot's or a preview's device is `Other`: what it claims to run on says nothing of who
    /// will read the link.
    const TOOL: Verdict = Verdict {
        agent: Agent::Bot,
        device: Device::Other,
    };
    const PREVIEW: Verdict = Verdict {
        agent: Agent::Preview,
        device: Device::Other,
    };

    /// Never 0 (an empty slot): the high bit is set.
    fn encode(self) -> u8 {
        0x80 | (self.agent as u8) << 2 | self.device as u8
    }

    fn decode(byte: u8) -> Option<Verdict> {
        let agent = match (byte >> 2) & 0b11 {
            0 => Agent::Human,
            1 => Agent::Bot,
            2 => Agent::Preview,
            _ => return None,
        };
        let device = Device::ALL[usize::from(byte & 0b11)];
        (byte & 0x80 != 0).then_some(Verdict { agent, device })
    }
}

/// Classifies requests: the bot and unfurler lists compiled once, shared by every handler.
pub(crate) struct Classifier {
    recorded: Recorded,
    /// The header the fronting proxy names the country in, if the country is recorded.
    country_header: Option<HeaderName>,
    unfurlers: Regex,
    /// The `isbot` crate: the omrilotan/isbot list (maintained, and kept free of browsers) as
    /// one regex, rather than a list of our own to keep. Its call lower-cases the user agent
    /// into a new `String` and runs the whole regex, several times what the rest of the
    /// classification costs (benches/visitor.rs), hence the verdict cache in front of it: only
    /// a user agent new to this thread's cache (or evicted from it) pays that allocation.
    bots: isbot::Bots,
    devices: AhoCorasick,
    /// Keys the verdict cache; seeded at random, so that no one can choose a user agent
    /// whose hashes crowd a browser's out of its set.
    hasher: foldhash::fast::RandomState,
}

impl Classifier {
    pub(crate) fn new(recorded: Recorded, country_header: Option<HeaderName>) -> Classifier {
        // The patterns are constants that the tests compile: they cannot fail at run time.
        let unfurlers = Regex::new(&UNFURLERS.join("|")).expect("the unfurler patterns");
        // Leftmost-first: a few times faster than the standard semantics, whose search keeps
        // the automaton running past each match; the tokens do not overlap, so no match is lost.
        let devices = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(DEVICE_TOKENS)
            .expect("the device tokens");
        Classifier {
            recorded,
            country_header: country_header.filter(|_| recorded.country),
            unfurlers,
            bots: isbot::Bots::default(),
            devices,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The dimensions of a request; the referrer host is written into `buf`.
    pub(crate) fn classify<'b>(
        &self,
        headers: &HeaderMap,
        buf: &'b mut [u8; MAX_REFERRER_LEN],
    ) -> Classified<'b> {
        let found = self.relevant(headers);
        let verdict = self.verdict(&found);
        // A country header that holds no assigned code: the caller counts it.
        let country = found.country.map(|value| Country::parse(value.as_bytes()));
        let referrer = match found.referer {
            Some(referer) if self.recorded.referrer => referrer_host(referer.as_bytes(), buf),
            _ => "",
        };
        let dimensions = Dimensions {
            agent: verdict.agent,
            referrer: self.recorded.referrer.then_some(referrer),
            device: self.recorded.device.then_some(verdict.device),
            country: country.flatten(),
        };
        Classified {
            dimensions,
            country_rejected: country.is_some_and(|c| c.is_none()),
            country_missing: self.country_header.is_some() && country.is_none(),
        }
    }

    /// A preview by its headers first (a browser's prefetch carries a browser's user agent),
    /// then by its user agent. Every browser sends a user agent: a request without one is a
    /// tool's.
    fn verdict(&self, found: &Relevant<'_>) -> Verdict {
        if found.ahead_of_a_click {
            return Verdict::PREVIEW;
        }
        found
            .user_agent
            .map_or(Verdict::TOOL, |ua| self.cached(ua.as_bytes()))
    }

    /// The headers a classification reads, in one pass over the request's, rather than a
    /// `get` apiece (each hashes its name and probes the map: five to seven a request, by the
    /// dimensions recorded): comparing
    /// each name (a byte, for a standard one) costs less, even for a browser's dozen or more
    /// headers (BENCHMARKS.md, "The redirector's share"). Each header's first value, as `get`
    /// gives it, but any value of a purpose header; the country header only when the country
    /// is recorded.
    fn relevant<'h>(&self, headers: &'h HeaderMap) -> Relevant<'h> {
        let mut found = Relevant::default();
        for (name, value) in headers {
            // On its own: the country header may have been named as one of the others.
            if Some(name) == self.country_header.as_ref() {
                found.country.get_or_insert(value);
            }
            if name == USER_AGENT {
                found.user_agent.get_or_insert(value);
            } else if name == REFERER {
                found.referer.get_or_insert(value);
            } else if PURPOSE_HEADERS.contains(name) {
                found.ahead_of_a_click |= marks_ahead_of_a_click(value.as_bytes());
            }
        }
        found
    }

    /// The verdict on `ua` from this thread's cache, judged and kept there on a miss: first
    /// in its set, the set's oldest verdict dropped (a hit moves nothing, so it writes
    /// nothing).
    fn cached(&self, ua: &[u8]) -> Verdict {
        let (set, tag) = verdict_slot(self.hasher.hash_one(ua));
        VERDICTS.with(|sets| {
            let slots = &sets[set].0;
            let held = slots.iter().map(Cell::get).find(|held| held & !0xff == tag);
            if let Some(verdict) = held.and_then(|held| Verdict::decode(held as u8)) {
                return verdict;
            }
            let verdict = self.judge(ua);
            for way in (1..WAYS).rev() {
                slots[way].set(slots[way - 1].get());
            }
            slots[0].set(tag | u64::from(verdict.encode()));
            verdict
        })
    }

    /// An unfurler, a bot or a human, by the user agent alone; a human's device. An empty
    /// user agent is a tool's, and so is one that is not UTF-8 (browsers send ASCII).
    fn judge(&self, ua: &[u8]) -> Verdict {
        if self.unfurlers.is_match(ua) {
            return Verdict::PREVIEW;
        }
        match std::str::from_utf8(ua) {
            Ok(text) if !text.is_empty() && !self.bots.is_bot(text) => Verdict {
                agent: Agent::Human,
                device: self.device_of(ua),
            },
            _ => Verdict::TOOL,
        }
    }

    /// Tablet before mobile (an Android tablet's browser says `Android` without `Mobile`; a
    /// tablet's Firefox says `Tablet`), mobile before desktop (phones say `Linux` too). iPadOS's
    /// Safari asks for desktop pages by saying `Macintosh`: it counts as desktop, as it asks.
    /// An app's own HTTP stack (`Dalvik/`, not a browser's `Mozilla/`) says `Android` without
    /// `Mobile` on phones and tablets alike: other.
    fn device_of(&self, ua: &[u8]) -> Device {
        let seen = self
            .devices
            .find_iter(ua)
            .fold(0u32, |seen, m| seen | 1 << m.pattern().as_u32());
        let android_only = seen & ANDROID != 0 && seen & MOBI == 0;
        if seen & TABLET != 0 {
            Device::Tablet
        } else if android_only && !ua.starts_with(b"Mozilla/") {
            Device::Other
        } else if android_only {
            Device::Tablet
        } else if seen & MOBILE != 0 {
            Device::Mobile
        } else if seen & DESKTOP != 0 {
            Device::Desktop
        } else {
            Device::Other
        }
    }
}

/// A user agent's set in the verdict cache, and its tag: the set comes from bits that the
/// tag keeps too, so that the tag alone tells two user agents of one set apart.
fn verdict_slot(hash: u64) -> (usize, u64) {
    ((hash >> 8) as usize % VERDICT_SETS, hash & !0xff)
}

/// Whether a purpose header's value marks the request as made ahead of a click.
fn marks_ahead_of_a_click(value: &[u8]) -> bool {
    PURPOSES.iter().any(|p| contains_ignore_case(value, p))
}

fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

// By path, so that the bench that compiles this file finds it too.
#[cfg(test)]
#[path = "visitor/tests.rs"]
mod tests;
