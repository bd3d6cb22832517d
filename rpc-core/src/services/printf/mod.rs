//! The host side of GPU `printf` (opcodes `PRINTF_TO_*`, PROTOCOL section 7).
//!
//! The exchange, per lane (`script.rs`, which says how a request's lanes go together):
//! 1. STREAM variants: C send buf\[0\] = raw stream handle.
//! 2. C send_n(format incl. NUL).
//! 3. S send buf\[0\] = bytes of arguments the format needs ([`Format::args_size`]); 0 for a
//!    lane whose handle or format is refused.
//! 4. C send_n(argument buffer).
//! 5. While any lane has a non-null `%s` pointer not yet fetched ([`Format::string_pointers`]):
//!    S send {buf\[0\] = 0, buf\[1\] = the lane's next pointer, last-first as LLVM asks, or 0};
//!    C send_n(the string incl. NUL, or nothing for 0). A pointer printed twice is fetched once.
//! 6. S formats each lane's output ([`Format::write`]) and writes it to the lane's stream in
//!    pieces of [`CHUNK`] bytes (never the whole of a longer output in memory), then S send
//!    {buf\[0\] = bytes written or -1, buf\[1\] = 0}: the reply always comes after the write.
//!
//! A format is read as the protocol layer parses it ([`crate::protocol::printf`], which a
//! client packs its arguments by) and compiled once into a [`Format`]: its pieces, argument
//! size, `%s` offsets and output bound, and, for a format of only plain conversions (no flags,
//! width or precision; most of what kernels print), its plan, each piece's step with its
//! argument's place, which prints a line without resolving a specification. The output is
//! byte-identical to the host C library's `printf` for the same format and values
//! ([`Dialect::HostC`], LLVM 23+: each conversion is handed to `snprintf`, except `%b`/`%B`
//! and the plain ones, formatted here, and `%n`, which prints nothing), or to LLVM libc's printf
//! core ([`Dialect::LlvmLibc`], the mailboxes the runtime attaches for LLVM 19-22 images).
//! A server thread keeps the last few plain formats it compiled (`format.rs`'s `Kept`), so that a format
//! printed again is not parsed again.
//!
//! Robustness (the format and the arguments come from an untrusted GPU): nothing here panics or
//! reads outside the slices it is given. Every format parses (a spec the dialect does not know
//! is a [`Piece::Malformed`](crate::protocol::printf::Piece::Malformed), printed as that
//! dialect's printf prints it). An argument buffer shorter than the format needs is a
//! [`FormatError`]. Widths and precisions, written or passed through `*`, are clamped to
//! [`MAX_FIELD`] so one conversion prints at most a few KiB. A null `%s` prints as glibc does:
//! `(null)` if the precision is absent or at least 6, else the empty string (then padded to the
//! width); a non-null `%s` whose string was not fetched prints the same way, as if it were
//! null. A length modifier on `c s p n` or a float is accepted and ignored: `%lc`/`%ls` print
//! as `%c`/`%s`, `%Lf` as `%f`.
//!
//! [`MAX_FIELD`]: crate::protocol::printf::MAX_FIELD
//! [`Dialect::HostC`]: crate::protocol::Dialect::HostC
//! [`Dialect::LlvmLibc`]: crate::protocol::Dialect::LlvmLibc

mod convert;
mod format;
mod script;

pub use format::{Format, FormatError, Sink, CHUNK};
pub(crate) use script::printf;
