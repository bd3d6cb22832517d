//! printf (opcodes 21-26, PROTOCOL section 7), every lane on its own:
//!
//! 1. STREAM variants: C send buf\[0\] = raw stream handle.
//! 2. C send_n(format incl. NUL).
//! 3. S send buf\[0\] = bytes of arguments the format needs ([`crate::services::printf::args_size`]);
//!    0 for a lane whose handle or format is refused.
//! 4. C send_n(argument buffer).
//! 5. While any lane has a non-null `%s` pointer not yet fetched: S send {buf\[0\] = 0,
//!    buf\[1\] = the lane's next pointer, last-first as LLVM asks, or 0}; C send_n(the string
//!    incl. NUL, or nothing for 0). A pointer printed twice is fetched once.
//! 6. S formats each lane's output and writes it to the lane's stream in pieces of
//!    [`CHUNK`] bytes (never the whole of a longer output in memory), then S send
//!    {buf\[0\] = bytes written or -1, buf\[1\] = 0}: the reply always comes after the write.
//!
//! Short lines to stdout or stderr are *staged* (see `streams::Output`): the exchange stages
//! its lanes' lines, yields (`Request::yield_unless_alone`: not when no other exchange is in
//! flight) so that the pass serves the other ports, and when polled again commits every line
//! staged meanwhile, its own and other exchanges', in one write, unless one of those did
//! already; then it replies. So the lines of a pass go
//! out in one write (a group commit: one syscall for a pass's lines, not one per request), in
//! the order they were formatted, each printf still returns only once its line was written,
//! and a printf to stdout is written before a later one of the same thread to stderr. Lanes of
//! one request that print to stdout and stderr (PRINTF_TO_STREAM) are written stream by
//! stream, not interleaved in lane order (C orders no two streams either).
//!
//! A lane gets -1 and no output for a bad handle, an argument
//! buffer shorter than the format needs, or `%s` strings above `Limits::printf_string_bytes`
//! (the request's lanes together); the script completes in those cases. A format, an argument
//! buffer or a string above the stream limits ends the exchange at once (see [`super`]).
//!
//! Output that may be long (above [`CHUNK`], by [`output_bound`]) or goes to a file is
//! formatted and written on an I/O thread, so that the server thread never spends long on one
//! request.

use core::ops::Range;
use core::task::Poll;
use std::format;
use std::string::String;
use std::vec::Vec;

use super::output::{Output, Ticket};
use super::streams::Target;
use super::{active, c_result, per_lane, recv_words, Refusals};
use crate::protocol::opcode::Opcode;
use crate::server::error::ServerError;
use crate::server::limits::quoted;
use crate::server::recycle::{PooledVec, Streams};
use crate::server::registry::Request;
use crate::services::printf::{
    args_size, format_in, format_onto, output_bound, parse_in, parse_onto, plan_onto,
    push_pointers_at, string_offsets_onto, Chunks, Dialect, Format, FormatError, KeptStep, Piece,
    Step, CHUNK,
};
use crate::sync::{lock, Mutex, MutexGuard};
use crate::Result;

/// One active lane of a printf request.
#[derive(Clone)]
struct Lane {
    /// Its index in the warp.
    lane: u32,
    /// Its format (a position in the request's [`Parsed`] formats) and the stream it prints
    /// to; `None` once the lane is refused (it answers -1).
    parsed: Option<(usize, Target)>,
    /// Its non-null `%s` pointers not fetched yet (indices into the request's list of
    /// pointers, popped last-first), and the one asked for now.
    pending: Range<usize>,
    asked: u64,
    /// Its entries in the request's [`Fetched`].
    strings: Range<usize>,
    /// Bytes of its `%s` strings fetched.
    fetched: usize,
    /// The commit that writes the lane's staged line, and its length.
    staged: Option<(Ticket, usize)>,
    /// The reply: bytes written, or -1.
    result: u64,
}

