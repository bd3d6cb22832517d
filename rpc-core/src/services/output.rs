//! The device's stdout and stderr: the bytes the handlers hand on, and writing them so that
//! the server thread never waits for a reader.
//!
//! # Commits
//! A stream's bytes reach its writer in *commits*: one `write`, or every printf line staged
//! since the last commit (the lines a pass formatted: printf's group commit), in the order
//! they were handed on. A [`Ticket`] names a commit; an exchange replies once its commit was
//! written ([`Output::committed`]).
//!
//! # Never waiting for a reader
//! A descriptor ([`Writer::Fd`]: the process's stdout or stderr, or one given with
//! `Services::set_stdout_fd`) is written without ever waiting: a pipe, FIFO or terminal
//! through a description of its own opened `O_NONBLOCK` (`/proc/self/fd/N` opened again, so
//! the process's other writers keep their blocking one), a socket with `MSG_DONTWAIT`, a
//! regular file or `/dev/null` as it is (no reader to wait for there). While the reader keeps
//! up, a commit is one `write(2)` on the server thread, as before. A commit that comes up
//! short leaves its rest in the stream's *queue*, and a *drainer* thread (one per stream,
//! started then, gone once the queue is empty) writes the queue in order, waiting in `poll`
//! for the reader; later commits queue behind it, so the order is kept. The exchanges whose
//! bytes are queued wait suspended, their ports held, as for an I/O call; so does an exchange
//! that would hand on bytes while the queue holds [`Limits::output_bytes`] or more (a write
//! is then taken whole once there is room). Every other port is served meanwhile. An I/O
//! thread writing a long printf waits on the stream's condition variable instead (one at a
//! time per server: the output turn, see `services::io`).
//!
//! A writer given as a [`Write`] (`Services::set_stdout`) is called on the server thread at
//! each commit, as it always was: it must not block (a buffer in memory, a sink).
//!
//! # Bounded flushing
//! [`StdStream::flush_within`] (a shutdown, `Services::flush_std`, a new writer, dropping the
//! services) waits for the queue up to a deadline and then gives the rest up: the bytes are
//! counted in the server's `output_lost_bytes` and logged in one line (within the devices' log
//! budget), and the exchanges that waited for them are answered as a failed write. A drainer
//! of a queue given up leaves at its next look (it waits in `poll` a slice at a time). Where
//! no description of its own can be had (no `/proc`), a pipe or terminal is written by the
//! drainer alone, blocking; one stuck in `write(2)` when its queue is given up is left behind
//! and leaves if that write ever returns.
//!
//! | field | written by | when |
//! |---|---|---|
//! | everything in [`Output`] | the server thread, the I/O threads, the drainer | under the stream's lock |
//! | `Report::lost` | whoever gives bytes up | a tally (`Relaxed`, see `server::stats`) |

use std::boxed::Box;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::io::{ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use std::vec::Vec;

use crate::server::limits::Limits;
use crate::server::stats::Reporting;
use crate::sync::{lock, wait_until, Condvar, Mutex, MutexGuard, Ordering};

/// Staged bytes above this are committed at once: a pass's short lines fit, and the buffer
/// stays small.
const STAGED_BYTES: usize = 64 << 10;

/// How long the drainer waits in `poll` before it looks whether its queue was given up.
const DRAIN_SLICE: Duration = Duration::from_millis(100);

/// Which commit carries a stage's bytes ([`Output::stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

/// How an output's bytes reach its stream.
pub(crate) enum Writer {
    /// A writer the runtime set: called on the thread that commits (see the module docs).
    Inline(Box<dyn Write + Send>),
    /// A descriptor, written without waiting (see the module docs).
    Fd(Arc<Descriptor>),
}

/// How a [`Descriptor`] is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// A regular file or `/dev/null`: `write(2)`, which waits for no reader.
    Direct,
    /// A description of our own with `O_NONBLOCK` (a pipe, FIFO or terminal).
    NonBlocking,
    /// A socket: `send` with `MSG_DONTWAIT`.
    Socket,
    /// Anything else (or no description of our own could be had): only the drainer writes,
    /// and it may block.
    Blocking,
}

/// A descriptor the output writes to, and how.
pub(crate) struct Descriptor {
    fd: RawFd,
    /// Set when the descriptor is ours to close (not the process's stdout or stderr).
    _owned: Option<OwnedFd>,
    how: How,
}

impl Descriptor {
    /// The process's descriptor `fd` (1 or 2), left open when dropped.
    pub(crate) fn process(fd: RawFd) -> Descriptor {
        Descriptor::classify(fd, None)
    }

