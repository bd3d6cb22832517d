//! `cargo xtask bench [--quick]`: the performance table of DESIGN.md ("Performance targets").
//!
//! Every benchmark speaks the real protocol: client threads (`rpc_core::protocol::Client`) over a real
//! mailbox in host memory, served by a real `RpcServer` worker. The machine this runs on is
//! shared and noisy, so every latency target is a ratio against a reference measured in the
//! same run, and the latency rows are measured in interleaved rounds (one repetition of each row
//! per round) so that a burst of background load hits every row alike.
//!
//! Rows (`docs/performance.md` explains each):
//! - `pingpong`: two threads bounce two `u32` flags on separate cache lines: the floor of one
//!   round trip between two cores on this machine;
//! - `roundtrip`: TEST_INCREMENT, L=1, N=64, port 0, one client thread;
//! - `scan N=..`: the same with N = 64, 1024 (v1) and 16384 (v2), the client on port N-1;
//! - `lanes`: TEST_INCREMENT with L=32, full and half masks;
//! - `stream`: TEST_STREAM of 1 MiB per lane, L=1 and L=32;
//! - `pipelined`: one client thread drives M = 64 ports at once (and, as the reference, M = 1:
//!   exchanges one after another), sending each exchange's next packet D µs after its reply
//!   arrived (D = 0 and 2 µs, a discrete GPU's round trip over PCIe), for TEST_INCREMENT and a
//!   4-packet printf; exchanges per second;
//! - `idle`: the worker's CPU share with no users and with a silent user guard held;
//! - `wake`: the latency of the first request after 10 ms of silence with a guard held.
//!
//! The last line printed is the machine-readable summary
//! (`roundtrip_ns=.. pingpong_ns=.. roundtrip_ratio=.. scan_ratio=.. stream_mb_s=..
//! idle_cpu_pct=.. wake_us_p50=.. wake_us_p99=..`); the table and the raw numbers go to
//! `target/bench/bench-{quick,full}.json` and `.md`.

use std::fmt::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rpc_core::protocol::{Client, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::{Opcode, RpcServer, ServerConfig, UserGuard};

use crate::flags::Flags;
use crate::project_root;

/// Runs the benchmarks. A debug build of xtask (what `cargo xtask` runs) re-runs itself with
/// `cargo run --release`, so the figures are always those of optimised code.
pub fn run(args: &[String]) -> crate::Result {
    let valued = ["park-us"];
    let flags = Flags::parse_with("bench", args, &valued, &["quick", "pin", "latency-only"])?;
    let quick = flags.switch("quick");
    let latency_only = flags.switch("latency-only");
    if flags.get("park-us").is_some() {
        let us = flags.number("park-us", None, 1, 1_000_000)?;
        PARK_US.store(us, Ordering::Relaxed);
    }
    if flags.switch("pin") {
        PIN.store(true, Ordering::Relaxed);
    }
    if cfg!(debug_assertions) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(project_root())
            .args([
                "run",
                "--release",
                "--quiet",
                "--package",
                "xtask",
                "--",
                "bench",
            ])
            .args(args)
            .status()
            .map_err(|e| format!("bench: cannot run cargo: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("bench: the release run failed ({status})").into())
        };
    }
    let settings = if quick {
        Settings::QUICK
    } else {
        Settings::FULL
    };
    Ok(run_release(settings, latency_only)?)
}

/// How long and how often to measure.
#[derive(Clone, Copy)]
struct Settings {
    name: &'static str,
    /// Interleaved rounds of the latency rows (one repetition of each row per round).
    rounds: usize,
    /// Measured time of one latency repetition (after a warm-up of a quarter of it).
    window: Duration,
    /// Repetitions of each stream row.
    stream_reps: usize,
    /// Length of each idle measurement.
    idle: Duration,
    /// Requests after 10 ms of silence.
    wake_samples: usize,
}

impl Settings {
    const QUICK: Settings = Settings {
        name: "quick",
        rounds: 5,
        window: Duration::from_millis(40),
        stream_reps: 3,
        idle: Duration::from_secs(2),
        wake_samples: 200,
    };
    const FULL: Settings = Settings {
        name: "full",
        rounds: 21,
        window: Duration::from_millis(200),
        stream_reps: 11,
        idle: Duration::from_secs(2),
        wake_samples: 1000,
    };
}

/// Bytes per lane of a stream repetition.
const STREAM_BYTES: usize = 1 << 20;
/// Silence before each wake-up sample.
const SILENCE: Duration = Duration::from_millis(10);

/// One row of the table: a value per repetition.
struct Row {
    name: String,
    unit: &'static str,
    values: Vec<f64>,
}

impl Row {
    fn new(name: impl Into<String>, unit: &'static str) -> Self {
        Row {
            name: name.into(),
            unit,
            values: Vec::new(),
        }
    }
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        v
    }
    fn median(&self) -> f64 {
        percentile(&self.sorted(), 50.0)
    }
    fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }
    fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How the bench's client threads wait: spin, then yield; never sleep. A GPU warp spins; a
