//! The service as a child process on free loopback ports, its log read as it runs, stopped
//! when dropped.
#![allow(dead_code)] // each test binary uses its own part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

pub struct Rls {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
    lines: mpsc::Receiver<String>,
    pub dir: PathBuf,
}

/// A fresh folder under the target directory for one test's files.
pub fn folder(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("atomic-limiter-rls-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Rls {
    /// Starts the service on `config` (written to a file in `dir`) with `extra` flags.
    pub fn start(dir: &Path, config: &str, extra: &[&str]) -> Rls {
        let file = dir.join("config.yaml");
        std::fs::write(&file, config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_atomic-limiter-rls"))
            .arg("--config")
            .arg(&file)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
                let _ = send.send(line);
            }
        });
        let mut rls = Rls {
            child,
            grpc: "0.0.0.0:0".parse().unwrap(),
            http: "0.0.0.0:0".parse().unwrap(),
            log,
            lines,
            dir: dir.to_path_buf(),
        };
        let line = rls.wait_for("serving gRPC on", Duration::from_secs(30));
        // "serving gRPC on A, /healthz and /metrics on B"
        let after = line.split("serving gRPC on ").nth(1).unwrap();
        let (grpc, rest) = after.split_once(',').unwrap();
        rls.grpc = grpc.trim().parse().unwrap();
        rls.http = rest.rsplit(' ').next().unwrap().trim().parse().unwrap();
        rls
    }

    /// The next log line containing `text`, waiting at most `within`.
    pub fn wait_for(&mut self, text: &str, within: Duration) -> String {
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "no log line with {text:?} within {within:?}; log:\n{}",
                    self.log.lock().unwrap().join("\n")
                ),
            }
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// A GET on the HTTP port: the status code and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }

    /// Waits for the process to end, at most `within`: its exit code.
    pub fn exit_within(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A request of `descriptors` in the tests' domain, `edge`.
pub fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

pub async fn client(rls: &Rls) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(rls.url()).await.unwrap()
}

pub async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

pub fn over(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::OverLimit as i32
}
