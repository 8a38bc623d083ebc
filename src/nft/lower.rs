//! Lowering: ruleset objects → what the kernel stores (expressions, key bytes,
//! userdata), as the wire types of `netlink::objects`.
//!
//! The output is exactly what `nft` 1.0.x writes for the same text (checked by the
//! parity tests against `nft --debug=netlink`), so `nft list ruleset` decompiles our
//! rules as if `nft -f` had loaded them. Readback decodes the kernel into the same
//! `Kernel*` types, which is what makes desired and actual comparable.

use crate::core::net::Family;
use crate::netlink::expr::{
    reg32, CmpOp, CtKey, Data, Expr, MetaKey, PayloadBase, FIB_F_SADDR, FIB_RESULT_ADDRTYPE,
    NAT_PROTO_SPECIFIED, NAT_RANDOM_FULLY, REG_1, REG_2, REG_VERDICT,
};
use crate::netlink::objects::*;
use crate::ruleset::{
    Chain, Element, Field, KeyType, KeyValue, MapData, NamedObject, ObjectDef, Rule, Set, Stmt,
    Table,
};
use std::net::IpAddr;

impl KeyType {
    /// nft's datatype id.
    pub fn type_id(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 7,
            KeyType::Ipv6Addr => 8,
            KeyType::InetProto => 12,
            KeyType::InetService => 13,
            KeyType::Slot => 4,
            KeyType::CtState => 26,
        }
    }

    /// Bytes of the value; in a concatenation each field is padded to 4.
    pub fn size(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 4,
            KeyType::Ipv6Addr => 16,
            KeyType::InetProto => 1,
            KeyType::InetService => 2,
            KeyType::Slot => 4,
            KeyType::CtState => 4,
        }
    }
}

/// A field's size in a concatenation: padded to a 32-bit register.
pub(crate) fn padded(n: u32) -> u32 {
    (n + 3) & !3
}

pub fn lower_set(set: &Set) -> KernelSet {
    let key_type = set
        .key
        .iter()
        .fold(0, |acc, k| (acc << TYPE_BITS) | k.type_id());
    let key_len = if set.key.len() == 1 {
        set.key[0].size()
    } else {
        set.key.iter().map(|k| padded(k.size())).sum()
    };
    let mut ud = Vec::new();
    let key_order = match set.key.as_slice() {
        [KeyType::Slot | KeyType::CtState] => BYTEORDER_HOST_ENDIAN,
        [_] => BYTEORDER_BIG_ENDIAN,
        _ => BYTEORDER_INVALID,
    };
    udata_tlv(&mut ud, UDATA_SET_KEYBYTEORDER, &key_order.to_ne_bytes());
    let verdict_map = set.data == Some(MapData::Verdict);
    let endpoints = match set.data {
        Some(MapData::Endpoint(family)) => Some(family),
        _ => None,
    };
    if verdict_map || endpoints.is_some() {
        udata_tlv(&mut ud, UDATA_SET_DATABYTEORDER, &0u32.to_ne_bytes());
    }
    if let Some(family) = endpoints {
        endpoint_map_typeof(&mut ud, family, &set.key);
    } else if set.key.len() > 1 {
        // A nest: TYPEOF_EXPR = EXPR_CONCAT, then an empty TYPEOF_DATA.
        let mut nest = Vec::new();
        udata_tlv(&mut nest, 0, &EXPR_CONCAT.to_ne_bytes());
        udata_tlv(&mut nest, 1, &[]);
        udata_tlv(&mut ud, UDATA_SET_KEY_TYPEOF, &nest);
    }
    // nft records the data's interval flag for object maps too, not its byte order.
    if set.data.is_some() {
        udata_tlv(&mut ud, UDATA_SET_DATA_INTERVAL, &0u32.to_ne_bytes());
    }
    if let Some(c) = &set.comment {
        udata_tlv(&mut ud, UDATA_SET_COMMENT, &strz(c));
    }
    let mut flags = match set.data {
        Some(MapData::Verdict | MapData::Endpoint(..)) => SET_F_MAP,
        Some(MapData::Counter) => SET_F_OBJECT,
        None => 0,
    };
    if set.timeout.is_some() {
        flags |= SET_F_TIMEOUT | SET_F_EVAL;
    }
    KernelSet {
        name: set.name.clone(),
        flags,
        key_type,
        key_len,
        data_type: match set.data {
            Some(MapData::Verdict) => Some(DATA_TYPE_VERDICT),
            Some(MapData::Endpoint(family)) => {
                Some((family.addr_type().type_id() << TYPE_BITS) | KeyType::InetService.type_id())
            }
            _ => None,
        },
        data_len: endpoints
            .map(|family| padded(family.addr_type().size()) + padded(KeyType::InetService.size())),
        obj_type: (set.data == Some(MapData::Counter)).then_some(OBJECT_COUNTER),
        timeout_ms: set.timeout.map(|t| t as u64 * 1000),
        size: set.size,
        userdata: Some(ud),
        elements: set.elements.iter().map(lower_element).collect(),
    }
}

