//! One request being served by a script handler ([`Request`]): its port, where it came from
//! ([`MailboxInfo`]) and the server's shared state, owned so that its exchange can be suspended
//! and resumed on later passes. Its port operations suspend through the executor's wait
//! ([`crate::server::exec`]); [`Request::blocking`] runs a call that may block (a file, a FIFO,
//! a terminal, a command) on the server's I/O threads; [`Request::yield_now`] steps the
//! exchange aside for the rest of the pass.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::vec::Vec;

use crate::protocol::layout::Layout;
use crate::protocol::opcode::Opcode;
use crate::protocol::port::Packet;
use crate::protocol::{ProtocolError, ServerPort};
use crate::server::error::ServerError;
use crate::server::exec;
use crate::server::exec::Received;
use crate::server::{Attached, Inner, MailboxId, ServerContext};
use crate::sync::Arc;

/// Which mailbox a request came from.
#[derive(Clone, Copy, Debug)]
pub struct MailboxInfo {
    /// Its id.
    pub id: MailboxId,
    /// Its layout.
    pub layout: Layout,
}

/// A handle on a server's [`ServerContext`] (see [`Request::shared`]).
#[derive(Clone)]
pub(crate) struct SharedContext(Arc<Inner>);

impl core::ops::Deref for SharedContext {
    type Target = ServerContext;
    fn deref(&self) -> &ServerContext {
        &self.0.context
    }
}

/// One request being served by a script handler: its port, where it came from, and the
/// server's shared services. It owns what it uses, so an exchange can be suspended and resumed
/// on later passes.
pub struct Request {
    // Field order matters: `port` refers into memory that `mailbox` owns, so it is dropped
    // first (fields drop in declaration order). See `Request::new`.
    port: ManuallyDrop<ServerPort<'static>>,
    mailbox: Arc<Attached>,
    inner: Arc<Inner>,
    /// Bytes its byte strings have carried so far (bounded by `Limits::request_bytes`).
    received: u64,
}

impl Drop for Request {
    /// Leaves the port locked as it is, telling the executor whether it owned the buffer: the
    /// server closes, drains or quarantines the port once the exchange has ended (see
    /// `server::exec`). A request must therefore not outlive its handler's exchange.
    fn drop(&mut self) {
        // SAFETY: the port is taken exactly once, here, and the field is not used afterwards.
        let port = unsafe { ManuallyDrop::take(&mut self.port) };
        let index = port.index();
        let owned = port.quarantine();
        exec::note_dropped(&self.mailbox, index, owned);
    }
}

impl Request {
    /// A request over `port`, which was opened on `mailbox`.
    ///
    /// # Safety
    /// Every reference inside `port` points into memory owned by `*mailbox` (its mailbox
    /// region, its lock table, its doorbell) and stays valid for as long as `*mailbox` lives.
    pub(crate) unsafe fn new(
        port: ServerPort<'_>,
        mailbox: Arc<Attached>,
        inner: Arc<Inner>,
    ) -> Request {
        // SAFETY: the lifetime is extended to 'static, but the port never outlives the memory
        // it refers to: (1) the caller promises that memory belongs to `*mailbox`, which neither
        // moves nor is mutably borrowed while shared (an `Arc`), so a borrow of it may last as
        // long as this `Arc` lives; (2) `port` is dropped before `mailbox` (in `Drop`, which runs
        // before the fields are dropped) and no method moves it out; (3) no reference with the extended lifetime escapes: the port is
        // reached only through `&self` accessors returning plain values and through operations
        // that lend each packet to a closure for the call alone (`Packet<'_>`); there is no
        // `DerefMut` that would let two requests swap their ports.
        let port = unsafe { core::mem::transmute::<ServerPort<'_>, ServerPort<'static>>(port) };
        Request {
            port: ManuallyDrop::new(port),
            mailbox,
            inner,
            received: 0,
        }
    }

