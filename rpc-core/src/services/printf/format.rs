//! [`Format`], a printf format compiled once for every line printed with it: its pieces (as
//! [`crate::protocol::printf`] parses them), the argument bytes it takes, where its `%s`
//! pointers lie, a bound of its output, and, if every piece is plain, its plan: what each
//! piece prints and where its argument lies, so that a line is a walk of the plan without a
//! specification resolved or an argument placed (a line of `"lane %d of %s: %d\n"` took 69 ns
//! through the general conversions here, 43 by the pieces of the format, 33 by its plan).
//! [`Format::write`] prints one line, by the plan or by the pieces, handing it on in pieces of
//! [`CHUNK`] bytes where asked.
//!
//! # Kept formats
//! The plain formats a thread compiled last ([`Kept`]), so that a format seen again is not
//! parsed again: with a warp printing the same line in a loop, parsing it was about a fifth of
//! the server's time per request (docs/performance.md). Per thread, so no lock.

use super::convert::{convert, malformed, malformed_as_text, push_integer, Resolved};
use crate::protocol::printf::{self, place, Count, Flags, Length, Piece, MAX_FIELD};
use crate::protocol::Dialect;
use crate::server::exec::PooledVec;
use core::cell::RefCell;
use core::fmt;
use std::ffi::CStr;
use std::vec::Vec;

/// The size of the pieces [`Format::write`] hands a sink: output is gathered up to this, then
/// handed on, so a long output is never whole in memory.
pub const CHUNK: usize = 64 << 10;

/// Room for the pieces of a format of up to 3 conversions (a literal before each and one at
/// the end), parsed without growing the vector.
const PIECES: usize = 8;

/// Where [`Format::write`] puts a line.
pub enum Sink<'o> {
    /// Appended to a buffer, whole: for a line known to be short ([`Format::output_bound`]).
    Append(&'o mut Vec<u8>),
    /// Handed on in pieces of [`CHUNK`] bytes, the last one shorter: a long line is never
    /// whole in memory.
    Chunks(&'o mut dyn FnMut(&[u8])),
}

/// Why a format's arguments cannot be used (every format parses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatError {
    /// The format needs `needed` bytes of arguments; only `available` were sent.
    MissingArguments {
        /// Bytes needed.
        needed: usize,
        /// Bytes sent.
        available: usize,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FormatError::MissingArguments { needed, available } => write!(
                f,
                "printf format needs {needed} bytes of arguments, only {available} were sent"
            ),
        }
    }
}

impl std::error::Error for FormatError {}

/// A printf format compiled for a dialect and a packing of its arguments, for every lane that
/// prints it. Its vectors come from the thread's pool and go back to it when it is dropped.
pub struct Format<'f> {
    /// The format as sent (what follows its NUL is not read): the plan's literals are ranges
    /// of it. Empty in a format `Kept` keeps, which keeps the bytes beside it.
    text: &'f [u8],
    dialect: Dialect,
    packed: bool,
    args_size: usize,
    /// More than it prints without its `%s` strings ([`output_bound`]).
    bound: usize,
    /// Where its `%s` pointers lie in an argument buffer, in format order.
    strings_at: PooledVec<usize>,
    body: Body<'f>,
}

/// How a [`Format`] prints.
enum Body<'f> {
    /// By its plan: every piece [`is_plain`], a step per piece (the pieces are not kept).
    Plan(PooledVec<Step>),
    /// By its pieces, each conversion resolved and printed as C prints it.
    Pieces(PooledVec<Piece<'f>>),
}

/// What a piece of a plain format prints, its argument's place in an argument buffer found
/// once, not per lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The `len` bytes at `at` of the format, printed as they are.
    Literal { at: usize, len: usize },
    /// The `%` of a `%%`.
    Percent,
    /// The integer of 4 bytes (8 if `wide`) at `at`, printed as `conversion` (`d i u x X o`).
    Integer {
        at: usize,
        wide: bool,
        conversion: u8,
    },
    /// A `%c`: the low byte of the int at `at`.
    Char { at: usize },
    /// A `%s`: the string at the pointer at `at`.
    Str { at: usize },
}

impl<'f> Format<'f> {
    /// Parses and compiles `text` (a format; it ends at its first NUL) as `dialect`'s printf
    /// reads it, for argument buffers `packed` or not.
    pub fn new(dialect: Dialect, text: &'f [u8], packed: bool) -> Self {
        // A literal and a spec per `%` at most, and a last literal: at most one allocation.
        let specs = text
            .iter()
            .take_while(|&&b| b != 0)
            .filter(|&&b| b == b'%')
            .count();
        let mut pieces = PooledVec::with_capacity((2 * specs + 1).max(PIECES));
        pieces.extend(printf::parse(dialect, text));
        let plain = pieces.iter().all(is_plain);
        let mut strings_at = pooled(pieces.iter().filter(|piece| is_string(piece)).count());
        let mut plan = pooled(if plain { pieces.len() } else { 0 });
        // One walk: each argument placed, each piece's place in the text.
        let (mut end, mut in_text) = (0, 0);
        for piece in pieces.iter() {
            let mut start = 0;
            for size in piece.arg_sizes() {
                (start, end) = place(end, size, packed);
            }
            // A `%s` takes a value, its last argument: the pointer.
            if is_string(piece) {
                strings_at.push(start);
            }
            if plain {
                plan.push(step(piece, start, in_text));
            }
            in_text += piece.text_len();
        }
        let bound = output_bound(&pieces);
        Format {
            text,
            dialect,
            packed,
            args_size: end,
            bound,
            strings_at,
            body: if plain {
                Body::Plan(plan)
            } else {
                Body::Pieces(pieces)
            },
        }
    }

    /// Size in bytes of the argument buffer it needs.
    pub fn args_size(&self) -> usize {
        self.args_size
    }

    /// More than the bytes it prints, but for its `%s` strings, which add their lengths:
    /// literal bytes, plus for each conversion its widest width and precision (a `*` counts as
    /// [`MAX_FIELD`]) and room for the longest number (a `%f` of the largest double).
    pub fn output_bound(&self) -> usize {
        self.bound
    }

    /// Appends the non-null `%s` pointers of `args`, in format order, to `pointers`; an
    /// argument buffer shorter than [`Format::args_size`] is an error (nothing appended).
    pub fn string_pointers(&self, args: &[u8], pointers: &mut Vec<u64>) -> Result<(), FormatError> {
        if args.len() < self.args_size {
            return Err(self.missing(args));
        }
        let found = self.strings_at.iter().map(|&at| arg_at(args, at, 8));
        pointers.extend(found.flatten().filter(|&pointer| pointer != 0));
        Ok(())
    }

