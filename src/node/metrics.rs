//! Prometheus metrics, with kube-proxy's names, labels and buckets where the
//! meaning is the same (so existing dashboards and alerts keep working) and
//! `kubenft_` for our own. kube-proxy runs one proxier per IP family and labels
//! its series `ip_family`; every sync of ours programs both families in one
//! transaction, so a sync's figures are given for both.

use crate::core::model::{ClusterState, Rejected};
use crate::core::net::Family as IpFamily;
use crate::core::policy::{categorize, port_endpoints};
use crate::engine::dataplane::SyncKind;
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

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;
type Timestamps = Family<Labels, Gauge<f64, AtomicU64>>;

pub struct Metrics {
    registry: Registry,
    sync_duration: Histograms,
    full_sync_duration: Histograms,
    partial_sync_duration: Histograms,
    last_sync: Timestamps,
    last_queued: Timestamps,
    programming_latency: Histograms,
    service_changes: Counter,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    endpoint_changes_pending: Gauge,
    no_local_endpoints: Family<Labels, Gauge>,
    sync_failures: Family<Labels, Counter>,
    healthz: Family<Labels, Counter>,
    livez: Family<Labels, Counter>,
    conntrack_duration: Histograms,
    conntrack_deleted: Family<Labels, Counter>,
    transaction_bytes: Histogram,
    rejected: Family<Labels, Counter>,
    skipped_values: Family<Labels, Counter>,
    manifest_errors: Counter,
    manifests_failing: Gauge,
    drift_repairs: Family<Labels, Counter>,
}

/// kube-proxy's sync buckets: 1 ms doubling to ~16 s.
fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// kube-proxy's network programming buckets: 0 (its bucket merge starts with
/// one), 0.25 s, 0.5 s, then 1 s steps to a minute, 5 s steps to two, 30 s
/// steps to five.
fn programming_buckets() -> Histogram {
    Histogram::new(
        std::iter::once(0.0)
            .chain(linear_buckets(0.25, 0.25, 2))
            .chain(linear_buckets(1.0, 1.0, 59))
            .chain(linear_buckets(60.0, 5.0, 12))
            .chain(linear_buckets(120.0, 30.0, 7)),
    )
}

