//! `rpc-serve`: serves the standard opcodes over a mailbox in shared memory, so a client in
//! another process (in any language) can use it.
//!
//! ```text
//! rpc-serve [--file PATH [--replace] | --memfd] --gen v0|v1|v2 --ports N --lanes 1|32|64
//!           [--files DIR|deny|all] [--allow-system] [--stdout FILE] [--stderr FILE]
//!           [--client-timeout MS] [--json] [--dispatch-tests]
//! ```
//! (`--help` says the same; the command line is `clap`'s.) `--gen v0` is LLVM 18's layout,
//! whose clients number their opcodes as LLVM 18 and 19 do (0, 1, 2... in 16 bits:
//! `Numbering::Llvm19`); v1 and v2 clients use today's numbers.
//!
//! The mailbox is a memfd (`--memfd`, also what happens without `--file`), sized to the
//! layout, zeroed and sealed against shrinking and growing; rpc-serve prints `ready
//! /proc/PID/fd/N BYTES` once it serves, and a client of the same user opens that path
//! read-write and maps it. Its `ftruncate` fails (EPERM), so the pages cannot be pulled from
//! under the server. With `--file PATH` the mailbox is PATH, and rpc-serve prints `ready PATH
//! BYTES`. One rpc-serve per file: it holds an exclusive `flock` on it while it serves, and a
//! second one exits 3. A path that does not exist is created (and removed at exit if the path
//! still names it); a symbolic link at PATH is never followed (`O_NOFOLLOW`), and an existing
//! file is served only if it is an idle mailbox of the layout (its exact size, every port's
//! two words 0 or 1 and equal), as it is, and kept at exit; anything else exits 4 and is left
//! untouched, unless `--replace` says to overwrite it (kept at exit too: `mailbox.rs`). If
//! another process truncates the file, the next access would raise SIGBUS: a handler
//! (`sigbus.rs`) maps zero pages over the mailbox instead, and rpc-serve logs "the mailbox file
//! was truncated by another process", detaches the mailbox, prints its statistics and exits 1.
//!
//! Served and silent, its worker parks longer as the silence grows: at most 250 µs while a
//! client may still be speaking; once nothing was asked for a second (a client in another
//! process is invisible, so that is taken as none) an eighth of the silence, up to 250 ms. So
//! rpc-serve with no client costs well below 0.1% of a core, and the first request after a
//! silence of a second or more waits up to an eighth of it (at most 250 ms). Its main thread
//! sleeps until a signal, which stops rpc-serve at once. A client's EXIT or ABORT is logged (at
//! `info`, shown by default) when it comes.
//!
//! rpc-serve serves until SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 or SIGALRM, each of which
//! stops it the same way, within 2 s whatever a writer is stuck on: the server's shutdown and
//! the flush of the device's output run on a thread of their own for at most 1.5 s (past that
//! rpc-serve gives up on them), the mailbox file it created is removed, and its statistics
//! (`stopped: ...`, or with `--json` one line of JSON, `StatsSnapshot::to_json`) go to stdout,
//! or to stderr when stdout is broken, each written without blocking past the bound
//! (`output.rs`). Exit statuses: 0 clean; 1 could not start, or the mailbox file was
//! truncated; 2 usage (a message naming the accepted values or range); 3 the `--file` is
//! another rpc-serve's; 4 the `--file` is refused (left untouched); 5 stopped, but output was
//! lost (a write of the device's output, the ready line or the statistics failed: a broken
//! pipe, a full disk); 6 the shutdown gave up at its bound. `--client-timeout MS` (default
//! 10000, 0 = never, at most a day) abandons an exchange whose client stopped answering
//! mid-script (e.g. a killed process), so the other ports keep being served and the port is
//! recovered. A client's EXIT/ABORT is recorded and logged, never ends rpc-serve.
//!
//! The device's stdout and stderr are rpc-serve's own unless `--stdout FILE` / `--stderr FILE`
//! send them to files. Without `--stderr`, the device's stderr shares rpc-serve's stderr with
//! rpc-serve's log, so a client can write lines that look like log lines: give `--stderr` when
//! the log matters. SIGXFSZ is ignored, so a write past `RLIMIT_FSIZE` (`ulimit -f`) fails with
//! EFBIG and the device gets an error reply (0 bytes written, "device output lost" in the log)
//! instead of the signal ending rpc-serve. (An ignored signal stays ignored across `exec`, so
//! SYSTEM's commands start with SIGXFSZ ignored too.)
//!
//! `--files` is the file policy of OPEN_FILE, REMOVE and RENAME: a directory (which must
//! exist) every path resolves beneath, `deny` (none), or `all` (any path rpc-serve's user may
//! use); default: rpc-serve's working directory as the sandbox (`./deny` names a directory
//! called `deny`). Whatever the policy, `/proc`, `/sys`, `/dev` (but `/dev/null`), non-regular
//! files, and rpc-serve's own files (the mailbox, its stdout and stderr when they are regular
//! files, so its log, and the `--stdout`/`--stderr` files), by identity wherever they lie, are
//! never opened, removed or renamed (`FilePolicy`, `Services::protect_file`).
//! SYSTEM runs commands only with `--allow-system`. MALLOC allocates from rpc-serve's own
//! memory (2 MiB aligned above 256 KiB, as LLVM's GPU allocator needs, smaller requests aligned
//! to their size from shared slabs; at most 1 GiB of address space at once), FREE frees it, and
//! what the client did not free is freed at exit.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::TypedValueParser;
use clap::{CommandFactory, Parser};
use rpc_core::plugin::RegionMailbox;
use rpc_core::protocol::{Dialect, Generation, Layout, Numbering};
use rpc_core::{
    AttachOptions, ExitPolicy, FilePolicy, Limits, RpcServer, ServerConfig, ServicesConfig,
};

