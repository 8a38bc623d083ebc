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
use crate::source::body::Pull;
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

/// A protobuf body as the API server sends it, read by the streaming readers
/// as a list and as a watch of both kinds, in pieces whose size the first byte
/// chooses; every object read is converted.
pub fn api_protobuf(data: &[u8]) {
    use crate::source::protobuf::{endpoint_slice, service, ListReader, WatchReader};
    let Some((&piece, body)) = data.split_first() else {
        return;
    };
    let piece = usize::from(piece).max(1);
    let to_service = |s: &_| {
        let _ = convert::convert_service(s, &mut Vec::new());
    };
    let to_slice = |s: &_| {
        let _ = convert::convert_endpoint_slice(s);
    };
    let mut services = Reading::new(ListReader::new(service));
    let mut slices = Reading::new(ListReader::new(endpoint_slice));
    let mut service_events = Reading::new(WatchReader::new(service));
    let mut slice_events = Reading::new(WatchReader::new(endpoint_slice));
    for chunk in body.chunks(piece) {
        services.feed(chunk, to_service);
        slices.feed(chunk, to_slice);
        service_events.feed(chunk, |e| event_object(e).map_or((), to_service));
        slice_events.feed(chunk, |e| event_object(e).map_or((), to_slice));
    }
    services.finish();
    slices.finish();
    service_events.finish();
    slice_events.finish();
}

/// The object a watch event carries, if it is one of the kind's.
fn event_object<K>(event: &kube::api::WatchEvent<K>) -> Option<&K> {
    use kube::api::WatchEvent::*;
    match event {
        Added(o) | Modified(o) | Deleted(o) => Some(o),
        Bookmark(_) | Error(_) => None,
    }
}

/// One reader, until its first error.
struct Reading<R> {
    reader: R,
    failed: bool,
}

impl<R: Pull> Reading<R> {
    fn new(reader: R) -> Self {
        Reading {
            reader,
            failed: false,
        }
    }

    /// Feeds a piece of the body and converts every object it completes.
    fn feed(&mut self, chunk: &[u8], convert: impl Fn(&R::Item)) {
        if self.failed {
            return;
        }
        self.reader.feed(chunk);
        loop {
            match self.reader.pull() {
                Ok(Some(obj)) => convert(&obj),
                Ok(None) => return,
                Err(_) => {
                    self.failed = true;
                    return;
                }
            }
        }
    }

    fn finish(&mut self) {
        if !self.failed {
            let _ = self.reader.finish();
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
