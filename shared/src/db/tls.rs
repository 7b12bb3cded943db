//! TLS for tokio-postgres with rustls and the ring provider, as libpq's `sslmode` asks.
//!
//! Why our own ~150 lines rather than the `tokio-postgres-rustls` crate: its current release
//! (0.14) is edition 2024 (Rust 1.85, above this workspace's `rust-version`), brings x509-cert
//! and sha2 for channel binding we do not use, and leaves the verification modes to us anyway
//! (`verify-ca` and `require` need verifiers of our own: neither is a rustls default). What is
//! left is an adapter from `tokio_rustls` to tokio-postgres' `MakeTlsConnect`/`TlsConnect`.
//! ring rather than aws-lc-rs: no C/CMake build of aws-lc on every machine.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use super::options::{SslMode, TlsOptions};

/// Why the TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("sslrootcert {path}: {error}")]
    RootCert { path: String, error: String },
    #[error("sslrootcert {0}: no certificate in it")]
    NoRootCert(String),
    #[error("TLS set-up: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Builds the rustls client configuration for `options` (reads `sslrootcert` now, so a
/// missing or unreadable file is reported at start, not at the first connection).
pub fn client_config(options: &TlsOptions) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(ring::default_provider());
    let roots = match &options.root_cert {
        Some(path) => Some(Arc::new(load_roots(path)?)),
        None => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (options.mode, roots) {
        // libpq: with a root certificate given, `prefer` and `require` check the chain too.
        (SslMode::Disable | SslMode::Prefer | SslMode::Require, None) => {
            Arc::new(NoVerification(provider.signature_verification_algorithms))
        }
        (SslMode::VerifyFull, Some(roots)) => {
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?
        }
        (_, Some(roots)) => Arc::new(ChainOnly(
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?,
        )),
        // options::split refuses verify-ca/verify-full without sslrootcert.
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(TlsError::NoRootCert("(none given)".into()))
        }
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn load_roots(path: &str) -> Result<RootCertStore, TlsError> {
    let err = |error: String| TlsError::RootCert {
        path: path.to_owned(),
        error,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| err(e.to_string()))? {
        let cert = cert.map_err(|e| err(e.to_string()))?;
        roots.add(cert).map_err(|e| err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoRootCert(path.to_owned()));
    }
    Ok(roots)
}

/// `sslmode=require` without a root certificate: encrypt, trust any certificate (libpq does
/// the same; it protects against eavesdropping, not against an active attacker). The
/// handshake's signatures are still checked, so the session key belongs to the certificate's
/// key.
#[derive(Debug)]
struct NoVerification(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a root we trust; the name in it is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain before the name, so a name error means the chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// tokio-postgres' `MakeTlsConnect`: one per connection string, cloned per connection.
#[derive(Clone)]
pub struct MakeTls {
    config: Arc<ClientConfig>,
    mode: SslMode,
}

impl MakeTls {
    pub fn new(config: Arc<ClientConfig>, mode: SslMode) -> MakeTls {
        MakeTls { config, mode }
    }
}

impl<S> MakeTlsConnect<S> for MakeTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = Tls;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<Tls, io::Error> {
        // The host is turned into a server name only if TLS is negotiated: over a Unix
        // socket tokio-postgres passes "", which is no name, and no TLS happens there.
        Ok(Tls {
            config: self.config.clone(),
            mode: self.mode,
            host: host.to_owned(),
        })
    }
}

/// One connection's TLS handshake.
pub struct Tls {
    config: Arc<ClientConfig>,
    mode: SslMode,
    host: String,
}

type Handshake<S> = Pin<Box<dyn Future<Output = io::Result<TlsStream<S>>> + Send>>;

impl<S> TlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = io::Error;
    type Future = Handshake<S>;

    fn connect(self, stream: S) -> Handshake<S> {
        Box::pin(async move {
            let context = |e: &dyn std::fmt::Display| {
                io::Error::other(format!(
                    "TLS with {:?} (sslmode={}): {e}",
                    self.host, self.mode
                ))
            };
            let name = ServerName::try_from(self.host.clone()).map_err(|e| context(&e))?;
            let stream = tokio_rustls::TlsConnector::from(self.config.clone())
                .connect(name, stream)
                .await
                .map_err(|e| context(&format!("{e}{}", hint(&e))))?;
            Ok(TlsStream(stream))
        })
    }
}

/// What a certificate error means for the one who wrote `DATABASE_URL`.
fn hint(e: &io::Error) -> &'static str {
    let Some(rustls::Error::InvalidCertificate(cert)) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return "";
    };
    match cert {
        CertificateError::UnknownIssuer => {
            " (the server's certificate is not signed by a CA in sslrootcert)"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            " (the server's certificate is not for this host name; sslmode=verify-ca does not check it)"
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            " (the server's certificate has expired)"
        }
        _ => "",
    }
}

/// An established TLS session.
pub struct TlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> tokio_postgres::tls::TlsStream for TlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// No SCRAM channel binding (tokio-postgres then authenticates without it, as with
    /// `channel_binding=prefer` in libpq against a server certificate it cannot bind to).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
