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
//! Files are C `FILE *`s of the host's libc (C semantics for modes, buffering, `fseek`...),
//! held only in the table and never exposed to the device; `ungetc` and the order of input
//! and output are kept by `CFile`, where C leaves them undefined and the C library is not
//! safe. Stdin is a Rust reader the runtime can redirect ([`super::Services::set_stdin`]),
//! with the C indicators (end-of-file, error) and `ungetc` pushback kept beside it; stdout and
//! stderr are `output.rs`'s streams.

use std::boxed::Box;
use std::collections::hash_map::RandomState;
use std::ffi::{c_int, CStr};
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;
use std::vec::Vec;

use super::output::{Output, StdStream};
use super::MailboxState;
use crate::protocol::{STDERR, STDIN, STDOUT};
use crate::server::limits::{device_log, LogLimit};
use crate::sync::{lock, Mutex};

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
///
/// # Input, output and `ungetc`
/// C leaves it undefined to follow input directly by output without a positioning call
/// between (`fseek`, `rewind`, ...), and output by input without one or an `fflush`, and the
/// host's C library is not robust there: after an `ungetc` glibc reads from a small buffer it
/// allocated for the pushed-back byte, and `fwrite`s that follow write into that buffer,
/// past its end, corrupting the host's heap. The device chooses the order of the calls, so
/// every call goes through this type, which
/// - keeps the one pushed-back byte itself (`pushback`, as stdin's is kept) and never hands
///   it to the C library: reads return it first, `ftell` counts it, `fseek` drops it, and
///   `ungetc` only clears the end-of-file indicator, as C's does;
/// - remembers the direction of the last call since the last positioning (`last`), and puts
///   the call C requires between them: `fflush` from output to input, `fseek(f, 0,
///   SEEK_CUR)` from input to output (one byte back first if a byte is pushed back, as
///   writing after C's `ungetc` and that `fseek` would).
pub(crate) struct CFile {
    file: *mut libc::FILE,
    pushback: Option<u8>,
    last: Direction,
}

/// The direction of a stream's last call since a positioning call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    None,
    Input,
    Output,
}

// SAFETY: a `FILE *` may be used from any thread (C stdio locks each stream internally); this
// crate reaches it only through the `Mutex` around the `CFile`, one thread at a time.
unsafe impl Send for CFile {}

impl CFile {
    fn new(file: *mut libc::FILE) -> CFile {
        CFile {
            file,
            pushback: None,
            last: Direction::None,
        }
    }

