//! The nf_tables netlink socket: commits a `Batch` as one transaction, and
//! reads our tables back through one dump walker (`walk_table`), which the full
//! readback (`read_table`) and the compact one (`nft::view`) both use.

use super::attr::{AttrWriter, ParseError};
use super::batch::{
    msg_type, put_header, GETCHAIN, GETGEN, GETOBJ, GETRULE, GETSET, GETSETELEM, GETTABLE,
};
use super::message::{
    exchange, finish_msg, parse_error, split_messages, Refusal, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use super::objects::{
    KernelChain, KernelElement, KernelObject, KernelRule, KernelSet, KernelTable, ObjectKind,
    ObjectReading, TableHeader, OBJECT_COUNTER,
};
use crate::core::net::Family;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use rustix::net::{SendAncillaryBuffer, SendFlags};
use std::collections::{BTreeSet, HashMap};
use std::io::{self, IoSlice};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::batch::Batch;

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

/// What a committed transaction cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    pub messages: usize,
    pub bytes: usize,
    /// From sending the batch to the kernel's answer: the kernel's share of a sync.
    pub kernel: Duration,
}

impl std::ops::AddAssign for Committed {
    fn add_assign(&mut self, other: Committed) {
        self.messages += other.messages;
        self.bytes += other.bytes;
        self.kernel += other.kernel;
    }
}

/// The most objects a transaction holds while another socket listens to
/// nf_tables in its namespace. The kernel then builds a notification of each
/// object (~8 KiB of slab each: 10k Services x 10, 122k objects, added
/// ~990 MiB) and holds them until the commit ends. Parts of 8192 still added
/// 97 MiB (the listener's queue holds some too); of this size, about half.
pub const LISTENED_PART: usize = 4096;

/// The transactions to send for `batch`: itself, or, when it holds more than
/// `LISTENED_PART` objects and another socket listens to nf_tables here, the
/// batch cut in order into parts of that size (`Batch::split`). This
/// process's monitors are away by then (`monitor::away_for`), so a listener
/// found is someone else's: an operator's `nft monitor`, a security agent.
/// Packets may meet the state between two parts; every part only adds to or
/// removes from what the next ones complete, in the plan's order (sets and
/// chains before the elements and rules that name them).
fn listened_parts(batch: Batch) -> Vec<Batch> {
    let objects = batch.notifications();
    if objects <= LISTENED_PART {
        return vec![batch];
    }
    let listeners = match super::listeners::nftables_listeners() {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!("reading this namespace's netlink sockets: {e}");
            return vec![batch];
        }
    };
    if listeners.is_empty() {
        return vec![batch];
    }
    let parts = batch.split(LISTENED_PART);
    tracing::info!(
        "another process listens to nf_tables here (netlink port {}): a transaction of \
         {objects} objects goes as {} of at most {LISTENED_PART}, so that the kernel holds \
         one part's notifications at a time rather than all of them",
        listeners
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        parts.len()
    );
    parts
}

/// The port ids of this process's sockets that have committed a transaction.
/// An nf_tables notification names the socket that committed it by its port id;
/// the pid it also carries is the committer's in the initial pid namespace, which
/// a process in a container (kube-nft in its DaemonSet) cannot know. So this is
/// how the daemon tells its own commits from another process's.
static COMMITTERS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Whether a notification from netlink port `port` is of a transaction this
/// process committed.
pub fn committed_by_this_process(port: u32) -> bool {
    COMMITTERS.lock().unwrap().contains(&port)
}

/// A netlink socket speaking nf_tables, bound in the network namespace of the
/// thread that opened it.
pub struct NftSocket {
    sock: Socket,
    /// The network namespace it was opened in (`monitor::netns_id`).
    netns: u64,
    /// Whether its port id is in `COMMITTERS`.
    registered: bool,
    /// Reused for every datagram. Its size matters: the kernel sizes the messages
    /// of a dump after the largest buffer we have received into, and an element
    /// dump re-walks the set from its start for every message.
    rx: Vec<u8>,
    /// Where asked for (`track_interruptions`), the dumps of `walk_tables`
    /// that a commit came during.
    interrupted: Option<Interrupted>,
}

