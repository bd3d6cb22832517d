//! Every bound the server keeps on what a device can make the host hold or do
//! ([`Limits`], part of [`crate::ServerConfig`]), the one budget of memory every device shares
//! ([`MemoryBudget`]), the policies of the standard services (what EXIT, the file opcodes and
//! SYSTEM may do: [`ServicesConfig`]), and the rate limit on log lines a device causes
//! ([`LogLimit`]).
//!
//! Over a limit the device gets the error value of the C function (or, for a byte string's claim,
//! the exchange ends at once: see [`crate::services`]), the server logs one line (rate-limited)
//! and counts it, and nothing is held beyond the bound. `docs/reliability.md` lists the
//! limits with the attacks they answer.

use core::fmt;
use std::path::PathBuf;
use std::string::String;
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
    /// must lie inside it (its real, canonical path or the path as given here). The directory
    /// is opened once, when the policy is set, and held by that descriptor: a rename of it (and
    /// a symbolic link put at its old path) moves nothing, requests go on in the renamed
    /// directory; one that cannot be opened then makes every file request a refusal. Resolved by the
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
    /// Bytes of one lane's byte string (one `send_n`, PROTOCOL section 5). Default 64 MiB.
    pub string_bytes: u64,
    /// Bytes one request's byte strings may carry, every lane and `send_n` together. Default
    /// 64 MiB.
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
    /// byte strings being received (`send_n` beyond its first packet: paths, writes, printf's
    /// formats, arguments and `%s` strings, host-call arguments) and read buffers. A byte string
    /// whose claim would pass it is received and dropped, and its request refused (the C function's
    /// error value); a read is served in part (possibly 0 bytes). Default 1 GiB.
    pub held_bytes: u64,
    /// Log lines per second a device may cause: refusals, unknown opcodes, bad headers, byte
    /// strings claimed above the bounds and other failed exchanges, abandoned exchanges (client
    /// timeouts among them), EXIT and ABORT under `ExitPolicy::Record`, lost device output, failed
    /// reads of stdin. Beyond it lines are dropped and counted; the next line logged says how
    /// many were, and so does a line of its own when the worker ends a stretch of serving (its
    /// users gone, or a shutdown). Every such request is still counted in the statistics. Each
    /// line is bounded in bytes too: a device's string is quoted by a prefix of 160 bytes and
    /// its length, and a line is cut at 2 KiB. Default 20.
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
            string_bytes: 64 << 20,
            request_bytes: 64 << 20,
            printf_string_bytes: 4 << 20,
            read_bytes: 1 << 20,
            open_files: 64,
            malloc_bytes: 16 << 30,
            held_bytes: 1 << 30,
            device_log_lines: 20,
            output_bytes: 1 << 20,
        }
    }
}

/// How many bytes of a device's string (a path, a command, a mode) a log line quotes: beyond,
/// the line shows this prefix and the string's length.
pub(crate) const QUOTED_BYTES: usize = 160;

/// How many bytes a device-caused log line holds at most, whatever it quotes: beyond, it is cut
/// and says how much was left out.
pub(crate) const LINE_BYTES: usize = 2048;

