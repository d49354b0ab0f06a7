//! What the worker client counts for itself, read at scrape time (the client sits below the
//! gateway's metrics and imports none of them).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use super::Upstream;

#[derive(Debug)]
pub(crate) struct UpstreamCollector(pub Upstream);

impl Collector for UpstreamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = encoder.encode_descriptor(
            "upstream_keepalive_resends",
            "Requests sent once more on a fresh connection to the same worker because the kept-alive connection closed before any byte of an answer (a keep-alive race, charged to no one)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(self.0.keepalive_resends()).encode(family)
    }
}
