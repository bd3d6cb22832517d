//! Typed calls: a Rust function serves LLVM's `rpc::dispatch<OPCODE, fn>(client, args...)`
//! (LLVM 23's `libc/shared/rpc_dispatch.h`), as LLVM's `rpc::invoke<NUM_LANES>(port, fn)`
//! would, byte for byte (PROTOCOL section 12), and refuses what LLVM's would trust.
//!
//! [`RpcServer::register_typed`] takes a function or closure whose signature says what the
//! client sends: each argument is an [`Argument`] (a [`Plain`] value, `bool`, or a pointer:
//! `Option<&CStr>`, `&CStr`, `Option<&[T]>`, `&[T]`, `Option<&mut [T]>`, `&mut [T]`,
//! `Option<&T>`, `Option<&mut T>`), the result a [`Reply`]. Per request, on the server thread:
//!
//! | step | client (`dispatch`) | server (this module) |
//! |---|---|---|
//! | per pointer argument | `send_n(pointee)`, `recv` | receive and check it (kept or drained), send a host pointer (0 for 0 bytes) |
//! | arguments | fixed packets: the packed bytes | receive them; per active lane, decode and call the function |
//! | per pointer argument | `recv_n` into its pointee | send the pointee back as the function left it (nothing for a refused lane) |
//! | return | fixed packets: `sizeof(R)`, 1 for `void` | send each lane's result (zero for a refused lane) |
//!
//! **Refused, never trusted.** A lane whose pointee does not fit its argument's type (not a
//! multiple of the element's size, not exactly one object, a C string without its NUL), is
//! NULL where the function needs data, is above [`Limits::string_bytes`](crate::Limits), would
//! take the request's pointees above [`Limits::request_bytes`](crate::Limits), or whose packed
//! pointer is not the one the host sent, is refused: its pointees are drained as they come
//! (never held), the function is not called for it, nothing is copied back to it and its result
//! is zero, while the other lanes are served; the exchange still takes every step the client
//! expects, so the client never hangs, and the request ends as a refusal (one budgeted log
//! line, counted in `refused`). A panic of the function refuses its lane the same way. A
//! client whose argument kinds differ from the function's desynchronises the exchange (its
//! packets mean something else to each side): the client's timeout and the server's ending of
//! an exchange whose client is gone end it, never a hang of the server or a crash.
//!
//! The pointees are copied into buffers of the server thread's pool (`exec`'s recycled memory), aligned to
//! 16 bytes so that a slice of any [`Plain`] type of alignment up to 16 borrows them in place,
//! and given back when the request ends.
//!
//! The function runs on the server thread, between two packets of the exchange, like a
//! packet handler: it must not block (a call that may block belongs on an I/O thread, in a
//! script handler: [`Request::blocking`]).

use core::ffi::CStr;
use std::borrow::Cow;
use std::boxed::Box;
use std::format;
use std::vec::Vec;

use bytemuck::{AnyBitPattern, NoUninit};

use crate::protocol::layout::{BUFFER_SIZE, FIRST_PACKET_BYTES};
use crate::protocol::port::lanes;
use crate::protocol::Opcode;
use crate::protocol::POINTER_BYTES;
use crate::server::error::{Outcome, ServerError};
use crate::server::exec::{PooledVec, Received};
use crate::server::registry::Handler;
use crate::server::request::Request;
use crate::server::{panic_message, RpcServer};
use crate::services::Refusals;
use crate::sync::Arc;

/// The most arguments a typed function takes.
pub const MAX_ARGUMENTS: usize = 8;
/// The alignment of every pointee's copy on the host: a [`Plain`] type of larger alignment
/// cannot be borrowed from it (such an argument is refused at compile time).
pub const POINTEE_ALIGN: usize = 16;

/// The host's pointer for pointer argument `k` of lane `lane`, which the client writes into the
/// packed arguments in place of its own: not an address (the device learns nothing of the
/// host's memory), checked when the arguments come (a lane whose argument differs is refused).
const fn host_pointer(k: usize, lane: u32) -> u64 {
    0xD15A_7C00_0000_0000 | ((k as u64) << 8) | lane as u64
}

