//! List-then-watch for the two kinds that grow with the cluster, Services and
//! EndpointSlices: the list whole, in protobuf, read object by object as it
//! arrives (`super::protobuf::ListReader`); then a watch from the list's
//! resourceVersion, as kube-rs's watcher does it.
//!
//! Why not kube-rs's watcher, which lists in JSON pages of 500: at 100k
//! Services the API server spent 5.7 s of CPU on the 200 pages of Services
//! (each page walks its cache), and 0.4 s on the same list whole in protobuf
//! (docs/BENCHMARKS.md). A whole list in JSON would have to be held whole to be
//! decoded; in protobuf each object is read and handed on as soon as its bytes
//! are in. The watch stays JSON: its events come one object at a time, and
//! kube-rs resumes and decodes them. The events and errors are kube-rs's own,
//! so that `super::kubernetes::forward` treats this stream and kube-rs's alike.
//!
//! As client-go's reflector (kube-proxy's), the first list is served from the
//! API server's cache (resourceVersion 0); after a watch that could not resume
//! (410 Gone) the relist is a consistent one.

use super::protobuf::{self, ListReader};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::future::Future;

/// Decodes one object of a protobuf list.
pub type DecodeItem<K> = fn(&[u8]) -> Result<K, protobuf::DecodeError>;

/// Which list to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Since {
    /// Whatever the API server's cache holds (resourceVersion 0): the first list.
    Cache,
    /// The latest, read consistently: after the watch could not resume.
    Latest,
}

/// A list response being read.
enum Reading<K> {
    /// Protobuf, read as it arrives.
    Protobuf {
        body: kube::client::Body,
        reader: ListReader<K>,
    },
    /// JSON (from a server that will not speak protobuf), read whole.
    Json(VecDeque<K>),
}

/// The watcher's state between two events.
enum State<K> {
    /// Next: a list.
    Empty { since: Since },
    /// Listing: the response in hand (if any), then the next page while the
    /// list has a continue token, then `InitDone`.
    Paging(Listing<K>),
    /// Listed or caught up: next, a watch from here.
    Listed { resource_version: String },
    Watching {
        resource_version: String,
        stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
    },
}

/// A list under way.
struct Listing<K> {
    since: Since,
    reading: Option<Reading<K>>,
    continue_token: Option<String>,
    resource_version: Option<String>,
    /// Objects read so far, and in what encoding: for the log line at its end.
    objects: usize,
    encoding: &'static str,
}

/// The lister and watcher of one kind.
struct Kind<K> {
    client: Client,
    api: Api<K>,
    config: watcher::Config,
    decode: DecodeItem<K>,
}

type Step<K> = (Option<Result<Event<K>, watcher::Error>>, State<K>);

/// kube-rs's `watcher(Api::all(client), config)`, with the list read in protobuf.
pub fn watcher<K>(
    client: Client,
    config: watcher::Config,
    decode: DecodeItem<K>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let kind = Kind {
        api: Api::all(client.clone()),
        client,
        config,
        decode,
    };
    let first = State::Empty {
        since: Since::Cache,
    };
    futures_util::stream::unfold((kind, first), |(kind, mut state)| async move {
        loop {
            let (event, next) = step(&kind, state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (kind, state)));
            }
        }
    })
}

