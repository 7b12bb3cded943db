//! Every message of the wire format, decoded from arbitrary bytes: never a panic, and what
//! decodes encodes back to a message that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(datagram) = protocol::wire::decode(data) {
        let again = datagram.encode();
        assert_eq!(protocol::wire::decode(&again).as_ref(), Ok(&datagram));
        for (code, at_us) in datagram.clicks_at() {
            assert!(protocol::wire::validate_code(code.as_bytes()).is_ok());
            assert!((protocol::wire::MIN_CLICKED_AT_US..protocol::wire::END_CLICKED_AT_US).contains(&at_us));
        }
    }
    if let Ok(ack) = protocol::wire::decode_ack(data) {
        assert_eq!(protocol::wire::decode_ack(&ack.encode()), Ok(ack));
    }
});
