//! `errors` and `problem_base_url`, in `[defaults]` and on each route: the dialect of the
//! gateway's own answers. A template file is read and checked here (JSON once filled with
//! sample values), so a broken one is refused before any port is bound.

use std::sync::Arc;

use super::defaults::{DEFAULT_ERRORS, DEFAULT_TEMPLATE_CONTENT_TYPE, MAX_TEMPLATE_BYTES};
use super::file::{FileDefaults, FileErrors, FileRoute, FileTemplate};
use super::{invalid, ConfigError};
use crate::protocol::route::dialect::{Dialect, Envelope, Template};

/// `[defaults] errors` and `problem_base_url`: what routes inherit, and how the answers
/// made before a request has a route are written.
pub(super) fn defaults(d: &FileDefaults) -> Result<Dialect, ConfigError> {
    Ok(Dialect {
        envelope: match &d.errors {
            Some(e) => envelope("defaults.errors", e)?,
            None => DEFAULT_ERRORS.into(),
        },
        problem_base_url: d
            .problem_base_url
            .as_deref()
            .map(|b| base_url("defaults.problem_base_url", b))
            .transpose()?,
    })
}

/// A route's own `errors` and `problem_base_url`, else the defaults'. A preset route
/// does not take `[defaults] errors`: its webhook sender does not read answers' bodies,
/// and problem+json is what the gateway's logs and tools speak; its own `errors` still
/// applies.
pub(super) fn route(at: &str, r: &FileRoute, defaults: &Dialect) -> Result<Dialect, ConfigError> {
    Ok(Dialect {
        envelope: match (&r.errors, r.preset) {
            (Some(e), _) => envelope(&format!("{at}.errors"), e)?,
            (None, Some(_)) => Envelope::Problem,
            (None, None) => defaults.envelope.clone(),
        },
        problem_base_url: match &r.problem_base_url {
            Some(b) => Some(base_url(&format!("{at}.problem_base_url"), b)?),
            None => defaults.problem_base_url.clone(),
        },
    })
}

fn envelope(at: &str, e: &FileErrors) -> Result<Envelope, ConfigError> {
    match e {
        FileErrors::BuiltIn(b) => Ok((*b).into()),
        FileErrors::Template(t) => template(at, t).map(|t| Envelope::Template(Arc::new(t))),
    }
}

/// Reads and checks a template file: at most [`MAX_TEMPLATE_BYTES`], UTF-8, placeholders
/// known, JSON once filled.
fn template(at: &str, t: &FileTemplate) -> Result<Template, ConfigError> {
    let content_type = t
        .content_type
        .as_deref()
        .unwrap_or(DEFAULT_TEMPLATE_CONTENT_TYPE);
    let at_file = format!("{at}.template");
    let path = &t.template;
    // A regular file only: a FIFO named here would block `check` and `run` for ever.
    let bytes = crate::config::files::read_regular(std::path::Path::new(path), MAX_TEMPLATE_BYTES)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => invalid(
                &at_file,
                format!("{path} is larger than {MAX_TEMPLATE_BYTES} bytes"),
            ),
            _ => invalid(&at_file, format!("cannot read {path}: {e}")),
        })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| invalid(&at_file, format!("cannot read {path}: not UTF-8 text")))?;
    Template::new(&text, content_type).map_err(|e| match e {
        crate::protocol::route::dialect::TemplateError::ContentType(_) => {
            invalid(format!("{at}.content_type"), e.to_string())
        }
        e => invalid(&at_file, format!("{path}: {e}")),
    })
}

/// An absolute `http` or `https` URL that a problem's name completes: it must end with
/// `/`, `#` or `=`, so the name starts a path segment, a fragment or a query value.
fn base_url(at: &str, v: &str) -> Result<Arc<str>, ConfigError> {
    let web = v.parse::<http::Uri>().is_ok_and(|uri| {
        matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some()
    });
    if !web {
        return Err(invalid(
            at,
            format!(
                "{v:?} is not an absolute http or https URL (of the pages documenting the problems)"
            ),
        ));
    }
    if !v.ends_with(['/', '#', '=']) {
        return Err(invalid(
            at,
            format!(
                "{v:?} must end with '/', '#' or '=': the problem's name is appended \
                 (\"{v}request-in-flight\" is what a client would get)"
            ),
        ));
    }
    Ok(v.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_absolute_web_urls_the_name_completes() {
        for good in [
            "https://docs.example.com/problems/",
            "http://127.0.0.1:8080/p#",
            "https://example.com/errors?type=",
        ] {
            assert_eq!(&*base_url("f", good).unwrap(), good);
        }
        for (bad, why) in [
            ("https://docs.example.com/problems", "must end with"),
            ("/problems/", "absolute http or https"),
            ("urn:example:problem:", "absolute http or https"),
            ("ftp://example.com/", "absolute http or https"),
            ("https://exa mple.com/", "absolute http or https"),
        ] {
            let e = base_url("defaults.problem_base_url", bad).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("defaults.problem_base_url: ") && text.contains(why),
                "{bad}: {text}"
            );
        }
    }
}
