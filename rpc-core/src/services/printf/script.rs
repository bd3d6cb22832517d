//! The printf exchange (PROTOCOL section 7, the steps in [`super`]), every lane on its own.
//!
//! Short lines to stdout or stderr are *staged* (see `output::Output`): the exchange stages
//! its lanes' lines, yields (`Request::yield_unless_alone`: not when no other exchange is in
//! flight) so that the pass serves the other ports, and when polled again commits every line
//! staged meanwhile, its own and other exchanges', in one write, unless one of those did
//! already; then it replies. So the lines of a pass go out in one write (a group commit: one
//! syscall for a pass's lines, not one per request), in the order they were formatted, each
//! printf still returns only once its line was written, and a printf to stdout is written
//! before a later one of the same thread to stderr. Lanes of one request that print to stdout
//! and stderr (PRINTF_TO_STREAM) are written stream by stream, not interleaved in lane order
//! (C orders no two streams either).
//!
//! A lane gets -1 and no output for a bad handle, an argument buffer shorter than the format
//! needs, or `%s` strings above `Limits::printf_string_bytes` (the request's lanes together);
//! the script completes in those cases. A format, an argument buffer or a string above the
//! byte string limits ends the exchange at once (see `services`).
//!
//! Output that may be long (above [`CHUNK`], by [`Format::output_bound`]) or goes to a file is
//! formatted and written on an I/O thread, so that the server thread never spends long on one
//! request.
//!
//! # Lanes
//! The active lanes of one printf request: each one's state ([`Lane`]), what
//! they sent ([`Sent`]: their arguments, and their `%s` strings, found through [`Fetched`]),
//! and, last, their lines written: short ones to stdout or stderr staged for the pass's group
//! commit ([`write_staged`]), the others formatted and written on an I/O thread
//! ([`write_on_io`]).

use super::format::{Format, Kept, Sink, CHUNK};
use std::format;

use crate::protocol::opcode::Opcode;
use crate::protocol::Dialect;
use crate::server::error::{Outcome, ServerError};
use crate::server::exec::{PooledVec, Received};
use crate::server::limits::quoted;
use crate::server::registry::Request;
use crate::services::output::{Output, Ticket};
use crate::services::streams::Target;
use crate::services::Services;
use crate::services::{
    active, c_result, mailbox_state, recv_words, until_nul, Refusals, Touches, OVER_BUDGET,
};
use crate::sync::{lock, Mutex, MutexGuard};
use core::ops::Range;
use core::task::Poll;
use std::string::{String, ToString};
use std::vec::Vec;

/// Room for the rounds of `%s` strings of a format of up to 4 `%s`, kept without growing.
const ROUNDS: usize = 4;