/// What `nft` records of an endpoint map's `typeof ip daddr . meta l4proto .
/// th dport . numgen random mod 1 : ip daddr . th dport`: each field of the key
/// and of the data as the expression it was declared with (payload fields as
/// nft's protocol description and field ids; `meta` by key; `numgen` as type
/// random, modulus 1, offset 0), so that `nft list` prints the map that way.
fn endpoint_map_typeof(ud: &mut Vec<u8>, family: Family, key: &[KeyType]) {
    let u32s = |fields: &[u32]| {
        let mut out = Vec::new();
        for (i, v) in fields.iter().enumerate() {
            udata_tlv(&mut out, i as u8, &v.to_ne_bytes());
        }
        out
    };
    let typeof_expr = |expr: u32, data: &[u8]| {
        let mut out = Vec::new();
        udata_tlv(&mut out, 0, &expr.to_ne_bytes());
        udata_tlv(&mut out, 1, data);
        out
    };
    let concat = |exprs: Vec<Vec<u8>>| {
        let mut fields = Vec::new();
        for (i, e) in exprs.iter().enumerate() {
            udata_tlv(&mut fields, i as u8, e);
        }
        typeof_expr(EXPR_CONCAT, &fields)
    };
    // nft's proto_desc ids and header field ids: the address family's daddr,
    // and `th` (any transport header) dport.
    let daddr = match family {
        Family::Ip => typeof_expr(EXPR_PAYLOAD, &u32s(&[12, 12])),
        Family::Ip6 => typeof_expr(EXPR_PAYLOAD, &u32s(&[13, 9])),
    };
    let dport = typeof_expr(EXPR_PAYLOAD, &u32s(&[11, 2]));
    const META_L4PROTO: u32 = 16;
    const RANDOM: u32 = 1;
    let key_exprs = key
        .iter()
        .map(|k| match k {
            KeyType::Ipv4Addr | KeyType::Ipv6Addr => daddr.clone(),
            KeyType::InetProto => typeof_expr(EXPR_META, &u32s(&[META_L4PROTO])),
            KeyType::InetService => dport.clone(),
            KeyType::Slot => typeof_expr(EXPR_NUMGEN, &u32s(&[RANDOM, 1, 0])),
            KeyType::CtState => unreachable!("an endpoint map's key is a Service port and a slot"),
        })
        .collect();
    udata_tlv(ud, UDATA_SET_KEY_TYPEOF, &concat(key_exprs));
    udata_tlv(ud, UDATA_SET_DATA_TYPEOF, &concat(vec![daddr, dport]));
}

