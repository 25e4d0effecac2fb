//! `[admin]`'s token. The admin API can delete and resolve keys, which lets a request
//! execute again, so it is never served beyond loopback without a token unless the file
//! says so in words (`allow_unauthenticated = true`).

use std::net::SocketAddr;

use super::defaults::DEFAULT_ADMIN_ALLOW_UNAUTHENTICATED;
use super::file::FileAdmin;
use super::{invalid, secrets, AdminConfig, ConfigError};

/// The token (read from its source when `admin.token` names one), or the refusal of an
/// admin listener that would be open beyond loopback.
pub(super) fn token(
    a: &FileAdmin,
    listen: SocketAddr,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let token = match a.token.as_deref() {
        Some("") => return Err(invalid("admin.token", "must not be empty")),
        Some(t) => Some(secrets::text("admin.token", t, env)?),
        None => None,
    };
    if token.is_none() && !listen.ip().is_loopback() && !allow_unauthenticated(a) {
        return Err(invalid(
            "admin.token",
            format!(
                "required: admin.listen {listen} is not a loopback address, and the admin API can \
                 delete and resolve keys (which lets a request execute again). Set admin.token \
                 (the token, \"env:VARIABLE\" or \"file:/path\"; or DEDUPE_ADMIN_TOKEN), listen on \
                 127.0.0.1, or write admin.allow_unauthenticated = true"
            ),
        ));
    }
    Ok(token)
}

/// `admin.allow_unauthenticated`, or its default.
pub(super) fn allow_unauthenticated(a: &FileAdmin) -> bool {
    a.allow_unauthenticated
        .unwrap_or(DEFAULT_ADMIN_ALLOW_UNAUTHENTICATED)
}

/// The warning for an admin API that anyone who reaches it may use.
pub(super) fn warnings(admin: &AdminConfig) -> Vec<String> {
    if !admin.is_open() {
        return Vec::new();
    }
    vec![format!(
        "admin.allow_unauthenticated = true: the admin API on {} (not loopback) needs no token; \
         anyone who reaches it can read /metrics and delete or resolve keys, letting requests \
         execute again",
        admin.listen
    )]
}
