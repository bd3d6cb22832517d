//! The standard services: the handlers every server registers after the user's (PROTOCOL
//! section 6), and the host-side state they share ([`Services`], one per server).
//!
//! The host trusts nothing the device sends (DESIGN, "Safety and policy"). Every handler runs
//! its opcode's whole script, whatever the input, so the client never hangs; a lane whose input
//! is refused gets the error value the C function would return, and the request ends as
//! [`Outcome::Refused`] (no error: logged at `warn`, counted in `stats().refused`).
//!
//! What a request may make the host hold is bounded by the server's [`crate::Limits`]. Byte
//! strings from the device (`send_n`) are bounded per lane (`string_bytes`) and per request
//! (`request_bytes`): a claim above them ends the exchange at once
//! ([`ProtocolError::TooLong`](crate::ProtocolError::TooLong),
//! [`ProtocolError::RequestTooLong`](crate::ProtocolError::RequestTooLong), logged and counted
//! in `errors`); nothing of it is kept, and the port is drained (PROTOCOL section 11): each
//! packet the client still sends is answered unread, and its reply is the opcode's failure
//! word (`Opcode::failure_word`). printf's output goes to its stream
//! in pieces, never whole in memory; reads are served in parts of at most `read_bytes`. Every
//! device together shares one budget (`held_bytes`): a byte string longer than its first packet
//! is charged before it grows (refused beyond it: received and dropped, the lane answered with its
//! error value), a read before its buffers are made (served in part beyond it).
//!
//! Each mailbox's kernels have their own open files and allocations: a handle or an address
//! from another mailbox names nothing, the quotas (`open_files`, `malloc_bytes`) are per
//! mailbox, and detaching a mailbox closes its files and frees its allocations.
//!
//! The one-packet opcodes (TEST_INCREMENT) are packet handlers; every other opcode is a script
//! whose exchange suspends while the client has not answered. Work that may block (opening,
//! reading or writing a file, reading stdin, REMOVE, RENAME, SYSTEM, HOST_CALL) runs on the
//! server's I/O threads ([`Request::blocking`]); calls on stdin one at a time, the others
//! waiting for their turn suspended (`Turn`), so a stdin nobody writes holds one I/O
//! thread at most. Writes to the device's stdout and stderr are handed on by the server thread
//! without waiting for their reader (`output.rs`): an exchange whose bytes wait for a reader
//! that does not read waits suspended, and the other ports are served; a long printf written
//! on an I/O thread takes the output turn, so a stdout nobody reads holds one I/O thread at
//! most too. The table look-ups run on the server thread.
//!
//! | opcode | script (C = client, S = server) | refused (reply) |
//! |---|---|---|
//! | NOOP | C send; S recv | — |
//! | EXIT | C send; S recv; S send; C recv; C send buf\[0\] = status; S recv; then [`ExitPolicy`] | — |
//! | ABORT | handshake as EXIT; C send; S recv; then [`ExitPolicy`] | — |
//! | WRITE_TO_STDOUT, _STDERR | C send_n(bytes); S send buf\[0\] = written | — |
//! | WRITE_TO_STDOUT_NEWLINE | as WRITE_TO_STDOUT, plus `\n` if complete, counted | — |
//! | WRITE_TO_STREAM | C send buf\[0\] = raw handle; C send_n(bytes); S send buf\[0\] = written | bad handle (0) |
//! | READ_FROM_STREAM | C send {max, tagged}; S send_n(data); S send buf\[0\] = read | bad handle (0 bytes, 0) |
//! | READ_FGETS | C send {count, tagged}; S send_n(line incl. NUL, or nothing) | bad handle (nothing) |
//! | OPEN_FILE | C send_n(path); C send(mode); S send buf\[0\] = handle or 0 | [`FilePolicy`]: denied, outside the sandbox, never opened (`/proc`, `/sys`, `/dev` but `/dev/null`, not a regular file, a protected file); bad mode, too many files (0) |
//! | CLOSE_FILE | C send buf\[0\] = raw handle; S send buf\[0\] = 0 or EOF | std stream, bad handle (EOF) |
//! | FEOF, FERROR | C send buf\[0\] = tagged; S send buf\[0\] = result | bad handle (1: "at end", "in error") |
//! | CLEARERR | C send buf\[0\] = tagged; S sends the buffer back | bad handle (buffer back) |
//! | FSEEK | C send {tagged, offset, whence}; S send buf\[0\] = 0 or -1 | bad handle, bad whence (-1) |
//! | FTELL | C send buf\[0\] = tagged; S send buf\[0\] = offset (i64) or -1 | bad handle (-1) |
//! | FFLUSH | C send buf\[0\] = tagged (0: every stream); S send buf\[0\] = 0 or EOF | bad handle (EOF) |
//! | UNGETC | C send {c, tagged}; S send buf\[0\] = c or EOF | bad handle (EOF) |
//! | PRINTF_TO_* (21-26) | PROTOCOL section 7, see [`printf`] | bad handle, bad format, missing arguments (-1) |
//! | MALLOC | C send buf\[0\] = size; S send buf\[0\] = address or 0 | no allocator (0) |
//! | FREE | C send buf\[0\] = address; S recv (no reply) | not a live allocation (nothing freed) |
//! | HOST_CALL, OFFLOAD_HOST_CALL | C send_n(args); C send buf\[0\] = function; S send buf\[0\] = result | unregistered function, panic ([`HOST_CALL_REFUSED`]) |
//! | REMOVE | C send_n(path); S send buf\[0\] = 0 or -1 | [`FilePolicy`]: denied, outside the sandbox, in `/proc`, `/sys` or `/dev`, a protected file (-1) |
//! | RENAME | C send_n(old); C send_n(new); S send buf\[0\] = 0 or -1 | as REMOVE, for either path (-1) |
//! | SYSTEM | C send_n(command); S send buf\[0\] = status | not allowed (-1) |
//! | TEST_INCREMENT, TEST_INTERFACE, TEST_STREAM | PROTOCOL section 6 | — |
//!
//! Any `send_n` above its bounds ends the exchange at once (see above): not a refusal counted in
//! `refused`, but its client still gets a failure reply.
//!
//! Results that are C `int`s or `i64`s are sent sign-extended into the u64 word (EOF and -1 read
//! as `u64::MAX`).
//!
//! Stream handles: PROTOCOL section 6 has their encoding; `streams.rs` keeps the table.

