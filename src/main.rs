//! The `kube-nft` command line.

use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use ipnet::IpNet;
use kube_nft::config::{self, LogSettings};
use kube_nft::core::node_config::{
    ModeName, NodeConfig, NodePortAddresses, DEFAULT_MASQUERADE_BIT,
};
use kube_nft::lab::{self, LabOptions};
use kube_nft::netlink::NftSocket;
use kube_nft::node::daemon;
use kube_nft::ruleset::text;
use kube_nft::source::files;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "kube-nft",
    version,
    about = "Kubernetes Services on nftables, programmed over netlink"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Proxy Services in the current network namespace, kept in sync with the API
    /// server (as kube-proxy; its flags and config file) or with manifests.
    Run(Box<RunArgs>),
    /// Print, as `nft -f` input, the ruleset `run` would program.
    Render {
        #[command(flatten)]
        proxy: ProxyArgs,
    },
    /// Explain what happens to the first packet of a new connection: the rules it
    /// meets, the Service, the endpoints and their shares, or why it is dropped or
    /// rejected. Walks the ruleset kube-nft has programmed in this network
    /// namespace, or with `--manifests` the one `run` would program from them.
    Explain {
        #[command(flatten)]
        proxy: ProxyArgs,
        /// The source address (one of this node's addresses: the output path).
        src: Option<std::net::IpAddr>,
        /// Destination as ADDR:PORT/PROTO, e.g. 10.96.0.10:53/udp or [fd00::1]:80/tcp.
        dst: Option<String>,
    },
    /// Remove kube-nft's tables from the current network namespace, and with the
    /// IPVS backend's leftovers: kube-ipvs0 and the virtual services on this
    /// node's addresses.
    Cleanup {
        /// Remove what kube-proxy left instead (once it no longer runs here):
        /// its nftables tables, its iptables-nft chains and the rules jumping to
        /// them, IPVS's virtual services and kube-ipvs0. kube-nft's are kept.
        #[arg(long)]
        kube_proxy: bool,
    },
    /// List the Service ports by traffic (packets and bytes, both directions, both
    /// families), from the counters `run --counters` keeps.
    Top {
        /// Show only the busiest N.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// A Service demo in network namespaces: pods, a client, and the proxy.
    Lab {
        /// Services and EndpointSlices to run instead of the built-in `hostnames` example.
        #[arg(long, num_args = 1..)]
        manifests: Vec<PathBuf>,
        /// Requests to send to each Service port.
        #[arg(long, default_value_t = 30)]
        requests: usize,
        /// Leave the namespaces (and pod servers) in place afterwards.
        #[arg(long)]
        keep: bool,
        /// Prefix of the namespaces' names.
        #[arg(long, default_value = "kn-lab")]
        prefix: String,
        /// The pods' CIDRs (comma-separated, one per family): traffic from
        /// outside them to a ClusterIP is masqueraded.
        #[arg(long, value_delimiter = ',', default_value = lab::DEFAULT_CLUSTER_CIDR)]
        cluster_cidr: Vec<IpNet>,
        /// The Services' CIDRs (comma-separated, any number per family):
        /// addresses there that no Service holds are dropped.
        #[arg(long, value_delimiter = ',', default_value = lab::DEFAULT_SERVICE_CIDR)]
        service_cidr: Vec<IpNet>,
        /// `nftables`, or `ipvs` where the kernel has IPVS.
        #[arg(long, visible_alias = "backend", value_enum, default_value_t)]
        proxy_mode: ModeName,
    },
    /// Measure syncs and packets at several cluster sizes, in scratch namespaces.
    Bench(BenchArgs),
    /// kube-nft against real kube-proxy (nftables and iptables modes), each in
    /// turn, on this network namespace as a node of a real control plane
    /// (integration/k8s/bench.sh sets it up and runs this).
    BenchKubeProxy(VersusArgs),
    /// Many nodes on one API server: kube-nft on every node, then kube-proxy
    /// (nftables mode), each node a network namespace, under a steady churn
    /// of endpoint changes (integration/k8s/bench-nodes.sh sets it up and
    /// runs this in the control plane's namespace).
    BenchNodes(NodesArgs),
    /// Measure the IPVS backend's syncs at several cluster sizes, beside the
    /// same state written by ipvsadm, ip and nft (needs a kernel with IPVS:
    /// benches/ipvs_scale.sh runs it in a guest).
    BenchIpvs {
        /// Cluster sizes in Services, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
        sizes: Vec<usize>,
        /// Endpoints per Service.
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Prefix of the scratch namespaces.
        #[arg(long, default_value = "kube-nft-bench-ipvs")]
        prefix: String,
    },
    /// The fast path (kube-nft.io/traffic-hint: LongLived) against the normal
    /// path for one Service's flows (needs a kernel with flowtables:
    /// benches/fast_path.sh runs it in a guest).
    BenchFastPath {
        /// Cluster sizes for the shape's cold syncs, comma-separated
        /// (10000,30000 checks the kernel's quadratic traps; none by default).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Cold syncs per size and mode.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Rounds of traffic (0: none; traffic needs a kernel with flowtables).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds of traffic per measurement.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Prefix of the scratch namespaces.
        #[arg(long, default_value = "kube-nft-bench-fp")]
        prefix: String,
    },
    /// A change made while the periodic verification runs, against the same
    /// change on a quiet proxy and behind a full sync, at several cluster
    /// sizes (a synthetic cluster, in a scratch namespace).
    BenchVerification {
        /// Cluster sizes in Services, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
        sizes: Vec<usize>,
        /// Endpoints per Service.
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        #[arg(long, default_value_t = 11)]
        runs: usize,
    },
    /// One full sync of a synthetic cluster in a fresh process (used by `bench`).
    #[command(hide = true)]
    BenchChild {
        #[arg(long)]
        netns: String,
        #[arg(long)]
        services: usize,
        #[arg(long)]
        endpoints: usize,
        /// With `--counters` (to measure what counting costs).
        #[arg(long)]
        counters: bool,
        #[arg(long, value_enum, default_value_t = ModeName::Nftables)]
        proxy_mode: ModeName,
        /// Whose flows are labelled for the fast path (the Service tables'
        /// share of it: the child writes no fast-path table).
        #[arg(long, value_enum, default_value = "off")]
        fast_path: kube_nft::core::node_config::FastPath,
    },
    /// A pod's workload: answer with NAME on TCP (HTTP) and UDP ports (used by the lab).
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        netns: Option<String>,
        #[arg(long)]
        name: String,
        #[arg(long = "port", required = true)]
        ports: Vec<u16>,
    },
}