/// sleeping client would add its own timer latency to what we measure of the server.
struct SpinThenYield;

impl rpc_core::protocol::Wait for SpinThenYield {
    fn pause(&self, _port: u32, attempt: u32) -> rpc_core::Result<()> {
        spin_then_yield(attempt);
        Ok(())
    }
}

fn spin_then_yield(attempt: u32) {
    if attempt < 64 {
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

/// `--pin`: run client threads on one CPU and server threads (and the ping-pong partner) on
/// another. On a quiet machine this removes the repetitions where the scheduler put both on one
/// CPU; on a busy one it hurts (a pinned thread cannot flee a CPU another process hogs), hence
/// off by default.
static PIN: AtomicBool = AtomicBool::new(false);

/// `--park-us N`: the benchmark servers' `ServerConfig::park` (0: the default), to measure the
/// idle CPU / wake-up latency trade-off.
static PARK_US: AtomicU64 = AtomicU64::new(0);

/// The CPUs the client threads and the server threads run on with `--pin`: the first two this
/// process may use. `None` without `--pin` or where fewer than two CPUs are allowed.
fn cpu_pair() -> Option<(usize, usize)> {
    if !PIN.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: `set` is a plain bit set that sched_getaffinity fills in; the size passed is its size.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    // SAFETY: CPU_ISSET only reads the bit set.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// Pins thread `tid` (0: the calling thread) to `cpu`; best effort (a failure only adds noise).
fn pin(tid: i32, cpu: usize) {
    // SAFETY: `set` is a zeroed bit set with one bit set by CPU_SET; sched_setaffinity reads
    // `size_of::<cpu_set_t>()` bytes of it and changes only the target thread's placement.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Pins the calling (client) thread to the first CPU of the pair.
fn pin_client() {
    if let Some((client, _)) = cpu_pair() {
        pin(0, client);
    }
}

/// Pins the calling thread or a server's worker to the second CPU of the pair.
fn pin_server(tid: i32) {
    if let Some((_, server)) = cpu_pair() {
        pin(tid, server);
    }
}

/// A server with one attached mailbox and the client's lock table.
struct Setup {
    server: RpcServer,
    memory: Arc<MailboxMemory>,
    locks: LockTable,
}

impl Setup {
    fn new(generation: Generation, ports: u32, lanes: u32) -> Result<Self, String> {
        let layout = Layout::new(generation, ports, lanes).map_err(|e| e.to_string())?;
        let server = RpcServer::new(ServerConfig {
            name: format!("bench-{ports}x{lanes}"),
            park: match PARK_US.load(Ordering::Relaxed) {
                0 => ServerConfig::default().park,
                us => Duration::from_micros(us),
            },
            ..ServerConfig::default()
        });
        let memory = Arc::new(MailboxMemory::new(layout));
        server.attach(Box::new(memory.clone()));
        let _ = server.start().map_err(|e| e.to_string())?;
        // The worker records its thread id once it runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        let tid = loop {
            match server.worker_tid() {
                Some(tid) => break tid,
                None if Instant::now() < deadline => thread::sleep(Duration::from_millis(1)),
                None => return Err("the worker did not start".into()),
            }
        };
        pin_server(tid);
        Ok(Setup {
            server,
            memory,
            locks: LockTable::new(ports),
        })
    }

    fn client(&self) -> Client<'_> {
        Client::new(self.memory.view(), self.locks.words())
            .expect("lock table sized for the mailbox")
            .with_wait(&SpinThenYield)
    }
}

/// One TEST_INCREMENT exchange on port `index` with the lanes of `mask`; checks the answer.
fn increment(client: &Client<'_>, index: u32, mask: u64, x: u64) -> Result<(), String> {
    let mut attempt = 0;
    let mut port = loop {
        // None: the server has not closed the port's last exchange yet.
        match client
            .try_open_at(index, Opcode::TEST_INCREMENT, mask)
            .map_err(|e| e.to_string())?
        {
            Some(port) => break port,
            None => spin_then_yield(attempt),
        }
        attempt += 1;
    };
    let mut ok = true;
    port.send_and_recv(
        |lane, p| p.set_word(0, x + u64::from(lane)),
        |lane, p| ok &= p.word(0) == x + u64::from(lane) + 1,
    )
    .map_err(|e| e.to_string())?;
    if ok {
        Ok(())
    } else {
        Err(format!("TEST_INCREMENT on port {index}: wrong answer"))
    }
}

/// One client thread drives `ports` exchanges at once (TEST_INCREMENT, or a printf of four
/// packets: format, sizes, arguments, result), each on its own port, sending each next packet
/// `delay` after the reply to the last one arrived; returns exchanges per second. The client's
/// wait is `Resumable`, so an operation whose buffer is not back yet returns `WouldBlock` and
/// is retried on the next round over the ports (every retried operation starts with a wait:
/// nothing is sent twice).
fn pipelined(
    setup: &Setup,
    ports: u32,
    printf: bool,
    delay: Duration,
    window: Duration,
) -> Result<f64, String> {
    let _user = setup.server.user();
    let client = Client::new(setup.memory.view(), setup.locks.words())
        .map_err(|e| e.to_string())?
        .with_wait(&rpc_core::protocol::Resumable);
    let format: &[u8] = b"%d %d %d\n\0";
    let args = [7u8; 12];
    let op = if printf {
        Opcode::PRINTF_TO_STDOUT
    } else {
        Opcode::TEST_INCREMENT
    };
    // Per port: the open exchange, its next step, and when that step may be sent.
    let mut open: Vec<Option<(rpc_core::protocol::ClientPort<'_>, u8)>> =
        (0..ports).map(|_| None).collect();
    let mut ready = vec![Instant::now(); ports as usize];
    let blocked = |r: rpc_core::Result<()>| match r {
        Ok(()) => Ok(true),
        Err(rpc_core::Error::WouldBlock { .. }) => Ok(false),
        Err(e) => Err(e.to_string()),
    };
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < window {
        let now = Instant::now();
        for k in 0..ports as usize {
            if now < ready[k] {
                continue;
            }
            let Some((port, step)) = &mut open[k] else {
                if let Some(mut port) = client
                    .try_open_at(k as u32, op, 1)
                    .map_err(|e| e.to_string())?
                {
                    if printf {
                        port.send_n(&[format]).map_err(|e| e.to_string())?;
                    } else {
                        port.send(|_, p| p.set_word(0, k as u64))
                            .map_err(|e| e.to_string())?;
                    }
                    open[k] = Some((port, 1));
                }
                continue;
            };
            match *step {
                1 | 3 => {
                    if !blocked(port.recv(|_, _| {}))? {
                        continue;
                    }
                    ready[k] = Instant::now() + delay;
                    if printf && *step == 1 {
                        *step = 2;
                    } else {
                        open[k] = None;
                        done += 1;
                    }
                }
                _ => {
                    if blocked(port.send_n(&[&args]))? {
                        *step = 3;
                    }
                }
            }
        }
    }
    // Let the exchanges still open finish, so the server is idle for the next row.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open.iter().any(Option::is_some) {
        for slot in open.iter_mut() {
            let Some((port, step)) = slot else { continue };
            let finished = match *step {
                2 => {
                    if blocked(port.send_n(&[&args]))? {
                        *step = 3;
                    }
                    false
                }
                1 if printf => {
                    if blocked(port.recv(|_, _| {}))? {
                        *step = 2;
                    }
                    false
                }
                _ => blocked(port.recv(|_, _| {}))?,
            };
            if finished {
                *slot = None;
            }
        }
        if Instant::now() > deadline {
            return Err("pipelined: exchanges did not finish".into());
        }
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Runs `op` in batches for a warm-up and then `window`; returns ns per op.
fn time_per_op(
    window: Duration,
    mut op: impl FnMut(u64) -> Result<(), String>,
) -> Result<f64, String> {
    const BATCH: u64 = 32;
    let mut x = 0;
    let warm_up = Instant::now();
    while warm_up.elapsed() < window / 4 {
        for _ in 0..BATCH {
            op(x)?;
            x += 1;
        }
    }
    let start = Instant::now();
    let mut ops = 0;
    loop {
        for _ in 0..BATCH {
            op(x)?;
            x += 1;
        }
        ops += BATCH;
        let elapsed = start.elapsed();
        if elapsed >= window {
            return Ok(elapsed.as_nanos() as f64 / ops as f64);
        }
    }
}

/// A `u32` alone on its cache line (128 bytes: also clear of the adjacent-line prefetcher).
#[repr(align(128))]
struct Line(AtomicU32);

/// One repetition of the ping-pong reference: ns per round trip.
fn pingpong(window: Duration) -> Result<f64, String> {
    const STOP: u32 = u32::MAX;
    let flags = Arc::new((Line(AtomicU32::new(0)), Line(AtomicU32::new(0))));
    let partner = {
        let flags = flags.clone();
        thread::spawn(move || {
            pin_server(0);
            let (ping, pong) = (&flags.0 .0, &flags.1 .0);
            let mut seen = 0;
            loop {
                let mut attempt = 0;
                let value = loop {
                    let value = ping.load(Ordering::Acquire);
                    if value != seen {
                        break value;
                    }
                    spin_then_yield(attempt);
                    attempt += 1;
                };
                if value == STOP {
                    return;
                }
                seen = value;
                pong.store(value, Ordering::Release);
            }
        })
    };
    let (ping, pong) = (&flags.0 .0, &flags.1 .0);
    let result = time_per_op(window, |x| {
        let value = (x % (STOP as u64 - 1)) as u32 + 1;
        // Never the same value twice in a row, so the partner sees every change.
        let value = if value == ping.load(Ordering::Relaxed) {
            value % (STOP - 1) + 1
        } else {
            value
        };
        ping.store(value, Ordering::Release);
        let mut attempt = 0;
        while pong.load(Ordering::Acquire) != value {
            spin_then_yield(attempt);
            attempt += 1;
        }
        Ok(())
    });
    ping.store(STOP, Ordering::Release);
    partner
        .join()
        .map_err(|_| "pingpong partner panicked".to_string())?;
    result
}

/// One repetition of TEST_INCREMENT round trips on port `index`: ns per round trip.
fn roundtrip(setup: &Setup, index: u32, mask: u64, window: Duration) -> Result<f64, String> {
    let _user = setup.server.user();
    let client = setup.client();
    time_per_op(window, |x| increment(&client, index, mask, x))
}

/// One repetition of TEST_INCREMENT round trips against a bare `rpc_core::protocol::ServerEnd` loop (a
/// thread that only opens pending ports and answers them: no `RpcServer`, registry, statistics
/// or back-off): ns per round trip. The gap to `roundtrip` is the cost of the real server's
/// per-pass and per-request work; the gap to `pingpong` that of the protocol itself.
fn bare_roundtrip(window: Duration) -> Result<f64, String> {
    let layout = Layout::new(Generation::V1, 64, 1).map_err(|e| e.to_string())?;
    let memory = MailboxMemory::new(layout);
    let (client_locks, server_locks) = (LockTable::new(64), LockTable::new(64));
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        scope.spawn(|| {
            pin_server(0);
            let server = rpc_core::protocol::ServerEnd::new(memory.view(), server_locks.words())
                .expect("lock table sized for the mailbox");
            let mut idle = 0;
            while !stop.load(Ordering::Relaxed) {
                match server.open_next(0, &SpinThenYield) {
                    Some(mut port) => {
                        let _ = port.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1));
                        idle = 0;
                    }
                    None => {
                        spin_then_yield(idle);
                        idle += 1;
                    }
                }
            }
        });
        let client = Client::new(memory.view(), client_locks.words())
            .expect("lock table sized for the mailbox")
            .with_wait(&SpinThenYield);
        let result = time_per_op(window, |x| increment(&client, 0, 1, x));
        stop.store(true, Ordering::Relaxed);
        result
    })
}

