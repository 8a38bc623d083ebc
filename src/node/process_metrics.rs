//! The metrics of the process rather than of the proxy, computed at each
//! scrape: the process metrics every Prometheus client serves (client_golang's
//! process collector, which kube-proxy serves), read from /proc on each
//! scrape: the kubernetes-mixin Proxy dashboard and common alerts read
//! `process_resident_memory_bytes`, `process_cpu_seconds_total`,
//! `process_start_time_seconds` and `process_open_fds`; and the API client's
//! requests as client-go's `rest_client_*` count them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// USER_HZ, the unit of /proc's CPU times: 100 on every Linux architecture
/// (the kernel fixes it for user space whatever its own HZ).
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What /proc says of this process now; a field it cannot read is left out.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    /// The CPU time of its children that it has waited for: not a metric of
    /// client_golang's, but the benches count it (kube-proxy's nftables mode
    /// runs `nft` for each sync, and that is where its syncs' work is done).
    pub children_cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub resident_memory_bytes: Option<f64>,
    pub virtual_memory_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

impl ProcessStats {
    pub fn read() -> ProcessStats {
        ProcessStats::of("self")
    }

    /// The same of process `pid` (a number, or `self`): the benches read their
    /// children's and the API server's.
    pub fn of(pid: &str) -> ProcessStats {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command, which may hold spaces and parentheses.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // stat(5) numbers fields from 1, the command being 2: field n is fields[n - 3].
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|t| t.trim().parse::<f64>().ok())
        });
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
        let max_fds = std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .ok()
            .and_then(|limits| {
                let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
                line["Max open files".len()..]
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            });
        ProcessStats {
            cpu_seconds: field(14)
                .zip(field(15))
                .map(|(user, system)| (user + system) / TICKS_PER_SECOND),
            children_cpu_seconds: field(16)
                .zip(field(17))
                .map(|(user, system)| (user + system) / TICKS_PER_SECOND),
            start_time_seconds: field(22)
                .zip(boot_time)
                .map(|(ticks, boot)| boot + ticks / TICKS_PER_SECOND),
            resident_memory_bytes: rss_kib.map(|k| k * 1024.0),
            virtual_memory_bytes: field(23),
            open_fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
                .ok()
                .map(|d| d.count() as f64),
            max_fds,
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        if let Some(cpu) = s.cpu_seconds {
            let counter = ConstCounter::new(cpu);
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                counter.metric_type(),
            )?;
            counter.encode(m)?;
        }
        let gauges = [
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time_seconds,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_memory_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                s.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let gauge = ConstGauge::new(v);
                let m = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
                gauge.encode(m)?;
            }
        }
        Ok(())
    }
}

/// The API client's requests (`source::api_metrics`), under client-go's names.
#[derive(Debug, Default)]
pub struct ApiRequestCollector;

/// A histogram as counted elsewhere: buckets not cumulated, the last one +Inf.
struct CountedHistogram<'a> {
    bounds: &'a [f64],
    buckets: &'a [u64],
    sum: f64,
}

impl EncodeMetric for CountedHistogram<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.buckets.iter().copied())
            .collect();
        let count = self.buckets.iter().sum();
        encoder.encode_histogram::<Vec<(String, String)>>(self.sum, count, &buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

impl Collector for ApiRequestCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::source::api_metrics::{snapshot, DURATION_BUCKETS};
        let requests = snapshot();
        if requests.counts.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ((code, host, method), n) in &requests.counts {
            let labels = [
                ("code", code.as_str()),
                ("host", host.as_str()),
                ("method", method.as_str()),
            ];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        for ((host, verb), (buckets, sum)) in &requests.durations {
            let labels = [("host", host.as_str()), ("verb", verb.as_str())];
            CountedHistogram {
                bounds: &DURATION_BUCKETS,
                buckets,
                sum: *sum,
            }
            .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures are this process's: its RSS against VmHWM's order, its
    /// start within the last hour (a test run), its descriptors counted.
    #[test]
    fn the_process_figures_are_this_process_s() {
        let before = ProcessStats::read();
        let files: Vec<std::fs::File> = (0..8)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        // Burn some CPU so that the counter moves.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(150) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = ProcessStats::read();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = after.start_time_seconds.unwrap();
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
        assert!(after.cpu_seconds.unwrap() >= before.cpu_seconds.unwrap() + 0.1);
        assert!(after.open_fds.unwrap() >= before.open_fds.unwrap() + 8.0);
        let rss = after.resident_memory_bytes.unwrap();
        let peak = crate::node::metrics::peak_rss_kib() as f64 * 1024.0;
        assert!(rss > 1e6 && rss <= peak, "{rss} vs peak {peak}");
        assert!(after.virtual_memory_bytes.unwrap() >= rss);
        assert!(after.max_fds.unwrap() >= after.open_fds.unwrap());
        drop(files);
    }
}
