//! Server statistics: counters the worker bumps and anyone may read while it runs.
//!
//! Each counter is listed once, in [`stats_counters!`](crate::stats_counters): its name and its
//! documentation. The list makes the server's atomics ([`Stats`]), the copy a caller gets
//! ([`StatsSnapshot`]), the order and names of `Display` and [`StatsSnapshot::to_json`], and
//! plugin-abi's conversions of its C struct `RpcStats`.
//!
//! Memory ordering: the counters are bumped `Relaxed`; they are independent tallies that order
//! no other data, and a reader only needs each value to be one the counter really had. One
//! orders what came before it: `abandoned` is counted with release once its exchange is dropped,
//! and a snapshot loads every counter with acquire (free where loads are ordered anyway, as on
//! x86), so a reader who sees an exchange counted abandoned also sees it gone: a call it left
//! queued for an I/O thread, let go after that, does not run (`io_pool::run`). (One
//! who needs a count complete, e.g. `live_workers` after a `shutdown`, gets it from what
//! ordered the events before the read: the shutdown joined the worker; a packet handler's
//! request is counted before its reply's Release, so a client that has taken the reply sees it
//! in `served`; a script's, through `RpcServer::wait_drained`.)

use std::collections::BTreeMap;
use std::fmt;
use std::format;
use std::string::String;
use std::vec::Vec;

use crate::protocol::opcode::Opcode;
use crate::server::limits::LogLimit;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// Calls the macro `$then` with the list of the server's counters (all but the per-opcode
/// `served`), each as its documentation and its name, in the order they are printed: the one
/// place a counter is listed. Every counter is a `u64` in [`StatsSnapshot`](crate::StatsSnapshot)
/// and an `AtomicU64` in the server.
///
/// For the workspace's own crates (plugin-abi makes its C struct's conversions of it, whose
/// struct literals fail to compile until its `RpcStats` has the same fields: a new counter is
/// a new plugin ABI version, see `docs/plugins.md`).
#[doc(hidden)]
#[macro_export]
macro_rules! stats_counters {
    ($then:ident) => {
        $then! {
            /// Handlers that returned an error other than a refusal (bad input, abandoned
            /// byte strings claimed above their bounds, ...).
            errors,
            /// Requests refused by policy or validation (answered with an error value).
            refused,
            /// Requests no handler accepted.
            unknown,
            /// Requests whose header lane mask had bits at or above `L` (a mask of 0 is the
            /// no-request mark of a drained port, PROTOCOL section 11: answered, not counted).
            bad_headers,
            /// Handlers that panicked.
            panics,
            /// Exchanges abandoned midway: no kernel left to answer, the client timed out, the
            /// mailbox was detached or the server shut down.
            abandoned,
            /// Scans over every attached mailbox.
            passes,
            /// Times the worker went to sleep with no users (until a user or a shutdown comes).
            sleeps,
            /// Times the worker woke from sleeping with no users.
            wakeups,
            /// Times the worker slept on a doorbell (no request open).
            doorbell_sleeps,
            /// Doorbell sleeps ended by the device ringing (not by the timeout).
            doorbell_rings,
            /// Worker threads started over the server's life.
            workers_started,
            /// Worker threads alive now (a gauge, up at the spawn and down as the worker
            /// exits): 1 while running, 0 once a shutdown returned (a worker abandoned by a
            /// handler that dropped its server counts until it has exited).
            live_workers,
            /// The most worker threads ever alive at once (1: never two).
            max_live_workers,
            /// Calls run on the I/O threads.
            blocking_calls,
            /// I/O threads a shutdown left behind, stuck in a blocking call.
            io_threads_abandoned,
            /// Bytes of device output (stdout, stderr) not written: a write failed, or the
            /// stream's reader did not take them before a shutdown or flush gave them up.
            output_lost_bytes,
        }
    };
}

/// Makes [`Stats`], [`StatsSnapshot`] and the snapshot's name/value list from the counters.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Live counters of one server.
        pub(crate) struct Stats {
            /// Served requests per opcode of the table, indexed like [`Opcode::ALL`] (an
            /// array: a request's count is one index, with its bounds known).
            known: [AtomicU64; Opcode::ALL.len()],
            /// Served requests of opcodes outside the table (user opcodes).
            other: Mutex<BTreeMap<Opcode, u64>>,
            $(pub(crate) $name: AtomicU64,)*
        }

        /// A copy of a server's counters.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            /// Requests served to completion, per opcode (including those answered with a
            /// refusal).
            pub served: BTreeMap<Opcode, u64>,
            $($(#[$doc])* pub $name: u64,)*
        }

        /// How many counters the list has.
        const COUNTERS: usize = [$(stringify!($name)),*].len();

        impl Default for Stats {
            fn default() -> Self {
                Stats {
                    known: core::array::from_fn(|_| AtomicU64::new(0)),
                    other: Mutex::new(BTreeMap::new()),
                    $($name: AtomicU64::new(0),)*
                }
            }
        }

        impl Stats {
            /// A snapshot of `served` and every counter, loaded now. Acquire: what came before
            /// a count made with release (`abandoned`: its exchange dropped, so its queued
            /// calls never run) happened before whatever the reader does next.
            fn load_counters(&self, served: BTreeMap<Opcode, u64>) -> StatsSnapshot {
                StatsSnapshot {
                    served,
                    $($name: self.$name.load(Ordering::Acquire),)*
                }
            }
        }

        impl StatsSnapshot {
            /// Every counter but `served`, by its field's name, in the order both `Display`
            /// and [`StatsSnapshot::to_json`] print them.
            fn counters(&self) -> [(&'static str, u64); COUNTERS] {
                [$((stringify!($name), self.$name),)*]
            }
        }
    };
}

