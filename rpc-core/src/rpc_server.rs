//! The RPC server of one plugin instance: attached mailboxes, handlers, statistics, users and
//! the one [`ServerThread`](crate::server_thread) that serves them.
//!
//! ```text
//! RpcServer ──Arc──> Inner { context: ServerContext, thread: ServerThread }
//!                        ^                ^
//!           UserGuard ───┘                └── the worker thread (while Running)
//! ```
//! Attaching and detaching work at any time, also while the worker runs: the worker reads the
//! set through a versioned snapshot it refreshes each pass and drops before it sleeps, and
//! `detach` returns only once the worker no longer holds the mailbox.
//!
//! # Calls a handler may make on its own server
//! Handlers run on the worker (scripts between their `.await`s, packet handlers whole), so a
//! call that would wait for the worker would wait for itself. None does:
//! - `start`: the worker runs, so `AlreadyRunning` (or, in the worker's last pass after a
//!   shutdown began, `Refused`: a new worker cannot start before this one is joined);
//! - `shutdown`, `shutdown_with`: `Refused` (a thread cannot join itself); a handler that wants
//!   its server stopped asks another thread to do it;
//! - `detach`: returns at once; the worker lets go of the mailbox after the pass (a handler
//!   detaching its own request's mailbox gets no reply to that request through: its memory is
//!   left untouched from then on);
//! - `attach`, `register*`, `user*`, `stats`, the services' setters: take short locks the
//!   worker never holds while it runs a handler;
//! - dropping the last `RpcServer` (through a `Weak` upgraded in a handler): the worker is
//!   told to stop and finishes by itself, after which the server's state and mailboxes are freed.

use std::boxed::Box;
use std::collections::BTreeSet;
use std::string::{String, ToString};
use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::mailbox::{LockTable, Mailbox, MailboxMemory};
use crate::opcode::Opcode;
use crate::port::Backoff;
use crate::registry::{entry, Entry, Handler, Matcher, Registry, Request};
use crate::server::Server;
use crate::server_thread::{ServerThread, Started, Stopped};
use crate::stats::{Stats, StatsSnapshot};
use crate::sync::{lock, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};
use std::future::Future;

/// What to do when `shutdown` finds kernels still holding user guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownPolicy {
    /// Return [`Error::LiveUsers`] and keep serving.
    Refuse,
    /// Wait up to this long for the guards to go, then refuse as above.
    Wait(Duration),
    /// Stop anyway, logging an error: the kernels lose their server.
    Force,
}

/// A server's settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Name used for the worker thread and in logs (`host`, `cuda`, ...).
    pub name: String,
    /// What one request and one mailbox may make the host hold (streams, reads, files,
    /// MALLOC), and how many log lines devices may cause.
    pub limits: crate::limits::Limits,
    /// Treat a client as gone once its exchange has made no progress for this long: the
    /// exchange is then abandoned and its port freed for a new client. Only for a server that has no kernels to count, whose
    /// clients are processes that may die (`rpc-serve`); a kernel's exchange is abandoned only
    /// once no kernel that could answer runs. None (the default): never.
    pub client_timeout: Option<Duration>,
    /// Threads that run blocking calls (files, FIFOs, terminals, SYSTEM, host calls) beside the
    /// server thread, started as needed. Default 4.
    pub io_threads: usize,
    /// How long `shutdown` waits for the I/O threads to finish their calls before it abandons
    /// the ones stuck in one (logged and counted in `io_threads_abandoned`). Default 200 ms.
    pub io_grace: Duration,
    /// What `shutdown` does with live user guards.
    pub shutdown_policy: ShutdownPolicy,
    /// The longest the worker parks between polls while kernels run but send nothing. The
    /// parks of a silent stretch grow with the silence (an eighth of it so far, from 5 µs), so
    /// a kernel that paused for a moment is answered within a few µs and one silent for
    /// milliseconds costs about (CPU of one wake-up) / `park`. Default 250 µs, LLVM's own
    /// nap (`docs/performance.md`).
    pub park: Duration,
    /// Where clients are invisible (`rpc-serve`: other processes, no launches to see end): the
    /// longest park once nothing was asked for [`ABSENT_AFTER`], when the client is most
    /// likely gone; the parks grow past `park` up to this, so a server nobody uses costs
    /// almost nothing, and the first request after such a silence waits up to this long.
    /// `None` (the default): never past `park`.
    pub absent_park: Option<Duration>,
    /// With doorbells (v2, a device that raises interrupts): the longest the worker sleeps on
    /// one while no request is open before it polls anyway (a lost interrupt costs this much).
    pub doorbell_sleep: Duration,
    /// Log the statistics (at `info`) when the worker stops.
    pub log_stats_on_shutdown: bool,
    /// Policies of the standard services (exit, files, SYSTEM).
    pub services: crate::services::ServicesConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            name: "rpc".into(),
            limits: Default::default(),
            client_timeout: None,
            io_threads: 4,
            io_grace: Duration::from_millis(200),
            shutdown_policy: ShutdownPolicy::Refuse,
            park: Duration::from_micros(250),
            absent_park: None,
            doorbell_sleep: Duration::from_millis(1),
            log_stats_on_shutdown: false,
            services: Default::default(),
        }
    }
}