mod mailbox;
mod output;
mod sigbus;

use mailbox::{Backing, Mapped, Refusal};
use output::write_until;
use plugin_host::HostAllocator;

/// The most bytes MALLOC hands the client out of rpc-serve's memory at once.
const MALLOC_BYTES: u64 = 1 << 30;

/// How long a wait for a client's next packet lasts before the exchange is abandoned.
const DEFAULT_CLIENT_TIMEOUT_MS: u64 = 10_000;
/// The longest `--client-timeout`: a day.
const MAX_CLIENT_TIMEOUT_MS: u64 = 86_400_000;

/// The longest park of the worker once nothing was asked for a second (`absent_park`): a
/// client in another process is invisible, so a long silence is taken as no client. The parks
/// grow to this as an eighth of the silence, so the first request after a silence waits at
/// most an eighth of it longer, and never more than this. A wake-up costs 25-150 µs of CPU on
/// this project's VMs (nested: `docs/performance.md`), so the worker's 4-8 wake-ups a second
/// (the only ones: the main thread sleeps until a signal) keep an unused rpc-serve below 0.1%
/// of a core.
const ABSENT_PARK: Duration = Duration::from_millis(250);

/// The log filter without `RUST_LOG`: warnings, and the core's line for a client's EXIT or
/// ABORT (`info`), which an in-process runtime collects instead.
const DEFAULT_LOG: &str = "warn,rpc_core::services::process=info";

/// The signals that stop rpc-serve, each the same clean way.
const STOP_SIGNALS: [i32; 6] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGUSR1,
    signal_hook::consts::SIGUSR2,
    signal_hook::consts::SIGALRM,
];

