//! What a row is measured against: an in-process `RpcServer` over `MailboxMemory` (with a v2
//! doorbell, or without), or a server process (`rpc-serve`, LLVM's server with our glue, or
//! the floor's `rpc-bench floor-serve`) whose memfd mailbox this process maps.
//!
//! A server process is stopped (SIGSTOP) whenever none of its rows runs, so that the timed
//! parks of a dozen idle servers do not load the machine the measured one runs on; it is
//! continued (SIGCONT) for its rows and killed when dropped. The servers of one mailbox shape
//! serve one mailbox file in turn (see `setups` in main.rs), so a stop returns only once the
//! process has stopped, and the end of an in-process row only once its worker sleeps: two
//! servers never serve one mailbox at once.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, ErrorKind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use plugin_host::memory::Signal;
use rpc_core::plugin::{Doorbell, RegionMailbox, SharedRegion};
use rpc_core::protocol::{
    Client, ClientDoorbell, Generation, Layout, LockTable, Mailbox, MailboxMemory, Wait,
};
use rpc_core::{AttachOptions, RpcServer, ServerConfig, UserGuard};

use crate::{pin_server, pin_server_process, spin_then_yield, SpinThenYield, PARK_US};

/// Which server a row measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Server {
    /// rpc-core's `RpcServer` in this process.
    InProcess,
    /// `rpc-serve` in another process.
    RpcServe,
    /// LLVM's server (`llvm-peer`) in another process.
    Llvm,
    /// The floor of the cross-process rows: a process of its own (this binary's
    /// `floor-serve`, [`Setup::floor`]) that answers the measured port alone with raw atomics
    /// (`measure::floor_loop`), on rpc-serve's mailbox file, stopped and continued as the
    /// servers are.
    Floor,
    /// The floor of the in-process server's rows: the same loop on a thread of the bench
    /// (`measure::thread_floor_roundtrip`), on the same file. A hand-over between two threads
    /// of one process costs no address-space switch where the client and the answerer share
    /// a CPU (the loaded regime), one between two processes does: each floor is the bound of
    /// the servers that pay what it pays. Not a server one starts: no setup of its own.
    ThreadFloor,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::InProcess => "in-process",
            Server::RpcServe => "rpc-serve",
            Server::Llvm => "LLVM",
            Server::Floor => "floor",
            Server::ThreadFloor => "thread floor",
        }
    }
}

/// The server binaries: rpc-serve's, and LLVM's peer per generation where it could be built.
pub struct Binaries {
    pub rpc_serve: Option<PathBuf>,
    pub peer_v1: Option<PathBuf>,
    pub peer_v2: Option<PathBuf>,
}

impl Binaries {
    fn of(&self, server: Server, generation: Generation) -> Option<&Path> {
        match (server, generation) {
            (Server::InProcess | Server::Floor | Server::ThreadFloor, _) => None,
            (Server::RpcServe, _) => self.rpc_serve.as_deref(),
            (Server::Llvm, Generation::V1) => self.peer_v1.as_deref(),
            (Server::Llvm, Generation::V2) => self.peer_v2.as_deref(),
            // The benchmark measures the two generations LLVM's header-only server speaks.
            (Server::Llvm, Generation::V0) => None,
        }
    }
}

/// A server with one mailbox and the client's lock table.
pub struct Setup {
    pub server: Server,
    host: Host,
    locks: LockTable,
    layout: Layout,
}

enum Host {
    InProcess {
        server: RpcServer,
        memory: Memory,
        /// The worker's kernel thread id (it runs from the setup to its end).
        worker: i32,
        /// The mailbox's v2 doorbell, which the client rings.
        bell: Option<Arc<Bell>>,
        /// Live [`Serving`] guards: the worker sleeps once the last is dropped.
        users: std::sync::Mutex<usize>,
    },
    Process(Process),
}

/// The in-process server's mailbox: its own, or the file the server processes serve.
enum Memory {
    Own(Arc<MailboxMemory>),
    Shared(Arc<Mapping>),
}

