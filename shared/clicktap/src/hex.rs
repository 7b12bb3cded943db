//! Hex text in and out: `--raw HEX`, `decode --hex`, and the first bytes of a rejected datagram.

use std::fmt::Write;

/// How many leading bytes of a rejected datagram are shown.
pub const HEAD_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("not hex: {ch:?} at character {at}")]
    BadChar { ch: char, at: usize },
    #[error("not hex: odd number of hex digits ({0})")]
    OddLength(usize),
}

/// Parses hex digits, ignoring whitespace (so `xxd -p` output and pasted dumps work) and an
/// optional leading `0x`.
pub fn parse(text: &str) -> Result<Vec<u8>, HexError> {
    let trimmed = text.trim_start();
    let body = trimmed.strip_prefix("0x").unwrap_or(trimmed);
    let skipped = text.len() - body.len();
    let mut nibbles = Vec::with_capacity(body.len());
    for (i, ch) in body.char_indices() {
        if ch.is_whitespace() {
            continue;
        }
        let nibble = ch.to_digit(16).ok_or(HexError::BadChar {
            ch,
            at: skipped + i,
        })?;
        nibbles.push(nibble as u8);
    }
    if nibbles.len() % 2 != 0 {
        return Err(HexError::OddLength(nibbles.len()));
    }
    Ok(nibbles.chunks(2).map(|p| p[0] << 4 | p[1]).collect())
}

/// The first [`HEAD_BYTES`] bytes as hex, with how many more there are.
pub fn head(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * HEAD_BYTES + 16);
    for b in bytes.iter().take(HEAD_BYTES) {
        let _ = write!(out, "{b:02x}");
    }
    if bytes.len() > HEAD_BYTES {
        let _ = write!(out, "... (+{} bytes)", bytes.len() - HEAD_BYTES);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_whitespace_and_prefix() {
        assert_eq!(parse("0x01 b9\n60").unwrap(), vec![0x01, 0xb9, 0x60]);
        assert_eq!(parse("").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn names_what_is_not_hex() {
        assert_eq!(
            parse("01zz").unwrap_err(),
            HexError::BadChar { ch: 'z', at: 2 }
        );
        assert_eq!(parse("abc").unwrap_err(), HexError::OddLength(3));
    }

    #[test]
    fn head_shows_the_first_bytes_and_counts_the_rest() {
        assert_eq!(head(&[0xde, 0xad]), "dead");
        let long = head(&[0xab; 40]);
        assert!(long.starts_with(&"ab".repeat(32)));
        assert!(long.ends_with("(+8 bytes)"));
    }
}
