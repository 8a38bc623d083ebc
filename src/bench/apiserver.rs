//! A Kubernetes API server on loopback, for the daemon to list and watch: the
//! API tests' and the API-path benchmark's. It speaks JSON only, as a server
//! that cannot speak protobuf would, so the daemon reads its lists with its
//! JSON fallback; the protobuf lists are read from real kube-apiservers (the
//! cluster tests, and the recorded `protobuf/` fixtures). It speaks the wire
//! protocol kube-rs expects (JSON lists with resourceVersion and `limit`/`continue` paging,
//! chunked watch streams of ADDED, MODIFIED, DELETED and BOOKMARK events, a 410
//! Gone error event). The tests start it from the responses recorded from a real
//! kube-apiserver (`integration/fixtures/kube-apiserver/`, a copy of the
//! project's `k8s-fixtures`) and replay recorded watch streams byte for byte;
//! they can also create, change and delete objects, drop every watch, and expire
//! old resourceVersions. The benchmark starts it with synthetic objects.
//!
//! It stays a fake for what a real API server cannot be made to do on demand
//! here: replay a recorded stream, drop watches, expire history at a chosen
//! moment, go down and come back. It does not stream initial states
//! (`sendInitialEvents`): it refuses them as a kube-apiserver with the WatchList
//! feature off does, so that the daemon lists; the streams are read from real
//! kube-apiservers.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("integration/fixtures/kube-apiserver")
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The kinds a service proxy watches, with their list paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Service,
    Slice,
    Node,
    ServiceCidr,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Service, Kind::Slice, Kind::Node, Kind::ServiceCidr];

    fn path(self) -> &'static str {
        match self {
            Kind::Service => "/api/v1/services",
            Kind::Slice => "/apis/discovery.k8s.io/v1/endpointslices",
            Kind::Node => "/api/v1/nodes",
            Kind::ServiceCidr => "/apis/networking.k8s.io/v1/servicecidrs",
        }
    }

    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Kind::Service => ("ServiceList", "v1"),
            Kind::Slice => ("EndpointSliceList", "discovery.k8s.io/v1"),
            Kind::Node => ("NodeList", "v1"),
            Kind::ServiceCidr => ("ServiceCIDRList", "networking.k8s.io/v1"),
        }
    }
}

type Key = (String, String);

fn key_of(obj: &Value) -> Key {
    let m = &obj["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str().unwrap_or_default().to_string(),
    )
}

#[derive(Default)]
struct State {
    resource_version: u64,
    objects: BTreeMap<Kind, BTreeMap<Key, Value>>,
    /// Every event since the start: (resourceVersion, kind, the line sent).
    history: Vec<(u64, Kind, String)>,
    /// Watches from before this resourceVersion get 410 Gone.
    expired_before: u64,
    /// Open watch connections, to drop them.
    watches: Vec<TcpStream>,
    /// Request lines, in order.
    requests: Vec<String>,
    /// Down: every connection is closed unanswered.
    down: bool,
    /// Pages of at most this many objects, even where the request set no
    /// limit (as a server may).
    page_size: Option<usize>,
}

impl State {
    /// A change made through this server: the next resourceVersion, stamped on the
    /// object, and the event in the history that watches send. Returns the object.
    fn record(&mut self, kind: Kind, verb: &str, mut obj: Value) -> Value {
        self.resource_version += 1;
        let rv = self.resource_version;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let line = json!({"type": verb, "object": obj}).to_string();
        self.history.push((rv, kind, line));
        obj
    }
}

pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl ApiServer {
    /// Serves, from a listener bound inside `netns` (so that the daemon there
    /// reaches it on its own loopback), the recorded lists and Node.
    pub fn start_in(netns: &str) -> ApiServer {
        let mut state = State::default();
        for (kind, file) in [
            (Kind::Service, "list-services.json"),
            (Kind::Slice, "list-endpointslices.json"),
            (Kind::ServiceCidr, "list-servicecidrs.json"),
        ] {
            let list: Value = serde_json::from_str(&fixture(file)).unwrap();
            let rv: u64 = list["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            state.resource_version = state.resource_version.max(rv);
            let objects = state.objects.entry(kind).or_default();
            for item in list["items"].as_array().unwrap() {
                objects.insert(key_of(item), item.clone());
            }
        }
        let node: Value = serde_json::from_str(&fixture("node-node1.json")).unwrap();
        state
            .objects
            .entry(Kind::Node)
            .or_default()
            .insert(key_of(&node), node);
        ApiServer::serve_in(netns, state).unwrap()
    }

    /// Serves these objects from inside `netns`, at resourceVersion 1.
    pub fn serving_in(netns: &str, objects: Vec<(Kind, Value)>) -> std::io::Result<ApiServer> {
        let mut state = State {
            resource_version: 1,
            ..State::default()
        };
        for (kind, obj) in objects {
            state
                .objects
                .entry(kind)
                .or_default()
                .insert(key_of(&obj), obj);
        }
        ApiServer::serve_in(netns, state)
    }

    fn serve_in(netns: &str, state: State) -> std::io::Result<ApiServer> {
        let listener =
            crate::testbed::netns::in_netns(netns, || TcpListener::bind("127.0.0.1:0"))??;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(state));
        // The listener holds the objects weakly: dropped with the server, they
        // are freed once its open streams end (100k Services × 10 as JSON values
        // are gigabytes; a benchmark starts several servers).
        let shared = Arc::downgrade(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let Some(s) = shared.upgrade() else { return };
                std::thread::spawn(move || handle(conn, &s));
            }
        });
        Ok(ApiServer { addr, state })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn resource_version(&self) -> u64 {
        self.state.lock().unwrap().resource_version
    }

    /// Replays a recorded watch stream (`watch-services.jsonl`, …): each event
    /// changes the objects and goes, as recorded, to every open watch.
    pub fn replay(&self, file: &str) {
        let kind = if file.contains("endpointslices") {
            Kind::Slice
        } else {
            Kind::Service
        };
        for line in fixture(file).lines().filter(|l| !l.trim().is_empty()) {
            let event: Value = serde_json::from_str(line).unwrap();
            let obj = &event["object"];
            let rv: u64 = obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let mut s = self.state.lock().unwrap();
            let objects = s.objects.entry(kind).or_default();
            match event["type"].as_str().unwrap() {
                "ADDED" | "MODIFIED" => {
                    objects.insert(key_of(obj), obj.clone());
                }
                "DELETED" => {
                    objects.remove(&key_of(obj));
                }
                _ => {}
            }
            s.resource_version = s.resource_version.max(rv);
            s.history.push((rv, kind, line.to_string()));
        }
    }

    /// Creates or replaces an object (given as YAML or JSON), as a client would.
    pub fn apply(&self, kind: Kind, manifest: &str) {
        let obj: Value = serde_saphyr::from_str(manifest).unwrap();
        let mut s = self.state.lock().unwrap();
        let objects = s.objects.entry(kind).or_default();
        let verb = if objects.contains_key(&key_of(&obj)) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let obj = s.record(kind, verb, obj);
        s.objects.entry(kind).or_default().insert(key_of(&obj), obj);
    }

    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut s = self.state.lock().unwrap();
        let key = (namespace.to_string(), name.to_string());
        let obj = s
            .objects
            .entry(kind)
            .or_default()
            .remove(&key)
            .expect("deleting an object that exists");
        s.record(kind, "DELETED", obj);
    }

    /// Closes every open watch, as an API server restart or a load balancer would.
    pub fn drop_watches(&self) {
        for w in self.state.lock().unwrap().watches.drain(..) {
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    /// Forgets history (as etcd compaction does): a watch resuming from any
    /// resourceVersion before now gets 410 Gone and must relist. Drops the watches.
    pub fn expire_history(&self) {
        {
            let mut s = self.state.lock().unwrap();
            s.resource_version += 1;
            s.expired_before = s.resource_version;
        }
        self.drop_watches();
    }

    /// Goes down (every connection closed unanswered, watches dropped) or comes back.
    pub fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
        if down {
            self.drop_watches();
        }
    }

    /// Answers every list in pages of at most `n` objects, asked for or not.
    pub fn page_by(&self, n: usize) {
        self.state.lock().unwrap().page_size = Some(n);
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    /// How many watches are open now.
    pub fn open_watches(&self) -> usize {
        self.state.lock().unwrap().watches.len()
    }
}

fn query(target: &str) -> (String, BTreeMap<String, String>) {
    let (path, q) = target.split_once('?').unwrap_or((target, ""));
    let params = q
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.replace("%3D", "=").replace("%3d", "=")))
        .collect();
    (path.to_string(), params)
}

