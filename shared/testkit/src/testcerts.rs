//! Certificates made at test time for the TLS cluster: a CA, a server certificate it signs
//! (for `localhost` and `127.0.0.1`), and a second CA that signed nothing, to be the wrong
//! `sslrootcert`. Nothing is checked in, so nothing expires in the repository.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// Where the PEM files were written.
#[derive(Debug, Clone)]
pub struct Certs {
    pub ca_cert: PathBuf,
    pub other_ca_cert: PathBuf,
    pub server_cert: PathBuf,
    /// Mode 0600: PostgreSQL refuses a key others can read.
    pub server_key: PathBuf,
}

impl Certs {
    /// Makes the certificates and writes them into `dir`.
    pub fn write(dir: &Path) -> Result<Certs, String> {
        let err = |what: &str, e: &dyn std::fmt::Display| format!("test certificates, {what}: {e}");
        let ca = make_ca("clicks test CA").map_err(|e| err("CA", &e))?;
        let other =
            make_ca("clicks test CA that signed nothing").map_err(|e| err("other CA", &e))?;
        let server_key = KeyPair::generate().map_err(|e| err("server key", &e))?;
        let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .map_err(|e| err("server parameters", &e))?;
        let server = params
            .signed_by(&server_key, &ca)
            .map_err(|e| err("server certificate", &e))?;
        let certs = Certs {
            ca_cert: dir.join("ca.crt"),
            other_ca_cert: dir.join("other-ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
        };
        let write = |path: &Path, text: String, mode: u32| {
            std::fs::write(path, text)
                .and_then(|()| {
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                })
                .map_err(|e| err(&path.display().to_string(), &e))
        };
        write(&certs.ca_cert, ca.pem(), 0o644)?;
        write(&certs.other_ca_cert, other.pem(), 0o644)?;
        write(&certs.server_cert, server.pem(), 0o644)?;
        write(&certs.server_key, server_key.serialize_pem(), 0o600)?;
        Ok(certs)
    }
}

fn make_ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate()?)
}
