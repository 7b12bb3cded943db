use super::*;
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

fn batch(sender: u64, seq: u64, base_us: i64, clicks: &[(&'static str, u32)]) -> Datagram<'static> {
    Datagram {
        version: VERSION,
        sender,
        seq,
        base_us,
        clicks: clicks
            .iter()
            .map(|&(code, offset_us)| Click { code, offset_us })
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
        assert_eq!(hex(&postcard::to_allocvec(&batch).unwrap()), expected);
    }
}

#[test]
fn golden_vectors_decode_back() {
    for (expected, hexed) in vectors() {
        let bytes = unhex(&hexed);
        let got = postcard::from_bytes::<Datagram>(&bytes).unwrap();
        assert_eq!(got, expected);
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
    assert_eq!(postcard::to_allocvec(&batch).unwrap(), bytes);
}

#[test]
fn decode_names_each_rejection() {
    let good = postcard::to_allocvec(&batch(1, 2, 3, &[("ok", 1)])).unwrap();
    let reason = |bytes: &[u8]| decode(bytes).unwrap_err().reason();

    assert_eq!(reason(&[]), RejectReason::Undecodable);
    assert_eq!(reason(&good[..good.len() - 1]), RejectReason::Undecodable);
    assert_eq!(reason(&[2, 0, 0, 0, 0]), RejectReason::WrongVersion);
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(decode(&trailing), Err(Reject::TrailingBytes(1)));
    for code in ["", "has space", "é", &"a".repeat(65)] {
        let bad = postcard::to_allocvec(&batch(1, 2, 3, &[("ok", 1), (leak(code), 1)])).unwrap();
        assert!(
            matches!(decode(&bad), Err(Reject::BadCode { index: 1, .. })),
            "{code:?}"
        );
    }
    let late = postcard::to_allocvec(&batch(1, 2, END_CLICKED_AT_US, &[("ok", 0)])).unwrap();
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

proptest! {
    #[test]
    fn any_valid_batch_round_trips(
        sender: u64,
        seq: u64,
        base_us in MIN_CLICKED_AT_US..END_CLICKED_AT_US - i64::from(u32::MAX),
        clicks in prop::collection::vec((code(), any::<u32>()), 0..50),
    ) {
        let batch = Datagram {
            version: VERSION,
            sender,
            seq,
            base_us,
            clicks: clicks.iter().map(|(c, o)| Click { code: c, offset_us: *o }).collect(),
        };
        let bytes = postcard::to_allocvec(&batch).unwrap();
        prop_assert_eq!(decode(&bytes).unwrap(), batch);
    }

    #[test]
    fn encoder_never_passes_its_limit_and_loses_nothing(
        sender: u64,
        limit in MIN_DATAGRAM..4096usize,
        start_us in 0..END_CLICKED_AT_US / 2,
        clicks in prop::collection::vec((code(), 0..10_000_000i64), 1..300),
    ) {
        let mut enc = Encoder::new(sender, limit).unwrap();
        let mut sent: Vec<(String, i64)> = Vec::new();
        let mut flush = |enc: &mut Encoder| -> Result<(), TestCaseError> {
            let bytes = enc.datagram().to_vec();
            prop_assert!(bytes.len() <= limit);
            prop_assert_eq!(bytes.len(), enc.encoded_len());
            let batch = decode(&bytes).unwrap();
            prop_assert_eq!(batch.seq, enc.seq());
            prop_assert_eq!(&postcard::to_allocvec(&batch).unwrap(), &bytes);
            sent.extend(batch.clicks_at().map(|(c, at)| (c.to_owned(), at)));
            enc.next();
            Ok(())
        };
        let mut expected = Vec::new();
        let mut at = start_us;
        for (code, step) in &clicks {
            at += step;
            if enc.push(code, at) == Err(EncodeError::Full) {
                flush(&mut enc)?;
                enc.push(code, at).unwrap();
            }
            expected.push((code.clone(), at));
        }
        flush(&mut enc)?;
        prop_assert_eq!(sent, expected);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn version_one_prefix_with_arbitrary_tail_never_panics(
        tail in prop::collection::vec(any::<u8>(), 0..512)
    ) {
        let mut bytes = vec![VERSION];
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
    let datagram = postcard::to_allocvec(&batch(1, 2, 3, &[("ok", 1)])).unwrap();
    let ack = Ack::new(1, Some(2), None).encode();
    let wrong = |got, want| Reject::WrongVersion { got, want };
    assert_eq!(decode_ack(&datagram), Err(wrong(VERSION, ACK_VERSION)));
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
