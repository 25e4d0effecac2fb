//! Certificates made by the test: a private CA (rcgen) and the leaf certificates it signs,
//! written to PEM files in a temporary directory for configs and `redis-server` to read.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

/// A private CA whose certificate is in [`TestCa::ca_file`].
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
    name: String,
    /// The CA certificate (PEM): what a client or server trusts.
    pub ca_file: PathBuf,
}

impl TestCa {
    /// A new CA named `name` (file names and the certificate's common name).
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, issuer.pem()).unwrap();
        Self {
            issuer,
            dir,
            name: name.to_owned(),
            ca_file,
        }
    }

    /// A certificate for `127.0.0.1` and `localhost`, usable by a server and a client,
    /// written as `{file}.pem` and `{file}-key.pem`.
    pub fn issue(&self, file: &str) -> CertFiles {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{} {file}", self.name));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = CertFiles {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}-key.pem")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

/// A path as a string for a config file.
pub fn path_str(p: &std::path::Path) -> String {
    p.to_str().expect("temporary paths are UTF-8").to_owned()
}