/// The silence after which `ServerConfig::absent_park` applies.
pub const ABSENT_AFTER: Duration = Duration::from_secs(1);

/// The text of a caught panic's payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Names an attached mailbox within its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MailboxId(pub u64);

/// Memory holding one mailbox, as the server reads it.
pub trait MailboxSource: Send + Sync {
    fn view(&self) -> Mailbox<'_>;
}

impl MailboxSource for MailboxMemory {
    fn view(&self) -> Mailbox<'_> {
        MailboxMemory::view(self)
    }
}

/// A mailbox the server shares with whoever else holds the `Arc` (host-side clients).
impl MailboxSource for Arc<MailboxMemory> {
    fn view(&self) -> Mailbox<'_> {
        MailboxMemory::view(self)
    }
}

/// A plugin's shared region holding a mailbox of `layout`.
#[cfg(not(loom))]
struct RegionMailbox {
    region: Box<dyn crate::plugin::SharedRegion>,
    layout: Layout,
}

#[cfg(not(loom))]
impl MailboxSource for RegionMailbox {
    fn view(&self) -> Mailbox<'_> {
        // SAFETY: the region is owned by `self` (so it lives as long as the view), and this
        // process only accesses mailbox memory through same-size atomic views (the region's
        // `SharedRegion` contract); `attach_region` checked alignment and size once, and the
        // region never changes.
        unsafe { Mailbox::from_raw(self.region.host_ptr(), self.region.len(), self.layout) }
            .expect("checked when attached")
    }
}

/// One attached mailbox.
pub(crate) struct Attached {
    pub(crate) id: MailboxId,
    pub(crate) layout: Layout,
    source: Box<dyn MailboxSource>,
    locks: LockTable,
    #[cfg(not(loom))]
    doorbell: Option<Box<dyn crate::plugin::Doorbell>>,
    /// Set by `detach`: the worker stops touching the mailbox and abandons waits on it.
    pub(crate) detached: AtomicBool,
    /// User guards covering this mailbox.
    pub(crate) users: Arc<Coverage>,
    /// Per port: whether the last request dropped owned the buffer (see `dispatch`).
    pub(crate) owned: Box<[AtomicBool]>,
    /// Ports left locked mid-exchange, each released once the kernels that could still be
    /// inside its exchange are gone (see [`crate::dispatch`]).
    pub(crate) quarantine: Mutex<Vec<crate::dispatch::Quarantined>>,
    /// How many ports `quarantine` holds, read without its lock.
    pub(crate) quarantined: AtomicUsize,
    /// One bit per port with an exchange in flight (written by the worker only), so that a
    /// pass does not try to open those ports again when their clients answer.
    pub(crate) in_flight: Box<[AtomicU64]>,
}

impl Attached {
    #[cfg(not(loom))]
    pub(crate) fn doorbell(&self) -> Option<&dyn crate::plugin::Doorbell> {
        self.doorbell.as_deref()
    }

    pub(crate) fn server(&self) -> Server<'_> {
        let server = Server::new(self.source.view(), self.locks.words())
            .expect("lock table sized for the layout");
        #[cfg(not(loom))]
        if let Some(bell) = &self.doorbell {
            return server.with_doorbell(bell.counter());
        }
        server
    }
}

