//! What a link answers: its row of `links` (URL, redirect status, query forwarding, expiry) as
//! the link table stores it, and the redirect it gives one request.
//!
//! The table stores bytes per code (`table`); a link's are one byte of options, its expiry
//! (8 bytes, only when it has one), then the URL. A link with every default (302, query
//! forwarded, never expires) costs one byte more than its URL.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use hyper::header::HeaderValue;
use hyper::StatusCode;

/// The statuses a link may redirect with (`links_status_redirect`, migration 14), by the index
/// its options byte holds: the default first.
const STATUSES: [StatusCode; 4] = [
    StatusCode::FOUND,
    StatusCode::MOVED_PERMANENTLY,
    StatusCode::TEMPORARY_REDIRECT,
    StatusCode::PERMANENT_REDIRECT,
];
const STATUS_BITS: u8 = 0b11;
/// The request's query is not merged into the URL.
const NO_QUERY: u8 = 0b100;
/// Eight bytes of expiry (Unix microseconds, little endian) follow.
const EXPIRES: u8 = 0b1000;

/// A row's options, as `links` has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOptions {
    pub status: i16,
    pub forward_query: bool,
    /// Unix microseconds; `None`: never.
    pub expires_us: Option<i64>,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            status: 302,
            forward_query: true,
            expires_us: None,
        }
    }
}

/// A status `links` should not hold (its CHECK refuses it; a row from before it could).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("status {0} is not one of 301, 302, 307, 308")]
pub struct BadStatus(pub i16);

/// Writes the table's bytes for a link: its options, then `url`.
pub fn encode(options: &LinkOptions, url: &[u8], out: &mut Vec<u8>) -> Result<(), BadStatus> {
    let status = STATUSES
        .iter()
        .position(|s| i16::try_from(s.as_u16()) == Ok(options.status))
        .ok_or(BadStatus(options.status))? as u8;
    let mut flags = status;
    if !options.forward_query {
        flags |= NO_QUERY;
    }
    out.clear();
    match options.expires_us {
        Some(at) => {
            out.push(flags | EXPIRES);
            out.extend_from_slice(&at.to_le_bytes());
        }
        None => out.push(flags),
    }
    out.extend_from_slice(&uri(&ascii_host(url)));
    Ok(())
}

/// `url` with an internationalised host name in its ASCII form (`bücher.de`:
/// `xn--bcher-kva.de`), as a browser sends it: percent-encoded, as the rest of the URL's UTF-8
/// is (`uri`), a host is not one that clients resolve. The `idna` crate (of the `url` crate's
/// authors) maps it, by UTS 46 as browsers do: punycode and its mapping rules are not to be
/// written again here. A host it refuses is left as it is (and then percent-encoded), one
/// whose mapping would make a URL delimiter too (a full-width `＠`, `／` or `：` maps to `@`,
/// `/` or `:`, which would send the redirect to another host): the URL standard's deny list,
/// as browsers refuse such a URL.
fn ascii_host(url: &[u8]) -> Cow<'_, [u8]> {
    let Some(at) = url.windows(3).position(|w| w == b"://") else {
        return Cow::Borrowed(url);
    };
    let start = at + 3;
    let authority = &url[start..];
    let end = start
        + authority
            .iter()
            .position(|b| b"/?#".contains(b))
            .unwrap_or(authority.len());
    let authority = &url[start..end];
    if authority.is_ascii() {
        return Cow::Borrowed(url);
    }
    let host_from = start
        + authority
            .iter()
            .rposition(|&b| b == b'@')
            .map_or(0, |i| i + 1);
    let host = &url[host_from..end];
    let host_to = host_from + host.iter().rposition(|&b| b == b':').unwrap_or(host.len());
    let host = &url[host_from..host_to];
    let ascii = idna::domain_to_ascii_cow(host, idna::AsciiDenyList::URL).ok();
    match ascii {
        Some(ascii) => {
            let mut out = Vec::with_capacity(url.len() + ascii.len());
            out.extend_from_slice(&url[..host_from]);
            out.extend_from_slice(ascii.as_bytes());
            out.extend_from_slice(&url[host_to..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(url),
    }
}

/// `bytes` with a space and every byte past ASCII (a URL's UTF-8, which `links` may hold and a
/// request's query may carry) percent-encoded, as a browser sends them, so that `Location`
/// holds no raw UTF-8, which not every client takes; copied only if there is any. Nothing else
/// is touched (a `%` stays: the URL's own escapes).
fn uri(bytes: &[u8]) -> Cow<'_, [u8]> {
    let plain = |b: u8| b != b' ' && b.is_ascii();
    if bytes.iter().all(|&b| plain(b)) {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() * 3);
    for &b in bytes {
        match plain(b) {
            true => out.push(b),
            false => {
                out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]])
            }
        }
    }
    Cow::Owned(out)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// What a request for a link gets.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Redirect {
        status: StatusCode,
        location: HeaderValue,
        /// Whole seconds until the link expires, for one that does.
        expires_in_s: Option<i64>,
        /// The request's query was not forwarded: it would add more than [`MAX_FORWARDED`]
        /// bytes to `Location`.
        query_dropped: bool,
    },
    /// Past its `expires_at`: 410 Gone, and no click.
    Expired,
}

