//! Streams as the device names them: the standard streams and a host table of open files.
//!
//! # Handles
//! The device sees only opaque handles. In *tagged* positions (every stream opcode but the
//! three below) the two low bits select a standard stream, as in LLVM: 1 = stdin, 2 = stdout,
//! 3 = stderr, 0 = a handle from OPEN_FILE. In *raw* positions (WRITE_TO_STREAM, CLOSE_FILE,
//! PRINTF_TO_STREAM) exactly 1, 2 and 3 name the standard streams and anything else must be a
//! table handle.
//!
//! Each mailbox has a table of its own: a handle names a file only for requests of the mailbox
//! that opened it, and detaching the mailbox closes its files. A table handle is
//! `tag << 32 | slot << 2`: the two low bits are 0 (so the device's tag check sees a file),
//! `slot` (30 bits) indexes the table and `tag` (32 bits, never 0, so a handle is never 0) is
//! drawn for each open from a keyed hash whose key is random per table. A handle names a file
//! only while that slot holds the tag it was made with, so a handle kept after CLOSE_FILE does
//! not alias a file opened later in the same slot, and a device cannot forge a handle it was
//! not given (one guess in 2^32). A handle that is not live is an error result, never
//! undefined behaviour.
//!
//! Files are C `FILE *`s of the host's libc (exact C semantics for modes, buffering, `ungetc`,
//! `fseek`...), held only in the table and never exposed to the device. The standard streams
//! are Rust readers and writers the runtime can redirect ([`super::Services::set_stdout`]), with
//! the C indicators (end-of-file, error) and `ungetc` pushback kept beside them.

use std::boxed::Box;
use std::collections::hash_map::RandomState;
use std::ffi::{c_int, CStr};
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;
use std::vec::Vec;

use crate::rpc_server::MailboxId;
use crate::sync::{lock, Mutex};

/// Tagged value of stdin.
pub const STDIN: u64 = 1;
/// Tagged value of stdout.
pub const STDOUT: u64 = 2;
/// Tagged value of stderr.
pub const STDERR: u64 = 3;

const SLOT_BITS: u32 = 30;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// The handle of `slot` opened with `tag`.
fn encode_handle(slot: usize, tag: u32) -> u64 {
    (u64::from(tag) << 32) | (((slot as u64) & SLOT_MASK) << 2)
}

/// `(slot, tag)` of a table handle; `None` if its low two bits are not 0.
fn decode_handle(handle: u64) -> Option<(usize, u32)> {
    if handle & 3 != 0 {
        return None;
    }
    Some((((handle >> 2) & SLOT_MASK) as usize, (handle >> 32) as u32))
}

/// A C `FILE *` owned by the table; null once closed.
pub(crate) struct CFile(*mut libc::FILE);

// SAFETY: a `FILE *` may be used from any thread (C stdio locks each stream internally); this
// crate reaches it only through the `Mutex` around the `CFile`, one thread at a time.
unsafe impl Send for CFile {}

impl CFile {
    /// Opens `path` with `mode` (both without NUL), or `None` with C's failure. Tests only:
    /// the server opens files through the file policy ([`CFile::from_fd`]).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn open(path: &CStr, mode: &CStr) -> Option<CFile> {
        // SAFETY: both are valid NUL-terminated strings for the duration of the call.
        let file = unsafe { libc::fopen(path.as_ptr(), mode.as_ptr()) };
        (!file.is_null()).then_some(CFile(file))
    }

    /// `fdopen(fd, mode)` (`mode` without NUL, matching the descriptor's access mode), or
    /// `None` with C's failure (the descriptor is closed then).
    pub(crate) fn from_fd(fd: OwnedFd, mode: &CStr) -> Option<CFile> {
        let fd = fd.into_raw_fd();
        // SAFETY: `fd` is an open descriptor this call now owns; `mode` is a valid
        // NUL-terminated string for the duration of the call.
        let file = unsafe { libc::fdopen(fd, mode.as_ptr()) };
        if file.is_null() {
            // SAFETY: fdopen failed, so `fd` is still open and still ours alone.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            return None;
        }
        Some(CFile(file))
    }

    /// The stream, unless closed.
    fn live(&self) -> Option<*mut libc::FILE> {
        (!self.0.is_null()).then_some(self.0)
    }

    /// `fclose`: 0 or EOF; the `CFile` is closed afterwards either way.
    pub(crate) fn close(&mut self) -> c_int {
        let Some(file) = self.live() else {
            return libc::EOF;
        };
        self.0 = std::ptr::null_mut();
        // SAFETY: `file` is an open stream from `fopen`, closed exactly once (the pointer was
        // cleared above, so no later call sees it).
        unsafe { libc::fclose(file) }
    }
}

