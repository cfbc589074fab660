//! pgwal-netdelay: a userspace TCP delay proxy for the pgwal lab.
//!
//! The kernel here has no netem, so network latency on the replication path
//! is emulated in user space: every chunk read from one side is held until
//! `arrival + one-way delay (+ jitter) (+ serialisation time at the
//! configured bandwidth)` and then written to the other side.  Release times
//! never decrease within a direction, so byte order is preserved.
//!
//! Arrival times come from the kernel (SO_TIMESTAMPNS), so the time a
//! thread needs to wake up and read does not add to the delay.
//!
//! Timing: each direction is one thread that both reads (and timestamps)
//! chunks and releases them, so no chunk crosses a thread hand-off.  It
//! waits in ppoll() with the thread's timer slack lowered to 1 ns until
//! `spin` microseconds before the next release, then polls the socket
//! without blocking and yields/spins the rest of the way.  That avoids
//! the ~50-80 us overshoot of a plain `nanosleep` and the ~1 ms granularity
//! of coarse timers, at a CPU cost bounded by `spin` per released chunk.
//!
//! Subcommands:
//!   proxy  --listen ADDR --upstream ADDR [--delay-ms F] [--up-delay-ms F]
//!          [--down-delay-ms F] [--jitter-ms F] [--bandwidth-mbit F]
//!          [--spin-us N] [--rt-priority N (SCHED_FIFO, default 0 = off)]
//!          [--stats-file PATH (chunks/bytes per direction, JSON, every 200 ms)]
//!   echo   --listen ADDR                      (test peer: echoes bytes back)
//!   ping   --target ADDR [--count N] [--size B] [--duration-s F]
//!          [--interval-us N]                  (ping-pong RTT, JSON summary)
//!
//! "up" is client -> upstream (standby -> primary), "down" is
//! upstream -> client (primary -> standby).
//!
//! A one-way stall: SIGUSR1 makes the proxy hold everything in the down
//! direction (it still reads and queues it) until SIGUSR2, while the up
//! direction flows as before.  The lab uses it for a link that loses the
//! primary's WAL but still carries the standby's replies.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::raw::{c_int, c_ulong};
use std::os::unix::io::AsRawFd;
use std::process::exit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

extern "C" {
    fn prctl(option: c_int, arg2: c_ulong, arg3: c_ulong, arg4: c_ulong, arg5: c_ulong) -> c_int;
}
const PR_SET_TIMERSLACK: c_int = 29;

#[repr(C)]
struct SchedParam {
    sched_priority: c_int,
}
extern "C" {
    fn sched_setscheduler(pid: c_int, policy: c_int, param: *const SchedParam) -> c_int;
}
const SCHED_FIFO: c_int = 1;

/// Ask for SCHED_FIFO at `prio` (inherited by threads created later), so the
/// emulated wire is not delayed by CPU contention on the host.  Needs root
/// (CAP_SYS_NICE); returns false when refused.
fn set_realtime(prio: i32) -> bool {
    let p = SchedParam {
        sched_priority: prio,
    };
    // SAFETY: p lives across the call; pid 0 = the calling thread.
    unsafe { sched_setscheduler(0, SCHED_FIFO, &p) == 0 }
}

/// Lower this thread's timer slack (inherited by threads it creates).
fn lower_timer_slack() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes plain integers and touches no memory.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
}

/// Set while the down direction is held (SIGUSR1 sets it, SIGUSR2 clears it).
static DOWN_HELD: AtomicBool = AtomicBool::new(false);

extern "C" {
    fn signal(signum: c_int, handler: extern "C" fn(c_int)) -> usize;
}
const SIGUSR1: c_int = 10;
const SIGUSR2: c_int = 12;

extern "C" fn hold_down(_: c_int) {
    DOWN_HELD.store(true, Ordering::SeqCst);
}
extern "C" fn release_down(_: c_int) {
    DOWN_HELD.store(false, Ordering::SeqCst);
}

/// Install the one-way stall's signal handlers.  glibc's signal() restarts
/// interrupted system calls (accept, read); ppoll returns early, which the
/// pumps treat as a wake-up.
fn install_hold_signals() {
    // SAFETY: the handlers only store to an atomic, which is async-signal-safe.
    unsafe {
        signal(SIGUSR1, hold_down);
        signal(SIGUSR2, release_down);
    }
}