impl Answer {
    /// The answer of the link stored as `value` to a request with `query` (the part after
    /// `?`, if any), at `now_us()` (read only for a link that expires). `None` for bytes the
    /// loader never writes.
    pub(crate) fn of(
        value: &[u8],
        query: Option<&str>,
        now_us: impl FnOnce() -> i64,
    ) -> Option<Answer> {
        let (&flags, rest) = value.split_first()?;
        let (url, expires_in_s) = if flags & EXPIRES != 0 {
            let (at, url) = rest.split_first_chunk::<8>()?;
            let left_us = i64::from_le_bytes(*at).saturating_sub(now_us());
            if left_us <= 0 {
                return Some(Answer::Expired);
            }
            (url, Some(left_us / 1_000_000))
        } else {
            (rest, None)
        };
        let status = STATUSES[usize::from(flags & STATUS_BITS)];
        let forwarded = query
            .filter(|q| !q.is_empty() && flags & NO_QUERY == 0)
            .map(|query| merged(url, query.as_bytes()));
        let query_dropped = matches!(forwarded, Some(None));
        let location = match forwarded.flatten() {
            Some(location) => location,
            None => HeaderValue::from_bytes(url).ok()?,
        };
        Some(Answer::Redirect {
            status,
            location,
            expires_in_s,
            query_dropped,
        })
    }
}

/// The most bytes a request's query may add to `Location`: 2 KiB. A request head of 16 KiB
/// (`MAX_HEAD` of `http`) can carry a query that percent-encodes to three times that, and hyper keeps the header buffer
/// it grew for the rest of the connection (to about 48 KiB), on every connection a client
/// opens. Past it, the link's URL alone is the answer. Added to the longest stored URL (2 KiB
/// of UTF-8, 6 KiB encoded), 8 KiB, the buffer hyper writes a response head into.
pub(crate) const MAX_FORWARDED: usize = 2048;

/// `url` with the request's `query` merged into its own: the URL's parameters first, kept as
/// they are, then the request's in their order, less those whose name the URL already has;
/// the fragment stays last; `None` where that would add more than [`MAX_FORWARDED`] bytes.
/// Names compare by their roots as lenient targets read them ([`Reading::root`], a name with
/// an unclosed `[` both as Rack and as PHP reads it): `%72ef`, `REF`, `ref[]` or (beside a
/// `ref_`) `ref[` is the URL's `ref` or `ref_` to some server, and `filter` or `filter[color]` touches the
/// URL's `filter[brand]`: none may override it there. Parameters are split on `;` as on `&`
/// where Rack 2 and older Python frameworks split them: a request's parameter goes only if no
/// piece of it between `;`s names one the URL has.
fn merged(url: &[u8], query: &[u8]) -> Option<HeaderValue> {
    let (before_fragment, fragment) = match url.iter().position(|&b| b == b'#') {
        Some(i) => url.split_at(i),
        None => (url, &b""[..]),
    };
    let own = match before_fragment.iter().position(|&b| b == b'?') {
        Some(i) => &before_fragment[i + 1..],
        None => &b""[..],
    };
    let mut out = BytesMut::with_capacity(url.len() + query.len() + 1);
    out.put_slice(before_fragment);
    let mut separator = match (own.is_empty(), before_fragment.last()) {
        (true, Some(b'?')) | (false, Some(b'&')) => None,
        (true, _) => Some(b'?'),
        (false, _) => Some(b'&'),
    };
    // Sorted once, so that a request of thousands of parameters against a URL of hundreds
    // costs a search each, not a scan of the URL each.
    // Empty parameters name nothing: a URL without a query, or ending in `&`, has no
    // parameter named "" for a request's `=x` to be taken for.
    let params = own.split(|&b| b == b'&' || b == b';');
    let mut names: Vec<Reading> = params
        .filter(|p| !p.is_empty())
        .flat_map(|p| readings(name(p)))
        .collect();
    names.sort_unstable_by(|a, b| a.root().cmp(b.root()));
    let known = |piece: &[u8]| {
        readings(name(piece)).any(|reading| {
            let key = reading.root();
            names
                .binary_search_by(|n| n.root().cmp(key.clone()))
                .is_ok()
        })
    };
    for param in query.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        // As the URL's own, encoded when loaded.
        let param = uri(param);
        if param
            .split(|&b| b == b';')
            .filter(|p| !p.is_empty())
            .any(known)
        {
            continue;
        }
        if let Some(s) = separator {
            out.put_u8(s);
        }
        separator = Some(b'&');
        out.put_slice(&param);
    }
    out.put_slice(fragment);
    if out.len() - url.len() > MAX_FORWARDED {
        return None;
    }
    // The URL passed as a header value when it was loaded, and the query is put as a URI
    // holds it: the merge is one too. Were it not, the URL alone is the answer.
    HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
}

