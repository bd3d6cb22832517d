//! The host side of GPU `printf` (opcodes `PRINTF_TO_*`, PROTOCOL section 7).
//!
//! The exchange, per lane: the device sends its C format string; the host [`parse`]s it and
//! replies with [`args_size`], the number of bytes of arguments it expects; the device sends that
//! raw argument buffer; the host asks for the strings behind the non-null `%s` pointers
//! ([`string_pointers`]) and finally [`format()`]s the output, byte-identical to the host C
//! library's `printf` for the same format and values (each conversion is handed to `snprintf`,
//! except `%b`/`%B` and the plain ones, formatted here, and `%n`, which prints nothing). A plain
//! conversion has no flags, width or precision and prints an integer of its full C type, a
//! character or a string; a format of only plain conversions (most of what kernels print) is
//! planned once (`plan_onto`: each piece's step, each argument's place) and each lane's line
//! printed by running the plan (`format_plain`).
//!
//! Argument sizes (LLVM's, the same for every conversion): `%c` 4 bytes; integers `d i o u x X
//! b B` 4 bytes, 8 with a length `l ll j z t q L` (`h`, `hh` stay 4 and truncate when printed);
//! floating `f F e E g G a A` 8 (a double; `L` is printed as a double); `p s n` 8; each `*` width
//! or precision a 4-byte `i32` read before the value, width first. Little-endian. Unpacked
//! buffers align the running offset up to each argument's size first; packed ones have no padding.
//!
//! Robustness (the format and the arguments come from an untrusted GPU): nothing here panics or
//! reads outside the slices it is given. The format ends at its first NUL. Every format parses,
//! as in LLVM's servers: a specification the dialect does not know (`%y`, positional `%1$d`,
//! flags other than `-+ #0`, a `%` the format ends in) is a [`Piece::Malformed`], which reads
//! only its `*` arguments and prints as that dialect's printf prints it (see [`parse_in`]). An
//! argument buffer shorter than the format needs is a [`FormatError`]. Widths and precisions,
//! written or passed through `*`, are clamped to [`MAX_FIELD`] so one conversion prints at most a
//! few KiB. A null `%s` prints as glibc does: `(null)` if the precision is absent or at least 6,
//! else the empty string (then padded to the width); a non-null `%s` whose string was not fetched
//! (`strings` returned `None`) prints the same way, as if it were null. A length modifier on `c s
//! p n` or a float is accepted and ignored: `%lc`/`%ls` print as `%c`/`%s`, `%Lf` as `%f`.

use core::ops::Range;
use std::ffi::{c_char, c_double, c_int, c_longlong, c_uint, c_ulonglong, c_void, CStr, CString};
use std::fmt;
use std::io::Write as _;
use std::vec::Vec;

pub use crate::protocol::opcode::Dialect;

/// The largest width or precision honoured; larger ones (written or through `*`) are clamped.
pub const MAX_FIELD: usize = 4096;

/// One parsed piece of a format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'f> {
    /// Bytes printed as they are.
    Literal(&'f [u8]),
    /// `%%`.
    Percent,
    /// One conversion specification.
    Spec(Spec),
    /// A specification the dialect does not format (`%y`, `%1$d`'s `%1$`, `%ll]`, a `%` the
    /// format ends in): its `*` arguments are read, and it prints as the dialect's printf
    /// prints it (see the module documentation). `spec.conversion` is the byte that ends it,
    /// 0 if the format ended first.
    Malformed {
        /// Its fields as parsed.
        spec: Spec,
        /// The specification as written, from `%` to the byte that ends it.
        text: &'f [u8],
    },
}

/// The flags of a specification: `-` (left), `+` (plus), ` ` (space), `#` (alt), `0` (zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// `-`: left-justify.
    pub left: bool,
    /// `+`: always a sign.
    pub plus: bool,
    /// ` `: a space for a missing sign.
    pub space: bool,
    /// `#`: the alternate form.
    pub alt: bool,
    /// `0`: pad with zeros.
    pub zero: bool,
}

/// A width or a precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Not given.
    None,
    /// Written in the format (already clamped to [`MAX_FIELD`]).
    Fixed(usize),
    /// `*`: an `i32` argument.
    Star,
}

/// A length modifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// None: `int`, `double`.
    None,
    /// `hh`: `char`.
    Hh,
    /// `h`: `short`.
    H,
    /// `l`: `long`.
    L,
    /// `ll`: `long long`.
    Ll,
    /// `j`: `intmax_t`.
    J,
    /// `z`: `size_t`.
    Z,
    /// `t`: `ptrdiff_t`.
    T,
    /// `q`: BSD's `long long`.
    Q,
    /// `L`
    BigL,
}

impl Length {
    /// Whether an integer conversion with this length takes 8 bytes.
    fn wide(self) -> bool {
        !matches!(self, Length::None | Length::Hh | Length::H)
    }
}

/// One conversion specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The flags.
    pub flags: Flags,
    /// The width.
    pub width: Count,
    /// The precision.
    pub precision: Count,
    /// The length modifier.
    pub length: Length,
    /// The conversion byte, one of `d i o u x X b B c s p n f F e E g G a A`, or `%` for a
    /// spec with something between its two `%`s (`%5%`, `%*%`: plain `%%` is a
    /// [`Piece::Percent`]). That one prints `%` and takes no value, only its `*` arguments, as
    /// glibc and both of LLVM's servers have it (LLVM 20-22's printf core documents the rule;
    /// LLVM 23+ hands the spec and its `*` values to the host's `fprintf`).
    pub conversion: u8,
    /// Offset of the `%` in the format.
    pub at: usize,
    /// The length of the spec as written, from `%` to the conversion inclusive.
    pub len: usize,
}

impl Spec {
    /// Size in bytes of the value argument (after any `*` arguments); 0 for `%`, which has none.
    #[inline]
    pub fn value_size(&self) -> usize {
        match self.conversion {
            b'%' => 0,
            b'c' => 4,
            b'd' | b'i' | b'o' | b'u' | b'x' | b'X' | b'b' | b'B' if !self.length.wide() => 4,
            _ => 8,
        }
    }
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

/// Parses `format` as the host C library reads it ([`parse_in`] with [`Dialect::HostC`]).
pub fn parse(format: &[u8]) -> Vec<Piece<'_>> {
    parse_in(Dialect::HostC, format)
}

/// Parses `format` (without its trailing NUL; it stops at the first NUL if there is one) as
/// `dialect`'s printf reads it. Every format parses: a specification the dialect does not know
/// is a [`Piece::Malformed`], printed as that printf prints it: as its text by LLVM libc's
/// printf core (LLVM 20-22), again in glibc's form by the host C library (LLVM 23+).
pub fn parse_in(dialect: Dialect, format: &[u8]) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    parse_onto(dialect, format, &mut pieces);
    pieces
}

/// [`parse_in`], onto the end of `pieces` (for a vector the caller keeps for reuse).
pub(crate) fn parse_onto<'f>(dialect: Dialect, format: &'f [u8], pieces: &mut Vec<Piece<'f>>) {
    let format = format.split(|&b| b == 0).next().unwrap_or_default();
    // A literal and a spec per `%` at most, and a last literal: at most one allocation.
    let specs = format.iter().filter(|&&b| b == b'%').count();
    pieces.reserve(2 * specs + 1);
    let mut rest = format;
    let mut at = 0;
    while !rest.is_empty() {
        let Some(pos) = rest.iter().position(|&b| b == b'%') else {
            pieces.push(Piece::Literal(rest));
            break;
        };
        let (literal, spec) = rest.split_at(pos);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        at += pos;
        let used = if spec.get(1) == Some(&b'%') {
            pieces.push(Piece::Percent);
            2
        } else {
            let parsed = parse_spec(dialect, spec, at);
            let used = parsed.len;
            if known(dialect, parsed.conversion) {
                pieces.push(Piece::Spec(parsed));
            } else {
                let text = spec.get(..used).unwrap_or_default();
                pieces.push(Piece::Malformed { spec: parsed, text });
            }
            used
        };
        at += used;
        rest = spec.get(used..).unwrap_or_default();
    }
}

