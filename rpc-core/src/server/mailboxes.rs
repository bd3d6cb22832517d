//! The mailboxes a server serves: the memory traits, how one is attached (`AttachOptions`),
//! and what the worker keeps per attached mailbox (`RpcServer::attach` and `detach`, like
//! every method of the server, are in `mod.rs`).

use std::boxed::Box;
use std::vec::Vec;

use crate::protocol::layout::Layout;
use crate::protocol::mailbox::{LockTable, Mailbox, MailboxMemory};
use crate::protocol::opcode::{Dialect, Numbering, Opcode};
use crate::protocol::server_end::ServerEnd;
#[cfg(not(loom))]
use crate::server::error::ServerError;
use crate::server::users::Coverage;
use crate::server::ServerContext;
use crate::sync::{lock, Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering};

/// Host memory the device reads and writes coherently (pinned / fine-grained), zeroed and
/// 64-byte aligned when allocated; freed when dropped.
///
/// # Safety
/// The server turns this memory into atomic views (`&[AtomicU32]`, `&[AtomicU64]`) and keeps
/// them while the mailbox is attached, so an implementation promises, for as long as the value
/// lives:
/// - `host_ptr()` is non-null, 64-byte aligned, and valid for reads and writes of `len()`
///   bytes, always the same pointer and length;
/// - the memory stays allocated at that address until the value is dropped;
/// - within this process, while the value is attached, the memory is accessed only through
///   atomics of the same size as the server's (`u32` flags, `u64` headers and packets). The
///   device and other processes may write it as they like: that is only garbage to the server.
pub unsafe trait SharedRegion: Send + Sync {
    /// The host address.
    fn host_ptr(&self) -> *mut u8;
    /// The same memory as the device addresses it.
    fn device_addr(&self) -> u64;
    /// Bytes in the region.
    fn len(&self) -> usize;
    /// True if the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The v2 doorbell of a mailbox (PROTOCOL section 9): a counter of open requests the device
/// increments after each open (ringing an interrupt on 0 -> 1) and the server decrements at each
/// close, so the worker can sleep while it is 0 and wake when the device rings. The worker still
/// polls on a timeout: interrupt-only wake-ups lose requests.
pub trait Doorbell: Send + Sync {
    /// The 64-byte record written at the start of the mailbox: `value` pointer at 0, `mailbox`
    /// pointer at 8, `event_id` at 16, in device addresses.
    fn record(&self) -> [u8; 64];
    /// The host's view of `*value`.
    fn counter(&self) -> &crate::sync::AtomicU64;
    /// Blocks until the counter is non-zero (true) or `timeout` passes (false).
    fn wait(&self, timeout: std::time::Duration) -> bool;
}

/// Names an attached mailbox within its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MailboxId(pub u64);

/// A mailbox in memory that already is atomics of this process (a [`MailboxMemory`], loom's
/// atomics in a model, a test's wrapper), as the server reads it: attaching one is safe.
///
/// Why this and [`SharedRegion`] stay two traits: a `SharedRegion` is raw bytes a plugin
/// allocated for a device, with the device's address for them, which the server can turn into
/// atomics only by trusting the plugin (hence an `unsafe trait`), and which loom cannot model
/// (it cannot wrap foreign memory); an `AtomicMailbox` needs neither trust nor a device
/// address, and is what the loom models attach. The server makes the one out of the other
/// (`RegionMailbox`), never the other way.
pub trait AtomicMailbox: Send + Sync {
    /// The memory as a mailbox (the same every call).
    fn view(&self) -> Mailbox<'_>;
}

impl AtomicMailbox for MailboxMemory {
    fn view(&self) -> Mailbox<'_> {
        MailboxMemory::view(self)
    }
}

/// A mailbox the server shares with whoever else holds the `Arc` (host-side clients).
impl AtomicMailbox for Arc<MailboxMemory> {
    fn view(&self) -> Mailbox<'_> {
        MailboxMemory::view(self)
    }
}

/// A plugin's shared region holding a mailbox of a layout, as [`RpcServer::attach`](crate::RpcServer::attach) takes it:
/// the server's same-size atomic views of the region, trusted by its [`SharedRegion`] contract.
///
/// The view is built (and the region checked) once, in `new`, and kept: the worker asks for it
/// on every pass, where building it (two calls into the plugin, the layout's offsets, the
/// checks) cost some 100 instructions a pass, more than a tenth of a pass that finds nothing
/// (`docs/performance.md`). The region's pointer and length never change (its contract).
#[cfg(not(loom))]
pub struct RegionMailbox {
    /// The view of `_region`. Its `'static` is never handed out: [`AtomicMailbox::view`] returns
    /// it borrowed from `self`, so no copy outlives the region (see the `SAFETY` in `new`).
    view: Mailbox<'static>,
    /// The memory `view` points into, held (never read again) until `self` drops.
    _region: Box<dyn SharedRegion>,
}

