//! A real nginx, from the distribution's package, as a reverse proxy on a free loopback port in
//! front of a server of the test's; stopped when dropped. Where nginx is not installed, `start`
//! says the test is skipped and returns `None`; under CI (the `CI` variable set) it fails instead.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let dir = std::env::temp_dir().join(format!("al-nginx-{}-{port}", std::process::id()));
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
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "nginx on {addr} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Nginx { addr, child, dir })
    }
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