/// Whether `dialect`'s printf formats `conversion`. LLVM 20-22's server builds LLVM libc's
/// printf core without `%n` (`LIBC_COPT_PRINTF_DISABLE_WRITE_INT`) and without `%m`.
fn known(dialect: Dialect, conversion: u8) -> bool {
    match dialect {
        Dialect::HostC => b"diouxXbBcspnfFeEgGaA%".contains(&conversion),
        Dialect::LlvmLibc => b"diouxXbBcspfFeEgGaA%".contains(&conversion),
    }
}

/// Parses the specification at the start of `s` (which starts with `%`, at byte `at` of the
/// format): flags, width, precision and length as `dialect` reads them, then the byte that
/// ends it, 0 if the format ends first (then the spec is the rest of the format).
fn parse_spec(dialect: Dialect, s: &[u8], at: usize) -> Spec {
    // The format ends at its first NUL, so 0 stands for its end.
    let byte = |i: usize| s.get(i).copied().unwrap_or(0);
    let mut i = 1;
    let mut flags = Flags::default();
    loop {
        match byte(i) {
            b'-' => flags.left = true,
            b'+' => flags.plus = true,
            b' ' => flags.space = true,
            b'#' => flags.alt = true,
            b'0' => flags.zero = true,
            _ => break,
        }
        i += 1;
    }
    let width = parse_count(s, &mut i);
    let precision = if byte(i) == b'.' {
        i += 1;
        match parse_count(s, &mut i) {
            Count::None => Count::Fixed(0),
            count => count,
        }
    } else {
        Count::None
    };
    let (length, len) = match (byte(i), byte(i + 1), dialect) {
        (b'h', b'h', _) => (Length::Hh, 2),
        (b'l', b'l', _) => (Length::Ll, 2),
        (b'h', _, _) => (Length::H, 1),
        (b'l', _, _) => (Length::L, 1),
        (b'j', _, _) => (Length::J, 1),
        (b'z', _, _) => (Length::Z, 1),
        (b't', _, _) => (Length::T, 1),
        // LLVM libc's printf core has no BSD `q`.
        (b'q', _, Dialect::HostC) => (Length::Q, 1),
        (b'L', _, _) => (Length::BigL, 1),
        _ => (Length::None, 0),
    };
    i += len;
    let conversion = byte(i);
    Spec {
        flags,
        width,
        precision,
        length,
        conversion,
        at,
        len: if conversion == 0 {
            i.min(s.len())
        } else {
            i + 1
        },
    }
}

/// Parses `*` or decimal digits at `s[*i..]` (clamped to [`MAX_FIELD`]), advancing `i`.
fn parse_count(s: &[u8], i: &mut usize) -> Count {
    if s.get(*i) == Some(&b'*') {
        *i += 1;
        return Count::Star;
    }
    let mut value: Option<usize> = None;
    while let Some(digit @ b'0'..=b'9') = s.get(*i).copied() {
        let v = value
            .unwrap_or(0)
            .saturating_mul(10)
            .saturating_add(usize::from(digit - b'0'));
        value = Some(v.min(MAX_FIELD));
        *i += 1;
    }
    value.map_or(Count::None, Count::Fixed)
}

/// Where the next argument of `size` bytes lies: `(start, end)` (saturating; never panics).
fn place(offset: usize, size: usize, packed: bool) -> (usize, usize) {
    let start = if packed {
        offset
    } else if size.is_power_of_two() {
        // Every argument is 4 or 8 bytes: aligning is a mask, not a division (one per argument
        // of every lane, in each of the two walks of its format).
        offset
            .checked_add(size - 1)
            .map_or(usize::MAX, |end| end & !(size - 1))
    } else {
        offset.checked_next_multiple_of(size).unwrap_or(usize::MAX)
    };
    (start, start.saturating_add(size))
}

/// The sizes of the arguments a piece takes, in order (`*` width, `*` precision, value).
fn arg_sizes<'p>(piece: &'p Piece) -> impl Iterator<Item = usize> + 'p {
    let spec = match piece {
        Piece::Spec(spec) | Piece::Malformed { spec, .. } => Some(spec),
        _ => None,
    };
    let star = |count: Count| (count == Count::Star).then_some(4);
    let stars = spec
        .into_iter()
        .flat_map(move |s| [star(s.width), star(s.precision)])
        .flatten();
    let value = match piece {
        Piece::Spec(spec) => Some(spec.value_size()).filter(|&size| size > 0),
        _ => None,
    };
    stars.chain(value)
}

/// Size in bytes of the argument buffer the format needs (`packed`: no alignment padding).
pub fn args_size(pieces: &[Piece], packed: bool) -> usize {
    pieces
        .iter()
        .flat_map(arg_sizes)
        .fold(0, |offset, size| place(offset, size, packed).1)
}

/// One specification with its arguments read and its `*`s resolved.
struct Resolved<'s> {
    spec: &'s Spec,
    flags: Flags,
    width: Option<usize>,
    precision: Option<usize>,
    /// The `*` values as sent, in order (a [`Piece::Malformed`] hands them on unchanged).
    stars: [Option<i32>; 2],
    /// The value's bytes, zero-extended.
    value: u64,
}

/// Reads the argument of `size` bytes placed after `offset` (see [`place`]) and moves `offset`
/// past it; zero-extended. One the buffer does not hold is a missing argument.
fn take_arg(
    pieces: &[Piece],
    args: &[u8],
    packed: bool,
    offset: &mut usize,
    size: usize,
) -> Result<u64, FormatError> {
    let (start, end) = place(*offset, size, packed);
    let value = arg_at(args, start, size).ok_or_else(|| missing(pieces, args, packed))?;
    *offset = end;
    Ok(value)
}

