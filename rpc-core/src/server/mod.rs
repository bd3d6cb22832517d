//! The RPC server of one plugin instance: attached mailboxes, handlers, statistics, users and
//! the one [`ServerThread`](crate::server::thread) that serves them (its loop:
//! [`worker`](crate::server::worker)).
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
use std::string::{String, ToString};
use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::protocol::opcode::Opcode;
use crate::protocol::port::Backoff;
use crate::server::mailboxes::{Attached, MailboxSlot, Slots, Snapshot};
use crate::server::registry::{entry, Entry, Handler, Matcher, Registry};
use crate::server::request::Request;
use crate::server::stats::{Reporting, Stats, StatsSnapshot};
pub use crate::server::thread::ShutdownPolicy;
use crate::server::thread::{ServerThread, Started, Stopped};
use crate::server::users::Coverage;
pub use crate::server::worker::ABSENT_AFTER;
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use error::{Outcome, ServerError};
use std::future::Future;

pub(crate) mod dispatch;
pub(crate) mod error;
pub(crate) mod exec;
pub(crate) mod io_pool;
pub(crate) mod limits;
pub(crate) mod mailboxes;
#[cfg(test)]
mod pass_tests;
pub(crate) mod registry;
pub(crate) mod request;
pub(crate) mod stats;
pub(crate) mod thread;
pub(crate) mod users;
pub(crate) mod worker;

#[cfg(all(test, loom))]
mod loom_dispatch;
#[cfg(all(test, loom))]
mod loom_io_pool;
#[cfg(all(test, loom))]
mod loom_thread;

#[cfg(not(loom))]
pub use mailboxes::RegionMailbox;
pub use mailboxes::{AtomicMailbox, AttachOptions, Doorbell, MailboxId, SharedRegion};
pub use users::UserGuard;

/// A server's settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Name used for the worker thread and in logs (`host`, `cuda`, ...).
    pub name: String,
    /// What one request and one mailbox may make the host hold (byte strings, reads, files,
    /// MALLOC), and how many log lines devices may cause.
    pub limits: crate::server::limits::Limits,
    /// Treat a client as gone once its exchange has waited this long for it (time the exchange
    /// spends on an I/O thread does not count: there the client waits for us): the exchange is
    /// then abandoned and its port freed for a new client. Only for a server that has no kernels to count, whose
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
    /// With doorbells (v2, a device that raises interrupts, on every attached mailbox): the
    /// longest the worker sleeps on one while no request is open before it polls anyway (a
    /// lost interrupt costs this much). It sleeps on them instead of parking once a park would
    /// last 50 µs (or `park`, if shorter), after some 400 µs of silence: the shorter parks
    /// before answer sooner than an interrupt's wake-up. Default 1 ms.
    pub doorbell_sleep: Duration,
    /// Log the statistics (at `info`) when the worker stops.
    pub log_stats_on_shutdown: bool,
    /// Policies of the standard services (exit, files, SYSTEM).
    pub services: crate::server::limits::ServicesConfig,
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

/// The text of a caught panic's payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// State the handlers share: settings, statistics, the services' tables.
pub struct ServerContext {
    pub(crate) config: ServerConfig,
    /// Shared with the layer above, which counts the device output it gives up
    /// ([`Reporting`]).
    pub(crate) stats: std::sync::Arc<Stats>,
    pub(crate) mailboxes: std::sync::Arc<Snapshot<Vec<Arc<Attached>>>>,
    pub(crate) registry: Snapshot<Registry>,
    next_id: AtomicU64,
    /// Guards that cover every mailbox.
    pub(crate) any_users: Arc<Coverage>,
    /// The standard services' state (`crate::services::Services`), held as an [`Extension`]
    /// so that this layer does not name the one above it.
    pub(crate) extension: Box<dyn Extension>,
    /// The budget of log lines devices cause (`Limits::device_log_lines`), shared with the
    /// layer above (the services log lost device output through it).
    pub(crate) log_limit: std::sync::Arc<crate::server::limits::LogLimit>,
    /// The memory every device together may make the server hold (`Limits::held_bytes`).
    pub(crate) memory: std::sync::Arc<crate::server::limits::MemoryBudget>,
    /// Set by the runtime's `deinit`: the server never starts again.
    retired: AtomicBool,
}

