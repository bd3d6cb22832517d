//! `rpc-serve`: serves the standard opcodes over a mailbox in shared memory, so a client in
//! another process (in any language) can use it.
//!
//! ```text
//! rpc-serve [--file PATH | --memfd] --gen v0|v1|v2 --ports N --lanes L [--files DIR|deny|all]
//!           [--allow-system] [--stdout FILE] [--stderr FILE] [--client-timeout MS] [--json]
//! ```
//! `--gen v0` is LLVM 18's layout, whose clients number their opcodes as LLVM 18 and 19 do
//! (0, 1, 2... in 16 bits: `Numbering::Llvm19`); v1 and v2 clients use today's numbers.
//!
//! The mailbox is a memfd (`--memfd`, also what happens without `--file`), sized to the
//! layout, zeroed and sealed against shrinking and growing; rpc-serve prints `ready
//! /proc/PID/fd/N BYTES` once it serves, and a client of the same user opens that path
//! read-write and maps it. Its `ftruncate` fails (EPERM), so the pages cannot be pulled from
//! under the server. With `--file PATH`, rpc-serve creates (or truncates) PATH instead and prints
//! `ready PATH BYTES` (and removes PATH when it stops); if another process truncates the file, the next access would raise
//! SIGBUS: a handler (`sigbus.rs`) maps zero pages over the mailbox instead, and rpc-serve logs
//! "the mailbox file was truncated by another process", detaches the mailbox, prints its
//! statistics and exits 1.
//!
//! Served and silent, its worker parks longer as the silence grows: at most 250 µs while a
//! client may still be speaking; once nothing was asked for a second (a client in another
//! process is invisible, so that is taken as none) an eighth of the silence, up to 250 ms. So
//! rpc-serve with no client costs well below 0.1% of a core, and the first request after a
//! silence of a second or more waits up to an eighth of it (at most 250 ms). Its main thread
//! sleeps until a signal, which ends rpc-serve at once. A client's EXIT or ABORT is logged (at
//! `info`, shown by default) when it comes.
//!
//! rpc-serve serves until SIGINT or SIGTERM, then prints its statistics (`stopped: ...`, or with
//! `--json` one line of JSON, `StatsSnapshot::to_json`) and exits 0. Bad
//! arguments: a message and exit code 2. `--client-timeout MS` (default 10000, 0 = never)
//! abandons an exchange whose client stopped answering mid-script (e.g. a killed process), so
//! the other ports keep being served and the port is recovered. A client's EXIT/ABORT is
//! recorded and logged, never ends rpc-serve.
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
//! files and the mailbox file itself are never opened, removed or renamed (`FilePolicy`).
//! SYSTEM runs commands only with `--allow-system`. MALLOC allocates from rpc-serve's own
//! memory (2 MiB aligned, as LLVM's GPU allocator needs; at most 1 GiB live at once), FREE frees
//! it, and what the client did not free is freed at exit.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpc_core::protocol::{Dialect, Generation, Layout, Numbering};
use rpc_core::{ExitPolicy, FilePolicy, Limits, RpcServer, ServerConfig, ServicesConfig};

mod mailbox;
mod sigbus;

use mailbox::{Backing, Mapped};
use plugin_host::HostAllocator;

const USAGE: &str = "usage: rpc-serve [--file PATH | --memfd] --gen v0|v1|v2 --ports N --lanes L \
                     [--files DIR|deny|all] [--allow-system] [--stdout FILE] [--stderr FILE] \
                     [--client-timeout MS] [--json]";

/// The most bytes MALLOC hands the client out of rpc-serve's memory at once.
const MALLOC_BYTES: u64 = 1 << 30;

/// How long a wait for a client's next packet lasts before the exchange is abandoned.
const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

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