/// The argument of `size` bytes at `start` of `args`, zero-extended, if `args` holds it.
fn arg_at(args: &[u8], start: usize, size: usize) -> Option<u64> {
    let bytes = args.get(start..)?.get(..size)?;
    // Every argument is 4 or 8 bytes: read as such, one load. (A copy of a run-time length
    // into a word was a call to memcpy, and the word's load then waited for its bytes' stores:
    // perf put a third of `format_onto`'s samples there.)
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

/// The error of an argument buffer `args` too short for `pieces`.
fn missing(pieces: &[Piece], args: &[u8], packed: bool) -> FormatError {
    FormatError::MissingArguments {
        needed: args_size(pieces, packed),
        available: args.len(),
    }
}

/// Reads the arguments of every specification in order and hands each to `visit`.
fn walk<'s>(
    pieces: &'s [Piece],
    args: &[u8],
    packed: bool,
    mut visit: impl FnMut(Option<Resolved<'s>>, &'s Piece),
) -> Result<(), FormatError> {
    let mut offset = 0;
    let mut take = |size: usize| take_arg(pieces, args, packed, &mut offset, size);
    for piece in pieces {
        let spec = match piece {
            Piece::Spec(spec) | Piece::Malformed { spec, .. } => spec,
            Piece::Literal(_) | Piece::Percent => {
                visit(None, piece);
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
        let value = match (piece, spec.value_size()) {
            (Piece::Malformed { .. }, _) | (_, 0) => 0,
            (_, size) => take(size)?,
        };
        visit(
            Some(Resolved {
                spec,
                flags,
                width,
                precision,
                stars,
                value,
            }),
            piece,
        );
    }
    Ok(())
}

/// The non-null `%s` pointers, in format order, read from `args`.
pub fn string_pointers(
    pieces: &[Piece],
    args: &[u8],
    packed: bool,
) -> Result<Vec<u64>, FormatError> {
    let needed = args_size(pieces, packed);
    if args.len() < needed {
        return Err(FormatError::MissingArguments {
            needed,
            available: args.len(),
        });
    }
    let mut at = Vec::new();
    string_offsets_onto(pieces, packed, &mut at);
    let mut pointers = Vec::new();
    push_pointers_at(&at, args, &mut pointers);
    Ok(pointers)
}

/// Where each `%s` pointer lies in the argument buffer of `pieces` (its offset), in format
/// order, appended to `at`. The same for every buffer: the lanes of one call site read their
/// pointers at the offsets found once, without walking the format each.
pub(crate) fn string_offsets_onto(pieces: &[Piece], packed: bool, at: &mut Vec<usize>) {
    let mut offset = 0;
    for piece in pieces {
        let mut start = 0;
        for size in arg_sizes(piece) {
            (start, offset) = place(offset, size, packed);
        }
        // A `%s` takes a value, its last argument: the pointer.
        if is_string(piece) {
            at.push(start);
        }
    }
}

/// Whether `piece` is a `%s` conversion: its argument is a pointer to a string the server
/// fetches from the device.
fn is_string(piece: &Piece) -> bool {
    matches!(piece, Piece::Spec(spec) if spec.conversion == b's')
}

/// Appends the non-null pointers at offsets `at` of `args` (which holds all of its format's
/// arguments, [`args_size`]) to `pointers`.
pub(crate) fn push_pointers_at(at: &[usize], args: &[u8], pointers: &mut Vec<u64>) {
    for &start in at {
        let word = args
            .get(start..start + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        if word != 0 {
            pointers.push(word);
        }
    }
}

/// The size of the pieces [`format_to`] hands its sink: output is gathered up to this, then
/// handed on, so a long output is never whole in memory.
pub const CHUNK: usize = 64 << 10;

/// Formats the pieces with the arguments in `args`, as the host C library's `printf` would.
///
/// `strings(ptr)` returns the bytes of the device string at a non-null `%s` pointer (its NUL, and
/// anything after a NUL, is ignored), or `None` if it was not fetched: that string then prints as
/// a null `%s` does (see the module documentation).
pub fn format<'s>(
    pieces: &[Piece],
    args: &[u8],
    packed: bool,
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
) -> Result<Vec<u8>, FormatError> {
    let mut all = Vec::new();
    format_to(pieces, args, packed, strings, &mut |chunk| {
        all.extend_from_slice(chunk)
    })?;
    Ok(all)
}

/// [`format()`], handing the output to `sink` in order, in pieces of [`CHUNK`] bytes (the last
/// one shorter). Besides the pieces, it holds at most one conversion's output (at most
/// [`MAX_FIELD`] bytes and a number's digits, or one `%s` string); a literal part of the
/// format is handed on from the format itself. A missing argument is found only where it is
/// needed, after the output before it was handed on: check the arguments with
/// [`string_pointers`] first.
pub fn format_to<'s>(
    pieces: &[Piece],
    args: &[u8],
    packed: bool,
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
    sink: &mut dyn FnMut(&[u8]),
) -> Result<(), FormatError> {
    format_in(Dialect::HostC, pieces, args, packed, strings, sink)
}

/// [`format_to`] in `dialect`.
pub fn format_in<'s>(
    dialect: Dialect,
    pieces: &[Piece],
    args: &[u8],
    packed: bool,
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
    sink: &mut dyn FnMut(&[u8]),
) -> Result<(), FormatError> {
    // Room for a usual line; a longer output grows it (up to a chunk). Not the bound: that is
    // about 330 bytes a conversion, a large allocation (glibc's costlier path) for every line.
    let mut out = Vec::with_capacity(output_bound(pieces, 0).min(256));
    let mut chunks = Chunks { size: CHUNK, sink };
    let mut plan = Vec::new();
    let plain = plan_onto(pieces, packed, &mut plan);
    format_onto(
        dialect,
        Format {
            pieces,
            plan: plain.then_some(&plan[..]),
        },
        args,
        packed,
        strings,
        &mut out,
        &mut chunks,
    )?;
    if !out.is_empty() {
        (chunks.sink)(&out);
    }
    Ok(())
}

/// Where formatted output goes once `out` holds `size` bytes: to `sink`, in pieces of `size`.
pub(crate) struct Chunks<'s> {
    size: usize,
    sink: &'s mut dyn FnMut(&[u8]),
}

impl Chunks<'_> {
    /// No chunks: everything stays in `out`, for an output known to be short (by
    /// [`output_bound`]), as nothing else bounds what `out` then holds.
    pub(crate) fn none() -> Chunks<'static> {
        Chunks {
            size: usize::MAX,
            // A closure of no captures is zero-sized: boxing and leaking it allocates nothing.
            sink: Box::leak(Box::new(|_: &[u8]| {})),
        }
    }
}

/// A parsed format as the formatter takes it: its pieces, and its plan if every one of them
/// [`is_plain`] ([`plan_onto`]), made once for all the lanes that print it.
#[derive(Clone, Copy)]
pub(crate) struct Format<'p, 'f> {
    pub(crate) pieces: &'p [Piece<'f>],
    pub(crate) plan: Option<&'p [Step<&'f [u8]>]>,
}

/// What a piece of a plain format prints, its argument's place in an argument buffer found
/// once ([`plan_onto`]), not per lane. `L` is a literal's bytes (`&[u8]`), or where they lie
/// in the format for a plan kept apart from it ([`KeptStep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step<L> {
    /// Bytes printed as they are: a literal, or the `%` of a `%%`.
    Literal(L),
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

/// A plan's step kept apart from the bytes of its format: a literal as the range of the format
/// it lies in (`None`: the `%` of a `%%`, which the format does not hold alone).
pub(crate) type KeptStep = Step<Option<Range<usize>>>;

impl<L> Step<L> {
    /// The same step, its literal (if it is one) mapped by `f`.
    fn map_literal<M>(self, f: impl FnOnce(L) -> M) -> Step<M> {
        match self {
            Step::Literal(literal) => Step::Literal(f(literal)),
            Step::Integer {
                at,
                wide,
                conversion,
            } => Step::Integer {
                at,
                wide,
                conversion,
            },
            Step::Char { at } => Step::Char { at },
            Step::Str { at } => Step::Str { at },
        }
    }

    /// The end of the step's argument in the buffer (0 for a literal).
    fn args_end(&self) -> usize {
        match *self {
            Step::Literal(_) => 0,
            Step::Integer { at, wide, .. } => at + if wide { 8 } else { 4 },
            Step::Char { at } => at + 4,
            Step::Str { at } => at + 8,
        }
    }
}

impl Step<&[u8]> {
    /// The step kept apart from `format`, the bytes its plan was made from.
    pub(crate) fn keep(self, format: &[u8]) -> KeptStep {
        self.map_literal(|bytes| {
            let at = (bytes.as_ptr() as usize).wrapping_sub(format.as_ptr() as usize);
            (at <= format.len() && bytes.len() <= format.len() - at).then(|| at..at + bytes.len())
        })
    }
}

impl KeptStep {
    /// The step over `format`, bytes equal to those it was kept apart from.
    pub(crate) fn within<'f>(&self, format: &'f [u8]) -> Step<&'f [u8]> {
        self.clone()
            .map_literal(|at| at.map_or(&b"%"[..], |at| &format[at]))
    }
}

