//! The plain formats a thread compiled last ([`Kept`]), so that a format seen again is not
//! parsed again: with a warp printing the same line in a loop, parsing it was about a fifth of
//! the server's time per request (docs/performance.md). Per thread, so no lock.

use core::cell::RefCell;
use std::vec::Vec;

use super::format::Format;
use crate::protocol::Dialect;

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
mod tests {
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