/// Serves every PRINTF_TO_* opcode. A request's vectors are few whatever its lanes (printf is
/// the busiest opcode there is), each sized once and taken from the thread's pool
/// (`PooledVec`), not the allocator: the active lanes' states (a warp's single printing thread
/// costs one, not 32), the formats compiled (one per call site, each its own few vectors, or
/// copies of a kept one: `Kept`), and with `%s` the pointers of all the lanes, the rounds
/// that fetched them and [`Fetched`]. The work per lane is what differs between lanes: what a
/// format implies (its argument size, its pointers' offsets, its plan if plain) is found once
/// per format.
pub(crate) async fn printf(mut req: Request) -> Result<Outcome, ServerError> {
    let opcode = req.opcode();
    let packed = matches!(
        opcode,
        Opcode::PRINTF_TO_STDOUT_PACKED
            | Opcode::PRINTF_TO_STDERR_PACKED
            | Opcode::PRINTF_TO_STREAM_PACKED
    );
    // The server's state is borrowed from `req` where it is used, not held as a clone of its
    // `Arc`: a reference count is a locked instruction, and each one waits for the stores
    // before it (see `protocol::deferred`).
    let string_limit = req.context().config.limits.printf_string_bytes;
    let dialect = req.printf_dialect();
    let mut refusals = Refusals::default();

    // 1. The stream of each lane.
    let stream = matches!(
        opcode,
        Opcode::PRINTF_TO_STREAM | Opcode::PRINTF_TO_STREAM_PACKED
    );
    // With the mailbox's streams, taken only here (a reference count).
    let handles = if stream {
        Some((recv_words(&mut req).await?, mailbox_state(&req)))
    } else {
        None
    };

    // 2, 3. The formats, and the argument sizes they need.
    let texts = req.recv_n().await?;
    let services = req.context().services();
    let target = |lane: u32| -> Option<Target> {
        match (&handles, opcode) {
            (Some((words, mailbox)), _) => services.raw(mailbox, words[lane as usize][0]),
            (None, Opcode::PRINTF_TO_STDERR | Opcode::PRINTF_TO_STDERR_PACKED) => {
                Some(Target::Stderr)
            }
            (None, _) => Some(Target::Stdout),
        }
    };
    // Capacities in powers of two: few sizes of block for the thread's pool to keep.
    let active_lanes = req.mask().count_ones() as usize;
    let mut lanes: PooledVec<Lane> = PooledVec::with_capacity(active_lanes.next_power_of_two());
    // Each state a copy of one made once, then given its lane: built one by one (`Lane::new`
    // per lane), each was written on the stack field by field and then copied into the
    // vector in wider moves, which waited for those writes (a failed store forwarding) twice
    // a lane: some 300 ns a warp.
    lanes.resize(active_lanes, Lane::new(0));
    for (state, lane) in lanes.iter_mut().zip(active(&req)) {
        state.lane = lane;
    }
    // Each format with the first lane that sent it. Most requests print one: room for one,
    // grown for more.
    let mut formats: PooledVec<(usize, Format)> = PooledVec::with_capacity(1);
    for state in &mut lanes {
        let (lane, i) = (state.lane, state.lane as usize);
        if texts.refused() {
            refusals.lane(lane, OVER_BUDGET);
            continue;
        }
        let Some(target) = target(lane) else {
            let handle = handles.as_ref().map_or(0, |(w, _)| w[i][0]);
            refusals.lane(lane, format!("{handle:#x} is not a live stream handle"));
            continue;
        };
        // A lane mostly sends the format of the lane before it.
        if !matches!(formats.last(), Some(&(first, _)) if texts[first] == texts[i]) {
            formats.push((i, Kept::format(dialect, &texts[i], packed)));
        }
        state.format = Some((formats.len() - 1, target));
    }
    req.send(|lane, p| {
        let size = at(&lanes, lane)
            .and_then(|state| state.format.as_ref())
            .map_or(0, |&(format, _)| formats[format].1.args_size());
        p.set_word(0, size as u64)
    })
    .await?;

    // 4. The arguments, and the strings they point to.
    let args = req.recv_n().await?;
    // Room for every lane's `%s` pointers: one block of the pool, never grown.
    let most: usize = lanes
        .iter()
        .filter_map(|state| Some(formats[state.format.as_ref()?.0].1.string_count()))
        .sum();
    let mut pointers = PooledVec::with_capacity(most.next_power_of_two());
    for state in &mut lanes {
        let (lane, i) = (state.lane, state.lane as usize);
        let Some((format, _)) = state.format else {
            continue;
        };
        if args.refused() {
            refusals.lane(lane, OVER_BUDGET);
            state.refuse();
            continue;
        }
        let first = pointers.len();
        if let Err(why) = formats[format].1.string_pointers(&args[i], &mut pointers) {
            let text = quoted(until_nul(&texts[i]));
            refusals.lane(lane, format!("{why} for {text}"));
            state.refuse();
            continue;
        }
        state.pending = first..pointers.len();
    }

    // 5. Fetch the strings, last-first, each pointer once per lane, within the request's
    // budget. Each round's strings stay in the buffers it was received in (reused by later
    // requests once dropped); `fetched` finds a lane's string by its pointer: the round that
    // brought it. (It was a B-tree map: at L=32 its 32 inserts and their nodes showed in the
    // profile; one sorted vector is built at once.)
    let mut rounds: PooledVec<Received> = PooledVec::with_capacity(ROUNDS);
    let mut fetched = Fetched::with_capacity(pointers.len());
    for state in &mut lanes {
        state.strings = fetched.add(pointers[state.pending.clone()].iter().copied());
    }
    let mut budget = string_limit;
    loop {
        let mut asking = false;
        for state in &mut lanes {
            state.asked = 0;
            while let Some(k) = state.pending.next_back() {
                if fetched.round(&state.strings, pointers[k]).is_none() {
                    state.asked = pointers[k];
                    asking = true;
                    break;
                }
            }
        }
        if !asking {
            break;
        }
        req.send(|lane, p| {
            p.set_word(0, 0);
            p.set_word(1, at(&lanes, lane).map_or(0, |state| state.asked));
        })
        .await?;
        let strings = req.recv_n().await?;
        for state in &mut lanes {
            let (lane, i) = (state.lane, state.lane as usize);
            if state.asked == 0 || state.format.is_none() {
                continue;
            }
            let len = strings[i].len();
            if strings.refused() {
                refusals.lane(lane, OVER_BUDGET);
                state.refuse();
                continue;
            }
            if len as u64 > budget {
                refusals.lane(
                    lane,
                    format!("its %s strings go above the request's limit of {string_limit} bytes"),
                );
                state.refuse();
                continue;
            }
            budget -= len as u64;
            state.fetched += len;
            fetched.set(&state.strings, state.asked, rounds.len());
        }
        rounds.push(strings);
    }

    // 6. Format and print in pieces, here or (if any lane prints to a file or may print
    // much) on an I/O thread; reply.
    let mut long = false;
    for state in &lanes {
        if let Some((format, _)) = state.format {
            long |= formats[format]
                .1
                .output_bound()
                .saturating_add(state.fetched)
                > CHUNK;
        }
    }
    let mut touches =
        Touches::streams(lanes.iter().filter_map(|s| s.format.as_ref().map(|p| &p.1)));
    touches.blocks |= long;
    let sent = Sent {
        args,
        fetched,
        rounds,
    };
    if touches.inline() {
        write_staged(&req, &mut lanes, &formats, &sent, &mut refusals).await;
    } else {
        // The compiled formats borrow `texts`, which the call takes: compiled again there.
        drop(formats);
        let how = (dialect, packed);
        write_on_io(&req, touches, &mut lanes, texts, sent, how, &mut refusals).await?;
    }
    req.send(|lane, p| {
        p.set_word(
            0,
            at(&lanes, lane).map_or(c_result(-1), |state| state.result),
        );
        p.set_word(1, 0);
    })
    .await?;
    refusals.finish()
}

