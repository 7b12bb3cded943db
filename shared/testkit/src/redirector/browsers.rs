//! Request headers as the people and programs that follow short links send them: a User-Agent
//! of a real browser (desktop, mobile, tablet), a crawler or a link previewer, a `Referer` or
//! none, and the country a fronting proxy or CDN adds ([`COUNTRY_HEADER`]). What the
//! redirector's `--dimensions` classify, for the load generator ([`super::load::Load::headers`]).
//!
//! The header lines are written out once, as blocks of whole lines in which each value of the
//! sets below appears in its weight's share exactly, paired across the sets by a shuffle with
//! a fixed seed: a request costs the generator one draw and one copy whatever the mix, and
//! every run (each mode, each round) draws from the same blocks.

use std::sync::Arc;

use crate::XorShift;

/// The header the country is sent in, as a CDN would set it (the redirector's
/// `--country-header`).
pub const COUNTRY_HEADER: &str = "X-Country";

/// What a User-Agent is, for the tests that check the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Desktop,
    Mobile,
    Tablet,
    /// A crawler or a tool.
    Bot,
    /// A chat or social app's link unfurler.
    Preview,
}

/// User-Agents with their weight in a thousand requests: browsers in about their share of
/// the web, a few percent crawlers and tools, and a few percent link previewers (a link
/// pasted into a chat is fetched by the app before anyone clicks it).
pub const AGENTS: &[(u32, Kind, &str)] = &[
    (250, Kind::Desktop, "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
    (80, Kind::Desktop, "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
    (50, Kind::Desktop, "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15"),
    (40, Kind::Desktop, "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0"),
    (40, Kind::Desktop, "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0"),
    (10, Kind::Desktop, "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"),
    (210, Kind::Mobile, "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1"),
    (190, Kind::Mobile, "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36"),
    (30, Kind::Mobile, "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/26.0 Chrome/122.0.0.0 Mobile Safari/537.36"),
    (30, Kind::Tablet, "Mozilla/5.0 (iPad; CPU OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1"),
    (10, Kind::Tablet, "Mozilla/5.0 (Linux; Android 13; SM-X710) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
    (12, Kind::Bot, "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"),
    (6, Kind::Bot, "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"),
    (6, Kind::Bot, "curl/8.5.0"),
    (6, Kind::Bot, "python-requests/2.31.0"),
    (8, Kind::Preview, "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)"),
    (6, Kind::Preview, "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)"),
    (5, Kind::Preview, "Twitterbot/1.0"),
    (4, Kind::Preview, "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)"),
    (4, Kind::Preview, "WhatsApp/2.23.20.0"),
    (3, Kind::Preview, "TelegramBot (like TwitterBot)"),
];

/// Referers with their weight in a thousand requests; `None` sends no `Referer` (typed or
/// pasted links, apps, and pages whose referrer policy strips it).
pub const REFERERS: &[(u32, Option<&str>)] = &[
    (400, None),
    (200, Some("https://www.google.com/")),
    (100, Some("https://t.co/")),
    (80, Some("https://www.facebook.com/")),
    (50, Some("https://news.ycombinator.com/")),
    (
        50,
        Some("https://www.reddit.com/r/rust/comments/1h3k2x9/a_post/"),
    ),
    (50, Some("https://www.linkedin.com/feed/")),
    (40, Some("https://mail.google.com/")),
    (30, Some("android-app://com.slack/")),
];

/// Countries (ISO 3166 alpha-2) with their weight in a thousand requests.
pub const COUNTRIES: &[(u32, &str)] = &[
    (300, "US"),
    (100, "DE"),
    (80, "GB"),
    (80, "IN"),
    (60, "FR"),
    (60, "BR"),
    (50, "JP"),
    (50, "CA"),
    (30, "AU"),
    (30, "NL"),
    (30, "ES"),
    (30, "IT"),
    (20, "PL"),
    (20, "SE"),
    (20, "MX"),
    (20, "KR"),
    (20, "ZA"),
];

/// Human requests in a thousand that are a browser's prefetch (`Sec-Purpose: prefetch`),
/// which the redirector counts as a preview.
const PREFETCH: u32 = 10;

/// Blocks written out: a multiple of the weights' thousand, so that each value's share is its
/// weight's; few enough to stay in the generator's cache.
const BLOCKS: usize = 4000;

/// The seed of the shuffles: the same blocks in every run.
const SEED: u64 = 0x5eed_b10c_4ead_e25f;

/// Header blocks, each a request's header lines (`Name: value\r\n` each), drawn per request.
#[derive(Debug)]
pub struct Headers {
    blocks: Vec<String>,
}

impl Headers {
    /// The blocks of [`AGENTS`], [`REFERERS`] and [`COUNTRIES`], each in its weights' shares,
    /// paired at random (so independent of each other).
    pub fn browsers() -> Arc<Headers> {
        let mut random = XorShift(SEED);
        let agents = spread(AGENTS, |a| a.0, &mut random);
        let referers = spread(REFERERS, |r| r.0, &mut random);
        let countries = spread(COUNTRIES, |c| c.0, &mut random);
        let prefetch = spread(
            &[(PREFETCH, true), (1000 - PREFETCH, false)],
            |p| p.0,
            &mut random,
        );
        let blocks = (0..BLOCKS)
            .map(|i| {
                let (_, kind, agent) = agents[i];
                let (_, referer) = referers[i];
                let (_, country) = countries[i];
                let mut block = format!("User-Agent: {agent}\r\n");
                let human = matches!(kind, Kind::Desktop | Kind::Mobile | Kind::Tablet);
                if human && prefetch[i].1 {
                    block.push_str("Sec-Purpose: prefetch\r\n");
                }
                if let Some(referer) = referer {
                    block.push_str(&format!("Referer: {referer}\r\n"));
                }
                block.push_str(&format!("{COUNTRY_HEADER}: {country}\r\n"));
                block
            })
            .collect();
        Arc::new(Headers { blocks })
    }

    /// One block, drawn with the connection's `random`.
    pub fn pick(&self, random: &mut XorShift) -> &str {
        &self.blocks[(random.next_u64() % self.blocks.len() as u64) as usize]
    }

    pub fn blocks(&self) -> &[String] {
        &self.blocks
    }
}

/// [`BLOCKS`] of `items`, each `weight` in a thousand of them, shuffled.
fn spread<'a, T>(items: &'a [T], weight: impl Fn(&T) -> u32, random: &mut XorShift) -> Vec<&'a T> {
    let mut all: Vec<&T> = items
        .iter()
        .flat_map(|item| std::iter::repeat(item).take(weight(item) as usize * BLOCKS / 1000))
        .collect();
    assert_eq!(all.len(), BLOCKS, "weights in a thousand");
    for i in (1..all.len()).rev() {
        all.swap(i, (random.next_u64() % (i as u64 + 1)) as usize);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(headers: &Headers, wanted: impl Fn(&str) -> bool) -> f64 {
        let n = headers.blocks().iter().filter(|b| wanted(b)).count();
        n as f64 / headers.blocks().len() as f64
    }

    fn agent_of(block: &str) -> Kind {
        let line = block.lines().next().expect("a User-Agent first");
        let ua = line.strip_prefix("User-Agent: ").expect("a User-Agent");
        AGENTS
            .iter()
            .find(|a| a.2 == ua)
            .map(|a| a.1)
            .expect("one of AGENTS")
    }

    #[test]
    fn the_weights_are_in_a_thousand() {
        assert_eq!(AGENTS.iter().map(|a| a.0).sum::<u32>(), 1000);
        assert_eq!(REFERERS.iter().map(|r| r.0).sum::<u32>(), 1000);
        assert_eq!(COUNTRIES.iter().map(|c| c.0).sum::<u32>(), 1000);
    }

    #[test]
    fn every_block_is_whole_header_lines() {
        let headers = Headers::browsers();
        for block in headers.blocks() {
            assert!(block.ends_with("\r\n"), "{block:?}");
            for line in block.split_terminator("\r\n") {
                let (name, value) = line.split_once(": ").expect("Name: value");
                assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                assert!(
                    value.bytes().all(|b| (b' '..=b'~').contains(&b)),
                    "{line:?}"
                );
            }
        }
    }

    #[test]
    fn the_blocks_follow_the_weights() {
        let headers = Headers::browsers();
        let kind = |k: Kind| share(&headers, |b| agent_of(b) == k);
        assert_eq!(kind(Kind::Bot), 0.030);
        assert_eq!(kind(Kind::Preview), 0.030);
        assert_eq!(kind(Kind::Mobile), 0.430);
        assert_eq!(share(&headers, |b| !b.contains("\r\nReferer: ")), 0.400);
        assert_eq!(share(&headers, |b| b.ends_with("X-Country: US\r\n")), 0.300);
        assert_eq!(share(&headers, |b| b.contains("X-Country: ")), 1.0);
        // Paired at random: about the humans' share of the prefetch flags.
        let prefetch = share(&headers, |b| b.contains("Sec-Purpose: prefetch"));
        assert!(prefetch > 0.005 && prefetch <= 0.010, "{prefetch}");
        // Independent: the countries' shares hold among the bots too.
        let bots = headers.blocks().iter().filter(|b| agent_of(b) == Kind::Bot);
        let us_bots = bots.filter(|b| b.ends_with("X-Country: US\r\n")).count();
        assert!((10..70).contains(&us_bots), "{us_bots} of 120 bots from US");
    }

    #[test]
    fn the_blocks_are_the_same_in_every_run() {
        assert_eq!(Headers::browsers().blocks(), Headers::browsers().blocks());
    }
}