/// Plain old data a typed call passes by value or behind a pointer: a C integer, float or
/// `#[repr(C)]` struct of them, for which every bit pattern is a value
/// ([`bytemuck::AnyBitPattern`]: derive it, padding allowed). Implemented for the integers and
/// floats; a struct of yours implements it in one line:
///
/// ```
/// #[repr(C)]
/// #[derive(Clone, Copy, bytemuck::AnyBitPattern)]
/// struct Pair { a: u32, b: u64 }
/// impl rpc_core::services::typed::Plain for Pair {}
/// ```
/// Behind a `&mut` (copied back to the device) or as a result it must have no padding
/// ([`bytemuck::Pod`]).
pub trait Plain: AnyBitPattern {}

macro_rules! plain {
    ($($t:ty),*) => { $(impl Plain for $t {})* };
}
plain!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

/// What a pointer argument's pointee must be, checked on its size as it comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pointee {
    /// Exactly one object of this many bytes (`T *`).
    Object(usize),
    /// Any number of elements of this many bytes (an `rpc::span`).
    Span(usize),
    /// A C string: its bytes with the NUL (`const char *`).
    CString,
    /// As the inner kind, and never NULL (0 bytes): the function needs data.
    Required(&'static Pointee),
}

impl Pointee {
    /// Why a pointee of `len` bytes cannot be this, if it cannot (a C string's NUL is checked
    /// once its bytes are in).
    fn refuse(self, len: u64) -> Option<Cow<'static, str>> {
        match self {
            Pointee::Required(_) if len == 0 => Some("NULL where the function needs data".into()),
            Pointee::Required(inner) => inner.refuse(len),
            _ if len == 0 => None,
            Pointee::Object(size) if len != size as u64 => {
                Some(format!("a pointee of {len} bytes for an object of {size}").into())
            }
            Pointee::Span(size) if size > 0 && len % size as u64 != 0 => {
                Some(format!("a span of {len} bytes for elements of {size}").into())
            }
            _ => None,
        }
    }
    fn is_string(self) -> bool {
        match self {
            Pointee::CString => true,
            Pointee::Required(inner) => inner.is_string(),
            _ => false,
        }
    }
}

/// One argument of a typed function: how the client passes it and what the function gets.
/// Implemented for every [`Plain`] type and `bool` (by value), and for pointers:
/// `Option<&CStr>` / `&CStr` (`const char *`, with its NUL), `Option<&[T]>` / `&[T]` and
/// `Option<&mut [T]>` / `&mut [T]` (a pointer or an `rpc::span` of `T`), `Option<&T>` and
/// `Option<&mut T>` (a pointer to exactly one `T`). `None` is NULL, which LLVM's client also
/// sends for an empty span; a type without `Option` refuses it.
pub trait Argument {
    /// What the function receives, borrowing the request's copies.
    type Value<'a>;
    /// Its bytes in the packed argument list (a pointer's: 8).
    const WIRE: usize;
    /// `Some` for a pointer: what its pointee must be.
    const POINTEE: Option<Pointee>;
    /// The value from its packed bytes (`wire`, [`Argument::WIRE`] of them) and, for a
    /// pointer, its pointee (`None` for NULL), already checked against
    /// [`Argument::POINTEE`] and aligned to [`POINTEE_ALIGN`]. `None` refuses the lane.
    fn decode<'a>(wire: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>>;
}

impl<T: Plain> Argument for T {
    type Value<'a> = T;
    const WIRE: usize = size_of::<T>();
    const POINTEE: Option<Pointee> = None;
    fn decode(wire: &[u8], _: Option<&mut [u8]>) -> Option<T> {
        bytemuck::try_pod_read_unaligned(wire).ok()
    }
}

