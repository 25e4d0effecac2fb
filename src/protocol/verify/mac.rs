//! The one MAC every scheme uses, HMAC-SHA256 (the `hmac` and `sha2` crates), and the
//! constant-time comparison of what a request carries with what it should (`subtle`).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::Secret;

/// HMAC-SHA256 under `key` of the concatenation of `parts`, without copying them into one
/// buffer (a body may be megabytes).
pub(super) fn hmac_sha256(key: &Secret, parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose()).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Whether `given` equals `expected`, in time that depends on their lengths only.
pub(super) fn equal(expected: &[u8], given: &[u8]) -> bool {
    expected.ct_eq(given).into()
}

/// The index of the first secret under which `matches` holds for the MAC of `parts`:
/// each secret's MAC is computed once and compared with every signature the request
/// carries.
pub(super) fn first_secret(
    secrets: &[Secret],
    parts: &[&[u8]],
    mut matches: impl FnMut(&[u8; 32]) -> bool,
) -> Option<usize> {
    secrets
        .iter()
        .position(|secret| matches(&hmac_sha256(secret, parts)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_4231_test_case_2() {
        // RFC 4231 §4.3: key "Jefe", data "what do ya want for nothing?".
        let key = Secret::new(b"Jefe".to_vec());
        let mac = hmac_sha256(&key, &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn comparison_needs_equal_lengths_and_bytes() {
        assert!(equal(b"abc", b"abc"));
        assert!(!equal(b"abc", b"abd"));
        assert!(!equal(b"abc", b"ab"));
        assert!(!equal(b"", b"a"));
    }
}