#[derive(Args)]
struct BenchArgs {
    /// Cluster sizes: SERVICES or SERVICESxENDPOINTS (total), comma-separated;
    /// plain SERVICES means 10 endpoints each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000,30000,30000x250000",
        value_parser = kube_nft::bench::report::parse_size
    )]
    sizes: Vec<(usize, usize)>,
    /// Runs per measurement; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Largest cluster loaded with an anonymous `numgen` map per Service, the
    /// quadratic part of kube-proxy 1.36's rules (~12 s at 10k).
    #[arg(long, default_value_t = 10_000)]
    kube_proxy_shape_max: usize,
    /// Services programmed in the data-plane runs.
    #[arg(long, value_delimiter = ',', default_value = "1,1000,10000,30000")]
    dataplane_sizes: Vec<usize>,
    /// Skip the data-plane runs.
    #[arg(long)]
    no_dataplane: bool,
    /// Seconds of connections per data-plane run.
    #[arg(long, default_value_t = 2.0)]
    dataplane_seconds: f64,
    /// Write an SVG plot of full-sync time against cluster size here.
    #[arg(long)]
    plot: Option<PathBuf>,
    #[arg(long, default_value = "kn-bench")]
    /// Namespace names' prefix, so that two benchmarks on one machine do not collide.
    prefix: String,
    /// Largest cluster whose ruleset (ours and the `numgen`-map shape) is listed and
    /// monitored with `nft` (ours lists in ~11 s at 30k).
    #[arg(long, default_value_t = 30_000)]
    operator_max: usize,
    /// Services fed through the loopback API server to `kube-nft run` (10 endpoints each).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    api_sizes: Vec<usize>,
    /// FROM,TO: grow the cluster from FROM Services to TO, FROM at a time, each
    /// step a partial sync, while a client connects through one ClusterIP.
    #[arg(long, value_name = "FROM,TO", value_parser = parse_growth)]
    growth: Option<(usize, usize)>,
}