/// The dumps of a read that a commit came during (the ruleset's generation
/// moved): a dump goes on by count, so such a dump may have missed or repeated
/// objects, of any table of the family for the family-wide dumps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interrupted {
    /// Of a family's tables, chains, rules, sets and objects.
    pub structure: Vec<Family>,
    /// Element dumps, each of one set: family, table, set.
    pub sets: Vec<(Family, String, String)>,
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
            netns: super::monitor::netns_id(),
            registered: false,
            rx: Vec::with_capacity(RX_BUFFER),
            interrupted: None,
        })
    }

    /// Sends the batch as one transaction. On error nothing was committed.
    /// This process's monitors of the namespace are away meanwhile
    /// (`Monitor::away_during_own_commits`); the generation count, read
    /// before and after, tells them if another process committed then.
    ///
    /// The one exception: a batch of more than `LISTENED_PART` objects, with
    /// another socket listening to nf_tables in the namespace, goes as several
    /// transactions (`listened_parts`). On error the parts before the one
    /// refused stay committed, and the caller's next sync, a full one, reads
    /// them back.
    pub fn commit(&mut self, batch: Batch) -> Result<Committed, NftError> {
        if batch.is_empty() {
            return Ok(Committed::default());
        }
        let mut away = super::monitor::away_for(self.netns);
        let before = away.any().then(|| self.generation().ok()).flatten();
        let mut committed = Committed::default();
        let mut transactions = 0;
        let mut result = Ok(());
        for part in listened_parts(batch) {
            match self.send_batch(part) {
                Ok(c) => {
                    committed += c;
                    transactions += 1;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if away.any() {
            let at_commit = self.generation().ok();
            away.rejoin();
            let after = self.generation().ok();
            if !super::monitor::only_ours(before, at_commit, after, transactions) {
                away.missed();
            }
        }
        result.map(|()| committed)
    }

    /// The kernel's generation count of the ruleset: one more per transaction
    /// committed, by any process.
    fn generation(&mut self) -> Result<u32, NftError> {
        let mut buf = Vec::new();
        let at = put_header(
            &mut buf,
            msg_type(GETGEN),
            NLM_F_REQUEST | NLM_F_ACK,
            1,
            0,
            0,
        );
        finish_msg(&mut buf, at);
        let mut id = None;
        let NftSocket { sock, rx, .. } = self;
        exchange(sock, rx, &buf, |msg| {
            let attrs = msg.payload.get(4..).unwrap_or_default();
            for (k, p) in super::attr::Attrs::new(attrs).flatten() {
                if k == super::monitor::NFTA_GEN_ID {
                    id = Some(super::attr::Payload::new("gen", k, p).u32()?);
                }
            }
            Ok::<(), NftError>(())
        })?;
        id.ok_or_else(|| NftError::Io(io::Error::other("the kernel's generation had no id")))
    }

    fn send_batch(&mut self, batch: Batch) -> Result<Committed, NftError> {
        if !self.registered {
            // Before the first send, so that its notification is known as ours.
            let mut addr = SocketAddr::new(0, 0);
            self.sock.get_address(&mut addr)?;
            COMMITTERS.lock().unwrap().insert(addr.port_number());
            self.registered = true;
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
        let NftSocket { sock, rx, .. } = self;
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

    /// A dump request whose answers are handed to `each` (the payload after
    /// the nfgenmsg) as they arrive, so a large table is never held whole.
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
        let NftSocket { sock, rx, .. } = self;
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
    pub fn find_table(
        &mut self,
        family: Family,
        name: &str,
    ) -> Result<Option<TableHeader>, NftError> {
        let mut found = None;
        self.dump_each(
            GETTABLE,
            family,
            |_| {},
            |t| {
                let header = TableHeader::parse(t)?;
                if header.name == name {
                    found = Some(header);
                }
                Ok(())
            },
        )?;
        Ok(found)
    }

    /// The names of one table's sets and maps, without their elements.
    pub fn set_names(&mut self, family: Family, table: &str) -> Result<Vec<String>, NftError> {
        let mut names = Vec::new();
        self.dump_each(
            GETSET,
            family,
            |w| w.put_str(1, table),
            |s| {
                if let Some(set) = KernelSet::parse(s, table)? {
                    names.push(set.name);
                }
                Ok(())
            },
        )?;
        Ok(names)
    }

    /// The rules of one chain, in order, through a dump filtered by chain: the
    /// kernel finds a named chain by hash, while a whole-table rule dump restarts
    /// its walk at the first rule for every message it fills (quadratic).
    pub fn each_chain_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        mut each: impl FnMut(KernelRule),
    ) -> Result<(), NftError> {
        self.dump_each(
            GETRULE,
            family,
            |w| KernelRule::emit_name(table, chain, None, w),
            |r| {
                if let Some((c, rule)) = KernelRule::parse(r, table)? {
                    if c == chain {
                        each(rule);
                    }
                }
                Ok(())
            },
        )
    }

    /// The elements of one set, as the kernel dumps them; nothing if the set
    /// does not exist.
    pub fn each_set_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        mut each: impl FnMut(KernelElement),
    ) -> Result<(), NftError> {
        let result = self.dump_each(
            GETSETELEM,
            family,
            |w| KernelSet::emit_name(table, set, w),
            |e| {
                for el in KernelElement::parse_list(e)? {
                    each(el);
                }
                Ok(())
            },
        );
        match result {
            Err(NftError::Refused { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(())
            }
            other => other,
        }
    }

    /// Hands each set's elements to its table's visitor. The kernel dumps one
    /// set per request, and the cost of a set grows with the square of its
    /// elements (each dump message walks the set again from its start, to skip
    /// what earlier messages carried), so a few large endpoint maps can take
    /// most of a readback: at 100k Services x 10, sixteen maps of 62,500. The
    /// requests are shared out over a socket per CPU (up to 4), each in its
    /// own thread (which starts in this thread's network namespace), taking
    /// the next set as they finish the last, so that large sets spread over
    /// them whatever their order. This thread visits what they pass it through
    /// a short queue, and reads sets too when it is alone. With `track`,
    /// returns the sets whose dump a commit came during.
    fn visit_elements<'s, V: TableVisitor>(
        &mut self,
        family: Family,
        sets: &'s [(String, String)],
        visitors: &mut HashMap<String, V>,
        track: bool,
    ) -> Result<Vec<&'s (String, String)>, NftError> {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4)
            .min(sets.len());
        type Read<'a> = Result<(&'a (String, String), Vec<KernelElement>, bool), NftError>;
        let mut interrupted = Vec::new();
        let mut visit = |read: Read<'s>| -> Result<(), NftError> {
            let (at, elements, cut) = read?;
            let v = visitors.get_mut(&at.0).expect("a walked table");
            for el in elements {
                v.element(&at.1, el);
            }
            if cut {
                interrupted.push(at);
            }
            Ok(())
        };
        if workers <= 1 {
            for at in sets {
                let (out, cut) = self.set_elements(family, at, track)?;
                visit(Ok((at, out, cut)))?;
            }
            return Ok(interrupted);
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Read>(64);
        std::thread::scope(|scope| {
            // Owned here, so that an early return drops it before the threads
            // are joined, which stops them at their next send.
            let rx = rx;
            for _ in 0..workers {
                let (tx, next) = (tx.clone(), &next);
                scope.spawn(move || {
                    let mut sock = match NftSocket::open() {
                        Ok(sock) => sock,
                        Err(e) => return drop(tx.send(Err(e.into()))),
                    };
                    while let Some(at) =
                        sets.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        let read = sock.set_elements(family, at, track);
                        if tx.send(read.map(|(out, cut)| (at, out, cut))).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            rx.iter().try_for_each(&mut visit)
        })?;
        Ok(interrupted)
    }

    /// One set's elements (`at`: table, set); with `track`, also whether a
    /// commit came during their dump.
    fn set_elements(
        &mut self,
        family: Family,
        at: &(String, String),
        track: bool,
    ) -> Result<(Vec<KernelElement>, bool), NftError> {
        let before = track.then(|| self.generation()).transpose()?;
        let mut out = Vec::new();
        self.each_set_element(family, &at.0, &at.1, |el| out.push(el))?;
        let cut = match before {
            Some(before) => self.generation()? != before,
            None => false,
        };
        Ok((out, cut))
    }

    /// Walks one of our tables: its header, each chain and then its rules, each
    /// set and then its elements, and its counters, each handed to `visit` as
    /// decoded. Returns false (visiting nothing) if the table does not exist.
    pub fn walk_table(
        &mut self,
        family: Family,
        name: &str,
        visit: &mut dyn TableVisitor,
    ) -> Result<bool, NftError> {
        let mut visit = Some(visit);
        let walked = self.walk_tables(family, Some(name), |_| visit.take())?;
        Ok(!walked.is_empty())
    }

    /// From now on, `walk_tables` notes which of its dumps a commit came
    /// during, at two generation reads a dump (`take_interruptions`).
    pub fn track_interruptions(&mut self) {
        self.interrupted = Some(Interrupted::default());
    }

    /// The dumps a commit came during since `track_interruptions`.
    pub fn take_interruptions(&mut self) -> Option<Interrupted> {
        self.interrupted.take()
    }

    /// Walks several tables of one family at once: `open` is shown each table
    /// header (of `only`, or of every table of the family) and gives the
    /// visitor of those to walk. One dump of each kind covers them all, then
    /// one element dump per set: the kernel restarts a dump's walk at the
    /// family's first object for each message it fills, and a request per
    /// chain or per table would multiply the round trips and those walks.
    pub fn walk_tables<V: TableVisitor>(
        &mut self,
        family: Family,
        only: Option<&str>,
        mut open: impl FnMut(&TableHeader) -> Option<V>,
    ) -> Result<HashMap<String, V>, NftError> {
        let mut visitors: HashMap<String, V> = HashMap::new();
        let tracking = self.interrupted.is_some();
        let before = tracking.then(|| self.generation()).transpose()?;
        self.dump_each(
            GETTABLE,
            family,
            |_| {},
            |t| {
                let header = TableHeader::parse(t)?;
                if only.is_none_or(|n| n == header.name) {
                    if let Some(mut v) = open(&header) {
                        let name = header.name.clone();
                        v.table(header);
                        visitors.insert(name, v);
                    }
                }
                Ok(())
            },
        )?;
        if visitors.is_empty() {
            return Ok(visitors);
        }
        let filter = |w: &mut AttrWriter| {
            if let Some(name) = only {
                w.put_str(1, name);
            }
        };
        // Every object message starts with its table's name (attribute 1).
        self.dump_each(GETCHAIN, family, filter, |c| {
            if let Some((table, v)) = visitor_of(&mut visitors, c)? {
                if let Some(chain) = KernelChain::parse(c, &table)? {
                    v.chain(chain);
                }
            }
            Ok(())
        })?;
        self.dump_each(GETRULE, family, filter, |r| {
            if let Some((table, v)) = visitor_of(&mut visitors, r)? {
                if let Some((chain, rule)) = KernelRule::parse(r, &table)? {
                    v.rule(&chain, rule);
                }
            }
            Ok(())
        })?;
        let mut sets = Vec::new();
        self.dump_each(GETSET, family, filter, |s| {
            if let Some((table, v)) = visitor_of(&mut visitors, s)? {
                if let Some(set) = KernelSet::parse(s, &table)? {
                    sets.push((table, set.name.clone()));
                    v.set(set);
                }
            }
            Ok(())
        })?;
        self.dump_each(GETOBJ, family, filter, |o| {
            if let Some((table, v)) = visitor_of(&mut visitors, o)? {
                if let Some(r) = KernelObject::parse(o, &table)? {
                    v.object(r);
                }
            }
            Ok(())
        })?;
        if let Some(before) = before {
            if self.generation()? != before {
                self.interrupted
                    .get_or_insert_default()
                    .structure
                    .push(family);
            }
        }
        let interrupted = self.visit_elements(family, &sets, &mut visitors, tracking)?;
        if let Some(i) = &mut self.interrupted {
            let sets = interrupted
                .into_iter()
                .map(|(t, s)| (family, t.clone(), s.clone()));
            i.sets.extend(sets);
        }
        Ok(visitors)
    }

    /// Reads one of our tables back in full; `None` if it does not exist.
    pub fn read_table(
        &mut self,
        family: Family,
        name: &str,
    ) -> Result<Option<KernelTable>, NftError> {
        let mut table = KernelTable::empty(family, name);
        Ok(self.walk_table(family, name, &mut table)?.then_some(table))
    }

    /// The named counters of one of our tables, with their values.
    pub fn read_counters(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Vec<ObjectReading>, NftError> {
        let mut out = Vec::new();
        self.dump_each(
            GETOBJ,
            family,
            |w| {
                w.put_str(1, table);
                w.put_u32(3, OBJECT_COUNTER);
            },
            |o| {
                let read = KernelObject::parse(o, table)?;
                out.extend(read.filter(|r| r.object.kind == ObjectKind::Counter));
                Ok(())
            },
        )?;
        Ok(out)
    }
}

/// The visitor of the table an object message belongs to, if it is walked.
fn visitor_of<'a, V>(
    visitors: &'a mut HashMap<String, V>,
    body: &[u8],
) -> Result<Option<(String, &'a mut V)>, ParseError> {
    let table = TableHeader::parse_name(body)?;
    Ok(visitors.get_mut(&table).map(|v| (table, v)))
}

/// What `walk_table` hands over, in dump order: the header first, a chain
/// before its rules, a set before its elements.
pub trait TableVisitor {
    fn table(&mut self, header: TableHeader);
    fn chain(&mut self, chain: KernelChain);
    fn rule(&mut self, chain: &str, rule: KernelRule);
    fn set(&mut self, set: KernelSet);
    fn element(&mut self, set: &str, element: KernelElement);
    fn object(&mut self, object: ObjectReading);
}

impl<T: TableVisitor + ?Sized> TableVisitor for &mut T {
    fn table(&mut self, header: TableHeader) {
        (**self).table(header)
    }
    fn chain(&mut self, chain: KernelChain) {
        (**self).chain(chain)
    }
    fn rule(&mut self, chain: &str, rule: KernelRule) {
        (**self).rule(chain, rule)
    }
    fn set(&mut self, set: KernelSet) {
        (**self).set(set)
    }
    fn element(&mut self, set: &str, element: KernelElement) {
        (**self).element(set, element)
    }
    fn object(&mut self, object: ObjectReading) {
        (**self).object(object)
    }
}

/// The full readback: every object decoded and kept.
impl TableVisitor for KernelTable {
    fn table(&mut self, header: TableHeader) {
        self.userdata = header.userdata;
    }

    fn chain(&mut self, chain: KernelChain) {
        self.chains.push(chain);
    }

    fn rule(&mut self, chain: &str, rule: KernelRule) {
        if let Some(c) = self.chains.iter_mut().rev().find(|c| c.name == chain) {
            c.rules.push(rule);
        }
    }

    fn set(&mut self, set: KernelSet) {
        self.sets.push(set);
    }

    fn element(&mut self, set: &str, element: KernelElement) {
        if let Some(s) = self.sets.iter_mut().rev().find(|s| s.name == set) {
            s.elements.push(element);
        }
    }

    fn object(&mut self, object: ObjectReading) {
        self.objects.push(object.object);
    }
}