/// Appends the plan of `pieces` to `plan` if every piece [`is_plain`], its arguments placed in
/// a buffer packed or not; returns whether it did (if not, `plan` is unchanged).
pub(crate) fn plan_onto<'f>(
    pieces: &[Piece<'f>],
    packed: bool,
    plan: &mut Vec<Step<&'f [u8]>>,
) -> bool {
    if !pieces.iter().all(is_plain) {
        return false;
    }
    let mut offset = 0;
    plan.extend(pieces.iter().map(|piece| {
        let Piece::Spec(spec) = piece else {
            return Step::Literal(match piece {
                Piece::Literal(bytes) => *bytes,
                _ => b"%", // A `%%` (a malformed piece is not plain).
            });
        };
        let size = spec.value_size();
        let (at, end) = place(offset, size, packed);
        offset = end;
        match spec.conversion {
            b'c' => Step::Char { at },
            b's' => Step::Str { at },
            conversion => Step::Integer {
                at,
                wide: size == 8,
                conversion,
            },
        }
    }));
    true
}

/// [`format_in`], appending the output to `out` and handing each full chunk on to `chunks`.
pub(crate) fn format_onto<'s>(
    dialect: Dialect,
    Format { pieces, plan }: Format,
    args: &[u8],
    packed: bool,
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
    out: &mut Vec<u8>,
    chunks: &mut Chunks,
) -> Result<(), FormatError> {
    if let Some(plan) = plan {
        // The plan's last argument ends where the format's arguments end ([`args_size`]): the
        // pieces are not needed (a format planned before may come without them, see `print`).
        return format_plain(plan, args, strings, out, chunks).map_err(|()| {
            FormatError::MissingArguments {
                needed: plan.iter().map(Step::args_end).max().unwrap_or(0),
                available: args.len(),
            }
        });
    }
    walk(pieces, args, packed, |arg, piece| match (arg, piece) {
        (Some(arg), Piece::Malformed { text, .. }) => {
            malformed(dialect, out, &arg, text, chunks);
            hand_on_full_chunks(out, chunks);
        }
        (Some(arg), _) => {
            convert(dialect, out, &arg, strings);
            hand_on_full_chunks(out, chunks);
        }
        (None, Piece::Literal(bytes)) => push_literal(out, bytes, chunks),
        (None, _) => push_literal(out, b"%", chunks),
    })
}