struct Args {
    mailbox: Backing,
    layout: Layout,
    files: FilePolicy,
    allow_system: bool,
    stdout: Option<PathBuf>,
    stderr: Option<PathBuf>,
    client_timeout: Option<Duration>,
    /// The statistics at exit as JSON.
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_env();
    let (mut file, mut generation, mut ports, mut lanes) = (None, None, None, None);
    let (mut allow_system, mut stdout, mut files) = (false, None, None);
    let (mut memfd, mut stderr, mut json) = (false, None, false);
    // Clients in other processes hold no launch guard we could see end: without a timeout, a
    // client killed mid-exchange would hold the worker forever. 0 disables it.
    let mut client_timeout = Some(DEFAULT_CLIENT_TIMEOUT);
    let text = |v: std::ffi::OsString| {
        v.into_string()
            .map_err(|_| "arguments must be UTF-8".to_string())
    };
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("file") => file = Some(PathBuf::from(parser.value().map_err(|e| e.to_string())?)),
            Long("gen") => {
                let value = text(parser.value().map_err(|e| e.to_string())?)?;
                generation = Some(value.parse::<Generation>().map_err(|e| e.to_string())?);
            }
            Long("ports") => {
                ports = Some(
                    parser
                        .value()
                        .map_err(|e| e.to_string())?
                        .parse::<u32>()
                        .map_err(|e| format!("--ports: {e}"))?,
                )
            }
            Long("lanes") => {
                lanes = Some(
                    parser
                        .value()
                        .map_err(|e| e.to_string())?
                        .parse::<u32>()
                        .map_err(|e| format!("--lanes: {e}"))?,
                )
            }
            Long("files") => files = Some(file_policy(parser.value().map_err(|e| e.to_string())?)?),
            Long("allow-system") => allow_system = true,
            Long("stdout") => {
                stdout = Some(PathBuf::from(parser.value().map_err(|e| e.to_string())?))
            }
            Long("stderr") => {
                stderr = Some(PathBuf::from(parser.value().map_err(|e| e.to_string())?))
            }
            Long("memfd") => memfd = true,
            Long("json") => json = true,
            Long("client-timeout") => {
                let ms: u64 = parser
                    .value()
                    .map_err(|e| e.to_string())?
                    .parse()
                    .map_err(|e| format!("--client-timeout: {e}"))?;
                client_timeout = (ms > 0).then(|| Duration::from_millis(ms));
            }
            Long("help") | Short('h') => return Err(String::new()),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let missing = |name: &str| format!("missing --{name}");
    let layout = Layout::new(
        generation.ok_or_else(|| missing("gen"))?,
        ports.ok_or_else(|| missing("ports"))?,
        lanes.ok_or_else(|| missing("lanes"))?,
    )
    .map_err(|e| e.to_string())?;
    let mailbox = match (file, memfd) {
        (Some(_), true) => return Err("--file and --memfd exclude each other".into()),
        (Some(path), false) => Backing::File(path),
        (None, _) => Backing::Memfd,
    };
    let files = match files {
        Some(files) => files,
        None => FilePolicy::Sandbox(
            std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?,
        ),
    };
    Ok(Args {
        mailbox,
        layout,
        files,
        allow_system,
        stdout,
        stderr,
        client_timeout,
        json,
    })
}

/// `--files`: `deny`, `all`, or a directory that exists.
fn file_policy(value: std::ffi::OsString) -> Result<FilePolicy, String> {
    match value.to_str() {
        Some("deny") => Ok(FilePolicy::Deny),
        Some("all") => Ok(FilePolicy::Allow),
        _ => {
            let dir = PathBuf::from(value);
            if dir.is_dir() {
                Ok(FilePolicy::Sandbox(dir))
            } else {
                Err(format!("--files: {} is not a directory", dir.display()))
            }
        }
    }
}

/// How serving ended.
enum Ended {
    /// SIGINT or SIGTERM: exit 0.
    Stopped,
    /// The mailbox memory was pulled away (a truncated file): exit 1.
    Faulted,
}

