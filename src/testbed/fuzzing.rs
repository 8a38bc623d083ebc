//! The bodies of the fuzz targets (`integration/fuzz/`): each hands arbitrary
//! bytes to one of kube-nft's decoders the way kube-nft itself does, and must
//! return without panicking. They live here so that the fuzzer and the test
//! that replays the seed corpora and every past finding
//! (`integration/fuzz_corpus.rs`) run the same code.

use crate::core::convert::{self, Objects};
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::netlink::objects::*;
use crate::netlink::{conntrack, expr, ipvs, message, route};
use crate::nft::lift;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary and its corpus directory.
pub const TARGETS: [(&str, Target); 8] = [
    ("nftables", nftables),
    ("conntrack", conntrack),
    ("ipvs", ipvs),
    ("rtnetlink", rtnetlink),
    ("api_objects", api_objects),
    ("api_protobuf", api_protobuf),
    ("manifests", manifests),
    ("config_file", config_file),
];

const TABLE: &str = "kube-nft";

/// The nf_tables readback, every object kind chosen by the first byte; a
/// decoded chain, rule or set is also lifted, as `explain` does on a live node.
pub fn nftables(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 8 {
        0 => {
            let _ = TableHeader::parse(body);
        }
        1 => {
            if let Ok(Some(chain)) = KernelChain::parse(body, TABLE) {
                let _ = lift::lift_chain(Family::Ip, &chain);
            }
        }
        2 => {
            if let Ok(Some((_, rule))) = KernelRule::parse(body, TABLE) {
                for family in Family::ALL {
                    let _ = lift::lift_rule(family, &rule);
                }
            }
        }
        3 => {
            if let Ok(Some(set)) = KernelSet::parse(body, TABLE) {
                let _ = lift::lift_set(Family::Ip6, &set);
            }
        }
        4 => {
            let _ = KernelElement::list_set(body);
            let _ = KernelElement::parse_list(body);
        }
        5 => {
            let _ = KernelObject::parse(body, TABLE);
        }
        6 => {
            let _ = expr::parse_list(body);
        }
        _ => {
            let _ = message::split_messages(body);
        }
    }
}

/// A conntrack dump's message body, as stale flows are found.
pub fn conntrack(data: &[u8]) {
    let _ = conntrack::decode_flow(data);
}

/// IPVS's answers: a virtual service or a real server, by the first byte.
pub fn ipvs(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    if kind % 2 == 0 {
        let _ = ipvs::decode_service(body);
    } else {
        let _ = ipvs::decode_real(body);
    }
}

/// An RTM_NEWADDR body, as the node's addresses are read.
pub fn rtnetlink(data: &[u8]) {
    let _ = route::decode_address(data);
}

/// Arbitrary JSON as a Service, an EndpointSlice and a Node: whatever
/// deserializes is converted into the model and validated as a whole.
pub fn api_objects(data: &[u8]) {
    let mut objects = Objects::default();
    if let Ok(s) = serde_json::from_slice::<Service>(data) {
        let _ = convert::convert_service(&s, &mut Vec::new());
        objects.services.push(s);
    }
    if let Ok(s) = serde_json::from_slice::<EndpointSlice>(data) {
        let _ = convert::convert_endpoint_slice(&s);
        objects.slices.push(s);
    }
    if let Ok(n) = serde_json::from_slice::<Node>(data) {
        let _ = convert::convert_node(&n);
        objects.nodes.push(n);
    }
    let _ = convert::validate(&objects, Some("node-a"));
}

/// A protobuf list body as the API server sends it, read by the streaming
/// reader as both kinds, in pieces whose size the first byte chooses; every
/// object read is converted.
pub fn api_protobuf(data: &[u8]) {
    use crate::source::protobuf::{endpoint_slice, service, ListReader};
    let Some((&piece, body)) = data.split_first() else {
        return;
    };
    let piece = usize::from(piece).max(1);
    let mut services = Reading::new(ListReader::new(service));
    let mut slices = Reading::new(ListReader::new(endpoint_slice));
    for chunk in body.chunks(piece) {
        services.feed(chunk, |s| {
            let _ = convert::convert_service(s, &mut Vec::new());
        });
        slices.feed(chunk, |s| {
            let _ = convert::convert_endpoint_slice(s);
        });
    }
    let _ = services.reader.finish();
    let _ = slices.reader.finish();
}

/// One kind's reader, until its first error.
struct Reading<K> {
    reader: crate::source::protobuf::ListReader<K>,
    failed: bool,
}

impl<K> Reading<K> {
    fn new(reader: crate::source::protobuf::ListReader<K>) -> Self {
        Reading {
            reader,
            failed: false,
        }
    }

    /// Feeds a piece of the body and converts every object it completes.
    fn feed(&mut self, chunk: &[u8], convert: impl Fn(&K)) {
        if self.failed {
            return;
        }
        self.reader.feed(chunk);
        loop {
            match self.reader.next_item() {
                Ok(Some(obj)) => convert(&obj),
                Ok(None) => return,
                Err(_) => {
                    self.failed = true;
                    return;
                }
            }
        }
    }
}

/// A manifest file, all the way to the `nft -f` text of the ruleset `run`
/// would program from it.
pub fn manifests(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(loaded) = crate::source::files::parse(text, "fuzz.yaml") {
        let config = NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().expect("a CIDR")],
            ..NodeConfig::default()
        };
        let (ruleset, _) = crate::nft::translate::desired(&loaded.objects, Some("node-a"), &config);
        let _ = crate::ruleset::text::replace_script(&ruleset.tables);
    }
}

/// kube-proxy's config file, as `run --config` reads it.
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::config::resolve_text(
        &crate::config::Flags::default(),
        text,
        std::path::Path::new("fuzz.conf"),
    );
}
