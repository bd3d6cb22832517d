//! `rpc-serve`: serves the standard opcodes over a mailbox living in a shared-memory file, so a
//! client in another process (in any language) can use it.
//!
//! ```text
//! rpc-serve --file PATH --gen v1|v2 --ports N --lanes L [--files DIR|deny|all]
//!           [--allow-system] [--stdout FILE] [--client-timeout MS]
//! ```
//! Creates (or truncates) PATH to the layout's size, zeroed; prints `ready PATH BYTES` once it
//! serves; serves until SIGINT or SIGTERM; prints its statistics and exits 0. Bad arguments: a
//! message and exit code 2. `--client-timeout MS` (default 10000, 0 = never) abandons an
//! exchange whose client stopped answering mid-script (e.g. a killed process), so the other
//! ports keep being served and the port is recovered. A client's EXIT/ABORT is recorded and
//! logged, never ends rpc-serve.
//!
//! `--files` is the file policy of OPEN_FILE, REMOVE and RENAME: a directory (which must
//! exist) every path resolves beneath, `deny` (none), or `all` (any path rpc-serve's user may
//! use); default: rpc-serve's working directory as the sandbox (`./deny` names a directory
//! called `deny`). Whatever the policy, `/proc`, `/sys`, `/dev` (but `/dev/null`), non-regular
//! files and the mailbox file itself are never opened, removed or renamed (`FilePolicy`).
//! SYSTEM runs commands only with `--allow-system`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpc_core::plugin::SharedRegion;
use rpc_core::{
    ExitPolicy, FilePolicy, Generation, Layout, RpcServer, ServerConfig, ServicesConfig,
};

const USAGE: &str = "usage: rpc-serve --file PATH --gen v1|v2 --ports N --lanes L \
                     [--files DIR|deny|all] [--allow-system] [--stdout FILE] \
                     [--client-timeout MS]";

/// How long a wait for a client's next packet lasts before the exchange is abandoned.
const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

struct Args {
    file: PathBuf,
    layout: Layout,
    files: FilePolicy,
    allow_system: bool,
    stdout: Option<PathBuf>,
    client_timeout: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_env();
    let (mut file, mut generation, mut ports, mut lanes) = (None, None, None, None);
    let (mut allow_system, mut stdout, mut files) = (false, None, None);
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
    let files = match files {
        Some(files) => files,
        None => FilePolicy::Sandbox(
            std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?,
        ),
    };
    Ok(Args {
        file: file.ok_or_else(|| missing("file"))?,
        layout,
        files,
        allow_system,
        stdout,
        client_timeout,
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

/// The mapped file as the mailbox's memory.
struct MappedFile(memmap2::MmapMut);

// SAFETY: an `mmap` of the mailbox file is page-aligned and stays mapped while this value
// lives; this process reads it only through the server's atomic views. (Another process
// truncating the file is not defended against yet: the next access would fault.)
unsafe impl SharedRegion for MappedFile {
    fn host_ptr(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }
    fn device_addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn serve(args: Args) -> Result<(), String> {
    let size = args.layout.total_size();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&args.file)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    file.set_len(size as u64)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    // SAFETY: the file is ours (just created or truncated); other processes may write it, which
    // the server tolerates: it only ever reads the mapping through atomics.
    let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| format!("mmap: {e}"))?;
    let config = ServerConfig {
        name: "rpc-serve".into(),
        client_timeout: args.client_timeout,
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            files: args.files,
            allow_system: args.allow_system,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    };
    let server = RpcServer::new(config);
    // No request may open (and truncate), remove or rename the mailbox under us.
    server
        .context()
        .services()
        .protect_file(&args.file)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    if let Some(path) = &args.stdout {
        let out = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        server.context().services().set_stdout(Box::new(out));
    }
    let mailbox = server
        .attach_region(Box::new(MappedFile(map)), args.layout)
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    let _ = server.start().map_err(|e| e.to_string())?;
    // Clients in other processes are no kernel launches we can see: one user for our whole life.
    let user = server.user();
    println!("ready {} {size}", args.file.display());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
        if let Some(exit) = server.context().services().take_exit(mailbox) {
            log::warn!("a client ended its program: {exit:?}");
        }
    }
    drop(user);
    let _ = server.shutdown().map_err(|e| e.to_string())?;
    server.context().services().flush_std();
    println!("stopped: {}", server.stats());
    Ok(())
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
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
    if let Err(message) = serve(args) {
        eprintln!("rpc-serve: {message}");
        std::process::exit(1);
    }
}
