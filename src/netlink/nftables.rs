//! nf_tables over netlink: transactions (batches) and readback (dumps).
//!
//! A `Batch` is built from kernel-level objects (see `lower`) and sent in one
//! `sendmsg`, so the kernel applies all of it or none of it. Only the last message
//! asks for an ack; any failing message is reported with its sequence number, which
//! maps back to a description of the object the kernel refused.

use super::attr::align4;
use super::attr::{AttrWriter, Attrs, ParseError, Payload};
use super::expr::{
    parse_data, parse_list, write_verdict, Data, NFTA_DATA_VALUE, NFTA_DATA_VERDICT,
};
use super::message::{
    exchange, finish_msg, parse_error, put_nlmsghdr, split_messages, NlMsg, Refusal, NLMSG_ERROR,
    NLMSG_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use super::objects::{
    KernelChain, KernelCounter, KernelElement, KernelRule, KernelSet, KernelTable, OBJECT_COUNTER,
};
use crate::ruleset::{BaseChain, ChainType, Family, Hook, Mapped, TableId};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use rustix::net::{SendAncillaryBuffer, SendFlags};
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;

// enum nf_tables_msg_types
const NEWTABLE: u16 = 0;
const GETTABLE: u16 = 1;
const DELTABLE: u16 = 2;
const NEWCHAIN: u16 = 3;
pub(crate) const GETCHAIN: u16 = 4;
const DELCHAIN: u16 = 5;
const NEWRULE: u16 = 6;
const GETRULE: u16 = 7;
const DELRULE: u16 = 8;
const NEWSET: u16 = 9;
pub(crate) const GETSET: u16 = 10;
const DELSET: u16 = 11;
const NEWSETELEM: u16 = 12;
pub(crate) const GETSETELEM: u16 = 13;
const DELSETELEM: u16 = 14;
const NEWOBJ: u16 = 18;
const GETOBJ: u16 = 19;
const DELOBJ: u16 = 20;
/// `NFTA_SET_ELEM_OBJREF`: an object map element's object name.
const SET_ELEM_OBJREF: u16 = 9;

/// A NEWSETELEM's element list is one attribute, whose length is a u16.
const MAX_ELEMENTS_BYTES: usize = 60_000;

fn msg_type(m: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | m
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("the kernel refused to {what}: {source}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        what: String,
        source: io::Error,
        detail: Option<String>,
    },
    #[error("netlink: {0}")]
    Io(#[from] io::Error),
    #[error("reading the kernel's answer: {0}")]
    Parse(#[from] ParseError),
}

impl From<Refusal> for NftError {
    fn from(r: Refusal) -> Self {
        NftError::Refused {
            what: "answer a request".into(),
            source: r.source,
            detail: r.detail,
        }
    }
}

/// One nf_tables transaction being built.
///
/// Messages are encoded as they are added, into chunks of about `CHUNK_BYTES`
/// that never split a message: a large transaction is not copied as it grows,
/// batches join by moving chunks, and `sendmsg` gathers the chunks. Sequence
/// numbers are given in send order when the batch is finished; a refused
/// message is described by decoding it again, so no description is kept.
#[derive(Default)]
pub struct Batch {
    chunks: Vec<Vec<u8>>,
    messages: usize,
}

const CHUNK_BYTES: usize = 1 << 20;

/// The kernel requires a transaction-unique id on every new set. A process-wide
/// counter keeps ids unique across batches that are later joined.
static NEXT_SET_ID: AtomicU32 = AtomicU32::new(1);

/// A netfilter message header: nlmsghdr, then nfgenmsg.
pub(crate) fn put_header(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
) -> usize {
    let at = put_nlmsghdr(buf, kind, flags, seq);
    buf.push(family);
    buf.push(0); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    at
}

/// A finished transaction: BATCH_BEGIN, the messages, BATCH_END, in chunks.
pub struct Transaction {
    chunks: Vec<Vec<u8>>,
    messages: usize,
    last_seq: u32,
}

impl Transaction {
    pub fn bytes(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// Every message, framing included, in send order.
    fn each_message(&self) -> impl Iterator<Item = NlMsg<'_>> {
        self.chunks
            .iter()
            .flat_map(|c| split_messages(c).unwrap_or_default())
    }

    /// Every object message described, in send order.
    #[cfg(test)]
    pub(crate) fn described(&self) -> Vec<String> {
        (1..=self.last_seq).map(|seq| self.describe(seq)).collect()
    }

    /// What the message with this sequence number does, in `nft`'s words.
    pub fn describe(&self, seq: u32) -> String {
        self.each_message()
            .find(|m| m.seq == seq && m.kind >> 8 == NFNL_SUBSYS_NFTABLES)
            .and_then(|m| describe_message(&m))
            .unwrap_or_else(|| format!("apply message {seq}"))
    }
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of object messages (not counting the batch framing).
    pub fn len(&self) -> usize {
        self.messages
    }

    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// Appends another batch's messages after this one's.
    pub fn append(&mut self, other: Batch) {
        for chunk in other.chunks {
            match self.chunks.last_mut() {
                // Small pieces are copied, so a plan of many small parts does
                // not become a gather list of many small slices.
                Some(last) if last.len() + chunk.len() <= CHUNK_BYTES => {
                    last.extend_from_slice(&chunk)
                }
                _ => self.chunks.push(chunk),
            }
        }
        self.messages += other.messages;
    }

    fn message(
        &mut self,
        kind: u16,
        flags: u16,
        family: Family,
        body: impl FnOnce(&mut AttrWriter),
    ) {
        match self.chunks.last() {
            // Most batches are small: the first chunk grows as needed.
            None => self.chunks.push(Vec::new()),
            Some(c) if c.len() >= CHUNK_BYTES => self
                .chunks
                .push(Vec::with_capacity(CHUNK_BYTES + MAX_ELEMENTS_BYTES + 4096)),
            Some(_) => {}
        }
        let chunk = self.chunks.last_mut().expect("a chunk");
        let mut buf = std::mem::take(chunk);
        let at = put_header(
            &mut buf,
            msg_type(kind),
            NLM_F_REQUEST | flags,
            0,
            family.nfproto(),
            0,
        );
        let mut w = AttrWriter::over(buf);
        body(&mut w);
        *chunk = w.into_bytes();
        finish_msg(chunk, at);
        self.messages += 1;
    }

    pub fn add_table(&mut self, family: Family, name: &str, userdata: Option<&[u8]>) {
        self.message(NEWTABLE, NLM_F_CREATE, family, |w| {
            w.put_str(1, name);
            w.put_u32(2, 0);
            if let Some(u) = userdata {
                w.put(6, u);
            }
        });
    }

    pub fn delete_table(&mut self, family: Family, name: &str) {
        self.message(DELTABLE, 0, family, |w| w.put_str(1, name));
    }

    /// Creates the chain, without its rules.
    pub fn add_chain(&mut self, family: Family, table: &str, chain: &KernelChain) {
        self.message(NEWCHAIN, NLM_F_CREATE, family, |w| {
            w.put_str(1, table);
            w.put_str(3, &chain.name);
            if let Some(base) = chain.base {
                w.put_str(7, base.kind.name());
                w.put_u32(5, 1); // policy accept
                w.nest(4, |w| {
                    w.put_u32(1, base.hook.number());
                    w.put_u32(2, base.priority as u32);
                });
            }
            if let Some(u) = &chain.userdata {
                w.put(12, u);
            }
        });
    }

    pub fn flush_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.message(DELRULE, 0, family, |w| {
            w.put_str(1, table);
            w.put_str(2, chain);
        });
    }

    pub fn delete_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.message(DELCHAIN, 0, family, |w| {
            w.put_str(1, table);
            w.put_str(3, chain);
        });
    }

    pub fn add_rule(&mut self, family: Family, table: &str, chain: &str, rule: &KernelRule) {
        self.rule_message(
            NLM_F_CREATE | NLM_F_APPEND,
            family,
            table,
            chain,
            None,
            rule,
        );
    }

    /// Replaces the rule with this handle, in place (NLM_F_REPLACE).
    pub fn replace_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        handle: u64,
        rule: &KernelRule,
    ) {
        self.rule_message(NLM_F_REPLACE, family, table, chain, Some(handle), rule);
    }

    /// Inserts the rule at the head of the chain (no NLM_F_APPEND, no position).
    pub fn insert_rule(&mut self, family: Family, table: &str, chain: &str, rule: &KernelRule) {
        self.rule_message(NLM_F_CREATE, family, table, chain, None, rule);
    }

    #[allow(clippy::too_many_arguments)]
    fn rule_message(
        &mut self,
        flags: u16,
        family: Family,
        table: &str,
        chain: &str,
        handle: Option<u64>,
        rule: &KernelRule,
    ) {
        self.message(NEWRULE, flags, family, |w| {
            w.put_str(1, table);
            w.put_str(2, chain);
            if let Some(h) = handle {
                w.put_u64(3, h);
            }
            w.nest(4, |w| {
                for e in &rule.exprs {
                    e.emit(w);
                }
            });
            if let Some(u) = &rule.userdata {
                w.put(7, u);
            }
        });
    }

    pub fn delete_rule(&mut self, family: Family, table: &str, chain: &str, handle: u64) {
        self.message(DELRULE, 0, family, |w| {
            w.put_str(1, table);
            w.put_str(2, chain);
            w.put_u64(3, handle);
        });
    }

    /// Creates the set, without its elements.
    pub fn add_set(&mut self, family: Family, table: &str, set: &KernelSet) {
        let id = NEXT_SET_ID.fetch_add(1, Ordering::Relaxed);
        self.message(NEWSET, NLM_F_CREATE, family, |w| {
            w.put_str(1, table);
            w.put_str(2, &set.name);
            w.put_u32(3, set.flags);
            w.put_u32(4, set.key_type);
            w.put_u32(5, set.key_len);
            if let Some(d) = set.data_type {
                w.put_u32(6, d);
                w.put_u32(7, 0);
            }
            if let Some(size) = set.size {
                w.nest(9, |w| w.put_u32(1, size));
            }
            w.put_u32(10, id);
            if let Some(t) = set.timeout_ms {
                w.put_u64(11, t);
            }
            if let Some(u) = &set.userdata {
                w.put(13, u);
            }
            if let Some(t) = set.obj_type {
                w.put_u32(15, t);
            }
        });
    }

    /// Creates a named counter at zero; one that exists already keeps its values
    /// (the kernel treats a second create without `NLM_F_EXCL` as done).
    pub fn add_counter(&mut self, family: Family, table: &str, counter: &KernelCounter) {
        self.message(NEWOBJ, NLM_F_CREATE, family, |w| {
            w.put_str(1, table);
            w.put_str(2, &counter.name);
            w.put_u32(3, OBJECT_COUNTER);
            w.nest(4, |w| {
                w.put_u64(1, 0);
                w.put_u64(2, 0);
            });
            if let Some(u) = &counter.userdata {
                w.put(8, u);
            }
        });
    }

    pub fn delete_counter(&mut self, family: Family, table: &str, name: &str) {
        self.message(DELOBJ, 0, family, |w| {
            w.put_str(1, table);
            w.put_str(2, name);
            w.put_u32(3, OBJECT_COUNTER);
        });
    }

    pub fn delete_set(&mut self, family: Family, table: &str, set: &str) {
        self.message(DELSET, 0, family, |w| {
            w.put_str(1, table);
            w.put_str(2, set);
        });
    }

    pub fn add_elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        elements: &[KernelElement],
    ) {
        self.elements(NEWSETELEM, NLM_F_CREATE, family, table, set, elements, true);
    }

    pub fn delete_elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        elements: &[KernelElement],
    ) {
        self.elements(DELSETELEM, 0, family, table, set, elements, false);
    }

    #[allow(clippy::too_many_arguments)]
    fn elements(
        &mut self,
        kind: u16,
        flags: u16,
        family: Family,
        table: &str,
        set: &str,
        elements: &[KernelElement],
        with_data: bool,
    ) {
        let encode = |e: &KernelElement, out: &mut Vec<u8>| {
            out.clear();
            let mut w = AttrWriter::over(std::mem::take(out));
            w.nest(1, |w| {
                w.nest(1, |w| w.put(NFTA_DATA_VALUE, &e.key));
                match (with_data, &e.data) {
                    (true, Some(Mapped::Verdict(v))) => {
                        w.nest(2, |w| w.nest(NFTA_DATA_VERDICT, |w| write_verdict(w, v)))
                    }
                    (true, Some(Mapped::Counter(name))) => w.put_str(SET_ELEM_OBJREF, name),
                    _ => {}
                }
                if let (true, Some(u)) = (with_data, &e.userdata) {
                    w.put(6, u);
                }
            });
            *out = w.into_bytes();
        };
        let mut rest = elements.iter().peekable();
        let mut scratch = Vec::new();
        while rest.peek().is_some() {
            self.message(kind, flags, family, |w| {
                w.put_str(1, table);
                w.put_str(2, set);
                w.nest(3, |w| {
                    let mut size = 0;
                    while let Some(e) = rest.peek() {
                        encode(e, &mut scratch);
                        if size > 0 && size + scratch.len() > MAX_ELEMENTS_BYTES {
                            break;
                        }
                        size += scratch.len();
                        w.put_raw(&scratch);
                        rest.next();
                    }
                });
            });
        }
    }

    /// Closes the batch: numbers the messages in send order, frames them, and
    /// has the last object message ask for the ack.
    pub fn finish(self) -> Transaction {
        let mut seq = 0u32;
        let mut last: Option<(usize, usize)> = None;
        let mut chunks = self.chunks;
        for (i, chunk) in chunks.iter_mut().enumerate() {
            let mut at = 0;
            while at + NLMSG_HDRLEN <= chunk.len() {
                seq += 1;
                chunk[at + 8..at + 12].copy_from_slice(&seq.to_ne_bytes());
                last = Some((i, at));
                let len = u32::from_ne_bytes(chunk[at..at + 4].try_into().expect("4 bytes"));
                at += align4(len as usize);
            }
        }
        if let Some((i, at)) = last {
            let flags_at = at + 6;
            let c = &mut chunks[i];
            let flags = u16::from_ne_bytes([c[flags_at], c[flags_at + 1]]) | NLM_F_ACK;
            c[flags_at..flags_at + 2].copy_from_slice(&flags.to_ne_bytes());
        }
        let framing = |kind, seq| {
            let mut b = Vec::new();
            let at = put_header(&mut b, kind, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES);
            finish_msg(&mut b, at);
            b
        };
        chunks.insert(0, framing(NFNL_MSG_BATCH_BEGIN, 0));
        chunks.push(framing(NFNL_MSG_BATCH_END, seq + 1));
        Transaction {
            chunks,
            messages: self.messages,
            last_seq: seq,
        }
    }
}

