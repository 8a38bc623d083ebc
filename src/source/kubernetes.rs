//! The API server source: list-then-watch of Services, EndpointSlices, this node's
//! Node and ServiceCIDRs with kube-rs watchers, forwarded as `Update`s.
//!
//! The watchers resume a dropped watch from the last resourceVersion seen, relist
//! after a 410 Gone, and back off (up to a few seconds apart) while the API server
//! is unreachable. Nothing here touches the rules: while the source is down, the
//! proxy keeps serving what it has.

use super::{list_watch, protobuf, store, Delta, Update};
use crate::core::model::{HEADLESS_LABEL, SERVICE_PROXY_NAME_LABEL};
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Api, Config};
use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

/// How to reach the API server, as kube-proxy's `--kubeconfig` and `--master`.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    pub kubeconfig: Option<PathBuf>,
    /// Overrides the kubeconfig's server (or, alone, is the server, unauthenticated).
    pub master: Option<String>,
}

/// The client config, chosen as kube-proxy chooses it: `--kubeconfig` (with
/// `--master` overriding its server), else `--master` alone, else the pod's
/// in-cluster config. Never `$KUBECONFIG` or `~/.kube/config`, which kubectl
/// reads: on a node they are often an administrator's, and a proxy that took
/// them would watch as that user, or whatever cluster they name.
pub async fn client_config(conn: &Connection) -> Result<Config, String> {
    let master = conn
        .master
        .as_deref()
        .map(|m| {
            m.parse()
                .map_err(|e| format!("--master {m:?} is not a URL: {e}"))
        })
        .transpose()?;
    let mut config = match (&conn.kubeconfig, master.clone()) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
        }
        (None, Some(url)) => Config::new(url),
        (None, None) => Config::incluster()
            .map_err(|e| format!("no --kubeconfig or --master, and no in-cluster config: {e}"))?,
    };
    if let Some(url) = master {
        config.cluster_url = url;
    }
    Ok(config)
}

/// Starts watching on threads of its own; every change goes to `tx`. Fails at
/// once only when the client cannot be configured (a bad kubeconfig or URL).
///
/// The EndpointSlices have a thread to themselves, so that the two kinds'
/// initial states are decoded and converted side by side rather than in turn
/// (at 100k, the listing took 0.88 of the time, on two cores shared with the
/// API server: docs/BENCHMARKS.md). Each thread has its own runtime and
/// client (HTTP/1.1: a connection per watch either way), and a full queue
/// holds only its own watches, on purpose: a list waits for the store.
pub fn spawn<T: From<Update> + Send + 'static>(
    conn: &Connection,
    node_name: &str,
    tx: SyncSender<T>,
) -> Result<(), String> {
    let runtime = watch_runtime()?;
    let config = runtime.block_on(client_config(conn))?;
    let client = client_in(&runtime, config.clone())?;
    let slices_runtime = watch_runtime()?;
    let slices_client = client_in(&slices_runtime, config)?;
    let (streaming_tx, streaming_rx) = std::sync::mpsc::channel();
    let node_fields = format!("metadata.name={node_name}");
    let slices_tx = tx.clone();
    std::thread::Builder::new()
        .name("api-watch".into())
        .spawn(move || {
            runtime.block_on(async move {
                let fields = watcher::Config::default();
                let proxied = fields.clone().labels(&proxied_selector());
                let stream_lists = stream_lists() && knows_watch_list(&client).await;
                let _ = streaming_tx.send(stream_lists);
                tokio::join!(
                    forward(
                        list_watch::watcher::<core::Service>(
                            client.clone(),
                            proxied,
                            protobuf::service,
                            stream_lists,
                        ),
                        "Services",
                        store::service_update,
                        tx.clone(),
                    ),
                    forward(
                        watcher(
                            Api::<core::Node>::all(client.clone()),
                            fields.clone().fields(&node_fields),
                        ),
                        "Node",
                        Update::Node,
                        tx.clone(),
                    ),
                    forward(
                        watcher(Api::<ServiceCIDR>::all(client), fields),
                        "ServiceCIDRs",
                        Update::ServiceCidr,
                        tx,
                    ),
                );
            })
        })
        .map_err(|e| format!("starting the watch thread: {e}"))?;
    std::thread::Builder::new()
        .name("api-watch-slices".into())
        .spawn(move || {
            // Asked once, by the other thread (`/version`).
            let Ok(stream_lists) = streaming_rx.recv() else {
                return;
            };
            let proxied = watcher::Config::default().labels(&proxied_selector());
            slices_runtime.block_on(forward(
                list_watch::watcher::<discovery::EndpointSlice>(
                    slices_client,
                    proxied,
                    protobuf::endpoint_slice,
                    stream_lists,
                ),
                "EndpointSlices",
                store::slice_update,
                slices_tx,
            ));
        })
        .map_err(|e| format!("starting the watch thread: {e}"))?;
    Ok(())
}

/// The runtime of one watch thread.
fn watch_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the API client: {e}"))
}