use std::boxed::Box;
use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;
use std::string::String;
use std::sync::Arc;
use std::vec::Vec;

use crate::protocol::port::lanes;
use crate::protocol::Opcode;
use crate::server::error::{Outcome, ServerError};
use crate::server::limits::{
    device_log, Charge, ExitPolicy, FilePolicy, Limits, LogLimit, ServicesConfig,
};
use crate::server::mailboxes::{MailboxSlot, Slots};
use crate::server::registry::{entry, Handler, Matcher, Registry};
use crate::server::request::{Request, SharedContext};
use crate::server::stats::Reporting;
use crate::server::{Extension, MailboxId, RpcServer, ServerConfig, ServerContext};
use crate::sync::{lock, AtomicBool, Mutex, Ordering};

pub mod dispatch_tests;
mod files;
pub(crate) mod memory;
pub(crate) mod output;
pub mod printf;
pub(crate) mod process;
mod stdio;
pub(crate) mod streams;
mod test_ops;
pub mod typed;

pub(crate) use memory::DeviceAllocator;
pub use memory::{malloc_alignment, Allocation, MALLOC_ALIGN, SMALL_MAX};
pub(crate) use process::KernelExit;
pub use process::HOST_CALL_REFUSED;

use output::{Descriptor, StdStream, Writer};
use streams::{FileTable, Input, Target};

/// A host function HOST_CALL may call: it gets the lane's argument block, returns the reply.
pub type HostFunction = Arc<dyn Fn(&[u8]) -> u64 + Send + Sync>;