/// Hands on the whole chunks `out` holds, keeping the rest.
fn hand_on_full_chunks(out: &mut Vec<u8>, chunks: &mut Chunks) {
    if out.len() < chunks.size {
        return; // Most calls, and all without chunks: no division.
    }
    let full = out.len() / chunks.size * chunks.size;
    if full > 0 {
        out[..full].chunks(chunks.size).for_each(&mut *chunks.sink);
        out.drain(..full);
    }
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

/// More than the bytes the pieces can print, given `strings` bytes of `%s` strings: literal
/// bytes, plus for each conversion its widest width and precision (a `*` counts as
/// [`MAX_FIELD`]) and room for the longest number (a `%f` of the largest double).
pub fn output_bound(pieces: &[Piece], strings: usize) -> usize {
    let count = |c: &Count| match c {
        Count::None => 0,
        Count::Fixed(n) => *n,
        Count::Star => MAX_FIELD,
    };
    pieces.iter().fold(strings, |sum, piece| {
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

/// `text` padded with spaces to `a`'s width (left-justified with `-`).
fn padded(out: &mut Vec<u8>, a: &Resolved, text: &[u8]) {
    let pad = a.width.unwrap_or(0).saturating_sub(text.len());
    if !a.flags.left {
        out.resize(out.len() + pad, b' ');
    }
    out.extend_from_slice(text);
    if a.flags.left {
        out.resize(out.len() + pad, b' ');
    }
}

/// Appends one conversion.
fn convert<'s>(
    dialect: Dialect,
    out: &mut Vec<u8>,
    a: &Resolved,
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
) {
    let (v, wide) = (a.value, a.spec.length.wide());
    match (dialect, a.spec.conversion) {
        // LLVM libc: `ptr_converter.h` and `string_converter.h`.
        (Dialect::LlvmLibc, b'p') if v == 0 => return padded(out, a, b"(nullptr)"),
        (Dialect::LlvmLibc, b's') if v == 0 => {
            let null = b"(null)";
            let shown = a.precision.map_or(null.len(), |p| p.min(null.len()));
            return padded(out, a, &null[..shown]);
        }
        _ => {}
    }
    match a.spec.conversion {
        b'n' => {}
        // Flags, width and precision do nothing to it (glibc, LLVM).
        b'%' => out.push(b'%'),
        b'b' | b'B' => binary(out, a),
        b's' => {
            let fetched = if v == 0 { None } else { strings(v) };
            let missing = match a.precision {
                Some(p) if p < 6 => c"",
                _ => c"(null)",
            };
            // A string ends at its first NUL; one sent without any is copied to add one.
            let copied;
            let text = match fetched {
                None => missing,
                Some(bytes) => match CStr::from_bytes_until_nul(bytes) {
                    Ok(text) => text,
                    Err(_) => {
                        copied = CString::new(bytes).unwrap_or_default();
                        copied.as_c_str()
                    }
                },
            };
            c_format(out, a, CValue::Str(text));
        }
        b'p' => c_format(
            out,
            a,
            CValue::Ptr(std::ptr::without_provenance(v as usize)),
        ),
        b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => {
            c_format(out, a, CValue::Double(f64::from_bits(v)))
        }
        b'd' | b'i' if wide => c_format(out, a, CValue::LongLong(v as i64)),
        b'o' | b'u' | b'x' | b'X' if wide => c_format(out, a, CValue::ULongLong(v)),
        b'o' | b'u' | b'x' | b'X' => c_format(out, a, CValue::UInt(v as u32)),
        // d, i (4 bytes) and c.
        _ => c_format(out, a, CValue::Int(v as u32 as i32)),
    }
}

/// A value handed to `snprintf`, with its C type.
#[derive(Clone, Copy)]
enum CValue<'a> {
    Int(c_int),
    UInt(c_uint),
    LongLong(c_longlong),
    ULongLong(c_ulonglong),
    Double(c_double),
    /// Printed by `%p` only, never dereferenced.
    Ptr(*const c_void),
    Str(&'a CStr),
}

/// Appends a conversion with no flags, width or precision, of an integer of its C type, a
/// character or a string, if it is one: then C prints exactly its digits (a `-` and the
/// magnitude's digits in the conversion's base), or its bytes, written here, and the call to
/// `snprintf`, the costliest part of a short printf, is saved. Returns whether it was one.
fn plain(out: &mut Vec<u8>, a: &Resolved, value: CValue) -> bool {
    if a.flags != Flags::default() || a.width.unwrap_or(0) != 0 || a.precision.is_some() {
        return false;
    }
    // `h` and `hh` truncate first, which snprintf does; only the full C types come here.
    let full = matches!(a.spec.length, Length::None)
        || matches!(value, CValue::LongLong(_) | CValue::ULongLong(_));
    let (negative, magnitude) = match (value, a.spec.conversion) {
        (CValue::Int(v), b'c') => {
            out.push(v as u8); // C prints the int as an unsigned char, a NUL included.
            return true;
        }
        (CValue::Str(text), _) => {
            out.extend_from_slice(text.to_bytes());
            return true;
        }
        (_, _) if !full => return false,
        (CValue::Int(v), _) => (v < 0, u64::from(v.unsigned_abs())),
        (CValue::LongLong(v), _) => (v < 0, v.unsigned_abs()),
        (CValue::UInt(v), _) => (false, u64::from(v)),
        (CValue::ULongLong(v), _) => (false, v),
        _ => return false,
    };
    if !matches!(a.spec.conversion, b'd' | b'i' | b'u' | b'x' | b'X' | b'o') {
        return false;
    }
    push_integer(out, a.spec.conversion, negative, magnitude);
    true
}

/// Appends an integer as a plain conversion prints it: a `-` if `negative`, then the
/// magnitude's digits in the base of `conversion` (one of `d i u x X o`).
fn push_integer(out: &mut Vec<u8>, conversion: u8, negative: bool, magnitude: u64) {
    if negative {
        out.push(b'-');
    }
    match conversion {
        b'x' => push_digits::<16>(out, magnitude, b"0123456789abcdef"),
        b'X' => push_digits::<16>(out, magnitude, b"0123456789ABCDEF"),
        b'o' => push_digits::<8>(out, magnitude, b"01234567"),
        _ => push_digits::<10>(out, magnitude, b"0123456789"),
    }
}

/// Whether [`plain`] prints `piece` whatever its argument: a literal, `%%`, or a conversion
/// with no flags, width or precision of an integer of its full C type, a character or a
/// string.
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

/// [`format_onto`] of a plain format, by its plan: each step straight onto `out`, as [`plain`]
/// prints it, without resolving a specification, placing its argument and going through the
/// general conversion for each (a line of `"lane %d of %s: %d\n"` took 69 ns that way here, 43
/// by the pieces of the format, 33 by its plan). `Err` where `args` lacks an argument, after
/// the output before it.
fn format_plain<'s>(
    plan: &[Step<&[u8]>],
    args: &[u8],
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
    out: &mut Vec<u8>,
    chunks: &mut Chunks,
) -> Result<(), ()> {
    for step in plan {
        match *step {
            Step::Literal(bytes) => {
                push_literal(out, bytes, chunks);
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

/// Appends `value`'s digits in base `RADIX` (a constant, so the divisions are multiplications).
fn push_digits<const RADIX: u64>(out: &mut Vec<u8>, value: u64, digits: &[u8]) {
    // Last first, into a buffer as long as the longest number (22 octal digits of 2^64 - 1).
    let mut buf = [0u8; 22];
    let mut start = buf.len();
    let mut rest = value;
    loop {
        start -= 1;
        buf[start] = digits[(rest % RADIX) as usize];
        rest /= RADIX;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[start..]);
}

/// Appends `snprintf` of one conversion: `a`'s flags, width and precision, its conversion, and a
/// length modifier chosen here to match `value`'s C type.
fn c_format(out: &mut Vec<u8>, a: &Resolved, value: CValue) {
    let conversion = a.spec.conversion;
    let matches = match value {
        CValue::Int(_) => matches!(conversion, b'd' | b'i' | b'c'),
        CValue::LongLong(_) => matches!(conversion, b'd' | b'i'),
        CValue::UInt(_) | CValue::ULongLong(_) => matches!(conversion, b'o' | b'u' | b'x' | b'X'),
        CValue::Double(_) => b"fFeEgGaA".contains(&conversion),
        CValue::Ptr(_) => conversion == b'p',
        CValue::Str(_) => conversion == b's',
    };
    if !matches {
        return; // Unreachable: `convert` pairs them. Checked here because the call relies on it.
    }
    if plain(out, a, value) {
        return;
    }
    let length: &[u8] = match (value, a.spec.length) {
        (CValue::LongLong(_) | CValue::ULongLong(_), _) => b"ll",
        (CValue::Int(_) | CValue::UInt(_), Length::Hh) if conversion != b'c' => b"hh",
        (CValue::Int(_) | CValue::UInt(_), Length::H) if conversion != b'c' => b"h",
        _ => b"",
    };
    let mut buf = [0u8; 32];
    if !clamped_spec(&mut buf, a, length, conversion) {
        return; // Unreachable (the fields are clamped); a cut spec must never reach snprintf.
    }
    let spec = buf.as_ptr().cast::<c_char>();
    let call = |buf: *mut c_char, len: usize| -> c_int {
        // SAFETY: `spec` is NUL-terminated and holds exactly one conversion (flags, digits and
        // '.' otherwise): `conversion` with `length`, whose C argument type was checked above to
        // be the type of the value passed (int for d/i/c and h/hh, long long for ll, unsigned
        // variants for o/u/x/X, double, void * for %p, which only prints the address, and a live
        // NUL-terminated string for %s). `buf` is valid for writes of `len` bytes.
        unsafe {
            match value {
                CValue::Int(v) => libc::snprintf(buf, len, spec, v),
                CValue::UInt(v) => libc::snprintf(buf, len, spec, v),
                CValue::LongLong(v) => libc::snprintf(buf, len, spec, v),
                CValue::ULongLong(v) => libc::snprintf(buf, len, spec, v),
                CValue::Double(v) => libc::snprintf(buf, len, spec, v),
                CValue::Ptr(v) => libc::snprintf(buf, len, spec, v),
                CValue::Str(v) => libc::snprintf(buf, len, spec, v.as_ptr()),
            }
        }
    };
    // snprintf fails only on what clamped fields rule out: then nothing is printed.
    append_snprintf(out, call);
}

/// Appends what `call(buf, len)`, an `snprintf` into `buf`, prints: into a stack buffer, or
/// again into `out` if that was too short. Nothing if it fails (returns a negative count),
/// as C's `printf` then prints nothing of the conversion either.
fn append_snprintf(out: &mut Vec<u8>, call: impl Fn(*mut c_char, usize) -> c_int) {
    let mut small = [0u8; 256];
    let Ok(n) = usize::try_from(call(small.as_mut_ptr().cast(), small.len())) else {
        return;
    };
    if let Some(text) = small.get(..n) {
        out.extend_from_slice(text);
    } else {
        let start = out.len();
        out.resize(start + n + 1, 0);
        let buf = out.get_mut(start..).unwrap_or_default();
        let complete = call(buf.as_mut_ptr().cast(), buf.len()) == n as c_int;
        out.truncate(start + if complete { n } else { 0 });
    }
}

/// Appends a [`Piece::Malformed`] as `dialect`'s printf prints it.
///
/// LLVM 20-22 (LLVM libc's printf core) prints its text as it is. LLVM 23+ hands the text, its
/// `*` values and a zero value to the host's `fprintf`, and so does this with `snprintf`:
/// glibc prints such a spec again in its own form (`%*y` with 3 is `%3y`, `%ll]` is `%]`),
/// without padding, and nothing if it cannot parse it. Three exceptions keep that call safe
/// and bounded: text the format ended in prints as it is (LLVM's parser writes it as a
/// literal); a positional `%N$` prints `%`, what glibc prints for it, without glibc reading N
/// arguments; and glibc's own conversions LLVM does not know, `%m` (errno's message), `%C`
/// and `%S` (of a zero value: a NUL, `(null)`), get clamped fields, as padding is real there.
fn malformed(dialect: Dialect, out: &mut Vec<u8>, a: &Resolved, text: &[u8], chunks: &mut Chunks) {
    let conversion = a.spec.conversion;
    let positional = matches!(text.get(1), Some(b'1'..=b'9')) && conversion == b'$';
    if dialect == Dialect::LlvmLibc || conversion == 0 {
        return push_literal(out, text, chunks);
    }
    if positional {
        return out.push(b'%');
    }
    if matches!(conversion, b'm' | b'C' | b'S') {
        let mut buf = [0u8; 32];
        if !clamped_spec(&mut buf, a, b"", conversion) {
            return;
        }
        let spec = buf.as_ptr().cast::<c_char>();
        return append_snprintf(out, |buf, len| {
            if conversion == b'm' {
                clear_errno();
            }
            // SAFETY: `spec` is one NUL-terminated conversion, `m` (which takes no argument),
            // `C` (a wint_t: the int 0 is passed) or `S` (a wchar_t pointer: null is passed,
            // which glibc prints as "(null)"), with flags and clamped digits; `buf` is valid
            // for writes of `len` bytes.
            unsafe {
                match conversion {
                    b'S' => libc::snprintf(buf, len, spec, std::ptr::null::<c_void>()),
                    _ => libc::snprintf(buf, len, spec, 0 as c_int),
                }
            }
        });
    }
    let mut spec = text.to_vec();
    spec.push(0);
    let spec = spec.as_ptr().cast::<c_char>();
    let zero: c_ulonglong = 0;
    append_snprintf(out, |buf, len| {
        // SAFETY: `spec` is NUL-terminated: a `%`, flags, digits or `*`s, a `.`, a length and
        // one byte that is none of glibc's conversions (the cases above took `m`, `C`, `S`,
        // and the known ones are no `Malformed`), so glibc reads at most the `*` values,
        // each an int, passed in order, then prints the spec as text; the zero after them is
        // what LLVM passes and is not read. Not positional (taken above), so glibc reads
        // nothing beyond them. `buf` is valid for writes of `len` bytes.
        unsafe {
            match a.stars {
                [Some(w), Some(p)] => libc::snprintf(buf, len, spec, w, p, zero),
                [Some(v), None] | [None, Some(v)] => libc::snprintf(buf, len, spec, v, zero),
                [None, None] => libc::snprintf(buf, len, spec, zero),
            }
        }
    });
}

/// Sets this thread's errno to 0 before a `%m`: a device has no host errno, and LLVM's server
/// prints errno 0's message ("Success" on glibc), not whatever its thread's last failed call
/// left (the server thread's own timeouts, say).
fn clear_errno() {
    // SAFETY: `__errno_location` returns the address of the calling thread's errno, valid and
    // written only by this thread for as long as it lives.
    unsafe { *libc::__errno_location() = 0 };
}

/// Writes into `buf` the NUL-terminated spec of `a`'s flags, its resolved width and precision
/// (clamped, no `*`), `length` and `conversion`. On the stack: at most 19 bytes (`%`, five
/// flags, a width and a precision of at most four digits each, as both are clamped to
/// MAX_FIELD, `.`, `ll`, the conversion and the NUL). Returns whether it fit.
fn clamped_spec(buf: &mut [u8; 32], a: &Resolved, length: &[u8], conversion: u8) -> bool {
    let mut spec = &mut buf[..];
    let f = a.flags;
    let on = [f.left, f.plus, f.space, f.alt, f.zero];
    let flags = b"-+ #0"
        .iter()
        .zip(on)
        .filter_map(|(&c, on)| on.then_some(c));
    let mut written = spec.write_all(b"%").is_ok();
    for flag in flags {
        written &= spec.write_all(&[flag]).is_ok();
    }
    if let Some(width) = a.width.filter(|&w| w > 0) {
        written &= write!(spec, "{width}").is_ok();
    }
    if let Some(precision) = a.precision {
        written &= write!(spec, ".{precision}").is_ok();
    }
    written && spec.write_all(length).is_ok() && spec.write_all(&[conversion, 0]).is_ok()
}

/// `%b` / `%B` as glibc prints them: binary digits, `#` adds `0b`/`0B` before a non-zero value,
/// and width, precision and the `-` and `0` flags work as for `%x`.
fn binary(out: &mut Vec<u8>, a: &Resolved) {
    let value = match a.spec.length {
        Length::Hh => a.value & 0xff,
        Length::H => a.value & 0xffff,
        length if length.wide() => a.value,
        _ => a.value & 0xffff_ffff,
    };
    // No digit at all for a zero value with precision 0, as for %x.
    let bits = (64 - value.leading_zeros()).max(u32::from(a.precision != Some(0)));
    let digits = (0..bits).rev().map(|b| b'0' + ((value >> b) & 1) as u8);
    let digit_count = digits.len();
    let zeros = a.precision.unwrap_or(0).saturating_sub(digit_count);
    let prefix: &[u8] = match (a.flags.alt && value != 0, a.spec.conversion) {
        (false, _) => b"",
        (true, b'B') => b"0B",
        (true, _) => b"0b",
    };
    let width = a.width.unwrap_or(0);
    let pad = width.saturating_sub(prefix.len() + zeros + digit_count);
    let zero_pad = a.flags.zero && !a.flags.left && a.precision.is_none();
    if !a.flags.left && !zero_pad {
        out.resize(out.len() + pad, b' ');
    }
    out.extend_from_slice(prefix);
    let zeros = if zero_pad { zeros + pad } else { zeros };
    out.resize(out.len() + zeros, b'0');
    out.extend(digits);
    if a.flags.left {
        out.resize(out.len() + pad, b' ');
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::boxed::Box;
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::string::String;
    use std::vec;

    /// How a test argument goes into the device's buffer.
    enum Enc {
        Four(u32),
        Eight(u64),
        Str(&'static CStr),
    }

    /// A test argument: its encoding, and the C value the reference `snprintf` call receives.
    trait TestArg {
        type C;
        fn c(&self) -> Self::C;
        fn enc(&self) -> Enc;
    }

    macro_rules! test_args {
        ($($name:ident($rust:ty) => $c:ty, |$v:ident| $conv:expr, $enc:expr;)*) => {$(
            struct $name($rust);
            impl TestArg for $name {
                type C = $c;
                fn c(&self) -> $c {
                    let $v = self.0;
                    $conv
                }
                fn enc(&self) -> Enc {
                    let $v = self.0;
                    $enc
                }
            }
        )*};
    }

    test_args! {
        I(i32) => c_int, |v| v, Enc::Four(v as u32);
        U(u32) => c_uint, |v| v, Enc::Four(v);
        L(i64) => c_longlong, |v| v, Enc::Eight(v as u64);
        Ul(u64) => c_ulonglong, |v| v, Enc::Eight(v);
        D(f64) => c_double, |v| v, Enc::Eight(v.to_bits());
        P(u64) => *const c_void, |v| std::ptr::without_provenance(v as usize), Enc::Eight(v);
        S(&'static CStr) => *const c_char, |v| v.as_ptr(), Enc::Str(v);
        NullS(()) => *const c_char, |_v| std::ptr::null(), Enc::Eight(0);
        N(()) => *mut c_int, |_v| SINK.with(|sink| sink.as_ptr().cast()), Enc::Eight(0xdead_beef);
    }

    std::thread_local! {
        /// Where the reference `snprintf` writes its `%n` counts: 8 bytes, 8-aligned, since a
        /// `%lln` writes a `long long` (a `c_int` here let it write past into the next
        /// thread-local, which crashed the test harness once the thread-locals moved).
        static SINK: Cell<i64> = const { Cell::new(0) };
    }

    type Reference = Box<dyn Fn(*mut c_char, usize) -> c_int>;

    struct Row {
        format: &'static CStr,
        args: Vec<Enc>,
        reference: Reference,
    }

    /// `row!(format [=> reference format]; args...)`: the reference is `snprintf` called directly.
    macro_rules! row {
        ($fmt:expr $(=> $reference:expr)?; $($arg:expr),* $(,)?) => {{
            let reference: &'static CStr = row!(@pick $fmt $(, $reference)?);
            Row {
                format: $fmt,
                args: vec![$(TestArg::enc(&$arg)),*],
                reference: Box::new(move |buf: *mut c_char, len: usize| {
                    // SAFETY: each row's C values have the types its reference format names, a
                    // `%n` pointer is the live thread-local SINK, strings are 'static C strings
                    // (or null, which glibc prints as "(null)"), and `buf` holds `len` bytes.
                    unsafe { libc::snprintf(buf, len, reference.as_ptr() $(, TestArg::c(&$arg))*) }
                }),
            }
        }};
        (@pick $fmt:expr) => { $fmt };
        (@pick $fmt:expr, $reference:expr) => { $reference };
    }

    const LONG: &CStr =
        c"The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs!";
    const AB: &CStr = c"abcdef";

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
            row!(c"%lu|%llx|%#llo|%lX"; Ul(u64::MAX), Ul(0xdead_beef_cafe), Ul(511), Ul(1 << 63)),
            row!(c"%jd|%zd|%td|%zu|%ju|%zx"; L(-5), L(6), L(-7), Ul(8), Ul(9), Ul(255)),
            row!(c"%qd|%Ld|%qu|%Lx"; L(-1 << 40), L(1 << 50), Ul(3), Ul(0xabc)),
            row!(c"%c%c%c"; I(b'a'.into()), I(b'b'.into()), I(b'c'.into())),
            row!(c"[%5c][%-5c][%c]"; I(b'x'.into()), I(b'y'.into()), I(0x141)),
            row!(c"a%cb"; I(0)),
            row!(c"%c%ld"; I(b'z'.into()), L(1_234_567_890_123)),
            row!(c"%d%lld%d%lld%hhd%f"; I(1), L(2), I(3), L(4), I(5), D(6.5)),
            row!(c"%s"; S(c"hi")),
            row!(c"%s|%s|%s"; S(c"a"), S(c"bb"), S(c"ccc")),
            row!(c"%10s|%-10s|%.2s|%10.3s|%.0s|"; S(AB), S(AB), S(AB), S(AB), S(AB)),
            row!(c"%s"; NullS(())),
            row!(c"[%10s][%-10s][%.5s][%.6s][%3.2s][%.0s][%.7s]"; NullS(()), NullS(()), NullS(()),
                 NullS(()), NullS(()), NullS(()), NullS(())),
            row!(c"%s and %s, %s"; NullS(()), S(c"x"), S(c"")),
            row!(c"%s"; S(LONG)),
            row!(c"%.70s|%100s|%-90s|%s"; S(LONG), S(LONG), S(LONG), S(AB)),
            row!(c"100%%";),
            row!(c"%%d %d %%%%"; I(5)),
            row!(c"[%5%|%-05%|%.3%|%l%|%+ #%|%d]"; I(9)),
            row!(c"[%*%|%.*%|%-*.*%|%d]"; I(5), I(6), I(7), I(8), I(9)),
            row!(c"ab%ncd"; N(())),
            row!(c"%d%n%s%hn|%lln"; I(1), N(()), S(c"z"), N(()), N(())),
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
            row!(c"%*.*s|%.*s|"; I(12), I(3), S(AB), I(-2), S(AB)),
            row!(c"%*.*ld|"; I(-15), I(10), L(-42)),
            row!(c"%c%*ld|%c%.*f"; I(b'q'.into()), I(5), L(7), I(b'r'.into()), I(2), D(0.125)),
            row!(c"%0*d|%-0*x|"; I(6), I(-5), I(6), U(0xf)),
            row!(c"%b|%B|%#b|%#B"; U(5), U(5), U(5), U(5)),
            row!(c"%#010b|%-#10b|%.8b|%08.3b|%#12.8B|"; U(5), U(5), U(5), U(5), U(5)),
            row!(c"%#.0b|%#b|%.0b|%5b|%#5.0b|"; U(0), U(0), U(0), U(0), U(0)),
            row!(c"%hhb|%hb|%lb|%llB|%#jb"; I(0x1ff), I(0x1ffff), Ul(u64::MAX), Ul(1 << 63), Ul(6)),
            row!(c"%+b|% b|%#B|%b"; U(3), U(3), U(0), U(u32::MAX)),
            row!(c"%*b|%-*b|%.*b"; I(10), U(9), I(-10), U(9), I(6), U(9)),
            row!(c"%1000d"; I(1)),
            row!(c"%-1000s|%.1000d"; S(c"w"), I(-3)),
            row!(c"%d %s %c %p %f %x %ld %s %% %u"; I(-1), S(c"str"), I(b'C'.into()), P(0xff),
                 D(0.5), U(0xabc), L(1 << 40), NullS(()), U(7)),
        ]
    }

    /// Encodes `args` as the device would: the buffer, the strings by pointer, the pointers.
    fn encode(args: &[Enc], packed: bool) -> (Vec<u8>, HashMap<u64, Vec<u8>>, Vec<u64>) {
        let (mut buf, mut strings, mut pointers) = (Vec::new(), HashMap::new(), Vec::new());
        for arg in args {
            let bytes = match *arg {
                Enc::Four(v) => v.to_le_bytes().to_vec(),
                Enc::Eight(v) => v.to_le_bytes().to_vec(),
                Enc::Str(s) => {
                    let pointer = 0x7f00_0000_0000 + 0x1000 * (strings.len() as u64 + 1);
                    strings.insert(pointer, s.to_bytes().to_vec());
                    pointers.push(pointer);
                    pointer.to_le_bytes().to_vec()
                }
            };
            while !packed && buf.len() % bytes.len() != 0 {
                buf.push(0xee);
            }
            buf.extend(bytes);
        }
        (buf, strings, pointers)
    }

    fn reference(row: &Row) -> Vec<u8> {
        let n = (row.reference)(std::ptr::null_mut(), 0);
        let mut buf = vec![0u8; usize::try_from(n).expect("reference snprintf failed") + 1];
        assert_eq!((row.reference)(buf.as_mut_ptr().cast(), buf.len()), n);
        buf.truncate(buf.len() - 1);
        buf
    }

    fn missing(needed: usize, available: usize) -> Result<Vec<u8>, FormatError> {
        Err(FormatError::MissingArguments { needed, available })
    }

    #[test]
    fn every_row_matches_the_host_snprintf_packed_and_unpacked() {
        let rows = rows();
        assert!(rows.len() >= 60, "{} rows", rows.len());
        for row in &rows {
            let expected = reference(row);
            let pieces = parse(row.format.to_bytes());
            for packed in [false, true] {
                let (args, strings, pointers) = encode(&row.args, packed);
                let what = std::format!("{:?} packed={packed}", row.format);
                assert_eq!(args_size(&pieces, packed), args.len(), "{what}");
                let got = string_pointers(&pieces, &args, packed);
                assert_eq!(got, Ok(pointers), "{what}");
                let got = format(&pieces, &args, packed, &|p| {
                    strings.get(&p).map(Vec::as_slice)
                })
                .unwrap();
                let lossy = String::from_utf8_lossy;
                assert_eq!(lossy(&got), lossy(&expected), "{what}");
                assert_eq!(got, expected, "{what}");
                // One byte short is an error, not a panic or a read past the end.
                if let Some(short) = args.len().checked_sub(1).and_then(|n| args.get(..n)) {
                    let err = missing(args.len(), short.len());
                    assert_eq!(format(&pieces, short, packed, &|_| None), err, "{what}");
                    let got = string_pointers(&pieces, short, packed).map(|_| Vec::new());
                    assert_eq!(got, err, "{what}");
                }
            }
        }
    }

    /// The plain path ([`format_plain`]) prints what the general one prints, in both dialects,
    /// packed or not, with every string, with none fetched, and with one argument byte short
    /// (the same error, after the same output).
    #[test]
    fn plain_formats_print_the_same_by_either_path() {
        let mut plain_rows = 0;
        for row in &rows() {
            let pieces = parse(row.format.to_bytes());
            if !plan_onto(&pieces, false, &mut Vec::new()) {
                continue;
            }
            plain_rows += 1;
            let general = Format {
                pieces: &pieces,
                plan: None,
            };
            for (dialect, packed) in [
                (Dialect::HostC, false),
                (Dialect::HostC, true),
                (Dialect::LlvmLibc, false),
                (Dialect::LlvmLibc, true),
            ] {
                let (args, strings, _) = encode(&row.args, packed);
                let fetched = |p| strings.get(&p).map(Vec::as_slice);
                let none = |_| None::<&[u8]>;
                let short = &args[..args.len().saturating_sub(1)];
                let what = std::format!("{:?} {dialect:?} packed={packed}", row.format);
                let mut plan = Vec::new();
                assert!(plan_onto(&pieces, packed, &mut plan), "{what}");
                let fast = Format {
                    pieces: &pieces,
                    plan: Some(&plan),
                };
                for (args, unfetched) in [(&args[..], false), (&args[..], true), (short, false)] {
                    let print = |format| {
                        let mut out = Vec::new();
                        let mut chunks = Chunks::none();
                        let done = if unfetched {
                            format_onto(dialect, format, args, packed, &none, &mut out, &mut chunks)
                        } else {
                            let strings = &fetched;
                            format_onto(
                                dialect,
                                format,
                                args,
                                packed,
                                strings,
                                &mut out,
                                &mut chunks,
                            )
                        };
                        (done, out)
                    };
                    assert_eq!(print(fast), print(general), "{what} {args:?} {unfetched}");
                }
            }
        }
        assert!(plain_rows >= 15, "only {plain_rows} plain rows");
        // Anything else takes the general path.
        for format in [
            "%5d", "%-d", "%+d", "% d", "%#x", "%05d", "%.1d", "%*d", "%.*s", "%hd", "%hhu", "%p",
            "%f", "%b", "%n", "%y", "a%5%", "%1$d",
        ] {
            let pieces = parse(format.as_bytes());
            let mut plan = std::vec![Step::Literal(&b"kept"[..])];
            assert!(!plan_onto(&pieces, false, &mut plan), "{format}");
            assert_eq!(plan.len(), 1, "{format}: the plan is left as it was");
        }
    }

    #[test]
    fn args_size_aligns_unpacked_and_not_packed() {
        let size = |f: &str, packed| args_size(&parse(f.as_bytes()), packed);
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
            let pieces = parse(format);
            let mut out = Vec::new();
            format_in(dialect, &pieces, args, false, &|_| None, &mut |b| {
                out.extend_from_slice(b)
            })
            .unwrap();
            String::from_utf8(out).unwrap()
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
        let pieces = parse_in(dialect, format);
        assert_eq!(args_size(&pieces, false), args.len(), "{:?}", pieces);
        let mut out = Vec::new();
        format_in(dialect, &pieces, &args, false, &|_| None, &mut |b| {
            out.extend_from_slice(b)
        })
        .unwrap();
        out
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
        assert_eq!(args_size(&parse_in(Dialect::LlvmLibc, b"%n%d"), false), 4);
        assert_eq!(args_size(&parse(b"%n%d"), false), 12);
        // The format ends at its first NUL: nothing after it is parsed.
        assert_eq!(parse(b"%d\0%y").len(), 1);
    }

    #[test]
    fn short_argument_buffers_are_missing_arguments() {
        let pieces = parse(b"%d%ld");
        assert_eq!(format(&pieces, &[0; 8], false, &|_| None), missing(16, 8));
        let pointers = string_pointers(&pieces, &[1; 8], false).map(|_| Vec::new());
        assert_eq!(pointers, missing(16, 8));
        assert_eq!(format(&pieces, &[0; 11], true, &|_| None), missing(12, 11));
        let pieces = parse(b"%s");
        assert_eq!(
            string_pointers(&pieces, &[], true).map(|_| Vec::new()),
            missing(8, 0)
        );
    }

    #[test]
    fn huge_widths_and_precisions_are_clamped() {
        let pieces = parse(b"%99999999999999999999999d|%.99999999999f");
        assert!(matches!(&pieces[0], Piece::Spec(s) if s.width == Count::Fixed(MAX_FIELD)));
        let args = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]; // 1, 1.0
        let out = format(&pieces, &args, false, &|_| None).unwrap();
        assert_eq!(out.len(), MAX_FIELD + 1 + 2 + MAX_FIELD);
        // `*` width i32::MIN: left-justified, clamped; `*` precision i32::MAX on a long string.
        let pieces = parse(b"%*d|%.*s");
        let words = [i32::MIN as u32 as u64, i32::MAX as u64, 1]; // Unpacked: star, 0, star, ptr.
        let args: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let long = vec![b'x'; 10_000];
        let out = format(&pieces, &args, false, &|_| Some(&long[..])).unwrap();
        assert_eq!((out.len(), out[0]), (MAX_FIELD + 1 + MAX_FIELD, b'0'));
    }

    #[test]
    fn unfetched_and_nul_containing_strings() {
        let pieces = parse(b"[%s][%.3s][%s]");
        let args: Vec<u8> = [1u64, 2, 3].iter().flat_map(|p| p.to_le_bytes()).collect();
        let strings = |p| (p == 3).then_some(&b"ab\0cd"[..]);
        let out = format(&pieces, &args, true, &strings).unwrap();
        assert_eq!(out, b"[(null)][][ab]");
        // A string sent without its NUL prints whole.
        let unterminated = |p| (p == 1).then_some(&b"xyz"[..]);
        let out = format(&pieces, &args, true, &unterminated).unwrap();
        assert_eq!(out, b"[xyz][][(null)]");
    }

    /// Pieces are `CHUNK` bytes (the last one shorter) whatever comes just before a chunk's
    /// end: a number of the widest precision (`%.4096f` of the largest double prints 4406
    /// bytes, more than `MAX_FIELD`), a literal longer than a chunk, a `%s` string longer than
    /// two. (The first two once made pieces longer than the `CHUNK + MAX_FIELD` that
    /// `format_to` promised, a literal as long as itself; found while writing the `printf`
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
        let pieces = parse(&format);
        let string = vec![b's'; 2 * CHUNK];
        let strings = |_| Some(&string[..]);
        let mut sizes = Vec::new();
        let mut joined = Vec::new();
        format_to(&pieces, &args, false, &strings, &mut |piece| {
            sizes.push(piece.len());
            joined.extend_from_slice(piece);
        })
        .unwrap();
        let last = sizes.pop().unwrap();
        assert!(sizes.iter().all(|&n| n == CHUNK), "{sizes:?}");
        assert!(0 < last && last <= CHUNK);
        assert_eq!(
            joined,
            self::format(&pieces, &args, false, &strings).unwrap()
        );
        assert_eq!(
            joined.len(),
            16 * 4095 + 309 + 1 + 4096 + 3 * CHUNK + 2 * CHUNK
        );
    }

    #[test]
    fn random_formats_never_panic() {
        const ALPHABET: &[u8] = b"%%%%-+ #0123456789*.hlLjztqdiouxXbBcspnfFeEgGaA$y\0";
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) as usize
        };
        for _ in 0..3000 {
            let fmt: Vec<u8> = (0..next() % 24)
                .map(|_| ALPHABET[next() % ALPHABET.len()])
                .collect();
            let args: Vec<u8> = (0..next() % 80).map(|_| next() as u8).collect();
            for (dialect, packed) in [(Dialect::HostC, false), (Dialect::LlvmLibc, true)] {
                let pieces = parse_in(dialect, &fmt);
                let _ = string_pointers(&pieces, &args, packed);
                let bytes = [7u8; 8];
                let strings = |p: u64| (p & 1 == 0).then_some(&bytes[..]);
                let _ = format_in(dialect, &pieces, &args, packed, &strings, &mut |_| {});
            }
        }
    }
}
