//! Real `redis-server` processes for the `redis` feature's tests, on free loopback ports, stopped
//! when dropped. Where redis-server is not installed, `start` says the test is skipped and returns
//! `None`; under CI (the `CI` variable set) it fails instead, so a missing server never passes
//! silently there.

#![allow(dead_code)]

#[path = "ports.rs"]
mod ports;

pub use ports::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether redis-server can be run here; prints the skip line when not (and panics under CI).
pub fn available(test: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var_os("CI").is_some() {
            panic!(
                "{test}: redis-server is not installed, and CI is set: install it (apt-get install redis-server)"
            );
        }
        eprintln!("SKIPPED {test}: redis-server is not installed (apt-get install redis-server)");
    }
    found
}

/// A free loopback port below 55 000, so that a cluster bus 10 000 above it is in range too.
pub fn free_low_port() -> u16 {
    (0..100)
        .map(|_| free_port())
        .find(|&p| p < 55_000)
        .expect("a low free port")
}

/// Where the value of `--tls-port` sits in `extra`, if it is set.
fn tls_port_at(extra: &[String]) -> Option<usize> {
    let i = extra.iter().position(|e| e == "--tls-port")? + 1;
    (i < extra.len()).then_some(i)
}

/// `extra` with its `--tls-port`, if any, replaced by a fresh free port.
fn redraw_tls_port(mut extra: Vec<String>) -> Vec<String> {
    if let Some(i) = tls_port_at(&extra) {
        extra[i] = free_low_port().to_string();
    }
    extra
}

/// A new directory `name` for a server's files, made in memory (`/dev/shm`) where it can be,
/// in the temporary directory otherwise.
///
/// A cluster node rewrites and fsyncs `nodes.conf` on its main thread when it votes in a
/// failover and when it takes the new configuration (three times in a manual failover), and a
/// sentinel its own file. On this project's hosts a small file's fsync on the root disk now and
/// then takes past the fault tests' 10 ms deadline (27.6 ms once in 1 800): a healthy master
/// stalls, its calls time out and its breaker opens, as in one CI run (an fsync made 30 ms long
/// with strace's fault injection fails the failover test so every time). These tests are of the
/// client, not of the disk, and on tmpfs an fsync does no I/O.
fn files_dir(name: String) -> PathBuf {
    let in_memory = PathBuf::from("/dev/shm").join(&name);
    if std::fs::create_dir_all(&in_memory).is_ok() {
        return in_memory;
    }
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// One redis-server process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
    /// A sentinel's configuration file (sentinels rewrite it), `None` for a plain server.
    sentinel: Option<PathBuf>,
}

impl RedisServer {
    /// A server on a free port, or `None` (skipped) where redis-server is not installed.
    pub fn start(test: &str) -> Option<RedisServer> {
        if !available(test) {
            return None;
        }
        Some(RedisServer::spawn(free_port(), Vec::new()))
    }

    /// A server on a free port with `extra` settings (they override the defaults above: the
    /// last of two settings wins), or `None` as [`RedisServer::start`].
    pub fn start_with(test: &str, extra: &[&str]) -> Option<RedisServer> {
        if !available(test) {
            return None;
        }
        let extra = extra.iter().map(|e| e.to_string()).collect();
        Some(RedisServer::spawn(free_port(), extra))
    }