pub fn lower_key(key: &[KeyValue], concatenated: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for v in key {
        match v {
            KeyValue::Addr(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            KeyValue::Addr(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            KeyValue::Proto(p) => out.push(p.number()),
            KeyValue::Port(p) => out.extend_from_slice(&p.to_be_bytes()),
            KeyValue::Slot(n) => out.extend_from_slice(&n.to_ne_bytes()),
            KeyValue::CtStateNew => out.extend_from_slice(&CT_STATE_NEW.to_ne_bytes()),
        }
        if concatenated {
            out.resize(padded(out.len() as u32) as usize, 0);
        }
    }
    out
}

/// An element's key is concatenated (each field padded) exactly when it has
/// several fields, as its set's key type does.
pub fn lower_element(e: &Element) -> KernelElement {
    KernelElement {
        key: lower_key(&e.key, e.key.len() > 1),
        data: e.value.clone(),
        userdata: comment_udata(&e.comment),
    }
}

pub fn lower_chain(family: Family, chain: &Chain) -> KernelChain {
    KernelChain {
        name: chain.name.clone(),
        base: chain.base,
        userdata: comment_udata(&chain.comment),
        rules: chain.rules.iter().map(|r| lower_rule(family, r)).collect(),
    }
}

pub fn lower_object(family: Family, o: &NamedObject) -> KernelObject {
    let kind = match &o.kind {
        ObjectDef::Counter => ObjectKind::Counter,
        ObjectDef::CtTimeout(p) => ObjectKind::CtTimeout {
            l3proto: family.nfproto().into(),
            l4proto: p.protocol.number(),
            timeouts: p.timeouts(),
        },
    };
    KernelObject {
        name: o.name.clone(),
        kind,
        userdata: comment_udata(&o.comment),
    }
}

pub fn lower_table(table: &Table) -> KernelTable {
    KernelTable {
        family: table.family,
        name: table.name.clone(),
        userdata: comment_udata(&table.comment),
        objects: table
            .objects
            .iter()
            .map(|o| lower_object(table.family, o))
            .collect(),
        sets: table.sets.iter().map(lower_set).collect(),
        chains: table
            .chains
            .iter()
            .map(|c| lower_chain(table.family, c))
            .collect(),
    }
}

pub fn lower_rule(family: Family, rule: &Rule) -> KernelRule {
    let mut exprs = Vec::new();
    // nft puts the protocol match a TCP reset depends on at the head of the rule.
    if rule.stmts.contains(&Stmt::RejectTcpReset) {
        lower_stmt(
            family,
            &Stmt::L4Proto(crate::core::net::Protocol::Tcp),
            &mut exprs,
        );
    }
    for s in &rule.stmts {
        lower_stmt(family, s, &mut exprs);
    }
    KernelRule {
        handle: None,
        exprs,
        userdata: comment_udata(&rule.comment),
    }
}

/// Loads `field` into the 32-bit register slot `slot`; returns the slots used.
fn load_field(family: Family, field: Field, slot: u32, out: &mut Vec<Expr>) -> u32 {
    let dreg = reg32(slot);
    match field {
        Field::Saddr | Field::Daddr => {
            let (offset, len) = addr_location(family, field);
            out.push(Expr::Payload {
                dreg,
                base: PayloadBase::Network,
                offset,
                len,
            });
            len / 4
        }
        Field::L4Proto => {
            out.push(Expr::Meta {
                dreg,
                key: MetaKey::L4Proto,
            });
            1
        }
        Field::Dport | Field::Sport => {
            out.push(Expr::Payload {
                dreg,
                base: PayloadBase::Transport,
                offset: if field == Field::Dport { 2 } else { 0 },
                len: 2,
            });
            1
        }
        Field::CtState => {
            out.push(Expr::Ct {
                dreg,
                key: CtKey::State,
                direction: None,
            });
            1
        }
    }
}

fn addr_location(family: Family, field: Field) -> (u32, u32) {
    match (family, field) {
        (Family::Ip, Field::Saddr) => (12, 4),
        (Family::Ip, _) => (16, 4),
        (Family::Ip6, Field::Saddr) => (8, 16),
        (Family::Ip6, _) => (24, 16),
    }
}

/// Loads `fields` as a concatenation from the first register on; returns the
/// 32-bit slots used.
fn load_concat(family: Family, fields: &[Field], out: &mut Vec<Expr>) -> u32 {
    fields
        .iter()
        .fold(0, |slot, f| slot + load_field(family, *f, slot, out))
}

fn addr_bytes(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The size of a connection's labels (`NF_CT_LABELS_MAX_SIZE`).
const LABEL_BYTES: u32 = 16;

/// `ct state new`: the state bit of a connection's first packets.
pub(crate) const CT_STATE_NEW: u32 = 8;

/// One label bit, as the kernel's bitmap of them holds it.
pub(crate) fn label_bits(bit: u8) -> Vec<u8> {
    let mut v = vec![0; LABEL_BYTES as usize];
    v[(bit / 8) as usize] = 1 << (bit % 8);
    v
}

/// `load` into the first register, then only the bits of `mask` kept there:
/// what a bit test compares.
fn masked(load: Expr, mask: Vec<u8>, out: &mut Vec<Expr>) {
    out.push(load);
    out.push(Expr::Bitwise {
        sreg: REG_1,
        dreg: REG_1,
        len: mask.len() as u32,
        xor: vec![0; mask.len()],
        mask,
    });
}

fn mark_rewrite(mask: u32, xor: u32, out: &mut Vec<Expr>) {
    out.push(Expr::Meta {
        dreg: REG_1,
        key: MetaKey::Mark,
    });
    out.push(Expr::Bitwise {
        sreg: REG_1,
        dreg: REG_1,
        len: 4,
        mask: mask.to_ne_bytes().to_vec(),
        xor: xor.to_ne_bytes().to_vec(),
    });
    out.push(Expr::MetaSet {
        sreg: REG_1,
        key: MetaKey::Mark,
    });
}

pub fn lower_stmt(family: Family, stmt: &Stmt, out: &mut Vec<Expr>) {
    let cmp = |op, data: Vec<u8>| Expr::Cmp {
        sreg: REG_1,
        op,
        data,
    };
    match stmt {
        Stmt::AddrMatch { field, net, negate } => {
            let op = if *negate { CmpOp::Neq } else { CmpOp::Eq };
            let (offset, len) = addr_location(family, *field);
            let prefix = net.prefix_len() as u32;
            let addr = addr_bytes(&net.network());
            if prefix.is_multiple_of(8) {
                // nft loads only the whole bytes a byte-aligned prefix covers.
                out.push(Expr::Payload {
                    dreg: REG_1,
                    base: PayloadBase::Network,
                    offset,
                    len: prefix / 8,
                });
                out.push(cmp(op, addr[..(prefix / 8) as usize].to_vec()));
            } else {
                out.push(Expr::Payload {
                    dreg: REG_1,
                    base: PayloadBase::Network,
                    offset,
                    len,
                });
                out.push(Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    len,
                    mask: addr_bytes(&net.netmask()),
                    xor: vec![0; len as usize],
                });
                out.push(cmp(op, addr));
            }
        }
        Stmt::L4Proto(p) => {
            out.push(Expr::Meta {
                dreg: REG_1,
                key: MetaKey::L4Proto,
            });
            out.push(cmp(CmpOp::Eq, vec![p.number()]));
        }
        Stmt::CtStateNew => {
            let state = Expr::Ct {
                dreg: REG_1,
                key: CtKey::State,
                direction: None,
            };
            masked(state, CT_STATE_NEW.to_ne_bytes().to_vec(), out);
            out.push(cmp(CmpOp::Neq, vec![0; 4]));
        }
        Stmt::CtDirection(d) => {
            out.push(Expr::Ct {
                dreg: REG_1,
                key: CtKey::Direction,
                direction: None,
            });
            out.push(cmp(CmpOp::Eq, vec![d.code()]));
        }
        Stmt::FibSaddrLocal => {
            const RTN_LOCAL: u32 = 2;
            out.push(Expr::Fib {
                dreg: REG_1,
                result: FIB_RESULT_ADDRTYPE,
                flags: FIB_F_SADDR,
            });
            out.push(cmp(CmpOp::Eq, RTN_LOCAL.to_ne_bytes().to_vec()));
        }
        Stmt::MarkHas(m) => {
            let mark = Expr::Meta {
                dreg: REG_1,
                key: MetaKey::Mark,
            };
            masked(mark, m.to_ne_bytes().to_vec(), out);
            out.push(cmp(CmpOp::Eq, m.to_ne_bytes().to_vec()));
        }
        Stmt::NumgenEq { modulus, value } => {
            out.push(Expr::Numgen {
                dreg: REG_1,
                modulus: *modulus,
            });
            // numgen's result is host endian.
            out.push(cmp(CmpOp::Eq, value.to_ne_bytes().to_vec()));
        }
        Stmt::NumgenBelow { modulus, bound } => {
            out.push(Expr::Numgen {
                dreg: REG_1,
                modulus: *modulus,
            });
            // The kernel compares for order byte by byte, so nft turns the
            // host-endian number big-endian first.
            out.push(Expr::Hton {
                sreg: REG_1,
                dreg: REG_1,
                len: 4,
                size: 4,
            });
            out.push(cmp(CmpOp::Lt, bound.to_be_bytes().to_vec()));
        }
        Stmt::InSet { fields, set } => {
            load_concat(family, fields, out);
            out.push(Expr::Lookup {
                sreg: REG_1,
                set: set.clone(),
                dreg: None,
                invert: false,
            });
        }
        Stmt::Vmap { fields, map } => {
            load_concat(family, fields, out);
            out.push(Expr::Lookup {
                sreg: REG_1,
                set: map.clone(),
                dreg: Some(REG_VERDICT),
                invert: false,
            });
        }
        Stmt::SetUpdate { field, set } => {
            load_field(family, *field, 0, out);
            out.push(Expr::DynsetUpdate {
                sreg: REG_1,
                set: set.clone(),
            });
        }
        Stmt::MarkOr(m) => mark_rewrite(!m, *m, out),
        Stmt::MarkXor(m) => mark_rewrite(u32::MAX, *m, out),
        Stmt::Dnat { addr, port } => {
            out.push(Expr::Immediate {
                dreg: REG_1,
                data: Data::Value(addr_bytes(addr)),
            });
            out.push(Expr::Immediate {
                dreg: REG_2,
                data: Data::Value(port.to_be_bytes().to_vec()),
            });
            out.push(Expr::Dnat {
                family: family.nfproto(),
                addr_reg: REG_1,
                proto_reg: Some(REG_2),
                flags: NAT_PROTO_SPECIFIED,
            });
        }
        Stmt::DnatPick {
            fields,
            modulus,
            map,
        } => {
            let slot = load_concat(family, fields, out);
            out.push(Expr::Numgen {
                dreg: reg32(slot),
                modulus: *modulus,
            });
            out.push(Expr::Lookup {
                sreg: REG_1,
                set: map.clone(),
                dreg: Some(REG_1),
                invert: false,
            });
            // The port follows the address in the registers, as in a concatenation.
            let port_reg = reg32(family.addr_type().size() / 4);
            // nft leaves the flag to the kernel, which sets it for a port
            // register and dumps it: sent, it reads back the same.
            out.push(Expr::Dnat {
                family: family.nfproto(),
                addr_reg: REG_1,
                proto_reg: Some(port_reg),
                flags: NAT_PROTO_SPECIFIED,
            });
        }
        Stmt::Masquerade { fully_random } => out.push(Expr::Masq {
            flags: if *fully_random { NAT_RANDOM_FULLY } else { 0 },
        }),
        Stmt::Reject => {
            // NFT_REJECT_ICMP_UNREACH with "port unreachable" of the family's ICMP.
            let code = match family {
                Family::Ip => 3,
                Family::Ip6 => 4,
            };
            out.push(Expr::Reject { kind: 0, code });
        }
        // Its `meta l4proto tcp` dependency is placed by `lower_rule`.
        Stmt::RejectTcpReset => out.push(Expr::Reject { kind: 1, code: 0 }),
        Stmt::Counter => out.push(Expr::Counter {
            packets: 0,
            bytes: 0,
        }),
        Stmt::CounterByMap { fields, map } => {
            load_concat(family, fields, out);
            out.push(Expr::ObjrefMap {
                sreg: REG_1,
                set: map.clone(),
            });
        }
        Stmt::CtTimeoutSet(name) => out.push(Expr::Objref {
            obj_type: OBJECT_CT_TIMEOUT,
            name: name.clone(),
        }),
        Stmt::CtLabelSet(bit) => {
            out.push(Expr::Immediate {
                dreg: REG_1,
                data: Data::Value(label_bits(*bit)),
            });
            out.push(Expr::CtSet {
                sreg: REG_1,
                key: CtKey::Labels,
            });
        }
        Stmt::CtLabelHas(bit) => {
            let labels = Expr::Ct {
                dreg: REG_1,
                key: CtKey::Labels,
                direction: None,
            };
            masked(labels, label_bits(*bit), out);
            out.push(cmp(CmpOp::Neq, vec![0; LABEL_BYTES as usize]));
        }
        Stmt::CtPacketsAbove { direction, count } => {
            out.push(Expr::Ct {
                dreg: REG_1,
                key: CtKey::Packets,
                direction: Some(direction.code()),
            });
            // A host-endian counter, compared for order as big-endian bytes.
            out.push(Expr::Hton {
                sreg: REG_1,
                dreg: REG_1,
                len: 8,
                size: 8,
            });
            out.push(cmp(CmpOp::Gt, count.to_be_bytes().to_vec()));
        }
        Stmt::FlowAdd(flowtable) => out.push(Expr::FlowOffload {
            flowtable: flowtable.clone(),
        }),
        Stmt::Verdict(v) => out.push(Expr::Immediate {
            dreg: REG_VERDICT,
            data: Data::Verdict(v.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::net::Protocol;

    // Expected bytecode below is what `nft --debug=netlink` 1.0.6 prints for the rule.

    #[test]
    fn byte_aligned_prefix_loads_only_the_prefix_bytes() {
        let mut out = Vec::new();
        lower_stmt(
            Family::Ip,
            &Stmt::AddrMatch {
                field: Field::Saddr,
                net: "10.244.0.0/16".parse().unwrap(),
                negate: true,
            },
            &mut out,
        );
        assert_eq!(
            out,
            vec![
                Expr::Payload {
                    dreg: 1,
                    base: PayloadBase::Network,
                    offset: 12,
                    len: 2
                },
                Expr::Cmp {
                    sreg: 1,
                    op: CmpOp::Neq,
                    data: vec![10, 244]
                },
            ]
        );
    }

    #[test]
    fn unaligned_ipv6_prefix_is_masked() {
        let mut out = Vec::new();
        lower_stmt(
            Family::Ip6,
            &Stmt::AddrMatch {
                field: Field::Saddr,
                net: "fd00:10:244::/52".parse().unwrap(),
                negate: true,
            },
            &mut out,
        );
        assert_eq!(out.len(), 3);
        match &out[1] {
            Expr::Bitwise { len, mask, .. } => {
                assert_eq!(*len, 16);
                assert_eq!(&mask[..8], &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0, 0]);
            }
            other => panic!("expected bitwise, got {other:?}"),
        }
    }

    #[test]
    fn concatenated_ipv6_key_uses_nft_registers() {
        let mut out = Vec::new();
        lower_stmt(
            Family::Ip6,
            &Stmt::Vmap {
                fields: vec![Field::Daddr, Field::L4Proto, Field::Dport],
                map: "service-ips".into(),
            },
            &mut out,
        );
        let dregs: Vec<u32> = out
            .iter()
            .filter_map(|e| match e {
                Expr::Payload { dreg, .. } | Expr::Meta { dreg, .. } => Some(*dreg),
                _ => None,
            })
            .collect();
        assert_eq!(dregs, vec![1, 2, 13]);
    }

    #[test]
    fn service_map_key_is_padded_per_field() {
        let key = lower_key(
            &[
                KeyValue::Addr("10.0.1.175".parse().unwrap()),
                KeyValue::Proto(Protocol::Tcp),
                KeyValue::Port(80),
            ],
            true,
        );
        assert_eq!(key, vec![10, 0, 1, 175, 6, 0, 0, 0, 0, 80, 0, 0]);
    }

    #[test]
    fn service_map_type_matches_nft() {
        let set = lower_set(&Set {
            name: "service-ips".into(),
            key: vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
            data: Some(MapData::Verdict),
            comment: None,
            timeout: None,
            size: None,
            elements: vec![],
        });
        assert_eq!(set.key_type, 0x730d);
        assert_eq!(set.key_len, 12);
        assert_eq!(set.flags, SET_F_MAP);
        assert_eq!(
            set.userdata.unwrap(),
            vec![
                0, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 3, 8, 0, 4, 13, 0, 0, 0, 1, 0, 6, 4, 0, 0, 0, 0
            ]
        );
    }

    #[test]
    fn comments_round_trip_through_userdata() {
        let c = Some("default/hostnames:http".to_string());
        assert_eq!(comment_of(&comment_udata(&c)), c);
    }
}