/// One TEST_STREAM exchange of `STREAM_BYTES` per active lane: MB/s of payload carried (both
/// directions, all lanes).
fn stream(setup: &Setup, mask: u64, data: &[Vec<u8>]) -> Result<f64, String> {
    let _user = setup.server.user();
    let client = setup.client();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let start = Instant::now();
    let mut port = client
        .open(Opcode::TEST_STREAM, mask)
        .map_err(|e| e.to_string())?;
    port.send_n(&slices).map_err(|e| e.to_string())?;
    let back = port
        .recv_n(STREAM_BYTES as u64)
        .map_err(|e| e.to_string())?;
    drop(port);
    let seconds = start.elapsed().as_secs_f64();
    let lanes = mask.count_ones() as usize;
    for lane in 0..lanes {
        if back[lane] != data[lane] {
            return Err(format!("TEST_STREAM: lane {lane} came back different"));
        }
    }
    Ok((2 * lanes * STREAM_BYTES) as f64 / seconds / 1e6)
}

/// The worker's CPU time so far, from the scheduler's per-task statistics.
fn worker_cpu(server: &RpcServer) -> Result<Duration, String> {
    let tid = server.worker_tid().ok_or("the worker is not running")?;
    let path = format!("/proc/self/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| format!("{path}: unexpected contents {text:?}"))?;
    Ok(Duration::from_nanos(ns))
}

/// The worker's CPU share (percent of one core) over `window`.
fn cpu_share(server: &RpcServer, window: Duration) -> Result<f64, String> {
    let (cpu, wall) = (worker_cpu(server)?, Instant::now());
    thread::sleep(window);
    let (cpu, wall) = (worker_cpu(server)? - cpu, wall.elapsed());
    Ok(100.0 * cpu.as_secs_f64() / wall.as_secs_f64())
}

/// Every figure of one run.
struct Report {
    settings: Settings,
    rows: Vec<Row>,
    /// Wake-up latencies in µs, in sample order.
    wake_us: Vec<f64>,
}

impl Report {
    fn row(&self, name: &str) -> &Row {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .expect("every summary row is measured")
    }

    fn summary(&self) -> String {
        let median = |name: &str| self.row(name).median();
        let wake: Vec<f64> = {
            let mut w = self.wake_us.clone();
            w.sort_by(f64::total_cmp);
            w
        };
        format!(
            "roundtrip_ns={:.1} pingpong_ns={:.1} roundtrip_ratio={:.2} scan_ratio={:.2} \
             stream_mb_s={:.0} idle_cpu_pct={:.3} wake_us_p50={:.1} wake_us_p99={:.1}",
            median(ROUNDTRIP),
            median(PINGPONG),
            median(ROUNDTRIP) / median(PINGPONG),
            median(SCAN_16384) / median(SCAN_64),
            median(STREAM_L1),
            median(IDLE_NO_USERS),
            percentile(&wake, 50.0),
            percentile(&wake, 99.0),
        )
    }

    fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| benchmark | unit | median | min | max | samples |\n|---|---|---:|---:|---:|---:|"
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                row.name,
                row.unit,
                fmt(row.median()),
                fmt(row.min()),
                fmt(row.max()),
                row.values.len()
            );
        }
        out
    }

    fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "unit": r.unit,
                    "median": r.median(),
                    "min": r.min(),
                    "max": r.max(),
                    "values": r.values,
                })
            })
            .collect();
        serde_json::json!({
            "mode": self.settings.name,
            "rounds": self.settings.rounds,
            "window_ms": self.settings.window.as_millis() as u64,
            "stream_bytes_per_lane": STREAM_BYTES,
            "rows": rows,
            "wake_us": self.wake_us,
            "summary": self.summary(),
        })
    }
}