/// Host-side state of the standard services of one server. Every method takes `&self`: the
/// runtime changes streams and policies while the worker serves.
pub struct Services {
    policy: Mutex<ServicesConfig>,
    limits: Limits,
    stdin: Mutex<Input>,
    /// Whether an I/O call holds the turn at stdin, and at stdout and stderr (see [`Turn`]).
    stdin_busy: AtomicBool,
    output_busy: AtomicBool,
    stdout: Arc<StdStream>,
    stderr: Arc<StdStream>,
    /// How long a flush waits for a reader that does not read (`ServerConfig::io_grace`).
    grace: std::time::Duration,
    /// The server-wide allocator, for mailboxes without one of their own.
    allocator: Mutex<Option<Arc<dyn DeviceAllocator>>>,
    /// The attached mailboxes' states ([`MailboxState`]), each kept with its mailbox.
    mailboxes: Slots,
    host_functions: Mutex<HashMap<u64, HostFunction>>,
    /// Files no request may open, remove or rename, by `(st_dev, st_ino)`.
    protected: Mutex<Vec<files::FileId>>,
    /// The file policy made ready: a sandbox's directory opened when the policy was set
    /// (changed under `policy`'s lock, with it).
    file_access: Mutex<files::Access>,
    /// The server's budget of device-caused log lines, for the streams set later.
    log: Arc<LogLimit>,
}

/// What the services keep for one attached mailbox, in the slot the server keeps with it
/// (`Extension`), from its attach to its detach: its kernels' open files and allocations, the
/// allocator for them, their recorded exit. Detaching empties it (`Services::forget_mailbox`);
/// a request of the mailbox still running then finds it closed.
pub(crate) struct MailboxState {
    pub(crate) id: MailboxId,
    /// Its open files; `None` once detached.
    pub(crate) files: Mutex<Option<FileTable>>,
    /// The allocator for its kernels (a plugin with several devices sets each device's), ahead
    /// of the server-wide one.
    allocator: Mutex<Option<Arc<dyn DeviceAllocator>>>,
    pub(crate) allocations: Mutex<memory::Allocations>,
    /// The last EXIT/ABORT recorded under [`ExitPolicy::Record`].
    pub(crate) exit: Mutex<Option<KernelExit>>,
}

impl MailboxState {
    fn new(id: MailboxId) -> Self {
        MailboxState {
            id,
            files: Mutex::new(Some(FileTable::default())),
            allocator: Mutex::new(None),
            allocations: Mutex::new(memory::Allocations::default()),
            exit: Mutex::new(None),
        }
    }
}

/// The state of a request's mailbox.
pub(crate) fn mailbox_state(req: &Request) -> Arc<MailboxState> {
    state_in(req.mailbox_slot().clone())
}

/// The services' state in a mailbox's slot (which only the services make: `mailbox_attached`).
fn state_in(slot: MailboxSlot) -> Arc<MailboxState> {
    slot.downcast()
        .unwrap_or_else(|_| unreachable!("a mailbox slot holds the services' MailboxState"))
}

impl Services {
    pub(crate) fn new(config: &ServerConfig, mailboxes: Slots, report: Reporting) -> Self {
        let std_stream = |name, fd, short| {
            let writer = Writer::Fd(Arc::new(Descriptor::process(fd)));
            let thread = std::format!("rpc-{}-{short}", config.name);
            StdStream::new(name, thread, writer, &config.limits, report.clone())
        };
        Services {
            policy: Mutex::new(config.services.clone()),
            limits: config.limits,
            stdin: Mutex::new(Input::process(report.log_limit.clone())),
            stdin_busy: AtomicBool::new(false),
            output_busy: AtomicBool::new(false),
            stdout: std_stream("stdout", libc::STDOUT_FILENO, "out"),
            stderr: std_stream("stderr", libc::STDERR_FILENO, "err"),
            grace: config.io_grace,
            allocator: Mutex::new(None),
            mailboxes,
            host_functions: Mutex::new(HashMap::new()),
            protected: Mutex::new(Vec::new()),
            file_access: Mutex::new(files::Access::of(&config.services.files)),
            log: report.log_limit,
        }
    }

