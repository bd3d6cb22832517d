//! Server statistics: counters the worker bumps and anyone may read while it runs.
//!
//! Memory ordering: every counter is `Relaxed`; they are independent tallies that order no
//! other data, and a reader only needs each value to be one the counter really had. (One
//! who needs a count complete, e.g. `live_workers` after a `shutdown`, gets it from what
//! ordered the events before the read: the shutdown joined the worker.)

use std::collections::BTreeMap;
use std::fmt;
use std::format;
use std::string::String;
use std::vec::Vec;

use crate::protocol::opcode::Opcode;
use crate::server::limits::LogLimit;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// Live counters of one server.
pub(crate) struct Stats {
    /// Served requests per opcode of the table, indexed like [`Opcode::ALL`].
    known: Vec<AtomicU64>,
    /// Served requests of opcodes outside the table (user opcodes).
    other: Mutex<BTreeMap<Opcode, u64>>,
    pub(crate) errors: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) unknown: AtomicU64,
    pub(crate) bad_headers: AtomicU64,
    pub(crate) panics: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) passes: AtomicU64,
    pub(crate) sleeps: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) doorbell_sleeps: AtomicU64,
    pub(crate) doorbell_rings: AtomicU64,
    pub(crate) workers_started: AtomicU64,
    /// Worker threads alive now (a gauge: up at the spawn, down as the worker exits).
    pub(crate) live_workers: AtomicU64,
    pub(crate) max_live_workers: AtomicU64,
    pub(crate) blocking_calls: AtomicU64,
    pub(crate) io_threads_abandoned: AtomicU64,
    /// Shared with the layer above, which counts the device output it gives up
    /// ([`Reporting`]).
    pub(crate) output_lost_bytes: std::sync::Arc<AtomicU64>,
}

/// What the layer above reports into without a request at hand (a stream's drainer thread, a
/// flush at shutdown): the bytes of device output given up, and the devices' log budget.
#[derive(Clone)]
pub(crate) struct Reporting {
    pub(crate) output_lost_bytes: std::sync::Arc<AtomicU64>,
    pub(crate) log_limit: std::sync::Arc<LogLimit>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            known: Opcode::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            other: Mutex::new(BTreeMap::new()),
            errors: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            bad_headers: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            doorbell_sleeps: AtomicU64::new(0),
            doorbell_rings: AtomicU64::new(0),
            workers_started: AtomicU64::new(0),
            live_workers: AtomicU64::new(0),
            max_live_workers: AtomicU64::new(0),
            blocking_calls: AtomicU64::new(0),
            io_threads_abandoned: AtomicU64::new(0),
            output_lost_bytes: std::sync::Arc::new(AtomicU64::new(0)),
        }
    }
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    // RMW: n -> n + 1.
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    pub(crate) fn served(&self, opcode: Opcode) {
        match opcode.table_index() {
            Some(i) => bump(&self.known[i]),
            None => *lock(&self.other).entry(opcode).or_insert(0) += 1,
        }
    }

    /// A consistent-enough copy of every counter.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut served: BTreeMap<Opcode, u64> = Opcode::ALL
            .iter()
            .zip(&self.known)
            .map(|(&op, c)| (op, get(c)))
            .filter(|&(_, n)| n > 0)
            .collect();
        served.extend(lock(&self.other).iter().map(|(&op, &n)| (op, n)));
        StatsSnapshot {
            served,
            errors: get(&self.errors),
            refused: get(&self.refused),
            unknown: get(&self.unknown),
            bad_headers: get(&self.bad_headers),
            panics: get(&self.panics),
            abandoned: get(&self.abandoned),
            passes: get(&self.passes),
            sleeps: get(&self.sleeps),
            wakeups: get(&self.wakeups),
            doorbell_sleeps: get(&self.doorbell_sleeps),
            doorbell_rings: get(&self.doorbell_rings),
            workers_started: get(&self.workers_started),
            live_workers: get(&self.live_workers),
            max_live_workers: get(&self.max_live_workers),
            blocking_calls: get(&self.blocking_calls),
            io_threads_abandoned: get(&self.io_threads_abandoned),
            output_lost_bytes: get(&self.output_lost_bytes),
        }
    }
}