/// One active lane of a printf request.
#[derive(Clone)]
pub(super) struct Lane {
    /// Its index in the warp.
    pub(super) lane: u32,
    /// Its format (a position in the request's formats) and the stream it prints to; `None`
    /// once the lane is refused (it answers -1).
    pub(super) format: Option<(usize, Target)>,
    /// Its non-null `%s` pointers not fetched yet (indices into the request's list of
    /// pointers, popped last-first), and the one asked for now.
    pub(super) pending: Range<usize>,
    pub(super) asked: u64,
    /// Its entries in the request's [`Fetched`].
    pub(super) strings: Range<usize>,
    /// Bytes of its `%s` strings fetched.
    pub(super) fetched: usize,
    /// The commit that writes the lane's staged line, and its length.
    staged: Option<(Ticket, usize)>,
    /// The reply: bytes written, or -1.
    pub(super) result: u64,
}

impl Lane {
    pub(super) fn new(lane: u32) -> Self {
        Lane {
            lane,
            format: None,
            pending: 0..0,
            asked: 0,
            strings: 0..0,
            fetched: 0,
            staged: None,
            result: c_result(-1),
        }
    }

    /// Refuses the lane: it answers -1 and asks for no more strings.
    pub(super) fn refuse(&mut self) {
        self.format = None;
        self.pending = 0..0;
        self.asked = 0;
    }
}