impl Argument for bool {
    type Value<'a> = bool;
    const WIRE: usize = 1;
    const POINTEE: Option<Pointee> = None;
    /// C's `bool` is one byte; any byte but 0 reads as true (no byte is undefined here).
    fn decode(wire: &[u8], _: Option<&mut [u8]>) -> Option<bool> {
        Some(wire[0] != 0)
    }
}

/// A pointee's string, its NUL already checked.
fn c_str(bytes: &[u8]) -> Option<&CStr> {
    CStr::from_bytes_until_nul(bytes).ok()
}

/// A pointee as a slice of `T`, in place (the copy is aligned to [`POINTEE_ALIGN`]).
fn slice_of<T: AnyBitPattern>(bytes: &[u8]) -> Option<&[T]> {
    const {
        assert!(
            align_of::<T>() <= POINTEE_ALIGN,
            "alignment above POINTEE_ALIGN"
        )
    };
    bytemuck::try_cast_slice(bytes).ok()
}

fn slice_of_mut<T: AnyBitPattern + NoUninit>(bytes: &mut [u8]) -> Option<&mut [T]> {
    const {
        assert!(
            align_of::<T>() <= POINTEE_ALIGN,
            "alignment above POINTEE_ALIGN"
        )
    };
    bytemuck::try_cast_slice_mut(bytes).ok()
}

/// A pointer that may be NULL: `Some(None)` for NULL, else its pointee as `decode` reads it
/// (`None` refuses the lane).
fn nullable<'a, V>(
    pointee: Option<&'a mut [u8]>,
    decode: impl FnOnce(&'a mut [u8]) -> Option<V>,
) -> Option<Option<V>> {
    match pointee {
        None => Some(None),
        Some(bytes) => decode(bytes).map(Some),
    }
}

impl Argument for Option<&CStr> {
    type Value<'a> = Option<&'a CStr>;
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::CString);
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        nullable(pointee, |bytes| c_str(bytes))
    }
}

impl Argument for &CStr {
    type Value<'a> = &'a CStr;
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Required(&Pointee::CString));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        c_str(pointee?)
    }
}

impl<T: Plain> Argument for Option<&[T]> {
    type Value<'a> = Option<&'a [T]>;
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Span(size_of::<T>()));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        nullable(pointee, |bytes| slice_of(bytes))
    }
}

impl<T: Plain> Argument for &[T] {
    type Value<'a> = &'a [T];
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Required(&Pointee::Span(size_of::<T>())));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        slice_of(pointee?)
    }
}

impl<T: Plain + NoUninit> Argument for Option<&mut [T]> {
    type Value<'a> = Option<&'a mut [T]>;
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Span(size_of::<T>()));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        nullable(pointee, |bytes| slice_of_mut(bytes))
    }
}

impl<T: Plain + NoUninit> Argument for &mut [T] {
    type Value<'a> = &'a mut [T];
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Required(&Pointee::Span(size_of::<T>())));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        slice_of_mut(pointee?)
    }
}

impl<T: Plain> Argument for Option<&T> {
    type Value<'a> = Option<&'a T>;
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Object(size_of::<T>()));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        nullable(pointee, |bytes| slice_of(bytes)?.first())
    }
}

impl<T: Plain + NoUninit> Argument for Option<&mut T> {
    type Value<'a> = Option<&'a mut T>;
    const WIRE: usize = POINTER_BYTES;
    const POINTEE: Option<Pointee> = Some(Pointee::Object(size_of::<T>()));
    fn decode<'a>(_: &[u8], pointee: Option<&'a mut [u8]>) -> Option<Self::Value<'a>> {
        nullable(pointee, |bytes| slice_of_mut(bytes)?.first_mut())
    }
}

/// What a typed function returns to the client: `()` (LLVM sends one byte for `void`),
/// `bool` (one byte), or a [`Plain`] type without padding ([`bytemuck::NoUninit`]).
pub trait Reply {
    /// Its bytes on the wire.
    const SIZE: usize;
    /// Writes its bytes into `out` ([`Reply::SIZE`] of them).
    fn write(&self, out: &mut [u8]);
}