fn name(param: &[u8]) -> &[u8] {
    param.split(|&b| b == b'=').next().unwrap_or(param)
}

/// A parameter's name, read one way (see [`Reading::root`]).
#[derive(Clone, Copy)]
struct Reading<'a> {
    name: &'a [u8],
    /// PHP's reading of a name whose first `[` no `]` follows: no nesting, the whole name.
    unclosed: bool,
}

/// The ways targets read `name`: its root, and where its first `[` has no `]` after it, as
/// PHP reads that (`utm[source` is its `utm_source`; Rack's `utm`).
fn readings(name: &[u8]) -> impl Iterator<Item = Reading<'_>> {
    let mut after = decoded(name)
        .take_while(|&b| b != 0)
        .skip_while(|&b| b != b'[');
    let unclosed = after.next() == Some(b'[') && !after.any(|b| b == b']');
    let plain = Reading {
        name,
        unclosed: false,
    };
    std::iter::once(plain).chain(unclosed.then_some(Reading {
        name,
        unclosed: true,
    }))
}

impl<'a> Reading<'a> {
    /// The root of the name as the most lenient targets read it: escapes decoded once, `+`
    /// a space; leading spaces and brackets dropped (PHP, Rack); up to a NUL (PHP) or a
    /// bracket, under which PHP and Rack nest values (`ref[]`, `ref[x]`, `ref]` are all
    /// `ref`'s, and a plain `ref` replaces what is nested under it), but for PHP's reading of
    /// an unclosed `[`, read as `_`; a space or a dot read as `_` (PHP's `utm.source` is
    /// `utm_source`); ASCII letters in lower case (ASP.NET). Compared once a parameter,
    /// without allocating.
    fn root(self) -> impl Iterator<Item = u8> + Clone + 'a {
        let unclosed = self.unclosed;
        let bracket = move |b: u8| !unclosed && matches!(b, b'[' | b']');
        decoded(self.name)
            .skip_while(move |&b| b == b' ' || bracket(b))
            .take_while(move |&b| b != 0 && !bracket(b))
            .map(|b| match b {
                b' ' | b'.' | b'[' => b'_',
                b => b.to_ascii_lowercase(),
            })
    }
}

