//! nf_tables transactions: a `Batch` of object messages, built from the kernel
//! objects of `objects` and sent by `NftSocket::commit` in one `sendmsg`, so the
//! kernel applies all of it or none of it. Only the last message asks for an ack;
//! a failing message is reported with its sequence number, which `describe`
//! decodes back into the words of the object the kernel refused.

use super::attr::{align4, AttrWriter};
use super::message::{
    finish_msg, put_nlmsghdr, split_messages, NlMsg, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_REQUEST,
};
use super::objects::{
    KernelChain, KernelElement, KernelObject, KernelRule, KernelSet, KernelTable, TableHeader,
    NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_TABLE,
};
use crate::core::net::Family;
use crate::ruleset::TableId;
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;

pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 17;

// enum nf_tables_msg_types
pub(crate) const NEWTABLE: u16 = 0;
pub(crate) const GETTABLE: u16 = 1;
pub(crate) const DELTABLE: u16 = 2;
pub(crate) const NEWCHAIN: u16 = 3;
pub(crate) const GETCHAIN: u16 = 4;
pub(crate) const DELCHAIN: u16 = 5;
pub(crate) const NEWRULE: u16 = 6;
pub(crate) const GETRULE: u16 = 7;
pub(crate) const DELRULE: u16 = 8;
pub(crate) const NEWSET: u16 = 9;
pub(crate) const GETSET: u16 = 10;
pub(crate) const DELSET: u16 = 11;
pub(crate) const NEWSETELEM: u16 = 12;
pub(crate) const GETSETELEM: u16 = 13;
pub(crate) const DELSETELEM: u16 = 14;
pub(crate) const NEWGEN: u16 = 15;
pub(crate) const GETGEN: u16 = 16;
pub(crate) const NEWOBJ: u16 = 18;
pub(crate) const GETOBJ: u16 = 19;
pub(crate) const DELOBJ: u16 = 20;
pub(crate) const NEWFLOWTABLE: u16 = 22;
pub(crate) const GETFLOWTABLE: u16 = 23;
pub(crate) const DELFLOWTABLE: u16 = 24;

/// A NEWSETELEM's element list is one attribute, whose length is a u16.
const MAX_ELEMENTS_BYTES: usize = 60_000;

