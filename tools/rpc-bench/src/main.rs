//! `rpc-bench`: the performance table of `cargo xtask bench` (docs/performance.md), rpc-core's
//! server against LLVM's own in the same run.
//!
//! Every row speaks the real protocol: `rpc_core::Client` threads over a real mailbox, served
//! by one of three servers ([`target::Server`]): an `RpcServer` in this process, `rpc-serve` in
//! another process, or LLVM's server (`llvm-peer`, built by `cargo xtask bench --peer llvm`) in
//! another process, both of those over a memfd mailbox this process maps. The cross-process
//! rows run the same client code against rpc-serve and against LLVM, so their ratio is the
//! servers' alone. The machine is shared and noisy, so every target is a ratio of medians
//! measured in the same run, and the latency rows are measured in interleaved rounds (one
//! repetition of every row, every server, per round), in two regimes: quiet, and loaded (a
//! thread keeps one CPU busy).
//!
//! Rows (`docs/performance.md` explains what bounds each):
//! - `pingpong`: two threads bounce two `u32` flags on separate cache lines: the floor;
//! - `bare loop`: TEST_INCREMENT against a thread running only `rpc_core::Server`, on the
//!   N=64 mailbox every server shares (all of them stopped or asleep);
//! - `roundtrip N=.. port ..`: TEST_INCREMENT, L=1, on port 0 and on port N-1, for N = 64,
//!   1024, 4096 (v1) and 16384 (v2); and against the floor, a loop that only flips the
//!   measured port's flag with raw atomics on the same mailbox, the least a server can do: in
//!   a process of its own ([`Server::Floor`], this binary's hidden `floor-serve`), the bound
//!   of rpc-serve's and LLVM's rows, and on a thread of the bench ([`Server::ThreadFloor`]),
//!   the in-process server's;
//! - `lanes L=32 full / half`: TEST_INCREMENT with 32 or 16 active lanes;
//! - `typed add` / `typed sum 4 KiB`, N=16384 (v2): typed calls as LLVM 23's `rpc::dispatch`
//!   makes them (`--dispatch-tests`' `add`, and `sum` of a 4 KiB span), against LLVM's own
//!   `rpc::invoke` in its peer;
//! - `stream 1 MiB L=1 / L=32`: TEST_STREAM, MB/s of payload both ways;
//! - `printf L=32`: lines per second of a 3-argument format with one `%s`;
//! - `pipelined increment / printf / stream M=.. D=..`: one client thread drives M exchanges at
//!   once, sending each next packet D after the reply it answers; exchanges per second;
//! - `idle CPU`: the server's CPU share with no client or kernel, and with a silent kernel;
//! - `wake after S`: the latency of the first request after S = 100 µs, 1 ms, 10 ms of silence;
//! - the last two also for an in-process v2 mailbox whose client rings a doorbell (`, v2
//!   doorbell`), on which the worker sleeps instead of parking.
//!
//! Written to `OUT/bench-{quick,full}.{json,md,svg}`; the last line printed is the summary.
//! `--requests-only N K` is no row: the client of an instruction count of a server
//! under callgrind (docs/performance.md).

mod measure;
mod svg;
mod target;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rpc_core::protocol::{Generation, Layout};

use measure::Hog;
use target::{Binaries, Server, Setup};

/// The command line. `xtask/src/bench.rs` passes `--rpc-serve`, `--out`, `--peer-v1`/`-v2`
/// and, from its own command line, `--quick`, `--float`, `--latency-only` and `--park-us`
/// (which it checks against the same range first).
#[derive(clap::Parser, Debug)]
#[command(
    name = "rpc-bench",
    about = "The performance table of `cargo xtask bench`: rpc-core's server in process, \
             rpc-serve and LLVM's server across processes (docs/performance.md)"
)]
struct Cli {
    /// Short windows and few rounds (about a minute) instead of the full run.
    #[arg(long)]
    quick: bool,
    /// Leave thread placement to the scheduler instead of pinning clients and servers to
    /// two CPUs.
    #[arg(long)]
    float: bool,
    /// Only the round trips, quiet and loaded.
    #[arg(long, group = "part")]
    latency_only: bool,
    /// Only the stream row of LANES lanes (to profile a server on it).
    #[arg(long, group = "part", value_name = "LANES", value_parser = ["1", "32"])]
    stream_only: Option<String>,
    /// Only the printf lines rows.
    #[arg(long, group = "part")]
    printf_only: bool,
    /// Only the pipelined rows, or those of one kind of exchange.
    #[arg(long, group = "part", value_name = "KIND", num_args = 0..=1,
          value_parser = clap::builder::PossibleValuesParser::new(
              measure::Pipelined::ALL.map(measure::Pipelined::name)))]
    pipelined_only: Option<Option<String>>,
    /// Only the idle CPU and wake-up rows.
    #[arg(long, group = "part")]
    idle_only: bool,
    /// No rows: only K TEST_INCREMENT round trips, one lane, on port N-1 of a fresh mailbox of
    /// N ports (a shape of the round-trip rows), against each server process given, one after
    /// the other; then exit. The client of an instruction count of a server under callgrind
    /// (docs/performance.md), whose requests cost it nothing but the round trips.
    #[arg(long, group = "part", num_args = 2, value_names = ["N", "K"])]
    requests_only: Option<Vec<u32>>,
    /// Busy threads in the loaded regime: the first alone on one CPU, each further one
    /// alternately beside the client and servers and on that CPU (more busy threads than
    /// CPUs: an oversubscribed node)
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=16))]
    hogs: u64,
    /// The servers' park in microseconds (ServerConfig::park), instead of its default.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(PARK_US_RANGE))]
    park_us: Option<u64>,
    /// rpc-serve's binary: measure it across processes.
    #[arg(long, value_name = "PATH")]
    rpc_serve: Option<PathBuf>,
    /// LLVM's v1 server (llvm-peer-22): measure it across processes.
    #[arg(long, value_name = "PATH")]
    peer_v1: Option<PathBuf>,
    /// LLVM's v2 server (llvm-peer-23): measure it across processes.
    #[arg(long, value_name = "PATH")]
    peer_v2: Option<PathBuf>,
    /// Where bench-{quick,full}.{json,md,svg} go.
    #[arg(long, value_name = "DIR", default_value = "target/bench")]
    out: PathBuf,
}

/// `--park-us`'s range, as `cargo xtask bench` checks it.
const PARK_US_RANGE: std::ops::RangeInclusive<u64> = 1..=1_000_000;

/// The hidden first argument that makes this binary the floor's process ([`FloorServe`]).
pub(crate) const FLOOR_SERVE: &str = "floor-serve";

/// `rpc-bench floor-serve ...`: the floor of the cross-process rows, a process of its own that
/// the bench starts from its own binary ([`Setup::floor`]) as it starts the server processes.
/// It maps the mailbox file, prints `ready FILE BYTES`, and answers port `--port` with
/// `measure::floor_loop` until a signal ends it (or the bench does: it dies with it).
#[derive(clap::Parser, Debug)]
#[command(name = "rpc-bench floor-serve")]
struct FloorServe {
    /// The mailbox file (a server process's).
    #[arg(long, value_name = "PATH")]
    file: PathBuf,
    /// Its layout's generation (v1 or v2).
    #[arg(long = "gen", value_name = "GEN", value_parser = ["v1", "v2"])]
    generation: String,
    /// Its ports.
    #[arg(long, value_name = "N")]
    ports: u32,
    /// Its lanes.
    #[arg(long, value_name = "L")]
    lanes: u32,
    /// The port to answer.
    #[arg(long, value_name = "P")]
    port: u32,
}