/// rpc-serve's bound: from the stop signal to the exit, whatever a writer is stuck on. Within
/// it, in turn: the server's shutdown and the flush of the device's output, on a thread of their
/// own (a write to a reader that never reads holds them), until [`STOP_BOUND`]; the statistics
/// on stdout until [`STATS_BOUND`]; rpc-serve's messages on stderr (the statistics too, if
/// stdout refused them) until [`SAY_BOUND`]; then `_exit`.
const STOP_BOUND: Duration = Duration::from_millis(1500);
/// See [`STOP_BOUND`].
const STATS_BOUND: Duration = Duration::from_millis(1700);
/// See [`STOP_BOUND`]; what is left of the 2 s is for the exit itself.
const SAY_BOUND: Duration = Duration::from_millis(1900);

/// rpc-serve's exit statuses (also in `--help`, README.md and docs/reliability.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Stopped by a signal; everything flushed, the statistics printed.
    Clean = 0,
    /// Could not start (a system call failed), or the mailbox file was truncated under it.
    Failed = 1,
    /// A usage error (clap's status).
    #[allow(dead_code)] // clap exits with it; named here for the table.
    Usage = 2,
    /// `--file`: another rpc-serve serves that mailbox (holds its lock).
    Busy = 3,
    /// `--file`: a symbolic link, not a regular file, or an existing file that is not an idle
    /// mailbox of the layout (without `--replace`); left untouched.
    NotAMailbox = 4,
    /// Stopped cleanly, but some of the device's output or rpc-serve's own (the ready line,
    /// the statistics) could not be written: a broken pipe, a full disk.
    OutputLost = 5,
    /// The shutdown did not end within its bound (a writer stuck on a reader that never
    /// reads): rpc-serve exited anyway; output may be lost.
    GaveUp = 6,
}

const EXIT_STATUSES: &str = "\
Stops on SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 or SIGALRM, within 2 s whatever a writer is \
stuck on, printing its statistics.

Exit status:
  0  stopped by a signal; output flushed, statistics printed
  1  could not start, or the mailbox file was truncated under it
  2  usage error
  3  --file: another rpc-serve serves that mailbox (holds its lock)
  4  --file: a symbolic link, not a regular file, or not an idle mailbox of this layout
     (without --replace); the file is left untouched
  5  stopped, but some output (the device's, the ready line, the statistics) was lost
  6  the shutdown did not end within its bound; exited anyway";

/// Serves the standard opcodes over a mailbox in shared memory, for clients in other
/// processes.
#[derive(Parser, Debug)]
#[command(name = "rpc-serve", after_help = EXIT_STATUSES)]
struct Cli {
    /// The mailbox is the file PATH: created (and removed at exit), or an existing idle
    /// mailbox of this layout (kept); locked against a second rpc-serve
    #[arg(long, value_name = "PATH", conflicts_with = "memfd")]
    file: Option<PathBuf>,
    /// With --file: overwrite an existing file that is not an idle mailbox of this layout
    /// (kept at exit)
    #[arg(long, requires = "file")]
    replace: bool,
    /// The mailbox is a sealed memfd, printed as /proc/PID/fd/N (the default)
    #[arg(long)]
    memfd: bool,
    /// The layout generation: v0 (LLVM 18), v1 (LLVM 19-22), v2 (LLVM 23 on)
    #[arg(
        long = "gen",
        value_name = "GEN",
        value_parser = clap::builder::PossibleValuesParser::new(["v0", "v1", "v2"])
            .map(|g| g.parse::<Generation>().expect("one of the possible values"))
    )]
    generation: Generation,
    /// The port count N: 1..=512 (v0), 1..=4096 (v1), 1..=16384 (v2)
    #[arg(long, value_name = "N", value_parser = ranged(1, 16384))]
    ports: u64,
    /// The lane size L: 1 (a CPU client), 32 or 64
    #[arg(
        long,
        value_name = "L",
        value_parser = clap::builder::PossibleValuesParser::new(["1", "32", "64"])
            .map(|l| l.parse::<u32>().expect("one of the possible values"))
    )]
    lanes: u32,
    /// File policy of OPEN_FILE, REMOVE, RENAME: a directory to sandbox them in, deny or all
    /// [default: the working directory]
    #[arg(long, value_name = "DIR|deny|all", value_parser = file_policy)]
    files: Option<FilePolicy>,
    /// Run SYSTEM's commands
    #[arg(long)]
    allow_system: bool,
    /// Send the device's stdout to FILE
    #[arg(long, value_name = "FILE")]
    stdout: Option<PathBuf>,
    /// Send the device's stderr to FILE (else it shares rpc-serve's stderr with its log)
    #[arg(long, value_name = "FILE")]
    stderr: Option<PathBuf>,
    /// Abandon an exchange whose client has not answered for MS milliseconds (0 = never):
    /// 0..=86400000
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_CLIENT_TIMEOUT_MS,
          value_parser = ranged(0, MAX_CLIENT_TIMEOUT_MS))]
    client_timeout: u64,
    /// The memory every client together may make rpc-serve hold at once, in MiB: streams
    /// being received and read buffers (beyond it a stream is refused, a read served in part):
    /// 1..=1048576
    #[arg(long, value_name = "MIB", default_value_t = Limits::default().held_bytes >> 20,
          value_parser = ranged(1, 1 << 20))]
    held_mib: u64,
    /// Print the statistics at exit as one line of JSON
    #[arg(long)]
    json: bool,
    /// Also serve the typed test functions of LLVM's rpc::dispatch (class 'd', 0x64000000 + n:
    /// add, fma3, length, negate, sum, pair_sum, ping, fill; PROTOCOL section 12)
    #[arg(long)]
    dispatch_tests: bool,
}