/// A versioned, copy-on-write list the worker reads without locking on every pass.
pub(crate) struct Snapshot<T> {
    current: Mutex<Arc<T>>,
    /// Bumped (Release) after each change; the worker compares (Acquire) to know to refresh.
    version: AtomicU64,
}

impl<T: Clone> Snapshot<T> {
    fn new(value: T) -> Self {
        Snapshot {
            current: Mutex::new(Arc::new(value)),
            version: AtomicU64::new(0),
        }
    }
    pub(crate) fn get(&self) -> Arc<T> {
        lock(&self.current).clone()
    }
    fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
        let mut current = lock(&self.current);
        let mut next = T::clone(&current);
        let result = change(&mut next);
        *current = Arc::new(next);
        // RMW: version v -> v + 1; Release so a reader seeing the new version finds the new list.
        self.version.fetch_add(1, Ordering::Release);
        result
    }
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

/// State the handlers share: settings, statistics, the services' tables.
pub struct ServerContext {
    pub(crate) config: ServerConfig,
    pub(crate) stats: Stats,
    pub(crate) mailboxes: Snapshot<Vec<Arc<Attached>>>,
    pub(crate) registry: Snapshot<Registry>,
    next_id: AtomicU64,
    /// Guards that cover every mailbox.
    pub(crate) any_users: Arc<Coverage>,
    /// Set while a shutdown is in progress: waits on clients give up.
    pub(crate) stopping: AtomicBool,
    pub(crate) services: crate::services::Services,
    /// The budget of log lines devices cause (`Limits::device_log_lines`).
    pub(crate) log_limit: crate::limits::LogLimit,
    /// Set by the runtime's `deinit`: the server never starts again.
    retired: AtomicBool,
}

impl ServerContext {
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    pub fn services(&self) -> &crate::services::Services {
        &self.services
    }
}

pub(crate) struct Inner {
    pub(crate) context: ServerContext,
    pub(crate) thread: ServerThread,
    /// The I/O threads blocking calls run on.
    pub(crate) io: crate::io_pool::IoPool,
}

/// The RPC server of one plugin instance. Dropping it shuts the worker down
/// ([`ShutdownPolicy::Force`] semantics, logged if kernels were still running).
pub struct RpcServer {
    pub(crate) inner: Arc<Inner>,
}

impl RpcServer {
    /// A stopped server with the standard handlers registered.
    pub fn new(config: ServerConfig) -> Self {
        let services = crate::services::Services::new(&config);
        let log_limit = crate::limits::LogLimit::new(config.limits.device_log_lines);
        let mut registry = Registry::default();
        crate::services::register_standard(&mut registry);
        let inner = Arc::new(Inner {
            context: ServerContext {
                config,
                stats: Stats::default(),
                mailboxes: Snapshot::new(Vec::new()),
                registry: Snapshot::new(registry),
                next_id: AtomicU64::new(1),
                any_users: Arc::new(Coverage::default()),
                stopping: AtomicBool::new(false),
                services,
                log_limit,
                retired: AtomicBool::new(false),
            },
            thread: ServerThread::new(),
            io: crate::io_pool::IoPool::default(),
        });
        RpcServer { inner }
    }

