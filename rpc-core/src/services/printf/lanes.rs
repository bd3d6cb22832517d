//! The active lanes of one printf request (`script.rs`): each one's state ([`Lane`]), what
//! they sent ([`Sent`]: their arguments, and their `%s` strings, found through [`Fetched`]),
//! and, last, their lines written: short ones to stdout or stderr staged for the pass's group
//! commit ([`write_staged`]), the others formatted and written on an I/O thread
//! ([`write_on_io`]).

use core::ops::Range;
use core::task::Poll;
use std::string::{String, ToString};
use std::vec::Vec;

use super::format::{Format, Sink};
use crate::protocol::Dialect;
use crate::server::error::ServerError;
use crate::server::recycle::{PooledVec, Streams};
use crate::server::registry::Request;
use crate::services::output::{Output, Ticket};
use crate::services::streams::Target;
use crate::services::{c_result, Refusals, Services, Touches};
use crate::sync::{lock, Mutex, MutexGuard};

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
    pub(super) args: Streams,
    pub(super) fetched: Fetched,
    pub(super) rounds: PooledVec<Streams>,
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
    texts: Streams,
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
mod tests {
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