impl<T: Plain + NoUninit> Reply for T {
    const SIZE: usize = size_of::<T>();
    fn write(&self, out: &mut [u8]) {
        out.copy_from_slice(bytemuck::bytes_of(self));
    }
}

impl Reply for () {
    const SIZE: usize = 1;
    fn write(&self, out: &mut [u8]) {
        out[0] = 0;
    }
}

impl Reply for bool {
    const SIZE: usize = 1;
    fn write(&self, out: &mut [u8]) {
        out[0] = u8::from(*self);
    }
}

/// The shape of a typed function's calls, from its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Each argument's bytes in the packed list and, for a pointer, what its pointee must be.
    pub(crate) arguments: Vec<(usize, Option<Pointee>)>,
    /// The return value's bytes (1 for `()`).
    pub(crate) reply: usize,
}

impl Signature {
    /// The packed argument list's size: at least one byte, as LLVM sends it.
    pub(crate) fn wire(&self) -> usize {
        self.arguments.iter().map(|a| a.0).sum::<usize>().max(1)
    }
    /// The pointer arguments' pointees, in order.
    fn pointees(&self) -> impl Iterator<Item = Pointee> + '_ {
        self.arguments.iter().filter_map(|a| a.1)
    }
    /// Each pointer argument's offset in the packed list, in order.
    fn pointer_offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.arguments
            .iter()
            .scan(0, |at, &(size, pointee)| {
                let here = *at;
                *at += size;
                Some(pointee.map(|_| here))
            })
            .flatten()
    }
}

/// A function or closure a typed call runs: `Fn(A0, A1, ...) -> R` of up to
/// [`MAX_ARGUMENTS`] [`Argument`]s and a [`Reply`]. `Args` is the tuple of its argument
/// types, which the compiler infers.
pub trait TypedFn<Args>: Send + Sync + 'static {
    /// Its arguments and result as the wire carries them.
    fn signature() -> Signature;
    /// Decodes one lane's arguments from its packed bytes and pointees (one per pointer
    /// argument, in order) and calls the function, writing its result into `reply`. False if
    /// an argument could not be decoded (the lane is refused; the function was not called).
    fn call_lane(
        &self,
        wire: &[u8],
        pointees: &mut dyn Iterator<Item = Option<&mut [u8]>>,
        reply: &mut [u8],
    ) -> bool;
}

macro_rules! typed_fn {
    ($($a:ident),*) => {
        impl<F, R, $($a,)*> TypedFn<($($a,)*)> for F
        where
            F: Fn($($a),*) -> R
                + for<'a> Fn($(<$a as Argument>::Value<'a>),*) -> R
                + Send + Sync + 'static,
            R: Reply,
            $($a: Argument,)*
        {
            fn signature() -> Signature {
                Signature {
                    arguments: std::vec![$(($a::WIRE, $a::POINTEE)),*],
                    reply: R::SIZE,
                }
            }
            #[allow(non_snake_case, unused_variables, unused_mut, unused_assignments)]
            fn call_lane(
                &self,
                wire: &[u8],
                pointees: &mut dyn Iterator<Item = Option<&mut [u8]>>,
                reply: &mut [u8],
            ) -> bool {
                let mut at = 0;
                $(
                    let $a = {
                        let bytes = &wire[at..at + $a::WIRE];
                        at += $a::WIRE;
                        let pointee = if $a::POINTEE.is_some() { pointees.next().flatten() } else { None };
                        match $a::decode(bytes, pointee) {
                            Some(value) => value,
                            None => return false,
                        }
                    };
                )*
                // A call through a generic function picks the higher-ranked bound.
                #[allow(clippy::too_many_arguments)] // One per argument of the function.
                fn call<F, R, $($a),*>(f: &F, $($a: $a),*) -> R
                where
                    F: Fn($($a),*) -> R,
                {
                    f($($a),*)
                }
                let result: R = call(self, $($a),*);
                result.write(reply);
                true
            }
        }
    };
}

