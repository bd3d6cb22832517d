//! stdio and file opcodes (PROTOCOL section 6, numbers 2-9, 14-20, 27, 28). Scripts and
//! refusals are listed in the module documentation of [`super`].

use std::ffi::{c_int, CString};
use std::string::String;
use std::vec::Vec;

use core::task::Poll;

use super::files::{self, Denial, Rules};
use super::output::StdStream;
use super::streams::{OpenError, Target};
use super::MailboxState;
use super::{
    active, c_result, io, per_lane, read_charge, recv_words, send_word0, until_nul, LaneWords,
    Refusals, Services, Touches, EOF_WORD, OVER_BUDGET,
};
use crate::server::error::{Outcome, ServerError};
use crate::server::exec::Received;
use crate::server::limits::{quoted, Charge};
use crate::server::request::Request;
use crate::sync::lock;

/// Writes each lane's bytes to its target; replies the bytes written. Lanes to stdout and
/// stderr are handed to their streams here, in lane order, each waiting suspended while its
/// stream is full and until its bytes were written (never for a reader on the server
/// thread); lanes to files are written on an I/O thread.
async fn write_lanes(
    req: &mut Request,
    data: Received,
    target: impl Fn(u32) -> Option<Target>,
    newline: bool,
    refusals: &mut Refusals,
) -> Result<(), ServerError> {
    let mut replies = per_lane(req, 0u64);
    let mut writes = Vec::new();
    let context = super::context(req);
    for lane in active(req) {
        let bytes = &data[lane as usize][..];
        let line: &[&[u8]] = if newline { &[bytes, b"\n"] } else { &[bytes] };
        match target(lane) {
            _ if data.refused() => refusals.lane(lane, OVER_BUDGET),
            Some(target) => match context.services().std_stream(&target) {
                Some(stream) => {
                    if write_std_stream(stream, line).await {
                        replies[lane as usize] = line.iter().map(|p| p.len() as u64).sum();
                    }
                }
                None => writes.push((lane, target)),
            },
            None => refusals.lane(lane, "not a live stream handle"),
        }
    }
    if !writes.is_empty() {
        let touches = Touches::streams(writes.iter().map(|(_, t)| t));
        let written = io(req, touches, move |context| {
            writes
                .into_iter()
                .map(|(lane, target)| {
                    let bytes = &data[lane as usize];
                    let written = if newline {
                        let mut line = Vec::with_capacity(bytes.len() + 1);
                        line.extend_from_slice(bytes);
                        line.push(b'\n');
                        context.services().write(&target, &line)
                    } else {
                        context.services().write(&target, bytes)
                    };
                    (lane, written as u64)
                })
                .collect::<Vec<_>>()
        })
        .await?;
        for (lane, written) in written {
            replies[lane as usize] = written;
        }
    }
    send_word0(req, &replies).await
}

/// Hands `parts` to a standard stream as one commit once it has room, then waits until they
/// were written: whether they were. Suspended, not blocked, while it waits.
async fn write_std_stream(stream: &StdStream, parts: &[&[u8]]) -> bool {
    let ticket = core::future::poll_fn(|_| {
        let mut output = lock(&stream.state);
        match output.has_room() {
            true => Poll::Ready(output.commit(parts)),
            false => Poll::Pending,
        }
    })
    .await;
    core::future::poll_fn(|_| match lock(&stream.state).done(ticket) {
        Some(written) => Poll::Ready(written),
        None => Poll::Pending,
    })
    .await
}

async fn write_std(
    mut req: Request,
    target: fn() -> Target,
    newline: bool,
) -> Result<Outcome, ServerError> {
    let data = req.recv_n().await?;
    let mut refusals = Refusals::default();
    write_lanes(&mut req, data, |_| Some(target()), newline, &mut refusals).await?;
    refusals.finish()
}

/// WRITE_TO_STDOUT: C send_n(bytes); S send buf\[0\] = written.
pub(crate) async fn write_to_stdout(req: Request) -> Result<Outcome, ServerError> {
    write_std(req, || Target::Stdout, false).await
}

/// WRITE_TO_STDERR: as WRITE_TO_STDOUT, to stderr.
pub(crate) async fn write_to_stderr(req: Request) -> Result<Outcome, ServerError> {
    write_std(req, || Target::Stderr, false).await
}

