use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn changes(puts: &[(&str, &str)], removes: &[&str]) -> Changes {
    let mut c = Changes::default();
    for (code, url) in puts {
        c.puts.push(code.as_bytes(), url.as_bytes());
    }
    c.removes = removes.iter().map(|r| r.as_bytes().into()).collect();
    c
}

/// Puts and removes for one shard.
type ShardOps<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>);

/// Applies `changes` to a table, each to its own shard, as the loader does.
fn apply(table: &Table, puts: &[(&str, &str)], removes: &[&str]) {
    let mut per_shard: HashMap<usize, ShardOps> = HashMap::new();
    for &(code, url) in puts {
        let shard = shard_of(table.hasher().hash(code.as_bytes()));
        per_shard.entry(shard).or_default().0.push((code, url));
    }
    for &code in removes {
        let shard = shard_of(table.hasher().hash(code.as_bytes()));
        per_shard.entry(shard).or_default().1.push(code);
    }
    for (shard, (p, r)) in per_shard {
        table.apply(shard, changes(&p, &r));
    }
}

fn url(table: &Table, code: &str) -> Option<String> {
    table
        .get(code.as_bytes())
        .map(|u| String::from_utf8(u.to_vec()).unwrap())
}

#[test]
fn inserts_replaces_and_removes() {
    let table = Table::default();
    apply(&table, &[("a", "https://x/a"), ("b", "https://x/b")], &[]);
    assert_eq!(url(&table, "a").as_deref(), Some("https://x/a"));
    assert_eq!(url(&table, "c"), None);
    apply(&table, &[("a", "https://x/a2")], &["b"]);
    assert_eq!(url(&table, "a").as_deref(), Some("https://x/a2"));
    assert_eq!(url(&table, "b"), None);
    assert_eq!(table.len(), 1);
    // Removing what is not there changes nothing.
    apply(&table, &[], &["nope"]);
    assert_eq!(table.len(), 1);
}

#[test]
fn a_change_rebuilds_only_its_own_shard() {
    let table = Table::default();
    let codes: Vec<String> = (0..20_000).map(|n| format!("c{n}")).collect();
    let puts: Vec<(&str, &str)> = codes.iter().map(|c| (c.as_str(), "https://x/")).collect();
    apply(&table, &puts, &[]);
    let before: Vec<Arc<Shard>> = (0..SHARDS).map(|i| table.shard(i)).collect();
    apply(&table, &[("c7", "https://x/moved")], &[]);
    let touched = shard_of(table.hasher().hash(b"c7"));
    for (i, old) in before.iter().enumerate() {
        assert_eq!(Arc::ptr_eq(old, &table.shard(i)), i != touched, "shard {i}");
    }
    // A reader that loaded the old shard still reads it, whole.
    let old = &before[touched];
    let hash = table.hasher().hash(b"c7");
    assert_eq!(&old.get(hash, b"c7").unwrap()[..], b"https://x/");
    assert_eq!(url(&table, "c7").as_deref(), Some("https://x/moved"));
    assert_eq!(table.len(), 20_000);
}

#[test]
fn urls_of_any_length_round_trip() {
    let table = Table::default();
    let long = format!("https://x/{}", "y".repeat(MAX_URL - "https://x/".len()));
    let mid = format!("https://x/{}", "z".repeat(200));
    apply(
        &table,
        &[("long", &long), ("mid", &mid), ("short", "http://x")],
        &[],
    );
    assert_eq!(url(&table, "long"), Some(long));
    assert_eq!(url(&table, "mid"), Some(mid));
    assert_eq!(url(&table, "short").as_deref(), Some("http://x"));
}

#[test]
fn unusable_rows_are_told_apart() {
    assert_eq!(usable(b"ok", b"https://x/"), Ok(()));
    assert!(matches!(
        usable(b"bad code", b"https://x/"),
        Err(Unusable::Code(_))
    ));
    assert!(matches!(usable(b"", b"https://x/"), Err(Unusable::Code(_))));
    assert_eq!(usable(b"ok", b"https://x/\nb"), Err(Unusable::Url));
    assert_eq!(usable(b"ok", b"https://x/\x7f"), Err(Unusable::Url));
    assert_eq!(usable(b"ok", "https://x/\u{e9}".as_bytes()), Ok(()));
    assert_eq!(usable(b"ok", b"https://x/\xe9"), Err(Unusable::UrlNotUtf8));
    assert_eq!(usable(b"ok", b"https://x/\tb"), Err(Unusable::Url));
    let longest = vec![b'a'; 2048];
    assert_eq!(usable(b"ok", &longest), Ok(()));
    let huge = vec![b'a'; MAX_URL + 1];
    assert_eq!(usable(b"ok", &huge), Err(Unusable::UrlTooLong));
    // What passes is what a Location header takes, less tab (the CHECK refuses it) and
    // bytes that are not UTF-8 (a lone byte >= 0x80 is not).
    for b in 0..=255u8 {
        let u = [b'h', b];
        assert_eq!(
            usable(b"ok", &u).is_ok(),
            hyper::header::HeaderValue::from_bytes(&u).is_ok() && b != b'\t' && b < 0x80,
            "byte {b:#x}"
        );
    }
}

#[test]
fn slots_name_each_entry_once() {
    let mut b = Builder::default();
    for n in 0..100 {
        b.push(format!("k{n}").as_bytes(), b"https://x/");
    }
    let hasher = Hasher::default();
    let shard = b.build(&hasher);
    let h = hasher.hash(b"k5");
    let Probe::Same(slot) = shard.slot_of(h, b"k5", b"https://x/") else {
        panic!("k5 is there with that URL");
    };
    assert_eq!(shard.code_in_slot(slot), Some(&b"k5"[..]));
    assert!(matches!(shard.slot_of(h, b"k5", b"https://y/"), Probe::Different(i) if i == slot));
    assert_eq!(
        shard.slot_of(hasher.hash(b"zz"), b"zz", b"u"),
        Probe::Absent
    );
    let occupied = (0..shard.slots())
        .filter(|&i| shard.code_in_slot(i).is_some())
        .count();
    assert_eq!(occupied, 100);
}

proptest! {
    /// Any sequence of puts and removes leaves the table equal to a plain map given the same.
    #[test]
    fn matches_a_map(ops in prop::collection::vec((0..50u8, prop::option::of(0..1000u32)), 1..300)) {
        let table = Table::default();
        let mut model = HashMap::new();
        for batch in ops.chunks(7) {
            let mut last: HashMap<String, Option<String>> = HashMap::new();
            for (code, url) in batch {
                last.insert(format!("c{code}"), url.map(|u| format!("https://x/{u}")));
            }
            let puts: Vec<(&str, &str)> = last.iter()
                .filter_map(|(c, u)| Some((c.as_str(), u.as_deref()?))).collect();
            let removes: Vec<&str> = last.iter()
                .filter(|(_, u)| u.is_none()).map(|(c, _)| c.as_str()).collect();
            apply(&table, &puts, &removes);
            for (c, u) in last {
                match u { Some(u) => model.insert(c, u), None => model.remove(&c) };
            }
        }
        prop_assert_eq!(table.len(), model.len());
        for code in 0..50u8 {
            let code = format!("c{code}");
            prop_assert_eq!(url(&table, &code), model.get(&code).cloned());
        }
    }
}
