//! The small builders every part of the desired tables is made with: chains,
//! sets, elements, and the keys of the dispatch maps. A leaf: it knows the
//! ruleset vocabulary and nothing else of the translator.

use crate::core::model::ServicePort;
use crate::ruleset::{
    clamp_comment, BaseChain, Chain, ChainType, Element, Field, Hook, KeyType, KeyValue, MapData,
    Mapped, Rule, Set, Stmt, Verdict,
};
use std::net::IpAddr;

pub fn base(name: &str, kind: ChainType, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.to_string(),
        base: Some(BaseChain {
            kind,
            hook,
            priority,
        }),
        comment: None,
        rules,
    }
}

pub fn regular(name: &str, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.to_string(),
        base: None,
        comment: None,
        rules,
    }
}

pub fn set(name: &str, key: Vec<KeyType>, data: Option<MapData>, comment: &str) -> Set {
    Set {
        name: name.to_string(),
        key,
        data,
        comment: Some(comment.to_string()),
        timeout: None,
        size: None,
        elements: Vec::new(),
    }
}

pub const DISPATCH_KEY: [Field; 3] = [Field::Daddr, Field::L4Proto, Field::Dport];
pub const NODEPORT_KEY: [Field; 2] = [Field::L4Proto, Field::Dport];

pub fn vmap(fields: &[Field], map: &str) -> Stmt {
    Stmt::Vmap {
        fields: fields.to_vec(),
        map: map.into(),
    }
}

pub fn jump(chain: &str) -> Stmt {
    Stmt::Verdict(Verdict::Jump(chain.to_string()))
}

pub fn dispatch_key(vip: IpAddr, port: &ServicePort) -> Vec<KeyValue> {
    vec![
        KeyValue::Addr(vip),
        KeyValue::Proto(port.protocol),
        KeyValue::Port(port.port),
    ]
}

pub fn element(key: Vec<KeyValue>, verdict: Option<Verdict>, comment: &str) -> Element {
    Element {
        key,
        value: verdict.map(Mapped::Verdict),
        comment: Some(clamp_comment(comment)),
    }
}

pub fn nodeport_key(port: &ServicePort, node_port: u16) -> Vec<KeyValue> {
    vec![KeyValue::Proto(port.protocol), KeyValue::Port(node_port)]
}