    /// A descriptor given to the services (closed when dropped).
    pub(crate) fn owned(fd: OwnedFd) -> Descriptor {
        Descriptor::classify(fd.as_raw_fd(), Some(fd))
    }

    fn classify(fd: RawFd, owned: Option<OwnedFd>) -> Descriptor {
        if cfg!(miri) {
            // Miri's isolation has no `fstat`; its tests write the standard streams plainly.
            return Descriptor {
                fd,
                _owned: owned,
                how: How::Direct,
            };
        }
        // SAFETY: an all-zero `stat` is a valid value of a plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid destination; a bad descriptor only makes fstat fail.
        let known = unsafe { libc::fstat(fd, &mut st) } == 0;
        let kind = st.st_mode & libc::S_IFMT;
        let dev_null = kind == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3);
        let how = match kind {
            // A closed descriptor fails each write at once (EBADF), as before.
            _ if !known || dev_null || kind == libc::S_IFREG => How::Direct,
            libc::S_IFSOCK => How::Socket,
            libc::S_IFIFO | libc::S_IFCHR => match reopen_nonblocking(fd) {
                Some(own) => {
                    let fd = own.as_raw_fd();
                    return Descriptor {
                        fd,
                        _owned: Some(own),
                        how: How::NonBlocking,
                    };
                }
                None => How::Blocking,
            },
            _ => How::Blocking,
        };
        Descriptor {
            fd,
            _owned: owned,
            how,
        }
    }

    /// One write that never waits for the reader: the bytes written, or `WouldBlock`.
    fn try_write(&self, data: &[u8]) -> std::io::Result<usize> {
        let written = match self.how {
            How::Blocking => return Err(ErrorKind::WouldBlock.into()),
            // SAFETY: `data` is valid for reads of `data.len()` bytes.
            How::Socket => unsafe {
                libc::send(
                    self.fd,
                    data.as_ptr().cast(),
                    data.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            },
            // SAFETY: as above.
            How::Direct | How::NonBlocking => unsafe {
                libc::write(self.fd, data.as_ptr().cast(), data.len())
            },
        };
        if written < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(written as usize)
    }

    /// Waits up to [`DRAIN_SLICE`] for the reader to make room (or for an error, which the
    /// next write reports).
    fn wait_writable(&self) {
        let mut poll = libc::pollfd {
            fd: self.fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, DRAIN_SLICE.as_millis() as c_int) };
    }

    /// `write(2)`, which may wait: for a `Blocking` descriptor, on the drainer only.
    fn write_blocking(&self, data: &[u8]) -> std::io::Result<usize> {
        // SAFETY: `data` is valid for reads of `data.len()` bytes.
        let written = unsafe { libc::write(self.fd, data.as_ptr().cast(), data.len()) };
        if written < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(written as usize)
    }
}

/// `fd`'s file opened again, write-only and non-blocking, as a description of our own; `None`
/// where that cannot be done (no `/proc`, no reader on a FIFO).
fn reopen_nonblocking(fd: RawFd) -> Option<OwnedFd> {
    let path = std::ffi::CString::new(std::format!("/proc/self/fd/{fd}")).ok()?;
    let flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    // SAFETY: a valid NUL-terminated path; the result is a new descriptor we own.
    let new = unsafe { libc::open(path.as_ptr(), flags) };
    // SAFETY: `new` was just opened and nothing else owns it.
    (new >= 0).then(|| unsafe { OwnedFd::from_raw_fd(new) })
}

/// Stdout or stderr as the services keep it: its [`Output`] under a lock, and a condition
/// variable signalled whenever queued bytes were written or given up.
pub(crate) struct StdStream {
    pub(crate) state: Mutex<Output>,
    changed: Condvar,
}

/// A writer standing for stdout or stderr, with C's error indicator, the staged printf lines
/// and the queue (see the module docs).
pub(crate) struct Output {
    /// "stdout" or "stderr", for the log.
    name: &'static str,
    /// The drainer's thread name.
    thread: std::string::String,
    writer: Writer,
    pub(crate) error: bool,
    /// Staged bytes, written by the next commit (at most [`STAGED_BYTES`] and one line more).
    staged: Vec<u8>,
    /// The commits so far, and which of the last 64 failed: bit `k` is commit `commits - 1 - k`.
    commits: u64,
    failures: u64,
    /// Bytes handed on but not taken by the drainer yet, in order.
    queue: Vec<u8>,
    /// The commits not written whole yet, oldest first: each with the end of its bytes,
    /// counted in `queued`.
    unwritten: VecDeque<(u64, u64)>,
    /// Bytes that went to the queue so far, and of those, the ones written or given up.
    queued: u64,
    written: u64,
    /// Whether a drainer runs.
    draining: bool,
    /// Moves on each time the queue is given up: a drainer of an older one leaves.
    epoch: u64,
    /// `Limits::output_bytes`.
    bound: u64,
    report: Reporting,
    /// The stream, for a commit that starts a drainer.
    me: Weak<StdStream>,
}

