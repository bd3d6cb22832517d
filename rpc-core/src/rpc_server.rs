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

use std::boxed::Box;
use std::collections::BTreeSet;
use std::string::{String, ToString};
use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::mailbox::{LockTable, Mailbox, MailboxMemory};
use crate::opcode::Opcode;
use crate::port::{Backoff, Wait, SPIN_POLLS};
use crate::registry::{entry, Entry, MailboxInfo, Matcher, Registry, Request};
use crate::server::Server;
use crate::server_thread::{Control, ServerThread, Started, Stopped};
use crate::stats::{bump, Stats, StatsSnapshot};
use crate::sync::{lock, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

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
    /// The most bytes a lane may send in one `send_n` (PROTOCOL section 5). Default 64 MiB.
    pub stream_bound: u64,
    /// Give up a wait for a client's next packet after this long even though kernels still run
    /// (None: only when no kernel that could answer is running).
    pub wait_timeout: Option<Duration>,
    /// What `shutdown` does with live user guards.
    pub shutdown_policy: ShutdownPolicy,
    /// How long the worker parks between polls while kernels run but send nothing, once they
    /// have been silent for a while (the parks of a silent stretch start shorter and double up
    /// to this). About twice the wake-up latency of a silent kernel's first request; a longer
    /// park costs less CPU (`docs/performance.md`).
    pub park: Duration,
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
            stream_bound: 64 << 20,
            wait_timeout: None,
            shutdown_policy: ShutdownPolicy::Refuse,
            park: Duration::from_micros(50),
            doorbell_sleep: Duration::from_millis(1),
            log_stats_on_shutdown: false,
            services: Default::default(),
        }
    }
}

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
        // process only accesses mailbox memory through atomic views; `attach_region` checked
        // alignment and size once, and the region never changes.
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
    detached: AtomicBool,
    /// User guards covering this mailbox.
    users: Arc<Coverage>,
}