#[derive(Args)]
struct NodesArgs {
    /// The kubeconfig every proxy uses (an admin's: the benchmark also writes
    /// the Services and EndpointSlices).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The kube-proxy binary.
    #[arg(long)]
    kube_proxy: PathBuf,
    /// A node, as NETNS:NAME:IP: its network namespace, its registered
    /// Node's name, and its address, where its proxy serves its metrics.
    #[arg(long = "node", required = true)]
    nodes: Vec<kube_nft::bench::nodes::Node>,
    /// Services in the cluster (10 endpoints each).
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Which to run, comma-separated: kube-nft, nftables (kube-proxy's mode).
    #[arg(long, value_delimiter = ',', default_value = "kube-nft,nftables")]
    contenders: Vec<String>,
    /// Endpoint changes per second during the churn.
    #[arg(long, default_value_t = 2.0)]
    rate: f64,
    /// How long the churn lasts, in seconds.
    #[arg(long, default_value_t = 300)]
    churn_seconds: u64,
    /// Seconds all the nodes' proxies may take to sync once.
    #[arg(long, default_value_t = 1800)]
    start_limit: u64,
    /// Seconds the proxies may take, after the churn, to program what it changed.
    #[arg(long, default_value_t = 600)]
    drain_limit: u64,
    /// The kube-apiserver's process, for its CPU time and peak RSS.
    #[arg(long)]
    apiserver_pid: u32,
    /// Write the Services straight into the etcd at this address (see
    /// bench-kube-proxy's flag of the same name).
    #[arg(long, value_name = "ADDR:PORT")]
    etcd: Option<std::net::SocketAddr>,
    /// One more argument for every proxy (repeat it for more), e.g.
    /// `--proxy-arg=--min-sync-period=0s`.
    #[arg(long = "proxy-arg", allow_hyphen_values = true)]
    proxy_args: Vec<String>,
    /// Where each process's log goes.
    #[arg(long, default_value = "/var/tmp/kube-nft-bench-nodes")]
    logs: PathBuf,
}

#[derive(Args)]
struct VersusArgs {
    /// The kubeconfig both proxies use (an admin's: the benchmark also writes
    /// the Services and EndpointSlices).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The kube-proxy binary.
    #[arg(long)]
    kube_proxy: PathBuf,
    /// This node's Node name, registered with its address.
    #[arg(long, visible_alias = "node-name")]
    hostname_override: String,
    /// This node's address: the probe's endpoint listens there, and /healthz.
    #[arg(long)]
    node_ip: std::net::Ipv4Addr,
    /// Cluster sizes in Services (10 endpoints each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sizes: Vec<usize>,
    /// Endpoint changes, Service deletions and restarts per contender; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Which to run, comma-separated: kube-nft, nftables, iptables (kube-proxy's
    /// modes), and where the kernel has IPVS, kube-nft-ipvs (kube-nft's IPVS
    /// backend) and ipvs (kube-proxy's IPVS mode).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kube-nft,nftables,iptables"
    )]
    contenders: Vec<String>,
    /// Seconds a contender may take from its start to traffic through the probe's
    /// VIP (kube-proxy's iptables mode over iptables-nft takes minutes at 10k).
    #[arg(long, default_value_t = 1800)]
    start_limit: u64,
    /// Where each process's log goes.
    #[arg(long, default_value = "/var/tmp/kube-nft-bench-kube-proxy")]
    logs: PathBuf,
    /// Write an SVG plot of start → first traffic per 1k Services here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write the Services straight into the etcd at this address (and the
    /// IPAddress that reserves each ClusterIP), not through the API server,
    /// whose create path is quadratic in the Services; the slices still go
    /// through it.
    #[arg(long, value_name = "ADDR:PORT")]
    etcd: Option<std::net::SocketAddr>,
    /// The network namespace to reach etcd from (the control plane's).
    #[arg(long, requires = "etcd")]
    etcd_netns: Option<String>,
    /// The largest size whose ruleset is listed and loaded again with `nft -f`:
    /// at 100k Services, `nft -f` of kube-nft's ruleset held 11 GiB of kernel
    /// memory before it was killed, next to a control plane of 8 GiB.
    #[arg(long, default_value_t = 30_000)]
    nft_f_max: usize,
    /// Rounds of the data plane (0: none): each nftables ruleset, as its proxy
    /// wrote it, loaded again and measured with a client outside the node and
    /// pods behind the probe Service's ClusterIP and NodePort.
    #[arg(long, default_value_t = 0)]
    dataplane_rounds: usize,
    /// How long each data-plane measurement sends, in seconds.
    #[arg(long, default_value_t = 3.0)]
    dataplane_seconds: f64,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    kube_proxy: config::kube_proxy_flags::KubeProxyFlags,
    #[command(flatten)]
    flags: config::Flags,
    /// Apply once and exit: 0 only if the ruleset was committed.
    #[arg(long)]
    once: bool,
    /// Remove kube-nft's tables and exit (as `kube-nft cleanup`).
    #[arg(long)]
    cleanup: bool,
    /// Do what needs a writable /proc/sys and /sys (the conntrack sysctls) and
    /// exit, as kube-proxy's flag: the daemon then needs only CAP_NET_ADMIN.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    init_only: Option<bool>,
}

