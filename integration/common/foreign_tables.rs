//! Tables that other tools write beside ours (issue #19), each with the nft
//! that wrote it: the host's, or Debian 11's and 13's from the chroots that
//! `integration/nft-versions/chroots.sh` builds. Whatever they hold (named
//! counters and quotas, sets and elements with comments, interval sets, verdict
//! maps, rule comments, a flowtable where the kernel has them), kube-nft must
//! neither take them for drift nor fail to read its own tables beside them, and
//! must leave them as they were.

use super::*;
use kube_nft::lab::topology::CLIENT_V4;

const CHROOTS: &str = "/var/cache/kube-nft/chroots";

pub struct Writer {
    pub label: &'static str,
    /// The chroot whose nft this is; `None`: the host's.
    root: Option<PathBuf>,
    /// Why an older nft cannot read what this one writes, if it cannot.
    pub breaks_older_nft: Option<&'static str>,
    /// Why this nft cannot read our tables, if it cannot: then it only writes.
    pub cannot_read_ours: Option<&'static str>,
}

impl Writer {
    pub fn host() -> Writer {
        Writer {
            label: "host",
            root: None,
            breaks_older_nft: None,
            cannot_read_ours: None,
        }
    }

    /// Debian `suite`'s nft; the chroot must exist (install-deps builds it).
    pub fn chroot(suite: &'static str) -> Writer {
        let root = Path::new(CHROOTS).join(suite);
        assert!(
            root.join("usr/sbin/nft").exists(),
            "no {suite} chroot at {}: run integration/nft-versions/chroots.sh",
            root.display()
        );
        Writer {
            label: suite,
            root: Some(root),
            breaks_older_nft: None,
            cannot_read_ours: None,
        }
    }

    /// An nft whose tables older nft versions crash on.
    pub fn breaking_older(mut self, why: &'static str) -> Writer {
        self.breaks_older_nft = Some(why);
        self
    }

    /// An nft too old to list our tables: it writes beside them, and lists
    /// nothing here.
    pub fn not_reading_ours(mut self, why: &'static str) -> Writer {
        self.cannot_read_ours = Some(why);
        self
    }

    fn nft(&self, ns: &str, args: &[&str]) -> Output {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        if let Some(root) = &self.root {
            c.arg("chroot").arg(root);
        }
        c.arg("nft").args(args).output().unwrap()
    }