    /// The current policies.
    pub fn config(&self) -> ServicesConfig {
        lock(&self.policy).clone()
    }
    /// Sets what EXIT and ABORT do.
    pub fn set_exit_policy(&self, exit: ExitPolicy) {
        lock(&self.policy).exit = exit;
    }
    /// Sets which paths the file opcodes may touch. A [`FilePolicy::Sandbox`]'s directory is
    /// opened now and held by its descriptor: renaming it later, or putting a symbolic link at
    /// its path, does not move the sandbox (requests go on in the renamed directory). A
    /// directory that cannot be opened now makes every file request a refusal.
    pub fn set_file_policy(&self, files: FilePolicy) {
        let access = files::Access::of(&files);
        let mut policy = lock(&self.policy);
        policy.files = files;
        *lock(&self.file_access) = access;
    }
    /// Sets whether SYSTEM runs commands.
    pub fn set_system_allowed(&self, allowed: bool) {
        lock(&self.policy).allow_system = allowed;
    }

    /// Protects the file at `path` (following symbolic links): from now on no request opens,
    /// removes or renames it, under any name or hard link, whatever the [`FilePolicy`]. For
    /// the mailbox file a server maps (`rpc-serve` protects its own): opened for writing, a
    /// device could truncate it under the server, and a later scan would fault. The file is
    /// known by its identity (`st_dev`, `st_ino`), so `path` must exist now.
    pub fn protect_file(&self, path: &Path) -> std::io::Result<()> {
        let id = files::identify(path)?;
        let mut protected = lock(&self.protected);
        if !protected.contains(&id) {
            protected.push(id);
        }
        Ok(())
    }

    /// Sends the device's stdout (WRITE_TO_STDOUT, PRINTF_TO_STDOUT, handle 2) to `writer`
    /// instead of the process's stdout. Each request's output is written whole and flushed
    /// before its reply; the short printf lines of one pass go out together (one `write_all`
    /// and one `flush` for them all). `writer` is called on the server thread, so it must not
    /// block: a buffer in memory, a sink. For a file, pipe, FIFO, terminal or socket, give its
    /// descriptor ([`Services::set_stdout_fd`]). What the old writer still had queued is
    /// flushed first, within `ServerConfig::io_grace`.
    pub fn set_stdout(&self, writer: Box<dyn Write + Send>) {
        self.stdout
            .set_writer(Writer::Inline(writer), self.deadline());
    }
    /// The same for stderr.
    pub fn set_stderr(&self, writer: Box<dyn Write + Send>) {
        self.stderr
            .set_writer(Writer::Inline(writer), self.deadline());
    }
    /// Sends the device's stdout to `fd` (a file, pipe, FIFO, terminal or socket; closed when
    /// replaced or dropped), which is never waited for: while its reader does not keep up,
    /// the output waits in a queue of `Limits::output_bytes` and only the exchanges writing
    /// to it wait (see `services/output.rs`). A pipe, FIFO or terminal is written through a description
    /// of its own, opened again non-blocking, so `fd`'s own flags are left as they are.
    pub fn set_stdout_fd(&self, fd: std::os::fd::OwnedFd) {
        let writer = Writer::Fd(Arc::new(Descriptor::owned(fd)));
        self.stdout.set_writer(writer, self.deadline());
    }
    /// The same for stderr.
    pub fn set_stderr_fd(&self, fd: std::os::fd::OwnedFd) {
        let writer = Writer::Fd(Arc::new(Descriptor::owned(fd)));
        self.stderr.set_writer(writer, self.deadline());
    }

    /// When a flush starting now gives up on a reader that does not read.
    fn deadline(&self) -> std::time::Instant {
        std::time::Instant::now() + self.grace
    }
    /// Reads the device's stdin (handle 1) from `reader` instead of the process's stdin.
    pub fn set_stdin(&self, reader: Box<dyn Read + Send>) {
        *lock(&self.stdin) = Input::custom(reader, self.log.clone());
    }

