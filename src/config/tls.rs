//! Certificates, private keys and trust anchors read from PEM files, and the rustls
//! configurations built from them: the client side of HTTPS upstreams and the server side
//! of the public listener. (TLS to Redis is the redis crate's; it is handed the same files.)
//!
//! Files are read and parsed when the configuration is validated, so a missing file, a
//! file with no certificate, or a key that does not match its certificate is an error
//! naming the field before anything binds, never a failure at the first handshake.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// Why a PEM file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct PemError {
    /// The file.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The contents of a PEM file, read once. Its `Debug` shows the path, never the bytes (a
/// private key is one of these).
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    path: PathBuf,
    bytes: Arc<[u8]>,
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PemFile({})", self.path.display())
    }
}

impl PemFile {
    /// Reads the file.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, PemError> {
        let path = path.as_ref();
        let bytes = crate::config::files::read_regular(path, crate::config::files::MAX_PEM_FILE)
            .map_err(|e| PemError {
                path: path.display().to_string(),
                reason: format!("cannot read: {e}"),
            })?;
        Ok(Self {
            path: path.to_owned(),
            bytes: bytes.into(),
        })
    }

    /// The path it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw PEM text.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn error(&self, reason: impl Into<String>) -> PemError {
        PemError {
            path: self.path.display().to_string(),
            reason: reason.into(),
        }
    }

    /// Every certificate in the file, in order; at least one.
    pub fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, PemError> {
        let certs = CertificateDer::pem_slice_iter(&self.bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(format!("not a PEM certificate file: {e}")))?;
        if certs.is_empty() {
            return Err(self.error("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
        }
        Ok(certs)
    }

    /// The private key in the file (PKCS#8, PKCS#1 or SEC1).
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, PemError> {
        PrivateKeyDer::from_pem_slice(&self.bytes)
            .map_err(|e| self.error(format!("holds no usable PEM private key: {e}")))
    }

    /// The certificates as trust anchors.
    pub fn trust_anchors(&self) -> Result<RootCertStore, PemError> {
        let mut roots = RootCertStore::empty();
        for cert in self.certificates()? {
            roots
                .add(cert)
                .map_err(|e| self.error(format!("not a usable CA certificate: {e}")))?;
        }
        Ok(roots)
    }
}

/// Makes ring the process's rustls provider (the only one compiled in). Idempotent.
pub fn install_crypto_provider() {
    // Err only when a provider is already installed: ours, from an earlier call.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A certificate chain and the key that signs for it, checked to belong together.
pub fn certified_key(cert: &PemFile, key: &PemFile) -> Result<CertifiedKey, PemError> {
    install_crypto_provider();
    let chain = cert.certificates()?;
    let der = key.private_key()?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&der)
        .map_err(|e| key.error(format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        key.error(format!(
            "does not match the certificate in {}: {e}",
            cert.path.display()
        ))
    })?;
    Ok(certified)
}

/// The roots an HTTPS upstream's certificate is checked against: the platform's (the
/// system trust store), plus a private CA when one is configured. Returns the roots and
/// any platform certificates that could not be loaded (worth a warning, not a refusal).
pub fn upstream_roots(private_ca: Option<&PemFile>) -> (RootCertStore, Vec<String>) {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let mut problems: Vec<String> = native.errors.iter().map(ToString::to_string).collect();
    let (_, unusable) = roots.add_parsable_certificates(native.certs);
    if unusable > 0 {
        problems.push(format!(
            "{unusable} platform root certificates could not be parsed"
        ));
    }
    if let Some(ca) = private_ca {
        // Parsed at validation; an error here would mean the file changed type since.
        match ca.certificates() {
            Ok(certs) => {
                roots.add_parsable_certificates(certs);
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    (roots, problems)
}

/// The client side of an HTTPS upstream: verified against `roots`; ALPN is set by the
/// connector (h2 when the upstream offers it, else http/1.1).
pub fn upstream_client_config(roots: RootCertStore) -> rustls::ClientConfig {
    install_crypto_provider();
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// The listener's certificate, swapped whole on reload: handshakes after the swap present
/// the new one, connections already open keep theirs.
#[derive(Debug)]
pub struct ListenerCert {
    current: ArcSwap<CertifiedKey>,
}

impl ListenerCert {
    /// Starts with `key`.
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(key),
        })
    }

    /// Presents `key` from the next handshake on.
    pub fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }

    /// The certificate presented now (its leaf first).
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The server side of the public listener: ALPN `h2` then `http/1.1`, the certificate
/// from `cert` (reloadable).
pub fn listener_config(cert: Arc<ListenerCert>) -> rustls::ServerConfig {
    install_crypto_provider();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PemFile {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        PemFile::read(&path).unwrap()
    }

    #[test]
    fn a_file_without_certificates_is_refused_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "empty.pem", "not pem at all\n");
        let e = f.certificates().unwrap_err();
        assert!(e.to_string().contains("empty.pem"), "{e}");
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        assert!(f.private_key().is_err());
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let e = PemFile::read("/nonexistent/ca.pem").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/ca.pem: cannot read"),
            "{e}"
        );
    }

    #[test]
    fn debug_never_prints_the_contents() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "key.pem",
            "-----BEGIN PRIVATE KEY-----\nSECRET\n",
        );
        assert!(!format!("{f:?}").contains("SECRET"));
    }
}