    /// A sentinel on a free port watching the master on `master_port` as `mymaster` (quorum 2,
    /// down after `down_after_ms`), or `None` as [`RedisServer::start`].
    pub fn start_sentinel(test: &str, master_port: u16, down_after_ms: u64) -> Option<RedisServer> {
        if !available(test) {
            return None;
        }
        for _ in 0..20 {
            let port = free_port();
            let dir = files_dir(format!(
                "atomic-limiter-sentinel-{port}-{}",
                std::process::id()
            ));
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds mymaster {down_after_ms}\n\
                     sentinel failover-timeout mymaster 10000\n\
                     sentinel parallel-syncs mymaster 1\n"
                ),
            )
            .expect("a sentinel configuration");
            let mut s = RedisServer {
                port,
                child: None,
                dir,
                extra: Vec::new(),
                sentinel: Some(conf),
            };
            if s.launch() {
                return Some(s);
            }
        }
        panic!("no sentinel of our own came up");
    }

    /// A server of our own: a port freed by `free_port` may be taken by another test's server
    /// before ours binds it, so the answer on the port must come from our process.
    fn spawn(mut port: u16, mut extra: Vec<String>) -> RedisServer {
        for _ in 0..20 {
            let dir = files_dir(format!(
                "atomic-limiter-redis-{port}-{}",
                std::process::id()
            ));
            let mut s = RedisServer {
                port,
                child: None,
                dir,
                extra: extra.clone(),
                sentinel: None,
            };
            if s.launch() {
                return s;
            }
            port = free_port();
            // A TLS port drawn by the caller may be the one that was taken: draw it anew too.
            extra = redraw_tls_port(extra);
        }
        panic!("no redis-server of our own came up");
    }

    /// Starts the process and waits until it answers; `false` if it exited (its port was taken).
    fn launch(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        match &self.sentinel {
            Some(conf) => command.arg(conf).arg("--sentinel"),
            None => command.args(["--save", "", "--appendonly", "no"]),
        };
        let child = command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--protected-mode", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let ours = format!("process_id:{}\r", child.id());
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if raw_command(self.port, &["INFO", "server"]).is_some_and(|i| i.contains(&ours)) {
                return true;
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited {
                self.child = None;
                return false;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server on {} did not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The port it listens on over TLS (`--tls-port`), as finally drawn.
    pub fn tls_port(&self) -> Option<u16> {
        self.extra[tls_port_at(&self.extra)?].parse().ok()
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Whether the server answers PING now.
    pub fn ping(&self) -> bool {
        raw_command(self.port, &["PING"]).is_some_and(|r| r.starts_with("+PONG"))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: the server dies mid-whatever, its memory lost.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (after `kill`).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.launch(),
            "the port {} was taken while the server was down",
            self.port
        );
    }

    /// SIGSTOP: the process hangs, its socket open.
    pub fn pause(&self) {
        signal(self.pid(), "-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), "-CONT");
    }

    /// Sends a command on a fresh connection and returns the raw reply (tests only).
    pub fn command(&self, args: &[&str]) -> Option<String> {
        raw_command(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            signal(c.id(), "-CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// One RESP command on a new connection, its first reply read raw.
pub fn raw_command(port: u16, args: &[&str]) -> Option<String> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = s.read(&mut buf).ok()?;
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A local three-master Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters on free ports, slots assigned by `redis-cli --cluster create`; `None` where
    /// redis-server is not installed (as [`RedisServer::start`]).
    pub fn start(test: &str) -> Option<RedisCluster> {
        if !available(test) {
            return None;
        }
        let cluster = RedisCluster::create(0, &[]);
        cluster.wait_until_ok();
        Some(cluster)
    }

    /// Waits until every node says the cluster is ok (20 s at most).
    fn wait_until_ok(&self) {
        let start = Instant::now();
        while !self.nodes.iter().all(|n| {
            n.command(&["CLUSTER", "INFO"])
                .is_some_and(|r| r.contains("cluster_state:ok"))
        }) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the cluster did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Three masters with `replicas` each, every server given `extra` settings, slots and roles
    /// assigned by `redis-cli --cluster create` (not waited for).
    fn create(replicas: usize, extra: &[String]) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                let port = free_port();
                let mut settings = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    format!("nodes-{port}.conf"),
                ];
                settings.extend(extra.iter().cloned());
                RedisServer::spawn(port, settings)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        RedisCluster { nodes }
    }

    /// Three masters whose cluster bus and announced ports are TLS (`tls-cluster yes`): each
    /// node also listens in plain text on its `port`, for the tests' own commands. `tls` are the
    /// certificate settings every server gets, `cli_tls` redis-cli's (`--tls --cacert ...`).
    /// Answers the cluster and each node's TLS port.
    pub fn start_tls(
        test: &str,
        tls: &[String],
        cli_tls: &[String],
    ) -> Option<(RedisCluster, Vec<u16>)> {
        if !available(test) {
            return None;
        }
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let port = free_port();
                // Its bus listens 10 000 above it: keep both within the port range.
                let tls_port = free_low_port();
                let mut settings = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    format!("nodes-{port}.conf"),
                    "--tls-port".into(),
                    tls_port.to_string(),
                    "--tls-cluster".into(),
                    "yes".into(),
                    "--tls-replication".into(),
                    "yes".into(),
                ];
                settings.extend(tls.iter().cloned());
                RedisServer::spawn(port, settings)
            })
            .collect();
        let tls_ports: Vec<u16> = nodes.iter().map(|n| n.tls_port().unwrap()).collect();
        let addrs: Vec<String> = tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let status = Command::new("redis-cli")
            .args(cli_tls)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --tls --cluster create failed");
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok();
        Some((cluster, tls_ports))
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// Three masters and a replica of each, `--cluster-node-timeout` `node_timeout_ms`, every
    /// replica in sync; `None` where redis-server is not installed.
    pub fn start_with_replicas(test: &str, node_timeout_ms: u64) -> Option<RedisCluster> {
        RedisCluster::start_with_replicas_and(test, node_timeout_ms, &[])
    }

    /// [`RedisCluster::start_with_replicas`], each server also given `extra` settings.
    pub fn start_with_replicas_and(
        test: &str,
        node_timeout_ms: u64,
        extra: &[&str],
    ) -> Option<RedisCluster> {
        if !available(test) {
            return None;
        }
        let mut settings = vec![
            "--cluster-node-timeout".to_string(),
            node_timeout_ms.to_string(),
        ];
        settings.extend(extra.iter().map(|e| e.to_string()));
        let cluster = RedisCluster::create(1, &settings);
        let start = Instant::now();
        while !cluster.is_ready() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the cluster with replicas did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    /// Every node says the cluster is ok, three say they are masters and three that they are
    /// replicas with their link up.
    fn is_ready(&self) -> bool {
        let mut masters = 0;
        let mut synced = 0;
        for n in &self.nodes {
            let ok = n
                .command(&["CLUSTER", "INFO"])
                .is_some_and(|r| r.contains("cluster_state:ok"));
            let Some(info) = n.command(&["INFO", "replication"]) else {
                return false;
            };
            if !ok {
                return false;
            }
            if info.contains("role:master") {
                masters += 1;
            } else if info.contains("master_link_status:up") {
                synced += 1;
            }
        }
        masters == 3 && synced == 3
    }

    /// Whether node `i` answers that it is a master.
    pub fn is_master(&self, i: usize) -> bool {
        self.nodes[i]
            .command(&["INFO", "replication"])
            .is_some_and(|r| r.contains("role:master"))
    }

    /// The index of node `i`'s replica.
    pub fn replica_of(&self, i: usize) -> usize {
        let id = self.nodes[i]
            .command(&["CLUSTER", "MYID"])
            .and_then(|r| r.lines().nth(1).map(str::to_owned))
            .expect("CLUSTER MYID");
        let nodes = self.nodes[i]
            .command(&["CLUSTER", "NODES"])
            .expect("CLUSTER NODES");
        let port = nodes
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields.len() > 3 && fields[2].contains("slave") && fields[3] == id).then(|| {
                    let addr = fields[1].split('@').next().unwrap_or("");
                    addr.rsplit(':').next().unwrap_or("").parse::<u16>().ok()
                })?
            })
            .expect("a replica of the master");
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("the replica is one of ours")
    }

    /// The index of the node that serves `key`'s slot now, as node 0..6 answer (`MOVED` or
    /// served locally).
    pub fn master_of(&self, key: &str) -> usize {
        for (i, n) in self.nodes.iter().enumerate() {
            if !self.is_master(i) {
                continue;
            }
            let slot = n
                .command(&["CLUSTER", "KEYSLOT", key])
                .and_then(|r| r.trim().trim_start_matches(':').parse::<u16>().ok())
                .expect("CLUSTER KEYSLOT");
            let nodes = n.command(&["CLUSTER", "NODES"]).expect("CLUSTER NODES");
            let mine = nodes.lines().find(|l| l.contains("myself")).unwrap_or("");
            let serves = mine.split(' ').skip(8).any(|range| {
                let mut ends = range.split('-');
                let lo = ends.next().and_then(|x| x.parse::<u16>().ok());
                let hi = ends.next().and_then(|x| x.parse::<u16>().ok()).or(lo);
                matches!((lo, hi), (Some(lo), Some(hi)) if (lo..=hi).contains(&slot))
            });
            if serves {
                return i;
            }
        }
        panic!("no master serves {key}");
    }
}
