//! Writes the seed corpora under `corpus/` (run by hand after a change to what
//! kube-nft writes or reads; `run.sh` fuzzes from them): real objects, encoded by
//! kube-nft's own encoders or taken from the recorded API server answers.
//! `cargo run --bin seeds` from this directory.

use kube_nft::core::node_config::NodeConfig;
use kube_nft::netlink::attr::{AttrWriter, Attrs};
use kube_nft::netlink::objects::TableHeader;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn tagged(kind: u8, w: AttrWriter) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend(w.into_bytes());
    out
}

/// Every kind of object in the lab's and the recorded cluster's rulesets, both
/// families, with counters: one seed per distinct shape.
fn nftables() {
    let mut manifests = kube_nft::lab::DEFAULT_MANIFESTS.to_string();
    manifests += "\n---\n";
    manifests += &std::fs::read_to_string(
        repo().join("integration/fixtures/kube-apiserver/applied-objects.yaml"),
    )
    .unwrap();
    let loaded = kube_nft::source::files::parse(&manifests, "seeds.yaml").unwrap();
    let config = NodeConfig {
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/56".parse().unwrap(),
        ],
        counters: true,
        ..NodeConfig::default()
    };
    let (ruleset, _) = kube_nft::nft::translate::desired(&loaded.objects, Some("node1"), &config);
    let mut seen = std::collections::BTreeSet::new();
    let mut keep = |bytes: Vec<u8>| {
        // One seed per size and kind keeps the corpus small and varied.
        if seen.insert((bytes[0], bytes.len())) {
            write("nftables", &format!("{}-{}", bytes[0], bytes.len()), &bytes);
        }
    };
    for table in kube_nft::nft::kernel::lowered(&ruleset) {
        let name = "kube-nft";
        let mut w = AttrWriter::new();
        TableHeader {
            name: name.into(),
            flags: 0,
            userdata: table.userdata.clone(),
        }
        .emit(&mut w);
        keep(tagged(0, w));
        for chain in &table.chains {
            let mut w = AttrWriter::new();
            chain.emit(name, &mut w);
            keep(tagged(1, w));
            for rule in &chain.rules {
                let mut w = AttrWriter::new();
                rule.emit(name, &chain.name, Some(7), &mut w);
                let bytes = w.into_bytes();
                for a in Attrs::new(&bytes).flatten() {
                    if a.0 == 4 {
                        let mut list = vec![6];
                        list.extend_from_slice(a.1);
                        keep(list);
                    }
                }
                let mut seed = vec![2];
                seed.extend(bytes);
                keep(seed);
            }
        }
        for object in &table.objects {
            let mut w = AttrWriter::new();
            object.emit(name, &mut w);
            keep(tagged(5, w));
        }
        for (i, set) in table.sets.iter().enumerate() {
            let mut w = AttrWriter::new();
            set.emit(name, i as u32, &mut w);
            keep(tagged(3, w));
            let mut w = AttrWriter::new();
            w.put_str(1, name);
            w.put_str(2, &set.name);
            w.nest(3, |w| {
                for e in set.elements.iter().take(4) {
                    e.emit(true, w);
                }
            });
            keep(tagged(4, w));
        }
    }
}

fn conntrack() {
    let tuple =
        |w: &mut AttrWriter, kind: u16, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16| {
            w.nest(kind, |w| {
                w.nest(1, |w| {
                    w.put(1, &src);
                    w.put(2, &dst);
                });
                w.nest(2, |w| {
                    w.put(1, &[17]);
                    w.put(2, &sport.to_be_bytes());
                    w.put(3, &dport.to_be_bytes());
                });
            });
        };
    let mut w = AttrWriter::over(vec![2, 0, 0, 0]);
    tuple(&mut w, 1, [10, 244, 1, 5], [10, 96, 0, 10], 40000, 53);
    tuple(&mut w, 2, [10, 244, 2, 7], [10, 244, 1, 5], 5353, 40000);
    write("conntrack", "udp-flow", &w.into_bytes());
}

fn ipvs() {
    let mut w = AttrWriter::new();
    w.put(1, &2u16.to_ne_bytes());
    w.put(2, &6u16.to_ne_bytes());
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[10, 96, 0, 10]);
    w.put(3, &addr);
    w.put(4, &80u16.to_be_bytes());
    w.put_str(6, "rr");
    w.put(7, &[0u8; 8]);
    w.put_u32(8, 0);
    w.put_u32(9, u32::MAX);
    write("ipvs", "service", &tagged(0, w));
    let mut w = AttrWriter::new();
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[10, 244, 1, 5]);
    w.put(1, &addr);
    w.put(2, &9376u16.to_be_bytes());
    w.put_u32(3, 0);
    w.put_u32(4, 1);
    w.put(11, &2u16.to_ne_bytes());
    write("ipvs", "real", &tagged(1, w));
}

fn rtnetlink() {
    let mut header = vec![2, 24, 0, 0];
    header.extend_from_slice(&3u32.to_ne_bytes());
    let mut w = AttrWriter::over(header);
    w.put(1, &[192, 0, 2, 10]);
    w.put(2, &[192, 0, 2, 10]);
    w.put_str(3, "eth0");
    write("rtnetlink", "v4", &w.into_bytes());
}

fn api_objects() {
    let dir = repo().join("integration/fixtures/kube-apiserver");
    for list in [
        "list-services.json",
        "list-endpointslices.json",
        "node-node1.json",
    ] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(list)).unwrap()).unwrap();
        let items = v["items"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![v.clone()]);
        for (i, item) in items.iter().take(6).enumerate() {
            let name = format!("{}-{i}", list.trim_end_matches(".json"));
            write("api_objects", &name, item.to_string().as_bytes());
        }
    }
}

/// The recorded protobuf lists and watches, each read whole (a first byte of
/// 255) and in small pieces (7).
fn api_protobuf() {
    let dir = repo().join("integration/fixtures/kube-apiserver/protobuf");
    for list in [
        "services.pb",
        "services-page1.pb",
        "endpointslices.pb",
        "watch-services.pb",
        "watch-endpointslices.pb",
    ] {
        let body = std::fs::read(dir.join(list)).unwrap();
        for piece in [255u8, 7] {
            let mut seed = vec![piece];
            seed.extend_from_slice(&body);
            let name = format!("{}-{piece}", list.trim_end_matches(".pb"));
            write("api_protobuf", &name, &seed);
        }
    }
}

fn manifests() {
    write(
        "manifests",
        "hostnames.yaml",
        kube_nft::lab::DEFAULT_MANIFESTS.as_bytes(),
    );
    let applied = repo().join("integration/fixtures/kube-apiserver/applied-objects.yaml");
    write(
        "manifests",
        "applied-objects.yaml",
        &std::fs::read(applied).unwrap(),
    );
}

/// deploy/'s ConfigMap's `config.conf`, as the DaemonSet mounts it.
fn config_file() {
    let text = std::fs::read_to_string(repo().join("deploy/config.yaml")).unwrap();
    let mut conf = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.trim_start().starts_with("config.conf:") {
            inside = true;
            continue;
        }
        if inside {
            match line.strip_prefix("    ") {
                Some(l) => conf += &format!("{l}\n"),
                None if line.trim().is_empty() => conf.push('\n'),
                None => break,
            }
        }
    }
    assert!(conf.contains("KubeProxyConfiguration"), "{conf}");
    write("config_file", "deploy.conf", conf.as_bytes());
}

fn main() {
    nftables();
    conntrack();
    ipvs();
    rtnetlink();
    api_objects();
    api_protobuf();
    manifests();
    config_file();
}