/// A whole number in `min..=max`, whose error names the range (also for numbers past 2^64).
fn ranged(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |text| {
        text.parse::<u64>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| format!("expected a whole number in {min}..={max}"))
    }
}

/// `--files`: `deny`, `all`, or a directory that exists.
fn file_policy(value: &str) -> Result<FilePolicy, String> {
    match value {
        "deny" => Ok(FilePolicy::Deny),
        "all" => Ok(FilePolicy::Allow),
        _ => {
            let dir = PathBuf::from(value);
            if dir.is_dir() {
                Ok(FilePolicy::Sandbox(dir))
            } else {
                Err(format!("{} is not a directory", dir.display()))
            }
        }
    }
}

struct Args {
    mailbox: Backing,
    layout: Layout,
    files: FilePolicy,
    allow_system: bool,
    stdout: Option<PathBuf>,
    stderr: Option<PathBuf>,
    client_timeout: Option<Duration>,
    /// `Limits::held_bytes`.
    held_bytes: u64,
    /// The statistics at exit as JSON.
    json: bool,
    /// Serve the typed test functions.
    dispatch_tests: bool,
}

impl Cli {
    /// The checked arguments, or a usage error (exit 2).
    fn args(self) -> Result<Args, clap::Error> {
        let usage = |message: String| {
            Cli::command().error(clap::error::ErrorKind::ValueValidation, message)
        };
        let ports = u32::try_from(self.ports).expect("within the parser's range");
        let layout = Layout::new(self.generation, ports, self.lanes)
            .map_err(|e| usage(format!("--ports: {e}")))?;
        let mailbox = match self.file {
            Some(path) => Backing::File {
                path,
                replace: self.replace,
            },
            None => Backing::Memfd,
        };
        let files = match self.files {
            Some(files) => files,
            None => FilePolicy::Sandbox(
                std::env::current_dir()
                    .map_err(|e| usage(format!("the working directory: {e}")))?,
            ),
        };
        Ok(Args {
            mailbox,
            layout,
            files,
            allow_system: self.allow_system,
            stdout: self.stdout,
            stderr: self.stderr,
            // Clients in other processes hold no launch guard we could see end: without a
            // timeout, a client killed mid-exchange would hold the worker forever.
            client_timeout: (self.client_timeout > 0)
                .then(|| Duration::from_millis(self.client_timeout)),
            held_bytes: self.held_mib << 20,
            json: self.json,
            dispatch_tests: self.dispatch_tests,
        })
    }
}

