//! Every bound the server keeps on what a device can make the host hold or do
//! ([`Limits`], part of [`crate::ServerConfig`]), the policies of the standard services (what
//! EXIT, the file opcodes and SYSTEM may do: [`ServicesConfig`]), and the rate limit on log
//! lines a device causes ([`LogLimit`]).
//!
//! Over a limit the device gets the error value of the C function (or, for a stream claim,
//! the exchange ends at once: see [`crate::services`]), the server logs one line (rate-limited)
//! and counts it, and nothing is held beyond the bound. `docs/reliability.md` lists the
//! limits with the attacks they answer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::sync::{lock, Mutex};

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
/// hold at once; per mailbox: what the kernels of one mailbox may hold together.
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
    /// Log lines per second for requests a device got wrong (refused, unknown, malformed):
    /// beyond it lines are dropped and counted, and the next line logged says how many were.
    /// Every such request is still counted in the statistics. Default 20.
    pub device_log_lines: u32,
    /// Bytes of device output one standard stream (stdout, stderr) holds for a reader that
    /// does not keep up (a pipe, FIFO or terminal nobody reads): an exchange that would write
    /// to it while it holds this much waits, suspended, until the reader takes some (a write
    /// is then taken whole, so a stream holds at most this and one request's bytes). The other
    /// ports are served meanwhile. Default 1 MiB.
    pub output_bytes: u64,
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
            device_log_lines: 20,
            output_bytes: 1 << 20,
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