impl Setup {
    /// `server` over a mailbox of the given shape: a fresh one, or the file `file` (a server
    /// process's `--file`: rpc-serve creates it, LLVM's peer serves it as it is; the in-process
    /// server maps it); `None` for a server process whose binary is missing.
    pub fn new(
        server: Server,
        binaries: &Binaries,
        generation: Generation,
        ports: u32,
        lanes: u32,
        file: Option<&Path>,
    ) -> Result<Option<Self>, String> {
        let layout = Layout::new(generation, ports, lanes).map_err(|e| e.to_string())?;
        let host = if server == Server::InProcess {
            in_process(layout, None, file)?
        } else {
            let Some(binary) = binaries.of(server, generation) else {
                return Ok(None);
            };
            let mut command = Command::new(binary);
            if let Some(file) = file {
                command.arg("--file").arg(file);
            }
            command
                .args(mailbox_args(layout))
                .args([
                    "--stdout",
                    "/dev/null",
                    "--files",
                    "deny",
                    "--dispatch-tests",
                ])
                .env("RUST_LOG", "error");
            Host::Process(Process::start(command, layout)?)
        };
        Ok(Some(Setup {
            server,
            host,
            locks: LockTable::new(ports),
            layout,
        }))
    }

    /// The floor's process, answering port `port` of `of`'s mailbox (a server process's file,
    /// which it maps), pinned, stopped and continued as the server processes are: `launch`
    /// makes its command from the arguments of `floor-serve` (`--file`, `--gen`, `--ports`,
    /// `--lanes`, `--port`): this binary's `floor-serve` ([`floor_command`]), or a test's
    /// stand-in for it.
    pub fn floor(
        of: &Setup,
        port: u32,
        launch: impl FnOnce(Vec<OsString>) -> Result<Command, String>,
    ) -> Result<Self, String> {
        let Host::Process(server) = &of.host else {
            return Err("the floor process maps a server process's mailbox file".into());
        };
        let mut args = vec!["--file".into(), server.path.clone().into_os_string()];
        args.extend(mailbox_args(of.layout).map(OsString::from));
        args.extend(["--port".into(), port.to_string().into()]);
        Ok(Setup {
            server: Server::Floor,
            host: Host::Process(Process::start(launch(args)?, of.layout)?),
            locks: LockTable::new(of.layout.ports()),
            layout: of.layout,
        })
    }

    /// An in-process server over a fresh v2 mailbox whose client rings a doorbell (PROTOCOL
    /// section 9), so that the worker sleeps on it while no request is open.
    pub fn with_doorbell(ports: u32, lanes: u32) -> Result<Self, String> {
        let layout = Layout::new(Generation::V2, ports, lanes).map_err(|e| e.to_string())?;
        Ok(Setup {
            server: Server::InProcess,
            host: in_process(layout, Some(Arc::new(Bell::default())), None)?,
            locks: LockTable::new(ports),
            layout,
        })
    }

    /// Whether the client rings a doorbell.
    pub fn rings(&self) -> bool {
        matches!(&self.host, Host::InProcess { bell: Some(_), .. })
    }