impl Drop for CFile {
    fn drop(&mut self) {
        self.close();
    }
}

/// One open file in the table.
struct Slot {
    tag: u32,
    file: Arc<Mutex<CFile>>,
}

/// The files one mailbox's kernels opened: handle -> `FILE *`.
#[derive(Default)]
pub(crate) struct FileTable {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Opens so far: with `key`, draws each open's tag.
    opens: u64,
    /// Random per table (std seeds it from the OS), so tags cannot be predicted.
    key: RandomState,
    open: usize,
}

impl FileTable {
    pub(crate) fn len(&self) -> usize {
        self.open
    }

    /// Adds a file; its handle, or `None` once `max` files are open.
    pub(crate) fn insert(&mut self, file: CFile, max: usize) -> Option<u64> {
        if self.open >= max {
            return None;
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if (self.slots.len() as u64) <= SLOT_MASK => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return None,
        };
        self.opens += 1;
        // A keyed hash (SipHash) of the open's number: distinct opens get unrelated tags.
        let tag = (self.key.hash_one(self.opens) as u32).max(1);
        self.slots[slot] = Some(Slot {
            tag,
            file: Arc::new(Mutex::new(file)),
        });
        self.open += 1;
        Some(encode_handle(slot, tag))
    }

    /// The live file a table handle names.
    pub(crate) fn get(&self, handle: u64) -> Option<Arc<Mutex<CFile>>> {
        let (slot, tag) = decode_handle(handle)?;
        let entry = self.slots.get(slot)?.as_ref()?;
        (entry.tag == tag && tag != 0).then(|| entry.file.clone())
    }

    /// Removes the live file a table handle names.
    pub(crate) fn remove(&mut self, handle: u64) -> Option<Arc<Mutex<CFile>>> {
        self.get(handle)?;
        let (slot, _) = decode_handle(handle)?;
        let entry = self.slots[slot].take()?;
        self.free.push(slot);
        self.open -= 1;
        Some(entry.file)
    }

    /// Every open file (for `fflush(NULL)`).
    pub(crate) fn all(&self) -> Vec<Arc<Mutex<CFile>>> {
        self.slots
            .iter()
            .flatten()
            .map(|s| s.file.clone())
            .collect()
    }
}

/// A writer standing for stdout or stderr, with C's error indicator.
pub(crate) struct Output {
    writer: Box<dyn Write + Send>,
    error: bool,
}

impl Output {
    pub(crate) fn new(writer: Box<dyn Write + Send>) -> Self {
        Output {
            writer,
            error: false,
        }
    }

    /// Writes `data` whole and flushes: `data.len()`, or 0 (and the error indicator) on failure.
    pub(crate) fn write(&mut self, data: &[u8]) -> usize {
        match self
            .writer
            .write_all(data)
            .and_then(|()| self.writer.flush())
        {
            Ok(()) => data.len(),
            Err(error) => {
                log::warn!("device output lost: {error}");
                self.error = true;
                0
            }
        }
    }

    /// `fflush`: 0 or EOF.
    pub(crate) fn flush(&mut self) -> c_int {
        match self.writer.flush() {
            Ok(()) => 0,
            Err(_) => {
                self.error = true;
                libc::EOF
            }
        }
    }
}

/// Where stdin's bytes come from.
enum Source {
    /// The process's stdin (its own shared buffer).
    Process,
    /// A reader the runtime set.
    Custom(BufReader<Box<dyn Read + Send>>),
}

/// A reader standing for stdin, with C's indicators and `ungetc` pushback.
pub(crate) struct Input {
    source: Source,
    /// The pushed-back byte: one, the pushback C guarantees (a second `ungetc` fails).
    pushback: Option<u8>,
    eof: bool,
    error: bool,
}

