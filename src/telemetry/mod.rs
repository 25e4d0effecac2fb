//! What the gateway tells its operators: the log (log/), Prometheus metrics (metrics/)
//! and traces (traces/).

pub mod log;
pub mod metrics;
pub mod traces;