/// Decodes one of our batch messages back into the words `Batch` was asked
/// for: "add rule to ip kube-nft chain services", "add 3 element(s) of ...".
fn describe_message(m: &NlMsg) -> Option<String> {
    let nfproto = *m.payload.first()?;
    let fam = Family::ALL
        .into_iter()
        .find(|f| f.nfproto() == nfproto)?
        .keyword();
    let mut strs: HashMap<u16, String> = HashMap::new();
    let (mut handle, mut elements) = (None, 0);
    for a in Attrs::new(m.payload.get(4..)?) {
        let (kind, payload) = a.ok()?;
        match kind {
            3 if m.kind & 0xff == NEWRULE || m.kind & 0xff == DELRULE => {
                handle = Payload::new("rule", kind, payload).u64().ok()
            }
            3 if m.kind & 0xff == NEWSETELEM || m.kind & 0xff == DELSETELEM => {
                elements = Attrs::new(payload).count()
            }
            _ => {
                if let Ok(s) = Payload::new("message", kind, payload).string() {
                    strs.insert(kind, s);
                }
            }
        }
    }
    let s = |k: u16| strs.get(&k).map(String::as_str).unwrap_or("?");
    let table = s(1);
    Some(match m.kind & 0xff {
        NEWTABLE => format!("add table {fam} {table}"),
        DELTABLE => format!("delete table {fam} {table}"),
        NEWCHAIN => format!("add chain {fam} {table} {}", s(3)),
        DELCHAIN => format!("delete chain {fam} {table} {}", s(3)),
        NEWRULE if m.flags & NLM_F_REPLACE != 0 => format!(
            "replace rule {} in {fam} {table} chain {}",
            handle.unwrap_or(0),
            s(2)
        ),
        NEWRULE if m.flags & NLM_F_APPEND != 0 => {
            format!("add rule to {fam} {table} chain {}", s(2))
        }
        NEWRULE => format!("insert rule into {fam} {table} chain {}", s(2)),
        DELRULE => match handle {
            Some(h) => format!("delete rule {h} from {fam} {table} chain {}", s(2)),
            None => format!("flush chain {fam} {table} {}", s(2)),
        },
        NEWSET => format!("add set {fam} {table} {}", s(2)),
        DELSET => format!("delete set {fam} {table} {}", s(2)),
        NEWOBJ => format!("add counter {fam} {table} {}", s(2)),
        DELOBJ => format!("delete counter {fam} {table} {}", s(2)),
        NEWSETELEM => format!("add {elements} element(s) of {fam} {table} {}", s(2)),
        DELSETELEM => format!("delete {elements} element(s) of {fam} {table} {}", s(2)),
        _ => return None,
    })
}

