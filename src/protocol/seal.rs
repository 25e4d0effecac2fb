//! Encryption at rest of stored records. Pure: no I/O, unit-tested here.
//!
//! A [`Keyring`] holds the keys of `store.encryption_keys`: the first seals every new
//! record, every one opens. A sealed record is
//!
//! `"DGS1"` | key id: 8 bytes | nonce: 24 bytes | XChaCha20-Poly1305 ciphertext and tag
//!
//! with the magic, the key id and the store key as associated data: a record copied under
//! another store key, or altered by one bit, does not open. XChaCha20-Poly1305's 192-bit
//! nonces are drawn at random, so gateways sharing a key need no nonce counter between
//! them and a collision is never a practical concern.
//!
//! The key id is a hash of the key (never the key, nor its index in the list), so a record
//! names the key that opens it across rotations, and logs and `check` can name a key
//! without showing any of its bytes.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

use crate::protocol::tokens::StoreKey;

/// The length of an encryption key, in bytes.
pub const KEY_LEN: usize = 32;

const MAGIC: &[u8; 4] = b"DGS1";
const KEY_ID_LEN: usize = 8;
const NONCE_LEN: usize = 24;
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + NONCE_LEN;

/// A key's public name: the first 8 bytes of a domain-tagged SHA-256 of the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; KEY_ID_LEN]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Why key material was refused. The message never quotes the material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyMaterialError {
    /// Neither 32 raw bytes nor 64 hex digits.
    #[error("holds {0} bytes: a key is exactly 32 raw bytes or 64 hex digits")]
    BadLength(usize),
    /// 64 characters, not all hex digits.
    #[error("is not 64 hex digits")]
    NotHex,
    /// The same key listed twice.
    #[error("is the same key as an earlier entry (key id {0})")]
    Duplicate(KeyId),
}

/// Why a stored record could not be opened: a store error, never a replay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Sealed under a key id that no configured key has.
    #[error("record sealed under key id {0}, which is not among store.encryption_keys")]
    UnknownKey(KeyId),
    /// The key is known but the record does not open: altered, truncated, or moved under
    /// another store key.
    #[error("record does not open under key id {0}: altered, or stored under another key")]
    Unopened(KeyId),
    /// Too short to be a sealed record.
    #[error("sealed record is truncated")]
    Truncated,
    /// Encryption is on and the record is in clear: refused, since anyone with write
    /// access to the store could have put it there.
    #[error("record is not encrypted, but store.encryption_keys are set")]
    Unsealed,
    /// Encryption is off and the record is sealed.
    #[error("record is encrypted, but no store.encryption_keys are set")]
    NoKeys,
}

#[derive(Clone)]
struct SealKey {
    id: KeyId,
    cipher: XChaCha20Poly1305,
}

/// The configured keys: the first seals, every one opens. Empty: records are stored in
/// clear. Cheap to clone.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Arc<[SealKey]>,
}

/// Reads one key's material: exactly 32 raw bytes, or 64 hex digits with surrounding
/// whitespace (`openssl rand -hex 32`).
pub fn parse_key(material: &[u8]) -> Result<[u8; KEY_LEN], KeyMaterialError> {
    if material.len() == KEY_LEN {
        let mut key = [0; KEY_LEN];
        key.copy_from_slice(material);
        return Ok(key);
    }
    let text = material.trim_ascii();
    if text.len() != 2 * KEY_LEN {
        return Err(KeyMaterialError::BadLength(material.len()));
    }
    let mut key = [0; KEY_LEN];
    hex::decode_to_slice(text, &mut key).map_err(|_| KeyMaterialError::NotHex)?;
    Ok(key)
}

/// The id a key is named by.
fn key_id(key: &[u8; KEY_LEN]) -> KeyId {
    let digest = Sha256::new()
        .chain_update(b"dedupe-gateway record key id v1\0")
        .chain_update(key)
        .finalize();
    let mut id = [0; KEY_ID_LEN];
    id.copy_from_slice(&digest[..KEY_ID_LEN]);
    KeyId(id)
}

/// The associated data a record is bound to: its header and its store key.
fn aad(header: &[u8], store_key: &StoreKey) -> Vec<u8> {
    let mut aad = Vec::with_capacity(header.len() + store_key.as_str().len());
    aad.extend_from_slice(header);
    aad.extend_from_slice(store_key.as_str().as_bytes());
    aad
}

