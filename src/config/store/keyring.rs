//! `store.encryption_keys`: the keys that seal stored records, read from files or the
//! environment.

use super::super::{invalid, secrets, ConfigError};
use crate::protocol::seal::{self, Keyring, KEY_LEN};

/// Reads and checks every `encryption_keys` entry. Errors name the entry and its source,
/// never a byte of the material.
pub(super) fn keyring(
    sources: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Keyring, ConfigError> {
    let mut keys: Vec<[u8; KEY_LEN]> = Vec::with_capacity(sources.len());
    for (i, source) in sources.iter().enumerate() {
        let at = format!("store.encryption_keys[{i}]");
        let (material, origin) = material(&at, source, env)?;
        let key = seal::parse_key(&material).map_err(|e| invalid(&at, format!("{origin} {e}")))?;
        keys.push(key);
    }
    Keyring::new(&keys)
        .map_err(|(i, e)| invalid(format!("store.encryption_keys[{i}]"), e.to_string()))
}

/// One entry's raw material and where it came from (for errors, which never quote it).
fn material(
    at: &str,
    source: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<u8>, String), ConfigError> {
    if let Some(path) = source.strip_prefix("file:") {
        let bytes = secrets::file(path, crate::config::files::MAX_KEY_FILE)
            .map_err(|why| invalid(at, format!("cannot read the key file {path:?}: {why}")))?;
        Ok((bytes, format!("the key file {path:?}")))
    } else if let Some(name) = source.strip_prefix("env:") {
        let value = secrets::env_var(at, name, env)?;
        // Raw bytes cannot travel in a variable: there, a key is 64 hex digits.
        if value.len() == KEY_LEN {
            return Err(invalid(
                at,
                format!("the environment variable {name} must hold 64 hex digits"),
            ));
        }
        Ok((
            value.into_bytes(),
            format!("the environment variable {name}"),
        ))
    } else {
        Err(invalid(
            at,
            "must be \"file:/path/to/key\" or \"env:VARIABLE\"",
        ))
    }
}
