//! The log: `tracing` for events, one writer thread for every line, and the access line
//! formatted without `tracing`'s layers.
//!
//! Every line, from `tracing` or the access log, goes through one [`sink::Sink`], so lines
//! never tear or reorder. Access lines wait up to [`sink::FLUSH_EVERY`] to be written in a
//! batch; other lines are written at once.

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
/// colours text lines from `tracing`. Keep the guard to the end: dropping it writes out
/// every line still buffered.
pub fn install(format: Format, ansi: bool) -> std::io::Result<sink::Guard> {
    let (sink, guard) = sink::Sink::start(Box::new(std::io::stderr()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(sink.clone());
    // A subscriber already set (by an embedding program) keeps its place.
    let _ = match format {
        Format::Text => builder.try_init(),
        // One copy of the span's fields per line: the current span, not also the list.
        Format::Json => builder
            .json()
            .flatten_event(true)
            .with_span_list(false)
            .try_init(),
    };
    let _ = ACCESS.set(AccessLog { sink, format });
    Ok(guard)
}

/// Writes one access line, if [`install`] ran and the filter lets `dedupe_gateway::access`
/// through at info. `line` is called only then.
pub fn access<'a>(line: impl FnOnce() -> AccessLine<'a>) {
    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    let Some(log) = ACCESS.get() else { return };
    if !tracing::enabled!(target: line::TARGET, tracing::Level::INFO) {
        return;
    }
    let line = line();
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        match log.format {
            Format::Json => line.write_json(buf),
            Format::Text => line.write_text(buf),
        }
        log.sink.append(buf, false);
    });
}