impl ServerContext {
    /// The server's settings.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }
    /// Bytes of device data the server holds now, against `Limits::held_bytes`: byte strings
    /// being received and read buffers of every exchange in flight.
    pub fn held_bytes(&self) -> u64 {
        self.memory.held()
    }
}

/// State the layer above the server keeps for it (the standard services' policies and streams),
/// told when a mailbox is attached (before the worker can see a request of it: it makes the
/// mailbox's slot, kept with the mailbox) and detached (after which its kernels can no longer
/// ask anything: it empties the slot).
pub(crate) trait Extension: Send + Sync + 'static {
    fn mailbox_attached(&self, id: MailboxId) -> MailboxSlot;
    fn mailbox_detached(&self, id: MailboxId, slot: &MailboxSlot);
    /// The worker is exiting (a shutdown): what the layer above still holds for the device
    /// (its output) is written by `deadline` or given up.
    fn worker_exiting(&self, deadline: std::time::Instant);
    /// For the layer above to find its own type again.
    fn as_any(&self) -> &dyn std::any::Any;
}

pub(crate) struct Inner {
    pub(crate) context: ServerContext,
    pub(crate) thread: ServerThread,
    /// The I/O threads blocking calls run on.
    pub(crate) io: crate::server::io_pool::IoPool,
}

/// The RPC server of one plugin instance. Dropping it shuts the worker down
/// ([`ShutdownPolicy::Force`] semantics, logged if kernels were still running).
pub struct RpcServer {
    pub(crate) inner: Arc<Inner>,
}

impl RpcServer {
    /// A stopped server with the handlers of `registry` and the layer above's extension, made
    /// by `extension` from the attached mailboxes' slots (`RpcServer::new`, in
    /// `crate::services`, gives it the standard services).
    pub(crate) fn assemble(
        config: ServerConfig,
        registry: Registry,
        extension: impl FnOnce(Slots, Reporting) -> Box<dyn Extension>,
    ) -> Self {
        let mailboxes = std::sync::Arc::new(Snapshot::new(Vec::new()));
        let stats = std::sync::Arc::new(Stats::default());
        let log_limit = std::sync::Arc::new(crate::server::limits::LogLimit::new(
            config.limits.device_log_lines,
        ));
        let reporting = Reporting {
            stats: stats.clone(),
            log_limit: log_limit.clone(),
        };
        let extension = extension(Slots(mailboxes.clone()), reporting);
        let memory = crate::server::limits::MemoryBudget::new(config.limits.held_bytes);
        let thread = ServerThread::new(config.name.clone());
        let inner = Arc::new(Inner {
            context: ServerContext {
                config,
                stats,
                mailboxes,
                registry: Snapshot::new(registry),
                next_id: AtomicU64::new(1),
                any_users: Arc::new(Coverage::default()),
                extension,
                log_limit,
                memory,
                retired: AtomicBool::new(false),
            },
            thread,
            io: crate::server::io_pool::IoPool::default(),
        });
        RpcServer { inner }
    }

