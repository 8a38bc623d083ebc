//! A response body read as it arrives: its pieces fed to a reader (`Pull`)
//! that gives back each item they complete. One loop reads every body the API
//! source streams: a list in protobuf (`super::protobuf::ListReader`), a watch
//! in protobuf frames (`super::protobuf::WatchReader`), or a watch in JSON
//! lines from a server that will not speak protobuf (`JsonLines`).
//!
//! In protobuf an event is about a third of its JSON bytes, and the API
//! server's watch cache encodes each object once for all the watchers that ask
//! for the same encoding: kube-proxy's, which asks for protobuf.

use super::protobuf::{self, ListReader, WatchReader};
use http_body_util::BodyExt;
use kube::api::WatchEvent;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::marker::PhantomData;

/// A reader of a body that arrives in pieces: fed each, asked for what it
/// completes, and told of the end.
pub trait Pull {
    type Item;
    fn feed(&mut self, bytes: &[u8]);
    /// The next item, or `None` until more of the body has been fed.
    fn pull(&mut self) -> kube::Result<Option<Self::Item>>;
    /// At the body's end: an error if it ends inside an item.
    fn finish(&mut self) -> kube::Result<()>;
}

/// What reading on gave.
pub enum Next<T> {
    Item(T),
    /// The body ended, all of it read.
    End,
    /// No word from the server for longer than the watch's own timeout.
    Silent,
    /// The body broke, or its bytes do not decode.
    Failed(kube::Error),
}

/// A response's body, and the reader of what has arrived of it.
pub struct Incoming<R> {
    body: kube::client::Body,
    reader: R,
}

impl<R: Pull> Incoming<R> {
    pub fn new(body: kube::client::Body, reader: R) -> Self {
        Incoming { body, reader }
    }

    pub fn reader_mut(&mut self) -> &mut R {
        &mut self.reader
    }

    /// The next item, reading more of the body as it needs.
    pub async fn next(&mut self, config: &watcher::Config) -> Next<R::Item> {
        loop {
            match self.reader.pull() {
                Ok(Some(item)) => return Next::Item(item),
                Ok(None) => {}
                Err(e) => return Next::Failed(e),
            }
            match idle_limited(config, self.body.frame()).await {
                Some(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.reader.feed(data);
                    }
                }
                Some(Some(Err(e))) => return Next::Failed(e),
                Some(None) => {
                    return match self.reader.finish() {
                        Ok(()) => Next::End,
                        Err(e) => Next::Failed(e),
                    }
                }
                None => return Next::Silent,
            }
        }
    }
}

impl<K> Pull for ListReader<K> {
    type Item = K;
    fn feed(&mut self, bytes: &[u8]) {
        ListReader::feed(self, bytes)
    }
    fn pull(&mut self) -> kube::Result<Option<K>> {
        self.next_item().map_err(invalid)
    }
    fn finish(&mut self) -> kube::Result<()> {
        ListReader::finish(self).map_err(invalid)
    }
}

impl<K: kube::Resource> Pull for WatchReader<K> {
    type Item = WatchEvent<K>;
    fn feed(&mut self, bytes: &[u8]) {
        WatchReader::feed(self, bytes)
    }
    fn pull(&mut self) -> kube::Result<Option<WatchEvent<K>>> {
        self.next_event().map_err(invalid)
    }
    fn finish(&mut self) -> kube::Result<()> {
        WatchReader::finish(self).map_err(invalid)
    }
}

/// A JSON watch: one event per line.
pub struct JsonLines<K> {
    buf: Vec<u8>,
    /// The offset in `buf` of the next line.
    pos: usize,
    kind: PhantomData<fn() -> K>,
}

impl<K> Default for JsonLines<K> {
    fn default() -> Self {
        JsonLines {
            buf: Vec::new(),
            pos: 0,
            kind: PhantomData,
        }
    }
}

impl<K: DeserializeOwned> Pull for JsonLines<K> {
    type Item = WatchEvent<K>;