    /// The in-process server's statistics, once every request begun on its mailbox is
    /// counted (a request is counted after its reply lets the client go on).
    #[cfg(test)]
    pub fn stats(&self) -> Option<rpc_core::StatsSnapshot> {
        match &self.host {
            Host::InProcess { server, .. } => {
                let mailboxes = server.mailboxes();
                let [mailbox] = mailboxes[..] else {
                    panic!("one mailbox: {mailboxes:?}")
                };
                Some(workloads::settled_stats(server, mailbox))
            }
            Host::Process(_) => None,
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn view(&self) -> Mailbox<'_> {
        let (base, len) = self.region();
        // SAFETY: the region is mapped (or allocated), 64-byte aligned and `len` bytes while
        // `self` lives (the view borrows it); this process touches it only through such
        // views and `Mapping::u32_at` / `u64_at`, all atomic and same-size. A server process
        // writes it as it likes: garbage to us at worst.
        unsafe { Mailbox::from_raw(base, len, self.layout) }.expect("sized for the layout")
    }

    /// A server process's mailbox file as this process maps it (for the bench's own loops on
    /// it); `None` in process.
    pub fn mapping(&self) -> Option<&Mapping> {
        match &self.host {
            Host::Process(process) => Some(&process.mapping),
            Host::InProcess { .. } => None,
        }
    }

    /// The server process's id; `None` in process.
    #[cfg(test)]
    pub fn pid(&self) -> Option<u32> {
        match &self.host {
            Host::Process(process) => Some(process.child.id()),
            Host::InProcess { .. } => None,
        }
    }

    /// Where the mailbox is in this process, and its length.
    fn region(&self) -> (*mut u8, usize) {
        match &self.host {
            Host::InProcess {
                memory: Memory::Own(memory),
                ..
            } => (memory.as_ptr(), self.layout.total_size()),
            Host::InProcess {
                memory: Memory::Shared(mapping),
                ..
            } => (mapping.base, mapping.len),
            Host::Process(process) => (process.mapping.base, process.mapping.len),
        }
    }

    pub fn locks(&self) -> &[AtomicU32] {
        self.locks.words()
    }

    /// A client that spins, then yields (and rings the doorbell, where there is one); of a
    /// server process, one that gives up once the process is gone ([`WatchProcess`]).
    pub fn client(&self) -> Client<'_> {
        let wait: &dyn Wait = match &self.host {
            Host::Process(process) => &process.watch,
            Host::InProcess { .. } => &SpinThenYield,
        };
        let client = Client::new(self.view(), self.locks.words())
            .expect("lock table sized for the mailbox")
            .with_wait(wait);
        match &self.host {
            Host::InProcess {
                bell: Some(bell), ..
            } => client.with_doorbell(ClientDoorbell {
                value: &bell.value,
                mailbox: &bell.mailbox,
                event_id: Bell::EVENT_ID,
                raise: &*bell.raise,
            }),
            _ => client,
        }
    }

    /// Makes the server serve for as long as the guard lives: a user guard in process (a
    /// kernel runs), SIGCONT then SIGSTOP for a process.
    pub fn serving(&self) -> Serving<'_> {
        match &self.host {
            Host::InProcess { server, users, .. } => {
                *users.lock().expect("never poisoned") += 1;
                Serving::User {
                    server,
                    users,
                    guard: Some(server.user()),
                }
            }
            Host::Process(process) => {
                let mut serving = process.serving.lock().expect("never poisoned");
                if *serving == 0 {
                    process.signal(libc::SIGCONT);
                }
                *serving += 1;
                Serving::Continued(process)
            }
        }
    }

    /// The kernel thread ids of the server's threads: the in-process worker, or every thread
    /// of the process.
    pub fn threads(&self) -> Vec<i32> {
        match &self.host {
            Host::InProcess { worker, .. } => vec![*worker],
            // Best effort, as pinning is: a process whose threads cannot be listed is not moved.
            Host::Process(process) => process.threads().unwrap_or_default(),
        }
    }

    /// CPU time the server has used so far: the in-process worker's, or all the process's
    /// threads'.
    pub fn cpu(&self) -> Result<Duration, String> {
        match &self.host {
            Host::InProcess { worker, .. } => {
                schedstat(&format!("/proc/self/task/{worker}/schedstat"))
            }
            Host::Process(process) => process.cpu(),
        }
    }
}

/// See [`Setup::serving`].
pub enum Serving<'a> {
    User {
        server: &'a RpcServer,
        /// The setup's live guards (a row may hold one inside another's).
        users: &'a std::sync::Mutex<usize>,
        guard: Option<UserGuard>,
    },
    Continued(&'a Process),
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        match self {
            Serving::User {
                server,
                users,
                guard,
            } => {
                let mut users = users.lock().expect("never poisoned");
                *users -= 1;
                if *users > 0 {
                    return;
                }
                // The worker polls on through its back-off after the last user leaves; it may
                // share its mailbox with the server processes, so wait until it sleeps.
                let asleep = || server.stats().sleeps;
                let before = asleep();
                drop(guard.take());
                let deadline = Instant::now() + Duration::from_secs(10);
                while asleep() == before {
                    // A liveness bound only.
                    assert!(Instant::now() < deadline, "the worker never went to sleep");
                    thread::sleep(Duration::from_micros(20));
                }
            }
            Serving::Continued(process) => {
                let mut serving = process.serving.lock().expect("never poisoned");
                *serving -= 1;
                if *serving == 0 {
                    process.stop();
                }
            }
        }
    }
}