    /// `nft ARGS` that must succeed without a word on stderr: its stdout.
    pub fn run(&self, ns: &str, args: &[&str]) -> String {
        let out = self.nft(ns, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{}'s nft {args:?}: {stderr}",
            self.label
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `nft -f` of `text`, from a file the writer's nft can see.
    pub fn load(&self, ns: &str, text: &str) {
        let dir = match &self.root {
            Some(root) => root.join("tmp"),
            None => std::env::temp_dir(),
        };
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(unique("foreign.nft"));
        std::fs::write(&file, text).unwrap();
        let inside = match &self.root {
            Some(root) => Path::new("/").join(file.strip_prefix(root).unwrap()),
            None => file.clone(),
        };
        let out = self.nft(ns, &["-f", inside.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        assert!(
            out.status.success(),
            "{}'s nft -f:\n{text}\n{}",
            self.label,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Another tool's tables, one per family kube-nft uses and one inet; nothing in
/// them matches the tests' traffic except the flowtable, which offloads it.
pub fn foreign_tables(label: &str, flowtable_devices: Option<&[String]>) -> String {
    let (flowtable, offload) = match flowtable_devices {
        Some(devices) => (
            format!(
                "  flowtable fast {{ hook ingress priority 0; devices = {{ {} }}; }}\n",
                devices.join(", ")
            ),
            "    meta l4proto { tcp, udp } flow add @fast\n",
        ),
        None => (String::new(), ""),
    };
    format!(
        r#"table inet foreign-{label} {{
  counter seen {{ comment "written by {label}" }}
  quota budget {{ over 900 mbytes }}
  set blocked {{ type ipv4_addr; flags interval; comment "a set with a comment"; elements = {{ 198.18.0.0/15 comment "benchmarking", 203.0.113.7 }} }}
  map by-port {{ type inet_service : verdict; elements = {{ 6 : drop }} }}
{flowtable}  chain through {{
    type filter hook forward priority 0; policy accept;
    ip daddr @blocked counter name seen drop comment "a rule with a comment"
    tcp dport vmap @by-port
{offload}  }}
}}
table ip foreign-{label} {{
  set marks {{ typeof meta mark; comment "typeof and a comment"; elements = {{ 0x7 }} }}
  quota budget-{label} {{ 10 mbytes }}
  chain local-output {{
    type filter hook output priority 10; policy accept;
    meta mark @marks quota name budget-{label} drop
  }}
}}
table ip6 foreign-{label} {{
  chain local-input {{
    type filter hook input priority 10; policy accept;
    ip6 saddr 2001:db8:ffff::/48 limit rate 10/second counter accept
  }}
}}
"#
    )
}

/// The links of `ns` that packets are routed between: not loopback, not a
/// bridge's port.
pub fn routed_links(ns: &str) -> Vec<String> {
    exec_in(ns, &["ip", "-o", "link", "show"])
        .lines()
        .filter(|l| !l.contains(" master ") && !l.contains("LOOPBACK"))
        .filter_map(|l| {
            let name = l.split(": ").nth(1)?;
            Some(name.split('@').next()?.to_string())
        })
        .collect()
}

/// Each writer in turn (oldest nft first) writes its tables beside ours while
/// `kube-nft run` serves a Service; after each, the Service answers, a change
/// to it syncs, and every writer so far lists the whole ruleset (but for an
/// older nft that a newer one's tables crash, `breaks_older_nft`, or that
/// cannot read ours, `cannot_read_ours`: each said aloud). Then, with every table written: the daemon took none of it for
/// drift; a change still syncs; a new full sync reads every table back and has
/// nothing to write; `explain` reads ours from the kernel; and the other
/// tools' tables list as they did before all that.
pub fn beside_ours(tag: &str, writers: &[Writer], flowtable: bool) {
    let (c, manifests, mut d) = serve_web_on_notifications_only(tag);
    let all = ["10.244.0.11", "10.244.0.12", "10.244.0.13"];
    // Our checks read the kernel with the newest nft: the others may crash on
    // what it wrote.
    let newest = writers.last().unwrap();
    let ruleset = || newest.run(c.node(), &["list", "ruleset"]);
    // 30 new connections: each of three endpoints is missed by all of them
    // with a chance of (2/3)^30, 5e-6 (12 missed one in 40 runs).
    let change_and_back = |after: &str| {
        std::fs::write(&manifests, web(&all[..2])).unwrap();
        wait_until(Duration::from_secs(5), "the change to sync", || {
            !ruleset().contains("10.244.0.13")
        });
        let t = tally(c.client(), WEB_VIP, 30, false);
        assert!(
            t.errors.is_empty() && t.answers.len() == 2,
            "{after}: {t:?}"
        );
        std::fs::write(&manifests, web(&all)).unwrap();
        wait_until(Duration::from_secs(5), "the change back to sync", || {
            ruleset().contains("10.244.0.13")
        });
        let t = tally(c.client(), WEB_VIP, 30, false);
        assert!(
            t.errors.is_empty() && t.answers.len() == 3,
            "{after}: {t:?}"
        );
    };
    let devices = flowtable.then(|| routed_links(c.node()));
    let mut tables = Vec::new();
    for (i, w) in writers.iter().enumerate() {
        w.load(c.node(), &foreign_tables(w.label, devices.as_deref()));
        for family in ["inet", "ip", "ip6"] {
            tables.push(format!("{family} foreign-{}", w.label));
        }
        change_and_back(&format!("after {}'s tables", w.label));
        for (j, reader) in writers[..=i].iter().enumerate() {
            if let Some(why) = reader.cannot_read_ours {
                println!("{} does not list our tables: {why}", reader.label);
                continue;
            }
            if let Some(why) = writers[j + 1..=i].iter().find_map(|w| w.breaks_older_nft) {
                println!(
                    "{} does not list the ruleset once {} wrote to it: {why}",
                    reader.label, w.label
                );
                continue;
            }
            let listing = reader.run(c.node(), &["list", "ruleset"]);
            for table in &tables {
                assert!(
                    listing.contains(&format!("table {table} {{")),
                    "{}: {table}",
                    reader.label
                );
            }
            assert!(listing.contains("table ip kube-nft {"), "{}", reader.label);
        }
    }
    if flowtable {
        assert!(ruleset().contains("flowtable fast"));
    }
    let list = |table: &String| {
        let (family, name) = table.split_once(' ').unwrap();
        newest.run(c.node(), &["list", "table", family, name])
    };
    let before: Vec<String> = tables.iter().map(list).collect();

    change_and_back("with every table written");
    d.terminate();
    assert!(
        !d.log_text().contains("changed outside kube-nft"),
        "another tool's tables were taken for drift:\n{}",
        d.log_text()
    );
    let again = sync_once(c.node(), &manifests);
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(
        again.status.success() && log.contains("messages=0 bytes=0"),
        "a full sync beside the other tables:\n{log}"
    );
    let explained = kube_nft_in(c.node(), &["explain", CLIENT_V4, "10.96.0.10:80/tcp"]);
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.status.success() && all.iter().all(|ep| text.contains(ep)),
        "{text}{}",
        String::from_utf8_lossy(&explained.stderr)
    );
    for (table, before) in tables.iter().zip(&before) {
        assert_eq!(&list(table), before, "{table} changed");
    }
}