impl Keyring {
    /// A keyring over `keys`, the first sealing. Refuses a key listed twice.
    pub fn new(keys: &[[u8; KEY_LEN]]) -> Result<Self, (usize, KeyMaterialError)> {
        let mut ring: Vec<SealKey> = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let id = key_id(key);
            if ring.iter().any(|k| k.id == id) {
                return Err((i, KeyMaterialError::Duplicate(id)));
            }
            ring.push(SealKey {
                id,
                cipher: XChaCha20Poly1305::new(key.into()),
            });
        }
        Ok(Self { keys: ring.into() })
    }

    /// Whether records are sealed.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The ids of the keys, the sealing one first.
    pub fn key_ids(&self) -> Vec<KeyId> {
        self.keys.iter().map(|k| k.id).collect()
    }

    /// Seals an encoded record under `store_key` with the first key; without keys, the
    /// record as it is.
    pub fn seal(&self, store_key: &StoreKey, record: Bytes) -> Bytes {
        let Some(key) = self.keys.first() else {
            return record;
        };
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&key.id.0);
        header.extend_from_slice(&nonce);
        let aad = aad(&header[..MAGIC.len() + KEY_ID_LEN], store_key);
        // Encryption fails only past the cipher's length limit (256 GiB), far above the
        // largest body a route may store.
        let sealed = key
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &record,
                    aad: &aad,
                },
            )
            .expect("a record within max_cached_body is below the cipher's length limit");
        header.extend_from_slice(&sealed);
        Bytes::from(header)
    }

    /// Opens a record read under `store_key`; without keys, passes a record in clear
    /// through.
    pub fn open(&self, store_key: &StoreKey, stored: Bytes) -> Result<Bytes, SealError> {
        let sealed = stored.starts_with(MAGIC);
        if self.keys.is_empty() {
            return if sealed {
                Err(SealError::NoKeys)
            } else {
                Ok(stored)
            };
        }
        if !sealed {
            return Err(SealError::Unsealed);
        }
        if stored.len() < HEADER_LEN {
            return Err(SealError::Truncated);
        }
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&stored[MAGIC.len()..MAGIC.len() + KEY_ID_LEN]);
        let id = KeyId(id);
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or(SealError::UnknownKey(id))?;
        let nonce = XNonce::from_slice(&stored[MAGIC.len() + KEY_ID_LEN..HEADER_LEN]);
        let aad = aad(&stored[..MAGIC.len() + KEY_ID_LEN], store_key);
        key.cipher
            .decrypt(
                nonce,
                Payload {
                    msg: &stored[HEADER_LEN..],
                    aad: &aad,
                },
            )
            .map(Bytes::from)
            .map_err(|_| SealError::Unopened(id))
    }
}

impl PartialEq for Keyring {
    fn eq(&self, other: &Self) -> bool {
        self.key_ids() == other.key_ids()
    }
}

impl Eq for Keyring {}

/// Names the keys by id only: no key byte ever reaches a log.
impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("key_ids", &self.key_ids())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: [u8; 32] = [1; 32];
    const K2: [u8; 32] = [2; 32];

    fn key(k: &str) -> StoreKey {
        StoreKey::from_raw(k)
    }

    fn record() -> Bytes {
        Bytes::from_static(b"DGR2 a record with a secret: card tok_4242")
    }

    #[test]
    fn seals_and_opens_without_leaving_the_record_in_clear() {
        let ring = Keyring::new(&[K1]).unwrap();
        let sealed = ring.seal(&key("k"), record());
        assert!(sealed.starts_with(MAGIC));
        assert!(!sealed.windows(8).any(|w| w == b"tok_4242"));
        assert_eq!(ring.open(&key("k"), sealed.clone()).unwrap(), record());
        // A fresh nonce every time.
        assert_ne!(ring.seal(&key("k"), record()), sealed);
    }

    #[test]
    fn a_record_moved_under_another_store_key_does_not_open() {
        let ring = Keyring::new(&[K1]).unwrap();
        let sealed = ring.seal(&key("dedupe:{a}:r:-:k1"), record());
        assert_eq!(
            ring.open(&key("dedupe:{a}:r:-:k2"), sealed),
            Err(SealError::Unopened(key_id(&K1)))
        );
    }

    #[test]
    fn rotation_opens_old_records_and_seals_with_the_new_key() {
        let old = Keyring::new(&[K1]).unwrap();
        let rotated = Keyring::new(&[K2, K1]).unwrap();
        let before = old.seal(&key("k"), record());
        assert_eq!(rotated.open(&key("k"), before).unwrap(), record());
        let after = rotated.seal(&key("k"), record());
        assert_eq!(after[4..12], key_id(&K2).0);
        assert_eq!(
            old.open(&key("k"), after),
            Err(SealError::UnknownKey(key_id(&K2)))
        );
    }

    #[test]
    fn altered_truncated_clear_or_unexpected_records_are_errors() {
        let ring = Keyring::new(&[K1]).unwrap();
        let sealed = ring.seal(&key("k"), record());
        for i in 0..sealed.len() {
            let mut bad = sealed.to_vec();
            bad[i] ^= 0x01;
            assert!(ring.open(&key("k"), Bytes::from(bad)).is_err(), "bit {i}");
        }
        for cut in 0..sealed.len() {
            assert!(ring.open(&key("k"), sealed.slice(..cut)).is_err(), "{cut}");
        }
        assert_eq!(ring.open(&key("k"), record()), Err(SealError::Unsealed));
        let none = Keyring::default();
        assert_eq!(none.open(&key("k"), sealed), Err(SealError::NoKeys));
        assert_eq!(none.open(&key("k"), record()).unwrap(), record());
        assert_eq!(none.seal(&key("k"), record()), record());
    }

    #[test]
    fn key_material_is_raw_or_hex_and_errors_never_quote_it() {
        assert_eq!(parse_key(&K1).unwrap(), K1);
        let hex_key = format!("  {}\n", hex::encode(K2));
        assert_eq!(parse_key(hex_key.as_bytes()).unwrap(), K2);
        assert_eq!(parse_key(b"short"), Err(KeyMaterialError::BadLength(5)));
        let not_hex = "z".repeat(64);
        let e = parse_key(not_hex.as_bytes()).unwrap_err();
        assert_eq!(e, KeyMaterialError::NotHex);
        assert!(!e.to_string().contains("zzzz"));
        assert!(matches!(
            Keyring::new(&[K1, K2, K1]),
            Err((2, KeyMaterialError::Duplicate(_)))
        ));
    }

    #[test]
    fn debug_and_ids_show_no_key_bytes() {
        let secret = [0xAB; 32];
        let ring = Keyring::new(&[secret]).unwrap();
        let shown = format!("{ring:?} {}", ring.key_ids()[0]);
        assert!(!shown.to_lowercase().contains("abab"), "{shown}");
        assert_eq!(ring.key_ids()[0].to_string().len(), 16);
    }
}