impl AttrWriter {
    /// Appends bytes that are already a sequence of attributes.
    pub fn put_raw(&mut self, attrs: &[u8]) {
        let mut buf = std::mem::take(self).into_bytes();
        buf.extend_from_slice(attrs);
        *self = AttrWriter::over(buf);
    }
}

/// What a committed transaction cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    pub messages: usize,
    pub bytes: usize,
    /// From sending the batch to the kernel's answer: the kernel's share of a sync.
    pub kernel: Duration,
}

/// A netlink socket speaking nf_tables, bound in the network namespace of the
/// thread that opened it.
pub struct NftSocket {
    sock: Socket,
    /// Reused for every datagram. Its size matters: the kernel sizes the messages
    /// of a dump after the largest buffer we have received into, and an element
    /// dump re-walks the set from its start for every message.
    rx: Vec<u8>,
}

const RX_BUFFER: usize = 1 << 20;

impl NftSocket {
    pub fn open() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        sock.set_cap_ack(true)?;
        sock.set_ext_ack(true)?;
        // Large batches and dumps: past the default buffers without touching sysctls.
        rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, 8 << 20)
            .map_err(io::Error::from)?;
        Ok(NftSocket {
            sock,
            rx: Vec::with_capacity(RX_BUFFER),
        })
    }

    /// Sends the batch as one transaction. On error nothing was committed.
    pub fn commit(&mut self, batch: Batch) -> Result<Committed, NftError> {
        if batch.is_empty() {
            return Ok(Committed::default());
        }
        let tx = batch.finish();
        let sending = Instant::now();
        let bytes = tx.bytes();
        rustix::net::sockopt::set_socket_send_buffer_size_force(&self.sock, bytes + (64 << 10))
            .map_err(io::Error::from)?;
        // One datagram: the kernel applies a batch only from a single sendmsg.
        let iov: Vec<IoSlice> = tx.chunks.iter().map(|c| IoSlice::new(c)).collect();
        let sent = rustix::net::sendmsg(
            &self.sock,
            &iov,
            &mut SendAncillaryBuffer::default(),
            SendFlags::empty(),
        )
        .map_err(io::Error::from)?;
        drop(iov);
        if sent != bytes {
            return Err(NftError::Io(io::Error::other("short netlink send")));
        }
        let mut first_error: Option<NftError> = None;
        let NftSocket { sock, rx } = self;
        loop {
            rx.clear();
            sock.recv(rx, 0)?;
            for msg in split_messages(rx)? {
                if msg.kind != NLMSG_ERROR {
                    continue;
                }
                let (errno, detail) = parse_error(&msg);
                if errno != 0 && first_error.is_none() {
                    first_error = Some(NftError::Refused {
                        what: tx.describe(msg.seq),
                        source: io::Error::from_raw_os_error(-errno),
                        detail,
                    });
                }
                // Errors for earlier messages are delivered before the last one's answer.
                if msg.seq == tx.last_seq {
                    return match first_error {
                        Some(e) => Err(e),
                        None => Ok(Committed {
                            messages: tx.messages,
                            bytes,
                            kernel: sending.elapsed(),
                        }),
                    };
                }
            }
        }
    }

    /// A dump request; returns the payload (after the nfgenmsg) of every answer.
    fn dump(
        &mut self,
        kind: u16,
        family: Family,
        body: impl FnOnce(&mut AttrWriter),
    ) -> Result<Vec<Vec<u8>>, NftError> {
        let mut out = Vec::new();
        self.dump_each(kind, family, body, |p| {
            out.push(p.to_vec());
            Ok(())
        })?;
        Ok(out)
    }

    /// A dump request whose answers are handed to `each` as they arrive, so a
    /// large table is never held whole in memory.
    pub(crate) fn dump_each(
        &mut self,
        kind: u16,
        family: Family,
        body: impl FnOnce(&mut AttrWriter),
        mut each: impl FnMut(&[u8]) -> Result<(), NftError>,
    ) -> Result<(), NftError> {
        let mut buf = Vec::new();
        let at = put_header(
            &mut buf,
            msg_type(kind),
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            family.nfproto(),
            0,
        );
        let mut w = AttrWriter::over(buf);
        body(&mut w);
        let mut buf = w.into_bytes();
        finish_msg(&mut buf, at);
        let NftSocket { sock, rx } = self;
        exchange(sock, rx, &buf, |msg| {
            if msg.payload.len() >= 4 {
                each(&msg.payload[4..])?;
            }
            Ok(())
        })
        .map_err(|e| match e {
            NftError::Refused { source, detail, .. } => NftError::Refused {
                what: format!("dump {} objects", family.keyword()),
                source,
                detail,
            },
            e => e,
        })
    }

    /// Whether the named table exists, and with what userdata.
    pub(crate) fn find_table(
        &mut self,
        family: Family,
        name: &str,
    ) -> Result<Option<Option<Vec<u8>>>, NftError> {
        let mut found = None;
        self.dump_each(
            GETTABLE,
            family,
            |_| {},
            |t| {
                let (mut this, mut userdata) = (false, None);
                for a in Attrs::new(t) {
                    let (k, p) = a?;
                    match k {
                        1 => this = Payload::new("table", k, p).string()? == name,
                        6 => userdata = Some(p.to_vec()),
                        _ => {}
                    }
                }
                if this {
                    found = Some(userdata);
                }
                Ok(())
            },
        )?;
        Ok(found)
    }

    /// The rules of one chain, in order, through a dump filtered by chain: the
    /// kernel finds a named chain by hash, while a whole-table rule dump restarts
    /// its walk at the first rule for every message it fills (quadratic).
    pub(crate) fn each_chain_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        mut each: impl FnMut(KernelRule),
    ) -> Result<(), NftError> {
        self.dump_each(
            GETRULE,
            family,
            |w| {
                w.put_str(1, table);
                w.put_str(2, chain);
            },
            |r| {
                if let Some((c, rule)) = parse_rule(r, table)? {
                    if c == chain {
                        each(rule);
                    }
                }
                Ok(())
            },
        )
    }

    /// Reads one of our tables back from the kernel; `None` if it does not exist.
    pub fn read_table(
        &mut self,
        family: Family,
        name: &str,
    ) -> Result<Option<KernelTable>, NftError> {
        let Some(userdata) = self.find_table(family, name)? else {
            return Ok(None);
        };
        let mut table = KernelTable {
            family,
            name: name.to_string(),
            userdata,
            counters: self
                .read_counters(family, name)?
                .into_iter()
                .map(|c| c.counter)
                .collect(),
            sets: Vec::new(),
            chains: Vec::new(),
        };
        for c in self.dump(GETCHAIN, family, |w| w.put_str(1, name))? {
            if let Some(chain) = parse_chain(&c, name)? {
                table.chains.push(chain);
            }
        }
        for chain in &mut table.chains {
            let mut rules = Vec::new();
            self.each_chain_rule(family, name, &chain.name, |r| rules.push(r))?;
            chain.rules = rules;
        }
        for s in self.dump(GETSET, family, |w| w.put_str(1, name))? {
            if let Some(set) = parse_set(&s, name)? {
                table.sets.push(set);
            }
        }
        for i in 0..table.sets.len() {
            let set_name = table.sets[i].name.clone();
            let answers = self.dump(GETSETELEM, family, |w| {
                w.put_str(1, name);
                w.put_str(2, &set_name);
            })?;
            for a in answers {
                table.sets[i].elements.extend(parse_elements(&a)?);
            }
        }
        Ok(Some(table))
    }
}

