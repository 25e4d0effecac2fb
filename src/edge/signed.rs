//! A signed route's gate: the webhook signature checked on the raw body before anything
//! reads the request's key, so a delivery that does not verify is never claimed, stored
//! or forwarded, and never answered from the store.

use std::time::SystemTime;

use http::HeaderMap;
use tracing::{debug, warn};

use super::Gateway;
use crate::edge::problem::GatewayError;
use crate::protocol::route::Route;

impl Gateway {
    /// Checks the delivery's signature on a route with `verify` (any other passes): counted
    /// by result, and a refusal logged at warn with the delivery id and the reason.
    pub(super) fn check_signature(
        &self,
        route: &Route,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(), GatewayError> {
        let Some(verifier) = &route.verify else {
            return Ok(());
        };
        match verifier.verify(headers, body, SystemTime::now()) {
            Ok(verified) => {
                self.metrics.signature(&route.name, "verified");
                debug!(route = %route.name, secret = verified.secret, "webhook signature verified");
                Ok(())
            }
            Err(e) => {
                self.metrics.signature(&route.name, e.result());
                let scheme = verifier.scheme();
                warn!(
                    route = %route.name,
                    scheme = scheme.as_str(),
                    delivery = scheme.delivery_id(headers, body).as_deref().unwrap_or("-"),
                    result = e.result(),
                    reason = %e,
                    "webhook signature refused (401): not claimed, not forwarded"
                );
                Err(GatewayError::SignatureInvalid)
            }
        }
    }
}