impl FloorServe {
    /// Answers until the process ends; returns only why it cannot.
    fn run(self) -> String {
        let generation = self.generation.parse().expect("one of the possible values");
        let layout = match Layout::new(generation, self.ports, self.lanes) {
            Ok(layout) if self.port < self.ports => layout,
            Ok(_) => return format!("port {} of {}", self.port, self.ports),
            Err(e) => return e.to_string(),
        };
        let mailbox = match target::Mapping::new(&self.file, layout.total_size()) {
            Ok(mailbox) => mailbox,
            Err(e) => return e,
        };
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process: killed when the
        // thread that started it (the bench's main thread) ends, even stopped, so that a
        // killed bench leaves no floor behind.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let ready = format!("ready {} {}", self.file.display(), layout.total_size());
        if let Err(e) = writeln!(std::io::stdout(), "{ready}") {
            return format!("the ready line: {e}");
        }
        measure::floor_loop(&mailbox, layout, self.port, &AtomicBool::new(false));
        unreachable!("the floor's loop has no stop but the signal that ends the process")
    }
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|first| first == FLOOR_SERVE)
    {
        let args = <FloorServe as clap::Parser>::parse_from(std::env::args_os().skip(1));
        eprintln!("rpc-bench {FLOOR_SERVE}: {}", args.run());
        return ExitCode::FAILURE;
    }
    // `--help` prints and exits 0; a refused command line prints why and the usage, exit 2.
    let cli = <Cli as clap::Parser>::parse();
    PIN.store(!cli.float, Ordering::Relaxed);
    PARK_US.store(cli.park_us.unwrap_or(0), Ordering::Relaxed);
    HOGS.store(cli.hogs, Ordering::Relaxed);
    let (settings, part, binaries, out) = parse(cli);
    match run(settings, part, &binaries, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("rpc-bench: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Which rows a run measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    All,
    /// `--latency-only`: the round trips, quiet and loaded.
    Latency,
    /// `--stream-only L`: the stream row of L lanes alone (to profile a server on it, e.g.
    /// under `valgrind --tool=callgrind`, docs/performance.md).
    Stream(u32),
    /// `--printf-only`: the printf lines rows alone (to profile a server on them).
    Printf,
    /// `--pipelined-only [KIND]`: the pipelined rows alone, or those of one kind of exchange
    /// (`increment`, `printf` or `stream`), to profile or compare servers on them.
    Pipelined(Option<measure::Pipelined>),
    /// `--idle-only`: the idle CPU and wake-up rows alone.
    Idle,
    /// `--requests-only N K`: K round trips on port N-1 of N ports per server process, no rows.
    Requests {
        ports: u32,
        count: u32,
    },
}

/// What the command line asks for, but for the flags `main` keeps in statics (`--float`,
/// `--park-us`).
fn parse(cli: Cli) -> (Settings, Part, Binaries, PathBuf) {
    let pipelined = |name: &str| {
        measure::Pipelined::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
    };
    let part = if cli.latency_only {
        Part::Latency
    } else if let Some(lanes) = cli.stream_only {
        Part::Stream(if lanes == "1" { 1 } else { 32 })
    } else if cli.printf_only {
        Part::Printf
    } else if let Some(kind) = cli.pipelined_only {
        Part::Pipelined(kind.as_deref().and_then(pipelined))
    } else if cli.idle_only {
        Part::Idle
    } else if let Some([ports, count]) = cli.requests_only.as_deref() {
        Part::Requests {
            ports: *ports,
            count: *count,
        }
    } else {
        Part::All
    };
    let settings = if cli.quick {
        Settings::QUICK
    } else {
        Settings::FULL
    };
    let binaries = Binaries {
        rpc_serve: cli.rpc_serve,
        peer_v1: cli.peer_v1,
        peer_v2: cli.peer_v2,
    };
    (settings, part, binaries, cli.out)
}

/// How long and how often to measure.
#[derive(Clone, Copy)]
struct Settings {
    name: &'static str,
    /// Interleaved rounds of the latency rows (one repetition of each row per round).
    rounds: usize,
    /// Measured time of one repetition (after a warm-up of a quarter of it).
    window: Duration,
    /// Repetitions of each throughput row.
    reps: usize,
    /// Length of each idle measurement.
    idle: Duration,
    /// Requests after each length of silence.
    wake_samples: usize,
}

impl Settings {
    const QUICK: Settings = Settings {
        name: "quick",
        rounds: 5,
        window: Duration::from_millis(20),
        reps: 3,
        idle: Duration::from_millis(1000),
        wake_samples: 100,
    };
    const FULL: Settings = Settings {
        name: "full",
        rounds: 15,
        window: Duration::from_millis(100),
        reps: 9,
        idle: Duration::from_secs(2),
        wake_samples: 400,
    };
}

/// Bytes per lane of a stream repetition.
pub(crate) const STREAM_BYTES: usize = 1 << 20;
/// The silences before the wake-up samples.
const SILENCES: [(Duration, &str); 3] = [
    (Duration::from_micros(100), "100 µs"),
    (Duration::from_millis(1), "1 ms"),
    (Duration::from_millis(10), "10 ms"),
];
/// The mailboxes of the round-trip rows: generation and ports (L=1).
const SHAPES: [(Generation, u32); 4] = [
    (Generation::V1, 64),
    (Generation::V1, 1024),
    (Generation::V1, 4096),
    (Generation::V2, 16384),
];
/// Ports one client thread drives at once in the pipelined rows.
const PIPELINED_PORTS: u32 = 64;

/// One row of the table: a value per repetition.
struct Row {
    what: String,
    server: Server,
    loaded: bool,
    unit: &'static str,
    values: Vec<f64>,
}

impl Row {
    fn new(what: impl Into<String>, server: Server, loaded: bool, unit: &'static str) -> Self {
        Row {
            what: what.into(),
            server,
            loaded,
            unit,
            values: Vec::new(),
        }
    }
    fn regime(&self) -> &'static str {
        if self.loaded {
            "loaded"
        } else {
            "quiet"
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
pub(crate) struct SpinThenYield;

impl rpc_core::protocol::Wait for SpinThenYield {
    fn pause(&self, _port: u32, attempt: u32) -> Result<(), rpc_core::ProtocolError> {
        spin_then_yield(attempt);
        Ok(())
    }
}

pub(crate) fn spin_then_yield(attempt: u32) {
    if attempt < 64 {
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

/// Client threads on one CPU and server threads (and the ping-pong partner) on another, in the
/// quiet regime, unless `--float`: what the quiet regime means (each side has a CPU), made
/// sure rather than left to the scheduler, which now and then placed both sides so that every
/// hand-over took twice as long for a stretch of repetitions (the stream rows were bimodal,
/// 90 or 190 MB/s for every server, docs/performance.md). `--float` leaves placement to the
/// scheduler: on a machine other programs keep busy, a pinned thread cannot flee their CPU.
static PIN: AtomicBool = AtomicBool::new(true);

/// `--park-us N`: the benchmark servers' `ServerConfig::park` (0: the default), to measure the
/// idle CPU / wake-up latency trade-off.
pub(crate) static PARK_US: AtomicU64 = AtomicU64::new(0);

/// `--hogs N`: the busy threads of the loaded regime (see [`Loaded`]).
static HOGS: AtomicU64 = AtomicU64::new(1);

/// Set while the loaded regime runs (see [`Loaded`]): threads a row spawns as its server run
/// on the client's CPU.
static LOADED: AtomicBool = AtomicBool::new(false);

/// The CPUs this process may use, as it started: read once, in `run`, before any thread is
/// pinned (read after that, the calling thread's set could be one CPU).
fn allowed_cpus() -> Option<libc::cpu_set_t> {
    static SET: std::sync::OnceLock<Option<libc::cpu_set_t>> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        // SAFETY: `set` is a plain bit set that sched_getaffinity fills in; the size passed is
        // its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
                .then_some(set)
        }
    })
}

/// The first two CPUs of [`allowed_cpus`], where there are two.
fn two_cpus() -> Option<(usize, usize)> {
    let set = allowed_cpus()?;
    // SAFETY: CPU_ISSET only reads the bit set.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// The CPUs the client threads and the server threads run on: [`two_cpus`]; `None` with
/// `--float`.
fn cpu_pair() -> Option<(usize, usize)> {
    PIN.load(Ordering::Relaxed).then(two_cpus).flatten()
}

/// Where the quiet regime runs the threads, as the report says it.
fn placement() -> String {
    match cpu_pair() {
        Some((client, server)) => format!("client on CPU {client}, servers on CPU {server}"),
        None => "threads placed by the scheduler".into(),
    }
}

/// The bit set of one CPU.
fn one_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed `cpu_set_t` is an empty bit set; CPU_SET sets one bit of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// Pins thread `tid` (0: the calling thread) to `cpu`; best effort (a failure only adds noise).
fn pin(tid: i32, cpu: usize) {
    place(tid, &one_cpu(cpu));
}

/// Lets thread `tid` (0: the calling thread) run on `set`; best effort.
fn place(tid: i32, set: &libc::cpu_set_t) {
    // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of `set` and changes only
    // the target thread's placement.
    unsafe {
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set);
    }
}

/// Puts thread `tid` back where the quiet regime runs it: the client's or the servers' CPU
/// unless `--float`, else any CPU the process may use.
fn unplace(tid: i32, client: bool) {
    match cpu_pair() {
        Some((a, b)) => pin(tid, if client { a } else { b }),
        None => {
            if let Some(set) = allowed_cpus() {
                place(tid, &set);
            }
        }
    }
}

/// The loaded regime, while alive: a thread that keeps one CPU busy ([`Hog`]), pinned to one
/// CPU, and the client (the calling thread) and every thread of every server pinned to the
/// other, so that the client and the server share a CPU and every hand-over goes through the
/// scheduler, in every round alike. (A hog left to float shared a CPU now with the client, now
/// with the server, and the loaded rows were bimodal.) With `--hogs N` the further busy
/// threads go alternately to the shared CPU and the hog's: more busy threads than CPUs, as on a
/// node whose other processes busy-poll. Where fewer than two CPUs are allowed, the hogs
/// alone.
struct Loaded {
    _hogs: Vec<Hog>,
    /// The server threads it pinned.
    threads: Vec<i32>,
}

impl Loaded {
    fn start<'s>(setups: impl IntoIterator<Item = &'s Setup>) -> Self {
        let hogs = HOGS.load(Ordering::Relaxed);
        let Some((shared, hogged)) = two_cpus() else {
            return Loaded {
                _hogs: (0..hogs).map(|_| Hog::start(None)).collect(),
                threads: Vec::new(),
            };
        };
        LOADED.store(true, Ordering::Relaxed);
        let hogs = (0..hogs)
            .map(|k| Hog::start(Some(if k % 2 == 0 { hogged } else { shared })))
            .collect();
        pin(0, shared);
        let threads: Vec<i32> = setups.into_iter().flat_map(Setup::threads).collect();
        for &tid in &threads {
            pin(tid, shared);
        }
        Loaded {
            _hogs: hogs,
            threads,
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        LOADED.store(false, Ordering::Relaxed);
        unplace(0, true);
        for &tid in &self.threads {
            unplace(tid, false);
        }
    }
}

/// Unless `--float`, makes `command`'s process (all its threads) run on the servers' CPU: set in
/// the child before it executes the server, since a child inherits the client's CPU.
pub(crate) fn pin_server_process(command: &mut std::process::Command) {
    let Some((_, cpu)) = cpu_pair() else {
        return;
    };
    let set = one_cpu(cpu);
    // SAFETY: the closure runs in the child between fork and exec; it only makes the
    // sched_setaffinity system call (async-signal-safe) on a bit set built before the fork,
    // and allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
}

/// Pins the calling (client) thread to the first CPU of the pair.
fn pin_client() {
    if let Some((client, _)) = cpu_pair() {
        pin(0, client);
    }
}

/// Pins the calling thread or a server's worker to the second CPU of the pair; in the loaded
/// regime, to the client's CPU.
pub(crate) fn pin_server(tid: i32) {
    if LOADED.load(Ordering::Relaxed) {
        if let Some((shared, _)) = two_cpus() {
            pin(tid, shared);
        }
    } else if let Some((_, server)) = cpu_pair() {
        pin(tid, server);
    }
}

/// Every figure of one run.
struct Report {
    settings: Settings,
    rows: Vec<Row>,
}

impl Report {
    fn find(&self, what: &str, server: Server, loaded: bool) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.what == what && r.server == server && r.loaded == loaded)
    }

    fn median(&self, what: &str, server: Server, loaded: bool) -> f64 {
        self.find(what, server, loaded)
            .map_or(f64::NAN, Row::median)
    }

    /// `server`'s median over `other`'s (rpc-serve over LLVM's server or the floor, the
    /// in-process server over the thread floor), for the same row and regime.
    fn over(&self, server: Server, other: Server, what: &str, loaded: bool) -> f64 {
        self.median(what, server, loaded) / self.median(what, other, loaded)
    }

    /// rpc-serve's median over LLVM's, for the same row and regime.
    fn vs_llvm(&self, what: &str, loaded: bool) -> f64 {
        self.over(Server::RpcServe, Server::Llvm, what, loaded)
    }

    /// The summary line: `name=value` for each figure the run measured; a figure it did not
    /// (no LLVM peer, a part of the run left out) is absent, not NaN.
    fn summary(&self) -> String {
        let ip = |what: &str| self.median(what, Server::InProcess, false);
        let xp = |what: &str, loaded| self.median(what, Server::RpcServe, loaded);
        let last = |ports: u32| format!("roundtrip N={ports} port {}", ports - 1);
        let wake = self
            .find(&wake_row(SILENCES[2].1, ""), Server::InProcess, false)
            .map(Row::sorted)
            .unwrap_or_default();
        // Per shape and regime, on port N-1: rpc-serve over LLVM's server and over the floor
        // (the process), the in-process server over the thread floor.
        let versus = SHAPES.iter().flat_map(|&(_, n)| {
            [false, true].into_iter().flat_map(move |loaded| {
                let regime = if loaded { "loaded" } else { "quiet" };
                let what = last(n);
                [
                    (
                        "vs_llvm",
                        self.over(Server::RpcServe, Server::Llvm, &what, loaded),
                    ),
                    (
                        "vs_floor",
                        self.over(Server::RpcServe, Server::Floor, &what, loaded),
                    ),
                    (
                        "ip_vs_thread_floor",
                        self.over(Server::InProcess, Server::ThreadFloor, &what, loaded),
                    ),
                ]
                .map(|(name, ratio)| (format!("{name}_n{n}_{regime}"), ratio, 2))
            })
        });
        let figures: Vec<(String, f64, usize)> = [
            ("roundtrip_ns", ip(&last(64)), 1),
            ("pingpong_ns", ip(PINGPONG), 1),
            ("roundtrip_ratio", ip(&last(64)) / ip(PINGPONG), 2),
            ("scan_ratio", ip(&last(16384)) / ip(&last(64)), 2),
            (
                "scan_ratio_xp_quiet",
                xp(&last(16384), false) / xp(&last(64), false),
                2,
            ),
            (
                "scan_ratio_xp_loaded",
                xp(&last(16384), true) / xp(&last(64), true),
                2,
            ),
        ]
        .into_iter()
        .map(|(name, value, digits)| (name.to_string(), value, digits))
        .chain(versus)
        .chain(
            [
                ("stream_mb_s", ip(STREAM_L1), 0),
                ("idle_cpu_pct", ip(IDLE_NO_KERNEL), 3),
                (
                    "rpc_serve_idle_cpu_pct",
                    self.median(IDLE_NO_CLIENT, Server::RpcServe, false),
                    3,
                ),
                ("silent_cpu_pct", ip(&silent_row("")), 2),
                ("silent_doorbell_cpu_pct", ip(&silent_row(RINGS)), 2),
                ("wake_us_p50", percentile(&wake, 50.0), 1),
                ("wake_us_p99", percentile(&wake, 99.0), 1),
            ]
            .map(|(name, value, digits)| (name.to_string(), value, digits)),
        )
        .collect();
        figures
            .iter()
            .filter(|(_, value, _)| value.is_finite())
            .map(|(name, value, digits)| format!("{name}={value:.digits$}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Every row, one line per server and regime.
    fn table(&self) -> String {
        let mut out = String::from(
            "| benchmark | server | regime | unit | median | min | max | samples |\n\
             |---|---|---|---|---:|---:|---:|---:|\n",
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.what,
                row.server.name(),
                row.regime(),
                row.unit,
                fmt(row.median()),
                fmt(row.min()),
                fmt(row.max()),
                row.values.len()
            );
        }
        out
    }

    /// The rows side by side, once per row and regime in the order measured: the median of
    /// each server of [`COLUMNS`] (NaN where not measured), rpc-serve over LLVM's server and
    /// over the floor (the process), and the in-process server over the thread floor.
    fn side_by_side(&self) -> Vec<SideBySide<'_>> {
        let mut out: Vec<SideBySide<'_>> = Vec::new();
        for row in &self.rows {
            if out
                .iter()
                .any(|line| line.row.what == row.what && line.row.loaded == row.loaded)
            {
                continue;
            }
            out.push(SideBySide {
                row,
                medians: COLUMNS.map(|server| self.median(&row.what, server, row.loaded)),
                vs_llvm: self.vs_llvm(&row.what, row.loaded),
                vs_floor: self.over(Server::RpcServe, Server::Floor, &row.what, row.loaded),
                in_process_vs_thread_floor: self.over(
                    Server::InProcess,
                    Server::ThreadFloor,
                    &row.what,
                    row.loaded,
                ),
            });
        }
        out
    }

    /// [`Report::side_by_side`] as a Markdown table.
    fn comparison(&self) -> String {
        let mut out = String::from("| benchmark | regime | unit |");
        for server in COLUMNS {
            let _ = write!(out, " {} |", server.name());
        }
        out.push_str(
            " rpc-serve / LLVM | rpc-serve / floor | in-process / thread floor |\n|---|---|---|",
        );
        out.push_str(&"---:|".repeat(COLUMNS.len() + 3));
        out.push('\n');
        let ratio = |r: f64| {
            if r.is_finite() {
                format!("{r:.2}")
            } else {
                "—".into()
            }
        };
        for line in self.side_by_side() {
            let row = line.row;
            let _ = write!(out, "| {} | {} | {} |", row.what, row.regime(), row.unit);
            for median in line.medians {
                let _ = write!(out, " {} |", fmt(median));
            }
            let _ = writeln!(
                out,
                " {} | {} | {} |",
                ratio(line.vs_llvm),
                ratio(line.vs_floor),
                ratio(line.in_process_vs_thread_floor)
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
                    "name": r.what,
                    "server": r.server.name(),
                    "regime": r.regime(),
                    "unit": r.unit,
                    "median": r.median(),
                    "min": r.min(),
                    "max": r.max(),
                    "values": r.values,
                })
            })
            .collect();
        // A figure not measured is null.
        let figure = |value: f64| value.is_finite().then_some(value);
        let side_by_side: Vec<serde_json::Value> = self
            .side_by_side()
            .iter()
            .map(|line| {
                let medians: serde_json::Map<String, serde_json::Value> = COLUMNS
                    .iter()
                    .zip(line.medians)
                    .map(|(server, median)| (server.name().to_string(), figure(median).into()))
                    .collect();
                serde_json::json!({
                    "name": line.row.what,
                    "regime": line.row.regime(),
                    "unit": line.row.unit,
                    "medians": medians,
                    "rpc_serve_over_llvm": figure(line.vs_llvm),
                    "rpc_serve_over_floor": figure(line.vs_floor),
                    "in_process_over_thread_floor": figure(line.in_process_vs_thread_floor),
                })
            })
            .collect();
        let machine = Machine::here();
        serde_json::json!({
            "mode": self.settings.name,
            "cpu_model": machine.model,
            "cpus": machine.cpus,
            "rounds": self.settings.rounds,
            "window_ms": self.settings.window.as_millis() as u64,
            "quiet_placement": placement(),
            "loaded_busy_threads": HOGS.load(Ordering::Relaxed),
            "stream_bytes_per_lane": STREAM_BYTES,
            "rows": rows,
            "comparison": side_by_side,
            "summary": self.summary(),
        })
    }

    /// The picture ([`svg::plot`]): per server and regime, latency of port N-1 against N
    /// (ns) and wake-up latency against silence (µs, the in-process server's with a v2
    /// doorbell as a series of its own), and the throughput rows of every server.
    fn picture(&self) -> String {
        let point = |x: f64, row: &Row| svg::Point {
            x,
            median: row.median(),
            min: row.min(),
            max: row.max(),
        };
        let servers = [Server::InProcess, Server::RpcServe, Server::Llvm];
        let mut latency = Vec::new();
        // The floor's colour is the last of the palette: the wake-up panel's doorbell series
        // takes the one after the servers'.
        let with_floor = servers
            .iter()
            .copied()
            .enumerate()
            .chain([(svg::FLOOR_COLOUR, Server::Floor)]);
        for (colour, server) in with_floor {
            for loaded in [false, true] {
                let points: Vec<svg::Point> = SHAPES
                    .iter()
                    .filter_map(|&(_, n)| {
                        let row =
                            self.find(&format!("roundtrip N={n} port {}", n - 1), server, loaded)?;
                        Some(point(f64::from(n), row))
                    })
                    .collect();
                if !points.is_empty() {
                    let regime = if loaded { "loaded" } else { "quiet" };
                    latency.push(svg::Series {
                        name: format!("{}, {regime}", server.name()),
                        colour,
                        loaded,
                        points,
                    });
                }
            }
        }
        let wake_series = servers
            .iter()
            .enumerate()
            .map(|(colour, &server)| (colour, server, ""))
            .chain([(servers.len(), Server::InProcess, RINGS)]);
        let mut wake = Vec::new();
        for (colour, server, rung) in wake_series {
            let points: Vec<svg::Point> = SILENCES
                .iter()
                .filter_map(|&(silence, label)| {
                    let row = self.find(&wake_row(label, rung), server, false)?;
                    Some(point(silence.as_secs_f64() * 1e6, row))
                })
                .collect();
            if !points.is_empty() {
                wake.push(svg::Series {
                    name: format!("{}{rung}", server.name()),
                    colour,
                    loaded: false,
                    points,
                });
            }
        }
        // The throughput rows, in the order measured: printf, then the pipelined rows.
        let mut rows: Vec<String> = Vec::new();
        for row in &self.rows {
            let rate = row.what == PRINTF || row.what.starts_with("pipelined ");
            if rate && !row.loaded && !rows.contains(&row.what) {
                rows.push(row.what.clone());
            }
        }
        let series = servers
            .iter()
            .enumerate()
            .filter_map(|(colour, &server)| {
                let points: Vec<svg::Point> = rows
                    .iter()
                    .enumerate()
                    .filter_map(|(i, what)| Some(point(i as f64, self.find(what, server, false)?)))
                    .collect();
                (!points.is_empty()).then(|| svg::Series {
                    name: server.name().into(),
                    colour,
                    loaded: false,
                    points,
                })
            })
            .collect();
        svg::plot(&latency, &wake, &svg::Rates { rows, series })
    }
}

