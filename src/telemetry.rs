//! Logging: `tracing` to stderr, human-readable or JSON lines.

use tracing_subscriber::{fmt, EnvFilter};

use crate::config::LogFormat;

/// Installs the global subscriber. Fails if the filter does not parse or a
/// subscriber is already installed.
pub fn init(
    format: LogFormat,
    filter: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = EnvFilter::try_new(filter)?;
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
}