    /// Formats one line with the arguments in `args`, as the dialect's printf would, into
    /// `sink`. In [`Sink::Chunks`], besides a piece it holds at most one conversion's output
    /// (at most [`MAX_FIELD`] bytes and a number's digits, or one `%s` string); a literal part
    /// of the format goes to the sink from the format itself.
    ///
    /// `strings(ptr)` returns the bytes of the device string at a non-null `%s` pointer (its
    /// NUL, and anything after a NUL, is ignored), or `None` if it was not fetched: that string
    /// then prints as a null `%s` does. A missing argument is found only where it is needed,
    /// after the output before it: check the arguments with [`Format::string_pointers`] first.
    pub fn write<'s>(
        &self,
        args: &[u8],
        strings: &dyn Fn(u64) -> Option<&'s [u8]>,
        sink: Sink,
    ) -> Result<(), FormatError> {
        let sink = match sink {
            Sink::Append(out) => {
                // Never a whole chunk: the sink is never called.
                let mut unchunked = Chunks {
                    size: usize::MAX,
                    sink: &mut |_| {},
                };
                return self.write_onto(args, strings, out, &mut unchunked);
            }
            Sink::Chunks(sink) => sink,
        };
        // Room for a usual line; a longer one grows it (up to a chunk). Not the bound: that is
        // about 330 bytes a conversion, a large allocation (glibc's costlier path) for every line.
        let mut out = Vec::with_capacity(self.bound.min(256));
        let mut chunks = Chunks { size: CHUNK, sink };
        self.write_onto(args, strings, &mut out, &mut chunks)?;
        if !out.is_empty() {
            (chunks.sink)(&out);
        }
        Ok(())
    }

    /// [`Format::write`], appending to `out` and handing each full chunk on to `chunks`.
    fn write_onto<'s>(
        &self,
        args: &[u8],
        strings: &dyn Fn(u64) -> Option<&'s [u8]>,
        out: &mut Vec<u8>,
        chunks: &mut Chunks,
    ) -> Result<(), FormatError> {
        match &self.body {
            Body::Plan(plan) => self
                .write_plan(plan, args, strings, out, chunks)
                .map_err(|()| self.missing(args)),
            Body::Pieces(pieces) => self.write_pieces(pieces, args, strings, out, chunks),
        }
    }

    /// The line of a plain format, by its plan: each step straight onto `out`, as C prints a
    /// conversion of no flags, width or precision. `Err` where `args` lacks an argument, after
    /// the output before it.
    fn write_plan<'s>(
        &self,
        plan: &[Step],
        args: &[u8],
        strings: &dyn Fn(u64) -> Option<&'s [u8]>,
        out: &mut Vec<u8>,
        chunks: &mut Chunks,
    ) -> Result<(), ()> {
        for step in plan {
            match *step {
                Step::Literal { at, len } => {
                    let bytes = self.text.get(at..at + len).unwrap_or_default();
                    push_literal(out, bytes, chunks);
                    continue;
                }
                Step::Percent => {
                    push_literal(out, b"%", chunks);
                    continue;
                }
                Step::Char { at } => out.push(arg_at(args, at, 4).ok_or(())? as u8),
                Step::Str { at } => {
                    // A string ends at its first NUL, if it has one; a null or unfetched one
                    // prints as glibc and LLVM print a null `%s`.
                    let pointer = arg_at(args, at, 8).ok_or(())?;
                    let fetched = if pointer == 0 { None } else { strings(pointer) };
                    let text = fetched.map_or(&b"(null)"[..], |bytes| {
                        CStr::from_bytes_until_nul(bytes).map_or(bytes, CStr::to_bytes)
                    });
                    out.extend_from_slice(text);
                }
                Step::Integer {
                    at,
                    wide,
                    conversion,
                } => {
                    let value = arg_at(args, at, if wide { 8 } else { 4 }).ok_or(())?;
                    if matches!(conversion, b'd' | b'i') {
                        let v = if wide {
                            value as i64
                        } else {
                            i64::from(value as u32 as i32)
                        };
                        push_integer(out, b'd', v < 0, v.unsigned_abs());
                    } else {
                        push_integer(out, conversion, false, value);
                    }
                }
            }
            hand_on_full_chunks(out, chunks);
        }
        Ok(())
    }

    /// The line of any format, by its pieces: each specification's arguments read in order,
    /// its `*`s resolved, and printed as the dialect prints it.
    fn write_pieces<'s>(
        &self,
        pieces: &[Piece],
        args: &[u8],
        strings: &dyn Fn(u64) -> Option<&'s [u8]>,
        out: &mut Vec<u8>,
        chunks: &mut Chunks,
    ) -> Result<(), FormatError> {
        let mut offset = 0;
        // The argument of `size` bytes placed after the last one, zero-extended.
        let mut take = |size: usize| {
            let (start, end) = place(offset, size, self.packed);
            let value = arg_at(args, start, size).ok_or_else(|| self.missing(args))?;
            offset = end;
            Ok(value)
        };
        for piece in pieces {
            let (spec, malformed_text) = match piece {
                Piece::Spec(spec) => (spec, None),
                Piece::Malformed { spec, text } => (spec, Some(*text)),
                Piece::Literal(bytes) => {
                    push_literal(out, bytes, chunks);
                    continue;
                }
                Piece::Percent => {
                    push_literal(out, b"%", chunks);
                    continue;
                }
            };
            let mut flags = spec.flags;
            let mut stars = [None; 2];
            let width = match spec.width {
                Count::None => None,
                Count::Fixed(n) => Some(n),
                Count::Star => {
                    let w = take(4)? as u32 as i32;
                    stars[0] = Some(w);
                    flags.left |= w < 0;
                    Some((w.unsigned_abs() as usize).min(MAX_FIELD))
                }
            };
            let precision = match spec.precision {
                Count::None => None,
                Count::Fixed(n) => Some(n),
                // A negative precision is taken as if it were absent.
                Count::Star => {
                    let p = take(4)? as u32 as i32;
                    stars[1] = Some(p);
                    usize::try_from(p).ok()
                }
            };
            let precision = precision.map(|p| p.min(MAX_FIELD));
            let value = match (malformed_text, spec.value_size()) {
                (Some(_), _) | (_, 0) => 0,
                (None, size) => take(size)?,
            };
            let arg = Resolved {
                spec,
                flags,
                width,
                precision,
                stars,
                value,
            };
            match malformed_text {
                None => convert(self.dialect, out, &arg, strings),
                Some(text) if malformed_as_text(self.dialect, spec.conversion) => {
                    push_literal(out, text, chunks)
                }
                Some(text) => malformed(out, &arg, text),
            }
            hand_on_full_chunks(out, chunks);
        }
        Ok(())
    }

    /// The error of an argument buffer `args` too short for it.
    fn missing(&self, args: &[u8]) -> FormatError {
        FormatError::MissingArguments {
            needed: self.args_size,
            available: args.len(),
        }
    }

    /// The same plain format over `text` (bytes equal to those it was compiled from), its
    /// vectors from the thread's pool; `None` if it is not plain. For `Kept`, which keeps
    /// plain formats (over no text) and hands out copies of them.
    pub(super) fn plain_copy<'g>(&self, text: &'g [u8]) -> Option<Format<'g>> {
        let Body::Plan(plan) = &self.body else {
            return None;
        };
        Some(Format {
            text,
            dialect: self.dialect,
            packed: self.packed,
            args_size: self.args_size,
            bound: self.bound,
            strings_at: pooled_copy(&self.strings_at),
            body: Body::Plan(pooled_copy(plan)),
        })
    }

    /// Makes this plain format a copy of plain `other` but for its text, in its own vectors
    /// (no allocation once they are large enough); false, unchanged, if either is not plain.
    pub(super) fn copy_plain(&mut self, other: &Format) -> bool {
        let (Body::Plan(mine), Body::Plan(theirs)) = (&mut self.body, &other.body) else {
            return false;
        };
        mine.clear();
        mine.extend_from_slice(theirs);
        self.strings_at.clear();
        self.strings_at.extend_from_slice(&other.strings_at);
        self.dialect = other.dialect;
        self.packed = other.packed;
        self.args_size = other.args_size;
        self.bound = other.bound;
        true
    }

    /// How many `%s` it prints: the most pointers [`Format::string_pointers`] appends.
    pub(super) fn string_count(&self) -> usize {
        self.strings_at.len()
    }

    /// Its dialect and packing.
    pub(super) fn how(&self) -> (Dialect, bool) {
        (self.dialect, self.packed)
    }
}