typed_fn!();
typed_fn!(A0);
typed_fn!(A0, A1);
typed_fn!(A0, A1, A2);
typed_fn!(A0, A1, A2, A3);
typed_fn!(A0, A1, A2, A3, A4);
typed_fn!(A0, A1, A2, A3, A4, A5);
typed_fn!(A0, A1, A2, A3, A4, A5, A6);
typed_fn!(A0, A1, A2, A3, A4, A5, A6, A7);

/// A registered typed function's [`TypedFn::call_lane`], its argument types erased.
type CallLane =
    dyn Fn(&[u8], &mut dyn Iterator<Item = Option<&mut [u8]>>, &mut [u8]) -> bool + Send + Sync;

/// What a registered typed handler keeps: the function and its calls' shape.
struct Registered {
    function: Box<CallLane>,
    signature: Signature,
    /// The pointer arguments' pointees, in order (at most [`MAX_ARGUMENTS`]).
    pointees: Vec<Pointee>,
    /// The pointer arguments' offsets in the packed list, in order.
    offsets: Vec<usize>,
}

impl RpcServer {
    /// Registers `function` as the host side of typed calls for `opcode`: what LLVM's
    /// `rpc::dispatch<opcode, fn>(client, args...)` (LLVM 23's `rpc_dispatch.h`) asks, served
    /// as its `rpc::invoke` would for each active lane (see [`crate::services::typed`]: the
    /// arguments' types, the refusals). The function's signature is the call's: a C
    /// `uint64_t sum(const uint32_t *xs, uint64_t n)` called with a span is served by
    /// `|xs: Option<&[u32]>, n: u64| -> u64`. It runs on the server thread and must not block.
    ///
    /// An opcode has one owner: registering a typed handler for an opcode that a user handler
    /// already accepts, or for one of the standard classes (libc `'c'`, offload `'o'`), fails
    /// with [`ServerError::OpcodeTaken`] (a handler registered for it later through
    /// `register*`, which cannot fail, is never reached: the first user handler that accepts
    /// an opcode serves it). It may be registered while the server runs.
    ///
    /// ```
    /// use std::ffi::CStr;
    /// # let server = rpc_core::RpcServer::new(Default::default());
    /// let op = rpc_core::Opcode::user(7);
    /// server.register_typed(op, |s: Option<&CStr>, out: &mut [u32]| -> u32 {
    ///     out.fill(s.map_or(0, |s| s.to_bytes().len() as u32));
    ///     out.len() as u32
    /// })?;
    /// assert!(server.register_typed(op, || {}).is_err(), "one owner per opcode");
    /// # Ok::<(), rpc_core::ServerError>(())
    /// ```
    pub fn register_typed<Args: 'static, F: TypedFn<Args>>(
        &self,
        opcode: Opcode,
        function: F,
    ) -> Result<(), ServerError> {
        let signature = F::signature();
        assert!(signature.arguments.len() <= MAX_ARGUMENTS);
        let call_lane: Box<CallLane> = Box::new(
            move |wire: &[u8],
                  pointees: &mut dyn Iterator<Item = Option<&mut [u8]>>,
                  reply: &mut [u8]| {
                <F as TypedFn<Args>>::call_lane(&function, wire, pointees, reply)
            },
        );
        let registered = Arc::new(Registered {
            pointees: signature.pointees().collect(),
            offsets: signature.pointer_offsets().collect(),
            signature,
            function: call_lane,
        });
        self.register_owner(
            opcode,
            Handler::script(move |request| serve(request, registered.clone())),
        )
    }
}

/// One pointer argument's pointees as they came: each lane's copy (kept lanes only, at the
/// copy's aligned offset) and which lanes sent any bytes.
#[derive(Default)]
struct Pointees {
    copies: Received,
    nonnull: u64,
}

