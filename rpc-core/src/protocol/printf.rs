//! printf's argument buffer (PROTOCOL section 7): how a C format string reads, and so which
//! bytes of arguments a client sends for it. Both ends need it: a client packs its arguments
//! by it (plugin-host's warps), the server reads them by it (`services::printf`). `no_std`, and
//! nothing here allocates: [`parse`] is an iterator over the format.
//!
//! Argument sizes (LLVM's, the same for every conversion): `%c` 4 bytes; integers `d i o u x X
//! b B` 4 bytes, 8 with a length `l ll j z t q L` (`h`, `hh` stay 4 and truncate when printed);
//! floating `f F e E g G a A` 8 (a double; `L` is printed as a double); `p s n` 8; each `*` width
//! or precision a 4-byte `i32` read before the value, width first. Little-endian. Unpacked
//! buffers align the running offset up to each argument's size first ([`place`]); packed ones
//! have no padding.
//!
//! Every format parses, as in LLVM's servers: a specification the dialect does not know (`%y`,
//! positional `%1$d`, flags other than `-+ #0`, a `%` the format ends in) is a
//! [`Piece::Malformed`], which takes only its `*` arguments. The format ends at its first NUL.
//! Widths and precisions written in the format are clamped to [`MAX_FIELD`]. Nothing here
//! panics or reads outside the format it is given (the format comes from an untrusted GPU).

use crate::protocol::opcode::Dialect;

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
    /// prints it (`services::printf`). `spec.conversion` is the byte that ends it, 0 if the
    /// format ended first.
    Malformed {
        /// Its fields as parsed.
        spec: Spec,
        /// The specification as written, from `%` to the byte that ends it.
        text: &'f [u8],
    },
}

/// The flags of a specification: `-` (left), `+` (plus), ` ` (space), `#` (alt), `0` (zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// `-`: left-justify.
    pub(crate) left: bool,
    /// `+`: always a sign.
    pub(crate) plus: bool,
    /// ` `: a space for a missing sign.
    pub(crate) space: bool,
    /// `#`: the alternate form.
    pub(crate) alt: bool,
    /// `0`: pad with zeros.
    pub(crate) zero: bool,
}

/// A width or a precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// Not given.
    None,
    /// Written in the format (already clamped to [`MAX_FIELD`]).
    Fixed(usize),
    /// `*`: an `i32` argument.
    Star,
}

/// A length modifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Length {
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
    pub(crate) fn wide(self) -> bool {
        !matches!(self, Length::None | Length::Hh | Length::H)
    }
}

/// One conversion specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The flags.
    pub(crate) flags: Flags,
    /// The width.
    pub(crate) width: Count,
    /// The precision.
    pub(crate) precision: Count,
    /// The length modifier.
    pub(crate) length: Length,
    /// The conversion byte, one of `d i o u x X b B c s p n f F e E g G a A`, or `%` for a
    /// spec with something between its two `%`s (`%5%`, `%*%`: plain `%%` is a
    /// [`Piece::Percent`]). That one prints `%` and takes no value, only its `*` arguments, as
    /// glibc and both of LLVM's servers have it (LLVM 20-22's printf core documents the rule;
    /// LLVM 23+ hands the spec and its `*` values to the host's `fprintf`).
    pub(crate) conversion: u8,
    /// Offset of the `%` in the format.
    pub(crate) at: usize,
    /// The length of the spec as written, from `%` to the conversion inclusive.
    pub(crate) len: usize,
}

impl Spec {
    /// Size in bytes of the value argument (after any `*` arguments); 0 for `%`, which has none.
    #[inline]
    pub(crate) fn value_size(&self) -> usize {
        match self.conversion {
            b'%' => 0,
            b'c' => 4,
            b'd' | b'i' | b'o' | b'u' | b'x' | b'X' | b'b' | b'B' if !self.length.wide() => 4,
            _ => 8,
        }
    }
}

impl Piece<'_> {
    /// The sizes of the arguments the piece takes, in order (`*` width, `*` precision, value):
    /// what a client sends for it, each [`place`]d after the ones before.
    pub fn arg_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        let spec = match self {
            Piece::Spec(spec) | Piece::Malformed { spec, .. } => Some(spec),
            _ => None,
        };
        let star = |count: Count| (count == Count::Star).then_some(4);
        let stars = spec
            .into_iter()
            .flat_map(move |s| [star(s.width), star(s.precision)])
            .flatten();
        let value = match self {
            Piece::Spec(spec) => Some(spec.value_size()).filter(|&size| size > 0),
            _ => None,
        };
        stars.chain(value)
    }

    /// The bytes of the format the piece was parsed from.
    pub(crate) fn text_len(&self) -> usize {
        match self {
            Piece::Literal(bytes) => bytes.len(),
            Piece::Percent => 2,
            Piece::Spec(spec) | Piece::Malformed { spec, .. } => spec.len,
        }
    }
}