/// The state of `lane` among the active `lanes` (in lane order).
pub(super) fn at(lanes: &[Lane], lane: u32) -> Option<&Lane> {
    // Where every lane up to it is active (a full warp), a lane's state is at its own index.
    if let Some(state) = lanes.get(lane as usize).filter(|state| state.lane == lane) {
        return Some(state);
    }
    let position = lanes.binary_search_by_key(&lane, |state| state.lane).ok()?;
    lanes.get(position)
}

/// Which round of a request fetched each lane's string at each of its `%s` pointers: per lane
/// (its `strings`), its distinct pointers sorted, so a lookup is a binary search among the
/// lane's own few entries however many `%s` a format carries (a device may send thousands).
/// One vector for the request, and none without `%s`.
pub(super) struct Fetched(PooledVec<(u64, Option<usize>)>);

impl Fetched {
    /// Room for `pointers` entries, none fetched yet.
    pub(super) fn with_capacity(pointers: usize) -> Self {
        Fetched(PooledVec::with_capacity(pointers.next_power_of_two()))
    }

    /// Adds the entries of a lane's `pointers`: each once (a pointer printed twice is fetched
    /// once); returns the lane's `strings`.
    pub(super) fn add(&mut self, pointers: impl Iterator<Item = u64>) -> Range<usize> {
        let all = &mut self.0;
        let start = all.len();
        all.extend(pointers.map(|pointer| (pointer, None)));
        // A lane of one `%s` (most) skips this: reading back the entry just written, to move
        // it onto itself, waited for its writes to leave the store buffer.
        if all.len() - start > 1 {
            all[start..].sort_unstable_by_key(|&(pointer, _)| pointer);
            let mut kept = start + 1;
            for k in start + 1..all.len() {
                if all[kept - 1].0 != all[k].0 {
                    all[kept] = all[k];
                    kept += 1;
                }
            }
            all.truncate(kept);
        }
        start..all.len()
    }

    /// Where among a lane's entries (`strings`) `pointer` is.
    fn find(&self, strings: &Range<usize>, pointer: u64) -> Option<usize> {
        let mine = self.0.get(strings.clone())?;
        let k = mine.binary_search_by_key(&pointer, |&(p, _)| p).ok()?;
        Some(strings.start + k)
    }

    /// The round that brought the string at `pointer` of the lane with entries `strings`.
    pub(super) fn round(&self, strings: &Range<usize>, pointer: u64) -> Option<usize> {
        self.0[self.find(strings, pointer)?].1
    }

    /// Notes that round `round` brought the string at `pointer` of the lane with `strings`.
    pub(super) fn set(&mut self, strings: &Range<usize>, pointer: u64, round: usize) {
        if let Some(k) = self.find(strings, pointer) {
            self.0[k].1 = Some(round);
        }
    }
}

/// What the lanes of a request sent besides their formats: their argument buffers, and the
/// rounds of `%s` strings (each round's strings in the buffers it was received in), with
/// which round brought each lane's string at each of its pointers.
pub(super) struct Sent {
    pub(super) args: Received,
    pub(super) fetched: Fetched,
    pub(super) rounds: PooledVec<Received>,
}

impl Sent {
    /// The string lane `i` (its index in the warp; its entries in `fetched` are `strings`)
    /// sent for `pointer`, if it was fetched.
    fn string(&self, i: usize, strings: &Range<usize>, pointer: u64) -> Option<&[u8]> {
        let round = self.fetched.round(strings, pointer)?;
        Some(self.rounds[round][i].as_slice())
    }
}