/// Three significant figures or so, without exponent.
fn fmt(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else if value >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

const PINGPONG: &str = "pingpong (2 flags, 2 cache lines)";
const ROUNDTRIP: &str = "roundtrip (TEST_INCREMENT, L=1, N=64, port 0)";
const SCAN_64: &str = "scan N=64 (v1, port 63)";
const SCAN_1024: &str = "scan N=1024 (v1, port 1023)";
const SCAN_16384: &str = "scan N=16384 (v2, port 16383)";
const BARE: &str = "roundtrip, bare Server loop (no RpcServer)";
const LANES_FULL: &str = "lanes L=32 full mask";
const LANES_HALF: &str = "lanes L=32 half mask";
const STREAM_L1: &str = "stream 1 MiB, L=1";
const STREAM_L32: &str = "stream 1 MiB/lane, L=32";
const IDLE_NO_USERS: &str = "idle CPU, no users";
/// Ports one client thread drives at once in the pipelined rows.
const PIPELINED_PORTS: u32 = 64;
const IDLE_GUARD: &str = "idle CPU, silent guard held";
const WAKE: &str = "wake after 10 ms silence";

/// Runs every benchmark, or with `latency_only` (a diagnostic for quick A/B comparisons of
/// hot-path changes) only the interleaved latency rows.
fn run_release(settings: Settings, latency_only: bool) -> Result<(), String> {
    let started = Instant::now();
    pin_client();
    eprintln!(
        "bench ({}): {} interleaved rounds of {} ms per latency row ...",
        settings.name,
        settings.rounds,
        settings.window.as_millis()
    );
    let mut rows = Vec::new();

    // Latency rows, interleaved.
    let roundtrip_setup = Setup::new(Generation::V1, 64, 1)?;
    let scans = [
        (SCAN_64, Setup::new(Generation::V1, 64, 1)?),
        (SCAN_1024, Setup::new(Generation::V1, 1024, 1)?),
        (SCAN_16384, Setup::new(Generation::V2, 16384, 1)?),
    ];
    let lanes_setup = Setup::new(Generation::V1, 64, 32)?;
    let mut latency: Vec<Row> = [
        PINGPONG, ROUNDTRIP, SCAN_64, SCAN_1024, SCAN_16384, LANES_FULL, LANES_HALF, BARE,
    ]
    .into_iter()
    .map(|name| Row::new(name, "ns/round trip"))
    .collect();
    for _ in 0..settings.rounds {
        let w = settings.window;
        latency[0].values.push(pingpong(w)?);
        latency[7].values.push(bare_roundtrip(w)?);
        latency[1]
            .values
            .push(roundtrip(&roundtrip_setup, 0, 1, w)?);
        for (k, (_, setup)) in scans.iter().enumerate() {
            let last = setup.memory.layout().ports() - 1;
            latency[2 + k].values.push(roundtrip(setup, last, 1, w)?);
        }
        latency[5]
            .values
            .push(roundtrip(&lanes_setup, 0, u64::from(u32::MAX), w)?);
        latency[6]
            .values
            .push(roundtrip(&lanes_setup, 0, 0xFFFF, w)?);
    }
    rows.extend(latency);
    drop(scans);
    if latency_only {
        for row in &rows {
            println!(
                "{}: median {} min {}",
                row.name,
                fmt(row.median()),
                fmt(row.min())
            );
        }
        let median = |k: usize| rows[k].median();
        println!(
            "roundtrip_ratio={:.2} scan_ratio={:.2}",
            median(1) / median(0),
            median(4) / median(2)
        );
        return Ok(());
    }

    // Streams.
    let stream_setup = Setup::new(Generation::V1, 64, 1)?;
    let data: Vec<Vec<u8>> = (0..32u8)
        .map(|lane| {
            (0..STREAM_BYTES)
                .map(|i| (i as u8).wrapping_mul(31) ^ lane)
                .collect()
        })
        .collect();
    for (name, setup, mask) in [
        (STREAM_L1, &stream_setup, 1),
        (STREAM_L32, &lanes_setup, u64::from(u32::MAX)),
    ] {
        let mut row = Row::new(name, "MB/s");
        stream(setup, mask, &data)?; // warm-up
        for _ in 0..settings.stream_reps {
            row.values.push(stream(setup, mask, &data)?);
        }
        rows.push(row);
    }
    drop((stream_setup, lanes_setup, data));

    // Pipelined exchanges: M ports at once against M = 1, in the same run.
    let pipelined_setup = Setup::new(Generation::V1, PIPELINED_PORTS, 1)?;
    pipelined_setup
        .server
        .context()
        .services()
        .set_stdout(Box::new(std::io::sink()));
    for printf in [false, true] {
        for delay_us in [0u64, 2] {
            for ports in [PIPELINED_PORTS, 1] {
                let what = if printf { "printf" } else { "increment" };
                let mut row = Row::new(
                    format!("pipelined {what} M={ports} D={delay_us}us"),
                    "exchanges/s",
                );
                let delay = Duration::from_micros(delay_us);
                for _ in 0..settings.stream_reps {
                    let per_s = pipelined(&pipelined_setup, ports, printf, delay, settings.window)?;
                    row.values.push(per_s);
                }
                rows.push(row);
            }
        }
    }
    drop(pipelined_setup);

    // Idle and wake-up, on the round-trip server alone (every other worker is gone).
    let server = &roundtrip_setup.server;
    thread::sleep(Duration::from_millis(50)); // let the worker fall asleep
    let mut idle = Row::new(IDLE_NO_USERS, "% of a core");
    idle.values.push(cpu_share(server, settings.idle)?);
    rows.push(idle);
    let wake_us = {
        let user: UserGuard = server.user();
        thread::sleep(Duration::from_millis(50)); // let the back-off reach its slowest polls
        let mut silent = Row::new(IDLE_GUARD, "% of a core");
        silent.values.push(cpu_share(server, settings.idle)?);
        rows.push(silent);
        let client = roundtrip_setup.client();
        let mut samples = Vec::with_capacity(settings.wake_samples);
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        for x in 0..settings.wake_samples as u64 {
            // The request must come at a moment unrelated to the worker's timed parks: a plain
            // sleep ends on a timer interrupt, often the very one that ends the worker's park
            // (the kernel coalesces timers within their slack), which would flatter the
            // figure. So sleep most of the silence, then spin to a pseudo-random instant.
            let quiet = Instant::now();
            thread::sleep(SILENCE - Duration::from_millis(1));
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let until = SILENCE + Duration::from_nanos(seed % 500_000);
            while quiet.elapsed() < until {
                std::hint::spin_loop();
            }
            let start = Instant::now();
            increment(&client, 0, 1, x)?;
            samples.push(start.elapsed().as_nanos() as f64 / 1e3);
        }
        drop(user);
        samples
    };
    let mut wake = Row::new(WAKE, "µs");
    wake.values = wake_us.clone();
    rows.push(wake);

    let report = Report {
        settings,
        rows,
        wake_us,
    };
    let table = report.table();
    println!("{table}");
    let dir = project_root().join("target").join("bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json_path = dir.join(format!("bench-{}.json", settings.name));
    let json = serde_json::to_string_pretty(&report.json()).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, json).map_err(|e| format!("{}: {e}", json_path.display()))?;
    let md_path = dir.join(format!("bench-{}.md", settings.name));
    std::fs::write(&md_path, &table).map_err(|e| format!("{}: {e}", md_path.display()))?;
    eprintln!(
        "bench: {:.1} s; wrote {} and {}",
        started.elapsed().as_secs_f64(),
        json_path.display(),
        md_path.display()
    );
    println!("{}", report.summary());
    Ok(())
}
