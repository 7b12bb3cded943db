use super::*;
use crate::dimensions::{Agent, Country, Device, Dimensions};
use proptest::prelude::*;

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The dimensions of a version-1 click, as it decodes.
const V1_DIMENSIONS: Dimensions<'static> = Dimensions {
    agent: Agent::Unknown,
    referrer: None,
    device: None,
    country: None,
};

/// A version-1 datagram.
fn batch(sender: u64, seq: u64, base_us: i64, clicks: &[(&'static str, u32)]) -> Datagram<'static> {
    Datagram {
        version: 1,
        sender,
        seq,
        base_us,
        clicks: clicks
            .iter()
            .map(|&(code, offset_us)| Click {
                code,
                offset_us,
                dimensions: V1_DIMENSIONS,
            })
            .collect(),
    }
}

const CODE_64: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";

/// (batch, its exact encoding). The first is DESIGN.md's golden vector.
fn vectors() -> Vec<(Datagram<'static>, String)> {
    vec![
        (
            batch(12345, 7, -5, &[("seed1", 0), ("x", 300)]),
            "01b960070902057365656431000178ac02".into(),
        ),
        (batch(0, 0, 0, &[]), "0100000000".into()),
        (
            batch(u64::MAX, u64::MAX, i64::MIN, &[(CODE_64, u32::MAX)]),
            format!(
                "01{max}{max}{min}0140{code}ffffffff0f",
                max = "ffffffffffffffffff01",
                min = "ffffffffffffffffff01",
                code = hex(CODE_64.as_bytes()),
            ),
        ),
    ]
}

#[test]
fn golden_vectors_encode_byte_for_byte() {
    for (batch, expected) in vectors() {
        assert_eq!(hex(&batch.encode()), expected);
    }
}

#[test]
fn golden_vectors_decode_back() {
    for (expected, hexed) in vectors() {
        let bytes = unhex(&hexed);
        // The third is bytes only: its time is outside what `decode` accepts.
        if expected.base_us != i64::MIN {
            assert_eq!(decode(&bytes).unwrap(), expected);
        }
    }
}

#[test]
fn encoder_writes_the_golden_vector() {
    // The encoder picks its own base, so compare what it means, then its bytes via serde.
    let mut enc = Encoder::new(12345, DEFAULT_DATAGRAM).unwrap();
    enc.next();
    assert_eq!(enc.seq(), 1);
    enc.push("seed1", 1_000).unwrap();
    enc.push("x", 1_300).unwrap();
    let bytes = enc.datagram().to_vec();
    let batch = decode(&bytes).unwrap();
    assert_eq!((batch.sender, batch.seq), (12345, 1));
    let clicks: Vec<_> = batch.clicks_at().collect();
    assert_eq!(clicks, [("seed1", 1_000), ("x", 1_300)]);
    assert_eq!(batch.encode(), bytes);
}

#[test]
fn decode_names_each_rejection() {
    let good = batch(1, 2, 3, &[("ok", 1)]).encode();
    let reason = |bytes: &[u8]| decode(bytes).unwrap_err().reason();

    assert_eq!(reason(&[]), RejectReason::Undecodable);
    assert_eq!(reason(&good[..good.len() - 1]), RejectReason::Undecodable);
    assert_eq!(reason(&[3, 0, 0, 0, 0]), RejectReason::WrongVersion);
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(decode(&trailing), Err(Reject::TrailingBytes(1)));
    for code in ["", "has space", "é", &"a".repeat(65)] {
        let bad = batch(1, 2, 3, &[("ok", 1), (leak(code), 1)]).encode();
        assert!(
            matches!(decode(&bad), Err(Reject::BadCode { index: 1, .. })),
            "{code:?}"
        );
    }
    let late = batch(1, 2, END_CLICKED_AT_US, &[("ok", 0)]).encode();
    assert_eq!(reason(&late), RejectReason::BadTimestamp);
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

#[test]
fn validate_code_says_what_is_wrong() {
    assert_eq!(validate_code(b""), Err(CodeError::Empty));
    assert_eq!(validate_code(&[b'a'; 65]), Err(CodeError::TooLong(65)));
    assert_eq!(
        validate_code(b"ab/c"),
        Err(CodeError::BadByte { at: 2, byte: b'/' })
    );
    assert_eq!(validate_code(CODE_64.as_bytes()), Ok(()));
}

#[test]
fn a_code_may_hold_letters_digits_underscore_and_hyphen_and_no_other_byte() {
    for byte in 0..=u8::MAX {
        let allowed =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-".contains(&byte);
        let got = validate_code(&[b'a', byte]);
        let want = if allowed {
            Ok(())
        } else {
            Err(CodeError::BadByte { at: 1, byte })
        };
        assert_eq!(got, want, "byte {byte:#04x}");
    }
}

/// A code is read as bytes and turned into a str without a second UTF-8 check: bytes that
/// are not UTF-8 must be refused as a bad code, in both versions.
#[test]
fn a_code_that_is_not_utf8_is_a_bad_code() {
    for version in [1, 2] {
        let mut enc = Encoder::of_version(version, 1, DEFAULT_DATAGRAM).unwrap();
        enc.push("zzq", 1_000).unwrap();
        let mut bytes = enc.datagram().to_vec();
        let at = bytes.windows(3).position(|w| w == b"zzq").unwrap();
        bytes[at + 1] = 0xc3;
        let want = Reject::BadCode {
            index: 0,
            error: CodeError::BadByte { at: 1, byte: 0xc3 },
        };
        assert_eq!(decode(&bytes), Err(want), "version {version}");
    }
}

/// The first bad click names the reject, whichever check it fails.
#[test]
fn the_first_bad_click_names_the_reject() {
    for version in [1, 2] {
        let late = Click::new("ok", 10);
        let bad = Click::new("no!", 0);
        let datagram = |clicks: Vec<Click<'static>>| Datagram {
            version,
            sender: 1,
            seq: 0,
            base_us: END_CLICKED_AT_US - 1,
            clicks,
        };
        let got = decode(&datagram(vec![late, bad]).encode()).map(|_| ());
        let at_us = i128::from(END_CLICKED_AT_US) + 9;
        assert_eq!(
            got,
            Err(Reject::BadTimestamp { index: 0, at_us }),
            "v{version}"
        );
        let got = decode(&datagram(vec![bad, late]).encode()).map(|_| ());
        let error = CodeError::BadByte { at: 2, byte: b'!' };
        assert_eq!(got, Err(Reject::BadCode { index: 0, error }), "v{version}");
    }
}

#[test]
fn an_encoder_restarted_as_another_sender_numbers_from_zero_and_keeps_its_clicks() {
    let mut enc = Encoder::new(1, DEFAULT_DATAGRAM).unwrap();
    enc.next();
    enc.push("kept", 1_000).unwrap();
    enc.restart_as(9);
    assert_eq!(enc.sender(), 9);
    let batch = decode(enc.datagram()).unwrap();
    assert_eq!((batch.sender, batch.seq), (9, 0));
    assert_eq!(batch.clicks_at().collect::<Vec<_>>(), [("kept", 1_000)]);
}

#[test]
fn encoder_refuses_limits_out_of_range() {
    assert_eq!(
        Encoder::new(1, MIN_DATAGRAM - 1).unwrap_err(),
        BadLimit(MIN_DATAGRAM - 1)
    );
    assert!(Encoder::new(1, MAX_DATAGRAM + 1).is_err());
    assert!(Encoder::new(1, MIN_DATAGRAM).is_ok());
}

#[test]
fn encoder_starts_a_new_datagram_before_the_offset_overflows() {
    let mut enc = Encoder::new(1, MAX_DATAGRAM).unwrap();
    enc.push("a", 0).unwrap();
    assert_eq!(enc.push("b", i64::from(u32::MAX)), Err(EncodeError::Full));
    assert_eq!(enc.push("c", -2_000_000), Err(EncodeError::Full));
    // Slightly out of order (concurrent request threads) still fits.
    enc.push("d", -999_000).unwrap();
    assert_eq!(enc.len(), 2);
}

#[test]
fn encoder_rejects_what_the_decoder_would() {
    let mut enc = Encoder::new(1, MAX_DATAGRAM).unwrap();
    assert!(matches!(enc.push("a b", 0), Err(EncodeError::BadCode(_))));
    assert_eq!(
        enc.push("a", END_CLICKED_AT_US),
        Err(EncodeError::BadTimestamp(END_CLICKED_AT_US))
    );
    assert!(enc.is_empty());
}

fn code() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,64}"
}

fn referrer() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{0,64}"
}

