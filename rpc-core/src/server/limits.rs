//! Every bound the server keeps on what a device can make the host hold or do
//! ([`Limits`], part of [`crate::ServerConfig`]), the one budget of memory every device shares
//! ([`MemoryBudget`]), the policies of the standard services (what EXIT, the file opcodes and
//! SYSTEM may do: [`ServicesConfig`]), and the rate limit on log lines a device causes
//! ([`LogLimit`]).
//!
//! Over a limit the device gets the error value of the C function (or, for a stream claim,
//! the exchange ends at once: see [`crate::services`]), the server logs one line (rate-limited)
//! and counts it, and nothing is held beyond the bound. `docs/reliability.md` lists the
//! limits with the attacks they answer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

// std's `Arc` (loom's cannot be a method's receiver); the counter is the sync shim's.
use std::sync::Arc;

use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// What EXIT and ABORT do once their script is complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExitPolicy {
    /// LLVM's behaviour: flush the standard streams, then end the host process
    /// (`std::process::exit(status)` or `std::process::abort()`).
    #[default]
    Process,
    /// Record the exit per mailbox, for the launcher to collect with `Services::take_exit`.
    Record,
}

/// Which paths OPEN_FILE, REMOVE and RENAME may touch (the machinery is in
/// `services/files.rs`).
///
/// Whatever the policy, the server never opens anything in `/proc`, `/sys` or `/dev` (but
/// `/dev/null`), anything on the kernel's pseudo file systems, anything but a regular file
/// (no directory, FIFO, socket or device), nor a protected file (`Services::protect_file`),
/// nor, for writing, a file mapped into the process (its program, libraries, a mailbox file),
/// and never removes or renames in those places or a protected file: `/proc/self/mem` alone
/// would hand the device the whole host process. These are checked on the descriptor actually
/// opened (its file system, device and real path), not only on the path as written. Opening
/// never blocks on a FIFO and never truncates a file that is then refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FilePolicy {
    /// None: OPEN_FILE answers 0, REMOVE and RENAME -1 (refusals).
    Deny,
    /// Only paths beneath this directory: a relative path resolves from it, an absolute path
    /// must lie inside it (its real, canonical path or the path as given here). Resolved by the
    /// kernel (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, so no `..`, symbolic
    /// link or rename racing the request leads outside); where `openat2` is missing or
    /// filtered, one component at a time with `O_NOFOLLOW`, refusing every `..` and symbolic
    /// link. What a server facing an untrusted device should use (`rpc-serve`'s default is its
    /// working directory).
    Sandbox(PathBuf),
    /// Any path the host process may use, minus the never-list above. The default for an
    /// embedding runtime: its kernel is part of the program, and behaves like a CPU program
    /// with the user's own rights would.
    #[default]
    Allow,
}

/// The policies of the standard services; part of [`ServerConfig`](crate::server::ServerConfig),
/// changeable later through the server's `Services`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicesConfig {
    /// EXIT and ABORT. Default: end the process, as LLVM does.
    pub exit: ExitPolicy,
    /// OPEN_FILE, REMOVE, RENAME. Default: [`FilePolicy::Allow`] (minus what is never
    /// touched).
    pub files: FilePolicy,
    /// Whether SYSTEM runs commands. Default: no (it answers -1).
    pub allow_system: bool,
}

impl Default for ServicesConfig {
    fn default() -> Self {
        ServicesConfig {
            exit: ExitPolicy::Process,
            files: FilePolicy::Allow,
            allow_system: false,
        }
    }
}

/// The bounds of one server. Per request: what one request of one port may make the server
/// hold at once; per mailbox: what the kernels of one mailbox may hold together; per server:
/// what every device together may make it hold at once (`held_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes one lane may send in one stream (`send_n`, PROTOCOL section 5). Default 64 MiB.
    pub stream_bytes: u64,
    /// Bytes one request's streams may carry, every lane and stream together. Default 64 MiB.
    pub request_bytes: u64,
    /// Bytes of `%s` strings one printf request may make the server fetch, every lane together
    /// (a pointer printed twice is fetched once). A lane whose strings go over it prints
    /// nothing and gets -1. Default 4 MiB.
    pub printf_string_bytes: u64,
    /// Bytes one READ_FROM_STREAM or READ_FGETS request reads, every lane together: a larger
    /// read is served in part, with the short count a read of a pipe may return (the program
    /// reads again for the rest). Default 1 MiB.
    pub read_bytes: u64,
    /// Files the kernels of one mailbox may hold open through OPEN_FILE. Default 64.
    pub open_files: usize,
    /// Bytes the kernels of one mailbox may hold allocated through MALLOC (MALLOC answers 0
    /// beyond). Default 16 GiB.
    pub malloc_bytes: u64,
    /// Bytes of device data the server holds at once, every port of every mailbox together:
    /// streams being received (`send_n` beyond its first packet: paths, writes, printf's formats,
    /// arguments and `%s` strings, host-call arguments) and read buffers. A stream whose
    /// claim would pass it is received and dropped, and its request refused (the C function's
    /// error value); a read is served in part (possibly 0 bytes). Default 1 GiB.
    pub held_bytes: u64,
    /// Log lines per second for requests a device got wrong (refused, unknown, malformed):
    /// beyond it lines are dropped and counted, and the next line logged says how many were.
    /// Every such request is still counted in the statistics. Default 20.
    pub device_log_lines: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            stream_bytes: 64 << 20,
            request_bytes: 64 << 20,
            printf_string_bytes: 4 << 20,
            read_bytes: 1 << 20,
            open_files: 64,
            malloc_bytes: 16 << 30,
            held_bytes: 1 << 30,
            device_log_lines: 20,
        }
    }
}