/// Short lines to stdout or stderr: each lane's line is formatted straight into its stream's
/// staged lines, in lane order, and written by one commit with the lines the other exchanges
/// stage this pass (see `output::Output`): the first of them polled again after yielding
/// commits, and each sets its lanes' `result` once their bytes were written.
pub(super) async fn write_staged(
    req: &Request,
    lanes: &mut [Lane],
    formats: &[(usize, Format<'_>)],
    sent: &Sent,
    refusals: &mut Refusals,
) {
    let services = req.context().services();
    let mut staged = false;
    let mut from = 0;
    loop {
        let full = 'lanes: {
            let mut held = Held(None);
            for (k, state) in lanes.iter_mut().enumerate().skip(from) {
                let (lane, i) = (state.lane, state.lane as usize);
                let Some((format, target)) = &state.format else {
                    continue;
                };
                let Some(output) = services.output(target) else {
                    continue; // Not reached: a file or stdin is no inline target.
                };
                let out = held.lock(output);
                if !out.has_room() {
                    // Its reader does not keep up: wait for room (below), then this lane.
                    break 'lanes Some((k, output));
                }
                let mine = &state.strings;
                let fetch = |p| sent.string(i, mine, p);
                let format = &formats[*format].1;
                let line =
                    |out: &mut Vec<u8>| format.write(&sent.args[i], &fetch, Sink::Append(out));
                match out.stage(line) {
                    Ok(ticket) => {
                        state.staged = Some(ticket);
                        staged = true;
                    }
                    Err(why) => refusals.lane(lane, why.to_string()),
                }
            }
            None
        };
        let Some((k, output)) = full else {
            break;
        };
        from = k;
        // What is staged goes on first: the room may be waiting for it.
        services.hand_on_std();
        core::future::poll_fn(|_| match lock(output).has_room() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await;
    }
    if staged {
        // Should the exchange be dropped here (abandoned), its lines are written now.
        let guard = CommitOnDrop(services);
        req.yield_unless_alone().await;
        core::mem::forget(guard);
    }
    // Each lane's line written: at once, unless its stream's reader did not keep up (then
    // suspended until it was, or was given up).
    // Lanes mostly share one commit: its outcome is looked up once.
    let mut next = 0;
    let mut last: Option<(&Mutex<Output>, Ticket, bool)> = None;
    core::future::poll_fn(|_| {
        let mut held = Held(None);
        while let Some(state) = lanes.get_mut(next) {
            if let (Some((_, target)), Some((ticket, len))) = (&state.format, state.staged) {
                let Some(output) = services.output(target) else {
                    next += 1; // Not reached: a staged lane prints to stdout or stderr.
                    continue;
                };
                let written = match last {
                    Some((o, t, written)) if core::ptr::eq(o, output) && t == ticket => written,
                    _ => match held.lock(output).committed(ticket) {
                        Poll::Ready(written) => written,
                        Poll::Pending => return Poll::Pending,
                    },
                };
                last = Some((output, ticket, written));
                if written {
                    state.result = len as u64;
                }
            }
            next += 1;
        }
        Poll::Ready(())
    })
    .await;
}

/// Lines that may be long (above a chunk) or go to a file: each formatted and written in
/// pieces of [`super::CHUNK`] bytes on an I/O thread, so that the server thread never spends
/// long on one request; sets each lane's `result`. The formats are compiled again there from
/// `texts`, which the call takes.
pub(super) async fn write_on_io(
    req: &Request,
    touches: Touches,
    lanes: &mut [Lane],
    texts: Received,
    sent: Sent,
    (dialect, packed): (Dialect, bool),
    refusals: &mut Refusals,
) -> Result<(), ServerError> {
    // Each lane's position among `lanes`, its lane, its stream and its entries in `fetched`.
    let jobs: Vec<_> = (lanes.iter().enumerate())
        .filter_map(|(k, state)| {
            let target = state.format.clone()?.1;
            Some((k, state.lane as usize, target, state.strings.clone()))
        })
        .collect();
    let printed = crate::services::io(req, touches, move |context| {
        let run = |(k, i, target, mine): (usize, usize, Target, Range<usize>)| {
            let format = Format::new(dialect, &texts[i], packed);
            let fetch = |p| sent.string(i, &mine, p);
            (
                k,
                print(context.services(), &target, &format, &sent.args[i], &fetch),
            )
        };
        jobs.into_iter().map(run).collect::<Vec<_>>()
    })
    .await?;
    for (k, outcome) in printed {
        match outcome {
            Ok(written) => lanes[k].result = written.unwrap_or(c_result(-1)),
            Err(why) => refusals.lane(lanes[k].lane, why),
        }
    }
    Ok(())
}

/// The lock of one stream's `Output`, kept from lane to lane while they print to that stream
/// (a request's lanes mostly do): a lock per request, not per lane (at L=32 the per-lane locks
/// showed in the profile, each locked instruction waiting for the line just formatted to
/// leave the store buffer). One stream at a time, as everywhere else. Scoped to end before
/// the exchange waits: a guard cannot cross an `await`.
struct Held<'s>(Option<(&'s Mutex<Output>, MutexGuard<'s, Output>)>);

impl<'s> Held<'s> {
    fn lock(&mut self, output: &'s Mutex<Output>) -> &mut Output {
        if !matches!(&self.0, Some((locked, _)) if core::ptr::eq(*locked, output)) {
            self.0 = None; // The other stream's lock goes first.
            self.0 = Some((output, lock(output)));
        }
        &mut self.0.as_mut().expect("just locked").1
    }
}

/// Commits the staged lines of stdout and stderr when dropped: for an exchange dropped before
/// it redeemed its stage, so its lines are written at once, not with the stream's next output.
struct CommitOnDrop<'s>(&'s Services);

impl Drop for CommitOnDrop<'_> {
    fn drop(&mut self) {
        self.0.hand_on_std();
    }
}