/// WRITE_TO_STDOUT_NEWLINE: as WRITE_TO_STDOUT, then `\n` (in the same write), counted.
pub(crate) async fn write_to_stdout_newline(req: Request) -> Result<Outcome, ServerError> {
    write_std(req, || Target::Stdout, true).await
}

/// WRITE_TO_STREAM: C send buf\[0\] = raw handle; C send_n(bytes); S send buf\[0\] = written.
pub(crate) async fn write_to_stream(mut req: Request) -> Result<Outcome, ServerError> {
    let handles = recv_words(&mut req).await?;
    let data = req.recv_n().await?;
    let context = super::context(&req);
    let mailbox = super::mailbox_state(&req);
    let mut refusals = Refusals::default();
    write_lanes(
        &mut req,
        data,
        |lane| context.services().raw(&mailbox, handles[lane as usize][0]),
        false,
        &mut refusals,
    )
    .await?;
    refusals.finish()
}

/// What is left of a request's read budget (`Limits::read_bytes`) for a lane asking `want`
/// bytes: the lane gets at most that, the rest of its read is a short count.
fn take_budget(budget: &mut u64, want: u64) -> usize {
    let take = want.min(*budget);
    *budget -= take;
    take as usize // At most `read_bytes`, which is far below usize::MAX on a 64-bit host.
}

/// The first half of READ_FROM_STREAM and READ_FGETS: C send {buf\[0\] = want, buf\[1\] =
/// tagged}. A lane with a live stream reads at most `clamp(want)` bytes of it, within what is
/// left of the request's read budget (`Limits::read_bytes`), by `read` on an I/O thread; a
/// lane without one is refused. Returns each lane's bytes (none for a refused lane) and the
/// budget's charge, to be held until the reply is sent.
async fn read_lanes(
    req: &mut Request,
    clamp: fn(u64) -> u64,
    read: fn(&Services, &Target, usize) -> Vec<u8>,
    refusals: &mut Refusals,
) -> Result<(Vec<Vec<u8>>, Charge), ServerError> {
    let words = recv_words(req).await?;
    let context = super::context(req);
    let mailbox = super::mailbox_state(req);
    let charge = read_charge(req, |lane| clamp(words[lane as usize][0]));
    let mut budget = charge.bytes();
    let mut reads = Vec::new();
    for lane in active(req) {
        let [want, handle, ..] = words[lane as usize];
        match context.services().tagged(&mailbox, handle) {
            Some(target) => reads.push((lane, target, take_budget(&mut budget, clamp(want)))),
            None => refusals.lane(lane, "not a live stream handle"),
        }
    }
    let touches = Touches::streams(reads.iter().map(|(_, t, _)| t));
    let data = io(req, touches, move |context| {
        let mut data: Vec<Vec<u8>> = (0..64).map(|_| Vec::new()).collect();
        for (lane, target, max) in reads {
            data[lane as usize] = read(context.services(), &target, max);
        }
        data
    })
    .await?;
    Ok((data, charge))
}