/// The bytes every device together may make the server hold at once
/// ([`Limits::held_bytes`]): exchanges take a [`Charge`] before their buffers grow, and drop
/// it with the buffers.
///
/// Memory ordering: every change is a read-modify-write of the one counter, so the charges
/// together never pass the limit, whichever threads take them. A charge succeeds with
/// `Acquire` and a release is a `Release` `fetch_sub`: a buffer is freed before its charge is
/// released, so a charge that counts on those bytes (it read the release) is ordered after
/// that free, and the buffer it lets grow never exists at the same time as the freed one.
pub(crate) struct MemoryBudget {
    limit: u64,
    held: AtomicU64,
}

impl MemoryBudget {
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(MemoryBudget {
            limit,
            held: AtomicU64::new(0),
        })
    }

    /// Bytes charged now.
    pub(crate) fn held(&self) -> u64 {
        // Relaxed: a figure to report, ordering nothing.
        self.held.load(Ordering::Relaxed)
    }

    /// A charge of `bytes`, or `None` if it would pass the limit.
    pub(crate) fn charge(self: &Arc<Self>, bytes: u64) -> Option<Charge> {
        self.take(|free| (bytes <= free).then_some(bytes))
    }

    /// A charge of as many of `bytes` as fit (possibly none).
    pub(crate) fn charge_at_most(self: &Arc<Self>, bytes: u64) -> Charge {
        self.take(|free| Some(bytes.min(free)))
            .expect("some bytes always fit")
    }

    /// Charges what `fit` grants of the bytes free now.
    fn take(self: &Arc<Self>, fit: impl Fn(u64) -> Option<u64>) -> Option<Charge> {
        let mut bytes = 0;
        // RMW: held -> held + what fits (Acquire on success: see the type's note; Relaxed on
        // failure, which only retries or gives up).
        self.held
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |held| {
                bytes = fit(self.limit.saturating_sub(held))?;
                Some(held + bytes)
            })
            .ok()?;
        Some(Charge {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes of a [`MemoryBudget`] held until this is dropped.
pub(crate) struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Charge {
    /// The bytes charged.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl core::fmt::Debug for Charge {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // RMW: held -> held - bytes (Release: see the type's note).
            self.budget.held.fetch_sub(self.bytes, Ordering::Release);
        }
    }
}

/// A per-second budget of log lines.
pub(crate) struct LogLimit {
    per_second: u32,
    window: Mutex<Window>,
}

struct Window {
    start: Option<Instant>,
    logged: u32,
    dropped: u64,
}

impl LogLimit {
    pub(crate) fn new(per_second: u32) -> Self {
        LogLimit {
            per_second,
            window: Mutex::new(Window {
                start: None,
                logged: 0,
                dropped: 0,
            }),
        }
    }

    /// Whether a line may be logged now; `Some(n)`: yes, and `n` lines were dropped before it.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut window = lock(&self.window);
        let fresh = window
            .start
            .is_none_or(|start| now.duration_since(start) >= Duration::from_secs(1));
        if fresh {
            window.start = Some(now);
            window.logged = 0;
        }
        if window.logged >= self.per_second {
            window.dropped += 1;
            return None;
        }
        window.logged += 1;
        Some(std::mem::take(&mut window.dropped))
    }
}

/// Logs a line a device caused at `warn`, within the server's budget (see
/// [`Limits::device_log_lines`]).
macro_rules! device_warn {
    ($context:expr, $($arg:tt)+) => {
        match $context.log_limit.admit() {
            Some(0) => log::warn!($($arg)+),
            Some(dropped) => log::warn!(
                "{} ({dropped} similar line(s) dropped before this one)",
                std::format_args!($($arg)+)
            ),
            None => {}
        }
    };
}
pub(crate) use device_warn;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn charges_never_pass_the_memory_budget_and_give_it_back_when_dropped() {
        let budget = MemoryBudget::new(100);
        let a = budget.charge(60).unwrap();
        assert!(budget.charge(41).is_none());
        let b = budget.charge_at_most(70);
        assert_eq!((a.bytes(), b.bytes(), budget.held()), (60, 40, 100));
        assert_eq!(budget.charge_at_most(1).bytes(), 0);
        drop(a);
        assert_eq!(budget.held(), 40);
        assert!(budget.charge(60).is_some(), "and dropped again at once");
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn the_budget_drops_and_then_reports_what_it_dropped() {
        let limit = LogLimit::new(3);
        let admitted: Vec<_> = (0..10).map(|_| limit.admit()).collect();
        assert_eq!(&admitted[..3], &[Some(0), Some(0), Some(0)]);
        assert!(admitted[3..].iter().all(Option::is_none), "{admitted:?}");
        // A new window: the first line logged reports the seven dropped ones.
        lock(&limit.window).start = Some(Instant::now() - Duration::from_secs(2));
        assert_eq!(limit.admit(), Some(7));
        assert_eq!(limit.admit(), Some(0));
    }
}