    /// The request's mailbox.
    pub fn mailbox(&self) -> MailboxInfo {
        MailboxInfo {
            id: self.mailbox.id,
            layout: self.mailbox.layout,
        }
    }
    /// Whose printf the request's mailbox expects.
    pub(crate) fn printf_dialect(&self) -> crate::protocol::opcode::Dialect {
        self.mailbox.printf
    }
    /// The layer above's state for the request's mailbox (see `Extension`).
    pub(crate) fn mailbox_slot(&self) -> &crate::server::mailboxes::MailboxSlot {
        &self.mailbox.slot
    }
    /// The server's shared state.
    pub fn context(&self) -> &ServerContext {
        &self.inner.context
    }
    /// The server's shared state as a handle of its own, to keep across the request's `&mut`
    /// operations (and to give to an I/O call).
    pub(crate) fn shared(&self) -> SharedContext {
        SharedContext(self.inner.clone())
    }
    /// The port's index.
    pub fn index(&self) -> u32 {
        self.port.index()
    }
    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        self.port.opcode()
    }
    /// The active lanes (header mask bits below `L`).
    pub fn mask(&self) -> u64 {
        self.port.mask()
    }
    /// The lane size `L`.
    pub fn lane_size(&self) -> u32 {
        self.port.lane_size()
    }
    /// The first active lane.
    pub fn first_lane(&self) -> u32 {
        self.port.first_lane()
    }

    /// A `RUST_LOG=trace` line about this request's exchange (one per packet operation).
    fn trace(&self, what: core::fmt::Arguments<'_>) {
        log::trace!(
            "{}: mailbox {} port {}: {}: {what}",
            self.inner.context.config.name,
            self.mailbox.id.0,
            self.index(),
            self.opcode()
        );
    }

    /// A packet operation's result as the request's, traced (`what` it did) if it succeeded.
    #[inline]
    fn traced(
        &self,
        done: Result<(), ProtocolError>,
        what: core::fmt::Arguments<'_>,
    ) -> Result<(), ServerError> {
        done?;
        self.trace(what);
        Ok(())
    }

    /// Waits for the buffer, lets `fill` write each active lane's packet, hands it over.
    pub async fn send(&mut self, fill: impl FnMut(u32, Packet<'_>)) -> Result<(), ServerError> {
        let done = self.port.send_async(fill).await;
        self.traced(done, format_args!("sent a packet"))
    }
    /// Waits for the client's packet and lets `use_` read each active lane's.
    pub async fn recv(&mut self, use_: impl FnMut(u32, Packet<'_>)) -> Result<(), ServerError> {
        let done = self.port.recv_async(use_).await;
        self.traced(done, format_args!("received a packet"))
    }
    /// Receives, lets `work` rewrite each lane's packet in place, and sends it back.
    pub async fn recv_and_send(
        &mut self,
        work: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ServerError> {
        let done = self.port.recv_and_send_async(work).await;
        self.traced(done, format_args!("received a packet and sent it back"))
    }
    /// `send(fill)` then `recv(use_)`.
    pub async fn send_and_recv(
        &mut self,
        fill: impl FnMut(u32, Packet<'_>),
        use_: impl FnMut(u32, Packet<'_>),
    ) -> Result<(), ServerError> {
        let done = self.port.send_and_recv_async(fill, use_).await;
        self.traced(done, format_args!("sent a packet, received the reply"))
    }
    /// Sends a byte string per lane (PROTOCOL section 5).
    pub async fn send_n(&mut self, data: &[&[u8]]) -> Result<(), ServerError> {
        self.port.send_n_async(data).await?;
        let longest = data.iter().map(|d| d.len()).max().unwrap_or(0);
        self.trace(format_args!(
            "sent byte strings (longest lane {longest} bytes)"
        ));
        Ok(())
    }
    /// Receives a byte string per lane ([`Received`]: index = lane, inactive lanes empty; its
    /// buffers are reused by later requests once it is dropped), bounded by the server's
    /// [`crate::Limits`]: a lane
    /// above `string_bytes`, or the request's byte strings together above `request_bytes`, end the
    /// exchange at once ([`ProtocolError::TooLong`](crate::ProtocolError::TooLong),
    /// [`ProtocolError::RequestTooLong`](crate::ProtocolError::RequestTooLong)). Strings
    /// longer than their first packet are charged to the server's memory budget
    /// (`Limits::held_bytes`) before they grow, until the [`Received`] are dropped; without room
    /// there they are received and dropped ([`Received::refused`]).
    pub async fn recv_n(&mut self) -> Result<Received, ServerError> {
        let context = &self.inner.context;
        let limits = &context.config.limits;
        let left = limits.request_bytes.saturating_sub(self.received);
        let mut data = Received::buffers();
        let mut charge = None;
        let admitted = self
            .port
            .recv_n_within_async(limits.string_bytes, left, &mut data, |claimed| {
                charge = context.memory.charge(claimed);
                charge.is_some()
            })
            .await?;
        let data = Received::new(data, charge, !admitted);
        self.received += data.iter().map(|d| d.len() as u64).sum::<u64>();
        let longest = data.iter().map(Vec::len).max().unwrap_or(0);
        self.trace(format_args!(
            "received byte strings (longest lane {longest} bytes)"
        ));
        Ok(data)
    }
    /// Sends `size` bytes per active lane without a length word.
    pub async fn send_fixed(&mut self, size: usize, data: &[&[u8]]) -> Result<(), ServerError> {
        Ok(self.port.send_fixed_async(size, data).await?)
    }
    /// Receives `size` bytes per active lane without a length word.
    pub async fn recv_fixed(&mut self, size: usize) -> Result<Vec<Vec<u8>>, ServerError> {
        Ok(self.port.recv_fixed_async(size).await?)
    }

    /// Runs `call` on one of the server's I/O threads and waits (suspended, the port held) for
    /// its result: for anything that may block, so that the server thread never does.
    pub async fn blocking<R: Send + 'static>(
        &self,
        call: impl FnOnce(&ServerContext) -> R + Send + 'static,
    ) -> Result<R, ServerError> {
        crate::server::io_pool::run(&self.inner, call).await
    }

    /// Suspends the exchange once, its port held: the server thread serves the other ports,
    /// then polls this exchange again at the pass's next checkpoint or at the start of the next
    /// pass. It counts as progress, so the thread does not back off meanwhile. For work that
    /// gains from letting the others go first: printf's output, written once for all the lines
    /// a pass formatted (a group commit).
    pub async fn yield_now(&self) {
        YieldNow { yielded: false }.await
    }

    /// [`Request::yield_now`], unless the exchange is alone in flight: for a group commit,
    /// which has no other exchange's lines to wait for then (the rest of the pass would only
    /// look for new requests; a warp printing in a loop saved some 160 ns a request). Not for
    /// a loop that waits for another port to be served: alone, it would never suspend.
    pub(crate) async fn yield_unless_alone(&self) {
        if !exec::alone() {
            self.yield_now().await;
        }
    }
}

/// The future of [`Request::yield_now`]: pending once, then ready.
struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if self.yielded {
            return std::task::Poll::Ready(());
        }
        self.yielded = true;
        exec::note_yielded();
        std::task::Poll::Pending
    }
}