#[cfg(not(loom))]
impl RegionMailbox {
    /// The mailbox of `layout` in `region`; fails if the region is misaligned or too small.
    pub fn new(region: Box<dyn SharedRegion>, layout: Layout) -> Result<Self, ServerError> {
        // SAFETY: the region is valid for reads and writes of `len()` bytes at `host_ptr()`,
        // and stays so at that address until it is dropped (the `SharedRegion` contract); it
        // is dropped with `self`, and the view never leaves `self` for longer than a borrow of
        // it (`view`), so no reference of the view is used after the region is gone, despite
        // the `'static` it is stored with. This process only accesses the region through
        // same-size atomic views (the contract again).
        let view = unsafe { Mailbox::from_raw(region.host_ptr(), region.len(), layout) }?;
        Ok(RegionMailbox {
            view,
            _region: region,
        })
    }
}

#[cfg(not(loom))]
impl AtomicMailbox for RegionMailbox {
    fn view(&self) -> Mailbox<'_> {
        // The kept view, its lifetime shortened to the borrow of `self`.
        self.view
    }
}

/// What the layer above the server keeps for one attached mailbox (the standard services'
/// stream table and allocations), opaque to the server: made when the mailbox is attached,
/// held by its [`Attached`] and handed to every request of it, and told of the detach.
/// (std's `Arc`: it is no part of what the loom models check.)
pub(crate) type MailboxSlot = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// The attached mailboxes' slots, for the layer above to find one by id (`RpcServer::new`
/// hands it the server's list).
pub(crate) struct Slots(pub(super) std::sync::Arc<Snapshot<Vec<Arc<Attached>>>>);

impl Slots {
    /// The slot of mailbox `id`, while it is attached.
    pub(crate) fn of(&self, id: MailboxId) -> Option<MailboxSlot> {
        let list = self.0.get();
        let attached = list.iter().find(|m| m.id == id)?;
        Some(attached.slot.clone())
    }
    /// Every attached mailbox's slot, in the order they were attached.
    pub(crate) fn all(&self) -> Vec<MailboxSlot> {
        self.0.get().iter().map(|m| m.slot.clone()).collect()
    }
}

/// One attached mailbox.
///
/// Memory ordering of `unsettled` (the other atomics say theirs where they are used): only the
/// worker writes it, with a plain load and store (no read-modify-write: one worker at a time,
/// and a locked instruction right after a hand-over would wait for that flip's store, see
/// `protocol::deferred`). It adds one (Relaxed) as a script's request begins, before anything
/// of it is handed to the client, and takes it away (Release) once the request is counted in
/// the statistics. A packet handler's request leaves it alone: it is counted before its one
/// hand-over, the reply, whose Release publishes the count with it.
/// `RpcServer::wait_drained` reads it (Acquire) after an Acquire fence that follows its look at
/// the flags: seeing a hand-over (the protocol publishes each with Release) it sees what was
/// written before it, a packet request's count or a script's one added, and seeing the value
/// the Release took it back to, it sees the script's count.
pub(crate) struct Attached {
    pub(crate) id: MailboxId,
    pub(crate) layout: Layout,
    /// How its clients number opcodes (LLVM 19 images differ); set once at attach.
    pub(crate) numbering: Numbering,
    /// Whose printf its output matches; set once at attach.
    pub(crate) printf: Dialect,
    /// The layer above's state for it, from its attach to its detach.
    pub(crate) slot: MailboxSlot,
    source: Box<dyn AtomicMailbox>,
    locks: LockTable,
    #[cfg(not(loom))]
    doorbell: Option<Box<dyn Doorbell>>,
    /// Set by `detach`: the worker stops touching the mailbox and abandons waits on it.
    pub(crate) detached: AtomicBool,
    /// User guards covering this mailbox.
    pub(crate) users: Arc<Coverage>,
    /// Ports a shutdown left locked mid-exchange, each drained once the kernels that could
    /// still be inside its exchange are gone (see [`crate::server::dispatch`]).
    pub(crate) quarantine: Mutex<Vec<Opened>>,
    /// How many ports `quarantine` holds, read without its lock.
    pub(crate) quarantined: AtomicUsize,
    /// Per port with an exchange in flight: 1 + its position in the worker's list of them,
    /// else 0 (written by the worker only), so that a pass finding the port pending polls that
    /// exchange rather than opening the port again.
    pub(crate) in_flight: Box<[AtomicU32]>,
    /// Script requests begun and not yet counted in the statistics (see the ordering note
    /// above): a script's last hand-over lets its kernel go on, so `wait_drained` waits for
    /// this too.
    unsettled: AtomicUsize,
}

impl Attached {
    /// A mailbox attached as `id`, held in `source`, with the layer above's `slot`.
    pub(crate) fn new(
        id: MailboxId,
        numbering: Numbering,
        printf: Dialect,
        slot: MailboxSlot,
        source: Box<dyn AtomicMailbox>,
        #[cfg(not(loom))] doorbell: Option<Box<dyn Doorbell>>,
    ) -> Self {
        let layout = source.view().layout();
        Attached {
            id,
            layout,
            numbering,
            printf,
            slot,
            source,
            locks: LockTable::new(layout.ports()),
            #[cfg(not(loom))]
            doorbell,
            detached: AtomicBool::new(false),
            users: Arc::new(Coverage::default()),
            quarantine: Mutex::new(Vec::new()),
            quarantined: AtomicUsize::new(0),
            in_flight: (0..layout.ports()).map(|_| AtomicU32::new(0)).collect(),
            unsettled: AtomicUsize::new(0),
        }
    }

