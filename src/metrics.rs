//! Prometheus metrics, with kube-proxy's names where the meaning is the same (so
//! existing dashboards and alerts keep working) and `kubenft_` for our own.

use crate::core::model::{ClusterState, Rejected};
use crate::dataplane::SyncKind;
use crate::engine::SyncReport;
use crate::netlink::monitor::Change;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, linear_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

type Labels = Vec<(&'static str, String)>;

/// Peak resident set of this process, KiB (`VmHWM`).
pub fn peak_rss_kib() -> u64 {
    peak_rss_kib_of("self")
}

/// Peak resident set of process `pid` (a number, or `self`), KiB; 0 if gone.
pub fn peak_rss_kib_of(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

pub struct Metrics {
    registry: Registry,
    sync_duration: Histogram,
    full_sync_duration: Histogram,
    partial_sync_duration: Histogram,
    last_sync: Gauge<f64, AtomicU64>,
    programming_latency: Histogram,
    service_changes: Counter,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    endpoint_changes_pending: Gauge,
    no_local_endpoints: Family<Labels, Gauge>,
    sync_failures: Counter,
    transaction_bytes: Histogram,
    rejected: Family<Labels, Counter>,
    manifest_errors: Counter,
    manifests_failing: Gauge,
    drift_repairs: Family<Labels, Counter>,
}

fn sync_buckets() -> Histogram {
    // kube-proxy's: 1 ms doubling to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        // kube-proxy's network programming buckets: 0.25 s, 0.5 s, then 1 s steps to
        // a minute, 5 s steps to two, 30 s steps to five.
        let programming = Histogram::new(
            linear_buckets(0.25, 0.25, 2)
                .chain(linear_buckets(1.0, 1.0, 59))
                .chain(linear_buckets(60.0, 5.0, 12))
                .chain(linear_buckets(120.0, 30.0, 7)),
        );
        let m = Metrics {
            registry: Registry::default(),
            sync_duration: sync_buckets(),
            full_sync_duration: sync_buckets(),
            partial_sync_duration: sync_buckets(),
            last_sync: Gauge::default(),
            programming_latency: programming,
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            endpoint_changes_pending: Gauge::default(),
            no_local_endpoints: Family::default(),
            sync_failures: Counter::default(),
            // 1 KiB to 1 GiB, by fours.
            transaction_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 11)),
            rejected: Family::default(),
            manifest_errors: Counter::default(),
            manifests_failing: Gauge::default(),
            drift_repairs: Family::default(),
        };
        m.register()
    }

    fn register(mut self) -> Metrics {
        let r = &mut self.registry;
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "Time of one sync of the proxy rules (full or partial)",
            self.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "Time of one full sync (the whole table read back and diffed)",
            self.full_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "Time of one partial sync (only the Services that changed)",
            self.partial_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "When the proxy rules were last synced successfully (Unix time)",
            self.last_sync.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "From an EndpointSlice's last-change-trigger-time to its rules being programmed",
            self.programming_latency.clone(),
        );
        // The client appends `_total` to counters.
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Service changes seen",
            self.service_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "EndpointSlice changes seen",
            self.endpoint_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Service changes not yet programmed",
            self.service_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "EndpointSlice changes not yet programmed",
            self.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Service ports with a Local traffic policy and no endpoint on this node",
            self.no_local_endpoints.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Syncs whose transaction failed (the previous rules stayed in place)",
            self.sync_failures.clone(),
        );
        r.register(
            "kubenft_transaction_bytes",
            "Netlink bytes sent per committed transaction",
            self.transaction_bytes.clone(),
        );
        r.register(
            "kubenft_rejected_objects",
            "Objects skipped as malformed, by kind and the field at fault",
            self.rejected.clone(),
        );
        r.register(
            "kubenft_manifest_errors",
            "Manifest files found unreadable or not YAML (each new error once); the file's last good objects were kept",
            self.manifest_errors.clone(),
        );
        r.register(
            "kubenft_manifest_files_failing",
            "Manifest files (or paths) that cannot be read or parsed now",
            self.manifests_failing.clone(),
        );
        r.register(
            "kubenft_drift_repairs",
            "Full syncs started because our tables may have changed outside kube-nft: another process's transaction touched them, or change notifications were lost (the socket overflowed)",
            self.drift_repairs.clone(),
        );
        self
    }

    /// After a reload of the manifests: `new` errors seen, `failing` files now.
    pub fn manifests_read(&self, new: usize, failing: usize) {
        self.manifest_errors.inc_by(new as u64);
        self.manifests_failing.set(failing as i64);
    }

    /// Counts changes as they arrive; they stay pending until the next sync.
    pub fn changes_seen(&self, services: usize, endpoints: usize) {
        self.service_changes.inc_by(services as u64);
        self.endpoint_changes.inc_by(endpoints as u64);
        self.service_changes_pending.inc_by(services as i64);
        self.endpoint_changes_pending.inc_by(endpoints as i64);
    }

    pub fn rejected(&self, rejected: &[Rejected]) {
        for r in rejected {
            let kind = r.object.split(' ').next().unwrap_or_default().to_string();
            self.rejected
                .get_or_create(&vec![("kind", kind), ("reason", reason_of(r))])
                .inc();
        }
    }

    pub fn sync_succeeded(&self, report: &SyncReport, state: &ClusterState, now: SystemTime) {
        let secs = report.duration.as_secs_f64();
        self.sync_duration.observe(secs);
        match report.kind {
            SyncKind::Full => self.full_sync_duration.observe(secs),
            SyncKind::Partial => self.partial_sync_duration.observe(secs),
        }
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_sync.set(unix.as_secs_f64());
        self.service_changes_pending.set(0);
        self.endpoint_changes_pending.set(0);
        if report.committed.bytes > 0 {
            self.transaction_bytes
                .observe(report.committed.bytes as f64);
        }
        let (internal, external) = no_local_endpoints(state);
        self.no_local_endpoints
            .get_or_create(&vec![("traffic_policy", "internal".into())])
            .set(internal as i64);
        self.no_local_endpoints
            .get_or_create(&vec![("traffic_policy", "external".into())])
            .set(external as i64);
    }

    /// Network programming latency of changes triggered at `triggers`, programmed `now`.
    pub fn programmed(&self, triggers: &[SystemTime], now: SystemTime) {
        for t in triggers {
            let latency = now.duration_since(*t).unwrap_or(Duration::ZERO);
            self.programming_latency.observe(latency.as_secs_f64());
        }
    }

    /// A full sync requested because of drift, by cause.
    pub fn drift_seen(&self, change: Change) {
        let cause = match change {
            Change::Foreign { .. } => "foreign_transaction",
            Change::Lost => "notifications_lost",
        };
        self.drift_repairs
            .get_or_create(&vec![("cause", cause.into())])
            .inc();
    }

    pub fn sync_failed(&self) {
        self.sync_failures.inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// A bounded label for a rejection: its field with list indices removed
/// (`spec.ports[1].port` → `spec.ports.port`), or "parse" for an unreadable document.
fn reason_of(r: &Rejected) -> String {
    if r.field.is_empty() {
        return "parse".into();
    }
    let mut out = String::new();
    let mut in_index = false;
    for c in r.field.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            c if !in_index => out.push(c),
            _ => {}
        }
    }
    out
}

