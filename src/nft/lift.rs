//! Lifting: what the kernel holds in our tables, back into `ruleset` objects.
//! The inverse of `lower`, for exactly the shapes `lower` writes, so that
//! `explain` can walk the live ruleset of a node with the same interpreter it
//! uses for the desired one.
//!
//! Each object is recognised by pattern, then lowered again and compared with
//! what was read: a lift either reproduces the kernel's bytes or fails, naming
//! the object. A rule someone else added to our tables is an error, not a guess.

use crate::core::net::{Family, Protocol};
use crate::netlink::attr::ip_from_bytes;
use crate::netlink::expr::{CmpOp, CtKey, Data, Expr, MetaKey, PayloadBase, REG_1, REG_VERDICT};
use crate::netlink::objects::*;
use crate::nft::lower::{lower_element, lower_object, lower_rule, lower_set, padded, CT_STATE_NEW};
use crate::ruleset::{
    Chain, CtTimeoutPolicy, Direction, Element, Field, KeyType, KeyValue, MapData, NamedObject,
    ObjectDef, Rule, Set, Stmt, Table,
};
use ipnet::IpNet;
use std::fmt;

/// An object of our table that `lower` could not have written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiftError(String);

impl fmt::Display for LiftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LiftError {}

pub fn lift_table(k: &KernelTable) -> Result<Table, LiftError> {
    let at = |what: String| LiftError(format!("table {} {}: {what}", k.family.keyword(), k.name));
    let sets = k
        .sets
        .iter()
        .map(|s| lift_set(k.family, s).map_err(|e| at(e.0)))
        .collect::<Result<Vec<_>, _>>()?;
    let chains = k
        .chains
        .iter()
        .map(|c| lift_chain(k.family, c).map_err(|e| at(e.0)))
        .collect::<Result<Vec<_>, _>>()?;
    let objects = k
        .objects
        .iter()
        .map(|o| lift_object(k.family, o).map_err(|e| at(e.0)))
        .collect::<Result<Vec<_>, _>>()?;
    let comment = comment_of(&k.userdata);
    same(&comment_udata(&comment), &k.userdata, || {
        "its comment".into()
    })
    .map_err(|e| at(e.0))?;
    Ok(Table {
        family: k.family,
        name: k.name.clone(),
        comment,
        objects,
        sets,
        chains,
    })
}

/// Every lifted object is lowered again and must be what was read: userdata
/// beyond a comment, padding, flags `lower` does not set all fail here.
fn same<T: PartialEq>(again: &T, read: &T, what: impl FnOnce() -> String) -> Result<(), LiftError> {
    if again == read {
        Ok(())
    } else {
        Err(LiftError(format!("{} is not what kube-nft writes", what())))
    }
}

