//! Webhook signatures: a route with `verify` accepts a delivery only when its provider's
//! signature over the raw body verifies with one of the route's secrets, before the
//! request is claimed. A forged delivery that carried a genuine delivery id would
//! otherwise be claimed under that id, and its refusal by the receiver (or its stored
//! answer) would stand for the genuine delivery for the whole window.
//!
//! Each scheme is checked as its provider documents it and its own library does (the
//! tests hold Stripe's and Standard Webhooks' libraries to the same answers):
//!
//! - [`Scheme::Stripe`]: `Stripe-Signature: t=<unix>,v1=<hex>`, HMAC-SHA256 of
//!   `<t>.<body>` under the endpoint secret (`whsec_...`, used as written); a `t` older
//!   than the tolerance is refused, a later one is not (as Stripe's libraries do).
//! - [`Scheme::Github`]: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body.
//! - [`Scheme::Shopify`]: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the body.
//! - [`Scheme::StandardWebhooks`]: `webhook-signature: v1,<base64> ...` (space-separated),
//!   HMAC-SHA256 of `<webhook-id>.<webhook-timestamp>.<body>` under the base64 key of a
//!   `whsec_` secret; a timestamp outside the tolerance either way is refused. Svix's
//!   `svix-id`, `svix-timestamp` and `svix-signature` stand in for their `webhook-` twins.
//!
//! Pure: the clock is an argument. The MAC and the comparison come from the `hmac`,
//! `sha2` and `subtle` crates ([`mac`]); secrets never show in `Debug` ([`secret`]).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use serde::Deserialize;

mod body_only;
mod header;
mod mac;
pub mod secret;
mod standard;
mod stripe;
mod timestamp;

pub use secret::{Secret, SecretError};

/// `verify.scheme`: whose signature a route checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"stripe\", \"github\", \"shopify\" or \"standard-webhooks\""
)]
pub enum Scheme {
    /// `Stripe-Signature` (`t=`, `v1=`).
    Stripe,
    /// `X-Hub-Signature-256` (`sha256=` hex).
    Github,
    /// `X-Shopify-Hmac-Sha256` (base64).
    Shopify,
    /// `webhook-signature` (`v1,` base64) over `id.timestamp.body`, or Svix's `svix-*`.
    StandardWebhooks,
}

impl Scheme {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::Shopify => "shopify",
            Scheme::StandardWebhooks => "standard-webhooks",
        }
    }

    /// Whether the scheme signs a timestamp, so that `tolerance` applies. GitHub and
    /// Shopify sign the body alone: a captured delivery verifies forever.
    pub fn signs_timestamp(self) -> bool {
        matches!(self, Scheme::Stripe | Scheme::StandardWebhooks)
    }

    /// The header the signature travels in, as the provider spells it.
    pub fn signature_header(self) -> &'static str {
        match self {
            Scheme::Stripe => "Stripe-Signature",
            Scheme::Github => "X-Hub-Signature-256",
            Scheme::Shopify => "X-Shopify-Hmac-Sha256",
            Scheme::StandardWebhooks => "webhook-signature",
        }
    }

    /// A secret as the provider hands it out (read from its `env:` or `file:` source),
    /// turned into the MAC key.
    pub fn secret(self, text: &[u8]) -> Result<Secret, SecretError> {
        secret::parse(self, text)
    }

    /// The delivery's id, for the log line of a refused delivery: the provider's delivery
    /// id header, or the event id in a Stripe body. Unverified, so only ever logged.
    pub fn delivery_id(self, headers: &HeaderMap, body: &[u8]) -> Option<String> {
        let id = match self {
            Scheme::Stripe => stripe::event_id(body),
            Scheme::Github => header::first(headers, "x-github-delivery"),
            Scheme::Shopify => header::first(headers, "x-shopify-webhook-id"),
            Scheme::StandardWebhooks => {
                header::first(headers, "webhook-id").or_else(|| header::first(headers, "svix-id"))
            }
        }?;
        // A forger chooses it: keep the log line short and on one line.
        Some(
            id.chars()
                .take(MAX_LOGGED_ID)
                .map(|c| if c.is_control() { '?' } else { c })
                .collect(),
        )
    }
}