    #[cfg(not(loom))]
    pub(crate) fn doorbell(&self) -> Option<&dyn Doorbell> {
        self.doorbell.as_deref()
    }

    /// A script's request of this mailbox begins (before any of its hand-overs). Worker only.
    pub(crate) fn begin_request(&self) {
        // n -> n + 1, the worker the only writer. Relaxed: ordered before the request's
        // hand-overs by their Release.
        let n = self.unsettled.load(Ordering::Relaxed);
        self.unsettled.store(n + 1, Ordering::Relaxed);
    }

    /// Whether every script's request of this mailbox begun is counted in the statistics.
    pub(crate) fn settled(&self) -> bool {
        // Acquire: pairs with `settle_request`'s Release, so the counts before it are seen.
        self.unsettled.load(Ordering::Acquire) == 0
    }

    /// A script's request of this mailbox has been counted in the statistics (completed,
    /// failed or abandoned). Worker only.
    pub(crate) fn settle_request(&self) {
        // n -> n - 1, the worker the only writer. Release: the statistics' counts before it
        // are seen by whoever reads the new value with Acquire (`wait_drained`).
        let n = self.unsettled.load(Ordering::Relaxed);
        self.unsettled.store(n.saturating_sub(1), Ordering::Release);
    }

    /// The server's end of this mailbox, as its source's view is now (once a pass).
    pub(crate) fn server(&self) -> ServerEnd<'_> {
        #[cfg(not(loom))]
        let doorbell = self.doorbell.as_ref().map(|bell| bell.counter());
        #[cfg(loom)]
        let doorbell = None;
        // The lock table was sized for the layout at attach.
        ServerEnd::sized(self.source.view(), self.locks.words(), doorbell)
    }
}

/// A request's port as it was opened: which port, the request's opcode (for a drained reply),
/// and the users that could be inside it (their marks then). An exchange in flight keeps it,
/// and so does a port left locked mid-exchange (quarantined) once its exchange is gone.
#[derive(Clone, Copy)]
pub(crate) struct Opened {
    pub(crate) index: u32,
    pub(crate) opcode: Opcode,
    pub(crate) marks: Marks,
}

/// The arrival marks of a mailbox's users and of the all-mailbox users when a port was opened:
/// the kernel owning the port is among the users that had arrived by then (see `Coverage`).
#[derive(Clone, Copy)]
pub(crate) struct Marks(u64, u64);

impl Marks {
    pub(crate) fn now(mailbox: &Attached, context: &ServerContext) -> Self {
        Marks(mailbox.users.mark(), context.any_users.mark())
    }
    /// True once no kernel that could answer the port runs any more.
    pub(crate) fn gone(self, mailbox: &Attached, context: &ServerContext) -> bool {
        mailbox.users.gone_since(self.0) && context.any_users.gone_since(self.1)
    }
}

/// A versioned, copy-on-write list the worker reads without locking on every pass.
pub(crate) struct Snapshot<T> {
    current: Mutex<Arc<T>>,
    /// Bumped (Release) after each change; the worker compares (Acquire) to know to refresh.
    version: AtomicU64,
}

impl<T: Clone> Snapshot<T> {
    pub(super) fn new(value: T) -> Self {
        Snapshot {
            current: Mutex::new(Arc::new(value)),
            version: AtomicU64::new(0),
        }
    }
    pub(crate) fn get(&self) -> Arc<T> {
        lock(&self.current).clone()
    }
    pub(super) fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
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

/// How [`RpcServer::attach`](crate::RpcServer::attach) serves a mailbox; the default is a current client of this
/// process (no doorbell, today's opcode numbers, the host C library's printf).
#[derive(Default)]
#[non_exhaustive]
pub struct AttachOptions {
    /// A v2 mailbox's doorbell (PROTOCOL section 9): the server decrements its counter once
    /// per served port, and the worker sleeps on it while no request is open (every attached
    /// mailbox having a doorbell), polling on a timeout too.
    #[cfg(not(loom))]
    pub doorbell: Option<Box<dyn Doorbell>>,
    /// How its clients number opcodes (an LLVM 19 image's: see [`Numbering`]).
    pub numbering: Numbering,
    /// Whose printf its clients expect (see [`Dialect`]).
    pub dialect: Dialect,
}

impl AttachOptions {
    /// These options with the v2 doorbell `bell`.
    #[cfg(not(loom))]
    pub fn doorbell(mut self, bell: Box<dyn Doorbell>) -> Self {
        self.doorbell = Some(bell);
        self
    }

    /// These options for clients numbering opcodes as `numbering` says and expecting the
    /// printf of `dialect`.
    pub fn clients(mut self, numbering: Numbering, dialect: Dialect) -> Self {
        self.numbering = numbering;
        self.dialect = dialect;
        self
    }
}
