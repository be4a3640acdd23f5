//! Servers run by a test, and hosts as network namespaces: what the tests
//! of members on other hosts stand on.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process, killed when dropped.
pub struct Server(pub Child);

impl Server {
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An NBD server that `cmd` starts on the Unix socket `sock` (a stale
/// socket file removed first), its output silenced, once the socket is
/// there.
pub fn unix_server(mut cmd: Command, sock: &std::path::Path) -> Server {
    let _ = std::fs::remove_file(sock);
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("an NBD server (nbdkit, qemu-nbd)");
    wait_for("the server's socket", 10, || sock.exists());
    Server(child)
}

pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(
            Instant::now() < end,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Hosts as network namespaces on one bridge (in a namespace of its own:
/// nothing is added to the machine's own network). Addresses are from
/// 192.0.2.0/24, the documentation range, which routes nowhere. Dropping
/// it kills the servers and deletes the namespaces.
pub struct Hosts {
    prefix: String,
    hosts: usize,
    servers: Vec<Server>,
}

impl Hosts {
    /// `n` hosts, or None (with a line saying why) where network
    /// namespaces cannot be made (not root).
    pub fn new(n: usize) -> Option<Hosts> {
        let prefix = format!("rc{}", std::process::id() % 100_000);
        let h = Hosts {
            prefix,
            hosts: n,
            servers: Vec::new(),
        };
        if !ip(&["netns", "add", &h.bridge()]) {
            println!("skipped: cannot create network namespaces here (needs root and iproute2)");
            return None;
        }
        let br = h.bridge();
        assert!(ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]));
        assert!(ip(&["-n", &br, "link", "set", "br0", "up"]));
        for i in 0..n {
            let ns = h.ns(i);
            assert!(ip(&["netns", "add", &ns]));
            let (a, b) = (format!("{}h{i}", h.prefix), format!("{}b{i}", h.prefix));
            assert!(ip(&[
                "link", "add", &a, "netns", &ns, "type", "veth", "peer", "name", &b, "netns", &br
            ]));
            assert!(ip(&["-n", &br, "link", "set", &b, "master", "br0", "up"]));
            assert!(ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", h.addr(i)),
                "dev",
                &a
            ]));
            assert!(ip(&["-n", &ns, "link", "set", &a, "up"]));
            assert!(ip(&["-n", &ns, "link", "set", "lo", "up"]));
        }
        Some(h)
    }

    pub fn bridge(&self) -> String {
        format!("{}br", self.prefix)
    }

    pub fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.prefix)
    }

    pub fn addr(&self, i: usize) -> String {
        format!("192.0.2.{}", i + 1)
    }

    /// Runs `cmd` as a server on host `i`.
    pub fn serve(&mut self, i: usize, cmd: &[&str]) {
        let c = Command::new("ip")
            .args(["netns", "exec", &self.ns(i)])
            .args(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.servers.push(Server(c));
    }

    /// Cuts or restores host `i`'s link (at the bridge, as a pulled cable
    /// or a failed switch port would).
    pub fn link(&self, i: usize, up: bool) {
        let port = format!("{}b{i}", self.prefix);
        assert!(ip(&[
            "-n",
            &self.bridge(),
            "link",
            "set",
            &port,
            if up { "up" } else { "down" }
        ]));
    }

    /// Whether host `from` reaches `to`'s port.
    pub fn reaches(&self, from: usize, to: usize, port: u16) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(from), "nbdinfo", "--size"])
            .arg(format!("nbd://{}:{port}/", self.addr(to)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.servers.clear();
        for i in 0..self.hosts {
            ip(&["netns", "del", &self.ns(i)]);
        }
        ip(&["netns", "del", &self.bridge()]);
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