/// A v2 doorbell in this process: the record's `value` and `mailbox` words, and the host
/// plugin's interrupt (a condition variable).
struct Bell {
    value: AtomicU64,
    mailbox: AtomicU64,
    signal: Arc<Signal>,
    /// Raises `signal` (the client's part takes a function).
    raise: Box<dyn Fn() + Send + Sync>,
}

impl Bell {
    const EVENT_ID: u32 = 1;
}

impl Default for Bell {
    fn default() -> Self {
        let signal = Arc::new(Signal::default());
        let raised = signal.clone();
        Bell {
            value: AtomicU64::new(0),
            mailbox: AtomicU64::new(0),
            signal,
            raise: Box::new(move || raised.raise()),
        }
    }
}

/// The server's part of a [`Bell`].
struct ServerBell(Arc<Bell>);

impl Doorbell for ServerBell {
    fn record(&self) -> [u8; 64] {
        // This process's addresses: device and host are one here.
        let mut record = [0u8; 64];
        record[..8].copy_from_slice(&(&self.0.value as *const AtomicU64 as u64).to_le_bytes());
        record[8..16].copy_from_slice(&(&self.0.mailbox as *const AtomicU64 as u64).to_le_bytes());
        record[16..20].copy_from_slice(&Bell::EVENT_ID.to_le_bytes());
        record
    }

    fn counter(&self) -> &AtomicU64 {
        &self.0.value
    }

    fn wait(&self, timeout: Duration) -> bool {
        self.0.signal.wait_for(&self.0.value, timeout)
    }
}

fn in_process(
    layout: Layout,
    bell: Option<Arc<Bell>>,
    file: Option<&Path>,
) -> Result<Host, String> {
    // A name no other server of this process has, short enough that the kernel keeps all of
    // the worker's thread name ("rpc-" and it, in 15 bytes): the worker is found by it.
    static SERVERS: AtomicU32 = AtomicU32::new(0);
    let name = format!("bench{}", SERVERS.fetch_add(1, Ordering::Relaxed));
    let server = RpcServer::new(ServerConfig {
        name: name.clone(),
        park: match PARK_US.load(Ordering::Relaxed) {
            0 => ServerConfig::default().park,
            us => Duration::from_micros(us),
        },
        ..ServerConfig::default()
    });
    server
        .context()
        .services()
        .set_stdout(Box::new(std::io::sink()));
    // The typed rows' `add` and `sum`, as `rpc-serve --dispatch-tests` serves them.
    rpc_core::services::dispatch_tests::register(&server).map_err(|e| e.to_string())?;
    let memory = match file {
        Some(file) => {
            let mapping = Arc::new(Mapping::new(file, layout.total_size())?);
            let region = RegionMailbox::new(Box::new(SharedMapping(mapping.clone())), layout)
                .map_err(|e| e.to_string())?;
            server.attach(Box::new(region), AttachOptions::default());
            Memory::Shared(mapping)
        }
        None => {
            let memory = Arc::new(MailboxMemory::new(layout));
            let options = match &bell {
                Some(bell) => AttachOptions::default().doorbell(Box::new(ServerBell(bell.clone()))),
                None => AttachOptions::default(),
            };
            server.attach(Box::new(memory.clone()), options);
            Memory::Own(memory)
        }
    };
    let _ = server.start().map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let worker = loop {
        match thread_named(&format!("rpc-{name}")) {
            Some(tid) => break tid,
            None if Instant::now() < deadline => thread::sleep(Duration::from_millis(1)),
            None => return Err("the worker did not start".into()),
        }
    };
    pin_server(worker);
    Ok(Host::InProcess {
        server,
        memory,
        worker,
        bell,
        users: std::sync::Mutex::new(0),
    })
}

