//! The OTLP sink: exports spooled profiles to an OpenTelemetry profiles receiver (an
//! OpenTelemetry collector, or a backend that speaks OTLP), as a second sink beside Ember's
//! collector. The conversion itself is `encode::otlp`.
use ember_proto::ember;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use tonic::{
    metadata::MetadataMap,
    transport::{Channel, Endpoint},
    Status,
};

use super::push::{channel, Acknowledged, Sink};
use crate::{encode::otlp::export_request, ops::metrics};

pub struct OtlpSink {
    client: ProfilesServiceClient<Channel>,
    /// Extra request headers, e.g. a tenant id or an authorization the receiver requires.
    headers: MetadataMap,
}

impl OtlpSink {
    pub fn new(endpoint: Endpoint, headers: MetadataMap) -> OtlpSink {
        OtlpSink { client: ProfilesServiceClient::new(channel(endpoint)), headers }
    }
}

impl Sink for OtlpSink {
    const NAME: &'static str = "otlp";

    async fn send(&mut self, profiles: Vec<ember::Profile>) -> Result<Acknowledged, Status> {
        let held = profiles.iter().map(|p| p.sequence).collect();
        // A spooled profile that does not decode can never be sent: refuse it as content.
        let request = export_request(&profiles).map_err(|e| Status::invalid_argument(format!("{e:#}")))?;
        let mut request = tonic::Request::new(request);
        *request.metadata_mut() = self.headers.clone();
        let response = self.client.export(request).await?.into_inner();
        // OTLP says how many it rejected, not which: the request is done either way, and the
        // rejected ones are counted.
        if let Some(partial) = response.partial_success.filter(|p| p.rejected_profiles > 0) {
            tracing::warn!(rejected = partial.rejected_profiles, "OTLP receiver rejected profiles: {}", partial.error_message);
            metrics::add("ember_lost_total", &[("reason", "refused"), ("sink", Self::NAME)], partial.rejected_profiles as f64);
        }
        Ok(Acknowledged { held, refused: vec![] })
    }
}