    /// The server's name (`ServerConfig::name`).
    pub fn name(&self) -> &str {
        &self.inner.context.config.name
    }
    /// What the handlers share: settings, statistics, services.
    pub fn context(&self) -> &ServerContext {
        &self.inner.context
    }
    /// A snapshot of the statistics. A packet handler's request is counted before its reply,
    /// but a script's after its last hand-over (the reply) lets its client go on, so a
    /// snapshot taken right after a script's reply came back may miss it: read the counts of a mailbox's requests once [`RpcServer::wait_drained`] returned true
    /// for it (what `PluginRuntime::synchronize` waits on), or after `shutdown`.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.context.stats.snapshot()
    }

    /// Registers a script handler for one opcode, ahead of the standard ones and of handlers
    /// registered later: an async function of the [`Request`] whose every `.await` on the port
    /// lets the server thread serve the other ports until the client answers. It ends with
    /// `Ok(())` or `Ok(`[`Outcome::Served`]`)`; `Ok(`[`Outcome::Refused`]`)`, its script
    /// complete, which closes the port as served and counts a refusal; or a failure, a
    /// [`ServerError`] (`?` lifts the port's `ProtocolError`s into one), which drains the port
    /// (PROTOCOL section 11: the rest of the client's script is answered with the opcode's
    /// failure word, and never run as a request).
    ///
    /// ```no_run
    /// # let server = rpc_core::RpcServer::new(Default::default());
    /// server.register(rpc_core::Opcode::user(1), |mut req| async move {
    ///     let data = req.recv_n().await?;
    ///     let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    ///     req.send_n(&slices).await
    /// });
    /// ```
    pub fn register<F, Fut, R>(&self, opcode: Opcode, script: F)
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ServerError>> + Send + 'static,
        R: Into<Outcome> + 'static,
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
        reply: impl Fn(u32, crate::protocol::Packet<'_>) + Send + Sync + 'static,
    ) {
        self.register_handler(
            Matcher::Opcode(opcode),
            opcode.to_string(),
            Handler::packet(reply),
        );
    }

    /// Registers a script handler for every opcode `accepts` says yes to.
    pub fn register_matching<F, Fut, R>(
        &self,
        name: &str,
        accepts: impl Fn(Opcode) -> bool + Send + Sync + 'static,
        script: F,
    ) where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ServerError>> + Send + 'static,
        R: Into<Outcome> + 'static,
    {
        self.register_handler(
            Matcher::Predicate(std::sync::Arc::new(accepts)),
            name.into(),
            Handler::script(script),
        );
    }

    /// Registers `handler` for the opcodes `matcher` accepts, under `name`.
    pub(crate) fn register_handler(&self, matcher: Matcher, name: String, handler: Handler) {
        self.register_entry(entry(name, matcher, handler));
    }

    /// Registers `handler` as the one owner of `opcode` (see [`Registry::push_owner`]).
    pub(crate) fn register_owner(
        &self,
        opcode: Opcode,
        handler: Handler,
    ) -> Result<(), ServerError> {
        let entry = entry(opcode.to_string(), Matcher::Opcode(opcode), handler);
        self.inner
            .context
            .registry
            .update(|r| r.push_owner(opcode, entry))
            .map_err(|owner| ServerError::OpcodeTaken { opcode, owner })
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

    /// Starts the worker unless it runs already. Both `start` and [`RpcServer::shutdown`] may be
    /// called any number of times, in any order: a second one says it had nothing to do. A
    /// [`crate::PluginRuntime`] starts its server itself whenever it loads or launches an RPC
    /// image (after a `shutdown` too), and after its `deinit` `start` fails with
    /// [`ServerError::Deinitialised`].
    ///
    /// ```
    /// use rpc_core::{RpcServer, ServerConfig, Started, Stopped};
    /// let server = RpcServer::new(ServerConfig::default());
    /// assert_eq!(server.start()?, Started::Started);
    /// assert_eq!(server.start()?, Started::AlreadyRunning);
    /// assert!(server.is_running());
    /// assert_eq!(server.shutdown()?, Stopped::Stopped);
    /// assert_eq!(server.shutdown()?, Stopped::AlreadyStopped);
    /// assert_eq!(server.start()?, Started::Started, "a stopped server starts again");
    /// # let _ = server.shutdown()?;
    /// # Ok::<(), rpc_core::Error>(())
    /// ```
    pub fn start(&self) -> Result<Started, ServerError> {
        // Acquire: pairs with `retire`'s Release (a plain flag; nothing else is ordered by it).
        if self.inner.context.retired.load(Ordering::Acquire) {
            return Err(ServerError::Deinitialised);
        }
        let inner = self.inner.clone();
        let stats = &self.inner.context.stats;
        self.inner
            .thread
            .start(stats, move || crate::server::worker::run(inner))
    }

    /// Makes every later `start` fail with [`ServerError::Deinitialised`] (the runtime's `deinit`).
    #[cfg_attr(loom, allow(dead_code))] // Its one caller, the runtime, is not built under loom.
    pub(crate) fn retire(&self) {
        self.inner.context.retired.store(true, Ordering::Release);
    }

    /// Stops the worker and joins it; `AlreadyStopped` if none ran (see [`RpcServer::start`]).
    /// With kernels still holding user guards, the configured [`ShutdownPolicy`] decides:
    /// refuse with [`ServerError::LiveUsers`] (at once or after a wait) and keep serving, or stop
    /// anyway. Exchanges still in flight are abandoned (their ports quarantined: nothing handed
    /// back until their kernels are gone, then drained), and I/O threads stuck in a call are left behind and counted
    /// (`io_threads_abandoned`), never joined forever.
    pub fn shutdown(&self) -> Result<Stopped, ServerError> {
        self.shutdown_with(self.inner.context.config.shutdown_policy)
    }

    /// Stops the worker with an explicit policy.
    pub fn shutdown_with(&self, policy: ShutdownPolicy) -> Result<Stopped, ServerError> {
        let stopped = self.inner.thread.shutdown(policy)?;
        if stopped == Stopped::Stopped && self.inner.context.config.log_stats_on_shutdown {
            log::info!("{}: server statistics: {}", self.name(), self.stats());
        }
        Ok(stopped)
    }

    /// True while a worker runs (state Running).
    pub fn is_running(&self) -> bool {
        self.inner.thread.is_running()
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
        self.inner.thread.users()
    }

    /// Attaches the mailbox held in `source` (a [`RegionMailbox`] for a plugin's raw shared
    /// region), served as `options` say; the worker serves it from its next pass on.
    pub fn attach(&self, source: Box<dyn AtomicMailbox>, options: AttachOptions) -> MailboxId {
        let AttachOptions {
            #[cfg(not(loom))]
            doorbell,
            numbering,
            dialect,
        } = options;
        let context = &self.inner.context;
        // RMW: hands out each id once.
        let id = MailboxId(context.next_id.fetch_add(1, Ordering::Relaxed));
        // Its state exists before the worker can see a request of it.
        let slot = context.extension.mailbox_attached(id);
        let attached = Arc::new(Attached::new(
            id,
            numbering,
            dialect,
            slot,
            source,
            #[cfg(not(loom))]
            doorbell,
        ));
        let layout = attached.layout;
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
    pub fn detach(&self, id: MailboxId) -> Result<(), ServerError> {
        let context = &self.inner.context;
        let attached = context.mailboxes.update(|list| {
            let at = list.iter().position(|m| m.id == id)?;
            Some(list.remove(at))
        });
        let attached = attached.ok_or(ServerError::NoSuchMailbox(id.0))?;
        // Release: pairs with the worker's Acquire load before it touches the mailbox again.
        attached.detached.store(true, Ordering::Release);
        // Its kernels can no longer ask anything: what they held goes now.
        context.extension.mailbox_detached(id, &attached.slot);
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
        self.inner.thread.wait_released(&attached);
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

    /// Waits (backing off) until mailbox `id` has no pending request and every request the
    /// server began on it is counted in the statistics, or `timeout` passes; true if it
    /// drained. A launcher calls it after a kernel completed, so that requests the kernel sent
    /// last without waiting for an answer (FREE, EXIT's status) are served, and the counts
    /// read next include every request of the kernel: a script's last hand-over lets the
    /// kernel go on before the server has counted it (the count follows the hand-over, in
    /// the same poll or, for a script that goes on after its reply, a later one). A packet
    /// handler's request is counted before its reply.
    pub fn wait_drained(&self, id: MailboxId, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut attempt = 0;
        while !self.drained(id) {
            if Instant::now() >= deadline {
                return false;
            }
            Backoff::step(attempt);
            attempt = attempt.saturating_add(1);
        }
        true
    }

    /// Whether mailbox `id` (if attached) has no pending port and no script's request begun
    /// and not yet counted.
    fn drained(&self, id: MailboxId) -> bool {
        let mailboxes = self.inner.context.mailboxes.get();
        let Some(attached) = mailboxes.iter().find(|m| m.id == id) else {
            return true;
        };
        let server = attached.server();
        if (0..attached.layout.ports()).any(|i| server.is_pending(i)) {
            return false;
        }
        // Acquire: pairs with the Release of the hand-overs whose flags were just read, so
        // the requests they belong to are seen counted (a packet handler's) or begun (a
        // script's: see `Attached`'s ordering note).
        crate::sync::fence(Ordering::Acquire);
        attached.settled()
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
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        if self.inner.thread.is_worker() {
            // A handler dropped the last handle (through a `Weak` it upgraded): see
            // `ServerThread::abandon_from_worker`.
            self.inner.thread.abandon_from_worker();
            return;
        }
        if let Err(error) = self.shutdown_with(ShutdownPolicy::Force) {
            log::error!("{}: shutdown on drop failed: {error}", self.name());
        }
    }
}