    /// The allocator behind MALLOC/FREE (without one MALLOC answers 0). Live allocations keep
    /// the allocator that made them and are freed through it.
    pub fn set_allocator(&self, allocator: Arc<dyn DeviceAllocator>) {
        *lock(&self.allocator) = Some(allocator);
    }
    /// Sets the allocator MALLOC uses for requests from one mailbox (its device's memory),
    /// ahead of the server-wide one. Nothing if `mailbox` is not attached.
    pub fn set_mailbox_allocator(&self, mailbox: MailboxId, allocator: Arc<dyn DeviceAllocator>) {
        if let Some(state) = self.state(mailbox) {
            *lock(&state.allocator) = Some(allocator);
        }
    }

    /// The allocator for requests from `mailbox`.
    pub(crate) fn allocator_for(&self, mailbox: &MailboxState) -> Option<Arc<dyn DeviceAllocator>> {
        let specific = lock(&mailbox.allocator).clone();
        specific.or_else(|| lock(&self.allocator).clone())
    }

    /// The state of mailbox `id`, while it is attached.
    fn state(&self, id: MailboxId) -> Option<Arc<MailboxState>> {
        self.mailboxes.of(id).map(state_in)
    }

    /// Every attached mailbox's state, in the order they were attached.
    fn states(&self) -> Vec<Arc<MailboxState>> {
        self.mailboxes.all().into_iter().map(state_in).collect()
    }

    /// Allocations MALLOC handed out and FREE has not freed, by mailbox, then lowest address
    /// first.
    pub fn live_allocations(&self) -> Vec<Allocation> {
        self.states()
            .iter()
            .flat_map(|state| lock(&state.allocations).list())
            .collect()
    }

    /// Lets HOST_CALL call `function` when the device names `addr`.
    pub fn register_host_function(&self, addr: u64, function: HostFunction) {
        lock(&self.host_functions).insert(addr, function);
    }
    /// Forgets the function at `addr`; true if there was one.
    pub fn unregister_host_function(&self, addr: u64) -> bool {
        lock(&self.host_functions).remove(&addr).is_some()
    }

    /// The last EXIT/ABORT recorded for a mailbox under [`ExitPolicy::Record`], removing it.
    pub fn take_exit(&self, mailbox: MailboxId) -> Option<KernelExit> {
        lock(&self.state(mailbox)?.exit).take()
    }

    /// Files opened through OPEN_FILE and not yet closed, every mailbox together.
    pub fn open_files(&self) -> usize {
        self.states()
            .iter()
            .map(|state| lock(&state.files).as_ref().map_or(0, FileTable::len))
            .sum()
    }

    /// Forgets what `mailbox`'s kernels held: closes their files (a file an I/O call is using
    /// closes when that call ends), frees their allocations through the allocators that made
    /// them, drops the mailbox's allocator. Called when the mailbox is detached, possibly while
    /// a request of it is still inside an open or an allocation: what such a request makes
    /// afterwards finds the tables gone and is closed or freed at once (`Services::open`,
    /// MALLOC), so nothing outlives the detach.
    pub(crate) fn forget_mailbox(&self, state: &MailboxState) {
        let mailbox = state.id;
        let files = lock(&state.files).take();
        let (count, freed) = {
            let mut books = lock(&state.allocations);
            (books.len(), books.close())
        };
        lock(&state.allocator).take();
        let closed = files.as_ref().map_or(0, FileTable::len);
        drop(files);
        for block in freed {
            if let Err(error) = block.free() {
                log::warn!("mailbox {}: freeing a block of MALLOC: {error}", mailbox.0);
            }
        }
        if closed + count > 0 {
            log::debug!(
                "mailbox {}: closed {closed} file(s), freed {count} allocation(s)",
                mailbox.0
            );
        }
    }

    /// Flushes the device's stdout and stderr: writes what is staged and waits up to
    /// `ServerConfig::io_grace` for what waits for a slow reader; what is still not written
    /// then is given up (counted in `output_lost_bytes`, logged once). Never longer.
    pub fn flush_std(&self) {
        let deadline = self.deadline();
        for stream in [&self.stdout, &self.stderr] {
            stream.flush_within(deadline);
        }
    }

