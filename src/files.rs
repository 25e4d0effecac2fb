//! Reading the files the gateway is given (its configuration, encryption keys, signing
//! secrets and tokens, certificates and private keys) within a size limit each: a path to `/dev/zero` or a log file by
//! mistake must be a clear error, not a process that grows until it is killed.

use std::io::{self, Read};
use std::path::Path;

/// Largest configuration file read: far above any real one.
pub const MAX_CONFIG_FILE: u64 = 1024 * 1024;
/// Largest encryption key file read: a key is 32 bytes or 64 hex digits.
pub const MAX_KEY_FILE: u64 = 1024;
/// Largest secret file read (`routes[].verify.secrets`, `admin.token`): a signing secret
/// or a token is tens of bytes.
pub const MAX_SECRET_FILE: u64 = 4096;
/// Largest PEM file read (certificate chains, CA bundles, private keys): a system CA
/// bundle is about 200 KiB.
pub const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The whole file, or an error when it cannot be read or is larger than `limit` bytes
/// (`InvalidData`, saying so). Never reads more than `limit + 1` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the file is larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_file_is_refused_after_the_limit() {
        let e = read_bounded(Path::new("/dev/zero"), 1024).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than 1024 bytes"), "{e}");
    }

    #[test]
    fn a_file_within_the_limit_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, [7u8; 1024]).unwrap();
        assert_eq!(read_bounded(&p, 1024).unwrap().len(), 1024);
        assert!(read_bounded(&p, 1023).is_err());
    }
}
