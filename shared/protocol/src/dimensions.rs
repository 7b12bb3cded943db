//! What a click carries besides its code and time (wire version 2): who followed the link
//! (`Agent`, always), and the coarse, opt-in dimensions of the breakdowns (`referrer` host,
//! `Device` class, `Country`). None of them is personal data: no address, no user agent, only
//! classes and a host name, which the collector aggregates per code and day.
//!
//! Each value has one spelling ([`Dimensions::values`]), the `value` of `click_breakdown`.

/// Longest referrer host kept, in bytes. A longer host is cut at a label boundary from the left
/// (its registrable domain, at the right, is kept): see [`referrer_host`].
pub const MAX_REFERRER_LEN: usize = 64;

/// Who followed a link, as the redirector classified its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Agent {
    #[default]
    Human = 0,
    /// A crawler or a tool (its user agent is on the list of known bots).
    Bot = 1,
    /// A link unfurler of a chat or social app, or a prefetch (`Sec-Purpose: prefetch`).
    Preview = 2,
    /// Not classified: a click of a version-1 sender, which predates the classes.
    Unknown = 3,
}

/// The class of device a click came from, by its user agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Device {
    Desktop = 0,
    Mobile = 1,
    Tablet = 2,
    Other = 3,
}

/// An ISO 3166-1 alpha-2 country code, upper case, one of those assigned (or Kosovo's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Country([u8; 2]);

/// The assigned ISO 3166-1 alpha-2 codes (tzdata's `iso3166.tab`, 249 of them) and `XK`,
/// sorted, two bytes each. `XK` is user-assigned, not ISO's, but it is Kosovo's in the EU's
/// and the IMF's use and in the GeoIP databases CDNs fill their country headers from: left
/// out, every click from Kosovo would be counted as an invalid header. A collector from before
/// it holds a datagram carrying it as an unknown dimension value (`bad_dimension`): upgrade
/// collectors first.
const ISO_3166: &[u8] = b"ADAEAFAGAIALAMAOAQARASATAUAWAXAZBABBBDBEBFBGBHBIBJBLBMBNBOBQBRBSBTBVBWBYBZCACCCDCFCGCHCICKCLCMCNCOCRCUCVCWCXCYCZDEDJDKDMDODZECEEEGEHERESETFIFJFKFMFOFRGAGBGDGEGFGGGHGIGLGMGNGPGQGRGSGTGUGWGYHKHMHNHRHTHUIDIEILIMINIOIQIRISITJEJMJOJPKEKGKHKIKMKNKPKRKWKYKZLALBLCLILKLRLSLTLULVLYMAMCMDMEMFMGMHMKMLMMMNMOMPMQMRMSMTMUMVMWMXMYMZNANCNENFNGNINLNONPNRNUNZOMPAPEPFPGPHPKPLPMPNPRPSPTPWPYQARERORSRURWSASBSCSDSESGSHSISJSKSLSMSNSOSRSSSTSVSXSYSZTCTDTFTGTHTJTKTLTMTNTOTRTTTVTWTZUAUGUMUSUYUZVAVCVEVGVIVNVUWFWSXKYEYTZAZMZW";

impl Country {
    /// The code in `text` (either case, surrounding blanks ignored), if it is an assigned
    /// alpha-2 code. `XX` or `T1` (what some CDNs send for unknown and Tor) are not.
    pub fn parse(text: &[u8]) -> Option<Country> {
        let text = text.trim_ascii();
        let [a, b] = <[u8; 2]>::try_from(text).ok()?;
        let code = [a.to_ascii_uppercase(), b.to_ascii_uppercase()];
        assigned(code).then_some(Country(code))
    }

    pub fn bytes(&self) -> [u8; 2] {
        self.0
    }

    /// Its two letters as a `'static` str, from [`ISO_3166`] (the collector keys counts by
    /// it, beyond the click's lifetime).
    pub fn as_str(self) -> &'static str {
        // Assigned, checked by `parse`.
        let i = iso_index(self.0).unwrap_or(0);
        std::str::from_utf8(&ISO_3166[i * 2..i * 2 + 2]).unwrap_or("??")
    }
}

/// A click's dimensions. `None` is a dimension the redirector does not record
/// (`--dimensions`); `Some("")` for `referrer` is a request without a usable `Referer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dimensions<'a> {
    pub agent: Agent,
    pub referrer: Option<&'a str>,
    pub device: Option<Device>,
    pub country: Option<Country>,
}

/// One dimension of `click_breakdown` (its `dimension` column; `--dimensions` names the last
/// three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Dimension {
    Agent = 0,
    Referrer = 1,
    Device = 2,
    Country = 3,
}

impl Dimension {
    pub const ALL: [Dimension; 4] = [
        Dimension::Agent,
        Dimension::Referrer,
        Dimension::Device,
        Dimension::Country,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Agent => "agent",
            Dimension::Referrer => "referrer",
            Dimension::Device => "device",
            Dimension::Country => "country",
        }
    }

    pub fn parse(name: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.as_str() == name)
    }
}

/// The `click_breakdown` value of a request without a usable `Referer`.
pub const NO_REFERRER: &str = "(none)";