/// READ_FROM_STREAM: C send {buf\[0\] = max, buf\[1\] = tagged}; S send_n(data);
/// S send buf\[0\] = bytes read. The lanes together read at most `Limits::read_bytes` (a short
/// count beyond, as a read of a pipe may return).
pub(crate) async fn read_from_stream(mut req: Request) -> Result<Outcome, ServerError> {
    let mut refusals = Refusals::default();
    let (data, _charge) = read_lanes(&mut req, |max| max, Services::read, &mut refusals).await?;
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    req.send_n(&slices).await?;
    let mut replies = per_lane(&req, 0u64);
    for lane in active(&req) {
        replies[lane as usize] = data[lane as usize].len() as u64;
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// READ_FGETS: C send {buf\[0\] = count, buf\[1\] = tagged}; S send_n(line incl. NUL, or 0
/// bytes at the end or on an error). The lanes' counts together are bounded by
/// `Limits::read_bytes` (a longer line comes in parts, as with a smaller count).
pub(crate) async fn read_fgets(mut req: Request) -> Result<Outcome, ServerError> {
    let mut refusals = Refusals::default();
    let (lines, _charge) = read_lanes(
        &mut req,
        |count| count.min(c_int::MAX as u64),
        |services, target, count| services.gets(target, count).unwrap_or_default(),
        &mut refusals,
    )
    .await?;
    let slices: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
    req.send_n(&slices).await?;
    refusals.finish()
}

/// A mode fopen may get: `r`, `w` or `a`, then only `+`, `b`, `x`, `e` (no glibc extensions
/// such as `,ccs=`), at most 8 bytes.
fn valid_mode(mode: &[u8]) -> bool {
    matches!(mode.first(), Some(b'r' | b'w' | b'a'))
        && mode.len() <= 8
        && mode[1..].iter().all(|b| b"+bxe".contains(b))
}

/// OPEN_FILE: C send_n(path incl. NUL); C send(mode incl. NUL in the buffer);
/// S send buf\[0\] = handle or 0. The file policy's checks and the open run on an I/O thread
/// (a slow file system may block; a FIFO does not, it is refused at once).
pub(crate) async fn open_file(mut req: Request) -> Result<Outcome, ServerError> {
    let paths = req.recv_n().await?;
    let mut modes = per_lane(&req, [0u8; 64]);
    req.recv(|lane, p| p.read_bytes(0, &mut modes[lane as usize]))
        .await?;
    let mut refusals = Refusals::default();
    let mut opens = Vec::new();
    for lane in active(&req) {
        let mode = until_nul(&modes[lane as usize]);
        if paths.refused() {
            refusals.lane(lane, OVER_BUDGET);
            continue;
        }
        if !valid_mode(mode) {
            refusals.lane(lane, std::format!("bad fopen mode {}", quoted(mode)));
            continue;
        }
        opens.push((
            lane,
            CString::new(until_nul(&paths[lane as usize])).unwrap_or_default(),
            CString::new(mode).unwrap_or_default(),
        ));
    }
    let mailbox = super::mailbox_state(&req);
    let opened = io(&req, !opens.is_empty(), move |context| {
        let services = &context.services();
        opens
            .into_iter()
            .map(|(lane, c_path, c_mode)| {
                match services.open(&mailbox, &c_path, &c_mode) {
                    Ok(handle) => Ok(handle),
                    // A failed open is an ordinary C result; the policy and the table limit
                    // are refusals.
                    Err(OpenError::Failed) => Ok(0),
                    Err(OpenError::Detached) => {
                        log::debug!("mailbox {}: detached, file not kept", mailbox.id.0);
                        Ok(0)
                    }
                    Err(OpenError::Refused(why)) => Err(why),
                    Err(OpenError::TooMany) => Err(std::format!(
                        "the mailbox has {} files open, its limit",
                        context.config.limits.open_files
                    )),
                }
                .map(|handle| (lane, handle))
                .map_err(|why: String| (lane, why))
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let mut replies = per_lane(&req, 0u64);
    for result in opened {
        match result {
            Ok((lane, handle)) => replies[lane as usize] = handle,
            Err((lane, why)) => refusals.lane(lane, why),
        }
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// A stream opcode's operation on one lane's stream: the services, the request's mailbox,
/// the stream, the lane's words; the reply word.
type StreamOp = fn(&Services, &MailboxState, &Target, &[u64; 8]) -> u64;

/// Each active lane's stream: the handle in its word `at`, found by `handle` (tagged or raw)
/// among `mailbox`'s streams; a lane whose handle is not a live one is refused.
fn lane_streams(
    req: &Request,
    mailbox: &MailboxState,
    words: &LaneWords,
    at: usize,
    handle: fn(&Services, &MailboxState, u64) -> Option<Target>,
    refusals: &mut Refusals,
) -> Vec<(u32, Target)> {
    let context = super::context(req);
    let mut targets = Vec::new();
    for lane in active(req) {
        let word = words[lane as usize][at];
        match handle(context.services(), mailbox, word) {
            Some(target) => targets.push((lane, target)),
            None => refusals.lane(lane, std::format!("{word:#x} is not a live stream handle")),
        }
    }
    targets
}

/// The pattern of every stream opcode but the reads and writes: C send {words}; S send
/// buf\[0\] = `op(..)` per lane, or `bad` where buf\[`at`\] is not a live stream handle of the
/// request's mailbox (`handle` finds it: tagged or raw). `op` runs on an I/O thread if any
/// lane's stream is a file or stdin.
async fn on_stream(
    mut req: Request,
    at: usize,
    bad: u64,
    handle: fn(&Services, &MailboxState, u64) -> Option<Target>,
    op: StreamOp,
) -> Result<Outcome, ServerError> {
    let words = recv_words(&mut req).await?;
    let mailbox = super::mailbox_state(&req);
    let mut refusals = Refusals::default();
    let targets = lane_streams(&req, &mailbox, &words, at, handle, &mut refusals);
    let touches = Touches::streams(targets.iter().map(|(_, t)| t));
    let results = io(&req, touches, move |context| {
        targets
            .into_iter()
            .map(|(lane, target)| {
                let reply = op(context.services(), &mailbox, &target, &words[lane as usize]);
                (lane, reply)
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let mut replies = per_lane(&req, bad);
    for (lane, result) in results {
        replies[lane as usize] = result;
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

/// FEOF: C send buf\[0\] = tagged; S send buf\[0\] = feof (1 for a bad handle).
pub(crate) async fn feof(req: Request) -> Result<Outcome, ServerError> {
    on_stream(req, 0, 1, Services::tagged, |s, _, t, _| {
        c_result(s.eof(t).into())
    })
    .await
}

/// FERROR: C send buf\[0\] = tagged; S send buf\[0\] = ferror (1 for a bad handle).
pub(crate) async fn ferror(req: Request) -> Result<Outcome, ServerError> {
    on_stream(req, 0, 1, Services::tagged, |s, _, t, _| {
        c_result(s.error(t).into())
    })
    .await
}

/// FTELL: C send buf\[0\] = tagged; S send buf\[0\] = ftell as i64 (-1 for a bad handle).
pub(crate) async fn ftell(req: Request) -> Result<Outcome, ServerError> {
    on_stream(req, 0, c_result(-1), Services::tagged, |s, _, t, _| {
        c_result(s.tell(t))
    })
    .await
}

/// FSEEK: C send {tagged, offset, whence}; S send buf\[0\] = 0 or -1.
pub(crate) async fn fseek(req: Request) -> Result<Outcome, ServerError> {
    on_stream(req, 0, c_result(-1), Services::tagged, |s, _, t, w| {
        c_result(s.seek(t, w[1] as i64, w[2]).into())
    })
    .await
}

/// UNGETC: C send {buf\[0\] = c, buf\[1\] = tagged}; S send buf\[0\] = c or EOF.
pub(crate) async fn ungetc(req: Request) -> Result<Outcome, ServerError> {
    on_stream(req, 1, EOF_WORD, Services::tagged, |s, _, t, w| {
        c_result(s.ungetc(t, w[0] as u32 as c_int).into())
    })
    .await
}

/// CLEARERR: C send buf\[0\] = tagged; S clears; S sends the buffer back unchanged. Clearing
/// stdin's or a file's indicators takes that stream's lock, which a read may hold while it
/// blocks: so it runs on an I/O thread, as every other stdin and file opcode does.
pub(crate) async fn clearerr(mut req: Request) -> Result<Outcome, ServerError> {
    let words = recv_words(&mut req).await?;
    let mailbox = super::mailbox_state(&req);
    let mut refusals = Refusals::default();
    let targets = lane_streams(&req, &mailbox, &words, 0, Services::tagged, &mut refusals);
    let touches = Touches::streams(targets.iter().map(|(_, t)| t));
    io(&req, touches, move |context| {
        for (_, target) in &targets {
            context.services().clear_error(target);
        }
    })
    .await?;
    req.send(|_, _| {}).await?;
    refusals.finish()
}

/// CLOSE_FILE: C send buf\[0\] = raw handle; S send buf\[0\] = 0 or EOF. The standard
/// streams cannot be closed.
pub(crate) async fn close_file(req: Request) -> Result<Outcome, ServerError> {
    let file =
        |services: &Services, mailbox: &MailboxState, handle| match services.raw(mailbox, handle) {
            Some(target @ Target::File(_)) => Some(target),
            _ => None,
        };
    on_stream(req, 0, EOF_WORD, file, |s, mailbox, _, w| {
        s.close(mailbox, w[0])
            .map_or(EOF_WORD, |result| c_result(result.into()))
    })
    .await
}

/// FFLUSH: C send buf\[0\] = tagged; S send buf\[0\] = 0 or EOF. Handle 0 (`fflush(NULL)`)
/// flushes every standard output and open file, as C does.
pub(crate) async fn fflush(req: Request) -> Result<Outcome, ServerError> {
    // Handle 0 stands for "every stream": stdin's target marks it (flushing stdin is a no-op).
    let every = |services: &Services, mailbox: &MailboxState, handle| match handle {
        0 => Some(Target::Stdin),
        _ => services.tagged(mailbox, handle),
    };
    on_stream(req, 0, EOF_WORD, every, |s, mailbox, t, w| {
        let result = if w[0] == 0 {
            s.flush_all(mailbox)
        } else {
            s.flush(t)
        };
        c_result(result.into())
    })
    .await
}

/// REMOVE: C send_n(path); S send buf\[0\] = 0 or -1.
pub(crate) async fn remove(mut req: Request) -> Result<Outcome, ServerError> {
    let paths = req.recv_n().await?;
    on_paths(req, std::vec![paths], |rules, p| files::remove(rules, p[0])).await
}

/// RENAME: C send_n(old); C send_n(new); S send buf\[0\] = 0 or -1.
pub(crate) async fn rename(mut req: Request) -> Result<Outcome, ServerError> {
    let old = req.recv_n().await?;
    let new = req.recv_n().await?;
    on_paths(req, std::vec![old, new], |rules, p| {
        files::rename(rules, p[0], p[1])
    })
    .await
}

/// The pattern of REMOVE and RENAME: on an I/O thread, `call` gets each active lane's paths
/// (one per `recv_n` of `received`, each up to its first NUL) and the file rules; each lane's
/// reply is 0 on success, -1 on a failure (an ordinary C result) or a refusal.
async fn on_paths(
    req: Request,
    received: Vec<Received>,
    call: fn(&Rules, &[&[u8]]) -> core::result::Result<(), Denial>,
) -> Result<Outcome, ServerError> {
    let lanes: Vec<u32> = active(&req).collect();
    let opcode = req.opcode();
    let results = io(&req, true, move |context| {
        let rules = context.services().file_rules();
        lanes
            .into_iter()
            .map(|lane| {
                if received.iter().any(|strings| strings.refused()) {
                    return Err((lane, OVER_BUDGET.into()));
                }
                let paths: Vec<&[u8]> = received
                    .iter()
                    .map(|strings| until_nul(&strings[lane as usize]))
                    .collect();
                match call(&rules, &paths) {
                    Ok(()) => Ok((lane, 0)),
                    Err(Denial::Failed(error)) => {
                        log::debug!("{opcode} lane {lane}: {error}");
                        Ok((lane, -1))
                    }
                    Err(Denial::Refused(why)) => Err((lane, why)),
                }
            })
            .collect::<Vec<_>>()
    })
    .await?;
    reply_calls(req, results).await
}

/// Replies each lane's C result (-1 for a lane the policy refused).
async fn reply_calls(
    mut req: Request,
    results: Vec<core::result::Result<(u32, c_int), (u32, String)>>,
) -> Result<Outcome, ServerError> {
    let mut refusals = Refusals::default();
    let mut replies = per_lane(&req, c_result(-1));
    for result in results {
        match result {
            Ok((lane, value)) => replies[lane as usize] = c_result(value.into()),
            Err((lane, why)) => refusals.lane(lane, why),
        }
    }
    send_word0(&mut req, &replies).await?;
    refusals.finish()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        for good in [&b"r"[..], b"w", b"a+", b"rb", b"wbx", b"r+e"] {
            assert!(valid_mode(good), "{good:?}");
        }
        for bad in [&b""[..], b"x", b"q", b"r,ccs=UTF-8", b"rrrrrrrrr", b"rm"] {
            assert!(!valid_mode(bad), "{bad:?}");
        }
    }
}
