//! Signing secrets: the MAC key each provider's secret stands for, held so that no
//! `Debug`, log line or error ever shows a byte of it.

use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use super::Scheme;

/// The prefix of Stripe's endpoint secrets and of Standard Webhooks' (and Svix's) secrets.
const WHSEC: &str = "whsec_";

/// Standard base64, with or without padding: Standard Webhooks' own library accepts both.
const BASE64_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A MAC key. `Debug` shows its length class only.
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// A key of these bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes.into_boxed_slice())
    }

    /// The key, for the MAC alone.
    pub(super) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Why a secret's text is not a key for its scheme. Never quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Nothing but white space.
    #[error("is empty")]
    Empty,
    /// A Stripe secret without `whsec_`: likely an API key (`sk_...`) pasted in its place.
    #[error("is not a Stripe endpoint secret: those start with \"whsec_\" (the endpoint's signing secret, not an API key)")]
    NotStripe,
    /// A Standard Webhooks secret that is not `whsec_` and base64.
    #[error("is not a Standard Webhooks secret: \"whsec_\" followed by base64")]
    NotBase64,
}

/// The key `text` stands for under `scheme`; white space around it (a file's newline) is
/// not part of it.
pub(super) fn parse(scheme: Scheme, text: &[u8]) -> Result<Secret, SecretError> {
    let text = text.trim_ascii();
    if text.is_empty() {
        return Err(SecretError::Empty);
    }
    let key = match scheme {
        // Stripe's libraries use the whole secret, prefix included, as the key.
        Scheme::Stripe if !text.starts_with(WHSEC.as_bytes()) => {
            return Err(SecretError::NotStripe)
        }
        Scheme::Stripe | Scheme::Github | Scheme::Shopify => text.to_vec(),
        Scheme::StandardWebhooks => {
            let encoded = text.strip_prefix(WHSEC.as_bytes()).unwrap_or(text);
            BASE64_ANY_PADDING
                .decode(encoded)
                .map_err(|_| SecretError::NotBase64)?
        }
    };
    if key.is_empty() {
        return Err(SecretError::Empty);
    }
    Ok(Secret::new(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_reads_its_providers_secret() {
        let sw = parse(
            Scheme::StandardWebhooks,
            b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
        )
        .unwrap();
        assert_eq!(sw.expose().len(), 24);
        // Unpadded and without the prefix, as the library accepts.
        let bare = parse(
            Scheme::StandardWebhooks,
            b"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        .unwrap();
        assert_eq!(bare.expose(), sw.expose());
        assert_eq!(
            parse(Scheme::StandardWebhooks, b"whsec_not base64!").unwrap_err(),
            SecretError::NotBase64
        );
        let stripe = parse(Scheme::Stripe, b"  whsec_abc \n").unwrap();
        assert_eq!(stripe.expose(), b"whsec_abc");
        assert_eq!(
            parse(Scheme::Stripe, b"sk_live_123").unwrap_err(),
            SecretError::NotStripe
        );
        assert_eq!(
            parse(Scheme::Github, b"s3cret").unwrap().expose(),
            b"s3cret"
        );
        assert_eq!(
            parse(Scheme::Shopify, b" \n").unwrap_err(),
            SecretError::Empty
        );
        assert_eq!(
            parse(Scheme::StandardWebhooks, b"whsec_").unwrap_err(),
            SecretError::Empty
        );
    }

    #[test]
    fn debug_never_shows_the_key() {
        let s = parse(Scheme::Github, b"hunter2").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }
}