/// Why rpc-serve stops before serving, or could not stop cleanly: its status and message.
struct Failure(Status, String);

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Busy(message) => Failure(Status::Busy, message),
            Refusal::NotAMailbox(message) => Failure(Status::NotAMailbox, message),
            Refusal::Failed(message) => Failure(Status::Failed, message),
        }
    }
}

fn failed(message: String) -> Failure {
    Failure(Status::Failed, message)
}

/// Keeps the device from opening, removing or renaming the regular file behind `fd` (one of
/// rpc-serve's own: its mailbox, log, output files), wherever it lies and however it is
/// named: by `(st_dev, st_ino)`, found through `/proc/self/fd/N`, the descriptor's own file.
/// Anything else (a pipe, a terminal, `/dev/null`) the file policy refuses or allows already.
fn protect(server: &RpcServer, fd: std::os::fd::RawFd, what: &str) -> Result<(), Failure> {
    let path = PathBuf::from(format!("/proc/self/fd/{fd}"));
    let protect = || -> std::io::Result<()> {
        if std::fs::metadata(&path)?.file_type().is_file() {
            server.context().services().protect_file(&path)?;
        }
        Ok(())
    };
    protect().map_err(|e| failed(format!("protecting {what} from the device: {e}")))
}

/// Creates `path` for the device's output, protected from the device, and recording losses.
fn output_file(server: &RpcServer, path: &Path) -> Result<std::fs::File, Failure> {
    let file =
        std::fs::File::create(path).map_err(|e| failed(format!("{}: {e}", path.display())))?;
    protect(server, file.as_raw_fd(), &path.display().to_string())?;
    Ok(file)
}