impl Input {
    pub(crate) fn process() -> Self {
        Input {
            source: Source::Process,
            pushback: None,
            eof: false,
            error: false,
        }
    }

    pub(crate) fn custom(reader: Box<dyn Read + Send>) -> Self {
        Input {
            source: Source::Custom(BufReader::new(reader)),
            ..Input::process()
        }
    }

    /// Runs `f` over the buffered source.
    fn with_source<R>(&mut self, f: impl FnOnce(&mut dyn BufRead) -> R) -> R {
        match &mut self.source {
            Source::Process => f(&mut std::io::stdin().lock()),
            Source::Custom(reader) => f(reader),
        }
    }

    /// Reads up to `max` bytes, until `stop` accepts a byte just read (kept) or the end.
    /// Sets the indicators as C's stdio does.
    fn read_until(&mut self, max: usize, stop: Option<u8>) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < max {
            if let Some(byte) = self.pushback.take() {
                out.push(byte);
                if Some(byte) == stop {
                    return out;
                }
                continue;
            }
            let step = self.with_source(|source| loop {
                match source.fill_buf() {
                    Ok([]) => break Step::End,
                    Ok(available) => {
                        let mut take = available.len().min(max - out.len());
                        let found =
                            stop.and_then(|stop| available[..take].iter().position(|&b| b == stop));
                        if let Some(at) = found {
                            take = at + 1;
                        }
                        out.extend_from_slice(&available[..take]);
                        source.consume(take);
                        break if found.is_some() {
                            Step::Found
                        } else {
                            Step::More
                        };
                    }
                    Err(error) if error.kind() == ErrorKind::Interrupted => {}
                    Err(error) => break Step::Failed(error),
                }
            });
            match step {
                Step::More => {}
                Step::Found => return out,
                Step::End => {
                    self.eof = true;
                    return out;
                }
                Step::Failed(error) => {
                    log::warn!("device stdin: {error}");
                    self.error = true;
                    return out;
                }
            }
        }
        out
    }

    /// `fread` of up to `max` bytes.
    pub(crate) fn read(&mut self, max: usize) -> Vec<u8> {
        self.read_until(max, None)
    }

    /// `fgets` with `count`: the line with its NUL, or `None` (end or error before any byte).
    pub(crate) fn gets(&mut self, count: usize) -> Option<Vec<u8>> {
        if count == 0 {
            return None;
        }
        let mut line = self.read_until(count - 1, Some(b'\n'));
        if line.is_empty() && count > 1 {
            return None;
        }
        line.push(0);
        Some(line)
    }

    /// `ungetc`.
    pub(crate) fn ungetc(&mut self, c: c_int) -> c_int {
        if c == libc::EOF || self.pushback.is_some() {
            return libc::EOF;
        }
        let byte = c as u8;
        self.pushback = Some(byte);
        self.eof = false;
        c_int::from(byte)
    }
}

/// Why [`super::Services::open`] gave no handle.
pub(crate) enum OpenError {
    /// The open failed (an ordinary C result; logged at `debug`).
    Failed,
    /// The file policy refuses the path (a refusal), for this reason.
    Refused(std::string::String),
    /// The mailbox holds `Limits::open_files` files already.
    TooMany,
    /// The mailbox is detached (or was never attached): its table is gone, and a file opened
    /// for it is closed at once (logged at `debug`; nobody reads the reply).
    Detached,
}

/// A stream a request names.
pub(crate) enum Target {
    Stdin,
    Stdout,
    Stderr,
    File(Arc<Mutex<CFile>>),
}

impl Target {
    /// Whether using the stream may block the calling thread: a file (a FIFO, a terminal, a
    /// slow file system) or stdin (nobody may be writing it). Run such work on an I/O thread.
    pub(crate) fn may_block(&self) -> bool {
        matches!(self, Target::Stdin | Target::File(_))
    }
}

/// How one read from stdin's source went.
enum Step {
    /// Bytes taken, no stop byte among them.
    More,
    /// The stop byte was taken.
    Found,
    /// End of input.
    End,
    Failed(std::io::Error),
}