/// A counter object as a dump shows it, with its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterReading {
    pub counter: KernelCounter,
    pub packets: u64,
    pub bytes: u64,
}

impl NftSocket {
    /// The named counters of one of our tables, with their values.
    pub fn read_counters(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Vec<CounterReading>, NftError> {
        let mut out = Vec::new();
        self.dump_each(
            GETOBJ,
            family,
            |w| {
                w.put_str(1, table);
                w.put_u32(3, OBJECT_COUNTER);
            },
            |o| {
                out.extend(parse_counter(o, table)?);
                Ok(())
            },
        )?;
        Ok(out)
    }
}

pub(crate) fn parse_counter(buf: &[u8], table: &str) -> Result<Option<CounterReading>, NftError> {
    let (mut tname, mut name, mut kind, mut userdata) = (None, None, None, None);
    let (mut packets, mut bytes) = (0, 0);
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        let pl = Payload::new("object", k, p);
        match k {
            1 => tname = Some(pl.string()?),
            2 => name = Some(pl.string()?),
            3 => kind = Some(pl.u32()?),
            4 => {
                for c in Attrs::new(p) {
                    let (ck, cp) = c?;
                    match ck {
                        1 => bytes = Payload::new("counter", ck, cp).u64()?,
                        2 => packets = Payload::new("counter", ck, cp).u64()?,
                        _ => {}
                    }
                }
            }
            8 => userdata = Some(p.to_vec()),
            _ => {}
        }
    }
    if tname.as_deref() != Some(table) || kind != Some(OBJECT_COUNTER) {
        return Ok(None);
    }
    let Some(name) = name else {
        return Ok(None);
    };
    Ok(Some(CounterReading {
        counter: KernelCounter { name, userdata },
        packets,
        bytes,
    }))
}