/// The kernel's id of this process's thread named `name`.
fn thread_named(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|task| {
        let task = task.ok()?.path();
        let comm = std::fs::read_to_string(task.join("comm")).ok()?;
        (comm.trim_end() == name).then(|| task.file_name()?.to_str()?.parse().ok())?
    })
}

/// A mailbox file mapped here, shared.
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory that lives as long as `Mapping`; every access to
// it goes through `Mailbox` views and `Mapping::u32_at` / `u64_at`, which are atomic.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared use of the mapping is only through atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the file `path`, which must be `len` bytes.
    pub fn new(path: &Path, len: usize) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let size = file.metadata().map_err(|e| e.to_string())?.len();
        if size != len as u64 {
            return Err(format!("{}: {size} bytes, not {len}", path.display()));
        }
        // SAFETY: a fresh shared mapping of the whole file (`len` bytes, checked above); the
        // kernel picks the address. The descriptor may close after mmap.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mmap {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }

    /// The mailbox's `u32` word at `offset` bytes, as an atomic (for the floor's loop on it,
    /// `measure::floor_loop`).
    pub fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset % 4 == 0 && offset + 4 <= self.len);
        // SAFETY: in bounds and aligned (asserted; the mapping is page-aligned), borrowed from
        // `self`, which keeps it mapped, and the mailbox is only ever accessed through
        // atomics, this word always through 4-byte ones (flags, opcodes).
        unsafe { &*self.base.add(offset).cast::<AtomicU32>() }
    }

    /// The mailbox's `u64` word at `offset` bytes, as an atomic.
    pub fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset % 8 == 0 && offset + 8 <= self.len);
        // SAFETY: as in `u32_at`; a packet's words are always accessed as 8-byte atomics.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; nothing borrowed from it outlives
        // `self` (views and words borrow the `Setup` that owns it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A [`Mapping`] as the in-process server's region.
struct SharedMapping(Arc<Mapping>);

// SAFETY: the mapping is page-aligned (an mmap) and stays mapped at the same address and length
// while this value (an owner of it) lives; the server reads and writes it only through atomic
// views. The file is never truncated while mapped (rpc-serve removes it only when it stops).
unsafe impl SharedRegion for SharedMapping {
    fn host_ptr(&self) -> *mut u8 {
        self.0.base
    }
    fn device_addr(&self) -> u64 {
        self.0.base as u64
    }
    fn len(&self) -> usize {
        self.0.len
    }
}

/// The arguments that give a server process the mailbox's layout.
fn mailbox_args(layout: Layout) -> [String; 6] {
    [
        "--gen".into(),
        layout.generation().to_string(),
        "--ports".into(),
        layout.ports().to_string(),
        "--lanes".into(),
        layout.lanes().to_string(),
    ]
}

/// The command of the floor's process: this binary's `floor-serve` with `args`.
pub fn floor_command(args: Vec<OsString>) -> Result<Command, String> {
    let bench = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let mut command = Command::new(bench);
    command.arg(crate::FLOOR_SERVE).args(args);
    Ok(command)
}

/// A server process and its mailbox, mapped here.
pub struct Process {
    child: Child,
    /// The mailbox file, as its ready line names it (a memfd's is `/proc/PID/fd/N`).
    path: PathBuf,
    /// Live [`Serving`] guards: the first continues the process, the last stops it.
    serving: std::sync::Mutex<usize>,
    mapping: Mapping,
    /// How its clients wait.
    watch: WatchProcess,
}

/// How the bench's client waits on a server process: as [`SpinThenYield`], and every
/// [`WatchProcess::EVERY`] pauses it looks whether the process still lives, so that a server
/// process that died (a crash, a kill from outside) fails its row with `wait abandoned on port
/// P: the server process is gone` instead of leaving the bench waiting forever.
pub(crate) struct WatchProcess {
    pid: u32,
}

