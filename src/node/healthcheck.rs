//! The per-Service health checks load balancers use with
//! `externalTrafficPolicy: Local`: an HTTP server on each `healthCheckNodePort`
//! answering 200 while this node has ready endpoints for the Service, and 503
//! (so the load balancer stops sending) when it has none. The JSON body and
//! headers are kube-proxy's.

use crate::core::model::{ClusterState, ServiceKey};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceHealth {
    pub service: ServiceKey,
    pub local_endpoints: usize,
}

/// The health-check ports this node must serve, from the model: every Service
/// with a `healthCheckNodePort`, with its ready endpoints on this node.
pub fn wanted(state: &ClusterState) -> BTreeMap<u16, ServiceHealth> {
    let node = state.node.as_ref();
    let mut out = BTreeMap::new();
    for svc in state.services.values() {
        let Some(port) = svc.health_check_node_port else {
            continue;
        };
        let mut local: Vec<_> = svc
            .ports
            .iter()
            .flat_map(|p| state.endpoints_for(svc, p))
            .filter(|e| e.conditions.ready && e.is_on(node))
            .map(|e| e.addr)
            .collect();
        local.sort();
        local.dedup();
        out.insert(
            port,
            ServiceHealth {
                service: svc.key.clone(),
                local_endpoints: local.len(),
            },
        );
    }
    out
}

/// kube-proxy's answer: status, headers and body.
pub fn response(health: &ServiceHealth, proxy_healthy: bool) -> String {
    let n = health.local_endpoints;
    let status = if n > 0 && proxy_healthy {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {n},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        health.service.namespace, health.service.name
    );
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {n}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[derive(Default)]
struct Shared {
    ports: BTreeMap<u16, ServiceHealth>,
    proxy_healthy: bool,
}

/// The servers, run by one thread that opens and closes listeners as the wanted
/// ports change (a Service's port appears when it is created, goes when it is deleted).
pub struct HealthServers {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const TICK: Duration = Duration::from_millis(100);

impl HealthServers {
    pub fn start() -> HealthServers {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (shared.clone(), stop.clone());
        let thread = std::thread::spawn(move || serve(&s, &st));
        HealthServers {
            shared,
            stop,
            thread: Some(thread),
        }
    }

    /// Publishes the ports and counts after a sync (`proxy_healthy`: it succeeded).
    pub fn update(&self, ports: BTreeMap<u16, ServiceHealth>, proxy_healthy: bool) {
        let mut s = self.shared.lock().unwrap();
        s.ports = ports;
        s.proxy_healthy = proxy_healthy;
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn listen(port: u16) -> io::Result<TcpListener> {
    // One dual-stack socket where IPv6 exists, else IPv4 only.
    let l = TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

fn serve(shared: &Mutex<Shared>, stop: &AtomicBool) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut listeners: BTreeMap<u16, TcpListener> = BTreeMap::new();
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    while !stop.load(Ordering::Relaxed) {
        let wanted: Vec<u16> = shared.lock().unwrap().ports.keys().copied().collect();
        listeners.retain(|p, _| wanted.contains(p));
        for p in wanted {
            if let std::collections::btree_map::Entry::Vacant(v) = listeners.entry(p) {
                match listen(p) {
                    Ok(l) => {
                        v.insert(l);
                    }
                    Err(e) => tracing::warn!("health check port {p}: {e}"),
                }
            }
        }
        let ports: Vec<u16> = listeners.keys().copied().collect();
        let mut fds: Vec<PollFd> = listeners
            .values()
            .map(|l| PollFd::new(l, PollFlags::IN))
            .collect();
        if fds.is_empty() {
            std::thread::sleep(TICK);
            continue;
        }
        if !matches!(poll(&mut fds, Some(&tick)), Ok(n) if n > 0) {
            continue;
        }
        let ready: Vec<u16> = fds
            .iter()
            .zip(&ports)
            .filter(|(f, _)| f.revents().contains(PollFlags::IN))
            .map(|(_, p)| *p)
            .collect();
        drop(fds);
        for p in ready {
            while let Ok((conn, _)) = listeners[&p].accept() {
                let answer = {
                    let s = shared.lock().unwrap();
                    s.ports.get(&p).map(|h| response(h, s.proxy_healthy))
                };
                if let Some(answer) = answer {
                    std::thread::spawn(move || answer_once(conn, &answer));
                }
            }
        }
    }
}

fn answer_once(mut conn: TcpStream, answer: &str) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    crate::node::http::read_request_head(&mut conn, 8192);
    let _ = conn.write_all(answer.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_like_kube_proxy() {
        let h = ServiceHealth {
            service: ServiceKey {
                namespace: "default".into(),
                name: "web".into(),
            },
            local_endpoints: 2,
        };
        let r = response(&h, true);
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(r.contains("X-Load-Balancing-Endpoint-Weight: 2\r\n"));
        let body = r.split_once("\r\n\r\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["service"]["name"], "web");
        assert_eq!(v["localEndpoints"], 2);
        assert_eq!(v["serviceProxyHealthy"], true);
        let none = ServiceHealth {
            local_endpoints: 0,
            ..h
        };
        assert!(response(&none, true).starts_with("HTTP/1.1 503 "));
    }
}