fn serve(args: Args) -> Result<Ended, String> {
    // The main thread sleeps reading `wake` until a stop signal or a mended SIGBUS writes to
    // `waker`: it costs no wake-ups while rpc-serve serves or idles. Each sets its flag before
    // it writes (signal-hook runs a signal's actions in the order they were registered), and
    // the loop below reads the flags after each wake-up, so none is missed.
    let (mut wake, waker) = UnixStream::pair().map_err(|e| format!("wake-up socket: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let waker = waker
            .try_clone()
            .map_err(|e| format!("wake-up socket: {e}"))?;
        signal_hook::flag::register(signal, stop.clone())
            .and_then(|_| signal_hook::low_level::pipe::register(signal, waker))
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    // Before the mailbox is mapped, so before it can fault.
    sigbus::wake_on_fault(waker);
    let size = args.layout.total_size();
    let (region, path) = Mapped::create(&args.mailbox, size)?;
    let config = ServerConfig {
        name: "rpc-serve".into(),
        client_timeout: args.client_timeout,
        absent_park: Some(ABSENT_PARK),
        limits: Limits {
            malloc_bytes: MALLOC_BYTES,
            ..Limits::default()
        },
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            files: args.files,
            allow_system: args.allow_system,
        },
        ..ServerConfig::default()
    };
    let server = RpcServer::new(config);
    // MALLOC from rpc-serve's own memory (what LLVM's loader gives a CPU client), freed at exit.
    server
        .context()
        .services()
        .set_allocator(Arc::new(HostAllocator::new()));
    // No request may open (and truncate), remove or rename the mailbox under us.
    server
        .context()
        .services()
        .protect_file(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(path) = &args.stdout {
        let out = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        server.context().services().set_stdout_fd(out.into());
    }
    if let Some(path) = &args.stderr {
        let err = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        server.context().services().set_stderr_fd(err.into());
    }
    // The only v0 clients are LLVM 18's, which number opcodes 0, 1, 2... in 16 bits.
    let numbering = match args.layout.generation() {
        Generation::V0 => Numbering::Llvm19,
        Generation::V1 | Generation::V2 => Numbering::Current,
    };
    let mailbox = server
        .attach_region_for(
            Box::new(region),
            args.layout,
            None,
            numbering,
            Dialect::HostC,
        )
        .map_err(|e| e.to_string())?;
    let _ = server.start().map_err(|e| e.to_string())?;
    // Clients in other processes are no kernel launches we can see: one user for our whole life.
    let user = server.user();
    println!("ready {} {size}", path.display());
    let mut ended = Ended::Stopped;
    while !stop.load(Ordering::Relaxed) {
        if sigbus::faulted() {
            match &args.mailbox {
                Backing::File(file) => log::error!(
                    "{}: the mailbox file was truncated by another process; \
                     detaching the mailbox and exiting",
                    file.display()
                ),
                Backing::Memfd => log::error!(
                    "{}: the mailbox memory faulted (SIGBUS); detaching the mailbox and exiting",
                    path.display()
                ),
            }
            // The worker now reads zero pages, an idle mailbox; detaching lets go of it (and
            // unmaps it) before we report.
            server.detach(mailbox).map_err(|e| e.to_string())?;
            ended = Ended::Faulted;
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
    drop(user);
    let _ = server.shutdown().map_err(|e| e.to_string())?;
    server.context().services().flush_std();
    if let Backing::File(file) = &args.mailbox {
        // We created it for our clients; with us gone it serves nobody.
        if let Err(error) = std::fs::remove_file(file) {
            log::warn!("{}: not removed: {error}", file.display());
        }
    }
    let stats = server.stats();
    if args.json {
        println!("{}", stats.to_json());
    } else {
        println!("stopped: {stats}");
    }
    Ok(ended)
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
        eprintln!("rpc-serve: SIGBUS handler: {error}");
        std::process::exit(1);
    }
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("rpc-serve: {message}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    match serve(args) {
        Ok(Ended::Stopped) => {}
        Ok(Ended::Faulted) => std::process::exit(1),
        Err(message) => {
            eprintln!("rpc-serve: {message}");
            std::process::exit(1);
        }
    }
}
