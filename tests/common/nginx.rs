//! A real nginx, from the distribution's package, as a reverse proxy on a free loopback port in
//! front of a server of the test's; stopped when dropped. Where nginx is not installed, `start`
//! says the test is skipped and returns `None`; under CI (the `CI` variable set) it fails instead.

#[path = "ports.rs"]
mod ports;

use ports::free_port;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub struct Nginx {
    pub addr: SocketAddr,
    child: Child,
    dir: PathBuf,
}

fn binary() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Nginx {
    /// nginx on a free port, passing every request to `upstream` with the lines of
    /// `proxy_config` (e.g. `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`).
    pub fn start(test: &str, upstream: SocketAddr, proxy_config: &str) -> Option<Nginx> {
        let Some(nginx) = binary() else {
            if std::env::var_os("CI").is_some() {
                panic!(
                    "{test}: nginx is not installed, and CI is set: apt-get install nginx-light"
                );
            }
            eprintln!("SKIPPED {test}: nginx is not installed (apt-get install nginx-light)");
            return None;
        };
        // A port freed by `free_port` may be taken by another test's nginx before ours binds it;
        // ours then exits, and a probe that only connected would talk to the other one.
        for _ in 0..20 {
            if let Some(ours) = Nginx::launch(&nginx, free_port(), upstream, proxy_config) {
                return Some(ours);
            }
        }
        panic!("{test}: no nginx of our own came up");
    }

    /// Starts nginx on `port` and waits until the answer on it is our own token; `None` if
    /// nginx exited (its port was taken).
    fn launch(nginx: &Path, port: u16, upstream: SocketAddr, proxy_config: &str) -> Option<Nginx> {
        // Unique per launch: two tests of one binary may draw the same port.
        static LAUNCHES: AtomicU32 = AtomicU32::new(0);
        let n = LAUNCHES.fetch_add(1, Ordering::Relaxed); // only a count, orders nothing
        let token = format!("al-nginx-{}-{port}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&token);
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.display();
        // Run as whoever runs the tests (root in CI): no `user` switch, every path in `dir`.
        let user = if is_root() { "user root;" } else { "" };
        let conf = format!(
            "{user}
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location = {READY} {{
            return 200 \"{token}\";
        }}
        location / {{
            proxy_pass http://{upstream};
            {proxy_config}
        }}
    }}
}}
"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx starts");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut ours = Nginx { addr, child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ready_answer(addr).is_some_and(|a| a.ends_with(&token)) {
                return Some(ours);
            }
            if ours.child.try_wait().ok().flatten().is_some() {
                return None; // dropping `ours` removes its directory
            }
            assert!(Instant::now() < deadline, "nginx on {addr} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The path only our nginx answers, with its token.
const READY: &str = "/al-nginx-ready";

/// The body of `GET READY` on `addr`, if something there answers.
fn ready_answer(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(s, "GET {READY} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    Some(answer.trim_end().to_owned())
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