/// The servers of the comparison's columns, in order.
const COLUMNS: [Server; 5] = [
    Server::InProcess,
    Server::RpcServe,
    Server::Llvm,
    Server::Floor,
    Server::ThreadFloor,
];

/// One line of the comparison: a row in one regime, every server's median side by side.
struct SideBySide<'r> {
    /// The first of the row's servers measured (its name, regime and unit).
    row: &'r Row,
    /// The medians of [`COLUMNS`]' servers.
    medians: [f64; COLUMNS.len()],
    /// rpc-serve over LLVM's server.
    vs_llvm: f64,
    /// rpc-serve over the floor (the process).
    vs_floor: f64,
    /// The in-process server over the thread floor.
    in_process_vs_thread_floor: f64,
}

/// The machine the run measured, as the report's header names it.
#[derive(Debug, PartialEq, Eq)]
struct Machine {
    /// `model name` of /proc/cpuinfo ("unknown" where it has none).
    model: String,
    /// Its CPUs (`processor` entries), which the bench's two pinned CPUs are among.
    cpus: usize,
}

impl Machine {
    fn here() -> Self {
        Machine::of(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
    }

    /// The machine that a /proc/cpuinfo text describes.
    fn of(cpuinfo: &str) -> Self {
        let field = |line: &str, key: &str| {
            let (name, value) = line.split_once(':')?;
            (name.trim() == key).then(|| value.trim().to_string())
        };
        Machine {
            model: cpuinfo
                .lines()
                .find_map(|line| field(line, "model name"))
                .unwrap_or_else(|| "unknown".into()),
            cpus: cpuinfo
                .lines()
                .filter(|line| field(line, "processor").is_some())
                .count(),
        }
    }
}

/// Three significant figures or so, without exponent.
fn fmt(value: f64) -> String {
    if !value.is_finite() {
        "—".into()
    } else if value >= 100.0 {
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
const BARE: &str = "roundtrip, bare Server loop";
/// The typed rows (`measure::typed`), on the v2 shape's mailbox, whose LLVM peer (LLVM 23) has
/// `rpc::invoke`.
const TYPED_ADD: &str = "typed add N=16384";
const TYPED_SUM: &str = "typed sum 4 KiB N=16384";
/// The port count of the shape the typed rows run on.
const TYPED_PORTS: u32 = 16384;
const LANES_FULL: &str = "lanes L=32 full mask";
const LANES_HALF: &str = "lanes L=32 half mask";
const STREAM_L1: &str = "stream 1 MiB, L=1";
const STREAM_L32: &str = "stream 1 MiB/lane, L=32";
const PRINTF: &str = "printf L=32, 3 arguments, one %s";
const IDLE_NO_KERNEL: &str = "idle CPU, no kernel";
const IDLE_NO_CLIENT: &str = "idle CPU, no client for 1 s+";
const PARK_FLOOR: &str = "idle CPU, a thread parking 250 µs at a time (floor)";
/// Appended to the names of the rows whose client rings a v2 doorbell.
const RINGS: &str = ", v2 doorbell";

/// The silent-kernel row, `rung` [`RINGS`] for a doorbell's or empty.
fn silent_row(rung: &str) -> String {
    format!("idle CPU, kernel silent for 10 ms+{rung}")
}

/// The wake-up row after `silence`, `rung` [`RINGS`] for a doorbell's or empty.
fn wake_row(silence: &str, rung: &str) -> String {
    format!("wake after {silence} silence{rung}")
}

/// The servers to measure: in-process, and those whose binary was given.
fn servers(binaries: &Binaries) -> Vec<Server> {
    let mut servers = vec![Server::InProcess];
    if binaries.rpc_serve.is_some() {
        servers.push(Server::RpcServe);
    }
    if binaries.peer_v1.is_some() || binaries.peer_v2.is_some() {
        servers.push(Server::Llvm);
    }
    servers
}

/// A setup of every server for one mailbox shape (servers whose binary is missing left out).
///
/// All of them serve one mailbox, in turn: a file in /dev/shm that rpc-serve creates, LLVM's
/// peer opens and the in-process server maps, so that their rows cross the same cache lines.
/// A line's transfer between the two CPUs took 228-283 ns here depending on the line (where
/// its address lands in the shared cache), now and then twice that, the same for a line from
/// run to run: with a mailbox each, a server's rows were up to 2x faster or slower for its
/// memory alone (the same rpc-serve binary in both slots read 219 and 84 MB/s on the L=1
/// stream). Without rpc-serve (or /dev/shm) each server has a mailbox of its own.
fn setups(
    servers: &[Server],
    binaries: &Binaries,
    generation: Generation,
    ports: u32,
    lanes: u32,
) -> Result<Vec<Setup>, String> {
    static MAILBOXES: AtomicU64 = AtomicU64::new(0);
    let shm = Path::new("/dev/shm");
    let file = shm.is_dir().then(|| {
        let n = MAILBOXES.fetch_add(1, Ordering::Relaxed);
        shm.join(format!("rpc-bench-{}-{n}", std::process::id()))
    });
    // rpc-serve first: it creates the file the others then serve.
    let order = [Server::RpcServe, Server::Llvm, Server::InProcess];
    let mut created = None;
    let mut out = Vec::new();
    for server in order.into_iter().filter(|s| servers.contains(s)) {
        let file = match server {
            Server::RpcServe => file.as_deref(),
            Server::Llvm | Server::InProcess | Server::Floor | Server::ThreadFloor => created,
        };
        if let Some(setup) = Setup::new(server, binaries, generation, ports, lanes, file)? {
            if server == Server::RpcServe {
                created = file;
            }
            out.push(setup);
        }
    }
    // In the order of `servers`, as the tables list them.
    out.sort_by_key(|setup| servers.iter().position(|&s| s == setup.server));
    Ok(out)
}

fn run(
    settings: Settings,
    part: Part,
    binaries: &Binaries,
    out_dir: PathBuf,
) -> Result<(), String> {
    let started = Instant::now();
    // Before any thread is pinned: see `allowed_cpus`.
    allowed_cpus();
    pin_client();
    let servers = servers(binaries);
    if let Part::Requests { ports, count } = part {
        return requests(&servers, binaries, ports, count);
    }
    eprintln!(
        "rpc-bench ({}): servers {}; {} interleaved rounds of {} ms per latency row, quiet ({}) \
         and loaded ...",
        settings.name,
        servers
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        settings.rounds,
        settings.window.as_millis(),
        placement()
    );
    let mut rows = Vec::new();
    let w = settings.window;

    // Latency rows, interleaved: every row of every server once per round.
    let streaming = matches!(part, Part::Stream(_));
    let latency_rows = matches!(part, Part::All | Part::Latency);
    // Per shape: its servers, and the floor's process for each measured port (where rpc-serve
    // made the file).
    let shapes: Vec<(u32, Vec<Setup>, Floors)> = if !latency_rows {
        Vec::new()
    } else {
        SHAPES
            .iter()
            .map(|&(g, n)| {
                let setups = setups(&servers, binaries, g, n, 1)?;
                let floors = match file_of(&setups) {
                    Some(file) => measured_ports(n)
                        .into_iter()
                        .map(|port| Ok((port, Setup::floor(file, port, target::floor_command)?)))
                        .collect::<Result<_, String>>()?,
                    None => Vec::new(),
                };
                Ok((n, setups, floors))
            })
            .collect::<Result<_, String>>()?
    };
    let lanes = if matches!(part, Part::Stream(1) | Part::Pipelined(_) | Part::Idle) {
        Vec::new()
    } else {
        setups(&servers, binaries, Generation::V1, 64, 32)?
    };
    for loaded in [false, true].into_iter().filter(|_| latency_rows) {
        let _loaded = loaded.then(|| {
            let floors = shapes.iter().flat_map(|(_, _, f)| f.iter().map(|(_, f)| f));
            Loaded::start(
                shapes
                    .iter()
                    .flat_map(|(_, s, _)| s)
                    .chain(floors)
                    .chain(&lanes),
            )
        });
        let unit = "ns/round trip";
        let mut plan: Vec<Measured<'_>> = vec![(
            Row::new(PINGPONG, Server::InProcess, loaded, unit),
            Box::new(move || measure::pingpong(w)),
        )];
        // The bare loop and the thread floor run on the lines every server of a shape serves:
        // its mailbox file, through rpc-serve's setup of it (every server is stopped or asleep
        // between its rows); the floor's processes map that file too.
        if let Some(setup) = shapes
            .iter()
            .find(|(n, _, _)| *n == 64)
            .and_then(|(_, setups, _)| file_of(setups))
        {
            plan.push((
                Row::new(BARE, Server::InProcess, loaded, unit),
                Box::new(move || measure::bare_roundtrip(setup, w)),
            ));
        }
        for (n, setups, floors) in &shapes {
            for port in measured_ports(*n) {
                let what = format!("roundtrip N={n} port {port}");
                let floor = floors.iter().filter(|(p, _)| *p == port).map(|(_, f)| f);
                for setup in setups.iter().chain(floor) {
                    plan.push((
                        Row::new(&what, setup.server, loaded, unit),
                        Box::new(move || measure::roundtrip(setup, port, 1, w)),
                    ));
                }
                if let Some(setup) = file_of(setups) {
                    plan.push((
                        Row::new(&what, Server::ThreadFloor, loaded, unit),
                        Box::new(move || measure::thread_floor_roundtrip(setup, port, w)),
                    ));
                }
            }
        }
        // The typed calls, where LLVM's peer has `rpc::invoke` (LLVM 23: the v2 shape).
        for (_, setups, _) in shapes.iter().filter(|(n, _, _)| *n == TYPED_PORTS) {
            for setup in setups {
                for (what, call) in [
                    (TYPED_ADD, measure::Typed::Add),
                    (TYPED_SUM, measure::Typed::Sum),
                ] {
                    plan.push((
                        Row::new(what, setup.server, loaded, unit),
                        Box::new(move || measure::typed(setup, call, w)),
                    ));
                }
            }
        }
        for setup in &lanes {
            for (what, mask) in [(LANES_FULL, u64::from(u32::MAX)), (LANES_HALF, 0xFFFF)] {
                plan.push((
                    Row::new(what, setup.server, loaded, unit),
                    Box::new(move || measure::roundtrip(setup, 0, mask, w)),
                ));
            }
        }
        // Each of these warms up inside its window already.
        in_rounds(settings.rounds, false, plan, &mut rows)?;
        progress(
            started,
            if loaded {
                "latency, loaded"
            } else {
                "latency, quiet"
            },
        );
    }
    drop(shapes);
    let report = |rows| Report { settings, rows };
    if part == Part::Latency {
        return write(report(rows), &out_dir, started);
    }

    // Throughput: streams and printf, then the pipelined rows, quiet, each set in rounds.
    let small = if matches!(part, Part::Stream(32) | Part::Printf) {
        Vec::new()
    } else {
        setups(&servers, binaries, Generation::V1, 64, 1)?
    };
    let data: Vec<Vec<u8>> = (0..32u8)
        .map(|lane| {
            (0..STREAM_BYTES)
                .map(|i| (i as u8).wrapping_mul(31) ^ lane)
                .collect()
        })
        .collect();
    let streams = [
        (STREAM_L1, &small, 1),
        (STREAM_L32, &lanes, u64::from(u32::MAX)),
    ];
    let stream_rows = matches!(part, Part::All | Part::Stream(_));
    let mut plan: Vec<Measured<'_>> = Vec::new();
    for (what, setups, mask) in streams.into_iter().filter(|_| stream_rows) {
        for setup in setups {
            let row = Row::new(what, setup.server, false, "MB/s");
            let data = &data;
            plan.push((row, Box::new(move || measure::stream(setup, mask, data))));
        }
    }
    for setup in lanes.iter().filter(|_| !streaming) {
        // (`lanes` is empty with `--pipelined-only` and `--idle-only`.)
        let row = Row::new(PRINTF, setup.server, false, "lines/s");
        let mut repetition = 0;
        plan.push((
            row,
            Box::new(move || {
                repetition += 1;
                measure::printf_lines(setup, w, repetition)
            }),
        ));
    }
    in_rounds(settings.reps, true, plan, &mut rows)?;
    drop(data);
    drop(lanes);
    progress(started, "streams and printf");
    if streaming || part == Part::Printf {
        return write(report(rows), &out_dir, started);
    }

    // Pipelined exchanges: M ports at once against M = 1, in the same run.
    let mut plan: Vec<Measured<'_>> = Vec::new();
    let wanted = |kind| match part {
        Part::Idle => false,
        Part::Pipelined(Some(only)) => kind == only,
        _ => true,
    };
    for kind in measure::Pipelined::ALL
        .into_iter()
        .filter(|&kind| wanted(kind))
    {
        for delay_us in [0u64, 2] {
            for ports in [PIPELINED_PORTS, 1] {
                let what = kind.name();
                for setup in &small {
                    let row = Row::new(
                        format!("pipelined {what} M={ports} D={delay_us}us"),
                        setup.server,
                        false,
                        "exchanges/s",
                    );
                    let delay = Duration::from_micros(delay_us);
                    plan.push((
                        row,
                        Box::new(move || measure::pipelined(setup, ports, kind, delay, w)),
                    ));
                }
            }
        }
    }
    in_rounds(settings.reps, true, plan, &mut rows)?;

    progress(started, "pipelined");
    if let Part::Pipelined(_) = part {
        return write(report(rows), &out_dir, started);
    }

    // Idle CPU and wake-up latency, one server at a time (the others stopped or asleep).
    let fresh = setups(&servers, binaries, Generation::V1, 64, 1)?;
    for setup in &fresh {
        if setup.server == Server::InProcess {
            // No kernel: no user guard.
            thread::sleep(Duration::from_millis(50));
            let mut row = Row::new(IDLE_NO_KERNEL, setup.server, false, "% of a core");
            row.values.push(measure::cpu_share(setup, settings.idle)?);
            rows.push(row);
        } else {
            // A server process never asked anything, for longer than rpc-serve's
            // `ABSENT_AFTER` (after which its parks may grow past 250 µs).
            let _serving = setup.serving();
            thread::sleep(rpc_core::ABSENT_AFTER + Duration::from_millis(200));
            let mut row = Row::new(IDLE_NO_CLIENT, setup.server, false, "% of a core");
            row.values.push(measure::cpu_share(setup, settings.idle)?);
            rows.push(row);
        }
    }
    drop(fresh);
    // What a silent kernel costs any server that looks every 250 µs: the wake-ups alone.
    let mut row = Row::new(PARK_FLOOR, Server::InProcess, false, "% of a core");
    let park = rpc_core::ServerConfig::default().park;
    row.values.push(measure::park_floor(park, settings.idle)?);
    rows.push(row);
    // And the same for a v2 kernel whose device rings a doorbell: the worker sleeps on it.
    let bell = Setup::with_doorbell(64, 1)?;
    for setup in small.iter().chain([&bell]) {
        let rung = if setup.rings() { RINGS } else { "" };
        let _serving = setup.serving();
        measure::roundtrip(setup, 0, 1, w)?;
        thread::sleep(Duration::from_millis(10));
        let mut row = Row::new(silent_row(rung), setup.server, false, "% of a core");
        row.values.push(measure::cpu_share(setup, settings.idle)?);
        rows.push(row);
        for (silence, label) in SILENCES {
            let mut row = Row::new(wake_row(label, rung), setup.server, false, "µs");
            row.values = measure::wake(setup, silence, settings.wake_samples)?;
            rows.push(row);
        }
    }
    drop((small, bell));
    write(report(rows), &out_dir, started)
}

/// The ports a round-trip row of N ports measures: 0 and 63 of 64, N-1 of the others.
fn measured_ports(n: u32) -> Vec<u32> {
    if n == 64 {
        vec![0, 63]
    } else {
        vec![n - 1]
    }
}

/// rpc-serve's setup among a shape's, through which the bench's own loops map its mailbox file.
fn file_of(setups: &[Setup]) -> Option<&Setup> {
    setups.iter().find(|setup| setup.server == Server::RpcServe)
}

/// `--requests-only N K`: K TEST_INCREMENT round trips, one lane, on port N-1 of a fresh
/// mailbox of N ports, against each server process of `servers` in turn. The server is
/// stopped (SIGSTOP) from its ready line to the first request and after the last, then ended
/// (SIGTERM), so that what it did in between is the K requests and the polls between them.
fn requests(servers: &[Server], binaries: &Binaries, ports: u32, count: u32) -> Result<(), String> {
    let Some(&(generation, _)) = SHAPES.iter().find(|&&(_, n)| n == ports) else {
        let shapes: Vec<String> = SHAPES.iter().map(|(_, n)| n.to_string()).collect();
        return Err(format!(
            "--requests-only: N is one of {}, not {ports}",
            shapes.join(", ")
        ));
    };
    for &server in servers.iter().filter(|&&s| s != Server::InProcess) {
        let Some(setup) = Setup::new(server, binaries, generation, ports, 1, None)? else {
            continue;
        };
        let serving = setup.serving();
        let client = setup.client();
        for x in 0..u64::from(count) {
            measure::increment(&client, ports - 1, 1, x)?;
        }
        drop(serving);
        eprintln!(
            "rpc-bench: {count} round trips on port {} of {ports} against {}",
            ports - 1,
            server.name()
        );
    }
    Ok(())
}

/// A shape's floor processes, each with the port it answers.
type Floors = Vec<(u32, Setup)>;

/// A row, and the measurement of one repetition of it.
type Measured<'a> = (Row, Box<dyn FnMut() -> Result<f64, String> + 'a>);