/// An empty vector from the thread's pool with room for `n` (a power of two: few sizes of
/// block for the pool to keep), none for 0.
fn pooled<T>(n: usize) -> PooledVec<T> {
    PooledVec::with_capacity(if n == 0 { 0 } else { n.next_power_of_two() })
}

/// A copy of `items` in a vector from the thread's pool.
fn pooled_copy<T: Copy>(items: &[T]) -> PooledVec<T> {
    let mut copy = pooled(items.len());
    copy.extend_from_slice(items);
    copy
}

/// Whether a conversion of no flags, width or precision prints `piece` whatever its
/// argument: a literal, `%%`, or a conversion with no flags, width or precision of an integer
/// of its full C type, a character or a string.
fn is_plain(piece: &Piece) -> bool {
    let Piece::Spec(spec) = piece else {
        return !matches!(piece, Piece::Malformed { .. });
    };
    let bare = spec.flags == Flags::default()
        && matches!(spec.width, Count::None | Count::Fixed(0))
        && spec.precision == Count::None;
    bare && match spec.conversion {
        b'c' | b's' => true,
        b'd' | b'i' | b'u' | b'x' | b'X' | b'o' => !matches!(spec.length, Length::H | Length::Hh),
        _ => false,
    }
}

/// Whether `piece` is a `%s` conversion: its argument is a pointer to a string the server
/// fetches from the device.
fn is_string(piece: &Piece) -> bool {
    matches!(piece, Piece::Spec(spec) if spec.conversion == b's')
}

/// The step of a plain `piece`, its value at `at` of the arguments, its text at `in_text` of
/// the format.
fn step(piece: &Piece, at: usize, in_text: usize) -> Step {
    match piece {
        Piece::Literal(bytes) => Step::Literal {
            at: in_text,
            len: bytes.len(),
        },
        Piece::Spec(spec) => match spec.conversion {
            b'c' => Step::Char { at },
            b's' => Step::Str { at },
            conversion => Step::Integer {
                at,
                wide: spec.value_size() == 8,
                conversion,
            },
        },
        // A `%%` (a malformed piece is not plain).
        _ => Step::Percent,
    }
}

/// More than the bytes the pieces can print without `%s` strings ([`Format::output_bound`]).
fn output_bound(pieces: &[Piece]) -> usize {
    let count = |c: &Count| match c {
        Count::None => 0,
        Count::Fixed(n) => *n,
        Count::Star => MAX_FIELD,
    };
    pieces.iter().fold(0usize, |sum, piece| {
        sum.saturating_add(match piece {
            Piece::Literal(bytes) => bytes.len(),
            Piece::Spec(spec) => count(&spec.width) + count(&spec.precision) + 330,
            // The text, or glibc's own form of it with each `*` as a number, or one of
            // glibc's conversions, `%m` (a message), `%C`, `%S`, with clamped fields.
            Piece::Malformed { spec, text } => {
                text.len() + count(&spec.width) + count(&spec.precision) + 330
            }
            Piece::Percent => 1,
        })
    })
}

/// The argument of `size` bytes at `start` of `args`, zero-extended, if `args` holds it.
fn arg_at(args: &[u8], start: usize, size: usize) -> Option<u64> {
    let bytes = args.get(start..)?.get(..size)?;
    // Every argument is 4 or 8 bytes: read as such, one load. (A copy of a run-time length
    // into a word was a call to memcpy, and the word's load then waited for its bytes' stores:
    // perf put a third of the formatter's samples there.)
    Some(match *bytes {
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e, f, g, h] => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => {
            let mut word = [0u8; 8];
            word.iter_mut().zip(bytes).for_each(|(w, b)| *w = *b);
            u64::from_le_bytes(word)
        }
    })
}

/// Where formatted output goes once `out` holds `size` bytes: to `sink`, in pieces of `size`.
struct Chunks<'s> {
    size: usize,
    sink: &'s mut dyn FnMut(&[u8]),
}

/// Hands on the whole chunks `out` holds, keeping the rest.
fn hand_on_full_chunks(out: &mut Vec<u8>, chunks: &mut Chunks) {
    if out.len() < chunks.size {
        return; // Most calls, and all without chunks: no division.
    }
    let full = out.len() / chunks.size * chunks.size;
    out[..full].chunks(chunks.size).for_each(&mut *chunks.sink);
    out.drain(..full);
}

/// Appends `bytes` to `out`, handing each chunk on as it fills; whole chunks of `bytes` go
/// to the sink straight from `bytes`, uncopied.
fn push_literal(out: &mut Vec<u8>, mut bytes: &[u8], chunks: &mut Chunks) {
    let size = chunks.size;
    if bytes.len() < size.saturating_sub(out.len()) {
        out.extend_from_slice(bytes); // Most: the chunk being filled does not fill up.
        return;
    }
    while !bytes.is_empty() {
        if out.is_empty() && bytes.len() >= size {
            (chunks.sink)(&bytes[..size]);
            bytes = &bytes[size..];
            continue;
        }
        let take = (size - out.len()).min(bytes.len());
        out.extend_from_slice(&bytes[..take]);
        bytes = &bytes[take..];
        if out.len() == size {
            (chunks.sink)(out);
            out.clear();
        }
    }
}
/// How many formats a thread keeps: a few call sites printing in turn.
const KEPT: usize = 8;
/// The longest format kept (with its NUL): a line, not a page.
const KEPT_BYTES: usize = 256;

