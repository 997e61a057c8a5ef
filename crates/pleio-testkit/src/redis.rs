//! Throwaway Redis servers for integration tests: standalone servers and
//! Redis Clusters on 127.0.0.1, run from the `redis-server` and `redis-cli`
//! found through `PATH` (Redis 7.0 or newer; Debian's `redis-server`
//! package). Each server has its own temporary directory (its log,
//! `redis.log`, and a cluster node's `nodes.conf`) and is killed with
//! SIGKILL and reaped when dropped, also when the test panics. Tests call
//! [`unavailable`] first and [`skip!`](crate::skip) with its reason.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server has to answer PING after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster has to become (or become again) healthy.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Spawns of one server, each on a fresh port, before giving up on ports.
const START_ATTEMPTS: usize = 5;
/// A cluster node's bus listens on its port plus this.
const BUS_OFFSET: u16 = 10000;
/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;
/// The oldest Redis whose `redis-cli` this module can drive (`-e`).
const MIN_MAJOR: u32 = 7;

/// Why Redis cannot run here (binary missing, ...), for skip!.
pub fn unavailable() -> Option<String> {
    for name in ["redis-server", "redis-cli"] {
        let path = match find(name) {
            Ok(p) => p,
            Err(e) => return Some(e),
        };
        let out = match Command::new(&path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            Ok(o) => {
                return Some(format!(
                    "{} --version failed ({}): {}",
                    path.display(),
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Err(e) => return Some(format!("cannot run {}: {e}", path.display())),
        };
        // "Redis server v=7.0.15 sha=..." / "redis-cli 7.0.15"
        let version = out
            .split_whitespace()
            .map(|w| w.trim_start_matches("v="))
            .find(|w| w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('.'));
        let major = version.and_then(|v| v.split('.').next()?.parse::<u32>().ok());
        match major {
            Some(m) if m >= MIN_MAJOR => {}
            _ => {
                return Some(format!(
                    "{} is not Redis {MIN_MAJOR}.0 or newer: {}",
                    path.display(),
                    out.trim()
                ))
            }
        }
    }
    if let Err(e) = TcpListener::bind("127.0.0.1:0") {
        return Some(format!("cannot listen on 127.0.0.1: {e}"));
    }
    None
}

/// Throwaway TLS material in a temporary directory, as PEM files: a CA,
/// a server certificate for 127.0.0.1 and `localhost`, and a client
/// certificate, all signed by the CA (ECDSA P-256).
pub struct TlsFiles {
    /// The CA's certificate (what clients trust).
    pub ca: PathBuf,
    /// The server's certificate and key.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate, for servers that require one.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsFiles {
    /// Generates a fresh CA and certificates.
    pub fn generate() -> Result<TlsFiles, String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        };
        let e = |e: rcgen::Error| format!("cannot make a test certificate: {e}");
        let ca_key = KeyPair::generate().map_err(e)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "pleio test CA");
        let ca_cert = ca.self_signed(&ca_key).map_err(e)?;
        let leaf = |names: Vec<String>, purposes| -> Result<(String, String), String> {
            let key = KeyPair::generate().map_err(e)?;
            let mut p = CertificateParams::new(names).map_err(e)?;
            p.distinguished_name.push(DnType::CommonName, "pleio test");
            p.extended_key_usages = purposes;
            let cert = p.signed_by(&key, &ca_cert, &ca_key).map_err(e)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        // Cluster nodes and replicas present the server certificate as
        // clients of each other too.
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        let (client_cert, client_key) = leaf(vec![], vec![ExtendedKeyUsagePurpose::ClientAuth])?;
        let dir = tempfile::Builder::new()
            .prefix("pleio-tls-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let p = dir.path().join(name);
            std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            Ok(p)
        };
        Ok(TlsFiles {
            ca: write("ca.pem", &ca_cert.pem())?,
            server_cert: write("server.pem", &server_cert)?,
            server_key: write("server.key", &server_key)?,
            client_cert: write("client.pem", &client_cert)?,
            client_key: write("client.key", &client_key)?,
            _dir: dir,
        })
    }
}

/// One redis-server process on 127.0.0.1, killed (SIGKILL by pid, then waited for) on drop, its directory removed.
pub struct Server {
    child: Child,
    port: u16,
    password: Option<String>,
    /// redis-cli's TLS arguments for a TLS-only server.
    tls_cli: Vec<String>,
    killed: bool,
    // Dropped (removed) after `drop` has killed the server.
    dir: tempfile::TempDir,
}

impl Server {
    /// A standalone server. `password`: if Some, `requirepass` is set (default user).
    pub fn standalone(password: Option<&str>) -> Result<Server, String> {
        Server::start(password, false, None)
    }

    /// A standalone server that speaks only TLS (its port is the TLS
    /// port), with `files`' server certificate; `require_client_cert`:
    /// clients must present a certificate the CA signed.
    pub fn standalone_tls(
        password: Option<&str>,
        files: &TlsFiles,
        require_client_cert: bool,
    ) -> Result<Server, String> {
        Server::start(password, false, Some((files, require_client_cert)))
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// "127.0.0.1:PORT".
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The redis-server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL now (for failover tests); idempotent.
    pub fn kill(&mut self) {
        if !self.killed {
            self.killed = true;
            // Fails only if the process was already reaped, never here.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Runs redis-cli against this server with args, returns stdout (error with stderr on failure).
    ///
    /// An error reply is a failure too (`redis-cli -e`); stdin is closed.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        let port = self.port.to_string();
        let mut all = vec!["-h", "127.0.0.1", "-p", &port, "-e"];
        all.extend(self.tls_cli.iter().map(String::as_str));
        all.extend_from_slice(args);
        let out = run_cli(self.password.as_deref(), &all)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "redis-cli {} on {}: {}: {}",
                args.join(" "),
                self.addr(),
                out.status,
                output_text(&out)
            ))
        }
    }

    /// Spawns a server (a cluster node if `cluster`) on a free port and
    /// waits for its PONG, on another port if that one was taken meanwhile.
    fn start(
        password: Option<&str>,
        cluster: bool,
        tls: Option<(&TlsFiles, bool)>,
    ) -> Result<Server, String> {
        let bin = find("redis-server")?;
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port(cluster)?;
            let dir = tempfile::Builder::new()
                .prefix("pleio-redis-")
                .tempdir()
                .map_err(|e| format!("redis-server: cannot make a temporary directory: {e}"))?;
            let log_path = dir.path().join("redis.log");
            let log = File::create(&log_path)
                .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
            let log2 = log
                .try_clone()
                .map_err(|e| format!("cannot duplicate {}: {e}", log_path.display()))?;
            let mut cmd = Command::new(&bin);
            let mut tls_cli = Vec::new();
            match tls {
                None => {
                    cmd.arg("--port").arg(port.to_string());
                }
                Some((f, require)) => {
                    cmd.args(["--port", "0", "--tls-port"])
                        .arg(port.to_string())
                        .arg("--tls-cert-file")
                        .arg(&f.server_cert)
                        .arg("--tls-key-file")
                        .arg(&f.server_key)
                        .arg("--tls-ca-cert-file")
                        .arg(&f.ca)
                        .args(["--tls-auth-clients", if require { "yes" } else { "no" }]);
                    if cluster {
                        cmd.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                    }
                    let path = |p: &Path| p.to_string_lossy().into_owned();
                    tls_cli = vec![
                        "--tls".into(),
                        "--cacert".into(),
                        path(&f.ca),
                        "--cert".into(),
                        path(&f.client_cert),
                        "--key".into(),
                        path(&f.client_key),
                    ];
                }
            }
            cmd.args(["--bind", "127.0.0.1", "--protected-mode", "no"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                // Replicas sync at once, not after 5 s of waiting for more.
                .args(["--repl-diskless-sync-delay", "0"])
                // DEBUG REPLICATE makes a replica lag on purpose (loopback only).
                .args(["--enable-debug-command", "local"])
                .arg("--dir")
                .arg(dir.path());
            if cluster {
                cmd.args(["--cluster-enabled", "yes"])
                    .args(["--cluster-config-file", "nodes.conf"])
                    .args(["--cluster-node-timeout", "1000"])
                    // A replica fails over however long it was cut off.
                    .args(["--cluster-replica-validity-factor", "0"]);
            }
            if let Some(p) = password {
                cmd.args(["--requirepass", p]);
                if cluster {
                    cmd.args(["--masterauth", p]);
                }
            }
            cmd.stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2));
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
            let mut server = Server {
                child,
                port,
                password: password.map(str::to_string),
                tls_cli,
                killed: false,
                dir,
            };
            match server.wait_pong() {
                Ok(()) => return Ok(server),
                Err((true, e)) => last = e, // dropped: killed; next port
                Err((false, e)) => return Err(e),
            }
        }
        Err(format!(
            "redis-server: no port it could bind in {START_ATTEMPTS} attempts; the last: {last}"
        ))
    }

    /// Polls `redis-cli ping` until PONG. Err((bind failure?, message)).
    fn wait_pong(&mut self) -> Result<(), (bool, String)> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.killed = true; // reaped already
                let log = self.log_tail();
                let bind = log.contains("Address already in use");
                return Err((
                    bind,
                    format!(
                        "redis-server on port {} exited at start ({status}); its log ends:\n{log}",
                        self.port
                    ),
                ));
            }
            let last = match self.cli(&["ping"]) {
                Ok(out) if out.trim() == "PONG" => return Ok(()),
                Ok(out) => out.trim().to_string(),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                self.kill();
                return Err((
                    false,
                    format!(
                        "redis-server on port {} gave no PONG within {START_TIMEOUT:?} \
                         (last: {last}); its log ends:\n{}",
                        self.port,
                        self.log_tail()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of the server's log.
    fn log_tail(&self) -> String {
        let path = self.dir.path().join("redis.log");
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(20)..].join("\n")
            }
            Err(e) => format!("(cannot read {}: {e})", path.display()),
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the password.
        f.debug_struct("Server")
            .field("port", &self.port)
            .field("pid", &self.child.id())
            .field("killed", &self.killed)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster on 127.0.0.1: `masters` masters with `replicas_per_master` replicas each, created with `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`, waited for until `CLUSTER INFO` says cluster_state:ok on every node and every slot is covered (bounded wait, ~30 s, then error). cluster-node-timeout short (e.g. 1000 ms) so failover tests are quick.
///
/// Its nodes run with `cluster-node-timeout 1000` and
/// `cluster-replica-validity-factor 0`: a replica of a killed master is
/// promoted in about 2 s. `start` also waits until every node knows every
/// other and every replica's link to its master is up.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes, killed on drop; kill one with [`Server::kill`].
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts `masters` (at least 3, as `redis-cli --cluster create`
    /// requires) masters with `replicas_per_master` replicas each.
    /// `password`: if Some, every node's `requirepass` and `masterauth`.
    pub fn start(
        masters: usize,
        replicas_per_master: usize,
        password: Option<&str>,
    ) -> Result<Cluster, String> {
        Cluster::start_with(masters, replicas_per_master, password, None)
    }

    /// [`Cluster::start`] with every node speaking only TLS, to clients,
    /// to each other (`tls-cluster yes`) and to its replicas, with
    /// `files`' server certificate; clients need no certificate.
    pub fn start_tls(
        masters: usize,
        replicas_per_master: usize,
        password: Option<&str>,
        files: &TlsFiles,
    ) -> Result<Cluster, String> {
        Cluster::start_with(masters, replicas_per_master, password, Some(files))
    }

    fn start_with(
        masters: usize,
        replicas_per_master: usize,
        password: Option<&str>,
        tls: Option<&TlsFiles>,
    ) -> Result<Cluster, String> {
        if masters < 3 {
            return Err(format!(
                "a Redis Cluster needs at least 3 masters (redis-cli --cluster create), not {masters}"
            ));
        }
        let total = masters * (1 + replicas_per_master);
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(Server::start(password, true, tls.map(|f| (f, false)))?);
        }
        let cluster = Cluster { nodes };
        let addrs: Vec<String> = cluster.nodes.iter().map(Server::addr).collect();
        let replicas = replicas_per_master.to_string();
        let mut args: Vec<&str> = cluster.nodes[0]
            .tls_cli
            .iter()
            .map(String::as_str)
            .collect();
        args.extend(["--cluster", "create"]);
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let out = run_cli(password, &args)?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create {} --cluster-replicas {replicas}: {}: {}",
                addrs.join(" "),
                out.status,
                output_text(&out)
            ));
        }
        poll("the new cluster to be ready", || {
            cluster.check(Some(masters))
        })?;
        Ok(cluster)
    }

    /// "127.0.0.1:PORT" of one node (the first) to bootstrap a client from.
    pub fn seed(&self) -> String {
        self.nodes[0].addr()
    }

    /// Indices into `nodes` of the current masters (from CLUSTER NODES).
    ///
    /// Asks the first live node; counts the live nodes it flags `master`
    /// and not `fail` or `fail?`, in increasing order.
    pub fn masters(&self) -> Result<Vec<usize>, String> {
        let (_, node) = self.live().next().ok_or("every node is killed")?;
        let mut masters = Vec::new();
        for e in self.cluster_nodes(node)? {
            if e.has("master") && !e.failing() {
                let i = self.index(e.port, node)?;
                if !self.nodes[i].killed {
                    masters.push(i);
                }
            }
        }
        masters.sort_unstable();
        Ok(masters)
    }

    /// Waits (bounded, ~30 s) until every live master's replicas have
    /// acknowledged its whole replication stream (the offsets of `INFO
    /// replication`; replicas acknowledge once a second).
    pub fn wait_replicated(&self) -> Result<(), String> {
        poll("replicas caught up with their masters", || {
            for (_, node) in self.live() {
                let info = node.cli(&["INFO", "replication"])?;
                let field = |k: &str| {
                    info.lines()
                        .find_map(|l| l.trim().strip_prefix(k))
                        .and_then(|v| v.parse::<u64>().ok())
                };
                if !info.contains("role:master") {
                    continue;
                }
                let Some(own) = field("master_repl_offset:") else {
                    return Err(format!("{}: no master_repl_offset", node.addr()));
                };
                for l in info.lines().filter(|l| l.starts_with("slave")) {
                    let acked = l
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("offset="))
                        .and_then(|v| v.parse::<u64>().ok());
                    if acked.is_none_or(|a| a < own) {
                        return Err(format!("{}: a replica at {acked:?} of {own}", node.addr()));
                    }
                }
            }
            Ok(())
        })
    }

    /// Waits (bounded, ~30 s) until cluster_state:ok again on every live node, after a kill.
    ///
    /// And until every node sees all slots served by live masters not
    /// marked failing (a node that has not yet noticed a kill still says
    /// ok). Fails if a killed master had no replica to take over.
    pub fn wait_ok(&self) -> Result<(), String> {
        poll("cluster_state:ok on every live node", || self.check(None))
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Server)> {
        self.nodes.iter().enumerate().filter(|(_, s)| !s.killed)
    }

    /// The index of the node listening on `port`, as `asked` names it.
    fn index(&self, port: u16, asked: &Server) -> Result<usize, String> {
        self.nodes
            .iter()
            .position(|s| s.port == port)
            .ok_or(format!(
                "{} names a node on port {port}, not one of this cluster's",
                asked.addr()
            ))
    }

    fn cluster_nodes(&self, node: &Server) -> Result<Vec<NodeEntry>, String> {
        let text = node.cli(&["CLUSTER", "NODES"])?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                NodeEntry::parse(l).ok_or(format!("{}: bad CLUSTER NODES line {l:?}", node.addr()))
            })
            .collect()
    }

    /// Ok if every live node says cluster_state:ok with every slot served
    /// by a live master it does not flag as failing. `ready`: the number of
    /// masters of a new cluster; also every node knows all the others,
    /// connected, and every replica's link to its master is up.
    fn check(&self, ready: Option<usize>) -> Result<(), String> {
        for (i, node) in self.live() {
            let at = format!("node {i} ({})", node.addr());
            let info = fields(&node.cli(&["CLUSTER", "INFO"])?);
            let slots = SLOTS.to_string();
            for (key, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", slots.as_str()),
                ("cluster_slots_ok", slots.as_str()),
            ] {
                let got = info.get(key).map_or("(missing)", String::as_str);
                if got != want {
                    return Err(format!("{at}: {key}:{got}"));
                }
            }
            let entries = self.cluster_nodes(node)?;
            let mut serving = 0;
            for e in &entries {
                if e.slots {
                    let j = self.index(e.port, node)?;
                    if self.nodes[j].killed {
                        return Err(format!("{at} still has killed node {j} serving slots"));
                    }
                    if e.failing() {
                        return Err(format!(
                            "{at} flags node {j}, serving slots, {}",
                            e.flags.join(",")
                        ));
                    }
                    serving += 1;
                }
            }
            if let Some(masters) = ready {
                if serving != masters {
                    return Err(format!(
                        "{at}: {serving} masters serve slots, not {masters}"
                    ));
                }
                if entries.len() != self.nodes.len() {
                    return Err(format!(
                        "{at} knows {} nodes of {}",
                        entries.len(),
                        self.nodes.len()
                    ));
                }
                // redis-cli makes the replicas replicate only after the
                // nodes met: gossip tells the others a while later.
                let flagged = entries.iter().filter(|e| e.has("master")).count();
                if flagged != masters {
                    return Err(format!("{at} sees {flagged} masters, not {masters}"));
                }
                if let Some(e) = entries
                    .iter()
                    .find(|e| !e.connected || e.failing() || e.has("handshake") || e.has("noaddr"))
                {
                    return Err(format!(
                        "{at} sees port {}: {} {}",
                        e.port,
                        e.flags.join(","),
                        if e.connected {
                            "connected"
                        } else {
                            "disconnected"
                        }
                    ));
                }
                let repl = fields(&node.cli(&["INFO", "replication"])?);
                if repl.get("role").map(String::as_str) == Some("slave") {
                    let link = repl
                        .get("master_link_status")
                        .map_or("(missing)", String::as_str);
                    if link != "up" {
                        return Err(format!("{at}: master_link_status:{link}"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One line of CLUSTER NODES, what this module needs of it.
struct NodeEntry {
    port: u16,
    flags: Vec<String>,
    connected: bool,
    /// It serves at least one slot.
    slots: bool,
}

impl NodeEntry {
    /// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
    /// <pong-recv> <config-epoch> <link-state> <slot>...`
    fn parse(line: &str) -> Option<NodeEntry> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            return None;
        }
        let addr = f[1].split(['@', ',']).next()?;
        let port = addr.rsplit(':').next()?.parse().ok()?;
        Some(NodeEntry {
            port,
            flags: f[2].split(',').map(str::to_string).collect(),
            connected: f[7] == "connected",
            slots: f.len() > 8,
        })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn failing(&self) -> bool {
        self.has("fail") || self.has("fail?")
    }
}

/// `key:value` lines (INFO, CLUSTER INFO) as a map.
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Calls `f` every 100 ms until it is Ok, for at most [`CLUSTER_TIMEOUT`].
fn poll(what: &str, mut f: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = Instant::now() + CLUSTER_TIMEOUT;
    loop {
        match f() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "waited {CLUSTER_TIMEOUT:?} for {what}; the last check: {e}"
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Runs redis-cli with `args` (after `-a P --no-auth-warning` if a
/// password is given), stdin closed; Err only if it cannot be run.
fn run_cli(password: Option<&str>, args: &[&str]) -> Result<Output, String> {
    let bin = find("redis-cli")?;
    let mut cmd = Command::new(&bin);
    if let Some(p) = password {
        cmd.args(["-a", p, "--no-auth-warning"]);
    }
    // Without a command redis-cli would read commands from stdin.
    cmd.args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))
}

/// A failed command's stderr, or its stdout if stderr is empty, without
/// the colour escapes `redis-cli --cluster` writes even into a pipe.
fn output_text(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let text = if err.trim().is_empty() {
        String::from_utf8_lossy(&out.stdout)
    } else {
        err
    };
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ parameters final-letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain.trim().to_string()
}

/// The executable `name` in a directory of `PATH`.
fn find(name: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or(format!(
            "no {name} in PATH (Debian: apt-get install redis-server)"
        ))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A port of 127.0.0.1 free now (and, for a cluster node, its bus port
/// too) and not handed out before by this process.
fn free_port(cluster: bool) -> Result<u16, String> {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot bind 127.0.0.1:0: {e}"))?
            .port();
        if given.contains(&port) {
            continue;
        }
        if cluster {
            let Some(bus) = port.checked_add(BUS_OFFSET) else {
                continue;
            };
            if given.contains(&bus) || TcpListener::bind(("127.0.0.1", bus)).is_err() {
                continue;
            }
            given.insert(bus);
        }
        given.insert(port);
        return Ok(port);
    }
    Err("no free port on 127.0.0.1 (with its bus port) in 100 tries".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_lose_colour_and_cluster_nodes_lines_parse() {
        use std::os::unix::process::ExitStatusExt;
        let out = Output {
            status: std::process::ExitStatus::from_raw(256),
            stdout: b"\x1b[31;1m[ERR] Node 127.0.0.1:1 is not empty.\n\x1b[0m".to_vec(),
            stderr: Vec::new(),
        };
        assert_eq!(output_text(&out), "[ERR] Node 127.0.0.1:1 is not empty.");
        let e = NodeEntry::parse(
            "07c3 127.0.0.1:30004@40004,host myself,master - 0 0 1 connected 0-5460 5461",
        )
        .unwrap();
        assert_eq!(e.port, 30004);
        assert!(e.has("master") && e.has("myself") && !e.failing() && e.connected && e.slots);
        let e = NodeEntry::parse("67ed :30002@40002 master,fail? - 0 0 2 disconnected").unwrap();
        assert!(e.port == 30002 && e.failing() && !e.connected && !e.slots);
    }

    #[test]
    fn a_standalone_server_answers_and_dies() {
        if let Some(why) = unavailable() {
            crate::skip!("{why}");
        }
        let mut s = Server::standalone(None).unwrap();
        assert_eq!(s.addr(), format!("127.0.0.1:{}", s.port()));
        assert_eq!(s.cli(&["ping"]).unwrap().trim(), "PONG");
        assert_eq!(s.cli(&["SET", "k", "v"]).unwrap().trim(), "OK");
        assert_eq!(s.cli(&["GET", "k"]).unwrap().trim(), "v");
        let e = s.cli(&["INCR"]).unwrap_err();
        assert!(e.contains("wrong number of arguments"), "{e}");
        let pid = s.pid();
        let proc = PathBuf::from(format!("/proc/{pid}"));
        assert!(proc.exists());
        s.kill();
        assert!(!proc.exists(), "{pid} still there (not reaped?)");
        s.kill();
        let e = s.cli(&["ping"]).unwrap_err();
        assert!(e.contains("refused"), "{e}");

        // Drop kills and removes the directory.
        let s = Server::standalone(None).unwrap();
        let (proc, dir) = (
            PathBuf::from(format!("/proc/{}", s.pid())),
            s.dir.path().to_path_buf(),
        );
        assert!(dir.join("redis.log").is_file());
        drop(s);
        assert!(!proc.exists() && !dir.exists());
    }

    #[test]
    fn a_password_is_required() {
        if let Some(why) = unavailable() {
            crate::skip!("{why}");
        }
        let s = Server::standalone(Some("s3cret")).unwrap();
        let out = Command::new(find("redis-cli").unwrap())
            .args(["-p", &s.port().to_string(), "ping"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("NOAUTH"), "{text}");
        assert_eq!(s.cli(&["ping"]).unwrap().trim(), "PONG");
    }

    #[test]
    fn a_cluster_fails_over() {
        if let Some(why) = unavailable() {
            crate::skip!("{why}");
        }
        let t = Instant::now();
        let mut c = Cluster::start(3, 1, None).unwrap();
        eprintln!("3+3 cluster up in {:?}", t.elapsed());
        assert_eq!(c.nodes.len(), 6);
        assert_eq!(c.seed(), c.nodes[0].addr());
        let masters = c.masters().unwrap();
        assert_eq!(masters.len(), 3, "{masters:?}");
        for k in ["a", "b", "c", "d"] {
            assert_eq!(c.nodes[0].cli(&["-c", "SET", k, k]).unwrap().trim(), "OK");
        }
        for k in ["a", "b", "c", "d"] {
            assert_eq!(c.nodes[5].cli(&["-c", "GET", k]).unwrap().trim(), k);
        }

        let dead = masters[0];
        let t = Instant::now();
        c.nodes[dead].kill();
        c.wait_ok().unwrap();
        eprintln!("failover in {:?}", t.elapsed());
        let after = c.masters().unwrap();
        assert_eq!(after.len(), 3, "{after:?}");
        assert!(!after.contains(&dead), "{after:?}");
        let live = if dead == 0 { 1 } else { 0 };
        for k in ["e", "f", "g", "h"] {
            assert_eq!(
                c.nodes[live].cli(&["-c", "SET", k, k]).unwrap().trim(),
                "OK"
            );
            assert_eq!(c.nodes[live].cli(&["-c", "GET", k]).unwrap().trim(), k);
        }
    }

    #[test]
    fn a_cluster_with_a_password() {
        if let Some(why) = unavailable() {
            crate::skip!("{why}");
        }
        // Replicas authenticate to their masters (masterauth): start waits
        // for their links to be up.
        let c = Cluster::start(3, 1, Some("pw")).unwrap();
        let m = c.masters().unwrap();
        let dump: Vec<String> = c
            .nodes
            .iter()
            .map(|n| format!("{}:\n{}", n.port(), n.cli(&["CLUSTER", "NODES"]).unwrap()))
            .collect();
        assert_eq!(m.len(), 3, "{m:?} {}", dump.join("\n"));
        assert_eq!(
            c.nodes[1].cli(&["-c", "SET", "x", "1"]).unwrap().trim(),
            "OK"
        );
        assert_eq!(c.nodes[2].cli(&["-c", "GET", "x"]).unwrap().trim(), "1");
        assert!(Cluster::start(2, 0, None)
            .unwrap_err()
            .contains("at least 3"));
    }
}
