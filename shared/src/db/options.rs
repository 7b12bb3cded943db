//! The TLS settings of a connection string, taken out before tokio-postgres parses the rest.
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` only, and refuses `verify-ca`,
//! `verify-full` and `sslrootcert`. These pure functions read `sslmode` and `sslrootcert` from
//! either form libpq accepts (`key=value ...` or a `postgres://` URL) and hand back the string
//! without them, so both services accept what libpq accepts.

use std::fmt;

/// libpq's `sslmode`, minus `allow` (plain first, then TLS), which nobody should want.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// libpq's default: TLS when the server offers it, plain otherwise.
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, OptionsError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(OptionsError::BadSslMode(other.to_owned())),
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// What a connection string says about TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file of the certificates to trust.
    pub root_cert: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    #[error("sslmode={0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    BadSslMode(String),
    #[error(
        "sslmode={0} needs sslrootcert=FILE (the CA certificates to check the server's against)"
    )]
    MissingRootCert(SslMode),
    #[error("the connection string has an unterminated quoted value")]
    UnterminatedQuote,
    #[error("the connection string has {0:?} where key=value was expected")]
    NotKeyValue(String),
    #[error("the URL has a bad percent-encoding in {0:?}")]
    BadPercent(String),
}

/// Splits `url` into the TLS options and the connection string for tokio-postgres (the same,
/// without `sslmode` and `sslrootcert`).
pub fn split(url: &str) -> Result<(TlsOptions, String), OptionsError> {
    let (mode, root_cert, rest) =
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            split_url(url)?
        } else {
            split_key_value(url)?
        };
    let mode = match mode {
        Some(m) => SslMode::parse(&m)?,
        None => SslMode::Prefer,
    };
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
        // libpq would look for ~/.postgresql/root.crt; a service's home is not where its
        // configuration lives, so the file must be named.
        return Err(OptionsError::MissingRootCert(mode));
    }
    Ok((TlsOptions { mode, root_cert }, rest))
}

type Split = (Option<String>, Option<String>, String);

/// `key=value key='quoted \' value' ...`, libpq's rules: spaces around `=` allowed, single
/// quotes, backslash escapes inside values.
fn split_key_value(s: &str) -> Result<Split, OptionsError> {
    let (mut mode, mut root, mut rest) = (None, None, Vec::new());
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(OptionsError::NotKeyValue(key));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(OptionsError::UnterminatedQuote),
                    Some('\'') => break,
                    Some('\\') => value.push(chars.next().ok_or(OptionsError::UnterminatedQuote)?),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().ok_or(OptionsError::UnterminatedQuote)?);
                } else {
                    value.push(c);
                }
            }
        }
        match key.as_str() {
            "sslmode" => mode = Some(value),
            "sslrootcert" => root = Some(value),
            _ => rest.push(format!("{key}={}", quoted(&value))),
        }
    }
    Ok((mode, root, rest.join(" ")))
}

/// `value` as a value of a key=value connection string, whatever it holds (a path with a
/// space, a quote).
pub fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `postgres://user@host/db?sslmode=...&sslrootcert=...&other=...`: the two are taken out of
/// the query; everything else is left byte for byte as it was.
fn split_url(url: &str) -> Result<Split, OptionsError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((None, None, url.to_owned()));
    };
    let (mut mode, mut root, mut rest) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        // Decoded as tokio-postgres and libpq decode it: `ssl%6Dode` is `sslmode`, and left
        // for them it would be overridden by the default mode, `prefer`.
        match percent_decode(key)?.as_str() {
            "sslmode" => mode = Some(percent_decode(value)?),
            "sslrootcert" => root = Some(percent_decode(value)?),
            _ => rest.push(pair),
        }
    }
    let rest = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((mode, root, rest))
}

fn percent_decode(s: &str) -> Result<String, OptionsError> {
    let bad = || OptionsError::BadPercent(s.to_owned());
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(mode: SslMode, root: Option<&str>) -> TlsOptions {
        TlsOptions {
            mode,
            root_cert: root.map(str::to_owned),
        }
    }

    #[test]
    fn default_is_prefer_and_the_rest_is_kept() {
        let (o, rest) = split("host=/run/pg user=clicks dbname=clicks").unwrap();
        assert_eq!(o, opts(SslMode::Prefer, None));
        assert_eq!(rest, "host='/run/pg' user='clicks' dbname='clicks'");
        let (o, rest) = split("postgres://u@db.example/clicks").unwrap();
        assert_eq!(o, opts(SslMode::Prefer, None));
        assert_eq!(rest, "postgres://u@db.example/clicks");
    }

    #[test]
    fn key_value_form() {
        let (o, rest) =
            split("host=db.example sslmode = verify-full  sslrootcert='/etc/my ca.pem' dbname=c")
                .unwrap();
        assert_eq!(o, opts(SslMode::VerifyFull, Some("/etc/my ca.pem")));
        assert_eq!(rest, "host='db.example' dbname='c'");
        let (o, rest) = split(r"password='it\'s' sslmode=require").unwrap();
        assert_eq!(o, opts(SslMode::Require, None));
        assert_eq!(rest, r"password='it\'s'");
        // What is left still parses, to the same values.
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"it's"[..]));
    }

    #[test]
    fn url_form() {
        let (o, rest) = split(
            "postgresql://u:p@h:5433/db?application_name=x&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(o, opts(SslMode::VerifyCa, Some("/etc/ca.pem")));
        assert_eq!(rest, "postgresql://u:p@h:5433/db?application_name=x");
        let (o, rest) = split("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!(o, opts(SslMode::Disable, None));
        assert_eq!(rest, "postgres://h/db");
        let (o, rest) = split("postgres://h/db?ssl%6Dode=require&ssl%72ootcert=ca.pem").unwrap();
        assert_eq!(o, opts(SslMode::Require, Some("ca.pem")), "keys decoded");
        assert_eq!(rest, "postgres://h/db");
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        assert_eq!(
            split("host=h sslmode=requir").unwrap_err(),
            OptionsError::BadSslMode("requir".into())
        );
        assert_eq!(
            split("postgres://h/db?sslmode=verify-full").unwrap_err(),
            OptionsError::MissingRootCert(SslMode::VerifyFull)
        );
        assert_eq!(
            split("host=h password='open").unwrap_err(),
            OptionsError::UnterminatedQuote
        );
        assert_eq!(
            split("host=h dbname").unwrap_err(),
            OptionsError::NotKeyValue("dbname".into())
        );
        assert_eq!(
            split("postgres://h/db?sslrootcert=%zz").unwrap_err(),
            OptionsError::BadPercent("%zz".into())
        );
        let text = split("sslmode=verify-ca").unwrap_err().to_string();
        assert!(text.contains("sslrootcert"), "{text}");
    }
}