impl WatchProcess {
    /// Pauses between two looks: some 10-100 ms of yields, so that the look (a read of
    /// `/proc/PID/stat`) costs nothing measurable.
    const EVERY: u32 = 1 << 16;
}

impl Wait for WatchProcess {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), rpc_core::ProtocolError> {
        if attempt > 0 && attempt % Self::EVERY == 0 && !alive(self.pid) {
            return Err(rpc_core::ProtocolError::Abandoned {
                port,
                reason: "the server process is gone",
            });
        }
        spin_then_yield(attempt);
        Ok(())
    }
}

/// Whether process `pid` lives: it is there and not a zombie (stopped counts as living: the
/// bench stops its servers between their rows).
fn alive(pid: u32) -> bool {
    process_state(pid).is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

/// The scheduler's state of process `pid` (`/proc/PID/stat`: 'R', 'S', 'T' stopped, 'Z' ...),
/// `None` once it is gone.
pub(crate) fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

impl Process {
    /// Starts `command` (a server's binary and its arguments), pinned, waits for its ready
    /// line, maps the mailbox it names and stops the process.
    fn start(mut command: Command, layout: Layout) -> Result<Self, String> {
        pin_server_process(&mut command);
        let binary = PathBuf::from(command.get_program());
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("piped");
        // A liveness bound only: every server prints the line at once.
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            // The first line that says `ready `, from there (a test's stand-in for the floor
            // is a test binary, whose harness prints lines and the start of this one first);
            // an empty one at the end.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(at) = line.find("ready ") {
                    line.drain(..at);
                    break;
                }
                line.clear();
            }
            let _ = tx.send(line);
            // Keep reading (and dropping) so that the server never blocks on a full pipe.
            let mut rest = String::new();
            while reader.read_line(&mut rest).is_ok_and(|n| n > 0) {
                rest.clear();
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| format!("{}: no ready line", binary.display()))?;
        let (path, bytes) = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|rest| rest.rsplit_once(' '))
            .ok_or_else(|| format!("{}: not a ready line: {line:?}", binary.display()))?;
        let mapping = if bytes == layout.total_size().to_string() {
            Mapping::new(Path::new(path), layout.total_size())
        } else {
            Err(format!(
                "{}: the mailbox is {bytes} bytes, rpc-core's layout {}",
                binary.display(),
                layout.total_size()
            ))
        };
        let mapping = mapping.inspect_err(|_| {
            let _ = child.kill();
        })?;
        let process = Process {
            watch: WatchProcess { pid: child.id() },
            child,
            path: PathBuf::from(path),
            serving: std::sync::Mutex::new(0),
            mapping,
        };
        process.stop();
        Ok(process)
    }

    /// Stops the running process and returns once all its threads have stopped (the stop that
    /// `waitpid` reports), or it has exited.
    fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our unreaped child, writing its status into `status`; with
            // WUNTRACED it returns at the stop. (Only a running process is ever stopped, so
            // there is always a stop to report.)
            let waited =
                unsafe { libc::waitpid(self.child.id() as i32, &mut status, libc::WUNTRACED) };
            if waited >= 0 || std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
                return;
            }
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child's.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// The kernel thread ids of the process's threads.
    fn threads(&self) -> Result<Vec<i32>, String> {
        let dir = format!("/proc/{}/task", self.child.id());
        let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
        Ok(tasks
            .filter_map(|task| task.ok()?.file_name().to_str()?.parse().ok())
            .collect())
    }

    /// The CPU time of all the process's threads.
    fn cpu(&self) -> Result<Duration, String> {
        let pid = self.child.id();
        // A thread that exits between the listing and the read is simply not counted.
        Ok(self
            .threads()?
            .into_iter()
            .filter_map(|tid| schedstat(&format!("/proc/{pid}/task/{tid}/schedstat")).ok())
            .sum())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The CPU time in a schedstat file (its first field, ns).
pub(crate) fn schedstat(path: &str) -> Result<Duration, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    text.split_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("{path}: unexpected contents {text:?}"))
}