    /// Hands what is staged on stdout and stderr to their writers, waiting for nothing.
    pub(crate) fn hand_on_std(&self) {
        for stream in [&self.stdout, &self.stderr] {
            lock(&stream.state).flush();
        }
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        let live: usize = self
            .states()
            .iter()
            .map(|state| lock(&state.allocations).len())
            .sum();
        if live > 0 {
            // The plugin owns the device memory and frees it with the device.
            log::warn!("{live} device allocation(s) from MALLOC were never freed");
        }
        self.flush_std();
    }
}

impl fmt::Debug for Services {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Services")
            .field("config", &self.config())
            .field("open_files", &self.open_files())
            .field("live_allocations", &self.live_allocations().len())
            .finish_non_exhaustive()
    }
}

impl RpcServer {
    /// A stopped server with the standard handlers registered.
    pub fn new(config: ServerConfig) -> Self {
        let mut registry = Registry::default();
        register_standard(&mut registry);
        let services = |mailboxes, report| -> Box<dyn Extension> {
            Box::new(Services::new(&config, mailboxes, report))
        };
        RpcServer::assemble(config.clone(), registry, services)
    }
}

impl ServerContext {
    /// The standard services' state: streams, policies, allocations, host functions.
    pub fn services(&self) -> &Services {
        self.extension
            .as_any()
            .downcast_ref()
            .expect("every server is made by `RpcServer::new`, with the standard services")
    }
}