/// The flags of the one-shot commands that translate manifests (`render`, `explain`).
#[derive(Args)]
struct ProxyArgs {
    /// Manifest files or directories (YAML or JSON; multi-document; `kind: List`).
    /// Required by `render`; `explain` without them reads this node's kernel.
    #[arg(long, num_args = 1..)]
    manifests: Vec<PathBuf>,
    /// This node's name, to pick its Node object.
    #[arg(long, visible_alias = "node-name")]
    hostname_override: Option<String>,
    /// Pod CIDRs (comma-separated, one per family).
    #[arg(long, value_delimiter = ',')]
    cluster_cidr: Vec<IpNet>,
    /// Service CIDRs (comma-separated, any number per family).
    #[arg(long, value_delimiter = ',')]
    service_cidr: Vec<IpNet>,
    /// The bit of the packet mark that asks for masquerading (kube-proxy's
    /// `--iptables-masquerade-bit`; 14 is 0x4000).
    #[arg(long, default_value_t = DEFAULT_MASQUERADE_BIT)]
    masquerade_bit: u8,
    /// `primary`, `all`, or CIDRs selecting this node's addresses.
    #[arg(long, default_value = "primary")]
    nodeport_addresses: NodePortAddresses,
    /// Masquerade every connection to a Service, not only those from outside
    /// the cluster CIDRs.
    #[arg(long)]
    masquerade_all: bool,
    /// Include the per-Service-port counters.
    #[arg(long)]
    counters: bool,
    /// Whose established flows a flowtable offloads (long-lived: Services
    /// annotated kube-nft.io/traffic-hint=LongLived; all; off).
    #[arg(long, value_enum, default_value = "long-lived", value_name = "WHOSE")]
    fast_path: kube_nft::core::node_config::FastPath,
    /// `ipvs`: the table the IPVS backend keeps beside IPVS.
    #[arg(long, visible_alias = "backend", value_enum, default_value_t)]
    proxy_mode: ModeName,
}

