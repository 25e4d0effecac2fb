//! `routes[].verify`: the scheme (the preset's unless written), the secrets read from their
//! sources and turned into keys, and the tolerance of schemes that sign a timestamp.

use super::defaults::{DEFAULT_VERIFY_TOLERANCE, MAX_VERIFY_TOLERANCE};
use super::file::FileRoute;
use super::{invalid, parse, secrets, ConfigError};
use crate::protocol::route::{Mode, Preset, Route};
use crate::protocol::verify::Verifier;

/// The route's verifier, if it has `verify`.
pub(super) fn validate(
    at: &str,
    r: &FileRoute,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Verifier>, ConfigError> {
    let Some(v) = &r.verify else {
        return Ok(None);
    };
    let at = format!("{at}.verify");
    let scheme = v
        .scheme
        .or(r.preset.map(Preset::scheme))
        .ok_or_else(|| {
            invalid(
                format!("{at}.scheme"),
                "required on a route without a preset: \"stripe\", \"github\", \"shopify\" or \"standard-webhooks\"",
            )
        })?;
    if v.secrets.is_empty() {
        return Err(invalid(
            format!("{at}.secrets"),
            "must list at least one secret: \"env:VARIABLE\" or \"file:/path\"",
        ));
    }
    let tolerance = match &v.tolerance {
        None => DEFAULT_VERIFY_TOLERANCE,
        Some(_) if !scheme.signs_timestamp() => {
            return Err(invalid(
                format!("{at}.tolerance"),
                format!(
                    "{} signs no timestamp, so there is nothing to hold to a tolerance",
                    scheme.as_str()
                ),
            ))
        }
        Some(t) => parse::duration(&format!("{at}.tolerance"), t, MAX_VERIFY_TOLERANCE)?,
    };
    let mut keys = Vec::with_capacity(v.secrets.len());
    for (i, source) in v.secrets.iter().enumerate() {
        let at = format!("{at}.secrets[{i}]");
        let (text, origin) = secrets::read(&at, source, env)?;
        keys.push(
            scheme
                .secret(&text)
                .map_err(|e| invalid(&at, format!("{origin} {e}")))?,
        );
    }
    Ok(Some(Verifier::new(scheme, keys, tolerance)))
}

/// Valid `verify` settings that do less than they seem to, and webhook routes a forged
/// delivery can still read.
pub(super) fn lints(routes: &[Route]) -> Vec<String> {
    let mut out = Vec::new();
    for r in routes {
        let name = &r.name;
        match (&r.verify, r.preset) {
            (Some(_), _) if r.mode == Mode::Off => out.push(format!(
                "routes[{name}].verify: mode = \"off\" passes every request through unverified"
            )),
            (Some(v), Some(p)) if v.scheme() != p.scheme() => out.push(format!(
                "routes[{name}].verify.scheme: {} on a {} preset route: its deliveries carry {}",
                v.scheme().as_str(),
                p.as_str(),
                p.scheme().signature_header(),
            )),
            (None, Some(p)) => out.push(format!(
                "routes[{name}]: preset {} without verify: a forged delivery that reuses a genuine \
                 delivery's id is answered with that delivery's stored response; set \
                 verify = {{ secrets = [\"env:...\"] }} to check {} before the claim",
                p.as_str(),
                p.scheme().signature_header(),
            )),
            _ => {}
        }
    }
    out
}