    /// Opens `path` with `mode` (both without NUL), or `None` with C's failure. Tests only:
    /// the server opens files through the file policy ([`CFile::from_fd`]).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn open(path: &CStr, mode: &CStr) -> Option<CFile> {
        // SAFETY: both are valid NUL-terminated strings for the duration of the call.
        let file = unsafe { libc::fopen(path.as_ptr(), mode.as_ptr()) };
        (!file.is_null()).then(|| CFile::new(file))
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
        Some(CFile::new(file))
    }

    /// Whether the stream is still open.
    fn is_open(&self) -> bool {
        !self.file.is_null()
    }

    /// `fclose`: 0 or EOF; the `CFile` is closed afterwards either way.
    pub(crate) fn close(&mut self) -> c_int {
        if !self.is_open() {
            return libc::EOF;
        }
        let file = std::mem::replace(&mut self.file, std::ptr::null_mut());
        // SAFETY: `file` is an open stream from `fopen`, closed exactly once (the pointer was
        // cleared above, so no later call sees it).
        unsafe { libc::fclose(file) }
    }

    /// `fseeko` on the stream itself.
    fn seek_raw(&mut self, offset: i64, whence: c_int) -> c_int {
        // SAFETY: the stream is open (every caller runs inside `with_file`); `whence` is one
        // of C's three values.
        unsafe { libc::fseeko(self.file, offset as libc::off_t, whence) }
    }

    /// Before a read, an `ungetc` (input).
    fn input(&mut self) {
        if self.last == Direction::Output {
            // SAFETY: the stream is open (see `seek_raw`).
            unsafe { libc::fflush(self.file) };
        }
        self.last = Direction::Input;
    }

    /// Before a write (output): the pushed-back byte is dropped, and the position is where C's
    /// `ungetc` would have left it.
    fn output(&mut self) {
        if self.last == Direction::Input || self.pushback.is_some() {
            let back = i64::from(self.pushback.take().is_some());
            // At position 0 a byte pushed back leaves the position undefined (C): write there.
            if self.seek_raw(-back, libc::SEEK_CUR) != 0 {
                self.seek_raw(0, libc::SEEK_CUR);
            }
        }
        self.last = Direction::Output;
    }

    /// `fwrite` of `data`: the bytes written.
    fn write(&mut self, data: &[u8]) -> usize {
        if data.is_empty() {
            return 0;
        }
        self.output();
        // SAFETY: the stream is open; `data` is valid for reads of `data.len()` bytes.
        unsafe { libc::fwrite(data.as_ptr().cast(), 1, data.len(), self.file) }
    }

    /// `fread` of up to `max` bytes, the pushed-back byte first.
    fn read(&mut self, max: usize) -> Vec<u8> {
        if max == 0 {
            return Vec::new();
        }
        self.input();
        let mut out = Vec::new();
        out.extend(self.pushback.take());
        while out.len() < max {
            let want = (max - out.len()).min(1 << 16);
            let start = out.len();
            out.resize(start + want, 0);
            // SAFETY: the stream is open; the destination holds `want` bytes.
            let got = unsafe { libc::fread(out[start..].as_mut_ptr().cast(), 1, want, self.file) };
            out.truncate(start + got.min(want));
            if got < want {
                break;
            }
        }
        out
    }

    /// `fgets` with `count` (at most `i32::MAX`), the pushed-back byte first: the line with its
    /// NUL, or `None`.
    fn gets(&mut self, count: usize) -> Option<Vec<u8>> {
        let count = count.min(c_int::MAX as usize);
        if count == 0 {
            return None;
        }
        self.input();
        let mut line = Vec::with_capacity(count.min(1 << 16));
        let mut room = count;
        if count > 1 {
            if let Some(byte) = self.pushback.take() {
                line.push(byte);
                room -= 1;
                if byte == b'\n' || room == 1 {
                    line.push(0);
                    return Some(line);
                }
            }
        }
        let start = line.len();
        line.resize(start + room, 0);
        // SAFETY: the stream is open; `line[start..]` holds `room` bytes (at most
        // `c_int::MAX`), and `fgets` writes at most `room` of them, NUL included.
        let got =
            unsafe { libc::fgets(line[start..].as_mut_ptr().cast(), room as c_int, self.file) };
        if got.is_null() {
            // End of input or an error: the pushed-back byte alone is the line, as in C.
            line.truncate(start);
            if line.is_empty() {
                return None;
            }
            line.push(0);
            return Some(line);
        }
        let len = line[start..]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(room - 1);
        line.truncate(start + len);
        line.push(0);
        Some(line)
    }

    /// `ungetc`: `c` as an unsigned char, or EOF (for EOF, and for a second byte: one is what C
    /// guarantees). Clears the end-of-file indicator, as C's does.
    fn ungetc(&mut self, c: c_int) -> c_int {
        if c == libc::EOF || self.pushback.is_some() {
            return libc::EOF;
        }
        self.input();
        // A positioning call of no distance: it clears the end-of-file indicator and nothing
        // else (the error indicator stays).
        self.seek_raw(0, libc::SEEK_CUR);
        let byte = c as u8; // C converts the pushed-back value to unsigned char.
        self.pushback = Some(byte);
        c_int::from(byte)
    }

    /// `fseek`: 0 or -1; on success the pushed-back byte is dropped.
    fn seek(&mut self, offset: i64, whence: c_int) -> c_int {
        let offset = if whence == libc::SEEK_CUR && self.pushback.is_some() {
            offset.saturating_sub(1)
        } else {
            offset
        };
        let result = self.seek_raw(offset, whence);
        if result == 0 {
            self.pushback = None;
            self.last = Direction::None;
        }
        result
    }

    /// `ftell`: the offset (one less while a byte is pushed back; -1 where that would be
    /// before the start, where C leaves it undefined) or -1.
    fn tell(&mut self) -> i64 {
        // SAFETY: the stream is open.
        let offset = unsafe { libc::ftello(self.file) } as i64;
        match (offset, self.pushback) {
            (..=0, Some(_)) => -1,
            (offset, Some(_)) => offset - 1,
            (offset, None) => offset,
        }
    }

    /// `feof` (0 while a byte is pushed back: `ungetc` cleared it).
    fn eof(&mut self) -> c_int {
        if self.pushback.is_some() {
            return 0;
        }
        // SAFETY: the stream is open.
        unsafe { libc::feof(self.file) }
    }

    /// `ferror`.
    fn error(&mut self) -> c_int {
        // SAFETY: the stream is open.
        unsafe { libc::ferror(self.file) }
    }

    /// `clearerr`.
    fn clear_error(&mut self) {
        // SAFETY: the stream is open.
        unsafe { libc::clearerr(self.file) }
    }

    /// `fflush`: 0 or EOF. After it, input may follow output.
    fn flush(&mut self) -> c_int {
        // SAFETY: the stream is open.
        let result = unsafe { libc::fflush(self.file) };
        if self.last == Direction::Output {
            self.last = Direction::None;
        }
        result
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
    /// The server's budget of device-caused log lines (a failed read of stdin is one).
    log: Arc<LogLimit>,
}

