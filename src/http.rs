//! The little HTTP/1 the node needs to speak (health checks, the lab's pods):
//! read a request head, answer, close.

use std::io::Read;

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

#[cfg(test)]
mod tests {
    #[test]
    fn stops_at_the_blank_line_or_the_limit() {
        let head = b"GET / HTTP/1.0\r\nHost: x\r\n\r\n";
        assert_eq!(super::read_request_head(&mut &head[..], 8192), head);
        let endless = vec![b'a'; 10_000];
        assert!(super::read_request_head(&mut &endless[..], 2048).len() < 4096);
    }
}
