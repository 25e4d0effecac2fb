//! Secrets named by where they are, `env:NAME` or `file:/path` (as `store.encryption_keys`
//! are), read when the configuration is loaded, so a secret never sits in the file beside
//! everything else. Errors name the field and the source, never a byte of the secret.

use std::path::Path;

use super::{invalid, ConfigError};

/// The bytes a source holds, white space around them removed (a file's newline), and the
/// source as errors name it (`the environment variable NAME`, `the file "/path"`).
pub(super) fn read(
    at: &str,
    source: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<u8>, String), ConfigError> {
    let (bytes, origin) = if let Some(path) = source.strip_prefix("file:") {
        let bytes = file(path, crate::config::files::MAX_SECRET_FILE)
            .map_err(|why| invalid(at, format!("cannot read the file {path:?}: {why}")))?;
        (bytes, format!("the file {path:?}"))
    } else if let Some(name) = source.strip_prefix("env:") {
        (
            env_var(at, name, env)?.into_bytes(),
            format!("the environment variable {name}"),
        )
    } else {
        return Err(invalid(
            at,
            "must be \"env:VARIABLE\" or \"file:/path\": a secret is never written in the file itself",
        ));
    };
    let trimmed = bytes.trim_ascii();
    if trimmed.is_empty() {
        return Err(invalid(at, format!("{origin} is empty")));
    }
    Ok((trimmed.to_vec(), origin))
}

/// A `file:` source's bytes (a regular file, at most `limit` bytes), or why not, in words
/// that quote none of it: the I/O error's kind alone, or what the file is instead.
pub(super) fn file(path: &str, limit: u64) -> Result<Vec<u8>, String> {
    crate::config::files::read_regular(Path::new(path), limit).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => e.to_string(),
        kind => kind.to_string(),
    })
}

/// An `env:` source's value: set, and named (`env:` alone would otherwise be reported as
/// "the environment variable  is not set").
pub(super) fn env_var(
    at: &str,
    name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    if name.is_empty() {
        return Err(invalid(
            at,
            "\"env:\" names no variable: the variable's name is empty; write \"env:NAME\"",
        ));
    }
    env(name).ok_or_else(|| invalid(at, format!("the environment variable {name} is not set")))
}

/// Whether a value names a source rather than being the secret itself.
pub(super) fn is_source(value: &str) -> bool {
    value.starts_with("env:") || value.starts_with("file:")
}

/// A secret that may be written in place or named by its source: text either way.
pub(super) fn text(
    at: &str,
    value: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    if !is_source(value) {
        return Ok(value.to_owned());
    }
    let (bytes, origin) = read(at, value, env)?;
    String::from_utf8(bytes).map_err(|_| invalid(at, format!("{origin} is not UTF-8 text")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| " t0ken\n".to_owned())
    }

    #[test]
    fn sources_are_read_trimmed_and_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cret\n").unwrap();
        let (bytes, origin) = read("x", &format!("file:{}", file.display()), &env).unwrap();
        assert_eq!(bytes, b"s3cret");
        assert!(origin.starts_with("the file"), "{origin}");
        assert_eq!(read("x", "env:TOKEN", &env).unwrap().0, b"t0ken");
        let e = read("x", "env:OTHER", &env).unwrap_err().to_string();
        assert_eq!(e, "x: the environment variable OTHER is not set");
        let e = read("x", "plain-secret", &env).unwrap_err().to_string();
        assert!(
            !e.contains("plain-secret") && e.contains("env:VARIABLE"),
            "{e}"
        );
        std::fs::write(&file, "\n").unwrap();
        let e = read("x", &format!("file:{}", file.display()), &env).unwrap_err();
        assert!(e.to_string().ends_with("is empty"), "{e}");
        // An endless file is refused at once: it is a device, not a file.
        let e = read("x", "file:/dev/zero", &env).unwrap_err().to_string();
        assert!(
            e.contains("not a regular file but a character device"),
            "{e}"
        );
        let e = read("x", "env:", &env).unwrap_err().to_string();
        assert!(e.starts_with("x: \"env:\" names no variable"), "{e}");
    }

    #[test]
    fn text_is_literal_unless_it_names_a_source() {
        assert_eq!(text("x", "literal", &env).unwrap(), "literal");
        assert_eq!(text("x", "env:TOKEN", &env).unwrap(), "t0ken");
    }
}