/// A format of a request, parsed once for the lanes that send it (those of one call site),
/// and what each of them needs of it, found once (it was kept in the state of the first lane
/// that sent it, which the others then pointed to).
struct Parsed<'f> {
    /// The first lane that sent it (its index in the warp).
    lane: usize,
    pieces: PooledVec<Piece<'f>>,
    /// The argument bytes it takes.
    args_size: usize,
    /// Where its `%s` pointers lie in an argument buffer: a range of the request's `offsets`.
    pointer_at: Range<usize>,
    /// Its plan, if every piece is plain (`printf::plan_onto`): a range of the request's
    /// `plans`.
    plan: Option<Range<usize>>,
    /// A bound of its output without strings, which add to it (`output_bound`).
    bound: usize,
}

/// Room for the pieces of a format of up to 3 conversions (a literal before each and one at
/// the end), parsed without growing the vector; the same for its plan (a step per piece).
const PIECES: usize = 8;

/// Room for the rounds of `%s` strings of a format of up to 4 `%s`, kept without growing.
const ROUNDS: usize = 4;

impl<'f> Parsed<'f> {
    /// The format `format` that lane `lane` sent, for `how` (dialect, packing): kept from an
    /// earlier request (see [`Known`]: then without pieces), or parsed (and kept if plain). Its
    /// `%s` offsets are appended to `offsets`, its plan, if plain, to `plans`.
    fn new(
        lane: usize,
        how: (Dialect, bool),
        format: &'f [u8],
        offsets: &mut Vec<usize>,
        plans: &mut Vec<Step<&'f [u8]>>,
    ) -> Self {
        let (dialect, packed) = how;
        let (first, first_step) = (offsets.len(), plans.len());
        let (pieces, (args_size, bound), plain) = match Known::recall(how, format, offsets, plans) {
            Some(sizes) => (PooledVec::with_capacity(0), sizes, true),
            None => {
                let mut pieces = PooledVec::with_capacity(PIECES);
                parse_onto(dialect, format, &mut pieces);
                string_offsets_onto(&pieces, packed, offsets);
                let sizes = (args_size(&pieces, packed), output_bound(&pieces, 0));
                let plain = plan_onto(&pieces, packed, plans);
                if plain {
                    let planned = (&offsets[first..], &plans[first_step..]);
                    Known::keep(how, format, planned, sizes);
                }
                (pieces, sizes, plain)
            }
        };
        Parsed {
            lane,
            pieces,
            args_size,
            pointer_at: first..offsets.len(),
            plan: plain.then_some(first_step..plans.len()),
            bound,
        }
    }
}

impl Lane {
    fn new(lane: u32) -> Self {
        Lane {
            lane,
            parsed: None,
            pending: 0..0,
            asked: 0,
            strings: 0..0,
            fetched: 0,
            staged: None,
            result: c_result(-1),
        }
    }

    /// Refuses the lane: it answers -1 and asks for no more strings.
    fn refuse(&mut self) {
        self.parsed = None;
        self.pending = 0..0;
        self.asked = 0;
    }
}

/// Which round of a request fetched each lane's string at each of its `%s` pointers: per lane
/// (its `strings`), its distinct pointers sorted, so a lookup is a binary search among the
/// lane's own few entries however many `%s` a format carries (a device may send thousands).
/// One vector for the request, and none without `%s`.
struct Fetched(PooledVec<(u64, Option<usize>)>);

impl Fetched {
    /// No string fetched yet, for the `%s` pointers of `lanes` (entries of `pointers`); sets
    /// each lane's `strings`.
    fn new(lanes: &mut [Lane], pointers: &[u64]) -> Self {
        let mut all = PooledVec::with_capacity(pointers.len().next_power_of_two());
        for state in lanes {
            let start = all.len();
            all.extend(state.pending.clone().map(|k| (pointers[k], None)));
            // Each pointer once: a pointer printed twice is fetched once. A lane of one `%s`
            // (most) skips this: reading back the entry just written, to move it onto itself,
            // waited for its writes to leave the store buffer.
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
            state.strings = start..all.len();
        }
        Fetched(all)
    }

    /// Where among a lane's entries (`strings`) `pointer` is.
    fn find(&self, strings: &Range<usize>, pointer: u64) -> Option<usize> {
        let mine = &self.0[strings.clone()];
        let k = mine.binary_search_by_key(&pointer, |&(p, _)| p).ok()?;
        Some(strings.start + k)
    }