impl super::Services {
    /// The file of `mailbox`'s table a handle names.
    fn file(&self, mailbox: MailboxId, handle: u64) -> Option<Target> {
        let tables = lock(&self.files);
        tables.get(&mailbox)?.get(handle).map(Target::File)
    }

    /// The stream a tagged handle names for `mailbox`'s requests (low two bits 1, 2, 3: the
    /// standard streams).
    pub(crate) fn tagged(&self, mailbox: MailboxId, handle: u64) -> Option<Target> {
        match handle & 3 {
            1 => Some(Target::Stdin),
            2 => Some(Target::Stdout),
            3 => Some(Target::Stderr),
            _ => self.file(mailbox, handle),
        }
    }

    /// The stream a raw handle names for `mailbox`'s requests (exactly 1, 2, 3: the standard
    /// streams).
    pub(crate) fn raw(&self, mailbox: MailboxId, handle: u64) -> Option<Target> {
        match handle {
            STDIN | STDOUT | STDERR => self.tagged(mailbox, handle),
            _ => self.file(mailbox, handle),
        }
    }

    fn output(&self, target: &Target) -> Option<&Mutex<Output>> {
        match target {
            Target::Stdout => Some(&self.stdout),
            Target::Stderr => Some(&self.stderr),
            _ => None,
        }
    }

    /// Writes `data` whole to a stream (one lock, one write): the bytes written.
    pub(crate) fn write(&self, target: &Target, data: &[u8]) -> usize {
        if let Some(output) = self.output(target) {
            return lock(output).write(data);
        }
        match target {
            Target::Stdin => {
                lock(&self.stdin).error = true;
                0
            }
            Target::File(file) => with_file(file, 0, |f| {
                if data.is_empty() {
                    return 0;
                }
                // SAFETY: `f` is an open stream (see `with_file`); `data` is valid for reads of
                // `data.len()` bytes.
                unsafe { libc::fwrite(data.as_ptr().cast(), 1, data.len(), f) }
            }),
            _ => 0,
        }
    }

    /// `fread` of up to `max` bytes.
    pub(crate) fn read(&self, target: &Target, max: usize) -> Vec<u8> {
        match target {
            Target::Stdin => lock(&self.stdin).read(max),
            Target::File(file) => with_file(file, Vec::new(), |f| {
                let mut out = Vec::new();
                while out.len() < max {
                    let want = (max - out.len()).min(1 << 16);
                    let start = out.len();
                    out.resize(start + want, 0);
                    // SAFETY: `f` is an open stream; the destination holds `want` bytes.
                    let got = unsafe { libc::fread(out[start..].as_mut_ptr().cast(), 1, want, f) };
                    out.truncate(start + got.min(want));
                    if got < want {
                        break;
                    }
                }
                out
            }),
            _ => {
                self.set_error(target);
                Vec::new()
            }
        }
    }

    /// `fgets` with `count` (at most `i32::MAX`): the line with its NUL, or `None`.
    pub(crate) fn gets(&self, target: &Target, count: usize) -> Option<Vec<u8>> {
        match target {
            Target::Stdin => lock(&self.stdin).gets(count),
            Target::File(file) => with_file(file, None, |f| {
                let count = count.min(c_int::MAX as usize);
                if count == 0 {
                    return None;
                }
                let mut line = std::vec![0u8; count];
                // SAFETY: `f` is an open stream; `line` holds `count` bytes, and `fgets` writes
                // at most `count` of them, NUL included.
                let got = unsafe { libc::fgets(line.as_mut_ptr().cast(), count as c_int, f) };
                if got.is_null() {
                    return None;
                }
                let len = line.iter().position(|&b| b == 0).unwrap_or(count - 1);
                line.truncate(len + 1);
                line[len] = 0;
                Some(line)
            }),
            _ => {
                self.set_error(target);
                None
            }
        }
    }

    fn set_error(&self, target: &Target) {
        match target {
            Target::Stdin => lock(&self.stdin).error = true,
            _ => {
                if let Some(output) = self.output(target) {
                    lock(output).error = true;
                }
            }
        }
    }

