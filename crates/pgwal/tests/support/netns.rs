//! Silent peers: a network namespace for the client, joined to this host by
//! veth links that a test can cut.
//!
//! A peer that dies on the same host resets its connections (the kernel
//! answers for the dead process), so it is noticed at once. A peer whose
//! host or network vanishes sends nothing at all: no data, no reset. To
//! make one, the client runs inside a namespace of its own and reaches each
//! server through a veth pair; cutting a link sets the host's end down, so
//! packets from the namespace are dropped without an answer (established
//! connections hang, new ones find no neighbour), while the servers on this
//! host keep running and reach their own addresses as before. Healing sets
//! it up again. (This kernel has no netem or packet filter; a link that is
//! down is the silent network there is.)
//!
//! Needs root and `ip`; everything made is removed on drop, also when the
//! test panics.

use std::process::Command;

/// One link: this host's end of a veth pair and its addresses.
pub struct Link {
    /// The host's interface.
    pub host_if: String,
    /// The host's address on it: servers listen here.
    pub host_addr: String,
    /// The namespace's address (clients connect from here).
    pub ns_addr: String,
}

/// A namespace with links to this host.
pub struct SilentNet {
    pub ns: String,
    pub links: Vec<Link>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl SilentNet {
    /// A namespace named after `tag` and this process, with `links` veth
    /// links numbered 0.. (10.N.i.1 here, 10.N.i.2 there, N from the pid).
    pub fn new(tag: &str, links: usize) -> SilentNet {
        let pid = std::process::id();
        // not "pgwal-...", the lab's prefix: the lab's leak checks and
        // cleanup (running beside these tests in CI) would take it as theirs
        let ns = format!("crates-{tag}-{pid}");
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        ip(&["netns", "add", &ns]);
        let mut net = SilentNet {
            ns: ns.clone(),
            links: Vec::new(),
        };
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // 10.200-249.x: private, and unlikely to be a route of this host
        let second = 200 + pid % 50;
        for i in 0..links {
            // interface names: at most 15 bytes
            let host_if = format!("ct{}h{i}", pid % 100_000);
            let ns_if = format!("ct{}n{i}", pid % 100_000);
            let _ = Command::new("ip").args(["link", "del", &host_if]).output();
            ip(&[
                "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ]);
            let link = Link {
                host_if: host_if.clone(),
                host_addr: format!("10.{second}.{i}.1"),
                ns_addr: format!("10.{second}.{i}.2"),
            };
            net.links.push(link);
            ip(&["link", "set", &ns_if, "netns", &ns]);
            ip(&[
                "addr",
                "add",
                &format!("10.{second}.{i}.1/30"),
                "dev",
                &host_if,
            ]);
            ip(&["link", "set", &host_if, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.{second}.{i}.2/30"),
                "dev",
                &ns_if,
            ]);
            ip(&["-n", &ns, "link", "set", &ns_if, "up"]);
        }
        net
    }

    /// Link `i` stops carrying packets, silently.
    pub fn cut(&self, i: usize) {
        ip(&["link", "set", &self.links[i].host_if, "down"]);
    }

    /// Link `i` carries packets again.
    pub fn heal(&self, i: usize) {
        ip(&["link", "set", &self.links[i].host_if, "up"]);
    }

    /// `program` to run inside the namespace: `ip netns exec NS program`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }
}

impl Drop for SilentNet {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = Command::new("ip")
                .args(["link", "del", &l.host_if])
                .output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}