/// The zeros before a pointee copy's first byte: up to its buffer's first address aligned to
/// [`POINTEE_ALIGN`] (see [`keep`]).
fn pad_of(copy: &[u8]) -> usize {
    let misalignment = copy.as_ptr().addr() % POINTEE_ALIGN;
    ((POINTEE_ALIGN - misalignment) % POINTEE_ALIGN).min(copy.len())
}

/// A lane's pointee, in its copy.
fn pointee_of(copy: &[u8]) -> &[u8] {
    &copy[pad_of(copy)..]
}

/// A lane's pointee, in its copy, for the function to change.
fn pointee_of_mut(copy: &mut [u8]) -> &mut [u8] {
    let pad = pad_of(copy);
    &mut copy[pad..]
}

/// Makes `copy` ready for a pointee of `len` bytes: room for all of it, and zeros up to the
/// first address aligned to [`POINTEE_ALIGN`], so that no byte moves once in.
fn keep(copy: &mut Vec<u8>, len: usize) {
    copy.clear();
    copy.reserve(len + POINTEE_ALIGN - 1);
    let misalignment = copy.as_ptr().addr() % POINTEE_ALIGN;
    copy.resize((POINTEE_ALIGN - misalignment) % POINTEE_ALIGN, 0);
}

/// The script of one typed request (see the module docs' table).
async fn serve(mut req: Request, call: Arc<Registered>) -> Result<Outcome, ServerError> {
    let limits = req.context().config().limits;
    let lanes_n = req.lane_size() as usize;
    let mask = req.mask();
    let mut refused = Refusals::default();
    let mut budget = limits.request_bytes;

    let mut pointees: [Pointees; MAX_ARGUMENTS] = Default::default();
    for (k, &shape) in call.pointees.iter().enumerate() {
        recv_pointee(
            &mut req,
            shape,
            limits.string_bytes,
            &mut budget,
            &mut refused,
            &mut pointees[k],
        )
        .await?;
        let nonnull = pointees[k].nonnull;
        req.send(|lane, p| {
            let host = if nonnull >> lane & 1 == 1 {
                host_pointer(k, lane)
            } else {
                0
            };
            p.set_word(0, host);
        })
        .await?;
    }

    let size = call.signature.wire();
    let mut wire = PooledVec::<u8>::with_capacity(lanes_n * size);
    wire.resize(lanes_n * size, 0);
    for offset in (0..size).step_by(BUFFER_SIZE) {
        let end = size.min(offset + BUFFER_SIZE);
        req.recv(|lane, p| {
            p.read_bytes(0, &mut wire[lane as usize * size..][offset..end]);
        })
        .await?;
    }

    let reply = call.signature.reply;
    let mut replies = PooledVec::<u8>::with_capacity(lanes_n * reply);
    replies.resize(lanes_n * reply, 0);
    for lane in lanes(mask) {
        if refused.has(lane) {
            continue;
        }
        let args = &wire[lane as usize * size..][..size];
        let forged = call.offsets.iter().enumerate().find(|&(k, &at)| {
            let expected = if pointees[k].nonnull >> lane & 1 == 1 {
                host_pointer(k, lane)
            } else {
                0
            };
            args[at..at + POINTER_BYTES] != expected.to_le_bytes()
        });
        if let Some((k, _)) = forged {
            refused.lane(
                lane,
                format!("pointer argument {k} is not the host pointer it was sent"),
            );
            continue;
        }
        let mut copies = pointees.iter_mut().take(call.pointees.len()).map(|p| {
            (p.nonnull >> lane & 1 == 1).then(|| pointee_of_mut(&mut p.copies[lane as usize]))
        });
        let out = &mut replies[lane as usize * reply..][..reply];
        let called = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            (call.function)(args, &mut copies, out)
        }));
        match called {
            Ok(true) => {}
            Ok(false) => refused.lane(lane, "an argument does not decode as its type"),
            Err(payload) => {
                out.fill(0);
                refused.lane(
                    lane,
                    format!("the function panicked: {}", panic_message(&*payload)),
                );
            }
        }
    }

    for pointee in pointees.iter().take(call.pointees.len()) {
        let mut back = PooledVec::<&[u8]>::with_capacity(lanes_n);
        for lane in 0..lanes_n as u32 {
            let keep = mask >> lane & 1 == 1 && !refused.has(lane);
            back.push(if keep && pointee.nonnull >> lane & 1 == 1 {
                pointee_of(&pointee.copies[lane as usize])
            } else {
                &[]
            });
        }
        req.send_n(&back).await?;
    }

    for offset in (0..reply).step_by(BUFFER_SIZE) {
        let end = reply.min(offset + BUFFER_SIZE);
        req.send(|lane, p| p.write_bytes(0, &replies[lane as usize * reply..][offset..end]))
            .await?;
    }

    // A refused lane's result is 0 and nothing was copied back to it.
    refused.finish()
}