/// The `ip_family` label, as kube-proxy writes it.
fn ip_family(f: IpFamily) -> Labels {
    vec![(
        "ip_family",
        match f {
            IpFamily::Ip => "IPv4",
            IpFamily::Ip6 => "IPv6",
        }
        .into(),
    )]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let histograms = |buckets: fn() -> Histogram| Histograms::new_with_constructor(buckets);
        let m = Metrics {
            registry: Registry::default(),
            sync_duration: histograms(sync_buckets),
            full_sync_duration: histograms(sync_buckets),
            partial_sync_duration: histograms(sync_buckets),
            last_sync: Family::default(),
            last_queued: Family::default(),
            programming_latency: histograms(programming_buckets),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            endpoint_changes_pending: Gauge::default(),
            no_local_endpoints: Family::default(),
            sync_failures: Family::default(),
            healthz: Family::default(),
            livez: Family::default(),
            conntrack_duration: histograms(sync_buckets),
            conntrack_deleted: Family::default(),
            // 1 KiB to 1 GiB, by fours.
            transaction_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 11)),
            rejected: Family::default(),
            skipped_values: Family::default(),
            manifest_errors: Counter::default(),
            manifests_failing: Gauge::default(),
            drift_repairs: Family::default(),
        };
        m.register()
    }

    /// kube-proxy's help texts, word for word. The client appends `_total` to
    /// counters' names.
    fn register(mut self) -> Metrics {
        let r = &mut self.registry;
        r.register_collector(Box::new(crate::node::process_metrics::ProcessCollector));
        r.register_collector(Box::new(crate::node::process_metrics::ApiRequestCollector));
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            self.full_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            self.partial_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            self.last_sync.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            self.last_queued.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            self.programming_latency.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            self.service_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            self.endpoint_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            self.service_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            self.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            self.no_local_endpoints.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            self.sync_failures.clone(),
        );
        r.register(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            self.healthz.clone(),
        );
        r.register(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            self.livez.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            self.conntrack_duration.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            self.conntrack_deleted.clone(),
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
            "kubenft_skipped_values",
            "Values skipped as malformed in objects that were kept (an external IP, an ingress IP, a source range), by kind and field",
            self.skipped_values.clone(),
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
        // At 0 from the start, so that a rate over them needs no first failure.
        for f in IpFamily::ALL {
            drop(self.sync_failures.get_or_create(&ip_family(f)));
        }
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

    pub fn skipped_values(&self, skipped: &[Rejected]) {
        for r in skipped {
            let kind = r.object.split(' ').next().unwrap_or_default().to_string();
            self.skipped_values
                .get_or_create(&vec![("kind", kind), ("field", reason_of(r))])
                .inc();
        }
    }

    pub fn sync_succeeded(&self, report: &SyncReport, state: &ClusterState, now: SystemTime) {
        let secs = report.duration.as_secs_f64();
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        for f in IpFamily::ALL {
            let family = ip_family(f);
            self.sync_duration.get_or_create(&family).observe(secs);
            match report.kind {
                SyncKind::Full => &self.full_sync_duration,
                SyncKind::Partial => &self.partial_sync_duration,
            }
            .get_or_create(&family)
            .observe(secs);
            self.last_sync
                .get_or_create(&family)
                .set(unix.as_secs_f64());
            let (internal, external) = no_local_endpoints(state, f);
            for (policy, n) in [("internal", internal), ("external", external)] {
                let mut labels = vec![("traffic_policy", policy.to_string())];
                labels.extend(family.clone());
                self.no_local_endpoints.get_or_create(&labels).set(n as i64);
            }
        }
        self.service_changes_pending.set(0);
        self.endpoint_changes_pending.set(0);
        if report.committed.bytes > 0 {
            self.transaction_bytes
                .observe(report.committed.bytes as f64);
        }
    }

    /// A change arrived that the next sync must program.
    pub fn queued(&self, now: SystemTime) {
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        for f in IpFamily::ALL {
            self.last_queued
                .get_or_create(&ip_family(f))
                .set(unix.as_secs_f64());
        }
    }

    /// Network programming latency of EndpointSlice changes of each family
    /// triggered at the times given, programmed `now`.
    pub fn programmed(&self, triggers: &[(IpFamily, SystemTime)], now: SystemTime) {
        for (f, t) in triggers {
            let latency = now.duration_since(*t).unwrap_or(Duration::ZERO);
            self.programming_latency
                .get_or_create(&ip_family(*f))
                .observe(latency.as_secs_f64());
        }
    }

    /// A run of the stale UDP flow cleanup: how long it took, and the flows it
    /// deleted in each family.
    pub fn conntrack_reconciled(&self, took: Duration, deleted: &[(IpFamily, usize)]) {
        for f in IpFamily::ALL {
            self.conntrack_duration
                .get_or_create(&ip_family(f))
                .observe(took.as_secs_f64());
        }
        for (f, n) in deleted {
            self.conntrack_deleted
                .get_or_create(&ip_family(*f))
                .inc_by(*n as u64);
        }
    }

    /// An answer of the health server: `/healthz` or `/livez`, with its status.
    pub fn health_answered(&self, path: &str, status: u16) {
        let counter = match path {
            "/healthz" => &self.healthz,
            "/livez" => &self.livez,
            _ => return,
        };
        counter
            .get_or_create(&vec![("code", status.to_string())])
            .inc();
    }

    /// A full sync requested because of drift, by cause.
    pub fn drift_seen(&self, change: Change) {
        self.drift_repair(match change {
            Change::Foreign { .. } => "foreign_transaction",
            Change::Lost => "notifications_lost",
        });
    }

    /// Drift no notification told of, found by the periodic verification.
    pub fn drift_found_by_verification(&self) {
        self.drift_repair("verification");
    }

    fn drift_repair(&self, cause: &str) {
        self.drift_repairs
            .get_or_create(&vec![("cause", cause.into())])
            .inc();
    }

    pub fn sync_failed(&self) {
        for f in IpFamily::ALL {
            self.sync_failures.get_or_create(&ip_family(f)).inc();
        }
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

/// Service ports of one family whose traffic policy is Local and which have
/// endpoints, but none on this node (kube-proxy's count: the traffic that
/// policy covers is dropped here, not rejected), by policy.
fn no_local_endpoints(state: &ClusterState, family: IpFamily) -> (usize, usize) {
    let node = state.node.as_ref();
    let (mut internal, mut external) = (0, 0);
    let local_policy = state.services.values().filter(|s| s.uses_local_endpoints());
    for svc in local_policy.filter(|s| s.cluster_ip_of(family).is_some()) {
        for port in &svc.ports {
            let eps = port_endpoints(state, svc, port, family);
            let chosen = categorize(svc, &eps, node);
            if !chosen.has_any || !chosen.local.is_empty() {
                continue;
            }
            internal += usize::from(svc.internal_policy_local);
            external += usize::from(svc.external_policy_local);
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

    /// Every kube-proxy metric that applies, under its name and with its
    /// labels, once a sync, a queued change, a health answer and a conntrack
    /// cleanup have happened.
    #[test]
    fn kube_proxy_names_carry_its_labels() {
        use crate::testbed::synthetic::{node_config, state};
        let m = Metrics::new();
        let mut st = state(3, 6);
        // Service 1: externalTrafficPolicy Local on a NodePort, its endpoints on other nodes.
        let key = crate::testbed::synthetic::service_key(1);
        let svc = st.service_mut(&key).unwrap();
        svc.ports[0].node_port = Some(30001);
        svc.external_policy_local = true;
        let _ = node_config();
        let report = SyncReport {
            kind: SyncKind::Full,
            services: 3,
            recomputed: Vec::new(),
            committed: Default::default(),
            written: Vec::new(),
            duration: Duration::from_millis(3),
        };
        let now = SystemTime::now();
        m.queued(now);
        m.sync_succeeded(&report, &st, now);
        m.programmed(&[(IpFamily::Ip, now - Duration::from_secs(2))], now);
        m.conntrack_reconciled(
            Duration::from_millis(1),
            &[(IpFamily::Ip, 2), (IpFamily::Ip6, 0)],
        );
        m.health_answered("/healthz", 503);
        m.health_answered("/livez", 200);
        let text = m.render();
        for sample in [
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}",
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.0\",ip_family=\"IPv4\"} 0",
            "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\",ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\",ip_family=\"IPv4\"} 0",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\",ip_family=\"IPv6\"} 0",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 0",
            "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
            "kubeproxy_proxy_livez_total{code=\"200\"} 1",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv6\"} 1",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 2",
        ] {
            assert!(text.contains(sample), "no {sample} in\n{text}");
        }
    }
}