/// Whether a pump in direction `up` must hold what it has queued.
fn held(up: bool) -> bool {
    !up && DOWN_HELD.load(Ordering::SeqCst)
}

/// Cumulative chunks and bytes per direction, for --stats-file (a standby's
/// "up" chunks are, near enough, its reply packets).
struct Stats {
    up_chunks: AtomicU64,
    up_bytes: AtomicU64,
    down_chunks: AtomicU64,
    down_bytes: AtomicU64,
}
impl Stats {
    fn add(&self, up: bool, n: usize) {
        let (c, b) = if up {
            (&self.up_chunks, &self.up_bytes)
        } else {
            (&self.down_chunks, &self.down_bytes)
        };
        c.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(n as u64, Ordering::Relaxed);
    }
    fn json(&self) -> String {
        format!(
            "{{\"up_chunks\": {}, \"up_bytes\": {}, \"down_chunks\": {}, \"down_bytes\": {}}}\n",
            self.up_chunks.load(Ordering::Relaxed),
            self.up_bytes.load(Ordering::Relaxed),
            self.down_chunks.load(Ordering::Relaxed),
            self.down_bytes.load(Ordering::Relaxed)
        )
    }
}
static STATS: Stats = Stats {
    up_chunks: AtomicU64::new(0),
    up_bytes: AtomicU64::new(0),
    down_chunks: AtomicU64::new(0),
    down_bytes: AtomicU64::new(0),
};

/// Rewrite `path` with the counters every 200 ms (write + rename: readers never see half a file).
fn stats_writer(path: String) {
    let tmp = format!("{}.tmp", path);
    loop {
        if std::fs::write(&tmp, STATS.json()).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
        thread::sleep(Duration::from_millis(200));
    }
}

#[derive(Clone, Debug)]
struct DirConf {
    dir_up: bool,
    delay: Duration,
    jitter: Duration,
    /// bytes per second, 0 = unlimited
    bytes_per_sec: f64,
}

#[derive(Clone, Debug)]
struct ProxyConf {
    listen: String,
    upstream: String,
    up: DirConf,
    down: DirConf,
    spin: Duration,
}