/// What printing one lane came to: the bytes written, `None` if a write failed (nothing more
/// is written after that, as C's printf stops too), or why the arguments do not fit.
type Printed = Result<Option<u64>, String>;

/// Formats one lane's line and writes it to `target` in pieces of [`super::CHUNK`] bytes.
fn print<'s>(
    services: &Services,
    target: &Target,
    format: &Format,
    args: &[u8],
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
) -> Printed {
    let (mut written, mut lost) = (0u64, false);
    let mut sink = |chunk: &[u8]| {
        if !lost {
            let n = services.write(target, chunk);
            written += n as u64;
            lost = n < chunk.len();
        }
    };
    format
        .write(args, strings, Sink::Chunks(&mut sink))
        .map_err(|e| e.to_string())?;
    Ok((!lost).then_some(written))
}

#[cfg(test)]
mod lanes_tests {
    use super::*;

    #[test]
    fn fetched_keeps_each_lanes_distinct_pointers_apart_and_finds_them() {
        // Lane 0 prints 9, 5, 9; lane 3 prints 5; lane 7 prints nothing.
        let mut fetched = Fetched::with_capacity(4);
        let zero = fetched.add([9, 5, 9].into_iter());
        let three = fetched.add([5].into_iter());
        let seven = fetched.add([].into_iter());
        assert_eq!((zero.clone(), three.clone()), (0..2, 2..3));
        assert!(seven.is_empty());
        assert_eq!(fetched.round(&zero, 9), None);
        fetched.set(&zero, 9, 0);
        fetched.set(&three, 5, 1);
        // A pointer printed twice is fetched once; lanes do not see each other's.
        assert_eq!(fetched.round(&zero, 9), Some(0));
        assert_eq!(fetched.round(&zero, 5), None);
        assert_eq!(fetched.round(&three, 5), Some(1));
        assert_eq!(fetched.round(&three, 9), None, "not a pointer of lane 3");
        fetched.set(&three, 7, 2); // Not one of its pointers: nothing to note.
        assert_eq!(fetched.round(&three, 7), None);
    }
}