    pub fn name(&self) -> &str {
        &self.inner.context.config.name
    }
    pub fn context(&self) -> &ServerContext {
        &self.inner.context
    }
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.context.stats.snapshot()
    }

    /// Attaches a mailbox held in `source`; the worker serves it from its next pass on.
    pub fn attach(&self, source: Box<dyn MailboxSource>) -> MailboxId {
        self.attach_inner(
            source,
            #[cfg(not(loom))]
            None,
        )
    }

    /// Attaches a plugin's shared region holding a mailbox of `layout`.
    #[cfg(not(loom))]
    pub fn attach_region(
        &self,
        region: Box<dyn crate::plugin::SharedRegion>,
        layout: Layout,
    ) -> Result<MailboxId> {
        // Checks alignment and size once; `RegionMailbox::view` relies on it.
        // SAFETY: a view is only built here to validate; the region outlives this statement.
        unsafe { Mailbox::from_raw(region.host_ptr(), region.len(), layout) }?;
        Ok(self.attach(Box::new(RegionMailbox { region, layout })))
    }

    /// Attaches a v2 mailbox (in `source`) whose doorbell (PROTOCOL section 9) is `bell`: the
    /// server decrements its counter once per served port, and the worker sleeps on it while no
    /// request is open (every attached mailbox having a doorbell), polling on a timeout too.
    #[cfg(not(loom))]
    pub fn attach_with_doorbell(
        &self,
        source: Box<dyn MailboxSource>,
        bell: Box<dyn crate::plugin::Doorbell>,
    ) -> MailboxId {
        self.attach_inner(source, Some(bell))
    }

    /// [`RpcServer::attach_region`] with a doorbell.
    #[cfg(not(loom))]
    pub fn attach_region_with_doorbell(
        &self,
        region: Box<dyn crate::plugin::SharedRegion>,
        layout: Layout,
        bell: Box<dyn crate::plugin::Doorbell>,
    ) -> Result<MailboxId> {
        // SAFETY: as in `attach_region`: a validating view only.
        unsafe { Mailbox::from_raw(region.host_ptr(), region.len(), layout) }?;
        Ok(self.attach_with_doorbell(Box::new(RegionMailbox { region, layout }), bell))
    }

    fn attach_inner(
        &self,
        source: Box<dyn MailboxSource>,
        #[cfg(not(loom))] doorbell: Option<Box<dyn crate::plugin::Doorbell>>,
    ) -> MailboxId {
        let context = &self.inner.context;
        // RMW: hands out each id once.
        let id = MailboxId(context.next_id.fetch_add(1, Ordering::Relaxed));
        // Its tables exist before the worker can see a request of it.
        context.services.register_mailbox(id);
        let layout = source.view().layout();
        let attached = Arc::new(Attached {
            id,
            layout,
            source,
            locks: LockTable::new(layout.ports()),
            #[cfg(not(loom))]
            doorbell,
            detached: AtomicBool::new(false),
            users: Arc::new(Coverage::default()),
            owned: (0..layout.ports())
                .map(|_| AtomicBool::new(false))
                .collect(),
            quarantine: Mutex::new(Vec::new()),
            quarantined: AtomicUsize::new(0),
            in_flight: (0..layout.ports().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        });
        context.mailboxes.update(|list| list.push(attached));
        log::debug!(
            "{}: attached mailbox {} ({layout})",
            context.config.name,
            id.0
        );
        id
    }

    /// Detaches a mailbox and frees it once the worker no longer holds it (a wait on one of
    /// its ports is abandoned); the files its kernels opened are closed and their MALLOC
    /// allocations freed. Errors if no such mailbox is attached.
    pub fn detach(&self, id: MailboxId) -> Result<()> {
        let context = &self.inner.context;
        let attached = context.mailboxes.update(|list| {
            let at = list.iter().position(|m| m.id == id)?;
            Some(list.remove(at))
        });
        let attached = attached.ok_or(Error::NoSuchMailbox(id.0))?;
        // Release: pairs with the worker's Acquire load before it touches the mailbox again.
        attached.detached.store(true, Ordering::Release);
        // Its kernels can no longer ask anything: what they held goes now.
        context.services.forget_mailbox(id);
        if self.inner.thread.is_worker() {
            // From a handler: the worker lets go of the mailbox after this pass; it cannot wait
            // for itself.
            log::debug!(
                "{}: detached mailbox {} (from a handler)",
                context.config.name,
                id.0
            );
            return Ok(());
        }
        self.inner.thread.notify();
        // The worker lets go of the mailbox at its next pass (its copy of the list, and the
        // exchanges in flight on it) or before it sleeps, and notifies `cv` when it does. The
        // count drops outside the lock, so the wait is also timed: a notification that comes
        // between the check and the wait costs at most a millisecond, never a hang.
        let thread = &self.inner.thread;
        let mut control = lock(&thread.control);
        while Arc::strong_count(&attached) > 1 {
            control = thread
                .cv
                .wait_timeout(control, Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(control);
        log::debug!("{}: detached mailbox {}", context.config.name, id.0);
        Ok(())
    }

    /// Ports of mailbox `id` whose request the server has not finished (`C != S`), or None if
    /// no such mailbox is attached.
    pub fn pending(&self, id: MailboxId) -> Option<usize> {
        let mailboxes = self.inner.context.mailboxes.get();
        let attached = mailboxes.iter().find(|m| m.id == id)?;
        let server = attached.server();
        Some(
            (0..attached.layout.ports())
                .filter(|&i| server.is_pending(i))
                .count(),
        )
    }

    /// Waits (backing off) until mailbox `id` has no pending request or `timeout` passes;
    /// true if it drained. A launcher calls it after a kernel completed, so that requests the
    /// kernel sent last without waiting for an answer (FREE, EXIT's status) are served.
    pub fn wait_drained(&self, id: MailboxId, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut attempt = 0;
        while self.pending(id).unwrap_or(0) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            Backoff::step(attempt);
            attempt = attempt.saturating_add(1);
        }
        true
    }

    /// The ids of the attached mailboxes.
    pub fn mailboxes(&self) -> Vec<MailboxId> {
        self.inner
            .context
            .mailboxes
            .get()
            .iter()
            .map(|m| m.id)
            .collect()
    }

    /// Registers a script handler for one opcode, ahead of the standard ones and of handlers
    /// registered later: an async function of the [`Request`] whose every `.await` on the port
    /// lets the server thread serve the other ports until the client answers.
    ///
    /// ```no_run
    /// # let server = rpc_core::RpcServer::new(Default::default());
    /// server.register(rpc_core::Opcode::user(1), |mut req| async move {
    ///     let data = req.recv_n().await?;
    ///     let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    ///     req.send_n(&slices).await
    /// });
    /// ```
    pub fn register<F, Fut>(&self, opcode: Opcode, script: F)
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.register_handler(
            Matcher::Opcode(opcode),
            opcode.to_string(),
            Handler::script(script),
        );
    }

    /// Registers a packet handler for a one-packet opcode (the client sends one packet and
    /// reads one back): `reply` rewrites each active lane's packet in place.
    ///
    /// ```no_run
    /// # let server = rpc_core::RpcServer::new(Default::default());
    /// server.register_packet(rpc_core::Opcode::user(2), |_lane, p| {
    ///     p.set_word(0, p.word(0) * p.word(0))
    /// });
    /// ```
    pub fn register_packet(
        &self,
        opcode: Opcode,
        reply: impl Fn(u32, crate::Packet<'_>) + Send + Sync + 'static,
    ) {
        self.register_handler(
            Matcher::Opcode(opcode),
            opcode.to_string(),
            Handler::packet(reply),
        );
    }

    /// Registers a script handler for every opcode `accepts` says yes to.
    pub fn register_matching<F, Fut>(
        &self,
        name: &str,
        accepts: impl Fn(Opcode) -> bool + Send + Sync + 'static,
        script: F,
    ) where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.register_handler(
            Matcher::Predicate(std::sync::Arc::new(accepts)),
            name.into(),
            Handler::script(script),
        );
    }

    /// Registers `handler` for the opcodes `matcher` accepts, under `name`.
    pub fn register_handler(&self, matcher: Matcher, name: String, handler: Handler) {
        self.register_entry(entry(name, matcher, handler));
    }

    fn register_entry(&self, entry: Entry) {
        self.inner.context.registry.update(|r| r.push_user(entry));
    }

    /// The handlers' names in lookup order.
    pub fn handler_names(&self) -> Vec<String> {
        self.inner
            .context
            .registry
            .get()
            .names()
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// Starts the worker unless it runs already.
    pub fn start(&self) -> Result<Started> {
        // Acquire: pairs with `retire`'s Release (a plain flag; nothing else is ordered by it).
        if self.inner.context.retired.load(Ordering::Acquire) {
            return Err(Error::Deinitialised);
        }
        ServerThread::start(&self.inner)
    }

    /// Makes every later `start` fail with [`Error::Deinitialised`] (the runtime's `deinit`).
    #[cfg_attr(loom, allow(dead_code))] // Its one caller, the runtime, is not built under loom.
    pub(crate) fn retire(&self) {
        self.inner.context.retired.store(true, Ordering::Release);
    }

    /// Stops the worker (per the configured [`ShutdownPolicy`]) and joins it.
    pub fn shutdown(&self) -> Result<Stopped> {
        self.shutdown_with(self.inner.context.config.shutdown_policy)
    }

    /// Stops the worker with an explicit policy.
    pub fn shutdown_with(&self, policy: ShutdownPolicy) -> Result<Stopped> {
        ServerThread::shutdown(&self.inner, policy)
    }

    /// True while a worker runs (state Running).
    pub fn is_running(&self) -> bool {
        self.inner.thread.is_running()
    }

    /// Live worker threads of this server (0 or 1; exposed for the stress tests).
    pub fn live_workers(&self) -> usize {
        self.inner.thread.live_workers()
    }

    /// Most worker threads ever alive at once.
    pub fn max_live_workers(&self) -> usize {
        self.inner.thread.max_live_workers()
    }

    /// The worker's kernel thread id, while one runs (to read its CPU time).
    pub fn worker_tid(&self) -> Option<i32> {
        self.inner.thread.worker_tid()
    }

    /// A user covering every mailbox (e.g. a client that is not a kernel launch).
    pub fn user(&self) -> UserGuard {
        UserGuard::new(&self.inner, self.inner.context.any_users.clone())
    }

    /// A user covering one mailbox: a launch of a kernel of the image that mailbox serves.
    pub fn user_for(&self, id: MailboxId) -> UserGuard {
        let covered = self
            .inner
            .context
            .mailboxes
            .get()
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.users.clone());
        UserGuard::new(&self.inner, covered.unwrap_or_default())
    }

    /// Live user guards.
    pub fn users(&self) -> usize {
        lock(&self.inner.thread.control).users
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        if self.inner.thread.is_worker() {
            // A handler dropped the last handle (through a `Weak` it upgraded): see
            // `ServerThread::abandon_from_worker`.
            ServerThread::abandon_from_worker(&self.inner);
            return;
        }
        if let Err(error) = self.shutdown_with(ShutdownPolicy::Force) {
            log::error!("{}: shutdown on drop failed: {error}", self.name());
        }
    }
}

