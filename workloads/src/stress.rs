//! A bounded stress of one [`RpcServer`]'s life cycle under client traffic.
//!
//! `threads` operation threads each run `ops` operations picked at random (a seeded
//! [`SplitMix64`], so a failing run can be replayed with its seed): `start`, `shutdown_with` a
//! random [`ShutdownPolicy`] (`Refuse`, `Force` or `Wait(1 ms)`), `attach` a small new mailbox
//! with one request already posted in it, `detach` one of the mailboxes this thread attached,
//! and take a user guard (every mailbox, or one of its own) that it holds for a few operations.
//! Meanwhile [`CLIENTS`] client threads do `TEST_INCREMENT` round trips on a traffic mailbox,
//! each batch under a `server.user()` guard, and check every reply.
//!
//! At the end the server is started once more so the clients can finish, then stopped with
//! `Force`. The run passes when no more than one worker was ever alive at once, no worker is
//! left, every request got its correct reply and no operation failed unexpectedly. A client
//! that waits longer than [`StressConfig::client_timeout`] gives up, so a lost request shows as
//! `unanswered` rather than as a hang.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rpc_core::protocol::Deadline;
use rpc_core::protocol::{Client, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::AttachOptions;
use rpc_core::{
    MailboxId, Opcode, RpcServer, ServerConfig, ServerError, ShutdownPolicy, Started, Stopped,
    UserGuard,
};

/// Client threads doing round trips on the traffic mailbox.
pub const CLIENTS: usize = 2;

/// Mailboxes one operation thread keeps attached at most.
const MAX_OWN_MAILBOXES: usize = 4;

/// What to run.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// Operation threads.
    pub threads: usize,
    /// Operations per thread.
    pub ops: usize,
    /// Seed of the operation threads' generators (thread `t` uses a stream derived from it).
    pub seed: u64,
    /// Round trips each client makes at least (it goes on while operations still run).
    pub min_requests: u64,
    /// How long a client waits for a port or a reply before giving up.
    pub client_timeout: Duration,
}

impl StressConfig {
    /// `threads` x `ops` with the seed from `RPC_STRESS_SEED` if set, else from the clock.
    ///
    /// # Panics
    /// If `RPC_STRESS_SEED` is set to anything but a whole number: a replay must not silently
    /// run other choices.
    pub fn new(threads: usize, ops: usize) -> Self {
        let seed = match std::env::var("RPC_STRESS_SEED") {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|_| panic!("RPC_STRESS_SEED wants a whole number, not `{text}`")),
            Err(_) => clock_seed(),
        };
        StressConfig {
            threads,
            ops,
            seed,
            min_requests: 200,
            client_timeout: Duration::from_secs(30),
        }
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5EED)
}

/// What a run did and found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StressReport {
    pub seed: u64,
    pub threads: usize,
    pub ops: usize,
    /// Workers started over the run (`stats().workers_started`).
    pub cycles: u64,
    /// Most workers alive at once (must be 1).
    pub max_workers: u64,
    /// Workers alive after the final shutdown (must be 0).
    pub leaked_workers: u64,
    /// Client round trips attempted.
    pub sent: u64,
    /// Client round trips answered correctly.
    pub answered: u64,
    /// `sent - answered` (must be 0).
    pub unanswered: u64,
    /// Operation counts: starts that spawned a worker / found one running.
    pub started: u64,
    pub already_running: u64,
    /// Shutdowns that stopped the worker / found none / were refused for live users.
    pub stopped: u64,
    pub already_stopped: u64,
    pub refused: u64,
    pub attached: u64,
    pub detached: u64,
    pub guards: u64,
    /// The longest any one `shutdown_with` call took, in milliseconds (a worker that misses the
    /// shutdown while traffic keeps it busy shows here first).
    pub slowest_shutdown_ms: f64,
    /// Operations that failed in a way the design rules out, with the first few messages.
    pub unexpected: Vec<String>,
    pub seconds: f64,
}

impl StressReport {
    /// The reasons the run failed; empty when it passed.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.max_workers > 1 {
            problems.push(format!("{} workers were alive at once", self.max_workers));
        }
        if self.leaked_workers > 0 {
            problems.push(format!("{} worker(s) left running", self.leaked_workers));
        }
        if self.unanswered > 0 {
            problems.push(format!("{} request(s) unanswered", self.unanswered));
        }
        problems.extend(self.unexpected.iter().cloned());
        problems
    }

    pub fn passed(&self) -> bool {
        self.problems().is_empty()
    }

    /// One line with the operation counts (the summary line is `Display`).
    pub fn details(&self) -> String {
        format!(
            "seed={} threads={} ops={} started={} already_running={} stopped={} already_stopped={} \
             refused_live_users={} attached={} detached={} guards={} requests={} \
             slowest_shutdown_ms={:.1}",
            self.seed,
            self.threads,
            self.ops,
            self.started,
            self.already_running,
            self.stopped,
            self.already_stopped,
            self.refused,
            self.attached,
            self.detached,
            self.guards,
            self.sent,
            self.slowest_shutdown_ms
        )
    }
}