/// `now` in whole Unix seconds, as providers stamp their signatures.
fn unix_secs(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The longest delivery id a log line carries, in characters.
const MAX_LOGGED_ID: usize = 128;

/// A route's `verify`: its scheme, its secrets (the first that verifies wins, so a
/// rotation lists the new and the old) and, for schemes that sign a timestamp, how far
/// from now it may be.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    secrets: Vec<Secret>,
    tolerance: Duration,
}

/// A delivery whose signature verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Which of the route's secrets verified it (0 for the first): when the old secret of
    /// a rotation stops showing up, it can go.
    pub secret: usize,
}

/// Why a delivery's signature does not verify. Said to the log and to `check --request`;
/// the client gets only `signature-invalid`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The signature (or another signed header) is absent or empty.
    #[error("no {0} header")]
    Missing(&'static str),
    /// A signed header, or the body, cannot be read as the scheme defines it.
    #[error("{what}: {why}")]
    Malformed {
        /// The header (or `body`).
        what: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The signed timestamp lies outside the tolerance.
    #[error(
        "the signed timestamp is {} seconds {}, outside the tolerance of {}s",
        .age_secs.unsigned_abs(),
        if *.age_secs >= 0 { "old" } else { "in the future" },
        .tolerance.as_secs()
    )]
    Expired {
        /// How long ago it was signed, in seconds (negative: in the future).
        age_secs: i64,
        /// The route's tolerance.
        tolerance: Duration,
    },
    /// No signature in the request matches one made with any of the secrets.
    #[error("no signature matches one made with the route's {secrets} secret(s)")]
    Mismatch {
        /// How many secrets were tried.
        secrets: usize,
    },
}

impl SignatureError {
    /// Every [`SignatureError::result`], in the order of the variants.
    pub const RESULTS: [&'static str; 4] = ["missing", "malformed", "expired", "mismatch"];

    /// The `result` label of `dedupe_signature_total` (`verified` for a success).
    pub fn result(&self) -> &'static str {
        let i = match self {
            SignatureError::Missing(_) => 0,
            SignatureError::Malformed { .. } => 1,
            SignatureError::Expired { .. } => 2,
            SignatureError::Mismatch { .. } => 3,
        };
        Self::RESULTS[i]
    }
}

impl Verifier {
    /// A verifier with at least one secret (config validation makes sure of it).
    pub fn new(scheme: Scheme, secrets: Vec<Secret>, tolerance: Duration) -> Self {
        Self {
            scheme,
            secrets,
            tolerance,
        }
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// How many secrets are tried.
    pub fn secret_count(&self) -> usize {
        self.secrets.len()
    }

    /// How far from `now` a signed timestamp may be (schemes that sign one).
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Signs a delivery as its provider would, with the first secret at `now`: the
    /// signature headers (and, for Standard Webhooks, an id and a timestamp where there
    /// are none) are set on `headers`. For the drill, whose requests must pass the route's
    /// check like a provider's.
    pub fn sign(&self, headers: &mut HeaderMap, body: &[u8], now: SystemTime) {
        let Some(secret) = self.secrets.first() else {
            return;
        };
        match self.scheme {
            Scheme::Stripe => stripe::sign(secret, headers, body, now),
            Scheme::Github => body_only::sign(&body_only::GITHUB, secret, headers, body),
            Scheme::Shopify => body_only::sign(&body_only::SHOPIFY, secret, headers, body),
            Scheme::StandardWebhooks => standard::sign(secret, headers, body, now),
        }
    }

    /// Checks a delivery's signature on its raw body, at `now`.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<Verified, SignatureError> {
        let secret = match self.scheme {
            Scheme::Stripe => stripe::verify(&self.secrets, self.tolerance, headers, body, now),
            Scheme::Github => body_only::verify(&body_only::GITHUB, &self.secrets, headers, body),
            Scheme::Shopify => body_only::verify(&body_only::SHOPIFY, &self.secrets, headers, body),
            Scheme::StandardWebhooks => {
                standard::verify(&self.secrets, self.tolerance, headers, body, now)
            }
        }?;
        Ok(Verified { secret })
    }
}

impl fmt::Debug for Verifier {
    // Never the secrets: a `Debug` of the configuration ends up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &self.secrets.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

#[cfg(test)]
mod tests;