pub(crate) fn parse_chain(buf: &[u8], table: &str) -> Result<Option<KernelChain>, NftError> {
    let (mut tname, mut name, mut kind, mut hook, mut prio, mut userdata) =
        (None, None, None, None, None, None);
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        let pl = Payload::new("chain", k, p);
        match k {
            1 => tname = Some(pl.string()?),
            3 => name = Some(pl.string()?),
            7 => kind = Some(pl.string()?),
            12 => userdata = Some(p.to_vec()),
            4 => {
                for h in Attrs::new(p) {
                    let (hk, hp) = h?;
                    let hp = Payload::new("chain hook", hk, hp);
                    match hk {
                        1 => hook = Some(hp.u32()?),
                        2 => prio = Some(hp.u32()? as i32),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if tname.as_deref() != Some(table) {
        return Ok(None);
    }
    let base = match (kind.as_deref(), hook, prio) {
        (Some(kind), Some(hook), Some(priority)) => Some(BaseChain {
            kind: if kind == "nat" {
                ChainType::Nat
            } else {
                ChainType::Filter
            },
            hook: match hook {
                0 => Hook::Prerouting,
                1 => Hook::Input,
                2 => Hook::Forward,
                3 => Hook::Output,
                _ => Hook::Postrouting,
            },
            priority,
        }),
        _ => None,
    };
    Ok(Some(KernelChain {
        name: name.unwrap_or_default(),
        base,
        userdata,
        rules: Vec::new(),
    }))
}

pub(crate) fn parse_rule(
    buf: &[u8],
    table: &str,
) -> Result<Option<(String, KernelRule)>, NftError> {
    let (mut tname, mut chain, mut handle, mut exprs, mut userdata) =
        (None, None, None, Vec::new(), None);
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        let pl = Payload::new("rule", k, p);
        match k {
            1 => tname = Some(pl.string()?),
            2 => chain = Some(pl.string()?),
            3 => handle = Some(pl.u64()?),
            4 => exprs = parse_list(p)?,
            7 => userdata = Some(p.to_vec()),
            _ => {}
        }
    }
    if tname.as_deref() != Some(table) {
        return Ok(None);
    }
    Ok(chain.map(|c| {
        (
            c,
            KernelRule {
                handle,
                exprs,
                userdata,
            },
        )
    }))
}

pub(crate) fn parse_set(buf: &[u8], table: &str) -> Result<Option<KernelSet>, NftError> {
    let mut set = KernelSet::default();
    let mut tname = None;
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        let pl = Payload::new("set", k, p);
        match k {
            1 => tname = Some(pl.string()?),
            2 => set.name = pl.string()?,
            3 => set.flags = pl.u32()?,
            4 => set.key_type = pl.u32()?,
            5 => set.key_len = pl.u32()?,
            6 => set.data_type = Some(pl.u32()?),
            9 => {
                for a in Attrs::new(p) {
                    let (k, v) = a?;
                    if k == 1 {
                        set.size = Some(Payload::new("set desc", k, v).u32()?);
                    }
                }
            }
            11 => set.timeout_ms = Some(pl.u64()?),
            13 => set.userdata = Some(p.to_vec()),
            15 => set.obj_type = Some(pl.u32()?),
            _ => {}
        }
    }
    // Anonymous sets belong to the rules that use them, not to the table's sets.
    const NFT_SET_ANONYMOUS: u32 = 0x1;
    if tname.as_deref() != Some(table) || set.flags & NFT_SET_ANONYMOUS != 0 {
        return Ok(None);
    }
    Ok(Some(set))
}

pub(crate) fn parse_elements(buf: &[u8]) -> Result<Vec<KernelElement>, NftError> {
    let mut out = Vec::new();
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        if k != 3 {
            continue;
        }
        for e in Attrs::new(p) {
            let (_, ep) = e?;
            let mut el = KernelElement {
                key: Vec::new(),
                data: None,
                userdata: None,
            };
            for f in Attrs::new(ep) {
                let (fk, fp) = f?;
                match fk {
                    1 => {
                        if let Data::Value(v) = parse_data(fp)? {
                            el.key = v;
                        }
                    }
                    2 => {
                        if let Data::Verdict(v) = parse_data(fp)? {
                            el.data = Some(Mapped::Verdict(v));
                        }
                    }
                    6 => el.userdata = Some(fp.to_vec()),
                    SET_ELEM_OBJREF => {
                        let name = Payload::new("element", fk, fp).string()?;
                        el.data = Some(Mapped::Counter(name));
                    }
                    _ => {}
                }
            }
            out.push(el);
        }
    }
    Ok(out)
}

/// The whole-table replacement, added to `b`: for each table, create it if it is
/// missing, delete it, and write it again with everything in it. Packets see the
/// old ruleset until the commit and the new one after it.
pub fn replace_tables(b: &mut Batch, tables: &[KernelTable]) {
    for t in tables {
        b.add_table(t.family, &t.name, None);
        b.delete_table(t.family, &t.name);
        write_table(b, t);
    }
}

/// Writes a table into an empty namespace, in the order `nft -f` uses: table,
/// chains, counters, sets with their elements, then rules (which may refer to
/// all of them).
pub fn write_table(b: &mut Batch, t: &KernelTable) {
    b.add_table(t.family, &t.name, t.userdata.as_deref());
    for c in &t.chains {
        b.add_chain(t.family, &t.name, c);
    }
    for c in &t.counters {
        b.add_counter(t.family, &t.name, c);
    }
    for s in &t.sets {
        b.add_set(t.family, &t.name, s);
        if !s.elements.is_empty() {
            b.add_elements(t.family, &t.name, &s.name, &s.elements);
        }
    }
    for c in &t.chains {
        for r in &c.rules {
            b.add_rule(t.family, &t.name, &c.name, r);
        }
    }
}

/// Removes these tables, where they exist, and nothing else.
pub fn delete_tables(tables: impl IntoIterator<Item = TableId>) -> Batch {
    let mut b = Batch::new();
    for t in tables {
        b.add_table(t.family, t.name(), None);
        b.delete_table(t.family, t.name());
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_is_framed_and_only_the_last_message_asks_for_an_ack() {
        let mut b = Batch::new();
        b.add_table(Family::Ip, "kube-nft", None);
        b.delete_table(Family::Ip, "kube-nft");
        let tx = b.finish();
        let msgs: Vec<NlMsg> = tx.each_message().collect();
        assert_eq!(msgs.len(), 4);
        assert_eq!(msgs[0].kind, NFNL_MSG_BATCH_BEGIN);
        assert_eq!(msgs[3].kind, NFNL_MSG_BATCH_END);
        assert_eq!(msgs[1].flags & NLM_F_ACK, 0);
        assert_ne!(msgs[2].flags & NLM_F_ACK, 0);
        let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [0, 1, 2, 3]);
        assert_eq!(tx.last_seq, 2);
        assert_eq!(tx.describe(2), "delete table ip kube-nft");
    }

    #[test]
    fn a_refused_message_is_described_from_its_bytes() {
        let rule = KernelRule {
            handle: None,
            exprs: Vec::new(),
            userdata: None,
        };
        let chain = KernelChain {
            name: "svc-x".into(),
            base: None,
            userdata: None,
            rules: Vec::new(),
        };
        let set = KernelSet {
            name: "service-ips".into(),
            key_type: 7,
            key_len: 4,
            ..KernelSet::default()
        };
        let counter = KernelCounter {
            name: "c".into(),
            userdata: None,
        };
        let element = KernelElement {
            key: vec![10, 0, 0, 1],
            data: None,
            userdata: None,
        };
        let (f, t) = (Family::Ip6, "kube-nft-services-07");
        let mut b = Batch::new();
        b.add_table(f, t, None);
        b.add_chain(f, t, &chain);
        b.add_set(f, t, &set);
        b.add_counter(f, t, &counter);
        b.add_rule(f, t, "svc-x", &rule);
        b.insert_rule(f, t, "svc-x", &rule);
        b.replace_rule(f, t, "svc-x", 42, &rule);
        b.delete_rule(f, t, "svc-x", 43);
        b.add_elements(f, t, "service-ips", &[element.clone(), element.clone()]);
        b.delete_elements(f, t, "service-ips", &[element]);
        b.flush_chain(f, t, "svc-x");
        b.delete_chain(f, t, "svc-x");
        b.delete_set(f, t, "service-ips");
        b.delete_counter(f, t, "c");
        b.delete_table(f, t);
        let tx = b.finish();
        let described = tx.described();
        let at = "ip6 kube-nft-services-07";
        assert_eq!(
            described,
            [
                format!("add table {at}"),
                format!("add chain {at} svc-x"),
                format!("add set {at} service-ips"),
                format!("add counter {at} c"),
                format!("add rule to {at} chain svc-x"),
                format!("insert rule into {at} chain svc-x"),
                format!("replace rule 42 in {at} chain svc-x"),
                format!("delete rule 43 from {at} chain svc-x"),
                format!("add 2 element(s) of {at} service-ips"),
                format!("delete 1 element(s) of {at} service-ips"),
                format!("flush chain {at} svc-x"),
                format!("delete chain {at} svc-x"),
                format!("delete set {at} service-ips"),
                format!("delete counter {at} c"),
                format!("delete table {at}"),
            ]
        );
        assert_eq!(tx.describe(99), "apply message 99");
    }

    #[test]
    fn joined_batches_are_numbered_in_send_order_and_keep_every_message() {
        let mut a = Batch::new();
        a.add_table(Family::Ip, "a", None);
        let mut b = Batch::new();
        b.add_table(Family::Ip, "b", None);
        b.delete_table(Family::Ip, "b");
        a.append(b);
        assert_eq!(a.len(), 3);
        let tx = a.finish();
        let msgs: Vec<NlMsg> = tx.each_message().collect();
        let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [0, 1, 2, 3, 4]);
        assert_eq!(tx.describe(2), "add table ip b");
        assert_eq!(tx.describe(3), "delete table ip b");
    }

    #[test]
    fn large_element_lists_are_split_under_the_attribute_limit() {
        let elements: Vec<KernelElement> = (0..10_000u32)
            .map(|i| KernelElement {
                key: i.to_be_bytes().to_vec(),
                data: None,
                userdata: Some(vec![0; 40]),
            })
            .collect();
        let mut b = Batch::new();
        b.add_elements(Family::Ip, "kube-nft", "s", &elements);
        let tx = b.finish();
        let msgs: Vec<NlMsg> = tx.each_message().collect();
        assert!(msgs.len() > 3);
        assert!(tx.describe(2).starts_with("add "), "{}", tx.describe(2));
        assert!(tx.describe(2).ends_with(" element(s) of ip kube-nft s"));
        let mut total = 0;
        for m in &msgs[1..msgs.len() - 1] {
            assert!(m.payload.len() < 65_535);
            total += parse_elements(&m.payload[4..]).unwrap().len();
        }
        assert_eq!(total, 10_000);
    }
}
