//! The two formats `/metrics` answers in, and which one a scraper asked for.

/// The formats `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0 (`application/openmetrics-text`), what Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (`text/plain`), for any other client: `curl`,
    /// `promtool check metrics`, older scrapers.
    PrometheusText,
}

impl Exposition {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` at a quality above 0 and no lower than that of
    /// `text/plain`, `text/*` or `*/*`; the text format otherwise, and without the header.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let (mut open, mut other) = (0.0_f32, 0.0_f32);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(0.0));
            match media.as_str() {
                "application/openmetrics-text" => open = open.max(q),
                "text/plain" | "text/*" | "*/*" => other = other.max(q),
                _ => {}
            }
        }
        match open > 0.0 && open >= other {
            true => Self::OpenMetrics,
            false => Self::PrometheusText,
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition as prometheus-client
/// writes it (it writes no other): a counter's `HELP` and `TYPE` name its samples
/// (`dedupe_requests_total`), not its family (`dedupe_requests`), and there is no `UNIT`
/// line and no `# EOF`. Samples, labels and values are written alike in both.
pub(super) fn prometheus_text(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len() + 512);
    let mut help: Option<&str> = None;
    for line in open_metrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').map_or("", |(_, text)| text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.rsplit_once(' ').unwrap_or((rest, "untyped"));
            let total = if kind == "counter" { "_total" } else { "" };
            if let Some(text) = help.take() {
                out += &format!("# HELP {family}{total} {text}\n");
            }
            out += &format!("# TYPE {family}{total} {kind}\n");
        } else if !(line.starts_with("# UNIT ") || line == "# EOF") {
            out += line;
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for_first() {
        use Exposition::*;
        // Prometheus's own scrape.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, want) in [
            (Some(prometheus), OpenMetrics),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("Application/OpenMetrics-Text; version=1.0.0"),
                OpenMetrics,
            ),
            (None, PrometheusText),
            (Some("text/plain"), PrometheusText),
            (Some("*/*"), PrometheusText),
            (
                Some("text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5"),
                PrometheusText,
            ),
            (Some("application/openmetrics-text;q=0"), PrometheusText),
            (Some("application/json"), PrometheusText),
        ] {
            assert_eq!(Exposition::negotiate(accept), want, "{accept:?}");
        }
    }
}