/// Where the next argument of `size` bytes lies after `offset` bytes of arguments: `(start,
/// end)`, aligned up to its size unless `packed` (saturating; never panics).
#[inline]
pub fn place(offset: usize, size: usize, packed: bool) -> (usize, usize) {
    let start = if packed {
        offset
    } else if size.is_power_of_two() {
        // Every argument is 4 or 8 bytes: aligning is a mask, not a division (one per argument
        // of every lane a format without a plan prints).
        offset
            .checked_add(size - 1)
            .map_or(usize::MAX, |end| end & !(size - 1))
    } else {
        offset.checked_next_multiple_of(size).unwrap_or(usize::MAX)
    };
    (start, start.saturating_add(size))
}

/// Parses `format` (it stops at the first NUL if there is one) as `dialect`'s printf reads it,
/// a piece at a time. Every format parses: a specification the dialect does not know is a
/// [`Piece::Malformed`], printed as that printf prints it: as its text by LLVM libc's printf
/// core (LLVM 20-22), again in glibc's form by the host C library (LLVM 23+).
pub fn parse(dialect: Dialect, format: &[u8]) -> Pieces<'_> {
    let end = format.iter().position(|&b| b == 0).unwrap_or(format.len());
    Pieces {
        dialect,
        rest: format.get(..end).unwrap_or_default(),
        at: 0,
    }
}

/// The pieces of a format, in order ([`parse`]).
#[derive(Debug, Clone)]
pub struct Pieces<'f> {
    dialect: Dialect,
    /// The format not parsed yet.
    rest: &'f [u8],
    /// Where `rest` starts in the format.
    at: usize,
}

impl<'f> Iterator for Pieces<'f> {
    type Item = Piece<'f>;

    fn next(&mut self) -> Option<Piece<'f>> {
        if self.rest.is_empty() {
            return None;
        }
        let literal = self.rest.iter().position(|&b| b == b'%');
        let piece = match literal.unwrap_or(self.rest.len()) {
            0 if self.rest.get(1) == Some(&b'%') => Piece::Percent,
            0 => {
                let spec = parse_spec(self.dialect, self.rest, self.at);
                if known(self.dialect, spec.conversion) {
                    Piece::Spec(spec)
                } else {
                    let text = self.rest.get(..spec.len).unwrap_or_default();
                    Piece::Malformed { spec, text }
                }
            }
            len => Piece::Literal(self.rest.get(..len).unwrap_or_default()),
        };
        // Each piece is at least a byte of the format (a spec at least its `%`).
        let used = piece.text_len().max(1);
        self.at += used;
        self.rest = self.rest.get(used..).unwrap_or_default();
        Some(piece)
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

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    use super::*;

    /// A small linear congruential generator from `seed`, for the tests' random formats (the
    /// services' tests of printf use it too).
    pub(crate) fn lcg(mut seed: u64) -> impl FnMut() -> usize {
        move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) as usize
        }
    }

    /// The pieces cover the format up to its first NUL, in order, each where the one before
    /// ended (a spec's `at` is its `%`): the positions a compiled format's plan takes its
    /// literals from.
    #[test]
    fn the_pieces_cover_the_format_up_to_its_nul() {
        const ALPHABET: &[u8] = b"%%%-+ #0123456789*.hlLjztqdiouxXbBcspnfFeEgGaA$y\0";
        let mut next = lcg(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let len = next() % 24;
            let format: [u8; 24] = core::array::from_fn(|_| ALPHABET[next() % ALPHABET.len()]);
            let format = &format[..len];
            let end = format.iter().position(|&b| b == 0).unwrap_or(len);
            for dialect in [Dialect::HostC, Dialect::LlvmLibc] {
                let mut at = 0;
                for piece in parse(dialect, format) {
                    match &piece {
                        Piece::Literal(bytes) => assert_eq!(*bytes, &format[at..at + bytes.len()]),
                        Piece::Percent => assert_eq!(&format[at..at + 2], b"%%"),
                        Piece::Spec(spec) => assert_eq!((spec.at, format[at]), (at, b'%')),
                        Piece::Malformed { spec, text } => {
                            assert_eq!(spec.at, at);
                            assert_eq!(*text, &format[at..at + spec.len]);
                        }
                    }
                    at += piece.text_len();
                }
                assert_eq!(at, end, "{format:?}");
            }
        }
    }

    #[test]
    fn arguments_are_placed_aligned_unless_packed() {
        let sizes: [usize; 3] = [4, 8, 4];
        let mut ends = (0, 0);
        let mut starts = [(0, 0); 3];
        for (k, &size) in sizes.iter().enumerate() {
            let unpacked = place(ends.0, size, false);
            let packed = place(ends.1, size, true);
            starts[k] = (unpacked.0, packed.0);
            ends = (unpacked.1, packed.1);
        }
        assert_eq!(starts, [(0, 0), (8, 4), (16, 12)]);
        assert_eq!(ends, (20, 16));
        assert_eq!(place(usize::MAX - 2, 8, false), (usize::MAX, usize::MAX));
    }
}