/// Measures every row of `plan` in `rounds` rounds, one repetition of each row a round (after
/// one unrecorded warm-up each with `warm_up`), so that a change of the machine during the run
/// (another tenant's load, the host scheduling this VM's CPUs elsewhere) falls on every server
/// alike, not on whichever ran then; appends the rows to `rows`.
fn in_rounds(
    rounds: usize,
    warm_up: bool,
    mut plan: Vec<Measured<'_>>,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    for (_, measure) in plan.iter_mut().filter(|_| warm_up) {
        measure()?;
    }
    for _ in 0..rounds {
        for (row, measure) in &mut plan {
            row.values.push(measure()?);
        }
    }
    rows.extend(plan.into_iter().map(|(row, _)| row));
    Ok(())
}

/// Says on stderr that a part of the run is done.
fn progress(started: Instant, part: &str) {
    eprintln!(
        "rpc-bench: {part} done at {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Prints the tables and writes the JSON, Markdown and SVG files.
fn write(report: Report, dir: &std::path::Path, started: Instant) -> Result<(), String> {
    let table = report.table();
    let comparison = report.comparison();
    println!("{comparison}");
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = report.settings.name;
    let path = |ext: &str| dir.join(format!("bench-{name}.{ext}"));
    let json = serde_json::to_string_pretty(&report.json()).map_err(|e| e.to_string())?;
    let machine = Machine::here();
    let header = format!(
        "# rpc-bench {name}\n\n{}, {} CPUs; quiet regime: {}; loaded regime: {} busy \
         thread(s).\n",
        machine.model,
        machine.cpus,
        placement(),
        HOGS.load(Ordering::Relaxed)
    );
    let md = format!(
        "{header}\n{comparison}\n{table}\n```\n{}\n```\n",
        report.summary()
    );
    let picture = report.picture();
    for (ext, text) in [("json", &json), ("md", &md), ("svg", &picture)] {
        std::fs::write(path(ext), text).map_err(|e| format!("{}: {e}", path(ext).display()))?;
    }
    eprintln!(
        "rpc-bench: {:.1} s; wrote {}.{{json,md,svg}}",
        started.elapsed().as_secs_f64(),
        dir.join(format!("bench-{name}")).display()
    );
    println!("{}", report.summary());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::process_state;
    use rpc_core::protocol::Layout;

    fn row(what: &str, server: Server, loaded: bool, values: &[f64]) -> Row {
        let mut row = Row::new(what, server, loaded, "ns/round trip");
        row.values = values.to_vec();
        row
    }

    #[test]
    fn the_comparison_puts_each_row_of_each_regime_on_one_line_with_ours_over_llvm_and_floor() {
        let report = Report {
            settings: Settings::QUICK,
            rows: vec![
                row("roundtrip N=64 port 63", Server::InProcess, false, &[500.0]),
                row(
                    "roundtrip N=64 port 63",
                    Server::RpcServe,
                    false,
                    &[400.0, 600.0, 500.0],
                ),
                row("roundtrip N=64 port 63", Server::Llvm, false, &[1000.0]),
                row("roundtrip N=64 port 63", Server::Floor, false, &[400.0]),
                row(
                    "roundtrip N=64 port 63",
                    Server::ThreadFloor,
                    false,
                    &[400.0],
                ),
                row("roundtrip N=64 port 63", Server::RpcServe, true, &[3000.0]),
                row("roundtrip N=64 port 63", Server::Floor, true, &[2000.0]),
            ],
        };
        let table = report.comparison();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "| benchmark | regime | unit | in-process | rpc-serve | LLVM | floor \
                 | thread floor | rpc-serve / LLVM | rpc-serve / floor \
                 | in-process / thread floor |",
                "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
                "| roundtrip N=64 port 63 | quiet | ns/round trip | 500 | 500 | 1000 | 400 \
                 | 400 | 0.50 | 1.25 | 1.25 |",
                "| roundtrip N=64 port 63 | loaded | ns/round trip | — | 3000 | — | 2000 \
                 | — | — | 1.50 | — |",
            ]
        );
        assert_eq!(report.vs_llvm("roundtrip N=64 port 63", false), 0.5);
        let summary = report.summary();
        assert!(
            summary.ends_with(
                "vs_llvm_n64_quiet=0.50 vs_floor_n64_quiet=1.25 ip_vs_thread_floor_n64_quiet=1.25 \
                 vs_floor_n64_loaded=1.50"
            ),
            "{summary}"
        );
        // The JSON says the same, null where a server was not measured.
        let json = report.json();
        let lines = json["comparison"].as_array().unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["medians"]["floor"], 400.0);
        assert_eq!(lines[0]["rpc_serve_over_llvm"], 0.5);
        assert_eq!(lines[0]["rpc_serve_over_floor"], 1.25);
        assert_eq!(lines[0]["medians"]["thread floor"], 400.0);
        assert_eq!(lines[0]["in_process_over_thread_floor"], 1.25);
        assert!(lines[1]["in_process_over_thread_floor"].is_null());
        assert_eq!(lines[1]["regime"], "loaded");
        assert!(lines[1]["medians"]["LLVM"].is_null());
        assert!(lines[1]["rpc_serve_over_llvm"].is_null());
        assert_eq!(lines[1]["rpc_serve_over_floor"], 1.5);
    }

    #[test]
    fn the_machine_is_the_model_name_and_the_count_of_processors_of_cpuinfo() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\
                       flags\t\t: fpu\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n\n";
        let machine = Machine::of(cpuinfo);
        assert_eq!(
            machine,
            Machine {
                model: "AMD EPYC 7B13".into(),
                cpus: 2
            }
        );
        // An architecture whose cpuinfo has no model name (some Arm kernels).
        assert_eq!(
            Machine::of("processor : 0\nBogoMIPS : 50.00\n").model,
            "unknown"
        );
        // And the JSON of this machine names its model and CPUs.
        let json = synthetic(false).json();
        assert!(!json["cpu_model"].as_str().unwrap().is_empty());
        assert!(json["cpus"].as_u64().unwrap() >= 1);
    }

    /// A report of every row the picture and the summary read, values spread over three
    /// repetitions: in-process, rpc-serve and the floor, and LLVM's server with `llvm`.
    fn synthetic(llvm: bool) -> Report {
        let mut servers = vec![Server::InProcess, Server::RpcServe];
        if llvm {
            servers.push(Server::Llvm);
        }
        let spread = |median: f64| [median * 0.8, median, median * 1.5];
        let mut rows = vec![row(PINGPONG, Server::InProcess, false, &spread(200.0))];
        for (k, &server) in servers.iter().enumerate() {
            let base = 300.0 * (k + 1) as f64;
            for loaded in [false, true] {
                for &(_, n) in &SHAPES {
                    let ns = base * f64::from(n).sqrt() / 8.0 * if loaded { 6.0 } else { 1.0 };
                    let what = format!("roundtrip N={n} port {}", n - 1);
                    rows.push(row(&what, server, loaded, &spread(ns)));
                }
            }
            for (silence, label) in SILENCES {
                let us = 5.0 + silence.as_secs_f64() * 1e4 * (k + 1) as f64;
                rows.push(row(&wake_row(label, ""), server, false, &spread(us)));
            }
            rows.push(row(PRINTF, server, false, &spread(2e5 / (k + 1) as f64)));
            for kind in measure::Pipelined::ALL {
                for m in [PIPELINED_PORTS, 1] {
                    let what = format!("pipelined {} M={m} D=0us", kind.name());
                    let rate = 1e5 * f64::from(m).sqrt() / (k + 1) as f64;
                    // A window in which nothing completed, as on a busy machine: 0, which a
                    // log axis shows at its start.
                    let values = if k == 1 && m == 1 {
                        [0.0, 0.0, rate]
                    } else {
                        spread(rate)
                    };
                    rows.push(row(&what, server, false, &values));
                }
            }
        }
        for loaded in [false, true] {
            for &(_, n) in &SHAPES {
                let ns = 250.0 * f64::from(n).sqrt() / 8.0 * if loaded { 6.0 } else { 1.0 };
                let what = format!("roundtrip N={n} port {}", n - 1);
                rows.push(row(&what, Server::Floor, loaded, &spread(ns)));
            }
        }
        for (_, label) in SILENCES {
            rows.push(row(
                &wake_row(label, RINGS),
                Server::InProcess,
                false,
                &spread(60.0),
            ));
        }
        Report {
            settings: Settings::QUICK,
            rows,
        }
    }

    /// The attributes of every `<NAME ...>` tag of `svg` (as plotters writes them:
    /// `key="value"`, no `"` inside values).
    fn tags<'s>(svg: &'s str, name: &str) -> Vec<std::collections::HashMap<&'s str, &'s str>> {
        let open = format!("<{name} ");
        svg.split(open.as_str())
            .skip(1)
            .map(|rest| {
                let body = &rest[..rest.find('>').unwrap()];
                body.split('"')
                    .collect::<Vec<_>>()
                    .chunks(2)
                    .filter(|pair| pair.len() == 2)
                    .map(|pair| (pair[0].trim().trim_end_matches('='), pair[1]))
                    .collect()
            })
            .collect()
    }

    /// An axis-aligned box: left, top, right, bottom.
    type Box4 = [f64; 4];

    fn number(tag: &std::collections::HashMap<&str, &str>, key: &str) -> f64 {
        tag[key].parse().unwrap()
    }

    fn rects(svg: &str, key: &str, value: &str) -> Vec<Box4> {
        tags(svg, "rect")
            .iter()
            .filter(|tag| tag.get(key) == Some(&value))
            .map(|tag| {
                let (x, y) = (number(tag, "x"), number(tag, "y"));
                [x, y, x + number(tag, "width"), y + number(tag, "height")]
            })
            .collect()
    }

    /// The picture of a synthetic report, parsed: no plotted point touches a legend box,
    /// every point lies inside a plotting area's frame, and each axis is fitted to its data
    /// (the outermost points near the frame's edges, not a decade inside them).
    #[test]
    fn the_picture_keeps_its_legends_off_the_data_and_fits_its_axes_to_it() {
        for llvm in [false, true] {
            let servers = if llvm { 3 } else { 2 };
            let svg = synthetic(llvm).picture();
            // To look at the pictures: RPC_BENCH_PICTURE_DIR=DIR cargo test -p rpc-bench.
            if let Some(dir) = std::env::var_os("RPC_BENCH_PICTURE_DIR") {
                std::fs::write(
                    std::path::Path::new(&dir).join(format!("synthetic-{llvm}.svg")),
                    &svg,
                )
                .unwrap();
            }
            let hex = |c: plotters::style::RGBColor| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
            let legends = rects(&svg, "fill", &hex(svg::LEGEND_FILL));
            let frames = rects(&svg, "stroke", &hex(svg::FRAME));
            assert_eq!(
                (legends.len(), frames.len()),
                (3, 3),
                "a legend and a frame a panel"
            );
            let circles: Vec<(f64, f64, f64)> = tags(&svg, "circle")
                .iter()
                .map(|c| (number(c, "cx"), number(c, "cy"), number(c, "r")))
                .collect();
            let touches = |b: &Box4, &(x, y, r): &(f64, f64, f64)| {
                x + r >= b[0] && x - r <= b[2] && y + r >= b[1] && y - r <= b[3]
            };
            // Entries: a series per server (and the floor) and regime; per server and the
            // doorbell; per server.
            let entries = [2 * (servers + 1), servers + 1, servers];
            for (legend, entries) in legends.iter().zip(entries) {
                let inside = circles.iter().filter(|c| touches(legend, c)).count();
                assert_eq!(
                    inside, entries,
                    "only the legend's own markers in {legend:?}"
                );
            }
            let plotted: Vec<_> = circles
                .iter()
                .filter(|c| !legends.iter().any(|b| touches(b, c)))
                .collect();
            // The words of the picture, in order (plotters writes each text on a line).
            let words: Vec<&str> = svg
                .lines()
                .filter(|line| !line.starts_with('<'))
                .flat_map(str::split_whitespace)
                .collect();
            let words = words.join(" ");
            assert!(
                words.contains("A 0 is drawn at the start of the axis."),
                "{words}"
            );
            // 4 shapes x 2 regimes, 3 silences (+ 3 doorbell), 7 rates, per server; the
            // floor's 4 shapes x 2 regimes.
            assert_eq!(plotted.len(), servers * (8 + 3 + 7) + 3 + 8);
            // The throughput axis also holds the bars, up to 1.5 times a median here.
            for (frame, slack) in frames.iter().zip([0.12, 0.12, 0.25]) {
                let here: Vec<_> = plotted.iter().filter(|c| touches(frame, c)).collect();
                assert!(!here.is_empty(), "{frame:?}");
                let width = frame[2] - frame[0];
                let left = here.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
                let right = here.iter().map(|c| c.0).fold(0.0, f64::max);
                assert!(
                    left - frame[0] < slack * width,
                    "x fitted at the left: {frame:?}"
                );
                assert!(
                    frame[2] - right < slack * width,
                    "x fitted at the right: {frame:?}"
                );
            }
            for c in &plotted {
                let inside = |f: &&Box4| f[0] <= c.0 && c.0 <= f[2] && f[1] <= c.1 && c.1 <= f[3];
                assert_eq!(frames.iter().filter(inside).count(), 1, "{c:?} in a frame");
            }
        }
    }

    /// Without LLVM's server the `vs_llvm_*` figures are absent from the summary (and the
    /// JSON), not NaN; with it they are there.
    #[test]
    fn the_summary_leaves_out_what_was_not_measured_rather_than_print_nan() {
        let alone = synthetic(false);
        for summary in [
            alone.summary(),
            alone.json()["summary"].as_str().unwrap().to_string(),
        ] {
            assert!(
                !summary.contains("NaN") && !summary.contains("inf"),
                "{summary}"
            );
            assert!(!summary.contains("vs_llvm"), "{summary}");
            assert!(summary.contains("vs_floor"), "{summary}");
            assert!(summary.starts_with("roundtrip_ns="), "{summary}");
        }
        let against = synthetic(true).summary();
        assert!(against.contains("vs_llvm_n64_quiet=0.67"), "{against}");
        assert!(against.contains("vs_llvm_n16384_loaded="), "{against}");
        // rpc-serve over the floor, without LLVM's server as with it: 600 / 250.
        for summary in [alone.summary(), against] {
            assert!(summary.contains("vs_floor_n64_quiet=2.40"), "{summary}");
            assert!(summary.contains("vs_floor_n4096_loaded=2.40"), "{summary}");
        }
        assert!(!serde_json::to_string(&alone.json())
            .unwrap()
            .contains("NaN"));
    }

    /// A stand-in for rpc-serve's process in `dir`: it makes its mailbox file (rpc-serve's
    /// command line starts `--file FILE`), says ready, and never answers.
    fn silent_server(dir: &std::path::Path, generation: Generation, n: u32) -> Setup {
        let bytes = Layout::new(generation, n, 1).unwrap().total_size();
        let script = dir.join(format!("serve-{n}"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ntruncate -s {bytes} \"$2\" && echo \"ready $2 {bytes}\" && \
                 exec sleep 600\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let binaries = Binaries {
            rpc_serve: Some(script),
            peer_v1: None,
            peer_v2: None,
        };
        let file = dir.join(format!("mailbox-{n}"));
        Setup::new(Server::RpcServe, &binaries, generation, n, 1, Some(&file))
            .unwrap()
            .expect("a server process")
    }

    /// The floors answer the measured port of every shape (port 0 and 63 of 64, port N-1 of
    /// the others, v2 at 16384) on a server process's mailbox file, the process stopped
    /// meanwhile: every answer is checked by the client. The process is a stand-in for
    /// rpc-serve that only makes the file, says it is ready and sleeps. The floor of the
    /// cross-process rows answers from a process of its own (this test binary again, running
    /// [`floor_serve_helper`] as the bench runs `rpc-bench floor-serve`): not this one, using
    /// CPU time of its own, stopped between rows like the servers, gone once dropped.
    #[test]
    fn the_floor_answers_the_measured_port_of_every_shape_on_a_server_process_file() {
        let dir = std::env::temp_dir().join(format!("rpc-bench-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The floor's command: this binary's helper, given `floor-serve`'s arguments.
        let launch = |args: Vec<std::ffi::OsString>| {
            let args: Vec<String> = args.into_iter().map(|a| a.into_string().unwrap()).collect();
            let mut command = std::process::Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", "tests::floor_serve_helper", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(FLOOR_ARGS, args.join("\n"));
            Ok(command)
        };
        for &(generation, n) in &SHAPES {
            let setup = silent_server(&dir, generation, n);
            for port in measured_ports(n) {
                let ns = measure::thread_floor_roundtrip(&setup, port, Duration::from_millis(5));
                assert!(ns.unwrap() > 0.0, "thread floor: N={n} port {port}");

                let floor = Setup::floor(&setup, port, launch).unwrap();
                assert_eq!(floor.server, Server::Floor);
                let pid = floor.pid().expect("a process");
                assert_ne!(pid, std::process::id());
                assert_eq!(process_state(pid), Some('T'), "stopped until its row");
                let cpu = floor.cpu().unwrap();
                let ns = measure::roundtrip(&floor, port, 1, Duration::from_millis(5));
                assert!(ns.unwrap() > 0.0, "floor: N={n} port {port}");
                assert!(floor.cpu().unwrap() > cpu, "the floor's process answered");
                assert_eq!(process_state(pid), Some('T'), "stopped after its row");
                drop(floor);
                assert_eq!(
                    process_state(pid),
                    None,
                    "N={n} port {port}: the floor's process ended"
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_row_against_a_server_process_that_died_fails_instead_of_waiting_forever() {
        let dir = std::env::temp_dir().join(format!("rpc-bench-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let setup = silent_server(&dir, Generation::V1, 64);
        let pid = setup.pid().expect("a process");
        // SAFETY: kill has no memory-safety preconditions; the pid is the setup's unreaped child.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        // On a thread of its own, so that a row that waits forever fails the test rather than
        // hanging it (the thread is then left behind).
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let result = measure::roundtrip(&setup, 63, 1, Duration::from_millis(5));
            let _ = tx.send((result, setup));
        });
        // A liveness bound only: the client looks every 65536 pauses (milliseconds).
        let (result, setup) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the row still waits");
        drop(setup);
        let error = result.expect_err("no server answered");
        assert!(
            error.contains("wait abandoned on port 63: the server process is gone"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `floor-serve`'s arguments, one a line, for [`floor_serve_helper`].
    const FLOOR_ARGS: &str = "RPC_BENCH_TEST_FLOOR_ARGS";

    /// Not a test of its own: where [`FLOOR_ARGS`] is set, the floor's process of the test
    /// above, `rpc-bench floor-serve` with those arguments (it never returns).
    #[test]
    fn floor_serve_helper() {
        let Ok(args) = std::env::var(FLOOR_ARGS) else {
            return;
        };
        let args = [FLOOR_SERVE].into_iter().chain(args.split('\n'));
        let floor = <FloorServe as clap::Parser>::try_parse_from(args).unwrap();
        panic!("floor-serve: {}", floor.run());
    }

    #[test]
    fn the_doorbell_rows_client_rings_and_their_worker_sleeps_on_the_doorbell() {
        let setup = Setup::with_doorbell(64, 1).unwrap();
        assert!(setup.rings());
        let _serving = setup.serving();
        let client = setup.client();
        let stats = || setup.stats().expect("in process");
        // Each round: wait until the worker sleeps on the doorbell (no request open, the short
        // parks over), then send a request, which rings it. A ring can come just as a sleep
        // ends on its timeout (the worker then finds the request by polling), so rounds until
        // one wakes it. A liveness bound only.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut x = 0;
        while stats().doorbell_rings == 0 {
            let slept = stats().doorbell_sleeps;
            while stats().doorbell_sleeps == slept {
                assert!(
                    Instant::now() < deadline,
                    "the worker never slept on the doorbell"
                );
                thread::sleep(Duration::from_micros(200));
            }
            measure::increment(&client, 0, 1, x).unwrap();
            x += 1;
            assert!(
                Instant::now() < deadline,
                "no request woke the worker by ringing"
            );
        }
        assert_eq!(stats().served_of(rpc_core::Opcode::TEST_INCREMENT), x);
    }

    #[test]
    fn rows_are_measured_in_rounds_with_or_without_a_warm_up_each() {
        let calls = std::cell::RefCell::new(Vec::new());
        // Rows "a" and "b", each counting its calls and logging them in `calls`.
        fn plan<'a>(calls: &'a std::cell::RefCell<Vec<&'static str>>) -> Vec<Measured<'a>> {
            ["a", "b"]
                .into_iter()
                .map(|name| {
                    let mut n = 0.0;
                    let measure = move || {
                        calls.borrow_mut().push(name);
                        n += 1.0;
                        Ok(n)
                    };
                    let row = Row::new(name, Server::InProcess, false, "MB/s");
                    (
                        row,
                        Box::new(measure) as Box<dyn FnMut() -> Result<f64, String>>,
                    )
                })
                .collect()
        }
        let mut rows = Vec::new();
        in_rounds(3, true, plan(&calls), &mut rows).unwrap();
        assert_eq!(*calls.borrow(), ["a", "b", "a", "b", "a", "b", "a", "b"]);
        // The warm-up (each row's first call) is not recorded.
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].values, [2.0, 3.0, 4.0]);
        assert_eq!(rows[1].values, [2.0, 3.0, 4.0]);

        // The latency rows warm up inside their windows: no call goes unrecorded.
        calls.borrow_mut().clear();
        let mut rows = Vec::new();
        in_rounds(2, false, plan(&calls), &mut rows).unwrap();
        assert_eq!(*calls.borrow(), ["a", "b", "a", "b"]);
        assert_eq!(rows[0].values, [1.0, 2.0]);
    }

    /// `args` as rpc-bench reads them, or clap's refusal.
    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        let args = std::iter::once("rpc-bench").chain(args.iter().copied());
        <Cli as clap::Parser>::try_parse_from(args)
    }

    fn parsed(args: &[&str]) -> Result<(Settings, Part, Binaries, PathBuf), clap::Error> {
        cli(args).map(parse)
    }

    #[test]
    fn pipelined_only_takes_an_optional_kind() {
        let part = |args: &[&str]| {
            parsed(args)
                .ok()
                .map(|(settings, part, _, _)| (settings.reps == Settings::QUICK.reps, part))
        };
        assert_eq!(
            part(&["--pipelined-only"]),
            Some((false, Part::Pipelined(None)))
        );
        let printf = Part::Pipelined(Some(measure::Pipelined::Printf));
        assert_eq!(
            part(&["--pipelined-only", "printf", "--quick"]),
            Some((true, printf))
        );
        let any = Part::Pipelined(None);
        assert_eq!(part(&["--pipelined-only", "--quick"]), Some((true, any)));
        assert_eq!(part(&["--pipelined-only", "bogus"]), None);
        let requests = Part::Requests {
            ports: 4096,
            count: 1000,
        };
        assert_eq!(
            part(&["--requests-only", "4096", "1000"]),
            Some((false, requests))
        );
        assert_eq!(part(&["--requests-only", "4096"]), None);
        // One part at a time.
        assert_eq!(part(&["--latency-only", "--idle-only"]), None);
    }

    /// What `cargo xtask bench` passes is taken; `--park-us` has xtask's range, named in
    /// the refusal.
    #[test]
    fn the_flags_xtask_passes_are_taken_and_park_us_has_its_range() {
        let args = [
            "--rpc-serve",
            "target/release/rpc-serve",
            "--out",
            "target/bench",
            "--peer-v1",
            "p1",
            "--peer-v2",
            "p2",
            "--quick",
            "--float",
            "--latency-only",
            "--park-us",
            "1000000",
        ];
        let taken = cli(&args).unwrap();
        assert!(taken.float && taken.park_us == Some(1_000_000));
        let (settings, part, binaries, out) = parse(taken);
        assert_eq!((settings.name, part), ("quick", Part::Latency));
        assert_eq!(binaries.peer_v2.as_deref(), Some(Path::new("p2")));
        assert_eq!(out, Path::new("target/bench"));
        for bad in ["0", "4294967296", "1000001", "-1", "x"] {
            let error = parsed(&["--park-us", bad]).err().unwrap();
            assert_eq!(error.exit_code(), 2, "{bad}");
            if bad != "x" && bad != "-1" {
                assert!(error.to_string().contains("1..=1000000"), "{bad}: {error}");
            }
        }
    }
}