impl fmt::Display for StressReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cycles={} max_workers={} leaked_workers={} unanswered={} seconds={:.2}",
            self.cycles, self.max_workers, self.leaked_workers, self.unanswered, self.seconds
        )
    }
}

/// Runs `threads` x `ops` with the default settings (see [`StressConfig::new`]).
pub fn run(threads: usize, ops: usize) -> StressReport {
    run_with(&StressConfig::new(threads, ops))
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator; we need reproducible
/// choices, not cryptographic ones, and no crate for that.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A mailbox with the client-side lock table every client thread of it shares.
struct ClientMailbox {
    memory: Arc<MailboxMemory>,
    locks: LockTable,
}

impl ClientMailbox {
    fn new(ports: u32, lanes: u32) -> Self {
        let layout = Layout::new(Generation::V1, ports, lanes).expect("a valid small layout");
        ClientMailbox {
            memory: Arc::new(MailboxMemory::new(layout)),
            locks: LockTable::new(ports),
        }
    }
    fn client(&self) -> Client<'_> {
        Client::new(self.memory.view(), self.locks.words()).expect("lock table sized for it")
    }
}

/// Counters the operation threads share.
#[derive(Default)]
struct OpCounts {
    started: AtomicU64,
    already_running: AtomicU64,
    stopped: AtomicU64,
    already_stopped: AtomicU64,
    refused: AtomicU64,
    attached: AtomicU64,
    detached: AtomicU64,
    guards: AtomicU64,
    slowest_shutdown_ns: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Runs the stress as configured and reports; never panics on a server bug (it reports it).
pub fn run_with(config: &StressConfig) -> StressReport {
    let began = Instant::now();
    let server = RpcServer::new(ServerConfig {
        name: "stress".into(),
        ..ServerConfig::default()
    });
    let traffic = ClientMailbox::new(CLIENTS as u32, 1);
    server.attach(Box::new(traffic.memory.clone()), AttachOptions::default());
    let counts = OpCounts::default();
    let ops_done = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let answered = AtomicU64::new(0);
    let unexpected = std::sync::Mutex::new(Vec::new());
    let note = |what: String| {
        let mut list = unexpected.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < 8 {
            list.push(what);
        }
    };
    if let Err(error) = server.start() {
        note(format!("first start failed: {error}"));
    }

    thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (server, traffic, ops_done) = (&server, &traffic, &ops_done);
                let (sent, answered) = (&sent, &answered);
                s.spawn(move || {
                    client_loop(c as u64, server, traffic, ops_done, config, sent, answered)
                })
            })
            .collect();
        let op_threads: Vec<_> = (0..config.threads)
            .map(|t| {
                let (server, counts, note) = (&server, &counts, &note);
                let seed = config.seed ^ (t as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F);
                s.spawn(move || op_loop(server, SplitMix64::new(seed), config.ops, counts, note))
            })
            .collect();
        for handle in op_threads {
            if handle.join().is_err() {
                note("an operation thread panicked".into());
            }
        }
        ops_done.store(true, Ordering::Relaxed);
        // Whatever the last operation was, serve the clients' remaining requests.
        if let Err(error) = server.start() {
            note(format!("final start failed: {error}"));
        }
        for handle in clients {
            if handle.join().is_err() {
                note("a client thread panicked".into());
            }
        }
    });

    match server.shutdown_with(ShutdownPolicy::Force) {
        Ok(_) => {}
        Err(error) => note(format!("final shutdown failed: {error}")),
    }
    let stats = server.stats();
    let (sent, answered) = (sent.into_inner(), answered.into_inner());
    let load = |c: AtomicU64| c.into_inner();
    StressReport {
        seed: config.seed,
        threads: config.threads,
        ops: config.ops,
        cycles: stats.workers_started,
        max_workers: stats.max_live_workers,
        leaked_workers: stats.live_workers,
        sent,
        answered,
        unanswered: sent - answered,
        started: load(counts.started),
        already_running: load(counts.already_running),
        stopped: load(counts.stopped),
        already_stopped: load(counts.already_stopped),
        refused: load(counts.refused),
        attached: load(counts.attached),
        detached: load(counts.detached),
        guards: load(counts.guards),
        slowest_shutdown_ms: load(counts.slowest_shutdown_ns) as f64 / 1e6,
        unexpected: unexpected.into_inner().unwrap_or_else(|e| e.into_inner()),
        seconds: began.elapsed().as_secs_f64(),
    }
}