impl Attached {
    fn server(&self) -> Server<'_> {
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
struct Snapshot<T> {
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
    fn get(&self) -> Arc<T> {
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
    fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

/// State the handlers share: settings, statistics, the services' tables.
pub struct ServerContext {
    pub(crate) config: ServerConfig,
    pub(crate) stats: Stats,
    mailboxes: Snapshot<Vec<Arc<Attached>>>,
    registry: Snapshot<Registry>,
    next_id: AtomicU64,
    /// Guards that cover every mailbox.
    any_users: Arc<Coverage>,
    /// Set while a shutdown is in progress: waits on clients give up.
    pub(crate) stopping: AtomicBool,
    pub(crate) services: crate::services::Services,
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
}

/// The RPC server of one plugin instance. Dropping it shuts the worker down
/// ([`ShutdownPolicy::Force`] semantics, logged if kernels were still running).
pub struct RpcServer {
    inner: Arc<Inner>,
}

impl RpcServer {
    /// A stopped server with the standard handlers registered.
    pub fn new(config: ServerConfig) -> Self {
        let services = crate::services::Services::new(&config);
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
            },
            thread: ServerThread::new(),
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
    /// its ports is abandoned). Errors if no such mailbox is attached.
    pub fn detach(&self, id: MailboxId) -> Result<()> {
        let context = &self.inner.context;
        let attached = context.mailboxes.update(|list| {
            let at = list.iter().position(|m| m.id == id)?;
            Some(list.remove(at))
        });
        let attached = attached.ok_or(Error::NoSuchMailbox(id.0))?;
        // Release: pairs with the worker's Acquire load before it touches the mailbox again.
        attached.detached.store(true, Ordering::Release);
        self.inner.thread.notify();
        // The worker drops its snapshot at the end of the pass (or before it sleeps).
        let mut attempt = 0;
        while Arc::strong_count(&attached) > 1 {
            Backoff::step(attempt);
            attempt = attempt.saturating_add(1);
        }
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

    /// Registers a handler for one opcode, ahead of the standard ones and of handlers
    /// registered later.
    pub fn register(
        &self,
        opcode: Opcode,
        handler: impl Fn(&mut Request<'_, '_>) -> Result<()> + Send + Sync + 'static,
    ) {
        self.register_entry(entry(opcode.to_string(), Matcher::Opcode(opcode), handler));
    }

    /// Registers a handler for every opcode `accepts` says yes to.
    pub fn register_matching(
        &self,
        name: &str,
        accepts: impl Fn(Opcode) -> bool + Send + Sync + 'static,
        handler: impl Fn(&mut Request<'_, '_>) -> Result<()> + Send + Sync + 'static,
    ) {
        self.register_entry(entry(
            name,
            Matcher::Predicate(std::sync::Arc::new(accepts)),
            handler,
        ));
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
        ServerThread::start(&self.inner)
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
    fn mark(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }
    /// True if every user that had arrived at `mark` has left.
    fn gone_since(&self, mark: u64) -> bool {
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
        let mut control: crate::sync::MutexGuard<'_, Control> = lock(&self.inner.thread.control);
        control.users -= 1;
        self.covered.leave(self.ticket);
        if control.users == 0 {
            // Wakes a shutdown waiting for the users to go (the worker notices by itself).
            self.inner.thread.cv.notify_all();
        }
    }
}

/// How the worker waits for a client's next packet: back off, and give up once no kernel that
/// could own the port is running (every user covering the mailbox when the port was opened has
/// gone since), the mailbox is detached, the server is stopping, or the configured per-wait
/// timeout passed.
struct ServerWait<'s> {
    context: &'s ServerContext,
    mailbox: &'s Attached,
    /// The arrival marks of the mailbox's and the all-mailbox coverage when the port was opened.
    opened_marks: (u64, u64),
    /// When the current wait began, in ns since `epoch` (0: not yet).
    started_ns: AtomicU64,
    epoch: Instant,
}

impl Wait for ServerWait<'_> {
    fn pause(&self, port: u32, attempt: u32) -> Result<()> {
        if attempt >= SPIN_POLLS {
            let abandon = |reason| Err(Error::Abandoned { port, reason });
            if self.mailbox.detached.load(Ordering::Acquire) {
                return abandon("mailbox detached");
            }
            let (mailbox_mark, any_mark) = self.opened_marks;
            if self.mailbox.users.gone_since(mailbox_mark)
                && self.context.any_users.gone_since(any_mark)
            {
                return abandon("no running kernel can answer");
            }
            if self.context.stopping.load(Ordering::Relaxed) {
                return abandon("server shutting down");
            }
            if let Some(timeout) = self.context.config.wait_timeout {
                let now = self.epoch.elapsed().as_nanos() as u64 + 1;
                let started = self.started_ns.load(Ordering::Relaxed);
                if attempt == SPIN_POLLS || started == 0 {
                    self.started_ns.store(now, Ordering::Relaxed);
                } else if Duration::from_nanos(now - started) > timeout {
                    return abandon("timed out");
                }
            }
        }
        Backoff::step(attempt);
        Ok(())
    }
}

impl Inner {
    /// One pass over every attached mailbox, serving every pending port. Returns how many.
    pub(crate) fn serve_pass(&self, cache: &mut PassCache) -> usize {
        let context = &self.context;
        cache.refresh(context);
        let (Some(mailboxes), Some(registry)) = (&cache.mailboxes, &cache.registry) else {
            return 0;
        };
        let mut served = 0;
        for (mailbox, hot) in mailboxes.iter().zip(cache.hot.iter_mut()) {
            let server = mailbox.server();
            // Every pending port in index order, plus the recently served ones re-checked on
            // the way (see `scan`), so a busy client on a large mailbox waits for a stride of
            // the scan, not a whole pass.
            let mut sweep = server.sweep(hot);
            while !mailbox.detached.load(Ordering::Acquire) {
                let Some(index) = sweep.next_pending() else {
                    break;
                };
                // Read just before the port opens: the kernel owning it is among these users.
                let wait = ServerWait {
                    context,
                    mailbox,
                    opened_marks: (mailbox.users.mark(), context.any_users.mark()),
                    started_ns: AtomicU64::new(0),
                    epoch: cache.epoch,
                };
                let Some(port) = server.try_open(index, &wait) else {
                    continue;
                };
                sweep.served(index);
                self.dispatch(port, mailbox, registry);
                served += 1;
            }
        }
        // Only the worker writes this counter: a plain load and store, no RMW needed.
        let passes = &context.stats.passes;
        passes.store(passes.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        served
    }

    fn dispatch(&self, mut port: crate::ServerPort<'_>, mailbox: &Attached, registry: &Registry) {
        let context = &self.context;
        let name = &context.config.name;
        let (opcode, index) = (port.opcode(), port.index());
        if let Err(error) = port.check_mask() {
            log::warn!(
                "{name}: mailbox {} port {index}: {opcode}: {error}; closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.bad_headers);
            return; // Dropping the port closes it: the client reads its own request back.
        }
        let Some(entry) = registry.find(opcode) else {
            log::warn!(
                "{name}: mailbox {} port {index}: unknown opcode {opcode}; closed unanswered",
                mailbox.id.0
            );
            bump(&context.stats.unknown);
            return;
        };
        log::debug!(
            "{name}: mailbox {} port {index}: {opcode} mask {:#x}",
            mailbox.id.0,
            port.mask()
        );
        let info = MailboxInfo {
            id: mailbox.id,
            layout: mailbox.layout,
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (entry.handler)(&mut Request {
                port: &mut port,
                mailbox: info,
                context,
            })
        }));
        match result {
            Ok(Ok(())) => context.stats.served(opcode),
            Ok(Err(Error::Refused(why))) => {
                log::warn!(
                    "{name}: mailbox {} port {index}: {opcode} refused: {why}",
                    mailbox.id.0
                );
                bump(&context.stats.refused);
                context.stats.served(opcode);
            }
            Ok(Err(error @ Error::Abandoned { .. })) => {
                log::warn!(
                    "{name}: mailbox {} port {index}: {opcode}: {error}; port reset",
                    mailbox.id.0
                );
                bump(&context.stats.abandoned);
                port.reset();
            }
            Ok(Err(error)) => {
                log::error!(
                    "{name}: mailbox {} port {index}: {opcode} failed: {error}",
                    mailbox.id.0
                );
                bump(&context.stats.errors);
            }
            Err(panic) => {
                let text = panic_message(panic.as_ref());
                log::error!(
                    "{name}: mailbox {} port {index}: handler for {opcode} panicked: {text}",
                    mailbox.id.0
                );
                bump(&context.stats.panics);
            }
        }
    }
}

/// The worker's copies of the mailbox list and the registry, refreshed when they change.
pub(crate) struct PassCache {
    mailboxes: Option<Arc<Vec<Arc<Attached>>>>,
    registry: Option<Arc<Registry>>,
    /// The recently served ports of each mailbox of `mailboxes`, in the same order.
    hot: Vec<crate::scan::HotPorts>,
    /// The ports of all of `mailboxes` together (what one pass scans).
    ports: usize,
    versions: (u64, u64),
    epoch: Instant,
}

impl PassCache {
    pub(crate) fn new() -> Self {
        PassCache {
            mailboxes: None,
            registry: None,
            hot: Vec::new(),
            ports: 0,
            versions: (u64::MAX, u64::MAX),
            epoch: Instant::now(),
        }
    }

    fn refresh(&mut self, context: &ServerContext) {
        let versions = (context.mailboxes.version(), context.registry.version());
        if self.mailboxes.is_none() || versions != self.versions {
            let mailboxes = context.mailboxes.get();
            self.hot = std::vec![Default::default(); mailboxes.len()];
            self.ports = mailboxes.iter().map(|m| m.layout.ports() as usize).sum();
            self.mailboxes = Some(mailboxes);
            self.registry = Some(context.registry.get());
            self.versions = versions;
        }
    }

    /// The ports one pass scans (as of the last pass).
    pub(crate) fn ports(&self) -> usize {
        self.ports
    }

    /// Lets go of every mailbox (before sleeping, so `detach` never waits on a sleeper).
    /// A doorbell to sleep on: only when every attached mailbox has one and no request is open
    /// in any (each counter 0). Then an open request rings one of them (waiting on the first,
    /// the others are seen at the next poll, at most `doorbell_sleep` later).
    #[cfg(not(loom))]
    pub(crate) fn quiet_doorbell(&self) -> Option<&dyn crate::plugin::Doorbell> {
        let mailboxes = self.mailboxes.as_ref()?;
        let mut bells = mailboxes.iter().map(|m| m.doorbell.as_deref());
        let first = bells.next()??;
        let all_quiet = std::iter::once(Some(first))
            .chain(bells)
            .all(|bell| bell.is_some_and(|b| b.counter().load(Ordering::Relaxed) == 0));
        all_quiet.then_some(first)
    }

    #[cfg(loom)]
    pub(crate) fn quiet_doorbell(&self) -> Option<&'static dyn crate::plugin::Doorbell> {
        None
    }

    pub(crate) fn clear(&mut self) {
        self.mailboxes = None;
    }
}