pub(crate) fn msg_type(m: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | m
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
    pub(crate) chunks: Vec<Vec<u8>>,
    pub(crate) messages: usize,
    pub(crate) last_seq: u32,
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

    pub(crate) fn message(
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
        self.add_table_flagged(family, name, 0, userdata);
    }

    /// A table with `NFT_TABLE_F_*` flags (`TABLE_F_OWNER`).
    pub fn add_table_flagged(
        &mut self,
        family: Family,
        name: &str,
        flags: u32,
        userdata: Option<&[u8]>,
    ) {
        let header = TableHeader {
            name: name.to_string(),
            flags,
            userdata: userdata.map(<[u8]>::to_vec),
        };
        self.message(NEWTABLE, NLM_F_CREATE, family, |w| header.emit(w));
    }

    /// nft's `destroy table`: deletes the table where it exists. An empty
    /// table of that name is added first, so that the deletion cannot fail
    /// (older kernels have no DESTROYTABLE).
    pub fn destroy_table(&mut self, family: Family, name: &str) {
        self.add_table(family, name, None);
        self.delete_table(family, name);
    }

    pub fn delete_table(&mut self, family: Family, name: &str) {
        let header = TableHeader {
            name: name.to_string(),
            flags: 0,
            userdata: None,
        };
        self.message(DELTABLE, 0, family, |w| header.emit(w));
    }

    /// Creates the chain, without its rules.
    pub fn add_chain(&mut self, family: Family, table: &str, chain: &KernelChain) {
        self.message(NEWCHAIN, NLM_F_CREATE, family, |w| chain.emit(table, w));
    }

    pub fn flush_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.message(DELRULE, 0, family, |w| {
            KernelRule::emit_name(table, chain, None, w)
        });
    }

    pub fn delete_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.message(DELCHAIN, 0, family, |w| {
            KernelChain::emit_name(table, chain, w)
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
            rule.emit(table, chain, handle, w)
        });
    }

    pub fn delete_rule(&mut self, family: Family, table: &str, chain: &str, handle: u64) {
        self.message(DELRULE, 0, family, |w| {
            KernelRule::emit_name(table, chain, Some(handle), w)
        });
    }

    /// Creates the set, without its elements.
    pub fn add_set(&mut self, family: Family, table: &str, set: &KernelSet) {
        let id = NEXT_SET_ID.fetch_add(1, Ordering::Relaxed);
        self.message(NEWSET, NLM_F_CREATE, family, |w| set.emit(table, id, w));
    }

    /// Creates a named object; a counter starts at zero, and one that exists
    /// already keeps its values (the kernel treats a second create without
    /// `NLM_F_EXCL` as done).
    pub fn add_object(&mut self, family: Family, table: &str, object: &KernelObject) {
        self.message(NEWOBJ, NLM_F_CREATE, family, |w| object.emit(table, w));
    }

    /// Deletes the object of that type (`ObjectKind::type_id`) and name.
    pub fn delete_object(&mut self, family: Family, table: &str, type_id: u32, name: &str) {
        self.message(DELOBJ, 0, family, |w| {
            KernelObject::emit_name(table, type_id, name, w)
        });
    }

    pub fn delete_set(&mut self, family: Family, table: &str, set: &str) {
        self.message(DELSET, 0, family, |w| KernelSet::emit_name(table, set, w));
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
            e.emit(with_data, &mut w);
            *out = w.into_bytes();
        };
        let mut rest = elements.iter().peekable();
        let mut scratch = Vec::new();
        while rest.peek().is_some() {
            self.message(kind, flags, family, |w| {
                w.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
                w.put_str(NFTA_SET_ELEM_LIST_SET, set);
                w.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |w| {
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

    /// Each message's bytes, in order.
    fn raw_messages(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks.iter().flat_map(|chunk| {
            let mut at = 0;
            std::iter::from_fn(move || {
                if at + NLMSG_HDRLEN > chunk.len() {
                    return None;
                }
                let len = u32::from_ne_bytes(chunk[at..at + 4].try_into().expect("4 bytes"));
                let end = (at + align4(len as usize)).min(chunk.len());
                let msg = &chunk[at..end];
                at = end;
                Some(msg)
            })
        })
    }

    /// How many notifications the kernel builds for this batch when a socket
    /// listens to nf_tables (`listeners`): one per element of an element
    /// message, one per other message (a chain flush, one per rule it held,
    /// is counted once).
    pub fn notifications(&self) -> usize {
        self.raw_messages().map(notifications_of).sum()
    }

    /// The batch cut, in order, into batches of at most `max` notifications
    /// each (an element message holds ~1,000, and stays whole). Each
    /// references only what earlier messages made (`Plan`'s order), so each
    /// part commits on the ones before it.
    pub fn split(self, max: usize) -> Vec<Batch> {
        let mut parts = vec![Batch::new()];
        let mut in_part = 0;
        for msg in self.raw_messages() {
            let n = notifications_of(msg);
            if in_part > 0 && in_part + n > max {
                parts.push(Batch::new());
                in_part = 0;
            }
            in_part += n;
            let part = parts.last_mut().expect("a part");
            match part.chunks.last_mut() {
                Some(c) if c.len() < CHUNK_BYTES => c.extend_from_slice(msg),
                _ => part.chunks.push(msg.to_vec()),
            }
            part.messages += 1;
        }
        parts
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

/// The notifications one message makes (`Batch::notifications`).
fn notifications_of(msg: &[u8]) -> usize {
    let kind = u16::from_ne_bytes([msg[4], msg[5]]);
    if kind != msg_type(NEWSETELEM) && kind != msg_type(DELSETELEM) {
        return 1;
    }
    // After the netlink header and the nfgenmsg.
    super::attr::Attrs::new(msg.get(NLMSG_HDRLEN + 4..).unwrap_or_default())
        .flatten()
        .find(|(k, _)| *k == NFTA_SET_ELEM_LIST_ELEMENTS)
        .map_or(1, |(_, list)| super::attr::Attrs::new(list).count())
}

/// Decodes one of our batch messages back into the words `Batch` was asked
/// for: "add rule to ip kube-nft chain services", "add 3 element(s) of ...".
fn describe_message(m: &NlMsg) -> Option<String> {
    let nfproto = *m.payload.first()?;
    let fam = Family::ALL
        .into_iter()
        .find(|f| f.nfproto() == nfproto)?
        .keyword();
    let body = m.payload.get(4..)?;
    // Every object message starts with its table's name, as a table's does.
    let table = TableHeader::parse(body).ok()?.name;
    let chain = || {
        KernelChain::parse(body, &table)
            .ok()
            .flatten()
            .map(|c| c.name)
    };
    let rule = || KernelRule::parse(body, &table).ok().flatten();
    let set = || {
        KernelSet::parse(body, &table)
            .ok()
            .flatten()
            .map(|s| s.name)
    };
    let object = || {
        let o = KernelObject::parse(body, &table).ok().flatten()?.object;
        Some((o.kind.keyword(), o.name))
    };
    let elements = || {
        let set = KernelElement::list_set(body).ok().flatten()?;
        let n = KernelElement::parse_list(body).ok()?.len();
        Some((n, set))
    };
    Some(match m.kind & 0xff {
        NEWTABLE => format!("add table {fam} {table}"),
        DELTABLE => format!("delete table {fam} {table}"),
        NEWCHAIN => format!("add chain {fam} {table} {}", chain()?),
        DELCHAIN => format!("delete chain {fam} {table} {}", chain()?),
        NEWRULE => {
            let (chain, r) = rule()?;
            if m.flags & NLM_F_REPLACE != 0 {
                let h = r.handle.unwrap_or(0);
                format!("replace rule {h} in {fam} {table} chain {chain}")
            } else if m.flags & NLM_F_APPEND != 0 {
                format!("add rule to {fam} {table} chain {chain}")
            } else {
                format!("insert rule into {fam} {table} chain {chain}")
            }
        }
        DELRULE => {
            let (chain, r) = rule()?;
            match r.handle {
                Some(h) => format!("delete rule {h} from {fam} {table} chain {chain}"),
                None => format!("flush chain {fam} {table} {chain}"),
            }
        }
        NEWSET => format!("add set {fam} {table} {}", set()?),
        DELSET => format!("delete set {fam} {table} {}", set()?),
        NEWOBJ => {
            let (kind, name) = object()?;
            format!("add {kind} {fam} {table} {name}")
        }
        DELOBJ => {
            let (kind, name) = object()?;
            format!("delete {kind} {fam} {table} {name}")
        }
        NEWFLOWTABLE => format!("add flowtable {fam} {table}"),
        DELFLOWTABLE => format!("delete devices of flowtable {fam} {table}"),
        NEWSETELEM => {
            let (n, set) = elements()?;
            format!("add {n} element(s) of {fam} {table} {set}")
        }
        DELSETELEM => {
            let (n, set) = elements()?;
            format!("delete {n} element(s) of {fam} {table} {set}")
        }
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

/// The whole-table replacement, added to `b`: for each table, create it if it is
/// missing, delete it, and write it again with everything in it. Packets see the
/// old ruleset until the commit and the new one after it.
pub fn replace_tables(b: &mut Batch, tables: &[KernelTable]) {
    for t in tables {
        b.destroy_table(t.family, &t.name);
        write_table(b, t);
    }
}

/// Writes a table into an empty namespace, in the order `nft -f` uses: table,
/// chains, counters, sets with their elements, then rules (which may refer to
/// all of them).
pub fn write_table(b: &mut Batch, t: &KernelTable) {
    write_flagged_table(b, t, 0);
}

/// `write_table`, with the table's `NFT_TABLE_F_*` flags.
pub fn write_flagged_table(b: &mut Batch, t: &KernelTable, flags: u32) {
    b.add_table_flagged(t.family, &t.name, flags, t.userdata.as_deref());
    for c in &t.chains {
        b.add_chain(t.family, &t.name, c);
    }
    for o in &t.objects {
        b.add_object(t.family, &t.name, o);
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
        b.destroy_table(t.family, t.name());
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::objects::{ObjectKind, OBJECT_COUNTER, OBJECT_CT_TIMEOUT};

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
        let counter = KernelObject {
            name: "c".into(),
            kind: ObjectKind::Counter,
            userdata: None,
        };
        let timeout = KernelObject {
            name: "t".into(),
            kind: ObjectKind::CtTimeout {
                l3proto: 2,
                l4proto: 17,
                timeouts: vec![5, 5],
            },
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
        b.add_object(f, t, &counter);
        b.add_object(f, t, &timeout);
        b.add_rule(f, t, "svc-x", &rule);
        b.insert_rule(f, t, "svc-x", &rule);
        b.replace_rule(f, t, "svc-x", 42, &rule);
        b.delete_rule(f, t, "svc-x", 43);
        b.add_elements(f, t, "service-ips", &[element.clone(), element.clone()]);
        b.delete_elements(f, t, "service-ips", &[element]);
        b.flush_chain(f, t, "svc-x");
        b.delete_chain(f, t, "svc-x");
        b.delete_set(f, t, "service-ips");
        b.delete_object(f, t, OBJECT_COUNTER, "c");
        b.delete_object(f, t, OBJECT_CT_TIMEOUT, "t");
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
                format!("add ct timeout {at} t"),
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
                format!("delete ct timeout {at} t"),
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
            total += KernelElement::parse_list(&m.payload[4..]).unwrap().len();
        }
        assert_eq!(total, 10_000);
    }

    #[test]
    fn a_split_keeps_every_message_in_order_within_its_notifications() {
        let element = |i: u32| KernelElement {
            key: i.to_be_bytes().to_vec(),
            data: None,
            userdata: None,
        };
        let mut b = Batch::new();
        b.add_table(Family::Ip, "t", None);
        let elements: Vec<KernelElement> = (0..5_000).map(element).collect();
        b.add_elements(Family::Ip, "t", "s", &elements);
        b.delete_elements(Family::Ip, "t", "s", &[element(1), element(2)]);
        b.delete_table(Family::Ip, "t");
        assert_eq!(b.notifications(), 1 + 5_000 + 2 + 1);
        let whole: Vec<String> = {
            let mut copy = Batch::new();
            copy.chunks = b.chunks.clone();
            copy.messages = b.messages;
            copy.finish().described()
        };
        let max = 1_000;
        let parts = b.split(max);
        assert!(parts.len() >= 3, "{} parts", parts.len());
        let mut described = Vec::new();
        for part in parts {
            let n = part.notifications();
            assert!(
                n <= max || part.len() == 1,
                "a part of {n} in {} messages",
                part.len()
            );
            described.extend(part.finish().described());
        }
        assert_eq!(described, whole);
    }
}
