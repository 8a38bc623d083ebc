//! client-go's request metrics for the API client (`rest_client_requests_total`
//! and `rest_client_request_duration_seconds`, kube-proxy's names, labels and
//! buckets), counted by a tower layer on kube's client. What a dashboard of
//! API server load reads per client: each list, watch and relist is one
//! request, by method and HTTP status (`<error>` for a request that got none),
//! and its latency to the response's headers (a watch's first byte).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// client-go's `rest_client_request_duration_seconds` buckets.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// What the layer has counted since the process started.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Requests {
    /// (code, host, method) → requests.
    pub counts: BTreeMap<(String, String, String), u64>,
    /// (host, verb) → (requests per bucket of `DURATION_BUCKETS` and a last
    /// one above them, not cumulated; the sum of seconds).
    pub durations: BTreeMap<(String, String), (Vec<u64>, f64)>,
}

static REQUESTS: Mutex<Option<Requests>> = Mutex::new(None);

/// A copy of what has been counted (read at each scrape).
pub fn snapshot() -> Requests {
    REQUESTS.lock().unwrap().clone().unwrap_or_default()
}

fn record(host: &str, method: &str, code: &str, took: Duration) {
    let mut guard = REQUESTS.lock().unwrap();
    let r = guard.get_or_insert_with(Requests::default);
    *r.counts
        .entry((code.to_string(), host.to_string(), method.to_string()))
        .or_default() += 1;
    let (buckets, sum) = r
        .durations
        .entry((host.to_string(), method.to_string()))
        .or_insert_with(|| (vec![0; DURATION_BUCKETS.len() + 1], 0.0));
    let secs = took.as_secs_f64();
    let bucket = DURATION_BUCKETS
        .iter()
        .position(|bound| secs <= *bound)
        .unwrap_or(DURATION_BUCKETS.len());
    buckets[bucket] += 1;
    *sum += secs;
}

/// The layer: every request through the client is counted under `host`, the
/// API server's `host:port` as client-go labels it.
#[derive(Clone)]
pub struct CountRequests {
    pub host: String,
}

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            host: self.host.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    host: String,
}

impl<S, B, R> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().as_str().to_string();
        let host = self.host.clone();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = match &answer {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            record(&host, &method, &code, started.elapsed());
            answer
        })
    }
}

/// client-go's host label: the server's `host:port`.
pub fn host_label(url: &http::Uri) -> String {
    let host = url.host().unwrap_or_default();
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    format!("{host}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_label_is_host_and_port() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert_eq!(host_label(&uri("https://10.96.0.1")), "10.96.0.1:443");
        assert_eq!(
            host_label(&uri("https://api.example:6443")),
            "api.example:6443"
        );
        assert_eq!(host_label(&uri("http://127.0.0.1:8080/")), "127.0.0.1:8080");
    }
}