    /// The round that brought the string at `pointer` of the lane with entries `strings`.
    fn round(&self, strings: &Range<usize>, pointer: u64) -> Option<usize> {
        self.0[self.find(strings, pointer)?].1
    }

    /// Notes that round `round` brought the string at `pointer` of the lane with `strings`.
    fn set(&mut self, strings: &Range<usize>, pointer: u64, round: usize) {
        if let Some(k) = self.find(strings, pointer) {
            self.0[k].1 = Some(round);
        }
    }
}

/// The plain formats this thread printed last, each kept with what it implies (its argument
/// size, its output bound, its `%s` offsets, its plan), so that a format seen again is not
/// parsed again: with a warp printing the same line in a loop, parsing it was about a fifth of
/// the server's time per request (docs/performance.md). Per thread, so no lock. A kept format
/// comes without its pieces: a plain one prints by its plan alone (`printf::format_onto`).
/// At most [`KNOWN`] formats of at most [`KNOWN_BYTES`] bytes each.
#[derive(Default)]
struct Known {
    formats: Vec<KnownFormat>,
    /// The entry the next format replaces once all are used.
    next: usize,
}

/// One plain format kept by [`Known`], for a dialect and a packing.
#[derive(Default)]
struct KnownFormat {
    how: (Dialect, bool),
    format: Vec<u8>,
    /// Its argument size and output bound.
    sizes: (usize, usize),
    pointer_at: Vec<usize>,
    plan: Vec<KeptStep>,
}

/// How many formats [`Known`] keeps: a few call sites printing in turn.
const KNOWN: usize = 8;
/// The longest format [`Known`] keeps (with its NUL): a line, not a page.
const KNOWN_BYTES: usize = 256;

std::thread_local! {
    static KNOWN_FORMATS: core::cell::RefCell<Known> = core::cell::RefCell::new(Known::default());
}

impl Known {
    /// If `format` was kept for `how`, appends its `%s` offsets to `pointer_at` and its plan
    /// (over `format`'s bytes) to `plan`, and returns its argument size and output bound.
    fn recall<'f>(
        how: (Dialect, bool),
        format: &'f [u8],
        pointer_at: &mut Vec<usize>,
        plan: &mut Vec<Step<&'f [u8]>>,
    ) -> Option<(usize, usize)> {
        KNOWN_FORMATS
            .try_with(|cell| {
                let known = cell.try_borrow().ok()?;
                let kept = known
                    .formats
                    .iter()
                    .find(|kept| kept.how == how && kept.format == format)?;
                pointer_at.extend_from_slice(&kept.pointer_at);
                plan.extend(kept.plan.iter().map(|step| step.within(format)));
                Some(kept.sizes)
            })
            .ok()
            .flatten()
    }

    /// Keeps the plain `format` for `how`, with its `%s` offsets and plan (made from
    /// `format`'s bytes) and its argument size and output bound, if it is short enough. The
    /// entry it replaces lends its vectors: a thread printing more formats in turn than are
    /// kept allocates nothing for them once warm.
    fn keep(
        how: (Dialect, bool),
        format: &[u8],
        (pointer_at, plan): (&[usize], &[Step<&[u8]>]),
        sizes: (usize, usize),
    ) {
        if format.len() > KNOWN_BYTES {
            return;
        }
        let _ = KNOWN_FORMATS.try_with(|cell| {
            let Ok(mut known) = cell.try_borrow_mut() else {
                return;
            };
            let known = &mut *known;
            let kept = if known.formats.len() < KNOWN {
                known.formats.push(KnownFormat::default());
                known.formats.last_mut().expect("just pushed")
            } else {
                let next = known.next;
                known.next = (next + 1) % KNOWN;
                &mut known.formats[next]
            };
            kept.how = how;
            kept.sizes = sizes;
            kept.format.clear();
            kept.format.extend_from_slice(format);
            kept.pointer_at.clear();
            kept.pointer_at.extend_from_slice(pointer_at);
            kept.plan.clear();
            kept.plan.extend(plan.iter().map(|step| step.keep(format)));
        });
    }
}