fn serve(args: Args) -> Result<Status, Failure> {
    // The main thread sleeps reading `wake` until a stop signal or a mended SIGBUS writes to
    // `waker`: it costs no wake-ups while rpc-serve serves or idles. Each sets its flag before
    // it writes (signal-hook runs a signal's actions in the order they were registered), and
    // the loop below reads the flags after each wake-up, so none is missed.
    let (mut wake, waker) =
        UnixStream::pair().map_err(|e| failed(format!("wake-up socket: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in STOP_SIGNALS {
        let waker = waker
            .try_clone()
            .map_err(|e| failed(format!("wake-up socket: {e}")))?;
        signal_hook::flag::register(signal, stop.clone())
            .and_then(|_| signal_hook::low_level::pipe::register(signal, waker))
            .map_err(|e| failed(format!("signal handler: {e}")))?;
    }
    // Before the mailbox is mapped, so before it can fault.
    sigbus::wake_on_fault(waker);
    let size = args.layout.total_size();
    let config = ServerConfig {
        name: "rpc-serve".into(),
        client_timeout: args.client_timeout,
        absent_park: Some(ABSENT_PARK),
        limits: Limits {
            malloc_bytes: MALLOC_BYTES,
            held_bytes: args.held_bytes,
            ..Limits::default()
        },
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            files: args.files,
            allow_system: args.allow_system,
        },
        ..ServerConfig::default()
    };
    let server = Arc::new(RpcServer::new(config));
    if args.dispatch_tests {
        rpc_core::services::dispatch_tests::register(&server)
            .map_err(|e| Failure(Status::Failed, format!("--dispatch-tests: {e}")))?;
    }
    let services = server.context().services();
    // MALLOC from rpc-serve's own memory (what LLVM's loader gives a CPU client), freed at exit.
    services.set_allocator(Arc::new(HostAllocator::new()));
    // No request may open (and truncate), remove or rename our own log and output (a forged
    // log line, a truncated statistics file), nor the mailbox under us (below).
    protect(&server, libc::STDOUT_FILENO, "rpc-serve's stdout")?;
    protect(&server, libc::STDERR_FILENO, "rpc-serve's stderr (its log)")?;
    // The device's output goes to descriptors the server writes without blocking (a reader
    // that stops reading holds only the exchanges writing to it); by default rpc-serve's own
    // stdout and stderr. A write of it that fails, or bytes given up at the stop, count in
    // `output_lost_bytes`: exit status 5.
    if let Some(path) = &args.stdout {
        services.set_stdout_fd(output_file(&server, path)?.into());
    }
    if let Some(path) = &args.stderr {
        services.set_stderr_fd(output_file(&server, path)?.into());
    }
    // Set when rpc-serve's own ready line or statistics could not be written: exit status 5.
    // Relaxed: a flag that orders nothing.
    let lost = AtomicBool::new(false);
    // The mailbox last: from here on, a failure removes the file it created.
    let opened = Mapped::create(&args.mailbox, args.layout)?;
    let (path, created) = (opened.path.clone(), opened.created);
    let remove_created = |stopping: Instant| {
        if let (Backing::File { path, .. }, Some(created)) = (&args.mailbox, created) {
            // We created it for our clients; with us gone it serves nobody.
            if let Err(why) = mailbox::remove_created(path, created) {
                say(&format!("{}: not removed: {why}", path.display()), stopping);
            }
        }
    };
    // The file's lock lives with its open file: this second descriptor of it holds the lock
    // until the process exits, after the file is removed, even when a fault detached (and
    // closed) the mailbox before.
    let mut _lock = None;
    let start = || -> Result<_, Failure> {
        let file = opened.region.file();
        _lock = Some(
            file.try_clone()
                .map_err(|e| failed(format!("{}: {e}", path.display())))?,
        );
        protect(&server, file.as_raw_fd(), "the mailbox")?;
        // The only v0 clients are LLVM 18's, which number opcodes 0, 1, 2... in 16 bits.
        let numbering = match args.layout.generation() {
            Generation::V0 => Numbering::Llvm19,
            Generation::V1 | Generation::V2 => Numbering::Current,
        };
        let region = RegionMailbox::new(Box::new(opened.region), args.layout)
            .map_err(|e| failed(e.to_string()))?;
        let mailbox = server.attach(
            Box::new(region),
            AttachOptions::default().clients(numbering, Dialect::HostC),
        );
        let _ = server.start().map_err(|e| failed(e.to_string()))?;
        Ok(mailbox)
    };
    let mailbox = start().inspect_err(|_| remove_created(Instant::now()))?;
    // Clients in other processes are no kernel launches we can see: one user for our whole life.
    let user = server.user();
    let ready = writeln!(std::io::stdout(), "ready {} {size}", path.display())
        .and_then(|()| std::io::stdout().flush());
    if let Err(error) = ready {
        log::error!("the ready line was not written: {error}");
        lost.store(true, Ordering::Relaxed);
    }
    let mut faulted = false;
    while !stop.load(Ordering::Relaxed) {
        if sigbus::faulted() {
            match &args.mailbox {
                Backing::File { path, .. } => log::error!(
                    "{}: the mailbox file was truncated by another process; \
                     detaching the mailbox and exiting",
                    path.display()
                ),
                Backing::Memfd => log::error!(
                    "{}: the mailbox memory faulted (SIGBUS); detaching the mailbox and exiting",
                    path.display()
                ),
            }
            faulted = true;
            break;
        }
        // Any number of wake-up bytes at once; an error other than EINTR means the socket is
        // broken and no signal could wake us: stop rather than sleep for ever.
        match wake.read(&mut [0; 64]) {
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            outcome => {
                log::error!("wake-up socket: {outcome:?}; stopping");
                break;
            }
        }
    }
    let stopping = Instant::now();
    drop(user);
    // The shutdown (and, after a fault, the detach) joins the worker and waits for the I/O
    // threads, and the flush writes what the device's output still holds: any of them may wait
    // on a reader that never reads. They run on a thread of their own, waited for until
    // STOP_BOUND; past it rpc-serve exits without them.
    let (done, stopped) = std::sync::mpsc::channel();
    let stopper = server.clone();
    std::thread::Builder::new()
        .name("rpc-serve-stop".into())
        .spawn(move || {
            let result = (|| {
                if faulted {
                    // The worker now reads zero pages, an idle mailbox; detaching lets go of
                    // it (and unmaps it) before we report.
                    stopper.detach(mailbox)?;
                }
                stopper.shutdown()
            })();
            stopper.context().services().flush_std();
            let _ = done.send(result.map(|_| ()).map_err(|e| e.to_string()));
        })
        .map_err(|e| failed(format!("the stopping thread: {e}")))?;
    let stopped = stopped.recv_timeout(STOP_BOUND.saturating_sub(stopping.elapsed()));
    remove_created(stopping);
    let stats = server.stats();
    let output_lost = stats.output_lost_bytes;
    let stats = if args.json {
        format!("{}\n", stats.to_json())
    } else {
        format!("stopped: {stats}\n")
    };
    let deadline = stopping + STATS_BOUND;
    if let Err(error) = write_until(libc::STDOUT_FILENO, stats.as_bytes(), deadline) {
        // The statistics where they can still go: rpc-serve's stderr.
        say(
            &format!("statistics not written to stdout ({error}): {stats}"),
            stopping,
        );
        lost.store(true, Ordering::Relaxed);
    }
    match stopped {
        Err(_) => {
            say(
                &format!(
                    "the shutdown did not end within {} ms (a write or call that does not \
                     return); exiting without it",
                    STOP_BOUND.as_millis()
                ),
                stopping,
            );
            Ok(Status::GaveUp)
        }
        Ok(Err(message)) => Err(failed(message)),
        Ok(Ok(())) if faulted => Ok(Status::Failed),
        Ok(Ok(())) if lost.load(Ordering::Relaxed) || output_lost > 0 => Ok(Status::OutputLost),
        Ok(Ok(())) => Ok(Status::Clean),
    }
}

/// Writes `rpc-serve: MESSAGE` to stderr within [`SAY_BOUND`] of `stopping`, or not at all.
/// After the stop signal, never through the logger: its stderr lock may be held by a worker
/// stuck writing the device's stderr.
fn say(message: &str, stopping: Instant) {
    let line = format!("rpc-serve: {}\n", message.trim_end());
    let _ = write_until(libc::STDERR_FILENO, line.as_bytes(), stopping + SAY_BOUND);
}

/// Ends the process with `status`. Not through std's exit after a shutdown that gave up: that
/// flushes std's stdout, which a stuck worker may hold or whose pipe may be full. `_exit`
/// ends every thread at once; what rpc-serve itself had to say went out already, unbuffered.
fn exit(status: Status) -> ! {
    if status == Status::GaveUp {
        // SAFETY: `_exit` has no preconditions; it does not return.
        unsafe { libc::_exit(status as i32) }
    }
    std::process::exit(status as i32)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(DEFAULT_LOG)).init();
    // A write past RLIMIT_FSIZE (`ulimit -f`) raises SIGXFSZ, which would end rpc-serve; ignored,
    // the write fails with EFBIG and the device gets an error reply.
    // SAFETY: SIG_IGN is a valid disposition; no other thread exists yet.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // Before anything is mapped or served, so that no truncation of the mailbox file can come
    // before it.
    if let Err(error) = sigbus::install() {
        let _ = writeln!(std::io::stderr(), "rpc-serve: SIGBUS handler: {error}");
        exit(Status::Failed);
    }
    // Usage errors exit 2 (`--help` 0) inside clap.
    let args = Cli::parse().args().unwrap_or_else(|error| error.exit());
    match serve(args) {
        Ok(status) => exit(status),
        Err(Failure(status, message)) => {
            let _ = writeln!(std::io::stderr(), "rpc-serve: {message}");
            exit(status)
        }
    }
}