impl Extension for Services {
    fn mailbox_attached(&self, id: MailboxId) -> MailboxSlot {
        Arc::new(MailboxState::new(id))
    }
    fn mailbox_detached(&self, _: MailboxId, slot: &MailboxSlot) {
        self.forget_mailbox(&state_in(slot.clone()));
    }
    fn worker_exiting(&self, deadline: std::time::Instant) {
        for stream in [&self.stdout, &self.stderr] {
            stream.flush_within(deadline);
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Registers the standard handlers, in lookup order after the user's. The one-packet opcodes
/// are packet handlers (run at once); the rest are scripts (resumable, see `crate::server::dispatch`).
pub(crate) fn register_standard(registry: &mut Registry) {
    let mut add = |op: Opcode, handler: Handler| {
        registry.push_standard(entry(
            op.name().unwrap_or("?"),
            Matcher::Opcode(op),
            handler,
        ));
    };
    // Each standard opcode's script, by the module that serves it.
    macro_rules! scripts {
        ($($op:ident => $script:path,)*) => {
            $(add(Opcode::$op, Handler::script($script));)*
        };
    }
    add(Opcode::TEST_INCREMENT, Handler::packet(test_ops::increment));
    scripts! {
        NOOP => test_ops::noop,
        TEST_INTERFACE => test_ops::interface,
        TEST_STREAM => test_ops::stream,

        EXIT => process::exit,
        ABORT => process::abort,
        HOST_CALL => process::host_call,
        OFFLOAD_HOST_CALL => process::host_call,
        SYSTEM => process::system,

        MALLOC => memory::malloc,
        FREE => memory::free,

        WRITE_TO_STDOUT => stdio::write_to_stdout,
        WRITE_TO_STDERR => stdio::write_to_stderr,
        WRITE_TO_STREAM => stdio::write_to_stream,
        WRITE_TO_STDOUT_NEWLINE => stdio::write_to_stdout_newline,
        READ_FROM_STREAM => stdio::read_from_stream,
        READ_FGETS => stdio::read_fgets,
        OPEN_FILE => stdio::open_file,
        CLOSE_FILE => stdio::close_file,
        FEOF => stdio::feof,
        FERROR => stdio::ferror,
        CLEARERR => stdio::clearerr,
        FSEEK => stdio::fseek,
        FTELL => stdio::ftell,
        FFLUSH => stdio::fflush,
        UNGETC => stdio::ungetc,
        REMOVE => stdio::remove,
        RENAME => stdio::rename,
    }

    for op in Opcode::PRINTF {
        add(op, Handler::script(printf::printf));
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the handlers.

/// The server context of a request, held apart from it (see [`Request::shared`]).
pub(crate) fn context(req: &Request) -> SharedContext {
    req.shared()
}

/// What an I/O call touches: whether it may block (a file, stdin, a command...), and whether
/// it takes stdin, or stdout or stderr.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Touches {
    pub(crate) blocks: bool,
    pub(crate) stdin: bool,
    pub(crate) output: bool,
}

impl Touches {
    /// Whether [`io`] runs such a call at once, on the server thread.
    pub(crate) fn inline(self) -> bool {
        !self.blocks && !self.stdin
    }

    /// What a call on these streams touches.
    pub(crate) fn streams<'t>(targets: impl IntoIterator<Item = &'t Target>) -> Touches {
        targets
            .into_iter()
            .fold(Touches::default(), |t, target| Touches {
                blocks: t.blocks || target.may_block(),
                stdin: t.stdin || matches!(target, Target::Stdin),
                output: t.output || matches!(target, Target::Stdout | Target::Stderr),
            })
    }
}

impl From<bool> for Touches {
    /// A call that blocks or not, without the standard streams.
    fn from(blocks: bool) -> Touches {
        Touches {
            blocks,
            ..Touches::default()
        }
    }
}

/// Runs `work` on the server's I/O threads if it may block, else here at once: the tables
/// never block. A call that takes stdin first waits for its turn at stdin, and one that writes
/// stdout or stderr for the output turn ([`Turn`]), suspended in its exchange.
pub(crate) async fn io<R: Send + 'static>(
    req: &Request,
    touches: impl Into<Touches>,
    work: impl FnOnce(&ServerContext) -> R + Send + 'static,
) -> Result<R, ServerError> {
    let touches = touches.into();
    if touches.inline() {
        return Ok(work(req.context()));
    }
    let stdin = match touches.stdin {
        true => Some(Turn::take(req, |s| &s.stdin_busy).await),
        false => None,
    };
    let output = match touches.output {
        true => Some(Turn::take(req, |s| &s.output_busy).await),
        false => None,
    };
    req.blocking(move |context| {
        let _turns = (stdin, output); // Given back once the call is done (or dropped unrun).
        work(context)
    })
    .await
}

/// The right to use stdin, or stdout and stderr, from an I/O call, held by one call at a time.
///
/// A read of stdin may block for as long as nobody writes to it (a pipe held open, a terminal
/// nobody types into), holding stdin's lock, and every other call on stdin would wait for that
/// lock on an I/O thread of its own: enough of them and no I/O thread is left for any other
/// port's files. A long printf to stdout written on an I/O thread waits there while the
/// stream's reader does not read, the same way. So such a call first takes the turn, waiting
/// for it suspended in its exchange (a poll per pass), and at most one I/O thread is ever
/// inside or waiting for stdin, and one for stdout and stderr. Not fair: whichever waiting
/// exchange is polled first after the turn is given back takes it. Stdin's is taken before
/// the output's, never the other way.
///
/// Memory ordering: `Services::stdin_busy` and `output_busy` are lock flags (no data rides on
/// them: the streams' own mutexes order their state); the acquiring compare-exchange pairs
/// with the releasing store.
pub(crate) struct Turn(SharedContext, fn(&Services) -> &AtomicBool);

impl Turn {
    async fn take(req: &Request, flag: fn(&Services) -> &AtomicBool) -> Turn {
        let context = req.shared();
        core::future::poll_fn(|_| {
            // RMW: the flag false -> true (taken), or no change while another holds it.
            let taken = flag(context.services())
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
            if taken {
                core::task::Poll::Ready(())
            } else {
                core::task::Poll::Pending
            }
        })
        .await;
        Turn(context, flag)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        (self.1)(self.0.services()).store(false, Ordering::Release);
    }
}

/// Words per lane, indexed by lane (inactive lanes hold zeros). On the heap, as every per-lane
/// buffer a script keeps across an `.await`: the exchange's future is boxed, and stays small.
pub(crate) type LaneWords = Vec<[u64; 8]>;

/// A C `int` or `i64` result as the reply word: sign-extended.
pub(crate) fn c_result(value: i64) -> u64 {
    value as u64
}

/// C's `EOF`, as a reply word.
pub(crate) const EOF_WORD: u64 = u64::MAX;

/// A value per lane of the request (`L` of them, indexed by lane), on the heap: per-lane
/// buffers a script keeps across an `.await` live in its boxed future, which stays small.
pub(crate) fn per_lane<T: Clone>(req: &Request, value: T) -> Vec<T> {
    std::vec![value; req.lane_size() as usize]
}

/// `recv`, keeping every active lane's eight words.
pub(crate) async fn recv_words(req: &mut Request) -> Result<LaneWords, ServerError> {
    let mut words = per_lane(req, [0u64; 8]);
    req.recv(|lane, p| words[lane as usize] = p.read().data)
        .await?;
    Ok(words)
}

/// `send` of one reply word (buf\[0\]) per lane.
pub(crate) async fn send_word0(req: &mut Request, replies: &[u64]) -> Result<(), ServerError> {
    req.send(|lane, p| p.set_word(0, replies[lane as usize]))
        .await
}

/// The bytes of a C string up to (without) its first NUL.
pub(crate) fn until_nul(bytes: &[u8]) -> &[u8] {
    bytes.split(|&b| b == 0).next().unwrap_or_default()
}

/// The refusals of one request, per lane; the request ends as [`Outcome::Refused`] if any.
#[derive(Default)]
pub(crate) struct Refusals {
    /// The lanes refused.
    mask: u64,
    /// The first refusal's lane and reason, for the log line.
    first: Option<String>,
}

impl Refusals {
    pub(crate) fn lane(&mut self, lane: u32, why: impl fmt::Display) {
        self.mask |= 1 << lane;
        if self.first.is_none() {
            self.first = Some(std::format!("lane {lane}: {why}"));
        }
    }
    /// Whether `lane` was refused.
    pub(crate) fn has(&self, lane: u32) -> bool {
        self.mask >> lane & 1 == 1
    }
    /// `Ok` if nothing was refused, else the refusal (the script must be complete by now).
    pub(crate) fn finish(self) -> Result<Outcome, ServerError> {
        let more = self.mask.count_ones().saturating_sub(1);
        Ok(match self.first {
            None => Outcome::Served,
            Some(first) if more == 0 => Outcome::Refused(first),
            Some(first) => Outcome::Refused(std::format!("{first} (and {more} more lane(s))")),
        })
    }
}

/// Why a lane whose strings the memory budget refused ([`Received::refused`]) gets its error
/// value.
///
/// [`Received::refused`]: crate::server::exec::Received::refused
pub(crate) const OVER_BUDGET: &str =
    "its strings would take the server above its memory budget (Limits::held_bytes)";

/// A charge on the memory budget for a read of `Limits::read_bytes` at most, the lanes asking
/// `want(lane)` bytes each; the bytes it grants are what the read may take. When the budget has
/// less room, the read is served in part (possibly 0 bytes), with one log line.
pub(crate) fn read_charge(req: &Request, want: impl Fn(u32) -> u64) -> Charge {
    let context = req.context();
    let asked = active(req).fold(0u64, |sum, lane| sum.saturating_add(want(lane)));
    let wanted = asked.min(context.config.limits.read_bytes);
    let charge = context.memory.charge_at_most(wanted);
    if charge.bytes() < wanted {
        device_log!(
            context.log_limit,
            Warn,
            "{}: a read of {wanted} bytes is served in {} for the server's memory budget \
             (Limits::held_bytes)",
            context.config.name,
            charge.bytes()
        );
    }
    charge
}

/// The active lanes of a request.
pub(crate) fn active(req: &Request) -> impl Iterator<Item = u32> {
    lanes(req.mask())
}