/// A click's dimensions as `(agent, referrer, device, country)` draws.
type Drawn = (u8, Option<String>, Option<u8>, Option<usize>);

fn drawn() -> impl Strategy<Value = Drawn> {
    (
        0..4u8,
        prop::option::of(referrer()),
        prop::option::of(0..4u8),
        prop::option::of(0..250usize),
    )
}

fn dimensions(d: &Drawn) -> Dimensions<'_> {
    let countries = ["DE", "FR", "US", "JP", "BR"];
    Dimensions {
        agent: Agent::ALL[usize::from(d.0)],
        referrer: d.1.as_deref(),
        device: d.2.map(|i| Device::ALL[usize::from(i)]),
        country: d
            .3
            .and_then(|i| Country::parse(countries[i % countries.len()].as_bytes())),
    }
}

/// DESIGN.md's golden vector in version 2: the same clicks, the second with every dimension.
#[test]
fn version_two_golden_vector() {
    let clicks = vec![
        Click::new("seed1", 0),
        Click {
            code: "x",
            offset_us: 300,
            dimensions: Dimensions {
                agent: Agent::Preview,
                referrer: Some("t.co"),
                device: Some(Device::Mobile),
                country: Country::parse(b"DE"),
            },
        },
    ];
    let batch = Datagram {
        version: 2,
        sender: 12345,
        seq: 7,
        base_us: -5,
        clicks,
    };
    // seed1: offset 0, agent human, no referrer, device or country; x: offset 300, preview,
    // referrer t.co, mobile, DE.
    let hexed = "02b96007090205736565643100000000000178ac02020104742e636f0101014445";
    assert_eq!(hex(&batch.encode()), hexed);
    assert_eq!(decode(&unhex(hexed)).unwrap(), batch);
}