fn handle(conn: TcpStream, state: &Mutex<State>) {
    if state.lock().unwrap().down {
        return;
    }
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // The rest of the head: nothing in it changes the answer.
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    state.lock().unwrap().requests.push(target.clone());
    let (path, params) = query(&target);
    let Some(kind) = Kind::ALL.into_iter().find(|k| k.path() == path) else {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("the server could not find the requested resource ({path})"),
            "reason": "NotFound", "code": 404});
        return respond(conn, "404 Not Found", &status.to_string());
    };
    let watching = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    if watching && params.contains_key("sendInitialEvents") {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "reason": "Invalid", "code": 422});
        return respond(conn, "422 Unprocessable Entity", &status.to_string());
    }
    if watching {
        watch(conn, state, kind, &params)
    } else {
        list(conn, state, kind, &params)
    }
}

fn respond(mut conn: TcpStream, status: &str, body: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn field_selector_matches(obj: &Value, params: &BTreeMap<String, String>) -> bool {
    match params
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
    {
        Some(name) => obj["metadata"]["name"] == name,
        None => true,
    }
}

/// A list, paged by `limit` (or the server's own page size) with an opaque
/// `continue` (the offset).
fn list(conn: TcpStream, state: &Mutex<State>, kind: Kind, params: &BTreeMap<String, String>) {
    let s = state.lock().unwrap();
    let all: Vec<&Value> = s
        .objects
        .get(&kind)
        .map(|o| o.values().collect())
        .unwrap_or_default();
    let all: Vec<&Value> = all
        .into_iter()
        .filter(|o| field_selector_matches(o, params))
        .collect();
    let start: usize = params
        .get("continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let limit: usize = params
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX)
        .min(s.page_size.unwrap_or(usize::MAX));
    let end = start.saturating_add(limit).min(all.len());
    let (list_kind, api_version) = kind.list_kind();
    let mut metadata = json!({"resourceVersion": s.resource_version.to_string()});
    if end < all.len() {
        metadata["continue"] = json!(end.to_string());
        metadata["remainingItemCount"] = json!(all.len() - end);
    }
    let body = json!({"kind": list_kind, "apiVersion": api_version, "metadata": metadata,
        "items": all[start.min(end)..end]});
    drop(s);
    respond(conn, "200 OK", &body.to_string());
}

fn chunk(conn: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let data = format!("{line}\n");
    write!(conn, "{:x}\r\n{data}\r\n", data.len())?;
    conn.flush()
}

/// A watch: history after `resourceVersion`, then events as they happen, until
/// the connection is dropped. From an expired resourceVersion: the recorded 410.
fn watch(mut conn: TcpStream, state: &Mutex<State>, kind: Kind, params: &BTreeMap<String, String>) {
    let from: u64 = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    if conn.write_all(head.as_bytes()).is_err() {
        return;
    }
    {
        let mut s = state.lock().unwrap();
        if from < s.expired_before {
            drop(s);
            let gone = fixture("watch-too-old.jsonl");
            let _ = chunk(&mut conn, gone.trim());
            let _ = conn.write_all(b"0\r\n\r\n");
            return;
        }
        s.watches.push(conn.try_clone().unwrap());
    }
    let mut sent = from;
    loop {
        let pending: Vec<(u64, String)> = {
            let s = state.lock().unwrap();
            s.history
                .iter()
                .filter(|(rv, k, _)| *k == kind && *rv > sent)
                .map(|(rv, _, l)| (*rv, l.clone()))
                .collect()
        };
        for (rv, line) in pending {
            if chunk(&mut conn, &line).is_err() {
                return;
            }
            sent = sent.max(rv);
        }
        // A dropped connection shows up as a failed write or a peek of 0/error.
        let mut probe = [0u8; 1];
        let _ = conn.set_read_timeout(Some(Duration::from_millis(20)));
        match conn.peek(&mut probe) {
            Ok(0) => return,
            Err(e)
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return
            }
            _ => {}
        }
    }
}