impl Agent {
    pub const ALL: [Agent; 4] = [Agent::Human, Agent::Bot, Agent::Preview, Agent::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            Agent::Human => "human",
            Agent::Bot => "bot",
            Agent::Preview => "preview",
            Agent::Unknown => "unknown",
        }
    }

    /// The agent whose `as u8` is `v`.
    pub fn from_u8(v: u8) -> Option<Agent> {
        Agent::ALL.get(usize::from(v)).copied()
    }
}

impl Device {
    pub const ALL: [Device; 4] = [
        Device::Desktop,
        Device::Mobile,
        Device::Tablet,
        Device::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Device::Desktop => "desktop",
            Device::Mobile => "mobile",
            Device::Tablet => "tablet",
            Device::Other => "other",
        }
    }

    /// The device class whose `as u8` is `v`.
    pub fn from_u8(v: u8) -> Option<Device> {
        Device::ALL.get(usize::from(v)).copied()
    }
}

impl<'a> Dimensions<'a> {
    /// Each recorded dimension with its `click_breakdown` value: the agent always, then those
    /// recorded.
    pub fn values(&self) -> impl Iterator<Item = (Dimension, &'a str)> + '_ {
        std::iter::once((Dimension::Agent, self.agent.as_str())).chain(self.recorded())
    }

    /// The dimensions recorded besides the agent, with their values: none when a redirector
    /// records only the agent. Chained options rather than a list of four to filter: the
    /// collector asks this of every click it counts.
    pub fn recorded(&self) -> impl Iterator<Item = (Dimension, &'a str)> + '_ {
        let referrer = self.referrer.map(|r| {
            (
                Dimension::Referrer,
                if r.is_empty() { NO_REFERRER } else { r },
            )
        });
        let device = self.device.map(|d| (Dimension::Device, d.as_str()));
        let country = self.country.map(|c| (Dimension::Country, c.as_str()));
        referrer.into_iter().chain(device).chain(country)
    }
}

/// [`ISO_3166`] as a bit per pair of letters: row `first - b'A'`, bit `second - b'A'`. A
/// lookup instead of a search: the redirector checks a country header on every request.
const ASSIGNED: [u32; 26] = {
    let mut rows = [0u32; 26];
    let mut i = 0;
    while i < ISO_3166.len() {
        rows[(ISO_3166[i] - b'A') as usize] |= 1 << (ISO_3166[i + 1] - b'A');
        i += 2;
    }
    rows
};

/// Where `code` is in [`ISO_3166`], if it is there (a binary search, no allocation).
fn iso_index(code: [u8; 2]) -> Option<usize> {
    let (mut lo, mut hi) = (0, ISO_3166.len() / 2);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match ISO_3166[mid * 2..mid * 2 + 2].cmp(&code[..]) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Some(mid),
        }
    }
    None
}

/// Whether `code` (upper case) is assigned.
fn assigned(code: [u8; 2]) -> bool {
    let [a, b] = code;
    a.is_ascii_uppercase()
        && b.is_ascii_uppercase()
        && ASSIGNED[usize::from(a - b'A')] & (1 << (b - b'A')) != 0
}

/// What follows `scheme://` at the start of `url` (RFC 3986: a letter, then letters, digits,
/// `+`, `-` or `.`); `None` when it does not begin so (a relative reference, whose query may
/// hold another URL).
fn after_scheme(url: &[u8]) -> Option<&[u8]> {
    let colon = url.iter().position(|&b| b == b':')?;
    let (scheme, rest) = url.split_at(colon);
    let letter = scheme.first()?.is_ascii_alphabetic();
    let rest_ok = scheme
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b));
    (letter && rest_ok).then_some(())?;
    rest.strip_prefix(b"://")
}

/// Whether `host` is a referrer host as [`referrer_host`] writes it: at most
/// [`MAX_REFERRER_LEN`] bytes of `[a-z0-9.-_]` (empty: none).
pub fn valid_referrer(host: &str) -> bool {
    host.len() <= MAX_REFERRER_LEN
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
}

/// The host of a `Referer` header's URL, lower case, without user info or port, cut to its
/// last labels that fit [`MAX_REFERRER_LEN`], written into `out`; empty when the header holds
/// no usable host (it does not begin with `scheme://`, or a byte a host name does not hold) or
/// an address rather than a name (an IPv4 address in any of the forms a browser reads, as an
/// IPv6 one's brackets are refused: a self-hosted page's or a home router's address can say
/// who someone is). Never allocates.
pub fn referrer_host<'o>(referer: &[u8], out: &'o mut [u8; MAX_REFERRER_LEN]) -> &'o str {
    let Some(authority) = after_scheme(referer) else {
        return "";
    };
    let end = authority
        .iter()
        .position(|b| b"/?#".contains(b))
        .unwrap_or(authority.len());
    let authority = &authority[..end];
    let host = match authority.iter().rposition(|&b| b == b'@') {
        Some(i) => &authority[i + 1..],
        None => authority,
    };
    let host = match host.iter().rposition(|&b| b == b':') {
        Some(i) if host[i + 1..].iter().all(u8::is_ascii_digit) => &host[..i],
        _ => host,
    };
    // A fully qualified name's root (`example.com.`), however often written, is the same host.
    let dots = host.iter().rev().take_while(|&&b| b == b'.').count();
    let mut host = &host[..host.len() - dots];
    if ends_in_a_number(host) {
        return "";
    }
    while host.len() > MAX_REFERRER_LEN {
        match host.iter().position(|&b| b == b'.') {
            Some(i) => host = &host[i + 1..],
            None => return "",
        }
    }
    for (o, b) in out.iter_mut().zip(host) {
        *o = b.to_ascii_lowercase();
    }
    let host = std::str::from_utf8(&out[..host.len()]).unwrap_or("");
    if valid_referrer(host) {
        host
    } else {
        ""
    }
}