pub fn lift_chain(family: Family, k: &KernelChain) -> Result<Chain, LiftError> {
    let rules = k
        .rules
        .iter()
        .map(|r| {
            lift_rule(family, r).map_err(|e| {
                let handle = r
                    .handle
                    .map_or_else(String::new, |h| format!(" (handle {h})"));
                LiftError(format!("chain {}, rule{handle}: {}", k.name, e.0))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let comment = comment_of(&k.userdata);
    same(&comment_udata(&comment), &k.userdata, || {
        format!("chain {}'s comment", k.name)
    })?;
    Ok(Chain {
        name: k.name.clone(),
        base: k.base,
        comment,
        rules,
    })
}

pub fn lift_rule(family: Family, k: &KernelRule) -> Result<Rule, LiftError> {
    let mut stmts = Vec::new();
    let mut rest = k.exprs.as_slice();
    while !rest.is_empty() {
        let (stmt, used) = lift_stmt(family, rest).ok_or_else(|| {
            LiftError(format!("not a statement kube-nft writes, at {:?}", rest[0]))
        })?;
        stmts.push(stmt);
        rest = &rest[used..];
    }
    // `lower_rule` puts a TCP reset's protocol match at the head of the rule.
    if stmts.contains(&Stmt::RejectTcpReset) && stmts.first() == Some(&Stmt::L4Proto(Protocol::Tcp))
    {
        stmts.remove(0);
    }
    let rule = Rule {
        stmts,
        comment: comment_of(&k.userdata),
    };
    let again = lower_rule(family, &rule);
    if !again.same_as(k) {
        return Err(LiftError(format!(
            "reads as `{}` but is not what that lowers to",
            crate::ruleset::text::rule(family, &rule)
        )));
    }
    Ok(rule)
}

fn lift_object(family: Family, k: &KernelObject) -> Result<NamedObject, LiftError> {
    let what = || format!("{} {}", k.kind.keyword(), k.name);
    let kind = match &k.kind {
        ObjectKind::Counter => Some(ObjectDef::Counter),
        ObjectKind::CtTimeout {
            l4proto, timeouts, ..
        } => Protocol::from_number(*l4proto)
            .and_then(|p| CtTimeoutPolicy::from_timeouts(p, timeouts))
            .map(ObjectDef::CtTimeout),
    };
    let kind = kind.ok_or_else(|| LiftError(format!("{}: not one we write", what())))?;
    let object = NamedObject {
        name: k.name.clone(),
        comment: comment_of(&k.userdata),
        kind,
    };
    same(&lower_object(family, &object), k, what).map(|()| object)
}

/// The statement at the head of `exprs`, and how many expressions it took.
/// Loose on registers and constants: `lift_rule` lowers the result again and
/// compares.
fn lift_stmt(family: Family, exprs: &[Expr]) -> Option<(Stmt, usize)> {
    use Expr::*;
    let stmt = match exprs {
        [Immediate {
            dreg: REG_VERDICT,
            data: Data::Verdict(v),
        }, ..] => (Stmt::Verdict(v.clone()), 1),
        [Masq { flags }, ..] => (
            Stmt::Masquerade {
                fully_random: flags & crate::netlink::expr::NAT_RANDOM_FULLY != 0,
            },
            1,
        ),
        [Reject { kind: 0, .. }, ..] => (Stmt::Reject, 1),
        [Reject { kind: 1, .. }, ..] => (Stmt::RejectTcpReset, 1),
        [Counter { .. }, ..] => (Stmt::Counter, 1),
        [Objref {
            obj_type: OBJECT_CT_TIMEOUT,
            name,
        }, ..] => (Stmt::CtTimeoutSet(name.clone()), 1),
        [Meta {
            key: MetaKey::L4Proto,
            ..
        }, Cmp {
            op: CmpOp::Eq,
            data,
            ..
        }, ..] => (Stmt::L4Proto(protocol(data)?), 2),
        [Ct {
            key: CtKey::State, ..
        }, Bitwise { .. }, Cmp { .. }, ..] => (Stmt::CtStateNew, 3),
        [Ct {
            key: CtKey::Direction,
            ..
        }, Cmp { data, .. }, ..] => {
            let d = match data.as_slice() {
                [0] => Direction::Original,
                [1] => Direction::Reply,
                _ => return None,
            };
            (Stmt::CtDirection(d), 2)
        }
        [Fib { .. }, Cmp { .. }, ..] => (Stmt::FibSaddrLocal, 2),
        [Immediate {
            data: Data::Value(bits),
            ..
        }, CtSet {
            key: CtKey::Labels, ..
        }, ..] => (Stmt::CtLabelSet(label_bit(bits)?), 2),
        [Ct {
            key: CtKey::Labels, ..
        }, Bitwise { mask, .. }, Cmp { .. }, ..] => (Stmt::CtLabelHas(label_bit(mask)?), 3),
        [Ct {
            key: CtKey::Packets,
            direction: Some(d),
            ..
        }, Hton { .. }, Cmp {
            op: CmpOp::Gt,
            data,
            ..
        }, ..] => {
            let direction = match d {
                0 => Direction::Original,
                1 => Direction::Reply,
                _ => return None,
            };
            let count = u64::from_be_bytes(data.as_slice().try_into().ok()?);
            (Stmt::CtPacketsAbove { direction, count }, 3)
        }
        [FlowOffload { flowtable }, ..] => (Stmt::FlowAdd(flowtable.clone()), 1),
        [Meta {
            key: MetaKey::Mark, ..
        }, Bitwise { mask, .. }, Cmp { .. }, ..] => (Stmt::MarkHas(u32_ne(mask)?), 3),
        [Meta {
            key: MetaKey::Mark, ..
        }, Bitwise { mask, xor, .. }, MetaSet {
            key: MetaKey::Mark, ..
        }, ..] => {
            let (mask, xor) = (u32_ne(mask)?, u32_ne(xor)?);
            let stmt = if mask == u32::MAX {
                Stmt::MarkXor(xor)
            } else {
                Stmt::MarkOr(xor)
            };
            (stmt, 3)
        }
        [Numgen { modulus, .. }, Hton { .. }, Cmp {
            op: CmpOp::Lt,
            data,
            ..
        }, ..] => (
            Stmt::NumgenBelow {
                modulus: *modulus,
                bound: u32::from_be_bytes(data.as_slice().try_into().ok()?),
            },
            3,
        ),
        [Numgen { modulus, .. }, Cmp { data, .. }, ..] => (
            Stmt::NumgenEq {
                modulus: *modulus,
                value: u32_ne(data)?,
            },
            2,
        ),
        [Immediate {
            data: Data::Value(addr),
            ..
        }, Immediate {
            data: Data::Value(port),
            ..
        }, Dnat { .. }, ..] => (
            Stmt::Dnat {
                addr: ip_from_bytes(addr)?,
                port: u16::from_be_bytes(port.as_slice().try_into().ok()?),
            },
            3,
        ),
        [Payload {
            base: PayloadBase::Network,
            offset,
            len,
            ..
        }, Cmp { op, data, .. }, ..] => {
            let field = addr_field(family, *offset)?;
            let mut addr = data.clone();
            addr.resize(family_len(family), 0);
            (addr_match(field, &addr, len.checked_mul(8)?, *op)?, 2)
        }
        [Payload {
            base: PayloadBase::Network,
            offset,
            ..
        }, Bitwise { mask, .. }, Cmp { op, data, .. }, ..] => {
            let field = addr_field(family, *offset)?;
            let prefix = mask.iter().map(|b| b.count_ones()).sum();
            (addr_match(field, data, prefix, *op)?, 3)
        }
        _ => return lift_lookup(family, exprs),
    };
    Some(stmt)
}

/// A key loaded field by field, then what uses it: a set, a verdict map, a
/// dynamic set's update, a counter map, or (with a slot after it) an endpoint
/// map that a DNAT reads.
fn lift_lookup(family: Family, exprs: &[Expr]) -> Option<(Stmt, usize)> {
    let mut fields = Vec::new();
    for (i, e) in exprs.iter().enumerate() {
        let stmt = match e {
            Expr::Payload {
                base: PayloadBase::Network,
                offset,
                ..
            } => {
                fields.push(addr_field(family, *offset)?);
                continue;
            }
            Expr::Payload {
                base: PayloadBase::Transport,
                offset,
                ..
            } => {
                fields.push(match offset {
                    0 => Field::Sport,
                    2 => Field::Dport,
                    _ => return None,
                });
                continue;
            }
            Expr::Meta {
                key: MetaKey::L4Proto,
                ..
            } => {
                fields.push(Field::L4Proto);
                continue;
            }
            Expr::Ct {
                key: CtKey::State,
                direction: None,
                ..
            } => {
                fields.push(Field::CtState);
                continue;
            }
            _ if fields.is_empty() => return None,
            Expr::Numgen { modulus, .. } => {
                let [Expr::Lookup {
                    set,
                    dreg: Some(REG_1),
                    ..
                }, Expr::Dnat { .. }, ..] = &exprs[i + 1..]
                else {
                    return None;
                };
                let pick = Stmt::DnatPick {
                    fields,
                    modulus: *modulus,
                    map: set.clone(),
                };
                return Some((pick, i + 3));
            }
            Expr::Lookup {
                set, dreg: None, ..
            } => Stmt::InSet {
                fields,
                set: set.clone(),
            },
            Expr::Lookup {
                set,
                dreg: Some(REG_VERDICT),
                ..
            } => Stmt::Vmap {
                fields,
                map: set.clone(),
            },
            Expr::DynsetUpdate { set, .. } if fields.len() == 1 => Stmt::SetUpdate {
                field: fields[0],
                set: set.clone(),
            },
            Expr::ObjrefMap { set, .. } => Stmt::CounterByMap {
                fields,
                map: set.clone(),
            },
            _ => return None,
        };
        return Some((stmt, i + 1));
    }
    None
}

fn addr_field(family: Family, offset: u32) -> Option<Field> {
    match (family, offset) {
        (Family::Ip, 12) | (Family::Ip6, 8) => Some(Field::Saddr),
        (Family::Ip, 16) | (Family::Ip6, 24) => Some(Field::Daddr),
        _ => None,
    }
}

fn family_len(family: Family) -> usize {
    family.addr_type().size() as usize
}

fn addr_match(field: Field, addr: &[u8], prefix: u32, op: CmpOp) -> Option<Stmt> {
    let net = IpNet::new(ip_from_bytes(addr)?, u8::try_from(prefix).ok()?).ok()?;
    Some(Stmt::AddrMatch {
        field,
        net,
        negate: op == CmpOp::Neq,
    })
}

/// The one label bit a 16-byte bitmap has set.
fn label_bit(bits: &[u8]) -> Option<u8> {
    let set: Vec<usize> = (0..bits.len() * 8)
        .filter(|i| bits[i / 8] & (1 << (i % 8)) != 0)
        .collect();
    match set.as_slice() {
        [bit] => u8::try_from(*bit).ok(),
        _ => None,
    }
}

fn u32_ne(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

fn protocol(data: &[u8]) -> Option<Protocol> {
    match data {
        [n] => Protocol::from_number(*n),
        _ => None,
    }
}

pub fn lift_set(family: Family, k: &KernelSet) -> Result<Set, LiftError> {
    let bad = |what: &str| LiftError(format!("set {}: {what}", k.name));
    let key = key_types(k.key_type).ok_or_else(|| bad("a key type kube-nft does not write"))?;
    let data_kinds: Vec<Option<MapData>> = if k.flags & SET_F_OBJECT != 0 {
        vec![Some(MapData::Counter)]
    } else if k.flags & SET_F_MAP == 0 {
        vec![None]
    } else if k.data_type == Some(DATA_TYPE_VERDICT) {
        vec![Some(MapData::Verdict)]
    } else if key.contains(&KeyType::CtState) {
        // No endpoint map is keyed by a connection's state.
        Vec::new()
    } else {
        vec![Some(MapData::Endpoint(family))]
    };
    let concatenated = key.len() > 1;
    let elements = k
        .elements
        .iter()
        .map(|e| {
            Some(Element {
                key: key_values(&key, &e.key, concatenated)?,
                value: e.data.clone(),
                comment: comment_of(&e.userdata),
            })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|lifted| {
            lifted
                .iter()
                .zip(&k.elements)
                .all(|(e, k)| lower_element(e) == *k)
        })
        .ok_or_else(|| bad("an element kube-nft does not write"))?;
    for data in data_kinds {
        let set = Set {
            name: k.name.clone(),
            key: key.clone(),
            data,
            comment: set_comment_of(&k.userdata),
            timeout: k.timeout_ms.map(|ms| (ms / 1000) as u32),
            size: k.size,
            elements: Vec::new(),
        };
        let again = lower_set(&set);
        let definition = KernelSet {
            elements: Vec::new(),
            ..k.clone()
        };
        if again == definition {
            return Ok(Set { elements, ..set });
        }
    }
    Err(bad("a definition kube-nft does not write"))
}

const KEY_TYPES: [KeyType; 6] = [
    KeyType::Ipv4Addr,
    KeyType::Ipv6Addr,
    KeyType::InetProto,
    KeyType::InetService,
    KeyType::Slot,
    KeyType::CtState,
];

/// The key's types, from the packed ids (6 bits each, first field highest).
fn key_types(mut packed: u32) -> Option<Vec<KeyType>> {
    let mut out = Vec::new();
    while packed != 0 {
        let id = packed & ((1 << TYPE_BITS) - 1);
        out.push(KEY_TYPES.into_iter().find(|t| t.type_id() == id)?);
        packed >>= TYPE_BITS;
    }
    out.reverse();
    (!out.is_empty()).then_some(out)
}

fn key_values(types: &[KeyType], mut bytes: &[u8], concatenated: bool) -> Option<Vec<KeyValue>> {
    let mut out = Vec::new();
    for t in types {
        let size = t.size() as usize;
        let step = if concatenated {
            padded(t.size()) as usize
        } else {
            size
        };
        let v = bytes.get(..size)?;
        out.push(match t {
            KeyType::Ipv4Addr | KeyType::Ipv6Addr => KeyValue::Addr(ip_from_bytes(v)?),
            KeyType::InetProto => KeyValue::Proto(protocol(v)?),
            KeyType::InetService => KeyValue::Port(u16::from_be_bytes(v.try_into().ok()?)),
            KeyType::Slot => KeyValue::Slot(u32_ne(v)?),
            KeyType::CtState => (u32_ne(v)? == CT_STATE_NEW).then_some(KeyValue::CtStateNew)?,
        });
        bytes = bytes.get(step..)?;
    }
    bytes.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::node_config::{FastPath, NodeConfig};
    use crate::nft::kernel::lowered;

    /// The lab's Service, its skeleton and (with `counters`) the counter maps.
    /// Every other shape is lifted from a kernel in the parity tests.
    fn desired(config: &NodeConfig) -> crate::ruleset::Ruleset {
        let text = crate::lab::DEFAULT_MANIFESTS;
        let loaded = crate::source::files::parse(text, "hostnames.yaml").unwrap();
        crate::nft::translate::desired(&loaded.objects, None, config).0
    }

    #[test]
    fn what_lower_writes_lifts_back_to_itself() {
        for (counters, fast_path) in [
            (false, FastPath::Off),
            (true, FastPath::Off),
            (false, FastPath::All),
        ] {
            let config = NodeConfig {
                cluster_cidrs: vec![
                    "10.244.0.0/16".parse().unwrap(),
                    "fd00:10:244::/52".parse().unwrap(),
                ],
                service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
                counters,
                fast_path,
                ..NodeConfig::default()
            };
            let ruleset = desired(&config);
            assert!(ruleset.tables.len() > 2);
            for (want, k) in ruleset.tables.iter().zip(lowered(&ruleset)) {
                let got = lift_table(&k).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(&got, want);
            }
        }
    }

    #[test]
    fn a_rule_kube_nft_does_not_write_is_named() {
        let rule = KernelRule {
            handle: Some(7),
            exprs: vec![Expr::Other("log".into())],
            userdata: None,
        };
        let chain = KernelChain {
            name: "services".into(),
            base: None,
            userdata: None,
            rules: vec![rule],
        };
        let e = lift_chain(Family::Ip, &chain).unwrap_err().to_string();
        assert!(e.contains("chain services, rule (handle 7)"), "{e}");
    }

    #[test]
    fn loose_patterns_are_checked_by_lowering_again() {
        // An address match with a mask that is no prefix: recognised by shape,
        // refused because it does not lower back to itself.
        let k = KernelRule {
            handle: None,
            exprs: vec![
                Expr::Payload {
                    dreg: 1,
                    base: PayloadBase::Network,
                    offset: 12,
                    len: 4,
                },
                Expr::Bitwise {
                    sreg: 1,
                    dreg: 1,
                    len: 4,
                    mask: vec![255, 0, 255, 0],
                    xor: vec![0; 4],
                },
                Expr::Cmp {
                    sreg: 1,
                    op: CmpOp::Eq,
                    data: vec![10, 0, 0, 0],
                },
            ],
            userdata: None,
        };
        assert!(lift_rule(Family::Ip, &k).is_err());
    }
}