#[test]
fn version_two_rejects_a_dimension_no_sender_writes() {
    let good = Click {
        code: "ok",
        offset_us: 1,
        dimensions: Dimensions {
            agent: Agent::Bot,
            referrer: Some("example.com"),
            device: Some(Device::Tablet),
            country: Country::parse(b"NZ"),
        },
    };
    let datagram = |c: Click<'static>| Datagram {
        version: 2,
        sender: 1,
        seq: 2,
        base_us: 3,
        clicks: vec![good, c],
    };
    assert!(decode(&datagram(good).encode()).is_ok());
    // Patch the second click's bytes: its last ones are the country's.
    let mut bytes = datagram(good).encode();
    let n = bytes.len();
    bytes[n - 2..].copy_from_slice(b"XX");
    assert_eq!(decode(&bytes), Err(Reject::BadDimension { index: 1 }));
    bytes[n - 2..].copy_from_slice(b"nz");
    assert_eq!(decode(&bytes), Err(Reject::BadDimension { index: 1 }));
    for referrer in ["Example.com", "exa mple.com", &"a".repeat(65)] {
        let mut bad = good;
        bad.dimensions.referrer = Some(leak(referrer));
        let bytes = datagram(bad).encode();
        assert_eq!(
            decode(&bytes).unwrap_err().reason(),
            RejectReason::BadDimension
        );
        let mut enc = Encoder::new(1, DEFAULT_DATAGRAM).unwrap();
        assert_eq!(
            enc.push_with("ok", 5, &bad.dimensions),
            Err(EncodeError::BadReferrer)
        );
    }
    // The agent is the byte after the code and its offset.
    let mut bytes = datagram(good).encode();
    let agent = bytes.len() - (1 + 2 + 11 + 2 + 3);
    assert_eq!(bytes[agent], Agent::Bot as u8);
    bytes[agent] = 4;
    assert_eq!(decode(&bytes), Err(Reject::BadDimension { index: 1 }));
}