/// Whether `host` (its root dots taken off) is an IPv4 address, as the WHATWG URL standard
/// tells one ("ends in a number"): its last label is decimal digits, or `0x` and hex digits.
/// No top-level domain is either.
fn ends_in_a_number(host: &[u8]) -> bool {
    let last = host.rsplit(|&b| b == b'.').next().unwrap_or_default();
    let hex = last
        .strip_prefix(b"0x")
        .or_else(|| last.strip_prefix(b"0X"));
    match hex {
        Some(digits) => digits.iter().all(u8::is_ascii_hexdigit),
        None => !last.is_empty() && last.iter().all(u8::is_ascii_digit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_iso_list_is_sorted_and_whole() {
        let pairs: Vec<_> = ISO_3166.chunks_exact(2).collect();
        assert_eq!(pairs.len(), 250);
        assert!(pairs.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_bit_table_holds_the_list_exactly() {
        for a in b'A'..=b'Z' {
            for b in b'A'..=b'Z' {
                assert_eq!(
                    assigned([a, b]),
                    iso_index([a, b]).is_some(),
                    "{}",
                    a as char
                );
            }
        }
    }

    #[test]
    fn countries_are_assigned_codes_in_either_case() {
        assert_eq!(Country::parse(b"de").map(|c| c.bytes()), Some(*b"DE"));
        assert_eq!(Country::parse(b" US ").map(|c| c.bytes()), Some(*b"US"));
        for bad in [&b"XX"[..], b"T1", b"D", b"DEU", b"", b"\xff\xfe", b"ZZ"] {
            assert_eq!(Country::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Country::parse(b"zw").unwrap().as_str(), "ZW");
        assert_eq!(Country::parse(b"XK").unwrap().as_str(), "XK", "Kosovo");
    }

    #[test]
    fn referrer_hosts() {
        let mut out = [0; MAX_REFERRER_LEN];
        let mut host = |r: &str| referrer_host(r.as_bytes(), &mut out).to_owned();
        assert_eq!(
            host("https://News.Example.com/item?id=1"),
            "news.example.com"
        );
        assert_eq!(host("http://user:pw@example.com:8080/x"), "example.com");
        assert_eq!(host("android-app://com.slack/"), "com.slack");
        assert_eq!(host("https://example.com."), "example.com");
        assert_eq!(host("example.com/no-scheme"), "");
        assert_eq!(
            host("/x?u=https://a.com/"),
            "",
            "a URL in a relative reference's query"
        );
        assert_eq!(host("1http://a.com/"), "", "a scheme begins with a letter");
        assert_eq!(
            host("https://example.com../"),
            "example.com",
            "every root dot"
        );
        assert_eq!(host("https://exa mple.com/"), "");
        assert_eq!(host("https://[::1]:80/"), "");
        // Addresses, in every form a browser reads as IPv4, are not names.
        for address in [
            "http://203.0.113.7:8080/page",
            "http://192.168.1.1./",
            "http://3232235777/",
            "http://0x7f.1/",
            "http://0XC0A80101/",
            "http://10.1/",
        ] {
            assert_eq!(host(address), "", "{address}");
        }
        assert_eq!(host("https://1.example.com/"), "1.example.com");
        assert_eq!(host("https://example.0xyz/"), "example.0xyz");
        let long = format!("https://{}.example.com/", "a".repeat(60));
        assert_eq!(host(&long), "example.com");
        let label = format!("https://{}/", "b".repeat(70));
        assert_eq!(host(&label), "");
    }

    #[test]
    fn values_name_the_recorded_dimensions_only() {
        let dims = Dimensions {
            agent: Agent::Bot,
            referrer: Some(""),
            device: None,
            country: Country::parse(b"fr"),
        };
        let values: Vec<_> = dims.values().map(|(d, v)| (d.as_str(), v)).collect();
        assert_eq!(
            values,
            [
                ("agent", "bot"),
                ("referrer", NO_REFERRER),
                ("country", "FR")
            ]
        );
        assert_eq!(dims.recorded().count(), 2);
        let agent_only = Dimensions {
            agent: Agent::Bot,
            ..Dimensions::default()
        };
        assert_eq!(agent_only.recorded().count(), 0);
        assert_eq!(agent_only.values().count(), 1);
    }
}