impl ProxyArgs {
    fn config(&self) -> Result<NodeConfig, String> {
        let config = NodeConfig {
            cluster_cidrs: self.cluster_cidr.clone(),
            service_cidrs: self.service_cidr.clone(),
            masquerade_bit: self.masquerade_bit,
            nodeport_addresses: self.nodeport_addresses.clone(),
            local_addresses: Vec::new(),
            counters: self.counters,
            masquerade_all: self.masquerade_all,
            mode: self.proxy_mode.mode(),
            service_tables: None,
            fast_path: self.fast_path,
        };
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// The config with this namespace's addresses, for the one-shot commands
    /// (`run` reads them itself, on every load).
    fn config_here(&self) -> Result<NodeConfig, String> {
        self.config().map(daemon::with_local_addresses)
    }

    /// Loads and translates; a manifest that cannot be read at all is an error,
    /// a malformed object in one is logged and skipped.
    fn desired(&self, config: &NodeConfig) -> Result<kube_nft::ruleset::Ruleset, String> {
        if self.manifests.is_empty() {
            return Err("render needs --manifests PATH…".into());
        }
        let loaded = files::load(&self.manifests).map_err(|e| format!("manifest {e}"))?;
        for r in &loaded.rejected {
            tracing::warn!("rejected: {r}");
        }
        let (ruleset, _) = kube_nft::nft::translate::desired(
            &loaded.objects,
            self.hostname_override.as_deref(),
            config,
        );
        Ok(ruleset)
    }
}

/// kube-client logs every failed request as an error; the source reports an
/// outage once, when it starts, and again when it ends.
const DEFAULT_LOG_FILTER: &str = "info,kube_client::client::builder=off";

/// The log filter `--v` asks for, as kube-proxy's levels: 0 and 1 log info, 2
/// to 4 debug, 5 and up trace.
fn log_filter(verbosity: u8) -> &'static str {
    match verbosity {
        0..=1 => DEFAULT_LOG_FILTER,
        2..=4 => "debug,kube_client::client::builder=off",
        _ => "trace",
    }
}

