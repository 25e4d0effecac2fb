//! The log: `tracing` for events, one writer thread for every line, and the access line
//! formatted without `tracing`'s layers.
//!
//! Every line, from `tracing` or the access log, goes through one [`sink::Sink`], so lines
//! never tear or reorder. Access lines wait up to [`sink::FLUSH_EVERY`] to be written in a
//! batch; other lines are written at once.

#[cfg(test)]
mod captured;
pub mod clock;
pub mod line;
pub mod sink;

use std::cell::RefCell;
use std::sync::OnceLock;

pub use line::AccessLine;

/// The format of every line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `tracing-subscriber`'s full text format.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where access lines go once [`install`] ran.
struct AccessLog {
    sink: sink::Sink,
    format: Format,
}

static ACCESS: OnceLock<AccessLog> = OnceLock::new();

/// Sets up the process's log, to stderr: `RUST_LOG` filters (default `info`), `ansi`
/// colours text lines from `tracing`. `traces`, when set, is installed beside it with a
/// filter of its own (the exporter's, see [`crate::telemetry::traces`]), and the log's filter then
/// leaves the trace spans out. Keep the guard to the end: dropping it writes out every
/// line still buffered.
pub fn install(
    format: Format,
    ansi: bool,
    traces: Option<crate::telemetry::traces::export::TraceLayer>,
) -> std::io::Result<sink::Guard> {
    let (sink, guard) = sink::Sink::start(Box::new(std::io::stderr()), sink::FLUSH_EVERY)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let installed = match traces {
        // Without traces, the subscriber the log always had: one global filter.
        None => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(ansi)
                .with_writer(sink.clone());
            match format {
                Format::Text => builder.try_init().is_ok(),
                // One copy of the span's fields per line: the current span, not also the list.
                Format::Json => builder
                    .json()
                    .flatten_event(true)
                    .with_span_list(false)
                    .try_init()
                    .is_ok(),
            }
        }
        Some(traces) => with_traces(format, ansi, filter, sink.clone(), traces),
    };
    // A subscriber set before (by a program embedding the gateway) keeps its place and
    // gets the access lines as events too.
    if installed {
        let _ = ACCESS.set(AccessLog { sink, format });
    }
    Ok(guard)
}

/// The log's layer under its own filter, beside the trace layer under the exporter's.
fn with_traces(
    format: Format,
    ansi: bool,
    filter: tracing_subscriber::EnvFilter,
    sink: sink::Sink,
    traces: crate::telemetry::traces::export::TraceLayer,
) -> bool {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // The trace spans are the exporter's; `RUST_LOG=trace` must not log them as well.
    let off = format!("{}=off", crate::telemetry::traces::TARGET);
    let filter = filter.add_directive(off.parse().expect("a valid directive"));
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(sink);
    let registry = tracing_subscriber::registry().with(traces);
    match format {
        Format::Text => registry.with(layer.with_filter(filter)).try_init().is_ok(),
        Format::Json => {
            let layer = layer.json().flatten_event(true).with_span_list(false);
            registry.with(layer.with_filter(filter)).try_init().is_ok()
        }
    }
}

/// Writes one access line, if the filter lets `dedupe_gateway::access` through at info:
/// formatted here when [`install`] set up the log; otherwise as a `tracing` event, for a
/// subscriber of the embedding program's own. `line` is called only then.
pub fn access<'a>(line: impl FnOnce() -> AccessLine<'a>) {
    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    if !tracing::enabled!(target: line::TARGET, tracing::Level::INFO) {
        return;
    }
    let line = line();
    let Some(log) = ACCESS.get() else {
        return line.emit();
    };
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        match log.format {
            Format::Json => line.write_json(buf),
            Format::Text => line.write_text(buf),
        }
        log.sink.append(buf, false);
        // One long key must not keep its buffer for good.
        if buf.capacity() > 64 * 1024 {
            *buf = Vec::new();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::captured::Out;
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn without_install_access_lines_reach_the_programs_own_subscriber_and_its_filter() {
        // No test in this crate calls `install`: access lines take the `tracing` path.
        assert!(ACCESS.get().is_none());
        let line = || AccessLine {
            at: SystemTime::now(),
            method: "POST",
            path: "/orders",
            route: "orders",
            outcome: "won",
            finish: None,
            would: None,
            status: 201,
            fence: Some(7),
            upstream_ms: None,
            total_ms: 1.5,
            key: Some("k1"),
            scope: None,
        };
        for (filter, logged) in [("info", true), ("info,dedupe_gateway::access=warn", false)] {
            let out = Out::default();
            let writer = out.clone();
            let subscriber = tracing_subscriber::fmt()
                .json()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::with_default(subscriber, || access(line));
            let text = out.text();
            assert_eq!(text.contains(r#""key":"k1""#), logged, "{filter}: {text}");
        }
    }
}
