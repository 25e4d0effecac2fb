//! Reading the files the gateway is given (its configuration, encryption keys, signing
//! secrets and tokens, certificates and private keys) within a size limit each: a path to `/dev/zero` or a log file by
//! mistake must be a clear error, not a process that grows until it is killed.
//!
//! The files the configuration names are read with [`read_regular`]: a FIFO there would
//! block `check` and `run` until something wrote to it, so each is opened without
//! blocking and refused unless it is a regular file. The configuration file itself is read
//! with [`read_bounded`], so `--config <(envsubst < gateway.toml.in)` keeps working.

use std::fs::{File, FileType, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
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
    read_at_most(File::open(path)?, limit)
}

/// A file the configuration names (a key, a secret, a certificate): the whole of it, as
/// [`read_bounded`] reads it, and only when it is a regular file. It is opened without
/// blocking and its type read from the open file, not from its path before opening (which
/// a rename between the two could change): a FIFO, a device or a directory is
/// `InvalidInput`, saying what it is, and is never read.
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        // Opening a FIFO for reading waits for a writer unless this is set; it changes
        // nothing for a regular file, whose reads never block.
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is not a regular file but {}", what_it_is(kind)),
        ));
    }
    read_at_most(file, limit)
}

/// What a file that is not a regular file is, for the error that refuses it.
fn what_it_is(kind: FileType) -> &'static str {
    if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// All of `file`, or `InvalidData` when it holds more than `limit` bytes.
fn read_at_most(file: File, limit: u64) -> io::Result<Vec<u8>> {
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
    fn a_fifo_a_device_or_a_directory_is_refused_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // No writer ever opens it: a blocking open would wait here for ever.
        for (path, what) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
        ] {
            let e = read_regular(path, 1024).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}");
            assert!(
                e.to_string()
                    .contains(&format!("not a regular file but {what}")),
                "{e}"
            );
        }
        let p = dir.path().join("k");
        std::fs::write(&p, [7u8; 16]).unwrap();
        assert_eq!(read_regular(&p, 16).unwrap().len(), 16);
        assert!(read_regular(&p, 15).is_err());
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