/// The last [`KEPT`] plain formats of at most [`KEPT_BYTES`] bytes this thread compiled, each
/// its bytes as sent and the compiled format, kept over no text (its plan's literals are
/// ranges of the bytes, which a format equal to them has too). The entry a new format
/// replaces lends its vectors: a thread printing more formats in turn than are kept allocates
/// nothing for them once warm.
#[derive(Default)]
pub(super) struct Kept {
    formats: Vec<(Vec<u8>, Format<'static>)>,
    /// The entry the next format replaces once all are used.
    next: usize,
}

std::thread_local! {
    static KEPT_FORMATS: RefCell<Kept> = RefCell::new(Kept::default());
}

impl Kept {
    /// `text` compiled for `dialect` and `packed` (see [`Format::new`]): the format kept from
    /// before if there is one, else compiled now, and kept if it is plain and short.
    pub(super) fn format(dialect: Dialect, text: &[u8], packed: bool) -> Format<'_> {
        let how = (dialect, packed);
        if let Some(kept) = Self::with(|kept| kept.recall(how, text)).flatten() {
            return kept;
        }
        let format = Format::new(dialect, text, packed);
        if text.len() <= KEPT_BYTES {
            Self::with(|kept| kept.keep(text, &format));
        }
        format
    }

    /// `f` on this thread's formats, unless they are being torn down or already borrowed.
    fn with<T>(f: impl FnOnce(&mut Kept) -> T) -> Option<T> {
        KEPT_FORMATS
            .try_with(|cell| Some(f(&mut *cell.try_borrow_mut().ok()?)))
            .ok()
            .flatten()
    }