impl Input {
    pub(crate) fn process(log: Arc<LogLimit>) -> Self {
        Input {
            source: Source::Process,
            pushback: None,
            eof: false,
            error: false,
            log,
        }
    }

    pub(crate) fn custom(reader: Box<dyn Read + Send>, log: Arc<LogLimit>) -> Self {
        Input {
            source: Source::Custom(BufReader::new(reader)),
            ..Input::process(log)
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
                    device_log!(self.log, Warn, "device stdin: {error}");
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
#[derive(Clone)]
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
    fn file(&self, mailbox: &MailboxState, handle: u64) -> Option<Target> {
        let table = lock(&mailbox.files);
        table.as_ref()?.get(handle).map(Target::File)
    }

    /// The stream a tagged handle names for `mailbox`'s requests (low two bits 1, 2, 3: the
    /// standard streams).
    pub(crate) fn tagged(&self, mailbox: &MailboxState, handle: u64) -> Option<Target> {
        match handle & 3 {
            1 => Some(Target::Stdin),
            2 => Some(Target::Stdout),
            3 => Some(Target::Stderr),
            _ => self.file(mailbox, handle),
        }
    }

    /// The stream a raw handle names for `mailbox`'s requests (exactly 1, 2, 3: the standard
    /// streams).
    pub(crate) fn raw(&self, mailbox: &MailboxState, handle: u64) -> Option<Target> {
        match handle {
            STDIN | STDOUT | STDERR => self.tagged(mailbox, handle),
            _ => self.file(mailbox, handle),
        }
    }

    /// Stdout or stderr, for a target that is one of them.
    pub(crate) fn std_stream(&self, target: &Target) -> Option<&Arc<StdStream>> {
        match target {
            Target::Stdout => Some(&self.stdout),
            Target::Stderr => Some(&self.stderr),
            _ => None,
        }
    }

    /// Stdout's or stderr's writer, for a target that is one of them.
    pub(crate) fn output(&self, target: &Target) -> Option<&Mutex<Output>> {
        match target {
            Target::Stdout => Some(&self.stdout.state),
            Target::Stderr => Some(&self.stderr.state),
            _ => None,
        }
    }

    /// Writes `data` whole to a stream: the bytes written. On an I/O thread: a standard
    /// stream's write waits there for room and for its bytes to be written
    /// ([`StdStream::write_waiting`]); the server thread hands bytes to them without waiting
    /// (`stdio`, `print`).
    pub(crate) fn write(&self, target: &Target, data: &[u8]) -> usize {
        if let Some(stream) = self.std_stream(target) {
            return stream.write_waiting(data);
        }
        match target {
            Target::Stdin => {
                lock(&self.stdin).error = true;
                0
            }
            Target::File(file) => with_file(file, 0, |f| f.write(data)),
            _ => 0,
        }
    }

    /// `fread` of up to `max` bytes.
    pub(crate) fn read(&self, target: &Target, max: usize) -> Vec<u8> {
        match target {
            Target::Stdin => lock(&self.stdin).read(max),
            Target::File(file) => with_file(file, Vec::new(), |f| f.read(max)),
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
            Target::File(file) => with_file(file, None, |f| f.gets(count)),
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
            Target::File(file) => with_file(file, 1, CFile::eof),
            _ => 0,
        }
    }

    /// `ferror`.
    pub(crate) fn error(&self, target: &Target) -> c_int {
        match target {
            Target::Stdin => c_int::from(lock(&self.stdin).error),
            Target::File(file) => with_file(file, 1, CFile::error),
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
            Target::File(file) => with_file(file, (), CFile::clear_error),
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
            Target::File(file) => with_file(file, -1, |f| f.seek(offset, whence)),
            _ => -1,
        }
    }

    /// `ftell`: the offset or -1.
    pub(crate) fn tell(&self, target: &Target) -> i64 {
        match target {
            Target::File(file) => with_file(file, -1, CFile::tell),
            _ => -1,
        }
    }

    /// `fflush`: 0 or EOF.
    pub(crate) fn flush(&self, target: &Target) -> c_int {
        match target {
            Target::Stdin => 0,
            Target::File(file) => with_file(file, libc::EOF, CFile::flush),
            _ => self.output(target).map_or(0, |o| lock(o).flush()),
        }
    }

    /// `fflush(NULL)`: every standard output and file `mailbox` has open; 0 or EOF if any
    /// failed.
    pub(crate) fn flush_all(&self, mailbox: &MailboxState) -> c_int {
        let files = lock(&mailbox.files)
            .as_ref()
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
            Target::File(file) => with_file(file, libc::EOF, |f| f.ungetc(c)),
            _ => libc::EOF,
        }
    }

    /// Files `mailbox` has open, or `None` if it has no table (not attached).
    fn open_count(&self, mailbox: &MailboxState) -> Option<usize> {
        lock(&mailbox.files).as_ref().map(FileTable::len)
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
        mailbox: &MailboxState,
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
        let mut table = lock(&mailbox.files);
        let table = table.as_mut().ok_or(OpenError::Detached)?;
        table.insert(file, max).ok_or(OpenError::TooMany)
    }

    /// Closes a handle of `mailbox`'s table: `fclose`'s result, or `None` if the handle is not
    /// live there.
    pub(crate) fn close(&self, mailbox: &MailboxState, handle: u64) -> Option<c_int> {
        let file = lock(&mailbox.files).as_mut()?.remove(handle)?;
        let result = lock(&file).close();
        Some(result)
    }
}

/// Runs `f` on a table file under its lock, or returns `closed` if it was closed meanwhile.
/// The file handed to `f` is open for the whole call: closing takes the same lock and clears
/// the pointer.
fn with_file<R>(file: &Mutex<CFile>, closed: R, f: impl FnOnce(&mut CFile) -> R) -> R {
    let mut file = lock(file);
    if file.is_open() {
        f(&mut file)
    } else {
        closed
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn test_log() -> Arc<LogLimit> {
        Arc::new(LogLimit::new(20))
    }

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

    /// A file's `ungetc` is kept here, not in the C library, and input and output get the
    /// positioning call C requires between them: the C results, with no `ungetc` state inside
    /// glibc for its writes to trample.
    #[test]
    fn file_ungetc_and_switching_between_input_and_output() {
        let path = std::env::temp_dir().join(format!("rpc-cfile-{}", std::process::id()));
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        let mut f = CFile::open(&c_path, c"w+").unwrap();
        assert_eq!(f.write(b"hello\nworld\n"), 12);
        assert_eq!(f.seek(0, libc::SEEK_SET), 0);
        assert_eq!(f.read(1), b"h");
        assert_eq!(f.ungetc(c_int::from(b'H')), c_int::from(b'H'));
        assert_eq!(f.tell(), 0, "ungetc moves the position back");
        assert_eq!(
            f.ungetc(c_int::from(b'x')),
            libc::EOF,
            "one byte of pushback"
        );
        assert_eq!(f.gets(100).unwrap(), b"Hello\n\0");
        assert_eq!(f.read(100), b"world\n");
        assert_eq!(f.eof(), 1);
        assert_eq!(f.ungetc(c_int::from(b'!')), c_int::from(b'!'));
        assert_eq!(f.eof(), 0, "ungetc clears end-of-file");
        assert_eq!(f.gets(2).unwrap(), b"!\0");
        assert_eq!(f.gets(100), None);
        // fseek drops the pushed-back byte; SEEK_CUR counts from the position ungetc left.
        assert_eq!(f.seek(3, libc::SEEK_SET), 0);
        f.ungetc(c_int::from(b'?'));
        assert_eq!(f.seek(1, libc::SEEK_CUR), 0);
        assert_eq!(f.tell(), 3);
        assert_eq!(f.read(1), b"l");
        // Output after input: written where the reads left off (after ungetc: one back).
        f.ungetc(c_int::from(b'L'));
        assert_eq!(f.write(b"XY"), 2);
        assert_eq!(f.read(3), b"\nwo", "input after output");
        assert_eq!(f.close(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), b"helXY\nworld\n");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn stdin_fgets_ungetc_and_indicators() {
        let mut input = Input::custom(Box::new(&b"ab\ncdef"[..]), test_log());
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