/// Small xorshift generator: jitter needs no cryptographic quality.
struct Rng(u64);
impl Rng {
    fn new(salt: u64) -> Rng {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng((t ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    fn next_f64(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Wait until `deadline`: sleep until `spin` before it, then yield/spin.
fn wait_until(deadline: Instant, spin: Duration) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let rem = deadline - now;
        if rem > spin {
            thread::sleep(rem - spin);
        } else if rem > Duration::from_micros(5) {
            thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}
#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}
extern "C" {
    fn ppoll(
        fds: *mut PollFd,
        nfds: c_ulong,
        timeout: *const Timespec,
        sigmask: *const u8,
    ) -> c_int;
}
#[repr(C)]
struct IoVec {
    base: *mut u8,
    len: usize,
}
#[repr(C)]
struct MsgHdr {
    name: *mut u8,
    namelen: u32,
    iov: *mut IoVec,
    iovlen: usize,
    control: *mut u8,
    controllen: usize,
    flags: c_int,
}
#[repr(C)]
struct CmsgHdr {
    len: usize,
    level: c_int,
    kind: c_int,
}
extern "C" {
    fn recvmsg(fd: c_int, msg: *mut MsgHdr, flags: c_int) -> isize;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const u8, len: u32) -> c_int;
}
const SOL_SOCKET: c_int = 1;
const SO_TIMESTAMPNS: c_int = 35;
const MSG_DONTWAIT: c_int = 0x40;

/// Ask the kernel to timestamp arriving data (CLOCK_REALTIME, ns).
fn enable_rx_timestamps(fd: c_int) -> bool {
    let one: c_int = 1;
    // SAFETY: passes a pointer to a live c_int and its size.
    unsafe {
        setsockopt(
            fd,
            SOL_SOCKET,
            SO_TIMESTAMPNS,
            &one as *const c_int as *const u8,
            4,
        ) == 0
    }
}

/// Non-blocking read that also returns the kernel's receive timestamp, so
/// the delay counts from when the bytes arrived, not from when this thread
/// woke up to read them.
fn recv_ts(fd: c_int, buf: &mut [u8]) -> std::io::Result<(usize, Option<SystemTime>)> {
    let mut iov = IoVec {
        base: buf.as_mut_ptr(),
        len: buf.len(),
    };
    let mut control = [0u64; 16];
    let mut msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: control.as_mut_ptr() as *mut u8,
        controllen: std::mem::size_of_val(&control),
        flags: 0,
    };
    // SAFETY: msg points at live buffers of the stated sizes.
    let n = unsafe { recvmsg(fd, &mut msg, MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut ts = None;
    let hdr = std::mem::size_of::<CmsgHdr>();
    let mut off = 0usize;
    while off + hdr <= msg.controllen {
        // SAFETY: off + hdr is within `control`; CmsgHdr has no invalid bit patterns.
        let c = unsafe {
            std::ptr::read_unaligned((control.as_ptr() as *const u8).add(off) as *const CmsgHdr)
        };
        if c.len < hdr || off + c.len > msg.controllen {
            break;
        }
        if c.level == SOL_SOCKET && c.kind == SO_TIMESTAMPNS && c.len >= hdr + 16 {
            // SAFETY: the payload of SCM_TIMESTAMPNS is a struct timespec (2 x i64).
            let t = unsafe {
                std::ptr::read_unaligned(
                    (control.as_ptr() as *const u8).add(off + hdr) as *const Timespec
                )
            };
            if t.tv_sec > 0 {
                ts = Some(UNIX_EPOCH + Duration::new(t.tv_sec as u64, t.tv_nsec as u32));
            }
        }
        off += (c.len + 7) & !7;
    }
    Ok((n as usize, ts))
}

const POLLIN: i16 = 0x1;
const POLLOUT: i16 = 0x4;

/// Wait until `fd` has `events` or `timeout` passes (None = forever).
fn poll_fd(fd: c_int, events: i16, timeout: Option<Duration>) {
    let mut p = PollFd {
        fd,
        events,
        revents: 0,
    };
    let ts = timeout.map(|t| Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: t.subsec_nanos() as i64,
    });
    let tp: *const Timespec = match &ts {
        Some(t) => t,
        None => std::ptr::null(),
    };
    // SAFETY: p and ts live across the call; nfds = 1; a null sigmask is allowed.
    unsafe {
        ppoll(&mut p, 1, tp, std::ptr::null());
    }
}

/// write_all on a non-blocking socket.
fn write_all_nb(dst: &mut TcpStream, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        match dst.write(data) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                poll_fd(dst.as_raw_fd(), POLLOUT, Some(Duration::from_millis(100)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One direction in one thread: read from `src`, hold each chunk until its
/// release time, write to `dst`.  The same thread reads and writes, so a
/// chunk crosses no thread hand-off: the thread waits in ppoll() on `src`
/// with a timeout ending `spin` before the next release, then polls
/// without blocking until the release time.
fn pump(
    mut src: TcpStream,
    mut dst: TcpStream,
    conf: DirConf,
    spin: Duration,
    salt: u64,
    label: String,
) {
    let mut rng = Rng::new(salt);
    let mut late = Lateness::new(label);
    let mut buf = vec![0u8; 256 * 1024];
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut last_release = Instant::now();
    let mut link_free = Instant::now();
    let mut eof = false;
    let fd = src.as_raw_fd();
    let use_ts = enable_rx_timestamps(fd);
    loop {
        // release what is due (nothing while this direction is held)
        let mut now = Instant::now();
        while let Some((release, _)) = queue.front() {
            if *release > now || held(conf.dir_up) {
                break;
            }
            let (release, data) = queue.pop_front().unwrap();
            late.record(now.saturating_duration_since(release));
            if write_all_nb(&mut dst, &data).is_err() {
                let _ = src.shutdown(Shutdown::Both);
                let _ = dst.shutdown(Shutdown::Both);
                return;
            }
            now = Instant::now();
        }
        if eof {
            match queue.front() {
                None => {
                    let _ = dst.shutdown(Shutdown::Write);
                    late.report();
                    return;
                }
                Some(_) if held(conf.dir_up) => {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Some((release, _)) => {
                    wait_until(*release, spin);
                    continue;
                }
            }
        }
        // wait for data or for the next release
        match queue.front() {
            None => poll_fd(fd, POLLIN, None),
            // held: look at the flag again within a millisecond
            Some(_) if held(conf.dir_up) => poll_fd(fd, POLLIN, Some(Duration::from_millis(1))),
            Some((release, _)) => {
                let rem = release.saturating_duration_since(now);
                if rem > spin {
                    poll_fd(fd, POLLIN, Some(rem - spin));
                } else if rem > Duration::from_micros(5) {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let got = if use_ts {
            recv_ts(fd, &mut buf)
        } else {
            src.read(&mut buf).map(|n| (n, None))
        };
        match got {
            Ok((0, _)) => eof = true,
            Ok((n, ts)) => {
                // the wall clock first: a preemption between the two
                // readings then makes the arrival look later, never earlier
                // (an early arrival would release before the configured delay)
                let wall = SystemTime::now();
                let mut now = Instant::now();
                if let Some(ts) = ts {
                    // arrival = now - (wall clock now - kernel receive time), bounded
                    if let Ok(age) = wall.duration_since(ts) {
                        if age < Duration::from_secs(1) {
                            now -= age;
                        }
                    }
                }
                STATS.add(conf.dir_up, n);
                // serialisation on a rate-limited link
                let sent = if conf.bytes_per_sec > 0.0 {
                    let start = if link_free > now { link_free } else { now };
                    link_free = start + Duration::from_secs_f64(n as f64 / conf.bytes_per_sec);
                    link_free
                } else {
                    now
                };
                let mut delay = conf.delay;
                if !conf.jitter.is_zero() {
                    let j = conf.jitter.as_secs_f64() * (2.0 * rng.next_f64() - 1.0);
                    delay = Duration::from_secs_f64((delay.as_secs_f64() + j).max(0.0));
                }
                let mut release = sent + delay;
                if release < last_release {
                    release = last_release; // keep byte order
                }
                last_release = release;
                queue.push_back((release, buf[..n].to_vec()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => eof = true,
        }
    }
}

/// Release lateness (actual write time - scheduled release), reported to
/// stderr every 10 s and when a direction closes: the proxy's own precision,
/// independent of the endpoints' scheduling.
struct Lateness {
    label: String,
    us: Vec<u32>,
    since: Instant,
}
impl Lateness {
    fn new(label: String) -> Lateness {
        Lateness {
            label,
            us: Vec::new(),
            since: Instant::now(),
        }
    }
    fn record(&mut self, d: Duration) {
        self.us.push(d.as_micros().min(u32::MAX as u128) as u32);
        if self.since.elapsed() > Duration::from_secs(10) {
            self.report();
        }
    }
    fn report(&mut self) {
        if self.us.is_empty() {
            return;
        }
        self.us.sort_unstable();
        let q = |p: f64| self.us[(((self.us.len() - 1) as f64) * p).round() as usize];
        eprintln!(
            "pgwal-netdelay: lateness {} n={} p50={}us p90={}us p99={}us max={}us",
            self.label,
            self.us.len(),
            q(0.5),
            q(0.9),
            q(0.99),
            self.us[self.us.len() - 1]
        );
        self.us.clear();
        self.since = Instant::now();
    }
}

fn run_proxy(conf: ProxyConf) {
    let listener = TcpListener::bind(&conf.listen).unwrap_or_else(|e| {
        eprintln!("pgwal-netdelay: cannot listen on {}: {}", conf.listen, e);
        exit(1)
    });
    eprintln!(
        "pgwal-netdelay: {} -> {} up={:?} down={:?} jitter={:?}/{:?} bw={}/{} B/s spin={:?}",
        conf.listen,
        conf.upstream,
        conf.up.delay,
        conf.down.delay,
        conf.up.jitter,
        conf.down.jitter,
        conf.up.bytes_per_sec,
        conf.down.bytes_per_sec,
        conf.spin
    );
    let mut n: u64 = 0;
    for incoming in listener.incoming() {
        let client = match incoming {
            Ok(c) => c,
            Err(e) => {
                eprintln!("pgwal-netdelay: accept: {}", e);
                continue;
            }
        };
        n += 1;
        let conf = conf.clone();
        thread::spawn(move || {
            let upstream = match TcpStream::connect(&conf.upstream) {
                Ok(u) => u,
                Err(e) => {
                    eprintln!("pgwal-netdelay: connect {}: {}", conf.upstream, e);
                    let _ = client.shutdown(Shutdown::Both);
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            if client.set_nonblocking(true).is_err() || upstream.set_nonblocking(true).is_err() {
                return;
            }
            let (c2, u2) = match (client.try_clone(), upstream.try_clone()) {
                (Ok(c), Ok(u)) => (c, u),
                _ => return,
            };
            let up = conf.up.clone();
            let spin = conf.spin;
            let t_up = thread::spawn(move || {
                pump(client, upstream, up, spin, 2 * n, format!("conn{} up", n))
            });
            pump(
                u2,
                c2,
                conf.down.clone(),
                conf.spin,
                2 * n + 1,
                format!("conn{} down", n),
            );
            let _ = t_up.join();
        });
    }
}

fn run_echo(listen: &str) {
    let listener = TcpListener::bind(listen).unwrap_or_else(|e| {
        eprintln!("pgwal-netdelay echo: cannot listen on {}: {}", listen, e);
        exit(1)
    });
    for s in listener.incoming().flatten() {
        thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let mut s = s;
            let mut buf = vec![0u8; 65536];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

fn run_ping(target: &str, count: u64, size: usize, duration: Duration, interval: Duration) {
    let mut s = TcpStream::connect(target).unwrap_or_else(|e| {
        eprintln!("pgwal-netdelay ping: connect {}: {}", target, e);
        exit(1)
    });
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let payload = vec![0x5au8; size.max(1)];
    let mut back = vec![0u8; size.max(1)];
    let mut rtts: Vec<f64> = Vec::new();
    let start = Instant::now();
    for _ in 0..count {
        if start.elapsed() > duration {
            break;
        }
        let t0 = Instant::now();
        if s.write_all(&payload).is_err() || s.read_exact(&mut back).is_err() {
            eprintln!("pgwal-netdelay ping: connection failed");
            exit(1);
        }
        rtts.push(t0.elapsed().as_secs_f64() * 1e6);
        if !interval.is_zero() {
            thread::sleep(interval);
        }
    }
    if rtts.is_empty() {
        eprintln!("pgwal-netdelay ping: no samples");
        exit(1);
    }
    let mean = rtts.iter().sum::<f64>() / rtts.len() as f64;
    rtts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| rtts[(((rtts.len() - 1) as f64) * p).round() as usize];
    println!(
        "{{\"count\": {}, \"size\": {}, \"mean_us\": {:.1}, \"min_us\": {:.1}, \"p50_us\": {:.1}, \"p90_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}}}",
        rtts.len(),
        size,
        mean,
        rtts[0],
        q(0.5),
        q(0.9),
        q(0.99),
        rtts[rtts.len() - 1]
    );
}

fn usage() -> ! {
    eprintln!(
        "usage:\n  pgwal-netdelay proxy --listen ADDR --upstream ADDR [--delay-ms F] [--up-delay-ms F] \
         [--down-delay-ms F] [--jitter-ms F] [--bandwidth-mbit F] [--spin-us N] [--rt-priority N] [--stats-file PATH]\n  \
         pgwal-netdelay echo --listen ADDR\n  \
         pgwal-netdelay ping --target ADDR [--count N] [--size B] [--duration-s F] [--interval-us N]"
    );
    exit(2)
}

fn parse_opts(args: &[String]) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some(name) = a.strip_prefix("--") {
            if let Some((k, v)) = name.split_once('=') {
                m.insert(k.to_string(), v.to_string());
            } else if i + 1 < args.len() {
                m.insert(name.to_string(), args[i + 1].clone());
                i += 1;
            } else {
                usage();
            }
        } else {
            usage();
        }
        i += 1;
    }
    m
}

fn num(m: &HashMap<String, String>, k: &str, dflt: f64) -> f64 {
    match m.get(k) {
        None => dflt,
        Some(v) => v.parse::<f64>().unwrap_or_else(|_| {
            eprintln!("pgwal-netdelay: --{} wants a number, got {:?}", k, v);
            exit(2)
        }),
    }
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1000.0)
}

fn main() {
    lower_timer_slack();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        usage();
    }
    let m = parse_opts(&args[1..]);
    match args[0].as_str() {
        "proxy" => {
            let listen = m.get("listen").cloned().unwrap_or_else(|| usage());
            let upstream = m.get("upstream").cloned().unwrap_or_else(|| usage());
            let delay = num(&m, "delay-ms", 0.0);
            let jitter = ms(num(&m, "jitter-ms", 0.0));
            let bw = num(&m, "bandwidth-mbit", 0.0) * 1e6 / 8.0;
            let rt = num(&m, "rt-priority", 0.0) as i32;
            if rt > 0 && !set_realtime(rt) {
                eprintln!("pgwal-netdelay: SCHED_FIFO refused, running with normal priority");
            }
            let conf = ProxyConf {
                listen,
                upstream,
                up: DirConf {
                    dir_up: true,
                    delay: ms(num(&m, "up-delay-ms", delay)),
                    jitter,
                    bytes_per_sec: bw,
                },
                down: DirConf {
                    dir_up: false,
                    delay: ms(num(&m, "down-delay-ms", delay)),
                    jitter,
                    bytes_per_sec: bw,
                },
                spin: Duration::from_micros(num(&m, "spin-us", 60.0) as u64),
            };
            install_hold_signals();
            if let Some(path) = m.get("stats-file").cloned() {
                thread::spawn(move || stats_writer(path));
            }
            run_proxy(conf);
        }
        "echo" => run_echo(&m.get("listen").cloned().unwrap_or_else(|| usage())),
        "ping" => run_ping(
            &m.get("target").cloned().unwrap_or_else(|| usage()),
            num(&m, "count", 1000.0) as u64,
            num(&m, "size", 64.0) as usize,
            Duration::from_secs_f64(num(&m, "duration-s", 30.0)),
            Duration::from_micros(num(&m, "interval-us", 0.0) as u64),
        ),
        _ => usage(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_never_early_nor_coarse() {
        lower_timer_slack();
        let mut late = Vec::new();
        for _ in 0..50 {
            let d = Instant::now() + Duration::from_micros(500);
            wait_until(d, Duration::from_micros(60));
            let now = Instant::now();
            assert!(now >= d, "woke early");
            late.push(now - d);
        }
        late.sort();
        // Precision is measured by `pgwal-lab proxy-test`, not asserted here:
        // on two cores busy compiling, the median was seen at 2.7 ms.  This
        // bound only catches a wait that sleeps in coarse steps.
        assert!(
            late[late.len() / 2] < Duration::from_millis(50),
            "median lateness {:?}",
            late[late.len() / 2]
        );
    }

    #[test]
    fn stats_count_per_direction() {
        STATS.add(true, 10);
        STATS.add(false, 5);
        let j = STATS.json();
        assert!(j.contains("\"up_chunks\": ") && j.contains("\"down_bytes\": "));
    }

    /// A connected pair of non-blocking-ready sockets on loopback.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Pump `dir_up` from one pair to another; returns (writer into the
    /// pump, reader of what it releases).
    fn pumped(dir_up: bool) -> (TcpStream, TcpStream) {
        let (feed, src) = pair();
        let (dst, out) = pair();
        src.set_nonblocking(true).unwrap();
        dst.set_nonblocking(true).unwrap();
        let conf = DirConf {
            dir_up,
            delay: Duration::from_micros(100),
            jitter: Duration::ZERO,
            bytes_per_sec: 0.0,
        };
        thread::spawn(move || pump(src, dst, conf, Duration::from_micros(60), 1, "test".into()));
        out.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        (feed, out)
    }

    extern "C" {
        fn raise(sig: c_int) -> c_int;
    }

    #[test]
    fn sigusr1_holds_the_down_direction_only_until_sigusr2() {
        install_hold_signals();
        let (mut down_in, mut down_out) = pumped(false);
        let (mut up_in, mut up_out) = pumped(true);
        let mut buf = [0u8; 16];
        // SAFETY: raise() with a signal whose handler is installed above.
        unsafe { raise(SIGUSR1) };
        down_in.write_all(b"wal").unwrap();
        up_in.write_all(b"reply").unwrap();
        up_out.read_exact(&mut buf[..5]).unwrap();
        assert_eq!(
            &buf[..5],
            b"reply",
            "the up direction flows while down is held"
        );
        let e = down_out.read(&mut buf).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the held direction released something: {e}"
        );
        // SAFETY: as above.
        unsafe { raise(SIGUSR2) };
        down_out.read_exact(&mut buf[..3]).unwrap();
        assert_eq!(
            &buf[..3],
            b"wal",
            "released in order once SIGUSR2 clears the hold"
        );
    }

    #[test]
    fn rng_in_unit_interval() {
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
