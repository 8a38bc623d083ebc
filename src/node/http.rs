//! The little HTTP/1 the node needs to speak (health checks, metrics, the lab's
//! pods): read a request head, answer, close.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Reads until the end of the request head (a blank line), EOF, an error or a
/// timeout, or `limit` bytes; returns what arrived. Callers answer whatever it
/// holds: a client that sends nothing still gets the answer.
pub fn read_request_head(conn: &mut impl Read, limit: usize) -> Vec<u8> {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < limit {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    req
}

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn not_found() -> Response {
        Response {
            status: 404,
            content_type: "text/plain; charset=utf-8",
            body: "404 page not found\n".into(),
        }
    }

    fn write_to(&self, conn: &mut impl Write) -> std::io::Result<()> {
        let reason = match self.status {
            200 => "OK",
            404 => "Not Found",
            503 => "Service Unavailable",
            _ => "",
        };
        write!(
            conn,
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            self.status,
            self.content_type,
            self.body.len(),
            self.body
        )
    }
}

/// The path of a request head (`GET /metrics HTTP/1.1` → `/metrics`), without query.
pub fn request_path(head: &[u8]) -> &str {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let target = std::str::from_utf8(line)
        .unwrap_or_default()
        .split(' ')
        .nth(1)
        .unwrap_or_default();
    target.split('?').next().unwrap_or_default()
}

/// Serves `handler` (given the request path) on `addr` from a thread of its own,
/// one request per connection. Fails only if `addr` cannot be bound.
pub fn serve(
    addr: SocketAddr,
    handler: impl Fn(&str) -> Response + Send + Sync + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let handler = handler.clone();
            std::thread::spawn(move || answer(conn, &*handler));
        }
    });
    Ok(bound)
}

/// How long a server whose port is taken waits before trying again: kube-proxy's.
const BIND_RETRY: Duration = Duration::from_secs(5);

/// [`serve`], but a port that cannot be bound is tried again every 5 s until it
/// can, as kube-proxy does unless `--bind-address-hard-fail`. While kube-proxy
/// still runs on the node (a move from it to kube-nft), it holds the health and
/// metrics ports; ours come up the moment it goes. Says once why it waits, and
/// when it serves.
pub fn serve_when_free(
    what: &'static str,
    addr: SocketAddr,
    handler: impl Fn(&str) -> Response + Send + Sync + 'static,
) {
    let handler = Arc::new(handler);
    let bind = move || {
        let handler = handler.clone();
        serve(addr, move |path| handler(path))
    };
    match bind() {
        Ok(bound) => tracing::info!("{what} on http://{bound}"),
        Err(e) => {
            tracing::error!(
                "{what} on {addr}: {e}; trying again every {} s",
                BIND_RETRY.as_secs()
            );
            std::thread::spawn(move || loop {
                std::thread::sleep(BIND_RETRY);
                if let Ok(bound) = bind() {
                    tracing::info!("{what} on http://{bound}, now that it is free");
                    return;
                }
            });
        }
    }
}

fn answer(mut conn: TcpStream, handler: &dyn Fn(&str) -> Response) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let head = read_request_head(&mut conn, 8192);
    let _ = handler(request_path(&head)).write_to(&mut conn);
}

#[cfg(test)]
mod tests {
    #[test]
    fn stops_at_the_blank_line_or_the_limit() {
        let head = b"GET / HTTP/1.0\r\nHost: x\r\n\r\n";
        assert_eq!(super::read_request_head(&mut &head[..], 8192), head);
        let endless = vec![b'a'; 10_000];
        assert!(super::read_request_head(&mut &endless[..], 2048).len() < 4096);
    }

    #[test]
    fn path_is_the_request_target_without_query() {
        assert_eq!(
            super::request_path(b"GET /livez?x=1 HTTP/1.1\r\n\r\n"),
            "/livez"
        );
        assert_eq!(super::request_path(b"garbage"), "");
    }
}