/// Service ports whose internal or external traffic policy is Local and which
/// have no ready endpoint on this node.
fn no_local_endpoints(state: &ClusterState) -> (usize, usize) {
    let node = state.node.as_ref();
    let (mut internal, mut external) = (0, 0);
    for svc in state.services.values().filter(|s| s.uses_local_endpoints()) {
        for port in &svc.ports {
            let local = state
                .endpoints_for(svc, port)
                .iter()
                .any(|e| e.conditions.ready && e.is_on(node));
            if local {
                continue;
            }
            if svc.internal_policy_local {
                internal += 1;
            }
            if svc.external_policy_local && svc.externally_accessible() {
                external += 1;
            }
        }
    }
    (internal, external)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_kube_proxy_names_and_reasons_without_indices() {
        let m = Metrics::new();
        m.changes_seen(2, 3);
        m.rejected(&[Rejected {
            object: "Service default/web".into(),
            field: "spec.ports[1].port".into(),
            reason: "0 is not a valid port".into(),
        }]);
        let text = m.render();
        assert!(text.contains("kubeproxy_sync_proxy_rules_service_changes_total 2\n"));
        assert!(text.contains("kubeproxy_sync_proxy_rules_endpoint_changes_pending 3\n"));
        assert!(text.contains(
            "kubenft_rejected_objects_total{kind=\"Service\",reason=\"spec.ports.port\"} 1\n"
        ));
    }
}