/// One step: maybe an event, and the state after it.
async fn step<K>(kind: &Kind<K>, state: State<K>) -> Step<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    match state {
        State::Empty { since } => (
            Some(Ok(Event::Init)),
            State::Paging(Listing {
                since,
                reading: None,
                continue_token: None,
                resource_version: None,
                objects: 0,
                encoding: "protobuf",
            }),
        ),
        State::Paging(listing) => page(kind, listing).await,
        State::Listed { resource_version } => {
            let params = WatchParams {
                label_selector: kind.config.label_selector.clone(),
                field_selector: kind.config.field_selector.clone(),
                timeout: kind.config.timeout,
                bookmarks: kind.config.bookmarks,
                send_initial_events: false,
            };
            match kind.api.watch(&params, &resource_version).await {
                Ok(stream) => (
                    None,
                    State::Watching {
                        resource_version,
                        stream: stream.boxed(),
                    },
                ),
                Err(e) => (
                    Some(Err(watcher::Error::WatchStartFailed(e))),
                    State::Listed { resource_version },
                ),
            }
        }
        State::Watching {
            resource_version,
            mut stream,
        } => {
            let watching = |resource_version, stream| State::Watching {
                resource_version,
                stream,
            };
            // An object's event moves the watch on to its resourceVersion.
            let seen = |obj: &K, resource_version| {
                obj.meta()
                    .resource_version
                    .clone()
                    .unwrap_or(resource_version)
            };
            match idle_limited(&kind.config, stream.next()).await.flatten() {
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    let rv = seen(&obj, resource_version);
                    (Some(Ok(Event::Apply(obj))), watching(rv, stream))
                }
                Some(Ok(WatchEvent::Deleted(obj))) => {
                    let rv = seen(&obj, resource_version);
                    (Some(Ok(Event::Delete(obj))), watching(rv, stream))
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    (None, watching(bookmark.metadata.resource_version, stream))
                }
                // 410 Gone: the watch cannot resume from here; list again.
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => (
                    Some(Err(watcher::Error::WatchError(status.boxed()))),
                    State::Empty {
                        since: Since::Latest,
                    },
                ),
                Some(Ok(WatchEvent::Error(status))) => (
                    Some(Err(watcher::Error::WatchError(status.boxed()))),
                    watching(resource_version, stream),
                ),
                Some(Err(e)) => (
                    Some(Err(watcher::Error::WatchFailed(e))),
                    watching(resource_version, stream),
                ),
                // The server ended the watch (its timeout), or the connection
                // went silent for longer: watch again from here.
                None => (None, State::Listed { resource_version }),
            }
        }
    }
}

/// The next object of the list under way, reading or asking for more as needed;
/// `InitDone` once the last page is read.
async fn page<K>(kind: &Kind<K>, mut l: Listing<K>) -> Step<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let failed = |e: kube::Error, since: Since| {
        // An expired continue token or a resourceVersion the server no
        // longer has: list the latest instead.
        let since = match &e {
            kube::Error::Api(status) if status.code == 410 => Since::Latest,
            _ => since,
        };
        (
            Some(Err(watcher::Error::InitialListFailed(e))),
            State::Empty { since },
        )
    };
    let object = |mut l: Listing<K>, obj: K| {
        l.objects += 1;
        (Some(Ok(Event::InitApply(obj))), State::Paging(l))
    };
    match l.reading.take() {
        Some(Reading::Protobuf {
            mut body,
            mut reader,
        }) => loop {
            match reader.next_item() {
                Ok(Some(obj)) => {
                    l.reading = Some(Reading::Protobuf { body, reader });
                    return object(l, obj);
                }
                Ok(None) => {}
                Err(e) => return failed(invalid(e), l.since),
            }
            let frame = match idle_limited(&kind.config, body.frame()).await {
                Some(frame) => frame,
                None => {
                    let silent = std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the list's response stopped arriving",
                    );
                    return failed(kube::Error::ReadEvents(silent), l.since);
                }
            };
            match frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        reader.feed(data);
                    }
                }
                Some(Err(e)) => return failed(e, l.since),
                None => {
                    if let Err(e) = reader.finish() {
                        return failed(invalid(e), l.since);
                    }
                    l.continue_token = reader.continue_token.take();
                    l.resource_version = reader.resource_version.take();
                    if l.continue_token.is_none() && l.resource_version.is_none() {
                        return no_resource_version(l.since);
                    }
                    return (None, State::Paging(l));
                }
            }
        },
        Some(Reading::Json(mut items)) => match items.pop_front() {
            Some(obj) => {
                l.reading = Some(Reading::Json(items));
                object(l, obj)
            }
            None => (None, State::Paging(l)),
        },
        None => {
            if l.continue_token.is_none() {
                if let Some(resource_version) = l.resource_version {
                    tracing::info!("listed {} {} ({})", l.objects, K::plural(&()), l.encoding);
                    return (
                        Some(Ok(Event::InitDone)),
                        State::Listed { resource_version },
                    );
                }
            }
            match request(kind, &l.since, l.continue_token.take()).await {
                // Its resourceVersion and continue token are read with it.
                Ok(Requested::Protobuf(reading)) => {
                    l.reading = Some(reading);
                    (None, State::Paging(l))
                }
                Ok(Requested::Json(list)) => {
                    l.continue_token = list.metadata.continue_.filter(|v| !v.is_empty());
                    l.resource_version = list.metadata.resource_version.filter(|v| !v.is_empty());
                    if l.continue_token.is_none() && l.resource_version.is_none() {
                        return no_resource_version(l.since);
                    }
                    l.reading = Some(Reading::Json(list.items.into()));
                    l.encoding = "JSON";
                    (None, State::Paging(l))
                }
                Err(e) => failed(e, l.since),
            }
        }
    }
}