#[test]
fn a_version_one_encoder_leaves_the_dimensions_out() {
    let mut enc = Encoder::of_version(1, 12345, DEFAULT_DATAGRAM).unwrap();
    let full = Dimensions {
        agent: Agent::Bot,
        referrer: Some("t.co"),
        device: Some(Device::Desktop),
        country: Country::parse(b"DE"),
    };
    enc.push_with("seed1", 1_000, &full).unwrap();
    let batch = decode(enc.datagram()).unwrap();
    assert_eq!(batch.version, 1);
    assert_eq!(batch.clicks[0].dimensions, V1_DIMENSIONS);
}

proptest! {
    #[test]
    fn any_valid_batch_round_trips(
        version in 1..=2u8,
        sender: u64,
        seq: u64,
        base_us in MIN_CLICKED_AT_US..END_CLICKED_AT_US - i64::from(u32::MAX),
        clicks in prop::collection::vec((code(), any::<u32>(), drawn()), 0..50),
    ) {
        let batch = Datagram {
            version,
            sender,
            seq,
            base_us,
            clicks: clicks
                .iter()
                .map(|(c, o, d)| Click {
                    code: c,
                    offset_us: *o,
                    dimensions: if version == 1 { V1_DIMENSIONS } else { dimensions(d) },
                })
                .collect(),
        };
        let bytes = batch.encode();
        prop_assert_eq!(decode(&bytes).unwrap(), batch);
        let header = decode_header(&bytes).unwrap();
        prop_assert_eq!((header.sender, header.seq, header.clicks), (sender, seq, clicks.len() as u64));
    }

    #[test]
    fn encoder_never_passes_its_limit_and_loses_nothing(
        sender: u64,
        limit in MIN_DATAGRAM..4096usize,
        start_us in 0..END_CLICKED_AT_US / 2,
        clicks in prop::collection::vec((code(), 0..10_000_000i64, drawn()), 1..300),
    ) {
        let mut enc = Encoder::new(sender, limit).unwrap();
        let mut sent: Vec<(String, i64, String)> = Vec::new();
        let mut flush = |enc: &mut Encoder| -> Result<(), TestCaseError> {
            let bytes = enc.datagram().to_vec();
            prop_assert!(bytes.len() <= limit);
            prop_assert_eq!(bytes.len(), enc.encoded_len());
            let batch = decode(&bytes).unwrap();
            prop_assert_eq!(batch.seq, enc.seq());
            prop_assert_eq!(&batch.encode(), &bytes);
            let clicks = batch.clicks_at().zip(&batch.clicks);
            sent.extend(clicks.map(|((c, at), click)| {
                (c.to_owned(), at, format!("{:?}", click.dimensions))
            }));
            enc.next();
            Ok(())
        };
        let mut expected = Vec::new();
        let mut at = start_us;
        for (code, step, drawn) in &clicks {
            at += step;
            let d = dimensions(drawn);
            if enc.push_with(code, at, &d) == Err(EncodeError::Full) {
                flush(&mut enc)?;
                enc.push_with(code, at, &d).unwrap();
            }
            expected.push((code.clone(), at, format!("{d:?}")));
        }
        flush(&mut enc)?;
        prop_assert_eq!(sent, expected);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn a_version_prefix_with_arbitrary_tail_never_panics(
        version in 1..=2u8,
        tail in prop::collection::vec(any::<u8>(), 0..512)
    ) {
        let mut bytes = vec![version];
        bytes.extend(tail);
        let _ = decode(&bytes);
    }
}

/// (acknowledgement, its exact encoding).
fn ack_vectors() -> Vec<(Ack, &'static str)> {
    vec![
        (Ack::new(12345, Some(7), None), "81b960010700"),
        (Ack::new(12345, None, Some(0)), "81b960000100"),
        (
            Ack::new(u64::MAX, Some(u64::MAX), Some(u64::MAX)),
            "81ffffffffffffffffff0101ffffffffffffffffff0101ffffffffffffffffff01",
        ),
    ]
}

#[test]
fn ack_golden_vectors_encode_and_decode_byte_for_byte() {
    for (ack, expected) in ack_vectors() {
        let bytes = ack.encode();
        assert_eq!(hex(&bytes), expected);
        assert!(bytes.len() <= MAX_ACK);
        assert_eq!(decode_ack(&bytes), Ok(ack));
    }
    assert_eq!(MAX_ACK, ack_vectors()[2].1.len() / 2);
}

#[test]
fn each_side_rejects_the_others_message_as_a_wrong_version() {
    let datagram = batch(1, 2, 3, &[("ok", 1)]).encode();
    let ack = Ack::new(1, Some(2), None).encode();
    let wrong = |got, want| Reject::WrongVersion { got, want };
    assert_eq!(decode_ack(&datagram), Err(wrong(1, ACK_VERSION)));
    assert_eq!(decode(&ack), Err(wrong(ACK_VERSION, VERSION)));
    let reason = |bytes: &[u8]| decode_ack(bytes).unwrap_err().reason();
    assert_eq!(reason(&[]), RejectReason::Undecodable);
    assert_eq!(reason(&ack[..ack.len() - 1]), RejectReason::Undecodable);
    let mut trailing = ack.clone();
    trailing.push(0);
    assert_eq!(reason(&trailing), RejectReason::TrailingBytes);
}

proptest! {
    #[test]
    fn any_ack_round_trips(sender: u64, committed: Option<u64>, resend_from: Option<u64>) {
        let ack = Ack::new(sender, committed, resend_from);
        prop_assert_eq!(decode_ack(&ack.encode()), Ok(ack));
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_ack_decoder(
        tail in prop::collection::vec(any::<u8>(), 0..64)
    ) {
        let _ = decode_ack(&tail);
        let mut bytes = vec![ACK_VERSION];
        bytes.extend(tail);
        let _ = decode_ack(&bytes);
    }
}

#[test]
fn resync_golden_vector_encodes_and_decodes_byte_for_byte() {
    let wrong = |got, want| Reject::WrongVersion { got, want };
    let resync = Resync::new(12345, 7, 300);
    let bytes = resync.encode();
    assert_eq!(hex(&bytes), "41b96007ac02");
    assert_eq!(decode_resync(&bytes), Ok(resync));
    let largest = Resync::new(u64::MAX, u64::MAX, u64::MAX).encode();
    assert_eq!(largest.len(), MAX_RESYNC);
    assert_eq!(
        decode_resync(&Ack::new(1, None, None).encode()),
        Err(wrong(ACK_VERSION, RESYNC_VERSION))
    );
    assert_eq!(decode(&bytes), Err(wrong(RESYNC_VERSION, VERSION)));
    assert_eq!(
        decode_resync(&bytes[..bytes.len() - 1])
            .unwrap_err()
            .reason(),
        RejectReason::Undecodable
    );
}

proptest! {
    #[test]
    fn any_resync_round_trips(sender: u64, first: u64, clicks_before: u64) {
        let resync = Resync::new(sender, first, clicks_before);
        prop_assert_eq!(decode_resync(&resync.encode()), Ok(resync));
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_resync_decoder(tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = vec![RESYNC_VERSION];
        bytes.extend(&tail);
        let _ = decode_resync(&bytes);
    }
}

/// A header is read without its clicks, but not believed when it counts more clicks than the
/// bytes after it could hold (`MIN_CLICK_LEN` each): a collector judges a rejected datagram
/// by it, and would otherwise count what a forger claims.
#[test]
fn a_header_counting_more_clicks_than_its_bytes_hold_is_undecodable() {
    let mut enc = Encoder::new(5, DEFAULT_DATAGRAM).unwrap();
    enc.push("abc", 1_000_000).unwrap();
    let header = decode_header(enc.datagram()).unwrap();
    assert_eq!((header.sender, header.seq, header.clicks), (5, 0, 1));
    let tail = [0u8; 2 * MIN_CLICK_LEN];
    let counted = |clicks: u64| {
        let mut bytes = postcard::to_allocvec(&(VERSION, 5u64, 0u64, 0i64, clicks)).unwrap();
        bytes.extend(tail);
        decode_header(&bytes).map(|h| h.clicks)
    };
    assert_eq!(counted(2), Ok(2));
    assert!(matches!(counted(3), Err(Reject::Undecodable(_))));
}