/// Logs to stderr, filtered by `RUST_LOG` or else by `run --v`, as text or JSON.
fn init_logging(logging: LogSettings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| log_filter(logging.verbosity).into());
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if logging.json {
        builder.json().init();
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

/// Every flag of `run` with its value as given, its default, or empty: what
/// `/flagz` lists, as kube-proxy's lists its own.
fn flag_values(command: &clap::Command, matches: &ArgMatches) -> Vec<(String, String)> {
    let Some(run) = matches.subcommand_matches("run") else {
        return Vec::new();
    };
    let Some(run_command) = command.find_subcommand("run") else {
        return Vec::new();
    };
    run_command
        .get_arguments()
        .filter_map(|arg| {
            let name = arg.get_long()?;
            let value = run
                .get_raw(arg.get_id().as_str())
                .map(|values| {
                    values
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            Some((name.to_string(), value))
        })
        .collect()
}

fn main() -> ExitCode {
    let command = Cli::command();
    let matches = command.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let reexec_failed = match &cli.command {
        Command::Run(_) => kube_nft::node::malloc_arena::reexec_with_one_arena(),
        _ => None,
    };
    let reexec_warning = reexec_failed.map(|e| {
        format!("running with glibc's malloc arenas: executing again with one failed: {e}")
    });
    if !matches!(cli.command, Command::Run(_)) {
        init_logging(LogSettings::default());
    }
    let result: Result<bool, String> = match cli.command {
        Command::Run(args) => run(&args, &flag_values(&command, &matches), reexec_warning),
        Command::Render { proxy } => {
            proxy
                .config_here()
                .and_then(|c| proxy.desired(&c))
                .map(|ruleset| {
                    print!("{}", text::replace_script(&ruleset.tables));
                    true
                })
        }
        Command::Cleanup { kube_proxy: false } => cleanup(),
        Command::Cleanup { kube_proxy: true } => cleanup_kube_proxy(),
        Command::Top { limit } => top(limit),
        Command::Explain {
            mut proxy,
            src,
            dst,
        } => packet_after_manifests(&mut proxy, src, dst)
            .and_then(|(src, dst)| explain(&proxy, src, &dst)),
        Command::Lab {
            manifests,
            requests,
            keep,
            prefix,
            cluster_cidr,
            service_cidr,
            proxy_mode,
        } => lab::run(&LabOptions {
            manifests,
            requests,
            keep,
            prefix,
            config: NodeConfig {
                cluster_cidrs: cluster_cidr,
                service_cidrs: service_cidr,
                masquerade_bit: DEFAULT_MASQUERADE_BIT,
                mode: proxy_mode.mode(),
                ..NodeConfig::default()
            },
        })
        .map_err(|e| e.to_string()),
        Command::Bench(args) => bench(args).map(|_| true),
        Command::BenchKubeProxy(args) => bench_kube_proxy(&args),
        Command::BenchNodes(args) => bench_nodes(&args),
        Command::BenchIpvs {
            sizes,
            endpoints,
            runs,
            prefix,
        } => kube_nft::bench::ipvs::run(&kube_nft::bench::ipvs::IpvsBenchOptions {
            sizes,
            endpoints,
            runs,
            prefix,
        })
        .map(|report| {
            print!("{report}");
            true
        }),
        Command::BenchFastPath {
            sizes,
            runs,
            rounds,
            seconds,
            prefix,
        } => kube_nft::bench::fast_path::run(&kube_nft::bench::fast_path::FastPathBenchOptions {
            sizes,
            runs,
            rounds,
            seconds,
            prefix,
        })
        .map(|report| {
            print!("{report}");
            true
        }),
        Command::BenchVerification {
            sizes,
            endpoints,
            runs,
        } => kube_nft::bench::verification::run(&sizes, endpoints, runs).map(|rows| {
            print!("{}", kube_nft::bench::verification::table(&rows, runs));
            true
        }),
        Command::BenchChild {
            netns,
            services,
            endpoints,
            counters,
            proxy_mode,
            fast_path,
        } => kube_nft::bench::child_sync(
            &netns, services, endpoints, counters, proxy_mode, fast_path,
        )
        .map(|_| true),
        Command::Serve { netns, name, ports } => {
            serve(netns.as_deref(), &name, &ports).map(|_| true)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("kube-nft: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `run`: logging starts once the flags and the file are resolved, as they
/// both choose its format and level; what they ignore is said then, once.
fn run(
    args: &RunArgs,
    flags_given: &[(String, String)],
    reexec_warning: Option<String>,
) -> Result<bool, String> {
    if args.kube_proxy.version {
        println!("kube-nft {}", env!("CARGO_PKG_VERSION"));
        return Ok(true);
    }
    let mut flags = args.flags.clone();
    let mut warnings: Vec<String> = reexec_warning.into_iter().collect();
    warnings.extend(args.kube_proxy.apply(&mut flags)?);
    let settings = if args.cleanup {
        None
    } else {
        Some(config::resolve(&flags)?)
    };
    init_logging(settings.as_ref().map(|s| s.logging).unwrap_or(LogSettings {
        json: flags.log_format.as_deref() == Some("json"),
        verbosity: flags.verbosity.unwrap_or(0),
    }));
    for warning in warnings
        .iter()
        .chain(settings.iter().flat_map(|s| &s.warnings))
    {
        tracing::warn!("{warning}");
    }
    let Some(settings) = settings else {
        return cleanup();
    };
    if args.init_only == Some(true) {
        kube_nft::node::conntrack_sysctls::settle(&settings.conntrack)?;
        return Ok(true);
    }
    daemon::run(settings, flags_given, args.once).map(|_| true)
}

fn cleanup_kube_proxy() -> Result<bool, String> {
    let mut sock = NftSocket::open().map_err(|e| e.to_string())?;
    let removed = kube_nft::node::kube_proxy_leftovers::remove(&mut sock)?;
    if removed.nftables.is_empty() {
        tracing::info!("no kube-proxy nftables or iptables-nft rules here");
    }
    for line in &removed.nftables {
        tracing::info!("removed kube-proxy's {line}");
    }
    if removed.ipvs_services > 0 {
        tracing::info!("removed {} IPVS virtual services", removed.ipvs_services);
    }
    if removed.ipvs_kept {
        tracing::info!(
            "kube-nft serves this node with IPVS: its virtual services and kube-ipvs0 stay"
        );
    }
    if !removed.ipsets.is_empty() {
        tracing::info!(
            "removed {} ipsets: {}",
            removed.ipsets.len(),
            removed.ipsets.join(", ")
        );
    }
    if !removed.ipsets_in_use.is_empty() {
        tracing::warn!(
            "ipsets still in use by rules kube-nft cannot see or did not write ({}): `kube-proxy --cleanup` removes kube-proxy's iptables-legacy rules and then them",
            removed.ipsets_in_use.join(", ")
        );
    }
    if !removed.legacy_tables.is_empty() {
        tracing::warn!(
            "iptables-legacy tables exist ({}), which kube-nft cannot read: if kube-proxy wrote rules there, `kube-proxy --cleanup` removes them",
            removed.legacy_tables.join("; ")
        );
    }
    Ok(true)
}

fn cleanup() -> Result<bool, String> {
    let mut sock = NftSocket::open().map_err(|e| e.to_string())?;
    kube_nft::nft::kernel::cleanup(&mut sock).map_err(|e| e.to_string())?;
    kube_nft::node::fast_path::reconcile(&mut sock, [false; 2])?;
    kube_nft::ipvs::cleanup().map_err(|e| format!("cleaning up IPVS: {e}"))?;
    Ok(true)
}

/// `explain --manifests PATH… SRC DST` (the README's order): `--manifests` takes
/// every value up to the next flag, so the packet ends up as its last two values.
/// Takes them back from there when they read as a packet.
fn packet_after_manifests(
    proxy: &mut ProxyArgs,
    src: Option<std::net::IpAddr>,
    dst: Option<String>,
) -> Result<(std::net::IpAddr, String), String> {
    if let (Some(src), Some(dst)) = (src, dst) {
        return Ok((src, dst));
    }
    let n = proxy.manifests.len();
    let tail = |i: usize| proxy.manifests[i].to_str().map(str::to_string);
    if n >= 3 {
        if let (Some(s), Some(d)) = (tail(n - 2), tail(n - 1)) {
            if let (Ok(src), true) = (s.parse(), d.contains(':') && d.contains('/')) {
                proxy.manifests.truncate(n - 2);
                return Ok((src, d));
            }
        }
    }
    Err("explain needs a packet: SRC DST:PORT/PROTO, e.g. `kube-nft explain 10.0.0.5 10.96.0.10:80/tcp` (this node's kernel) or `kube-nft explain --manifests app.yaml 10.0.0.5 10.96.0.10:80/tcp`".into())
}

fn explain(proxy: &ProxyArgs, src: std::net::IpAddr, dst: &str) -> Result<bool, String> {
    use kube_nft::tools::explain;
    let packet: explain::Packet = format!("{src} {dst}").parse()?;
    let local = kube_nft::netlink::route::local_addresses()
        .map_err(|e| format!("reading this node's addresses: {e}"))?;
    if proxy.manifests.is_empty() {
        let mut sock = NftSocket::open().map_err(|e| e.to_string())?;
        let ruleset = kube_nft::nft::kernel::read_ruleset(&mut sock).map_err(|e| e.to_string())?;
        if ruleset.tables.is_empty() {
            return Err("no kube-nft tables in this network namespace: is kube-nft running here? (or explain --manifests PATH… what it would program)".into());
        }
        print!(
            "{}",
            explain::render(&explain::explain(&ruleset, &packet, &local))
        );
        return Ok(true);
    }
    let config = proxy.config_here()?;
    let loaded = files::load(&proxy.manifests).map_err(|e| format!("manifest {e}"))?;
    let (ruleset, validated) = kube_nft::nft::translate::desired(
        &loaded.objects,
        proxy.hostname_override.as_deref(),
        &config,
    );
    let e = explain::explain(&ruleset, &packet, &local);
    print!("{}", explain::render(&e));
    if let Some(why) = config.nodeports_unserved(&validated.state) {
        println!("note: {why}");
    }
    Ok(true)
}

fn top(limit: Option<usize>) -> Result<bool, String> {
    use kube_nft::tools::top;
    let mut sock = NftSocket::open().map_err(|e| e.to_string())?;
    match top::read(&mut sock).map_err(|e| e.to_string())? {
        Some(mut rows) => {
            rows.truncate(limit.unwrap_or(usize::MAX));
            print!("{}", top::table(&rows));
            Ok(true)
        }
        None => Err(
            "no Service counters here: is kube-nft running in this network namespace with --counters?"
                .into(),
        ),
    }
}

fn serve(netns: Option<&str>, name: &str, ports: &[u16]) -> Result<(), String> {
    if let Some(ns) = netns {
        kube_nft::testbed::netns::enter(ns).map_err(|e| e.to_string())?;
    }
    let server =
        lab::hostname_server::HostnameServer::bind(name, ports).map_err(|e| e.to_string())?;
    println!("ready");
    server.wait();
    Ok(())
}

fn bench_kube_proxy(args: &VersusArgs) -> Result<bool, String> {
    use kube_nft::bench::versus::{self, Contender};
    let contenders = args
        .contenders
        .iter()
        .map(|n| {
            Contender::named(n).ok_or_else(|| {
                format!("{n:?} is not kube-nft, nftables, iptables, kube-nft-ipvs or ipvs")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if args.sizes.contains(&0) || args.runs == 0 {
        return Err("sizes and runs must be at least 1".into());
    }
    versus::versus(&versus::VersusOptions {
        kubeconfig: args.kubeconfig.clone(),
        kube_proxy: args.kube_proxy.clone(),
        node_name: args.hostname_override.clone(),
        node_ip: args.node_ip,
        sizes: args.sizes.clone(),
        runs: args.runs,
        contenders,
        start_limit: Duration::from_secs(args.start_limit),
        logs: args.logs.clone(),
        plot: args.plot.clone(),
        nft_f_max: args.nft_f_max,
        dataplane: (args.dataplane_rounds > 0).then_some(versus::DataplaneRuns {
            rounds: args.dataplane_rounds,
            seconds: args.dataplane_seconds,
        }),
        etcd: args.etcd.map(|addr| versus::Etcd {
            addr,
            netns: args.etcd_netns.clone(),
        }),
    })?;
    Ok(true)
}

fn bench_nodes(args: &NodesArgs) -> Result<bool, String> {
    use kube_nft::bench::nodes::{self, Contender};
    let contenders = args
        .contenders
        .iter()
        .map(|n| {
            // kube-proxy's iptables mode does not sync 10k Services in minutes
            // here, and the host's kernel has no IPVS.
            Contender::named(n)
                .filter(|c| matches!(c, Contender::KubeNft | Contender::KubeProxyNftables))
                .ok_or_else(|| format!("{n:?} is not kube-nft or nftables"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if args.services == 0 || !args.rate.is_finite() || args.rate <= 0.0 {
        return Err("--services and --rate must be above 0".into());
    }
    nodes::bench_nodes(&nodes::NodesOptions {
        kubeconfig: args.kubeconfig.clone(),
        kube_proxy: args.kube_proxy.clone(),
        nodes: args.nodes.clone(),
        services: args.services,
        contenders,
        rate: args.rate,
        churn: Duration::from_secs(args.churn_seconds),
        start_limit: Duration::from_secs(args.start_limit),
        drain_limit: Duration::from_secs(args.drain_limit),
        apiserver_pid: args.apiserver_pid,
        proxy_args: args.proxy_args.clone(),
        etcd: args.etcd.map(|addr| nodes::Etcd { addr, netns: None }),
        logs: args.logs.clone(),
    })?;
    Ok(true)
}

/// `FROM,TO` of `bench --growth`: two Service counts, the first the smaller.
fn parse_growth(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not FROM,TO (two numbers of Services, FROM smaller)");
    let (from, to) = s.split_once(',').ok_or_else(bad)?;
    let (from, to): (usize, usize) = (
        from.trim().parse().map_err(|_| bad())?,
        to.trim().parse().map_err(|_| bad())?,
    );
    (0 < from && from < to)
        .then_some((from, to))
        .ok_or_else(bad)
}

fn bench(args: BenchArgs) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("kube-nft bench creates network namespaces and needs root".into());
    }
    kube_nft::bench::report::run(&kube_nft::bench::report::Report {
        control: kube_nft::bench::BenchOptions {
            sizes: args.sizes,
            runs: args.runs,
            kube_proxy_shape_max: args.kube_proxy_shape_max,
            operator_max: args.operator_max,
            prefix: args.prefix,
        },
        dataplane_sizes: if args.no_dataplane {
            Vec::new()
        } else {
            args.dataplane_sizes
        },
        dataplane_seconds: args.dataplane_seconds,
        plot: args.plot,
        api_sizes: args.api_sizes,
        growth: args.growth,
    })
}