    /// A copy over `text` of the format kept for `how` with bytes `text`.
    fn recall<'f>(&self, how: (Dialect, bool), text: &'f [u8]) -> Option<Format<'f>> {
        let (_, kept) = self
            .formats
            .iter()
            .find(|(bytes, kept)| kept.how() == how && bytes[..] == *text)?;
        kept.plain_copy(text)
    }

    /// Keeps `format`, compiled from `text`, if it is plain.
    fn keep(&mut self, text: &[u8], format: &Format) {
        if self.formats.len() < KEPT {
            if let Some(kept) = format.plain_copy(&[]) {
                self.formats.push((text.to_vec(), kept));
            }
            return;
        }
        let (bytes, kept) = &mut self.formats[self.next];
        if kept.copy_plain(format) {
            bytes.clear();
            bytes.extend_from_slice(text);
            self.next = (self.next + 1) % KEPT;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod kept_tests {
    use super::*;
    use crate::services::printf::Sink;

    /// Compiles `format` as a request does, which keeps it if it is plain (and new).
    fn keep(format: &[u8]) {
        Kept::format(Dialect::HostC, format, false);
    }

    /// Whether this thread keeps `format` for `how`; if so, checks that what it gives prints
    /// what compiling a copy of the format prints, the plan's literals in the copy.
    fn recall(format: &[u8], how: (Dialect, bool)) -> bool {
        let copy = format.to_vec();
        let Some(kept) = Kept::with(|kept| kept.recall(how, &copy)).flatten() else {
            return false;
        };
        let fresh = Format::new(how.0, &copy, how.1);
        assert_eq!(
            (kept.args_size(), kept.output_bound()),
            (fresh.args_size(), fresh.output_bound())
        );
        let args: Vec<u8> = (1..=64u8).collect();
        let strings = |_| Some(&b"str"[..]);
        let (mut pointers, mut fresh_pointers) = (Vec::new(), Vec::new());
        kept.string_pointers(&args, &mut pointers).unwrap();
        fresh.string_pointers(&args, &mut fresh_pointers).unwrap();
        assert_eq!(pointers, fresh_pointers);
        let (mut line, mut fresh_line) = (Vec::new(), Vec::new());
        kept.write(&args, &strings, Sink::Append(&mut line))
            .unwrap();
        fresh
            .write(&args, &strings, Sink::Append(&mut fresh_line))
            .unwrap();
        assert_eq!(line, fresh_line);
        true
    }

    #[test]
    fn kept_formats_are_the_last_few_short_plain_ones_for_their_dialect_and_packing() {
        let host = (Dialect::HostC, false);
        let format = |k: usize| std::format!("line {k}: %d of %s, 100%%\n\0").into_bytes();
        keep(&format(0));
        assert!(recall(&format(0), host));
        assert!(!recall(&format(0), (Dialect::HostC, true)), "packed");
        assert!(!recall(&format(0), (Dialect::LlvmLibc, false)), "dialect");
        assert!(!recall(b"line 0: %d\0", host));
        // The ninth format replaces the first one kept.
        for k in 1..=KEPT {
            keep(&format(k));
        }
        assert!(!recall(&format(0), host));
        for k in 1..=KEPT {
            assert!(recall(&format(k), host), "{k}");
        }
        // A long format is compiled for its request only, and so is one not plain.
        let long = [&[b'x'; KEPT_BYTES][..], b"%d\0"].concat();
        keep(&long);
        assert!(!recall(&long, host));
        keep(b"%5d\0");
        assert!(!recall(b"%5d\0", host));
    }
}

/// The test arguments these tests share with the services' integration tests.
#[cfg(all(test, not(loom)))]
#[path = "../../../tests/common/printf_args.rs"]
#[macro_use]
mod printf_args;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::protocol::printf::parse;
    use crate::protocol::printf::tests::lcg;
    use std::ffi::{c_int, CStr};
    use std::string::String;
    use std::vec;

    use printf_args::*;

    const LONG: &str =
        "The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs!";
    const AB: &str = "abcdef";

    fn rows() -> Vec<Row> {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        vec![
            row!(c"hello, world\n";),
            row!(c"";),
            row!(c"%d"; I(42)),
            row!(c"%i|%d"; I(i32::MIN), I(i32::MAX)),
            row!(c"%5d|%-5d|%05d|"; I(42), I(-42), I(-42)),
            row!(c"%+d|% d|%+ d|% 05d"; I(7), I(7), I(-7), I(7)),
            row!(c"%.3d|%.0d|%5.0d|%-+8.4d|"; I(7), I(0), I(0), I(-7)),
            row!(c"%5.3d|%-5.3d|%05.3d|"; I(-7), I(-7), I(-7)),
            row!(c"%u|%u"; U(u32::MAX), U(0)),
            row!(c"%o|%#o|%#.0o|%#o"; U(8), U(8), U(0), U(0)),
            row!(c"%x|%X|%#x|%#X|%#010x|%-#10X|"; U(0xbeef), U(0xbeef), U(0xbeef), U(0xbeef),
                 U(0xbeef), U(0xbeef)),
            row!(c"%#.0x|%#x|%.0x|%#5.0x|"; U(0), U(0), U(0), U(0)),
            row!(c"%hd|%hhd|%hu|%hhu"; I(70000), I(300), I(-1), I(-1)),
            row!(c"%hx|%hhX|%hho|%#hhx|%05hd"; I(0x12345), I(0x1ff), I(0x1ff), I(0x180), I(-3)),
            row!(c"%ld|%lld|%li"; L(i64::MIN), L(i64::MAX), L(-1)),
            row!(c"%lu|%llx|%#llo|%lX"; UL(u64::MAX), UL(0xdead_beef_cafe), UL(511), UL(1 << 63)),
            row!(c"%jd|%zd|%td|%zu|%ju|%zx"; L(-5), L(6), L(-7), UL(8), UL(9), UL(255)),
            row!(c"%qd|%Ld|%qu|%Lx"; L(-1 << 40), L(1 << 50), UL(3), UL(0xabc)),
            row!(c"%c%c%c"; I(b'a'.into()), I(b'b'.into()), I(b'c'.into())),
            row!(c"[%5c][%-5c][%c]"; I(b'x'.into()), I(b'y'.into()), I(0x141)),
            row!(c"a%cb"; I(0)),
            row!(c"%c%ld"; I(b'z'.into()), L(1_234_567_890_123)),
            row!(c"%d%lld%d%lld%hhd%f"; I(1), L(2), I(3), L(4), I(5), D(6.5)),
            row!(c"%s"; s("hi")),
            row!(c"%s|%s|%s"; s("a"), s("bb"), s("ccc")),
            row!(c"%10s|%-10s|%.2s|%10.3s|%.0s|"; s(AB), s(AB), s(AB), s(AB), s(AB)),
            row!(c"%s"; NULL),
            row!(c"[%10s][%-10s][%.5s][%.6s][%3.2s][%.0s][%.7s]"; NULL, NULL, NULL,
                 NULL, NULL, NULL, NULL),
            row!(c"%s and %s, %s"; NULL, s("x"), s("")),
            row!(c"%s"; s(LONG)),
            row!(c"%.70s|%100s|%-90s|%s"; s(LONG), s(LONG), s(LONG), s(AB)),
            row!(c"100%%";),
            row!(c"%%d %d %%%%"; I(5)),
            row!(c"[%5%|%-05%|%.3%|%l%|%+ #%|%d]"; I(9)),
            row!(c"[%*%|%.*%|%-*.*%|%d]"; I(5), I(6), I(7), I(8), I(9)),
            row!(c"ab%ncd"; N(())),
            row!(c"%d%n%s%hn|%lln"; I(1), N(()), s("z"), N(()), N(())),
            row!(c"%p"; P(0x1234_5678)),
            row!(c"%p|%20p|%-20p|%+p"; P(0), P(0xdead), P(0xbeef), P(0x10)),
            row!(c"%f|%F"; D(1.23456), D(-2.0)),
            row!(c"%.2f|%10.3f|%-10.1f|%+f|% f|%#.0f"; D(2.345), D(2.345), D(2.345), D(2.345),
                 D(2.345), D(2.0)),
            row!(c"%e|%E|%.0e|%#.0e|%12.3e"; D(12345.678), D(12345.678), D(12345.678),
                 D(12345.678), D(-1e-300)),
            row!(c"%g|%G|%#g|%g|%.3g"; D(0.0001), D(1e20), D(1.5), D(100000.0), D(1234567.0)),
            row!(c"%a|%A|%.2a|%20a|%#a"; D(1.0), D(-0.5), D(1.2345), D(1e-310), D(2.0)),
            row!(c"%f|%f|%f|%f|%5.1f|%-6f|"; D(inf), D(-inf), D(nan), D(-nan), D(nan), D(inf)),
            row!(c"%F|%E|%G|%A|%010f"; D(inf), D(nan), D(-inf), D(-nan), D(-inf)),
            row!(c"%f|%e|%g|%a|%+.0f"; D(-0.0), D(-0.0), D(-0.0), D(-0.0), D(0.0)),
            row!(c"%010.2f|%-010.2f|%+010.2f|% 010.2f"; D(-3.5), D(-3.5), D(3.5), D(3.5)),
            row!(c"%lf|%lf|%le"; D(1.25), D(2.5), D(1e-5)),
            row!(c"%Lf|%Le|%Lg|%La" => c"%f|%e|%g|%a"; D(1.5), D(1.5), D(1.5), D(1.5)),
            row!(c"%.300f"; D(1.0 / 3.0)),
            row!(c"%f|%g"; D(1e300), D(f64::MIN_POSITIVE)),
            row!(c"%*d|"; I(8), I(42)),
            row!(c"%-*d|"; I(8), I(42)),
            row!(c"%*d|%*d|"; I(-8), I(42), I(0), I(1)),
            row!(c"%.*f|%.*f"; I(3), D(1.23456), I(-1), D(1.23456)),
            row!(c"%*.*s|%.*s|"; I(12), I(3), s(AB), I(-2), s(AB)),
            row!(c"%*.*ld|"; I(-15), I(10), L(-42)),
            row!(c"%c%*ld|%c%.*f"; I(b'q'.into()), I(5), L(7), I(b'r'.into()), I(2), D(0.125)),
            row!(c"%0*d|%-0*x|"; I(6), I(-5), I(6), U(0xf)),
            row!(c"%b|%B|%#b|%#B"; U(5), U(5), U(5), U(5)),
            row!(c"%#010b|%-#10b|%.8b|%08.3b|%#12.8B|"; U(5), U(5), U(5), U(5), U(5)),
            row!(c"%#.0b|%#b|%.0b|%5b|%#5.0b|"; U(0), U(0), U(0), U(0), U(0)),
            row!(c"%hhb|%hb|%lb|%llB|%#jb"; I(0x1ff), I(0x1ffff), UL(u64::MAX), UL(1 << 63), UL(6)),
            row!(c"%+b|% b|%#B|%b"; U(3), U(3), U(0), U(u32::MAX)),
            row!(c"%*b|%-*b|%.*b"; I(10), U(9), I(-10), U(9), I(6), U(9)),
            row!(c"%1000d"; I(1)),
            row!(c"%-1000s|%.1000d"; s("w"), I(-3)),
            row!(c"%d %s %c %p %f %x %ld %s %% %u"; I(-1), s("str"), I(b'C'.into()), P(0xff),
                 D(0.5), U(0xabc), L(1 << 40), NULL, U(7)),
        ]
    }

    fn missing(needed: usize, available: usize) -> Result<Vec<u8>, FormatError> {
        Err(FormatError::MissingArguments { needed, available })
    }

    /// `text` read as the host C library reads it, printed as `dialect` prints (most rows
    /// read the same in both dialects; `%n` and `%q` do not).
    fn host_read(dialect: Dialect, text: &[u8], packed: bool) -> Format<'_> {
        let mut format = Format::new(Dialect::HostC, text, packed);
        format.dialect = dialect;
        format
    }

    /// The non-null `%s` pointers of `args`, or why there are none.
    fn string_pointers(format: &Format, args: &[u8]) -> Result<Vec<u64>, FormatError> {
        let mut pointers = Vec::new();
        format
            .string_pointers(args, &mut pointers)
            .map(|()| pointers)
    }

    /// The whole line, put together from the pieces [`Format::write`] hands a sink.
    fn format<'s>(
        format: &Format,
        args: &[u8],
        strings: &dyn Fn(u64) -> Option<&'s [u8]>,
    ) -> Result<Vec<u8>, FormatError> {
        let mut all = Vec::new();
        let mut sink = |chunk: &[u8]| all.extend_from_slice(chunk);
        format.write(args, strings, Sink::Chunks(&mut sink))?;
        Ok(all)
    }

    /// The same format printed by its pieces, never by a plan.
    fn general(format: Format<'_>) -> Format<'_> {
        let mut pieces = PooledVec::with_capacity(PIECES);
        pieces.extend(parse(Dialect::HostC, format.text));
        Format {
            body: Body::Pieces(pieces),
            ..format
        }
    }

    #[test]
    fn every_row_matches_the_host_snprintf_packed_and_unpacked() {
        let rows = rows();
        assert!(rows.len() >= 60, "{} rows", rows.len());
        for row in &rows {
            let expected = &row.reference;
            for packed in [false, true] {
                let pieces = Format::new(Dialect::HostC, row.format.to_bytes(), packed);
                let (args, strings, pointers) = encode(0, &row.args, packed);
                let what = std::format!("{:?} packed={packed}", row.format);
                assert_eq!(pieces.args_size(), args.len(), "{what}");
                let got = string_pointers(&pieces, &args);
                assert_eq!(got, Ok(pointers), "{what}");
                let got = format(&pieces, &args, &|p| strings.get(&p).map(Vec::as_slice)).unwrap();
                let lossy = String::from_utf8_lossy;
                assert_eq!(lossy(&got), lossy(expected), "{what}");
                assert_eq!(&got, expected, "{what}");
                // One byte short is an error, not a panic or a read past the end.
                if let Some(short) = args.len().checked_sub(1).and_then(|n| args.get(..n)) {
                    let err = missing(args.len(), short.len());
                    assert_eq!(format(&pieces, short, &|_| None), err, "{what}");
                    let got = string_pointers(&pieces, short).map(|_| Vec::new());
                    assert_eq!(got, err, "{what}");
                }
            }
        }
    }

    /// The plain path (the plan) prints what the general one prints, in both dialects,
    /// packed or not, with every string, with none fetched, and with one argument byte short
    /// (the same error, after the same output).
    #[test]
    fn plain_formats_print_the_same_by_either_path() {
        let mut plain_rows = 0;
        for row in &rows() {
            let text = row.format.to_bytes();
            if !matches!(Format::new(Dialect::HostC, text, false).body, Body::Plan(_)) {
                continue;
            }
            plain_rows += 1;
            for (dialect, packed) in [
                (Dialect::HostC, false),
                (Dialect::HostC, true),
                (Dialect::LlvmLibc, false),
                (Dialect::LlvmLibc, true),
            ] {
                let (args, strings, _) = encode(0, &row.args, packed);
                let fetched = |p| strings.get(&p).map(Vec::as_slice);
                let none = |_| None::<&[u8]>;
                let short = &args[..args.len().saturating_sub(1)];
                let what = std::format!("{:?} {dialect:?} packed={packed}", row.format);
                let fast = host_read(dialect, text, packed);
                assert!(matches!(fast.body, Body::Plan(_)), "{what}");
                let general = general(host_read(dialect, text, packed));
                for (args, unfetched) in [(&args[..], false), (&args[..], true), (short, false)] {
                    let print = |format: &Format| {
                        let mut out = Vec::new();
                        let done = if unfetched {
                            format.write(args, &none, Sink::Append(&mut out))
                        } else {
                            format.write(args, &fetched, Sink::Append(&mut out))
                        };
                        (done, out)
                    };
                    assert_eq!(print(&fast), print(&general), "{what} {args:?} {unfetched}");
                }
            }
        }
        assert!(plain_rows >= 15, "only {plain_rows} plain rows");
        // Anything else takes the general path.
        for format in [
            "%5d", "%-d", "%+d", "% d", "%#x", "%05d", "%.1d", "%*d", "%.*s", "%hd", "%hhu", "%p",
            "%f", "%b", "%n", "%y", "a%5%", "%1$d",
        ] {
            let compiled = Format::new(Dialect::HostC, format.as_bytes(), false);
            assert!(matches!(compiled.body, Body::Pieces(_)), "{format}");
        }
    }

    #[test]
    fn args_size_aligns_unpacked_and_not_packed() {
        let size = |f: &str, packed| Format::new(Dialect::HostC, f.as_bytes(), packed).args_size();
        for (f, unpacked, packed) in [
            ("", 0, 0),
            ("%%no args%%", 0, 0),
            ("%5%%c", 4, 4),
            ("%c%*%%ld", 16, 16),
            ("%c%*.*%%c", 16, 16),
            ("%c%d%ld", 16, 16),
            ("%c%ld", 16, 12),
            ("%hhd%hd%c", 12, 12),
            ("%d%s", 16, 12),
            ("%*.*f", 16, 16),
            ("%c%*.*f", 24, 20),
            ("%n%p%Lf%jd", 32, 32),
            ("%c%zu%c%lc", 24, 20),
        ] {
            assert_eq!(size(f, false), unpacked, "{f}");
            assert_eq!(size(f, true), packed, "{f}");
        }
    }

    #[test]
    fn llvm_libcs_dialect_prints_null_pointers_and_strings_as_llvm_22_does() {
        let print = |dialect, format: &[u8], args: &[u8]| {
            let out = self::format(&host_read(dialect, format, false), args, &|_| None);
            String::from_utf8(out.unwrap()).unwrap()
        };
        let null = [0u8; 8];
        assert_eq!(print(Dialect::LlvmLibc, b"[%p]", &null), "[(nullptr)]");
        assert_eq!(print(Dialect::LlvmLibc, b"[%12p]", &null), "[   (nullptr)]");
        assert_eq!(
            print(Dialect::LlvmLibc, b"[%-12p]", &null),
            "[(nullptr)   ]"
        );
        assert_eq!(print(Dialect::HostC, b"[%p]", &null), "[(nil)]");
        assert_eq!(print(Dialect::LlvmLibc, b"[%.3s]", &null), "[(nu]");
        assert_eq!(print(Dialect::LlvmLibc, b"[%8s]", &null), "[  (null)]");
        assert_eq!(print(Dialect::HostC, b"[%.3s]", &null), "[]");
        // Everything else is the same in both.
        let x = 0x1234u64.to_le_bytes();
        assert_eq!(
            print(
                Dialect::LlvmLibc,
                b"%p %d",
                &[x, [7, 0, 0, 0, 0, 0, 0, 0]].concat()
            ),
            "0x1234 7"
        );
    }

    /// `format` printed in `dialect` with `args` (4-byte words, unpacked).
    fn printed(dialect: Dialect, format: &[u8], args: &[i32]) -> Vec<u8> {
        let args: Vec<u8> = args.iter().flat_map(|w| w.to_le_bytes()).collect();
        let compiled = Format::new(dialect, format, false);
        let pieces: Vec<_> = parse(dialect, format).collect();
        assert_eq!(compiled.args_size(), args.len(), "{:?}", pieces);
        self::format(&compiled, &args, &|_| None).unwrap()
    }

    /// A device has no host errno: `%m` prints errno 0's message, as LLVM's server (whose
    /// thread's errno is 0) does, not what the server thread's last failed call left in it.
    #[test]
    fn percent_m_prints_errno_zeros_message_not_the_server_threads_errno() {
        // SAFETY: this thread's errno, as in `clear_errno`.
        unsafe { *libc::__errno_location() = libc::ETIMEDOUT };
        // SAFETY: strerror(0) returns a NUL-terminated message that lives until the next call
        // to strerror on this thread; it is copied at once.
        let success = unsafe { CStr::from_ptr(libc::strerror(0)) }
            .to_bytes()
            .to_vec();
        assert_eq!(
            printed(Dialect::HostC, b"[%m]", &[]),
            [b"[", &success[..], b"]"].concat()
        );
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = libc::ETIMEDOUT };
        let padded = printed(Dialect::HostC, b"%-12m|", &[]);
        assert_eq!(padded.len(), 13.max(success.len() + 1), "{padded:?}");
        assert!(padded.starts_with(&success));
        if cfg!(target_env = "gnu") {
            assert_eq!(success, b"Success");
        }
        // LLVM 20-22's printf core knows no `%m`: it prints the text.
        assert_eq!(printed(Dialect::LlvmLibc, b"%m", &[]), b"%m");
    }

    /// LLVM 23+ hands a spec it does not know, its `*` values and a zero to the host's
    /// `fprintf`: each malformed format here is checked against the host's `snprintf` given
    /// the same, and against what glibc prints (seen when this was written).
    #[test]
    fn malformed_specs_print_as_the_host_c_library_prints_them() {
        for (format, stars, glibc) in [
            ("[%y]", &[][..], "[%y]"),
            ("[%ll]", &[], "[%]"),
            ("[%-8y|%0#8y|% +y]", &[], "[%-8y|%#08y|%+y]"),
            ("[%*y]", &[3], "[%3y]"),
            ("[%*y]", &[-3], "[%-3y]"),
            ("[%.*y|%*.*y]", &[-5, 7, 9], "[%y|%7.9y]"),
            ("[%5.y]", &[], "[%5.0y]"),
            ("%1$d", &[], "%d"),
            ("[%0$]", &[], "[%0$]"),
            // LLVM's parser ends the spec at `I`, glibc's flag: `%I` is an error, nothing.
            ("[%Iy|%lly|%hhy]", &[], "[y|%y|%y]"),
            ("[%5%]", &[], "[%]"),
            ("abc%", &[], "abc%"),
            ("abc%-5", &[], "abc%-5"),
            ("[%*", &[4], "[%*"),
            ("%99999999999y|", &[], "|"),
            ("[%'d]", &[], "[d]"),
            ("[%5S|%.2S|%3C]", &[], "[(null)||  \0]"),
        ] {
            let expected = glibc.replace("\\0", "\0");
            let got = printed(Dialect::HostC, format.as_bytes(), stars);
            assert_eq!(String::from_utf8_lossy(&got), expected, "{format}");
        }
        // `%m` is errno 0's message, as LLVM's server prints it, its width clamped.
        let got = printed(Dialect::HostC, b"%m", &[]);
        assert!(!got.is_empty() && !got.contains(&b'%'), "{got:?}");
        let got = printed(Dialect::HostC, b"%99999999m", &[]);
        assert_eq!(got.len(), MAX_FIELD);
        // A huge `*` width on an unknown conversion prints the number, not that much padding.
        let got = printed(Dialect::HostC, b"%*y", &[i32::MAX]);
        assert_eq!(got, b"%2147483647y");
    }

    /// The host's `snprintf` agrees with the table above where it is safe to call it directly
    /// (so the table is not merely what this code prints).
    #[test]
    fn the_malformed_table_is_the_host_snprintfs() {
        let reference = |format: &CStr, star: c_int| -> Vec<u8> {
            let mut buf = [0u8; 64];
            // SAFETY: each format below reads at most one int (its `*`), passed, and `%5S`
            // a null wchar_t pointer's worth of zero, passed as a 64-bit zero; glibc also
            // reads positional `%1$`'s one argument, the star.
            let n = unsafe {
                libc::snprintf(
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    format.as_ptr(),
                    star,
                    0u64,
                )
            };
            buf[..usize::try_from(n).unwrap_or(0)].to_vec()
        };
        for (format, star) in [
            (c"[%y]", None),
            (c"[%ll]", None),
            (c"[%-8y|%0#8y|% +y]", None),
            (c"[%*y]", Some(3)),
            (c"[%*y]", Some(-3)),
            (c"[%5.y]", None),
            (c"%1$d", None),
            (c"[%0$]", None),
            (c"[%lly|%hhy]", None),
            (c"[%5S]", None),
            (c"[%.2S]", None),
        ] {
            let star_args: Vec<i32> = star.into_iter().collect();
            let got = printed(Dialect::HostC, format.to_bytes(), &star_args);
            let expected = reference(format, star.unwrap_or(0));
            // `%1$d` is cut by LLVM's parser before the `d`: glibc sees `%1$` then `d`.
            if format == c"%1$d" {
                assert_eq!(expected, b"0", "glibc reads %1$d as positional %d");
                assert_eq!(got, b"%d");
                continue;
            }
            assert_eq!(got, expected, "{format:?}");
        }
    }

    /// LLVM 20-22's server prints a spec LLVM libc's printf core does not know as its text,
    /// having read its `*` values: `%n` (built without it), `%m`, `%q`, positional `%1$`.
    #[test]
    fn malformed_specs_print_as_their_text_in_llvm_libcs_dialect() {
        for (format, stars, llvm) in [
            ("[%y]", &[][..], "[%y]"),
            ("[%ll]", &[], "[%ll]"),
            ("[%*y]", &[3], "[%*y]"),
            ("[%**d]", &[3], "[%**d]"),
            ("%1$d", &[], "%1$d"),
            ("[%n|%m|%qd]", &[], "[%n|%m|%qd]"),
            ("abc%", &[], "abc%"),
            ("[%-5%]", &[], "[%]"),
        ] {
            let got = printed(Dialect::LlvmLibc, format.as_bytes(), stars);
            assert_eq!(String::from_utf8_lossy(&got), llvm, "{format}");
        }
        // `%n` takes no argument there, and 8 bytes in the host C dialect.
        let size = |dialect, text| Format::new(dialect, text, false).args_size();
        assert_eq!(size(Dialect::LlvmLibc, b"%n%d"), 4);
        assert_eq!(size(Dialect::HostC, b"%n%d"), 12);
        // The format ends at its first NUL: nothing after it is parsed.
        assert_eq!(parse(Dialect::HostC, b"%d\0%y").count(), 1);
    }

    #[test]
    fn short_argument_buffers_are_missing_arguments() {
        let pieces = Format::new(Dialect::HostC, b"%d%ld", false);
        assert_eq!(format(&pieces, &[0; 8], &|_| None), missing(16, 8));
        let pointers = string_pointers(&pieces, &[1; 8]).map(|_| Vec::new());
        assert_eq!(pointers, missing(16, 8));
        let packed = Format::new(Dialect::HostC, b"%d%ld", true);
        assert_eq!(format(&packed, &[0; 11], &|_| None), missing(12, 11));
        let pieces = Format::new(Dialect::HostC, b"%s", true);
        assert_eq!(
            string_pointers(&pieces, &[]).map(|_| Vec::new()),
            missing(8, 0)
        );
    }

    #[test]
    fn huge_widths_and_precisions_are_clamped() {
        let text = b"%99999999999999999999999d|%.99999999999f";
        let first = parse(Dialect::HostC, text).next();
        assert!(matches!(first, Some(Piece::Spec(s)) if s.width == Count::Fixed(MAX_FIELD)));
        let pieces = Format::new(Dialect::HostC, text, false);
        let args = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]; // 1, 1.0
        let out = format(&pieces, &args, &|_| None).unwrap();
        assert_eq!(out.len(), MAX_FIELD + 1 + 2 + MAX_FIELD);
        // `*` width i32::MIN: left-justified, clamped; `*` precision i32::MAX on a long string.
        let pieces = Format::new(Dialect::HostC, b"%*d|%.*s", false);
        let words = [i32::MIN as u32 as u64, i32::MAX as u64, 1]; // Unpacked: star, 0, star, ptr.
        let args: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let long = vec![b'x'; 10_000];
        let out = format(&pieces, &args, &|_| Some(&long[..])).unwrap();
        assert_eq!((out.len(), out[0]), (MAX_FIELD + 1 + MAX_FIELD, b'0'));
    }

    #[test]
    fn unfetched_and_nul_containing_strings() {
        let pieces = Format::new(Dialect::HostC, b"[%s][%.3s][%s]", true);
        let args: Vec<u8> = [1u64, 2, 3].iter().flat_map(|p| p.to_le_bytes()).collect();
        let strings = |p| (p == 3).then_some(&b"ab\0cd"[..]);
        let out = format(&pieces, &args, &strings).unwrap();
        assert_eq!(out, b"[(null)][][ab]");
        // A string sent without its NUL prints whole.
        let unterminated = |p| (p == 1).then_some(&b"xyz"[..]);
        let out = format(&pieces, &args, &unterminated).unwrap();
        assert_eq!(out, b"[xyz][][(null)]");
    }

    /// Pieces are `CHUNK` bytes (the last one shorter) whatever comes just before a chunk's
    /// end: a number of the widest precision (`%.4096f` of the largest double prints 4406
    /// bytes, more than `MAX_FIELD`), a literal longer than a chunk, a `%s` string longer than
    /// two. (The first two once made pieces longer than the `CHUNK + MAX_FIELD` that
    /// `write` promised, a literal as long as itself; found while writing the `printf`
    /// fuzz target's check on pieces.)
    #[test]
    fn pieces_are_chunks_whatever_ends_them() {
        let mut format = b"%4095d".repeat(16); // 65520 bytes, just under a chunk
        format.extend_from_slice(b"%.4096f");
        format.extend_from_slice(&[b'l'; 3 * CHUNK]);
        format.extend_from_slice(b"%s");
        let mut args: Vec<u8> = (0..16).flat_map(|_| 7u32.to_le_bytes()).collect();
        args.extend_from_slice(&f64::MAX.to_le_bytes());
        args.extend_from_slice(&1u64.to_le_bytes());
        let pieces = Format::new(Dialect::HostC, &format, false);
        let string = vec![b's'; 2 * CHUNK];
        let strings = |_| Some(&string[..]);
        let mut sizes = Vec::new();
        let mut joined = Vec::new();
        let mut sink = |piece: &[u8]| {
            sizes.push(piece.len());
            joined.extend_from_slice(piece);
        };
        pieces
            .write(&args, &strings, Sink::Chunks(&mut sink))
            .unwrap();
        let last = sizes.pop().unwrap();
        assert!(sizes.iter().all(|&n| n == CHUNK), "{sizes:?}");
        assert!(0 < last && last <= CHUNK);
        assert_eq!(joined, {
            let mut whole = Vec::new();
            pieces
                .write(&args, &strings, Sink::Append(&mut whole))
                .unwrap();
            whole
        });
        assert_eq!(
            joined.len(),
            16 * 4095 + 309 + 1 + 4096 + 3 * CHUNK + 2 * CHUNK
        );
    }

    #[test]
    fn random_formats_never_panic() {
        const ALPHABET: &[u8] = b"%%%%-+ #0123456789*.hlLjztqdiouxXbBcspnfFeEgGaA$y\0";
        let mut next = lcg(0x2545_f491_4f6c_dd1d);
        for _ in 0..3000 {
            let fmt: Vec<u8> = (0..next() % 24)
                .map(|_| ALPHABET[next() % ALPHABET.len()])
                .collect();
            let args: Vec<u8> = (0..next() % 80).map(|_| next() as u8).collect();
            for (dialect, packed) in [(Dialect::HostC, false), (Dialect::LlvmLibc, true)] {
                let pieces = Format::new(dialect, &fmt, packed);
                let _ = string_pointers(&pieces, &args);
                let bytes = [7u8; 8];
                let strings = |p: u64| (p & 1 == 0).then_some(&bytes[..]);
                let _ = pieces.write(&args, &strings, Sink::Chunks(&mut |_| {}));
            }
        }
    }
}
