//! IPVS over generic netlink (family "IPVS", `include/uapi/linux/ip_vs.h`):
//! virtual services and their real servers, created, changed, deleted and dumped.
//! Only what kube-nft uses: services by address, protocol and port (not firewall
//! marks), masquerading real servers.
//!
//! IPVS has no transactions: each command stands alone. `IpvsSocket::apply` sends
//! many in one datagram and matches each acknowledgement to its command, so a
//! thousand changes cost one round trip and an error still names its command.

use super::attr::{ip_from_bytes, AttrWriter, Attrs, ParseError, Payload};
use super::genl::{put_genl_header, GenlError, GenlSocket, GENL_HDRLEN};
use super::message::{
    finish_msg, parse_error, split_messages, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use crate::core::net::Protocol;
use crate::core::node_config::IpvsTimeouts;
use std::fmt;
use std::net::IpAddr;

const IPVS_GENL_NAME: &str = "IPVS";
const IPVS_GENL_VERSION: u8 = 1;

const IPVS_CMD_NEW_SERVICE: u8 = 1;
const IPVS_CMD_SET_SERVICE: u8 = 2;
const IPVS_CMD_DEL_SERVICE: u8 = 3;
const IPVS_CMD_GET_SERVICE: u8 = 4;
const IPVS_CMD_NEW_DEST: u8 = 5;
const IPVS_CMD_SET_DEST: u8 = 6;
const IPVS_CMD_DEL_DEST: u8 = 7;
const IPVS_CMD_GET_DEST: u8 = 8;

const IPVS_CMD_SET_CONFIG: u8 = 12;
const IPVS_CMD_GET_CONFIG: u8 = 13;

const IPVS_CMD_ATTR_SERVICE: u16 = 1;
const IPVS_CMD_ATTR_DEST: u16 = 2;
const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const IPVS_SVC_ATTR_AF: u16 = 1;
const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
const IPVS_SVC_ATTR_ADDR: u16 = 3;
const IPVS_SVC_ATTR_PORT: u16 = 4;
const IPVS_SVC_ATTR_FWMARK: u16 = 5;
const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
const IPVS_SVC_ATTR_FLAGS: u16 = 7;
const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
const IPVS_SVC_ATTR_NETMASK: u16 = 9;

const IPVS_DEST_ATTR_ADDR: u16 = 1;
const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`: one client keeps its real server for `timeout` seconds.
const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// `IP_VS_CONN_F_MASQ`: real servers are reached by NAT.
const IP_VS_CONN_F_MASQ: u32 = 0;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// IPVS's answer to a request for a virtual service it does not have.
const ESRCH: i32 = 3;

/// What identifies a virtual service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VirtualKey {
    pub addr: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

impl fmt::Display for VirtualKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            std::net::SocketAddr::new(self.addr, self.port),
            self.protocol
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualService {
    pub key: VirtualKey,
    pub scheduler: String,
    /// Persistence (session affinity) timeout in seconds.
    pub persistence: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealServer {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
}

/// One change to the kernel's IPVS table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    AddService(VirtualService),
    UpdateService(VirtualService),
    /// Its real servers go with it.
    DeleteService(VirtualKey),
    AddReal(VirtualKey, RealServer),
    UpdateReal(VirtualKey, RealServer),
    DeleteReal(VirtualKey, RealServer),
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let real = |r: &RealServer| std::net::SocketAddr::new(r.addr, r.port);
        match self {
            Command::AddService(s) => write!(f, "add virtual service {} ({})", s.key, s.scheduler),
            Command::UpdateService(s) => {
                write!(f, "change virtual service {} ({})", s.key, s.scheduler)
            }
            Command::DeleteService(k) => write!(f, "delete virtual service {k}"),
            Command::AddReal(k, r) => write!(f, "add real server {} to {k}", real(r)),
            Command::UpdateReal(k, r) => write!(f, "change real server {} of {k}", real(r)),
            Command::DeleteReal(k, r) => write!(f, "delete real server {} from {k}", real(r)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    #[error("IPVS: {0}")]
    Genl(#[from] GenlError),
    #[error("IPVS refused to {command}: {source}")]
    Refused { command: String, source: GenlError },
}

impl From<ParseError> for IpvsError {
    fn from(e: ParseError) -> Self {
        IpvsError::Genl(e.into())
    }
}

impl From<std::io::Error> for IpvsError {
    fn from(e: std::io::Error) -> Self {
        IpvsError::Genl(e.into())
    }
}

fn af(addr: &IpAddr) -> u16 {
    match addr {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first four.
fn inet_addr(addr: &IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match addr {
        IpAddr::V4(a) => out[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => out.copy_from_slice(&a.octets()),
    }
    out
}

fn protocol_from(n: u16) -> Option<Protocol> {
    Protocol::from_number(u8::try_from(n).ok()?)
}

/// The attributes that name a virtual service.
fn put_key(w: &mut AttrWriter, key: &VirtualKey) {
    w.put_u16_host(IPVS_SVC_ATTR_AF, af(&key.addr));
    w.put_u16_host(IPVS_SVC_ATTR_PROTOCOL, key.protocol.number().into());
    w.put(IPVS_SVC_ATTR_ADDR, &inet_addr(&key.addr));
    w.put(IPVS_SVC_ATTR_PORT, &key.port.to_be_bytes());
}

fn put_service(w: &mut AttrWriter, svc: &VirtualService) {
    w.nest(IPVS_CMD_ATTR_SERVICE, |w| {
        put_key(w, &svc.key);
        w.put_str(IPVS_SVC_ATTR_SCHED_NAME, &svc.scheduler);
        let flags = if svc.persistence.is_some() {
            IP_VS_SVC_F_PERSISTENT
        } else {
            0
        };
        // struct ip_vs_flags { flags, mask }: the mask says which flags we set.
        let mut f = flags.to_ne_bytes().to_vec();
        f.extend_from_slice(&IP_VS_SVC_F_PERSISTENT.to_ne_bytes());
        w.put(IPVS_SVC_ATTR_FLAGS, &f);
        w.put_u32_host(IPVS_SVC_ATTR_TIMEOUT, svc.persistence.unwrap_or(0));
        // Persistence per client address: a full mask (IPv4), a /128 (IPv6).
        match svc.key.addr {
            IpAddr::V4(_) => w.put(IPVS_SVC_ATTR_NETMASK, &u32::MAX.to_be_bytes()),
            IpAddr::V6(_) => w.put_u32_host(IPVS_SVC_ATTR_NETMASK, 128),
        }
    });
}

fn put_real(w: &mut AttrWriter, real: &RealServer, full: bool) {
    w.nest(IPVS_CMD_ATTR_DEST, |w| {
        w.put(IPVS_DEST_ATTR_ADDR, &inet_addr(&real.addr));
        w.put(IPVS_DEST_ATTR_PORT, &real.port.to_be_bytes());
        w.put_u16_host(IPVS_DEST_ATTR_ADDR_FAMILY, af(&real.addr));
        if full {
            w.put_u32_host(IPVS_DEST_ATTR_FWD_METHOD, IP_VS_CONN_F_MASQ);
            w.put_u32_host(IPVS_DEST_ATTR_WEIGHT, real.weight);
            w.put_u32_host(IPVS_DEST_ATTR_U_THRESH, 0);
            w.put_u32_host(IPVS_DEST_ATTR_L_THRESH, 0);
        }
    });
}

/// The message for one command.
/// The bytes of `commands` as one request would carry them (the fake's count).
pub fn encoded_len(commands: &[Command]) -> usize {
    commands
        .iter()
        .map(|c| encode(Vec::new(), 0, 0, c).len())
        .sum()
}

fn encode(buf: Vec<u8>, family: u16, seq: u32, command: &Command) -> Vec<u8> {
    let cmd = match command {
        Command::AddService(_) => IPVS_CMD_NEW_SERVICE,
        Command::UpdateService(_) => IPVS_CMD_SET_SERVICE,
        Command::DeleteService(_) => IPVS_CMD_DEL_SERVICE,
        Command::AddReal(..) => IPVS_CMD_NEW_DEST,
        Command::UpdateReal(..) => IPVS_CMD_SET_DEST,
        Command::DeleteReal(..) => IPVS_CMD_DEL_DEST,
    };
    let mut buf = buf;
    let at = put_genl_header(
        &mut buf,
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        cmd,
        IPVS_GENL_VERSION,
    );
    let mut w = AttrWriter::over(buf);
    match command {
        Command::AddService(s) | Command::UpdateService(s) => put_service(&mut w, s),
        Command::DeleteService(k) => w.nest(IPVS_CMD_ATTR_SERVICE, |w| put_key(w, k)),
        Command::AddReal(k, r) | Command::UpdateReal(k, r) | Command::DeleteReal(k, r) => {
            w.nest(IPVS_CMD_ATTR_SERVICE, |w| put_key(w, k));
            put_real(&mut w, r, !matches!(command, Command::DeleteReal(..)));
        }
    }
    let mut buf = w.into_bytes();
    finish_msg(&mut buf, at);
    buf
}

/// One virtual service from its attribute nest (`IPVS_CMD_ATTR_SERVICE`);
/// `None` for one of another kind than kube-nft programs.
pub fn decode_service(nest: &[u8]) -> Result<Option<VirtualService>, ParseError> {
    const CTX: &str = "IPVS service";
    let (mut family, mut protocol, mut addr, mut port) = (0, 0, None, 0);
    let (mut scheduler, mut flags, mut timeout, mut fwmark) = (String::new(), 0, 0, 0);
    for a in Attrs::new(nest) {
        let (kind, p) = a?;
        let v = Payload::new(CTX, kind, p);
        match kind {
            IPVS_SVC_ATTR_AF => family = v.u16_host()?,
            IPVS_SVC_ATTR_PROTOCOL => protocol = v.u16_host()?,
            IPVS_SVC_ATTR_ADDR => addr = Some(p),
            IPVS_SVC_ATTR_PORT => port = v.u16()?,
            IPVS_SVC_ATTR_FWMARK => fwmark = v.u32_host()?,
            IPVS_SVC_ATTR_SCHED_NAME => scheduler = v.string()?,
            IPVS_SVC_ATTR_FLAGS if p.len() >= 4 => {
                flags = u32::from_ne_bytes([p[0], p[1], p[2], p[3]])
            }
            IPVS_SVC_ATTR_TIMEOUT => timeout = v.u32_host()?,
            _ => {}
        }
    }
    let addr = match (family, addr) {
        (AF_INET, Some(a)) if a.len() >= 4 => ip_from_bytes(&a[..4]),
        (AF_INET6, Some(a)) => ip_from_bytes(a),
        _ => None,
    };
    // Firewall-mark services are someone else's.
    let (Some(addr), Some(protocol), 0) = (addr, protocol_from(protocol), fwmark) else {
        return Ok(None);
    };
    Ok(Some(VirtualService {
        key: VirtualKey {
            addr,
            protocol,
            port,
        },
        scheduler,
        persistence: (flags & IP_VS_SVC_F_PERSISTENT != 0).then_some(timeout),
    }))
}

/// One real server from its attribute nest (`IPVS_CMD_ATTR_DEST`).
pub fn decode_real(nest: &[u8]) -> Result<Option<RealServer>, ParseError> {
    Ok(decode_dest(nest)?.map(|(real, _)| real))
}

/// One real server and the connections IPVS holds on it, active
/// (established TCP) and inactive (any other state) together.
fn decode_dest(nest: &[u8]) -> Result<Option<(RealServer, u32)>, ParseError> {
    const CTX: &str = "IPVS real server";
    let (mut addr, mut port, mut weight, mut family) = (None, 0, 0, 0);
    let mut connections = 0u32;
    for a in Attrs::new(nest) {
        let (kind, p) = a?;
        let v = Payload::new(CTX, kind, p);
        match kind {
            IPVS_DEST_ATTR_ADDR => addr = Some(p),
            IPVS_DEST_ATTR_PORT => port = v.u16()?,
            IPVS_DEST_ATTR_WEIGHT => weight = v.u32_host()?,
            IPVS_DEST_ATTR_ADDR_FAMILY => family = v.u16_host()?,
            IPVS_DEST_ATTR_ACTIVE_CONNS | IPVS_DEST_ATTR_INACT_CONNS => {
                connections = connections.saturating_add(v.u32_host()?)
            }
            _ => {}
        }
    }
    let addr = match (family, addr) {
        (AF_INET, Some(a)) if a.len() >= 4 => ip_from_bytes(&a[..4]),
        (AF_INET6, Some(a)) => ip_from_bytes(a),
        _ => None,
    };
    Ok(addr.map(|addr| (RealServer { addr, port, weight }, connections)))
}

/// Commands per datagram: each is under 200 bytes, and so are the acks together.
const COMMANDS_PER_SEND: usize = 256;

pub struct IpvsSocket {
    genl: GenlSocket,
    rx: Vec<u8>,
    seq: u32,
}

impl IpvsSocket {
    /// `None` when this kernel has no IPVS (not built, and no module to load).
    pub fn open() -> Result<Option<IpvsSocket>, IpvsError> {
        Ok(GenlSocket::open(IPVS_GENL_NAME)?.map(|genl| IpvsSocket {
            genl,
            rx: Vec::with_capacity(256 << 10),
            seq: 1,
        }))
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(2);
        self.seq
    }

    /// Sends one request of `cmd` with the attributes `body` writes, and hands
    /// each answer's attributes to `each` until the dump ends or the ack comes.
    fn send(
        &mut self,
        cmd: u8,
        flags: u16,
        body: impl FnOnce(&mut AttrWriter),
        mut each: impl FnMut(&[u8]) -> Result<(), ParseError>,
    ) -> Result<(), GenlError> {
        let seq = self.next_seq();
        let mut req = Vec::new();
        let at = put_genl_header(
            &mut req,
            self.genl.family,
            NLM_F_REQUEST | flags,
            seq,
            cmd,
            IPVS_GENL_VERSION,
        );
        let mut w = AttrWriter::over(req);
        body(&mut w);
        let mut req = w.into_bytes();
        finish_msg(&mut req, at);
        super::message::exchange::<GenlError>(&self.genl.sock, &mut self.rx, &req, |msg| {
            each(msg.payload.get(GENL_HDRLEN..).unwrap_or_default())?;
            Ok(())
        })
    }

    /// Sends a dump request and hands each answer's attributes to `each`.
    fn dump(
        &mut self,
        cmd: u8,
        key: Option<&VirtualKey>,
        each: impl FnMut(&[u8]) -> Result<(), ParseError>,
    ) -> Result<(), IpvsError> {
        let body = |w: &mut AttrWriter| {
            if let Some(k) = key {
                w.nest(IPVS_CMD_ATTR_SERVICE, |w| put_key(w, k));
            }
        };
        Ok(self.send(cmd, NLM_F_DUMP, body, each)?)
    }

    /// The namespace's IPVS timeouts (`ipvsadm -L --timeout`).
    pub fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsError> {
        let mut t = IpvsTimeouts::default();
        self.request(IpvsTimeouts::default(), IPVS_CMD_GET_CONFIG, |attrs| {
            for a in Attrs::new(attrs) {
                let (kind, p) = a?;
                let v = || Payload::new("ipvs timeout", kind, p).u32_host();
                match kind {
                    IPVS_CMD_ATTR_TIMEOUT_TCP => t.tcp = v()?,
                    IPVS_CMD_ATTR_TIMEOUT_TCP_FIN => t.tcp_fin = v()?,
                    IPVS_CMD_ATTR_TIMEOUT_UDP => t.udp = v()?,
                    _ => {}
                }
            }
            Ok(())
        })?;
        Ok(t)
    }

    /// Sets the timeouts that are not 0, as `ipvsadm --set` does; the kernel
    /// keeps its value for each one left out.
    pub fn set_timeouts(&mut self, t: IpvsTimeouts) -> Result<(), IpvsError> {
        self.request(t, IPVS_CMD_SET_CONFIG, |_| Ok(()))
    }

    /// One request that is not a dump, with the timeouts of `t` that are not 0
    /// as its attributes; its answer's attributes go to `each`, and the kernel's
    /// refusal is the error.
    fn request(
        &mut self,
        t: IpvsTimeouts,
        cmd: u8,
        each: impl FnMut(&[u8]) -> Result<(), ParseError>,
    ) -> Result<(), IpvsError> {
        let body = |w: &mut AttrWriter| {
            for (kind, secs) in [
                (IPVS_CMD_ATTR_TIMEOUT_TCP, t.tcp),
                (IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, t.tcp_fin),
                (IPVS_CMD_ATTR_TIMEOUT_UDP, t.udp),
            ] {
                if secs != 0 {
                    w.put_u32_host(kind, secs);
                }
            }
        };
        self.send(cmd, NLM_F_ACK, body, each).map_err(|e| match e {
            GenlError::Refused { .. } => IpvsError::Refused {
                command: match cmd {
                    IPVS_CMD_SET_CONFIG => format!("set the timeouts {t:?}"),
                    _ => "read the timeouts".into(),
                },
                source: e,
            },
            other => IpvsError::Genl(other),
        })
    }

    /// Every virtual service the kernel has (firewall-mark ones left out).
    pub fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError> {
        let mut out = Vec::new();
        self.dump(IPVS_CMD_GET_SERVICE, None, |attrs| {
            for a in Attrs::new(attrs) {
                let (kind, p) = a?;
                if kind == IPVS_CMD_ATTR_SERVICE {
                    out.extend(decode_service(p)?);
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// One virtual service, or `None` if the kernel has none with that key
    /// (a dump of its real servers would be empty either way).
    pub fn service(&mut self, key: &VirtualKey) -> Result<Option<VirtualService>, IpvsError> {
        let mut out = None;
        let body = |w: &mut AttrWriter| w.nest(IPVS_CMD_ATTR_SERVICE, |w| put_key(w, key));
        let answered = self.send(IPVS_CMD_GET_SERVICE, NLM_F_ACK, body, |attrs| {
            for a in Attrs::new(attrs) {
                let (kind, p) = a?;
                if kind == IPVS_CMD_ATTR_SERVICE {
                    out = decode_service(p)?;
                }
            }
            Ok(())
        });
        match answered {
            Ok(()) => Ok(out),
            Err(GenlError::Refused { source, .. }) if source.raw_os_error() == Some(ESRCH) => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The real servers of one virtual service.
    pub fn reals(&mut self, key: &VirtualKey) -> Result<Vec<RealServer>, IpvsError> {
        let mut out: Vec<RealServer> = self.dests(key)?.into_iter().map(|(r, _)| r).collect();
        out.sort();
        Ok(out)
    }

    /// The real servers of one virtual service, each with the connections
    /// IPVS holds on it (`ipvsadm -Ln`'s ActiveConn plus InActConn).
    pub fn dests(&mut self, key: &VirtualKey) -> Result<Vec<(RealServer, u32)>, IpvsError> {
        let mut out = Vec::new();
        self.dump(IPVS_CMD_GET_DEST, Some(key), |attrs| {
            for a in Attrs::new(attrs) {
                let (kind, p) = a?;
                if kind == IPVS_CMD_ATTR_DEST {
                    out.extend(decode_dest(p)?);
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Applies the commands in order, many per datagram, and returns the bytes
    /// sent. The first command the kernel refuses is named in the error; the rest
    /// of its datagram was still tried and later datagrams are not sent, so after
    /// an error the caller must read the kernel's state again.
    pub fn apply(&mut self, commands: &[Command]) -> Result<usize, IpvsError> {
        let mut sent = 0;
        for chunk in commands.chunks(COMMANDS_PER_SEND) {
            let mut buf = Vec::with_capacity(chunk.len() * 160);
            let mut seqs = Vec::with_capacity(chunk.len());
            for c in chunk {
                let seq = self.next_seq();
                seqs.push(seq);
                buf = encode(buf, self.genl.family, seq, c);
            }
            self.genl.sock.send(&buf, 0)?;
            sent += buf.len();
            let mut refused = None;
            let mut acked = 0;
            while acked < chunk.len() {
                self.rx.clear();
                self.genl.sock.recv(&mut self.rx, 0)?;
                for msg in split_messages(&self.rx)? {
                    if msg.kind != NLMSG_ERROR {
                        continue;
                    }
                    let Some(i) = seqs.iter().position(|s| *s == msg.seq) else {
                        continue;
                    };
                    acked += 1;
                    let (errno, detail) = parse_error(&msg);
                    if errno != 0 && refused.is_none() {
                        refused = Some(IpvsError::Refused {
                            command: chunk[i].to_string(),
                            source: GenlError::Refused {
                                source: std::io::Error::from_raw_os_error(-errno),
                                detail,
                            },
                        });
                    }
                }
            }
            if let Some(e) = refused {
                return Err(e);
            }
        }
        Ok(sent)
    }
}