/// A copy of a server's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests served to completion, per opcode (including those answered with a refusal).
    pub served: BTreeMap<Opcode, u64>,
    /// Handlers that returned an error other than a refusal (bad input, abandoned streams, ...).
    pub errors: u64,
    /// Requests refused by policy or validation (answered with an error value).
    pub refused: u64,
    /// Requests no handler accepted.
    pub unknown: u64,
    /// Requests whose header lane mask had bits at or above `L` (a mask of 0 is the no-request
    /// mark of a drained port, PROTOCOL section 11: answered, not counted).
    pub bad_headers: u64,
    /// Handlers that panicked.
    pub panics: u64,
    /// Exchanges abandoned midway: no kernel left to answer, the client timed out, the mailbox
    /// was detached or the server shut down.
    pub abandoned: u64,
    /// Scans over every attached mailbox.
    pub passes: u64,
    /// Times the worker went to sleep with no users (until a user or a shutdown comes).
    pub sleeps: u64,
    /// Times the worker woke from sleeping with no users.
    pub wakeups: u64,
    /// Times the worker slept on a doorbell (no request open).
    pub doorbell_sleeps: u64,
    /// Doorbell sleeps ended by the device ringing (not by the timeout).
    pub doorbell_rings: u64,
    /// Worker threads started over the server's life.
    pub workers_started: u64,
    /// Worker threads alive now: 1 while running, 0 once a shutdown returned (a worker
    /// abandoned by a handler that dropped its server counts until it has exited).
    pub live_workers: u64,
    /// The most worker threads ever alive at once (1: never two).
    pub max_live_workers: u64,
    /// Calls run on the I/O threads.
    pub blocking_calls: u64,
    /// I/O threads a shutdown left behind, stuck in a blocking call.
    pub io_threads_abandoned: u64,
    /// Bytes of device output (stdout, stderr) not written: a write failed, or the stream's
    /// reader did not take them before a shutdown or flush gave them up.
    pub output_lost_bytes: u64,
}

impl StatsSnapshot {
    /// Requests served, all opcodes together.
    pub fn total_served(&self) -> u64 {
        self.served.values().sum()
    }
    /// Requests of `opcode` served.
    pub fn served_of(&self, opcode: Opcode) -> u64 {
        self.served.get(&opcode).copied().unwrap_or(0)
    }

    /// Every counter but `served`, by its field's name, in the order both `Display` and
    /// [`StatsSnapshot::to_json`] print them.
    fn counters(&self) -> [(&'static str, u64); 17] {
        [
            ("errors", self.errors),
            ("refused", self.refused),
            ("unknown", self.unknown),
            ("bad_headers", self.bad_headers),
            ("panics", self.panics),
            ("abandoned", self.abandoned),
            ("passes", self.passes),
            ("sleeps", self.sleeps),
            ("wakeups", self.wakeups),
            ("doorbell_sleeps", self.doorbell_sleeps),
            ("doorbell_rings", self.doorbell_rings),
            ("workers_started", self.workers_started),
            ("live_workers", self.live_workers),
            ("max_live_workers", self.max_live_workers),
            ("blocking_calls", self.blocking_calls),
            ("io_threads_abandoned", self.io_threads_abandoned),
            ("output_lost_bytes", self.output_lost_bytes),
        ]
    }

    /// The counters as one line of JSON: every field by its name, `total_served`, and `served`
    /// as an object keyed by opcode name (an opcode without one by its number, `"0x75000007"`).
    ///
    /// ```
    /// let stats = rpc_core::StatsSnapshot::default();
    /// assert!(stats.to_json().starts_with(r#"{"total_served":0,"served":{},"errors":0,"#));
    /// ```
    pub fn to_json(&self) -> String {
        let served: Vec<String> = self
            .served
            .iter()
            .map(|(op, n)| match op.name() {
                Some(name) => format!("\"{name}\":{n}"),
                None => format!("\"{:#010x}\":{n}", op.0),
            })
            .collect();
        let counters: Vec<String> = self
            .counters()
            .iter()
            .map(|(name, n)| format!("\"{name}\":{n}"))
            .collect();
        format!(
            "{{\"total_served\":{},\"served\":{{{}}},{}}}",
            self.total_served(),
            served.join(","),
            counters.join(",")
        )
    }
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "served={}", self.total_served())?;
        for (name, n) in self.counters() {
            write!(f, " {name}={n}")?;
        }
        for (op, n) in &self.served {
            write!(f, "\n  {op}: {n}")?;
        }
        Ok(())
    }
}