/// A kernel (or other client) that may send requests: while any guard lives the worker stays
/// awake. Dropping it ends the use.
#[must_use = "the worker sleeps again once the guard is dropped"]
pub struct UserGuard {
    inner: Arc<Inner>,
    covered: Arc<Coverage>,
    ticket: u64,
}

/// The users covering some mailboxes (one mailbox, or all of them). Each user gets a ticket in
/// arrival order; a port opened when `arrivals` was A belongs to a kernel holding a ticket
/// below A, so once the oldest live ticket is A or more, no kernel that could own the port runs.
///
/// Changed only under the server thread's `control` lock; the worker reads the atomics without
/// it (Relaxed: a stale value only delays abandoning a wait by one poll).
pub(crate) struct Coverage {
    live: Mutex<BTreeSet<u64>>,
    arrivals: AtomicU64,
    /// The smallest live ticket, or `u64::MAX` when there is none.
    oldest_live: AtomicU64,
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage {
            live: Mutex::new(BTreeSet::new()),
            arrivals: AtomicU64::new(0),
            oldest_live: AtomicU64::new(u64::MAX),
        }
    }
}

impl Coverage {
    fn arrive(&self) -> u64 {
        // RMW: hands out each ticket once.
        let ticket = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let mut live = lock(&self.live);
        live.insert(ticket);
        self.oldest_live
            .store(*live.first().expect("just inserted"), Ordering::Relaxed);
        ticket
    }
    fn leave(&self, ticket: u64) {
        let mut live = lock(&self.live);
        live.remove(&ticket);
        self.oldest_live
            .store(live.first().copied().unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    /// The mark to test a port opened now against.
    pub(crate) fn mark(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }
    /// True if every user that had arrived at `mark` has left.
    pub(crate) fn gone_since(&self, mark: u64) -> bool {
        self.oldest_live.load(Ordering::Relaxed) >= mark
    }
}

impl UserGuard {
    fn new(inner: &Arc<Inner>, covered: Arc<Coverage>) -> Self {
        let mut control = lock(&inner.thread.control);
        control.users += 1;
        control.epoch += 1;
        let ticket = covered.arrive();
        if control.users == 1 {
            inner.thread.cv.notify_all();
        }
        UserGuard {
            inner: inner.clone(),
            covered,
            ticket,
        }
    }
}

impl Drop for UserGuard {
    fn drop(&mut self) {
        let mut control = lock(&self.inner.thread.control);
        control.users -= 1;
        self.covered.leave(self.ticket);
        if control.users == 0 {
            // Wakes a shutdown waiting for the users to go (the worker notices by itself).
            self.inner.thread.cv.notify_all();
        }
    }
}