/// Receives one pointer argument's pointees (a `send_n` per lane, PROTOCOL section 5) into
/// `into`: a lane's bytes are kept if they fit `shape`, the lane's byte string bound and what is
/// left of the request's `budget`, and the lane was not refused before; otherwise the lane is
/// refused and its bytes are drained as they come, every packet still taken and acknowledged.
async fn recv_pointee(
    req: &mut Request,
    shape: Pointee,
    bound: u64,
    budget: &mut u64,
    refused: &mut Refusals,
    into: &mut Pointees,
) -> Result<(), ServerError> {
    let lanes_n = req.lane_size() as usize;
    let mut copies = Received::buffers();
    copies.iter_mut().for_each(Vec::clear);
    copies.resize_with(lanes_n, Vec::new);
    let mut lengths = PooledVec::<u64>::with_capacity(lanes_n);
    lengths.resize(lanes_n, 0);
    let mut kept = 0u64;
    let mut nonnull = 0u64;
    req.recv(|lane, p| {
        let len = p.word(0);
        lengths[lane as usize] = len;
        if len != 0 {
            nonnull |= 1 << lane;
        }
        let why = if refused.has(lane) {
            return;
        } else if let Some(why) = shape.refuse(len) {
            why
        } else if len > bound {
            format!("a pointee of {len} bytes, above the byte string bound {bound}").into()
        } else if len > *budget {
            format!(
                "a pointee of {len} bytes, above what is left of the request's {} bytes",
                *budget
            )
            .into()
        } else {
            *budget -= len;
            if len > 0 {
                kept |= 1 << lane;
                let copy = &mut copies[lane as usize];
                keep(copy, len as usize);
                let first = (len as usize).min(FIRST_PACKET_BYTES);
                copy.extend_from_slice(&p.payload()[..first]);
            }
            return;
        };
        refused.lane(lane, why);
    })
    .await?;
    // What grows beyond the first packet is charged to the server's memory budget first, lane
    // by lane; a lane it has no room for is refused and drained like the others.
    let first = FIRST_PACKET_BYTES as u64;
    let mut charge = None;
    for lane in lanes(kept).filter(|&lane| lengths[lane as usize] > first) {
        let len = lengths[lane as usize];
        let charged = match &mut charge {
            None => {
                charge = req.context().memory.charge(len);
                charge.is_some()
            }
            Some(charge) => charge.grow(len),
        };
        if !charged {
            kept &= !(1 << lane);
            copies[lane as usize].clear();
            refused.lane(
                lane,
                "above the server's memory budget (Limits::held_bytes)",
            );
        }
    }
    let longest = lanes(req.mask())
        .map(|lane| lengths[lane as usize])
        .max()
        .unwrap_or(0);
    let mut offset = first;
    while offset < longest {
        req.recv(|lane, p| {
            let len = lengths[lane as usize];
            if kept >> lane & 1 == 0 || offset >= len {
                return;
            }
            let take = (len - offset).min(BUFFER_SIZE as u64) as usize;
            let copy = &mut copies[lane as usize];
            let start = copy.len();
            copy.resize(start + take, 0);
            p.read_bytes(0, &mut copy[start..]);
        })
        .await?;
        offset += BUFFER_SIZE as u64;
    }
    if shape.is_string() {
        for lane in lanes(kept) {
            if copies[lane as usize].last() != Some(&0) {
                refused.lane(lane, "a C string without its NUL");
            }
        }
    }
    into.copies = Received::new(copies, charge, false);
    into.nonnull = nonnull;
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pointees_are_refused_by_their_size_as_they_come() {
        assert_eq!(Pointee::Object(8).refuse(8), None);
        assert_eq!(
            Pointee::Object(8).refuse(0),
            None,
            "NULL is None to an Option"
        );
        assert!(Pointee::Object(8).refuse(7).is_some());
        assert!(Pointee::Object(8).refuse(16).is_some());
        assert_eq!(Pointee::Span(4).refuse(4096), None);
        assert!(Pointee::Span(4).refuse(6).is_some());
        assert_eq!(
            Pointee::CString.refuse(1),
            None,
            "the NUL is checked once it is in"
        );
        let required = Pointee::Required(&Pointee::Span(4));
        assert!(
            required.refuse(0).is_some(),
            "NULL where the function needs data"
        );
        assert!(required.refuse(3).is_some());
        assert_eq!(required.refuse(12), None);
        assert!(Pointee::Required(&Pointee::CString).is_string());
    }

    #[test]
    fn a_signature_is_the_functions_types_on_the_wire() {
        fn of<Args, F: TypedFn<Args>>(_: F) -> Signature {
            F::signature()
        }
        let sum = of(|_: Option<&[u32]>, _: u64| 0u64);
        assert_eq!(sum.arguments, [(8, Some(Pointee::Span(4))), (8, None)]);
        assert_eq!((sum.wire(), sum.reply), (16, 8));
        assert_eq!(sum.pointer_offsets().collect::<Vec<_>>(), [0]);
        let mixed = of(|_: u8, _: &CStr, _: bool, _: Option<&mut i16>| {});
        assert_eq!(mixed.wire(), 1 + 8 + 1 + 8);
        assert_eq!(mixed.pointer_offsets().collect::<Vec<_>>(), [1, 10]);
        assert_eq!(mixed.reply, 1, "void is one byte");
        assert_eq!(of(|| true).wire(), 1, "no arguments still send one byte");
    }

    #[test]
    fn a_lane_is_decoded_and_called_or_refused() {
        let f = |s: &CStr, xs: &mut [u16], k: u16| -> u32 {
            xs.iter_mut().for_each(|x| *x *= k);
            s.to_bytes().len() as u32
        };
        #[repr(align(16))]
        struct Aligned([u8; 4]);
        let mut text = *b"four\0";
        let mut xs = Aligned([1, 0, 2, 0]);
        let mut wire = [0u8; 18];
        wire[16..].copy_from_slice(&3u16.to_le_bytes());
        let mut reply = [0u8; 4];
        let mut pointees = [Some(&mut text[..]), Some(&mut xs.0[..])].into_iter();
        assert!(TypedFn::call_lane(&f, &wire, &mut pointees, &mut reply));
        drop(pointees);
        assert_eq!(u32::from_le_bytes(reply), 4);
        assert_eq!(xs.0, [3, 0, 6, 0]);
        let mut no_nul = *b"four";
        let mut pointees = [Some(&mut no_nul[..]), None].into_iter();
        assert!(!TypedFn::call_lane(&f, &wire, &mut pointees, &mut reply));
    }

    #[test]
    fn a_kept_copy_starts_at_an_aligned_address_and_stays_there() {
        for len in [1, 7, 56, 57, 4096] {
            let mut copy = Vec::new();
            keep(&mut copy, len);
            copy.extend(core::iter::repeat_n(0xAB, len));
            let bytes = pointee_of(&copy);
            assert_eq!(bytes.len(), len);
            assert_eq!(bytes.as_ptr().addr() % POINTEE_ALIGN, 0);
            assert!(bytes.iter().all(|&b| b == 0xAB));
        }
    }
}