impl StdStream {
    /// A stream named `name` ("stdout", "stderr") writing to `writer`, drained (when it has
    /// to be) by a thread named `thread`.
    pub(crate) fn new(
        name: &'static str,
        thread: std::string::String,
        writer: Writer,
        limits: &Limits,
        report: Reporting,
    ) -> Arc<StdStream> {
        Arc::new_cyclic(|me| StdStream {
            state: Mutex::new(Output {
                name,
                thread,
                writer,
                error: false,
                staged: Vec::new(),
                commits: 0,
                failures: 0,
                queue: Vec::new(),
                unwritten: VecDeque::new(),
                queued: 0,
                written: 0,
                draining: false,
                epoch: 0,
                bound: limits.output_bytes,
                report,
                me: me.clone(),
            }),
            changed: Condvar::new(),
        })
    }

    fn wait<'a>(&self, state: MutexGuard<'a, Output>) -> MutexGuard<'a, Output> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// For an I/O thread: waits for room, hands `data` on, waits until it was written. The
    /// bytes written: `data.len()`, or 0 (and C's error indicator) if it failed or was given up.
    pub(crate) fn write_waiting(&self, data: &[u8]) -> usize {
        let mut state = lock(&self.state);
        while !state.has_room() {
            state = self.wait(state);
        }
        let ticket = state.commit(&[data]);
        loop {
            match state.done(ticket) {
                Some(true) => return data.len(),
                Some(false) => return 0,
                None => state = self.wait(state),
            }
        }
    }

    /// Commits what is staged and waits up to `deadline` for the queue to be written; gives
    /// up what is left then (see the module docs). 0, or EOF if anything failed or was given
    /// up.
    pub(crate) fn flush_within(&self, deadline: Instant) -> c_int {
        let start = Instant::now();
        let mut state = lock(&self.state);
        let ticket = state.commit(&[]);
        state = wait_until(&self.changed, state, deadline, |s| s.done(ticket).is_none());
        if state.done(ticket).is_none() {
            state.give_up(start.elapsed());
        }
        self.changed.notify_all();
        match state.done(ticket) {
            Some(true) => 0,
            _ => libc::EOF,
        }
    }

    /// Writes to `writer` from now on, after flushing to the old one within `deadline` (what
    /// was queued for it since is given up: a drainer writes only to the writer it began with).
    pub(crate) fn set_writer(&self, writer: Writer, deadline: Instant) {
        self.flush_within(deadline);
        let mut state = lock(&self.state);
        state.give_up(Duration::ZERO);
        state.writer = writer;
        state.error = false;
    }
}

/// The drainer of `stream`'s queue (see the module docs). It waits for the reader outside
/// the lock, and writes under it (the write does not wait), so that no byte of a queue given
/// up meanwhile is written after all; only a `Blocking` descriptor is written outside it.
fn drain(stream: Arc<StdStream>, fd: Arc<Descriptor>, epoch: u64) {
    let mut batch = Vec::new();
    let mut state = lock(&stream.state);
    loop {
        if state.epoch != epoch {
            return; // Given up before it began.
        }
        if state.queue.is_empty() {
            state.draining = false;
            stream.changed.notify_all();
            return;
        }
        batch.clear();
        core::mem::swap(&mut batch, &mut state.queue);
        let mut at = 0;
        while at < batch.len() {
            let result = if fd.how == How::Blocking {
                drop(state);
                let result = fd.write_blocking(&batch[at..]);
                state = lock(&stream.state);
                result
            } else {
                drop(state);
                fd.wait_writable();
                state = lock(&stream.state);
                if state.epoch != epoch {
                    return; // Given up: not ours to write any more.
                }
                fd.try_write(&batch[at..])
            };
            if state.epoch != epoch {
                return;
            }
            match result {
                Ok(n) => {
                    at += n;
                    state.advance(n as u64, None);
                    stream.changed.notify_all();
                }
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(error) => {
                    let rest = (batch.len() - at) as u64;
                    state.lose(rest, &error);
                    state.advance(rest, Some(()));
                    stream.changed.notify_all();
                    break;
                }
            }
        }
    }
}