/// A client made in `runtime`: it spawns its request buffer on the runtime it
/// is made in, and that runtime then drives its connections.
fn client_in(runtime: &tokio::runtime::Runtime, config: Config) -> Result<kube::Client, String> {
    let _in_runtime = runtime.enter();
    let counted = super::api_metrics::CountRequests {
        host: super::api_metrics::host_label(&config.cluster_url),
    };
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(|e| format!("API client: {e}"))?
        .with_layer(&counted)
        .build())
}

/// Whether to stream the initial state of Services and EndpointSlices: yes,
/// unless `KUBE_FEATURE_WatchListClient` says false, the switch client-go
/// reads (kube-proxy's, for the same feature).
fn stream_lists() -> bool {
    let value = std::env::var("KUBE_FEATURE_WatchListClient").ok();
    let on = value
        .as_deref()
        .is_none_or(|v| !v.eq_ignore_ascii_case("false"));
    if !on {
        tracing::info!("KUBE_FEATURE_WatchListClient=false: listing Services and EndpointSlices");
    }
    on
}

/// Whether the API server knows `sendInitialEvents` (1.27 and later): one
/// before it would ignore the parameter and never send the closing bookmark,
/// and the stream would be waited on until the watch's timeout. One not yet
/// reachable, or silent for 5 s (the client has no read timeout), is taken to
/// know it; one that knows it but has it off refuses it, which `list_watch`
/// handles.
async fn knows_watch_list(client: &kube::Client) -> bool {
    let asked = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version());
    let Ok(Ok(info)) = asked.await else {
        return true;
    };
    let minor = info.minor.trim_end_matches('+').parse::<u32>();
    let knows = info.major != "1" || minor.map_or(true, |m| m >= 27);
    if !knows {
        tracing::info!(
            "the API server is {}.{}, older than 1.27: listing Services and EndpointSlices",
            info.major,
            info.minor
        );
    }
    knows
}

/// kube-proxy's informers' label selector, for Services and EndpointSlices
/// alike: the API server leaves out another proxy's objects and headless ones,
/// rather than sending each for us to drop, in every list and watch event and
/// on every node. An object that gains
/// either label leaves the selection, and the watch reports it deleted.
/// `convert` still skips both, for manifests.
fn proxied_selector() -> String {
    format!("!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}")
}

fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

/// Forwards one watcher's events as they come. A full queue blocks the watch
/// thread, on purpose: the list waits for the store (no other task there needs
/// to run meanwhile). Returns when the receiver is gone, or when the API server has no such kind (an old
/// cluster without ServiceCIDRs): that kind is then reported as an empty list.
async fn forward<K: Send + 'static, T: From<Update>>(
    events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    kind: &'static str,
    wrap: fn(Delta<K>) -> Update,
    tx: SyncSender<T>,
) {
    futures_util::pin_mut!(events);
    // client-go's reflector backoff (800 ms doubling to 30 s, with jitter),
    // reset by progress: an object, or a list done. Not by `Init`, which the
    // watcher sends before every list attempt, failed ones included.
    let mut backoff = watcher::DefaultBackoff::default();
    let mut failing = false;
    while let Some(event) = events.next().await {
        let progress = matches!(
            event,
            Ok(Event::InitApply(_) | Event::InitDone | Event::Apply(_) | Event::Delete(_))
        );
        // A list goes out object by object as its pages arrive: converted and
        // dropped by the store at once, never held whole.
        let delta = match event {
            Ok(Event::Init) => Delta::ListStarted,
            Ok(Event::InitApply(obj)) => Delta::Listing(Box::new(obj)),
            Ok(Event::InitDone) => Delta::Listed,
            Ok(Event::Apply(obj)) => {
                tracing::debug!(kind, "watch: applied");
                Delta::Applied(Box::new(obj))
            }
            Ok(Event::Delete(obj)) => {
                tracing::debug!(kind, "watch: deleted");
                Delta::Deleted(Box::new(obj))
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if status.is_not_found() =>
            {
                tracing::info!("the API server has no {kind}; not watching them");
                let _ = tx.send(wrap(Delta::ListStarted).into());
                let _ = tx.send(wrap(Delta::Listed).into());
                return;
            }
            // An answering server saying the watch cannot resume: the watcher
            // relists at once. Waiting first would add a second backoff, up to
            // a minute, to an outage's end. What the relist costs is told by the
            // sync that follows, if any.
            Err(e) if is_gone(&e) => {
                tracing::info!(
                    "relisting {kind}: the watch could not resume from where it was (410 Gone)"
                );
                continue;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("watching {kind}: {e}; retrying with backoff, rules unchanged");
                }
                failing = true;
                if let Some(delay) = backoff.next() {
                    tokio::time::sleep(delay).await;
                }
                continue;
            }
        };
        if progress {
            backoff.reset();
            if failing {
                tracing::info!("watching {kind} again");
                failing = false;
            }
        }
        if tx.send(wrap(delta).into()).is_err() {
            return;
        }
    }
}