stats_counters!(counters);

/// What the layer above reports into without a request at hand (a stream's drainer thread, a
/// flush at shutdown): the bytes of device output given up (`output_lost_bytes`), and the
/// devices' log budget.
#[derive(Clone)]
pub(crate) struct Reporting {
    pub(crate) stats: std::sync::Arc<Stats>,
    pub(crate) log_limit: std::sync::Arc<LogLimit>,
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    // RMW: n -> n + 1.
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    /// Counts a request of `opcode` served. Worker only: the counters of `known` have one
    /// writer at a time (one worker runs at a time, and the next starts only once the server
    /// thread's lock saw the last one stop), so each is a plain load and store, as `passes`:
    /// no read-modify-write, whose locked instruction would also wait for the request's flip
    /// to leave the store buffer (`protocol::deferred`). The line is written by the worker
    /// only; a reader's load is the only other access. Inlined (every request passes here),
    /// the map of opcodes outside the table left out of line.
    #[inline]
    pub(crate) fn served(&self, opcode: Opcode) {
        self.served_at(opcode.table_index(), opcode);
    }

    /// [`Stats::served`] with the opcode's [`Opcode::table_index`] as its caller found it
    /// (`slot`): the request's path finds it once, for the registry and for this.
    #[inline]
    pub(crate) fn served_at(&self, slot: Option<usize>, opcode: Opcode) {
        match slot {
            Some(i) => {
                let counter = &self.known[i];
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            None => self.served_other(opcode),
        }
    }

    /// [`Stats::served`] for an opcode outside the table.
    #[inline(never)]
    fn served_other(&self, opcode: Opcode) {
        *lock(&self.other).entry(opcode).or_insert(0) += 1;
    }

    /// A consistent-enough copy of every counter.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let mut served: BTreeMap<Opcode, u64> = Opcode::ALL
            .iter()
            .zip(&self.known)
            .map(|(&op, c)| (op, c.load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        served.extend(lock(&self.other).iter().map(|(&op, &n)| (op, n)));
        self.load_counters(served)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter a different value (1, 2, 3, ... in the list's order), an opcode of the
    /// table and one outside it.
    macro_rules! sample {
        ($($(#[$doc:meta])* $name:ident,)*) => {{
            let mut n = 0;
            StatsSnapshot {
                served: [(Opcode::TEST_INCREMENT, 2), (Opcode(0x7500_0007), 1)].into(),
                $($name: { n += 1; n },)*
            }
        }};
    }

    /// rpc-serve prints these two forms; scripts read them: each counter by its name, in the
    /// list's order.
    #[test]
    fn display_and_json_name_every_counter_in_order() {
        let stats: StatsSnapshot = crate::stats_counters!(sample);
        assert_eq!(
            std::format!("{stats}"),
            "served=3 errors=1 refused=2 unknown=3 bad_headers=4 panics=5 abandoned=6 passes=7 \
             sleeps=8 wakeups=9 doorbell_sleeps=10 doorbell_rings=11 workers_started=12 \
             live_workers=13 max_live_workers=14 blocking_calls=15 io_threads_abandoned=16 \
             output_lost_bytes=17\n  TEST_INCREMENT (0x63008000): 2\n  0x75000007 (class 'u', n=7): 1"
        );
        assert_eq!(
            stats.to_json(),
            r#"{"total_served":3,"served":{"TEST_INCREMENT":2,"0x75000007":1},"errors":1,"refused":2,"#
                .to_string()
                + r#""unknown":3,"bad_headers":4,"panics":5,"abandoned":6,"passes":7,"sleeps":8,"#
                + r#""wakeups":9,"doorbell_sleeps":10,"doorbell_rings":11,"workers_started":12,"#
                + r#""live_workers":13,"max_live_workers":14,"blocking_calls":15,"#
                + r#""io_threads_abandoned":16,"output_lost_bytes":17}"#
        );
    }
}
