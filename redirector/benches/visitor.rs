//! The cost of classifying a request (`http::visitor`), which every redirect pays: the bot
//! check alone (`isbot`, its list as one regex) per user agent, and the whole classification
//! of a browser's request with no optional dimension recorded and with all of them.
//!
//! `cargo bench -p redirector --bench visitor`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use protocol::dimensions::MAX_REFERRER_LEN;

// The module itself (crate-private in the redirector), compiled into the bench.
#[allow(dead_code)]
#[path = "../src/http/visitor.rs"]
mod visitor;
/// Where the module finds `Recorded` in the redirector's crate.
mod config {
    pub(crate) use redirector::config::Recorded;
}

use visitor::{Classifier, Recorded};

/// What people click with, as their browsers sent it (2025).
const BROWSERS: [&str; 8] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
    "Mozilla/5.0 (Linux; Android 14; SAMSUNG SM-S921B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/27.0 Chrome/125.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
];

/// Crawlers and tools.
const BOTS: [&str; 6] = [
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm) Chrome/116.0.1938.76 Safari/537.36",
    "curl/8.5.0",
    "python-requests/2.32.3",
    "Go-http-client/1.1",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/131.0.0.0 Safari/537.36",
];

/// The headers of a browser's click on a link (Chrome's, less the cookie).
fn browser_request(ua: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("host", "s.example.com"),
        ("connection", "keep-alive"),
        (
            "sec-ch-ua",
            "\"Chromium\";v=\"131\", \"Not_A Brand\";v=\"24\"",
        ),
        ("sec-ch-ua-mobile", "?0"),
        ("sec-ch-ua-platform", "\"Windows\""),
        ("upgrade-insecure-requests", "1"),
        ("user-agent", ua),
        (
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
        ),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-mode", "navigate"),
        ("sec-fetch-user", "?1"),
        ("sec-fetch-dest", "document"),
        ("referer", "https://news.ycombinator.com/item?id=42"),
        ("accept-encoding", "gzip, deflate, br, zstd"),
        ("accept-language", "en-US,en;q=0.9,de;q=0.8"),
        ("cf-ipcountry", "DE"),
    ] {
        headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    headers
}

/// The bot check alone: `isbot` per user agent, browsers and bots apart.
fn bot_check(c: &mut Criterion) {
    let bots = isbot::Bots::default();
    for (name, uas) in [("browser", &BROWSERS[..]), ("bot", &BOTS[..])] {
        c.bench_function(&format!("isbot::is_bot, {name} user agents"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % uas.len();
                bots.is_bot(black_box(uas[i]))
            })
        });
    }
}

/// The whole classification of a browser's click: the browsers' user agents in turn (each
/// thread's verdict cache holds them after the first round), and user agents that are each
/// new to the cache (the cost of a miss, and of a client that sends a new one every time).
fn classify(c: &mut Criterion) {
    let all = Recorded {
        referrer: true,
        device: true,
        country: true,
    };
    let seen: Vec<HeaderMap> = BROWSERS.iter().map(|ua| browser_request(ua)).collect();
    let new: Vec<HeaderMap> = (0..DISTINCT)
        .map(|n| browser_request(&format!("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.{n}.0 Safari/537.36")))
        .collect();
    for (name, recorded) in [
        ("no dimension", Recorded::default()),
        ("all dimensions", all),
    ] {
        let classifier = Classifier::new(recorded, Some(HeaderName::from_static("cf-ipcountry")));
        for (uas, requests) in [("seen before", &seen), ("each new", &new)] {
            c.bench_function(
                &format!("classify a browser's click, {name}, user agents {uas}"),
                |b| {
                    let mut i = 0;
                    let mut buf = [0; MAX_REFERRER_LEN];
                    b.iter(|| {
                        i = (i + 1) % requests.len();
                        black_box(classifier.classify(black_box(&requests[i]), &mut buf))
                            .country_rejected
                    })
                },
            );
        }
    }
}

/// Distinct user agents of the misses: four times the cache's slots, so that each one's slot
/// has been taken by others before it comes round again.
const DISTINCT: usize = 2048;

criterion_group!(benches, bot_check, classify);
criterion_main!(benches);