/// A client: batches of 1..=16 round trips, each batch under a user guard, until the
/// operations are done and it has made at least `min_requests`. Stops at its first failure
/// (that request counts as unanswered).
fn client_loop(
    id: u64,
    server: &RpcServer,
    traffic: &ClientMailbox,
    ops_done: &AtomicBool,
    config: &StressConfig,
    sent: &AtomicU64,
    answered: &AtomicU64,
) {
    let mut rng = SplitMix64::new(config.seed ^ 0xC1_1E47 ^ id);
    let mut made = 0u64;
    while made < config.min_requests || !ops_done.load(Ordering::Relaxed) {
        let _guard = server.user();
        for _ in 0..=rng.below(16) {
            let x = rng.next_u64() >> 1;
            sent.fetch_add(1, Ordering::Relaxed);
            made += 1;
            let wait = Deadline::after(config.client_timeout);
            let client = traffic.client().with_wait(&wait);
            let mut reply = None;
            let result = client.open(Opcode::TEST_INCREMENT, 1).and_then(|mut port| {
                port.send_and_recv(|_, p| p.set_word(0, x), |_, p| reply = Some(p.word(0)))
            });
            match (result, reply) {
                (Ok(()), Some(y)) if y == x + 1 => {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                _ => return,
            }
        }
        drop(_guard);
        // Traffic, not a flood: on a 2-core machine two clients spinning flat out would starve
        // the operation threads (and the worker) of the CPU the stress is about.
        thread::sleep(Duration::from_micros(50 + rng.below(200)));
    }
}

/// One operation thread's state: its mailboxes and the guard it holds.
struct OpThread<'s> {
    server: &'s RpcServer,
    own: Vec<(MailboxId, ClientMailbox)>,
    guard: Option<(UserGuard, u64)>,
}

fn op_loop(
    server: &RpcServer,
    mut rng: SplitMix64,
    ops: usize,
    counts: &OpCounts,
    note: &(dyn Fn(String) + Sync),
) {
    let mut me = OpThread {
        server,
        own: Vec::new(),
        guard: None,
    };
    for _ in 0..ops {
        // A held guard lasts a few operations.
        if let Some((_, left)) = &mut me.guard {
            *left = left.saturating_sub(1);
            if *left == 0 {
                me.guard = None;
            }
        }
        match rng.below(100) {
            0..25 => match server.start() {
                Ok(Started::Started) => bump(&counts.started),
                Ok(Started::AlreadyRunning) => bump(&counts.already_running),
                Err(error) => note(format!("start: {error}")),
            },
            25..45 => {
                let policy = match rng.below(3) {
                    0 => ShutdownPolicy::Refuse,
                    1 => ShutdownPolicy::Force,
                    _ => ShutdownPolicy::Wait(Duration::from_millis(1)),
                };
                let began = Instant::now();
                let result = server.shutdown_with(policy);
                let took = began.elapsed().as_nanos() as u64;
                counts
                    .slowest_shutdown_ns
                    .fetch_max(took, Ordering::Relaxed);
                match result {
                    Ok(Stopped::Stopped) => bump(&counts.stopped),
                    Ok(Stopped::AlreadyStopped) => bump(&counts.already_stopped),
                    Err(ServerError::LiveUsers(_)) if policy != ShutdownPolicy::Force => {
                        bump(&counts.refused)
                    }
                    Err(error) => note(format!("shutdown {policy:?}: {error}")),
                }
            }
            45..65 => {
                if me.own.len() >= MAX_OWN_MAILBOXES {
                    me.detach_one(0, counts, note);
                }
                me.attach(&mut rng, counts);
            }
            65..80 => {
                if !me.own.is_empty() {
                    let at = rng.below(me.own.len() as u64) as usize;
                    me.detach_one(at, counts, note);
                }
            }
            _ => {
                let guard = match me.own.first() {
                    Some((id, _)) if rng.below(2) == 0 => server.user_for(*id),
                    _ => server.user(),
                };
                me.guard = Some((guard, 1 + rng.below(4)));
                bump(&counts.guards);
            }
        }
    }
    me.guard = None;
    while !me.own.is_empty() {
        me.detach_one(0, counts, note);
    }
}

impl OpThread<'_> {
    /// Attaches a small mailbox and posts one request in it, so the worker has something to
    /// serve there (and `detach` may meet it mid-pass). Nobody waits for the reply.
    fn attach(&mut self, rng: &mut SplitMix64, counts: &OpCounts) {
        let ports = 1 + rng.below(4) as u32;
        let lanes = [1, 32][rng.below(2) as usize];
        let mailbox = ClientMailbox::new(ports, lanes);
        let id = self
            .server
            .attach(Box::new(mailbox.memory.clone()), AttachOptions::default());
        if let Ok(Some(mut port)) = mailbox.client().try_open_at(0, Opcode::TEST_INCREMENT, 1) {
            // The port is owned by us when opened, so this send does not wait.
            let _ = port.send(|_, p| p.set_word(0, 1));
        }
        self.own.push((id, mailbox));
        bump(&counts.attached);
    }

    fn detach_one(&mut self, at: usize, counts: &OpCounts, note: &(dyn Fn(String) + Sync)) {
        let (id, mailbox) = self.own.remove(at);
        match self.server.detach(id) {
            Ok(()) => bump(&counts.detached),
            Err(error) => note(format!("detach {id:?}: {error}")),
        }
        drop(mailbox); // The memory may go now: the worker no longer holds it.
    }
}
