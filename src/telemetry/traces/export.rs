//! The exporter: spans batched on the tokio runtime and posted to the collector over
//! OTLP/HTTP (protobuf) by a hyper client; the `tracing` layer that feeds it.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry};

use super::{ON, TARGET};
use crate::config::TelemetryConfig;

/// How long one export may take; a collector that does not answer loses that batch, never
/// holds requests (spans wait in a bounded queue, dropped when it is full).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The layer to install beside the log's, for `tracing_subscriber::registry()`.
pub type TraceLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Why the exporter could not start, or could not send its last spans.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExportError(String);

/// The running exporter: [`Exporter::shutdown`] sends what is still queued.
pub struct Exporter {
    provider: SdkTracerProvider,
}

/// Starts the exporter for `config` and answers the layer that feeds it; from then on the
/// request path creates spans. The batches are sent from `runtime`.
pub fn start(
    config: &TelemetryConfig,
    runtime: &tokio::runtime::Handle,
) -> Result<(TraceLayer, Exporter), ExportError> {
    let _in = runtime.enter();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.otlp_endpoint.to_string())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| ExportError(format!("cannot start the OTLP trace exporter: {e}")))?;
    let processor = BatchSpanProcessor::builder(exporter, runtime::Tokio).build();
    // The caller's sampled flag decides for its trace; the ratio for the traces begun here.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("dedupe-gateway");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        // Neither is read: the gateway propagates a span's context itself (`inject`), and a
        // span's start and end times give its duration. Both cost work on every poll of
        // every instrumented future (a clock read, a lookup, a context swap): turned off,
        // traced passthrough spent 6% less CPU (5 alternating rounds, benchmarks.md).
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_level(false)
        .with_target(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO));
    ON.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok((Box::new(layer), Exporter { provider }))
}

impl Exporter {
    /// Stops creating spans and sends every span still queued. Call it while the runtime
    /// given to [`start`] is still alive, outside of it: it blocks until the last batch is
    /// sent (or its export timed out).
    pub fn shutdown(self) -> Result<(), ExportError> {
        ON.store(false, std::sync::atomic::Ordering::Relaxed);
        self.provider
            .shutdown()
            .map_err(|e| ExportError(format!("the last spans were not sent: {e}")))
    }
}