    /// `feof`.
    pub(crate) fn eof(&self, target: &Target) -> c_int {
        match target {
            Target::Stdin => c_int::from(lock(&self.stdin).eof),
            Target::File(file) => with_file(file, 1, |f| {
                // SAFETY: `f` is an open stream.
                unsafe { libc::feof(f) }
            }),
            _ => 0,
        }
    }

    /// `ferror`.
    pub(crate) fn error(&self, target: &Target) -> c_int {
        match target {
            Target::Stdin => c_int::from(lock(&self.stdin).error),
            Target::File(file) => with_file(file, 1, |f| {
                // SAFETY: `f` is an open stream.
                unsafe { libc::ferror(f) }
            }),
            _ => self
                .output(target)
                .map_or(0, |o| c_int::from(lock(o).error)),
        }
    }

    /// `clearerr`.
    pub(crate) fn clear_error(&self, target: &Target) {
        match target {
            Target::Stdin => {
                let mut input = lock(&self.stdin);
                input.eof = false;
                input.error = false;
            }
            Target::File(file) => with_file(file, (), |f| {
                // SAFETY: `f` is an open stream.
                unsafe { libc::clearerr(f) }
            }),
            _ => {
                if let Some(output) = self.output(target) {
                    lock(output).error = false;
                }
            }
        }
    }

    /// `fseek`: 0 or -1. The standard streams do not seek (-1, as on a pipe or terminal).
    pub(crate) fn seek(&self, target: &Target, offset: i64, whence: u64) -> c_int {
        let whence = match whence {
            0 => libc::SEEK_SET,
            1 => libc::SEEK_CUR,
            2 => libc::SEEK_END,
            _ => return -1,
        };
        match target {
            Target::File(file) => with_file(file, -1, |f| {
                // SAFETY: `f` is an open stream; `whence` is one of C's three values.
                unsafe { libc::fseeko(f, offset as libc::off_t, whence) }
            }),
            _ => -1,
        }
    }

    /// `ftell`: the offset or -1.
    pub(crate) fn tell(&self, target: &Target) -> i64 {
        match target {
            Target::File(file) => with_file(file, -1, |f| {
                // SAFETY: `f` is an open stream.
                let offset: libc::off_t = unsafe { libc::ftello(f) };
                offset as i64
            }),
            _ => -1,
        }
    }

    /// `fflush`: 0 or EOF.
    pub(crate) fn flush(&self, target: &Target) -> c_int {
        match target {
            Target::Stdin => 0,
            Target::File(file) => with_file(file, libc::EOF, |f| {
                // SAFETY: `f` is an open stream.
                unsafe { libc::fflush(f) }
            }),
            _ => self.output(target).map_or(0, |o| lock(o).flush()),
        }
    }

    /// `fflush(NULL)`: every standard output and file `mailbox` has open; 0 or EOF if any
    /// failed.
    pub(crate) fn flush_all(&self, mailbox: MailboxId) -> c_int {
        let files = lock(&self.files)
            .get(&mailbox)
            .map(FileTable::all)
            .unwrap_or_default();
        let mut result = 0;
        for target in [Target::Stdout, Target::Stderr]
            .into_iter()
            .chain(files.into_iter().map(Target::File))
        {
            if self.flush(&target) != 0 {
                result = libc::EOF;
            }
        }
        result
    }

    /// `ungetc`: `c` as an unsigned char, or EOF.
    pub(crate) fn ungetc(&self, target: &Target, c: c_int) -> c_int {
        match target {
            Target::Stdin => lock(&self.stdin).ungetc(c),
            Target::File(file) => with_file(file, libc::EOF, |f| {
                // SAFETY: `f` is an open stream.
                unsafe { libc::ungetc(c, f) }
            }),
            _ => libc::EOF,
        }
    }

    /// Files `mailbox` has open, or `None` if it has no table (not attached).
    fn open_count(&self, mailbox: MailboxId) -> Option<usize> {
        lock(&self.files).get(&mailbox).map(FileTable::len)
    }

