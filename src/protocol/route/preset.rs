//! Webhook presets: a provider's delivery id as the key, a `match` under which its
//! redeliveries replay, and a window at least as long as the provider's documented retry
//! horizon. Pure data; docs/routing.md cites each provider's documentation.

use std::time::Duration;

use http::header::HeaderName;
use serde::Deserialize;

use crate::protocol::key::{KeyRule, RequestPart};
use crate::protocol::verify::Scheme;

use super::{MatchMode, StatusSpec};

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// Upstream statuses a preset route without `verify` adds to its `retry_statuses`: there
/// the receiver is the only one checking signatures, and its refusal of a forged delivery
/// must release the key rather than stand for the genuine delivery for the whole window.
pub const UNVERIFIED_REFUSALS: [StatusSpec; 2] = [StatusSpec::Code(401), StatusSpec::Code(403)];

/// `preset = "stripe" | "github" | "shopify" | "standard-webhooks"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"stripe\", \"github\", \"shopify\" or \"standard-webhooks\""
)]
pub enum Preset {
    /// Stripe: the event's `id` in the JSON body.
    Stripe,
    /// GitHub: `X-GitHub-Delivery`, per webhook (`X-GitHub-Hook-ID`).
    Github,
    /// Shopify: `X-Shopify-Webhook-Id`, per shop (`X-Shopify-Shop-Domain`).
    Shopify,
    /// Standard Webhooks: `webhook-id`.
    StandardWebhooks,
}

impl Preset {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Stripe => "stripe",
            Preset::Github => "github",
            Preset::Shopify => "shopify",
            Preset::StandardWebhooks => "standard-webhooks",
        }
    }

    /// Whose signature the provider's deliveries carry (`verify.scheme` unless the route
    /// writes its own).
    pub fn scheme(self) -> Scheme {
        match self {
            Preset::Stripe => Scheme::Stripe,
            Preset::Github => Scheme::Github,
            Preset::Shopify => Scheme::Shopify,
            Preset::StandardWebhooks => Scheme::StandardWebhooks,
        }
    }

    /// Where the key comes from: the id the provider keeps the same on every redelivery.
    pub fn key(self) -> KeyRule {
        let header = |name: &'static str| KeyRule::Header {
            name: HeaderName::from_static(name),
            alias: None,
            required: true,
        };
        match self {
            // Stripe sends no delivery-id header; the event's own id is in the body.
            Preset::Stripe => KeyRule::Fingerprint(vec![RequestPart::Json("/id".to_owned())]),
            Preset::Github => header("x-github-delivery"),
            Preset::Shopify => header("x-shopify-webhook-id"),
            // Svix, a Standard Webhooks sender, names it `svix-id` by default.
            Preset::StandardWebhooks => KeyRule::Header {
                name: HeaderName::from_static("webhook-id"),
                alias: Some(HeaderName::from_static("svix-id")),
                required: true,
            },
        }
    }

    /// The parts that namespace the key. GitHub shares one delivery GUID among every
    /// webhook subscribed to the event, so each webhook gets its own namespace; Shopify's
    /// ids are namespaced per shop, as an operator looks them up.
    pub fn scope(self) -> Vec<RequestPart> {
        let header = |name: &'static str| vec![RequestPart::Header(HeaderName::from_static(name))];
        match self {
            Preset::Stripe | Preset::StandardWebhooks => Vec::new(),
            Preset::Github => header("x-github-hook-id"),
            Preset::Shopify => header("x-shopify-shop-domain"),
        }
    }

    /// What must match for a repeat to be a replay: the delivery id alone. A redelivery
    /// carries new signatures and timestamps (`Stripe-Signature`, `webhook-timestamp`),
    /// and a provider never reuses its own id for another event.
    pub fn must_match(self) -> MatchMode {
        MatchMode::Key
    }

    /// How long after the first delivery the provider documents sending the same delivery
    /// again.
    pub fn retry_horizon(self) -> Duration {
        Duration::from_secs(match self {
            // Live mode: automatic retries for up to three days.
            Preset::Stripe => 3 * DAY,
            // No automatic retries; deliveries of the past 3 days can be redelivered.
            Preset::Github => 3 * DAY,
            // 8 retries over 4 hours.
            Preset::Shopify => 4 * HOUR,
            // The specification's example schedule ends 75h35m05s after the first attempt.
            Preset::StandardWebhooks => 75 * HOUR + 35 * 60 + 5,
        })
    }

    /// The window the preset sets: the retry horizon with a margin (the horizon is
    /// counted from the first attempt, the window from completion, and the providers
    /// state their horizons approximately).
    pub fn window(self) -> Duration {
        Duration::from_secs(match self {
            Preset::Stripe | Preset::Github | Preset::StandardWebhooks => 4 * DAY,
            Preset::Shopify => DAY,
        })
    }

    /// Where the provider documents its retries.
    pub fn docs(self) -> &'static str {
        match self {
            Preset::Stripe => "https://docs.stripe.com/webhooks#automatic-retries",
            Preset::Github => {
                "https://docs.github.com/en/webhooks/testing-and-troubleshooting-webhooks/redelivering-webhooks"
            }
            Preset::Shopify => "https://shopify.dev/changelog/updates-to-webhook-retry-mechanism",
            Preset::StandardWebhooks => {
                "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Preset; 4] = [
        Preset::Stripe,
        Preset::Github,
        Preset::Shopify,
        Preset::StandardWebhooks,
    ];

    #[test]
    fn every_window_covers_its_providers_retry_horizon() {
        for p in ALL {
            assert!(p.window() >= p.retry_horizon(), "{}", p.as_str());
        }
    }

    #[test]
    fn each_preset_verifies_its_providers_scheme() {
        for p in ALL {
            assert_eq!(p.scheme().as_str(), p.as_str());
        }
    }

    #[test]
    fn names_parse_as_written() {
        for p in ALL {
            let parsed: Preset = toml::Value::String(p.as_str().to_owned())
                .try_into()
                .unwrap();
            assert_eq!(parsed, p);
        }
    }
}