    fn feed(&mut self, bytes: &[u8]) {
        // `pull` has dropped the lines read before asking for more.
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole line as an event, skipping blank ones.
    fn pull(&mut self) -> kube::Result<Option<WatchEvent<K>>> {
        loop {
            let Some(n) = self.buf[self.pos..].iter().position(|&b| b == b'\n') else {
                self.buf.drain(..self.pos);
                self.pos = 0;
                return Ok(None);
            };
            let line = &self.buf[self.pos..self.pos + n];
            self.pos += n + 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(line)
                .map(Some)
                .map_err(kube::Error::SerdeError);
        }
    }

    fn finish(&mut self) -> kube::Result<()> {
        if self.buf[self.pos..].iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        Err(kube::Error::ReadEvents(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the watch ends inside an event",
        )))
    }
}

/// A watch's events, in whichever encoding the server answered.
pub enum WatchBody<K> {
    Protobuf(Incoming<WatchReader<K>>),
    Json(Incoming<JsonLines<K>>),
    /// Ended: the server closed it, or it went silent or broke.
    Ended,
}

impl<K: kube::Resource + DeserializeOwned> WatchBody<K> {
    /// The next event; `None` once the body has ended, after an error or a
    /// silence longer than the watch's own timeout (`idle_limited`).
    pub async fn next(&mut self, config: &watcher::Config) -> Option<kube::Result<WatchEvent<K>>> {
        let next = match self {
            WatchBody::Ended => return None,
            WatchBody::Protobuf(incoming) => incoming.next(config).await,
            WatchBody::Json(incoming) => incoming.next(config).await,
        };
        match next {
            Next::Item(event) => Some(Ok(event)),
            Next::Failed(e) => {
                *self = WatchBody::Ended;
                Some(Err(e))
            }
            Next::End | Next::Silent => {
                *self = WatchBody::Ended;
                None
            }
        }
    }

    /// The encoding, for log lines.
    pub fn encoding(&self) -> &'static str {
        match self {
            WatchBody::Json(_) => "JSON",
            _ => "protobuf",
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

/// A decoding error, as kube-rs reports a body it cannot read.
fn invalid(e: protobuf::DecodeError) -> kube::Error {
    kube::Error::ReadEvents(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    /// Feeds `body` in pieces of `piece` bytes, pulling after each.
    fn read(body: &[u8], piece: usize) -> (Vec<WatchEvent<Service>>, kube::Result<()>) {
        let mut lines = JsonLines::<Service>::default();
        let mut events = Vec::new();
        for chunk in body.chunks(piece) {
            lines.feed(chunk);
            while let Some(event) = lines.pull().expect("every line is an event") {
                events.push(event);
            }
        }
        (events, lines.finish())
    }

    const ADDED: &str = r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"n","resourceVersion":"1"}}}"#;
    const DELETED: &str = r#"{"type":"DELETED","object":{"metadata":{"name":"a","namespace":"n","resourceVersion":"2"}}}"#;

    #[test]
    fn json_lines_give_each_event_however_the_body_is_cut() {
        let body = format!("{ADDED}\n\n  \n{DELETED}\n");
        for piece in 1..=body.len() {
            let (events, end) = read(body.as_bytes(), piece);
            let names: Vec<_> = events
                .iter()
                .map(|e| match e {
                    WatchEvent::Added(s) => ("added", s.metadata.resource_version.clone()),
                    WatchEvent::Deleted(s) => ("deleted", s.metadata.resource_version.clone()),
                    _ => ("other", None),
                })
                .collect();
            assert_eq!(
                names,
                [("added", Some("1".into())), ("deleted", Some("2".into()))],
                "pieces of {piece}"
            );
            assert!(end.is_ok(), "pieces of {piece}");
        }
    }

    #[test]
    fn a_json_watch_that_ends_inside_an_event_is_an_error() {
        let body = format!("{ADDED}\n{}", &DELETED[..20]);
        let (events, end) = read(body.as_bytes(), 7);
        assert_eq!(events.len(), 1);
        assert!(end.is_err());
        let mut lines = JsonLines::<Service>::default();
        lines.feed(b"{\"type\": nonsense}\n");
        assert!(lines.pull().is_err());
    }
}
