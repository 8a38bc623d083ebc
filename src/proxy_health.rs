//! kube-proxy's own health endpoint (`--healthz-bind-address`, `/healthz` and
//! `/livez`): healthy once the first sync is in, and while no change has waited
//! longer than the timeout (kube-proxy's: twice the sync period) to be programmed.
//! The JSON body has kube-proxy's fields.

use crate::http::Response;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

pub struct ProxyHealth {
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<Instant>,
}

fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl ProxyHealth {
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth {
            timeout,
            state: Mutex::default(),
        }
    }

    /// A change arrived that the next sync must program.
    pub fn queued(&self) {
        let mut s = self.state.lock().unwrap();
        s.oldest_pending.get_or_insert_with(Instant::now);
    }

    /// A sync succeeded: everything queued before it is programmed.
    pub fn updated(&self) {
        let mut s = self.state.lock().unwrap();
        s.last_updated = Some(SystemTime::now());
        s.oldest_pending = None;
    }

    pub fn healthy(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.last_updated.is_some() && s.oldest_pending.is_none_or(|t| t.elapsed() <= self.timeout)
    }

    /// The answer to `/healthz` and `/livez` (anything else: 404).
    pub fn respond(&self, path: &str) -> Response {
        if path != "/healthz" && path != "/livez" {
            return Response::not_found();
        }
        let healthy = self.healthy();
        let last = self.state.lock().unwrap().last_updated;
        let body = serde_json::json!({
            "lastUpdated": last.map(rfc3339).unwrap_or_default(),
            "currentTime": rfc3339(SystemTime::now()),
            "nodeEligible": true,
        });
        Response {
            status: if healthy { 200 } else { 503 },
            content_type: "application/json",
            body: body.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_until_the_first_sync_and_when_a_change_waits_too_long() {
        let h = ProxyHealth::new(Duration::from_millis(50));
        assert_eq!(h.respond("/healthz").status, 503);
        h.updated();
        assert_eq!(h.respond("/livez").status, 200);
        h.queued();
        assert_eq!(h.respond("/healthz").status, 200);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(h.respond("/healthz").status, 503);
        h.updated();
        assert_eq!(h.respond("/healthz").status, 200);
        assert_eq!(h.respond("/other").status, 404);
    }
}