impl Output {
    /// Whether bytes may be handed on now: the queue holds less than its bound.
    pub(crate) fn has_room(&self) -> bool {
        self.queued - self.written < self.bound
    }

    /// Appends bytes to the stage with `append` (which may fail, leaving nothing staged) and
    /// returns the commit that will write them.
    pub(crate) fn stage<E>(
        &mut self,
        append: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(Ticket, usize), E> {
        if self.staged.len() >= STAGED_BYTES {
            self.commit(&[]);
        }
        let start = self.staged.len();
        if let Err(error) = append(&mut self.staged) {
            self.staged.truncate(start);
            return Err(error);
        }
        Ok((Ticket(self.commits), self.staged.len() - start))
    }

    /// Whether the bytes staged with `ticket` were written: commits them now if that has not
    /// happened yet; pending while they wait in the queue.
    pub(crate) fn committed(&mut self, ticket: Ticket) -> core::task::Poll<bool> {
        if ticket.0 >= self.commits {
            self.commit(&[]);
        }
        match self.done(ticket) {
            Some(written) => core::task::Poll::Ready(written),
            None => core::task::Poll::Pending,
        }
    }

    /// Whether commit `ticket` was written (`Some(true)`), failed or was given up
    /// (`Some(false)`), or is still to be written (`None`).
    pub(crate) fn done(&self, ticket: Ticket) -> Option<bool> {
        let waiting = self.unwritten.front().is_some_and(|&(c, _)| c <= ticket.0);
        if ticket.0 >= self.commits || waiting {
            return None;
        }
        match self.commits.checked_sub(ticket.0 + 1) {
            Some(age) if age < 64 => Some(self.failures >> age & 1 == 0),
            // Beyond the history (not reached: a stage is redeemed within a pass or two):
            // C's error indicator, set by any failure since.
            _ => Some(!self.error),
        }
    }

    /// `fflush`: hands what is staged on, without waiting for the queue; EOF if that commit
    /// failed at once. Nothing of the caller's can be in the queue: a write or printf is
    /// answered only once its commit was written, so the queue holds only bytes of exchanges
    /// still waiting for their answer, which C's `fflush` of another thread would not wait for
    /// either.
    pub(crate) fn flush(&mut self) -> c_int {
        let ticket = self.commit(&[]);
        match self.done(ticket) {
            Some(false) => libc::EOF,
            _ => 0,
        }
    }

    /// One commit: the staged bytes, then `parts`, written whole (a writer is flushed after).
    /// Records a failure; the staged bytes are gone either way.
    pub(crate) fn commit(&mut self, parts: &[&[u8]]) -> Ticket {
        let ticket = Ticket(self.commits);
        self.commits += 1;
        self.failures <<= 1;
        let staged = core::mem::take(&mut self.staged);
        let total = staged.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let all = core::iter::once(staged.as_slice()).chain(parts.iter().copied());
        let mut queued = false;
        let failed = match &mut self.writer {
            Writer::Inline(writer) => {
                let written = (|| {
                    for part in all.filter(|p| !p.is_empty()) {
                        writer.write_all(part)?;
                    }
                    writer.flush()
                })();
                written.err().map(|error| (error, total))
            }
            Writer::Fd(fd) => {
                let (mut failed, mut sent) = (None, 0);
                let mut short = self.draining;
                for part in all {
                    let mut at = 0;
                    while !short && failed.is_none() && at < part.len() {
                        match fd.try_write(&part[at..]) {
                            Ok(n) => {
                                at += n;
                                sent += n;
                            }
                            Err(error) if error.kind() == ErrorKind::Interrupted => {}
                            Err(error) if error.kind() == ErrorKind::WouldBlock => short = true,
                            Err(error) => failed = Some(error),
                        }
                    }
                    match &failed {
                        Some(_) => break,
                        None if short => {
                            self.queue.extend_from_slice(&part[at..]);
                            self.queued += (part.len() - at) as u64;
                        }
                        None => {}
                    }
                }
                if failed.is_none() && short {
                    self.unwritten.push_back((ticket.0, self.queued));
                    queued = true;
                }
                failed.map(|error| (error, total - sent))
            }
        };
        if queued {
            self.start_drainer();
        }
        // The stage's buffer keeps its room for the next lines.
        self.staged = staged;
        self.staged.clear();
        if let Some((error, lost)) = failed {
            self.lose(lost as u64, &error);
            self.failures |= 1;
        }
        ticket
    }

    /// Starts the drainer unless it runs.
    fn start_drainer(&mut self) {
        if self.draining {
            return;
        }
        let Some(stream) = self.me.upgrade() else {
            return; // Being dropped: `Drop` gives the queue up.
        };
        let Writer::Fd(fd) = &self.writer else {
            return; // Not reached: only a descriptor's commits are queued.
        };
        let (fd, epoch) = (fd.clone(), self.epoch);
        match crate::sync::spawn(self.thread.clone(), move || drain(stream, fd, epoch)) {
            Ok(_detached) => self.draining = true,
            Err(error) => {
                // Nothing will write the queue: give it up now.
                log::error!("device {}: no drainer thread: {error}", self.name);
                self.give_up(Duration::ZERO);
            }
        }
    }

    /// `n` more queued bytes were written (or, with `failed`, dropped): the commits they end
    /// are done (failed with them).
    fn advance(&mut self, n: u64, failed: Option<()>) {
        self.written += n;
        while let Some(&(commit, end)) = self.unwritten.front() {
            if end > self.written {
                break;
            }
            self.unwritten.pop_front();
            if failed.is_some() {
                self.fail(commit);
            }
        }
    }

    /// Records commit `commit` as failed.
    fn fail(&mut self, commit: u64) {
        self.error = true;
        if let Some(age) = (self.commits - 1).checked_sub(commit) {
            if age < 64 {
                self.failures |= 1 << age;
            }
        }
    }

    /// Counts `bytes` lost to `error` and logs it (within the devices' log budget).
    fn lose(&mut self, bytes: u64, error: &std::io::Error) {
        self.error = true;
        self.count_lost(bytes);
        crate::server::limits::device_log!(
            self.report.log_limit,
            Warn,
            "device output lost: {error} ({bytes} bytes of {})",
            self.name
        );
    }

    fn count_lost(&self, bytes: u64) {
        // RMW: a tally (see `server::stats`).
        self.report
            .stats
            .output_lost_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives up the queue: its bytes are counted lost and logged once, its commits fail, and a
    /// drainer of it leaves.
    fn give_up(&mut self, waited: Duration) {
        let lost = self.queued - self.written;
        if lost == 0 {
            return;
        }
        self.queue.clear();
        self.advance(lost, Some(()));
        self.epoch += 1;
        self.draining = false;
        self.count_lost(lost);
        crate::server::limits::device_log!(
            self.report.log_limit,
            Warn,
            "device output lost: {lost} bytes of {} not written after {waited:?} (its reader \
             does not read)",
            self.name
        );
    }
}

impl Drop for Output {
    /// What is staged is handed on, never silently dropped: written if the stream takes it
    /// at once, else counted lost (nothing drains it once the stream is gone).
    fn drop(&mut self) {
        if !self.staged.is_empty() {
            self.commit(&[]);
        }
        self.give_up(Duration::ZERO);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::server::limits::LogLimit;

    /// A writer that records each `write` call, and fails while `fail` is set.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
        fail: Arc<std::sync::Mutex<bool>>,
    }

    impl Write for Recorder {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            if *self.fail.lock().unwrap() {
                return Err(std::io::Error::other("refused"));
            }
            self.writes.lock().unwrap().push(data.to_vec());
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Recorder {
        fn writes(&self) -> Vec<Vec<u8>> {
            self.writes.lock().unwrap().clone()
        }
    }

    fn report() -> Reporting {
        Reporting {
            stats: Arc::default(),
            log_limit: Arc::new(LogLimit::new(20)),
        }
    }

    fn stream(writer: Writer) -> Arc<StdStream> {
        StdStream::new(
            "stdout",
            "drain".into(),
            writer,
            &Limits::default(),
            report(),
        )
    }

    fn stage(output: &mut Output, line: &[u8]) -> Ticket {
        let staged = output.stage(|out| {
            out.extend_from_slice(line);
            Ok::<(), ()>(())
        });
        let (ticket, len) = staged.unwrap();
        assert_eq!(len, line.len());
        ticket
    }

    fn written(output: &mut Output, ticket: Ticket) -> bool {
        match output.committed(ticket) {
            core::task::Poll::Ready(written) => written,
            core::task::Poll::Pending => panic!("an inline writer's commit is never pending"),
        }
    }

    #[test]
    fn staged_lines_go_out_in_one_write_in_order_when_the_first_is_redeemed() {
        let recorder = Recorder::default();
        let stream = stream(Writer::Inline(Box::new(recorder.clone())));
        let mut output = lock(&stream.state);
        let (a, b) = (stage(&mut output, b"a\n"), stage(&mut output, b"b\n"));
        assert!(recorder.writes().is_empty(), "staging writes nothing");
        assert!(written(&mut output, b));
        assert_eq!(recorder.writes(), [b"a\nb\n".to_vec()]);
        assert!(written(&mut output, a), "already written by b's commit");
        assert_eq!(recorder.writes().len(), 1);
        // A failed format stages nothing.
        let failed = output.stage(|out| {
            out.extend_from_slice(b"half");
            Err("missing argument")
        });
        assert_eq!(failed.unwrap_err(), "missing argument");
        // A write commits what is staged first: the stream's order is the order of arrival.
        let c = stage(&mut output, b"c\n");
        let d = output.commit(&[b"d\n"]);
        assert_eq!(output.done(d), Some(true));
        assert!(written(&mut output, c));
        let all: Vec<u8> = recorder.writes().concat();
        assert_eq!(all, b"a\nb\nc\nd\n");
    }

    #[test]
    fn a_failed_commit_fails_exactly_its_own_stages() {
        let recorder = Recorder::default();
        let stream = stream(Writer::Inline(Box::new(recorder.clone())));
        let mut output = lock(&stream.state);
        let early = stage(&mut output, b"early\n");
        assert!(written(&mut output, early));
        *recorder.fail.lock().unwrap() = true;
        let lost = stage(&mut output, b"lost\n");
        assert!(!written(&mut output, lost));
        *recorder.fail.lock().unwrap() = false;
        let late = stage(&mut output, b"late\n");
        assert!(written(&mut output, late));
        // Each ticket keeps its own commit's outcome.
        assert!(written(&mut output, early));
        assert!(!written(&mut output, lost));
        assert_eq!(recorder.writes().concat(), b"early\nlate\n");
        assert!(output.error, "C's error indicator is set by the failure");
    }

    #[test]
    fn staged_lines_survive_a_new_writer_and_a_drop() {
        let (old, new) = (Recorder::default(), Recorder::default());
        let stream = stream(Writer::Inline(Box::new(old.clone())));
        let before = stage(&mut lock(&stream.state), b"to the old writer\n");
        let soon = Instant::now() + Duration::from_secs(1);
        stream.set_writer(Writer::Inline(Box::new(new.clone())), soon);
        assert_eq!(old.writes().concat(), b"to the old writer\n");
        assert!(written(&mut lock(&stream.state), before), "still known");
        stage(&mut lock(&stream.state), b"never redeemed\n");
        drop(stream);
        assert_eq!(new.writes().concat(), b"never redeemed\n");
    }

    /// A pipe nobody reads: commits beyond its buffer wait in the queue, in order, each
    /// pending until the reader takes it; a flush gives up what is left at its deadline and
    /// counts it.
    #[test]
    fn a_full_pipe_queues_in_order_and_a_flush_gives_up_at_its_deadline() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let report = report();
        let fd = Descriptor::owned(writer.into());
        assert_eq!(fd.how, How::NonBlocking);
        let stream = StdStream::new(
            "stdout",
            "drain".into(),
            Writer::Fd(Arc::new(fd)),
            &Limits::default(),
            report.clone(),
        );
        let line = |k: u32| std::format!("{k:07}\n").into_bytes();
        // 4 MiB in lines of 8 bytes: far beyond a pipe's 64 KiB.
        let tickets: Vec<Ticket> = (0..(1 << 19))
            .map(|k| lock(&stream.state).commit(&[&line(k)]))
            .collect();
        let last = *tickets.last().unwrap();
        assert_eq!(lock(&stream.state).done(last), None, "queued, not written");
        assert!(!lock(&stream.state).has_room());
        // The reader takes half, in order; then nobody reads.
        let mut got = std::vec![0u8; 2 << 20];
        std::io::Read::read_exact(&mut reader, &mut got).unwrap();
        for (k, chunk) in got.chunks(8).enumerate() {
            assert_eq!(chunk, line(k as u32));
        }
        assert_eq!(stream.flush_within(Instant::now()), libc::EOF);
        assert_eq!(lock(&stream.state).done(last), Some(false), "given up");
        let lost = report.stats.output_lost_bytes.load(Ordering::Relaxed);
        assert!(lost > 0 && lost <= 2 << 20, "{lost}");
    }
}
