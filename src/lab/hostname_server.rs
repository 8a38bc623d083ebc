//! The pods' workload: a server that answers with its own name, over HTTP on TCP
//! (like the `hostnames` image) and as a datagram on UDP, plus the matching clients.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(20);

/// Serves `name` on TCP and UDP `port` of every address, until dropped.
pub struct HostnameServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl HostnameServer {
    /// Binds in the calling thread's network namespace (enter it first).
    pub fn bind(name: &str, ports: &[u16]) -> io::Result<HostnameServer> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for &port in ports {
            let tcp = TcpListener::bind(("::", port))?;
            tcp.set_nonblocking(true)?;
            let udp = UdpSocket::bind(("::", port))?;
            udp.set_read_timeout(Some(POLL * 5))?;
            let (n, s) = (name.to_string(), stop.clone());
            threads.push(std::thread::spawn(move || serve_tcp(tcp, &n, &s)));
            let (n, s) = (name.to_string(), stop.clone());
            threads.push(std::thread::spawn(move || serve_udp(udp, &n, &s)));
        }
        Ok(HostnameServer { stop, threads })
    }

    /// Binds inside the named namespace; the serving threads stay there.
    pub fn bind_in(netns: &str, name: &str, ports: &[u16]) -> io::Result<HostnameServer> {
        let (name, ports) = (name.to_string(), ports.to_vec());
        crate::testbed::netns::in_netns(netns, move || HostnameServer::bind(&name, &ports))?
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for HostnameServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve_tcp(listener: TcpListener, name: &str, stop: &AtomicBool) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let wake = Timespec {
        tv_sec: 0,
        tv_nsec: POLL.as_nanos() as _,
    };
    while !stop.load(Ordering::Relaxed) {
        // Wait for a connection, waking now and then to notice `stop`.
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        if !matches!(poll(&mut fds, Some(&wake)), Ok(n) if n > 0) {
            continue;
        }
        if let Ok((conn, peer)) = listener.accept() {
            let name = name.to_string();
            std::thread::spawn(move || {
                let _ = answer_http(conn, &name, peer);
            });
        }
    }
}

/// Answers `GET /client` with the client's address as seen here (to check source
/// address preservation), and anything else with the pod's name.
fn answer_http(mut conn: TcpStream, name: &str, peer: SocketAddr) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    // Long enough for a test to hold a connection open across a proxy restart.
    conn.set_read_timeout(Some(Duration::from_secs(20)))?;
    let req = crate::node::http::read_request_head(&mut conn, 16 * 1024);
    let body = if req.starts_with(b"GET /client ") {
        format!("{}\n", peer.ip().to_canonical())
    } else {
        format!("{name}\n")
    };
    // One write, one segment: `write!` on the socket would send each piece alone.
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(answer.as_bytes())
}

fn serve_udp(sock: UdpSocket, name: &str, stop: &AtomicBool) {
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, from)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(name.as_bytes(), from);
        }
    }
}

/// One HTTP request; returns the body (the pod's name), trimmed.
pub fn http_get(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    http_get_path(addr, "/", timeout)
}

pub fn http_get_path(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<String> {
    let mut conn = TcpStream::connect_timeout(&addr, timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut resp = String::new();
    conn.read_to_string(&mut resp)?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP response"))?;
    // HTTP/1.0 or 1.1: a Go server answers in the request's version.
    let status = head.split_whitespace().nth(1);
    if !head.starts_with("HTTP/1.") || status != Some("200") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            head.lines().next().unwrap_or("").to_string(),
        ));
    }
    Ok(body.trim().to_string())
}

/// One UDP question from a fresh socket (so a fresh conntrack flow); returns the answer.
pub fn udp_ask(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let sock = UdpSocket::bind(bind)?;
    sock.connect(addr)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.send(b"who are you?")?;
    let mut buf = [0u8; 2048];
    let n = sock.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}