/// `name` with its escapes decoded once and `+` read as a space.
fn decoded(name: &[u8]) -> impl Iterator<Item = u8> + Clone + '_ {
    let mut rest = name;
    std::iter::from_fn(move || {
        let (&b, tail) = rest.split_first()?;
        rest = tail;
        let byte = match (b, tail) {
            (b'%', [hi, lo, after @ ..]) => match (hex(*hi), hex(*lo)) {
                (Some(hi), Some(lo)) => {
                    rest = after;
                    hi << 4 | lo
                }
                _ => b,
            },
            (b'+', _) => b' ',
            _ => b,
        };
        Some(byte)
    })
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(options: LinkOptions, url: &str) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&options, url.as_bytes(), &mut out).unwrap();
        out
    }

    fn location(url: &str, query: Option<&str>) -> String {
        match Answer::of(&stored(LinkOptions::default(), url), query, || 0).unwrap() {
            Answer::Redirect {
                status, location, ..
            } => {
                assert_eq!(status, StatusCode::FOUND);
                location.to_str().unwrap().to_owned()
            }
            Answer::Expired => panic!("never expires"),
        }
    }

    #[test]
    fn the_query_is_merged_and_the_urls_own_parameters_are_kept_in_order() {
        let t = "https://example.com/p";
        assert_eq!(location(t, None), t);
        assert_eq!(location(t, Some("")), t);
        assert_eq!(
            location(t, Some("utm_source=mail&b=2")),
            "https://example.com/p?utm_source=mail&b=2"
        );
        assert_eq!(
            location("https://e.com/?", Some("a=1")),
            "https://e.com/?a=1"
        );
        assert_eq!(
            location("https://e.com/p?a=1&c=3", Some("b=2&a=9&d&c=7&b=5")),
            "https://e.com/p?a=1&c=3&b=2&d&b=5"
        );
        assert_eq!(
            location("https://e.com/p#top", Some("x=1")),
            "https://e.com/p?x=1#top"
        );
        assert_eq!(
            location("https://e.com/p?a=1#top", Some("&&x=1&")),
            "https://e.com/p?a=1&x=1#top"
        );
        // A parameter with no name is forwarded as any other, unless the URL has one.
        assert_eq!(location(t, Some("=x")), "https://example.com/p?=x");
        assert_eq!(
            location("https://e.com/p?a&", Some("=x")),
            "https://e.com/p?a&=x"
        );
        assert_eq!(
            location("https://e.com/p?=1", Some("=x")),
            "https://e.com/p?=1"
        );
    }

    /// A name the URL has, spelled otherwise, is the URL's to a target that decodes names or
    /// folds their case: the request cannot override the link's parameter with it.
    #[test]
    fn a_name_the_url_has_is_dropped_however_it_is_spelled() {
        let t = "https://shop.example/p?ref=partner&utm+source=x&%2561=1";
        for query in [
            "%72ef=evil",
            "REF=evil",
            "%52eF=evil",
            "ref[]=evil",
            "ref%5B0%5D=evil",
            "[ref]=evil",
            "ref]=evil",
            "+ref=evil",
            "%20ref=evil",
            "ref%00x=evil",
            "utm%20source=evil",
            "utm.source=evil",
            "utm_source=evil",
            "utm[source=evil",
            "utm%5Bsource=evil",
            "+utm.source[=evil",
            "utm%2bsource",
        ] {
            let kept = if query == "utm%2bsource" {
                "&utm%2bsource"
            } else {
                ""
            };
            assert_eq!(location(t, Some(query)), format!("{t}{kept}"), "{query}");
        }
        // Rack 2 splits on `;` too: a piece of a parameter naming the URL's is not forwarded,
        // and a URL's own parameters split so are all its names.
        for query in ["x=1;ref=evil", ";ref=evil", "x;REF=evil;y=2"] {
            assert_eq!(location(t, Some(query)), t, "{query}");
        }
        assert_eq!(location(t, Some("x=1;y=2")), format!("{t}&x=1;y=2"));
        let semi = "https://e.com/?a=1;ref=partner";
        assert_eq!(location(semi, Some("ref=evil&b=2")), format!("{semi}&b=2"));
        // PHP reads a `[` that no `]` follows as `_`: a URL's `ref_` is overridden by `ref[`,
        // and a URL's `utm[source` (`utm_source` to PHP, `utm` to Rack) by either.
        let php = "https://e.com/?ref_=partner&utm[source=x";
        let query = "ref[=evil&utm_source=evil&utm=evil&utm[x]=evil&ref=1&ref[]]=2";
        assert_eq!(location(php, Some(query)), format!("{php}&ref=1&ref[]]=2"));
        // Whatever nests under the root of a name the URL has, or replaces it, is dropped.
        let nested = "https://e.com/?filter[brand]=acme&ref[]=partner";
        let query = "filter[color]=red&filter[brand]]=x&filter=x&ref=evil&f=1";
        assert_eq!(location(nested, Some(query)), format!("{nested}&f=1"));
        // Found whatever the order of the URL's names raw and decoded (`%5Aa` is `za`).
        let sorted = "https://e.com/?b=1&%5Aa=2&c=3";
        assert_eq!(location(sorted, Some("za=evil&ZA=x")), sorted);
        // An escape decodes once: `%2561` is `%61`, not `a`; a broken escape is itself.
        assert_eq!(location(t, Some("a=2&%2561=2")), format!("{t}&a=2"));
        assert_eq!(
            location("https://e.com/?%zz=1&%4", Some("%ZZ=2&%4=2&%5=2")),
            "https://e.com/?%zz=1&%4&%5=2"
        );
    }

    /// A query that would add more than `MAX_FORWARDED` bytes to `Location` (here raw UTF-8,
    /// which triples when encoded) is not forwarded: the URL alone, and the answer says so;
    /// however long the URL is itself.
    #[test]
    fn a_query_that_adds_too_much_to_the_location_is_not_forwarded() {
        let url = format!("https://e.com/{}?a=1", "é".repeat(1_000));
        let url = String::from_utf8(uri(url.as_bytes()).into_owned()).unwrap();
        // The Location and whether the query was dropped.
        let answer = |query: &str| match Answer::of(
            &stored(LinkOptions::default(), &url),
            Some(query),
            || 0,
        ) {
            Some(Answer::Redirect {
                location,
                query_dropped,
                ..
            }) => (location, query_dropped),
            other => panic!("not a redirect: {other:?}"),
        };
        let fits = format!("q={}", "x".repeat(MAX_FORWARDED - 3));
        let (location, query_dropped) = answer(&fits);
        assert_eq!(location.len(), url.len() + MAX_FORWARDED);
        assert!(!query_dropped);
        let long = format!("q={}", "é".repeat(MAX_FORWARDED / 4));
        assert_eq!(answer(&long), (HeaderValue::from_str(&url).unwrap(), true));
    }

    /// A URL's UTF-8 and spaces, and a request's, are percent-encoded, as a browser sends
    /// them: `Location` is a URI reference. Escapes already there are kept as they are.
    #[test]
    fn the_location_is_a_uri_utf_8_and_spaces_percent_encoded() {
        assert_eq!(
            location("https://e.com/a b/café?x=%41", Some("q=naïve")),
            "https://e.com/a%20b/caf%C3%A9?x=%41&q=na%C3%AFve"
        );
        assert_eq!(
            location("https://e.com/?café=1", Some("café=2&x=1")),
            "https://e.com/?caf%C3%A9=1&x=1",
            "a name the URL has, compared as encoded"
        );
    }

    /// An internationalised host name goes in its ASCII form, as a browser sends it (not
    /// percent-encoded: clients do not resolve that); user info and a port stay, and the rest
    /// of the URL is percent-encoded as before.
    #[test]
    fn an_internationalised_host_goes_in_its_ascii_form() {
        assert_eq!(
            location("https://bücher.de/café", None),
            "https://xn--bcher-kva.de/caf%C3%A9"
        );
        assert_eq!(
            location("https://u@Bücher.de:8443?q=ü", None),
            "https://u@xn--bcher-kva.de:8443?q=%C3%BC"
        );
        assert_eq!(
            location("https://e.com/bücher.de", None),
            "https://e.com/b%C3%BCcher.de"
        );
        // Full-width delimiters would map to ASCII ones, another host: refused, as browsers do.
        assert_eq!(
            location("https://bank.example＠evil.example/", None),
            "https://bank.example%EF%BC%A0evil.example/"
        );
    }

    #[test]
    fn a_link_that_opts_out_is_not_given_the_query() {
        let options = LinkOptions {
            forward_query: false,
            ..LinkOptions::default()
        };
        let answer = Answer::of(&stored(options, "https://e.com/p"), Some("a=1"), || 0);
        let Some(Answer::Redirect { location, .. }) = answer else {
            panic!()
        };
        assert_eq!(location, "https://e.com/p");
    }

    #[test]
    fn each_status_and_the_expiry() {
        for status in [301, 302, 307, 308] {
            let options = LinkOptions {
                status,
                expires_us: Some(1_000),
                ..LinkOptions::default()
            };
            let value = stored(options, "https://e.com/");
            let Some(Answer::Redirect { status: got, .. }) = Answer::of(&value, None, || 999)
            else {
                panic!("not expired yet");
            };
            assert_eq!(got.as_u16() as i16, status);
            assert_eq!(Answer::of(&value, None, || 1_000), Some(Answer::Expired));
        }
        let mut out = Vec::new();
        let bad = LinkOptions {
            status: 303,
            ..LinkOptions::default()
        };
        assert_eq!(
            encode(&bad, b"https://e.com/", &mut out),
            Err(BadStatus(303))
        );
        assert_eq!(Answer::of(&[], None, || 0), None);
        assert_eq!(Answer::of(&[EXPIRES, 1, 2], None, || 0), None);
    }
}