/// How long a watch or a list's response may stay silent before its
/// connection is taken for dead: the server's watch timeout (kube-rs's default,
/// 290 s) and 5 s, as kube-rs's watcher waits. The client sets no read timeout,
/// and a half-open connection would otherwise be waited on for ever.
async fn idle_limited<T>(config: &watcher::Config, next: impl Future<Output = T>) -> Option<T> {
    let server = u64::from(config.timeout.unwrap_or(290));
    let limit = std::time::Duration::from_secs(server + 5);
    match tokio::time::timeout(limit, next).await {
        Ok(item) => Some(item),
        Err(_) => {
            tracing::info!("no word from the API server in {limit:?}; reconnecting");
            None
        }
    }
}

fn no_resource_version<K>(since: Since) -> Step<K> {
    (
        Some(Err(watcher::Error::NoResourceVersion)),
        State::Empty { since },
    )
}

/// A decoding error, as kube-rs reports a body it cannot read.
fn invalid(e: protobuf::DecodeError) -> kube::Error {
    kube::Error::ReadEvents(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// What a list request brought: a body to read, or a JSON list read whole.
enum Requested<K: Clone> {
    Protobuf(Reading<K>),
    Json(ObjectList<K>),
}

/// Protobuf first; JSON where the server cannot (as client-go asks).
const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// Asks for a list, or its next page. No page size: the API server's cache
/// answers a whole list at a fraction of the CPU of pages of 500, and the
/// reader holds one object at a time. A server that pages anyway gives a
/// continue token, which is followed.
async fn request<K>(
    kind: &Kind<K>,
    since: &Since,
    continue_token: Option<String>,
) -> kube::Result<Requested<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let mut params = ListParams {
        label_selector: kind.config.label_selector.clone(),
        field_selector: kind.config.field_selector.clone(),
        ..ListParams::default()
    };
    match continue_token {
        // A continued list is read at the resourceVersion of its first page.
        Some(token) => params.continue_token = Some(token),
        None if *since == Since::Cache => params = params.match_any(),
        None => {}
    }
    let mut request = kube::core::Request::new(kind.api.resource_url())
        .list(&params)
        .map_err(kube::Error::BuildRequest)?;
    request
        .headers_mut()
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT));
    let response = kind
        .client
        .send(request.map(kube::client::Body::from))
        .await?;
    let status = response.status();
    let is_protobuf = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(protobuf::CONTENT_TYPE));
    let body = response.into_body();
    if !status.is_success() {
        let body = body.collect_bytes().await?;
        return Err(kube::Error::Api(Box::new(error_status(
            status,
            &body,
            is_protobuf,
        ))));
    }
    if is_protobuf {
        let reader = ListReader::new(kind.decode);
        return Ok(Requested::Protobuf(Reading::Protobuf { body, reader }));
    }
    let body = body.collect_bytes().await?;
    let list = serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
    Ok(Requested::Json(list))
}

/// The API server's Status of a failed request, in either encoding; the HTTP
/// status alone where the body says nothing readable.
fn error_status(status: http::StatusCode, body: &[u8], is_protobuf: bool) -> Status {
    let decoded = if is_protobuf {
        protobuf::status(body).ok()
    } else {
        serde_json::from_slice::<Status>(body).ok()
    };
    decoded.filter(|s| s.code != 0).unwrap_or_else(|| {
        Status::failure(
            &String::from_utf8_lossy(body),
            status.canonical_reason().unwrap_or(""),
        )
        .with_code(status.as_u16())
    })
}
