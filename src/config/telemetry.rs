//! `[telemetry]`: where traces go. Off unless `otlp_endpoint` is set.

use http::Uri;
use serde::Deserialize;

use super::defaults::{DEFAULT_SAMPLE_RATIO, DEFAULT_SERVICE_NAME};
use super::{invalid, ConfigError};

/// `[telemetry]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [telemetry] table")]
pub struct FileTelemetry {
    /// The OTLP/HTTP collector: `http://host:4318` (spans go to `/v1/traces`) or a full
    /// URL with its path.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` the spans carry.
    pub service_name: Option<String>,
    /// The share of new traces exported (a caller's `traceparent` decides for its own).
    pub sample_ratio: Option<f64>,
}

/// Validated `[telemetry]`: spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Where the spans are posted (OTLP/HTTP, protobuf): the full URL, path included.
    pub otlp_endpoint: Uri,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The share, 0 to 1, of the traces that start here which are exported; a request
    /// with a `traceparent` follows its caller's decision (the sampled flag).
    pub sample_ratio: f64,
}

/// `None` when traces are off: no `[telemetry]`, or no `otlp_endpoint` in it.
pub(super) fn validate(t: Option<&FileTelemetry>) -> Result<Option<TelemetryConfig>, ConfigError> {
    let Some(t) = t else { return Ok(None) };
    let Some(endpoint) = t.otlp_endpoint.as_deref() else {
        return Ok(None);
    };
    let service_name = match t.service_name.as_deref() {
        None => DEFAULT_SERVICE_NAME.to_owned(),
        Some(name) if name.trim().is_empty() || name.chars().any(char::is_control) => {
            return Err(invalid(
                "telemetry.service_name",
                "must be a name, not empty and without control characters",
            ))
        }
        Some(name) => name.to_owned(),
    };
    let sample_ratio = t.sample_ratio.unwrap_or(DEFAULT_SAMPLE_RATIO);
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(invalid(
            "telemetry.sample_ratio",
            format!("{sample_ratio} is not a share from 0 to 1 (0.1 exports one new trace in ten)"),
        ));
    }
    Ok(Some(TelemetryConfig {
        otlp_endpoint: endpoint_url(endpoint)?,
        service_name,
        sample_ratio,
    }))
}

/// `http://host:port` with `/v1/traces` added when it has no path of its own, as the
/// OTLP exporters' `OTEL_EXPORTER_OTLP_ENDPOINT` does.
fn endpoint_url(text: &str) -> Result<Uri, ConfigError> {
    const AT: &str = "telemetry.otlp_endpoint";
    let expected = "expected http://host:port (spans go to /v1/traces) or a full http:// URL";
    let uri: Uri = text
        .parse()
        .map_err(|e| invalid(AT, format!("{text:?} is not a URL ({e}); {expected}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(invalid(
            AT,
            format!("{text:?}: only http:// is supported (OTLP/HTTP without TLS, e.g. a local collector); {expected}"),
        ));
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(invalid(AT, format!("{text:?} has no host; {expected}")));
    };
    if authority.as_str().contains('@') {
        return Err(invalid(
            AT,
            format!("{text:?}: no user or password in the URL"),
        ));
    }
    let path = match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("") | Some("/") => "/v1/traces",
        Some(p) => p,
    };
    Uri::builder()
        .scheme("http")
        .authority(authority.as_str())
        .path_and_query(path)
        .build()
        .map_err(|e| invalid(AT, format!("{text:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(endpoint: Option<&str>, name: Option<&str>) -> FileTelemetry {
        FileTelemetry {
            otlp_endpoint: endpoint.map(str::to_owned),
            service_name: name.map(str::to_owned),
            sample_ratio: None,
        }
    }

    #[test]
    fn off_without_the_section_or_the_endpoint() {
        assert_eq!(validate(None).unwrap(), None);
        assert_eq!(validate(Some(&file(None, Some("x")))).unwrap(), None);
    }

    #[test]
    fn a_base_url_gets_the_traces_path_and_a_full_one_is_kept() {
        let t = validate(Some(&file(Some("http://collector:4318"), None)))
            .unwrap()
            .unwrap();
        assert_eq!(t.otlp_endpoint, "http://collector:4318/v1/traces");
        assert_eq!(t.service_name, DEFAULT_SERVICE_NAME);
        assert_eq!(t.sample_ratio, DEFAULT_SAMPLE_RATIO);
        let t = validate(Some(&file(
            Some("http://127.0.0.1:9/otlp/traces"),
            Some("edge"),
        )))
        .unwrap()
        .unwrap();
        assert_eq!(t.otlp_endpoint, "http://127.0.0.1:9/otlp/traces");
        assert_eq!(t.service_name, "edge");
    }

    #[test]
    fn a_bad_endpoint_or_name_is_refused_naming_the_field() {
        for bad in [
            "collector:4318",
            "https://c:4318",
            "grpc://c:4317",
            "http://",
            "http://u:p@c:4318",
            "not a url",
        ] {
            let e = validate(Some(&file(Some(bad), None)))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("telemetry.otlp_endpoint: "), "{bad}: {e}");
        }
        let e = validate(Some(&file(Some("http://c:4318"), Some(" "))))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("telemetry.service_name: "), "{e}");
        for bad in [-0.1, 1.5, f64::NAN] {
            let t = FileTelemetry {
                sample_ratio: Some(bad),
                ..file(Some("http://c:4318"), None)
            };
            let e = validate(Some(&t)).unwrap_err().to_string();
            assert!(e.starts_with("telemetry.sample_ratio: "), "{bad}: {e}");
        }
    }
}