/// A string a device sent, for a log line or a refusal: lossy UTF-8, quoted and escaped (so it
/// cannot forge lines), and cut after [`QUOTED_BYTES`] bytes with its length, e.g.
/// `"/etc/aaaa…" (4194304 bytes)`, so a long path makes a short line.
pub(crate) fn quoted(bytes: &[u8]) -> String {
    if bytes.len() <= QUOTED_BYTES {
        return std::format!("{:?}", String::from_utf8_lossy(bytes));
    }
    let prefix = String::from_utf8_lossy(&bytes[..QUOTED_BYTES]);
    let quoted = std::format!("{:?}", std::format!("{prefix}\u{2026}"));
    std::format!("{quoted} ({} bytes)", bytes.len())
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

    /// Adds `bytes` to this charge if they fit the budget; `false`, and nothing added, if not.
    pub(crate) fn grow(&mut self, bytes: u64) -> bool {
        let Some(mut more) = self.budget.charge(bytes) else {
            return false;
        };
        // Moved into this charge: `more` drops releasing nothing.
        self.bytes += std::mem::take(&mut more.bytes);
        true
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

/// A per-second budget of the log lines devices cause, one per server. Every such line goes
/// through it ([`device_log!`]): refusals, unknown opcodes, bad headers, byte strings claimed above
/// the bounds, abandoned exchanges (client timeouts among them), EXIT and ABORT, lost device
/// output. Dropped lines are counted; the next line logged says how many, and so does
/// [`LogLimit::report_dropped`] when the worker ends a stretch of serving.
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

    /// Logs one device-caused line at `level` (for `target`, the caller's module), if the
    /// budget admits it and the logger wants it, cut to [`LINE_BYTES`]; called by
    /// [`device_log!`]. The line is formatted into a bounded buffer: nothing beyond the bound
    /// is held, however long what it quotes.
    pub(crate) fn log(&self, level: log::Level, target: &str, line: fmt::Arguments<'_>) {
        if !log::log_enabled!(target: target, level) {
            return;
        }
        let Some(dropped) = self.admit() else {
            return;
        };
        let mut text = Bounded::default();
        // Bounded's `write_str` never fails; a Display impl's error would only cut the line.
        let _ = fmt::Write::write_fmt(&mut text, line);
        let cut = match text.left_out {
            0 => String::new(),
            n => std::format!("\u{2026} ({n} more bytes left out)"),
        };
        match dropped {
            0 => log::log!(target: target, level, "{}{cut}", text.text),
            n => log::log!(
                target: target,
                level,
                "{}{cut} ({n} similar line(s) dropped before this one)",
                text.text
            ),
        }
    }

    /// Logs how many lines were dropped since the last line logged, if any were (at `warn`,
    /// outside the budget: one line per call). The worker calls it as it ends a stretch of
    /// serving, so a burst's count is told even if no later line comes.
    pub(crate) fn report_dropped(&self, name: &str) {
        let dropped = std::mem::take(&mut lock(&self.window).dropped);
        if dropped > 0 {
            log::warn!("{name}: {dropped} device-caused log line(s) dropped (over the budget)");
        }
    }
}

/// A line being formatted, kept to [`LINE_BYTES`] (cut at a character boundary); what did not
/// fit is only counted.
#[derive(Default)]
struct Bounded {
    text: String,
    left_out: usize,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = LINE_BYTES.saturating_sub(self.text.len());
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.text.push_str(&s[..take]);
        self.left_out += s.len() - take;
        Ok(())
    }
}

/// Logs a line a device caused, within the server's budget ([`Limits::device_log_lines`],
/// [`LogLimit::log`]): `device_log!(limit, level, format, args...)`, `limit` a [`LogLimit`].
macro_rules! device_log {
    ($limit:expr, $level:ident, $($arg:tt)+) => {
        $limit.log(log::Level::$level, module_path!(), std::format_args!($($arg)+))
    };
}
pub(crate) use device_log;

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
        let mut grown = budget.charge(50).unwrap();
        assert!(grown.grow(50) && !grown.grow(1));
        assert_eq!((grown.bytes(), budget.held()), (100, 100));
        drop(grown);
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

    #[test]
    fn a_device_string_is_quoted_escaped_and_cut_with_its_length() {
        assert_eq!(quoted(b"a\nb"), "\"a\\nb\"");
        let long = std::vec![b'x'; 4 << 20];
        let shown = quoted(&long);
        assert!(shown.len() < QUOTED_BYTES + 40, "{shown}");
        assert!(shown.starts_with("\"xxx"), "{shown}");
        assert!(shown.ends_with("\u{2026}\" (4194304 bytes)"), "{shown}");
        // A cut inside a character of several bytes is no panic.
        let mut wide = std::vec![b'x'; QUOTED_BYTES - 1];
        wide.extend_from_slice("\u{e9}\u{e9}".as_bytes());
        assert!(quoted(&wide).contains("bytes)"));
    }

    #[test]
    fn a_line_is_kept_to_its_bound_and_counts_what_it_left_out() {
        let mut line = Bounded::default();
        let long = "\u{e9}".repeat(LINE_BYTES);
        fmt::Write::write_fmt(&mut line, std::format_args!("ab{long}")).unwrap();
        assert!(line.text.len() <= LINE_BYTES && line.text.len() >= LINE_BYTES - 1);
        assert_eq!(line.text.len() + line.left_out, 2 + long.len());
    }

    #[test]
    fn the_dropped_count_is_told_once() {
        let limit = LogLimit::new(1);
        assert_eq!(limit.admit(), Some(0));
        assert_eq!(limit.admit(), None);
        assert_eq!(limit.admit(), None);
        limit.report_dropped("test");
        // Told: the next window's first line has nothing more to tell.
        lock(&limit.window).start = Some(Instant::now() - Duration::from_secs(2));
        assert_eq!(limit.admit(), Some(0));
    }
}