/// The state of `lane` among the active `lanes` (in lane order).
fn at(lanes: &[Lane], lane: u32) -> Option<&Lane> {
    // Where every lane up to it is active (a full warp), a lane's state is at its own index.
    if let Some(state) = lanes.get(lane as usize).filter(|state| state.lane == lane) {
        return Some(state);
    }
    let position = lanes.binary_search_by_key(&lane, |state| state.lane).ok()?;
    lanes.get(position)
}

/// Serves every PRINTF_TO_* opcode. A request's vectors are few whatever its lanes (printf is
/// the busiest opcode there is), each sized once and taken from the thread's pool
/// (`PooledVec`), not the allocator: the active lanes' states (a warp's single printing thread
/// costs one, not 32), the formats parsed ([`Parsed`], one per call site), their pieces, plans
/// and `%s` offsets, and with `%s` the pointers of all the lanes, the rounds that fetched them
/// and [`Fetched`]. The work per lane is what differs between lanes: what a format implies
/// (its argument size, its pointers' offsets, its plan if plain) is found once per format.
pub(crate) async fn printf(mut req: Request) -> Result<(), ServerError> {
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
        Some((recv_words(&mut req).await?, super::mailbox_state(&req)))
    } else {
        None
    };

    // 2, 3. The formats, and the argument sizes they need.
    let formats = req.recv_n().await?;
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
    // Most requests print one format: room for one, grown for more.
    let mut parsed: PooledVec<Parsed> = PooledVec::with_capacity(1);
    let mut offsets = PooledVec::with_capacity(PIECES);
    let mut plans = PooledVec::with_capacity(PIECES);
    for state in &mut lanes {
        let (lane, i) = (state.lane, state.lane as usize);
        if formats.refused() {
            refusals.lane(lane, super::OVER_BUDGET);
            continue;
        }
        let Some(target) = target(lane) else {
            let handle = handles.as_ref().map_or(0, |(w, _)| w[i][0]);
            refusals.lane(lane, format!("{handle:#x} is not a live stream handle"));
            continue;
        };
        // A lane mostly sends the format of the lane before it.
        if !matches!(parsed.last(), Some(last) if formats[last.lane] == formats[i]) {
            let how = (dialect, packed);
            parsed.push(Parsed::new(i, how, &formats[i], &mut offsets, &mut plans));
        }
        state.parsed = Some((parsed.len() - 1, target));
    }
    req.send(|lane, p| {
        let size = at(&lanes, lane)
            .and_then(|state| state.parsed.as_ref())
            .map_or(0, |&(format, _)| parsed[format].args_size);
        p.set_word(0, size as u64)
    })
    .await?;

    // 4. The arguments, and the strings they point to.
    let args = req.recv_n().await?;
    // Room for every lane's `%s` pointers: one block of the pool, never grown.
    let most: usize = lanes
        .iter()
        .filter_map(|state| Some(parsed[state.parsed.as_ref()?.0].pointer_at.len()))
        .sum();
    let mut pointers = PooledVec::with_capacity(most.next_power_of_two());
    for k in 0..lanes.len() {
        let (lane, i) = (lanes[k].lane, lanes[k].lane as usize);
        let Some((format, _)) = lanes[k].parsed else {
            continue;
        };
        let format = &parsed[format];
        let (needed, available) = (format.args_size, args[i].len());
        if args.refused() {
            refusals.lane(lane, super::OVER_BUDGET);
            lanes[k].refuse();
            continue;
        }
        if available < needed {
            let why = FormatError::MissingArguments { needed, available };
            refusals.lane(
                lane,
                format!("{why} for {}", quoted(super::until_nul(&formats[i]))),
            );
            lanes[k].refuse();
            continue;
        }
        let first = pointers.len();
        push_pointers_at(&offsets[format.pointer_at.clone()], &args[i], &mut pointers);
        lanes[k].pending = first..pointers.len();
    }

    // 5. Fetch the strings, last-first, each pointer once per lane, within the request's
    // budget. Each round's strings stay in the buffers it was received in (reused by later
    // requests once dropped); `fetched` finds a lane's string by its pointer: the round that
    // brought it. (It was a B-tree map: at L=32 its 32 inserts and their nodes showed in the
    // profile; one sorted vector is built at once.)
    let mut rounds: PooledVec<Streams> = PooledVec::with_capacity(ROUNDS);
    let mut fetched = Fetched::new(&mut lanes, &pointers);
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
            if state.asked == 0 || state.parsed.is_none() {
                continue;
            }
            let len = strings[i].len();
            if strings.refused() {
                refusals.lane(lane, super::OVER_BUDGET);
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
        if let Some((format, _)) = state.parsed {
            long |= parsed[format].bound.saturating_add(state.fetched) > CHUNK;
        }
    }
    let mut touches =
        super::Touches::streams(lanes.iter().filter_map(|s| s.parsed.as_ref().map(|p| &p.1)));
    touches.blocks |= long;
    if touches.inline() {
        let services = req.context().services();
        // Short outputs to stdout or stderr: each lane's line is staged on its stream, in lane
        // order, and written by one commit with the lines the other exchanges stage this pass
        // (see `streams::Output`): the first of them polled again after yielding commits, and
        // each replies once its bytes were written.
        let mut staged = false;
        let mut from = 0;
        loop {
            let full = 'lanes: {
                let mut held = Held(None);
                for k in from..lanes.len() {
                    let (lane, i) = (lanes[k].lane, lanes[k].lane as usize);
                    let Some((format, target)) = &lanes[k].parsed else {
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
                    let mine = &lanes[k].strings;
                    let fetch = |p| fetched.round(mine, p).map(|r| rounds[r][i].as_slice());
                    let format = Format {
                        pieces: &parsed[*format].pieces,
                        plan: parsed[*format].plan.clone().map(|steps| &plans[steps]),
                    };
                    let line = |out: &mut Vec<u8>| {
                        let mut unchunked = Chunks::none();
                        format_onto(
                            dialect,
                            format,
                            &args[i],
                            packed,
                            &fetch,
                            out,
                            &mut unchunked,
                        )
                    };
                    match out.stage(line) {
                        Ok(ticket) => {
                            lanes[k].staged = Some(ticket);
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
                if let (Some((_, target)), Some((ticket, len))) = (&state.parsed, state.staged) {
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
        reply(&mut req, |lane| {
            at(&lanes, lane).map_or(c_result(-1), |s| s.result)
        })
        .await?;
    } else {
        // The parsed pieces borrow `formats`, which the call takes: they are parsed again there.
        let jobs: Vec<_> = lanes
            .drain(..)
            .filter_map(|state| Some((state.lane as usize, state.parsed?.1, state.strings)))
            .collect();
        drop((lanes, parsed, plans));
        let printed = super::io(&req, touches, move |context| {
            let run = |(i, target, mine): (usize, Target, Range<usize>)| {
                let pieces = parse_in(dialect, &formats[i]);
                let fetch = |p| fetched.round(&mine, p).map(|r| rounds[r][i].as_slice());
                let printed = print(
                    context.services(),
                    &target,
                    &pieces,
                    &args[i],
                    (dialect, packed),
                    &fetch,
                );
                (i, printed)
            };
            jobs.into_iter().map(run).collect::<Vec<_>>()
        })
        .await?;
        let mut results = per_lane(&req, c_result(-1));
        for (i, outcome) in printed {
            match outcome {
                Ok(written) => results[i] = written.unwrap_or(c_result(-1)),
                Err(why) => refusals.lane(i as u32, why),
            }
        }
        reply(&mut req, |lane| results[lane as usize]).await?;
    }
    refusals.finish()
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

/// The last packet: each lane's result (bytes written or -1) in buf\[0\].
async fn reply(req: &mut Request, result: impl Fn(u32) -> u64) -> Result<(), ServerError> {
    req.send(|lane, p| {
        p.set_word(0, result(lane));
        p.set_word(1, 0);
    })
    .await
}

/// What printing one lane came to: the bytes written, `None` if a write failed (nothing more
/// is written after that, as C's printf stops too), or why the arguments do not fit.
type Printed = core::result::Result<Option<u64>, String>;

/// Commits the staged lines of stdout and stderr when dropped: for an exchange dropped before
/// it redeemed its stage, so its lines are written at once, not with the stream's next output.
struct CommitOnDrop<'s>(&'s super::Services);

impl Drop for CommitOnDrop<'_> {
    fn drop(&mut self) {
        self.0.hand_on_std();
    }
}

/// Formats one lane's output and writes it to `target` in pieces of [`CHUNK`] bytes.
fn print<'s>(
    services: &super::Services,
    target: &Target,
    pieces: &[Piece],
    args: &[u8],
    (dialect, packed): (Dialect, bool),
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
    format_in(dialect, pieces, args, packed, strings, &mut sink).map_err(|e| e.to_string())?;
    Ok((!lost).then_some(written))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `format` as a request does, which keeps it if it is plain (and new).
    fn keep(format: &[u8]) {
        let host = (Dialect::HostC, false);
        Parsed::new(0, host, format, &mut Vec::new(), &mut Vec::new());
    }

    /// Whether `Known` has `format` for `how`; if so, checks that what it gives is what
    /// parsing and planning a copy of the format make, the plan's literals in the copy.
    fn recall(format: &[u8], how: (Dialect, bool)) -> bool {
        let copy = format.to_vec();
        let (mut offsets, mut plan) = (Vec::new(), Vec::new());
        let Some(sizes) = Known::recall(how, &copy, &mut offsets, &mut plan) else {
            return false;
        };
        let pieces = parse_in(how.0, &copy);
        let (mut fresh_offsets, mut fresh_plan) = (Vec::new(), Vec::new());
        string_offsets_onto(&pieces, how.1, &mut fresh_offsets);
        assert!(plan_onto(&pieces, how.1, &mut fresh_plan));
        let fresh_sizes = (args_size(&pieces, how.1), output_bound(&pieces, 0));
        assert_eq!(
            (sizes, offsets, &plan),
            (fresh_sizes, fresh_offsets, &fresh_plan)
        );
        let within = copy.as_ptr_range();
        for step in &plan {
            if let Step::Literal(bytes) = step {
                let inside = within.contains(&bytes.as_ptr());
                assert!(inside || *bytes == b"%", "a literal outside the format");
            }
        }
        true
    }

    #[test]
    fn known_formats_are_the_last_few_short_plain_ones_for_their_dialect_and_packing() {
        let host = (Dialect::HostC, false);
        let format = |k: usize| std::format!("line {k}: %d of %s, 100%%\n\0").into_bytes();
        keep(&format(0));
        assert!(recall(&format(0), host));
        assert!(!recall(&format(0), (Dialect::HostC, true)), "packed");
        assert!(!recall(&format(0), (Dialect::LlvmLibc, false)), "dialect");
        assert!(!recall(b"line 0: %d\0", host));
        // The ninth format replaces the first one kept.
        for k in 1..=KNOWN {
            keep(&format(k));
        }
        assert!(!recall(&format(0), host));
        for k in 1..=KNOWN {
            assert!(recall(&format(k), host), "{k}");
        }
        // A long format is planned for its request only.
        let long = [&[b'x'; KNOWN_BYTES][..], b"%d\0"].concat();
        keep(&long);
        assert!(!recall(&long, host));
    }

    #[test]
    fn fetched_keeps_each_lanes_distinct_pointers_apart_and_finds_them() {
        // Lane 0 prints 9, 5, 9; lane 3 prints 5; lane 7 prints nothing.
        let pointers = [9, 5, 9, 5];
        let mut lanes = [Lane::new(0), Lane::new(3), Lane::new(7)];
        lanes[0].pending = 0..3;
        lanes[1].pending = 3..4;
        let mut fetched = Fetched::new(&mut lanes, &pointers);
        assert_eq!(
            (lanes[0].strings.clone(), lanes[1].strings.clone()),
            (0..2, 2..3)
        );
        assert!(lanes[2].strings.is_empty());
        let (zero, three) = (lanes[0].strings.clone(), lanes[1].strings.clone());
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