    /// Opens a file into `mailbox`'s table: its handle, or why not (open failed, the mailbox
    /// holds `Limits::open_files` files, or it is detached).
    ///
    /// The open itself runs without the table's lock (it may block), so the mailbox may be
    /// detached meanwhile: the file goes into the table only if the table is still there,
    /// checked under its lock, which `forget_mailbox` takes to remove it. A file opened for a
    /// mailbox detached meanwhile is closed here, so a detach leaves no file open.
    pub(crate) fn open(
        &self,
        mailbox: MailboxId,
        path: &CStr,
        mode: &CStr,
    ) -> core::result::Result<u64, OpenError> {
        let max = self.limits.open_files;
        match self.open_count(mailbox) {
            None => return Err(OpenError::Detached),
            Some(open) if open >= max => return Err(OpenError::TooMany),
            Some(_) => {}
        }
        let file = self.open_under_policy(path, mode)?;
        // Dropping `file` on failure closes it.
        let mut tables = lock(&self.files);
        let table = tables.get_mut(&mailbox).ok_or(OpenError::Detached)?;
        table.insert(file, max).ok_or(OpenError::TooMany)
    }

    /// Closes a handle of `mailbox`'s table: `fclose`'s result, or `None` if the handle is not
    /// live there.
    pub(crate) fn close(&self, mailbox: MailboxId, handle: u64) -> Option<c_int> {
        let file = lock(&self.files).get_mut(&mailbox)?.remove(handle)?;
        let result = lock(&file).close();
        Some(result)
    }
}

/// Runs `f` on a table file's stream under its lock, or returns `closed` if it was closed
/// meanwhile. The `FILE *` handed to `f` is open for the whole call: closing takes the same lock
/// and clears the pointer.
fn with_file<R>(file: &Mutex<CFile>, closed: R, f: impl FnOnce(*mut libc::FILE) -> R) -> R {
    let file = lock(file);
    match file.live() {
        Some(stream) => f(stream),
        None => closed,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn handles_have_clear_tag_bits_and_are_never_zero() {
        for (slot, generation) in [(0, 1), (1, 7), (SLOT_MASK as usize, u32::MAX)] {
            let handle = encode_handle(slot, generation);
            assert_ne!(handle, 0);
            assert_eq!(handle & 3, 0);
            assert_eq!(decode_handle(handle), Some((slot, generation)));
        }
        assert_eq!(decode_handle(STDOUT), None);
    }

    #[test]
    fn a_closed_handle_does_not_alias_a_reopened_slot() {
        let mut table = FileTable::default();
        let devnull = c"/dev/null";
        let first = table
            .insert(CFile::open(devnull, c"r").unwrap(), 8)
            .unwrap();
        assert!(table.get(first).is_some());
        assert!(table.remove(first).is_some());
        let second = table
            .insert(CFile::open(devnull, c"r").unwrap(), 8)
            .unwrap();
        assert_eq!(
            decode_handle(first).unwrap().0,
            decode_handle(second).unwrap().0
        );
        assert_ne!(first, second);
        assert!(table.get(first).is_none(), "stale handle must be dead");
        assert!(table.remove(first).is_none());
        assert!(table.get(second).is_some());
        assert!(table.get(second | 1).is_none());
        assert!(table.get(0).is_none());
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut table = FileTable::default();
        assert!(table
            .insert(CFile::open(c"/dev/null", c"r").unwrap(), 1)
            .is_some());
        assert!(table
            .insert(CFile::open(c"/dev/null", c"r").unwrap(), 1)
            .is_none());
    }

    #[test]
    fn stdin_fgets_ungetc_and_indicators() {
        let mut input = Input::custom(Box::new(&b"ab\ncdef"[..]));
        assert_eq!(input.gets(10).unwrap(), b"ab\n\0");
        assert_eq!(input.gets(3).unwrap(), b"cd\0");
        assert_eq!(input.ungetc(c_int::from(b'x')), c_int::from(b'x'));
        assert_eq!(input.gets(1).unwrap(), b"\0");
        assert_eq!(input.read(100), b"xef");
        assert!(input.eof);
        assert_eq!(input.gets(10), None);
        assert_eq!(input.ungetc(libc::EOF), libc::EOF);
        input.ungetc(c_int::from(b'z'));
        assert!(!input.eof);
        assert_eq!(input.gets(10).unwrap(), b"z\0");
    }
}
