//! kube-proxy's own health endpoint (`--healthz-bind-address`, `/healthz` and
//! `/livez`): healthy while the kernel serves this node's Services and no
//! change has waited longer than the timeout (kube-proxy's: twice the sync
//! period) to be programmed. The kernel serves them once the first sync is in,
//! or from the start when an earlier run's tables are in place (a restart):
//! kube-proxy answers 200 from its start, even on a node it has programmed
//! nothing on yet; kube-nft does as soon as that is true, and not before.
//! `/healthz` also fails while the node is being deleted. The JSON body has
//! kube-proxy's fields.

use crate::core::model::NodeInfo;
use crate::node::http::Response;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

pub struct ProxyHealth {
    timeout: Duration,
    state: Mutex<State>,
}

struct State {
    last_updated: Option<SystemTime>,
    /// The kernel held our tables when this process started: the rules of an
    /// earlier run serve until the first sync brings them up to date.
    inherited: bool,
    oldest_pending: Option<Instant>,
    /// Whether load balancers may send this node traffic (see `node_eligible`).
    node_eligible: bool,
}

fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// kube-proxy's `NodeEligible`: a node whose Node object is being deleted, or
/// carries the cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint, is
/// not, so that `/healthz` fails and cloud load balancers drain it before it
/// goes (KEP-3836). With the API server as the source, a node without a Node
/// object is not either (kube-proxy's node is nil); with manifests, whose Node
/// object is optional, it is.
pub fn node_eligible(node: Option<&NodeInfo>, from_api: bool) -> bool {
    match node {
        Some(n) if n.from_object => !n.leaving,
        _ => !from_api,
    }
}

impl ProxyHealth {
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth {
            timeout,
            state: Mutex::new(State {
                last_updated: None,
                inherited: false,
                oldest_pending: None,
                node_eligible: true,
            }),
        }
    }

    /// A change arrived that the next sync must program.
    pub fn queued(&self) {
        let mut s = self.state.lock().unwrap();
        s.oldest_pending.get_or_insert_with(Instant::now);
    }

    /// At start, before the first sync: the kernel already holds our tables.
    pub fn inherit_ruleset(&self) {
        self.state.lock().unwrap().inherited = true;
    }

    /// A sync succeeded: everything queued before it is programmed.
    pub fn updated(&self) {
        let mut s = self.state.lock().unwrap();
        s.last_updated = Some(SystemTime::now());
        s.oldest_pending = None;
    }

    pub fn set_node_eligible(&self, eligible: bool) {
        let mut s = self.state.lock().unwrap();
        if s.node_eligible != eligible {
            if eligible {
                tracing::info!(
                    "this node is eligible for load balancer traffic again: /healthz answers 200"
                );
            } else {
                tracing::warn!("this node is being deleted (or has no Node object): /healthz answers 503, so that load balancers drain it");
            }
            s.node_eligible = eligible;
        }
    }

    pub fn healthy(&self) -> bool {
        self.healthy_in(&self.state.lock().unwrap())
    }

    fn healthy_in(&self, s: &State) -> bool {
        (s.last_updated.is_some() || s.inherited)
            && s.oldest_pending.is_none_or(|t| t.elapsed() <= self.timeout)
    }

    /// The answer to `/healthz` and `/livez` (anything else: 404), in
    /// kube-proxy's form. `/livez` says whether the proxy is healthy; `/healthz`
    /// also whether the node is eligible, and says so in `nodeEligible`.
    pub fn respond(&self, path: &str) -> Response {
        let with_node = match path {
            "/healthz" => true,
            "/livez" => false,
            _ => return Response::not_found(),
        };
        let (healthy, last, eligible) = {
            let s = self.state.lock().unwrap();
            (self.healthy_in(&s), s.last_updated, s.node_eligible)
        };
        let ok = healthy && (eligible || !with_node);
        let now = SystemTime::now();
        // As kube-proxy: a healthy answer's lastUpdated is now.
        let last_updated = if ok { Some(now) } else { last };
        let stamp = |t: Option<SystemTime>| t.map(rfc3339).unwrap_or_default();
        // Both families are programmed by every sync.
        let family = serde_json::json!({"lastUpdated": stamp(last), "healthy": healthy});
        let mut body = serde_json::json!({
            "lastUpdated": stamp(last_updated),
            "currentTime": rfc3339(now),
            "healthy": healthy,
            "status": {"IPv4": family.clone(), "IPv6": family},
        });
        if with_node {
            body["nodeEligible"] = eligible.into();
        }
        Response {
            status: if ok { 200 } else { 503 },
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

    #[test]
    fn over_an_earlier_runs_rules_healthy_from_the_start_until_a_change_waits_too_long() {
        let h = ProxyHealth::new(Duration::from_millis(50));
        h.queued();
        h.inherit_ruleset();
        assert_eq!(h.respond("/healthz").status, 200);
        assert_eq!(h.respond("/livez").status, 200);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(h.respond("/healthz").status, 503);
        h.updated();
        assert_eq!(h.respond("/healthz").status, 200);
    }

    #[test]
    fn a_node_being_deleted_fails_healthz_but_not_livez() {
        let h = ProxyHealth::new(Duration::from_secs(60));
        h.updated();
        let node = |leaving| NodeInfo {
            name: "n1".into(),
            from_object: true,
            leaving,
            ..NodeInfo::default()
        };
        h.set_node_eligible(node_eligible(Some(&node(true)), true));
        let healthz = h.respond("/healthz");
        assert_eq!(healthz.status, 503);
        let body: serde_json::Value = serde_json::from_str(&healthz.body).unwrap();
        assert_eq!(body["nodeEligible"], false);
        assert_eq!(body["healthy"], true);
        assert_eq!(body["status"]["IPv4"]["healthy"], true);
        let livez = h.respond("/livez");
        assert_eq!(livez.status, 200);
        let body: serde_json::Value = serde_json::from_str(&livez.body).unwrap();
        assert!(body.get("nodeEligible").is_none(), "{body}");
        h.set_node_eligible(node_eligible(Some(&node(false)), true));
        assert_eq!(h.respond("/healthz").status, 200);
        // Without a Node object: not eligible from the API server, eligible from manifests.
        let by_name = NodeInfo {
            name: "n1".into(),
            ..NodeInfo::default()
        };
        assert!(!node_eligible(Some(&by_name), true));
        assert!(!node_eligible(None, true));
        assert!(node_eligible(Some(&by_name), false));
    }
}
