use super::*;
use hyper::header::HeaderValue;

const ALL: Recorded = Recorded {
    referrer: true,
    device: true,
    country: true,
};

fn classifier(recorded: Recorded) -> Classifier {
    Classifier::new(recorded, Some(HeaderName::from_static("cf-ipcountry")))
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for &(name, value) in pairs {
        let value = HeaderValue::from_str(value).unwrap();
        headers.append(HeaderName::from_static(name), value);
    }
    headers
}

/// Agent and device of a request with this user agent alone, classified twice: the second
/// answer comes from the verdict cache and must be the same.
fn by_ua(ua: &str) -> (Agent, Option<Device>) {
    let c = classifier(ALL);
    let (mut buf, mut buf_again) = ([0; MAX_REFERRER_LEN], [0; MAX_REFERRER_LEN]);
    let request = headers(&[("user-agent", ua)]);
    let first = c.classify(&request, &mut buf).dimensions;
    let again = c.classify(&request, &mut buf_again).dimensions;
    assert_eq!(first, again, "{ua}");
    (first.agent, first.device)
}

#[test]
fn browsers_are_humans_on_their_devices() {
    use Device::*;
    let browsers = [
        (Desktop, "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
        (Desktop, "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
        (Desktop, "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
        (Desktop, "Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
        (Desktop, "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0"),
        (Desktop, "Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"),
        (Desktop, "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15"),
        (Desktop, "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0"),
        (Mobile, "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1"),
        (Mobile, "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1"),
        (Mobile, "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36"),
        (Mobile, "Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0"),
        (Mobile, "Mozilla/5.0 (Linux; Android 14; SAMSUNG SM-S921B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/27.0 Chrome/125.0.0.0 Mobile Safari/537.36"),
        (Tablet, "Mozilla/5.0 (Linux; Android 13; SM-X200) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"),
        (Tablet, "Mozilla/5.0 (Linux; Android 13; SAMSUNG SM-X200) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/27.0 Chrome/125.0.0.0 Safari/537.36"),
        (Tablet, "Mozilla/5.0 (iPad; CPU OS 17_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1"),
        (Tablet, "Mozilla/5.0 (Android 14; Tablet; rv:133.0) Gecko/133.0 Firefox/133.0"),
        (Tablet, "Mozilla/5.0 (Linux; Android 9; KFTRWI) AppleWebKit/537.36 (KHTML, like Gecko) Silk/131.3.1 like Chrome/131.0.6778.69 Safari/537.36"),
        (Other, "Mozilla/5.0 (PlayStation; PlayStation 5/2.26) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/13.0 Safari/605.1.15"),
        // An app's HTTP stack: a phone's or a tablet's, it does not say.
        (Other, "Dalvik/2.1.0 (Linux; U; Android 8.0.0; SM-G930F Build/R16NW)"),
        // Not a Mozilla/ one, but it says Tablet.
        (Tablet, "Opera/9.80 (Android 3.2.1; Linux; Opera Tablet/ADR-1111101157; U; en) Presto/2.9.201 Version/11.50"),
    ];
    for (device, ua) in browsers {
        assert_eq!(by_ua(ua), (Agent::Human, Some(device)), "{ua}");
    }
}

#[test]
fn crawlers_and_tools_are_bots_on_no_device() {
    let bots = [
        "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
        "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.6778.69 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
        "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm) Chrome/116.0.1938.76 Safari/537.36",
        "curl/8.5.0",
        "python-requests/2.32.3",
        "Go-http-client/1.1",
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/131.0.0.0 Safari/537.36",
        "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
        "",
    ];
    for ua in bots {
        assert_eq!(by_ua(ua), (Agent::Bot, Some(Device::Other)), "{ua:?}");
    }
}

#[test]
fn a_request_without_a_user_agent_or_with_one_not_utf8_is_a_bot() {
    let c = classifier(ALL);
    let mut buf = [0; MAX_REFERRER_LEN];
    let none = c.classify(&HeaderMap::new(), &mut buf).dimensions;
    assert_eq!((none.agent, none.device), (Agent::Bot, Some(Device::Other)));
    let mut request = HeaderMap::new();
    let latin1 = HeaderValue::from_bytes(b"Mozilla/5.0 (Windows NT 10.0) caf\xe9").unwrap();
    request.insert(USER_AGENT, latin1);
    assert_eq!(c.classify(&request, &mut buf).dimensions.agent, Agent::Bot);
}

#[test]
fn unfurlers_are_previews_on_no_device() {
    let unfurlers = [
        "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
        "Slack-ImgProxy (+https://api.slack.com/robots)",
        "Twitterbot/1.0",
        "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_11_1) AppleWebKit/601.2.4 (KHTML, like Gecko) Version/9.0.1 Safari/601.2.4 facebookexternalhit/1.1 Facebot Twitterbot/1.0",
        "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
        "WhatsApp/2.23.20.0 A",
        "TelegramBot (like TwitterBot)",
        "LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://www.linkedin.com)",
        "Mozilla/5.0 (Windows NT 6.1; WOW64) SkypeUriPreview Preview/0.5 skype-url-preview@microsoft.com",
        "Mastodon/4.3.2 (http.rb/5.2.0; +https://mastodon.social/) Bot",
        "Mozilla/5.0 (compatible; Bluesky Cardyb/1.1; +mailto:support@bsky.app)",
        "Viber",
    ];
    for ua in unfurlers {
        assert_eq!(by_ua(ua), (Agent::Preview, Some(Device::Other)), "{ua}");
    }
}

#[test]
fn in_app_browsers_are_people() {
    let snapchat = "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Snapchat/13.16.0.42 (like Safari/8619.1.26.30.5, panda)";
    assert_eq!(by_ua(snapchat), (Agent::Human, Some(Device::Mobile)));
    let line = "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Safari Line/14.19.0";
    assert_eq!(by_ua(line), (Agent::Human, Some(Device::Mobile)));
}

#[test]
fn a_prefetch_or_a_preview_by_its_purpose_header_is_a_preview() {
    let chrome = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    let c = classifier(ALL);
    let mut buf = [0; MAX_REFERRER_LEN];
    for (name, value) in [
        ("sec-purpose", "prefetch"),
        ("sec-purpose", "prefetch;prerender"),
        ("purpose", "prefetch"),
        ("x-purpose", "preview"),
        ("x-moz", "Prefetch"),
    ] {
        let request = headers(&[("user-agent", chrome), (name, value)]);
        let dims = c.classify(&request, &mut buf).dimensions;
        assert_eq!(dims.agent, Agent::Preview, "{name}: {value}");
        assert_eq!(dims.device, Some(Device::Other), "{name}: {value}");
    }
    let other = headers(&[("user-agent", chrome), ("sec-purpose", "something-else")]);
    let dims = c.classify(&other, &mut buf).dimensions;
    assert_eq!(
        (dims.agent, dims.device),
        (Agent::Human, Some(Device::Desktop))
    );
}

#[test]
fn a_repeated_header_counts_by_its_first_value_a_purpose_by_any() {
    let chrome = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    let c = classifier(ALL);
    let mut buf = [0; MAX_REFERRER_LEN];
    let request = headers(&[
        ("user-agent", chrome),
        ("user-agent", "curl/8.5.0"),
        ("referer", "https://first.example/"),
        ("referer", "https://second.example/"),
        ("cf-ipcountry", "DE"),
        ("cf-ipcountry", "XX"),
    ]);
    let classified = c.classify(&request, &mut buf);
    assert_eq!(classified.dimensions.agent, Agent::Human);
    assert_eq!(classified.dimensions.referrer, Some("first.example"));
    assert_eq!(
        classified.dimensions.country.map(|c| c.bytes()),
        Some(*b"DE")
    );
    assert!(!classified.country_rejected);
    let prefetched = headers(&[
        ("user-agent", chrome),
        ("sec-purpose", "something-else"),
        ("sec-purpose", "prefetch"),
        ("sec-purpose", "something-else"),
    ]);
    let dims = c.classify(&prefetched, &mut buf).dimensions;
    assert_eq!(dims.agent, Agent::Preview);
}

#[test]
fn the_referrer_is_its_host_or_empty() {
    let c = classifier(ALL);
    let mut buf = [0; MAX_REFERRER_LEN];
    let mut referrer = |request: HeaderMap| {
        c.classify(&request, &mut buf)
            .dimensions
            .referrer
            .map(str::to_owned)
    };
    let from = |r: &'static str| headers(&[("referer", r)]);
    assert_eq!(
        referrer(from("https://News.Example.com/item?id=1")).as_deref(),
        Some("news.example.com")
    );
    assert_eq!(referrer(from("not a url")).as_deref(), Some(""));
    assert_eq!(referrer(HeaderMap::new()).as_deref(), Some(""));
}

#[test]
fn the_country_is_an_assigned_code_or_rejected() {
    let c = classifier(ALL);
    let mut buf = [0; MAX_REFERRER_LEN];
    let mut country = |request: HeaderMap| {
        let classified = c.classify(&request, &mut buf);
        (
            classified.dimensions.country.map(|c| c.bytes()),
            classified.country_rejected,
        )
    };
    assert_eq!(
        country(headers(&[("cf-ipcountry", "DE")])),
        (Some(*b"DE"), false)
    );
    assert_eq!(
        country(headers(&[("cf-ipcountry", "de")])),
        (Some(*b"DE"), false)
    );
    for bad in ["XX", "Germany", "d", "T1", ""] {
        assert_eq!(
            country(headers(&[("cf-ipcountry", bad)])),
            (None, true),
            "{bad:?}"
        );
    }
    assert_eq!(country(HeaderMap::new()), (None, false));
    // Another header of that value is not the country's.
    assert_eq!(country(headers(&[("x-country", "DE")])), (None, false));
    // A country header named as one the classification reads for itself is read for both.
    let chrome = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    for (name, agent) in [("user-agent", None), ("sec-purpose", Some(Agent::Preview))] {
        let misnamed = Classifier::new(ALL, Some(HeaderName::from_static(name)));
        let request = headers(&[(name, "prefetch"), ("user-agent", chrome)]);
        let classified = misnamed.classify(&request, &mut buf);
        assert!(classified.country_rejected, "{name}: not a country");
        if let Some(agent) = agent {
            assert_eq!(classified.dimensions.agent, agent, "{name}");
        }
    }
}

#[test]
fn dimensions_not_recorded_are_none() {
    let chrome = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    let request = headers(&[
        ("user-agent", chrome),
        ("referer", "https://example.com/"),
        ("cf-ipcountry", "XX"),
    ]);
    let mut buf = [0; MAX_REFERRER_LEN];
    let expected = Dimensions {
        agent: Agent::Human,
        ..Dimensions::default()
    };
    let classified = classifier(Recorded::default()).classify(&request, &mut buf);
    assert_eq!(classified.dimensions, expected);
    assert!(
        !classified.country_rejected,
        "a country not recorded is not checked"
    );
    // Recorded, but no header named for it.
    let unnamed = Classifier::new(ALL, None).classify(&request, &mut buf);
    assert_eq!(unnamed.dimensions.country, None);
    assert!(!unnamed.country_rejected);
}

#[test]
fn verdicts_encode_and_decode() {
    for agent in [Agent::Human, Agent::Bot, Agent::Preview] {
        for device in Device::ALL {
            let verdict = Verdict { agent, device };
            assert_eq!(Verdict::decode(verdict.encode()), Some(verdict));
        }
    }
    assert_eq!(Verdict::decode(0), None, "an empty slot");
}

#[test]
fn four_user_agents_of_one_set_are_all_kept_a_fifth_drops_the_oldest() {
    let c = classifier(ALL);
    let slot = |ua: &str| verdict_slot(c.hasher.hash_one(ua.as_bytes()));
    let (set, _) = slot("agent/0");
    let agents: Vec<String> = (0..)
        .map(|n| format!("agent/{n}"))
        .filter(|ua| slot(ua).0 == set)
        .take(5)
        .collect();
    let held = || VERDICTS.with(|sets| sets[set].0.iter().map(Cell::get).collect::<Vec<_>>());
    let kept = |ua: &str| held().iter().any(|h| h & !0xff == slot(ua).1);
    for ua in &agents[..4] {
        c.cached(ua.as_bytes());
    }
    for ua in &agents[..4] {
        assert!(kept(ua), "{ua} kept beside three others of its set");
    }
    let before = held();
    c.cached(agents[1].as_bytes());
    assert_eq!(held(), before, "a hit, which moves nothing");
    c.cached(agents[4].as_bytes());
    assert!(!kept(&agents[0]), "the oldest makes room");
    for ua in &agents[1..] {
        assert!(kept(ua), "{ua} kept");
    }
}
